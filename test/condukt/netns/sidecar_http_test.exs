defmodule Condukt.Netns.SidecarHttpTest do
  # The sidecar's HTTP/1.1 corners and its operational limits end to end:
  # Expect: 100-continue, bodiless responses and re-chunking, pipelining
  # across hosts, the TCP control port seen from the workspace, the
  # ClientHello / header / idle timeouts, --max-connections, the SIGTERM
  # drain, unreachable upstreams, and the body preview and redaction in
  # events. Every test gets its own proxy (most need their own flags, and
  # two of them stop it), started in one shared testbed; every proxy is
  # stopped with SIGTERM at the end of its test and must drain cleanly and
  # without a sanitizer report.
  #
  # Raw HTTP is spoken by small Python programs inside the pod
  # (clients/rawhttp.py, run through RawHttp.py/4), so that framing, ordering and connection reuse are
  # observed byte for byte rather than through a client library's
  # forgiveness.
  use Condukt.Test.Netns.Case, async: false

  import Condukt.Test.Netns.RawHttp

  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  # The decide rule (matching every other host) is answered by the test's
  # ControlPeer, which refuses.
  def decider(_ctx, _req), do: {:deny, "decided on the BEAM"}

  @policy [
    rules: [
      deny: ["denied.test"],
      allow: ~w(allowed.test v4.test pod.test nxdomain.test 10.233.0.2),
      decide: &__MODULE__.decider/2
    ],
    default: :deny
  ]

  setup_all do
    %{tb: Testbed.start(big_size: 100 * 1024 * 1024)}
  end

  # One proxy per test: @tag sidecar: [Sidecar.start options] chooses its
  # flags; @tag drain: true leaves stopping it to the test.
  setup %{tb: tb} = ctx do
    opts = Map.get(ctx, :sidecar, [])
    sc = Sidecar.start(tb, @policy, opts)
    sc = if opts[:control] == "tcp", do: Sidecar.port_forward(sc), else: sc

    unless ctx[:drain], do: on_exit(fn -> Sidecar.stop(sc) end)

    decide = Map.get(ctx, :decide, fn _ -> {:deny, "the decider says no"} end)
    {:ok, peer} = ControlPeer.start_link(sc, self(), decide)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    %{sc: sc, peer: peer}
  end

  ## Helpers

  defp names(events), do: Enum.map(events, & &1["event"])

  ## 1. Expect: 100-continue

  describe "Expect: 100-continue" do
    test "curl waits for the 100 the origin sends through the proxy; the body arrives intact", %{tb: tb, sc: sc} do
      {path, sha} = Testbed.make_file(tb, "expect-#{System.unique_integer([:positive])}.bin", 2_000_000)
      q = tag()

      # A long --expect100-timeout: had the 100 not come through, curl would
      # sit out the test's deadline instead of sending the body anyway.
      r =
        Client.run(tb, :curl, "https://allowed.test/upload?#{q}",
          method: "POST",
          body: {:file, path},
          headers: [{"Expect", "100-continue"}],
          extra_args: ["-v", "--expect100-timeout", "60"],
          http: :h1,
          ca: sc.ca_cert,
          timeout: 40_000
        )

      assert r.ok and r.status == 200, inspect(r)
      assert r.output =~ ~r/< HTTP\/1\.1 100 Continue/, r.output
      echo = Condukt.JSON.decode!(r.body)
      assert echo["body_sha256"] == sha
      assert echo["body_size"] == 2_000_000

      closed = List.last(events_for(sc, q))
      assert closed["event"] == "request_closed"
      assert closed["status"] == 200
      assert closed["bytes_out"] >= 2_000_000
    end

    test "a raw client sends the body only after the 100, on 80 and 443", %{tb: tb, sc: sc} do
      script = ~S'''
      out = []
      for port in (80, 443):
          q = sys.argv[2] + "-" + str(port)
          body = bytes(i % 251 for i in range(300000))
          s = connect("allowed.test", port)
          r = Reader(s)
          s.sendall(request("POST", "/upload?" + q, "allowed.test",
                            "Content-Length: %d\r\nExpect: 100-continue\r\n" % len(body)))
          # Nothing of the body is sent before the interim answer.
          first_status, _ = r.head()
          s.sendall(body)
          resp = r.response("POST")
          # The connection stays usable.
          s.sendall(request("GET", "/?" + q + "-after", "allowed.test"))
          after = r.response()
          out.append({"port": port, "first": first_status, "resp": resp, "after": after,
                      "sha": hashlib.sha256(body).hexdigest()})
      print(json.dumps(out))
      '''

      q = tag()

      for res <- py(tb, sc, script, [q]) do
        assert res["first"] == 100, inspect(res)
        assert res["resp"]["status"] == 200
        echo = Condukt.JSON.decode!(res["resp"]["body"] || "{}")
        assert echo["body_sha256"] == res["sha"], inspect(res)
        assert echo["body_size"] == 300_000
        assert res["after"]["status"] == 200
        assert res["after"]["body"] == "hello from allowed.test\n"

        events = events_for(sc, "#{q}-#{res["port"]}")
        assert names(events) == ~w(request_opened request_allowed request_closed)
      end
    end

    test "a refused request that expects 100-continue is answered at once and the connection closed",
         %{tb: tb, sc: sc} do
      # The client has not sent (and, per RFC 9110 §10.1.1, need not send)
      # the body: the proxy must neither wait for it nor keep the
      # connection, or the next request's bytes would be taken for it.
      script = ~S'''
      q = sys.argv[2]
      res = {}
      for port in (80, 443):
          s = connect("denied.test", port)
          r = Reader(s)
          s.sendall(request("POST", "/upload?" + q + "-" + str(port), "denied.test",
                            "Content-Length: 1000\r\nExpect: 100-continue\r\n"))
          resp = r.response("POST")
          s.settimeout(10)
          res[str(port)] = {"resp": resp, "end": ending(s, 10)}
      print(json.dumps(res))
      '''

      q = tag()
      res = py(tb, sc, script, [q])

      for port <- ["80", "443"] do
        %{"resp" => resp, "end" => ending} = res[port]
        assert resp["status"] == 403, inspect(res)
        assert resp["interim"] == [], "no 100 Continue for a refused request"
        assert header(resp["headers"], "connection") == "close", inspect(resp)
        assert ending["how"] in ["eof", "reset"] and ending["bytes"] == 0, inspect(ending)
        assert names(events_for(sc, "#{q}-#{port}")) == ~w(request_opened request_denied)
      end
    end
  end

  ## 2. HEAD, 204, 304, chunked

  describe "bodiless responses and chunked re-framing" do
    test "HEAD, 304 and 204 carry no body and the connection goes on; /chunked arrives intact",
         %{tb: tb, sc: sc} do
      script = ~S'''
      q = sys.argv[2]
      expected_chunked = b"".join(bytes((i + j) % 251 for j in range(4096)) for i in range(20))
      out = {}
      for port in (80, 443):
          s = connect("allowed.test", port)
          local = s.getsockname()
          r = Reader(s)
          seq = []
          def ask(method, path, extra=""):
              s.sendall(request(method, path, "allowed.test", extra))
              resp = r.response(method)
              seq.append(resp)
              return resp
          first = ask("GET", "/?%s-%d-1" % (q, port))
          etag = dict(first["headers"])["etag"]
          ask("GET", "/?%s-%d-2" % (q, port), "If-None-Match: %s\r\n" % etag)
          ask("HEAD", "/?%s-%d-3" % (q, port))
          ask("GET", "/204?%s-%d-4" % (q, port))
          ask("GET", "/chunked?n=20&size=4096&%s-%d-5" % (q, port))
          ask("GET", "/?%s-%d-6" % (q, port))
          out[str(port)] = {"seq": seq, "same_socket": s.getsockname() == local,
                            "chunked_sha": hashlib.sha256(expected_chunked).hexdigest()}
          s.close()
      print(json.dumps(out))
      '''

      q = tag()
      out = py(tb, sc, script, [q])

      for port <- [80, 443] do
        %{"seq" => seq, "same_socket" => true, "chunked_sha" => chunked_sha} = out["#{port}"]
        assert Enum.map(seq, & &1["status"]) == [200, 304, 200, 204, 200, 200], inspect(seq)
        [get, not_modified, head, no_content, chunked, again] = seq

        assert get["body"] == "hello from allowed.test\n"

        for resp <- [not_modified, head, no_content] do
          refute header(resp["headers"], "transfer-encoding"), inspect(resp)
          refute header(resp["headers"], "connection") == "close", inspect(resp)
        end

        # HEAD keeps the length of the GET it stands for.
        assert header(head["headers"], "content-length") == "24"
        assert header(chunked["headers"], "transfer-encoding") == "chunked"
        assert chunked["body_size"] == 20 * 4096
        assert chunked["body_sha256"] == chunked_sha
        assert again["body"] == "hello from allowed.test\n"

        # One connection, one event chain per request, each with its status.
        statuses =
          for i <- 1..6 do
            query = if i == 5, do: "n=20&size=4096&#{q}-#{port}-5", else: "#{q}-#{port}-#{i}"
            closed = List.last(events_for(sc, query))
            assert closed["event"] == "request_closed"
            closed["status"]
          end

        assert statuses == [200, 304, 200, 204, 200, 200]
      end

      chunked_event = List.last(events_for(sc, "n=20&size=4096&#{q}-443-5"))
      assert chunked_event["bytes_in"] >= 20 * 4096
    end
  end

  describe "buffers released between requests" do
    # An idle keep-alive connection holds no input buffer (they come from
    # the loop's pool while they hold bytes, docs/proxy.md "Memory of an
    # idle connection"): each request below arrives after its connection's
    # buffers went back, with large heads and bodies that fill them again
    # (on 443 the upstream speaks h2, so h1h2.c's buffers too).
    test "one connection serves many requests with large heads, bodies and chunked answers, pausing between",
         %{tb: tb, sc: sc} do
      script = ~S'''
      import random
      q = sys.argv[2]
      rnd = random.Random(7)
      out = {}
      for port in (80, 443):
          s = connect("allowed.test", port)
          local = s.getsockname()
          r = Reader(s)
          seq = []
          for i in range(24):
              # Three fields of 3000 bytes each (nginx's h2 bounds: 4 KiB a
              # field, 16 KiB a head), fresh values each time (no HPACK reuse).
              vals = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3000)) for _ in range(3)]
              extra = "".join("X-Big-%d: %s\r\n" % (k, v) for k, v in enumerate(vals))
              kind = i % 3
              if kind == 0:
                  s.sendall(request("GET", "/echo?%s-%d-%d" % (q, port, i), "allowed.test", extra))
              elif kind == 1:
                  body = bytes(rnd.getrandbits(8) for _ in range(150000))
                  s.sendall(request("POST", "/echo?%s-%d-%d" % (q, port, i), "allowed.test",
                                    extra + "Content-Length: %d\r\n" % len(body)) + body)
              else:
                  s.sendall(request("GET", "/chunked?n=8&size=30000&%s-%d-%d" % (q, port, i), "allowed.test", extra))
              status, headers = r.head()
              h = dict(headers)
              if "chunked" in h.get("transfer-encoding", ""):
                  data = b""
                  while True:
                      size = int(r.line().split(b";")[0], 16)
                      if size == 0:
                          while r.line() != b"":
                              pass
                          break
                      data += r.exact(size)
                      r.exact(2)
              else:
                  data = r.exact(int(h.get("content-length", "0")))
              item = {"status": status, "size": len(data), "kind": kind}
              if kind != 2:
                  try:
                      echo = json.loads(data)
                  except ValueError:
                      echo = {}
                  item["fields_ok"] = all(["x-big-%d" % k, v] in echo.get("headers", []) for k, v in enumerate(vals))
                  if kind == 1:
                      item["body_ok"] = echo.get("body_sha256") == hashlib.sha256(body).hexdigest() and echo.get("body_size") == len(body)
              seq.append(item)
              time.sleep(0.03)
          out[str(port)] = {"seq": seq, "same_socket": s.getsockname() == local}
          s.close()
      print(json.dumps(out))
      '''

      q = tag()
      out = py(tb, sc, script, [q])

      for port <- [80, 443] do
        %{"seq" => seq, "same_socket" => true} = out["#{port}"]
        assert length(seq) == 24

        for item <- seq do
          assert item["status"] == 200, inspect({port, item})

          case item["kind"] do
            0 -> assert item["fields_ok"], inspect({port, item})
            1 -> assert item["fields_ok"] and item["body_ok"], inspect({port, item})
            2 -> assert item["size"] == 8 * 30000, inspect({port, item})
          end
        end

        for i <- 0..23 do
          query = if rem(i, 3) == 2, do: "n=8&size=30000&#{q}-#{port}-#{i}", else: "#{q}-#{port}-#{i}"
          assert List.last(events_for(sc, query))["event"] == "request_closed", "#{port} #{i}"
        end
      end
    end
  end

  ## 3. Pipelining

  describe "a slow HTTP/1.1 reader of an h2 upstream" do
    # On 443 the upstream speaks h2 (h1h2.c). Its DATA is acknowledged only
    # while the workspace's socket is under the high-water mark, so what
    # the proxy holds for one connection stays within: its two input
    # buffers, the queue towards the workspace (the high-water mark and one
    # write of a TLS record), the response window the upstream may send
    # beyond it (1 MiB, in the queue or still as TLS records), and h1h2's
    # field buffer.
    @h1h2_held_bound 2 * 128 * 1024 + (256 * 1024 + 1024 * 1024 + 64 * 1024) + 64 * 1024

    test "a download read at 1 MB/s: what the proxy holds stays within its limits", %{tb: tb, sc: sc} do
      q = tag()

      task =
        Task.async(fn ->
          Client.run(tb, :curl, "https://allowed.test/big.bin?#{q}",
            ca: sc.ca_cert,
            http: :h1,
            extra_args: ["--limit-rate", "1M", "--max-time", "5"],
            timeout: 30_000
          )
        end)

      Process.sleep(1_500)
      samples = Enum.map(1..8, fn _ -> Process.sleep(250) && Sidecar.buffer_stats(sc) end)
      r = Task.await(task, 30_000)
      # curl gives up at --max-time (28), having read only part of the body.
      assert r.exit_status == 28, inspect(r)

      # held (buffers and queues) and tls (OpenSSL's buffers, the upstream's
      # records not yet taken included): all the connection's bytes.
      peak = Enum.max_by(samples, &(&1["held"] + &1["tls"]))

      assert peak["held"] + peak["tls"] <= @h1h2_held_bound,
             "the proxy held #{inspect(peak)}, over #{@h1h2_held_bound} bytes"

      # The reader was slower than the origin: the bytes waited in the proxy.
      assert Enum.any?(samples, &(&1["queued"] > 0)), inspect(samples)
    end
  end

  describe "pipelining" do
    test "pipelined plain-HTTP requests to several hosts are answered in order, each evaluated on its own",
         %{tb: tb, sc: sc} do
      script = ~S'''
      q = sys.argv[2]
      s = connect("allowed.test", 80)
      r = Reader(s)
      s.sendall(request("GET", "/?%s-1" % q, "allowed.test") +
                request("GET", "/?%s-2" % q, "denied.test") +
                request("GET", "/?%s-3" % q, "v4.test") +
                request("GET", "/?%s-4" % q, "allowed.test", "Connection: close\r\n"))
      resps = [r.response() for _ in range(4)]
      print(json.dumps({"resps": resps, "end": ending(s, 10)}))
      '''

      q = tag()
      %{"resps" => resps, "end" => ending} = py(tb, sc, script, [q])

      assert Enum.map(resps, & &1["status"]) == [200, 403, 200, 200], inspect(resps)
      [one, two, three, four] = resps
      assert one["body"] == "hello from allowed.test\n"
      assert two["body"] =~ "refused the request to denied.test"
      assert header(two["headers"], "x-condukt-egress") == "refused"
      # The request named v4.test: it went there, not to the address dialled.
      assert three["body"] == "hello from v4.test\n"
      assert four["body"] == "hello from allowed.test\n"
      assert header(four["headers"], "connection") == "close"
      assert ending["how"] == "eof" and ending["bytes"] == 0

      assert names(events_for(sc, "#{q}-1")) == ~w(request_opened request_allowed request_closed)
      assert [_, denied] = events_for(sc, "#{q}-2")
      assert denied["event"] == "request_denied" and denied["host"] == "denied.test"
      assert denied["matched_rule"] == %{"index" => 0, "kind" => "deny"}
      assert %{"event" => "request_closed", "host" => "v4.test"} = List.last(events_for(sc, "#{q}-3"))
      assert %{"event" => "request_closed", "host" => "allowed.test"} = List.last(events_for(sc, "#{q}-4"))

      # All four came over one workspace connection.
      ids = for i <- 1..4, do: hd(events_for(sc, "#{q}-#{i}"))["connection_id"]
      assert length(Enum.uniq(ids)) == 1
    end
  end

  describe "refusals on a keep-alive connection" do
    test "a refused request's small body is skipped and the next request is answered (rule and decider)",
         %{tb: tb, sc: sc} do
      script = ~S'''
      q = sys.argv[2]
      out = {}
      for port in (80, 443):
          host = "allowed.test"
          s = connect(host, port) if port == 80 else None
          r = Reader(s) if s else None
          seq = []
          # On 443 the SNI is the host, so each host gets its own connection
          # there; on 80 all of it goes over one.
          for i, (h, body) in enumerate([("denied.test", b"d" * 100), ("allowed.test", None),
                                         ("decide.test", b"x" * 100), ("allowed.test", None)]):
              if port == 443:
                  s = connect(h, 443)
                  r = Reader(s)
              path = "/?%s-%d-%d" % (q, port, i)
              if body is None:
                  s.sendall(request("GET", path, h))
              else:
                  s.sendall(request("POST", path, h, "Content-Length: %d\r\n" % len(body)) + body)
              resp = r.response("POST" if body else "GET")
              seq.append(resp)
              if port == 443 and body is not None:
                  # The same connection goes on after the refusal.
                  s.sendall(request("GET", "/?%s-%d-%d-again" % (q, port, i), h))
                  seq.append(r.response())
          out[str(port)] = [x["status"] for x in seq]
      print(json.dumps(out))
      '''

      q = tag()
      out = py(tb, sc, script, [q])
      assert out["80"] == [403, 200, 403, 200], inspect(out)
      # On 443 the follow-up names the refused host again: refused again.
      assert out["443"] == [403, 403, 200, 403, 403, 200], inspect(out)

      denied = List.last(events_for(sc, "#{q}-80-2"))
      assert denied["event"] == "request_denied" and denied["reason"] == "the decider says no"
      assert denied["matched_rule"] == %{"index" => 2, "kind" => "decide"}
    end
  end

  # Allows a request whose body starts with "please", whatever else it
  # says; refuses the others, quoting the preview it was asked with. An
  # answer that depends on the body is not for the decision cache (which
  # keys on the rule and the host).
  def preview_decider(request) do
    preview = Base.decode64!(request["body_preview"] || "")
    answer = if String.starts_with?(preview, "please"), do: :allow, else: {:deny, "preview: " <> preview}
    {answer, false}
  end

  describe "decide rules and the body preview" do
    @tag sidecar: [extra_args: ~w(--body-preview 16)]
    @tag decide: &__MODULE__.preview_decider/1
    test "the decider's question carries the first body bytes, on HTTP/1.1 and h2", %{tb: tb, sc: sc} do
      for http <- [:h1, :h2] do
        q = tag()

        r =
          Client.run(tb, :curl, "https://decide.test/echo?#{q}",
            method: "POST",
            body: "please-let-me-through-#{http}",
            ca: sc.ca_cert,
            http: http
          )

        events = events_for(sc, q)
        assert "request_allowed" in names(events), "#{http}: #{inspect(events)}"
        assert Result.header(r, "x-condukt-egress") == nil, inspect(r)

        q = tag()

        r =
          Client.run(tb, :curl, "https://decide.test/echo?#{q}",
            method: "POST",
            body: "nope-0123456789abcdef",
            ca: sc.ca_cert,
            http: http
          )

        assert r.status == 403, inspect(r)
        # The first 16 bytes, as the decider saw them, and in the refusal's words.
        assert r.body =~ "reason: preview: nope-0123456789a\n", inspect(r.body)
        denied = List.last(events_for(sc, q))
        assert denied["event"] == "request_denied" and denied["reason"] == "preview: nope-0123456789a"
        assert denied["matched_rule"] == %{"index" => 2, "kind" => "decide"}
      end
    end
  end

  ## 4. The TCP control port, from the workspace

  describe "TCP control port" do
    @tag sidecar: [control: "tcp"]
    test "the workspace reaches 127.0.0.1:15002 but is closed without a byte; the real peer keeps working",
         %{tb: tb, sc: sc} do
      script = ~S'''
      attempts = {
          "garbage": b"hello\n",
          "not_json_then_hello": b"{\n",
          "wrong_token": (json.dumps({"type": "hello", "version": 1, "token": "00" * 32}) + "\n").encode(),
          "not_a_hello": b'{"type":"ping"}\n',
          "bad_version": (json.dumps({"type": "hello", "version": 2, "token": "ab" * 32}) + "\n").encode(),
          "oversized": b"x" * 5000,
          "silent": b"",
      }
      res = {}
      def attempt(name, data):
          s = socket.create_connection(("127.0.0.1", 15002), timeout=5)
          try:
              if data:
                  s.sendall(data)
          except OSError:
              pass
          res[name] = ending(s, 20)
      threads = [threading.Thread(target=attempt, args=kv) for kv in attempts.items()]
      for t in threads: t.start()
      for t in threads: t.join()
      print(json.dumps(res))
      '''

      # As a workspace user, not root.
      argv = argv(tb, sc, script)
      {out, 0} = Testbed.exec_in(tb, :pod, argv, timeout: 40_000, uid: 1000)
      res = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()

      assert map_size(res) == 7

      for {name, ending} <- res do
        assert ending["how"] in ["eof", "reset"], "#{name}: #{inspect(ending)}"
        assert ending["bytes"] == 0, "#{name} got bytes: #{inspect(ending)}"
      end

      assert Regex.scan(~r/dropped before authenticating/, Sidecar.stderr(sc)) |> length() == 7

      # The authenticated peer (through the port-forward) was not disturbed.
      refute_received {:egress_frame, %{"type" => "closed"}}
      q = tag()
      r = Client.run(tb, :curl, "https://allowed.test/?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.status == 200
      assert_receive {:egress_event, %{"event" => "request_closed", "query" => ^q}}, 10_000

      # A new peer with the token still authenticates and replaces it.
      {:ok, _second} = ControlPeer.start_link(sc, self(), fn _ -> :allow end)
      assert_receive {:egress_frame, %{"type" => "welcome", "session_id" => "e2e-" <> _}}, 10_000
      assert_receive {:egress_frame, %{"type" => "closed"}}, 10_000
    end
  end

  ## 5. Timeouts

  describe "timeouts" do
    @tag sidecar: [
           extra_args: ~w(--clienthello-timeout-ms 1000 --header-timeout-ms 1500 --idle-timeout-ms 2000)
         ]
    test "silent, slow-head and idle connections are closed; the first two are reported", %{tb: tb, sc: sc} do
      script = ~S'''
      q = sys.argv[2]
      res = {}
      def silent(port):
          s = socket.create_connection(("allowed.test", port), timeout=5)
          res["silent_%d" % port] = ending(s, 20)
      def half_head(port):
          s = connect("allowed.test", port)
          s.sendall(b"GET /?" + q.encode() + b" HTTP/1.1\r\nHost: allo")
          res["half_head_%d" % port] = ending(s, 20)
      def trickle():
          # A byte every 200 ms: the header deadline does not move.
          s = connect("allowed.test", 80)
          s.settimeout(0.2)
          t0 = time.monotonic()
          for b in b"GET / HTTP/1.1\r\nHost: allowed.test\r\nX-Slow: " + b"a" * 200:
              try:
                  s.send(bytes([b]))
                  if s.recv(100) == b"":
                      break
              except (socket.timeout, TimeoutError):
                  continue
              except OSError:
                  break
              if time.monotonic() - t0 > 20:
                  break
          res["trickle"] = ending(s, 20)
      def idle(port):
          s = connect("allowed.test", port)
          r = Reader(s)
          s.sendall(request("GET", "/?%s-idle-%d" % (q, port), "allowed.test"))
          resp = r.response()
          e = ending(s, 20)
          e["status"] = resp["status"]
          res["idle_%d" % port] = e
      def body_never_sent():
          # A refused request announces a body it never sends: the proxy
          # waits to skip it only as long as the idle timeout.
          s = connect("allowed.test", 80)
          r = Reader(s)
          s.sendall(request("POST", "/?%s-unsent" % q, "denied.test", "Content-Length: 1000\r\n"))
          resp = r.response("POST")
          e = ending(s, 20)
          e["status"] = resp["status"]
          res["body_never_sent"] = e
      jobs = [(silent, 80), (silent, 443), (half_head, 80), (half_head, 443), (trickle,), (idle, 80), (idle, 443),
              (body_never_sent,)]
      threads = [threading.Thread(target=j[0], args=j[1:]) for j in jobs]
      for t in threads: t.start()
      for t in threads: t.join()
      print(json.dumps(res))
      '''

      q = tag()
      res = py(tb, sc, script, [q])
      assert map_size(res) == 8, inspect(res)

      for {name, ending} <- res do
        # Closed by the proxy, well before the client's own 20 s.
        assert ending["how"] in ["eof", "reset"], "#{name}: #{inspect(ending)}"
        assert ending["bytes"] == 0, "#{name}: #{inspect(ending)}"
      end

      assert res["idle_80"]["status"] == 200 and res["idle_443"]["status"] == 200
      assert res["body_never_sent"]["status"] == 403

      failed = await_events(sc, 5, &(&1["event"] == "request_failed"))
      hello = Enum.filter(failed, &(&1["reason"] == "client_hello_timeout"))
      head = Enum.filter(failed, &(&1["reason"] == "request_header_timeout"))
      assert Enum.sort(Enum.map(hello, & &1["port"])) == [80, 443], inspect(failed)
      assert Enum.sort(Enum.map(head, & &1["port"])) == [80, 80, 443], inspect(failed)
      assert length(failed) == 5, inspect(failed)

      # An idle keep-alive connection simply ends: its request closed cleanly.
      for port <- [80, 443] do
        assert names(events_for(sc, "#{q}-idle-#{port}")) == ~w(request_opened request_allowed request_closed)
      end
    end
  end

  ## 6. --max-connections

  describe "connection limit" do
    @tag sidecar: [extra_args: ~w(--max-connections 3)]
    test "the N+1st connection is reset while N are open; afterwards new ones work", %{tb: tb, sc: sc} do
      script = ~S'''
      n = int(sys.argv[2])
      def get(s, r, path):
          s.sendall(request("GET", path, "allowed.test"))
          return r.response()["status"]
      conns = []
      for i in range(n):
          s = connect("allowed.test", 80)
          r = Reader(s)
          conns.append((s, r, get(s, r, "/?first-%d" % i)))
      try:
          extra = socket.create_connection(("allowed.test", 80), timeout=15)
      except ConnectionResetError:
          # The proxy's reset can arrive before connect() returns, which
          # then reports it (Linux wakes the connecting socket already
          # closed).
          extra = None
      if extra is None:
          extra_end = {"how": "reset", "bytes": 0}
      else:
          try:
              extra.sendall(request("GET", "/?extra", "allowed.test"))
          except OSError:
              pass
          extra_end = ending(extra, 15)
      second = [get(s, r, "/?second") for s, r, _ in conns]
      for s, _, _ in conns:
          s.close()
      # The proxy lets the closed ones go asynchronously: retry until a
      # deadline.
      after, deadline = None, time.monotonic() + 20
      while time.monotonic() < deadline:
          try:
              s = connect("allowed.test", 80)
              after = get(s, Reader(s), "/?after")
              s.close()
              break
          except (OSError, EOFError) as e:
              after = repr(e)
              time.sleep(0.1)
      print(json.dumps({"first": [c[2] for c in conns], "extra": extra_end, "second": second,
                        "after": after}))
      '''

      res = py(tb, sc, script, ["3"])
      assert res["first"] == [200, 200, 200]
      assert res["extra"]["how"] in ["reset", "eof"] and res["extra"]["bytes"] == 0, inspect(res["extra"])
      assert res["second"] == [200, 200, 200]
      assert res["after"] == 200
      assert Sidecar.stderr(sc) =~ "connection limit (3) reached"
      refute Enum.any?(Sidecar.stdout_events(sc), &(&1["query"] == "extra"))
    end
  end

  ## 7. SIGTERM

  describe "SIGTERM drain" do
    @tag drain: true
    test "a busy exchange finishes, idle connections close, new ones are refused, exit is clean",
         %{tb: tb, sc: sc} do
      q = tag()
      idle_q = tag()

      # An idle keep-alive connection, reported when it ends.
      idle =
        Task.async(fn ->
          script = ~S'''
          s = connect("allowed.test", 443)
          r = Reader(s)
          s.sendall(request("GET", "/?" + sys.argv[2], "allowed.test"))
          status = r.response()["status"]
          e = ending(s, 40)
          e["status"] = status
          print(json.dumps(e))
          '''

          py(tb, sc, script, [idle_q])
        end)

      busy =
        Task.async(fn ->
          Client.run(tb, :curl, "https://allowed.test/slow?ms=4000&#{q}", ca: sc.ca_cert, http: :h1, timeout: 40_000)
        end)

      await_events(sc, 1, &(&1["query"] == idle_q and &1["event"] == "request_closed"))
      await_events(sc, 1, &(&1["query"] == "ms=4000&#{q}" and &1["event"] == "request_allowed"))
      System.cmd("kill", ["-TERM", "#{sc.pid}"])
      :ok = Cmd.poll(fn -> Sidecar.stderr(sc) =~ "SIGTERM: draining" end, 10_000)

      # No new connection is taken while draining.
      refused = Client.run(tb, :curl, "http://allowed.test/?#{tag()}", ca: sc.ca_cert, timeout: 10_000)
      refute refused.ok, inspect(refused)
      # curl: (7) could not connect: the REDIRECT leads to a closed port.
      assert refused.exit_status == 7, inspect(refused)

      idle_end = Task.await(idle, 45_000)
      assert idle_end["status"] == 200
      assert idle_end["how"] in ["eof", "reset"], inspect(idle_end)

      r = Task.await(busy, 45_000)
      assert r.ok and r.status == 200 and r.body == "slow\n", inspect(r)
      assert Result.header(r, "connection") == "close"

      err = Sidecar.await_exit(sc, 20_000)
      refute err =~ "drain deadline passed"
      assert err =~ ~r/SIGTERM: draining \d+ connection\(s\)/

      closed = List.last(Sidecar.stdout_events(sc) |> Enum.filter(&(&1["query"] == "ms=4000&#{q}")))
      assert closed["event"] == "request_closed" and closed["status"] == 200
      refute Enum.any?(Sidecar.stdout_events(sc), &(&1["event"] == "request_failed")), Sidecar.stderr(sc)
    end

    @tag drain: true
    test "a download still running at the drain deadline is cut with request_failed proxy_shutdown",
         %{tb: tb, sc: sc} do
      q = tag()

      busy =
        Task.async(fn ->
          Client.run(tb, :curl, "https://allowed.test/big.bin?#{q}",
            ca: sc.ca_cert,
            http: :h1,
            extra_args: ["--limit-rate", "1M"],
            timeout: 90_000
          )
        end)

      await_events(sc, 1, &(&1["query"] == q and &1["event"] == "request_allowed"))
      System.cmd("kill", ["-TERM", "#{sc.pid}"])
      :ok = Cmd.poll(fn -> Sidecar.stderr(sc) =~ "SIGTERM: draining" end, 10_000)

      refused = Client.run(tb, :curl, "https://allowed.test/?#{tag()}", ca: sc.ca_cert, http: :h1, timeout: 10_000)
      refute refused.ok, inspect(refused)

      # The drain deadline is 10 s; the whole exit well within 30.
      err = Sidecar.await_exit(sc, 30_000)
      assert err =~ "SIGTERM: draining 1 connection(s)"
      assert err =~ "drain deadline passed with 1 connection(s) busy; closing them"

      r = Task.await(busy, 95_000)
      refute r.ok, "the download should have been cut: #{inspect(r)}"

      failed = List.last(Enum.filter(Sidecar.stdout_events(sc), &(&1["query"] == q)))
      assert failed["event"] == "request_failed"
      assert failed["reason"] == "proxy_shutdown"
      assert failed["bytes_in"] > 0 and failed["bytes_in"] < tb.big_file.size
    end
  end

  ## 8. Unreachable upstreams

  describe "unreachable upstreams" do
    test "an allowed host whose port is closed: 502 and request_failed upstream_unreachable", %{tb: tb, sc: sc} do
      # pod.test is the pod itself (allowed by name, its addresses by
      # --allow-private), where nothing listens on 80 or 443; 10.233.0.2 is
      # the same by an IP-literal rule. The workspace dials the internet's
      # address (a connection to the pod's own address is local and never
      # redirected), naming pod.test in the SNI or Host: the proxy resolves
      # the name itself and finds the port closed.
      for {url, port, host} <- [
            {"http://pod.test/", 80, nil},
            {"https://pod.test/", 443, nil},
            {"http://allowed.test/", 80, "10.233.0.2"}
          ] do
        q = tag()

        r =
          Client.run(tb, :curl, url <> "?#{q}",
            ca: sc.ca_cert,
            http: :h1,
            headers: if(host, do: [{"Host", host}], else: []),
            extra_args: ["--resolve", "pod.test:#{port}:#{tb.inet.v4}"]
          )

        assert r.status == 502,
               "#{url}: #{inspect(r)}\n#{Sidecar.stderr(sc)}\n#{inspect(Enum.filter(Sidecar.stdout_events(sc), &(&1["query"] == q)))}"

        assert r.body =~ "upstream_unreachable"

        events = events_for(sc, q)
        assert names(events) == ~w(request_opened request_allowed request_failed), url
        failed = List.last(events)
        assert failed["reason"] =~ ~r/^upstream_unreachable: .*refused/i, inspect(failed)
      end
    end

    test "an allowed name that does not resolve: 502 and upstream_unreachable: cannot resolve", %{tb: tb, sc: sc} do
      q = tag()

      r =
        Client.run(tb, :curl, "http://nxdomain.test/?#{q}",
          ca: sc.ca_cert,
          extra_args: ["--resolve", "nxdomain.test:80:#{tb.inet.v4}"]
        )

      assert r.status == 502, inspect(r)
      failed = List.last(events_for(sc, q))
      assert failed["event"] == "request_failed"
      assert failed["reason"] =~ "upstream_unreachable: cannot resolve nxdomain.test"
    end
  end

  ## 9. Body preview and redaction

  describe "events: body preview and redaction" do
    @tag sidecar: [extra_args: ~w(--body-preview 16 --redact-header X-Api-Key --redact-header x-session)]
    test "body_preview holds the first N body bytes; redacted headers say [redacted]", %{tb: tb, sc: sc} do
      secret_headers = [
        {"Authorization", "Bearer s3cret-auth"},
        {"Cookie", "sid=s3cret-cookie"},
        {"X-Api-Key", "s3cret-key"},
        {"X-Session", "s3cret-session"},
        {"X-Visible", "shown"}
      ]

      q = tag()
      body = "0123456789abcdef-and-more-bytes-than-the-preview"

      r =
        Client.run(tb, :curl, "https://allowed.test/echo?#{q}",
          method: "POST",
          body: body,
          headers: secret_headers,
          ca: sc.ca_cert,
          http: :h1
        )

      assert r.status == 200
      # The origin gets the real values: redaction is for events only.
      echo = Condukt.JSON.decode!(r.body)
      assert header(echo["headers"], "x-api-key") == "s3cret-key"
      assert header(echo["headers"], "authorization") == "Bearer s3cret-auth"

      closed = List.last(events_for(sc, q))
      assert closed["body_preview"] == Base.encode64("0123456789abcdef")

      for name <- ~w(authorization cookie x-api-key x-session) do
        assert header(closed["headers"], name) == "[redacted]", "#{name}: #{inspect(closed["headers"])}"
      end

      assert header(closed["headers"], "x-visible") == "shown"

      # A chunked body shorter than N: the whole of it, decoded.
      q2 = tag()

      r =
        Client.run(tb, :curl, "https://allowed.test/upload?#{q2}",
          method: "POST",
          body: "abcde",
          chunked: true,
          ca: sc.ca_cert,
          http: :h1
        )

      # (nginx may re-frame a body this small; the origin's hash is what counts.)
      assert r.status == 200

      assert Condukt.JSON.decode!(r.body)["body_sha256"] ==
               :crypto.hash(:sha256, "abcde") |> Base.encode16(case: :lower)

      assert List.last(events_for(sc, q2))["body_preview"] == Base.encode64("abcde")

      # No body, no preview; response headers are redacted too.
      q3 = tag()
      r = Client.run(tb, :curl, "https://allowed.test/set-cookie?#{q3}", ca: sc.ca_cert, http: :h1)
      assert r.status == 200 and Result.header(r, "set-cookie") =~ "s3cret-cookie"
      closed = List.last(events_for(sc, q3))
      refute Map.has_key?(closed, "body_preview")
      assert header(closed["response_headers"], "set-cookie") == "[redacted]"
      assert header(closed["response_headers"], "x-session") == "[redacted]"

      # Refused requests are redacted the same way.
      q4 = tag()
      r = Client.run(tb, :curl, "https://denied.test/?#{q4}", headers: secret_headers, ca: sc.ca_cert, http: :h1)
      assert r.status == 403
      denied = List.last(events_for(sc, q4))
      assert header(denied["headers"], "x-api-key") == "[redacted]"
      assert header(denied["headers"], "authorization") == "[redacted]"

      # No secret reaches the audit trail.
      refute File.read!(sc.stdout) =~ "s3cret"
    end
  end
end
