defmodule Condukt.Dev.Netns.Cmd do
  @moduledoc false
  # Runs external programs for the end-to-end tier, always under a deadline.
  #
  # `run/2` wraps the command in coreutils `timeout`, which signals the
  # command's whole process group (TERM, then KILL two seconds later), so a
  # hung client or a child it forked cannot outlive the deadline. The BEAM
  # side keeps a second, later deadline of its own and kills the wrapper by
  # OS pid if even `timeout` does not come back. Standard input is
  # /dev/null unless a file is given: a client that reads stdin (openssl
  # s_client) must never wait on the port's pipe.
  #
  # `spawn_daemon/3` starts a long-lived server detached from the BEAM (its
  # own session, output to a log file) and returns its pid; servers are
  # stopped by pid, and the testbed also kills whatever still runs inside
  # its namespaces when it stops.

  @default_timeout 30_000
  # Output kept from one command; clients write bodies to files, so only a
  # runaway command reaches this.
  @max_output 8 * 1024 * 1024

  @type result :: {binary(), non_neg_integer()}

  @doc """
  Runs `argv` and returns `{output, exit_status}`; exit status 124 means the
  deadline passed and the command was killed.

  Options: `:timeout` (ms, default #{@default_timeout}), `:env` (list of
  `{name, value}`, value `nil` unsets), `:cd`, `:stdin` (a file path,
  default /dev/null), `:stderr` (`:stdout` (default), `:discard` or a file
  path).
  """
  @spec run([String.t()], keyword()) :: result()
  def run([_ | _] = argv, opts \\ []) do
    timeout = Keyword.get(opts, :timeout, @default_timeout)
    stdin = Keyword.get(opts, :stdin, "/dev/null")

    err =
      case Keyword.get(opts, :stderr, :stdout) do
        :stdout -> "&1"
        :discard -> "/dev/null"
        path when is_binary(path) -> path
      end

    # `timeout` runs the command in its own process group and signals the
    # group. The redirections are done by sh, which then execs the command.
    script =
      ~S(in=$1; err=$2; shift 2; if [ "$err" = "&1" ]; then exec "$@" <"$in" 2>&1; else exec "$@" <"$in" 2>"$err"; fi)

    args = ["--kill-after=2", "#{timeout / 1000}s", "/bin/sh", "-c", script, "sh", stdin, err] ++ argv

    port_opts =
      [:binary, :exit_status, :use_stdio, :stderr_to_stdout, args: args, env: port_env(Keyword.get(opts, :env, []))] ++
        if(cd = opts[:cd], do: [cd: cd], else: [])

    port = Port.open({:spawn_executable, timeout_exe()}, port_opts)
    # nil when the command already exited (its port closed) on a busy machine.
    os_pid =
      case Port.info(port, :os_pid) do
        {:os_pid, pid} -> pid
        nil -> nil
      end

    collect(port, os_pid, [], 0, System.monotonic_time(:millisecond) + timeout + 5_000)
  end

  @doc "Like `run/2`, but raises unless the command exits 0; returns the output."
  @spec run!([String.t()], keyword()) :: binary()
  def run!(argv, opts \\ []) do
    case run(argv, opts) do
      {out, 0} -> out
      {out, status} -> raise "command failed (exit #{status}): #{Enum.join(argv, " ")}\n#{out}"
    end
  end

  @doc """
  Starts `argv` detached (new session, stdin /dev/null, stdout and stderr
  appended to `log`) and returns its OS pid. `argv` may start with a
  namespace prefix (`ip netns exec NS`), which execs, so the pid returned is
  the server's own.
  """
  @spec spawn_daemon([String.t()], Path.t(), keyword()) :: pos_integer()
  def spawn_daemon([_ | _] = argv, log, opts \\ []) do
    script = ~S(log=$1; shift; setsid "$@" </dev/null >>"$log" 2>&1 & echo $!)
    out = run!(["/bin/sh", "-c", script, "sh", log | argv], Keyword.put_new(opts, :timeout, 10_000))
    out |> String.trim() |> String.to_integer()
  end

  @doc "True while `pid` names a live process that is not a zombie."
  @spec alive?(pos_integer()) :: boolean()
  def alive?(pid) do
    case File.read("/proc/#{pid}/stat") do
      # The state letter follows the parenthesised command name.
      {:ok, stat} -> not (stat |> String.split(") ") |> List.last() |> String.starts_with?("Z"))
      {:error, _} -> false
    end
  end

  @doc """
  Sends TERM to `pids`, waits up to `grace` ms for them to go, then KILLs
  the rest. Pids that are already gone are ignored.
  """
  @spec kill([pos_integer()], non_neg_integer()) :: :ok
  def kill(pids, grace \\ 2_000) do
    pids = Enum.filter(pids, &alive?/1)
    signal(pids, "TERM")

    case poll(fn -> Enum.all?(pids, &(not alive?(&1))) end, grace, 20) do
      :ok -> :ok
      {:error, :timeout} -> signal(Enum.filter(pids, &alive?/1), "KILL")
    end

    :ok
  end

  @doc """
  Calls `fun` every `interval` ms until it returns a truthy value or
  `timeout` ms pass. Returns `:ok` or `{:error, :timeout}`.
  """
  @spec poll((() -> any()), non_neg_integer(), pos_integer()) :: :ok | {:error, :timeout}
  def poll(fun, timeout, interval \\ 25) do
    do_poll(fun, System.monotonic_time(:millisecond) + timeout, interval)
  end

  defp do_poll(fun, deadline, interval) do
    cond do
      fun.() ->
        :ok

      System.monotonic_time(:millisecond) >= deadline ->
        {:error, :timeout}

      true ->
        Process.sleep(interval)
        do_poll(fun, deadline, interval)
    end
  end

  defp signal([], _sig), do: :ok

  defp signal(pids, sig) do
    System.cmd("kill", ["-#{sig}" | Enum.map(pids, &Integer.to_string/1)], stderr_to_stdout: true)
    :ok
  end

  defp collect(port, os_pid, acc, size, deadline) do
    wait = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {^port, {:data, data}} when size < @max_output ->
        collect(port, os_pid, [acc | data], size + byte_size(data), deadline)

      {^port, {:data, _}} ->
        collect(port, os_pid, acc, size, deadline)

      {^port, {:exit_status, status}} ->
        {IO.iodata_to_binary(acc), status}
    after
      wait ->
        # `timeout` itself did not come back: kill it and report a timeout.
        if os_pid, do: System.cmd("kill", ["-KILL", Integer.to_string(os_pid)], stderr_to_stdout: true)
        Port.close(port)
        {IO.iodata_to_binary(acc), 124}
    end
  end

  defp port_env(env) do
    Enum.map(env, fn
      {k, nil} -> {to_charlist(k), false}
      {k, v} -> {to_charlist(k), to_charlist(v)}
    end)
  end

  defp timeout_exe, do: System.find_executable("timeout") || raise("coreutils `timeout` not found")
end
