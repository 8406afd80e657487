defmodule Condukt.K8s.OperatorPodTest do
  # The operator's pod options, `manifests/1` and the size of a session's
  # objects, against a real kube-apiserver and the real node (the
  # :kubernetes tier): each option reaches the pod the API server stored,
  # admission included (RuntimeClass and PriorityClass must exist), and
  # the pod runs with them.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes

  setup_all do
    tier = Condukt.Test.K8s.Case.start_node_tier!()
    c = tier.cluster

    Cluster.request!(c, :admin, "POST", "/apis/node.k8s.io/v1/runtimeclasses", %{
      apiVersion: "node.k8s.io/v1",
      kind: "RuntimeClass",
      metadata: %{name: "gvisor"},
      # The node's second runc handler: the pods must run.
      handler: Condukt.Test.K8s.Node.runtime_handler()
    })

    Cluster.request!(c, :admin, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses", %{
      apiVersion: "scheduling.k8s.io/v1",
      kind: "PriorityClass",
      metadata: %{name: "agents-low"},
      value: 100
    })

    %{cluster: c, node: tier.node, egress_image: tier.egress_image}
  end

  setup %{cluster: c, egress_image: image} do
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]
    base = [namespace: c.namespace, conn: conn, ready_timeout: 60_000, heartbeat_interval: false]
    %{conn: conn, base: base, image: image}
  end

  defp id, do: "op-#{System.unique_integer([:positive])}"

  defp admin_get(c, path) do
    case Cluster.request(c, :admin, "GET", path) do
      {200, body} -> body
      {404, _} -> nil
    end
  end

  # Starts a session with `opts` (which hold :id, :namespace and :conn),
  # runs `fun`, and removes the session whatever happens.
  defp with_session(opts, fun) do
    {:ok, sb} = Sandbox.new({Kubernetes, opts})

    try do
      fun.(sb)
    after
      Sandbox.shutdown(sb)
      :ok = Kubernetes.terminate(opts[:id], namespace: opts[:namespace], conn: opts[:conn])
    end
  end

  defp pod(c, id), do: admin_get(c, "/api/v1/namespaces/#{c.namespace}/pods/#{Kubernetes.pod_name(id)}")

  @tag :capture_log
  test "every pod option reaches the pod the API server stored", %{cluster: c, base: base, image: image, node: node} do
    id = id()

    opts =
      base ++
        [
          network_policy: [rules: [allow: ["example.com"]]],
          network_policy_image: image,
          tolerations: [%{key: "agents", operator: "Exists", effect: "NoSchedule"}],
          affinity: %{
            node_affinity: %{
              required_during_scheduling_ignored_during_execution: %{
                node_selector_terms: [
                  %{match_expressions: [%{key: "kubernetes.io/hostname", operator: "In", values: [node.name]}]}
                ]
              }
            }
          },
          runtime_class_name: "gvisor",
          priority_class_name: "agents-low",
          image_pull_secrets: ["mirror-pull"],
          security_context: %{run_as_non_root: false, run_as_group: 2000, allow_privilege_escalation: true},
          sidecar_resources: %{requests: %{cpu: "60m", memory: "40Mi"}, limits: %{memory: "200Mi"}}
        ]

    with_session(opts ++ [id: id], fn sb ->
      # It runs, on the RuntimeClass's handler, with the group asked for.
      assert {:ok, %{output: "2000\n"}} = Sandbox.exec(sb, "id -g")
      spec = pod(c, id)["spec"]
      assert %{"key" => "agents", "operator" => "Exists", "effect" => "NoSchedule"} in spec["tolerations"]

      assert get_in(spec, ["affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"]) ==
               %{
                 "nodeSelectorTerms" => [
                   %{
                     "matchExpressions" => [
                       %{"key" => "kubernetes.io/hostname", "operator" => "In", "values" => [node.name]}
                     ]
                   }
                 ]
               }

      assert spec["runtimeClassName"] == "gvisor"
      assert spec["priorityClassName"] == "agents-low"
      # The Priority admission plugin resolved the class.
      assert spec["priority"] == 100
      assert spec["imagePullSecrets"] == [%{"name" => "mirror-pull"}]

      [ws] = spec["containers"]
      assert ws["securityContext"]["runAsGroup"] == 2000
      assert ws["securityContext"]["runAsNonRoot"] == false
      # The hardening won.
      assert ws["securityContext"]["allowPrivilegeEscalation"] == false
      assert ws["securityContext"]["capabilities"]["drop"] == ["ALL"]

      inits = Map.new(spec["initContainers"], &{&1["name"], &1})

      assert inits["condukt-egress"]["resources"] == %{
               "requests" => %{"cpu" => "60m", "memory" => "40Mi"},
               "limits" => %{"memory" => "200Mi"}
             }

      assert inits["condukt-netfilter"]["resources"]["limits"] == %{"cpu" => "100m", "memory" => "64Mi"}
    end)
  end

  @tag :capture_log
  test "a LimitRange admits the policy pod with the default resources, and refuses a sidecar limit past its maximum", %{
    cluster: c,
    base: base,
    image: image
  } do
    ns = "lr-#{System.unique_integer([:positive])}"
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{metadata: %{name: ns}})
    # The ServiceAccount admission plugin wants `default`; the controller
    # manager may have made it already.
    Cluster.request(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: "default"}})

    # A LimitRange with a minimum and a maximum per container (the
    # LimitRanger admission plugin checks init containers too).
    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/limitranges", %{
      metadata: %{name: "lr"},
      spec: %{limits: [%{type: "Container", max: %{cpu: "2", memory: "512Mi"}, min: %{cpu: "5m", memory: "8Mi"}}]}
    })

    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: admin_token(c, ns)]
    id = id()

    # The workspace needs its own resources under such a LimitRange; the
    # sidecar and init containers have theirs by default.
    opts =
      Keyword.merge(base,
        namespace: ns,
        conn: conn,
        network_policy: [rules: [allow: ["example.com"]]],
        network_policy_image: image,
        resources: %{requests: %{cpu: "100m", memory: "64Mi"}, limits: %{cpu: "1", memory: "512Mi"}}
      )

    with_session(opts ++ [id: id], fn _sb -> :ok end)

    # A sidecar limit past the maximum: refused, naming it.
    assert {:error, %Sandbox.Error{} = e} =
             Sandbox.new({Kubernetes, opts ++ [sidecar_resources: %{limits: %{memory: "1Gi"}}]}, id: id())

    assert Exception.message(e) =~ "maximum memory usage per Container is 512Mi"
  end

  # The path of the first field of `want` that `got` lacks or holds
  # otherwise, nil when there is none: the API server adds defaults and
  # status, and leaves out empty lists such as a NetworkPolicy's
  # `ingress: []`. Lists compare element by element.
  defp mismatch(want, got, path \\ [])

  defp mismatch(want, got, path) when is_map(want) and is_map(got) do
    Enum.find_value(want, fn
      {k, v} when v in [[], %{}] ->
        if got[k] in [nil, v], do: nil, else: {path ++ [k], v, got[k]}

      # The DefaultTolerationSeconds admission plugin appends two.
      {"tolerations" = k, v} when is_list(v) and is_map_key(got, "tolerations") ->
        mismatch(v, Enum.take(got[k], length(v)), path ++ [k])

      {k, v} ->
        mismatch(v, got[k], path ++ [k])
    end)
  end

  defp mismatch(want, got, path) when is_list(want) and is_list(got) and length(want) == length(got) do
    want |> Enum.zip(got) |> Enum.with_index() |> Enum.find_value(fn {{w, g}, i} -> mismatch(w, g, path ++ [i]) end)
  end

  defp mismatch(want, got, path), do: if(want == got, do: nil, else: {path, want, got})

  defp stored(c, obj) do
    ns = obj["metadata"]["namespace"]
    name = obj["metadata"]["name"]

    case obj["kind"] do
      "Pod" -> admin_get(c, "/api/v1/namespaces/#{ns}/pods/#{name}")
      "Secret" -> admin_get(c, "/api/v1/namespaces/#{ns}/secrets/#{name}")
      "NetworkPolicy" -> admin_get(c, "/apis/networking.k8s.io/v1/namespaces/#{ns}/networkpolicies/#{name}")
    end
  end

  @tag :capture_log
  test "manifests/1 returns the objects init/1 creates, as the API server received them",
       %{cluster: c, base: base, image: image} do
    id = id()

    opts =
      base ++
        [
          id: id,
          network_policy: [rules: [allow: ["example.com"]], body_preview: 256, redact_headers: ["x-api-key"]],
          network_policy_image: image,
          tolerations: [%{key: "agents", operator: "Exists"}],
          runtime_class_name: "gvisor",
          labels: %{"tenant" => "acme"},
          env: %{"A" => "1"}
        ]

    {:ok, manifests} = Kubernetes.manifests(opts)
    assert Enum.map(manifests, & &1["kind"]) == ["Secret", "Secret", "NetworkPolicy", "Pod"]

    with_session(opts, fn _sb ->
      for want <- manifests do
        got = stored(c, want)
        assert got, "#{want["kind"]} #{want["metadata"]["name"]} was not created"

        # What only exists per session: the Secrets' generated values and
        # the heartbeat's time.
        want =
          case want do
            %{"kind" => "Secret"} ->
              assert Map.keys(want["data"]) |> Enum.sort() == Map.keys(got["data"]) |> Enum.sort()
              Map.delete(want, "data")

            %{"kind" => "Pod"} ->
              update_in(want, ["metadata", "annotations"], &Map.delete(&1, Kubernetes.Names.heartbeat_annotation()))

            other ->
              other
          end

        diff = mismatch(want, got)
        assert diff == nil, "#{want["kind"]} #{want["metadata"]["name"]}: #{inspect(diff)}"
      end

      # Nothing else carries the session's label.
      sel = URI.encode_www_form("condukt.dev/sandbox=#{Kubernetes.Names.hash(id)}")

      for {kind, path} <- [
            {"Secret", "/api/v1/namespaces/#{c.namespace}/secrets?labelSelector=#{sel}"},
            {"NetworkPolicy",
             "/apis/networking.k8s.io/v1/namespaces/#{c.namespace}/networkpolicies?labelSelector=#{sel}"},
            {"Pod", "/api/v1/namespaces/#{c.namespace}/pods?labelSelector=#{sel}"}
          ] do
        names = admin_get(c, path)["items"] |> Enum.map(& &1["metadata"]["name"]) |> Enum.sort()

        assert names ==
                 manifests |> Enum.filter(&(&1["kind"] == kind)) |> Enum.map(& &1["metadata"]["name"]) |> Enum.sort()
      end

      # The policy's capture keys reached the sidecar.
      pod = stored(c, List.last(manifests))
      sidecar = Enum.find(pod["spec"]["initContainers"], &(&1["name"] == "condukt-egress"))
      assert ["--body-preview", "256"] in Enum.chunk_every(sidecar["command"], 2, 1)
    end)
  end

  @tag :capture_log
  test "a session's objects are small: the trust bundle is not stored per session",
       %{cluster: c, base: base, image: image} do
    id = id()

    opts = base ++ [id: id, network_policy: [rules: [allow: ["example.com"]]], network_policy_image: image]

    with_session(opts, fn _sb ->
      {:ok, manifests} = Kubernetes.manifests(opts)

      bytes =
        for want <- manifests, reduce: 0 do
          acc ->
            got = stored(c, want) |> Map.delete("status") |> update_in(["metadata"], &Map.delete(&1, "managedFields"))
            acc + IO.iodata_length(Condukt.JSON.encode!(got))
        end

      # About 300 KB when every session stored the Mozilla roots.
      assert bytes < 16_384, "#{bytes} bytes"

      secrets = Enum.filter(manifests, &(&1["kind"] == "Secret"))
      assert Enum.all?(secrets, &(IO.iodata_length(Condukt.JSON.encode!(stored(c, &1))) < 4_096))
    end)
  end

  @tag :capture_log
  test "Pod Security: baseline refuses the policy pod naming the capabilities, admits the plain one",
       %{cluster: c, base: base, image: image} do
    ns = "pss-#{System.unique_integer([:positive])}"

    Cluster.request!(c, :admin, "POST", "/api/v1/namespaces", %{
      metadata: %{name: ns, labels: %{"pod-security.kubernetes.io/enforce" => "baseline"}}
    })

    Cluster.request(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: "default"}})
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: admin_token(c, ns)]
    opts = Keyword.merge(base, namespace: ns, conn: conn)

    assert {:error, %Sandbox.Error{} = e} =
             Sandbox.new(
               {Kubernetes, opts ++ [network_policy: [rules: [allow: ["a.test"]]], network_policy_image: image]},
               id: id()
             )

    assert Exception.message(e) =~ "PodSecurity"
    assert Exception.message(e) =~ "NET_ADMIN"

    id = id()
    with_session(opts ++ [id: id], fn _sb -> :ok end)
  end

  # A token of a ServiceAccount bound to the documented Role in `ns` (the
  # tier binds it in its own namespace only).
  defp admin_token(c, ns) do
    Cluster.bound_token!(c, ns, "op", Cluster.contract_role_rules())
  end
end
