defmodule Condukt.Sandbox.NetworkPolicy.OperatorTelemetryTest do
  # Decide spans, the sidecar's request duration and the default logger,
  # seen by handlers the way telemetry_metrics reporters see them.
  use ExUnit.Case, async: false

  import ExUnit.CaptureLog

  alias Condukt.Sandbox.NetworkPolicy.{DecideRuntime, Request, Telemetry}

  @prefix [:condukt, :sandbox, :network_policy]

  setup do
    session = "op-#{System.unique_integer([:positive])}"
    me = self()
    id = {__MODULE__, session}

    :telemetry.attach_many(
      id,
      Telemetry.events(),
      fn
        event, measurements, %{session_id: ^session} = meta, _ -> send(me, {:event, event, measurements, meta})
        _event, _measurements, _meta, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
    %{session: session}
  end

  defp request(host \\ "api.example.com"),
    do: %Request{id: "1", method: "POST", scheme: :https, host: host, port: 443, path: "/v1"}

  defp span(kind) do
    assert_receive {:event, @prefix ++ [:decide, ^kind], measurements, meta}, 5_000
    {measurements, meta}
  end

  test "an allow: start and stop with one span context, duration in native units", %{session: s} do
    decider = fn _ctx, _req ->
      Process.sleep(20)
      :allow
    end

    assert {:ok, :allow} = DecideRuntime.run(decider, request(), session_id: s)
    {start_m, start_meta} = span(:start)
    {stop_m, stop_meta} = span(:stop)

    assert is_integer(start_m.monotonic_time) and is_integer(start_m.system_time)
    assert is_reference(start_meta.telemetry_span_context)
    assert stop_meta.telemetry_span_context == start_meta.telemetry_span_context
    assert %Request{host: "api.example.com"} = start_meta.request
    assert start_meta.rule_index == 0
    assert stop_meta.result == :allow and stop_meta.scope == :request and stop_meta.reason == nil
    assert System.convert_time_unit(stop_m.duration, :native, :millisecond) >= 20
    assert stop_m.monotonic_time - start_m.monotonic_time == stop_m.duration
  end

  test "a deny carries its reason and scope", %{session: s} do
    assert {:ok, {:deny, :too_risky}} =
             DecideRuntime.run(fn _, _ -> {:deny, :too_risky, scope: :path} end, request(), session_id: s)

    span(:start)
    {_m, meta} = span(:stop)
    assert meta.result == :deny and meta.reason == :too_risky and meta.scope == :path
  end

  @tag :capture_log
  test "a raise, a timeout and a bad return end the span with :exception", %{session: s} do
    cases = [
      {fn _, _ -> raise "boom" end, :decider_error, :error, 1_000},
      {fn _, _ -> Process.sleep(5_000) end, :decider_timeout, :exit, 50},
      {fn _, _ -> :maybe end, :decider_bad_return, :error, 1_000}
    ]

    for {fun, reason, kind, timeout} <- cases do
      assert {:error, ^reason} = DecideRuntime.run([call: fun, timeout: timeout], request(), session_id: s)
      {_m, start_meta} = span(:start)
      {m, meta} = span(:exception)
      assert meta.reason == reason and meta.kind == kind and meta.stacktrace == []
      assert meta.telemetry_span_context == start_meta.telemetry_span_context
      assert is_integer(m.duration) and m.duration >= 0
      refute_received {:event, @prefix ++ [:decide, :stop], _, _}
    end
  end

  test "a cached answer runs no decider and emits no span", %{session: s} do
    rt = DecideRuntime.new(policy: [rules: [decide: fn _, _ -> {:allow, scope: :host} end]], session_id: s)
    {[], rt} = DecideRuntime.request(rt, "a", 0, request())
    span(:start)
    rt = await_replies(rt)
    span(:stop)
    {[{:decision, "b", :allow, true}], _rt} = DecideRuntime.request(rt, "b", 0, request())
    refute_received {:event, @prefix ++ [:decide, :start], _, _}
  end

  test "cancel_all ends running spans as cancelled", %{session: s} do
    rt = DecideRuntime.new(policy: [rules: [decide: fn _, _ -> Process.sleep(5_000) end]], session_id: s)
    {[], rt} = DecideRuntime.request(rt, "a", 0, request())
    span(:start)
    DecideRuntime.cancel_all(rt)
    {_m, meta} = span(:exception)
    assert meta.reason == :cancelled and meta.kind == :exit
  end

  defp await_replies(rt) do
    receive do
      msg ->
        case DecideRuntime.handle_info(rt, msg) do
          {:ok, [_ | _], rt} -> rt
          {:ok, [], rt} -> await_replies(rt)
          :unknown -> await_replies(rt)
        end
    after
      5_000 -> flunk("no decision")
    end
  end

  defp frame(event, extra \\ %{}) do
    Map.merge(
      %{
        "event" => event,
        "id" => "7",
        "method" => "GET",
        "host" => "api.example.com",
        "port" => 443,
        "path" => "/x",
        "bytes_in" => 10,
        "bytes_out" => 3,
        "seq" => 1
      },
      extra
    )
  end

  test "request_closed and request_failed carry the sidecar's duration in native units", %{session: s} do
    for name <- ["request_closed", "request_failed"] do
      :ok = Telemetry.emit_frame(frame(name, %{"duration_us" => 1_500}), s)
      event = @prefix ++ [String.to_existing_atom(name)]
      assert_receive {:event, ^event, m, _meta}
      assert m.duration == System.convert_time_unit(1_500, :microsecond, :native)
      assert m.bytes_in == 10 and m.bytes_out == 3
    end

    # Other events, and a malformed duration, carry none.
    :ok = Telemetry.emit_frame(frame("request_allowed", %{"duration_us" => 5}), s)
    assert_receive {:event, _, m, _}
    refute Map.has_key?(m, :duration)
    :ok = Telemetry.emit_frame(frame("request_closed", %{"duration_us" => -1}), s)
    assert_receive {:event, _, m, _}
    refute Map.has_key?(m, :duration)
  end

  # What a telemetry_metrics reporter does with a distribution:
  # measurement by name, unit conversion, tags from the metadata.
  defp reporter(event_name, measurement, unit, tags) do
    me = self()
    id = {:reporter, make_ref()}

    :telemetry.attach(
      id,
      event_name,
      fn _event, measurements, metadata, _ ->
        value = System.convert_time_unit(Map.fetch!(measurements, measurement), :native, unit)
        send(me, {:metric, value, Map.take(metadata, tags)})
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
  end

  test "telemetry_metrics-style distributions of decide and request durations", %{session: s} do
    reporter(@prefix ++ [:decide, :stop], :duration, :microsecond, [:result, :rule_index])
    reporter(@prefix ++ [:request_closed], :duration, :millisecond, [:session_id])

    {:ok, _} = DecideRuntime.run(fn _, _ -> {:deny, "no"} end, request(), session_id: s)
    assert_receive {:metric, us, %{result: :deny, rule_index: 0}} when is_integer(us) and us >= 0

    :ok = Telemetry.emit_frame(frame("request_closed", %{"duration_us" => 250_000}), s)
    assert_receive {:metric, 250, %{session_id: ^s}}
  end

  test "the default logger: one structured line per event, at the configured level", %{session: s} do
    :ok = Telemetry.attach_default_logger(level: :debug)
    assert {:error, :already_exists} = Telemetry.attach_default_logger()

    try do
      log =
        capture_log([level: :debug], fn ->
          :ok = Telemetry.emit_frame(frame("request_closed", %{"duration_us" => 1_234}), s)

          :ok =
            Telemetry.emit_frame(
              frame("request_denied", %{"reason" => "default_deny", "matched_rule" => %{"index" => 2, "kind" => "deny"}}),
              s
            )

          {:ok, :allow} = DecideRuntime.run(fn _, _ -> :allow end, request(), session_id: s)
        end)

      lines = log |> String.split("\n") |> Enum.filter(&(&1 =~ "session_id=#{s}"))
      assert length(lines) == 4, log

      [closed] = Enum.filter(lines, &(&1 =~ "event=request_closed"))
      assert closed =~ "[debug]"
      assert closed =~ "network_policy event=request_closed session_id=#{s} method=GET host=api.example.com port=443"
      assert closed =~ "path=/x"
      assert closed =~ "bytes_in=10 bytes_out=3 duration_us=1234"

      # Denials stand out at :warning even under a lower level.
      [denied] = Enum.filter(lines, &(&1 =~ "event=request_denied"))
      assert denied =~ "[warning]"
      assert denied =~ "rule=2:deny"
      assert denied =~ "reason=default_deny"

      assert Enum.any?(lines, &(&1 =~ "event=decide.start"))
      [stop] = Enum.filter(lines, &(&1 =~ "event=decide.stop"))
      assert stop =~ "result=allow" and stop =~ "scope=request" and stop =~ "duration_us="
      refute stop =~ "telemetry_span_context"
    after
      :ok = Telemetry.detach_default_logger()
    end

    # Detached: nothing more.
    log = capture_log(fn -> Telemetry.emit_frame(frame("request_closed"), s) end)
    refute log =~ "network_policy event="
    assert_raise ArgumentError, fn -> Telemetry.attach_default_logger(level: :loud) end
  end
end
