defmodule Condukt.K8s.RealNodeTest do
  # The real node (docs/k8s-tier.md, "The real node"): kubelet, containerd,
  # runc and the CNI bridge in the netns testbed's pod namespace, running
  # pods from the images of scripts/k8s/images.sh imported into containerd
  # (no registry: IfNotPresent finds them). Exec, logs and port-forward go
  # through the API server to the real kubelet.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Dev.Netns.{Cmd, Testbed}
  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests
  alias Condukt.Test.K8s.Node

  @client Path.expand("../../support/k8s/ws_client.py", __DIR__)
  @tools_image "condukt.test/workspace-tools:bookworm"

  setup_all do
    Condukt.Test.K8s.Case.start_node_tier!()
  end

  # A Kubernetes sandbox with `policy` on the real node, as the
  # ServiceAccount, names resolved by cluster DNS (no hostAliases);
  # terminated on exit.
  defp policy_sandbox!(ctx, id, policy, extra \\ []) do
    c = ctx.cluster
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]

    opts = [
      id: id,
      namespace: c.namespace,
      conn: conn,
      image: @tools_image,
      heartbeat_interval: false,
      network_policy: policy,
      network_policy_image: ctx.egress_image,
      network_policy_upstream_ca: ctx.upstream_ca_pem,
      network_policy_allow_private: ctx.allow_private
    ]

    {:ok, sb} = Sandbox.new({Kubernetes, opts ++ extra})

    on_exit({:terminate, id}, fn -> Kubernetes.terminate(id, namespace: c.namespace, conn: conn) end)
    sb
  end

  defp pod_path(c, name), do: "/api/v1/namespaces/#{c.namespace}/pods/#{name}"

  defp run_pod!(c, node, name, spec, labels \\ %{}) do
    pod = %{apiVersion: "v1", kind: "Pod", metadata: %{name: name, labels: labels}, spec: spec}
    {201, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{c.namespace}/pods", pod)

    case Cluster.wait_until(
           fn ->
             match?({200, %{"status" => %{"phase" => "Running"}}}, Cluster.request(c, :sa, "GET", pod_path(c, name)))
           end,
           60_000
         ) do
      :ok ->
        :ok

      _ ->
        flunk("""
        pod #{name} not Running: #{inspect(Cluster.request(c, :admin, "GET", pod_path(c, name)))}
        kubelet: #{Node.tail_log(node, :kubelet, 30)}
        """)
    end
  end

  defp exec(c, pod, argv, extra \\ []) do
    {out, status} =
      Cmd.run(
        ["/usr/bin/python3", @client, "exec", c.server, Cluster.ca(c), c.token, c.namespace, pod, "workspace"] ++
          extra ++ ["--" | argv],
        timeout: 30_000,
        stderr: :stdout
      )

    assert status == 0, out
    :jiffy.decode(out |> String.split("\n", trim: true) |> List.last(), [:return_maps])
  end

  test "a pod from the imported images runs on the real kubelet (IfNotPresent, no registry)",
       %{cluster: c, node: node} do
    run_pod!(c, node, "plain", %{
      automountServiceAccountToken: false,
      containers: [
        %{
          name: "workspace",
          image: "debian:bookworm-slim",
          imagePullPolicy: "IfNotPresent",
          command: ["sleep", "infinity"]
        }
      ]
    })

    {200, pod} = Cluster.request(c, :sa, "GET", pod_path(c, "plain"))
    assert pod["spec"]["nodeName"] == node.name
    assert [%{"ready" => true, "imageID" => image_id}] = pod["status"]["containerStatuses"]
    assert image_id =~ "sha256:"
    # Its own network namespace on the node's bridge.
    assert pod["status"]["podIP"] =~ ~r/^10\.244\.0\./

    # The image's file system, not the host's.
    res = exec(c, "plain", ["cat", "/etc/debian_version"])
    assert res["stdout"] =~ ~r/^12\./

    # (stdin and exit codes through this kubelet: exec_portforward_smoke_test.exs)
  end

  test "Condukt.Sandbox.Kubernetes with a network policy: the sidecar image on the real kubelet allows and denies",
       ctx do
    me = self()
    handler = "real-node-#{System.unique_integer([:positive])}"

    :telemetry.attach_many(
      handler,
      [
        [:condukt, :sandbox, :network_policy, :request_allowed],
        [:condukt, :sandbox, :network_policy, :request_denied],
        [:condukt, :sandbox, :network_policy, :control_connected],
        [:condukt, :sandbox, :network_policy, :control_disconnected]
      ],
      fn e, _m, meta, _ -> send(me, {:event, List.last(e), meta}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach(handler) end)
    c = ctx.cluster
    id = "real-#{System.unique_integer([:positive])}"

    decider = fn sctx, req ->
      send(me, {:asked, req.host, sctx.session_id})
      if req.host == "decide.test", do: :allow, else: {:deny, "the decider said no"}
    end

    sb =
      policy_sandbox!(ctx, id,
        rules: [deny: ["denied.test"], allow: ["allowed.test"], decide: [call: decider, cache: false]],
        default: :deny
      )

    assert_receive {:event, :control_connected, %{session_id: ^id}}, 30_000

    curl = fn url ->
      {:ok, %{output: out}} =
        Sandbox.exec(sb, "curl -sS --max-time 15 -o /dev/stdout -w ' %{http_code}\\n' #{url} 2>/dev/null; true")

      out
    end

    assert_allowed!(c, sb, id, curl)
    # deny: refused by the sidecar (at the workspace's DNS, which is
    # redirected to it, or at the request), never asked of the decider.
    assert curl.("https://denied.test/") =~ ~r/\A( 000\n|.*refused by: rule 0 \(deny\).* 403\n)\z/s
    assert_receive {:event, :request_denied, %{request: %{host: "denied.test"}}}, 10_000
    refute_received {:asked, "denied.test", _}

    # decide, on the BEAM: the name gets the synthetic address, the
    # request is redirected to the sidecar, which asks the decider here
    # through the control channel and resolves the name itself.
    assert curl.("https://decide.test/") =~ ~r/ 200\n\z/
    assert_receive {:asked, "decide.test", ^id}, 10_000

    assert_receive {:event, :request_allowed, %{request: %{host: "decide.test"}, matched_rule: %{kind: :decide}}},
                   10_000

    assert curl.("https://other.test/") =~ ~r/ 403\n\z/
    assert_receive {:asked, "other.test", ^id}, 10_000

    # The sidecar's secrets (CA key, token, policy) are not in the
    # workspace's file system, and it cannot change the pod's rules.
    for f <- ~w(ca.key token policy.json) do
      assert {:error, %Sandbox.Error{}} = Sandbox.read(sb, "/etc/condukt-egress/" <> f)
    end

    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "cat /etc/condukt-egress/ca.key 2>&1")
    assert code != 0
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "iptables -t nat -F 2>&1")
    assert code != 0

    # The sidecar container killed on the node: the kubelet restarts it
    # (a native sidecar, restartPolicy Always). While it is down nothing
    # gets out; the control channel comes back with the new process.
    pod = Kubernetes.Names.pod_name(id)
    {200, before} = Cluster.request(c, :admin, "GET", pod_path(c, pod))
    %{"containerID" => "containerd://" <> cid, "restartCount" => 0} = sidecar_status(before)
    # The kubelet is held (SIGSTOP) meanwhile, so the outage is certain
    # to last while the workspace tries.
    kubelet = Node.kubelet_pid(ctx.node)
    {_, 0} = System.cmd("kill", ["-STOP", "#{kubelet}"])

    try do
      {_, 0} = Node.ctr(ctx.node, ["tasks", "kill", "--signal", "SIGKILL", cid])
      assert_receive {:event, :control_disconnected, %{session_id: ^id}}, 30_000
      # exec needs the kubelet: the workspace's attempt runs in the pod
      # through containerd directly.
      {out, _} =
        Node.ctr(ctx.node, [
          "tasks",
          "exec",
          "--exec-id",
          "probe-#{System.unique_integer([:positive])}",
          workspace_id(before),
          "sh",
          "-c",
          "curl -sS --max-time 5 -o /dev/null -w '%{http_code}' https://allowed.test/ 2>&1; echo \" exit=$?\""
        ])

      refute out =~ "200"
      assert out =~ ~r/exit=(7|28|35|6)/
    after
      System.cmd("kill", ["-CONT", "#{kubelet}"])
    end

    # (DNS events aside: with the pod's search path, a catch-all decide
    # rule answers every search-expanded name with the synthetic address.)
    refute_received {:event, :request_allowed, %{request: %{scheme: :https}}}
    refute_received {:event, :request_allowed, %{request: %{scheme: :http}}}

    assert_receive {:event, :control_connected, %{session_id: ^id}}, 60_000

    :ok =
      Cluster.wait_until(
        fn ->
          {200, p} = Cluster.request(c, :admin, "GET", pod_path(c, pod))
          match?(%{"restartCount" => 1, "started" => true}, sidecar_status(p))
        end,
        60_000
      )

    assert_allowed!(c, sb, id, curl)
  end

  # allowed.test through the sidecar, or a failure that shows why.
  defp assert_allowed!(c, sb, id, curl) do
    first = curl.("https://allowed.test/")

    if first != "hello from allowed.test\n 200\n" do
      {:ok, %{output: v}} = Sandbox.exec(sb, "curl -v --max-time 15 https://allowed.test/ 2>&1; cat /etc/resolv.conf")
      path = pod_path(c, Kubernetes.Names.pod_name(id)) <> "/log?container=condukt-egress"
      {_, log} = Cluster.request(c, :admin, "GET", path)
      flunk("curl: #{inspect(first)}\n#{v}\nsidecar log:\n#{inspect(log)}")
    end

    assert_receive {:event, :request_allowed, %{request: %{host: "allowed.test"}}}, 10_000
  end

  defp workspace_id(pod) do
    %{"containerID" => "containerd://" <> cid} =
      Enum.find(pod["status"]["containerStatuses"], &(&1["name"] == "workspace"))

    cid
  end

  defp sidecar_status(pod) do
    Enum.find(pod["status"]["initContainerStatuses"] || [], &(&1["name"] == "condukt-egress")) || %{}
  end

  defp tools_pod!(c, node, name, labels) do
    run_pod!(
      c,
      node,
      name,
      %{
        automountServiceAccountToken: false,
        containers: [%{name: "workspace", image: @tools_image, command: ["sleep", "infinity"]}]
      },
      labels
    )
  end

  test "the NetworkPolicy object alone blocks a pod without the init rules; cluster DNS resolves", ctx do
    c = ctx.cluster
    inet = ctx.testbed.inet.v4
    bypass = "http://#{inet}:8080/"

    # The sandbox's own NetworkPolicy (egress only to 53, 80, 443), over a
    # pod carrying the sandbox label but none of its init containers.
    labels = %{"condukt.dev/sandbox" => "np-caged"}
    np = Manifests.network_policy(%{pod: "np-caged", namespace: c.namespace, labels: labels})

    {201, _} =
      Cluster.request(c, :sa, "POST", "/apis/networking.k8s.io/v1/namespaces/#{c.namespace}/networkpolicies", np)

    tools_pod!(c, ctx.node, "np-caged", labels)
    tools_pod!(c, ctx.node, "np-free", %{"condukt.dev/sandbox" => "np-other"})

    curl = fn pod, url ->
      exec(c, pod, ["sh", "-c", "curl -sS --http0.9 --max-time 5 #{url} 2>&1; echo \" exit=$?\""])["stdout"]
    end

    # Without the policy the bypass port answers ...
    assert curl.("np-free", bypass) =~ "bypass-tcp-ok"
    seen = length(bypass_tcp(ctx.testbed))
    assert seen >= 1
    # ... with it, nothing leaves on 8080 (kube-router's filter drops it in
    # the node), while 80 is allowed by the same object.
    assert curl.("np-caged", bypass) =~ ~r/exit=(7|28)/
    assert curl.("np-caged", "http://#{inet}/") =~ "exit=0"
    assert length(bypass_tcp(ctx.testbed)) == seen

    # Cluster DNS: the pod's resolver is CoreDNS on the node, which knows
    # the cluster's names and forwards the rest to the "internet".
    res = exec(c, "np-caged", ["cat", "/etc/resolv.conf"])
    assert res["stdout"] =~ "nameserver #{ctx.node.ip}"
    assert res["stdout"] =~ "svc.cluster.local"
    assert exec(c, "np-caged", ["getent", "hosts", "allowed.test"])["stdout"] =~ inet
    assert exec(c, "np-free", ["getent", "hosts", "kubernetes.default"])["stdout"] =~ "10.96.0.1"
  end

  defp bypass_tcp(tb), do: Enum.filter(Testbed.bypass_log(tb), &(&1["proto"] == "tcp"))

  test "Pod Security: the sandbox namespace enforces privileged; baseline refuses the sidecar's pod", %{cluster: c} do
    {200, ns} = Cluster.request(c, :admin, "GET", "/api/v1/namespaces/#{c.namespace}")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

    # The same init containers in a namespace at baseline: refused at
    # admission (NET_ADMIN and NET_RAW are beyond baseline).
    other = "baseline-#{c.id}"

    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{
      metadata: %{name: other, labels: %{"pod-security.kubernetes.io/enforce" => "baseline"}}
    })

    p = %{
      pod: "psa",
      namespace: other,
      labels: %{"condukt.dev/sandbox" => "psa"},
      image: "condukt.test/none:1",
      session_id: "psa"
    }

    pod = %{
      apiVersion: "v1",
      kind: "Pod",
      metadata: %{name: "psa"},
      spec: %{
        initContainers: Manifests.init_containers(p),
        containers: [%{name: "workspace", image: "debian:bookworm-slim", command: ["sleep", "infinity"]}],
        volumes: Manifests.volumes(p)
      }
    }

    assert {403, %{"message" => msg}} = Cluster.request(c, :admin, "POST", "/api/v1/namespaces/#{other}/pods", pod)
    assert msg =~ "violates PodSecurity"
    assert msg =~ "NET_ADMIN"
  end

  test "a kubelet restart: the pod keeps running, exec and the control channel come back", ctx do
    me = self()
    handler = "real-node-restart-#{System.unique_integer([:positive])}"

    :telemetry.attach(
      handler,
      [:condukt, :sandbox, :network_policy, :control_connected],
      fn _, _, meta, _ -> send(me, {:connected, meta.session_id}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach(handler) end)
    c = ctx.cluster
    id = "restart-#{System.unique_integer([:positive])}"
    sb = policy_sandbox!(ctx, id, rules: [allow: ["allowed.test"]], default: :deny)
    assert_receive {:connected, ^id}, 30_000
    :ok = Sandbox.write(sb, "before.txt", "kept\n")
    {200, before} = Cluster.request(c, :admin, "GET", pod_path(c, Kubernetes.Names.pod_name(id)))

    Node.restart_kubelet!(ctx.node, c, 3_000)

    # The same containers (no restart), the same files; exec works again
    # and the control channel is re-dialled through a new port-forward.
    {200, after_} = Cluster.request(c, :admin, "GET", pod_path(c, Kubernetes.Names.pod_name(id)))
    assert workspace_id(after_) == workspace_id(before)
    assert sidecar_status(after_)["containerID"] == sidecar_status(before)["containerID"]

    :ok = Cluster.wait_until(fn -> match?({:ok, %{output: "kept\n"}}, Sandbox.exec(sb, "cat before.txt")) end, 60_000)

    assert_receive {:connected, ^id}, 60_000

    {:ok, %{output: out}} =
      Sandbox.exec(sb, "curl -sS --max-time 15 -o /dev/null -w '%{http_code}' https://allowed.test/")

    assert out == "200"
  end

  test "a Service: kube-proxy's rules and cluster DNS lead a pod to another pod", %{cluster: c, node: node} do
    run_pod!(
      c,
      node,
      "web",
      %{
        automountServiceAccountToken: false,
        containers: [
          %{
            name: "workspace",
            image: @tools_image,
            command: [
              "sh",
              "-c",
              "mkdir -p /srv && echo served-by-web >/srv/index.html && exec python3 -m http.server -d /srv 8000"
            ]
          }
        ]
      },
      %{"app" => "web"}
    )

    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces/#{c.namespace}/services", %{
      metadata: %{name: "web"},
      spec: %{selector: %{"app" => "web"}, ports: [%{port: 80, targetPort: 8000}]}
    })

    tools_pod!(c, node, "web-client", %{})
    url = "http://web.#{c.namespace}.svc.cluster.local/"

    :ok =
      Cluster.wait_until(
        fn -> exec(c, "web-client", ["curl", "-sS", "--max-time", "3", url])["stdout"] == "served-by-web\n" end,
        60_000
      )
  end

  test "workspace_source clones through the sidecar into the pod's emptyDir; the file operations work there; a reattach keeps the checkout",
       ctx do
    git = ctx.testbed.git
    id = "git-#{System.unique_integer([:positive])}"
    policy = [rules: [allow: ["git.test"]], default: :deny]
    source = [workspace_source: [git: git.url, ref: "main"]]
    sb = policy_sandbox!(ctx, id, policy, source)

    assert {:ok, %{output: head, exit_code: 0}} = Sandbox.exec(sb, "git rev-parse HEAD")
    assert String.trim(head) == git.head
    assert {:ok, "# repo.git\n" <> _} = Sandbox.read(sb, "README.md")
    assert {:ok, ["README.md", "data.txt"]} = Sandbox.glob(sb, "*")
    assert {:ok, [%{path: "data.txt", line_number: 42, line: "line 42"}]} = Sandbox.grep(sb, "^line 42$")

    # Work in progress survives a reattach (same id): the checkout is reused.
    :ok = Sandbox.write(sb, "notes/wip.md", "- half done\n")
    :ok = Sandbox.edit(sb, "README.md", "Served by", "Cloned from")
    :ok = Sandbox.shutdown(sb)

    sb = policy_sandbox!(ctx, id, policy, source)
    assert {:ok, "- half done\n"} = Sandbox.read(sb, "notes/wip.md")
    assert {:ok, readme} = Sandbox.read(sb, "README.md")
    assert readme =~ "Cloned from"
    assert {:ok, %{output: head}} = Sandbox.exec(sb, "git rev-parse HEAD")
    assert String.trim(head) == git.head
    :ok = Sandbox.shutdown(sb)
  end

  test "a sidecar image the node does not have: init gives up at :ready_timeout naming the container", ctx do
    c = ctx.cluster
    id = "bad-#{System.unique_integer([:positive])}"
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]

    # No registry is reachable: the kubelet cannot pull it (ErrImagePull).
    assert {:error, %Sandbox.Error{reason: :timeout, op: :new} = e} =
             Sandbox.new({
               Kubernetes,
               id: id,
               namespace: c.namespace,
               conn: conn,
               image: @tools_image,
               ready_timeout: 15_000,
               network_policy: [rules: [allow: ["allowed.test"]]],
               network_policy_image: "registry.example/not-the-sidecar:1"
             })

    Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
    message = Exception.message(e)
    assert message =~ "did not reach Running within 15000 ms"
    assert message =~ "condukt-netfilter"
  end
end
