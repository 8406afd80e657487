defmodule Condukt.Sandbox.Kubernetes.Manifest do
  @moduledoc false
  # The pod of docs/kubernetes.md, "Pod", as a plain map (JSON-ready).

  alias Condukt.Sandbox.Kubernetes.Names
  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests

  @keepalive "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"

  # What a root workspace keeps of the runtime's default capability set:
  # enough to own, edit and chmod every file of its volume, signal its own
  # processes and bind ports below 1024 (docs/kubernetes.md, "Workspace
  # container"). NET_RAW (SO_MARK, raw frames), SETUID/SETGID (the
  # sidecar's uid), SETPCAP, SETFCAP, MKNOD, SYS_CHROOT and AUDIT_WRITE go.
  @workspace_caps ~w(CHOWN DAC_OVERRIDE FOWNER FSETID KILL NET_BIND_SERVICE)

  # Refused through `:capabilities` when a network policy is enforced:
  # each lets the workspace forge the sidecar's exemption (the socket mark
  # or its uid) or get around the rules altogether.
  @policy_refused_caps ~w(ALL NET_RAW NET_ADMIN SETUID SETGID SYS_ADMIN BPF SYS_MODULE)

  @doc "The capabilities the workspace container keeps unless `:capabilities` adds more."
  @spec workspace_capabilities() :: [String.t()]
  def workspace_capabilities, do: @workspace_caps

  @doc """
  Checks the workspace options that a network policy forbids: the
  capabilities in `@policy_refused_caps` and `:run_as_user` equal to the
  sidecar's uid. Returns `:ok` or `{:error, {:invalid, key, value, expected}}`.
  """
  @spec check_workspace(map() | keyword(), boolean()) :: :ok | {:error, {:invalid, atom(), term(), String.t()}}
  def check_workspace(opts, policy?) do
    caps = Enum.map(requested_caps(opts), &normalize_cap/1)
    uid = Manifests.sidecar_uid()
    run_as = run_as_user(opts)

    cond do
      not policy? ->
        :ok

      (bad = Enum.filter(caps, &(&1 in @policy_refused_caps))) != [] ->
        {:error,
         {:invalid, :capabilities, opts[:capabilities],
          "a list without #{Enum.join(bad, ", ")} (from :capabilities or :security_context): " <>
            "with a network policy the workspace may not have " <>
            Enum.join(@policy_refused_caps, ", ") <>
            " (they let it forge the sidecar's exemption or get around the rules)"}}

      run_as == uid ->
        {:error,
         {:invalid, :run_as_user, uid,
          "another uid than the sidecar's (#{uid}): its marked sockets are the ones exempt from the rules"}}

      true ->
        :ok
    end
  end

  # `:capabilities` and the `add` list of `:security_context`'s capabilities.
  defp requested_caps(opts) do
    added = get_in(to_k8s(opts[:security_context] || %{}), ["capabilities", "add"]) || []
    (opts[:capabilities] || []) ++ added
  end

  # `:run_as_user` wins over `:security_context`'s runAsUser.
  defp run_as_user(opts), do: opts[:run_as_user] || to_k8s(opts[:security_context] || %{})["runAsUser"]

  defp normalize_cap(name), do: name |> to_string() |> String.upcase() |> String.replace_prefix("CAP_", "")

  @doc """
  `cfg` is the validated init options as a map plus `:id` (a string),
  `:pod`, `:delete_on_shutdown` (a boolean), `:now` and, with a policy,
  `:policy_params` (`t:Manifests.params/0`).
  """
  @spec pod(map()) :: map()
  def pod(cfg) do
    policy? = cfg[:policy_params] != nil

    container =
      %{
        "name" => "workspace",
        "image" => cfg.image,
        "command" => ["/bin/sh", "-c", @keepalive],
        "workingDir" => cfg.cwd,
        "env" => env(cfg.env, policy?),
        "volumeMounts" =>
          [%{"name" => "workspace", "mountPath" => cfg.cwd}] ++ if(policy?, do: Manifests.workspace_mounts(), else: [])
      }
      |> put_if("resources", cfg[:resources] && to_k8s(cfg.resources))
      |> Map.put("securityContext", elem(workspace_security_context(cfg), 0))

    spec =
      %{
        "restartPolicy" => "Always",
        "activeDeadlineSeconds" => cfg.active_deadline_seconds,
        "automountServiceAccountToken" => false,
        "volumes" =>
          [%{"name" => "workspace", "emptyDir" => %{}}] ++
            if(policy?, do: Manifests.volumes(cfg.policy_params), else: []),
        "containers" => [container]
      }
      |> put_if("serviceAccountName", cfg[:service_account])
      |> put_if("hostAliases", host_aliases(cfg[:host_aliases] || []))
      |> put_if("nodeSelector", non_empty(Names.stringify(cfg[:node_selector] || %{})))
      |> put_if("tolerations", non_empty_list(Enum.map(cfg[:tolerations] || [], &to_k8s/1)))
      |> put_if("affinity", cfg[:affinity] && to_k8s(cfg.affinity))
      |> put_if("runtimeClassName", cfg[:runtime_class_name])
      |> put_if("priorityClassName", cfg[:priority_class_name])
      |> put_if("imagePullSecrets", non_empty_list(Enum.map(cfg[:image_pull_secrets] || [], &%{"name" => &1})))
      |> put_if("securityContext", policy? && %{"fsGroup" => Manifests.sidecar_uid()})
      |> put_if("initContainers", policy? && Manifests.init_containers(cfg.policy_params))

    %{
      "apiVersion" => "v1",
      "kind" => "Pod",
      "metadata" => %{
        "name" => cfg.pod,
        "namespace" => cfg.namespace,
        "labels" => Names.pod_labels(cfg.id, cfg.labels),
        "annotations" => Names.pod_annotations(cfg.id, cfg.delete_on_shutdown, cfg.now, cfg.annotations)
      },
      "spec" => spec
    }
  end

  @doc """
  The workspace container's `securityContext` and what the hardening
  overrode of `:security_context` (one sentence each, for the log).

  Every default capability the workspace does not need is dropped, and
  nothing can be regained through a setuid or file-capability binary;
  `:security_context` adds fields under that: its capabilities join
  `:capabilities` (and are checked with them), a `privileged`, an
  `allowPrivilegeEscalation`, an `Unconfined` seccomp profile or an
  `Unmasked` `procMount` is overridden.
  """
  @spec workspace_security_context(map() | keyword()) :: {map(), [String.t()]}
  def workspace_security_context(cfg) do
    caps = Enum.uniq(@workspace_caps ++ Enum.map(requested_caps(cfg), &normalize_cap/1))

    hardening =
      %{
        "allowPrivilegeEscalation" => false,
        "capabilities" => %{"drop" => ["ALL"], "add" => caps},
        "seccompProfile" => %{"type" => "RuntimeDefault"}
      }
      |> put_if("runAsUser", run_as_user(cfg))

    user = to_k8s(cfg[:security_context] || %{})

    Enum.reduce(Enum.sort(user), {hardening, []}, fn {key, value}, {ctx, notes} ->
      case under_hardening(key, value, ctx) do
        {:keep, ctx} -> {ctx, notes}
        {:override, ctx, note} -> {ctx, notes ++ [note]}
      end
    end)
  end

  # One field of the caller's securityContext against the hardening.
  defp under_hardening("capabilities", _value, ctx), do: {:keep, ctx}
  defp under_hardening("runAsUser", _value, ctx), do: {:keep, ctx}
  defp under_hardening("allowPrivilegeEscalation", false, ctx), do: {:keep, ctx}

  defp under_hardening("allowPrivilegeEscalation", value, ctx),
    do: {:override, ctx, "allowPrivilegeEscalation #{inspect(value)} overridden: it stays false"}

  defp under_hardening("privileged", false, ctx), do: {:keep, Map.put(ctx, "privileged", false)}

  defp under_hardening("privileged", value, ctx),
    do: {:override, ctx, "privileged #{inspect(value)} overridden: the workspace is never privileged"}

  defp under_hardening("seccompProfile", %{"type" => type} = profile, ctx) when type in ["RuntimeDefault", "Localhost"],
    do: {:keep, Map.put(ctx, "seccompProfile", profile)}

  defp under_hardening("seccompProfile", value, ctx),
    do: {:override, ctx, "seccompProfile #{inspect(value)} overridden: it stays RuntimeDefault (or a Localhost one)"}

  defp under_hardening("procMount", "Default", ctx), do: {:keep, Map.put(ctx, "procMount", "Default")}

  defp under_hardening("procMount", value, ctx),
    do: {:override, ctx, "procMount #{inspect(value)} overridden: it stays Default"}

  defp under_hardening(key, value, ctx), do: {:keep, Map.put(ctx, key, value)}

  # The caller's variables, then (with a policy) the CA variables, which
  # win over a caller's variable of the same name; a caller's
  # JAVA_TOOL_OPTIONS is kept, in front of the trust store's options.
  defp env(env, policy?) do
    caller =
      env
      |> Enum.map(fn {k, v} -> {to_string(k), to_string(v)} end)
      |> Enum.reverse()
      |> Enum.uniq_by(&elem(&1, 0))
      |> Enum.reverse()

    java = Enum.find_value(caller, fn {k, v} -> if k == "JAVA_TOOL_OPTIONS", do: v end)
    ca = if policy?, do: Manifests.ca_env() ++ Manifests.trust_env(java), else: []
    ca_names = MapSet.new(ca, & &1["name"])

    caller =
      caller
      |> Enum.reject(fn {k, _} -> MapSet.member?(ca_names, k) end)
      |> Enum.map(fn {k, v} -> %{"name" => k, "value" => v} end)

    caller ++ ca
  end

  defp host_aliases([]), do: nil

  defp host_aliases(aliases) do
    Enum.map(aliases, fn a ->
      m = Map.new(a)
      %{"ip" => m[:ip] || m["ip"], "hostnames" => m[:hostnames] || m["hostnames"]}
    end)
  end

  defp non_empty(m) when map_size(m) == 0, do: nil
  defp non_empty(m), do: m

  defp non_empty_list([]), do: nil
  defp non_empty_list(l), do: l

  defp put_if(map, _k, nil), do: map
  defp put_if(map, _k, false), do: map
  defp put_if(map, k, v), do: Map.put(map, k, v)

  @doc """
  A Kubernetes object from its Elixir form: maps and keyword lists become
  string-keyed maps, atom keys in snake_case become camelCase
  (`:toleration_seconds` is `"tolerationSeconds"`), string keys stay as
  given, and atom values (other than booleans and nil) become strings.
  """
  @spec to_k8s(term()) :: term()
  def to_k8s(m) when is_map(m), do: Map.new(m, fn {k, v} -> {k8s_key(k), to_k8s(v)} end)
  def to_k8s([{k, _} | _] = kw) when is_atom(k), do: if(Keyword.keyword?(kw), do: to_k8s(Map.new(kw)), else: kw)
  def to_k8s(l) when is_list(l), do: Enum.map(l, &to_k8s/1)
  def to_k8s(v) when is_atom(v) and v not in [nil, true, false], do: Atom.to_string(v)
  def to_k8s(v), do: v

  defp k8s_key(k) when is_binary(k), do: k

  defp k8s_key(k) when is_atom(k) do
    [first | rest] = k |> Atom.to_string() |> String.split("_")
    Enum.join([first | Enum.map(rest, &String.capitalize/1)])
  end
end
