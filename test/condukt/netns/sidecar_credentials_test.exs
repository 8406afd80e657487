defmodule Condukt.Netns.SidecarCredentialsTest do
  # Credential injection end to end (docs/credentials.md), over HTTP/1.1
  # and h2, on both kinds of upstream (an HTTP/1.1-only origin and an
  # h2-only one, each echoing the header fields it received): the sidecar
  # adds the credential to the allowed requests its entry names, replacing
  # every copy of the field the workspace sent (any case); another host,
  # another path, plain HTTP and a redirect's follow-up to another host
  # get nothing; events never hold the secret; the workspace cannot read
  # the sidecar's secrets file; a value rotated over the control channel
  # is used for the next request.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Test.Netns.{ControlPeer, RawHttp, Sidecar}

  # servers/scripted.py speaks HTTP/1.1 only on 8091, servers/h2_origin.py
  # h2 only on 8093; both answer /fields with the fields they got.
  @h1_only 8091
  @h2_only 8093
  @secret "Bearer s3cr3t-0ne-b2c3d4e5f6"
  @rotated "Bearer r0tated-9z8y7x6w5v"
  @key "k3y-4ab5c6d7e8"

  @policy [
    rules: [allow: ["allowed.test", "other.test"]],
    credentials: [
      {"allowed.test",
       header: "Authorization", value: {:secret, "token"}, paths: ["/fields", "/echo", "/redirect-echo"]},
      {"allowed.test", header: "x-api-key", value: {:secret, "key"}, methods: ["POST"], paths: ["/fields"]}
    ],
    secrets: %{"token" => "placeholder-token", "key" => "placeholder-key"},
    default: :deny
  ]

  setup_all do
    tb = Testbed.start()
    Testbed.start_origins(tb)

    sc =
      Sidecar.start(tb, @policy,
        ports: [80, 443, @h1_only, @h2_only],
        credentials: %{"token" => @secret, "key" => @key}
      )

    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  setup %{sc: sc} do
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> :allow end)
    assert_receive {:egress_frame, %{"type" => "welcome"}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    %{peer: peer}
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  # The fields an origin received, as [[name, value]] (names as received).
  defp fields(%{body: body} = r) do
    assert r.ok and r.status == 200, inspect(r)
    Condukt.JSON.decode!(body)
  end

  defp named(fields, name), do: for([k, v] <- fields, String.downcase(k) == name, do: v)

  defp curl(tb, sc, url, http, opts \\ []) do
    Client.run(tb, :curl, url, [ca: sc.ca_cert, http: http] ++ opts)
  end

  # Every event of the sidecar so far: none holds a secret.
  defp refute_secret_in_events(sc) do
    text = File.read!(sc.stdout)
    refute text =~ "s3cr3t", "an event holds the secret"
    refute text =~ "r0tated"
    refute text =~ @key
  end

  defp wait_closed(sc, q) do
    RawHttp.events_for(sc, q)
    |> List.last()
  end

  for http <- [:h1, :h2], port <- [@h1_only, @h2_only] do
    test "#{http} to the #{if port == @h1_only, do: "HTTP/1.1", else: "h2"} origin: the credential replaces the workspace's own",
         %{tb: tb, sc: sc} do
      q = tag()

      r =
        curl(tb, sc, "https://allowed.test:#{unquote(port)}/fields?#{q}", unquote(http),
          headers: [{"authorization", "Bearer workspace-fake"}, {"X-Api-Key", "workspace-key"}]
        )

      got = fields(r)
      # One authorization, the sidecar's; x-api-key is for POST only: the
      # workspace's own passes.
      assert named(got, "authorization") == [@secret]
      assert named(got, "x-api-key") == ["workspace-key"]

      closed = wait_closed(sc, q)
      assert closed["event"] == "request_closed"
      assert ["authorization", "[redacted]"] in Enum.map(closed["headers"], fn [k, v] -> [String.downcase(k), v] end)

      # POST: both credentials.
      q = tag()

      r =
        curl(tb, sc, "https://allowed.test:#{unquote(port)}/fields?#{q}", unquote(http),
          method: "POST",
          body: "x",
          headers: [{"x-api-key", "workspace-key"}]
        )

      got = fields(r)
      assert named(got, "authorization") == [@secret]
      assert named(got, "x-api-key") == [@key]
      closed = wait_closed(sc, q)
      # A credential's header is redacted in events like authorization.
      assert ["x-api-key", "[redacted]"] in Enum.map(closed["headers"], fn [k, v] -> [String.downcase(k), v] end)
      refute_secret_in_events(sc)
    end
  end

  # The fields the origin on `port` received from a raw HTTP/1.1 request
  # for /fields with the header lines `fields` (CRLF-terminated each),
  # sent by a client in the workspace's namespace.
  defp raw_h1_fields(tb, sc, port, q, fields) do
    script = """
    import socket, ssl, sys
    ctx = ssl.create_default_context(cafile=sys.argv[1])
    s = ctx.wrap_socket(socket.create_connection(("allowed.test", int(sys.argv[2]))), server_hostname="allowed.test")
    s.sendall(("GET /fields?%s HTTP/1.1\\r\\nHost: allowed.test\\r\\n%sConnection: close\\r\\n\\r\\n" % (sys.argv[3], sys.argv[4])).encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    print(data.split(b"\\r\\n\\r\\n", 1)[1].decode())
    """

    argv = ["/usr/bin/python3", "-c", script, sc.ca_cert, "#{port}", q, fields]
    {out, 0} = Testbed.exec_in(tb, :pod, argv, timeout: 30_000)
    out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
  end

  # docs/proxy.md "Idle connections": a keep-alive connection idle past
  # --idle-release-ms (500 ms by default) closes its upstream connection;
  # the next request on the same workspace connection is evaluated and
  # reported on its own, connects again, and gets the credential again.
  for port <- [@h1_only, @h2_only] do
    test "HTTP/1.1 keep-alive to the #{if port == @h1_only, do: "HTTP/1.1", else: "h2"} origin: after the idle release the next request connects again with the credential",
         %{tb: tb, sc: sc} do
      script = """
      import http.client, json, ssl, sys, time
      ctx = ssl.create_default_context(cafile=sys.argv[1])
      c = http.client.HTTPSConnection("allowed.test", int(sys.argv[2]), context=ctx, timeout=30)
      for i, q in enumerate(sys.argv[3:5]):
          if i:
              time.sleep(1.5)
          c.request("GET", "/fields?" + q, headers={"Authorization": "Bearer workspace-fake"})
          r = c.getresponse()
          body = r.read().decode()
          print(json.dumps({"status": r.status, "body": body, "port": c.sock.getsockname()[1]}), flush=True)
      """

      [q1, q2] = [tag(), tag()]
      argv = ["/usr/bin/python3", "-c", script, sc.ca_cert, "#{unquote(port)}", q1, q2]
      {out, 0} = Testbed.exec_in(tb, :pod, argv, timeout: 30_000)
      [one, two] = out |> String.split("\n", trim: true) |> Enum.take(-2) |> Enum.map(&Condukt.JSON.decode!/1)
      assert one["port"] == two["port"], "one workspace connection: #{out}"

      for r <- [one, two] do
        assert r["status"] == 200, out
        assert named(Condukt.JSON.decode!(r["body"]), "authorization") == [@secret]
      end

      for q <- [q1, q2] do
        assert ~w(request_opened request_allowed request_closed) == Enum.map(RawHttp.events_for(sc, q), & &1["event"])
      end

      refute_secret_in_events(sc)
    end
  end

  test "HTTP/1.1: every copy the workspace sent, in any case, is removed", %{tb: tb, sc: sc} do
    fields = "Authorization: one\r\nAUTHORIZATION: two\r\naUtHoRiZaTiOn: three\r\nX-Other: kept\r\n"
    got = raw_h1_fields(tb, sc, @h1_only, tag(), fields)
    assert named(got, "authorization") == [@secret]
    assert named(got, "x-other") == ["kept"]
  end

  # A Connection option names fields of the workspace's own hop: the
  # credential, which the sidecar adds, goes upstream all the same, and the
  # fields the option names do not (nor does the workspace's copy).
  for port <- [@h1_only, @h2_only] do
    test "HTTP/1.1 to the #{if port == @h1_only, do: "HTTP/1.1", else: "h2"} origin: Connection naming the credential's header does not remove it",
         %{tb: tb, sc: sc} do
      fields = "Connection: Authorization, x-hop\r\nAuthorization: mine\r\nX-Hop: 1\r\nX-Other: kept\r\n"
      got = raw_h1_fields(tb, sc, unquote(port), tag(), fields)
      assert named(got, "authorization") == [@secret]
      assert named(got, "x-hop") == []
      assert named(got, "connection") == []
      assert named(got, "x-other") == ["kept"]
      refute_secret_in_events(sc)
    end
  end

  test "h2: every copy of the field is removed (a raw client puts them on the wire)", %{tb: tb, sc: sc} do
    q = tag()

    stream = [
      [":method", "GET"],
      [":scheme", "https"],
      [":authority", "allowed.test:#{@h2_only}"],
      [":path", "/fields?#{q}"],
      ["authorization", "one"],
      ["authorization", "two"],
      ["x-other", "kept"]
    ]

    out =
      Client.h2_raw(tb, sc.ca_cert, %{host: "allowed.test", port: @h2_only, mode: "custom", streams: [stream], query: q})

    %{"status" => 200, "body" => body} = out["streams"]["1"]
    got = Condukt.JSON.decode!(body)
    assert named(got, "authorization") == [@secret]
    assert named(got, "x-other") == ["kept"]
  end

  for http <- [:h1, :h2] do
    test "#{http}: other hosts, other paths and plain HTTP get nothing", %{tb: tb, sc: sc} do
      # Another host: the workspace's own field passes untouched.
      r =
        curl(tb, sc, "https://other.test:#{@h1_only}/fields?#{tag()}", unquote(http),
          headers: [{"authorization", "Bearer mine"}]
        )

      assert named(fields(r), "authorization") == ["Bearer mine"]

      # The right host, a path no entry names.
      r =
        curl(tb, sc, "https://allowed.test:#{@h1_only}/fields/other?#{tag()}", unquote(http),
          headers: [{"authorization", "Bearer mine"}]
        )

      assert r.ok and r.status == 200
      refute r.body =~ "s3cr3t"

      # Dot segments cannot take the credential to another path: this one
      # is /x once normalised (the h2 origin still echoes it, by prefix).
      r =
        curl(tb, sc, "https://allowed.test:#{@h2_only}/fields/../x?#{tag()}", unquote(http),
          extra_args: ["--path-as-is"],
          headers: [{"authorization", "Bearer mine"}]
        )

      assert named(fields(r), "authorization") == ["Bearer mine"]
      refute_secret_in_events(sc)
    end
  end

  test "plain HTTP never carries a credential (it would cross the network in clear)", %{tb: tb} do
    r = Client.run(tb, :curl, "http://allowed.test/echo?#{tag()}", headers: [{"authorization", "Bearer mine"}])
    assert r.ok and r.status == 200, inspect(r)
    got = Condukt.JSON.decode!(r.body)["headers"]
    assert named(got, "authorization") == ["Bearer mine"]
    refute r.body =~ "s3cr3t"
  end

  for http <- [:h1, :h2] do
    test "#{http}: a redirect to another host: the follow-up request carries no credential", %{tb: tb, sc: sc} do
      q = tag()
      r = curl(tb, sc, "https://allowed.test/redirect-echo?#{q}", unquote(http), extra_args: ["-L"])
      assert r.ok and r.status == 200, inspect(r)
      # The final answer is other.test's echo of what it received.
      got = Condukt.JSON.decode!(r.body)
      assert got["path"] == "/echo"
      assert named(got["headers"], "authorization") == []
      refute r.body =~ "s3cr3t"
      refute_secret_in_events(sc)
    end
  end

  test "the workspace cannot read the secrets file, and its environment has no secret", %{tb: tb, sc: sc} do
    path = Path.join(sc.dir, "credentials.json")
    assert File.read!(path) =~ "s3cr3t"
    %File.Stat{mode: mode, uid: uid} = File.stat!(path)
    assert {Bitwise.band(mode, 0o777), uid} == {0o600, Sidecar.uid()}

    # A workspace process (another uid, root without the sidecar's files)
    # tries to read it and to find the value anywhere it can see.
    script = ~s(cat #{path}; env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; exit 0)

    {out, 0} = Testbed.exec_in(tb, :pod, ["/bin/sh", "-c", script], uid: 4242, stderr: :stdout, timeout: 30_000)
    assert out =~ "Permission denied"
    refute out =~ "s3cr3t"
  end

  test "a sidecar without every secret's value refuses to start, naming what is missing", %{tb: tb} do
    # A listener of its own: the readiness probe must not find the running
    # sidecar's (the one of setup_all, same namespace) and call this one up.
    own = [netfilter: false, extra_args: ["--listen", "127.0.0.1:15091"]]
    e = assert_raise RuntimeError, fn -> Sidecar.start(tb, @policy, own) end
    assert e.message =~ "the policy has credentials: pass their values with --credentials FILE"

    e = assert_raise RuntimeError, fn -> Sidecar.start(tb, @policy, [credentials: %{"token" => "x"}] ++ own) end

    assert e.message =~ ~s(names the secret "key", which has no value)
  end

  test "rotation: the sidecar uses a new value from the next request on", %{tb: tb, sc: sc, peer: peer} do
    r = curl(tb, sc, "https://allowed.test:#{@h2_only}/fields?#{tag()}", :h2)
    assert named(fields(r), "authorization") == [@secret]

    :ok = ControlPeer.send_frame(peer, %{type: "credential", name: "token", value: @rotated})
    :ok = ControlPeer.send_frame(peer, %{type: "ping"})
    assert_receive {:egress_frame, %{"type" => "pong"}}, 5_000

    for {http, port} <- [h1: @h1_only, h2: @h2_only, h1: @h2_only, h2: @h1_only] do
      r = curl(tb, sc, "https://allowed.test:#{port}/fields?#{tag()}", http)
      assert named(fields(r), "authorization") == [@rotated], "#{http} to #{port}"
    end

    refute_secret_in_events(sc)

    # Back, for the other tests.
    :ok = ControlPeer.send_frame(peer, %{type: "credential", name: "token", value: @secret})
    :ok = ControlPeer.send_frame(peer, %{type: "ping"})
    assert_receive {:egress_frame, %{"type" => "pong"}}, 5_000
  end

  test "rotation of a secret the policy does not have is refused (the peer is closed)", %{peer: peer, sc: sc} do
    # The control channel logs at most 10 lines a second: after the other
    # tests' peers came and went, the refusal's line waits for a new window.
    Process.sleep(1_100)
    :ok = ControlPeer.send_frame(peer, %{type: "credential", name: "nope", value: "x"})
    assert_receive {:egress_frame, %{"type" => "closed"}}, 5_000

    assert :ok = Condukt.Dev.Netns.Cmd.poll(fn -> Sidecar.stderr(sc) =~ "credential: refused" end, 5_000),
           Sidecar.stderr(sc)

    # A value that is no header value: refused too, the old one stays.
    {:ok, peer2} = ControlPeer.start_link(sc, self(), fn _ -> :allow end)
    assert_receive {:egress_frame, %{"type" => "welcome"}}, 10_000
    :ok = ControlPeer.send_frame(peer2, %{type: "credential", name: "token", value: "a\r\nX-Injected: 1"})
    assert_receive {:egress_frame, %{"type" => "closed"}}, 5_000
  end
end
