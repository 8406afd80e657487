defmodule Condukt.Sandbox.Virtual do
  @moduledoc """
  A sandbox with no host processes: an in-memory file system and a virtual
  bash interpreter ([bashkit](https://github.com/everruns/bashkit), Rust,
  loaded as a NIF).

      {:ok, sb} = Condukt.Sandbox.new(Condukt.Sandbox.Virtual)
      {:ok, %{output: "hi\\n", exit_code: 0}} = Condukt.Sandbox.exec(sb, "echo hi")

      # The host project, read-only, at /workspace:
      {:ok, sb} =
        Condukt.Sandbox.new(Condukt.Sandbox.Virtual,
          mounts: [{File.cwd!(), "/workspace", :readonly}]
        )

  Every file lives in the sandbox's own memory and disappears with it,
  except under a mount, where reads (and, for `:readwrite`, writes) reach
  the host directory. Commands are bashkit's builtins (`cat`, `grep`,
  `sed`, `awk`, `find`, `curl` …), interpreted in the BEAM's OS process:
  nothing is spawned.

  The NIF is built from `native/condukt_virtual` with `make virtual-nif`
  (`mix compile` does it when `cargo` is on the PATH). Without it,
  `init/1` returns `{:error, %Condukt.Sandbox.Error{reason: :not_available}}`
  whose message says how to build it; the rest of the library is unaffected.

  ## Init options

  #{Condukt.Options.docs(Condukt.Sandbox.Virtual.Schema.init())}

  ## Paths

  Paths are virtual: a relative path resolves against `:cwd`, `..` is
  resolved by name, and nothing outside the virtual tree (and its mounts)
  can be named. `write_file/3` creates missing parent directories.

  ## exec

  Each call gets a fresh interpreter over the sandbox's file system: files
  persist between calls, `cd`, `export` and shell variables do not (as with
  `Condukt.Sandbox.Local`). stdout and stderr are merged into `:output` in
  the order the commands wrote them; output is handed over after each
  command, so two streams written by one command come out stdout first.

  #{Condukt.Options.docs(Condukt.Sandbox.Virtual.Schema.exec())}

  A command that runs past its `:timeout`, or past `:max_commands`,
  `:max_loop_iterations` or `:max_total_loop_iterations`, ends with
  `{:error, %Condukt.Sandbox.Error{reason: :timeout}}` or
  `{:error, %Condukt.Sandbox.Error{reason: :limit_exceeded}}` (`:detail`
  holds the message and the output so far). The interpreter runs on a
  thread of its own, never on a BEAM scheduler, so a runaway script delays
  nobody else; it stops when the process that called `exec/3` dies. Output past `:max_output_bytes` is dropped and the kept part
  ends with `[condukt: output truncated: kept the first N bytes, dropped M more]`.

  ## glob and grep

  Same options and results as `Condukt.Sandbox.Local`'s, over the virtual
  file system.

  ## mount

  `mount/3` adds a read-write mount of a host directory at runtime
  (`:mounts` at `init/1` can also make them read-only).

  ## Network policy

  Without `:network_policy` a command has no network at all. With one,
  every HTTP(S) request a script makes (`curl`, `wget`, `http`, every hop of
  a `curl -L` redirect) is evaluated by the policy before a connection is opened: the
  same rules, host matching, decide runtime (timeouts, cache, decider
  failures) and `:telemetry` events as the egress sidecar
  (`Condukt.Sandbox.NetworkPolicy.Telemetry`). A refused request fails in
  the script (curl exits 7) with a message naming the rule or decider and
  the reason. Allowed requests may not reach loopback, private or
  link-local addresses unless an allow rule names the address or
  `allow_private_networks: true`. The policy is answered by a process
  linked to nothing but watching the process that called `new/2`: when that
  process ends, so does the policy, and later requests are refused.
  `docs/virtual.md` compares this with the other backends.
  """

  @behaviour Condukt.Sandbox

  import Condukt.Sandbox.Backend, only: [validate: 3, network_policy: 1, check_command: 1]

  alias Condukt.Options
  alias Condukt.Sandbox.{Backend, Error}
  alias Condukt.Sandbox.Virtual.{Native, Policy, Schema, Search}

  @enforce_keys [:fs, :cwd]
  defstruct [
    :fs,
    :cwd,
    :policy_pid,
    env: [],
    timeout: 120_000,
    max_output_bytes: 1_048_576,
    limits: %{},
    agent_mounts: []
  ]

  @typedoc "The state `init/1` returns; `Condukt.Sandbox` keeps it in its handle."
  @type t :: %__MODULE__{
          fs: reference(),
          cwd: String.t(),
          policy_pid: pid() | nil,
          env: [{String.t(), String.t()}],
          timeout: pos_integer(),
          max_output_bytes: pos_integer(),
          limits: map(),
          agent_mounts: [{String.t(), :readonly | :readwrite}]
        }

  # Time the BEAM side gives the interpreter past its own deadline before it
  # stops waiting (the interpreter ends itself at the deadline).
  @grace_ms 2_000

  @doc "Whether the NIF is loaded: `:ok`, or `{:error, message}` saying how to build it."
  @spec available() :: :ok | {:error, String.t()}
  def available, do: Native.available()

  # Credential injection needs a sidecar that holds the secrets apart from
  # the workspace; here the scripts' HTTP client and the secrets would share
  # one process, so a policy with credentials is refused rather than run
  # without them.
  defp no_credentials(%Condukt.Sandbox.NetworkPolicy{credentials: [_ | _]}) do
    {:error,
     %Error{
       reason: :invalid_network_policy,
       op: :new,
       detail: %Condukt.Sandbox.NetworkPolicy.Error{
         reason: :credentials_unsupported,
         key: :credentials,
         value: __MODULE__
       }
     }}
  end

  defp no_credentials(_policy), do: :ok

  @impl true
  @spec init(keyword()) :: {:ok, t()} | {:error, Error.t()}
  def init(opts) do
    with :ok <- check_available(),
         {:ok, opts} <- validate(opts, Schema.init(), :new),
         {:ok, policy} <- network_policy(opts[:network_policy]),
         :ok <- no_credentials(policy),
         {:ok, http} <- http_options(opts, policy),
         {:ok, pid, link} <- start_policy(policy, opts),
         {:ok, fs} <- native_new(opts, link, http, pid) do
      state = %__MODULE__{
        fs: fs,
        cwd: opts[:cwd],
        policy_pid: pid,
        env: normalize_env(opts[:env]),
        timeout: opts[:timeout],
        max_output_bytes: opts[:max_output_bytes],
        limits: Map.new(Keyword.take(opts, [:max_commands, :max_loop_iterations, :max_total_loop_iterations])),
        agent_mounts: opts[:agent_mounts]
      }

      with :ok <- mkdir(state, state.cwd, :new),
           :ok <- initial_mounts(state, opts[:mounts]) do
        {:ok, state}
      else
        error ->
          shutdown(state)
          error
      end
    end
  end

  defp check_available do
    case Native.available() do
      :ok -> :ok
      {:error, why} -> {:error, %Error{reason: :not_available, op: :new, detail: why}}
    end
  end

  defp http_options(opts, policy) do
    Options.map_ok(opts[:ca_files], fn path ->
      case File.read(path) do
        {:ok, pem} -> {:ok, pem}
        {:error, reason} -> {:error, %Error{reason: reason, op: :new, path: path, detail: "a :ca_files entry"}}
      end
    end)
    |> case do
      {:ok, pems} ->
        {:ok,
         %{
           ca_pems: pems,
           allow_private: opts[:allow_private_networks],
           resolve: Enum.to_list(opts[:resolve]),
           answer_timeout_ms: if(policy, do: Policy.answer_timeout(policy), else: 1)
         }}

      error ->
        error
    end
  end

  defp start_policy(nil, _opts), do: {:ok, nil, nil}

  defp start_policy(policy, opts) do
    session_id = if is_binary(opts[:id]), do: opts[:id], else: if(opts[:id], do: inspect(opts[:id]), else: "")

    case Policy.start(policy: policy, session_id: session_id, messages: opts[:messages]) do
      {:ok, pid, link} -> {:ok, pid, link}
      {:error, reason} -> {:error, %Error{reason: :backend, op: :new, detail: reason}}
    end
  end

  defp native_new(opts, link, http, policy_pid) do
    fs_opts = %{max_total_bytes: opts[:max_fs_bytes], max_file_bytes: opts[:max_file_bytes]}

    case Native.new(fs_opts, link, http) do
      {:ok, fs} ->
        {:ok, fs}

      {:error, why} ->
        if policy_pid, do: Policy.stop(policy_pid)
        {:error, %Error{reason: :invalid_option, op: :new, detail: "ca_files: #{why}"}}
    end
  end

  defp initial_mounts(state, mounts) do
    Enum.reduce_while(mounts, :ok, fn {host, at, mode}, :ok ->
      case do_mount(state, host, at, mode == :readonly, :new, nil) do
        :ok -> {:cont, :ok}
        error -> {:halt, error}
      end
    end)
  end

  @impl true
  @spec shutdown(t()) :: :ok
  def shutdown(%__MODULE__{policy_pid: nil}), do: :ok
  def shutdown(%__MODULE__{policy_pid: pid}), do: Policy.stop(pid)

  @impl true
  @spec read_file(t(), String.t()) :: {:ok, binary()} | {:error, Error.t()}
  def read_file(%__MODULE__{} = state, path) do
    with {:ok, abs} <- resolve(state, path, :read) do
      case Native.read_file(state.fs, abs) do
        {:ok, content} -> {:ok, content}
        {:error, error} -> fs_error(error, :read, path)
      end
    end
  end

  @impl true
  @spec write_file(t(), String.t(), binary()) :: :ok | {:error, Error.t()}
  def write_file(%__MODULE__{} = state, path, content) do
    with {:ok, abs} <- resolve(state, path, :write), do: write(state, abs, content, :write, path)
  end

  defp write(state, abs, content, op, path) do
    case Native.write_file(state.fs, abs, content) do
      :ok -> :ok
      {:error, error} -> fs_error(error, op, path)
    end
  end

  @impl true
  @spec edit_file(t(), String.t(), binary(), binary()) :: :ok | {:error, Error.t()}
  def edit_file(%__MODULE__{} = state, path, old_text, new_text) do
    with {:ok, abs} <- resolve(state, path, :edit),
         {:ok, content} <- read_for_edit(state, abs, path),
         {:ok, updated} <- Backend.replace_once(content, old_text, new_text, path) do
      write(state, abs, updated, :edit, path)
    end
  end

  defp read_for_edit(state, abs, path) do
    case Native.read_file(state.fs, abs) do
      {:ok, content} -> {:ok, content}
      {:error, error} -> fs_error(error, :edit, path)
    end
  end

  @impl true
  @spec exec(t(), String.t(), keyword()) :: {:ok, Condukt.Sandbox.exec_result()} | {:error, Error.t()}
  def exec(%__MODULE__{} = state, command, opts) do
    with {:ok, opts} <- validate(opts, Schema.exec(), :exec),
         :ok <- check_command(command),
         {:ok, dir} <- exec_dir(state, opts[:cwd]) do
      timeout = opts[:timeout] || state.timeout
      max_output = opts[:max_output_bytes] || state.max_output_bytes

      native_opts =
        Map.merge(state.limits, %{
          cwd: dir,
          env: Enum.reject(state.env ++ normalize_env(opts[:env]), fn {_, v} -> is_nil(v) end),
          timeout_ms: timeout,
          max_output_bytes: max_output
        })

      case run(state.fs, command, native_opts, timeout) do
        {:ok, outcome} -> outcome(outcome, timeout, max_output, opts[:cwd])
        :timeout -> timeout_error(timeout, "", opts[:cwd])
        {:error, reason} -> {:error, %Error{reason: :spawn_failed, op: :exec, path: opts[:cwd], detail: reason}}
      end
    end
  end

  # The NIF reports to a pid, so a result that comes after the caller gave
  # up would stay in the caller's mailbox forever. A short-lived process
  # receives it instead, and forwards it only while the caller waits. It
  # watches the caller: when the caller dies it exits, which releases the
  # command's handle, which stops the command.
  defp run(fs, command, native_opts, timeout) do
    caller = self()
    ref = make_ref()

    {pid, monitor} =
      spawn_monitor(fn ->
        caller_down = Process.monitor(caller)
        tag = make_ref()
        {:ok, handle} = Native.exec(fs, command, native_opts, self(), tag)
        relay(ref, caller, caller_down, tag, handle)
      end)

    receive do
      {^ref, outcome} ->
        Process.demonitor(monitor, [:flush])
        {:ok, outcome}

      {:DOWN, ^monitor, :process, _, reason} ->
        {:error, reason}
    after
      timeout + @grace_ms ->
        # The interpreter stops at its next command boundary; its last
        # output is still worth having if it comes quickly.
        send(pid, {ref, :cancel})

        receive do
          {^ref, outcome} ->
            Process.demonitor(monitor, [:flush])
            {:ok, outcome}
        after
          @grace_ms ->
            Process.exit(pid, :kill)
            Process.demonitor(monitor, [:flush])

            receive do
              {^ref, outcome} -> {:ok, outcome}
            after
              0 -> :timeout
            end
        end
    end
  end

  defp relay(ref, caller, caller_down, tag, handle) do
    receive do
      {^tag, outcome} ->
        send(caller, {ref, outcome})

      {^ref, :cancel} ->
        Native.cancel(handle)
        relay(ref, caller, caller_down, tag, handle)

      {:DOWN, ^caller_down, :process, _, _} ->
        Native.cancel(handle)
    end
  end

  defp outcome({:ok, output, exit_code, 0}, _timeout, _max, _cwd), do: {:ok, %{output: output, exit_code: exit_code}}

  defp outcome({:ok, output, exit_code, dropped}, _timeout, max, _cwd),
    do:
      {:ok,
       %{
         output: output <> "\n[condukt: output truncated: kept the first #{max} bytes, dropped #{dropped} more]\n",
         exit_code: exit_code
       }}

  defp outcome({:error, :limit_exceeded, message, output}, timeout, _max, cwd) do
    if String.contains?(message, "timeout"),
      do: timeout_error(timeout, output, cwd),
      else: {:error, %Error{reason: :limit_exceeded, op: :exec, path: cwd, detail: %{message: message, output: output}}}
  end

  defp outcome({:error, :cancelled, output}, timeout, _max, cwd), do: timeout_error(timeout, output, cwd)

  defp outcome({:error, :internal, message}, _timeout, _max, cwd),
    do: {:error, %Error{reason: :spawn_failed, op: :exec, path: cwd, detail: message}}

  defp timeout_error(timeout, output, cwd),
    do: {:error, %Error{reason: :timeout, op: :exec, path: cwd, detail: %{timeout: timeout, output: output}}}

  defp exec_dir(state, nil), do: {:ok, state.cwd}

  defp exec_dir(state, dir) do
    with {:ok, abs} <- resolve(state, dir, :exec) do
      case Native.stat(state.fs, abs) do
        {:ok, {:directory, _}} -> {:ok, abs}
        {:ok, _} -> {:error, %Error{reason: :enotdir, op: :exec, path: dir}}
        {:error, {reason, _}} -> {:error, %Error{reason: reason, op: :exec, path: dir}}
      end
    end
  end

  @impl true
  @spec glob(t(), String.t(), keyword()) :: {:ok, [String.t()]} | {:error, Error.t()}
  def glob(%__MODULE__{} = state, pattern, opts) do
    with {:ok, opts} <- validate(opts, Schema.glob(), :glob),
         {:ok, paths} <- Search.glob(state.fs, state.cwd, pattern, opts[:match_dot]) do
      {:ok, Enum.take(paths, opts[:max_results])}
    else
      {:error, %Error{}} = error -> error
      {:error, why} -> {:error, %Error{reason: :invalid_pattern, op: :glob, path: pattern, detail: why}}
    end
  end

  @impl true
  @spec grep(t(), String.t(), keyword()) :: {:ok, [Condukt.Sandbox.grep_match()]} | {:error, Error.t()}
  def grep(%__MODULE__{} = state, pattern, opts) do
    with {:ok, opts} <- validate(opts, Schema.grep(), :grep),
         {:ok, abs} <- resolve(state, opts[:path], :grep) do
      case Search.grep(state.fs, opts[:path], abs, pattern, Map.new(opts)) do
        {:ok, matches} ->
          {:ok, matches}

        {:error, {:invalid_pattern, why}} ->
          {:error, %Error{reason: :invalid_pattern, op: :grep, path: pattern, detail: why}}

        {:error, reason} ->
          {:error, %Error{reason: reason, op: :grep, path: opts[:path]}}
      end
    end
  end

  @impl true
  @spec mount(t(), String.t(), String.t()) :: :ok | {:error, Error.t()}
  def mount(%__MODULE__{} = state, host_path, sandbox_path) do
    with {:ok, abs} <- resolve(state, sandbox_path, :mount),
         do: do_mount(state, host_path, abs, false, :mount, nil)
  end

  @doc """
  Mounts a host directory on an agent's behalf (`Condukt.Sandbox.Virtual.Tools.Mount`):
  like `Condukt.Sandbox.mount/3`, but only inside the sandbox's
  `:agent_mounts` directories (symbolic links resolved), and read-write
  only inside a `:readwrite` one. With no `:agent_mounts`, every request is
  refused.
  """
  @spec agent_mount(Condukt.Sandbox.t(), String.t(), String.t(), :readonly | :readwrite) :: :ok | {:error, Error.t()}
  def agent_mount(%Condukt.Sandbox{module: __MODULE__, state: state}, host_path, sandbox_path, mode)
      when mode in [:readonly, :readwrite] do
    within = Enum.map(state.agent_mounts, fn {root, root_mode} -> {Path.expand(root), root_mode == :readwrite} end)

    with {:ok, abs} <- resolve(state, sandbox_path, :mount),
         do: do_mount(state, host_path, abs, mode == :readonly, :mount, within)
  end

  defp do_mount(state, host, at, readonly?, op, within) do
    with :ok <- mkdir(state, at, op) do
      case Native.mount(state.fs, Path.expand(host), at, readonly?, within) do
        {:ok, _} -> :ok
        {:error, why} -> {:error, %Error{reason: :mount_failed, op: op, path: at, detail: why}}
      end
    end
  end

  defp mkdir(state, abs, op) do
    case Native.mkdir_p(state.fs, abs) do
      :ok -> :ok
      {:error, error} -> fs_error(error, op, abs)
    end
  end

  ## Helpers

  # A virtual absolute path: joined to cwd and normalised by name ("." and
  # ".." resolved, "/.." stays "/"). No "~", no host path.
  @doc false
  @spec resolve(t(), String.t(), Error.op()) :: {:ok, String.t()} | {:error, Error.t()}
  def resolve(state, path, op) do
    if String.contains?(path, <<0>>) do
      {:error, %Error{reason: :invalid_path, op: op, path: path}}
    else
      joined = if String.starts_with?(path, "/"), do: path, else: state.cwd <> "/" <> path
      {:ok, normalize(joined)}
    end
  end

  @doc false
  @spec normalize(String.t()) :: String.t()
  def normalize(path) do
    path
    |> String.split("/", trim: true)
    |> Enum.reduce([], fn
      ".", acc -> acc
      "..", [] -> []
      "..", [_ | acc] -> acc
      name, acc -> [name | acc]
    end)
    |> Enum.reverse()
    |> then(&("/" <> Enum.join(&1, "/")))
  end

  defp fs_error({reason, _message}, op, path), do: {:error, %Error{reason: reason, op: op, path: path}}

  defp normalize_env(env), do: Enum.map(env, fn {k, v} -> {to_string(k), v} end)
end
