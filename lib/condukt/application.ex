defmodule Condukt.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    children =
      offline_telemetry() ++
        [
          # Deciders run here, never inside a bridge (DecideRuntime).
          {Task.Supervisor, name: Condukt.Sandbox.NetworkPolicy.TaskSupervisor},
          Condukt.Sandbox.NetworkPolicy.ControlChannelSupervisor,
          # One Condukt.Sandbox.Local.Network per enforcing Local session
          # (restart: :temporary: a network is rebuilt by a new session,
          # never behind its owner's back).
          {DynamicSupervisor, name: Condukt.Sandbox.Local.NetworkSupervisor, strategy: :one_for_one}
        ]

    Supervisor.start_link(children, strategy: :one_for_one, name: Condukt.Supervisor)
  end

  # When the build had no Hex, :telemetry is the in-repo stand-in
  # (offline/telemetry/), whose handler table is owned by a process that
  # this tree starts. With the real :telemetry the module below does not
  # exist and the real application owns its table.
  defp offline_telemetry do
    if Code.ensure_loaded?(:condukt_offline_telemetry_table),
      do: [%{id: :condukt_offline_telemetry_table, start: {:condukt_offline_telemetry_table, :start_link, []}}],
      else: []
  end
end
