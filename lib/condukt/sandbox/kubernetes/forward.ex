defmodule Condukt.Sandbox.Kubernetes.Forward do
  @moduledoc false
  # Owns the control channel's port-forward listener for one sandbox. The
  # port reports a tunnel that failed to the process that opened the
  # listener, and closes the listener when that process dies; this small
  # process is that owner, so the reports do not land in the session's
  # mailbox (a GenServer would log each as unexpected). It is linked to the
  # process that called init/1 and dies with it, taking the listener along
  # and removing the listener's private directory.
  require Logger

  alias Condukt.Kube

  @doc """
  Opens the listener (a Unix socket in `dir`) from a new process linked to
  the caller; returns it and the address. `dir` is removed when the
  process ends, however it ends.
  """
  @spec start(Kube.t(), String.t(), String.t(), 1..65_535, Path.t()) ::
          {:ok, pid(), Condukt.Native.address()} | {:error, Kube.Error.t()}
  def start(kube, namespace, pod, port, dir) do
    caller = self()
    ref = make_ref()

    pid =
      spawn_link(fn ->
        # The caller's death arrives as a message: clean up, then go.
        Process.flag(:trap_exit, true)

        case Kube.forward(kube, namespace, pod, port, {:unix, Path.join(dir, "control.sock")}) do
          {:ok, {fchan, address}} ->
            send(caller, {ref, {:ok, address}})
            loop(%{kube: kube, fchan: fchan, dir: dir, caller: caller, target: "#{namespace}/#{pod}:#{port}"})

          {:error, _} = error ->
            File.rm_rf(dir)
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

  defp loop(st) do
    receive do
      :stop ->
        finish(st)

      {:EXIT, caller, _reason} when caller == st.caller ->
        finish(st)

      {:condukt_kube_forward, _native, fchan, {:error, message}} when fchan == st.fchan ->
        # The bridge sees the same failure as a closed channel and re-dials.
        Logger.debug("condukt: Kubernetes sandbox: a control tunnel to #{st.target} failed: #{message}")
        loop(st)

      _other ->
        loop(st)
    end
  end

  defp finish(st) do
    Kube.forward_close(st.kube, st.fchan)
    File.rm_rf(st.dir)
    :ok
  end
end
