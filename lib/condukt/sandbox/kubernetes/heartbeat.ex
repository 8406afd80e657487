defmodule Condukt.Sandbox.Kubernetes.Heartbeat do
  @moduledoc false
  # The worker that refreshes a pod's heartbeat annotation every
  # `interval` ms. It stops with the process that called init/1 (the
  # session), whatever that process's exit reason: it monitors it (an
  # owner that returns or exits :normal sends no exit signal through a
  # link) and is linked to it (an owner that crashes takes it along at
  # once). A pod whose owner is gone stops being refreshed and
  # reap_stale/1 can collect it.
  require Logger

  @spec start(pid(), (() -> :ok | {:error, term()}), pos_integer(), String.t()) :: pid()
  def start(owner, beat, interval, pod) do
    # spawn_link from the owner (init/1 runs in it).
    ^owner = self()

    spawn_link(fn ->
      # An owner already gone is reported at once ({:DOWN, …, :noproc}).
      ref = Process.monitor(owner)
      loop(ref, beat, interval, pod)
    end)
  end

  @spec stop(pid() | nil) :: :ok
  def stop(nil), do: :ok

  def stop(pid) do
    Process.unlink(pid)
    ref = Process.monitor(pid)
    Process.exit(pid, :kill)

    receive do
      {:DOWN, ^ref, :process, ^pid, _} -> :ok
    after
      5_000 -> :ok
    end
  end

  defp loop(ref, beat, interval, pod) do
    receive do
      {:DOWN, ^ref, :process, _owner, _reason} -> exit(:normal)
    after
      interval ->
        case beat.() do
          :ok ->
            :ok

          {:error, error} ->
            Logger.warning("condukt: Kubernetes sandbox: heartbeat of pod #{pod} failed: #{describe(error)}")
        end

        loop(ref, beat, interval, pod)
    end
  end

  defp describe(e) when is_exception(e), do: Exception.message(e)
  defp describe(e), do: inspect(e)
end
