# What the added latency at one request in flight is made of: the
# sidecar's work, or the wake-ups of idle CPUs between its steps.
#
#   make bench-wakeups [WAKEUPS_ARGS="--rounds N --seconds S --out DIR"]
#
# With one request in flight every step of an exchange (client -> sidecar
# -> origin -> sidecar -> client) finds the next process asleep; where that
# process sleeps on another CPU, the CPU itself may be idle (halted: in a
# VM, a vCPU that gives its physical CPU back), and waking it is paid on
# every step. This script measures the latency client (bench/clients/latency.py,
# as `make bench` does) direct and through the sidecar under three
# settings, alternating them in rounds:
#
#   split   the benchmark's pinning: sidecar on CPU 0, client and nginx on CPU 1
#   awake   the same, with a busy loop at nice 19 on each CPU, so no CPU
#           halts between requests (the loop yields at once to any woken task)
#   shared  the sidecar re-pinned to CPU 1, with the client and nginx: no
#           wake-up crosses CPUs
#
# and writes a table of p50 and p99 per setting, the added latency
# (sidecar minus direct under the same setting) and the sidecar's CPU time
# per request (from /proc/PID/stat over the run) to OUT/wakeups.md.

for file <- ~w(interceptor measure setup) do
  Code.require_file(Path.join([__DIR__, "lib", file <> ".ex"]))
end

alias Condukt.Dev.Netns.{Cmd, Testbed, Tier}

{opts, _} = OptionParser.parse!(System.argv(), strict: [rounds: :integer, seconds: :integer, out: :string])
rounds = Keyword.get(opts, :rounds, 3)
secs = Keyword.get(opts, :seconds, 5)
out = Keyword.get(opts, :out, Path.join(__DIR__, "results"))

case Tier.check() do
  :ok ->
    :ok

  {:error, reason} ->
    IO.puts(:stderr, "needs what the end-to-end tier needs: #{reason}")
    System.halt(1)
end

log = fn msg -> IO.puts("[#{Time.utc_now() |> Time.truncate(:second)}] #{msg}") end

# A busy loop per CPU at the lowest priority, for the "awake" setting,
# bounded by `timeout` so that it cannot outlive an interrupted run.
spin = fn ->
  for cpu <- [Bench.Os.proxy_cpu(), Bench.Os.load_cpu()] do
    Bench.Os.spawn(
      ["/usr/bin/timeout", "#{secs + 60}", "/usr/bin/taskset", "-c", cpu, "/usr/bin/nice", "-n", "19"] ++
        ["/bin/sh", "-c", "while :; do :; done"],
      "/dev/null",
      "/dev/null"
    )
  end
end

cpu_ticks = fn pid ->
  case File.read("/proc/#{pid}/stat") do
    {:ok, stat} ->
      # the fields after the command name (which may hold spaces)
      [_, rest] = String.split(stat, ") ", parts: 2)
      rest |> String.split(" ") |> Enum.slice(11, 2) |> Enum.map(&String.to_integer/1) |> Enum.sum()

    _ ->
      0
  end
end

# Each loop is its own session (Bench.Os.spawn: setsid): the group goes.
unspin = fn pids -> for pid <- pids, do: Cmd.run(["/bin/kill", "-KILL", "--", "-#{pid}"], stderr: :discard) end

tb = Testbed.start(on_exit: false)

rows =
  try do
    Bench.Setup.prepare!(tb)
    url = "https://allowed.test/1k.bin"

    for round <- 1..rounds, setting <- ~w(split awake shared), kind <- ~w(direct condukt), reduce: [] do
      acc ->
        ic = Bench.Interceptor.start(kind, tb)
        spinners = if setting == "awake", do: spin.(), else: []

        try do
          if setting == "shared" and ic.pid do
            for pid <- Bench.Interceptor.pids(ic) do
              Cmd.run!(["/usr/bin/taskset", "-a", "-p", "-c", Bench.Os.load_cpu(), "#{pid}"])
            end
          end

          {code, 0} =
            Bench.Os.client(tb, ["/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url], ca: ic.ca)

          "200" = code
          # The sidecar's CPU time over the run, per request (clock ticks of
          # /proc/PID/stat: utime + stime, 100 per second).
          cpu = fn -> Enum.sum(for pid <- Bench.Interceptor.pids(ic), do: cpu_ticks.(pid)) end
          t0 = cpu.()
          r = Bench.Measure.latency(tb, url, ic.ca, secs)
          r = if ic.pid && is_integer(r[:n]) && r.n > 0, do: Map.put(r, :cpu_us, (cpu.() - t0) * 10_000 / r.n), else: r
          log.("round #{round} #{setting} #{kind}: #{inspect(r)}")
          [{setting, kind, r} | acc]
        after
          unspin.(spinners)
          Bench.Interceptor.stop(ic)
        end
    end
  after
    Testbed.stop(tb)
  end

median = fn xs ->
  xs = Enum.sort(xs)
  n = length(xs)
  if rem(n, 2) == 1, do: Enum.at(xs, div(n, 2)), else: (Enum.at(xs, div(n, 2) - 1) + Enum.at(xs, div(n, 2))) / 2
end

stat = fn setting, kind, key ->
  xs = for {^setting, ^kind, %{^key => v}} <- rows, is_number(v), do: v
  if xs == [], do: nil, else: median.(xs)
end

fmt = fn
  nil -> "n/a"
  v -> :erlang.float_to_binary(v / 1, decimals: 0)
end

errors = for {s, k, %{error: e}} <- rows, do: "- #{s} #{k}: #{e}"

table =
  [
    "| setting | direct p50 µs | sidecar p50 µs | added p50 µs | direct p99 µs | sidecar p99 µs | added p99 µs | sidecar CPU per request µs |",
    "|---|---:|---:|---:|---:|---:|---:|---:|"
  ] ++
    for s <- ~w(split awake shared) do
      [dp50, cp50, dp99, cp99] =
        for {k, key} <- [{"direct", :p50_us}, {"condukt", :p50_us}, {"direct", :p99_us}, {"condukt", :p99_us}],
            do: stat.(s, k, key)

      added = fn a, b -> if a && b, do: b - a, else: nil end

      "| #{s} | #{fmt.(dp50)} | #{fmt.(cp50)} | #{fmt.(added.(dp50, cp50))} | #{fmt.(dp99)} | #{fmt.(cp99)} | #{fmt.(added.(dp99, cp99))} | #{fmt.(stat.(s, "condukt", :cpu_us))} |"
    end

text =
  Enum.join(
    [
      "# Latency at one request in flight, by CPU setting",
      "",
      "#{rounds} rounds of #{secs} s, medians; #{DateTime.utc_now() |> DateTime.truncate(:second)}",
      ""
    ] ++
      table ++ if(errors == [], do: [], else: ["", "Errors:" | errors]),
    "\n"
  ) <> "\n"

File.mkdir_p!(out)
File.write!(Path.join(out, "wakeups.md"), text)
IO.puts(text)
if errors != [], do: System.halt(1)
