defmodule Condukt.Sandbox.Kubernetes.OperatorOptionsTest do
  # The pod options an operator needs (resources of the sidecar and the
  # init containers, scheduling, runtime class, pull secrets, the
  # workspace's securityContext under the hardening), without a cluster.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.Kubernetes.{Manifest, Schema}
  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests

  @params %{
    pod: "condukt-job-42-0123456789",
    namespace: "agents",
    labels: %{"app.kubernetes.io/managed-by" => "condukt", "condukt.dev/sandbox" => "0123456789"},
    session_id: "job-42",
    image: "registry.example/condukt-egress:1",
    ca_cert_pem: "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
    ca_key_pem: "KEY",
    token: String.duplicate("ab", 32),
    policy_json: ~s({"version":1}),
    upstream_ca: nil,
    allow_private: []
  }

  defp cfg(extra, policy? \\ false) do
    {:ok, opts} = Condukt.Options.validate(extra, Schema.init())
    opts = Map.new(opts)

    params =
      if policy?,
        do: Map.merge(@params, Map.take(opts, [:sidecar_resources, :init_resources])),
        else: nil

    Map.merge(opts, %{
      id: "job-42",
      pod: "condukt-job-42-0123456789",
      namespace: "agents",
      delete_on_shutdown: false,
      now: ~U[2026-01-02 03:04:05Z],
      policy_params: params
    })
  end

  defp init_error(opts) do
    assert {:error, %Error{reason: :invalid_option, op: :new} = e} = Kubernetes.init(opts)
    Exception.message(e)
  end

  defp init(pod, name), do: Enum.find(pod["spec"]["initContainers"], &(&1["name"] == name))

  test "the sidecar and the init containers have small default resources; nil removes them" do
    pod = Manifest.pod(cfg([], true))

    assert init(pod, "condukt-egress")["resources"] == %{
             "requests" => %{"cpu" => "50m", "memory" => "32Mi"},
             "limits" => %{"cpu" => "1", "memory" => "256Mi"}
           }

    assert init(pod, "condukt-netfilter")["resources"] == %{
             "requests" => %{"cpu" => "10m", "memory" => "16Mi"},
             "limits" => %{"cpu" => "100m", "memory" => "64Mi"}
           }

    custom = Manifest.pod(cfg([sidecar_resources: %{requests: %{cpu: "200m"}}, init_resources: nil], true))
    assert init(custom, "condukt-egress")["resources"] == %{"requests" => %{"cpu" => "200m"}}
    refute Map.has_key?(init(custom, "condukt-netfilter"), "resources")
  end

  test "scheduling, runtime class, priority class and pull secrets reach the pod spec" do
    spec =
      Manifest.pod(
        cfg(
          tolerations: [
            %{key: "agents", operator: "Exists", effect: "NoSchedule"},
            [key: "gpu", operator: "Equal", value: "yes", effect: "NoExecute", toleration_seconds: 30]
          ],
          node_selector: %{"pool" => "agents"},
          affinity: %{
            node_affinity: %{
              required_during_scheduling_ignored_during_execution: %{
                node_selector_terms: [%{match_expressions: [%{key: "zone", operator: "In", values: ["a", "b"]}]}]
              }
            }
          },
          runtime_class_name: "gvisor",
          priority_class_name: "agents-low",
          image_pull_secrets: ["mirror-pull"]
        )
      )["spec"]

    assert spec["tolerations"] == [
             %{"key" => "agents", "operator" => "Exists", "effect" => "NoSchedule"},
             %{
               "key" => "gpu",
               "operator" => "Equal",
               "value" => "yes",
               "effect" => "NoExecute",
               "tolerationSeconds" => 30
             }
           ]

    assert spec["nodeSelector"] == %{"pool" => "agents"}

    assert spec["affinity"] == %{
             "nodeAffinity" => %{
               "requiredDuringSchedulingIgnoredDuringExecution" => %{
                 "nodeSelectorTerms" => [
                   %{"matchExpressions" => [%{"key" => "zone", "operator" => "In", "values" => ["a", "b"]}]}
                 ]
               }
             }
           }

    assert spec["runtimeClassName"] == "gvisor"
    assert spec["priorityClassName"] == "agents-low"
    assert spec["imagePullSecrets"] == [%{"name" => "mirror-pull"}]
  end

  test "without these options the pod spec has none of the fields" do
    spec = Manifest.pod(cfg([]))

    for key <- ~w(tolerations affinity runtimeClassName priorityClassName imagePullSecrets nodeSelector),
        do: refute(Map.has_key?(spec, key), key)
  end

  test "bad values are refused naming the option" do
    assert init_error(tolerations: [%{key: "a", effects: "NoSchedule"}]) =~ ":tolerations"
    assert init_error(tolerations: %{key: "a"}) =~ ":tolerations"
    assert init_error(affinity: %{node: %{}}) =~ ":affinity"
    assert init_error(runtime_class_name: "gVisor!") =~ ":runtime_class_name"
    assert init_error(priority_class_name: "") =~ ":priority_class_name"
    assert init_error(image_pull_secrets: "mirror") =~ ":image_pull_secrets"
    assert init_error(image_pull_secrets: ["Mirror_Pull"]) =~ ":image_pull_secrets"
    assert init_error(security_context: %{run_as_usr: 1000}) =~ ":security_context"
    assert init_error(sidecar_resources: %{requests: %{cpu: "lots"}}) =~ ":sidecar_resources"
    assert init_error(init_resources: %{request: %{cpu: "1"}}) =~ ":init_resources"
  end

  test "the security context is merged under the hardening, which wins and says so" do
    {ctx, notes} =
      Manifest.workspace_security_context(
        security_context: %{
          run_as_non_root: true,
          run_as_group: 2000,
          read_only_root_filesystem: true,
          allow_privilege_escalation: true,
          privileged: true,
          seccomp_profile: %{type: "Unconfined"},
          proc_mount: "Unmasked",
          capabilities: %{add: ["SYS_PTRACE"], drop: ["CHOWN"]}
        }
      )

    assert ctx["runAsNonRoot"] == true
    assert ctx["runAsGroup"] == 2000
    assert ctx["readOnlyRootFilesystem"] == true
    assert ctx["allowPrivilegeEscalation"] == false
    refute ctx["privileged"]
    refute Map.has_key?(ctx, "procMount")
    assert ctx["seccompProfile"] == %{"type" => "RuntimeDefault"}
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert "SYS_PTRACE" in ctx["capabilities"]["add"]

    assert Enum.any?(notes, &(&1 =~ "allowPrivilegeEscalation true overridden"))
    assert Enum.any?(notes, &(&1 =~ "privileged true overridden"))
    assert Enum.any?(notes, &(&1 =~ "seccompProfile"))
    assert Enum.any?(notes, &(&1 =~ "procMount"))
    assert length(notes) == 4

    # A Localhost seccomp profile is stricter or equal: kept.
    {ctx, []} =
      Manifest.workspace_security_context(
        security_context: [seccomp_profile: [type: "Localhost", localhost_profile: "agents.json"]]
      )

    assert ctx["seccompProfile"] == %{"type" => "Localhost", "localhostProfile" => "agents.json"}

    # :run_as_user wins over runAsUser.
    {ctx, []} = Manifest.workspace_security_context(run_as_user: 1000, security_context: %{run_as_user: 2000})
    assert ctx["runAsUser"] == 1000

    # In the pod.
    c = hd(Manifest.pod(cfg(security_context: %{run_as_non_root: true, privileged: true}))["spec"]["containers"])
    assert c["securityContext"]["runAsNonRoot"] == true
    refute c["securityContext"]["privileged"]
  end

  test "init logs what the hardening overrode" do
    log =
      capture_log(fn ->
        # No server listens there: init fails after the options were checked.
        assert {:error, %Error{}} =
                 Kubernetes.init(
                   security_context: %{allow_privilege_escalation: true},
                   conn: [server: "https://127.0.0.1:1"],
                   namespace: "agents",
                   ready_timeout: 1_000
                 )
      end)

    assert log =~
             ":security_context allowPrivilegeEscalation true overridden: it stays false by the sandbox's hardening"
  end

  test "with a policy, the security context cannot add what forges the exemption nor take the sidecar's uid" do
    assert {:error, {:invalid, :capabilities, _, expected}} =
             Manifest.check_workspace([security_context: %{capabilities: %{add: ["NET_RAW"]}}], true)

    assert expected =~ "NET_RAW"
    assert expected =~ ":security_context"

    assert {:error, {:invalid, :run_as_user, 1337, _}} =
             Manifest.check_workspace([security_context: %{run_as_user: Manifests.sidecar_uid()}], true)

    assert init_error(
             network_policy: [rules: [allow: ["a.test"]]],
             security_context: %{"runAsUser" => 1337},
             conn: [server: "https://127.0.0.1:1"]
           ) =~ ":run_as_user"
  end
end
