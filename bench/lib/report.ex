defmodule Bench.Report do
  @moduledoc false
  # Medians over rounds, the markdown table, results.json and the chart;
  # and the one-off profile of the sidecar.

  alias Condukt.Dev.Netns.Cmd

  # {key, label, unit, better}: better is :higher or :lower.
  defp metrics(cfg) do
    c = Bench.Measure.concurrency()
    bulk = if cfg.bulk_range, do: "first #{div(cfg.bulk_range, 1024 * 1024)} MiB of the 1 GiB body", else: "1 GiB body"

    [
      {:h1_rps, "keep-alive HTTPS, HTTP/1.1, 1 KiB, #{c.h1_conns} connections", "req/s", :higher},
      {:h2_rps, "keep-alive HTTPS, h2, 1 KiB, #{c.h2_conns} connections × #{c.h2_streams} streams", "req/s", :higher},
      {:new_conns, "new TLS connections, one request each, #{c.h1_conns} at a time", "conn/s", :higher},
      {:bulk_mb_s, "bulk download, #{bulk}", "MB/s", :higher},
      {:lat_p50, "latency p50, one request in flight", "µs", :lower},
      {:lat_p99, "latency p99, one request in flight", "µs", :lower},
      {:added_p50, "added latency p50 (over direct)", "µs", :lower},
      {:added_p99, "added latency p99 (over direct)", "µs", :lower},
      {:rss_base, "proxy RSS at start", "MiB", :lower},
      {:rss_idle, "proxy RSS with #{cfg.idle_conns} idle TLS connections", "MiB", :lower},
      {:rss_per_conn, "proxy RSS per idle connection", "KiB", :lower},
      {:rss_per_conn_h2, "proxy RSS per idle h2 connection", "KiB", :lower}
    ]
  end

  @doc "The medians per interceptor and metric: value, or {:na, why}."
  def summarize(results, cfg) do
    direct = Map.get(results, "direct", %{})

    base =
      Map.new(results, fn {kind, r} ->
        {kind,
         %{
           h1_rps: med(r[:h1], & &1[:rps]),
           h2_rps: h2(r[:h2]),
           new_conns: med(r[:new_conns], & &1[:rps]),
           bulk_mb_s: med(r[:bulk], & &1[:mb_s]),
           lat_p50: med(r[:latency], & &1[:p50_us]),
           lat_p99: med(r[:latency], & &1[:p99_us]),
           rss_base:
             if(kind == "direct",
               do: {:na, "no proxy"},
               else: med(r[:idle], &(&1[:before_kib] && &1[:before_kib] / 1024))
             ),
           rss_idle:
             if(kind == "direct", do: {:na, "no proxy"}, else: med(r[:idle], &(&1[:held_kib] && &1[:held_kib] / 1024))),
           rss_per_conn: if(kind == "direct", do: {:na, "no proxy"}, else: med(r[:idle], & &1[:per_conn_kib])),
           rss_per_conn_h2: if(kind == "direct", do: {:na, "no proxy"}, else: idle_h2(r[:idle_h2]))
         }}
      end)

    d50 = med(direct[:latency], & &1[:p50_us])
    d99 = med(direct[:latency], & &1[:p99_us])

    Map.new(base, fn {kind, m} ->
      {kind,
       Map.merge(m, %{
         added_p50: diff(m.lat_p50, d50),
         added_p99: diff(m.lat_p99, d99)
       })}
    end)
    |> then(&{&1, errors(results)})
    |> then(fn {s, errs} -> %{summary: s, errors: errs, metrics: metrics(cfg)} end)
  end

  defp diff(a, b) when is_number(a) and is_number(b), do: a - b
  defp diff(_, _), do: {:na, "no direct baseline"}

  # An interceptor that does not offer h2 to the workspace holds no idle
  # h2 connection: "no h2", not a number.
  defp idle_h2(nil), do: {:na, "not run"}

  defp idle_h2(rounds) do
    if Enum.all?(rounds, &(&1[:opened] == 0)),
      do: {:na, "no h2 to the workspace"},
      else: med(rounds, & &1[:per_conn_kib])
  end

  # The h2 row shows what happened: a client that asked for h2 and got
  # HTTP/1.1 (the proxy offered no h2 in ALPN) is "h1 fallback", not a number.
  defp h2(nil), do: {:na, "not run"}

  defp h2(rounds) do
    protos = rounds |> Enum.map(& &1[:protocol]) |> Enum.reject(&is_nil/1) |> Enum.uniq()

    cond do
      protos != [] and "h2" not in protos -> {:na, "h1 fallback (no h2 in ALPN)"}
      true -> med(Enum.filter(rounds, &(&1[:protocol] == "h2")), & &1[:rps])
    end
  end

  defp med(nil, _f), do: {:na, "not run"}

  defp med(rounds, f) do
    values = rounds |> Enum.reject(&Map.has_key?(&1, :error)) |> Enum.map(f) |> Enum.filter(&is_number/1) |> Enum.sort()

    case values do
      [] -> {:na, "failed"}
      _ -> median(values)
    end
  end

  defp median(sorted) do
    n = length(sorted)

    if rem(n, 2) == 1,
      do: Enum.at(sorted, div(n, 2)),
      else: (Enum.at(sorted, div(n, 2) - 1) + Enum.at(sorted, div(n, 2))) / 2
  end

  defp errors(results) do
    for {kind, r} <- results,
        {metric, rounds} <- r,
        {round, i} <- Enum.with_index(rounds, 1),
        Map.has_key?(round, :error) do
      "#{kind} #{metric} round #{i}: #{round.error |> String.replace("\n", " ") |> String.slice(0, 800)}"
    end
  end

  defp decide_summary(nil), do: nil

  defp decide_summary(decide) do
    row = fn rounds, side ->
      %{
        p50: med(Enum.map(rounds, & &1[side]), & &1[:p50_us]),
        p99: med(Enum.map(rounds, & &1[side]), & &1[:p99_us])
      }
    end

    no_cache = Map.get(decide, false, [])
    cache = Map.get(decide, true, [])

    %{
      allow: row.(no_cache, :allow),
      decide_no_cache: row.(no_cache, :decide),
      decide_cache_hit: row.(cache, :decide),
      errors:
        for({c, rs} <- decide, r <- rs, {side, m} <- r, Map.has_key?(m, :error), do: "cache #{c} #{side}: #{m.error}")
    }
  end

  ## Writing ------------------------------------------------------------------

  def write(result, cfg, elapsed) do
    File.mkdir_p!(cfg.out)
    s = summarize(result.results, cfg)
    decide = decide_summary(result.decide)
    machine = machine()
    date = DateTime.utc_now() |> DateTime.truncate(:second) |> DateTime.to_iso8601()
    kinds = Enum.filter(Bench.Interceptor.kinds(), &Map.has_key?(s.summary, &1))

    md =
      [
        "# Benchmark results (#{cfg.mode} mode)\n",
        "Taken #{date} on #{machine}; #{cfg.rounds} round(s), medians; #{cfg.seconds} s per throughput measurement; ",
        "run time #{elapsed} s. Absolute numbers depend on the machine; the ratios are the headline. ",
        "Proxy pinned to CPU #{Bench.Os.proxy_cpu()}, load generator and nginx to CPU #{Bench.Os.load_cpu()}.\n\n",
        table(s, kinds),
        "\n",
        ratios(s, kinds),
        decide_table(decide),
        if(s.errors != [], do: "\n## Errors\n\n" <> Enum.map_join(s.errors, "\n", &"- #{&1}") <> "\n", else: ""),
        if(decide && decide.errors != [], do: Enum.map_join(decide.errors, "\n", &"- #{&1}") <> "\n", else: ""),
        profile_md(result.profile)
      ]
      |> IO.iodata_to_binary()

    json = %{
      mode: cfg.mode,
      date: date,
      machine: machine,
      rounds: cfg.rounds,
      seconds: cfg.seconds,
      elapsed_s: elapsed,
      kinds: kinds,
      metrics: Enum.map(s.metrics, fn {k, l, u, b} -> %{key: k, label: l, unit: u, better: b} end),
      summary: Map.new(s.summary, fn {k, m} -> {k, Map.new(m, fn {mk, v} -> {mk, jsonable(v)} end)} end),
      decide:
        decide &&
          Map.new(Map.delete(decide, :errors), fn {k, m} -> {k, Map.new(m, fn {mk, v} -> {mk, jsonable(v)} end)} end),
      raw: jsonable_deep(result.results),
      raw_decide: jsonable_deep(result.decide),
      profile: jsonable_deep(result.profile),
      errors: s.errors
    }

    md_path = Path.join(cfg.out, "results-#{cfg.mode}.md")
    json_path = Path.join(cfg.out, "results-#{cfg.mode}.json")
    png_path = Path.join(cfg.out, "results-#{cfg.mode}.png")
    File.write!(md_path, md)
    File.write!(json_path, Condukt.JSON.encode!(json))

    case Cmd.run(["/usr/bin/python3", Path.join([__DIR__, "..", "chart.py"]), json_path, png_path], timeout: 60_000) do
      {_, 0} -> :ok
      {out, st} -> IO.puts(:stderr, "chart.py failed (exit #{st}): #{out}")
    end

    IO.puts("\n" <> md)
    IO.puts("Written: #{md_path}, #{json_path}, #{png_path}")
  end

  defp table(s, kinds) do
    head =
      "| metric | unit | " <>
        Enum.join(kinds, " | ") <> " |\n|---|---|" <> String.duplicate("---:|", length(kinds)) <> "\n"

    rows =
      for {key, label, unit, _better} <- s.metrics do
        direct = get_in(s.summary, ["direct", key])

        cells =
          for kind <- kinds do
            v = s.summary[kind][key]

            case {v, direct} do
              {{:na, why}, _} ->
                "n/a: #{why}"

              {v, d} when kind != "direct" and is_number(d) and d != 0 and key not in [:added_p50, :added_p99] ->
                "#{fmt(v)} (#{ratio(v, d)})"

              {v, _} ->
                fmt(v)
            end
          end

        "| #{label} | #{unit} | " <> Enum.join(cells, " | ") <> " |\n"
      end

    "## Absolute numbers (ratio to direct in parentheses)\n\n" <> head <> Enum.join(rows)
  end

  defp ratios(s, kinds) do
    others = Enum.reject(kinds, &(&1 == "condukt"))

    if "condukt" in kinds and others != [] do
      head =
        "| metric | better | " <>
          Enum.map_join(others, " | ", &"condukt / #{&1}") <>
          " |\n|---|---|" <> String.duplicate("---:|", length(others)) <> "\n"

      rows =
        for {key, label, _unit, better} <- s.metrics, key not in [:added_p50, :added_p99] do
          c = s.summary["condukt"][key]
          cells = for o <- others, do: ratio(c, s.summary[o][key])
          "| #{label} | #{better} | " <> Enum.join(cells, " | ") <> " |\n"
        end

      "## condukt-egress against each (condukt's number divided by the other's)\n\n" <> head <> Enum.join(rows)
    else
      ""
    end
  end

  defp decide_table(nil), do: ""

  defp decide_table(d) do
    """

    ## The decide path (condukt only)

    Sequential keep-alive requests, one in flight, through the sidecar with a
    ControlBridge on this BEAM running an Elixir function decider.

    | request | p50 µs | p99 µs | p50 over the allow rule µs |
    |---|---:|---:|---:|
    | allowed.test (allow rule, no round trip) | #{fmt(d.allow.p50)} | #{fmt(d.allow.p99)} | |
    | decide.test, `cache: false` (a round trip per request) | #{fmt(d.decide_no_cache.p50)} | #{fmt(d.decide_no_cache.p99)} | #{fmt(diff(d.decide_no_cache.p50, d.allow.p50))} |
    | decide.test, `cache: true` (cache hits) | #{fmt(d.decide_cache_hit.p50)} | #{fmt(d.decide_cache_hit.p99)} | #{fmt(diff(d.decide_cache_hit.p50, d.allow.p50))} |
    """
  end

  defp ratio(a, b) when is_number(a) and is_number(b) and b != 0, do: :erlang.float_to_binary(a / b, decimals: 2) <> "×"
  defp ratio(_, _), do: "n/a"

  defp fmt({:na, why}), do: "n/a: #{why}"
  defp fmt(v) when is_integer(v), do: group(Integer.to_string(v))
  defp fmt(v) when is_float(v) and abs(v) >= 100, do: group(Integer.to_string(round(v)))
  defp fmt(v) when is_float(v), do: :erlang.float_to_binary(v, decimals: 1)
  defp fmt(v), do: inspect(v)

  defp group("-" <> s), do: "-" <> group(s)

  defp group(s),
    do:
      s
      |> String.reverse()
      |> String.graphemes()
      |> Enum.chunk_every(3)
      |> Enum.map_join(",", &Enum.join/1)
      |> String.reverse()

  defp jsonable({:na, why}), do: %{na: why}
  defp jsonable(v), do: v

  defp jsonable_deep(m) when is_map(m), do: Map.new(m, fn {k, v} -> {to_string(k), jsonable_deep(v)} end)
  defp jsonable_deep(l) when is_list(l), do: Enum.map(l, &jsonable_deep/1)
  defp jsonable_deep(v), do: v

  def machine do
    cpu =
      case File.read("/proc/cpuinfo") do
        {:ok, t} ->
          case Regex.run(~r/model name\s*:\s*(.+)/, t),
            do:
              (
                [_, m] -> m
                _ -> "unknown CPU"
              )

        _ ->
          "unknown CPU"
      end

    mem =
      case File.read("/proc/meminfo") do
        {:ok, t} ->
          case Regex.run(~r/MemTotal:\s+(\d+)/, t),
            do:
              (
                [_, kb] -> "#{round(String.to_integer(kb) / 1024 / 1024)} GiB RAM"
                _ -> ""
              )

        _ ->
          ""
      end

    debian =
      case File.read("/etc/debian_version"),
        do:
          (
            {:ok, v} -> "Debian #{String.trim(v)}"
            _ -> "Linux"
          )

    {kernel, _} = System.cmd("uname", ["-r"])
    "#{:erlang.system_info(:logical_processors)} cores (#{cpu}), #{mem}, #{debian}, kernel #{String.trim(kernel)}"
  end

  @doc "The profile's table (markdown): the sidecar's CPU per unit of work under each load."
  def profile_md(nil), do: ""

  def profile_md(%{loads: loads}) do
    rows =
      Enum.map_join(loads, "", fn
        %{error: e, name: n} -> "| #{n} | n/a: #{e} | |\n"
        l -> "| #{l.name} | #{fmt_per(l.cpu_us_per_unit)} µs per #{l.unit} | `#{Path.basename(l.path)}` |\n"
      end)

    "\n## Profile of condukt-egress\n\n| load | sidecar CPU | perf report |\n|---|---:|---|\n" <> rows
  end

  defp fmt_per(nil), do: "n/a"
  defp fmt_per(v), do: :erlang.float_to_binary(v / 1, decimals: 1)

  ## Profile ------------------------------------------------------------------

  @doc """
  Records condukt-egress with perf (call graphs) during each of four loads
  and writes `profile-condukt-NAME.txt` per load (by shared object, by
  symbol, inclusive time) into the results dir: `h1` and `h2` keep-alive
  (the 1 KiB body, as in test 1), `newconn` (one request per connection, as
  in test 2) and `bulk` (the 1 GiB body, as in test 3). Each also gets the
  sidecar's CPU time per unit of work over the load's whole run (from
  /proc/PID/stat): µs per request, per connection, or per MB. Returns
  %{loads: [%{name, cpu_us_per_unit, unit, ...}]}.
  """
  def profile(tb, url, cfg) do
    File.mkdir_p!(cfg.out)
    secs = max(cfg.seconds, 5)
    big = String.replace(url, "1k.bin", "big.bin")
    loads = Enum.filter(profile_loads(), &(&1 in cfg.profile_loads))
    %{loads: Enum.map(loads, &profile_one(tb, &1, url, big, secs, cfg))}
  end

  @doc "The loads `profile/3` knows, in its order."
  def profile_loads, do: ~w(h1 h2 newconn bulk)

  defp profile_client("h1", url, _big, secs, _ca),
    do: [
      "/usr/bin/h2load",
      "--h1",
      "-c",
      "#{Bench.Measure.concurrency().h1_conns}",
      "-t",
      "1",
      "-D",
      "#{secs + 2}",
      url
    ]

  defp profile_client("h2", url, _big, secs, _ca) do
    c = Bench.Measure.concurrency()
    ["/usr/bin/h2load", "-c", "#{c.h2_conns}", "-m", "#{c.h2_streams}", "-t", "1", "-D", "#{secs + 2}", url]
  end

  # h2load's duration mode does not reconnect: a count far above what the
  # window can take, and the client is stopped after it.
  defp profile_client("newconn", url, _big, _secs, _ca),
    do:
      ["/usr/bin/h2load", "--h1", "-c", "#{Bench.Measure.concurrency().h1_conns}", "-t", "1"] ++
        ["-H", "connection: close", "-n", "1000000", url]

  # Downloads of the 1 GiB body one after the other for the window; each
  # line of the log is one download's "bytes seconds".
  defp profile_client("bulk", _url, big, secs, ca) do
    script =
      ~s|end=$(($(date +%s) + #{secs + 2})); while [ "$(date +%s)" -lt "$end" ]; do | <>
        ~s|/usr/bin/curl -sS -o /dev/null --cacert "#{ca}" --max-time #{secs + 2} | <>
        ~s|-w '%{size_download} %{time_total}\\n' "#{big}"; done|

    ["/bin/sh", "-c", script]
  end

  defp cpu_ticks(pid) do
    case File.read("/proc/#{pid}/stat") do
      {:ok, stat} ->
        [_, rest] = String.split(stat, ") ", parts: 2)
        f = String.split(rest)
        String.to_integer(Enum.at(f, 11)) + String.to_integer(Enum.at(f, 12))

      _ ->
        0
    end
  end

  # The work the load's client did, in its unit: h2load's succeeded
  # requests, or the MB (10^6 bytes) curl downloaded.
  defp profile_work("bulk", text) do
    mb =
      Regex.scan(~r/^(\d+) [\d.]+$/m, text)
      |> Enum.map(fn [_, b] -> String.to_integer(b) end)
      |> Enum.sum()

    {mb / 1.0e6, "MB"}
  end

  defp profile_work(name, text) do
    n =
      case Regex.run(~r/requests: .* (\d+) succeeded/, text) do
        [_, v] -> String.to_integer(v)
        _ -> 0
      end

    {n, if(name == "newconn", do: "connection", else: "request")}
  end

  defp profile_one(tb, name, url, big, secs, cfg) do
    ic = Bench.Interceptor.start("condukt", tb)
    data = Path.join(tb.dir, "perf-#{name}.data")
    hz = :erlang.convert_time_unit(1, :second, :native)

    try do
      log = Path.join(tb.dir, "logs/profile-#{name}.log")
      cpu0 = cpu_ticks(ic.pid)
      t0 = System.monotonic_time()
      client = Bench.Os.spawn_client(tb, profile_client(name, url, big, secs, ic.ca), log)
      Process.sleep(1_000)

      {out, st} =
        Cmd.run(
          ["/usr/bin/perf", "record", "-F", "997", "--call-graph", "dwarf", "-p", "#{ic.pid}", "-o", data] ++
            ["--", "sleep", "#{secs}"],
          timeout: (secs + 30) * 1000
        )

      if name == "newconn",
        do: Cmd.kill(Bench.Os.tree(client)),
        else: Cmd.poll(fn -> not Cmd.alive?(client) end, 30_000)

      # newconn: h2load was stopped, its summary is lost; count the
      # connections from the proxy's events instead (one request_closed each).
      cpu = (cpu_ticks(ic.pid) - cpu0) * 1_000_000 / 100
      wall = (System.monotonic_time() - t0) / hz
      load = File.read!(log)

      {work, unit} =
        if name == "newconn",
          do: {count_events(ic, "request_closed"), "connection"},
          else: profile_work(name, load)

      if st != 0 do
        %{name: name, error: "perf record exit #{st}: #{out}"}
      else
        report = fn args ->
          {text, _} =
            Cmd.run(["/usr/bin/perf", "report", "-i", data, "--stdio" | args], timeout: 180_000, stderr: :discard)

          text
        end

        per = if work > 0, do: cpu / work, else: nil

        summary =
          "# sidecar CPU over the load's #{Float.round(wall, 1)} s: #{Float.round(cpu / 1.0e6, 2)} s for " <>
            "#{work} #{unit}(s): #{if per, do: Float.round(per, 1), else: "n/a"} µs CPU per #{unit}" <>
            " (perf's sampling included)\n"

        text =
          "# condukt-egress profile: perf record -F 997 --call-graph dwarf, #{secs} s of the #{name} load\n" <>
            "# client: #{Enum.join(profile_client(name, url, big, secs, "CA"), " ")}\n" <>
            summary <>
            "# load during the profile (client output):\n" <>
            (load
             |> String.split("\n")
             |> Enum.filter(&(&1 =~ ~r/finished in|requests:|^\d+ [\d.]+$/))
             |> Enum.map_join("\n", &("#   " <> &1))) <>
            "\n\n## by shared object (self)\n" <>
            report.(["--no-children", "--sort", "dso", "--percent-limit", "0.5", "-g", "none"]) <>
            "\n\n## by symbol (self)\n" <>
            report.(["--no-children", "--sort", "dso,symbol", "--percent-limit", "0.4", "-g", "none"]) <>
            "\n\n## condukt-egress's own functions, children included (inclusive time)\n" <>
            report.(["--children", "--dsos", "condukt-egress", "--sort", "symbol", "--percent-limit", "1", "-g", "none"]) <>
            "\n\n## every symbol, children included (inclusive time)\n" <>
            report.(["--children", "--sort", "dso,symbol", "--percent-limit", "2", "-g", "none"])

        path = Path.join(cfg.out, "profile-condukt-#{name}.txt")
        File.write!(path, text)
        if cfg[:keep_perf_data], do: File.cp!(data, Path.join(cfg.out, "perf-#{name}.data"))
        File.rm(data)
        %{name: name, path: path, cpu_us: cpu, work: work, unit: unit, cpu_us_per_unit: per, wall_s: wall}
      end
    after
      Bench.Interceptor.stop(ic)
    end
  end

  defp count_events(ic, type) do
    case File.read(Path.join(ic.dir, "events.ndjson")) do
      {:ok, text} -> length(:binary.matches(text, ~s("event":"#{type}")))
      _ -> 0
    end
  end
end
