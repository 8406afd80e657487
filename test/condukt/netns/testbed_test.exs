defmodule Condukt.Netns.TestbedTest do
  # The end-to-end testbed itself, proven with direct connections from the
  # pod to inet (no sidecar): every client, every name, both address
  # families, h2 and http/1.1, big and chunked bodies, WebSocket, git,
  # certificate failures, the bypass listeners, and clean-up. The sidecar's
  # tests build on this, so a failure here says "the testbed is broken",
  # not "the proxy is".
  use Condukt.Test.Netns.Case, async: true

  alias Condukt.Dev.Netns.Tier

  setup_all do
    {:ok, tb: Testbed.start()}
  end

  # Runs `fun` over `items` concurrently (the clients are separate OS
  # processes) and returns the items whose check failed, with the reason.
  defp failures(items, fun) do
    items
    |> Task.async_stream(fn item -> {item, fun.(item)} end, max_concurrency: 8, timeout: 120_000, ordered: true)
    |> Enum.flat_map(fn {:ok, {item, result}} -> if result == :ok, do: [], else: [{item, result}] end)
  end

  defp expect(true, _result), do: :ok
  defp expect(false, result), do: Map.take(result, [:ok, :status, :body, :error, :error_kind, :output])

  defp headers_body(body) do
    body |> String.split("\n", trim: true) |> Map.new(&List.to_tuple(String.split(&1, "=", parts: 2)))
  end

  describe "HTTPS from the pod, directly" do
    test "every HTTP client gets each name's own page", %{tb: tb} do
      cases = for c <- Client.http_clients(), name <- Testbed.names(), do: {c, name}

      assert failures(cases, fn {c, name} ->
               r = Client.run(tb, c, "https://#{name}/")
               expect(r.ok and r.status == 200 and r.body == "hello from #{name}\n", r)
             end) == []
    end

    test "IPv4 and IPv6 both reach every name (curl -4 / -6)", %{tb: tb} do
      cases = for name <- Testbed.names(), family <- [4, 6], do: {name, family}

      assert failures(cases, fn {name, family} ->
               r = Client.run(tb, :curl, "https://#{name}/headers", family: family)
               seen = r.body && headers_body(r.body)
               {pod, inet} = if family == 4, do: {tb.pod.v4, tb.inet.v4}, else: {tb.pod.v6, tb.inet.v6}
               expect(r.ok and seen["remote"] == pod and seen["server_addr"] == inet and seen["sni"] == name, r)
             end) == []
    end

    test "Python and Node clients can be pinned to one address family", %{tb: tb} do
      cases = for c <- [:python_urllib, :python_requests, :node_https], family <- [4, 6], do: {c, family}

      assert failures(cases, fn {c, family} ->
               r = Client.run(tb, c, "https://allowed.test/headers", family: family)
               pod = if family == 4, do: tb.pod.v4, else: tb.pod.v6
               expect(r.ok and headers_body(r.body)["remote"] == pod, r)
             end) == []

      # Names with one address family only.
      assert %{ok: true, body: "hello from v4.test\n"} = Client.run(tb, :node_fetch, "https://v4.test/")
      assert %{ok: true, body: "hello from v6.test\n"} = Client.run(tb, :python_requests, "https://v6.test/")
    end

    test "curl speaks h2 and http/1.1 as asked; ALPN reaches nginx", %{tb: tb} do
      h2 = Client.run(tb, :curl, "https://allowed.test/headers", http: :h2)
      assert %{ok: true, http_version: "2"} = h2
      assert %{"alpn" => "h2", "protocol" => "HTTP/2.0"} = headers_body(h2.body)

      h1 = Client.run(tb, :curl, "https://allowed.test/headers", http: :h1)
      assert %{ok: true, http_version: "1.1"} = h1
      assert %{"alpn" => "http/1.1", "protocol" => "HTTP/1.1"} = headers_body(h1.body)

      assert %{ok: true, data: %{alpn: "h2", verified: true}} = Client.s_client(tb, "other.test", alpn: ["h2"])
    end

    test "openssl s_client verifies the chain and the name, and fetches a page", %{tb: tb} do
      r = Client.s_client(tb, "decide.test")
      assert %{ok: true, status: 200, body: "hello from decide.test\n"} = r
      assert %{verified: true, alpn: "http/1.1", subject: "CN = allowed.test"} = r.data
      assert %{ok: true, status: 200} = Client.s_client(tb, tb.inet.v6, servername: "other.test", family: 6)
    end

    test "plain HTTP on port 80 serves the same names", %{tb: tb} do
      assert failures(Client.http_clients(), fn c ->
               r = Client.run(tb, c, "http://denied.test/")
               expect(r.ok and r.body == "hello from denied.test\n", r)
             end) == []
    end
  end

  describe "bodies" do
    test "the 100 MB file arrives whole (curl over h2, requests over http/1.1)", %{tb: tb} do
      %{size: size, sha256: sha} = tb.big_file
      assert size == 100 * 1024 * 1024

      for c <- [:curl, :python_requests] do
        r = Client.run(tb, c, tb.urls.big, timeout: 60_000)
        assert %{ok: true, status: 200, body_size: ^size, body_sha256: ^sha, body: nil} = r, inspect(c)
      end
    end

    test "a chunked upload reaches the origin whole, from every client", %{tb: tb} do
      {path, sha} = Testbed.make_file(tb, "upload.bin", 5_000_000)
      cases = Enum.map(Client.http_clients(), &{&1, []}) ++ [{:curl, [http: :h2]}]

      assert failures(cases, fn {c, extra} ->
               r = Client.run(tb, c, tb.urls.upload, [method: "POST", body: {:file, path}, chunked: true] ++ extra)
               seen = r.ok && Condukt.JSON.decode!(r.body)

               expect(
                 r.ok and seen["body_sha256"] == sha and seen["body_size"] == 5_000_000 and
                   seen["framing"] == "chunked" and seen["method"] == "POST",
                 r
               )
             end) == []

      # The same body with a Content-Length.
      r = Client.run(tb, :python_requests, tb.urls.upload, method: "PUT", body: {:file, path})
      assert %{"body_sha256" => ^sha, "framing" => "content-length", "method" => "PUT"} = Condukt.JSON.decode!(r.body)
    end

    test "a chunked response is chunked on the wire and arrives whole", %{tb: tb} do
      expected = for(i <- 0..19, do: for(j <- 0..4095, into: <<>>, do: <<rem(i + j, 251)>>)) |> IO.iodata_to_binary()

      r = Client.run(tb, :curl, tb.urls.chunked, http: :h1)
      assert %{ok: true, status: 200, body: ^expected} = r
      assert Result.header(r, "transfer-encoding") == "chunked"

      assert %{ok: true, body: ^expected} = Client.run(tb, :node_https, tb.urls.chunked)
    end

    test "204, HEAD, redirect and the header echo", %{tb: tb} do
      assert %{ok: true, status: 204, body: ""} = Client.run(tb, :node_fetch, tb.urls.no_content)

      head = Client.run(tb, :curl, "https://other.test/", method: "HEAD")
      assert %{ok: true, status: 200, body: ""} = head
      assert Result.header(head, "content-length") == "22"

      redirect = Client.run(tb, :python_urllib, tb.urls.redirect)
      assert %{ok: true, status: 302} = redirect
      assert Result.header(redirect, "location") == "https://other.test/"

      echo = Client.run(tb, :node_https, tb.urls.echo, headers: [{"X-Test", "yes"}])
      seen = Condukt.JSON.decode!(echo.body)
      assert ["x-test", "yes"] in seen["headers"]
      assert ["x-seen-sni", "allowed.test"] in seen["headers"]
      assert ["host", "allowed.test"] in seen["headers"]
    end
  end

  describe "other protocols" do
    test "WebSocket echo through nginx's /ws", %{tb: tb} do
      r = Client.websocket(tb, tb.urls.ws, ["one", "two", String.duplicate("x", 100_000)])
      assert %{ok: true, status: 101} = r
      assert r.data.received == ["hello /ws", "one", "two", String.duplicate("x", 100_000)]
    end

    test "git clone over smart HTTP gets the served commit", %{tb: tb} do
      r = Client.git_clone(tb, tb.urls.git)
      assert %{ok: true} = r, r.output
      assert r.data.head == tb.git.head
      assert File.read!(Path.join(r.data.dir, "README.md")) =~ "condukt netns testbed"
    end

    test "TCP 8080 and UDP 443 reach inet directly (the bypass tests will mean something)", %{tb: tb} do
      probes =
        for proto <- [:tcp, :udp], {addr, family} <- [{tb.inet.v4, 4}, {tb.inet.v6, 6}] do
          port = if proto == :tcp, do: tb.ports.bypass_tcp, else: tb.ports.bypass_udp
          {proto, addr, port, family}
        end

      assert failures(probes, fn {proto, addr, port, family} ->
               r = Client.probe(tb, proto, addr, port, "probe #{proto} v#{family}\n")
               expect(r.ok and r.body == "bypass-#{proto}-ok\n", r)
             end) == []

      log = Testbed.bypass_log(tb)

      for {proto, _addr, _port, family} <- probes do
        pod = if family == 4, do: tb.pod.v4, else: tb.pod.v6

        assert Enum.any?(log, fn e ->
                 e["proto"] == "#{proto}" and e["peer"] == pod and
                   Base.decode64!(e["data_b64"]) == "probe #{proto} v#{family}\n"
               end),
               "no #{proto} v#{family} entry in #{inspect(log)}"
      end
    end

    test "the metadata and decoy addresses answer from inet whatever the Host", %{tb: tb} do
      assert %{ok: true, body: "metadata-service 169.254.169.254 host=metadata.test\n"} =
               Client.run(tb, :curl, "http://metadata.test/")

      assert %{ok: true, body: "metadata-service 169.254.169.254 host=allowed.test\n"} =
               Client.run(tb, :curl, tb.urls.metadata, headers: [{"Host", "allowed.test"}])

      assert %{ok: true, body: "decoy 192.0.2.80 host=allowed.test\n"} =
               Client.run(tb, :python_requests, tb.urls.decoy, headers: [{"Host", "allowed.test"}])
    end
  end

  describe "certificate failures" do
    test "mismatch.test (a leaf for other.test) and untrusted.test (self-signed) fail in every client", %{tb: tb} do
      cases =
        for name <- ["mismatch.test", "untrusted.test"],
            c <- Client.http_clients() ++ [:s_client, :git],
            do: {name, c}

      assert failures(cases, fn {name, c} ->
               r =
                 case c do
                   :s_client -> Client.s_client(tb, name)
                   :git -> Client.git_clone(tb, "https://#{name}/repo.git")
                   _ -> Client.run(tb, c, "https://#{name}/")
                 end

               expect(not r.ok and r.error_kind == :tls_verify, r)
             end) == []
    end

    test "without the test root in the environment, the system trust store refuses", %{tb: tb} do
      assert %{ok: false, error_kind: :tls_verify} = Client.run(tb, :curl, "https://allowed.test/", ca: nil)
      assert %{ok: false, error_kind: :tls_verify} = Client.run(tb, :node_https, "https://allowed.test/", ca: nil)
    end
  end

  describe "exec_in" do
    test "runs inside the namespace with a clean environment", %{tb: tb} do
      {addrs, 0} = Testbed.exec_in(tb, :pod, ["ip", "-o", "addr", "show", "dev", "eth0"])
      assert addrs =~ tb.pod.v4 and addrs =~ tb.pod.v6

      {hosts, 0} = Testbed.exec_in(tb, :pod, ["cat", "/etc/hosts"])
      assert hosts =~ ~r/^#{Regex.escape(tb.inet.v4)} .*allowed\.test/m

      {env, 0} = Testbed.exec_in(tb, :pod, ["env"], ca: tb.ca_cert, env: [{"X_TEST", "1"}])
      vars = env |> String.split("\n", trim: true) |> Enum.map(&hd(String.split(&1, "=")))

      assert Enum.sort(vars) ==
               Enum.sort(~w(PATH HOME LANG X_TEST) ++ Enum.map(Testbed.ca_env(tb.ca_cert), &elem(&1, 0)))
    end

    test "runs as another uid, and clients work as that uid", %{tb: tb} do
      assert {"65534\n", 0} = Testbed.exec_in(tb, :pod, ["id", "-u"], uid: 65534)
      assert %{ok: true, body: "hello from git.test\n"} = Client.run(tb, :curl, "https://git.test/", uid: 65534)
      assert %{ok: true, data: %{head: head}} = Client.git_clone(tb, tb.urls.git, uid: 65534)
      assert head == tb.git.head
    end

    test "spawn_in starts a server in the pod that wait_listening sees; a dead one is reported", %{tb: tb} do
      # A stand-in for the sidecar: listeners on 127.0.0.1:15001 and [::1]:15001.
      script = """
      import socket, time
      socks = []
      for family, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
          s = socket.socket(family)
          s.bind((addr, 15001))
          s.listen()
          socks.append(s)
      time.sleep(120)
      """

      pid = Testbed.spawn_in(tb, :pod, ["/usr/bin/python3", "-c", script])
      assert :ok = Testbed.wait_listening(tb, :pod, tcp: ["127.0.0.1:15001", "[::1]:15001"], pids: [pid])
      Cmd.kill([pid])
      refute Cmd.alive?(pid)

      dead = Testbed.spawn_in(tb, :pod, ["/bin/false"])
      assert {:error, :died} = Testbed.wait_listening(tb, :pod, tcp: ["127.0.0.1:15002"], pids: [dead], timeout: 5_000)
    end

    test "kills a command at its deadline", %{tb: tb} do
      {micros, {_, status}} = :timer.tc(fn -> Testbed.exec_in(tb, :inet, ["sleep", "30"], timeout: 300) end)
      assert status == 124
      assert micros < 5_000_000
    end
  end

  describe "life cycle" do
    test "the tier check passed on this machine" do
      assert Tier.check() == :ok
    end

    test "stop/1 removes namespaces, processes and files, and is idempotent" do
      tb = Testbed.start()
      assert tb.pod_ns in Testbed.list_namespaces() and tb.inet_ns in Testbed.list_namespaces()
      assert Enum.all?(tb.pids, &Cmd.alive?/1)

      assert :ok = Testbed.stop(tb)
      namespaces = Testbed.list_namespaces()
      refute tb.pod_ns in namespaces or tb.inet_ns in namespaces
      refute Enum.any?(tb.pids, &Cmd.alive?/1)
      refute File.exists?(Path.join("/etc/netns", tb.pod_ns)) or File.exists?(Path.join("/etc/netns", tb.inet_ns))
      refute File.exists?(tb.dir)

      assert :ok = Testbed.stop(tb)
    end

    test "sweep/0 removes a dead run's leftovers and keeps live testbeds", %{tb: live} do
      id = "dead00"
      ns = "ce-#{id}-pod"
      File.mkdir_p!(Path.join("/etc/netns", ns))
      File.write!(Path.join(["/etc/netns", ns, "hosts"]), "127.0.0.1 localhost\n")
      File.mkdir_p!("/run/condukt-netns")
      # A pid that cannot be running (above pid_max).
      File.write!("/run/condukt-netns/#{id}", "999999999 1\n")
      {_, 0} = Cmd.run(["ip", "netns", "add", ns])
      on_exit(fn -> Cmd.run(["ip", "netns", "del", ns]) end)

      assert :ok = Testbed.sweep()

      refute ns in Testbed.list_namespaces()
      refute File.exists?(Path.join("/etc/netns", ns))
      refute File.exists?("/run/condukt-netns/#{id}")
      assert live.pod_ns in Testbed.list_namespaces()
      assert %{ok: true} = Client.run(live, :curl, "https://allowed.test/")
    end
  end
end
