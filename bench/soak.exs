# The soak: the sidecar under mixed traffic for a long time, sampled at a
# fixed interval, failing when its RSS, its file descriptors or its latency
# trend up (bench/README.md, "Soak"). `make soak` (bench/run.sh --soak) is
# the entry point, which cleans the testbed up after a crash or Ctrl-C.
#
#   mix run bench/soak.exs [--minutes M] [--interval S] [--scale X] [--out DIR]
#                          [--heaptrack FILE]
#
# --minutes: how long the traffic runs (default 60); --interval: seconds
# between samples (default 60, or about 45 samples over a run shorter than
# 45 minutes, at least 10 s); --scale: multiplies every rate of the traffic
# (default 1); --out: where soak-results.md and soak.json go (default
# bench/results/); --heaptrack: run the sidecar under heaptrack, writing
# FILE.zst, and end it with SIGKILL once the clients are gone and it holds
# no connection, so that `heaptrack_print -l 1 FILE.zst` lists as "leaked"
# exactly what it still held then (a leak's call stacks).

for file <- ~w(interceptor measure decide trend setup) do
  Code.require_file(Path.join([__DIR__, "lib", file <> ".ex"]))
end

alias Condukt.Dev.Netns.{Cmd, Testbed, Tier}
alias Condukt.Sandbox.NetworkPolicy
alias Condukt.Sandbox.NetworkPolicy.ControlBridge

{opts, _} =
  OptionParser.parse!(System.argv(),
    strict: [minutes: :float, interval: :integer, scale: :float, out: :string, heaptrack: :string]
  )

minutes = Keyword.get(opts, :minutes, 60.0)
run_s = round(minutes * 60)
interval = Keyword.get(opts, :interval, if(minutes >= 45, do: 60, else: max(10, div(run_s, 45))))
scale = Keyword.get(opts, :scale, 1.0)
out_dir = Keyword.get(opts, :out, Path.join(__DIR__, "results"))
# The first samples show the allocator, the pools and the leaf cache
# filling up: the verdict starts after min(10 min, 20 % of the run).
warmup_s = min(600, div(run_s, 5))

case Tier.check() do
  :ok ->
    :ok

  {:error, reason} ->
    IO.puts(:stderr, "The soak needs what the end-to-end tier needs: #{reason}")
    System.halt(1)
end

log = fn msg -> IO.puts("[#{Time.utc_now() |> Time.truncate(:second)}] #{msg}") end
log.("soak: #{minutes} min of traffic, a sample every #{interval} s, verdict after #{warmup_s} s of warm-up")

tb = Testbed.start(on_exit: false, big_size: 1024 * 1024 * 1024)

# Everything the sidecar is sampled for, from the outside: RSS of its
# process, its open file descriptors, and (SIGUSR1) its own count of live
# connections and buffer bytes held.
sample_proxy = fn ic ->
  stderr = Path.join(ic.dir, "proxy.stderr")
  lines = fn -> Regex.scan(~r/^condukt-egress: buffers: .*$/m, File.read!(stderr)) end
  seen = length(lines.())
  System.cmd("kill", ["-USR1", "#{ic.proxy}"])
  Cmd.poll(fn -> length(lines.()) > seen end, 5_000)

  stats =
    case List.last(lines.()) do
      [line] -> Regex.scan(~r/(\w+)=(\d+)/, line) |> Map.new(fn [_, k, v] -> {k, String.to_integer(v)} end)
      _ -> %{}
    end

  fds =
    case File.ls("/proc/#{ic.proxy}/fd") do
      {:ok, l} -> length(l)
      _ -> nil
    end

  %{rss_kib: Bench.Os.rss_kib([ic.proxy]), fds: fds, connections: stats["connections"], held: stats["held"]}
end

result =
  try do
    Bench.Setup.prepare!(tb)

    decider = fn _ctx, req ->
      cond do
        req.host != "decide.test" -> {:deny, "not decide.test"}
        String.starts_with?(req.path || "", "/deny/") -> {:deny, "a /deny/ path"}
        true -> :allow
      end
    end

    policy =
      NetworkPolicy.new!(
        rules: [allow: ["allowed.test"], decide: [call: decider, timeout: 5_000, cache: false]],
        default: :deny
      )

    wrap = if f = opts[:heaptrack], do: ["/usr/bin/heaptrack", "-o", f], else: []
    ic = Bench.Interceptor.start("condukt", tb, policy: policy, wrap: wrap)
    # The sidecar itself (under heaptrack, a child of its script).
    proxy = Enum.find(Bench.Os.tree(ic.pid), ic.pid, &(File.read("/proc/#{&1}/comm") == {:ok, "condukt-egress\n"}))
    ic = Map.put(ic, :proxy, proxy)

    bridge = Bench.Decide.bridge!(tb, ic, policy)
    url = "https://allowed.test/1k.bin"

    # The warm-up request mints the leaf.
    {"200", 0} = Bench.Os.client(tb, ["/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url], ca: ic.ca)

    # Before any traffic: what the end is compared with.
    start_sample = Map.put(sample_proxy.(ic), :t, 0)

    # h1 and h2 keep-alive at a fixed rate, in runs of 60 s (each run opens
    # new connections: churn of long-lived ones too).
    h2load = fn args -> ~s(while :; do /usr/bin/h2load #{args} -t 1 -D 60 #{url} >/dev/null 2>&1; done) end

    clients = [
      Bench.Os.spawn_client(
        tb,
        ["/bin/sh", "-c", h2load.("--h1 -c 4 --rps #{round(50 * scale)}")],
        Path.join(tb.dir, "logs/soak-h1.log")
      ),
      Bench.Os.spawn_client(
        tb,
        ["/bin/sh", "-c", h2load.("-c 2 -m 4 --rps #{round(100 * scale)}")],
        Path.join(tb.dir, "logs/soak-h2.log")
      ),
      Bench.Os.spawn_client(
        tb,
        [
          "/usr/bin/python3",
          Path.join(tb.bin_dir, "soak.py"),
          "https://allowed.test",
          ic.ca,
          Path.join(tb.dir, "soak-counts.json"),
          "#{scale}"
        ],
        Path.join(tb.dir, "logs/soak-py.log"),
        ca: ic.ca
      )
    ]

    counts = fn ->
      case File.read(Path.join(tb.dir, "soak-counts.json")) do
        {:ok, t} -> Condukt.JSON.decode!(t)
        _ -> %{}
      end
    end

    t0 = System.monotonic_time(:millisecond)
    log.("soak: traffic started; proxy at start #{inspect(start_sample)}")

    samples =
      Enum.reduce_while(Stream.iterate(1, &(&1 + 1)), [], fn k, acc ->
        due = t0 + k * interval * 1000
        Process.sleep(max(0, due - System.monotonic_time(:millisecond)))
        t = (System.monotonic_time(:millisecond) - t0) / 1000

        cond do
          not Cmd.alive?(ic.proxy) ->
            {:halt, acc}

          t > run_s + 1 ->
            {:halt, acc}

          true ->
            lat = Bench.Measure.latency(tb, url, ic.ca, 3)
            s = sample_proxy.(ic) |> Map.merge(%{t: t, p50_us: lat[:p50_us], p99_us: lat[:p99_us]})
            log.("soak: #{inspect(s)}")
            {:cont, acc ++ [s]}
        end
      end)

    traffic = counts.()
    for c <- clients, do: Cmd.kill(Bench.Os.tree(c))
    # Once the clients are gone, every connection should be gone too, and
    # the descriptors back to the start's.
    Cmd.poll(fn -> sample_proxy.(ic)[:connections] == 0 end, 30_000, 500)
    final = sample_proxy.(ic)
    died = Bench.Interceptor.died(ic)
    if opts[:heaptrack], do: System.cmd("kill", ["-KILL", "#{proxy}"]) && Process.sleep(3_000)
    ControlBridge.stop(bridge)
    Bench.Interceptor.stop(ic)
    %{samples: samples, start: start_sample, final: final, traffic: traffic, died: died}
  after
    Testbed.stop(tb)
  end

# The verdict: each metric after the warm-up, with its tolerance (the
# largest growth over the span that is accepted, a rise that is both
# significant and larger fails).
kib = 1024

metrics = [
  {:rss_kib, "RSS, KiB", fn med -> max(2 * kib, 0.02 * med) end},
  {:fds, "file descriptors", fn _ -> 4 end},
  {:p50_us, "latency p50, µs", fn med -> max(50, 0.25 * med) end},
  {:p99_us, "latency p99, µs", fn med -> max(200, 0.5 * med) end}
]

steady = Enum.filter(result.samples, &(&1.t >= warmup_s))

verdicts =
  for {key, label, tol} <- metrics do
    points = for s <- steady, is_number(s[key]), do: {s.t, s[key]}
    {key, label, Bench.Trend.verdict(points, tol)}
  end

traffic_errors =
  for {kind, c} <- result.traffic || %{}, c["error"] > 0.01 * max(1, c["ok"] + c["refused"] + c["error"]) do
    "#{kind}: #{c["error"]} errors of #{c["ok"] + c["refused"] + c["error"]}"
  end

failures =
  for({_, label, v} <- verdicts, v.up, do: "#{label} trends up") ++
    if(result.died, do: ["the sidecar died: #{result.died}"], else: []) ++
    if(result.final[:connections] != 0,
      do: ["#{result.final[:connections]} connections left after the clients stopped"],
      else: []
    ) ++
    if(is_integer(result.final[:fds]) and result.final[:fds] > result.start[:fds] + 2,
      do: ["#{result.final[:fds]} file descriptors after the clients stopped, #{result.start[:fds]} at the start"],
      else: []
    ) ++ Enum.map(traffic_errors, &"more than 1 % errors: #{&1}")

fmt = fn
  nil -> "n/a"
  v when is_float(v) -> :erlang.float_to_binary(v, decimals: 1)
  v -> "#{v}"
end

md =
  IO.iodata_to_binary([
    "# Soak (#{minutes} min, a sample every #{interval} s, traffic scale #{scale})\n\n",
    "Ended #{DateTime.utc_now() |> DateTime.truncate(:second) |> DateTime.to_iso8601()}; verdict on the ",
    "#{length(steady)} samples after #{warmup_s} s of warm-up: **#{if failures == [], do: "flat (pass)", else: "FAIL"}**.\n\n",
    "| metric | median | Theil-Sen slope per hour | growth over the span | tolerance | Mann-Kendall z | trends up |\n",
    "|---|---:|---:|---:|---:|---:|---|\n",
    for {_, label, v} <- verdicts do
      "| #{label} | #{fmt.(v.median)} | #{fmt.(v.slope_per_h)} | #{fmt.(v.growth)} | #{fmt.(v.tolerance)} | " <>
        "#{fmt.(v.z)} | #{if v.up, do: "**yes**", else: "no"} |\n"
    end,
    "\nAt the start: #{inspect(result.start)}; after the clients stopped: #{inspect(result.final)}.\n\n",
    "Traffic (outcomes per kind, \"ok\" = what the kind expects): `#{Condukt.JSON.encode!(result.traffic || %{})}`\n",
    if(failures == [], do: "", else: "\n## Failures\n\n" <> Enum.map_join(failures, "\n", &"- #{&1}") <> "\n"),
    "\n## Samples\n\n| t s | RSS KiB | fds | connections | held B | p50 µs | p99 µs |\n|---:|---:|---:|---:|---:|---:|---:|\n",
    for s <- result.samples do
      "| #{fmt.(s.t)} | #{s.rss_kib} | #{s.fds} | #{fmt.(s.connections)} | #{fmt.(s.held)} | #{fmt.(s.p50_us)} | #{fmt.(s.p99_us)} |\n"
    end
  ])

File.mkdir_p!(out_dir)
File.write!(Path.join(out_dir, "soak-results.md"), md)

File.write!(
  Path.join(out_dir, "soak.json"),
  Condukt.JSON.encode!(%{
    minutes: minutes,
    interval: interval,
    warmup_s: warmup_s,
    samples: result.samples,
    start: result.start,
    final: result.final,
    traffic: result.traffic,
    verdicts: Map.new(verdicts, fn {k, _, v} -> {k, v} end),
    failures: failures
  })
)

IO.puts(md |> String.split("## Samples") |> hd())

if failures != [] do
  log.("soak FAILED: " <> Enum.join(failures, "; "))
  System.halt(1)
end
