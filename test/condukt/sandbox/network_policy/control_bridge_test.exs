defmodule Condukt.Sandbox.NetworkPolicy.ControlBridgeTest do
  # The bridge end to end: the real sidecar (condukt-egress proxy) in a
  # testbed pod, the real port program, real curl. Needs the :netns tier and
  # the port program; skipped with a printed reason otherwise.
  use Condukt.Test.Netns.Case, async: false

  import ExUnit.CaptureLog

  alias Condukt.Sandbox.NetworkPolicy.{ControlBridge, ControlChannelSupervisor, Request}
  alias Condukt.Test.Netns.Sidecar

  @moduletag :port_program
  # The bridges log their channel closing when each test stops its sidecar.
  @moduletag :capture_log
  if reason = Condukt.Test.PortProgram.skip_reason(), do: @moduletag(skip: reason)

  @prefix [:condukt, :sandbox, :network_policy]
  @lifecycle [:request_opened, :request_allowed, :request_denied, :request_closed, :request_failed]

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

  # A decider the tests steer by host; `me` receives {:deciding, host, pid}.
  def decider(me) do
    fn _ctx, %Request{host: host} ->
      send(me, {:deciding, host, self()})

      case host do
        "decide.test" -> :allow
        "other.test" -> {:deny, "other.test is not needed for this task"}
        "v4.test" -> raise "decider bug"
        "v6.test" -> receive(do: (:go -> :allow))
      end
    end
  end

  defp policy(me, timeout \\ 5_000) do
    [rules: [deny: ["denied.test"], decide: [call: decider(me), timeout: timeout]], default: :deny]
  end

  defp start_bridge(ctx, sc, opts \\ []) do
    {:ok, bridge} =
      ControlBridge.start(
        [
          session_id: ctx.session,
          owner: ctx.owner,
          policy: Keyword.get(opts, :policy, policy(self())),
          address: sc.control,
          token: sc.token,
          backoff: {50, 500}
        ] ++ Keyword.drop(opts, [:policy])
      )

    assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 10_000
    on_exit(fn -> ControlBridge.stop(bridge) end)
    bridge
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  defp curl(tb, sc, url), do: Client.run(tb, :curl, url, ca: sc.ca_cert, http: :h1, timeout: 30_000)

  # The telemetry events of the request whose query is `q`, up to its last.
  defp events_for(q, last \\ [:request_closed, :request_failed, :request_denied]) do
    receive do
      {:telemetry, [_, _, _, name], m, %{request: %Request{query: ^q}} = meta} when name in @lifecycle ->
        if name in last, do: [{name, m, meta}], else: [{name, m, meta} | events_for(q, last)]
    after
      15_000 -> flunk("no #{inspect(last)} telemetry for #{q}")
    end
  end

  test "a function decider allows one host and denies another; the events reach :telemetry handlers", ctx do
    sc = Sidecar.start(ctx.tb, policy(self()))
    start_bridge(ctx, sc)

    q = tag()
    r = curl(ctx.tb, sc, "https://decide.test/?#{q}")
    assert r.status == 200 and r.body == "hello from decide.test\n", inspect(r)
    assert_received {:deciding, "decide.test", _}
    events = events_for(q)
    assert Enum.map(events, &elem(&1, 0)) == [:request_opened, :request_allowed, :request_closed]
    {_, _, allowed} = Enum.at(events, 1)
    assert allowed.matched_rule == %{index: 1, kind: :decide}
    {_, m, closed} = List.last(events)
    assert m.bytes_in > 0 and m.bytes_out > 0
    assert %Request{host: "decide.test", scheme: :https, method: "GET", status: 200} = closed.request
    assert %DateTime{} = closed.at
    assert %DateTime{} = closed.request.opened_at

    q = tag()
    r = curl(ctx.tb, sc, "https://other.test/?#{q}")
    assert r.status == 403
    assert r.body =~ "other.test is not needed for this task"
    [{:request_opened, _, _}, {:request_denied, _, denied}] = events_for(q)
    assert denied.reason == "other.test is not needed for this task"
    assert denied.matched_rule == %{index: 1, kind: :decide}

    # A static deny never asks the decider; its reason is the policy's atom.
    q = tag()
    assert curl(ctx.tb, sc, "https://denied.test/?#{q}").status == 403

    assert {:request_denied, _, %{reason: :denied_by_rule, matched_rule: %{index: 0, kind: :deny}}} =
             List.last(events_for(q))

    refute_received {:deciding, "denied.test", _}

    # An allow covers identical requests only: another query asks again.
    q = tag()
    assert curl(ctx.tb, sc, "https://decide.test/?#{q}").status == 200
    events_for(q)
    assert_received {:deciding, "decide.test", _}
    Sidecar.stop(sc)
  end

  test "a crashing decider denies with :decider_error and emits :decider_failure", ctx do
    sc = Sidecar.start(ctx.tb, policy(self()))
    start_bridge(ctx, sc)

    log =
      capture_log(fn ->
        q = tag()
        assert curl(ctx.tb, sc, "https://v4.test/?#{q}").status == 403
        assert {:request_denied, _, %{reason: :decider_error}} = List.last(events_for(q))
      end)

    assert log =~ "decider bug"
    assert_received {:telemetry, @prefix ++ [:decider_failure], %{count: 1}, %{reason: :decider_error}}
    Sidecar.stop(sc)
  end

  test "killing the owner stops the bridge :normal, and its port process with it", ctx do
    sc = Sidecar.start(ctx.tb, policy(self()))
    bridge = start_bridge(ctx, sc)
    %{os_pid: os_pid, status: :connected} = ControlBridge.info(bridge)
    ref = Process.monitor(bridge)

    Process.exit(ctx.owner, :kill)
    assert_receive {:DOWN, ^ref, :process, ^bridge, :normal}, 5_000
    refute os_alive?(os_pid)
    refute Enum.any?(DynamicSupervisor.which_children(ControlChannelSupervisor), &match?({_, ^bridge, _, _}, &1))
    assert ControlBridge.stop(bridge) == :ok
    Sidecar.stop(sc)
  end

  test "killing the port program: the bridge starts a new one, re-dials, and decides again", ctx do
    sc = Sidecar.start(ctx.tb, policy(self()))
    bridge = start_bridge(ctx, sc)
    %{os_pid: os_pid} = ControlBridge.info(bridge)

    capture_log(fn ->
      System.cmd("kill", ["-KILL", "#{os_pid}"])
      # The port's death reaches the bridge as the channel closing.
      assert_receive {:telemetry, @prefix ++ [:control_disconnected], _, %{reason: reason}}, 5_000
      assert reason =~ "the port program exited"
      assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 10_000
    end)

    assert %{status: :connected, os_pid: new_os_pid} = ControlBridge.info(bridge)
    assert new_os_pid != os_pid
    refute os_alive?(os_pid)

    q = tag()
    assert curl(ctx.tb, sc, "https://other.test/?#{q}").status == 403
    assert {:request_denied, _, %{reason: "other.test is not needed for this task"}} = List.last(events_for(q))
    Sidecar.stop(sc)
  end

  test "the channel cut mid-decision: an answer that comes in time after the re-dial still counts", ctx do
    sc = Sidecar.start(ctx.tb, policy(self(), 10_000))
    bridge = start_bridge(ctx, sc)
    %{os_pid: os_pid} = ControlBridge.info(bridge)
    q = tag()
    client = Task.async(fn -> curl(ctx.tb, sc, "https://v6.test/?#{q}") end)
    assert_receive {:deciding, "v6.test", decider}, 10_000

    capture_log(fn ->
      System.cmd("kill", ["-KILL", "#{os_pid}"])
      assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 10_000
    end)

    # The decider kept running across the drop; the sidecar re-sent the
    # pending request to the new channel, which gets the answer.
    assert Process.alive?(decider)
    send(decider, :go)
    r = Task.await(client, 30_000)
    assert r.status == 200, inspect(r)
    assert {:request_closed, _, _} = List.last(events_for(q))
    Sidecar.stop(sc)
  end

  # Decisions are posted to the port without a reply; one the port could
  # not queue comes back as :send_failed (Condukt.NativeTest shows the
  # port and Native doing so). Given that message, the bridge holds the
  # answer and gives it to the sidecar's re-sent request: the decider is
  # not asked again (here it never answers at all).
  test "a posted decision that could not be queued is held for the re-sent request", ctx do
    sc = Sidecar.start(ctx.tb, policy(self(), 10_000))
    bridge = start_bridge(ctx, sc)
    %{os_pid: os_pid, native: native, chan: chan} = ControlBridge.info(bridge)
    q = tag()
    client = Task.async(fn -> curl(ctx.tb, sc, "https://v6.test/?#{q}") end)
    assert_receive {:deciding, "v6.test", _decider}, 10_000

    # The sidecar's first question of this run has id "1".
    failed = %Condukt.Native.Error{
      code: :closed,
      message: "control_send: channel #{chan} is not open",
      op: :control_post
    }

    capture_log(fn ->
      send(bridge, {:condukt_control, native, chan, {:send_failed, {:decision, "1", :allow, false}, failed}})
      System.cmd("kill", ["-KILL", "#{os_pid}"])
      assert_receive {:telemetry, @prefix ++ [:control_connected], _, _}, 10_000
    end)

    r = Task.await(client, 30_000)
    assert r.status == 200, inspect(r)
    assert {:request_closed, _, _} = List.last(events_for(q))
    refute_received {:deciding, "v6.test", _}
    Sidecar.stop(sc)
  end

  test "the channel cut mid-decision with a decider too slow: denied :decider_timeout, the bridge recovers", ctx do
    sc = Sidecar.start(ctx.tb, policy(self(), 1_500))
    bridge = start_bridge(ctx, sc)
    %{os_pid: os_pid} = ControlBridge.info(bridge)
    q = tag()
    client = Task.async(fn -> curl(ctx.tb, sc, "https://v6.test/?#{q}") end)
    assert_receive {:deciding, "v6.test", _decider}, 10_000

    capture_log(fn ->
      System.cmd("kill", ["-KILL", "#{os_pid}"])
      assert Task.await(client, 30_000).status == 403
    end)

    assert {:request_denied, _, %{reason: :decider_timeout}} = List.last(events_for(q))

    q = tag()
    assert curl(ctx.tb, sc, "https://decide.test/?#{q}").status == 200
    assert ControlBridge.info(bridge).status == :connected
    Sidecar.stop(sc)
  end

  test "the sidecar going away: the bridge retries, then gives up :normal", ctx do
    sc = Sidecar.start(ctx.tb, policy(self()))
    bridge = start_bridge(ctx, sc, attempts: 3)
    ref = Process.monitor(bridge)

    capture_log(fn ->
      Sidecar.stop(sc)
      assert_receive {:telemetry, @prefix ++ [:control_disconnected], _, _}, 10_000
      assert_receive {:telemetry, @prefix ++ [:control_gave_up], %{attempts: 3}, _}, 10_000
      assert_receive {:DOWN, ^ref, :process, ^bridge, :normal}, 5_000
    end)
  end

  def os_alive?(os_pid) do
    case File.read("/proc/#{os_pid}/stat") do
      {:ok, stat} -> not String.match?(stat, ~r/^\d+ \(.*\) [ZX] /s)
      {:error, _} -> false
    end
  end
end

defmodule Condukt.Sandbox.NetworkPolicy.ControlBridgeLocalTest do
  # The bridge without a sidecar: needs only the port program.
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Condukt.Sandbox.NetworkPolicy.ControlBridge

  @moduletag :port_program
  @moduletag :tmp_dir
  if reason = Condukt.Test.PortProgram.skip_reason(), do: @moduletag(skip: reason)

  test "an unreachable control address: capped retries, then :control_gave_up and a :normal stop", %{tmp_dir: dir} do
    me = self()
    session = "local-#{System.unique_integer([:positive])}"
    id = {__MODULE__, session}

    :telemetry.attach(
      id,
      [:condukt, :sandbox, :network_policy, :control_gave_up],
      fn
        _, m, %{session_id: ^session} = meta, _ -> send(me, {:gave_up, m, meta})
        _, _, _, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)

    capture_log(fn ->
      {:ok, bridge} =
        ControlBridge.start(
          session_id: session,
          owner: self(),
          policy: [rules: [decide: fn _, _ -> :allow end]],
          address: "unix:" <> Path.join(dir, "nobody.sock"),
          token: String.duplicate("0f", 16),
          backoff: {10, 40},
          attempts: 4
        )

      ref = Process.monitor(bridge)
      assert_receive {:gave_up, %{attempts: 4}, %{reason: _}}, 10_000
      assert_receive {:DOWN, ^ref, :process, ^bridge, :normal}, 5_000
      assert ControlBridge.stop(bridge) == :ok
    end)
  end

  test "attempts: :infinity keeps dialling an unreachable address, and connects once it listens" do
    alias Condukt.Test.ControlListener
    me = self()
    session = "inf-#{System.unique_integer([:positive])}"
    id = {__MODULE__, session}

    :telemetry.attach_many(
      id,
      [
        [:condukt, :sandbox, :network_policy, :control_connected],
        [:condukt, :sandbox, :network_policy, :control_gave_up]
      ],
      fn
        event, _m, %{session_id: ^session} = meta, _ -> send(me, {:control, List.last(event), meta})
        _, _, _, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
    path = "/tmp/ce-inf-#{System.unique_integer([:positive])}.sock"
    on_exit(fn -> File.rm(path) end)

    capture_log(fn ->
      {:ok, bridge} =
        ControlBridge.start(
          session_id: session,
          owner: self(),
          policy: [rules: [decide: fn _, _ -> :allow end]],
          address: {:unix, path},
          token: String.duplicate("0f", 16),
          backoff: {5, 10},
          attempts: :infinity
        )

      # Far more failures than the default 10 attempts: still dialling.
      :ok = Condukt.Dev.Netns.Cmd.poll(fn -> ControlBridge.info(bridge).failures > 30 end, 10_000)
      assert Process.alive?(bridge)
      refute_received {:control, :control_gave_up, _}

      # The address comes up: the next dial connects.
      ControlListener.start(path)
      assert_receive {:listener, :hello, %{"type" => "hello"}, conn}, 5_000
      ControlListener.welcome(conn, session)
      assert_receive {:control, :control_connected, %{attempt: attempt}}, 5_000
      assert attempt > 30
      assert ControlBridge.info(bridge).failures == 0
      assert ControlBridge.stop(bridge) == :ok
    end)
  end

  test "with :ping_interval, a channel that goes silent (a tunnel that never reports its drop) is closed and re-dialled" do
    alias Condukt.Test.ControlListener
    me = self()
    session = "ping-#{System.unique_integer([:positive])}"
    id = {__MODULE__, session}

    :telemetry.attach_many(
      id,
      [
        [:condukt, :sandbox, :network_policy, :control_connected],
        [:condukt, :sandbox, :network_policy, :control_disconnected]
      ],
      fn
        event, _m, %{session_id: ^session} = meta, _ -> send(me, {:control, List.last(event), meta})
        _, _, _, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
    listener = ControlListener.start()

    capture_log(fn ->
      {:ok, bridge} =
        ControlBridge.start(
          session_id: session,
          owner: self(),
          policy: [rules: [decide: fn _, _ -> :allow end]],
          address: {:unix, listener.path},
          token: String.duplicate("0f", 16),
          backoff: {10, 40},
          ping_interval: 200,
          ping_timeout: 300
        )

      assert_receive {:listener, :hello, %{"type" => "hello"}, conn}, 5_000
      ControlListener.welcome(conn, session)
      assert_receive {:control, :control_connected, _}, 5_000

      # A live peer answers the ping: no drop.
      assert_receive {:listener, :line, %{"type" => "ping"}}, 2_000
      ControlListener.send_frames(conn, [%{type: "pong"}])
      assert_receive {:listener, :line, %{"type" => "ping"}}, 2_000
      refute_received {:control, :control_disconnected, _}

      # Now silence: the bridge gives the channel up and dials again.
      assert_receive {:control, :control_disconnected, %{reason: :ping_timeout}}, 2_000
      assert_receive {:listener, :hello, %{"type" => "hello"}, conn2}, 5_000
      assert conn2 != conn
      ControlListener.welcome(conn2, session)
      assert_receive {:control, :control_connected, _}, 5_000
      assert ControlBridge.stop(bridge) == :ok
    end)
  end
end
