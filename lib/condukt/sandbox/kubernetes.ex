defmodule Condukt.Sandbox.Kubernetes do
  @moduledoc """
  Sandbox that runs each session inside a dedicated Kubernetes Pod.

  One Pod per session. Every file operation and every command runs inside
  the Pod through the Kubernetes exec API (`Condukt.Kube`, over the
  `condukt-egress port` program: no `kubectl`). The agent cannot reach the
  host running the BEAM.

      {:ok, sb} = Condukt.Sandbox.new({Condukt.Sandbox.Kubernetes, namespace: "agents", id: "job-42"})
      {:ok, %{output: "hi\\n", exit_code: 0}} = Condukt.Sandbox.exec(sb, "echo hi")
      :ok = Condukt.Sandbox.shutdown(sb)   # the pod stays: an :id was given
      :ok = Condukt.Sandbox.Kubernetes.terminate("job-42", namespace: "agents")

  ## Idempotent init via the session id

  `init/1` derives a deterministic pod name from `:id`
  (`condukt-<slug>-<hash>`, docs/kubernetes.md) and either adopts the
  existing pod or creates a fresh one, so a retried job with the same id
  reattaches to its pod and finds its workspace (an `emptyDir` at `:cwd`)
  as it left it. An existing pod that is `Running` is adopted, a `Pending`
  one is waited for (`:ready_timeout`), a terminating one is waited out and
  then recreated; `Succeeded` or `Failed` follow `:on_stale`. A pod of that
  name that Condukt did not create for this id is refused.

  Without an `:id`, one is generated and the pod is single-use:
  `shutdown/1` deletes it (`:delete_on_shutdown`).

  ## Init options

  #{Condukt.Options.docs(Condukt.Sandbox.Kubernetes.Schema.init())}

  Unknown options are refused with a "did you mean …?" hint.

  ## Dry run

  `manifests/1` returns the objects `init/1` would create for the same
  options, and `mix condukt.manifests` prints them as YAML, for review,
  admission checks or a GitOps diff, without touching the cluster.

  ## Heartbeat and reaping

  Each pod carries a `condukt.tuist.dev/heartbeat-at` annotation (RFC 3339,
  UTC). A worker tied to the process that called `init/1` refreshes it
  every `:heartbeat_interval`; when that process ends, for whatever
  reason (a crash, or a plain return), the worker stops with it, and
  `reap_stale/1`, run from elsewhere, deletes pods whose heartbeat is too
  old. `reap_stale/1` also reads `condukt.dev/heartbeat`, the name earlier
  versions wrote, so their pods are reaped too.
  `:active_deadline_seconds` is the cluster-side ceiling either way.

  ## Operations

  Every operation is one exec into the `workspace` container with an argv;
  paths, patterns and commands are separate arguments (or stdin), never
  part of a shell line, so nothing in them can inject. Relative paths
  resolve against `:cwd`.

    * `exec/3` runs `sh -c COMMAND` in `:cwd` (or the `:cwd` option), under
      `timeout -s KILL`, stdout and stderr interleaved into `:output`,
      stdin `/dev/null`; options as `Condukt.Sandbox.Local`'s (`:timeout`,
      `:cwd`, `:env`, `:max_output_bytes`). A timeout is
      `{:error, %Condukt.Sandbox.Error{reason: :timeout}}`.
    * `read_file/2` is `cat`; errors carry the POSIX reason (`:enoent`, …).
    * `write_file/3` streams the content through exec's stdin into
      `head -c N` (8 MiB per exec), creating parent directories. Unlike
      Local it writes in place, not by rename.
    * `edit_file/4` reads, applies Local's exact rule, and writes.
    * `glob/3` lists with `find` and matches the pattern here, with
      `Path.wildcard/2` semantics; `grep/3` runs `grep -P` (or `-F` with
      `literal: true`) with Local's options and result shape.
    * `mount/3` is not supported: a running pod cannot gain volumes.

  ## Network policy

  With `:network_policy`, every TCP 80/443 connection of the pod goes
  through the `condukt-egress` sidecar (a native sidecar init container)
  behind iptables rules set by an init container, with a per-session CA
  that the workspace trusts (six CA variables, and a bundle, written in
  the pod from the sidecar image's roots, mounted over the system trust
  store). The pod gets two small Secrets and a NetworkPolicy
  (docs/kubernetes.md, "Objects"), owned by the pod. A
  `Condukt.Sandbox.NetworkPolicy.ControlBridge` reaches the sidecar's
  control port through a port-forward listener on a Unix socket in a
  private directory: decide rules run on the BEAM and every request
  becomes a `:telemetry` event. A dropped tunnel is re-dialled through the
  listener (a silent one is found by a ping every 5 s), without giving up
  however long the kubelet or API server stays down (decide rules fail
  closed meanwhile, allow and deny rules keep working); reattaching to an
  existing pod brings the bridge back with the token from the pod's
  Secret.

  ## RBAC

  The identity needs, in the namespace (docs/kubernetes.md, "RBAC"):
  `pods` get/list/create/patch/delete; `pods/exec` and `pods/portforward`
  get/create (WebSocket upgrades are GETs); with a network policy,
  `secrets` and `networkpolicies.networking.k8s.io`
  get/list/create/patch/delete. A refusal names the verb and resource to
  grant (`Condukt.Kube.Error`).
  """

  @behaviour Condukt.Sandbox

  import Condukt.Sandbox.Backend, only: [validate: 3, network_policy: 1, credential_values: 1, rotate_in_sidecar: 3]

  require Logger

  alias Condukt.{Kube, Native, Options}
  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Kubernetes.{Forward, Heartbeat, Manifest, Names, Ops, Schema}
  alias Condukt.Sandbox.Local.Schema, as: LocalSchema
  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge
  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests

  @poll_ms 200

  @enforce_keys [:id, :pod, :namespace, :cwd, :kube]
  defstruct [
    :id,
    :pod,
    :namespace,
    :cwd,
    :kube,
    :heartbeat,
    :bridge,
    :forward,
    :forward_dir,
    :network_policy,
    delete_on_shutdown: false,
    created: false,
    timeout: 120_000,
    max_output_bytes: 1_048_576
  ]

  @typedoc "The state `init/1` returns; `Condukt.Sandbox` keeps it in its handle."
  @type t :: %__MODULE__{
          id: String.t(),
          pod: String.t(),
          namespace: String.t(),
          cwd: String.t(),
          kube: Kube.t(),
          heartbeat: pid() | nil,
          bridge: pid() | nil,
          forward: pid() | nil,
          forward_dir: Path.t() | nil,
          network_policy: NetworkPolicy.t() | nil,
          delete_on_shutdown: boolean(),
          created: boolean(),
          timeout: pos_integer(),
          max_output_bytes: pos_integer()
        }

  @doc "The pod name for a session id (docs/kubernetes.md, \"Names\")."
  @spec pod_name(String.t()) :: String.t()
  def pod_name(id) when is_binary(id), do: Names.pod_name(id)

  ## init -----------------------------------------------------------------------

  @impl true
  @spec init(keyword()) :: {:ok, t()} | {:error, Error.t() | {:stale_pod, String.t()}}
  def init(opts) do
    with {:ok, opts} <- validate(opts, Schema.init(), :new),
         {:ok, policy} <- network_policy(opts[:network_policy]),
         :ok <- workspace_options(opts, policy),
         {:ok, kube, namespace} <- connect(opts, :new) do
      opts = Keyword.put(opts, :namespace, namespace)
      {id, explicit?} = if opts[:id] == nil, do: {random_id(), false}, else: {to_string(opts[:id]), true}
      delete? = if opts[:delete_on_shutdown] == nil, do: not explicit?, else: opts[:delete_on_shutdown]

      state = %__MODULE__{
        id: id,
        pod: Names.pod_name(id),
        namespace: opts[:namespace],
        cwd: opts[:cwd],
        kube: kube,
        network_policy: policy,
        delete_on_shutdown: delete?,
        timeout: opts[:timeout],
        max_output_bytes: opts[:max_output_bytes]
      }

      cfg = Map.new(opts)

      case bring_up(state, cfg) do
        {:ok, state} ->
          {:ok, state}

        {:error, _} = error ->
          Kube.close(kube)
          error
      end
    end
  end

  # Capabilities and a uid that would let the workspace forge the
  # sidecar's exemption are refused before anything is created.
  # A :security_context value the hardening overrides is logged.
  defp workspace_options(opts, policy) do
    case Manifest.check_workspace(opts, policy != nil) do
      :ok ->
        {_context, overridden} = Manifest.workspace_security_context(opts)

        for note <- overridden,
            do: Logger.warning("condukt: Kubernetes sandbox: :security_context #{note} by the sandbox's hardening")

        :ok

      {:error, detail} ->
        {:error, %Error{reason: :invalid_option, op: :new, detail: detail}}
    end
  end

  defp random_id, do: "s-" <> (:crypto.strong_rand_bytes(8) |> Base.encode16(case: :lower))

  # The connection and the namespace to work in: `:namespace`, else the
  # connection's (the kubeconfig context's `namespace`, or the in-cluster
  # ServiceAccount's), else "default", as kubectl resolves it.
  defp connect(opts, op) do
    case Kube.connect(Keyword.take(opts, [:conn, :kubeconfig, :context, :in_cluster])) do
      {:ok, kube} ->
        case namespace(opts[:namespace], kube) do
          {:ok, ns} ->
            {:ok, kube, ns}

          {:error, e} ->
            Kube.close(kube)
            {:error, %Error{reason: :backend, op: op, detail: e}}
        end

      {:error, e} ->
        {:error, %Error{reason: :backend, op: op, detail: e}}
    end
  end

  defp namespace(ns, _kube) when is_binary(ns), do: {:ok, ns}
  defp namespace(nil, %Kube{namespace: ns}) when ns in [nil, ""], do: {:ok, "default"}

  defp namespace(nil, %Kube{namespace: ns} = kube) do
    case Schema.dns_label(ns) do
      :ok ->
        {:ok, ns}

      {:error, expected} ->
        from = if kube.context, do: "of the kubeconfig context #{inspect(kube.context)}", else: "of the connection"

        {:error,
         %Kube.Error{
           reason: :config,
           message: "the namespace #{inspect(ns)} #{from} is not #{expected}; pass :namespace"
         }}
    end
  end

  defp bring_up(state, cfg) do
    deadline = System.monotonic_time(:millisecond) + cfg.ready_timeout

    with {:ok, pod, how} <- ensure_pod(state, cfg, deadline) do
      state = %{state | created: how == :created}

      case attach(state, cfg, pod, how) do
        {:ok, state} ->
          {:ok, state}

        {:error, _} = error ->
          release(state)
          if state.delete_on_shutdown, do: delete_objects(state.kube, state.namespace, state.id)
          error
      end
    end
  end

  # Adopt, wait for, or create the pod: {:ok, pod, :created | :adopted}.
  defp ensure_pod(state, cfg, deadline) do
    case Kube.get(state.kube, :pods, state.namespace, state.pod) do
      {:error, %Kube.Error{reason: :not_found}} ->
        create(state, cfg, deadline)

      {:ok, pod} ->
        with :ok <- check_ours(state, pod) do
          cond do
            terminating?(pod) ->
              with :ok <- wait_gone(state, deadline), do: create(state, cfg, deadline)

            phase(pod) == "Running" ->
              {:ok, pod, :adopted}

            phase(pod) in ["Succeeded", "Failed"] ->
              stale(state, cfg, deadline, phase(pod))

            true ->
              wait_running(state, cfg, deadline, :adopted)
          end
        end

      {:error, e} ->
        kube_error(e)
    end
  end

  defp check_ours(state, pod) do
    labels = get_in(pod, ["metadata", "labels"]) || %{}
    annotations = get_in(pod, ["metadata", "annotations"]) || %{}

    if labels[Names.managed_by_label()] == "condukt" and annotations[Names.id_annotation()] == state.id do
      :ok
    else
      {:error,
       %Error{
         reason: :backend,
         op: :new,
         detail:
           "pod #{state.pod} in namespace #{state.namespace} exists but was not created by Condukt for the id " <>
             "#{inspect(state.id)}; refusing to adopt it"
       }}
    end
  end

  defp stale(state, cfg, deadline, phase) do
    case cfg.on_stale do
      :error ->
        {:error, {:stale_pod, phase}}

      :recreate ->
        Logger.info("condukt: Kubernetes sandbox: pod #{state.pod} is #{phase}; recreating it (on_stale: :recreate)")

        with :ok <- delete_objects(state.kube, state.namespace, state.id),
             :ok <- wait_gone(state, deadline) do
          create(state, cfg, deadline)
        end
    end
  end

  defp terminating?(pod), do: get_in(pod, ["metadata", "deletionTimestamp"]) != nil
  defp phase(pod), do: get_in(pod, ["status", "phase"])

  defp wait_gone(state, deadline) do
    case Kube.get(state.kube, :pods, state.namespace, state.pod) do
      {:error, %Kube.Error{reason: :not_found}} ->
        :ok

      {:ok, pod} ->
        if System.monotonic_time(:millisecond) >= deadline do
          {:error,
           %Error{
             reason: :timeout,
             op: :new,
             detail: "pod #{state.pod} was still terminating at the end of :ready_timeout (phase #{phase(pod)})"
           }}
        else
          Process.sleep(@poll_ms)
          wait_gone(state, deadline)
        end

      {:error, e} ->
        kube_error(e)
    end
  end

  defp wait_running(state, cfg, deadline, how) do
    case Kube.get(state.kube, :pods, state.namespace, state.pod) do
      {:ok, pod} ->
        cond do
          terminating?(pod) and how == :adopted ->
            with :ok <- wait_gone(state, deadline), do: create(state, cfg, deadline)

          phase(pod) == "Running" ->
            {:ok, pod, how}

          phase(pod) in ["Succeeded", "Failed"] and how == :adopted ->
            stale(state, cfg, deadline, phase(pod))

          phase(pod) in ["Succeeded", "Failed"] ->
            {:error,
             %Error{reason: :backend, op: :new, detail: "pod #{state.pod} ended as #{phase(pod)}: #{why_not(pod)}"}}

          System.monotonic_time(:millisecond) >= deadline ->
            {:error,
             %Error{
               reason: :timeout,
               op: :new,
               detail:
                 "pod #{state.pod} did not reach Running within #{cfg.ready_timeout} ms " <>
                   "(phase #{phase(pod) || "unknown"}#{why_not(pod)})"
             }}

          true ->
            Process.sleep(@poll_ms)
            wait_running(state, cfg, deadline, how)
        end

      {:error, %Kube.Error{reason: :not_found}} when how == :adopted ->
        create(state, cfg, deadline)

      {:error, e} ->
        kube_error(e)
    end
  end

  # The container states that explain a pod that is not running.
  defp why_not(pod) do
    statuses =
      (get_in(pod, ["status", "initContainerStatuses"]) || []) ++ (get_in(pod, ["status", "containerStatuses"]) || [])

    reasons =
      for %{"name" => name, "state" => st} <- statuses,
          {kind, %{} = detail} when kind in ["waiting", "terminated"] <- st,
          reason = detail["reason"],
          reason not in [nil, "Completed"],
          do: "#{name}: #{reason}#{if detail["message"], do: " (#{detail["message"]})", else: ""}"

    if reasons == [], do: "", else: "; " <> Enum.join(reasons, "; ")
  end

  ## creation -------------------------------------------------------------------

  defp create(state, cfg, deadline) do
    with {:ok, params} <- policy_params(state, cfg),
         {:ok, pod} <- create_objects(state, cfg, params) do
      _ = pod
      wait_running(state, cfg, deadline, :created)
    end
  end

  defp policy_params(%{network_policy: nil}, _cfg), do: {:ok, nil}

  defp policy_params(state, cfg) do
    native = state.kube.native

    with {:ok, values} <- credential_values(state.network_policy),
         {:ok, ca} <- native_ok(Native.ca_new(native, common_name: "condukt session #{state.pod}")),
         {:ok, token} <- native_ok(Native.token_new(native)) do
      {:ok,
       session_params(state, cfg, %{cert_pem: ca.cert_pem, key_pem: ca.key_pem, token: token, credentials: values})}
    end
  end

  defp session_params(state, cfg, secrets) do
    %{
      pod: state.pod,
      namespace: state.namespace,
      labels: Names.selector_labels(state.id),
      session_id: state.id,
      image: cfg.network_policy_image,
      ca_cert_pem: secrets.cert_pem,
      ca_key_pem: secrets.key_pem,
      token: secrets.token,
      policy_json: NetworkPolicy.to_sidecar_json(state.network_policy),
      credentials_json: credentials_json(secrets.credentials),
      upstream_ca: cfg.network_policy_upstream_ca,
      allow_private: cfg.network_policy_allow_private,
      sidecar_resources: cfg.sidecar_resources,
      init_resources: cfg.init_resources,
      proxy_args: NetworkPolicy.Capture.sidecar_args(state.network_policy),
      host_aliases: cfg[:host_aliases] || []
    }
  end

  # The sidecar's secrets file, in its Secret only (nil: no credentials).
  defp credentials_json(values) when map_size(values) == 0, do: nil
  defp credentials_json(values), do: NetworkPolicy.Credentials.sidecar_secrets_json(values)

  defp native_ok({:ok, v}), do: {:ok, v}
  defp native_ok({:error, e}), do: {:error, %Error{reason: :backend, op: :new, detail: e}}

  # The Secrets and the NetworkPolicy, the pod, then the owner references;
  # a failure deletes what was created and returns the first error.
  defp create_objects(state, cfg, params) do
    %{kube: kube, namespace: ns} = state

    # Objects a crashed earlier run left behind (the pod is gone, so the
    # garbage collector would have taken owned ones) would make the
    # creates below conflict.
    if params, do: delete_labelled(kube, ns, state.id)

    result =
      Enum.reduce_while(objects(state, cfg, params), {:ok, []}, fn {res, body}, {:ok, done} ->
        case Kube.create(kube, res, ns, body) do
          {:ok, obj} -> {:cont, {:ok, [{res, obj} | done]}}
          {:error, e} -> {:halt, {:error, e, done}}
        end
      end)

    with {:ok, done} <- result,
         [{:pods, pod} | _] = done,
         :ok <- own(kube, ns, pod, Enum.drop(done, 1)) do
      {:ok, pod}
    else
      {:error, e, done} ->
        rollback(kube, ns, done)
        kube_error(e)

      {:error, e, done, :patch} ->
        rollback(kube, ns, done)
        kube_error(e)
    end
  end

  # What init/1 creates, in order: with a policy the two Secrets and the
  # NetworkPolicy, then the pod. manifests/1 shows the same list.
  defp objects(state, cfg, params) do
    pod =
      Manifest.pod(
        Map.merge(cfg, %{
          id: state.id,
          pod: state.pod,
          delete_on_shutdown: state.delete_on_shutdown,
          now: DateTime.utc_now(),
          policy_params: params
        })
      )

    extras =
      if params,
        do: [
          {:secrets, Manifests.egress_secret(params)},
          {:secrets, Manifests.trust_secret(params)},
          {:networkpolicies, Manifests.network_policy(params)}
        ],
        else: []

    extras ++ [{:pods, pod}]
  end

  ## manifests ------------------------------------------------------------------

  @placeholder "generated-by-init"

  @doc """
  The Kubernetes objects `init/1` would create for these options, without
  creating anything: for review, policy checks (`kubectl apply
  --dry-run=server -f -`, admission tests, GitOps diffs).

  Takes `init/1`'s options and returns the objects in the order `init/1`
  creates them: with a `:network_policy` the sidecar's Secret
  `<pod>-egress`, the trust Secret `<pod>-trust` and the NetworkPolicy
  `<pod>-egress`, then the Pod. They are what `init/1` sends, field for
  field, except what only exists per session:

    * the Secrets' values (the session CA certificate and key, the control
      token) are the placeholder `"#{@placeholder}"`, base64-encoded;
      the policy is the real one; the credentials' secrets file names
      each secret with the value `"[redacted]"` (no secret is resolved:
      no function is called, no environment variable read);
    * the heartbeat annotation is the time of the call;
    * without an `:id`, a random id is used, as `init/1` does.

  The owner references `init/1` adds right after the pod exists are not
  included (they need the pod's uid). The namespace is `:namespace`, else
  the connection's, as `init/1` resolves it (reading the kubeconfig; the
  API server is not contacted).

  `mix condukt.manifests` prints them as YAML.
  """
  @spec manifests(keyword()) :: {:ok, [map()]} | {:error, Error.t()}
  def manifests(opts) do
    with {:ok, opts} <- validate(opts, Schema.init(), :new),
         {:ok, policy} <- network_policy(opts[:network_policy]),
         :ok <- workspace_options(opts, policy),
         {:ok, namespace} <- manifest_namespace(opts) do
      id = if opts[:id] == nil, do: random_id(), else: to_string(opts[:id])
      delete? = if opts[:delete_on_shutdown] == nil, do: opts[:id] == nil, else: opts[:delete_on_shutdown]
      cfg = Map.new(Keyword.put(opts, :namespace, namespace))

      state = %{
        id: id,
        pod: Names.pod_name(id),
        namespace: namespace,
        network_policy: policy,
        delete_on_shutdown: delete?
      }

      params =
        if policy,
          do:
            session_params(state, cfg, %{
              cert_pem: @placeholder,
              key_pem: @placeholder,
              token: @placeholder,
              # Secret values are never resolved here: names only.
              credentials: Map.new(policy.secrets, fn {name, _} -> {name, "[redacted]"} end)
            })

      {:ok, Enum.map(objects(state, cfg, params), &elem(&1, 1))}
    end
  end

  defp manifest_namespace(opts) do
    if opts[:namespace] do
      {:ok, opts[:namespace]}
    else
      with {:ok, kube, ns} <- connect(opts, :new) do
        Kube.close(kube)
        {:ok, ns}
      end
    end
  end

  defp own(_kube, _ns, _pod, []), do: :ok

  defp own(kube, ns, pod, objects) do
    patch = Manifests.owner_patch(pod["metadata"]["name"], pod["metadata"]["uid"])

    Enum.reduce_while(objects, :ok, fn {res, obj}, :ok ->
      case Kube.patch(kube, res, ns, obj["metadata"]["name"], patch) do
        {:ok, _} -> {:cont, :ok}
        {:error, e} -> {:halt, {:error, e, [{:pods, pod} | objects], :patch}}
      end
    end)
  end

  defp rollback(kube, ns, done) do
    for {res, obj} <- done do
      name = obj["metadata"]["name"]

      case Kube.delete(kube, res, ns, name, ignore_missing: true) do
        :ok ->
          :ok

        {:error, e} ->
          Logger.warning("condukt: Kubernetes sandbox: could not delete #{res} #{name}: #{Exception.message(e)}")
      end
    end

    :ok
  end

  ## after the pod is Running ---------------------------------------------------

  defp attach(state, cfg, pod, how) do
    # The bridge before the clone: a decide rule may gate the git host.
    with :ok <- check_policy_shape(state, pod),
         :ok <- if(how == :adopted, do: beat(state), else: :ok),
         {:ok, state} <- start_bridge(state, cfg, pod),
         :ok <- release_on_error(state, workspace_source(state, cfg)) do
      {:ok, start_heartbeat(state, cfg)}
    end
  end

  defp release_on_error(_state, :ok), do: :ok

  defp release_on_error(state, error) do
    release(state)
    error
  end

  defp check_policy_shape(state, pod) do
    sidecar? = Enum.any?(get_in(pod, ["spec", "initContainers"]) || [], &(&1["name"] == "condukt-egress"))

    cond do
      state.network_policy != nil and not sidecar? ->
        {:error,
         %Error{
           reason: :network_policy_unenforceable,
           op: :new,
           detail:
             "pod #{state.pod} exists without the egress sidecar (created without a network policy); " <>
               "terminate it or use another id"
         }}

      state.network_policy == nil and sidecar? ->
        Logger.warning(
          "condukt: Kubernetes sandbox: pod #{state.pod} runs the egress sidecar but no :network_policy was given; " <>
            "its decide rules (if any) will fail closed"
        )

        :ok

      true ->
        :ok
    end
  end

  @clone_script ~S"""
  set -e
  cd -- "$1"
  if [ ! -e .git ]; then git clone --quiet -- "$2" .; fi
  if [ -n "$3" ]; then git fetch --quiet origin "$3" 2>/dev/null || true; git checkout --quiet "$3"; fi
  """

  defp workspace_source(_state, %{workspace_source: nil}), do: :ok

  defp workspace_source(state, cfg) do
    {url, ref} =
      case cfg.workspace_source do
        url when is_binary(url) -> {url, ""}
        kw -> {Map.new(kw)[:git], Map.new(kw)[:ref] || ""}
      end

    argv = ["/bin/sh", "-c", @clone_script, "sh", state.cwd, url, ref]

    case Ops.run(state, argv, timeout: cfg.workspace_source_timeout) do
      {:ok, %{exit_code: 0}} ->
        :ok

      {:ok, r} ->
        {:error,
         %Error{
           reason: :backend,
           op: :new,
           path: state.cwd,
           detail: "workspace_source: git exited #{inspect(r.exit_code)}: #{String.trim(r.stderr <> r.stdout)}"
         }}

      {:error, e} ->
        {:error, %Error{reason: :backend, op: :new, path: state.cwd, detail: e}}
    end
  end

  defp start_bridge(%{network_policy: nil} = state, _cfg, _pod), do: {:ok, state}

  defp start_bridge(state, cfg, _pod) do
    dir = Path.join(System.tmp_dir!(), "condukt-kube-" <> Base.encode16(:crypto.strong_rand_bytes(6), case: :lower))
    File.mkdir_p!(dir)
    File.chmod!(dir, 0o700)
    state = %{state | forward_dir: dir}

    with {:ok, token} <- read_token(state),
         {:ok, forward, address} <-
           wrap_forward(Forward.start(state.kube, state.namespace, state.pod, Manifests.control_port(), dir)) do
      state = %{state | forward: forward}

      bridge_opts = [
        session_id: state.id,
        owner: self(),
        policy: state.network_policy,
        address: address,
        token: token,
        messages: cfg.messages,
        # A port-forward tunnel may not report that the sidecar went away
        # (docs/kubernetes.md): silence is probed.
        ping_interval: 5_000,
        ping_timeout: 5_000,
        # Every dial crosses the API server and the kubelet, which can be
        # down for longer than the default 10 attempts (26 to 52 s) last
        # (a kubelet restart, an API server upgrade): never give up, or
        # the session's decide rules stay dead after the outage. The
        # bridge stops with the sandbox (it monitors its owner).
        attempts: :infinity
      ]

      case ControlBridge.start(bridge_opts) do
        {:ok, bridge} ->
          {:ok, %{state | bridge: bridge}}

        {:error, reason} ->
          release(state)
          {:error, %Error{reason: :backend, op: :new, detail: "the control bridge did not start: #{inspect(reason)}"}}
      end
    else
      {:error, _} = error ->
        File.rm_rf(dir)
        error
    end
  end

  defp wrap_forward({:ok, _pid, _address} = ok), do: ok
  defp wrap_forward({:error, e}), do: kube_error(e)

  # The control token, from the sidecar's Secret (also when we just wrote
  # it: one path for created and adopted pods).
  defp read_token(state) do
    case Kube.get(state.kube, :secrets, state.namespace, Names.egress_secret(state.pod)) do
      {:ok, %{"data" => %{"token" => b64}}} when is_binary(b64) ->
        case Base.decode64(b64) do
          {:ok, token} -> {:ok, String.trim(token)}
          :error -> {:error, %Error{reason: :backend, op: :new, detail: "the egress Secret's token is not base64"}}
        end

      {:ok, _} ->
        {:error, %Error{reason: :backend, op: :new, detail: "the egress Secret of pod #{state.pod} has no token"}}

      {:error, e} ->
        kube_error(e)
    end
  end

  defp start_heartbeat(state, %{heartbeat_interval: false}), do: state

  defp start_heartbeat(state, %{heartbeat_interval: ms}) do
    target = Map.take(state, [:kube, :namespace, :pod])
    %{state | heartbeat: Heartbeat.start(self(), fn -> beat(target) end, ms, state.pod)}
  end

  ## shutdown -------------------------------------------------------------------

  @doc """
  `Condukt.Sandbox.NetworkPolicy.rotate_credential/3`: replaces the value
  in the sidecar's Secret (what a restarted sidecar reads), then sends it
  over the control channel.
  """
  @spec rotate_credential(t(), String.t(), String.t()) :: :ok | {:error, NetworkPolicy.Error.t()}
  def rotate_credential(%__MODULE__{} = state, name, value) do
    with :ok <- NetworkPolicy.check_rotation(state.network_policy, name),
         :ok <- patch_credentials(state, name, value) do
      rotate_in_sidecar(state.bridge, name, value)
    end
  end

  defp patch_credentials(state, name, value) do
    secret = Names.egress_secret(state.pod)

    with {:ok, %{"data" => %{"credentials.json" => b64}}} <- Kube.get(state.kube, :secrets, state.namespace, secret),
         {:ok, text} <- Base.decode64(b64),
         %{"secrets" => values} <- decode_json(text),
         json = NetworkPolicy.Credentials.sidecar_secrets_json(Map.put(values, name, value)),
         patch = %{"data" => %{"credentials.json" => Base.encode64(json)}},
         {:ok, _} <- Kube.patch(state.kube, :secrets, state.namespace, secret, patch) do
      :ok
    else
      {:error, %{__exception__: true} = e} -> rotation_failed(name, "the sidecar's Secret: " <> Exception.message(e))
      _ -> rotation_failed(name, "the sidecar's Secret has no readable credentials")
    end
  end

  defp decode_json(text) do
    Condukt.JSON.decode!(text)
  rescue
    _ -> nil
  end

  defp rotation_failed(name, why),
    do: {:error, %NetworkPolicy.Error{reason: :rotation_failed, key: :secrets, value: name, detail: why}}

  @impl true
  @spec shutdown(t()) :: :ok | {:error, Error.t()}
  def shutdown(%__MODULE__{} = state) do
    release(state)

    result =
      if state.delete_on_shutdown,
        do: delete_objects(state.kube, state.namespace, state.id),
        else: :ok

    Kube.close(state.kube)
    result
  end

  # Everything but the pod and the connection.
  defp release(state) do
    Heartbeat.stop(state.heartbeat)
    ControlBridge.stop(state.bridge)
    Forward.stop(state.forward)
    if state.forward_dir, do: File.rm_rf(state.forward_dir)
    :ok
  end

  ## heartbeat, terminate, reap_stale -----------------------------------------

  @doc """
  Updates the heartbeat annotation on a Kubernetes sandbox pod, now.

  The sandbox starts a worker tied to the owner process by default; this
  is for callers that pass `heartbeat_interval: false` and drive
  heartbeats from their own supervision tree. Takes the sandbox handle
  (`Condukt.Sandbox.t()`) or its state.
  """
  @spec heartbeat(Condukt.Sandbox.t() | t()) :: :ok | {:error, Error.t()}
  def heartbeat(%Condukt.Sandbox{module: __MODULE__, state: state}), do: heartbeat(state)

  def heartbeat(%__MODULE__{} = state) do
    case beat(state) do
      :ok -> :ok
      {:error, %Error{}} = e -> e
      {:error, e} -> {:error, %Error{reason: :backend, detail: e}}
    end
  end

  defp beat(%{kube: kube, namespace: ns, pod: pod}) do
    patch = %{"metadata" => %{"annotations" => %{Names.heartbeat_annotation() => Names.timestamp(DateTime.utc_now())}}}

    case Kube.patch(kube, :pods, ns, pod, patch) do
      {:ok, _} -> :ok
      {:error, e} -> kube_error(e)
    end
  end

  @conn_schema [
    namespace: [type: {:custom, &Schema.dns_label_or_nil/1}, default: nil, doc: "the namespace."],
    conn: [type: :any, default: nil, doc: "as for `init/1`."],
    kubeconfig: [type: {:custom, &Schema.paths/1}, default: nil, doc: "as for `init/1`."],
    context: [type: {:custom, &Schema.string_or_nil/1}, default: nil, doc: "as for `init/1`."],
    in_cluster: [type: {:custom, &Schema.boolean_or_nil/1}, default: nil, doc: "as for `init/1`."]
  ]

  @doc """
  Deletes the pod backing the session `id`, with its Secrets and
  NetworkPolicy (selected by label). A pod already gone is `:ok`.

  Use this when a session is truly done and the pod should not outlive it
  (the default when an `:id` is set).

      Condukt.Sandbox.Kubernetes.terminate(id, namespace: "agents")

  Options: `:namespace` (resolved as by `init/1`: the kubeconfig
  context's namespace, else `"default"`) and the connection options of
  `init/1` (`:conn`, `:kubeconfig`, `:context`, `:in_cluster`).
  """
  @spec terminate(String.t() | atom() | integer(), keyword()) :: :ok | {:error, Error.t()}
  def terminate(id, opts \\ []) do
    with :ok <- check_id(id),
         {:ok, opts} <- validate(opts, @conn_schema, :shutdown),
         {:ok, kube, namespace} <- connect(opts, :shutdown) do
      try do
        delete_objects(kube, namespace, to_string(id))
      after
        Kube.close(kube)
      end
    end
  end

  defp check_id(id) do
    case Schema.id(id) do
      :ok when id != nil -> :ok
      _ -> {:error, %Error{reason: :invalid_option, op: :shutdown, detail: {:invalid, :id, id, "a non-empty string"}}}
    end
  end

  @doc """
  Deletes Condukt-managed pods whose heartbeat annotation is older than
  `:stale_after` (pods without one count from their creation), with their
  Secrets and NetworkPolicies. Returns the names of the deleted pods.

  The heartbeat is `condukt.tuist.dev/heartbeat-at`; pods made by earlier
  versions carry `condukt.dev/heartbeat` instead, which is read too (the
  newer of the two counts when a pod has both).

  Options:

    * `:namespace` - namespace to scan, resolved as by `init/1` (the
      kubeconfig context's namespace, else `"default"`).
    * `:stale_after` - heartbeat age in milliseconds, default 15 minutes.
    * `:now` - `DateTime` used for tests, default `DateTime.utc_now()`.
    * the connection options of `init/1`: `:conn`, `:kubeconfig`,
      `:context`, `:in_cluster`.
  """
  @spec reap_stale(keyword()) :: {:ok, [String.t()]} | {:error, Error.t()}
  def reap_stale(opts \\ []) do
    schema =
      @conn_schema ++
        [
          stale_after: [type: :pos_integer, default: 15 * 60_000, doc: "heartbeat age in ms."],
          now: [type: {:custom, &datetime/1}, default: nil, doc: "the current time."]
        ]

    with {:ok, opts} <- validate(opts, schema, :shutdown),
         {:ok, kube, namespace} <- connect(opts, :shutdown) do
      try do
        reap(kube, namespace, opts[:now] || DateTime.utc_now(), opts[:stale_after])
      after
        Kube.close(kube)
      end
    end
  end

  defp datetime(nil), do: :ok
  defp datetime(%DateTime{}), do: :ok
  defp datetime(_), do: {:error, "a DateTime"}

  defp reap(kube, ns, now, stale_after) do
    case Kube.list(kube, :pods, ns, label_selector: %{Names.managed_by_label() => "condukt"}) do
      {:ok, pods} ->
        stale = Enum.filter(pods, &stale?(&1, now, stale_after))

        Options.map_ok(stale, fn pod ->
          name = pod["metadata"]["name"]
          hash = get_in(pod, ["metadata", "labels", Names.sandbox_label()])

          case delete_pod_and_labelled(kube, ns, name, hash) do
            :ok -> {:ok, name}
            error -> error
          end
        end)

      {:error, e} ->
        kube_error(e)
    end
  end

  defp stale?(pod, now, stale_after) do
    meta = pod["metadata"]

    meta["deletionTimestamp"] == nil and
      case last_beat(meta) do
        %DateTime{} = at -> DateTime.diff(now, at, :millisecond) > stale_after
        nil -> false
      end
  end

  # The newest heartbeat under either name (a pod made by an earlier
  # version carries the legacy one, and keeps it once a newer version
  # adopts it), else the creation time; nil when none can be read.
  defp last_beat(meta) do
    annotations = meta["annotations"] || %{}

    [Names.heartbeat_annotation(), Names.legacy_heartbeat_annotation()]
    |> Enum.map(&parse_time(annotations[&1]))
    |> Enum.reject(&is_nil/1)
    |> case do
      [] -> parse_time(meta["creationTimestamp"])
      beats -> Enum.max(beats, DateTime)
    end
  end

  defp parse_time(text) when is_binary(text) do
    case DateTime.from_iso8601(text) do
      {:ok, at, _} -> at
      _ -> nil
    end
  end

  defp parse_time(_), do: nil

  # The pod (by name) and the Secrets and NetworkPolicies of its session
  # (by the sandbox label).
  defp delete_objects(kube, ns, id),
    do: delete_pod_and_labelled(kube, ns, Names.pod_name(id), Names.hash(id))

  defp delete_pod_and_labelled(kube, ns, pod, hash) do
    with :ok <- wrap_ok(Kube.delete(kube, :pods, ns, pod, ignore_missing: true)) do
      if hash, do: delete_labelled_hash(kube, ns, hash), else: :ok
    end
  end

  defp delete_labelled(kube, ns, id), do: delete_labelled_hash(kube, ns, Names.hash(id))

  defp delete_labelled_hash(kube, ns, hash) do
    selector = %{Names.managed_by_label() => "condukt", Names.sandbox_label() => hash}

    Enum.reduce_while([:secrets, :networkpolicies], :ok, fn res, :ok ->
      case Kube.list(kube, res, ns, label_selector: selector) do
        {:ok, items} ->
          case Options.map_ok(items, &wrap_delete(kube, res, ns, &1)) do
            {:ok, _} -> {:cont, :ok}
            error -> {:halt, error}
          end

        # An identity without the network-policy grants never made any.
        {:error, %Kube.Error{reason: :forbidden}} ->
          {:cont, :ok}

        {:error, e} ->
          {:halt, kube_error(e)}
      end
    end)
  end

  defp wrap_delete(kube, res, ns, obj) do
    case Kube.delete(kube, res, ns, obj["metadata"]["name"], ignore_missing: true) do
      :ok -> {:ok, obj}
      {:error, e} -> kube_error(e)
    end
  end

  defp wrap_ok(:ok), do: :ok
  defp wrap_ok({:error, e}), do: kube_error(e)

  defp kube_error(%Kube.Error{} = e), do: {:error, %Error{reason: :backend, detail: e}}
  defp kube_error(other), do: {:error, %Error{reason: :backend, detail: other}}

  ## operations -----------------------------------------------------------------

  @impl true
  @spec read_file(t(), String.t()) :: {:ok, binary()} | {:error, Error.t()}
  def read_file(%__MODULE__{} = state, path), do: Ops.read_file(state, path)

  @impl true
  @spec write_file(t(), String.t(), binary()) :: :ok | {:error, Error.t()}
  def write_file(%__MODULE__{} = state, path, content), do: Ops.write_file(state, path, content)

  @impl true
  @spec edit_file(t(), String.t(), binary(), binary()) :: :ok | {:error, Error.t()}
  def edit_file(%__MODULE__{} = state, path, old_text, new_text), do: Ops.edit_file(state, path, old_text, new_text)

  @impl true
  @spec exec(t(), String.t(), keyword()) :: {:ok, Condukt.Sandbox.exec_result()} | {:error, Error.t()}
  def exec(%__MODULE__{} = state, command, opts) do
    with {:ok, opts} <- validate(opts, LocalSchema.exec(), :exec) do
      Ops.exec(state, command, opts, state.timeout, state.max_output_bytes)
    end
  end

  @impl true
  @spec glob(t(), String.t(), keyword()) :: {:ok, [String.t()]} | {:error, Error.t()}
  def glob(%__MODULE__{} = state, pattern, opts) do
    with {:ok, opts} <- validate(opts, LocalSchema.glob(), :glob), do: Ops.glob(state, pattern, opts)
  end

  @impl true
  @spec grep(t(), String.t(), keyword()) :: {:ok, [Condukt.Sandbox.grep_match()]} | {:error, Error.t()}
  def grep(%__MODULE__{} = state, pattern, opts) do
    with {:ok, opts} <- validate(opts, LocalSchema.grep(), :grep), do: Ops.grep(state, pattern, opts)
  end
end
