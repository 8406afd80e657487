defmodule Condukt.K8s.ExecPortforwardSmokeTest do
  # Feasibility proof for the Kubernetes tier (docs/k8s-tier.md): a pod
  # bound to a node whose kwok runs inside its own network namespace; exec
  # and port-forward over the API server's WebSocket, as the
  # ServiceAccount, reach into that namespace.
  use Condukt.Test.K8s.Case, async: false

  alias Condukt.Dev.Netns.Cmd

  @port 18_080
  @client Path.expand("../../support/k8s/ws_client.py", __DIR__)

  if System.cmd("id", ["-u"]) != {"0\n", 0} do
    @moduletag skip: "kubernetes tier: exec into a node's network namespace needs root"
  end

  setup_all do
    # WebSocket exec and port-forward are HTTP GETs: the API server
    # authorizes them as `get` on pods/exec and pods/portforward, and since
    # 1.35 also as `create`. The seeds' Role grants only `create`, which is
    # enough for SPDY (POST) but not for WebSocket; the test below shows the
    # 403, and the documented Role (Cluster.role_rules/0) adds `get`
    # (docs/k8s-tier.md, RBAC).
    c = Cluster.start()
    {c, node} = Cluster.add_netns_node!(c, forward_ports: [@port])

    pod = %{
      apiVersion: "v1",
      kind: "Pod",
      metadata: %{name: "ns-smoke"},
      spec: %{
        nodeName: node.name,
        automountServiceAccountToken: false,
        containers: [%{name: "workspace", image: "debian:bookworm-slim", command: ["sleep", "infinity"]}]
      }
    }

    {201, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{c.namespace}/pods", pod)

    :ok =
      Cluster.wait_until(fn ->
        match?(
          {200, %{"status" => %{"phase" => "Running"}}},
          Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{c.namespace}/pods/ns-smoke")
        )
      end)

    %{cluster: c, node: node}
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

  test "exec over v5.channel.k8s.io runs the command in the node's network namespace", %{cluster: c, node: node} do
    res = exec(c, ["/usr/sbin/ip", "netns", "identify"])
    assert res["protocol"] == "v5.channel.k8s.io"
    assert String.trim(res["stdout"]) == node.netns
    assert %{"status" => "Success"} = res["status"]

    # Only the namespace's loopback: no host interface is visible.
    res = exec(c, ["/usr/sbin/ip", "-o", "link"])
    assert [_lo] = String.split(res["stdout"], "\n", trim: true)
  end

  test "with exactly the seeds' Role (create only), WebSocket exec and port-forward are forbidden", %{cluster: c} do
    ns = "seedrole"
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{metadata: %{name: ns}})
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: "seed"}})

    Cluster.request!(c, :admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/roles", %{
      metadata: %{name: "seed"},
      rules: Cluster.seed_role_rules()
    })

    Cluster.request!(c, :admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/rolebindings", %{
      metadata: %{name: "seed"},
      subjects: [%{kind: "ServiceAccount", name: "seed", namespace: ns}],
      roleRef: %{kind: "Role", name: "seed", apiGroup: "rbac.authorization.k8s.io"}
    })

    %{"status" => %{"token" => token}} =
      Cluster.request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts/seed/token", %{
        spec: %{audiences: ["https://kubernetes.default.svc"], expirationSeconds: 600}
      })

    {_, out} = ws(c, ["exec", c.server, Cluster.ca(c), token, ns, "any", "workspace", "--", "true"])
    assert out =~ "HTTP 403"
    {_, out} = ws(c, ["portforward", c.server, Cluster.ca(c), token, ns, "any", "80", "x"])
    assert out =~ "HTTP 403"
  end

  # kwok v0.8.0 copies stdin into the command's pipe and never closes it
  # (pkg/utils/exec: io.Copy without Close), so `cat` never sees EOF:
  # docs/k8s-tier.md, "Gaps".
  @tag skip: "kwok v0.8.0 never closes an exec'd command's stdin (docs/k8s-tier.md)"
  test "exec streams stdin and closes it (v5 close signal)", %{cluster: c} do
    file = Path.join(System.tmp_dir!(), "k8s-stdin-#{System.unique_integer([:positive])}")
    File.write!(file, "hello through stdin\n")
    res = exec(c, ["/bin/cat"], ["--stdin", file])
    File.rm(file)
    assert res["stdout"] == "hello through stdin\n"
    assert %{"status" => "Success"} = res["status"]
  end

  test "exec reports a non-zero exit and stderr", %{cluster: c} do
    res = exec(c, ["/bin/sh", "-c", "echo oops >&2; exit 3"])
    assert res["stderr"] =~ "oops"
    assert %{"status" => "Failure"} = res["status"]
    IO.puts("exit-status shape from kwok: #{inspect(res["status"])}")
  end

  test "port-forward over v4.channel.k8s.io reaches a listener inside the namespace", %{cluster: c, node: node} do
    # A one-shot echo server inside the namespace, on the forwarded port.
    script =
      "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('127.0.0.1',#{@port}));s.listen();c,_=s.accept();c.sendall(b'pong:'+c.recv(100));c.close()"

    server =
      Task.async(fn ->
        Cmd.run(["/usr/sbin/ip", "netns", "exec", node.netns, "/usr/bin/python3", "-c", script], timeout: 20_000)
      end)

    Process.sleep(500)

    {status, out} =
      ws(c, ["portforward", c.server, Cluster.ca(c), c.token, c.namespace, "ns-smoke", "#{@port}", "ping"])

    assert status == 0, out
    res = :jiffy.decode(out |> String.split("\n", trim: true) |> List.last(), [:return_maps])
    assert res["data"] == "pong:ping", out
    assert {_, 0} = Task.await(server, 25_000)
  end
end
