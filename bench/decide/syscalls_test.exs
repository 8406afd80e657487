defmodule Condukt.Bench.DecideSyscallsTest do
  # Counts the system calls of the port program and of the sidecar over N
  # decided requests (function decider, no cache), one at a time: strace -f
  # -c on each process while curl runs N requests to a decide rule. Not a
  # timing: counts, which the machine's load does not move.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Sandbox.NetworkPolicy.ControlBridge
  alias Condukt.Test.Netns.Sidecar

  @moduletag :port_program
  @moduletag timeout: 600_000
  @n String.to_integer(System.get_env("DECIDES", "100"))
  @out System.get_env("COUNT_OUT", "/tmp/decide-syscalls")

  setup_all do
    %{tb: Testbed.start()}
  end

  test "system calls per decide", %{tb: tb} do
    session = "e2e-#{tb.id}"
    owner = spawn(fn -> Process.sleep(:infinity) end)
    me = self()

    :telemetry.attach(
      {__MODULE__, session},
      [:condukt, :sandbox, :network_policy, :control_connected],
      fn _e, _m, meta, _ -> if meta[:session_id] == session, do: send(me, :connected) end,
      nil
    )

    policy = [rules: [decide: [call: fn _ctx, _req -> :allow end, cache: false, timeout: 5_000]], default: :deny]
    sc = Sidecar.start(tb, policy)

    {:ok, bridge} =
      ControlBridge.start(
        session_id: session,
        owner: owner,
        policy: policy,
        address: sc.control,
        token: sc.token,
        backoff: {50, 500}
      )

    assert_receive :connected, 10_000
    %{os_pid: port_pid} = ControlBridge.info(bridge)
    # Warm up: the first requests open the upstream pool, the TLS cache.
    for _ <- 1..5, do: assert(curl(tb, sc).status == 200)

    File.mkdir_p!(@out)

    tracers =
      for {name, pid} <- [port: port_pid, sidecar: sc.pid] do
        file = Path.join(@out, "#{name}.txt")

        args =
          case System.get_env("TRACER", "strace") do
            "strace" ->
              ["strace", "-f", "-c", "-o", file, "-p", "#{pid}"]

            # every read and write with its socket's addresses, for counts per socket
            "calls" ->
              ["strace", "-f", "-yy", "-e", "trace=read,write,writev", "-o", file, "-p", "#{pid}"]

            "perf" ->
              ["perf", "stat", "-e", "instructions:u,instructions:k,context-switches", "-o", file, "-p", "#{pid}"]
          end

        port =
          Port.open(
            {:spawn_executable, System.find_executable(hd(args))},
            [:binary, :exit_status, args: tl(args)]
          )

        {:os_pid, os} = Port.info(port, :os_pid)
        {name, port, os, file}
      end

    Process.sleep(1_000)
    for _ <- 1..@n, do: assert(curl(tb, sc).status == 200)
    Process.sleep(200)
    for {_name, _port, os, _file} <- tracers, do: System.cmd("kill", ["-INT", "#{os}"])
    for {_name, port, _os, _file} <- tracers, do: assert_receive({^port, {:exit_status, _}}, 10_000)

    if System.get_env("TRACER", "strace") != "calls" do
      for {name, _port, _os, file} <- tracers, do: IO.puts("== #{name} (#{@n} decides)\n" <> File.read!(file))
    end

    ControlBridge.stop(bridge)
    Sidecar.stop(sc)
  end

  defp curl(tb, sc) do
    Client.run(tb, :curl, "https://decide.test/?t=#{System.unique_integer([:positive])}",
      ca: sc.ca_cert,
      http: :h1,
      timeout: 30_000
    )
  end
end
