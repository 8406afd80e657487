defmodule Condukt.K8s.KubernetesE2ETest do
  # Condukt.Sandbox.Kubernetes with a network policy, end to end on the
  # real node (docs/k8s-tier.md, "The real node"): the sandbox creates the
  # pod of the contract; the kubelet runs its netfilter init container
  # and native sidecar from the sidecar image; the workspace's curl
  # (through Condukt.Sandbox.exec/3) goes through the real iptables rules
  # and the real sidecar to the testbed's nginx; the decide rule runs
  # here, through the ControlBridge, the kube_forward listener and a
  # port-forward WebSocket; every request is a :telemetry event. As the
  # ServiceAccount with the documented Role. The names resolve through
  # the pod's hostAliases here (no DNS on the way); real_node_test.exs
  # proves allow, deny and decide through cluster DNS.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge
  alias Condukt.Test.K8s.Node

  @events [
    [:condukt, :sandbox, :network_policy, :request_allowed],
    [:condukt, :sandbox, :network_policy, :request_denied],
    [:condukt, :sandbox, :network_policy, :request_closed],
    [:condukt, :sandbox, :network_policy, :control_connected]
  ]

  setup_all do
    %{tier: Condukt.Test.K8s.Case.start_node_tier!()}
  end

  defp decode(json) do
    Condukt.JSON.decode!(json)
  catch
    _, _ -> nil
  end

  defp curl(sb, url) do
    {:ok, %{output: out}} =
      Sandbox.exec(sb, "curl -sS --max-time 15 -o /dev/stdout -w ' %{http_code}\\n' #{url} 2>/dev/null; true")

    out
  end

  defp conn(tier) do
    c = tier.cluster
    [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]
  end

  defp sandbox_opts(tier, id, policy) do
    [
      id: id,
      namespace: tier.cluster.namespace,
      conn: conn(tier),
      image: "condukt.test/workspace-tools:bookworm",
      heartbeat_interval: false,
      host_aliases: tier.host_aliases,
      network_policy: policy,
      network_policy_image: tier.egress_image,
      network_policy_upstream_ca: tier.upstream_ca_pem,
      network_policy_allow_private: tier.allow_private
    ]
  end

  defp get_pod(tier, id) do
    c = tier.cluster
    Cluster.request!(c, :admin, "GET", "/api/v1/namespaces/#{c.namespace}/pods/#{Kubernetes.Names.pod_name(id)}")
  end

  test "the workspace trusts the session CA (variables, system bundle, JVM store) and holds no secret, no capability; a reattach re-dials the bridge",
       %{tier: tier} do
    me = self()
    handler = "kube-e2e-#{System.unique_integer([:positive])}"
    :telemetry.attach_many(handler, @events, fn e, m, meta, _ -> send(me, {:event, List.last(e), m, meta}) end, nil)
    on_exit(fn -> :telemetry.detach(handler) end)

    decider = fn ctx, req ->
      send(me, {:asked, req.host, ctx.session_id})
      if req.host == "decide.test", do: :allow, else: {:deny, "the decider said no"}
    end

    policy = [
      rules: [deny: ["denied.test"], allow: ["allowed.test"], decide: [call: decider, cache: false]],
      default: :deny
    ]

    id = "e2e-#{System.unique_integer([:positive])}"
    {:ok, sb} = Sandbox.new({Kubernetes, sandbox_opts(tier, id, policy)})
    on_exit(fn -> Kubernetes.terminate(id, namespace: tier.cluster.namespace, conn: conn(tier)) end)
    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000

    # The workspace started only once the manifest's startupProbe
    # (`condukt-egress ready`) succeeded in the sidecar, as the kubelet ran
    # it; the proxy took the probe's connections without a warning.
    pod = get_pod(tier, id)
    sidecar = Enum.find(pod["spec"]["initContainers"], &(&1["name"] == "condukt-egress"))
    assert %{"exec" => %{"command" => [_ | _]}} = sidecar["startupProbe"]

    assert %{"started" => true, "ready" => true} =
             Enum.find(pod["status"]["initContainerStatuses"], &(&1["name"] == "condukt-egress"))

    log = Node.container_log(tier.node, pod, "condukt-egress")
    assert log != []
    refute Enum.any?(log, &(&1 =~ "not redirected")), Enum.join(log, "\n")

    # allow: the sidecar alone; curl trusts the session CA (the six
    # variables). The workspace's first request: nothing was refused.
    assert curl(sb, "https://allowed.test/") == "hello from allowed.test\n 200\n"

    assert_receive {:event, :request_allowed, _, %{request: %{host: "allowed.test"}, matched_rule: %{kind: :allow}}},
                   10_000

    assert_receive {:event, :request_closed, %{bytes_in: _}, %{request: %{host: "allowed.test"}}}, 10_000

    # The JVM's trust store, written in the pod by the condukt-trust init
    # container (read-only), byte for byte the store the BEAM builds for
    # the session CA, and the variable naming it. (The system bundle:
    # operator_e2e_test.exs.)
    {:ok, %{output: out}} = Sandbox.exec(sb, ~S(stat -c %a /etc/condukt/trust-store.p12; echo "$JAVA_TOOL_OPTIONS"))

    assert out ==
             "444\n-Djavax.net.ssl.trustStore=/etc/condukt/trust-store.p12 -Djavax.net.ssl.trustStoreType=PKCS12\n"

    {:ok, %{output: ca_pem}} = Sandbox.exec(sb, "cat /etc/condukt/ca.pem")
    {:ok, %{output: store}} = Sandbox.exec(sb, "base64 -w0 /etc/condukt/trust-store.p12")
    assert Base.decode64!(store) == Condukt.Sandbox.NetworkPolicy.TrustStore.pkcs12(ca_pem)

    # deny and decide with their reasons (real_node_test.exs: the same
    # through cluster DNS).
    assert curl(sb, "https://denied.test/") =~ ~r/ 403\n\z/

    assert_receive {:event, :request_denied, _,
                    %{request: %{host: "denied.test"}, matched_rule: %{kind: :deny}, reason: :denied_by_rule}},
                   10_000

    refute_received {:asked, "denied.test", _}
    assert curl(sb, "https://other.test/") =~ ~r/ 403\n\z/
    assert_receive {:asked, "other.test", ^id}, 10_000

    assert_receive {:event, :request_denied, _,
                    %{request: %{host: "other.test"}, matched_rule: %{kind: :decide}, reason: "the decider said no"}},
                   10_000

    # The workspace: the session CA, none of the sidecar's secrets, no NET_ADMIN.
    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "grep -q 'BEGIN CERTIFICATE' /etc/condukt/ca.pem")
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "ls /etc/condukt-egress")
    assert code != 0

    # ... nor NET_RAW (the socket mark, AF_PACKET frames) nor SETUID (the
    # sidecar's uid), whatever the runtime's defaults: the manifest drops them.
    for {what, py} <- [
          mark: "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, 36, 0x539)",
          packet: "socket.socket(socket.AF_PACKET, socket.SOCK_RAW)",
          setuid: "os.setuid(1337)"
        ] do
      assert {:ok, %{exit_code: code, output: out}} = Sandbox.exec(sb, "python3 -c 'import os, socket; #{py}' 2>&1")

      assert code != 0 and out =~ "PermissionError", "#{what}: #{out}"
    end

    # ... and the sidecar's files are not reachable through /proc either
    # (another container's root is another user's and mount namespace's).
    assert {:ok, %{exit_code: code}} =
             Sandbox.exec(
               sb,
               "cat /proc/*/root/etc/condukt-egress/ca.key /proc/*/root/etc/condukt-egress/token 2>/dev/null"
             )

    assert code != 0

    # Another port of the internet, by address (no name, no sidecar on
    # the way): the init container's rules refuse the connection in the
    # pod (refused at once, not dropped later by the NetworkPolicy), and
    # nothing reaches the bypass listener.
    tb = tier.testbed
    seen = length(Condukt.Dev.Netns.Testbed.bypass_log(tb))

    {:ok, %{output: out}} =
      Sandbox.exec(sb, "curl -sS --max-time 10 http://#{tb.inet.v4}:8080/ 2>&1; echo \" exit=$?\"")

    assert out =~ "exit=7", out
    assert length(Condukt.Dev.Netns.Testbed.bypass_log(tb)) == seen

    # Reattach (a retried job): the bridge comes back, decisions still run here.
    :ok = Sandbox.shutdown(sb)

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes,
         id: id, namespace: tier.cluster.namespace, conn: conn(tier), heartbeat_interval: false, network_policy: policy}
      )

    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000
    assert curl(sb, "https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000
    :ok = Sandbox.shutdown(sb)
  end

  # The kubelet, which serves the pod's exec and port-forward streams, is
  # stopped while the pod (and its sidecar) keeps running, so the control
  # tunnel breaks at the kubelet and every re-dial fails at the API server
  # until it is back. exec goes through that kubelet too, so the
  # workspace's requests of the outage are made by a script started
  # before it: it waits (/proc/net/tcp, the pod's network namespace)
  # until the tunnel's connection to the sidecar's control port is gone,
  # then runs its curls. The sidecar's own stdout (its log file on the
  # node, written whatever the channel does) tells the test when they are
  # done. (real_node_test.exs: a kubelet restart with a short outage.)
  test "a kubelet restart drops the control tunnel: decide fails closed while it is down, static rules keep working, the bridge re-dials by itself",
       %{tier: tier} do
    me = self()
    handler = "kube-e2e-drop-#{System.unique_integer([:positive])}"

    events =
      @events ++
        [
          [:condukt, :sandbox, :network_policy, :control_disconnected],
          [:condukt, :sandbox, :network_policy, :control_gave_up],
          [:condukt, :sandbox, :network_policy, :decider_failure]
        ]

    :telemetry.attach_many(handler, events, fn e, m, meta, _ -> send(me, {:event, List.last(e), m, meta}) end, nil)
    on_exit(fn -> :telemetry.detach(handler) end)

    decider = fn ctx, req ->
      send(me, {:asked, req.host, ctx.session_id})
      if req.host == "decide.test", do: :allow, else: {:deny, "the decider said no"}
    end

    policy = [
      rules: [
        deny: ["denied.test"],
        allow: ["allowed.test"],
        decide: [call: decider, cache: false, timeout: 3_000]
      ],
      default: :deny
    ]

    id = "drop-#{System.unique_integer([:positive])}"
    {:ok, sb} = Sandbox.new({Kubernetes, sandbox_opts(tier, id, policy)})

    on_exit(fn ->
      # A failed assertion may leave the kubelet down; the pod's deletion needs it.
      Node.start_kubelet_again!(tier.node, tier.cluster)
      Kubernetes.terminate(id, namespace: tier.cluster.namespace, conn: conn(tier))
    end)

    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000
    assert curl(sb, "https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000
    assert_receive {:event, :request_allowed, _, %{request: %{host: "decide.test"}}}, 10_000
    bridge = sb.state.bridge

    port = Condukt.Sandbox.NetworkPolicy.K8s.Manifests.control_port()

    hex = port |> Integer.to_string(16) |> String.pad_leading(4, "0")

    script = """
    tunnel() { awk '$2 ~ /:#{hex}$/ && $4 == "01"' /proc/net/tcp /proc/net/tcp6 | grep -q .; }
    n=0; until tunnel; do n=$((n+1)); [ $n -gt 100 ] && echo "no tunnel seen" >> down.txt; [ $n -gt 100 ] && exit 1; sleep 0.1; done
    echo ready >> down.txt
    n=0; while tunnel; do n=$((n+1)); [ $n -gt 600 ] && echo "the tunnel stayed up" >> down.txt; [ $n -gt 600 ] && exit 1; sleep 0.1; done
    for h in decide allowed denied; do
      curl -sS --max-time 15 -o /dev/null -w "$h %{http_code}\\n" https://$h.test/ >> down.txt 2>/dev/null
    done
    echo done >> down.txt
    """

    :ok = Sandbox.write(sb, "drop.sh", script)
    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "setsid sh drop.sh </dev/null >/dev/null 2>&1 &")

    # The script has seen the tunnel before the kubelet goes (on a busy
    # machine it may start late; the test reads the emptyDir on the node).
    pod = get_pod(tier, id)
    down_txt = Path.join(Node.empty_dir(tier.node, pod, "workspace"), "down.txt")

    script_out = fn ->
      File.read(down_txt)
      |> then(fn
        {:ok, t} -> t
        _ -> ""
      end)
    end

    assert :ok == Cluster.wait_until(fn -> script_out.() =~ "ready" end, 30_000),
           "the script did not see the tunnel: #{inspect(script_out.())}"

    # The kubelet goes: the tunnel breaks, the bridge notices.
    :ok = Node.stop_kubelet!(tier.node)
    assert_receive {:event, :control_disconnected, _, %{session_id: ^id}}, 15_000

    # The sidecar still gates the workspace: its pod log records the three
    # requests of the outage.
    outage = fn ->
      for json <- Node.container_log(tier.node, pod, "condukt-egress"),
          %{"event" => e, "host" => h} = ev <- [decode(json)],
          e in ["request_allowed", "request_denied"],
          h in ["decide.test", "allowed.test", "denied.test"],
          into: %{},
          do: {h, {e, ev["reason"]}}
    end

    assert :ok == Cluster.wait_until(fn -> map_size(outage.()) == 3 end, 60_000),
           "the outage's requests: #{inspect(outage.())}; the script: #{inspect(script_out.())}"

    # decide failed closed at the sidecar's decide timeout (nobody to ask);
    # allow and deny rules did not need the channel.
    assert outage.() == %{
             "decide.test" => {"request_denied", "decider_timeout"},
             "allowed.test" => {"request_allowed", nil},
             "denied.test" => {"request_denied", "denied_by_rule"}
           }

    # The decider was not called, no request event crossed the dead
    # channel, and the bridge kept dialling (it did not give up).
    refute_received {:asked, _, _}
    refute_received {:event, :request_denied, _, _}
    refute_received {:event, :control_gave_up, _, _}
    refute_received {:event, :control_connected, _, _}

    # The kubelet is back: the bridge re-dials by itself and receives what
    # the sidecar buffered meanwhile.
    Node.start_kubelet_again!(tier.node, tier.cluster)
    assert_receive {:event, :control_connected, _, %{session_id: ^id, attempt: attempt}}, 30_000
    assert attempt >= 1

    # The same bridge (not a restarted one), told never to give up: an
    # outage past its default 10 attempts (26 to 52 s) ends the same way
    # (a 60 s one was run by hand: docs/kubernetes.md).
    assert %{status: :connected} = ControlBridge.info(bridge)
    assert :sys.get_state(bridge).opts[:attempts] == :infinity

    assert_receive {:event, :request_denied, _,
                    %{request: %{host: "decide.test"}, matched_rule: %{kind: :decide}, reason: :decider_timeout}},
                   10_000

    assert_receive {:event, :request_allowed, _, %{request: %{host: "allowed.test"}, matched_rule: %{kind: :allow}}},
                   10_000

    assert_receive {:event, :request_denied, _,
                    %{request: %{host: "denied.test"}, matched_rule: %{kind: :deny}, reason: :denied_by_rule}},
                   10_000

    assert {:ok, "ready\ndecide 403\nallowed 200\ndenied 403\ndone\n"} = Sandbox.read(sb, "down.txt")
    refute_received {:asked, _, _}

    # Decisions run here again.
    assert curl(sb, "https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000
    assert curl(sb, "https://other.test/") =~ ~r/ 403\n\z/
    assert_receive {:asked, "other.test", ^id}, 10_000

    assert_receive {:event, :request_denied, _,
                    %{request: %{host: "other.test"}, matched_rule: %{kind: :decide}, reason: "the decider said no"}},
                   10_000

    :ok = Sandbox.shutdown(sb)
  end
end
