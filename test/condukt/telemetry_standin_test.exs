defmodule Condukt.TelemetryStandinTest do
  # The documented :telemetry semantics Condukt relies on. With Hex these
  # run against the real package; offline, against offline/telemetry/.
  use ExUnit.Case, async: true

  setup do
    id = {__MODULE__, make_ref()}
    on_exit(fn -> :telemetry.detach(id) end)
    %{id: id, event: [:condukt_test, :"event#{System.unique_integer([:positive])}"]}
  end

  test "attach, execute, detach", %{id: id, event: event} do
    me = self()
    assert :ok = :telemetry.attach(id, event, fn e, m, md, cfg -> send(me, {e, m, md, cfg}) end, :cfg)
    assert {:error, :already_exists} = :telemetry.attach(id, event, fn _, _, _, _ -> :ok end, nil)
    :telemetry.execute(event, %{bytes_in: 1}, %{reason: nil})
    assert_receive {^event, %{bytes_in: 1}, %{reason: nil}, :cfg}
    assert :ok = :telemetry.detach(id)
    assert {:error, :not_found} = :telemetry.detach(id)
    :telemetry.execute(event, %{bytes_in: 2}, %{})
    refute_receive {^event, _, _, _}, 50
  end

  test "attach_many and list_handlers", %{id: id, event: event} do
    other = event ++ [:other]
    :ok = :telemetry.attach_many(id, [event, other], fn _, _, _, _ -> :ok end, nil)
    assert [%{id: ^id, event_name: ^event}] = :telemetry.list_handlers(event) |> Enum.filter(&(&1.event_name == event))
    assert length(:telemetry.list_handlers([hd(event)]) |> Enum.filter(&(&1.id == id))) == 2
  end

  test "a failing handler is detached and others keep running", %{id: id, event: event} do
    me = self()
    good = {id, :good}
    on_exit(fn -> :telemetry.detach(good) end)
    :ok = :telemetry.attach(id, event, fn _, _, _, _ -> raise "boom" end, nil)
    :ok = :telemetry.attach(good, event, fn _, m, _, _ -> send(me, {:good, m}) end, nil)

    ExUnit.CaptureLog.capture_log(fn -> :telemetry.execute(event, %{n: 1}, %{}) end)
    assert_receive {:good, %{n: 1}}
    assert {:error, :not_found} = :telemetry.detach(id)
  end

  test "span emits start and stop with a duration, exception on raise", %{id: id, event: event} do
    me = self()
    events = [event ++ [:start], event ++ [:stop], event ++ [:exception]]
    :ok = :telemetry.attach_many(id, events, fn e, m, md, _ -> send(me, {List.last(e), m, md}) end, nil)

    assert :result = :telemetry.span(event, %{a: 1}, fn -> {:result, %{b: 2}} end)
    assert_receive {:start, %{monotonic_time: _, system_time: _}, %{a: 1, telemetry_span_context: ref}}
    assert_receive {:stop, %{duration: d}, %{b: 2, telemetry_span_context: ^ref}} when is_integer(d) and d >= 0

    assert_raise RuntimeError, fn -> :telemetry.span(event, %{}, fn -> raise "x" end) end
    assert_receive {:exception, %{duration: _}, %{kind: :error, reason: %RuntimeError{}}}
  end

  # A release holds one :telemetry application. When :condukt itself
  # carried a `telemetry` module, `mix release` of a project that also had
  # the real package failed with "Duplicated modules".
  test ":condukt ships no telemetry module; :telemetry is an application of its own" do
    condukt_modules = Application.spec(:condukt, :modules)
    refute :telemetry in condukt_modules
    refute Enum.any?(condukt_modules, &String.starts_with?(Atom.to_string(&1), "condukt_offline_telemetry"))
    assert :telemetry in Application.spec(:telemetry, :modules)
    assert :telemetry in Enum.map(Application.started_applications(), &elem(&1, 0))
  end
end
