defmodule Condukt.Netns.SidecarH2Test do
  # HTTP/2 through the sidecar (issue 4, docs/http2.md): real h2 clients
  # (curl --http2, python3-h2, node's http2) in the pod, nginx speaking h2
  # in the internet namespace. Every stream is a request of its own with its
  # own events; a stream naming another host than the SNI gets 421 while the
  # others on the same connection go on; a rapid-reset attack ends with
  # GOAWAY ENHANCE_YOUR_CALM and an event.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.{Cmd, Tier}
  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  def decider(_ctx, _req), do: :deny

  defp policy do
    [
      rules: [deny: ["denied.test"], allow: ~w(allowed.test other.test), decide: &__MODULE__.decider/2],
      default: :deny
    ]
  end

  # servers/scripted.py speaks HTTP/1.1 only (no ALPN) on 8091;
  # servers/h2_origin.py speaks h2 only on 8093; nginx both on 443.
  @h1_only 8091
  @h2_only 8093
  # scripted.py again: one connection at a time.
  @h1_one 8094

  setup_all do
    tb = Testbed.start(big_size: 20 * 1024 * 1024)
    Testbed.start_origins(tb)
    sc = Sidecar.start(tb, policy(), ports: [80, 443, @h1_only, @h2_only, @h1_one])
    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  # Decide rules are answered per stream: a path with "secret" is denied.
  # A path with "hold" is never answered.
  defp decide(req) do
    path = req["path"] || ""

    cond do
      String.contains?(path, "hold") -> :ignore
      String.contains?(path, "long-reason") -> {{:deny, long_reason()}, false}
      String.contains?(path, "secret") -> {{:deny, "secret path"}, false}
      true -> {:allow, false}
    end
  end

  # A decider's reason as long as the control channel allows (512 bytes),
  # its end marked.
  defp long_reason, do: String.duplicate("0123456789abcdef", 30) <> "<- the end of a 512-byte reason."

  setup %{sc: sc} do
    {:ok, peer} = ControlPeer.start_link(sc, self(), &decide/1)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 5_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    {:ok, peer: peer}
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  defp events_for(query, n_last \\ 1, timeout \\ 10_000) do
    collect(query, n_last, [], System.monotonic_time(:millisecond) + timeout)
  end

  @last ~w(request_closed request_failed request_denied)

  defp collect(query, n_last, acc, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {:egress_event, %{"query" => ^query} = ev} ->
        acc = [ev | acc]
        n = if ev["event"] in @last, do: n_last - 1, else: n_last
        if n == 0, do: Enum.reverse(acc), else: collect(query, n, acc, deadline)
    after
      left -> flunk("events for #{query}: got #{inspect(Enum.map(Enum.reverse(acc), & &1["event"]))}")
    end
  end

  defp h2_raw(tb, sc, spec), do: Client.h2_raw(tb, sc.ca_cert, spec)

  test "curl --http2: h2 on both sides, one stream, HTTP/2 events with the stream id", %{tb: tb, sc: sc} do
    q = tag()
    r = Client.run(tb, :curl, "https://allowed.test/headers?#{q}", ca: sc.ca_cert, http: :h2)
    assert r.ok and r.status == 200, inspect(r)
    assert r.http_version == "2"
    assert r.body =~ "alpn=h2\n"
    assert r.body =~ "protocol=HTTP/2.0\n"
    assert r.body =~ "host=allowed.test\n"

    events = events_for(q)
    assert Enum.map(events, & &1["event"]) == ~w(request_opened request_allowed request_closed)
    closed = List.last(events)
    assert closed["http_version"] == "HTTP/2"
    assert closed["stream_id"] == 1
    assert closed["status"] == 200
    assert closed["host"] == "allowed.test"
    assert closed["path"] == "/headers"
    assert closed["bytes_in"] > 0
  end

  test "an upload and a 20 MiB download over h2 arrive intact (flow control end to end)", %{tb: tb, sc: sc} do
    {path, sha} = Testbed.make_file(tb, "h2-upload-#{System.unique_integer([:positive])}.bin", 3_000_000)
    q = tag()

    r =
      Client.run(tb, :curl, "https://allowed.test/upload?#{q}",
        method: "POST",
        body: {:file, path},
        ca: sc.ca_cert,
        http: :h2
      )

    assert r.ok and r.status == 200, inspect(r)
    body = Condukt.JSON.decode!(r.body)
    assert body["body_sha256"] == sha
    assert body["body_size"] == 3_000_000
    assert List.last(events_for(q))["bytes_out"] >= 3_000_000

    q = tag()
    r = Client.run(tb, :curl, "https://allowed.test/big.bin?#{q}", ca: sc.ca_cert, http: :h2, timeout: 120_000)
    assert r.ok and r.status == 200 and r.http_version == "2", inspect(r)
    assert r.body_sha256 == tb.big_file.sha256
  end

  test "a denied host is never pre-connected: the workspace still gets h2, and a 403 on the stream", %{tb: tb, sc: sc} do
    q = tag()
    r = Client.run(tb, :curl, "https://denied.test/?#{q}", ca: sc.ca_cert, http: :h2)
    assert r.status == 403 and r.http_version == "2", inspect(r)
    assert r.body =~ "refused the request to denied.test"
    assert [%{"event" => "request_opened"}, %{"event" => "request_denied"} = d] = events_for(q)
    assert d["stream_id"] == 1 and d["http_version"] == "HTTP/2"
  end

  test "coalescing: a stream for another name gets 421, the others on the connection succeed", %{tb: tb, sc: sc} do
    q = tag()
    out = h2_raw(tb, sc, %{host: "allowed.test", other: "other.test", mode: "coalesce", query: q})
    assert out["alpn"] == "h2"
    assert %{"status" => 200, "body" => "hello from allowed.test\n", "ended" => true} = out["streams"]["1"]
    assert %{"status" => 421, "ended" => true} = out["streams"]["3"]
    assert out["streams"]["3"]["body"] =~ "misdirected request"
    assert %{"status" => 200, "ended" => true} = out["streams"]["5"]
    assert out["goaway"] == nil

    events = events_for(q, 3)
    denied = Enum.find(events, &(&1["event"] == "request_denied"))
    assert denied["reason"] == "misdirected_request"
    assert denied["stream_id"] == 3
    assert denied["host"] == "other.test"
    closed = Enum.filter(events, &(&1["event"] == "request_closed"))
    assert Enum.sort(Enum.map(closed, & &1["stream_id"])) == [1, 5]
  end

  test "rapid reset (CVE-2023-44487): GOAWAY ENHANCE_YOUR_CALM and an event", %{tb: tb, sc: sc} do
    q = tag()
    out = h2_raw(tb, sc, %{host: "allowed.test", mode: "rapid_reset", query: q})
    # 0xb ENHANCE_YOUR_CALM
    assert out["goaway"] == 11, inspect(out)
    assert out["resets_sent"] > 200 and out["resets_sent"] < 2000, inspect(out)

    assert_receive {:egress_event, %{"event" => "request_failed", "reason" => "h2_rapid_reset"} = ev}, 10_000
    assert ev["sni"] == "allowed.test"
  end

  test "resets the proxy sends (MadeYouReset-style: oversized trailers) count as rapid reset", %{tb: tb, sc: sc} do
    q = tag()
    out = h2_raw(tb, sc, %{host: "allowed.test", mode: "made_you_reset", count: 400, query: q})
    assert out["goaway"] == 11, inspect(Map.delete(out, "streams"))
    assert out["resets_sent"] < 400
  end

  test "node's http2 client: two concurrent streams on one session", %{tb: tb, sc: sc} do
    q = tag()

    js = """
    const http2 = require('http2');
    const s = http2.connect('https://allowed.test');
    let left = 2; const out = [];
    for (const p of ['/?#{q}&a=1', '/?#{q}&a=2']) {
      const r = s.request({':path': p});
      let body = ''; let status = 0;
      r.on('response', h => { status = h[':status']; });
      r.setEncoding('utf8'); r.on('data', d => body += d);
      r.on('end', () => { out.push({status, body}); if (--left === 0) { console.log(JSON.stringify(out)); s.close(); } });
    }
    s.on('error', e => { console.log(JSON.stringify({error: String(e)})); process.exit(1); });
    """

    {out, status} = Testbed.exec_in(tb, :pod, [Tier.tool!("node"), "-e", js], ca: sc.ca_cert, timeout: 30_000)
    assert status == 0, out
    results = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
    assert [%{"status" => 200, "body" => "hello from allowed.test\n"}, %{"status" => 200}] = results
  end

  describe "translation" do
    test "h2 workspace, HTTP/1.1-only upstream: chunked and interim responses, uploads, 101 refused", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://allowed.test:#{@h1_only}/chunked?n=5&#{q}", ca: sc.ca_cert, http: :h2)
      assert r.ok and r.status == 200 and r.http_version == "2", inspect(r)
      assert r.body == Enum.map_join(0..4, &"chunk #{&1}\n")
      closed = List.last(events_for("n=5&#{q}"))
      assert closed["event"] == "request_closed" and closed["http_version"] == "HTTP/2" and closed["stream_id"] == 1

      {path, _sha} = Testbed.make_file(tb, "h2-h1-upload-#{System.unique_integer([:positive])}.bin", 3_000_000)

      r =
        Client.run(tb, :curl, "https://allowed.test:#{@h1_only}/sink?#{tag()}",
          method: "POST",
          body: {:file, path},
          ca: sc.ca_cert,
          http: :h2
        )

      assert r.ok and r.status == 200 and r.body == "3000000\n", inspect(r)

      q = tag()
      paths = Enum.map(1..8, &"/n#{&1}") ++ ["/interim", "/101"]
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h1_only, mode: "paths", paths: paths, query: q})
      assert out["alpn"] == "h2"

      for i <- 1..8 do
        assert %{"status" => 200, "ended" => true, "body" => body} = out["streams"]["#{2 * i - 1}"]
        assert body == "scripted /n#{i}\n"
      end

      # Interim responses arrive as non-final HEADERS before the final one.
      assert %{"status" => 200, "body" => "ok\n", "interim" => [[100, nil], [103, "</x>; rel=preload"]]} =
               out["streams"]["17"]

      assert %{"status" => 502, "body" => body} = out["streams"]["19"]
      assert body =~ "101 cannot be expressed in HTTP/2"
      assert out["goaway"] == nil
    end

    test "gRPC-style trailers both ways with an h2-only upstream; request trailers to HTTP/1.1 as chunked trailers",
         %{tb: tb, sc: sc} do
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h2_only, mode: "trailers", path: "/trailers", query: tag()})
      assert %{"status" => 200, "ended" => true} = st = out["streams"]["1"]
      assert st["body"] == "got 1000 bytes; trailers x-req-trailer=yes\n"
      assert st["headers"]["content-type"] == "application/grpc"
      assert st["trailers"] == %{"grpc-status" => "0", "grpc-message" => "ok"}

      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h1_only, mode: "trailers", path: "/sink", query: tag()})
      assert %{"status" => 200, "ended" => true, "body" => "1000\n"} = out["streams"]["1"]
    end

    test "request trailers from an h2 workspace are filtered like every trailer path (h2 and HTTP/1.1 upstreams)",
         %{tb: tb, sc: sc} do
      # Host, framing and credentials must not ride in trailers to the upstream.
      trailers = [
        ["x-req-trailer", "yes"],
        ["host", "evil.test"],
        ["authorization", "Bearer stolen"],
        ["proxy-authorization", "Basic eA=="],
        ["cookie", "s=1"],
        ["content-length", "1000"],
        ["content-type", "text/evil"]
      ]

      for {port, path} <- [{@h2_only, "/trailers"}, {@h1_only, "/trailers-in"}] do
        spec = %{host: "allowed.test", port: port, mode: "trailers", path: path, trailers: trailers, query: tag()}
        out = h2_raw(tb, sc, spec)
        assert %{"status" => 200, "ended" => true, "body" => body} = out["streams"]["1"], inspect({port, out})
        assert body == "got 1000 bytes; trailers x-req-trailer=yes\n", inspect({port, body})
      end
    end

    test "a close-delimited response cut without close_notify fails the stream; with close_notify it ends",
         %{tb: tb, sc: sc} do
      q = tag()
      paths = ["/close?notify=0", "/close?notify=1"]
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h1_only, mode: "paths", paths: paths, query: q})
      # The head went out before the truncation: the stream is reset, never ended.
      assert %{"status" => 200, "reset" => 2} = cut = out["streams"]["1"]
      refute cut["ended"]
      assert %{"status" => 200, "ended" => true, "body" => "close-delimited body\n"} = out["streams"]["3"]

      failed = List.last(events_for("notify=0&#{q}"))
      assert failed["event"] == "request_failed" and failed["reason"] =~ "truncated", inspect(failed)
      assert List.last(events_for("notify=1&#{q}"))["event"] == "request_closed"
    end

    test "h2 workspace, HTTP/1.1 upstream: chunked trailers become a trailing HEADERS frame", %{tb: tb, sc: sc} do
      q = tag()

      out =
        h2_raw(tb, sc, %{host: "allowed.test", port: @h1_only, mode: "paths", paths: ["/trailers", "/n1"], query: q})

      assert %{"status" => 200, "ended" => true, "body" => "with trailers\n"} = st = out["streams"]["1"]
      assert st["trailers"] == %{"grpc-status" => "0", "x-checksum" => "abc"}
      assert st["headers"]["trailer"] == nil
      assert %{"status" => 200, "body" => "scripted /n1\n"} = out["streams"]["3"]
      assert out["streams"]["3"]["trailers"] == nil
    end

    test "1xx on h2: an h2 upstream's 103 Early Hints reaches the workspace before the final response",
         %{tb: tb, sc: sc} do
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h2_only, mode: "paths", paths: ["/early"], query: tag()})
      assert %{"status" => 200, "ended" => true, "body" => "after hints\n"} = st = out["streams"]["1"]
      assert st["interim"] == [[103, "</style.css>; rel=preload"]]

      # An HTTP/1.1 workspace gets it as an interim HTTP/1.1 response.
      r =
        Client.run(tb, :curl, "https://allowed.test:#{@h2_only}/early?#{tag()}",
          ca: sc.ca_cert,
          http: :h1,
          extra_args: ["-v"]
        )

      assert r.ok and r.status == 200 and r.body == "after hints\n", inspect(r)
      assert r.output =~ "< HTTP/1.1 103 Early Hints", r.output
    end

    test "the HTTP/1.1 upstream pool: 8 concurrent slow streams on one h2 connection use 6 upstream connections",
         %{tb: tb, sc: sc} do
      key = "k#{System.unique_integer([:positive])}"
      paths = Enum.map(1..8, &"/slow?key=#{key}&i=#{&1}")
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h1_only, mode: "paths", paths: paths, query: tag()})

      for i <- 1..8 do
        assert %{"status" => 200, "ended" => true, "body" => "slow"} = out["streams"]["#{2 * i - 1}"]
      end

      # The origin's view: at most (and here exactly) CE_H2_H1_POOL of them
      # at once, each on a connection of its own.
      r = Client.run(tb, :curl, "https://allowed.test:#{@h1_only}/slow-max?key=#{key}", ca: sc.ca_cert, http: :h1)
      assert r.ok and r.body == "6 6", inspect(r)
    end

    test "the pool: an upstream that refuses extra connections serves the streams on the one it keeps",
         %{tb: tb, sc: sc} do
      key = "k#{System.unique_integer([:positive])}"
      q = tag()
      paths = Enum.map(1..3, &"/slow?key=#{key}&i=#{&1}")
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h1_one, mode: "paths", paths: paths, query: q})

      # The extra connections fail (closed before TLS); the streams wait
      # for the one connection instead of failing, and are served in turn.
      for i <- 1..3 do
        assert %{"status" => 200, "ended" => true, "body" => "slow"} = out["streams"]["#{2 * i - 1}"]
      end

      for i <- 1..3 do
        assert List.last(events_for("key=#{key}&i=#{i}&#{q}"))["event"] == "request_closed"
      end

      r = Client.run(tb, :curl, "https://allowed.test:#{@h1_one}/slow-max?key=#{key}", ca: sc.ca_cert, http: :h1)
      assert r.ok and r.body == "1 1", inspect(r)
    end

    test "h2load: 200 requests on 4 connections, 10 streams each, all succeed (h2 and HTTP/1.1 upstreams)",
         %{tb: tb, sc: sc} do
      for url <- ["https://allowed.test/", "https://allowed.test:#{@h1_only}/"] do
        out = Client.h2load(tb, sc.ca_cert, ["-n", "200", "-c", "4", "-m", "10", url])
        assert out =~ ~r/requests: 200 total, 200 started, 200 done, 200 succeeded, 0 failed/, out
        assert out =~ "status codes: 200 2xx", out
      end
    end

    test "python httpx over h2", %{tb: tb, sc: sc} do
      script = """
      import json, os, httpx
      out = []
      with httpx.Client(http2=True, verify=os.environ["SSL_CERT_FILE"]) as c:
          for u in ["https://allowed.test/", "https://allowed.test:#{@h1_only}/x"]:
              r = c.get(u)
              out.append([r.status_code, r.http_version, r.text])
      print(json.dumps(out))
      """

      {out, status} = Testbed.exec_in(tb, :pod, [Tier.tool!("python3"), "-c", script], ca: sc.ca_cert, timeout: 30_000)
      assert status == 0, out
      results = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
      assert results == [[200, "HTTP/2", "hello from allowed.test\n"], [200, "HTTP/2", "scripted /x\n"]]
    end
  end

  describe "HTTP/1.1 workspace, h2-only upstream (translation)" do
    test "curl --http1.1: the request goes as an h2 stream, the answer comes back as HTTP/1.1", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://allowed.test:#{@h2_only}/x?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.ok and r.status == 200 and r.http_version == "1.1", inspect(r)
      assert r.body == "h2 origin /x?#{q}\n"
      closed = List.last(events_for(q))
      assert closed["event"] == "request_closed" and closed["http_version"] == "HTTP/1.1"
      assert closed["status"] == 200 and closed["stream_id"] == nil
    end

    test "python http.client: keep-alive, a chunked upload, and trailers as chunked trailers", %{tb: tb, sc: sc} do
      q = tag()
      q2 = tag()

      script = """
      import http.client, json, os, socket, ssl
      ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
      c = http.client.HTTPSConnection("allowed.test", #{@h2_only}, context=ctx)
      res = []
      for p in ["/a", "/b", "/c"]:
          c.request("GET", p + "?#{q}")
          r = c.getresponse()
          res.append([r.status, r.version, r.read().decode()])
      c.request("POST", "/empty?#{q}", body=b"")
      r = c.getresponse()
      res.append([r.status, r.version, r.read().decode()])
      def gen():
          for i in range(10):
              yield b"x" * 1000
      c.request("POST", "/trailers?#{q}", body=gen(), encode_chunked=True)
      r = c.getresponse()
      res.append([r.status, r.getheader("transfer-encoding"), r.read().decode()])
      s = ctx.wrap_socket(socket.create_connection(("allowed.test", #{@h2_only})), server_hostname="allowed.test")
      s.sendall(b"POST /trailers?#{q2} HTTP/1.1\\r\\nHost: allowed.test:#{@h2_only}\\r\\nTE: trailers\\r\\n"
                b"Content-Length: 5\\r\\nConnection: close\\r\\n\\r\\nhello")
      raw = b""
      while True:
          d = s.recv(65536)
          if not d:
              break
          raw += d
      s = ctx.wrap_socket(socket.create_connection(("allowed.test", #{@h2_only})), server_hostname="allowed.test")
      s.sendall(b"POST /trailers?#{q2}-10 HTTP/1.0\\r\\nHost: allowed.test:#{@h2_only}\\r\\n"
                b"Content-Length: 3\\r\\n\\r\\nabc")
      raw10 = b""
      while True:
          d = s.recv(65536)
          if not d:
              break
          raw10 += d
      print(json.dumps({"keepalive": res, "raw": raw.decode(), "raw10": raw10.decode()}))
      """

      {out, status} = Testbed.exec_in(tb, :pod, [Tier.tool!("python3"), "-c", script], ca: sc.ca_cert, timeout: 30_000)
      assert status == 0, out
      res = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()

      assert [
               [200, 11, "h2 origin /a?" <> _],
               [200, 11, "h2 origin /b?" <> _],
               [200, 11, "h2 origin /c?" <> _],
               [200, 11, "h2 origin /empty?" <> _],
               upload
             ] = res["keepalive"]

      assert upload == [200, "chunked", "got 10000 bytes; trailers \n"]

      # Five exchanges (one a POST with Content-Length: 0) on one workspace
      # connection, and so one upstream session.
      closed = q |> events_for(5) |> Enum.filter(&(&1["event"] == "request_closed"))
      assert length(closed) == 5
      assert closed |> Enum.map(& &1["connection_id"]) |> Enum.uniq() |> length() == 1
      assert Enum.all?(closed, &(&1["http_version"] == "HTTP/1.1"))
      assert List.last(closed)["bytes_out"] >= 10_000

      raw = res["raw"]
      assert raw =~ ~r/^HTTP\/1.1 200 OK\r\n/
      assert raw =~ "content-type: application/grpc\r\n"
      assert raw =~ "transfer-encoding: chunked\r\n"
      assert String.ends_with?(raw, "\r\n0\r\ngrpc-status: 0\r\ngrpc-message: ok\r\n\r\n"), inspect(raw)
      assert raw =~ "got 5 bytes; trailers \n"

      # HTTP/1.0: no chunked, no trailers; the body ends at the close.
      raw10 = res["raw10"]
      assert raw10 =~ ~r/^HTTP\/1.1 200 OK\r\n/
      assert raw10 =~ "connection: close\r\n"
      refute raw10 =~ "transfer-encoding"
      assert String.ends_with?(raw10, "\r\n\r\ngot 3 bytes; trailers \n"), inspect(raw10)
    end

    test "HTTP/1.1 chunked trailers go through, filtered: h1 origin to h1 workspace, h1 workspace to h1 and h2 origins",
         %{tb: tb, sc: sc} do
      q = tag()

      script = """
      import json, os, socket, ssl
      ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
      def ex(port, data):
          s = ctx.wrap_socket(socket.create_connection(("allowed.test", port)), server_hostname="allowed.test")
          s.sendall(data)
          raw = b""
          while True:
              d = s.recv(65536)
              if not d:
                  break
              raw += d
          return raw.decode("latin-1")
      H1, H2 = #{@h1_only}, #{@h2_only}
      # Allowed trailer fields among ones a trailer section must not carry.
      up = (b"5\\r\\nhello\\r\\n0\\r\\nX-Req-Trailer: yes\\r\\nContent-Length: 5\\r\\nHost: evil.test\\r\\n"
            b"Transfer-Encoding: chunked\\r\\nAuthorization: Basic eA==\\r\\nConnection: close\\r\\n"
            b"X-Sum:  42 \\r\\n\\r\\n")
      def post(port, path):
          return (b"POST %s?#{q} HTTP/1.1\\r\\nHost: allowed.test:%d\\r\\nTransfer-Encoding: chunked\\r\\n"
                  b"Connection: close\\r\\n\\r\\n" % (path, port)) + up
      out = {
          # Two requests on one connection: the trailers must end the first
          # response exactly where the client reads its end.
          "resp11": ex(H1, b"GET /trailers?#{q} HTTP/1.1\\r\\nHost: allowed.test:%d\\r\\nTE: trailers\\r\\n\\r\\n"
                           b"GET /next?#{q} HTTP/1.1\\r\\nHost: allowed.test:%d\\r\\nConnection: close\\r\\n\\r\\n"
                           % (H1, H1)),
          "resp10": ex(H1, b"GET /trailers?#{q}-10 HTTP/1.0\\r\\nHost: allowed.test:%d\\r\\n\\r\\n" % H1),
          "up_h1": ex(H1, post(H1, b"/trailers-in")),
          "up_h2": ex(H2, post(H2, b"/trailers")),
      }
      print(json.dumps(out))
      """

      {out, status} = Testbed.exec_in(tb, :pod, [Tier.tool!("python3"), "-c", script], ca: sc.ca_cert, timeout: 30_000)
      assert status == 0, out
      res = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()

      # Response trailers from the HTTP/1.1 origin: the allowed ones, in
      # order and spelling, after the last chunk; Content-Length,
      # Transfer-Encoding, Host, Connection and Set-Cookie are dropped, and
      # the next response follows at once on the same connection.
      resp11 = res["resp11"]
      assert resp11 =~ ~r/^HTTP\/1.1 200 OK\r\n/
      assert resp11 =~ "\r\n0\r\nGrpc-Status: 0\r\nX-Checksum: abc\r\n\r\nHTTP/1.1 200 OK\r\n", inspect(resp11)
      assert String.ends_with?(resp11, "scripted /next\n"), inspect(resp11)

      for bad <- ["evil.test", "Set-Cookie", "Content-Length: 99", "Connection: close\r\nX-Checksum"],
          do: refute(resp11 =~ bad, inspect(resp11))

      # HTTP/1.0: the body decoded, until the close, without the trailers.
      resp10 = res["resp10"]
      assert resp10 =~ ~r/^HTTP\/1.1 200 OK\r\n/
      refute resp10 =~ "Grpc-Status"
      refute resp10 =~ "ransfer-Encoding"
      assert String.ends_with?(resp10, "\r\n\r\nwith trailers\n"), inspect(resp10)

      # Request trailers: to the HTTP/1.1 origin as chunked trailers (as
      # spelled, values without surrounding whitespace), to the h2 origin as
      # a trailing HEADERS frame (lower-case names); filtered alike.
      assert res["up_h1"] =~ ~r/^HTTP\/1.1 200 OK\r\n/

      assert String.ends_with?(res["up_h1"], "got 5 bytes; trailers X-Req-Trailer=yes,X-Sum=42\n"),
             inspect(res["up_h1"])

      assert res["up_h2"] =~ ~r/^HTTP\/1.1 200 OK\r\n/
      assert res["up_h2"] =~ "got 5 bytes; trailers x-req-trailer=yes,x-sum=42\n", inspect(res["up_h2"])

      # Trailers are not part of the events: each exchange closes as usual.
      closed = q |> events_for(4) |> Enum.filter(&(&1["event"] == "request_closed"))
      assert length(closed) == 4
      assert Enum.all?(closed, &(&1["status"] == 200))
    end

    test "a paused HTTP/1.1 reader of 20 MiB from nginx over h2: the h2 window holds nginx back", %{tb: tb, sc: sc} do
      q = tag()
      marker = Path.join(Testbed.scratch_dir(tb), "paused-#{q}")

      script = """
      import hashlib, json, os, socket, ssl, time
      ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
      fam, typ, proto, _, addr = socket.getaddrinfo("allowed.test", 443, type=socket.SOCK_STREAM)[0]
      raw = socket.socket(fam, typ, proto)
      raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
      raw.connect(addr)
      s = ctx.wrap_socket(raw, server_hostname="allowed.test")
      s.sendall(b"GET /big.bin?#{q} HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: close\\r\\n\\r\\n")
      data = bytearray()
      while len(data) < 1 << 20:
          d = s.recv(65536)
          if not d:
              break
          data += d
      open(#{inspect(marker)}, "w").close()
      time.sleep(6)
      while True:
          d = s.recv(1 << 20)
          if not d:
              break
          data += d
      head, body = bytes(data).split(b"\\r\\n\\r\\n", 1)
      print(json.dumps({"head": head.decode(), "size": len(body), "sha": hashlib.sha256(body).hexdigest()}))
      """

      task =
        Task.async(fn ->
          Testbed.exec_in(tb, :pod, [Tier.tool!("python3"), "-c", script], ca: sc.ca_cert, timeout: 60_000)
        end)

      # While the reader pauses, the proxy takes nginx's DATA only as the
      # workspace takes it (the window is acknowledged, and the upstream
      # socket read, only while the workspace's socket queue is short), so
      # nginx cannot finish the response (it logs a request when it did):
      # the buffers between the proxy and the reader (a 64 KiB receive
      # buffer, the proxy's socket queue) hold far less than the 19 MiB to
      # come. A proxy that buffered the body would let nginx finish.
      :ok = Cmd.poll(fn -> File.exists?(marker) end, 30_000)
      Process.sleep(2_000)
      refute Enum.any?(Testbed.access_log(tb), &(&1["uri"] == "/big.bin?#{q}"))
      {out, status} = Task.await(task, 70_000)
      assert status == 0, out
      res = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
      assert res["size"] == 20_971_520 and res["sha"] == tb.big_file.sha256, inspect(res)
      assert res["head"] =~ "content-length: 20971520"

      # nginx saw the request in h2.
      assert Enum.any?(Testbed.access_log(tb), &(&1["uri"] == "/big.bin?#{q}" and &1["protocol"] == "HTTP/2.0"))
    end
  end

  describe "per stream" do
    test "decide: each stream asks on its own; a denied path gets 403 while the others succeed", %{tb: tb, sc: sc} do
      q = tag()
      out = h2_raw(tb, sc, %{host: "decide.test", mode: "paths", paths: ["/", "/secret", "/index.txt"], query: q})
      assert out["alpn"] == "h2"
      assert %{"status" => 200, "body" => "hello from decide.test\n"} = out["streams"]["1"]
      assert %{"status" => 403, "body" => body} = out["streams"]["3"]
      assert body =~ "the decider of rule 2" and body =~ "secret path"
      assert %{"status" => 200, "body" => "hello from decide.test\n"} = out["streams"]["5"]

      events = events_for(q, 3)
      denied = Enum.find(events, &(&1["event"] == "request_denied"))
      assert denied["stream_id"] == 3 and denied["reason"] == "secret path"
      assert denied["matched_rule"] == %{"index" => 2, "kind" => "decide"}
    end
  end

  test "a decider's reason of the control channel's 512 bytes reaches the workspace whole, on h2 and HTTP/1.1",
       %{tb: tb, sc: sc} do
    reason = long_reason()
    assert byte_size(reason) == 512

    q = tag()
    out = h2_raw(tb, sc, %{host: "decide.test", mode: "paths", paths: ["/long-reason"], query: q})
    assert %{"status" => 403, "body" => h2_body} = out["streams"]["1"]
    [denied] = Enum.filter(events_for(q), &(&1["event"] == "request_denied"))
    assert denied["reason"] == reason

    q = tag()
    r = Client.run(tb, :curl, "https://decide.test/long-reason?#{q}", ca: sc.ca_cert, http: :h1)
    assert r.status == 403, inspect(r)

    # The same words on both protocols, the reason to its last byte.
    for body <- [h2_body, r.body] do
      assert body ==
               "condukt: the network policy of this sandbox refused the request to decide.test\n" <>
                 "refused by: the decider of rule 2\nreason: #{reason}\n"
    end
  end

  describe "decision questions" do
    # At most 8 decision_requests outstanding per workspace connection
    # (docs/http2.md §3): the other streams wait for an answer, then ask.
    test "twelve streams waiting on the decider: eight questions at a time, the rest wait",
         %{tb: tb, sc: sc, peer: peer} do
      q = tag()
      paths = for i <- 1..12, do: "/hold/#{i}"
      task = Task.async(fn -> h2_raw(tb, sc, %{host: "decide.test", mode: "paths", paths: paths, query: q}) end)

      for _ <- 1..8, do: assert_receive({:egress_decision_request, %{"request" => %{"path" => "/hold/" <> _}}}, 5_000)
      refute_receive {:egress_decision_request, _}, 1_500

      # The control channel goes away: the eight questions time out (5 s),
      # the four waiting streams cannot ask; every stream is answered 403.
      ControlPeer.stop(peer)
      out = Task.await(task, 60_000)

      for i <- 0..11 do
        assert %{"status" => 403, "body" => body} = out["streams"]["#{1 + 2 * i}"]
        assert body =~ ~r/reason: (decider_timeout|control_channel_unavailable)\n/
      end
    end
  end

  describe "request-head budget" do
    # docs/http2.md §5: the request heads a workspace connection holds
    # (waiting for a decision, for an upstream connection, or kept for a
    # resend) are bounded by CE_H2_HEAD_BUDGET (1 MiB). 40 streams with
    # 60 KiB heads (64 KiB buffers each) waiting on the decider: the first
    # 16 fit exactly, the other 24 are refused before evaluation with
    # RST_STREAM REFUSED_STREAM and request_denied naming the limit; the 16
    # complete once answered, and then 16 new 60 KiB streams on the same
    # connection all fit again (every byte was given back).
    test "40 streams with 60 KiB heads waiting on a decision: 16 held, 24 refused, then room again",
         %{tb: tb, sc: sc, peer: peer} do
      q = tag()
      # 60 KiB, made by the client (an argv string is at most 128 KiB).
      big = ["a", 61_440]
      auth = "decide.test:#{@h1_only}"

      f = fn path ->
        [[":method", "GET"], [":scheme", "https"], [":authority", auth], [":path", path], ["x-big", big]]
      end

      first = for i <- 1..40, do: f.("/hold/#{i}?#{q}")
      again = for i <- 1..16, do: f.("/again/#{i}?#{q}")

      spec = %{
        host: "decide.test",
        port: @h1_only,
        mode: "custom",
        streams: first,
        then: [again],
        huffman: false,
        query: q
      }

      task = Task.async(fn -> h2_raw(tb, sc, spec) end)

      # The refusals come at once, while the 16 held streams still wait.
      denied =
        for _ <- 1..24 do
          assert_receive {:egress_event,
                          %{"event" => "request_denied", "query" => ^q, "reason" => "request_header_budget" <> _} = ev},
                         10_000

          ev
        end

      assert Enum.all?(denied, &(&1["path"] =~ ~r{^/hold/\d+$} and &1["host"] == "decide.test")), inspect(denied)
      assert hd(denied)["reason"] =~ "would exceed 1048576 bytes"
      assert Enum.sort(Enum.map(denied, & &1["stream_id"])) == Enum.to_list(33..79//2)

      # 8 questions at a time (CE_H2_MAX_ASKS): answer them, then the other 8.
      for _round <- 1..2 do
        ids =
          for _ <- 1..8 do
            assert_receive {:egress_decision_request, %{"id" => id, "request" => %{"path" => "/hold/" <> _}}}, 10_000
            id
          end

        refute_receive {:egress_decision_request, %{"request" => %{"path" => "/hold/" <> _}}}, 300
        for id <- ids, do: :ok = ControlPeer.reply(peer, id, :allow)
      end

      out = Task.await(task, 60_000)
      assert out["goaway"] == nil, inspect(Map.delete(out, "streams"))

      for i <- 1..40 do
        st = out["streams"]["#{2 * i - 1}"]

        if i <= 16 do
          assert %{"status" => 200, "ended" => true, "body" => "scripted /hold/" <> _} = st, inspect(st)
        else
          # 7: REFUSED_STREAM, the client may retry.
          assert st["reset"] == 7 and not Map.has_key?(st, "status"), inspect(st)
        end
      end

      for i <- 41..56 do
        assert %{"status" => 200, "ended" => true, "body" => "scripted /again/" <> _} = out["streams"]["#{2 * i - 1}"]
      end

      # No denial beyond the 24: the second round fitted whole.
      refute_receive {:egress_event, %{"event" => "request_denied", "query" => ^q}}, 500
    end
  end

  describe "request-head budget, heads kept for a resend" do
    # docs/http2.md §4: a head sent to an h2 upstream is kept until the
    # response head comes, to send the stream again if the upstream refuses
    # it. Under the budget those copies go first: a new stream is taken and
    # the oldest kept head is dropped (that stream, if refused, is reset
    # REFUSED_STREAM to the workspace instead of being sent again).
    test "new streams displace kept heads; refused streams without their head get REFUSED_STREAM",
         %{tb: tb, sc: sc} do
      q = tag()
      big = ["a", 61_440]
      auth = "allowed.test:#{@h2_only}"

      f = fn path ->
        [[":method", "GET"], [":scheme", "https"], [":authority", auth], [":path", path], ["x-big", big]]
      end

      # The warm-up stream makes sure the upstream connection takes streams.
      # Then /goaway-wait (the origin stops for 2 s, then GOAWAY refusing it
      # and every later stream) and 15 /count streams: 16 kept heads of
      # 64 KiB, the whole budget. 4 more streams each drop the oldest kept
      # head: workspace streams 3 (/goaway-wait), 5, 7 and 9. After the
      # GOAWAY the other 16 are sent again on a new connection.
      warm = [[[":method", "GET"], [":scheme", "https"], [":authority", auth], [":path", "/count/warm?#{q}"]]]
      held = [f.("/goaway-wait/a?#{q}")] ++ for(i <- 1..15, do: f.("/count/b#{i}?#{q}"))
      new = for i <- 1..4, do: f.("/count/c#{i}?#{q}")

      out =
        h2_raw(tb, sc, %{
          host: "allowed.test",
          port: @h2_only,
          mode: "custom",
          streams: warm,
          then: [held ++ new],
          huffman: false
        })

      assert out["goaway"] == nil, inspect(Map.delete(out, "streams"))
      assert %{"status" => 200} = out["streams"]["1"]

      for sid <- [3, 5, 7, 9] do
        st = out["streams"]["#{sid}"]
        assert st["reset"] == 7 and not Map.has_key?(st, "status"), inspect(st)
      end

      for sid <- 11..41//2 do
        assert %{"status" => 200, "body" => "h2 origin /count/" <> rest} = out["streams"]["#{sid}"]
        assert rest =~ ~r/ seen 1\n$/
      end

      events = events_for(q, 21)
      refute Enum.any?(events, &(&1["event"] == "request_denied")), inspect(events)

      failed = for %{"event" => "request_failed"} = ev <- events, do: {ev["stream_id"], ev["reason"]}

      assert Enum.sort(failed) == for(sid <- [3, 5, 7, 9], do: {sid, "upstream_reset: RST_STREAM REFUSED_STREAM"})
    end
  end

  describe "request targets" do
    # A :path that is not origin-form (or a :scheme that is not https) would
    # reach the upstream as an absolute-form request line or a :path it
    # routes by, naming another host than the policy saw: 400 on the stream,
    # before any evaluation, on both the translated and the h2 upstream.
    for {port, label} <- [{@h1_only, "HTTP/1.1"}, {@h2_only, "h2"}] do
      test "absolute-form :path or another :scheme is refused with 400 (#{label} upstream)", %{tb: tb, sc: sc} do
        q = tag()
        auth = "allowed.test:#{unquote(port)}"
        f = fn scheme, path -> [[":method", "GET"], [":scheme", scheme], [":authority", auth], [":path", path]] end

        streams = [
          f.("foo", "http://evil.example/x?#{q}"),
          f.("foo", "evil.example:443"),
          f.("foo", "/n1?#{q}"),
          f.("http", "/n1?#{q}"),
          f.("https", "/n1?#{q}")
        ]

        out = h2_raw(tb, sc, %{host: "allowed.test", port: unquote(port), mode: "custom", streams: streams, query: q})
        assert out["goaway"] == nil, inspect(out)

        for sid <- ["1", "3", "5", "7"] do
          st = out["streams"][sid]
          # nghttp2 may refuse some shapes itself (RST_STREAM); never forwarded.
          assert st["status"] == 400 or Map.has_key?(st, "reset"), inspect(out)
          refute (st["body"] || "") =~ ~r/scripted|h2 origin/
        end

        assert %{"status" => 200, "ended" => true} = out["streams"]["9"]
      end
    end
  end

  describe ":path bytes" do
    test "a :path that is not visible ASCII is refused with 400 before evaluation, and logged", %{tb: tb, sc: sc} do
      q = tag()
      f = fn path -> [[":method", "GET"], [":scheme", "https"], [":authority", "allowed.test"], [":path", path]] end

      # Not UTF-8 (Latin-1 bytes), UTF-8 but not ASCII, a control byte; then a clean one.
      streams = [f.(%{latin1: "/caf\u00e9?#{q}"}), f.("/caf\u00e9?#{q}"), f.(%{latin1: "/a\u0001b?#{q}"}), f.("/?#{q}")]
      out = h2_raw(tb, sc, %{host: "allowed.test", mode: "custom", streams: streams, query: q})
      assert out["goaway"] == nil, inspect(out)

      for sid <- ["1", "3", "5"] do
        st = out["streams"][sid]
        # nghttp2 may refuse a control byte itself (RST_STREAM); never forwarded.
        assert st["status"] == 400 or Map.has_key?(st, "reset"), inspect(out)
        refute (st["body"] || "") =~ "hello from"
      end

      assert out["streams"]["1"]["body"] =~ ":path must be visible ASCII"
      assert %{"status" => 200, "body" => "hello from allowed.test\n"} = out["streams"]["7"]

      # Every request is in the audit trail, the Latin-1 one with U+FFFD (a
      # control byte nghttp2 refuses itself: its event has no path to match).
      denied =
        q
        |> events_for(3)
        |> Enum.filter(&(&1["event"] == "request_denied"))
        |> Map.new(&{&1["stream_id"], &1})

      assert denied[1]["reason"] == "bad_request: invalid byte in :path"
      assert denied[1]["path"] == "/caf\uFFFD"
      assert denied[3]["reason"] == "bad_request: invalid byte in :path"
      assert denied[3]["path"] == "/caf\u00e9"
    end

    test "a :method longer than the records keep is refused with 400", %{tb: tb, sc: sc} do
      q = tag()
      long = String.duplicate("M", 40)
      f = fn m -> [[":method", m], [":scheme", "https"], [":authority", "allowed.test"], [":path", "/?#{q}"]] end
      out = h2_raw(tb, sc, %{host: "allowed.test", mode: "custom", streams: [f.(long), f.("GET")], query: q})
      assert %{"status" => 400, "body" => body} = out["streams"]["1"], inspect(out)
      assert body =~ ":method is too long"
      assert %{"status" => 200} = out["streams"]["3"]

      denied = q |> events_for(2) |> Enum.find(&(&1["event"] == "request_denied"))
      assert denied["reason"] == "bad_request: method too long" and denied["method"] == String.slice(long, 0, 31)
    end
  end

  describe "the :authority against the connection" do
    test "another port is misdirected (421), a malformed port is 400, the connection's own port passes",
         %{tb: tb, sc: sc} do
      q = tag()
      f = fn auth -> [[":method", "GET"], [":scheme", "https"], [":authority", auth], [":path", "/?#{q}"]] end

      streams = [f.("allowed.test:444"), f.("allowed.test:0"), f.("allowed.test:99999"), f.("allowed.test:443")]
      out = h2_raw(tb, sc, %{host: "allowed.test", mode: "custom", streams: streams, query: q})
      assert out["goaway"] == nil, inspect(out)

      assert %{"status" => 421, "body" => body} = out["streams"]["1"]
      assert body =~ "the :authority names port 444 but this connection is to port 443"

      for sid <- ["3", "5"] do
        assert %{"status" => 400, "body" => body} = out["streams"][sid]
        assert body =~ "the :authority is not a valid host name or address"
      end

      assert %{"status" => 200, "body" => "hello from allowed.test\n"} = out["streams"]["7"]

      denied =
        q
        |> events_for(4)
        |> Enum.filter(&(&1["event"] == "request_denied"))
        |> Map.new(&{&1["stream_id"], {&1["reason"], &1["host"]}})

      assert denied == %{
               1 => {"misdirected_request", "allowed.test"},
               3 => {"invalid_host", "allowed.test:0"},
               5 => {"invalid_host", "allowed.test:99999"}
             }
    end
  end

  describe "flow control" do
    test "uploads held while a decision is pending and then denied give their window back", %{tb: tb, sc: sc} do
      # 24 x 64 KiB buffered then dropped would exceed the 1 MiB connection
      # window if the bytes were never given back: the last ones would hang.
      q = tag()
      paths = List.duplicate("/secret", 24) ++ ["/"]
      out = h2_raw(tb, sc, %{host: "decide.test", mode: "uploads", paths: paths, size: 65_535, query: q})
      refute out["error"], inspect(out)

      for i <- 0..23 do
        assert %{"status" => 403} = out["streams"]["#{2 * i + 1}"], inspect(out)
      end

      assert %{"status" => s} = out["streams"]["49"]
      assert s != 403
    end
  end

  describe "floods" do
    for {mode, reason} <- [
          continuation_flood: "h2_continuation_flood",
          settings_flood: "h2_settings_flood",
          ping_flood: "h2_ping_flood"
        ] do
      test "#{mode}: GOAWAY ENHANCE_YOUR_CALM and an event", %{tb: tb, sc: sc} do
        out = h2_raw(tb, sc, %{host: "allowed.test", mode: unquote(to_string(mode)), count: 1000, query: tag()})
        assert out["goaway"] == 11, inspect(out)
        assert_receive {:egress_event, %{"event" => "request_failed", "reason" => unquote(reason)} = ev}, 10_000
        assert ev["sni"] == "allowed.test"
      end
    end
  end

  describe "teardown" do
    test "a connection that fails (a guard limit) ends every open stream with request_failed", %{tb: tb, sc: sc} do
      q = tag()

      out =
        h2_raw(tb, sc, %{host: "allowed.test", port: @h1_only, mode: "ping_flood", path: "/slow", count: 1000, query: q})

      assert out["goaway"] == 11, inspect(out)
      last = List.last(events_for(q))
      assert last["event"] == "request_failed" and last["stream_id"] == 1, inspect(last)
      assert last["reason"] =~ "flood", inspect(last)
    end
  end

  describe "early answers" do
    test "a stream answered while the workspace still uploads gets RST_STREAM(NO_ERROR) after the answer",
         %{tb: tb, sc: sc} do
      # RFC 9113 §8.1: the workspace may stop sending; without the reset its
      # upload would fill the stream's buffer and the stream kept its slot.
      q = tag()
      out = h2_raw(tb, sc, %{host: "decide.test", mode: "upload_open", path: "/secret", query: q})
      assert %{"status" => 403, "ended" => true, "reset" => 0} = out["streams"]["1"], inspect(out)
      assert %{"event" => "request_denied", "stream_id" => 1} = List.last(events_for(q))
    end

    test "a stream answered while the rest of its declared body fits a window is not reset: the workspace ends it",
         %{tb: tb, sc: sc} do
      # 1000 of 1500 announced bytes sent, then nothing for 3 s: the 500
      # left fit the stream's window, so no RST_STREAM comes (curl 7.88,
      # answered before it sent its body, reports such a reset as a stream
      # error instead of the 403 it received).
      q = tag()
      out = h2_raw(tb, sc, %{host: "decide.test", mode: "upload_open", path: "/secret", size: 1500, query: q})
      assert %{"status" => 403, "ended" => true} = st = out["streams"]["1"], inspect(out)
      refute Map.has_key?(st, "reset"), inspect(out)
      assert %{"event" => "request_denied", "stream_id" => 1} = List.last(events_for(q))
    end
  end

  describe "event shapes" do
    test "translation: a name that resolves to a private address is request_denied, never request_allowed",
         %{tb: tb, sc: sc} do
      q = tag()
      out = h2_raw(tb, sc, %{host: "metadata.test", mode: "paths", paths: ["/"], query: q})
      assert %{"status" => 403} = out["streams"]["1"], inspect(out)
      events = events_for(q)
      refute Enum.any?(events, &(&1["event"] == "request_allowed")), inspect(events)
      assert %{"event" => "request_denied", "reason" => "upstream_private_address: 169.254.169.254"} = List.last(events)
    end

    test "a stream nghttp2 refuses as malformed gets request_opened and request_denied", %{tb: tb, sc: sc} do
      # No :path (RFC 9113 §8.3.1): nghttp2 resets the stream itself.
      fields = [[":method", "GET"], [":scheme", "https"], [":authority", "allowed.test"]]
      out = h2_raw(tb, sc, %{host: "allowed.test", mode: "custom", streams: [fields]})
      assert out["streams"]["1"]["reset"] == 1, inspect(out)
      assert_receive {:egress_event, %{"event" => "request_opened", "stream_id" => 1, "host" => "allowed.test"}}, 5_000
      assert_receive {:egress_event, %{"event" => "request_denied", "stream_id" => 1} = ev}, 5_000
      assert ev["reason"] =~ "bad_request: malformed stream"
    end

    test "a stream the h2 upstream refuses (REFUSED_STREAM) is refused to the workspace the same way",
         %{tb: tb, sc: sc} do
      q = tag()
      out = h2_raw(tb, sc, %{host: "allowed.test", port: @h2_only, mode: "paths", paths: ["/refuse"], query: q})
      assert out["streams"]["1"]["reset"] == 7, inspect(out)
      last = List.last(events_for(q))
      assert last["event"] == "request_failed" and last["reason"] == "upstream_reset: RST_STREAM REFUSED_STREAM"
    end
  end

  describe "failed connections" do
    test "a workspace that never reads the GOAWAY after a guard limit is cut by a fixed deadline",
         %{tb: tb, sc: sc} do
      # The GOAWAY waits behind 16 MiB of unread response; the workspace
      # keeps sending. Without the deadline every read re-armed the idle
      # timer (300 s) and the connection kept its slot.
      q = tag()

      out = h2_raw(tb, sc, %{host: "allowed.test", mode: "fail_unread", path: "/big.bin", seconds: 15, query: q})

      assert is_number(out["closed_after"]), inspect(Map.delete(out, "streams"))
      assert out["closed_after"] < 10, inspect(Map.delete(out, "streams"))
      assert_receive {:egress_event, %{"event" => "request_failed", "reason" => "h2_ping_flood"}}, 10_000
    end
  end

  describe "memory" do
    # What the proxy accounts for (its buffer statistics, docs/proxy.md
    # "Signals"), not the process's RSS: under the sanitizers RSS also
    # counts the allocator's quarantine, which grows with every byte moved
    # by earlier tests and with the load of the machine (RSS is measured
    # by the benchmark, bench/README.md). The bound is the limits'
    # (docs/proxy.md "Limits", docs/http2.md §4) for one connection: its
    # two input buffers, the output queued towards the workspace up to the
    # high-water mark plus the one write that crosses it, the stream's
    # response buffer (one upstream stream window, 1 MiB, in chunks of
    # 16,375 bytes that cost 16,408 with their headroom and record: 65 of
    # them, and two more when the first is partly taken and the last partly
    # filled) and its request head.
    @held_bound 2 * 128 * 1024 + (256 + 64) * 1024 + 67 * 16_408 + 64 * 1024

    test "a slow reader of a 20 MiB response: what the proxy holds stays within its limits, then all bytes arrive",
         %{tb: tb, sc: sc} do
      q = tag()

      task =
        Task.async(fn ->
          h2_raw(tb, sc, %{host: "allowed.test", mode: "slow_reader", path: "/big.bin", seconds: 4, query: q})
        end)

      Process.sleep(1_000)
      samples = Enum.map(1..10, fn _ -> Process.sleep(250) && Sidecar.buffer_stats(sc) end)
      # Still inside the reader's pause: nginx, held by the windows, has not
      # finished the response (it logs a request when it did).
      refute Enum.any?(Testbed.access_log(tb), &(&1["uri"] == "/big.bin?#{q}"))
      out = Task.await(task, 60_000)
      assert %{"status" => 200, "ended" => true, "size" => 20_971_520} = out["streams"]["1"]

      peak = Enum.max_by(samples, & &1["held"])
      assert peak["held"] <= @held_bound, "the proxy held #{inspect(peak)}, over #{@held_bound} bytes"
      # The stall was seen (the reader's bytes waited in the proxy), so the
      # bound above was tested against a full pipe, not an idle one.
      # (The stream itself may already be gone from the proxy's count while
      # its last bytes wait in the queue: the queue is what shows the stall.)
      assert Enum.any?(samples, &(&1["queued"] > 0)), inspect(samples)
    end
  end

  describe "translation memory" do
    test "responses the workspace does not read stop the HTTP/1.1 upstreams at the connection's budget, then all arrive",
         %{tb: tb, sc: sc} do
      # SETTINGS_INITIAL_WINDOW_SIZE 0 and 60 streams of 60000-byte
      # responses: each fits a stream's buffer, so without a connection
      # budget every response was read whole from the upstream and held
      # (60 × 60000 bytes). With it (1 MiB) the upstreams stop: keep-alive
      # sends the next request on a connection only after the whole
      # previous response was taken, so the origin sees about 1 MiB worth
      # of requests plus one per pooled connection.
      key = "k#{System.unique_integer([:positive])}"
      n = 60
      size = 60_000
      paths = Enum.map(1..n, &"/blob?key=#{key}&i=#{&1}&size=#{size}")

      out =
        h2_raw(tb, sc, %{
          host: "allowed.test",
          port: @h1_only,
          mode: "window_zero",
          paths: paths,
          seconds: 3,
          stats: "/blob-stats?key=#{key}",
          query: tag()
        })

      [requests, bytes] = out["stats"] |> String.split() |> Enum.map(&String.to_integer/1)
      assert requests <= 30, "the origin served #{requests} of #{n} requests while nothing was read"
      assert bytes <= 30 * size, "the origin wrote #{bytes} bytes while nothing was read"

      for i <- 1..n do
        unit = "blob #{i} "
        body = unit |> String.duplicate(div(size, byte_size(unit)) + 1) |> binary_part(0, size)
        sha = :crypto.hash(:sha256, body) |> Base.encode16(case: :lower)

        assert %{"status" => 200, "ended" => true, "size" => ^size, "sha256" => ^sha} = out["streams"]["#{2 * i - 1}"],
               "stream #{2 * i - 1}: #{inspect(out["streams"]["#{2 * i - 1}"])}"
      end

      assert out["goaway"] == nil
      r = Client.run(tb, :curl, "https://allowed.test:#{@h1_only}/blob-stats?key=#{key}", ca: sc.ca_cert, http: :h1)
      assert r.ok and r.body == "#{n} #{n * size}", inspect(r)
    end
  end
end
