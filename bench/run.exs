# The benchmark: condukt-egress against a direct connection, mitmproxy and
# Squid, on one namespace testbed, in one run. bench/README.md describes the
# method; `make bench` (bench/run.sh) is the entry point, which installs the
# peers and cleans up after a crash or Ctrl-C.
#
#   mix run bench/run.exs [--quick] [--rounds N] [--seconds S]
#                         [--only direct,condukt,...] [--no-decide] [--[no-]profile]
#                         [--profile-only h1,h2,newconn,bulk] [--keep-perf-data] [--out DIR]
#
# --profile-only LOADS: no measurement rounds, only perf profiles of the
# sidecar under the named loads (Bench.Report.profile/3).

for file <- ~w(interceptor measure decide report setup) do
  Code.require_file(Path.join([__DIR__, "lib", file <> ".ex"]))
end

alias Condukt.Dev.Netns.{Testbed, Tier}

{opts, _} =
  OptionParser.parse!(System.argv(),
    strict: [
      quick: :boolean,
      rounds: :integer,
      seconds: :integer,
      only: :string,
      decide: :boolean,
      profile: :boolean,
      profile_only: :string,
      keep_perf_data: :boolean,
      out: :string
    ]
  )

quick = Keyword.get(opts, :quick, false)

cfg = %{
  mode: if(quick, do: "quick", else: "full"),
  rounds: Keyword.get(opts, :rounds, if(quick, do: 1, else: 3)),
  seconds: Keyword.get(opts, :seconds, if(quick, do: 2, else: 8)),
  latency_seconds: if(quick, do: 2, else: 5),
  # quick mode downloads the first 128 MiB of the 1 GiB body
  bulk_range: if(quick, do: 128 * 1024 * 1024, else: nil),
  idle_conns: if(quick, do: 200, else: 1000),
  kinds:
    case opts[:only] do
      nil -> Bench.Interceptor.kinds()
      list -> String.split(list, ",", trim: true)
    end,
  decide: Keyword.get(opts, :decide, true),
  # the full mode profiles the sidecar once (perf), the quick mode only when asked
  profile: Keyword.get(opts, :profile, not quick) or opts[:profile_only] != nil,
  profile_loads: if(p = opts[:profile_only], do: String.split(p, ",", trim: true), else: Bench.Report.profile_loads()),
  profile_only: opts[:profile_only] != nil,
  # perf-NAME.data next to each profile (large: for `perf report` by hand)
  keep_perf_data: Keyword.get(opts, :keep_perf_data, false),
  out: Keyword.get(opts, :out, Path.join(__DIR__, "results"))
}

case Tier.check() do
  :ok ->
    :ok

  {:error, reason} ->
    IO.puts(:stderr, "The benchmark needs what the end-to-end tier needs: #{reason}")
    System.halt(1)
end

for tool <- ~w(/usr/bin/h2load /usr/bin/mitmdump /usr/sbin/squid /usr/bin/taskset /usr/bin/prlimit),
    not File.exists?(tool) do
  IO.puts(:stderr, "#{tool} is missing: run bench/setup.sh (make bench does)")
  System.halt(1)
end

log = fn msg -> IO.puts("[#{Time.utc_now() |> Time.truncate(:second)}] #{msg}") end
started = System.monotonic_time(:second)

log.("building the testbed (the 1 GiB body is made once per machine under $TMPDIR/condukt-netns-cache)")
tb = Testbed.start(on_exit: false, big_size: 1024 * 1024 * 1024)

result =
  try do
    Bench.Setup.prepare!(tb)

    url_1k = "https://allowed.test/1k.bin"
    url_big = "https://allowed.test/big.bin"
    results = Map.new(cfg.kinds, &{&1, %{}})
    add = fn acc, kind, key, value -> update_in(acc, [kind, key], &((&1 || []) ++ [value])) end

    results =
      for round <- 1..cfg.rounds//1, not cfg.profile_only, kind <- cfg.kinds, reduce: results do
        acc ->
          log.("round #{round}/#{cfg.rounds}: #{kind}")
          # start/3 flushes the pod's conntrack table (stale NAT decisions).
          ic = Bench.Interceptor.start(kind, tb)

          # Every measurement through a proxy checks, with the REDIRECT
          # counters, that its connections went through the proxy: a result
          # where some reached nginx directly is an error, not a number.
          checked = fn min_conns, measure ->
            before = Bench.Interceptor.redirected(ic)
            r = measure.()
            later = Bench.Interceptor.redirected(ic)
            expected = if is_function(min_conns), do: min_conns.(r), else: min_conns

            cond do
              before == nil or Map.has_key?(r, :error) ->
                r

              later - before < expected ->
                %{
                  error:
                    "only #{later - before} new connections went through #{kind}, at least #{expected} expected: " <>
                      "the rest bypassed it (result discarded: #{inspect(r)})"
                }

              true ->
                Map.put(r, :redirected, later - before)
            end
          end

          c = Bench.Measure.concurrency()

          acc =
            try do
              # Warm-up: the first request through a proxy mints its leaf
              # certificate and resolves the name.
              {out, st} =
                Bench.Os.client(tb, ["/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url_1k], ca: ic.ca)

              if st != 0 or out != "200", do: raise("#{kind}: warm-up request failed: exit #{st}: #{out}")

              h1 = checked.(c.h1_conns, fn -> Bench.Measure.keepalive(tb, url_1k, :h1, cfg.seconds) end)
              acc = add.(acc, kind, :h1, h1)
              h2 = checked.(c.h2_conns, fn -> Bench.Measure.keepalive(tb, url_1k, :h2, cfg.seconds) end)
              acc = add.(acc, kind, :h2, h2)
              nc = checked.(& &1[:succeeded], fn -> Bench.Measure.new_conns(tb, url_1k, cfg.seconds) end)
              acc = add.(acc, kind, :new_conns, nc)
              lat = checked.(1, fn -> Bench.Measure.latency(tb, url_1k, ic.ca, cfg.latency_seconds) end)
              acc = add.(acc, kind, :latency, lat)
              bulk = checked.(1, fn -> Bench.Measure.bulk(tb, url_big, ic.ca, cfg.bulk_range) end)
              acc = add.(acc, kind, :bulk, bulk)

              acc =
                if round == cfg.rounds and kind != "direct" do
                  add.(acc, kind, :idle, Bench.Measure.idle_rss(tb, ic, url_1k, cfg.idle_conns))
                else
                  acc
                end

              # A proxy that crashed is a result too: its log goes in the report.
              case Bench.Interceptor.died(ic) do
                nil -> acc
                why -> add.(acc, kind, :alive, %{error: "in round #{round}: " <> why})
              end
            after
              Bench.Interceptor.stop(ic)
            end

          # Idle h2 connections on an interceptor of their own: one that
          # held the HTTP/1.1 ones keeps their freed heap resident, which
          # the next ones would reuse unseen.
          if round == cfg.rounds and kind != "direct" do
            ic = Bench.Interceptor.start(kind, tb)

            try do
              Bench.Os.client(tb, ["/usr/bin/curl", "-sS", "-o", "/dev/null", url_1k], ca: ic.ca)
              add.(acc, kind, :idle_h2, Bench.Measure.idle_rss(tb, ic, url_1k, cfg.idle_conns, "h2"))
            after
              Bench.Interceptor.stop(ic)
            end
          else
            acc
          end
      end

    decide =
      if cfg.decide and not cfg.profile_only and "condukt" in cfg.kinds do
        for round <- 1..cfg.rounds, cache <- [false, true], reduce: %{} do
          acc ->
            log.("round #{round}/#{cfg.rounds}: condukt decide path, cache #{cache}")
            r = Bench.Decide.run(tb, cache, cfg.latency_seconds)
            Map.update(acc, cache, [r], &(&1 ++ [r]))
        end
      end

    profile =
      if cfg.profile and "condukt" in cfg.kinds do
        log.("profiling condukt-egress (perf) under #{Enum.join(cfg.profile_loads, ", ")}")
        Bench.Report.profile(tb, url_1k, cfg)
      end

    %{results: results, decide: decide, profile: profile}
  after
    Testbed.stop(tb)
  end

elapsed = System.monotonic_time(:second) - started

if cfg.profile_only do
  # Only the profiles: the results tables of the last full run stay as they are.
  log.("profiles done in #{elapsed} s, in #{cfg.out}")
  IO.puts(Bench.Report.profile_md(result.profile))
else
  log.("measurements done in #{elapsed} s; writing #{cfg.out}")
  Bench.Report.write(result, cfg, elapsed)
end
