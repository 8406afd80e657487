defmodule Condukt.Sandbox.NetworkPolicy.Telemetry do
  @moduledoc """
  Every `:telemetry` event of the network policy, in one place.

  Attach handlers with `:telemetry.attach/4` or `:telemetry.attach_many/4`.
  Handlers run in the session's `Condukt.Sandbox.NetworkPolicy.ControlBridge`
  process: keep them quick (a slow handler delays the session's decisions;
  the sidecar buffers events meanwhile and never blocks its data plane).

  ## Request lifecycle (from the sidecar)

  Each `event` frame the sidecar sends on the control channel
  (docs/control-channel.md) becomes one event:

  | event | when |
  |-------|------|
  | `[:condukt, :sandbox, :network_policy, :request_opened]` | the request line and headers were read |
  | `[:condukt, :sandbox, :network_policy, :request_allowed]` | a rule or the default allowed it |
  | `[:condukt, :sandbox, :network_policy, :request_denied]` | a rule, the default, a decider or a decider failure refused it (the client got a 403) |
  | `[:condukt, :sandbox, :network_policy, :request_closed]` | an allowed request finished cleanly |
  | `[:condukt, :sandbox, :network_policy, :request_failed]` | an allowed request never completed cleanly (the workspace rejected the session CA, the upstream was unreachable, the stream broke) |

  The sidecar's DNS resolver reports through the same events: a name it
  refused is a `:request_denied` whose `request.scheme` is `:dns` (`host` the
  name asked, `port` 53) and whose reason starts with `"dns: "`; a name it
  left to a decider is a `:request_allowed` with reason
  `"dns: deferred to the decider"` (docs/dns.md).

  Measurements: `%{bytes_in: non_neg_integer(), bytes_out: non_neg_integer()}`
  (bytes received from / sent to the upstream for this request so far).
  `:request_closed` and `:request_failed` also carry `duration`: how long
  the request took, from its first byte to its end, as the sidecar measured
  it on a monotonic clock, in native time units (`System.convert_time_unit/3`
  turns it into milliseconds), as `:telemetry.span/3` durations are.

  Metadata:

  | key | type | meaning |
  |-----|------|---------|
  | `:request` | `Condukt.Sandbox.NetworkPolicy.Request.t()` | everything the sidecar knew at that step |
  | `:reason` | `atom() \\| String.t() \\| nil` | why it was denied or failed (see below) |
  | `:matched_rule` | `%{index: non_neg_integer(), kind: :allow \\| :deny \\| :decide} \\| nil` | the rule that decided, on `:request_allowed` and `:request_denied`; `nil` when the policy default fired and on lifecycle-only events |
  | `:at` | `DateTime.t() \\| nil` | when the step happened (sidecar clock) |
  | `:session_id` | `String.t()` | the gated session (an addition to upstream Condukt's metadata) |
  | `:seq` | `pos_integer() \\| nil` | the sidecar's event sequence number; a gap is a loss |

  **Reasons.** The refusal reasons that the policy itself defines are atoms,
  the same atoms `Condukt.Sandbox.NetworkPolicy.evaluate/2` and the decide
  runtime use: `:default_deny`, `:denied_by_rule`, `:invalid_host`,
  `:invalid_path`, `:decider_timeout`, `:decider_error`, `:decider_bad_return` and
  `:control_channel_unavailable`. Every other reason stays the sidecar's
  string: a decider's own words (`{:deny, :too_risky}` arrives as
  `"too_risky"`, since it crossed the wire as text), and the transport
  reasons such as `"tls_client_rejected_ca"` or
  `"upstream_unreachable: ..."` (docs/proxy.md lists them). Atoms are never
  created from the wire.

  ## Decider failures (from the decide runtime)

  | event | measurements | metadata |
  |-------|--------------|----------|
  | `[:condukt, :sandbox, :network_policy, :decider_failure]` | `%{count: 1}` | `%{reason: :decider_timeout \\| :decider_error \\| :decider_bad_return, session_id: String.t() \\| nil, request: Request.t(), rule_index: non_neg_integer()}` |

  The request itself still surfaces as `:request_denied` with the same
  reason; this event tracks decider health apart from policy denials.

  ## Decide spans (from the decide runtime)

  Every time a decider runs (not for an answer the cache already had), a
  span in the shape `:telemetry.span/3` gives, so `telemetry_metrics`
  histograms and tracing bridges work unchanged:

  | event | measurements | metadata |
  |-------|--------------|----------|
  | `[:condukt, :sandbox, :network_policy, :decide, :start]` | `%{monotonic_time: integer(), system_time: integer()}` | `%{session_id: String.t() \\| nil, request: Request.t(), rule_index: non_neg_integer(), telemetry_span_context: reference()}` |
  | `[:condukt, :sandbox, :network_policy, :decide, :stop]` | `%{duration: integer(), monotonic_time: integer()}` | the start's, plus `result: :allow \\| :deny`, `reason: atom() \\| String.t() \\| nil` (a deny's) and `scope: :once \\| :request \\| :path \\| :host` |
  | `[:condukt, :sandbox, :network_policy, :decide, :exception]` | `%{duration: integer(), monotonic_time: integer()}` | the start's, plus `kind: :error \\| :exit`, `reason: :decider_timeout \\| :decider_error \\| :decider_bad_return \\| :cancelled` and `stacktrace: []` |

  `duration` is in native time units. A decider that timed out, raised or
  answered something invalid ends its span with `:exception` (and the
  request is denied, see `:decider_failure`); one killed because the
  session ended ends it with `reason: :cancelled`. Identical requests that
  waited for one decider share its span. Handlers run in the session's
  bridge process, not in the decider's task.

  ## With telemetry_metrics

      [
        Telemetry.Metrics.distribution("condukt.sandbox.network_policy.decide.stop.duration",
          unit: {:native, :millisecond},
          tags: [:result, :rule_index]
        ),
        Telemetry.Metrics.counter("condukt.sandbox.network_policy.decide.exception.duration",
          tags: [:reason]
        ),
        Telemetry.Metrics.distribution("condukt.sandbox.network_policy.request_closed.duration",
          unit: {:native, :millisecond},
          tags: [:session_id]
        ),
        Telemetry.Metrics.sum("condukt.sandbox.network_policy.request_closed.bytes_in", unit: :byte),
        Telemetry.Metrics.counter("condukt.sandbox.network_policy.request_denied.bytes_out",
          tags: [:reason],
          tag_values: &%{&1 | reason: to_string(&1.reason)}
        )
      ]

  ## A default logger

  `attach_default_logger/1` logs one structured line per event (every event
  in `events/0`), in the style of `Oban.Telemetry.attach_default_logger/1`:

      Condukt.Sandbox.NetworkPolicy.Telemetry.attach_default_logger(level: :info)
      # [warning] network_policy event=request_denied session_id=job-42 method=POST
      #           host=api.example.com port=443 path=/v1/charges rule=0:deny reason=denied_by_rule
      #           seq=12 bytes_in=0 bytes_out=0

  ## The control channel (from the bridge; additive)

  | event | measurements | metadata |
  |-------|--------------|----------|
  | `[:condukt, :sandbox, :network_policy, :control_connected]` | `%{dropped: non_neg_integer()}` (the welcome's cumulative count of events the sidecar lost) | `%{session_id: String.t(), attempt: pos_integer()}` |
  | `[:condukt, :sandbox, :network_policy, :control_disconnected]` | `%{}` | `%{session_id: String.t(), reason: term()}` |
  | `[:condukt, :sandbox, :network_policy, :control_gave_up]` | `%{attempts: non_neg_integer()}` | `%{session_id: String.t(), reason: term()}` (the bridge stops `:normal`) |
  | `[:condukt, :sandbox, :network_policy, :control_refused]` | `%{count: pos_integer()}` | `%{session_id: String.t(), side: :sidecar \\| :bridge, reason: String.t(), at: DateTime.t() \\| nil, seq: pos_integer() \\| nil}` |

  `:control_refused` reports a process that tried to take part in the
  control channel without the session token. `side: :sidecar`: the sidecar
  refused connections to its control port (a wrong proof, a malformed or
  late handshake, another session id, or evicted as the oldest of too many
  waiting); it reports at most one such event a second, `count` being the
  refusals since the previous one. `side: :bridge`: what listened at the
  sidecar's address could not prove the token or gates another session
  (a process squatting the port), and the bridge refused it.
  """

  require Logger

  alias Condukt.Sandbox.NetworkPolicy.Request

  @prefix [:condukt, :sandbox, :network_policy]

  @lifecycle ~w(request_opened request_allowed request_denied request_closed request_failed)
  @lifecycle_atoms Map.new(@lifecycle, &{&1, String.to_atom(&1)})

  # Refusal reasons the policy layer itself defines (NetworkPolicy.evaluate/2,
  # the decide runtime, docs/proxy.md's policy refusals). Only these become
  # atoms; the table is fixed at compile time so the wire never mints atoms.
  @atom_reasons ~w(default_deny denied_by_rule invalid_host invalid_path decider_timeout decider_error
                   decider_bad_return control_channel_unavailable)
  @reason_atoms Map.new(@atom_reasons, &{&1, String.to_atom(&1)})

  @kinds %{"allow" => :allow, "deny" => :deny, "decide" => :decide}

  @typedoc "The lifecycle event names (the last element of the event)."
  @type lifecycle_event ::
          :request_opened | :request_allowed | :request_denied | :request_closed | :request_failed

  @doc "The full names of the five lifecycle events."
  @spec lifecycle_events() :: [[atom()]]
  def lifecycle_events, do: Enum.map(@lifecycle, &(@prefix ++ [@lifecycle_atoms[&1]]))

  @doc "The three events of a decide span."
  @spec decide_events() :: [[atom()]]
  def decide_events, do: Enum.map([:start, :stop, :exception], &(@prefix ++ [:decide, &1]))

  @doc "Every event this module emits, for `:telemetry.attach_many/4`."
  @spec events() :: [[atom()]]
  def events do
    lifecycle_events() ++
      decide_events() ++
      Enum.map(
        [:decider_failure, :control_connected, :control_disconnected, :control_gave_up, :control_refused],
        &(@prefix ++ [&1])
      )
  end

  @default_logger "condukt-network-policy-default-logger"
  @levels [:emergency, :alert, :critical, :error, :warning, :notice, :info, :debug]

  @doc """
  Attaches a handler that logs every event of `events/0` as one line of
  `key=value` pairs (values with spaces or quotes are quoted), through
  `Logger` with the metadata `session_id` and `event`.

  Options:

    * `:level` - the `Logger` level of the lines (default `:info`); denied
      requests, decider failures and control channel refusals use
      `:warning` when `:level` is lower than that, so they stand out.
    * `:events` - the events to log (default `events/0`).

  Returns `:ok`, or `{:error, :already_exists}` when it is attached
  already. `detach_default_logger/0` removes it.
  """
  @spec attach_default_logger(keyword()) :: :ok | {:error, :already_exists}
  def attach_default_logger(opts \\ []) do
    level = Keyword.get(opts, :level, :info)

    unless level in @levels,
      do: raise(ArgumentError, ":level must be one of #{inspect(@levels)}, got: #{inspect(level)}")

    events = Keyword.get(opts, :events, events())
    :telemetry.attach_many(@default_logger, events, &__MODULE__.log_event/4, %{level: level})
  end

  @doc "Detaches the handler of `attach_default_logger/1`."
  @spec detach_default_logger() :: :ok | {:error, :not_found}
  def detach_default_logger, do: :telemetry.detach(@default_logger)

  @loud [:request_denied, :decider_failure, :control_refused, :control_gave_up]

  @doc false
  @spec log_event([atom()], map(), map(), map()) :: :ok
  def log_event(event, measurements, metadata, %{level: level}) do
    name = event |> Enum.drop(length(@prefix)) |> Enum.map_join(".", &Atom.to_string/1)
    loud? = List.last(event) in @loud or event == @prefix ++ [:decide, :exception]
    level = if loud? and Logger.compare_levels(level, :warning) == :lt, do: :warning, else: level

    Logger.log(level, fn -> line(name, measurements, metadata) end,
      session_id: metadata[:session_id],
      event: name
    )
  end

  # event=... then the request's fields, the metadata's scalars, the
  # measurements (durations in microseconds).
  defp line(name, measurements, metadata) do
    request =
      case metadata[:request] do
        %Request{} = r ->
          [method: r.method, host: r.host, port: r.port, path: r.path, status: r.status] ++
            if(r.body_preview, do: [body_preview_bytes: byte_size(r.body_preview)], else: [])

        _ ->
          []
      end

    rule =
      case metadata[:matched_rule] do
        %{index: i, kind: k} -> [rule: "#{i}:#{k}"]
        _ -> []
      end

    meta =
      metadata
      |> Map.drop([:request, :matched_rule, :at, :telemetry_span_context, :stacktrace, :session_id])
      |> Enum.sort()

    measured =
      Enum.map(Enum.sort(measurements), fn
        {k, v} when k in [:duration, :monotonic_time, :system_time] and is_integer(v) ->
          if k == :duration, do: {:duration_us, System.convert_time_unit(v, :native, :microsecond)}, else: nil

        kv ->
          kv
      end)

    pairs = [event: name, session_id: metadata[:session_id]] ++ request ++ rule ++ meta ++ measured

    ["network_policy" | for({k, v} <- Enum.reject(pairs, &is_nil/1), v != nil, do: "#{k}=#{value(v)}")]
    |> Enum.join(" ")
  end

  defp value(v) when is_binary(v) do
    if v != "" and not String.contains?(v, [" ", "\"", "=", "\n", "\\"]), do: v, else: inspect(v)
  end

  defp value(v) when is_atom(v) or is_number(v), do: to_string(v)
  defp value(v), do: inspect(v)

  @doc false
  @spec decide_start(map()) :: {integer(), map()}
  def decide_start(metadata) do
    start = System.monotonic_time()
    metadata = Map.put(metadata, :telemetry_span_context, make_ref())

    :telemetry.execute(
      @prefix ++ [:decide, :start],
      %{monotonic_time: start, system_time: System.system_time()},
      metadata
    )

    {start, metadata}
  end

  @doc false
  @spec decide_stop({integer(), map()}, :stop | :exception, map()) :: :ok
  def decide_stop({start, metadata}, kind, extra) do
    stop = System.monotonic_time()

    :telemetry.execute(
      @prefix ++ [:decide, kind],
      %{duration: stop - start, monotonic_time: stop},
      Map.merge(metadata, extra)
    )
  end

  @doc """
  Emits the lifecycle event of one sidecar `event` frame (a map with string
  keys). Returns `:ok`, or `{:error, :unknown_event}` for an event name this
  version does not know (nothing is emitted then).
  """
  @spec emit_frame(map(), String.t() | nil) :: :ok | {:error, :unknown_event}
  def emit_frame(%{"event" => "control_refused"} = frame, session_id) do
    :telemetry.execute(@prefix ++ [:control_refused], %{count: max(count(frame["count"]), 1)}, %{
      session_id: session_id,
      side: :sidecar,
      reason: if(is_binary(frame["reason"]), do: frame["reason"], else: "refused"),
      at: Request.timestamp(frame["at"]),
      seq: frame["seq"]
    })
  end

  def emit_frame(%{"event" => name} = frame, session_id) do
    case @lifecycle_atoms do
      %{^name => event} ->
        measurements =
          %{bytes_in: count(frame["bytes_in"]), bytes_out: count(frame["bytes_out"])}
          |> put_duration(event, frame["duration_us"])

        metadata = %{
          request: Request.from_sidecar(frame),
          reason: reason(frame["reason"]),
          matched_rule: matched_rule(frame["matched_rule"]),
          at: Request.timestamp(frame["at"]),
          session_id: session_id,
          seq: frame["seq"]
        }

        :telemetry.execute(@prefix ++ [event], measurements, metadata)

      _ ->
        {:error, :unknown_event}
    end
  end

  def emit_frame(_frame, _session_id), do: {:error, :unknown_event}

  @doc """
  The metadata form of a sidecar reason: one of the policy's own reasons as
  an atom, any other string as it came, `nil` for none.
  """
  @spec reason(term()) :: atom() | String.t() | nil
  def reason(value) when is_binary(value), do: Map.get(@reason_atoms, value, value)
  def reason(_), do: nil

  @doc false
  @spec decider_failure(atom(), map()) :: :ok
  def decider_failure(reason, metadata) do
    :telemetry.execute(@prefix ++ [:decider_failure], %{count: 1}, Map.put(metadata, :reason, reason))
  end

  @doc false
  @spec control_connected(String.t(), pos_integer(), non_neg_integer()) :: :ok
  def control_connected(session_id, attempt, dropped) do
    :telemetry.execute(@prefix ++ [:control_connected], %{dropped: dropped}, %{
      session_id: session_id,
      attempt: attempt
    })
  end

  @doc false
  @spec control_disconnected(String.t(), term()) :: :ok
  def control_disconnected(session_id, reason) do
    :telemetry.execute(@prefix ++ [:control_disconnected], %{}, %{session_id: session_id, reason: reason})
  end

  @doc false
  @spec control_refused(String.t(), :sidecar | :bridge, String.t(), pos_integer()) :: :ok
  def control_refused(session_id, side, reason, count) do
    :telemetry.execute(@prefix ++ [:control_refused], %{count: count}, %{
      session_id: session_id,
      side: side,
      reason: reason,
      at: DateTime.utc_now(),
      seq: nil
    })
  end

  @doc false
  @spec control_gave_up(String.t(), non_neg_integer(), term()) :: :ok
  def control_gave_up(session_id, attempts, reason) do
    :telemetry.execute(@prefix ++ [:control_gave_up], %{attempts: attempts}, %{session_id: session_id, reason: reason})
  end

  # The sidecar measures the two events that end a request (microseconds).
  defp put_duration(m, event, us) when event in [:request_closed, :request_failed] and is_integer(us) and us >= 0,
    do: Map.put(m, :duration, System.convert_time_unit(us, :microsecond, :native))

  defp put_duration(m, _event, _us), do: m

  defp count(n) when is_integer(n) and n >= 0, do: n
  defp count(_), do: 0

  defp matched_rule(%{"index" => index, "kind" => kind}) when is_integer(index) and index >= 0 do
    case @kinds do
      %{^kind => atom} -> %{index: index, kind: atom}
      _ -> nil
    end
  end

  defp matched_rule(_), do: nil
end
