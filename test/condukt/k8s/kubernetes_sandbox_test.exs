defmodule Condukt.K8s.KubernetesSandboxTest do
  # Condukt.Sandbox.Kubernetes against a real kube-apiserver and the real
  # node (the :kubernetes tier, docs/k8s-tier.md), as the ServiceAccount
  # bound to the documented Role (Cluster.role_rules/0): init, adoption,
  # stale and terminating pods, heartbeat, reap_stale, terminate, the
  # network-policy objects, and a refusal that names the missing grant.
  #
  # The operations inside a pod are in kubernetes_ops_test.exs, the
  # sidecar end to end in kubernetes_e2e_test.exs and real_node_test.exs.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Kubernetes

  setup_all do
    tier = Condukt.Test.K8s.Case.start_node_tier!()
    %{cluster: tier.cluster, egress_image: tier.egress_image}
  end

  setup %{cluster: c} do
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]
    base = [namespace: c.namespace, conn: conn, ready_timeout: 60_000]
    %{conn: conn, base: base}
  end

  defp id, do: "t-#{System.unique_integer([:positive])}"

  defp admin_get(c, path) do
    case Cluster.request(c, :admin, "GET", path) do
      {200, body} -> body
      {404, _} -> nil
    end
  end

  defp pod(c, id), do: admin_get(c, "/api/v1/namespaces/#{c.namespace}/pods/#{Kubernetes.pod_name(id)}")

  defp wait_gone(c, id) do
    assert :ok == Cluster.wait_until(fn -> pod(c, id) == nil end)
  end

  defp list(c, kind, id) do
    sel = URI.encode_www_form("condukt.dev/sandbox=#{Condukt.Sandbox.Kubernetes.Names.hash(id)}")

    path =
      case kind do
        :secrets -> "/api/v1/namespaces/#{c.namespace}/secrets?labelSelector=#{sel}"
        :networkpolicies -> "/apis/networking.k8s.io/v1/namespaces/#{c.namespace}/networkpolicies?labelSelector=#{sel}"
      end

    admin_get(c, path)["items"]
  end

  test "init creates the pod of the contract, a second init adopts it, terminate/2 deletes it",
       %{cluster: c, base: base, conn: conn} do
    id = id()

    {:ok, sb} =
      Sandbox.new({Kubernetes, base ++ [labels: %{"tenant" => "acme"}, annotations: %{"note" => "x"}]}, id: id)

    p = pod(c, id)
    assert p["status"]["phase"] == "Running"
    assert p["metadata"]["name"] == Kubernetes.pod_name(id)
    labels = p["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "condukt"
    assert labels["condukt.dev/sandbox"] == Condukt.Sandbox.Kubernetes.Names.hash(id)
    assert labels["tenant"] == "acme"
    ann = p["metadata"]["annotations"]
    assert ann["condukt.dev/id"] == id
    assert ann["condukt.dev/delete-on-shutdown"] == "false"
    assert ann["note"] == "x"
    assert {:ok, _, 0} = DateTime.from_iso8601(ann["condukt.tuist.dev/heartbeat-at"])
    assert p["spec"]["automountServiceAccountToken"] == false
    assert p["spec"]["activeDeadlineSeconds"] == 28_800
    uid = p["metadata"]["uid"]

    # The same id again: adopted, not recreated.
    {:ok, sb2} = Sandbox.new({Kubernetes, base}, id: id)
    assert pod(c, id)["metadata"]["uid"] == uid

    # An id was given: shutdown leaves the pod.
    :ok = Sandbox.shutdown(sb)
    :ok = Sandbox.shutdown(sb2)
    assert pod(c, id)["metadata"]["uid"] == uid

    :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
    wait_gone(c, id)
    # Idempotent.
    :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
  end

  test "with a kubeconfig (the ServiceAccount's), no id and no namespace: the context's namespace, single-use, shutdown deletes the pod",
       %{cluster: c} do
    # The kubeconfig's context names the namespace (the only one the
    # ServiceAccount may use): no :namespace option is needed.
    {:ok, sb} = Sandbox.new({Kubernetes, kubeconfig: c.kubeconfig, heartbeat_interval: false})

    assert sb.state.namespace == c.namespace
    id = sb.state.id
    assert pod(c, id)["metadata"]["annotations"]["condukt.dev/delete-on-shutdown"] == "true"
    :ok = Sandbox.shutdown(sb)
    wait_gone(c, id)
  end

  test "a Failed pod: {:stale_pod, phase} by default, recreated with on_stale: :recreate", %{
    cluster: c,
    base: base,
    conn: conn
  } do
    id = id()
    # The kubelet ends it at its activeDeadlineSeconds (DeadlineExceeded).
    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [active_deadline_seconds: 10, heartbeat_interval: false]}, id: id)
    :ok = Sandbox.shutdown(sb)
    uid = pod(c, id)["metadata"]["uid"]
    assert :ok == Cluster.wait_until(fn -> pod(c, id)["status"]["phase"] == "Failed" end, 60_000)
    assert pod(c, id)["status"]["reason"] == "DeadlineExceeded"

    assert {:error, %Error{reason: :backend, detail: {:stale_pod, "Failed"}}} = Sandbox.new({Kubernetes, base}, id: id)

    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [on_stale: :recreate]}, id: id)
    p = pod(c, id)
    assert p["metadata"]["uid"] != uid
    assert p["status"]["phase"] == "Running"
    :ok = Sandbox.shutdown(sb)
    :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
  end

  test "init waits out a terminating pod, then creates a new one", %{cluster: c, base: base, conn: conn} do
    id = id()
    name = Kubernetes.pod_name(id)
    {:ok, sb} = Sandbox.new({Kubernetes, base}, id: id)
    :ok = Sandbox.shutdown(sb)
    uid = pod(c, id)["metadata"]["uid"]
    path = "/api/v1/namespaces/#{c.namespace}/pods/#{name}"

    # A finalizer holds the pod in Terminating until we lift it.
    Cluster.request!(c, :admin, "PATCH", path, %{metadata: %{finalizers: ["condukt.test/hold"]}},
      content_type: "application/merge-patch+json"
    )

    Cluster.request!(c, :admin, "DELETE", path)
    assert pod(c, id)["metadata"]["deletionTimestamp"]

    task = Task.async(fn -> Sandbox.new({Kubernetes, base}, id: id) end)
    Process.sleep(1_500)
    assert Task.yield(task, 0) == nil, "init did not wait for the terminating pod"

    Cluster.request!(c, :admin, "PATCH", path, %{metadata: %{finalizers: :null}},
      content_type: "application/merge-patch+json"
    )

    assert {:ok, sb} = Task.await(task, 40_000)
    assert pod(c, id)["metadata"]["uid"] != uid
    :ok = Sandbox.shutdown(sb)
    :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
  end

  test "a pod deleted while in use: the operations fail with an error, the same id then gets a new pod",
       %{cluster: c, base: base, conn: conn} do
    id = id()
    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [heartbeat_interval: false]}, id: id)
    assert {:ok, %{output: "here\n"}} = Sandbox.exec(sb, "echo here")
    uid = pod(c, id)["metadata"]["uid"]
    Cluster.request!(c, :admin, "DELETE", "/api/v1/namespaces/#{c.namespace}/pods/#{Kubernetes.pod_name(id)}")
    wait_gone(c, id)

    assert {:error, %Error{op: :exec}} = Sandbox.exec(sb, "echo here")
    assert {:error, %Error{op: :read}} = Sandbox.read(sb, "/etc/hostname")
    :ok = Sandbox.shutdown(sb)

    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [heartbeat_interval: false]}, id: id)
    assert pod(c, id)["metadata"]["uid"] != uid
    assert {:ok, %{output: "here\n"}} = Sandbox.exec(sb, "echo here")
    :ok = Sandbox.shutdown(sb)
    :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
  end

  test "a pod of that name not made for this id is refused", %{cluster: c, base: base} do
    id = id()

    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces/#{c.namespace}/pods", %{
      metadata: %{name: Kubernetes.pod_name(id)},
      spec: %{containers: [%{name: "x", image: "condukt.test/none:1"}]}
    })

    assert {:error, %Error{reason: :backend} = e} = Sandbox.new({Kubernetes, base}, id: id)
    assert Exception.message(e) =~ "was not created by Condukt"
    Cluster.request!(c, :admin, "DELETE", "/api/v1/namespaces/#{c.namespace}/pods/#{Kubernetes.pod_name(id)}")
  end

  test "the heartbeat worker refreshes the annotation; heartbeat/1 does it on demand; reap_stale/1 takes only stale pods",
       %{cluster: c, base: base, conn: conn} do
    fresh = id()
    old = id()
    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [heartbeat_interval: 1_000]}, id: fresh)
    {:ok, manual} = Sandbox.new({Kubernetes, base ++ [heartbeat_interval: false]}, id: old)

    beat = fn id -> pod(c, id)["metadata"]["annotations"]["condukt.tuist.dev/heartbeat-at"] end
    first = beat.(fresh)
    assert :ok == Cluster.wait_until(fn -> beat.(fresh) != first end, 10_000)

    # The manual one only moves when asked.
    manual_first = beat.(old)
    Process.sleep(1_200)
    assert beat.(old) == manual_first
    :ok = Kubernetes.heartbeat(manual)
    assert beat.(old) != manual_first

    # Nothing is stale now.
    assert {:ok, []} = Kubernetes.reap_stale(namespace: c.namespace, conn: conn, stale_after: 60_000)

    # An hour later, both are.
    later = DateTime.add(DateTime.utc_now(), 3600, :second)
    {:ok, reaped} = Kubernetes.reap_stale(namespace: c.namespace, conn: conn, stale_after: 60_000, now: later)
    assert Kubernetes.pod_name(fresh) in reaped
    assert Kubernetes.pod_name(old) in reaped
    wait_gone(c, fresh)
    wait_gone(c, old)

    :ok = Sandbox.shutdown(sb)
    :ok = Sandbox.shutdown(manual)
  end

  # (the killed owner's port server logs its own end)
  @tag :capture_log
  test "the heartbeat worker dies with the process that started the sandbox, killed or ending normally",
       %{cluster: c, base: base, conn: conn} do
    for ending <- [:kill, :normal] do
      id = id()
      parent = self()

      owner =
        spawn(fn ->
          {:ok, sb} = Sandbox.new({Kubernetes, base ++ [heartbeat_interval: 500]}, id: id)
          send(parent, {:up, sb.state.heartbeat})

          # :normal: the owner returns without shutting the sandbox down
          # (a finished job that forgot to); its worker must not go on
          # beating, and failing, forever.
          receive do
            :return -> :ok
          end
        end)

      assert_receive {:up, hb}, 40_000
      assert Process.alive?(hb)
      if ending == :kill, do: Process.exit(owner, :kill), else: send(owner, :return)
      assert :ok == Cluster.wait_until(fn -> not Process.alive?(hb) end, 5_000), "owner ended by #{ending}"
      stamp = pod(c, id)["metadata"]["annotations"]["condukt.tuist.dev/heartbeat-at"]
      Process.sleep(2_100)
      assert pod(c, id)["metadata"]["annotations"]["condukt.tuist.dev/heartbeat-at"] == stamp
      :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
    end
  end

  test "reap_stale/1 reads the heartbeat annotation of earlier versions too; the newer of the two counts",
       %{cluster: c, base: base, conn: conn} do
    legacy = id()
    both = id()
    hour_ago = DateTime.utc_now() |> DateTime.add(-3600, :second) |> Kubernetes.Names.timestamp()

    for id <- [legacy, both] do
      {:ok, sb} = Sandbox.new({Kubernetes, base ++ [heartbeat_interval: false]}, id: id)
      :ok = Sandbox.shutdown(sb)
    end

    patch = fn id, annotations ->
      Cluster.request!(
        c,
        :admin,
        "PATCH",
        "/api/v1/namespaces/#{c.namespace}/pods/#{Kubernetes.pod_name(id)}",
        %{metadata: %{annotations: annotations}},
        content_type: "application/merge-patch+json"
      )
    end

    # As an earlier version left it: only the old name, an hour old.
    patch.(legacy, %{"condukt.tuist.dev/heartbeat-at" => :null, "condukt.dev/heartbeat" => hour_ago})
    # Adopted by this version since: a fresh beat under the new name.
    patch.(both, %{"condukt.dev/heartbeat" => hour_ago})

    {:ok, reaped} = Kubernetes.reap_stale(namespace: c.namespace, conn: conn, stale_after: 60_000)
    assert Kubernetes.pod_name(legacy) in reaped
    refute Kubernetes.pod_name(both) in reaped
    wait_gone(c, legacy)
    assert pod(c, both)
    :ok = Kubernetes.terminate(both, namespace: c.namespace, conn: conn)
  end

  @tag :capture_log
  test "network_policy: two Secrets and a NetworkPolicy owned by the pod; adoption reads the token back; terminate removes all",
       %{cluster: c, base: base, conn: conn, egress_image: image} do
    id = id()
    policy = [rules: [allow: ["example.com"]], default: :deny]
    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [network_policy: policy, network_policy_image: image]}, id: id)

    p = pod(c, id)
    uid = p["metadata"]["uid"]

    assert Enum.map(p["spec"]["initContainers"], & &1["name"]) == [
             "condukt-netfilter",
             "condukt-trust",
             "condukt-egress"
           ]

    assert Enum.all?(p["spec"]["initContainers"], &(&1["image"] == image))

    secrets = list(c, :secrets, id)

    assert Enum.map(secrets, & &1["metadata"]["name"]) |> Enum.sort() ==
             Enum.sort([Kubernetes.pod_name(id) <> "-egress", Kubernetes.pod_name(id) <> "-trust"])

    [np] = list(c, :networkpolicies, id)

    for obj <- [np | secrets] do
      assert [%{"kind" => "Pod", "uid" => ^uid, "controller" => false}] = obj["metadata"]["ownerReferences"]
    end

    egress = Enum.find(secrets, &String.ends_with?(&1["metadata"]["name"], "-egress"))
    token = Base.decode64!(egress["data"]["token"])
    assert token =~ ~r/\A[0-9a-f]{64}\z/
    assert Base.decode64!(egress["data"]["policy.json"]) == Condukt.Sandbox.NetworkPolicy.to_sidecar_json(policy)

    # The trust Secret holds the session certificate alone (the pod
    # writes the bundle from the sidecar image's roots).
    trust = Enum.find(secrets, &String.ends_with?(&1["metadata"]["name"], "-trust"))
    assert Map.keys(trust["data"]) == ["ca.pem"]
    assert Base.decode64!(trust["data"]["ca.pem"]) == Base.decode64!(egress["data"]["ca.pem"])

    assert is_pid(sb.state.bridge)
    :ok = Sandbox.shutdown(sb)
    refute Process.alive?(sb.state.bridge)
    refute File.exists?(sb.state.forward_dir)
    refute Process.alive?(sb.state.forward)

    # Reattach: the bridge comes back with the Secret's token.
    {:ok, sb} = Sandbox.new({Kubernetes, base ++ [network_policy: policy]}, id: id)
    # The forward listener is a Unix socket in a private directory.
    assert %File.Stat{mode: mode} = File.stat!(sb.state.forward_dir)
    assert Bitwise.band(mode, 0o777) == 0o700
    assert pod(c, id)["metadata"]["uid"] == uid
    assert is_pid(sb.state.bridge)
    :ok = Sandbox.shutdown(sb)

    # An owner that dies takes its bridge, listener and directory along.
    me = self()

    owner =
      spawn(fn ->
        {:ok, sb} = Sandbox.new({Kubernetes, base ++ [network_policy: policy]}, id: id)
        send(me, {:up, sb.state})
        Process.sleep(:infinity)
      end)

    assert_receive {:up, st}, 40_000
    assert File.dir?(st.forward_dir)
    Process.exit(owner, :kill)
    assert :ok == Cluster.wait_until(fn -> not File.exists?(st.forward_dir) end, 5_000)
    assert :ok == Cluster.wait_until(fn -> not Process.alive?(st.bridge) and not Process.alive?(st.forward) end, 5_000)

    # Adopting it without the sidecar is refused (fail closed).
    plain = id()
    {:ok, sb} = Sandbox.new({Kubernetes, base}, id: plain)
    :ok = Sandbox.shutdown(sb)

    assert {:error, %Error{reason: :network_policy_unenforceable}} =
             Sandbox.new({Kubernetes, base ++ [network_policy: policy]}, id: plain)

    :ok = Kubernetes.terminate(plain, namespace: c.namespace, conn: conn)
    :ok = Kubernetes.terminate(id, namespace: c.namespace, conn: conn)
    wait_gone(c, id)
    assert list(c, :secrets, id) == []
    assert list(c, :networkpolicies, id) == []
  end

  test "with the seeds' Role, exec is refused naming the missing grant: get on pods/exec (WebSocket upgrades are GETs)",
       %{cluster: c} do
    ns = "seedrole-#{System.unique_integer([:positive])}"
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{metadata: %{name: ns}})

    {code, _} =
      Cluster.request(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: "default"}})

    assert code in [201, 409]
    token = Cluster.bound_token!(c, ns, "seed", Cluster.seed_role_rules())

    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: token]

    {:ok, sb} = Sandbox.new({Kubernetes, namespace: ns, conn: conn, heartbeat_interval: false, ready_timeout: 60_000})

    assert {:error, %Error{op: :exec, detail: %Condukt.Kube.Error{reason: :forbidden} = ke} = e} =
             Sandbox.exec(sb, "true")

    assert %{verb: "get", resource: "pods/exec", namespace: ^ns} = ke
    assert Exception.message(e) =~ ~s[cannot get pods/exec in namespace "#{ns}" (grant "get" on "pods/exec")]
    :ok = Sandbox.shutdown(sb)
  end

  test "a missing grant names the verb, the resource and the namespace", %{cluster: c} do
    ns = "norbac-#{System.unique_integer([:positive])}"
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{metadata: %{name: ns}})
    # (the ServiceAccount admission wants `default`; the controller may have made it)
    {code, _} =
      Cluster.request(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: "default"}})

    assert code in [201, 409]
    token = Cluster.bound_token!(c, ns, "weak", [%{apiGroups: [""], resources: ["pods"], verbs: ["get"]}])

    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: token]
    assert {:error, %Error{} = e} = Sandbox.new({Kubernetes, namespace: ns, conn: conn, id: "x"})
    assert %Condukt.Kube.Error{reason: :forbidden, verb: "create", resource: "pods", namespace: ^ns} = e.detail
    assert Exception.message(e) =~ ~s[cannot create pods in namespace "#{ns}" (grant "create" on "pods")]
  end

  test "a pod the API server refuses: the Secrets and NetworkPolicy created before it are deleted, the error names the field",
       %{cluster: c, base: base} do
    id = id()
    policy = [rules: [allow: ["example.com"]]]

    assert {:error, %Error{op: :new, detail: %Condukt.Kube.Error{reason: :invalid}} = e} =
             Sandbox.new(
               {Kubernetes, base ++ [network_policy: policy, resources: %{requests: %{cpu: "2"}, limits: %{cpu: "1"}}]},
               id: id
             )

    assert Exception.message(e) =~ "spec.containers[0].resources.requests"
    assert pod(c, id) == nil
    assert list(c, :secrets, id) == []
    assert list(c, :networkpolicies, id) == []
  end

  test "connection errors name their cause: a missing kubeconfig, a context it lacks, an unreachable server", %{
    cluster: c
  } do
    missing = Path.join(c.dir, "nope.kubeconfig")

    assert {:error, %Error{op: :new, detail: %Condukt.Kube.Error{reason: :config}} = e} =
             Kubernetes.init(kubeconfig: missing)

    assert Exception.message(e) =~ missing

    assert {:error, %Error{detail: %Condukt.Kube.Error{reason: :config}} = e} =
             Kubernetes.init(kubeconfig: c.kubeconfig, context: "no-such-context")

    assert Exception.message(e) =~ "no-such-context"

    {:ok, l} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
    {:ok, port} = :inet.port(l)
    :gen_tcp.close(l)
    conn = [server: "https://127.0.0.1:#{port}", ca_pem: File.read!(Cluster.ca(c)), token: "x"]
    assert {:error, %Error{detail: %Condukt.Kube.Error{reason: :unavailable}}} = Kubernetes.init(conn: conn, id: "x")
  end
end
