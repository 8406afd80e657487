defmodule Condukt.Netns.SidecarIdleMemoryTest do
  # What an idle keep-alive TLS connection holds, by the proxy's own
  # accounting (SIGUSR1, docs/proxy.md "Signals", "Idle connections" and
  # "Memory of an idle connection"): no input buffer of the pool, nothing
  # queued, TLS ciphertext buffers (OpenSSL's memory BIOs) trimmed after
  # the exchange, also after a response far larger than the bound; and,
  # once idle for --idle-release-ms, no upstream connection at all, the
  # next request on the connection connecting again. Counts, not timings:
  # RSS per connection is the benchmark's measure (bench/README.md).
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.{Cmd, Tier}
  alias Condukt.Test.Netns.{ControlPeer, RawHttp, Sidecar}

  # CE_TLSCONN_BIO_KEEP (c_src/tls/tlsconn.h): an empty BIO with more room
  # than this is swapped for a fresh one at the end of an exchange.
  @bio_keep 32 * 1024
  @small 20
  @large 8
  @large_size 512 * 1024
  # Long enough for the counts taken before it (a few connections made on
  # a busy machine), short enough to wait for.
  @release_ms 5_000

  setup_all do
    tb = Testbed.start(big_size: 1024 * 1024)
    www = Path.join([tb.dir, "www", "allowed.test"])
    File.write!(Path.join(www, "1k.bin"), :binary.copy("x", 1023) <> "\n")
    File.write!(Path.join(www, "512k.bin"), :binary.copy("y", @large_size))

    sc =
      Sidecar.start(tb, [rules: [allow: ["allowed.test"]], default: :deny],
        extra_args: ["--idle-release-ms", "#{@release_ms}"]
      )

    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  setup %{sc: sc} do
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> {:deny, "no decider here"} end)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  test "idle keep-alive connections hold no pool buffer, nothing queued, trimmed TLS buffers, then no upstream",
       %{tb: tb, sc: sc} do
    assert %{"connections" => 0, "input" => 0, "queued" => 0, "tls" => 0, "upstreams" => 0} = Sidecar.buffer_stats(sc)

    small = hold(tb, sc, "https://allowed.test/1k.bin", @small)
    s1 = Sidecar.buffer_stats(sc)

    assert %{"connections" => @small, "input" => 0, "queued" => 0, "h2_streams" => 0, "held" => 0} = s1,
           inspect(s1)

    # Before --idle-release-ms each keeps its upstream; after a 1 KiB
    # exchange, the workspace's and the upstream's TLS connections keep
    # some ciphertext room each (a record or two), never the bound's worth.
    assert s1["upstreams"] > 0 and s1["upstreams"] <= @small, inspect(s1)
    assert s1["tls"] > 0, inspect(s1)
    assert s1["tls"] <= @small * 16 * 1024, "#{div(s1["tls"], @small)} bytes of TLS room per idle connection"

    # Then every upstream goes, and the TLS buffers' room with it; the
    # workspace's connections stay.
    r1 = released(sc, @small)
    assert r1["tls"] == 0, inspect({s1, r1})

    # A response of 512 KiB grows the BIOs it passes through (the
    # upstream's input, the workspace's output) far past the bound, 64 KiB
    # or more each; the end of the exchange swaps every empty one above the
    # bound for a fresh one, so what is left is the other two BIOs' room
    # (heads) and less than the bound each.
    large = hold(tb, sc, "https://allowed.test/512k.bin", @large)
    s2 = Sidecar.buffer_stats(sc)

    assert %{"connections" => n, "input" => 0, "queued" => 0, "held" => 0} = s2
    assert n == @small + @large, inspect(s2)
    grown = s2["tls"] - r1["tls"]
    assert grown <= @large * 2 * @bio_keep, "#{div(grown, @large)} bytes of TLS room per idle connection after 512 KiB"
    assert %{"tls" => 0} = released(sc, @small + @large)

    Cmd.kill([small, large])
    :ok = Cmd.poll(fn -> Sidecar.buffer_stats(sc)["connections"] == 0 end, 15_000, 200)
    assert %{"connections" => 0, "input" => 0, "queued" => 0, "tls" => 0, "upstreams" => 0} = Sidecar.buffer_stats(sc)
  end

  test "a keep-alive connection after its upstream was released: the next request is evaluated, reported and connects again",
       %{tb: tb, sc: sc} do
    script = """
    import http.client, json, os, ssl, sys, time
    ctx = ssl.create_default_context(cafile=sys.argv[1])
    c = http.client.HTTPSConnection("allowed.test", 443, context=ctx, timeout=30)
    def get(q):
        c.request("GET", "/1k.bin?" + q)
        r = c.getresponse()
        body = r.read()
        print(json.dumps({"status": r.status, "len": len(body), "port": c.sock.getsockname()[1]}), flush=True)
    get(sys.argv[2])
    deadline = time.time() + 60
    while not os.path.exists(sys.argv[4]) and time.time() < deadline:
        time.sleep(0.05)
    get(sys.argv[3])
    """

    [q1, q2] = for _ <- 1..2, do: "t=#{System.unique_integer([:positive])}"
    log = Path.join(tb.logs.dir, "again-#{System.unique_integer([:positive])}.log")
    go = log <> ".go"
    argv = [Tier.tool!("python3"), "-c", script, sc.ca_cert, q1, q2, go]
    pid = Testbed.spawn_in(tb, :pod, argv, log: log)
    on_exit(fn -> Cmd.kill([pid]) end)

    :ok = Cmd.poll(fn -> length(lines(log)) == 1 end, 30_000, 100)
    assert ~w(request_opened request_allowed request_closed) == Enum.map(RawHttp.events_for(sc, q1), & &1["event"])
    # The connection rests: open, with no upstream.
    released(sc, 1)

    File.write!(go, "")
    :ok = Cmd.poll(fn -> length(lines(log)) == 2 end, 30_000, 100)
    [one, two] = lines(log)
    assert one["status"] == 200 and two["status"] == 200, inspect({one, two})
    assert one["len"] == 1024 and two["len"] == 1024
    assert one["port"] == two["port"], "the same workspace connection"
    assert ~w(request_opened request_allowed request_closed) == Enum.map(RawHttp.events_for(sc, q2), & &1["event"])

    # The origin (nginx) saw two upstream connections, the second one
    # resuming the first one's TLS session.
    :ok = Cmd.poll(fn -> logged(tb, q2) != [] end, 10_000, 100)
    [first] = logged(tb, q1)
    [again] = logged(tb, q2)
    assert first["connection"] != again["connection"], inspect({first, again})
    assert again["tls_reused"] == "r", inspect(again)

    Cmd.kill([pid])
    :ok = Cmd.poll(fn -> Sidecar.buffer_stats(sc)["connections"] == 0 end, 15_000, 200)
  end

  # Waits until the n connections hold no upstream connection (their
  # --idle-release-ms passed) and nothing else; returns the counts.
  defp released(sc, n) do
    :ok = Cmd.poll(fn -> Sidecar.buffer_stats(sc)["upstreams"] == 0 end, @release_ms + 15_000, 200)
    s = Sidecar.buffer_stats(sc)

    assert %{"connections" => ^n, "upstreams" => 0, "input" => 0, "queued" => 0, "held" => 0} = s, inspect(s)
    s
  end

  defp logged(tb, q), do: Enum.filter(Testbed.access_log(tb), &String.contains?(&1["uri"] || "", q))

  defp lines(log) do
    log
    |> File.read!()
    |> String.split("\n", trim: true)
    |> Enum.filter(&String.starts_with?(&1, "{"))
    |> Enum.map(&Condukt.JSON.decode!/1)
  end

  # Opens n keep-alive connections through the proxy, one GET of `url`
  # each, and leaves them open; returns the client's pid.
  defp hold(tb, sc, url, n) do
    {pid, opened, failed} = Client.idle(tb, sc.ca_cert, url, n)
    on_exit(fn -> Cmd.kill([pid]) end)
    assert {opened, failed} == {n, 0}
    pid
  end
end
