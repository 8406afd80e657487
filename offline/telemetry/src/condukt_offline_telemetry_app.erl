%% OFFLINE STAND-IN (see README.md next to this folder): the application
%% callback of the stand-in `telemetry` application. It starts the process
%% that owns the handler table, as the real application does for its own.
-module(condukt_offline_telemetry_app).
-behaviour(application).

-export([start/2, stop/1]).

start(_Type, _Args) ->
    supervisor:start_link({local, condukt_offline_telemetry_sup}, condukt_offline_telemetry_sup, []).

stop(_State) -> ok.
