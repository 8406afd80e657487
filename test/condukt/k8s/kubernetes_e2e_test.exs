defmodule Condukt.K8s.KubernetesE2ETest do
  # Condukt.Sandbox.Kubernetes with a network policy, end to end on the
  # tier's pod runtime (docs/k8s-tier.md, "The pod runtime"): the sandbox
  # creates the pod of the contract; the runtime runs its netfilter init
  # container and native sidecar for real in the netns testbed's pod
  # namespace; the workspace's curl (through Condukt.Sandbox.exec/3) goes
  # through the real iptables rules and the real sidecar to the testbed's
  # nginx; the decide rule runs here, through the ControlBridge, the
  # kube_forward listener and a port-forward WebSocket; every request is a
  # :telemetry event. As the ServiceAccount with the documented Role.
  use Condukt.Test.K8s.Case, async: false, pods: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge

  @events [
    [:condukt, :sandbox, :network_policy, :request_allowed],
    [:condukt, :sandbox, :network_policy, :request_denied],
    [:condukt, :sandbox, :network_policy, :request_closed],
    [:condukt, :sandbox, :network_policy, :control_connected]
  ]

  setup_all do
    %{tier: Condukt.Test.K8s.Case.start_pod_tier!()}
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

  test "deny, allow and a decider on the BEAM, with telemetry; the workspace trusts the session CA and holds no secret",
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
    conn = [server: tier.server, ca_pem: File.read!(tier.ca), token: tier.token]

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes,
         id: id,
         namespace: tier.namespace,
         conn: conn,
         heartbeat_interval: false,
         host_aliases: tier.host_aliases,
         network_policy: policy,
         network_policy_image: tier.egress_image,
         network_policy_upstream_ca: tier.upstream_ca_pem,
         network_policy_allow_private: tier.allow_private}
      )

    on_exit(fn -> Kubernetes.terminate(id, namespace: tier.namespace, conn: conn) end)
    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000

    # The workspace started only once the manifest's startupProbe
    # (`condukt-egress ready`) succeeded in the sidecar, as a kubelet runs
    # it; the proxy took the probe's connections without a warning.
    info = Runtime.pod(tier.runtime, tier.namespace, Kubernetes.Names.pod_name(id))
    assert %{probe: :exec, output: "condukt-egress: ready (2 listener(s))\n"} = info.startup["condukt-egress"]
    refute File.read!(info.logs["condukt-egress"]) =~ "not redirected"

    # allow: the sidecar alone; curl trusts the session CA (the six
    # variables). The workspace's first request: nothing was refused.
    assert curl(sb, "https://allowed.test/") == "hello from allowed.test\n 200\n"

    assert_receive {:event, :request_allowed, _, %{request: %{host: "allowed.test"}, matched_rule: %{kind: :allow}}},
                   10_000

    assert_receive {:event, :request_closed, %{bytes_in: _}, %{request: %{host: "allowed.test"}}}, 10_000

    # Without any CA variable: the system bundle overlay (subPath mounts).
    {:ok, %{output: out}} =
      Sandbox.exec(
        sb,
        "env -u CURL_CA_BUNDLE -u SSL_CERT_FILE curl -sS --max-time 15 -o /dev/null -w '%{http_code}' https://allowed.test/"
      )

    assert out == "200"

    # The JVM's trust store, written in the pod by the condukt-trust init
    # container (read-only), byte for byte the store the BEAM builds for
    # the session CA, and the variable naming it.
    {:ok, %{output: out}} = Sandbox.exec(sb, ~S(stat -c %a /etc/condukt/trust-store.p12; echo "$JAVA_TOOL_OPTIONS"))

    assert out ==
             "444\n-Djavax.net.ssl.trustStore=/etc/condukt/trust-store.p12 -Djavax.net.ssl.trustStoreType=PKCS12\n"

    {:ok, %{output: ca_pem}} = Sandbox.exec(sb, "cat /etc/condukt/ca.pem")
    {:ok, %{output: store}} = Sandbox.exec(sb, "base64 -w0 /etc/condukt/trust-store.p12")
    assert Base.decode64!(store) == Condukt.Sandbox.NetworkPolicy.TrustStore.pkcs12(ca_pem)

    # deny
    assert curl(sb, "https://denied.test/") =~ ~r/ 403\n\z/

    assert_receive {:event, :request_denied, _, %{request: %{host: "denied.test"}, matched_rule: %{kind: :deny}}},
                   10_000

    refute_received {:asked, "denied.test", _}

    # decide, on the BEAM
    assert curl(sb, "https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000

    assert_receive {:event, :request_allowed, _, %{request: %{host: "decide.test"}, matched_rule: %{kind: :decide}}},
                   10_000

    assert curl(sb, "https://other.test/") =~ ~r/ 403\n\z/
    assert_receive {:asked, "other.test", ^id}, 10_000

    assert_receive {:event, :request_denied, _,
                    %{request: %{host: "other.test"}, matched_rule: %{kind: :decide}, reason: "the decider said no"}},
                   10_000

    # The workspace: the session CA, none of the sidecar's secrets, no NET_ADMIN.
    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "grep -q 'BEGIN CERTIFICATE' /etc/condukt/ca.pem")
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "ls /etc/condukt-egress")
    assert code != 0
    assert {:error, %Sandbox.Error{reason: :enoent}} = Sandbox.read(sb, "/etc/condukt-egress/ca.key")
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "iptables -t nat -F")
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

    # Reattach (a retried job): the bridge comes back, decisions still run here.
    :ok = Sandbox.shutdown(sb)

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes, id: id, namespace: tier.namespace, conn: conn, heartbeat_interval: false, network_policy: policy}
      )

    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000
    assert curl(sb, "https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000
    :ok = Sandbox.shutdown(sb)
  end

  # The kubelet restart case (issue 6, item 6): the node's kwok, which
  # serves the pod's exec and port-forward streams, is stopped while the
  # pod (and its sidecar) keeps running, so the control tunnel breaks at
  # the kubelet and every re-dial fails at the API server until it is back.
  # exec goes through that kubelet too, so the workspace's requests of the
  # outage are made by a script started before it: it waits (ss, in the
  # pod's network namespace) until the tunnel's connection to the
  # sidecar's control port is gone, then runs its curls. The sidecar's own
  # stdout (the pod log, written whatever the channel does) tells the test
  # when they are done.
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
    pod = Kubernetes.Names.pod_name(id)
    conn = [server: tier.server, ca_pem: File.read!(tier.ca), token: tier.token]

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes,
         id: id,
         namespace: tier.namespace,
         conn: conn,
         heartbeat_interval: false,
         host_aliases: tier.host_aliases,
         network_policy: policy,
         network_policy_image: tier.egress_image,
         network_policy_upstream_ca: tier.upstream_ca_pem,
         network_policy_allow_private: tier.allow_private}
      )

    on_exit(fn ->
      # A failed assertion may leave the kubelet down; the pod's deletion needs it.
      Runtime.start_kubelet(tier.runtime, tier.namespace, pod)
      Kubernetes.terminate(id, namespace: tier.namespace, conn: conn)
    end)

    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000
    assert curl(sb, "https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000
    assert_receive {:event, :request_allowed, _, %{request: %{host: "decide.test"}}}, 10_000
    bridge = sb.state.bridge

    port = Condukt.Sandbox.NetworkPolicy.K8s.Manifests.control_port()

    script = """
    tunnel() { ss -Htn state established '( sport = :#{port} )' | grep -q .; }
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
    # machine it may start late; it reads the emptyDir, here on the host).
    down_txt = Path.join([Runtime.pod(tier.runtime, tier.namespace, pod).dir, "volumes", "workspace", "down.txt"])

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
    :ok = Runtime.stop_kubelet(tier.runtime, tier.namespace, pod)
    assert_receive {:event, :control_disconnected, _, %{session_id: ^id}}, 15_000

    # The sidecar still gates the workspace: its pod log records the three
    # requests of the outage.
    log = Runtime.pod(tier.runtime, tier.namespace, pod).logs["condukt-egress"]

    outage = fn ->
      for line <- String.split(File.read!(log), "\n", trim: true),
          [_, _, _, json] <- [String.split(line, " ", parts: 4)],
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
    :ok = Runtime.start_kubelet(tier.runtime, tier.namespace, pod)
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

  test "workspace_source clones through the sidecar; the file operations work in the pod's emptyDir; a reattach keeps the checkout",
       %{tier: tier} do
    tb = tier.testbed
    id = "git-#{System.unique_integer([:positive])}"
    conn = [server: tier.server, ca_pem: File.read!(tier.ca), token: tier.token]

    opts = [
      id: id,
      namespace: tier.namespace,
      conn: conn,
      heartbeat_interval: false,
      host_aliases: tier.host_aliases,
      network_policy: [rules: [allow: ["git.test"]], default: :deny],
      network_policy_image: tier.egress_image,
      network_policy_upstream_ca: tier.upstream_ca_pem,
      network_policy_allow_private: tier.allow_private,
      workspace_source: [git: tb.git.url, ref: "main"]
    ]

    {:ok, sb} = Sandbox.new({Kubernetes, opts})
    on_exit(fn -> Kubernetes.terminate(id, namespace: tier.namespace, conn: conn) end)

    assert {:ok, %{output: head, exit_code: 0}} = Sandbox.exec(sb, "git rev-parse HEAD")
    assert String.trim(head) == tb.git.head
    assert {:ok, "# repo.git\n" <> _} = Sandbox.read(sb, "README.md")
    assert {:ok, ["README.md", "data.txt"]} = Sandbox.glob(sb, "*")
    assert {:ok, [%{path: "data.txt", line_number: 42, line: "line 42"}]} = Sandbox.grep(sb, "^line 42$")

    # Work in progress survives a reattach (same id): the checkout is reused.
    :ok = Sandbox.write(sb, "notes/wip.md", "- half done\n")
    :ok = Sandbox.edit(sb, "README.md", "Served by", "Cloned from")
    :ok = Sandbox.shutdown(sb)

    {:ok, sb} = Sandbox.new({Kubernetes, opts})
    assert {:ok, "- half done\n"} = Sandbox.read(sb, "notes/wip.md")
    assert {:ok, readme} = Sandbox.read(sb, "README.md")
    assert readme =~ "Cloned from"
    assert {:ok, %{output: head}} = Sandbox.exec(sb, "git rev-parse HEAD")
    assert String.trim(head) == tb.git.head
    :ok = Sandbox.shutdown(sb)
  end

  test "a sidecar that cannot start: init gives up at :ready_timeout naming the failed container", %{tier: tier} do
    id = "bad-#{System.unique_integer([:positive])}"
    conn = [server: tier.server, ca_pem: File.read!(tier.ca), token: tier.token]

    assert {:error, %Sandbox.Error{reason: :timeout, op: :new} = e} =
             Sandbox.new({
               Kubernetes,
               # an image the runtime does not map to the sidecar binary
               id: id,
               namespace: tier.namespace,
               conn: conn,
               ready_timeout: 10_000,
               network_policy: [rules: [allow: ["allowed.test"]]],
               network_policy_image: "registry.example/not-the-sidecar:1"
             })

    Kubernetes.terminate(id, namespace: tier.namespace, conn: conn)
    message = Exception.message(e)
    assert message =~ "did not reach Running within 10000 ms"
    assert message =~ "condukt-netfilter"
  end
end
