defmodule Condukt.K8s.KubernetesControlTest do
  # The network policy of Condukt.Sandbox.Kubernetes end to end through the
  # real API server: the pod's objects, a ControlBridge that reaches the
  # sidecar's control port through a `kube_forward` listener (a
  # port-forward WebSocket per connection), decide rules answered on the
  # BEAM, telemetry, and the bridge re-dialling after the tunnel drops.
  #
  # Stand-in for the tier's pod runtime (docs/kubernetes.md, "The tier's
  # pod runtime"): kwok runs nothing, so this test starts the real
  # `netfilter-setup` and `condukt-egress proxy` itself, inside the netns
  # node's namespace, from the files of the pod's own `<pod>-egress`
  # Secret, as the init containers of the pod manifest would. The workspace
  # (kwok's exec) shares that namespace, so its curl goes through the real
  # iptables rules and the real sidecar. Needs root.
  use Condukt.Test.K8s.Case, async: false

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Dev.Netns.Cmd

  if System.cmd("id", ["-u"]) != {"0\n", 0} do
    @moduletag skip: "kubernetes tier: a sidecar in a node's network namespace needs root"
  end

  @events [
    [:condukt, :sandbox, :network_policy, :request_allowed],
    [:condukt, :sandbox, :network_policy, :request_denied],
    [:condukt, :sandbox, :network_policy, :control_connected],
    [:condukt, :sandbox, :network_policy, :control_disconnected]
  ]

  setup_all do
    c = Cluster.start()
    {c, node} = Cluster.add_netns_node!(c, forward_ports: [15_002])
    # A route out of the namespace (to nowhere), so that connect() to a
    # test address reaches the OUTPUT chain, where netfilter-setup's rules
    # send it to the sidecar.
    ip = "/usr/sbin/ip"
    Cmd.run!([ip, "-n", node.netns, "link", "add", "out0", "type", "veth", "peer", "name", "out1"])
    Cmd.run!([ip, "-n", node.netns, "addr", "add", "10.9.9.1/24", "dev", "out0"])
    Cmd.run!([ip, "-n", node.netns, "link", "set", "out0", "up"])
    Cmd.run!([ip, "-n", node.netns, "link", "set", "out1", "up"])
    Cmd.run!([ip, "-n", node.netns, "route", "add", "default", "dev", "out0"])
    ws = Path.join(node.dir, "workspace")
    File.mkdir_p!(ws)
    %{cluster: c, node: node, ws: ws}
  end

  # The pod's init containers, by hand: netfilter-setup as root, then the
  # proxy as uid 1337 with only CAP_NET_ADMIN, from the Secret's files.
  defp start_sidecar!(c, node, pod, netfilter? \\ true) do
    %{"data" => data} = Cluster.request!(c, :admin, "GET", "/api/v1/namespaces/#{c.namespace}/secrets/#{pod}-egress")
    dir = Path.join(node.dir, "egress-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    bin = Path.join(dir, "condukt-egress")
    File.cp!(Condukt.egress_binary(), bin)
    File.chmod!(bin, 0o755)
    mozilla = Path.join(dir, "mozilla.pem")
    File.cp!(Condukt.Sandbox.NetworkPolicy.CA.mozilla_path(), mozilla)
    # File.cp!/2 keeps the source's mode, which a checkout's umask decides.
    File.chmod!(mozilla, 0o444)

    for {key, b64} <- data do
      path = Path.join(dir, key)
      File.write!(path, Base.decode64!(b64))
      File.chmod!(path, 0o400)
      File.chown!(path, 1337)
    end

    File.chmod!(dir, 0o711)

    if netfilter? do
      Cmd.run!(["/usr/sbin/ip", "netns", "exec", node.netns, bin | ~w(netfilter-setup --proxy-port 15001 --mark 0x539)])
    end

    # The sidecar's own command from the pod manifest, its /etc/condukt-egress
    # files where this test wrote them.
    %{"spec" => %{"initContainers" => inits}} =
      Cluster.request!(c, :admin, "GET", "/api/v1/namespaces/#{c.namespace}/pods/#{pod}")

    ["/usr/local/bin/condukt-egress" | args] = Enum.find(inits, &(&1["name"] == "condukt-egress"))["command"]

    args =
      Enum.map(args, &String.replace(&1, "/etc/condukt-egress", dir)) ++ ["--trust-bundle", mozilla, "--mark", "0x539"]

    argv =
      ["/usr/sbin/ip", "netns", "exec", node.netns, "/usr/bin/setpriv", "--reuid=1337", "--regid=1337"] ++
        ["--clear-groups", "--inh-caps=+net_admin", "--ambient-caps=+net_admin", "--", bin | args]

    stderr = Path.join(dir, "proxy.stderr")
    script = ~S(err=$1; shift; setsid "$@" </dev/null >/dev/null 2>>"$err" & echo $!)
    pid = Cmd.run!(["/bin/sh", "-c", script, "sh", stderr | argv]) |> String.trim() |> String.to_integer()

    if Cmd.poll(fn -> File.read!(stderr) =~ "proxy ready" end, 15_000) != :ok do
      flunk("the sidecar did not get ready within 15 s; its stderr:\n#{File.read!(stderr)}")
    end

    ExUnit.Callbacks.on_exit(fn -> Cmd.kill([pid]) end)
    pid
  end

  defp curl(sb, host) do
    {:ok, %{output: out}} =
      Sandbox.exec(
        sb,
        "curl -sS -m 10 -o /dev/null -w '%{http_code}' --resolve #{host}:80:10.9.9.9 http://#{host}/ 2>/dev/null; true"
      )

    out
  end

  test "decide rules run on the BEAM through the port-forward; the bridge re-dials after the tunnel drops",
       %{cluster: c, node: node, ws: ws} do
    test_pid = self()
    handler = "kube-control-#{System.unique_integer([:positive])}"

    :telemetry.attach_many(
      handler,
      @events,
      fn event, m, meta, _ -> send(test_pid, {:event, List.last(event), m, meta}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach(handler) end)

    decider = fn _ctx, req ->
      send(test_pid, {:asked, req.host})
      if req.host == "10.9.9.9", do: :allow, else: {:deny, "not this one"}
    end

    policy = [rules: [deny: ["blocked.test"], decide: [call: decider, cache: false]], default: :deny]
    # 10.9.9.9 stands for an upstream; the sidecar refuses private
    # addresses unless told otherwise.
    id = "ctl-#{System.unique_integer([:positive])}"
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes,
         id: id,
         namespace: c.namespace,
         conn: conn,
         cwd: ws,
         node_selector: %{"kubernetes.io/hostname" => node.name},
         heartbeat_interval: false,
         network_policy: policy,
         network_policy_allow_private: ["10.9.9.0/24"]}
      )

    on_exit(fn -> Kubernetes.terminate(id, namespace: c.namespace, conn: conn) end)
    pod = Kubernetes.pod_name(id)
    # The forward listener is a Unix socket in a private directory.
    assert %File.Stat{mode: mode} = File.stat!(sb.state.forward_dir)
    assert Bitwise.band(mode, 0o777) == 0o700

    sidecar = start_sidecar!(c, node, pod)
    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000

    # A static deny: the sidecar alone.
    assert curl(sb, "blocked.test") == "403"

    assert_receive {:event, :request_denied, _, %{request: %{host: "blocked.test"}, matched_rule: %{kind: :deny}}},
                   10_000

    refute_received {:asked, "blocked.test"}

    # The decider, on the BEAM, through the tunnel.
    assert curl(sb, "ask-deny.test") == "403"
    assert_receive {:asked, "ask-deny.test"}, 10_000

    assert_receive {:event, :request_denied, _, %{request: %{host: "ask-deny.test"}, matched_rule: %{kind: :decide}}},
                   10_000

    # (nothing answers at 10.9.9.9: the request is allowed, then fails)
    {:ok, _} = Sandbox.exec(sb, "curl -sS -m 3 -o /dev/null http://10.9.9.9/ 2>/dev/null; true")
    assert_receive {:asked, "10.9.9.9"}, 10_000

    assert_receive {:event, :request_allowed, _, %{request: %{host: "10.9.9.9"}, matched_rule: %{kind: :decide}}},
                   10_000

    # The tunnel drops (the sidecar goes away); the bridge re-dials
    # through the same listener once a sidecar listens again.
    Cmd.kill([sidecar])
    # (the tunnel may not report the drop: the bridge's ping finds it)
    assert_receive {:event, :control_disconnected, _, %{session_id: ^id}}, 30_000
    _sidecar = start_sidecar!(c, node, pod, false)
    assert_receive {:event, :control_connected, _, %{session_id: ^id}}, 30_000
    assert curl(sb, "ask-deny.test") == "403"
    assert_receive {:asked, "ask-deny.test"}, 10_000

    :ok = Sandbox.shutdown(sb)
  end
end
