defmodule Condukt.NativeTest do
  # Against the real `condukt-egress port` (docs/port-protocol.md).
  use ExUnit.Case, async: true

  alias Condukt.Native
  alias Condukt.Native.Error
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge.Handshake
  alias Condukt.Test.ControlListener

  @moduletag :port_program
  @moduletag :tmp_dir
  if reason = Condukt.Test.PortProgram.skip_reason(), do: @moduletag(skip: reason)

  @token String.duplicate("5a", 16)

  setup do
    {:ok, native} = Native.start_link()
    %{native: native}
  end

  test "version", %{native: n} do
    assert {:ok, %{version: v, protocol: 1}} = Native.version(n)
    assert is_binary(v) and v != ""
  end

  test "many calls outstanding at once all get their own answer", %{native: n} do
    tasks = for bytes <- 16..64, do: Task.async(fn -> {bytes, Native.token_new(n, bytes)} end)

    for {bytes, {:ok, hex}} <- Task.await_many(tasks) do
      assert byte_size(hex) == 2 * bytes
      assert hex =~ ~r/\A[0-9a-f]+\z/
    end
  end

  test "token_new refuses a size out of range, naming it", %{native: n} do
    assert {:error, %Error{op: :token_new, code: code, message: msg}} = Native.token_new(n, 8)
    assert code in [:inval, :badarg]
    assert msg =~ "8"
  end

  test "ca_new returns PEMs and writes the files when asked", %{native: n, tmp_dir: dir} do
    assert {:ok, %{cert_pem: "-----BEGIN CERTIFICATE-----" <> _, key_pem: "-----BEGIN " <> _}} =
             Native.ca_new(n, common_name: "condukt test CA")

    cert = Path.join(dir, "ca.pem")
    key = Path.join(dir, "ca.key")
    assert {:ok, %{cert_pem: pem}} = Native.ca_new(n, common_name: "files", days: 2, cert_path: cert, key_path: key)
    assert File.read!(cert) == pem
    assert Bitwise.band(File.stat!(key).mode, 0o777) == 0o600

    # The key is created exclusively.
    assert {:error, %Error{code: :io, message: msg}} =
             Native.ca_new(n, common_name: "again", cert_path: cert, key_path: key)

    assert msg =~ key or msg =~ "exist"
  end

  test "policy_write loads the policy with the sidecar's loader before writing", %{native: n, tmp_dir: dir} do
    path = Path.join(dir, "policy.json")
    json = Condukt.Sandbox.NetworkPolicy.to_sidecar_json(rules: [allow: ["a.test"]])
    assert :ok = Native.policy_write(n, path, json)
    assert File.read!(path) == json
    assert Bitwise.band(File.stat!(path).mode, 0o777) == 0o600

    assert {:error, %Error{code: :inval}} = Native.policy_write(n, Path.join(dir, "bad.json"), ~s({"version":99}))
    refute File.exists?(Path.join(dir, "bad.json"))
  end

  test "control_attach to nothing is an error, not a hang", %{native: n, tmp_dir: dir} do
    assert {:error, %Error{op: :control_attach}} =
             Native.control_attach(n, {:unix, Path.join(dir, "nobody.sock")}, @token,
               timeout: 1_000,
               session_id: "test"
             )
  end

  describe "control channels" do
    setup do
      %{listener: ControlListener.start()}
    end

    defp attach(n, listener, opts) do
      task =
        Task.async(fn ->
          Native.control_attach(
            n,
            {:unix, listener.path},
            @token,
            [owner: opts[:owner], session_id: "test"] ++ Keyword.delete(opts, :owner)
          )
        end)

      # The hello carries a nonce, the session and its ticket, never the token.
      assert_receive {:listener, :hello, hello, conn}, 5_000

      assert %{"type" => "hello", "version" => 2, "session_id" => "test", "nonce" => nonce, "ticket" => ticket} = hello

      assert map_size(hello) == 5 and nonce =~ ~r/\A[0-9a-f]{64}\z/
      token = Base.decode16!(@token, case: :lower)
      assert ticket == Handshake.hex(Handshake.ticket(token, "test", Base.decode16!(nonce, case: :lower)))
      ControlListener.welcome(conn, "test", @token)
      assert {:ok, {chan, welcome}} = Task.await(task)
      assert %{"type" => "welcome", "version" => 2, "session_id" => "test"} = welcome
      refute Map.has_key?(welcome, "proof")
      {chan, conn}
    end

    test "a listener that does not hold the token learns nothing and never welcomes", %{native: n, listener: l} do
      task = Task.async(fn -> Native.control_attach(n, {:unix, l.path}, @token, session_id: "test") end)
      assert_receive {:listener, :hello, hello, conn}, 5_000
      refute inspect(hello) =~ @token
      # The stand-in holds another token: the port's proof does not check
      # out there, and nothing it can say would check out here.
      ControlListener.welcome(conn, "test", String.duplicate("a5", 16))
      assert_receive {:listener, :refused}, 5_000
      assert {:error, %Error{code: :closed}} = Task.await(task)
    end

    test "frames both ways, as terms", %{native: n, listener: l} do
      {chan, conn} = attach(n, l, owner: self())
      ControlListener.send_frames(conn, [%{type: "event", seq: 1, event: "request_opened", query: nil, ok: true}])
      assert_receive {:condukt_control, ^n, ^chan, {:frame, frame}}, 5_000
      assert frame == %{"type" => "event", "seq" => 1, "event" => "request_opened", "query" => nil, "ok" => true}

      assert :ok =
               Native.control_send(n, chan, %{type: "decision", id: "1", decision: "allow", cache: false, reason: nil})

      assert_receive {:listener, :line, line}, 5_000
      assert line["type"] == "decision" and line["id"] == "1" and line["cache"] == false

      assert {:error, %Error{code: :badarg, message: msg}} = Native.control_send(n, chan, %{type: "x", bad: {:tuple}})
      assert msg =~ "bad"
    end

    test "control_post: no answer when the frame is queued, send_failed with the tag when not",
         %{native: n, listener: l} do
      {chan, _conn} = attach(n, l, owner: self())
      port = Native.port(n)
      assert is_port(port)

      assert :ok = Native.control_post(port, chan, %{type: "decision", id: "7", decision: "allow", cache: false}, :t1)
      assert_receive {:listener, :line, line}, 5_000
      assert line["type"] == "decision" and line["id"] == "7" and line["decision"] == "allow"
      refute_receive {:condukt_control, ^n, ^chan, _}, 300

      # Refused by the sidecar's rules, by the mapping, and on a channel
      # that is not open: each comes back to the poster with its tag.
      assert :ok = Native.control_post(port, chan, %{type: "decision", id: "x"}, {:decision, "x"})

      assert_receive {:condukt_control, ^n, ^chan,
                      {:send_failed, {:decision, "x"}, %Error{code: :inval, op: :control_post, message: msg}}},
                     5_000

      assert msg =~ ~s("id" must be a decimal string)
      assert :ok = Native.control_post(port, chan, %{type: "ping", x: {:tuple}}, :t3)
      assert_receive {:condukt_control, ^n, ^chan, {:send_failed, :t3, %Error{code: :badarg}}}, 5_000
      assert :ok = Native.control_post(port, 999, %{type: "ping"}, :t4)
      assert_receive {:condukt_control, ^n, 999, {:send_failed, :t4, %Error{code: :closed}}}, 5_000
      refute_received {:listener, :line, _}

      # A port that is gone is an error at once.
      Native.stop(n)

      assert {:error, %Error{code: :port_exited, op: :control_post}} =
               Native.control_post(port, chan, %{type: "ping"}, :t5)
    end

    test "credit: at most :window unacknowledged frames", %{native: n, listener: l} do
      {chan, conn} = attach(n, l, owner: self(), window: 4)
      ControlListener.send_frames(conn, for(i <- 1..10, do: %{type: "event", seq: i}))

      for i <- 1..4, do: assert_receive({:condukt_control, ^n, ^chan, {:frame, %{"seq" => ^i}}}, 5_000)
      refute_receive {:condukt_control, ^n, ^chan, {:frame, _}}, 300

      Native.ack(n, chan, 4)
      for i <- 5..8, do: assert_receive({:condukt_control, ^n, ^chan, {:frame, %{"seq" => ^i}}}, 5_000)
      refute_receive {:condukt_control, ^n, ^chan, {:frame, _}}, 300
    end

    test "the sidecar closing is reported once", %{native: n, listener: l} do
      {chan, conn} = attach(n, l, owner: self())
      ControlListener.close(conn)
      assert_receive {:condukt_control, ^n, ^chan, {:closed, reason}}, 5_000
      assert is_binary(reason)
      assert {:error, %Error{}} = Native.control_send(n, chan, %{type: "ping"})
    end

    test "detach closes the socket; an owner that dies has its channels detached", %{native: n, listener: l} do
      {chan, _conn} = attach(n, l, owner: self())
      assert :ok = Native.control_detach(n, chan)
      assert_receive {:listener, :closed}, 5_000

      owner = spawn(fn -> Process.sleep(:infinity) end)
      {_chan, _conn} = attach(n, l, owner: owner)
      Process.exit(owner, :kill)
      assert_receive {:listener, :closed}, 5_000
    end

    test "the port dying fails pending calls and stops the server", %{listener: l} do
      Process.flag(:trap_exit, true)
      {:ok, n} = Native.start_link()
      os_pid = Native.os_pid(n)

      task =
        Task.async(fn -> Native.control_attach(n, {:unix, l.path}, @token, timeout: 30_000, session_id: "test") end)

      # The listener never welcomes: the call is pending when the port dies.
      assert_receive {:listener, :hello, _, _conn}, 5_000

      log =
        ExUnit.CaptureLog.capture_log(fn ->
          System.cmd("kill", ["-KILL", "#{os_pid}"])
          assert {:error, %Error{code: :port_exited, op: :control_attach}} = Task.await(task)
          assert_receive {:EXIT, ^n, {:port_exited, 137}}, 5_000
        end)

      assert log =~ "the port program exited (status 137)"
    end
  end

  describe "kube_* without an API server" do
    setup do
      {:ok, l} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
      {:ok, port} = :inet.port(l)
      :gen_tcp.close(l)
      %{server: "https://127.0.0.1:#{port}"}
    end

    test "forward errors go to the listener's owner; its death closes the listener", %{native: n, server: server} do
      {:ok, %{kube: k, auth: :none, context: nil}} = Native.kube_open(n, %{source: :explicit, server: server})
      sock = Path.join(System.tmp_dir!(), "ck-fwd-#{System.unique_integer([:positive])}.sock")
      test = self()

      owner =
        spawn(fn ->
          result = Native.kube_forward(n, k, %{namespace: "a", pod: "p", port: 80, listen: {:unix, sock}})
          send(test, {:opened, result})

          receive do
            msg -> send(test, {:owner_got, msg})
          end

          receive do
            :exit -> :ok
          end
        end)

      assert_receive {:opened, {:ok, {f, %{address: {:unix, ^sock}}}}}
      {:ok, s} = :gen_tcp.connect({:local, sock}, 0, [:binary, active: false])
      assert {:error, :closed} = :gen_tcp.recv(s, 0, 5_000)
      assert_receive {:owner_got, {:condukt_kube_forward, ^n, ^f, {:error, msg}}}, 5_000
      assert msg =~ "cannot connect"
      ref = Process.monitor(owner)
      send(owner, :exit)
      assert_receive {:DOWN, ^ref, :process, ^owner, _}
      assert :ok = wait_until(fn -> not File.exists?(sock) end)
      assert :ok = Native.kube_close(n, k)
    end

    test "kube_request with no server is unavail; a malformed request is badarg", %{native: n, server: server} do
      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :explicit, server: server, token: "t"})
      assert {:error, %Error{op: :kube_request, code: :unavail}} = Native.kube_request(n, k, %{method: :get, path: "/"})

      assert {:error, %Error{code: :badarg}} = Native.kube_request(n, k, %{method: :get})
    end

    test "a name none of whose addresses answers fails naming the host and each address tried",
         %{native: n, server: server} do
      port = server |> URI.parse() |> Map.fetch!(:port)
      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :explicit, server: "https://localhost:#{port}", token: "t"})

      assert {:error, %Error{code: :unavail, message: msg}} = Native.kube_request(n, k, %{method: :get, path: "/"})
      assert msg =~ "cannot connect to \"localhost\""
      assert msg =~ "127.0.0.1: "

      if localhost_has_ipv6?() do
        assert msg =~ "::1: "
      end
    end
  end

  describe "kube_* against a local TLS server" do
    setup %{tmp_dir: dir} do
      cert = Path.join(dir, "server.pem")
      key = Path.join(dir, "server.key")

      {_, 0} =
        System.cmd(
          "openssl",
          ~w(req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost
             -addext subjectAltName=DNS:localhost -keyout #{key} -out #{cert}),
          stderr_to_stdout: true
        )

      %{cert: cert, key: key}
    end

    # Where localhost is ::1 first (Debian's /etc/hosts), a client that
    # tried one address would never reach a server on 127.0.0.1 only.
    test "a server listening on 127.0.0.1 only is reached as https://localhost:PORT",
         %{native: n, cert: cert, key: key} do
      {:ok, l} = :ssl.listen(0, ip: {127, 0, 0, 1}, certfile: cert, keyfile: key, active: false, reuseaddr: true)
      {:ok, {_, port}} = :ssl.sockname(l)
      test = self()

      spawn_link(fn ->
        {:ok, t} = :ssl.transport_accept(l)
        {:ok, s} = :ssl.handshake(t)
        {:ok, req} = recv_head(s, "")
        send(test, {:request, req})

        :ok =
          :ssl.send(s, "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}")

        Process.sleep(200)
        :ssl.close(s)
      end)

      {:ok, %{kube: k}} =
        Native.kube_open(n, %{
          source: :explicit,
          server: "https://localhost:#{port}",
          ca_pem: File.read!(cert),
          token: "t0k"
        })

      assert {:ok, %{status: 200, body: %{"ok" => true}}} = Native.kube_request(n, k, %{method: :get, path: "/api"})
      assert_receive {:request, req}
      # The name, not the address dialled, is what the server is told.
      assert req =~ ~r/^GET \/api HTTP\/1.1\r\n/
      assert req =~ ~r/\r\nhost: localhost:#{port}\r\n/i
      assert req =~ ~r/\r\nauthorization: Bearer t0k\r\n/i
      :ssl.close(l)
    end
  end

  defp recv_head(s, acc) do
    if String.contains?(acc, "\r\n\r\n") do
      {:ok, acc}
    else
      case :ssl.recv(s, 0, 5_000) do
        {:ok, data} -> recv_head(s, acc <> IO.iodata_to_binary(data))
        other -> other
      end
    end
  end

  defp localhost_has_ipv6?, do: match?({:ok, [_ | _]}, :inet.getaddrs(~c"localhost", :inet6))

  defp wait_until(fun, tries \\ 100) do
    cond do
      fun.() ->
        :ok

      tries == 0 ->
        :timeout

      true ->
        Process.sleep(20)
        wait_until(fun, tries - 1)
    end
  end

  test "stop closes the program: the OS process is gone", %{native: n} do
    os_pid = Native.os_pid(n)
    assert File.exists?("/proc/#{os_pid}")
    :ok = Native.stop(n)
    refute Process.alive?(n)
    refute os_alive?(os_pid)
    assert Native.stop(n) == :ok
  end

  # A zombie waiting for erl_child_setup to reap it counts as gone.
  def os_alive?(os_pid) do
    case File.read("/proc/#{os_pid}/stat") do
      {:ok, stat} -> not String.match?(stat, ~r/^\d+ \(.*\) [ZX] /s)
      {:error, _} -> false
    end
  end

  test "a missing binary is an error naming it" do
    Process.flag(:trap_exit, true)
    assert {:error, %Error{code: :port_exited, message: msg}} = Native.start_link(bin: "/nonexistent/condukt-egress")
    assert msg =~ "/nonexistent/condukt-egress"
  end
end
