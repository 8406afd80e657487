defmodule Condukt.Netns.ControlChannelTest do
  # Attacks on the control channel from the workspace, end to end: the real
  # sidecar in a testbed pod with its TCP control port (127.0.0.1:15002 and
  # [::1]:15002), reached as Kubernetes reaches it (a port-forward that dials
  # localhost: IPv4 first, then IPv6), the real ControlBridge and port
  # program on the BEAM side, and the attacker a workspace process with an
  # ordinary uid (1000) in the pod.
  #
  #   * A workspace process that listens on the control port while the
  #     sidecar is down (on [::1], where the port-forward falls back, or on
  #     127.0.0.1) gets the bridge's hello and even its proof, yet nothing it
  #     can use: it cannot welcome the bridge (refused, :control_refused), and
  #     what it recorded does not authenticate it to the restarted sidecar
  #     (refused, a control_refused event). While the sidecar runs, neither
  #     family can be taken.
  #   * A workspace process that holds far more connections in the handshake
  #     than the sidecar has slots, or floods the port while the bridge
  #     connects, does not keep the bridge out: the bridge connects and its
  #     decide rule answers; the evicted connections are reported as
  #     control_refused events.
  use Condukt.Test.Netns.Case, async: false

  import Condukt.Test.Netns.RawHttp

  alias Condukt.Sandbox.NetworkPolicy.{ControlBridge, Request}
  alias Condukt.Dev.Netns.Cmd
  alias Condukt.Test.Netns.Sidecar

  @moduletag :port_program
  @moduletag :capture_log
  if reason = Condukt.Test.PortProgram.skip_reason(), do: @moduletag(skip: reason)

  @prefix [:condukt, :sandbox, :network_policy]
  @workspace_uid 1000

  setup_all do
    %{tb: Testbed.start()}
  end

  setup %{tb: tb} do
    me = self()
    session = "e2e-#{tb.id}"
    id = {__MODULE__, System.unique_integer()}

    :telemetry.attach_many(
      id,
      Condukt.Sandbox.NetworkPolicy.Telemetry.events(),
      fn event, m, meta, _ -> if meta[:session_id] == session, do: send(me, {:telemetry, event, m, meta}) end,
      nil
    )

    owner = spawn(fn -> Process.sleep(:infinity) end)

    on_exit(fn ->
      :telemetry.detach(id)
      Process.exit(owner, :kill)
    end)

    %{session: session, owner: owner}
  end

  def decider(_ctx, %Request{host: "decide.test"}), do: :allow
  def decider(_ctx, _request), do: {:deny, "not this one"}

  @policy [rules: [deny: ["denied.test"], decide: &__MODULE__.decider/2], default: :deny]

  defp start_sidecar(tb, opts) do
    tb |> Sidecar.start(@policy, [control: "tcp"] ++ opts) |> Sidecar.port_forward()
  end

  defp start_bridge(ctx, sc, token) do
    {:ok, bridge} =
      ControlBridge.start(
        session_id: ctx.session,
        owner: ctx.owner,
        policy: @policy,
        address: {:unix, sc.control_relay},
        token: token,
        backoff: {50, 200},
        attempts: :infinity
      )

    on_exit(fn -> ControlBridge.stop(bridge) end)
    bridge
  end

  # A Python program in the pod as the workspace uid; long-lived ones are
  # spawned and write JSON lines to their log.
  defp spawn_workspace(tb, sc, script, args) do
    log = Path.join(tb.dir, "attacker-#{System.unique_integer([:positive])}.log")
    pid = Testbed.spawn_in(tb, :pod, argv(tb, sc, script) ++ args, uid: @workspace_uid, log: log)
    on_exit(fn -> Cmd.kill([pid]) end)
    {pid, log}
  end

  defp log_lines(log) do
    case File.read(log) do
      {:ok, text} ->
        for line <- String.split(text, "\n", trim: true), String.starts_with?(line, "{"), do: Condukt.JSON.decode!(line)

      {:error, _} ->
        []
    end
  end

  defp await_log(log, fun, timeout \\ 15_000) do
    case Cmd.poll(fn -> Enum.any?(log_lines(log), fun) end, timeout, 50) do
      :ok -> Enum.find(log_lines(log), fun)
      {:error, :timeout} -> flunk("the attacker did not log what was expected:\n" <> (File.read(log) |> elem(1)))
    end
  end

  defp run_workspace(tb, sc, script, args) do
    {out, status} = Testbed.exec_in(tb, :pod, argv(tb, sc, script) ++ args, timeout: 60_000, uid: @workspace_uid)
    assert status == 0, "the workspace program failed (exit #{status}):\n#{out}"
    out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
  end

  # Plays the sidecar on the control port for every connection, as far as
  # one can without the token, and logs every line it was sent.
  @squatter ~S'''
  import json, socket, threading
  families = sys.argv[2].split(",")
  def serve(c):
      got = []
      f = c.makefile("rb")
      try:
          for line in f:
              got.append(line.decode("latin-1"))
              m = json.loads(line)
              if m.get("type") == "hello":
                  c.sendall(b'{"type":"challenge","version":2,"nonce":"' + b"00" * 32 + b'"}\n')
              elif m.get("type") == "auth":
                  w = {"type": "welcome", "version": 2, "session_id": sys.argv[3], "proof": m["proof"], "dropped": 0}
                  c.sendall((json.dumps(w) + "\n").encode())
      except (OSError, ValueError):
          pass
      print(json.dumps({"got": got}), flush=True)
      c.close()
  def listen(fam):
      if fam == "6":
          s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
          s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
          s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
          s.bind(("::1", 15002))
      else:
          s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
          s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
          s.bind(("127.0.0.1", 15002))
      s.listen(16)
      return s
  socks = [listen(f) for f in families]
  print(json.dumps({"listening": families}), flush=True)
  def accept(s):
      while True:
          c, _ = s.accept()
          threading.Thread(target=serve, args=(c,), daemon=True).start()
  for s in socks[1:]:
      threading.Thread(target=accept, args=(s,), daemon=True).start()
  accept(socks[0])
  '''

  test "a workspace process squatting the control port (IPv6 or IPv4) while the sidecar is down captures nothing usable",
       %{tb: tb} = ctx do
    token = :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    sc = start_sidecar(tb, token: token)

    # While the sidecar runs, neither family of its port can be taken.
    binds = ~S'''
    import json, socket
    res = {}
    for fam, addr in (("6", "::1"), ("4", "127.0.0.1")):
        s = socket.socket(socket.AF_INET6 if fam == "6" else socket.AF_INET, socket.SOCK_STREAM)
        if fam == "6":
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, 15002))
            s.listen(1)
            res[fam] = "bound"
        except OSError as e:
            res[fam] = e.strerror
    print(json.dumps(res))
    '''

    assert run_workspace(tb, sc, binds, []) == %{"6" => "Address already in use", "4" => "Address already in use"}

    # The sidecar goes away (a restart); the workspace takes its port.
    Sidecar.stop(sc)

    captured =
      for families <- ["6", "4"] do
        {pid, log} = spawn_workspace(tb, sc, @squatter, [families, ctx.session])
        await_log(log, &(&1["listening"] == [families]))

        bridge = start_bridge(ctx, sc, token)

        assert_receive {:telemetry, @prefix ++ [:control_refused], %{count: 1}, %{side: :bridge, reason: reason}},
                       15_000

        assert reason =~ "did not prove the session token"
        refute_received {:telemetry, @prefix ++ [:control_connected], _, _}
        ControlBridge.stop(bridge)
        Cmd.kill([pid])
        flush_telemetry()

        %{"got" => [hello, auth | _]} = await_log(log, &match?(%{"got" => [_, _ | _]}, &1))
        # What it got: a nonce, the session id and a proof bound to its own
        # made-up nonce. Never the token.
        refute hello =~ token
        refute auth =~ token
        assert %{"type" => "hello", "version" => 2, "session_id" => session, "nonce" => _} = Condukt.JSON.decode!(hello)
        assert session == ctx.session
        assert %{"type" => "auth", "proof" => _} = Condukt.JSON.decode!(auth)
        {hello, auth}
      end

    # The sidecar is back (same token, same session). Replaying what was
    # captured does not authenticate: the sidecar's challenge is fresh.
    sc = start_sidecar(tb, token: token)

    replay = ~S'''
    import json, socket
    res = []
    for hello, auth in json.loads(sys.argv[2]):
        s = socket.create_connection(("127.0.0.1", 15002), timeout=5)
        s.sendall(hello.encode())
        r = s.makefile("rb")
        challenge = json.loads(r.readline())
        s.sendall(auth.encode())
        res.append({"challenge": challenge["type"], "end": ending(s, 10)})
    print(json.dumps(res))
    '''

    res = run_workspace(tb, sc, replay, [Condukt.JSON.encode!(Enum.map(captured, &Tuple.to_list/1))])
    assert length(res) == 2

    for %{"challenge" => "challenge", "end" => ending} <- res do
      assert ending["how"] in ["eof", "reset"] and ending["bytes"] == 0, inspect(ending)
    end

    [refused | _] = await_events(sc, 1, &(&1["event"] == "control_refused"))
    assert refused["reason"] == "wrong proof"

    # The real bridge connects, hears about the refusals, and decides.
    start_bridge(ctx, sc, token)
    assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 15_000

    assert_receive {:telemetry, @prefix ++ [:control_refused], %{count: n}, %{side: :sidecar, reason: "wrong proof"}},
                   10_000

    assert n >= 1
    r = Client.run(tb, :curl, "https://decide.test/?#{tag()}", ca: sc.ca_cert, http: :h1, timeout: 30_000)
    assert r.status == 200 and r.body == "hello from decide.test\n", inspect(r)
    Sidecar.stop(sc)
  end

  # Opens HOLD connections to the control port over both families, half of
  # them with a valid hello (the session id is no secret), and holds them;
  # once a second it opens new ones for those the sidecar dropped.
  @holder ~S'''
  import json, socket, time
  hold, sid = int(sys.argv[2]), sys.argv[3]
  conns, opened = [], 0
  def open_one(i):
      fam, addr = (socket.AF_INET6, "::1") if i % 2 else (socket.AF_INET, "127.0.0.1")
      s = socket.socket(fam, socket.SOCK_STREAM)
      s.connect((addr, 15002))
      if i % 4 < 2:
          s.sendall(json.dumps({"type": "hello", "version": 2, "session_id": sid, "nonce": "ab" * 32}).encode() + b"\n")
      s.setblocking(False)
      return s
  def closed(s):
      try:
          while True:
              d = s.recv(4096)
              if d == b"":
                  return True
      except BlockingIOError:
          return False
      except OSError:
          return True
  for i in range(hold):
      conns.append(open_one(i))
      opened += 1
  print(json.dumps({"opened": opened}), flush=True)
  end = time.monotonic() + float(sys.argv[4])
  while time.monotonic() < end:
      time.sleep(1)
      for k, s in enumerate(conns):
          if closed(s):
              s.close()
              conns[k] = open_one(opened)
              opened += 1
      print(json.dumps({"opened": opened}), flush=True)
  '''

  test "a workspace process holding more connections in the handshake than there are slots does not keep the bridge out",
       %{tb: tb} = ctx do
    token = :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    sc = start_sidecar(tb, token: token)
    {pid, log} = spawn_workspace(tb, sc, @holder, ["400", ctx.session, "40"])
    await_log(log, &((&1["opened"] || 0) >= 400), 30_000)

    # 400 held, 128 slots: the 272 oldest went, and the holder keeps
    # topping up. The bridge still gets in and its decide rule answers.
    start_bridge(ctx, sc, token)
    assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 15_000
    r = Client.run(tb, :curl, "https://decide.test/?#{tag()}", ca: sc.ca_cert, http: :h1, timeout: 30_000)
    assert r.status == 200 and r.body == "hello from decide.test\n", inspect(r)
    r = Client.run(tb, :curl, "https://other.test/?#{tag()}", ca: sc.ca_cert, http: :h1, timeout: 30_000)
    assert r.status == 403 and r.body =~ "not this one", inspect(r)

    # The evictions are on record, summarised (at most one event a second).
    evicted = fn ->
      Sidecar.stdout_events(sc)
      |> Enum.filter(&(&1["event"] == "control_refused" and &1["reason"] =~ "evicted"))
      |> Enum.map(& &1["count"])
      |> Enum.sum()
    end

    assert :ok == Cmd.poll(fn -> evicted.() >= 272 end, 10_000), "evictions on record: #{evicted.()}"
    assert_receive {:telemetry, @prefix ++ [:control_refused], %{count: _}, %{side: :sidecar}}, 10_000
    assert Cmd.alive?(pid), "the holder gave up early:\n" <> File.read!(log)
    Cmd.kill([pid])
    Sidecar.stop(sc)
  end

  # Opens connections to the control port as fast as it can for SECONDS,
  # over both families, half of them with a valid hello (the session id is
  # no secret), keeping the newest KEEP open; logs how many it opened.
  @flooder ~S'''
  import json, socket, time
  keep, sid, seconds = int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
  hello = json.dumps({"type": "hello", "version": 2, "session_id": sid, "nonce": "cd" * 32}).encode() + b"\n"
  conns, opened, last = [], 0, 0.0
  end = time.monotonic() + seconds
  while time.monotonic() < end:
      fam, addr = (socket.AF_INET6, "::1") if opened % 2 else (socket.AF_INET, "127.0.0.1")
      s = socket.socket(fam, socket.SOCK_STREAM)
      try:
          s.connect((addr, 15002))
          if opened % 4 < 2:
              s.sendall(hello)
      except OSError:
          s.close()
          continue
      conns.append(s)
      opened += 1
      if len(conns) > keep:
          conns.pop(0).close()
      if time.monotonic() - last > 0.5:
          last = time.monotonic()
          print(json.dumps({"opened": opened}), flush=True)
  print(json.dumps({"opened": opened, "done": True}), flush=True)
  '''

  test "a workspace process flooding the control port while the bridge connects does not keep it out or delay its decisions",
       %{tb: tb} = ctx do
    token = :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    sc = start_sidecar(tb, token: token)
    {pid, log} = spawn_workspace(tb, sc, @flooder, ["300", ctx.session, "30"])
    await_log(log, &((&1["opened"] || 0) >= 1_000), 30_000)

    # The flood goes on (several times the slots every second) while the
    # bridge dials, authenticates and answers a decide rule.
    t0 = System.monotonic_time(:millisecond)
    start_bridge(ctx, sc, token)
    assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 15_000
    r = Client.run(tb, :curl, "https://decide.test/?#{tag()}", ca: sc.ca_cert, http: :h1, timeout: 30_000)
    assert r.status == 200 and r.body == "hello from decide.test\n", inspect(r)
    took = System.monotonic_time(:millisecond) - t0
    assert took < 10_000, "the bridge's decision took #{took} ms under the flood"
    assert Cmd.alive?(pid), "the flood ended before the decision:\n" <> File.read!(log)

    # The connections the flood lost are on record as evictions.
    assert :ok ==
             Cmd.poll(
               fn ->
                 Sidecar.stdout_events(sc)
                 |> Enum.any?(&(&1["event"] == "control_refused" and &1["reason"] =~ "evicted"))
               end,
               10_000
             )

    Cmd.kill([pid])
    Sidecar.stop(sc)
  end

  defp flush_telemetry do
    receive do
      {:telemetry, _, _, _} -> flush_telemetry()
    after
      0 -> :ok
    end
  end
end
