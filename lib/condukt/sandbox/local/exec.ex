defmodule Condukt.Sandbox.Local.Exec do
  @moduledoc false
  # Runs one shell command for Condukt.Sandbox.Local and guarantees that no
  # process it started outlives the call.
  #
  # The port runs a small bash wrapper (@wrapper) that starts the command as
  # a job in its own process group (`set -m`), so the command and everything
  # it forks can be killed together with `kill -KILL -- -PGID`. The wrapper
  # kills that group
  #
  #   * when the command exits (background jobs it left behind die with it:
  #     exec is stateless, and a stray child would also hold the output pipe
  #     open);
  #   * when a watchdog reading the port's stdin sees the line "kill" (our
  #     timeout) or end-of-file (the port closed: the process that owned it
  #     died, or the whole BEAM did).
  #
  # With a network policy, a prefix (`ip netns exec NS unshare … setpriv
  # … --`, see Condukt.Sandbox.Local.Network.prefix/1) goes in front of the
  # inner bash. Each program in it execs the next except unshare, which
  # forks the command into a new PID namespace and waits; the fork stays
  # in the job's process group, so the group kill still reaches it (and
  # everything left in the namespace dies with the command anyway).
  #
  # The wrapper's own stderr goes to /dev/null before `set -m`: with job
  # control on, bash reports a job that ends before `set +m` ("[1]+ Done
  # ...") on it, which would land in the command's output. The command's
  # stderr is its stdout (2>&1), so nothing of the command's is lost.
  #
  # The command's exit status is the wrapper's. The command itself reads
  # /dev/null, never the port. A process that leaves the group on purpose
  # (setsid, a double fork into a new group) escapes; Local is not an
  # isolation boundary, and the output wait below is bounded regardless.
  #
  # The port is owned by a helper process rather than the caller, so a
  # caller that traps exits never sees the port's EXIT message, and the
  # helper monitors the caller to kill the command if the caller dies.

  @wrapper ~S"""
  command=$1; bash=$2; restore=$3; shift 3
  exec 2>/dev/null
  set -m
  "$@" "$bash" -c "$restore" "$bash" "$command" </dev/null 2>&1 &
  cmd=$!
  set +m
  { while IFS= read -r line; do [ "$line" = kill ] && break; done; kill -KILL -- "-$cmd"; } <&0 &
  watchdog=$!
  wait "$cmd"
  status=$?
  kill -KILL -- "-$cmd"
  kill "$watchdog"
  exit "$status"
  """

  # The caller's environment variables that must not reach the programs
  # that run before the command has dropped its privileges: the wrapper's
  # bash (and, with a network policy, ip, unshare and setpriv), which run
  # as the BEAM, as root when the BEAM is. bash sources BASH_ENV (ENV in
  # POSIX mode) and imports functions (BASH_FUNC_name%%, which would
  # override the wrapper's `kill`); glibc's loader and libraries load code
  # and data named by LD_*, GCONV_PATH and the rest of the list glibc
  # itself ignores for setuid programs. A session can write the files these
  # name (its cwd is its own), so each travels renamed, @renamed NAME, and
  # @restore, the first thing the command's own shell runs (after the
  # drop), gives it back its name. Functions cannot be exported by name
  # from bash and are dropped.
  @renamed "CONDUKT_RENAMED_"
  @unsafe ~w(BASH_ENV ENV GCONV_PATH GETCONF_DIR GLIBC_TUNABLES HOSTALIASES LOCALDOMAIN LOCPATH
             NIS_PATH NLSPATH RESOLV_HOST_CONF RES_OPTIONS TMPDIR TZDIR)
  @unsafe_prefixes ["LD_", "MALLOC_"]
  @restore ~S"""
  for v in ${!CONDUKT_RENAMED_@}; do export "${v#CONDUKT_RENAMED_}=${!v}"; unset "$v"; done
  exec "$0" -c "$1"
  """

  # After the kill line, how long to wait for the wrapper's exit status. It
  # normally comes within milliseconds; it is late only when an escaped
  # process still holds the output pipe, and then we stop listening.
  @kill_grace_ms 2_000

  @type opts :: %{
          optional(:prefix) => [String.t()],
          required(:bash) => String.t(),
          required(:cwd) => String.t(),
          required(:env) => [{charlist(), charlist() | false}],
          required(:timeout) => pos_integer(),
          required(:max_output_bytes) => pos_integer()
        }

  @type result ::
          {:ok, %{output: binary(), exit_code: integer()}}
          | {:error, {:timeout, binary()}}
          | {:error, {:spawn_failed, term()}}

  @spec run(String.t(), opts()) :: result()
  def run(command, opts) do
    caller = self()
    ref = make_ref()
    {pid, monitor} = spawn_monitor(fn -> send(caller, {ref, own_port(caller, command, opts)}) end)

    receive do
      {^ref, result} ->
        Process.demonitor(monitor, [:flush])
        result

      {:DOWN, ^monitor, :process, ^pid, reason} ->
        {:error, {:spawn_failed, {:runner_crashed, reason}}}
    end
  end

  defp own_port(caller, command, opts) do
    caller_monitor = Process.monitor(caller)

    port_opts = [
      :binary,
      :exit_status,
      :use_stdio,
      :stderr_to_stdout,
      :hide,
      args: ["-c", @wrapper, "condukt-exec", command, opts.bash, @restore | Map.get(opts, :prefix, [])],
      cd: opts.cwd,
      env: Enum.flat_map(opts.env, &carry/1)
    ]

    case open(opts.bash, port_opts) do
      {:ok, port} ->
        deadline = System.monotonic_time(:millisecond) + opts.timeout
        out = %{acc: [], size: 0, dropped: 0, max: opts.max_output_bytes}
        port |> collect(caller_monitor, deadline, false, out) |> finish()

      {:error, reason} ->
        {:error, {:spawn_failed, reason}}
    end
  end

  # An unsafe variable set by the caller travels renamed (and its own name
  # is unset for the wrapper); unsetting one is always safe.
  defp carry({_name, false} = unset), do: [unset]

  defp carry({name, value} = pair) do
    s = List.to_string(name)

    cond do
      String.starts_with?(s, "BASH_FUNC_") -> [{name, false}]
      s in @unsafe or String.starts_with?(s, @unsafe_prefixes) -> [{name, false}, {~c"#{@renamed}#{s}", value}]
      true -> [pair]
    end
  end

  defp open(bash, port_opts) do
    {:ok, Port.open({:spawn_executable, bash}, port_opts)}
  rescue
    e in ErlangError -> {:error, e.original}
    e -> {:error, Exception.message(e)}
  end

  defp collect(port, caller_monitor, deadline, killed?, out) do
    wait = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {^port, {:data, data}} ->
        collect(port, caller_monitor, deadline, killed?, append(out, data))

      {^port, {:exit_status, status}} ->
        {if(killed?, do: :timeout, else: {:exited, status}), out}

      {:DOWN, ^caller_monitor, :process, _, _} ->
        # Closing the port is enough: the watchdog sees end-of-file.
        Port.close(port)
        exit(:normal)
    after
      wait ->
        if killed? do
          Port.close(port)
          {:timeout, out}
        else
          send_kill(port)
          collect(port, caller_monitor, System.monotonic_time(:millisecond) + @kill_grace_ms, true, out)
        end
    end
  end

  defp send_kill(port) do
    Port.command(port, "kill\n")
  rescue
    # The wrapper exited in the meantime; its exit status is on its way.
    ArgumentError -> :ok
  end

  defp append(%{size: size, max: max} = out, data) when size >= max,
    do: %{out | dropped: out.dropped + byte_size(data)}

  defp append(%{size: size, max: max} = out, data) do
    keep = min(byte_size(data), max - size)

    %{
      out
      | acc: [out.acc | binary_part(data, 0, keep)],
        size: size + keep,
        dropped: out.dropped + byte_size(data) - keep
    }
  end

  defp finish({{:exited, status}, out}), do: {:ok, %{output: output(out), exit_code: status}}
  defp finish({:timeout, out}), do: {:error, {:timeout, output(out)}}

  defp output(%{acc: acc, dropped: 0}), do: IO.iodata_to_binary(acc)

  defp output(%{acc: acc, dropped: dropped, max: max}) do
    IO.iodata_to_binary([
      acc,
      "\n[condukt: output truncated: kept the first #{max} bytes, dropped #{dropped} more]\n"
    ])
  end
end
