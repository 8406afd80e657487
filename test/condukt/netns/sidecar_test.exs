defmodule Condukt.Netns.SidecarTest do
  # The sidecar end to end (issue 3): real clients in a pod namespace whose
  # TCP 80/443 is redirected by netfilter-setup to condukt-egress proxy,
  # nginx and friends in an "internet" namespace. Every request's events are
  # checked on the control channel, and the proxy runs under ASan+UBSan
  # when the Makefile provides that build.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  # The sidecar asks the control channel for decide rules; the callable
  # itself runs on the BEAM side (issue 5), here the ControlPeer answers.
  def decider(_ctx, _req), do: :allow

  defp policy do
    [
      rules: [
        deny: ["denied.test"],
        allow: ~w(allowed.test v4.test v6.test ws.test git.test metadata.test mismatch.test untrusted.test),
        decide: &__MODULE__.decider/2
      ],
      default: :deny
    ]
  end

  setup_all do
    tb = Testbed.start(big_size: 100 * 1024 * 1024)
    sc = Sidecar.start(tb, policy())
    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  setup %{sc: sc} do
    decide = fn request ->
      case request["host"] do
        "decide.test" -> :allow
        "other.test" -> {:deny, "other.test is not needed for this task"}
        _ -> {:deny, "unexpected"}
      end
    end

    {:ok, peer} = ControlPeer.start_link(sc, self(), decide)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 5_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  # A query that names the test, so events of other tests never match.
  defp tag, do: "t=#{System.unique_integer([:positive])}"

  # Collects the events of the request whose query is `query`, up to and
  # including one of `last`.
  defp events_for(query, last \\ ~w(request_closed request_failed request_denied), timeout \\ 10_000) do
    collect(query, last, [], System.monotonic_time(:millisecond) + timeout)
  end

  defp collect(query, last, acc, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {:egress_event, %{"query" => ^query} = ev} ->
        acc = [ev | acc]
        if ev["event"] in last, do: Enum.reverse(acc), else: collect(query, last, acc, deadline)
    after
      left ->
        flunk("no #{inspect(last)} event for #{query}; got #{inspect(Enum.map(Enum.reverse(acc), & &1["event"]))}")
    end
  end

  defp names(events), do: Enum.map(events, & &1["event"])

  describe "allowed requests" do
    test "every HTTP client gets the origin's body over HTTPS, with the lifecycle events", %{tb: tb, sc: sc} do
      for client <- Client.http_clients() do
        q = tag()
        r = Client.run(tb, client, "https://allowed.test/?#{q}", ca: sc.ca_cert, http: if(client == :curl, do: :h1))
        assert r.ok, "#{client}: #{inspect(r.error)} #{r.output}"
        assert r.status == 200, "#{client}: #{inspect(r)}"
        assert r.body == "hello from allowed.test\n", "#{client}"

        events = events_for(q)
        assert names(events) == ~w(request_opened request_allowed request_closed), "#{client}"
        closed = List.last(events)
        assert closed["host"] == "allowed.test"
        assert closed["scheme"] == "https"
        assert closed["sni"] == "allowed.test"
        assert closed["method"] == "GET"
        assert closed["path"] == "/"
        assert closed["status"] == 200
        assert closed["port"] == 443
        assert closed["matched_rule"] == nil
        assert closed["bytes_in"] > 0 and closed["bytes_out"] > 0
        allowed = Enum.find(events, &(&1["event"] == "request_allowed"))
        assert allowed["matched_rule"] == %{"index" => 1, "kind" => "allow"}
      end
    end

    test "plain HTTP on port 80 and IPv6 both go through the proxy", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "http://allowed.test/?#{q}", ca: sc.ca_cert)
      assert r.status == 200 and r.body == "hello from allowed.test\n"
      assert %{"scheme" => "http", "port" => 80} = List.last(events_for(q))

      q = tag()
      r = Client.run(tb, :curl, "https://v6.test/?#{q}", ca: sc.ca_cert, family: 6, http: :h1)
      assert r.status == 200, inspect(r)
      assert List.last(events_for(q))["host"] == "v6.test"
    end

    test "a 100 MB download arrives byte-identical", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://allowed.test/big.bin?#{q}", ca: sc.ca_cert, http: :h1, timeout: 120_000)
      assert r.ok and r.status == 200, inspect(r)
      assert r.body_sha256 == tb.big_file.sha256
      closed = List.last(events_for(q))
      assert closed["bytes_in"] >= 100 * 1024 * 1024
    end

    test "a chunked upload reaches the origin intact and chunked", %{tb: tb, sc: sc} do
      {path, sha} = Testbed.make_file(tb, "upload-#{System.unique_integer([:positive])}.bin", 3_000_000)
      q = tag()

      r =
        Client.run(tb, :python_requests, "https://allowed.test/upload?#{q}",
          method: "POST",
          body: {:file, path},
          chunked: true,
          ca: sc.ca_cert
        )

      assert r.status == 200, inspect(r)
      echo = Condukt.JSON.decode!(r.body)
      assert echo["body_sha256"] == sha
      assert echo["framing"] == "chunked"
      assert List.last(events_for(q))["bytes_out"] >= 3_000_000
    end

    test "WebSocket upgrades are evaluated, then relayed both ways", %{tb: tb, sc: sc} do
      r = Client.websocket(tb, "wss://ws.test/ws", ["one", "two", String.duplicate("x", 100_000)], ca: sc.ca_cert)
      assert r.ok, inspect(r) <> Sidecar.stderr(sc)
      assert r.data.received == ["hello /ws", "one", "two", String.duplicate("x", 100_000)]
    end

    test "git clone over smart HTTP", %{tb: tb, sc: sc} do
      r = Client.git_clone(tb, "https://git.test/repo.git", ca: sc.ca_cert)
      assert r.ok, r.output
      assert r.data.head == tb.git.head
    end

    test "openssl s_client verifies the minted leaf against the session CA", %{tb: tb, sc: sc} do
      r = Client.s_client(tb, "allowed.test", ca: sc.ca_cert)
      assert r.data.verified, inspect(r)
      assert r.status == 200
    end

    test "the trust bundle alone (Mozilla + session CA) is enough", %{tb: tb, sc: sc} do
      r = Client.run(tb, :curl, "https://allowed.test/?#{tag()}", ca: sc.bundle, http: :h1)
      assert r.status == 200, inspect(r)
    end
  end

  describe "refusals" do
    test "a deny rule answers 403 in words and emits request_denied", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://denied.test/?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.status == 403
      assert r.body =~ "refused by: rule 0 (deny)"
      assert r.body =~ "reason: denied_by_rule"
      assert Result.header(r, "x-condukt-egress") == "refused"

      events = events_for(q)
      assert names(events) == ~w(request_opened request_denied)
      denied = List.last(events)
      assert denied["matched_rule"] == %{"index" => 0, "kind" => "deny"}
      assert denied["reason"] == "denied_by_rule"
      assert denied["status"] == 403
    end

    test "decide rules ask the control channel; answers are cached per host", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://decide.test/?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.status == 200 and r.body == "hello from decide.test\n"
      assert_receive {:egress_decision_request, %{"request" => %{"host" => "decide.test"}, "rule" => rule}}
      assert rule == %{"index" => 2, "kind" => "decide"}
      assert List.last(events_for(q))["event"] == "request_closed"

      q = tag()
      r = Client.run(tb, :curl, "https://other.test/?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.status == 403
      assert r.body =~ "the decider of rule 2"
      assert r.body =~ "other.test is not needed for this task"
      denied = List.last(events_for(q))
      assert denied["reason"] == "other.test is not needed for this task"
      assert denied["matched_rule"] == %{"index" => 2, "kind" => "decide"}

      # Cached: the second request to the same host does not ask again.
      q = tag()
      r = Client.run(tb, :curl, "https://decide.test/again?#{q}", ca: sc.ca_cert, http: :h1)
      assert r.status in [200, 404]
      refute_received {:egress_decision_request, %{"request" => %{"host" => "decide.test"}}}
    end

    test "a client that does not trust the session CA fails: request_failed tls_client_rejected_ca", %{tb: tb} do
      r = Client.run(tb, :curl, "https://allowed.test/", ca: tb.ca_cert, http: :h1)
      refute r.ok
      assert r.error_kind == :tls_verify

      assert_receive {:egress_event, %{"event" => "request_failed", "reason" => "tls_client_rejected_ca"} = ev}, 5_000
      assert ev["sni"] == "allowed.test"
    end

    test "an upstream whose certificate does not verify gives 502 and upstream_tls", %{tb: tb, sc: sc} do
      for host <- ["mismatch.test", "untrusted.test"] do
        q = tag()
        r = Client.run(tb, :curl, "https://#{host}/?#{q}", ca: sc.ca_cert, http: :h1)
        assert r.status == 502, inspect(r)
        failed = List.last(events_for(q))
        assert failed["event"] == "request_failed"
        assert failed["reason"] =~ "upstream_tls:"
      end
    end
  end

  describe "bypass attempts" do
    test "Host differing from SNI is misdirected (421)", %{tb: tb, sc: sc} do
      q = tag()

      r =
        Client.run(tb, :curl, "https://allowed.test/?#{q}",
          ca: sc.ca_cert,
          http: :h1,
          headers: [{"Host", "denied.test"}]
        )

      assert r.status == 421
      assert List.last(events_for(q))["reason"] == "misdirected_request"
    end

    test "the request's target is checked against the connection: port, absolute-form, validity",
         %{tb: tb, sc: sc} do
      # One TLS connection per request; the status line of each answer.
      script = """
      import socket, ssl, sys
      ctx = ssl.create_default_context(cafile=sys.argv[1])
      for line in sys.argv[2:]:
          s = ctx.wrap_socket(socket.create_connection(("allowed.test", 443), timeout=10), server_hostname="allowed.test")
          s.sendall(line.encode() + b"\\r\\nConnection: close\\r\\n\\r\\n")
          data = b""
          while True:
              chunk = s.recv(65536)
              if not chunk: break
              data += chunk
          s.close()
          head, _, body = data.partition(b"\\r\\n\\r\\n")
          print(head.split(b"\\r\\n")[0].decode("latin-1") + " | " + body.decode("latin-1").strip())
      """

      [q1, q2, q3, q4] = for _ <- 1..4, do: tag()

      requests = [
        # Host names another port than the one dialled.
        "GET /?#{q1} HTTP/1.1\r\nHost: allowed.test:8443",
        # The absolute-form authority names another host (a Host that
        # differs from it is refused by the parser already).
        "GET https://other.test/?#{q2} HTTP/1.1\r\nHost: other.test",
        # Not a host name.
        "GET /?#{q3} HTTP/1.1\r\nHost: under_score!.test",
        # The connection's own name and port.
        "GET /?#{q4} HTTP/1.1\r\nHost: allowed.test:443"
      ]

      {out, 0} = Testbed.exec_in(tb, :pod, ["/usr/bin/python3", "-c", script, sc.ca_cert | requests], timeout: 30_000)
      assert [port, absolute, invalid, ok] = String.split(out, "\n", trim: true)
      assert port =~ ~r/^HTTP\/1\.1 421 .*the Host names port 8443 but this connection is to port 443/
      assert absolute =~ ~r/^HTTP\/1\.1 421 .*the Host other\.test is not the TLS server name allowed\.test/
      assert invalid =~ ~r/^HTTP\/1\.1 400 .*the Host is not a valid host name or address/
      assert ok =~ ~r/^HTTP\/1\.1 200 /

      last = for q <- [q1, q2, q3, q4], do: List.last(events_for(q))

      assert Enum.map(last, &{&1["event"], &1["reason"], &1["host"]}) == [
               {"request_denied", "misdirected_request", "allowed.test"},
               {"request_denied", "misdirected_request", "other.test"},
               {"request_denied", "invalid_host", "under_score!.test"},
               {"request_closed", nil, "allowed.test"}
             ]
    end

    test "a second Host on a keep-alive TLS connection is refused", %{tb: tb, sc: sc} do
      script = """
      import socket, ssl, sys
      ctx = ssl.create_default_context(cafile=sys.argv[1])
      s = ctx.wrap_socket(socket.create_connection(("allowed.test", 443), timeout=10), server_hostname="allowed.test")
      s.sendall(b"GET / HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\nGET / HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n")
      data = b""
      while data.count(b"HTTP/1.1 ") < 2 or not data.rstrip().endswith(b"connection"):
          chunk = s.recv(65536)
          if not chunk: break
          data += chunk
      print(data.decode("latin-1"))
      """

      {out, 0} = Testbed.exec_in(tb, :pod, ["/usr/bin/python3", "-c", script, sc.ca_cert], timeout: 20_000)
      assert [first, second] = Regex.scan(~r/HTTP\/1\.1 (\d{3})/, out) |> Enum.map(&List.last/1)
      assert {first, second} == {"200", "421"}
    end

    test "a spoofed Host on port 80 never reaches a private address", %{tb: tb, sc: sc} do
      # metadata.test is allowed by name, but it resolves to 169.254.169.254,
      # which the policy does not name: the proxy refuses to connect there.
      q = tag()
      r = Client.run(tb, :curl, "http://allowed.test/?#{q}", ca: sc.ca_cert, headers: [{"Host", "metadata.test"}])
      assert r.status == 403
      refute r.body =~ "metadata-service"
      assert List.last(events_for(q))["reason"] == "upstream_private_address: 169.254.169.254"

      # Dialling the metadata address itself: the Host is an IP literal that
      # no rule names.
      q = tag()
      r = Client.run(tb, :curl, "http://169.254.169.254/latest?#{q}", ca: sc.ca_cert)
      assert r.status == 403
      refute r.body =~ "metadata-service"
    end

    test "a client running as the proxy's uid is still intercepted", %{tb: tb, sc: sc} do
      q = tag()
      r = Client.run(tb, :curl, "https://denied.test/?#{q}", ca: sc.ca_cert, http: :h1, uid: Sidecar.uid())
      assert r.status == 403
      assert List.last(events_for(q))["event"] == "request_denied"

      r = Client.probe(tb, :tcp, "allowed.test", 8080, "hello", uid: Sidecar.uid())
      refute r.ok
    end

    test "other ports and UDP 443 do not get out", %{tb: tb} do
      for family <- [4, 6] do
        r = Client.probe(tb, :tcp, "allowed.test", 8080, "tcp-#{family}", family: family)
        refute r.ok, "tcp 8080 over IPv#{family} got out: #{inspect(r)}"
        r = Client.probe(tb, :udp, "allowed.test", 443, "udp-#{family}", family: family)
        refute r.ok, "udp 443 over IPv#{family} got out: #{inspect(r)}"
      end

      assert Testbed.bypass_log(tb) == []
    end

    test "the control channel drops a peer without the token", %{sc: sc} do
      Process.flag(:trap_exit, true)
      {:ok, bad} = ControlPeer.start_link(sc, self(), fn _ -> :allow end, token: String.duplicate("0", 64))
      assert_receive {:egress_frame, %{"type" => "closed"}}, 10_000
      refute_received {:egress_frame, %{"type" => "welcome"}}
      refute Process.alive?(bad)
    end
  end

  test "every event also reaches stdout as a JSON line", %{tb: tb, sc: sc} do
    q = tag()
    r = Client.run(tb, :curl, "https://allowed.test/?#{q}", ca: sc.ca_cert, http: :h1)
    assert r.status == 200
    events = events_for(q)

    :ok =
      Cmd.poll(
        fn -> Enum.count(Sidecar.stdout_events(sc), &(&1["query"] == q)) == length(events) end,
        5_000
      )

    from_stdout = Enum.filter(Sidecar.stdout_events(sc), &(&1["query"] == q))
    assert Enum.map(from_stdout, & &1["seq"]) == Enum.map(events, & &1["seq"])
  end
end
