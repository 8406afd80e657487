defmodule Condukt.Sandbox.Kubernetes.Forward do
  @moduledoc false
  # Owns the control channel's port-forward listener for one sandbox. The
  # port reports a tunnel that failed to the process that opened the
  # listener, and closes the listener when that process dies; this small
  # process is that owner, so the reports do not land in the session's
  # mailbox (a GenServer would log each as unexpected). It is linked to the
  # process that called init/1 and dies with it, taking the listener along.
  require Logger

  alias Condukt.Kube

  @doc "Opens the listener from a new process linked to the caller; returns it and the address."
  @spec start(Kube.t(), String.t(), String.t(), 1..65_535, Condukt.Native.address()) ::
          {:ok, pid(), Condukt.Native.address()} | {:error, Kube.Error.t()}
  def start(kube, namespace, pod, port, listen) do
    caller = self()
    ref = make_ref()

    pid =
      spawn_link(fn ->
        case Kube.forward(kube, namespace, pod, port, listen) do
          {:ok, {fchan, address}} ->
            send(caller, {ref, {:ok, address}})
            loop(kube, fchan, "#{namespace}/#{pod}:#{port}")

          {:error, _} = error ->
            send(caller, {ref, error})
        end
      end)

    receive do
      {^ref, {:ok, address}} -> {:ok, pid, address}
      {^ref, {:error, _} = error} -> error
    end
  end

  @doc "Closes the listener and stops the owner. Idempotent."
  @spec stop(pid() | nil) :: :ok
  def stop(nil), do: :ok

  def stop(pid) do
    Process.unlink(pid)
    ref = Process.monitor(pid)
    send(pid, :stop)

    receive do
      {:DOWN, ^ref, :process, ^pid, _} -> :ok
    after
      5_000 ->
        Process.exit(pid, :kill)
        :ok
    end
  end

  defp loop(kube, fchan, target) do
    receive do
      :stop ->
        Kube.forward_close(kube, fchan)

      {:condukt_kube_forward, _native, ^fchan, {:error, message}} ->
        # The bridge sees the same failure as a closed channel and re-dials.
        Logger.debug("condukt: Kubernetes sandbox: a control tunnel to #{target} failed: #{message}")
        loop(kube, fchan, target)

      _other ->
        loop(kube, fchan, target)
    end
  end
end
