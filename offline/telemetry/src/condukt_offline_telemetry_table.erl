%% OFFLINE STAND-IN (see README.md next to this file): owns the ETS table
%% behind the stand-in `telemetry` module. Started by the stand-in
%% application (condukt_offline_telemetry_app), never by Condukt itself.
-module(condukt_offline_telemetry_table).
-behaviour(gen_server).

-export([start_link/0, table/0]).
-export([init/1, handle_call/3, handle_cast/2]).

-define(TABLE, condukt_offline_telemetry_handlers).

start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% The table name; rows are {EventName, HandlerId, Function, Config}.
table() -> ?TABLE.

init([]) ->
    _ = ets:new(?TABLE, [duplicate_bag, public, named_table, {read_concurrency, true}]),
    {ok, #{}}.

handle_call(_Request, _From, State) -> {reply, {error, unsupported}, State}.
handle_cast(_Request, State) -> {noreply, State}.
