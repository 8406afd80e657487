defmodule Condukt.K8s.ExecPortforwardSmokeTest do
  # The API server's WebSocket exec (v5.channel.k8s.io) and port-forward
  # (v4.channel.k8s.io) to a real kubelet (docs/k8s-tier.md, "The real
  # node"), as the ServiceAccount with the documented Role, and the 403
  # with upstream's create-only Role (docs/k8s-tier.md, RBAC).
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Dev.Netns.Cmd

  @port 18_080
  @client Path.expand("../../support/k8s/ws_client.py", __DIR__)

  setup_all do
    tier = Condukt.Test.K8s.Case.start_node_tier!()
    c = tier.cluster

    # A one-shot echo server in the pod, on @port (loopback only: the
    # kubelet's port-forward enters the pod's network namespace).
    server =
      "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);" <>
        "s.bind(('127.0.0.1',#{@port}));s.listen()\nwhile True:\n c,_=s.accept();c.sendall(b'pong:'+c.recv(100));c.close()"

    pod = %{
      apiVersion: "v1",
      kind: "Pod",
      metadata: %{name: "ns-smoke"},
      spec: %{
        automountServiceAccountToken: false,
        containers: [
          %{name: "workspace", image: "condukt.test/workspace-tools:bookworm", command: ["python3", "-c", server]}
        ]
      }
    }

    {201, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{c.namespace}/pods", pod)

    :ok =
      Cluster.wait_until(
        fn ->
          match?(
            {200, %{"status" => %{"phase" => "Running"}}},
            Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{c.namespace}/pods/ns-smoke")
          )
        end,
        60_000
      )

    %{cluster: c, node: tier.node}
  end

  defp ws(_c, args) do
    {out, status} = Cmd.run(["/usr/bin/python3", @client | args], timeout: 30_000, stderr: :stdout)
    {status, out}
  end

  defp exec(c, argv, extra \\ []) do
    {status, out} =
      ws(c, ["exec", c.server, Cluster.ca(c), c.token, c.namespace, "ns-smoke", "workspace"] ++ extra ++ ["--" | argv])

    assert status == 0, out
    :jiffy.decode(out |> String.split("\n", trim: true) |> List.last(), [:return_maps])
  end

  test "exec over v5.channel.k8s.io runs the command in the pod's own network namespace", %{cluster: c} do
    res = exec(c, ["cat", "/proc/net/dev"])
    assert res["protocol"] == "v5.channel.k8s.io"
    assert %{"status" => "Success"} = res["status"]
    # The pod's loopback and its veth end on the node's bridge, nothing else.
    assert res["stdout"] =~ "lo:"
    assert res["stdout"] =~ "eth0:"
    refute res["stdout"] =~ "cnik0"
  end

  test "with exactly the seeds' Role (create only), WebSocket exec and port-forward are forbidden", %{cluster: c} do
    ns = "seedrole"
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{metadata: %{name: ns}})
    token = Cluster.bound_token!(c, ns, "seed", Cluster.seed_role_rules())

    {_, out} = ws(c, ["exec", c.server, Cluster.ca(c), token, ns, "any", "workspace", "--", "true"])
    assert out =~ "HTTP 403"
    {_, out} = ws(c, ["portforward", c.server, Cluster.ca(c), token, ns, "any", "80", "x"])
    assert out =~ "HTTP 403"
  end

  test "exec streams stdin and closes it (v5 close signal)", %{cluster: c} do
    file = Path.join(System.tmp_dir!(), "k8s-stdin-#{System.unique_integer([:positive])}")
    File.write!(file, "hello through stdin\n")
    res = exec(c, ["/bin/cat"], ["--stdin", file])
    File.rm(file)
    assert res["stdout"] == "hello through stdin\n"
    assert %{"status" => "Success"} = res["status"]
  end

  test "exec reports a non-zero exit as NonZeroExitCode with the code, and stderr", %{cluster: c} do
    res = exec(c, ["/bin/sh", "-c", "echo oops >&2; exit 3"])
    assert res["stderr"] =~ "oops"

    assert %{"status" => "Failure", "reason" => "NonZeroExitCode", "details" => %{"causes" => causes}} = res["status"]

    assert %{"reason" => "ExitCode", "message" => "3"} in causes
  end

  test "port-forward over v4.channel.k8s.io reaches a listener on the pod's loopback", %{cluster: c} do
    {status, out} =
      ws(c, ["portforward", c.server, Cluster.ca(c), c.token, c.namespace, "ns-smoke", "#{@port}", "ping"])

    assert status == 0, out
    res = :jiffy.decode(out |> String.split("\n", trim: true) |> List.last(), [:return_maps])
    assert res["data"] == "pong:ping", out
  end
end
