defmodule Condukt.Sandbox.NetworkPolicy.ControlBridgeCredentialsTest do
  # ControlBridge.rotate_credential/4 against a scripted sidecar listener
  # (the real port program, a stand-in for the sidecar): the value goes as
  # a "credential" frame followed by a ping, and the call returns when the
  # pong comes back; a rotation while the channel is down waits, and every
  # rotated value is sent again after each reconnection. (The real sidecar
  # taking the value: test/condukt/netns/sidecar_credentials_test.exs and
  # test/condukt/sandbox/local_credentials_test.exs.)
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Condukt.Sandbox.NetworkPolicy.ControlBridge
  alias Condukt.Test.ControlListener

  @moduletag :port_program
  if reason = Condukt.Test.PortProgram.skip_reason(), do: @moduletag(skip: reason)

  @token String.duplicate("0f", 16)

  defp connect(session) do
    assert_receive {:listener, :hello, %{"type" => "hello"}, conn}, 5_000
    ControlListener.welcome(conn, session, @token)
    conn
  end

  # The next line the bridge wrote (no :ping_interval: no liveness pings).
  defp line do
    assert_receive {:listener, :line, frame}, 5_000
    frame
  end

  test "a rotation is confirmed by the pong after it; one made while disconnected is sent after the re-dial" do
    session = "rot-#{System.unique_integer([:positive])}"
    listener = ControlListener.start()

    capture_log(fn ->
      {:ok, bridge} =
        ControlBridge.start(
          session_id: session,
          owner: self(),
          policy: [rules: [allow: ["a.test"]]],
          address: {:unix, listener.path},
          token: @token,
          backoff: {10, 40}
        )

      on_exit(fn -> ControlBridge.stop(bridge) end)
      conn = connect(session)
      # Let the bridge see its welcome before the call.
      Process.sleep(100)

      me = self()
      spawn(fn -> send(me, {:rotated, ControlBridge.rotate_credential(bridge, "github", "Bearer one", 5_000)}) end)
      assert line() == %{"type" => "credential", "name" => "github", "value" => "Bearer one"}
      assert line() == %{"type" => "ping"}
      refute_receive {:rotated, _}, 200
      ControlListener.send_frames(conn, [%{type: "pong"}])
      assert_receive {:rotated, :ok}, 2_000

      # The channel goes; a rotation now waits for the next one.
      ControlListener.close(conn)
      spawn(fn -> send(me, {:rotated, ControlBridge.rotate_credential(bridge, "npm", "Bearer two", 10_000)}) end)
      conn2 = connect(session)

      # Every rotated value again (the sidecar may have restarted from its
      # stored copy), then one ping that confirms them.
      frames = [line(), line()]

      assert Enum.sort_by(frames, & &1["name"]) == [
               %{"type" => "credential", "name" => "github", "value" => "Bearer one"},
               %{"type" => "credential", "name" => "npm", "value" => "Bearer two"}
             ]

      assert line() == %{"type" => "ping"}
      refute_receive {:rotated, _}, 200
      ControlListener.send_frames(conn2, [%{type: "pong"}])
      assert_receive {:rotated, :ok}, 2_000

      # No confirmation in time: an error, not a hang.
      assert ControlBridge.rotate_credential(bridge, "github", "Bearer three", 300) == {:error, :timeout}
      # The bridge's state never shows a value.
      refute inspect(:sys.get_state(bridge)) =~ "Bearer"
    end)
  end
end
