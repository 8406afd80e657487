defmodule Condukt.Sandbox.Local do
  @moduledoc """
  The default sandbox: the host filesystem and real `bash` processes.

      {:ok, sb} = Condukt.Sandbox.new({Condukt.Sandbox.Local, cwd: "/path/to/project"})
      {:ok, %{output: "hi\\n", exit_code: 0}} = Condukt.Sandbox.exec(sb, "echo hi")

  Local is a convenience for development, not an isolation boundary: paths
  are not confined to `:cwd` (`..` and absolute paths reach the whole
  filesystem the BEAM can reach), and commands run as the BEAM's user
  (with an enforced network policy: as an unprivileged uid, see "Network
  policy").

  ## Init options

  #{Condukt.Options.docs(Condukt.Sandbox.Local.Schema.init())}

  Unknown options are refused with a "did you mean …?" hint.

  ## Paths

  A relative path resolves against `:cwd`; an absolute path is used as is.
  Paths are never handed to a shell, so spaces, quotes, `$(…)`, newlines and
  leading dashes are plain characters. There is no `~` expansion.

  `write_file/3` creates missing parent directories. It and `edit_file/4`
  replace the file atomically: the new content goes to a temporary file in the same directory
  which is then renamed over the target, so a reader never sees half a file.
  The target keeps its permission bits; when the path is a symbolic link,
  the file it points to is replaced and the link is kept.

  ## exec

  Each call runs `bash -c COMMAND` in a fresh process: `cd`, `export` and
  shell variables do not carry over. stdout and stderr are merged, in the
  order they were written, into the one `:output`; stdin is `/dev/null`.

  #{Condukt.Options.docs(Condukt.Sandbox.Local.Schema.exec())}

  The command runs in its own process group. When it exits, any background
  process it left in that group is killed, so nothing outlives the call. On
  timeout the whole group is killed with `SIGKILL` and `exec/3` returns
  `{:error, %Condukt.Sandbox.Error{reason: :timeout}}`, whose `:detail`
  holds the output so far. If the calling process dies, the command is
  killed as well. A process that deliberately leaves the group (`setsid`)
  escapes this cleanup, except in a session with an enforced network
  policy, where each command has a PID namespace of its own and nothing
  outlives it.

  Output past `:max_output_bytes` is dropped and the kept part ends with a
  line `[condukt: output truncated: kept the first N bytes, dropped M more]`.

  ## glob

  `glob/3` has `Path.wildcard/2` semantics (`*`, `?`, `**`, `{a,b}`,
  `[a-z]`) relative to `:cwd`; results are sorted and relative when the
  pattern is. No shell is involved.

  #{Condukt.Options.docs(Condukt.Sandbox.Local.Schema.glob())}

  ## grep

  `grep/3` searches in Elixir (no `grep` or `rg` process): the pattern is a
  regular expression (`Regex`, PCRE syntax, matched byte-wise) unless
  `literal: true`. It returns `%{path: path, line_number: n, line: text}`
  maps, in path order, with lines longer than 1000 bytes cut short. Files
  that look binary (a NUL byte in their first 8 KiB) or are larger than
  16 MiB are skipped, as are unreadable files; symbolic links to directories
  are not followed.

  #{Condukt.Options.docs(Condukt.Sandbox.Local.Schema.grep())}

  ## mount

  Local does not implement the optional `mount/3` callback: the host
  filesystem is already all there. `Condukt.Sandbox.mount/3` returns
  `{:error, :not_supported}` and `Condukt.Sandbox.supports?(sb, :mount)` is
  `false`.

  ## Network policy

  The `:network_policy` option is validated with
  `Condukt.Sandbox.NetworkPolicy.new/1`, so a bad policy fails `init/1`
  here just as it would on Kubernetes.

  Upstream Condukt's Local ignores the policy; this Local enforces it where it
  can. On Linux, when the BEAM runs as root (CAP_NET_ADMIN, CAP_SYS_ADMIN,
  CAP_SETUID, CAP_SETGID, CAP_CHOWN) and `ip`, `setpriv` and `iptables`
  are installed, owned by root and writable by nobody else, `init/1` puts the
  session in a network namespace of its own with the real egress sidecar
  (`Condukt.Sandbox.Local.Network`, docs/local-network.md): every `exec/3`
  runs inside it as an unprivileged uid without any capability (below), its TCP 80/443 goes through the
  policy, everything else is rejected, and the clients trust the session
  CA through the six usual CA variables. A
  `Condukt.Sandbox.NetworkPolicy.ControlBridge` attaches to the sidecar's
  control channel: decide rules run here, on the BEAM, and every request's
  events become `:telemetry` events (`Condukt.Sandbox.NetworkPolicy.Telemetry`).
  `shutdown/1` removes it all.
  File operations are not network operations and stay on the host.

  An enforced session's commands never run as root, even when the BEAM
  does: a command running as uid 0, even without any capability, owns
  every root-owned file on the host (the programs the BEAM runs as root,
  the session's audit log, its hosts file). They run as `nobody` (65534),
  or as the uid in `network: [user: uid]`. For the commands to work in
  `:cwd`, give the directory to that uid (`init/1` logs a warning when it
  cannot write it). `user:` 0, the sidecar's uid (it can read the control
  token) and the BEAM's uid are refused with
  `:network_policy_unenforceable`. A real user's uid works, but that
  user's own processes outside the namespace (a tmux server, a systemd
  user manager) and dotfiles are then the session's too: prefer a uid of
  its own. docs/local-network.md has the threat model.

  Where that is impossible, `init/1` logs one warning and the commands run
  unenforced (as upstream Condukt's Local does), unless `network_policy_required:
  true`, which makes `init/1` fail with
  `%Condukt.Sandbox.Error{reason: :network_policy_unenforceable}` whose
  `:detail` is the `Condukt.Sandbox.Local.NetworkError` that says why.
  """

  @behaviour Condukt.Sandbox

  import Condukt.Sandbox.Backend,
    only: [credential_values: 1, rotate_in_sidecar: 3, validate: 3, network_policy: 1, check_command: 1]

  require Logger

  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Local.{Exec, Network, NetworkError, Schema, Search}
  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge

  @enforce_keys [:cwd]
  defstruct [
    :cwd,
    :bash,
    :id,
    :network_policy,
    :network,
    :network_pid,
    :bridge,
    env: [],
    timeout: 120_000,
    max_output_bytes: 1_048_576
  ]

  @typedoc "The state `init/1` returns; `Condukt.Sandbox` keeps it in its handle."
  @type t :: %__MODULE__{
          cwd: String.t(),
          bash: String.t() | nil,
          id: term(),
          network_policy: NetworkPolicy.t() | nil,
          network: Network.t() | nil,
          network_pid: pid() | nil,
          bridge: pid() | nil,
          env: [{String.t(), String.t() | nil}],
          timeout: pos_integer(),
          max_output_bytes: pos_integer()
        }

  @impl true
  @spec init(keyword()) :: {:ok, t()} | {:error, Error.t()}
  def init(opts) do
    with {:ok, opts} <- validate(opts, Schema.init(), :new),
         {:ok, cwd} <- init_cwd(opts[:cwd]),
         {:ok, policy} <- network_policy(opts[:network_policy]) do
      state = %__MODULE__{
        cwd: cwd,
        bash: System.find_executable("bash"),
        id: opts[:id],
        network_policy: policy,
        env: normalize_env(opts[:env]),
        timeout: opts[:timeout],
        max_output_bytes: opts[:max_output_bytes]
      }

      enforce(state, opts)
    end
  end

  defp enforce(%{network_policy: nil} = state, _opts), do: {:ok, state}

  defp enforce(state, opts) do
    required? = opts[:network_policy_required]

    net_opts = Keyword.merge(opts[:network], policy: state.network_policy, session_id: session_id(state.id))

    with {:ok, values} <- credential_values(state.network_policy),
         net_opts = if(values == %{}, do: net_opts, else: Keyword.put(net_opts, :credentials, fn -> values end)),
         :ok <- Network.available?(net_opts),
         {:ok, pid, net} <- Network.start(net_opts),
         {:ok, bridge} <- start_bridge(state, net, pid, opts) do
      warn_unwritable(state.cwd, net.user)
      # The outer shell of every exec runs as the BEAM: the bash the
      # network checked to be root's alone, not whatever the PATH finds.
      {:ok, %{state | network: net, network_pid: pid, bridge: bridge, bash: net.tools["bash"]}}
    else
      {:error, %NetworkError{reason: reason} = error}
      when reason in [:unsupported_os, :not_privileged, :missing_tool] and not required? ->
        Logger.warning(
          "condukt: Local sandbox: the network policy is NOT enforced: #{Exception.message(error)}. " <>
            "Pass network_policy_required: true to refuse to run unenforced."
        )

        {:ok, state}

      {:error, %NetworkError{} = error} ->
        {:error, %Error{reason: :network_policy_unenforceable, op: :new, detail: error}}

      {:error, %Error{}} = error ->
        error
    end
  end

  @doc """
  `Condukt.Sandbox.NetworkPolicy.rotate_credential/3` for an enforced
  session: replaces the value in the sidecar's file, then sends it over
  the control channel.
  """
  @spec rotate_credential(t(), String.t(), String.t()) :: :ok | {:error, Condukt.Sandbox.NetworkPolicy.Error.t()}
  def rotate_credential(%__MODULE__{} = state, name, value) do
    with :ok <- Condukt.Sandbox.NetworkPolicy.check_rotation(state.network_policy, name),
         :ok <- Network.rotate_credential(state.network, name, value) do
      rotate_in_sidecar(state.bridge, name, value)
    end
  end

  # The control channel is always on when a policy is set:
  # telemetry is the product, and decide rules are answered here.
  defp start_bridge(state, net, net_pid, opts) do
    bridge_opts = [
      session_id: net.session_id,
      owner: self(),
      policy: state.network_policy,
      address: net.control,
      token: net.token,
      messages: opts[:messages]
    ]

    case ControlBridge.start(bridge_opts) do
      {:ok, bridge} ->
        {:ok, bridge}

      {:error, reason} ->
        Network.stop(net_pid)
        {:error, %NetworkError{reason: :sidecar_failed, detail: "the control bridge did not start: #{inspect(reason)}"}}
    end
  end

  # Commands of an enforced session never run as root (by default as
  # nobody): say so once when that leaves them a cwd they cannot write.
  defp warn_unwritable(cwd, uid) do
    case File.stat(cwd) do
      {:ok, %File.Stat{uid: ^uid}} ->
        :ok

      {:ok, %File.Stat{uid: owner, mode: mode}} when Bitwise.band(mode, 0o002) == 0 ->
        Logger.warning(
          "condukt: Local sandbox: commands run as uid #{uid}, which cannot write the cwd #{cwd} " <>
            "(owned by uid #{owner}). Give the directory to uid #{uid}, or pass network: [user: uid] " <>
            "with an unprivileged uid that owns it (docs/local-network.md)."
        )

      _ ->
        :ok
    end
  end

  defp session_id(nil), do: ""
  defp session_id(id) when is_binary(id), do: id
  defp session_id(id), do: inspect(id)

  defp init_cwd(nil), do: {:ok, File.cwd!()}

  defp init_cwd(cwd) do
    dir = Path.expand(cwd)

    case dir_status(dir) do
      :ok -> {:ok, dir}
      {:error, reason} -> {:error, %Error{reason: reason, op: :new, path: cwd}}
    end
  end

  @impl true
  @spec shutdown(t()) :: :ok
  def shutdown(%__MODULE__{network_pid: nil}), do: :ok

  def shutdown(%__MODULE__{network_pid: pid, bridge: bridge}) do
    ControlBridge.stop(bridge)
    Network.stop(pid)
  end

  @impl true
  @spec read_file(t(), String.t()) :: {:ok, binary()} | {:error, Error.t()}
  def read_file(%__MODULE__{} = state, path) do
    case File.read(resolve(state, path)) do
      {:ok, content} -> {:ok, content}
      {:error, reason} -> file_error(reason, :read, path)
    end
  end

  @impl true
  @spec write_file(t(), String.t(), binary()) :: :ok | {:error, Error.t()}
  def write_file(%__MODULE__{} = state, path, content) do
    target = final_target(resolve(state, path))

    with :ok <- File.mkdir_p(Path.dirname(target)),
         :ok <- atomic_write(target, content) do
      :ok
    else
      {:error, reason} -> file_error(reason, :write, path)
    end
  end

  @impl true
  @spec edit_file(t(), String.t(), binary(), binary()) :: :ok | {:error, Error.t()}
  def edit_file(%__MODULE__{} = state, path, old_text, new_text) do
    target = final_target(resolve(state, path))

    with {:ok, content} <- File.read(target),
         {:ok, updated} <- Condukt.Sandbox.Edit.replace_once(content, old_text, new_text),
         :ok <- atomic_write(target, updated) do
      :ok
    else
      {:error, reason} when reason in [:empty_old_text, :old_text_not_found] ->
        {:error, %Error{reason: reason, op: :edit, path: path}}

      {:error, {:old_text_not_unique, count}} ->
        {:error, %Error{reason: :old_text_not_unique, op: :edit, path: path, detail: count}}

      {:error, reason} ->
        file_error(reason, :edit, path)
    end
  end

  @impl true
  @spec exec(t(), String.t(), keyword()) ::
          {:ok, Condukt.Sandbox.exec_result()} | {:error, Error.t()}
  def exec(%__MODULE__{} = state, command, opts) do
    with {:ok, opts} <- validate(opts, Schema.exec(), :exec),
         :ok <- check_command(command),
         {:ok, dir} <- exec_dir(state, opts[:cwd]),
         {:ok, bash} <- bash(state) do
      run_opts = %{
        bash: bash,
        cwd: dir,
        env: port_env(network_env(state, state.env ++ normalize_env(opts[:env]))),
        timeout: opts[:timeout] || state.timeout,
        max_output_bytes: opts[:max_output_bytes] || state.max_output_bytes,
        prefix: network_prefix(state)
      }

      case Exec.run(command, run_opts) do
        {:ok, result} ->
          {:ok, result}

        {:error, {:timeout, output}} ->
          {:error,
           %Error{reason: :timeout, op: :exec, path: opts[:cwd], detail: %{timeout: run_opts.timeout, output: output}}}

        {:error, {:spawn_failed, why}} ->
          {:error, %Error{reason: :spawn_failed, op: :exec, path: opts[:cwd], detail: why}}
      end
    end
  end

  defp network_prefix(%{network: nil}), do: []
  defp network_prefix(%{network: net}), do: Network.prefix(net)

  defp network_env(%{network: nil}, env), do: env
  defp network_env(%{network: net}, env), do: Network.env(net, env)

  defp exec_dir(state, nil), do: {:ok, state.cwd}

  defp exec_dir(state, dir) do
    resolved = resolve(state, dir)

    case dir_status(resolved) do
      :ok -> {:ok, resolved}
      {:error, reason} -> {:error, %Error{reason: reason, op: :exec, path: dir}}
    end
  end

  defp bash(%{bash: nil}),
    do: {:error, %Error{reason: :spawn_failed, op: :exec, detail: "bash was not found on the PATH"}}

  defp bash(%{bash: bash}), do: {:ok, bash}

  @impl true
  @spec glob(t(), String.t(), keyword()) :: {:ok, [String.t()]} | {:error, Error.t()}
  def glob(%__MODULE__{} = state, pattern, opts) do
    with {:ok, opts} <- validate(opts, Schema.glob(), :glob) do
      case Search.glob(state.cwd, pattern, opts[:match_dot]) do
        {:ok, paths} -> {:ok, Enum.take(paths, opts[:max_results])}
        {:error, why} -> {:error, %Error{reason: :invalid_pattern, op: :glob, path: pattern, detail: why}}
      end
    end
  end

  @impl true
  @spec grep(t(), String.t(), keyword()) :: {:ok, [Condukt.Sandbox.grep_match()]} | {:error, Error.t()}
  def grep(%__MODULE__{} = state, pattern, opts) do
    with {:ok, opts} <- validate(opts, Schema.grep(), :grep) do
      root = opts[:path]

      case Search.grep(root, resolve(state, root), pattern, Map.new(opts)) do
        {:ok, matches} ->
          {:ok, matches}

        {:error, {:invalid_pattern, why}} ->
          {:error, %Error{reason: :invalid_pattern, op: :grep, path: pattern, detail: why}}

        {:error, reason} ->
          file_error(reason, :grep, root)
      end
    end
  end

  ## Helpers

  defp resolve(%{cwd: cwd}, path) do
    case Path.type(path) do
      :absolute -> path
      _ -> Path.join(cwd, path)
    end
  end

  defp dir_status(dir) do
    case File.stat(dir) do
      {:ok, %File.Stat{type: :directory}} -> :ok
      {:ok, _} -> {:error, :enotdir}
      {:error, reason} -> {:error, reason}
    end
  end

  defp file_error(:badarg, op, path), do: {:error, %Error{reason: :invalid_path, op: op, path: path}}
  defp file_error(reason, op, path), do: {:error, %Error{reason: reason, op: op, path: path}}

  # Follows a chain of symbolic links to the file it ends at, so that a write
  # replaces that file and keeps the links. 40 is Linux's own limit (ELOOP).
  defp final_target(path, hops \\ 40)
  defp final_target(path, 0), do: path

  defp final_target(path, hops) do
    case File.read_link(path) do
      {:ok, link} -> final_target(Path.expand(link, Path.dirname(path)), hops - 1)
      {:error, _not_a_link} -> path
    end
  end

  defp atomic_write(target, content) do
    tmp = Path.join(Path.dirname(target), ".condukt-#{System.unique_integer([:positive])}.tmp")

    result =
      with :ok <- File.write(tmp, content, [:exclusive]),
           :ok <- keep_mode(target, tmp) do
        File.rename(tmp, target)
      end

    if result != :ok, do: File.rm(tmp)
    result
  end

  defp keep_mode(target, tmp) do
    case File.stat(target) do
      {:ok, %File.Stat{type: :regular, mode: mode}} -> File.chmod(tmp, Bitwise.band(mode, 0o7777))
      _ -> :ok
    end
  end

  defp normalize_env(env), do: Enum.map(env, fn {k, v} -> {k, v} end)

  # Later entries win, so the command's :env overrides the sandbox's.
  defp port_env(env) do
    env
    |> Enum.reverse()
    |> Enum.uniq_by(&elem(&1, 0))
    |> Enum.map(fn
      {k, nil} -> {String.to_charlist(k), false}
      {k, v} -> {String.to_charlist(k), String.to_charlist(v)}
    end)
  end
end
