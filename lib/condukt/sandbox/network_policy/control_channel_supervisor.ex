defmodule Condukt.Sandbox.NetworkPolicy.ControlChannelSupervisor do
  @moduledoc """
  **Internal.** Part of the library's plumbing, documented for those who
  work on Condukt; its API may change in any release.

  The `DynamicSupervisor` (one_for_one) of every session's
  `Condukt.Sandbox.NetworkPolicy.ControlBridge`, started under the
  application root (`Condukt.Supervisor`).

  Bridges are `:transient`: one that stops `:normal` (its session ended,
  or its control port stayed unreachable past its attempt budget) is
  dropped, a crash is restarted. The restart intensity is bounded (three
  restarts in five seconds), so a pathologically crashing bridge cannot
  hot-loop the shared supervisor: past it the supervisor itself exits and
  the root restarts it empty, and the affected sessions' decide rules fail
  closed (the sidecar's decide timeout) until their bridges are started
  again.
  """

  use DynamicSupervisor

  @doc false
  @spec start_link(keyword()) :: Supervisor.on_start()
  def start_link(opts \\ []) do
    DynamicSupervisor.start_link(__MODULE__, opts, name: __MODULE__)
  end

  @impl true
  def init(_opts) do
    DynamicSupervisor.init(strategy: :one_for_one, max_restarts: 3, max_seconds: 5)
  end
end
