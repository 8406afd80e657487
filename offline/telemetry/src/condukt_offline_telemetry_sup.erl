%% OFFLINE STAND-IN (see README.md next to this folder): supervises the
%% owner of the handler table.
-module(condukt_offline_telemetry_sup).
-behaviour(supervisor).

-export([init/1]).

init([]) ->
    Table = #{id => condukt_offline_telemetry_table,
              start => {condukt_offline_telemetry_table, start_link, []}},
    {ok, {#{strategy => one_for_one, intensity => 5, period => 10}, [Table]}}.
