defmodule Bench.Measure do
  @moduledoc false
  # One measurement each; every function returns a map of numbers (or
  # %{error: text}). Clients run in the pod, pinned to the load CPU, and
  # reach https://allowed.test/ through whatever interceptor is in place.

  alias Condukt.Dev.Netns.Cmd

  @h2load "/usr/bin/h2load"
  # 16 requests in flight in both protocols: HTTP/1.1 over 16 connections,
  # h2 over 4 connections of 4 streams each.
  @h1_conns 16
  @h2_conns 4
  @h2_streams 4

  def concurrency, do: %{h1_conns: @h1_conns, h2_conns: @h2_conns, h2_streams: @h2_streams}

  @doc "Keep-alive requests/s of the 1 KiB body, :h1 or :h2, for `secs`."
  def keepalive(tb, url, proto, secs) do
    args =
      case proto do
        :h1 -> ["--h1", "-c", "#{@h1_conns}"]
        :h2 -> ["-c", "#{@h2_conns}", "-m", "#{@h2_streams}"]
      end

    h2load(tb, args ++ ["-t", "1", "-D", "#{secs}", "--warm-up-time", "1", url], secs)
  end

  @doc """
  New TLS connections/s: HTTP/1.1, one request per connection (the request
  says `Connection: close`; h2load opens a new connection for the next).
  h2load's duration mode does not reconnect, so this runs a fixed number of
  requests: a short calibration run (also the warm-up) sizes the real run
  to last about `secs`.
  """
  def new_conns(tb, url, secs) do
    run = fn n ->
      h2load(tb, ["--h1", "-c", "#{@h1_conns}", "-t", "1", "-H", "connection: close", "-n", "#{n}", url], 120)
    end

    case run.(200) do
      %{rps: rate} when is_number(rate) and rate > 0 -> run.(min(max(round(rate * secs), 200), 100_000))
      other -> other
    end
  end

  defp h2load(tb, args, secs) do
    {out, status} = Bench.Os.client(tb, [@h2load | args], timeout: (secs + 30) * 1000)
    parse_h2load(out, status)
  end

  def parse_h2load(out, status) do
    rps = capture(out, ~r/finished in [\d.]+m?s, ([\d.]+) req\/s/)
    succeeded = capture(out, ~r/requests: .* (\d+) succeeded/)
    failed = capture(out, ~r/requests: .* (\d+) failed/)
    errored = capture(out, ~r/requests: .* (\d+) errored/)

    proto =
      case Regex.run(~r/Application protocol: (\S+)/, out),
        do:
          (
            [_, p] -> p
            _ -> nil
          )

    cond do
      rps == nil or status != 0 ->
        %{error: "h2load exit #{status}: " <> String.slice(out, -600, 600)}

      succeeded == 0 ->
        %{error: "no request succeeded (protocol #{proto}): " <> String.slice(out, -600, 600), protocol: proto}

      true ->
        %{rps: rps, succeeded: succeeded, failed: failed, errored: errored, protocol: proto}
    end
  end

  @doc "Download of `url` (the 1 GiB body, or a range of it) to /dev/null; MB/s (10^6)."
  def bulk(tb, url, ca, range) do
    range_args = if range, do: ["--range", "0-#{range - 1}"], else: []

    {out, status} =
      Bench.Os.client(
        tb,
        [
          "/usr/bin/curl",
          "-sS",
          "-o",
          "/dev/null",
          "--max-time",
          "300",
          "-w",
          "%{http_code} %{size_download} %{speed_download}"
        ] ++
          range_args ++ [url],
        ca: ca,
        timeout: 310_000
      )

    case Regex.run(~r/(\d{3}) (\d+) ([\d.]+)\s*$/, out) do
      [_, code, size, speed] when status == 0 and code in ["200", "206"] ->
        # curl's speed_download is bytes per second over the whole transfer.
        %{mb_s: parse_num(speed) / 1.0e6, bytes: String.to_integer(size)}

      _ ->
        %{error: "curl exit #{status}: #{String.slice(out, -400, 400)}"}
    end
  end

  @doc "Sequential keep-alive requests for `secs`: p50/p99 in microseconds."
  def latency(tb, url, ca, secs) do
    script = Path.join(tb.bin_dir, "latency.py")
    {out, status} = Bench.Os.client(tb, ["/usr/bin/python3", script, url, "#{secs}", ca], timeout: (secs + 30) * 1000)

    with 0 <- status,
         line when is_binary(line) <- out |> String.split("\n", trim: true) |> List.last(),
         {:ok, map} <- decode(line),
         true <- is_number(map["p50_us"]) do
      %{p50_us: map["p50_us"], p99_us: map["p99_us"], n: map["n"], errors: map["errors"]}
    else
      _ -> %{error: "latency.py exit #{status}: #{String.slice(out, -600, 600)}"}
    end
  end

  @doc """
  RSS of the interceptor's processes before and while `n` keep-alive TLS
  connections (each after one request) sit idle; KiB. `protocol` is the
  workspace's: "http/1.1", or "h2" (ALPN h2 only: an interceptor that
  does not offer it opens none).
  """
  def idle_rss(tb, ic, url, n, protocol \\ "http/1.1") do
    pids = Bench.Interceptor.pids(ic)
    before = Bench.Os.rss_kib(pids)
    log = Path.join(tb.dir, "logs/idle-#{System.unique_integer([:positive])}.log")
    script = Path.join(tb.bin_dir, "idle.py")

    client =
      Bench.Os.spawn_client(tb, ["/usr/bin/python3", script, url, "#{n}", ic.ca, "120", protocol], log, ca: ic.ca)

    try do
      case Cmd.poll(fn -> File.read!(log) =~ "ready" or not Cmd.alive?(client) end, 120_000, 200) do
        :ok -> :ok
        {:error, :timeout} -> :ok
      end

      text = File.read!(log)

      case Regex.run(~r/ready (\d+) (\d+)/, text) do
        [_, opened, failed] ->
          # Give the proxy a moment to finish its side (upstream reuse, buffers).
          Process.sleep(1_000)
          pids = Bench.Interceptor.pids(ic)
          held = Bench.Os.rss_kib(pids)
          opened = String.to_integer(opened)

          %{
            before_kib: before,
            held_kib: held,
            opened: opened,
            failed: String.to_integer(failed),
            per_conn_kib: if(opened > 0, do: (held - before) / opened, else: nil),
            processes: length(pids)
          }

        nil ->
          %{error: "idle.py: " <> String.slice(text, -600, 600)}
      end
    after
      Cmd.kill(Bench.Os.tree(client))
    end
  end

  @doc "Copies the Python clients next to the testbed's own (readable by any uid)."
  def install_clients(tb) do
    for f <- ~w(latency.py soak.py) do
      dst = Path.join(tb.bin_dir, f)
      File.cp!(Path.join([__DIR__, "..", "clients", f]), dst)
      File.chmod!(dst, 0o755)
    end

    :ok
  end

  defp decode(line) do
    {:ok, Condukt.JSON.decode!(line)}
  rescue
    _ -> :error
  end

  defp capture(out, re) do
    case Regex.run(re, out) do
      [_, v] -> parse_num(v)
      _ -> nil
    end
  end

  defp parse_num(v) do
    case Float.parse(v) do
      {f, _} -> if f == trunc(f) and not String.contains?(v, "."), do: trunc(f), else: f
      :error -> nil
    end
  end
end
