%% OFFLINE STAND-IN for the `telemetry` library (see README.md next to this
%% file). Compiled only when the build has no Hex; it implements the
%% documented API with the same semantics so that Condukt and its tests
%% behave identically with the real package.
-module(telemetry).

-export([attach/4, attach_many/4, detach/1, execute/2, execute/3, span/3,
         list_handlers/1]).

-include_lib("kernel/include/logger.hrl").

-type event_name() :: [atom(), ...].
-type handler_id() :: term().
-type handler_function() :: fun((event_name(), map(), map(), term()) -> any()).

-spec attach(handler_id(), event_name(), handler_function(), term()) ->
          ok | {error, already_exists}.
attach(HandlerId, EventName, Function, Config) ->
    attach_many(HandlerId, [EventName], Function, Config).

-spec attach_many(handler_id(), [event_name()], handler_function(), term()) ->
          ok | {error, already_exists}.
attach_many(HandlerId, EventNames, Function, Config)
  when is_function(Function, 4), is_list(EventNames) ->
    lists:foreach(fun assert_event_name/1, EventNames),
    Table = condukt_offline_telemetry_table:table(),
    %% The table process serialises nothing here; a global lock keeps two
    %% concurrent attaches with the same id from both succeeding.
    global:trans({{?MODULE, HandlerId}, self()}, fun() ->
        case ets:match_object(Table, {'_', HandlerId, '_', '_'}) of
            [] ->
                true = ets:insert(Table, [{E, HandlerId, Function, Config}
                                          || E <- EventNames]),
                ok;
            _ ->
                {error, already_exists}
        end
    end, [node()]).

-spec detach(handler_id()) -> ok | {error, not_found}.
detach(HandlerId) ->
    Table = condukt_offline_telemetry_table:table(),
    case ets:match_object(Table, {'_', HandlerId, '_', '_'}) of
        [] -> {error, not_found};
        _ -> true = ets:match_delete(Table, {'_', HandlerId, '_', '_'}), ok
    end.

-spec execute(event_name(), map() | number()) -> ok.
execute(EventName, Measurements) ->
    execute(EventName, Measurements, #{}).

-spec execute(event_name(), map() | number(), map()) -> ok.
execute(EventName, Value, Metadata) when is_number(Value) ->
    execute(EventName, #{value => Value}, Metadata);
execute(EventName, Measurements, Metadata)
  when is_map(Measurements), is_map(Metadata) ->
    Handlers = ets:lookup(condukt_offline_telemetry_table:table(), EventName),
    lists:foreach(
      fun({_, HandlerId, Function, Config}) ->
          try
              Function(EventName, Measurements, Metadata, Config)
          catch
              Class:Reason:Stacktrace ->
                  _ = detach(HandlerId),
                  ?LOG_ERROR("Handler ~p has failed and has been detached. "
                             "Class=~p~nReason=~p~nStacktrace=~p~n",
                             [HandlerId, Class, Reason, Stacktrace])
          end
      end, Handlers).

-spec span(event_name(), map(), fun(() -> {term(), map()} | {term(), map(), map()})) -> term().
span(EventPrefix, StartMetadata, SpanFunction) ->
    StartTime = erlang:monotonic_time(),
    Ref = make_ref(),
    Meta = StartMetadata#{telemetry_span_context => Ref},
    execute(EventPrefix ++ [start],
            #{monotonic_time => StartTime, system_time => erlang:system_time()},
            Meta),
    try SpanFunction() of
        {Result, StopMetadata} ->
            stop(EventPrefix, StartTime, #{}, StopMetadata, Ref),
            Result;
        {Result, ExtraMeasurements, StopMetadata} ->
            stop(EventPrefix, StartTime, ExtraMeasurements, StopMetadata, Ref),
            Result
    catch
        Class:Reason:Stacktrace ->
            StopTime = erlang:monotonic_time(),
            execute(EventPrefix ++ [exception],
                    #{duration => StopTime - StartTime, monotonic_time => StopTime},
                    Meta#{kind => Class, reason => Reason, stacktrace => Stacktrace}),
            erlang:raise(Class, Reason, Stacktrace)
    end.

stop(EventPrefix, StartTime, Extra, StopMetadata, Ref) ->
    StopTime = erlang:monotonic_time(),
    execute(EventPrefix ++ [stop],
            Extra#{duration => StopTime - StartTime, monotonic_time => StopTime},
            StopMetadata#{telemetry_span_context => Ref}).

-spec list_handlers(event_name() | []) -> [map()].
list_handlers(EventPrefix) ->
    Rows = ets:tab2list(condukt_offline_telemetry_table:table()),
    [#{id => Id, event_name => E, function => F, config => C}
     || {E, Id, F, C} <- Rows, lists:prefix(EventPrefix, E)].

assert_event_name([_ | _] = Name) ->
    case lists:all(fun is_atom/1, Name) of
        true -> ok;
        false -> erlang:error(badarg, [Name])
    end;
assert_event_name(Name) ->
    erlang:error(badarg, [Name]).
