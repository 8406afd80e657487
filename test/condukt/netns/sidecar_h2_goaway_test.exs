defmodule Condukt.Netns.SidecarH2GoawayTest do
  # An h2 upstream that ends its connections with GOAWAY (docs/http2.md §6
  # "GOAWAY"): nginx with keepalive_requests 5 sends GOAWAY after every
  # fifth stream of a connection. The streams it accepted finish on the old
  # connection, the others and every new stream go to a new h2 connection:
  # the clients see only 200s, and nginx sees HTTP/2 for every request.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.Tier
  alias Condukt.Test.Netns.{ControlPeer, DnsServer, Sidecar}

  defp policy, do: [rules: [allow: ~w(allowed.test)], default: :deny]

  # servers/h2_origin.py (h2 only): its /goaway-once paths are refused by
  # a GOAWAY the first time they come.
  @h2_only 8093
  @connect_ms 4000

  setup_all do
    tb = Testbed.start()
    limit_nginx_requests!(tb, 5)
    {crt, key} = tb.pki.server
    py = Tier.tool!("python3")
    origin = Testbed.spawn_in(tb, :inet, [py, Path.join(tb.bin_dir, "h2_origin.py"), "#{@h2_only}", crt, key])
    :ok = Testbed.wait_listening(tb, :inet, tcp: ["0.0.0.0:#{@h2_only}"], pids: [origin])
    # allowed.test comes from a DNS server the tests control, not from the
    # sidecar's hosts file: a test moves it to another address.
    dns = DnsServer.start(tb, %{"allowed.test" => [tb.inet.v4, tb.inet.v6]})
    hosts = Regex.replace(~r/ allowed\.test(?= |$)/m, Testbed.hosts_file(tb), "")
    # A short connect timeout: it is also how long streams wait while every
    # upstream connection drains ("every slot draining" below). The debug
    # trace shows what the proxy did when ("memory of responses" below).
    sc =
      Sidecar.start(tb, policy(),
        ports: [443, @h2_only],
        hosts: hosts,
        extra_args: ["--connect-timeout-ms", "#{@connect_ms}", "--verbose"]
      )

    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc, dns: dns}
  end

  setup %{sc: sc} do
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> :allow end)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 5_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  # nginx ends an h2 connection with GOAWAY after `n` streams (as after
  # 1000 by default), and its access log names the connection of each
  # request. A reload: the new workers have the new configuration.
  defp limit_nginx_requests!(tb, n) do
    conf = Path.join([tb.dir, "nginx", "nginx.conf"])

    text =
      conf
      |> File.read!()
      |> String.replace("keepalive_timeout 30s;", "keepalive_timeout 30s;\n  keepalive_requests #{n};")
      |> String.replace(~s("protocol":"$server_protocol",), ~s("protocol":"$server_protocol","conn":"$connection",))

    assert text =~ "keepalive_requests #{n};" and text =~ ~s("conn":"$connection")
    File.write!(conf, text)
    {master, _} = Integer.parse(File.read!(Path.join([tb.dir, "nginx", "nginx.pid"])))
    old = children(master)
    assert old != []
    {_, 0} = System.cmd("kill", ["-HUP", "#{master}"])
    :ok = Cmd.poll(fn -> Enum.all?(old, &(not Cmd.alive?(&1))) and children(master) != [] end, 15_000)
  end

  defp children(pid) do
    case File.read("/proc/#{pid}/task/#{pid}/children") do
      {:ok, text} -> text |> String.split() |> Enum.map(&String.to_integer/1)
      _ -> []
    end
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  # Every event of the requests whose query is q, until `n` closing ones.
  defp events_for(q, n \\ 1, acc \\ []) do
    receive do
      {:egress_event, %{"query" => ^q} = ev} ->
        n = if ev["event"] in ~w(request_closed request_failed request_denied), do: n - 1, else: n
        if n == 0, do: Enum.reverse([ev | acc]), else: events_for(q, n, [ev | acc])
    after
      15_000 -> flunk("events for #{q}: #{inspect(Enum.reverse(acc))}")
    end
  end

  # nginx's entries for requests whose URI contains `q` (the log is
  # written when a request ends: polled until `n` are there).
  defp nginx_entries(tb, q, n) do
    get = fn -> Enum.filter(Testbed.access_log(tb), &String.contains?(&1["uri"] || "", q)) end
    Cmd.poll(fn -> length(get.()) >= n end, 10_000)
    get.()
  end

  # Events until `n` closing events for requests whose query contains q.
  defp closing_events(q, n, acc \\ []) do
    if length(acc) == n do
      Enum.reverse(acc)
    else
      receive do
        {:egress_event, %{"event" => e, "query" => query} = ev}
        when e in ~w(request_closed request_failed request_denied) ->
          if String.contains?(query || "", q), do: closing_events(q, n, [ev | acc]), else: closing_events(q, n, acc)
      after
        15_000 -> flunk("#{length(acc)} of #{n} closing events for #{q}: #{inspect(acc)}")
      end
    end
  end

  defp h2_raw(tb, sc, spec), do: Client.h2_raw(tb, sc.ca_cert, spec)

  defp h2load(tb, sc, args), do: Client.h2load(tb, sc.ca_cert, args)

  test "h2load, 50 streams one after the other on one connection: all 200, all h2 upstream", %{tb: tb, sc: sc} do
    q = tag()
    out = h2load(tb, sc, ["-n", "50", "-c", "1", "-m", "1", "https://allowed.test/?#{q}"])
    assert out =~ "requests: 50 total, 50 started, 50 done, 50 succeeded, 0 failed", out
    assert out =~ "status codes: 50 2xx", out

    entries = nginx_entries(tb, q, 50)
    assert length(entries) == 50
    assert Enum.all?(entries, &(&1["protocol"] == "HTTP/2.0" and &1["status"] == "200")), inspect(entries)
    # Five streams per nginx connection: ten connections, one after the other.
    conns = entries |> Enum.frequencies_by(& &1["conn"]) |> Map.values()
    assert Enum.sort(conns) == List.duplicate(5, 10), inspect(conns)

    events = closing_events(q, 50)
    assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)
  end

  # curl closes its connection once it has a response's content-length
  # of body; an origin whose end of the stream comes later (nginx
  # relaying an unbuffered upstream does) finds the workspace gone: the
  # request was served all the same, and its event says so.
  test "a client that closes once it has the whole response, before the origin ends the stream: request_closed",
       %{tb: tb, sc: sc} do
    q = "size=440&ms=10000&" <> tag()
    r = Client.run(tb, :curl, "https://allowed.test:#{@h2_only}/late-end?#{q}", ca: sc.ca_cert, http: :h2)
    assert r.ok and r.status == 200 and byte_size(r.body) == 440, inspect(r)
    events = events_for(q)
    assert Enum.map(events, & &1["event"]) == ~w(request_opened request_allowed request_closed), inspect(events)
    # Ended by the workspace's close, not by the origin's end 10 s later.
    assert %{"status" => 200, "http_version" => "HTTP/2", "duration_us" => us} = List.last(events)
    assert us < 5_000_000, inspect(List.last(events))
  end

  test "h2load, 100 streams 10 at a time: the streams a GOAWAY refused are sent again, each once",
       %{tb: tb, sc: sc} do
    q = tag()
    out = h2load(tb, sc, ["-n", "100", "-c", "1", "-m", "10", "https://allowed.test/?#{q}"])
    assert out =~ "requests: 100 total, 100 started, 100 done, 100 succeeded, 0 failed", out
    assert out =~ "status codes: 100 2xx", out

    # Every request reached nginx once, over h2, at most 5 per connection.
    entries = nginx_entries(tb, q, 100)
    assert length(entries) == 100, inspect(length(entries))
    assert Enum.all?(entries, &(&1["protocol"] == "HTTP/2.0" and &1["status"] == "200"))
    assert entries |> Enum.frequencies_by(& &1["conn"]) |> Map.values() |> Enum.all?(&(&1 <= 5))

    events = closing_events(q, 100)
    assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)
  end

  test "h2load, 100 streams at once: every stream a GOAWAY refused waits for a new connection (no 503)",
       %{tb: tb, sc: sc} do
    q = tag()
    out = h2load(tb, sc, ["-n", "100", "-c", "1", "-m", "100", "https://allowed.test/?#{q}"])
    assert out =~ "requests: 100 total, 100 started, 100 done, 100 succeeded, 0 failed", out
    assert out =~ "status codes: 100 2xx", out

    entries = nginx_entries(tb, q, 100)
    assert length(entries) == 100, inspect(length(entries))
    assert Enum.all?(entries, &(&1["protocol"] == "HTTP/2.0" and &1["status"] == "200"))

    events = closing_events(q, 100)
    assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)
  end

  test "streams in flight at the GOAWAY finish on the old connection; the others go to a new one",
       %{tb: tb, sc: sc} do
    q = tag()
    # Eight streams at once, each answered after 1 s: nginx takes five and
    # sends GOAWAY on the fifth, while all five are still running.
    paths = for i <- 1..8, do: "/slow?ms=1000&i=#{i}&#{q}"
    out = h2_raw(tb, sc, %{host: "allowed.test", mode: "paths", paths: paths})
    assert out["goaway"] == nil, inspect(out)

    for i <- 1..8 do
      assert %{"status" => 200, "ended" => true, "body" => "slow\n"} = out["streams"]["#{2 * i - 1}"], inspect(out)
    end

    entries = nginx_entries(tb, q, 8)
    assert length(entries) == 8
    assert Enum.all?(entries, &(&1["protocol"] == "HTTP/2.0" and &1["status"] == "200")), inspect(entries)
    assert entries |> Enum.frequencies_by(& &1["conn"]) |> Map.values() |> Enum.sort() == [3, 5], inspect(entries)

    events = closing_events(q, 8)
    assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)
  end

  test "an HTTP/1.1 client's keep-alive requests: one workspace connection, a new h2 upstream after each GOAWAY",
       %{tb: tb, sc: sc} do
    q = tag()

    script = """
    import http.client, json, os, ssl
    ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    c = http.client.HTTPSConnection("allowed.test", 443, context=ctx)
    res, socks = [], set()
    for i in range(20):
        c.request("GET", "/?i=%d&#{q}" % i)
        r = c.getresponse()
        body = r.read().decode()
        socks.add(id(c.sock))
        res.append([r.status, r.will_close, body])
    print(json.dumps({"res": res, "socks": len(socks)}))
    """

    {out, status} = Testbed.exec_in(tb, :pod, [Tier.tool!("python3"), "-c", script], ca: sc.ca_cert, timeout: 60_000)
    assert status == 0, out
    got = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
    assert got["socks"] == 1, inspect(got)

    assert Enum.all?(got["res"], fn [st, close, body] -> st == 200 and close == false and body =~ "allowed.test" end),
           inspect(got)

    entries = nginx_entries(tb, q, 20)
    assert length(entries) == 20
    assert Enum.all?(entries, &(&1["protocol"] == "HTTP/2.0" and &1["status"] == "200")), inspect(entries)
    conns = entries |> Enum.frequencies_by(& &1["conn"]) |> Map.values()
    assert Enum.sort(conns) == List.duplicate(5, 4), inspect(conns)

    events = closing_events(q, 20)
    assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)
  end

  describe "a stream the GOAWAY refused (h2_origin.py /goaway-once)" do
    test "h2 workspace: sent again over a new connection, one request_allowed", %{tb: tb, sc: sc} do
      q = tag()
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h2_only, mode: "paths", paths: ["/goaway-once"], query: q})
      assert %{"status" => 200, "ended" => true} = st = out["streams"]["1"], inspect(out)
      assert st["body"] == "h2 origin /goaway-once?#{q} seen 2 body 0\n"
      events = events_for(q)
      assert Enum.map(events, & &1["event"]) == ~w(request_opened request_allowed request_closed), inspect(events)
    end

    test "h2 workspace: a refused stream whose body went is a 502 that says why", %{tb: tb, sc: sc} do
      q = tag()

      out =
        h2_raw(tb, sc, %{
          host: "allowed.test",
          port: @h2_only,
          mode: "uploads",
          paths: ["/goaway-once"],
          size: 1000,
          query: q
        })

      assert %{"status" => 502} = out["streams"]["1"], inspect(out)
      last = List.last(events_for(q))
      assert last["event"] == "request_failed"
      assert last["reason"] =~ "upstream_refused: the upstream refused the stream after 1000 bytes", inspect(last)
    end

    test "h2 workspace: after a GOAWAY with an error no new connection: the next stream is a 502 that says why",
         %{tb: tb, sc: sc} do
      q = tag()

      out =
        h2_raw(tb, sc, %{
          host: "allowed.test",
          port: @h2_only,
          mode: "uploads",
          paths: ["/goaway-error", "/after"],
          size: 1,
          query: q
        })

      assert %{"status" => 502} = out["streams"]["1"], inspect(out)
      assert %{"status" => 502} = out["streams"]["3"], inspect(out)
      [first, second] = Enum.filter(events_for(q, 2), &(&1["event"] == "request_failed"))
      assert first["path"] == "/goaway-error" and first["reason"] =~ "upstream_refused", inspect(first)
      assert second["path"] == "/after", inspect(second)
      assert second["reason"] == "upstream_unreachable: the upstream sent GOAWAY INTERNAL_ERROR", inspect(second)
    end

    test "HTTP/1.1 workspace: sent again over a new h2 connection, one request_allowed", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://allowed.test:#{@h2_only}/goaway-once?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.ok and r.status == 200, inspect(r)
      assert r.body == "h2 origin /goaway-once?#{q} seen 2 body 0\n"
      events = events_for(q)
      assert Enum.map(events, & &1["event"]) == ~w(request_opened request_allowed request_closed), inspect(events)
    end

    test "HTTP/1.1 workspace: a refused stream whose body was read is a 502 that says why", %{tb: tb, sc: sc} do
      q = tag()

      r =
        Client.run(tb, :curl, "https://allowed.test:#{@h2_only}/goaway-once?#{q}",
          method: "POST",
          body: String.duplicate("b", 1000),
          ca: sc.ca_cert,
          http: :h1
        )

      assert r.status == 502, inspect(r)
      last = List.last(events_for(q))
      assert last["event"] == "request_failed"

      assert last["reason"] =~ "upstream_refused: the upstream refused the stream after the request body was read",
             inspect(last)
    end

    test "HTTP/1.1 workspace: the retried lookup finds a private address: request_failed; the next request is allowed",
         %{tb: tb, sc: sc, dns: dns} do
      q1 = tag()
      q2 = tag()
      flag = Path.join(System.tmp_dir!(), "goaway-next-#{System.unique_integer([:positive])}")

      # The origin answers /goaway-wait with a GOAWAY refusing it 2 s after
      # it came: meanwhile the sidecar's resolver (the DNS server here, not
      # the pod's hosts file, docs/dns.md) says allowed.test is a link-local address,
      # so the request's new connection is refused. The second request
      # waits for the flag (the address is back).
      script = """
      import http.client, json, os, ssl, time
      ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
      c = http.client.HTTPSConnection("allowed.test", #{@h2_only}, context=ctx)
      res = []
      c.request("GET", "/goaway-wait?#{q1}")
      r = c.getresponse(); b = r.read().decode(); res.append([r.status, r.will_close, b])
      while not os.path.exists("#{flag}"):
          time.sleep(0.05)
      c.request("GET", "/count?#{q2}")
      r = c.getresponse(); b = r.read().decode(); res.append([r.status, r.will_close, b])
      print(json.dumps(res))
      """

      try do
        task =
          Task.async(fn ->
            Testbed.exec_in(tb, :pod, [Tier.tool!("python3"), "-c", script], ca: sc.ca_cert, timeout: 60_000)
          end)

        assert_receive {:egress_event, %{"event" => "request_opened", "query" => ^q1}}, 15_000
        assert_receive {:egress_event, %{"event" => "request_allowed", "query" => ^q1}}, 15_000
        DnsServer.set_zone(dns, %{"allowed.test" => ["169.254.169.254"]})
        first = events_for(q1)
        DnsServer.set_zone(dns, %{"allowed.test" => [tb.inet.v4, tb.inet.v6]})
        File.write!(flag, "")
        {out, status} = Task.await(task, 60_000)
        assert status == 0, out

        [[st1, close1, _], [st2, _, body2]] =
          out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()

        # An allowed request that then could not be sent: request_failed,
        # 403 in words; the connection goes on (a GET has no body to skip).
        assert st1 == 403 and close1 == false, out
        assert Enum.map(first, & &1["event"]) == ~w(request_failed), inspect(first)
        assert List.last(first)["reason"] =~ "169.254.169.254", inspect(first)
        assert List.last(first)["status"] == 403, inspect(first)

        # The next request on the same connection is evaluated and said so.
        assert st2 == 200 and body2 == "h2 origin /count?#{q2} seen 1\n", out
        second = events_for(q2)
        assert Enum.map(second, & &1["event"]) == ~w(request_opened request_allowed request_closed), inspect(second)
      after
        DnsServer.set_zone(dns, %{"allowed.test" => [tb.inet.v4, tb.inet.v6]})
        File.rm(flag)
      end
    end
  end

  describe "long streams on draining connections (h2_origin.py /goaway-hold)" do
    test "every slot draining: the stream that cannot get a connection fails with 503 after the connect timeout",
         %{tb: tb, sc: sc} do
      q = tag()
      # Each connection serves one held stream and refuses the others: six
      # connections (the pool) each hold one, the seventh stream has none.
      paths = for i <- 1..7, do: "/goaway-hold?ms=#{@connect_ms + 4000}&i=#{i}"
      t0 = System.monotonic_time(:millisecond)
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h2_only, mode: "paths", paths: paths, query: q})
      streams = for i <- 1..7, do: out["streams"]["#{2 * i - 1}"]
      {held, busy} = Enum.split_with(streams, &(&1["status"] == 200))
      assert length(held) == 6 and Enum.all?(held, &(&1["body"] == "held\ndone\n")), inspect(out)
      assert [%{"status" => 503, "ended" => true} = failed] = busy, inspect(out)
      assert failed["body"] =~ "upstream_busy: every upstream connection is draining", inspect(out)

      events = closing_events(q, 7)
      assert Enum.count(events, &(&1["event"] == "request_closed" and &1["status"] == 200)) == 6, inspect(events)
      [ev] = Enum.filter(events, &(&1["event"] == "request_failed"))
      assert ev["status"] == 503 and ev["reason"] =~ "upstream_busy: every upstream connection is draining", inspect(ev)
      # Within the held streams' time, not after one of them ended.
      assert System.monotonic_time(:millisecond) - t0 < 2 * (@connect_ms + 4000), inspect(out)
    end

    test "an error GOAWAY from a draining connection does not fail the next stream", %{tb: tb, sc: sc} do
      q = tag()

      out =
        h2_raw(tb, sc, %{
          host: "allowed.test",
          port: @h2_only,
          mode: "uploads",
          paths: ["/goaway-hold?ms=1000&err=1", "/after"],
          size: 1,
          query: q
        })

      assert %{"status" => 200, "ended" => true, "body" => "held\ndone\n"} = out["streams"]["1"], inspect(out)
      assert %{"status" => 200, "ended" => true} = out["streams"]["3"], inspect(out)
      events = closing_events(q, 2)
      assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)
    end
  end

  describe "memory of responses left unread (h2_origin.py /bytes, /close-after)" do
    # What the proxy accounts for (its buffer statistics), sampled while the
    # client runs. A chunk of a stream's response buffer costs 16 KiB and
    # its 24-byte record (h2/streambuf.h); the request heads held are at
    # most 64 KiB here.
    @chunk 16_384 + 24
    @window 1_048_576
    @heads 65_536

    defp body_sha(size) do
      body = "0123456789abcdef" |> String.duplicate(div(size, 16) + 1) |> binary_part(0, size)
      :crypto.hash(:sha256, body) |> Base.encode16(case: :lower)
    end

    defp unread(tb, sc, spec) do
      task =
        Task.async(fn -> h2_raw(tb, sc, Map.merge(%{host: "allowed.test", port: @h2_only, mode: "unread"}, spec)) end)

      sample_while(task, sc, [])
    end

    defp sample_while(task, sc, acc) do
      case Task.yield(task, 100) do
        {:ok, out} -> {out, Enum.reverse(acc)}
        nil -> sample_while(task, sc, [Sidecar.buffer_stats(sc)["h2_streams"] | acc])
      end
    end

    test "streams drained to their last byte hold a chunk each, not the window they once filled", %{tb: tb, sc: sc} do
      # Each response (1,000,000 bytes) fills its stream's buffer while the
      # workspace reads nothing, then the workspace takes all of it but the
      # last byte and goes to the next stream. A buffer whose allocation
      # kept its high-water mark would hold a megabyte per stream.
      n = 8
      size = 1_000_000
      paths = for i <- 1..n, do: "/bytes?size=#{size}&i=#{i}"
      {out, samples} = unread(tb, sc, %{paths: paths, take: size - 1, gap: 0.5, seconds: 1, query: tag()})

      sha = body_sha(size)

      for i <- 1..n do
        assert %{"status" => 200, "ended" => true, "size" => ^size, "sha256" => ^sha} = out["streams"]["#{2 * i - 1}"],
               inspect(out["streams"]["#{2 * i - 1}"])
      end

      # The window let a whole response in (the pipe was full) ...
      assert Enum.max(samples) >= size, inspect(samples)
      # ... and what stayed behind is a chunk per drained stream.
      bound = @window + n * 2 * @chunk + @heads
      assert Enum.max(samples) <= bound, "held #{Enum.max(samples)} > #{bound}: #{inspect(samples)}"
    end

    test "responses of closed upstream connections left unread hold new connections back, then all arrive",
         %{tb: tb, sc: sc} do
      # Each response (900,000 bytes) comes whole and its connection closes
      # (GOAWAY): no connection window counts the bytes any more. Without a
      # bound every new stream's new connection brought another window:
      # 4.5 MB here, 100 MiB with 100 streams of 1 MiB.
      n = 5
      size = 900_000
      paths = for i <- 1..n, do: "/close-after?size=#{size}&i=#{i}"
      {out, samples} = unread(tb, sc, %{paths: paths, gap: 0.4, seconds: 0.5, query: tag()})

      sha = body_sha(size)

      for i <- 1..n do
        assert %{"status" => 200, "ended" => true, "size" => ^size, "sha256" => ^sha} = out["streams"]["#{2 * i - 1}"],
               inspect(out["streams"]["#{2 * i - 1}"])
      end

      # Two closed connections' responses (over one window), then the rest waited.
      assert Enum.max(samples) >= 2 * size, inspect(samples)
      bound = 2 * @window + n * 2 * @chunk + @heads
      assert Enum.max(samples) <= bound, "held #{Enum.max(samples)} > #{bound}: #{inspect(samples)}"
    end

    test "a stream held back by unread responses of closed connections fails with 503 after the connect timeout",
         %{tb: tb, sc: sc} do
      q = tag()
      size = 900_000
      paths = for i <- 1..3, do: "/close-after?size=#{size}&i=#{i}"
      {out, _samples} = unread(tb, sc, %{paths: paths, gap: 0.4, seconds: @connect_ms / 1000 + 1.5, query: q})

      sha = body_sha(size)
      assert %{"status" => 200, "ended" => true, "size" => ^size, "sha256" => ^sha} = out["streams"]["1"], inspect(out)
      assert %{"status" => 200, "ended" => true, "size" => ^size, "sha256" => ^sha} = out["streams"]["3"], inspect(out)
      assert %{"status" => 503, "ended" => true} = failed = out["streams"]["5"], inspect(out)
      assert failed["body"] =~ "upstream_busy: responses of closed upstream connections wait unread", inspect(failed)
      # It waited the connect timeout for a connection, not less (and not
      # much more: the deadline's timer, not the client's end, answered).
      waited = failed["head_at"] - failed["sent_at"]
      assert waited >= @connect_ms / 1000 - 0.05 and waited < @connect_ms / 1000 + 1.0, inspect(failed)

      events = closing_events(q, 3)
      [ev] = Enum.filter(events, &(&1["event"] == "request_failed"))

      assert ev["status"] == 503 and ev["reason"] =~ "upstream_busy: responses of closed upstream connections",
             inspect(ev)
    end

    test "a stream held back by unread responses waits for a connection being opened while they pass the budget again",
         %{tb: tb, sc: sc} do
      # The first two connections drain after their GOAWAY, their streams
      # held open (hold=): connection 0 until after the read below,
      # connection 1 (whose timer runs the hold's deadline) past two
      # deadlines. The next two close at once: 1,200,000 bytes unread, and
      # the fifth stream waits. The workspace reads the third response: a
      # connection is opened for the fifth stream, its TLS handshake 8 s
      # slow (delay_next: two connect timeouts; the handshake timeout is
      # 10 s). Meanwhile
      # connection 0 closes with its 900,000 bytes unread: past the budget
      # again while the connection is being opened. The stream waits for
      # it (two connect timeouts, past the hold's deadline) and gets its
      # answer from it.
      q = tag()
      size = 900_000
      delay = 2 * @connect_ms / 1000

      paths = [
        "/close-after?size=#{size}&hold=5000&i=1",
        "/close-after?size=1000&hold=11500&i=2",
        "/close-after?size=#{size}&i=3",
        "/close-after?size=300000&delay_next=#{round(delay * 1000)}&i=4",
        "/bytes?size=1000&i=5"
      ]

      spec = %{host: "allowed.test", port: @h2_only, mode: "unread", gap: 0.5, seconds: 0.5, query: q}
      out = h2_raw(tb, sc, Map.merge(spec, %{paths: paths, early: [2], early_seconds: delay + 0.5}))

      for {sid, n} <- [{"1", size}, {"3", 1000}, {"5", size}, {"7", 300_000}, {"9", 1000}] do
        sha = body_sha(n)
        assert %{"status" => 200, "ended" => true, "size" => ^n, "sha256" => ^sha} = out["streams"][sid], inspect(out)
      end

      # Answered by the connection opened after the read: it was not
      # refused at the hold's deadline, nor one connect timeout later.
      held = out["streams"]["9"]
      assert held["head_at"] - held["sent_at"] > 2 * @connect_ms / 1000 + 0.2, inspect(held)
      assert held["head_at"] > out["streams"]["5"]["read_at"] + delay - 0.5, inspect(out)

      events = closing_events(q, 5)
      assert Enum.all?(events, &(&1["event"] == "request_closed" and &1["status"] == 200)), inspect(events)

      # What the proxy did, in its trace: the hold, the new connection,
      # connection 0 closing while it was opened, before the hold's
      # deadline; the new connection up after two deadlines, connection 1
      # (the deadline's timer) up until then.
      trace = Sidecar.h2_trace(sc, hd(events)["connection_id"])
      assert [hold | _] = Sidecar.trace_at(trace, ~r/new streams wait$/), inspect(trace)

      assert [opened] = Sidecar.trace_at(trace, ~r/connecting upstream connection [2-5]$/) |> Enum.filter(&(&1 > hold)),
             inspect(trace)

      assert [closed0] = Sidecar.trace_at(trace, ~r/upstream connection 0 closed/), inspect(trace)
      assert [closed1] = Sidecar.trace_at(trace, ~r/upstream connection 1 closed/), inspect(trace)

      assert [ready] =
               Sidecar.trace_at(trace, ~r/upstream connection [2-5] ready \(h2\)$/) |> Enum.filter(&(&1 > opened)),
             inspect(trace)

      deadline = hold + @connect_ms / 1000
      assert hold < opened and opened < closed0 and closed0 < deadline, inspect(trace)
      assert ready > deadline + @connect_ms / 1000 and closed1 > deadline + @connect_ms / 1000, inspect(trace)
      assert Sidecar.trace_at(trace, ~r/the waiting streams fail/) == [], inspect(trace)
    end
  end
end
