defmodule Condukt.Application do
  @moduledoc false
  use Application

  @impl true
  def start(_type, _args) do
    children = [
      Condukt.Sandbox.NetworkPolicy.ControlChannelSupervisor,
      # One Condukt.Sandbox.Local.Network per enforcing Local session
      # (restart: :temporary: a network is rebuilt by a new session,
      # never behind its owner's back).
      {DynamicSupervisor, name: Condukt.Sandbox.Local.NetworkSupervisor, strategy: :one_for_one},
      # Sessions of one-shot runs (Condukt.run/3 with an agent module).
      {DynamicSupervisor, name: Condukt.SessionSupervisor, strategy: :one_for_one}
    ]

    Supervisor.start_link(children, strategy: :one_for_one, name: Condukt.Supervisor)
  end
end
