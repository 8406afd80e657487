defmodule Condukt.Netns.SidecarH2IdleReleaseTest do
  # An HTTP/2 workspace connection at rest (no stream left, no byte read
  # from the workspace or an upstream for --idle-release-ms) releases its
  # upstream connections and its empty TLS ciphertext buffers; the
  # workspace's connection stays, with no event, and its next stream
  # connects again on the usual path, resumed (docs/proxy.md "Idle
  # connections", docs/http2.md). A stream that exists (waiting for its
  # decision, or its response unread) keeps the upstream. Real h2 clients
  # in the pod (python3-h2: clients/idle.py h2, clients/h2_raw.py "rest"),
  # nginx speaking h2 on 443 (its access log names each request's
  # connection and whether its TLS session was resumed), an HTTP/1.1-only
  # origin (8091) and an h2-only one (8093). Every test gets its own proxy
  # (the release delay is a flag) with its debug trace, stopped at the end
  # of the test: it must drain cleanly and without a sanitizer report.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.Tier
  alias Condukt.Test.Netns.{ControlPeer, RawHttp, Sidecar}

  def decider(_ctx, _req), do: :deny

  @policy [rules: [allow: ~w(allowed.test), decide: &__MODULE__.decider/2], default: :deny]

  # servers/scripted.py speaks HTTP/1.1 only (no ALPN) on 8091;
  # servers/h2_origin.py speaks h2 only on 8093; nginx both on 443.
  @h1_only 8091
  @h2_only 8093
  @big 20 * 1024 * 1024
  @large_size 512 * 1024
  # The proxy's trace line for each upstream connection (slot) a rested
  # connection releases.
  @released ~r/^h2: idle: upstream connection \d released$/

  setup_all do
    tb = Testbed.start(big_size: @big)
    www = Path.join(tb.dir, "www")
    File.write!(Path.join([www, "allowed.test", "1k.bin"]), :binary.copy("x", 1023) <> "\n")
    File.write!(Path.join([www, "allowed.test", "512k.bin"]), :binary.copy("y", @large_size))
    File.write!(Path.join([www, "decide.test", "hold.txt"]), "held\n")

    Testbed.start_origins(tb)
    %{tb: tb}
  end

  # One proxy per test: @tag proxy_args: [flags] (default: the debug trace
  # and the default --idle-release-ms, 500 ms).
  setup %{tb: tb} = ctx do
    args = Map.get(ctx, :proxy_args, ["--verbose"])
    sc = Sidecar.start(tb, @policy, ports: [443, @h1_only, @h2_only], extra_args: args)
    on_exit(fn -> Sidecar.stop(sc) end)

    {:ok, peer} = ControlPeer.start_link(sc, self(), &decide/1)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    %{sc: sc, peer: peer}
  end

  # decide.test asks the test's decider: a path with "hold" is left to the
  # test (ControlPeer.reply/3), anything else is allowed at once.
  defp decide(req) do
    if String.contains?(req["path"] || "", "hold"), do: :ignore, else: {:allow, false}
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  @tag proxy_args: ["--idle-release-ms", "5000"]
  test "20 idle h2 connections release their upstreams and their TLS room; the connections stay", %{tb: tb, sc: sc} do
    assert %{"connections" => 0, "upstreams" => 0, "tls" => 0} = Sidecar.buffer_stats(sc)

    # One 1 KiB GET each over h2 with nginx picking h2: one upstream
    # connection each (the pre-connected one), and some TLS room, until
    # --idle-release-ms (5 s, long enough for these counts).
    small = hold(tb, sc, "https://allowed.test/1k.bin", 20)
    s1 = Sidecar.buffer_stats(sc)
    assert %{"connections" => 20, "upstreams" => 20, "input" => 0, "h2_streams" => 0, "held" => 0} = s1, inspect(s1)
    assert s1["tls"] > 0, inspect(s1)

    # Then every upstream goes, with every TLS buffer's room; the
    # workspace's connections stay.
    r1 = released(sc, 20)
    assert %{"tls" => 0, "h2_streams" => 0} = r1, inspect({s1, r1})

    # A 512 KiB response grows the workspace's output BIO (never trimmed on
    # an h2 connection between streams): the release frees it too.
    large = hold(tb, sc, "https://allowed.test/512k.bin", 4)
    s2 = Sidecar.buffer_stats(sc)
    assert %{"connections" => 24, "upstreams" => 4} = s2, inspect(s2)
    assert s2["tls"] > 0, inspect(s2)
    assert %{"tls" => 0, "h2_streams" => 0} = released(sc, 24)

    Cmd.kill([small, large])
    :ok = Cmd.poll(fn -> Sidecar.buffer_stats(sc)["connections"] == 0 end, 15_000, 200)
    assert %{"connections" => 0, "upstreams" => 0, "tls" => 0} = Sidecar.buffer_stats(sc)
  end

  test "an idle h2 connection releases its upstream; its next stream connects again, resumed", %{tb: tb, sc: sc} do
    [q1, q2] = for _ <- 1..2, do: tag()

    {log, go} = rest(tb, sc, %{host: "allowed.test", mode: "rest", path: "/1k.bin?#{q1}", path2: "/1k.bin?#{q2}"})

    [first] = await_lines(log, 1)
    assert %{"status" => 200, "ended" => true, "size" => 1024} = first["first"], inspect(first)
    events = RawHttp.events_for(sc, q1)
    assert ~w(request_opened request_allowed request_closed) == Enum.map(events, & &1["event"])
    id = hd(events)["connection_id"]

    # The connection rests: no upstream, no TLS room, the connection open.
    released_at = await_release(sc, id)
    assert %{"connections" => 1, "upstreams" => 0, "tls" => 0, "held" => 0, "input" => 0} = Sidecar.buffer_stats(sc)

    File.write!(go, "")
    [_, out] = await_lines(log, 2)
    assert %{"status" => 200, "ended" => true, "size" => 1024} = out["streams"]["3"], inspect(out)
    assert out["goaway"] == nil and out["closed"] == nil, inspect(out)
    assert out["port"] == out["port2"] and out["port"] == first["port"]

    # The next stream's events are those of any stream, on the same
    # workspace connection.
    events = RawHttp.events_for(sc, q2)
    assert ~w(request_opened request_allowed request_closed) == Enum.map(events, & &1["event"])
    closed = List.last(events)
    assert %{"stream_id" => 3, "status" => 200, "connection_id" => ^id, "http_version" => "HTTP/2"} = closed

    # The release itself said nothing: the connection's events are its two
    # streams'.
    mine = Enum.filter(Sidecar.stdout_events(sc), &(&1["connection_id"] == id))

    assert Enum.map(mine, &{&1["event"], &1["stream_id"]}) ==
             for(s <- [1, 3], e <- ~w(request_opened request_allowed request_closed), do: {e, s}),
           inspect(mine)

    # It connected again (the trace: a verified TLS handshake, an h2
    # session), over h2 (nginx), on another upstream connection that
    # resumed the first one's TLS session.
    after_release!(sc, id, released_at, [
      ~r/^\[upstream handshaking\] -> ready$/,
      ~r/^h2: upstream connection \d ready \(h2\)$/
    ])

    [one] = logged(tb, q1, 1)
    [two] = logged(tb, q2, 1)
    assert one["protocol"] == "HTTP/2.0" and two["protocol"] == "HTTP/2.0", inspect({one, two})
    assert one["connection"] != two["connection"], inspect({one, two})
    assert two["tls_reused"] == "r", inspect(two)
  end

  for {label, port, body} <- [{"HTTP/1.1-only", @h1_only, "scripted /"}, {"h2-only", @h2_only, "h2 origin /"}] do
    test "after the release over an #{label} upstream the next stream connects again", %{tb: tb, sc: sc} do
      [q1, q2] = for _ <- 1..2, do: tag()
      spec = %{host: "allowed.test", port: unquote(port), mode: "rest", path: "/one?#{q1}", path2: "/two?#{q2}"}
      {log, go} = rest(tb, sc, spec)

      [first] = await_lines(log, 1)
      assert %{"status" => 200, "ended" => true, "body" => unquote(body) <> "one" <> _} = first["first"], inspect(first)
      id = hd(RawHttp.events_for(sc, q1))["connection_id"]

      released_at = await_release(sc, id)
      assert %{"connections" => 1, "upstreams" => 0, "tls" => 0} = Sidecar.buffer_stats(sc)

      File.write!(go, "")
      [_, out] = await_lines(log, 2)

      assert %{"status" => 200, "ended" => true, "body" => unquote(body) <> "two" <> _} = out["streams"]["3"],
             inspect(out)

      assert out["goaway"] == nil and out["closed"] == nil, inspect(out)

      events = RawHttp.events_for(sc, q2)
      assert ~w(request_opened request_allowed request_closed) == Enum.map(events, & &1["event"])
      assert %{"stream_id" => 3, "connection_id" => ^id} = List.last(events)

      # It connected again: a verified TLS handshake, and over h2 an h2
      # session.
      ready = if unquote(port) == @h2_only, do: [~r/^h2: upstream connection \d ready \(h2\)$/], else: []
      after_release!(sc, id, released_at, [~r/^\[upstream handshaking\] -> ready$/ | ready])
    end
  end

  test "an h2 connection over six HTTP/1.1 upstream connections (the pool) releases them all", %{tb: tb, sc: sc} do
    key = "k#{System.unique_integer([:positive])}"
    q = tag()
    # Eight slow streams at once to the HTTP/1.1-only origin: the pool opens
    # its six connections (slot 0 and five of its own).
    paths = for i <- 1..8, do: "/slow?key=#{key}&i=#{i}"
    spec = %{host: "allowed.test", port: @h1_only, mode: "rest", paths: paths, path2: "/after?#{q}"}
    {log, go} = rest(tb, sc, spec)

    [first] = await_lines(log, 1)

    for i <- 0..7 do
      assert %{"status" => 200, "ended" => true, "body" => "slow"} = first["streams"]["#{1 + 2 * i}"], inspect(first)
    end

    id = hd(RawHttp.events_for(sc, "key=#{key}&i=1"))["connection_id"]
    released_at = await_release(sc, id)
    slots = fn -> for {_, m} <- Sidecar.h2_trace(sc, id), m =~ @released, do: m |> String.split() |> Enum.at(4) end
    _ = Cmd.poll(fn -> length(slots.()) >= 6 end, 5_000, 100)
    assert Enum.sort(slots.()) == ~w(0 1 2 3 4 5), inspect(Sidecar.h2_trace(sc, id))
    assert %{"connections" => 1, "upstreams" => 0, "tls" => 0, "held" => 0} = Sidecar.buffer_stats(sc)

    File.write!(go, "")
    [_, out] = await_lines(log, 2)
    assert %{"status" => 200, "ended" => true, "body" => "scripted /after\n"} = out["streams"]["17"], inspect(out)
    events = RawHttp.events_for(sc, q)
    assert ~w(request_opened request_allowed request_closed) == Enum.map(events, & &1["event"])
    assert %{"stream_id" => 17, "connection_id" => ^id} = List.last(events)
    after_release!(sc, id, released_at, [~r/^\[upstream handshaking\] -> ready$/])
  end

  test "a stream waiting for its decision keeps the upstream", %{tb: tb, sc: sc, peer: peer} do
    q = tag()
    # Stream 3 is allowed at once and connects; stream 1 waits for the test
    # to answer, far longer than --idle-release-ms after stream 3's end.
    task =
      Task.async(fn ->
        h2_raw(tb, sc, %{host: "decide.test", mode: "paths", paths: ["/hold.txt", "/index.txt"], query: q})
      end)

    assert_receive {:egress_decision_request, %{"id" => ask, "request" => %{"path" => "/hold.txt"}}}, 10_000

    [_] =
      RawHttp.await_events(
        sc,
        1,
        &(&1["query"] == q and &1["path"] == "/index.txt" and &1["event"] == "request_closed")
      )

    samples = for _ <- 1..10, do: Process.sleep(200) && Sidecar.buffer_stats(sc)
    assert Enum.all?(samples, &(&1["upstreams"] >= 1)), inspect(samples)
    assert release_lines(sc) == [], "released while a stream waited for its decision"

    :ok = ControlPeer.reply(peer, ask, :allow)
    out = Task.await(task, 30_000)
    assert %{"status" => 200, "ended" => true, "body" => "held\n"} = out["streams"]["1"], inspect(out)
    assert %{"status" => 200, "ended" => true, "body" => "hello from decide.test\n"} = out["streams"]["3"], inspect(out)
  end

  test "a slow reader keeps the upstream while its stream is open; its response arrives intact", %{tb: tb, sc: sc} do
    q = tag()

    task =
      Task.async(fn ->
        h2_raw(tb, sc, %{host: "allowed.test", mode: "slow_reader", path: "/big.bin", seconds: 3, query: q})
      end)

    # The reader reads nothing for 3 s: nothing comes from the workspace or
    # (held by the windows) from nginx for far longer than
    # --idle-release-ms, but the stream is open.
    Process.sleep(500)
    samples = for _ <- 1..10, do: Process.sleep(200) && Sidecar.buffer_stats(sc)
    before = release_lines(sc)
    out = Task.await(task, 60_000)

    assert Enum.all?(samples, &(&1["upstreams"] >= 1)), inspect(samples)
    # The stall was seen: the response waited in the proxy.
    assert Enum.any?(samples, &(&1["queued"] > 0)), inspect(samples)
    assert before == [], "released while a stream was open"
    assert %{"status" => 200, "ended" => true, "size" => @big} = out["streams"]["1"], inspect(out)
    assert out["streams"]["1"]["sha256"] == tb.big_file.sha256
  end

  @tag proxy_args: ["--idle-release-ms", "0", "--verbose"]
  test "--idle-release-ms 0 keeps an h2 connection's upstream", %{tb: tb, sc: sc} do
    [q1, q2] = for _ <- 1..2, do: tag()
    {log, go} = rest(tb, sc, %{host: "allowed.test", mode: "rest", path: "/1k.bin?#{q1}", path2: "/1k.bin?#{q2}"})
    [first] = await_lines(log, 1)
    assert %{"status" => 200} = first["first"], inspect(first)

    Process.sleep(2_000)
    assert %{"connections" => 1, "upstreams" => 1} = Sidecar.buffer_stats(sc)
    File.write!(go, "")
    [_, out] = await_lines(log, 2)
    assert %{"status" => 200, "ended" => true} = out["streams"]["3"], inspect(out)

    assert release_lines(sc) == []
    [one] = logged(tb, q1, 1)
    [two] = logged(tb, q2, 1)
    assert one["connection"] == two["connection"], inspect({one, two})
  end

  test "streams that come about when the release is due: every one is served", %{tb: tb, sc: sc} do
    q = tag()
    # 30 rests around --idle-release-ms (450 to 550 ms): the next stream
    # finds the upstream, or comes after the release and connects again;
    # none may fail.
    pauses = for i <- 0..29, do: 0.45 + rem(i, 11) * 0.01

    out = h2_raw(tb, sc, %{host: "allowed.test", mode: "rest", path: "/1k.bin", pauses: pauses, query: q})

    for i <- 0..30 do
      assert %{"status" => 200, "ended" => true, "size" => 1024} = out["streams"]["#{1 + 2 * i}"], inspect(out)
    end

    assert out["goaway"] == nil and out["closed"] == nil
    _ = RawHttp.await_events(sc, 31, &(&1["query"] == q and &1["event"] == "request_closed"))

    assert Enum.filter(
             Sidecar.stdout_events(sc),
             &(&1["query"] == q and &1["event"] in ~w(request_failed request_denied))
           ) == []

    # The rests past --idle-release-ms did release (the proxy's clock runs
    # from its last read, before the client's pause began).
    assert release_lines(sc) != []
  end

  # The idle timeout runs from the last byte read, release or not: after
  # the release only what is left of it runs (2,000 - 500 ms here), and a
  # release that would come after it (release >= idle) never comes.
  @tag proxy_args: ["--verbose", "--idle-timeout-ms", "2000"]
  test "after the release the idle timeout still ends the connection, on time", %{tb: tb, sc: sc} do
    q = tag()
    {log, _go} = rest(tb, sc, %{host: "allowed.test", mode: "rest", path: "/1k.bin?#{q}", path2: "/1k.bin"})
    [first] = await_lines(log, 1)
    assert %{"status" => 200, "ended" => true} = first["first"], inspect(first)
    id = hd(RawHttp.events_for(sc, q))["connection_id"]

    released_at = await_release(sc, id)
    ended_at = await_end(sc, id)
    left = ended_at - released_at
    assert left > 1.2 and left < 1.8, "the connection ended #{left} s after its release (1.5 s expected)"
    assert %{"connections" => 0} = Sidecar.buffer_stats(sc)
  end

  @tag proxy_args: ["--verbose", "--idle-timeout-ms", "1500", "--idle-release-ms", "3000"]
  test "a release that would come after the idle timeout never comes", %{tb: tb, sc: sc} do
    q = tag()
    {log, _go} = rest(tb, sc, %{host: "allowed.test", mode: "rest", path: "/1k.bin?#{q}", path2: "/1k.bin"})
    [_first] = await_lines(log, 1)
    id = hd(RawHttp.events_for(sc, q))["connection_id"]

    _ = await_end(sc, id)
    assert Sidecar.trace_at(Sidecar.h2_trace(sc, id), @released) == [], inspect(Sidecar.h2_trace(sc, id))
  end

  ## Helpers

  defp h2_raw(tb, sc, spec), do: Client.h2_raw(tb, sc.ca_cert, spec)

  # Starts h2_raw.py "rest" in the pod; its first pause lasts until the
  # file `go` exists. Returns {log, go}.
  defp rest(tb, sc, spec) do
    log = Path.join(tb.logs.dir, "rest-#{System.unique_integer([:positive])}.log")
    go = log <> ".go"
    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "h2_raw.py"), Condukt.JSON.encode!(Map.put(spec, :go, go))]
    pid = Testbed.spawn_in(tb, :pod, argv, log: log, ca: sc.ca_cert)
    on_exit(fn -> Cmd.kill([pid]) end)
    {log, go}
  end

  # The JSON lines of `log`, once there are `n`.
  defp await_lines(log, n) do
    case Cmd.poll(fn -> length(lines(log)) >= n end, 30_000, 100) do
      :ok -> lines(log)
      {:error, :timeout} -> flunk("fewer than #{n} JSON lines in #{log}:\n" <> File.read!(log))
    end
  end

  defp lines(log) do
    case File.read(log) do
      {:ok, text} ->
        text
        |> String.split("\n", trim: true)
        |> Enum.filter(&String.starts_with?(&1, "{"))
        |> Enum.map(&Condukt.JSON.decode!/1)

      {:error, _} ->
        []
    end
  end

  # Waits for the release of workspace connection `id` (its trace line);
  # returns its time.
  defp await_release(sc, id) do
    case Cmd.poll(fn -> Sidecar.trace_at(Sidecar.h2_trace(sc, id), @released) != [] end, 10_000, 100) do
      :ok ->
        hd(Sidecar.trace_at(Sidecar.h2_trace(sc, id), @released))

      {:error, :timeout} ->
        flunk("no release within 10 s: #{inspect(Sidecar.buffer_stats(sc))}\n#{inspect(Sidecar.h2_trace(sc, id))}")
    end
  end

  # Waits for workspace connection `id` to end (its trace's abort: the
  # idle timeout's GOAWAY, then the close); returns its time.
  defp await_end(sc, id) do
    ended = fn -> Sidecar.trace_at(Sidecar.trace(sc, id), ~r/^\[h2\] abort$/) end

    case Cmd.poll(fn -> ended.() != [] end, 10_000, 100) do
      :ok -> hd(ended.())
      {:error, :timeout} -> flunk("the connection did not end within 10 s:\n#{inspect(Sidecar.trace(sc, id))}")
    end
  end

  # Each of `patterns` matches a trace line of connection `id` after the
  # time `t` (its release), in that order.
  defp after_release!(sc, id, t, patterns) do
    trace = Sidecar.trace(sc, id)

    Enum.reduce(patterns, t, fn re, t ->
      case Enum.filter(Sidecar.trace_at(trace, re), &(&1 > t)) do
        [at | _] -> at
        [] -> flunk("no #{inspect(re)} after #{t} in the trace:\n" <> Enum.map_join(trace, "\n", &inspect/1))
      end
    end)
  end

  defp release_lines(sc), do: Regex.scan(~r/h2: idle: upstream connection \d released/, Sidecar.stderr(sc))

  # Waits until the n connections hold no upstream connection (their
  # --idle-release-ms passed) and nothing else; returns the counts.
  defp released(sc, n) do
    case Cmd.poll(fn -> Sidecar.buffer_stats(sc)["upstreams"] == 0 end, 20_000, 200) do
      :ok -> :ok
      {:error, :timeout} -> flunk("the upstreams were not released within 20 s: #{inspect(Sidecar.buffer_stats(sc))}")
    end

    s = Sidecar.buffer_stats(sc)
    assert %{"connections" => ^n, "upstreams" => 0, "input" => 0, "queued" => 0, "held" => 0} = s, inspect(s)
    s
  end

  # nginx's entries for requests whose URI contains `q`, once there are `n`
  # (it logs a request when it ends).
  defp logged(tb, q, n) do
    get = fn -> Enum.filter(Testbed.access_log(tb), &String.contains?(&1["uri"] || "", q)) end
    _ = Cmd.poll(fn -> length(get.()) >= n end, 10_000, 100)
    get.()
  end

  # Opens n h2 connections through the proxy (clients/idle.py h2), one GET
  # of `url` each, and leaves them open; returns the client's pid.
  defp hold(tb, sc, url, n) do
    {pid, opened, failed} = Client.idle(tb, sc.ca_cert, url, n, "h2")
    on_exit(fn -> Cmd.kill([pid]) end)
    assert {opened, failed} == {n, 0}
    pid
  end
end
