defmodule Condukt.Sandbox.Kubernetes.Schema do
  @moduledoc false
  # Option schemas of Condukt.Sandbox.Kubernetes (Condukt.Options), shared
  # by validation and the rendered moduledoc. The options of upstream
  # Condukt's Kubernetes sandbox first, then the network policy ones
  # (docs/kubernetes.md).

  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests

  @spec init() :: Condukt.Options.schema()
  def init do
    [
      id: [
        type: {:custom, &__MODULE__.id/1},
        default: nil,
        doc:
          "stable identifier the pod name is derived from (1 to 253 bytes once a string). Defaults to the " <>
            "session id when started through a session; without one a random id is generated and the pod is single-use."
      ],
      namespace: [
        type: {:custom, &__MODULE__.dns_label_or_nil/1},
        default: nil,
        doc:
          "Kubernetes namespace. When not given: the `namespace` of the kubeconfig context in use, or the " <>
            "in-cluster ServiceAccount's namespace, else `\"default\"` (as `kubectl` resolves it)."
      ],
      image: [
        type: {:custom, &__MODULE__.non_empty/1},
        default: "debian:bookworm-slim",
        doc: "the workspace container's image."
      ],
      cwd: [
        type: {:custom, &__MODULE__.absolute/1},
        default: "/workspace",
        doc: "working directory inside the pod, where the workspace volume (an `emptyDir`) is mounted."
      ],
      env: [
        type: {:custom, &__MODULE__.env/1},
        default: %{},
        doc: "environment variables of the workspace container, as a map or a list of `{name, value}` string pairs."
      ],
      labels: [
        type: {:custom, &__MODULE__.string_map/1},
        default: %{},
        doc:
          "additional pod labels, merged under Condukt's (`app.kubernetes.io/managed-by` and " <>
            "`condukt.dev/sandbox` cannot be overridden)."
      ],
      annotations: [type: {:custom, &__MODULE__.string_map/1}, default: %{}, doc: "additional pod annotations."],
      resources: [
        type: {:custom, &__MODULE__.map_or_nil/1},
        default: nil,
        doc:
          "the container's resource requests/limits, e.g. `%{requests: %{cpu: \"500m\"}, limits: %{memory: \"4Gi\"}}`."
      ],
      capabilities: [
        type: {:custom, &__MODULE__.capabilities/1},
        default: [],
        doc:
          "Linux capabilities added to the ones the workspace container keeps (`CHOWN`, `DAC_OVERRIDE`, " <>
            "`FOWNER`, `FSETID`, `KILL`, `NET_BIND_SERVICE`; every other is dropped), e.g. `[\"SYS_PTRACE\"]`. " <>
            "With a network policy `NET_RAW`, `NET_ADMIN`, `SETUID`, `SETGID`, `SYS_ADMIN`, `BPF`, " <>
            "`SYS_MODULE` and `ALL` are refused."
      ],
      run_as_user: [
        type: {:custom, &__MODULE__.uid_or_nil/1},
        default: nil,
        doc:
          "the workspace container's uid (`runAsUser`); default: the image's. With a network policy the " <>
            "sidecar's uid (1337) is refused."
      ],
      service_account: [
        type: {:custom, &__MODULE__.string_or_nil/1},
        default: nil,
        doc: "the ServiceAccount the pod runs as (its token is never mounted into the workspace)."
      ],
      active_deadline_seconds: [
        type: :pos_integer,
        default: 28_800,
        doc: "Kubernetes-side hard ceiling on the pod's lifetime (`activeDeadlineSeconds`, 8 hours)."
      ],
      heartbeat_interval: [
        type: {:custom, &__MODULE__.interval/1},
        default: 60_000,
        doc:
          "milliseconds between heartbeat annotation updates by a worker tied to the calling process; " <>
            "`false` disables the worker (drive `heartbeat/1` yourself)."
      ],
      workspace_source: [
        type: {:custom, &__MODULE__.workspace_source/1},
        default: nil,
        doc:
          "a git repository cloned into `:cwd` at init: a URL, or `[git: url, ref: ref]`. An existing checkout " <>
            "is reused and `:ref` checked out again. The image must include `git`."
      ],
      workspace_source_timeout: [
        type: :pos_integer,
        default: 300_000,
        doc: "milliseconds the clone or checkout may take."
      ],
      ready_timeout: [
        type: :pos_integer,
        default: 120_000,
        doc: "milliseconds to wait for a pod to reach `Running` (and for a terminating one to go)."
      ],
      on_stale: [
        type: {:in, [:error, :recreate]},
        default: :error,
        doc:
          "an adopted pod in phase `Succeeded` or `Failed`: `:error` returns `{:error, {:stale_pod, phase}}`, " <>
            "`:recreate` deletes and recreates it."
      ],
      delete_on_shutdown: [
        type: {:custom, &__MODULE__.boolean_or_nil/1},
        default: nil,
        doc: "whether `shutdown/1` deletes the pod. Default: `false` when an `:id` is given, `true` otherwise."
      ],
      conn: [
        type: :any,
        default: nil,
        doc:
          "explicit connection: a `Condukt.Kube.Conn` (or its fields as a keyword list or map) or a " <>
            "connected `Condukt.Kube`. Skips in-cluster and kubeconfig resolution."
      ],
      kubeconfig: [
        type: {:custom, &__MODULE__.paths/1},
        default: nil,
        doc: "a kubeconfig path or list of paths. Default: `$KUBECONFIG`, else `~/.kube/config`."
      ],
      context: [
        type: {:custom, &__MODULE__.string_or_nil/1},
        default: nil,
        doc: "kubeconfig context (default: `current-context`)."
      ],
      in_cluster: [
        type: {:custom, &__MODULE__.boolean_or_nil/1},
        default: nil,
        doc: "`true` to use the pod's ServiceAccount; auto-detected from `KUBERNETES_SERVICE_HOST`."
      ],
      host_aliases: [
        type: {:custom, &__MODULE__.host_aliases/1},
        default: [],
        doc: "`hostAliases` of the pod: a list of `%{ip: \"10.0.0.5\", hostnames: [\"git.internal\"]}`."
      ],
      node_selector: [
        type: {:custom, &__MODULE__.string_map/1},
        default: %{},
        doc: "the pod's `nodeSelector` (labels of the nodes it may run on)."
      ],
      tolerations: [
        type: {:custom, &__MODULE__.tolerations/1},
        default: [],
        doc:
          "the pod's `tolerations`: a list of maps (or keyword lists) with `:key`, `:operator`, `:value`, " <>
            "`:effect` and `:toleration_seconds`, e.g. `[%{key: \"agents\", operator: \"Exists\", effect: \"NoSchedule\"}]`."
      ],
      affinity: [
        type: {:custom, &__MODULE__.affinity/1},
        default: nil,
        doc:
          "the pod's `affinity`: a map with `:node_affinity`, `:pod_affinity` and/or `:pod_anti_affinity`, " <>
            "in the Kubernetes shape (atom keys in snake_case become camelCase; string keys are kept as given)."
      ],
      runtime_class_name: [
        type: {:custom, &__MODULE__.dns_subdomain_or_nil/1},
        default: nil,
        doc: "the pod's `runtimeClassName`, e.g. `\"gvisor\"` or `\"kata\"`."
      ],
      priority_class_name: [
        type: {:custom, &__MODULE__.dns_subdomain_or_nil/1},
        default: nil,
        doc: "the pod's `priorityClassName`."
      ],
      image_pull_secrets: [
        type: {:custom, &__MODULE__.names/1},
        default: [],
        doc:
          "names of Secrets (of type `kubernetes.io/dockerconfigjson`) in the namespace used to pull the " <>
            "workspace and sidecar images (`imagePullSecrets`), e.g. for a private mirror."
      ],
      security_context: [
        type: {:custom, &__MODULE__.security_context/1},
        default: nil,
        doc:
          "extra fields of the workspace container's `securityContext` (`:run_as_non_root`, `:run_as_group`, " <>
            "`:read_only_root_filesystem`, `:se_linux_options`, `:app_armor_profile`, ...), merged *under* the " <>
            "hardening the sandbox requires: privilege escalation stays off, capabilities come from " <>
            "`:capabilities` only, the seccomp profile stays `RuntimeDefault` (a `Localhost` one is kept), " <>
            "`privileged` and an `Unmasked` `procMount` are refused; a value the hardening overrides is logged. " <>
            "`:run_as_user` wins over its `runAsUser`."
      ],
      sidecar_resources: [
        type: {:custom, &__MODULE__.resources_or_nil/1},
        default: Manifests.default_sidecar_resources(),
        doc:
          "the `condukt-egress` sidecar's resource requests and limits (with a network policy); `nil` sets none. " <>
            "Default: `#{inspect(Manifests.default_sidecar_resources())}`."
      ],
      init_resources: [
        type: {:custom, &__MODULE__.resources_or_nil/1},
        default: Manifests.default_init_resources(),
        doc:
          "the resource requests and limits of the run-to-completion init containers the network policy adds " <>
            "(`condukt-netfilter`, `condukt-trust`); `nil` sets none. " <>
            "Default: `#{inspect(Manifests.default_init_resources())}`."
      ],
      timeout: [type: :pos_integer, default: 120_000, doc: "the default `exec/3` timeout, in milliseconds."],
      max_output_bytes: [
        type: :pos_integer,
        default: 1_048_576,
        doc: "the default cap on the output `exec/3` keeps; the rest is dropped and a marker says how much."
      ],
      network_policy: [
        type: :any,
        default: nil,
        doc:
          "a `Condukt.Sandbox.NetworkPolicy` (struct, keyword list or map): every TCP 80/443 connection of the " <>
            "pod goes through the egress sidecar (see \"Network policy\")."
      ],
      network_policy_image: [
        type: {:custom, &__MODULE__.non_empty/1},
        default: Manifests.default_image(),
        doc: "the `condukt-egress` sidecar image (mirror or pin it here)."
      ],
      network_policy_upstream_ca: [
        type: {:custom, &__MODULE__.string_or_nil/1},
        default: nil,
        doc: "PEM of extra roots the sidecar trusts for upstreams (an internal CA)."
      ],
      network_policy_allow_private: [
        type: {:list, :string},
        default: [],
        doc: "CIDRs of private addresses the sidecar may connect to (denied by default)."
      ],
      network_policy_required: [
        type: :boolean,
        default: false,
        doc: "accepted for portability with `Condukt.Sandbox.Local`; the Kubernetes sandbox always enforces."
      ],
      messages: [
        type: :any,
        default: nil,
        doc:
          "the session's message history, oldest first, for the context of decide rules: a list, " <>
            "a 0-arity function or `{m, f, a}`."
      ]
    ]
  end

  @doc false
  def id(nil), do: :ok

  def id(v) when is_binary(v) and byte_size(v) in 1..253 do
    if String.valid?(v) and not String.contains?(v, <<0>>), do: :ok, else: id({:bad, v})
  end

  def id(v) when is_atom(v) or is_integer(v), do: id(to_string(v))
  def id(_), do: {:error, "a string of 1 to 253 bytes (UTF-8, no NUL), an atom or an integer"}

  @doc false
  def dns_label(v) when is_binary(v) do
    if v =~ ~r/\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\z/,
      do: :ok,
      else: {:error, "a DNS-1123 label (lowercase letters, digits and '-', at most 63)"}
  end

  def dns_label(_), do: {:error, "a DNS-1123 label (lowercase letters, digits and '-', at most 63)"}

  @doc false
  def dns_label_or_nil(nil), do: :ok
  def dns_label_or_nil(v), do: dns_label(v)

  @doc false
  def non_empty(v) when is_binary(v) and v != "", do: :ok
  def non_empty(_), do: {:error, "a non-empty string"}

  @doc false
  def absolute(v) when is_binary(v) do
    if String.starts_with?(v, "/") and not String.contains?(v, <<0>>),
      do: :ok,
      else: {:error, "an absolute path"}
  end

  def absolute(_), do: {:error, "an absolute path"}

  @doc false
  def env(v) when is_map(v) or is_list(v) do
    if Enum.all?(v, &env_pair?/1),
      do: :ok,
      else: {:error, "a map or list of {name, value} strings (names without \"=\" or NUL, values without NUL)"}
  end

  def env(_), do: {:error, "a map or list of {name, value} strings"}

  defp env_pair?({k, v}) when is_binary(k) and is_binary(v),
    do: k != "" and not String.contains?(k, ["=", <<0>>]) and not String.contains?(v, <<0>>)

  defp env_pair?(_), do: false

  @doc false
  def string_map(v) when is_map(v) do
    if Enum.all?(v, fn {k, val} -> stringish?(k) and stringish?(val) end),
      do: :ok,
      else: {:error, "a map of string keys to string values"}
  end

  def string_map(_), do: {:error, "a map of string keys to string values"}

  defp stringish?(v), do: (is_binary(v) and v != "") or (is_atom(v) and v not in [nil, true, false])

  @doc false
  def map_or_nil(v) when is_nil(v) or is_map(v), do: :ok
  def map_or_nil(_), do: {:error, "a map or nil"}

  @doc false
  def string_or_nil(v) when is_nil(v) or (is_binary(v) and v != ""), do: :ok
  def string_or_nil(_), do: {:error, "a non-empty string or nil"}

  @doc false
  def capabilities(v) when is_list(v) do
    if Enum.all?(v, &((is_binary(&1) or is_atom(&1)) and to_string(&1) =~ ~r/\A(CAP_)?[A-Za-z_]{2,32}\z/)),
      do: :ok,
      else: capabilities(:bad)
  end

  def capabilities(_), do: {:error, "a list of capability names such as \"SYS_PTRACE\""}

  @doc false
  def uid_or_nil(nil), do: :ok
  def uid_or_nil(v) when is_integer(v) and v >= 0 and v < 4_294_967_295, do: :ok
  def uid_or_nil(_), do: {:error, "a uid (a non-negative integer) or nil"}

  @doc false
  def dns_subdomain_or_nil(nil), do: :ok

  def dns_subdomain_or_nil(v) when is_binary(v) and byte_size(v) <= 253 do
    if v =~ ~r/\A[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\z/,
      do: :ok,
      else: dns_subdomain_or_nil(:bad)
  end

  def dns_subdomain_or_nil(_), do: {:error, "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.') or nil"}

  @doc false
  def names(v) when is_list(v) do
    if Enum.all?(v, &(dns_subdomain_or_nil(&1) == :ok and &1 != nil)),
      do: :ok,
      else: names(:bad)
  end

  def names(_), do: {:error, "a list of object names (DNS-1123 subdomains)"}

  @toleration_keys ~w(key operator value effect toleration_seconds tolerationSeconds)

  @doc false
  def tolerations(v) when is_list(v) do
    if Enum.all?(v, &(object?(&1) and keys_in?(&1, @toleration_keys))),
      do: :ok,
      else: tolerations(:bad)
  end

  def tolerations(_),
    do: {:error, "a list of maps with :key, :operator, :value, :effect and :toleration_seconds"}

  @affinity_keys ~w(node_affinity pod_affinity pod_anti_affinity nodeAffinity podAffinity podAntiAffinity)

  @doc false
  def affinity(nil), do: :ok

  def affinity(v) do
    if object?(v) and keys_in?(v, @affinity_keys),
      do: :ok,
      else: {:error, "a map with :node_affinity, :pod_affinity and/or :pod_anti_affinity (Kubernetes' Affinity)"}
  end

  @security_context_keys ~w(allow_privilege_escalation app_armor_profile capabilities privileged proc_mount
                            read_only_root_filesystem run_as_group run_as_non_root run_as_user se_linux_options
                            seccomp_profile windows_options allowPrivilegeEscalation appArmorProfile procMount
                            readOnlyRootFilesystem runAsGroup runAsNonRoot runAsUser seLinuxOptions seccompProfile
                            windowsOptions)

  @doc false
  def security_context(nil), do: :ok

  def security_context(v) do
    if object?(v) and keys_in?(v, @security_context_keys),
      do: :ok,
      else: {:error, "a map of container securityContext fields (:run_as_non_root, :run_as_group, ...)"}
  end

  @doc false
  def resources_or_nil(nil), do: :ok

  def resources_or_nil(v) do
    ok? =
      object?(v) and keys_in?(v, ~w(requests limits)) and
        Enum.all?(Map.new(v), fn {_k, q} ->
          object?(q) and Enum.all?(Map.new(q), fn {_name, amount} -> quantity?(amount) end)
        end)

    if ok?,
      do: :ok,
      else:
        {:error, "a map with :requests and/or :limits, each a map of resource names to quantities (\"100m\", \"64Mi\")"}
  end

  defp quantity?(v) when is_integer(v) and v >= 0, do: true
  defp quantity?(v) when is_binary(v), do: v =~ ~r/\A[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]+)?\z/
  defp quantity?(_), do: false

  # A Kubernetes object given as a map or a keyword list: atom or string
  # keys, and values that JSON can carry.
  defp object?(v) when is_map(v), do: Enum.all?(v, fn {k, val} -> key?(k) and value?(val) end)
  defp object?([_ | _] = v), do: Keyword.keyword?(v) and object?(Map.new(v))
  defp object?(_), do: false

  defp key?(k), do: (is_atom(k) and k not in [nil, true, false]) or (is_binary(k) and k != "")

  defp value?(v) when is_binary(v) or is_number(v) or is_boolean(v) or is_nil(v), do: true
  defp value?(v) when is_atom(v), do: true
  defp value?(v) when is_map(v), do: object?(v)
  defp value?(v) when is_list(v), do: object?(v) or Enum.all?(v, &value?/1)
  defp value?(_), do: false

  defp keys_in?(v, allowed), do: Enum.all?(Map.new(v), fn {k, _} -> to_string(k) in allowed end)

  @doc false
  def boolean_or_nil(v) when is_nil(v) or is_boolean(v), do: :ok
  def boolean_or_nil(_), do: {:error, "a boolean"}

  @doc false
  def interval(false), do: :ok
  def interval(v) when is_integer(v) and v > 0, do: :ok
  def interval(_), do: {:error, "a positive integer (milliseconds) or false"}

  @doc false
  def paths(nil), do: :ok
  def paths(v) when is_binary(v) and v != "", do: :ok

  def paths([_ | _] = v),
    do: if(Enum.all?(v, &(is_binary(&1) and &1 != "")), do: :ok, else: paths(:bad))

  def paths(_), do: {:error, "a path or a non-empty list of paths"}

  @doc false
  def workspace_source(nil), do: :ok
  def workspace_source(v) when is_binary(v) and v != "", do: :ok

  def workspace_source(v) when is_list(v) or is_map(v) do
    with true <- is_map(v) or Keyword.keyword?(v),
         m = Map.new(v),
         [] <- Map.keys(m) -- [:git, :ref],
         true <- is_binary(m[:git]) and m[:git] != "",
         true <- is_nil(m[:ref]) or (is_binary(m[:ref]) and m[:ref] != "" and not String.starts_with?(m[:ref], "-")) do
      :ok
    else
      _ -> workspace_source(:bad)
    end
  end

  def workspace_source(_), do: {:error, "a git URL, or [git: url, ref: ref] (a ref not starting with \"-\")"}

  @doc false
  def host_aliases(v) when is_list(v) do
    if Enum.all?(v, &host_alias?/1),
      do: :ok,
      else: {:error, "a list of %{ip: address, hostnames: [name, ...]}"}
  end

  def host_aliases(_), do: {:error, "a list of %{ip: address, hostnames: [name, ...]}"}

  defp host_alias?(a) when is_map(a) or is_list(a) do
    m = if is_map(a), do: a, else: (Keyword.keyword?(a) && Map.new(a)) || %{}
    ip = m[:ip] || m["ip"]
    names = m[:hostnames] || m["hostnames"]

    is_binary(ip) and match?({:ok, _}, :inet.parse_strict_address(String.to_charlist(ip))) and
      is_list(names) and names != [] and
      Enum.all?(names, &(is_binary(&1) and &1 =~ ~r/\A[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?\z/))
  end

  defp host_alias?(_), do: false
end
