defmodule Condukt.Sandbox.NetworkPolicy.ControlBridge do
  @moduledoc """
  **Internal.** Part of the library's plumbing, documented for those who
  work on Condukt; its API may change in any release.

  The BEAM's end of one session's sidecar control channel
  (docs/control-channel.md, docs/beam-side.md).

  One bridge per gated session, started with `start/1` under
  `Condukt.Sandbox.NetworkPolicy.ControlChannelSupervisor`:

      Condukt.Supervisor (application root)
        ControlChannelSupervisor   DynamicSupervisor, one_for_one
          ControlBridge            1 per session, restart: :transient
            Condukt.Native         linked: the `condukt-egress port` process

  The bridge

    * **attaches** to the sidecar's control address through its own
      `Condukt.Native` (the port program speaks the channel's NDJSON; the
      bridge sees terms): the port and the sidecar each prove that they
      hold the session token without sending it, and the sidecar must name
      this session; whatever listens there and cannot is refused, with a
      `:control_refused` telemetry event;
    * turns every `event` frame into a `:telemetry` event
      (`Condukt.Sandbox.NetworkPolicy.Telemetry`);
    * answers every `decision_request` by running the policy's decide rule
      in `Condukt.Sandbox.NetworkPolicy.DecideRuntime` (a task per
      decision, never in the bridge's own loop) and sends the `decision`
      back;
    * acknowledges frames in batches (the port's credit window), so a
      bridge that falls behind slows the channel, never the sidecar.

  ## Lifetime

    * It **monitors** (does not link to) the session's `:owner` and stops
      `:normal` when the owner goes: a `:transient` child that stops
      `:normal` is not restarted, and its port process goes with it.
    * A dial that fails (unreachable address, refused token, no welcome in
      time) is retried after a capped exponential backoff; after
      `:attempts` consecutive failures the bridge emits `:control_gave_up`
      and stops `:normal` (dropped, not restarted): `:decide` then fails
      closed through the sidecar's decide timeout. A successful welcome
      resets the count. With `attempts: :infinity` it never gives up: a
      transport that can be down for a while and come back (a Kubernetes
      port-forward through a restarting kubelet) is re-dialled every
      backoff step, `:decide` failing closed meanwhile.
    * A channel that drops is re-dialled (after the first backoff step).
      With `:ping_interval`, a channel silent that long gets a `ping`, and
      one that then stays silent for `:ping_timeout` is closed and
      re-dialled: a tunnel (a Kubernetes port-forward) may not report that
      its far end went away.
      Decisions in flight keep running; an answer that finds no channel is
      held and sent when the sidecar asks again (it re-sends every pending
      request to a new peer).
    * If the port program dies the bridge starts a new one and re-dials;
      more than five port deaths within a minute count as a dead port and
      the bridge gives up `:normal` as above.
    * A genuine crash of the bridge is restarted by the supervisor, whose
      restart intensity is bounded.

  `stop/1` ends a bridge and is idempotent.

  ## Options

  #{Condukt.Options.docs(Condukt.Sandbox.NetworkPolicy.ControlBridge.Options.schema())}
  """

  use GenServer, restart: :transient, shutdown: 10_000
  require Logger

  alias Condukt.Native
  alias Condukt.Sandbox.NetworkPolicy.{Capture, ControlChannelSupervisor, DecideRuntime, Request, Telemetry}
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge.Options

  @max_port_deaths 5
  @port_death_window 60_000
  # The sidecar refuses a decision reason over 512 bytes (and closes the
  # channel for it), so longer reasons are cut at a character boundary.
  @max_reason_bytes 512

  @type t :: pid()

  @typedoc "What `info/1` reports."
  @type info :: %{
          status: :connecting | :connected,
          chan: Native.chan() | nil,
          failures: non_neg_integer(),
          native: pid() | nil,
          os_pid: non_neg_integer() | nil,
          running_deciders: non_neg_integer()
        }

  ## Public API ---------------------------------------------------------------

  @doc """
  Starts a bridge for a session under `ControlChannelSupervisor`.

  Returns `{:error, %Condukt.Options.Error{}}` for bad options (naming
  the option and the value) without starting anything.
  """
  @spec start(keyword()) :: {:ok, t()} | {:error, Condukt.Options.Error.t() | term()}
  def start(opts) do
    with {:ok, opts} <- Options.validate(opts) do
      DynamicSupervisor.start_child(ControlChannelSupervisor, {__MODULE__, opts})
    end
  end

  @doc """
  Stops a bridge (detaching its channel and closing its port program).
  Idempotent: a bridge that already went away is `:ok`.
  """
  @spec stop(t() | nil) :: :ok
  def stop(nil), do: :ok

  def stop(bridge) when is_pid(bridge) do
    case DynamicSupervisor.terminate_child(ControlChannelSupervisor, bridge) do
      :ok ->
        :ok

      {:error, :not_found} ->
        # Started outside the supervisor (start_link/1), or already gone.
        try do
          GenServer.stop(bridge, :normal, 15_000)
        catch
          :exit, _ -> :ok
        end
    end
  end

  @doc "The bridge's connection state, for operators and tests."
  @spec info(t()) :: info()
  def info(bridge), do: GenServer.call(bridge, :info)

  @doc """
  Sends the sidecar a new value for the secret `name`
  (`Condukt.Sandbox.NetworkPolicy.Credentials`). Returns `:ok` once the
  sidecar has taken it (its answer to a `ping` sent after the value), so
  the next request gets the new value; `{:error, :timeout}` when no
  channel took it within `timeout` ms. The bridge keeps the newest value
  of every rotated secret and sends them again after each reconnection,
  so a sidecar that restarted from its stored copy is brought up to date.
  The caller checks the name and the value first.
  """
  @spec rotate_credential(t(), String.t(), String.t(), timeout()) :: :ok | {:error, :timeout}
  def rotate_credential(bridge, name, value, timeout \\ 10_000) do
    # The value travels inside a closure: a crash report or a state dump
    # of the bridge shows a function, not the secret.
    GenServer.call(bridge, {:rotate_credential, name, fn -> value end}, timeout)
  catch
    :exit, {:timeout, _} -> {:error, :timeout}
  end

  @doc """
  Starts a bridge linked to the caller, outside the supervisor (tests,
  custom trees). Options as for `start/1`; raises
  `Condukt.Options.Error` on bad options.
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts) do
    opts =
      case Options.validate(opts) do
        {:ok, opts} -> opts
        {:error, error} -> raise error
      end

    GenServer.start_link(__MODULE__, opts)
  end

  ## Server -------------------------------------------------------------------

  @impl true
  def init(opts) do
    # Trapping exits turns the death of our Native (linked) into a message
    # we recover from; the supervisor's own EXIT still stops us.
    Process.flag(:trap_exit, true)
    Process.monitor(opts[:owner])

    runtime =
      DecideRuntime.new(
        policy: opts[:policy],
        session_id: opts[:session_id],
        messages: opts[:messages]
      )

    state = %{
      opts: opts,
      capture: Capture.of(opts[:policy]),
      owner: opts[:owner],
      session_id: opts[:session_id],
      native: nil,
      # The port program's port, written to directly for decisions.
      port: nil,
      chan: nil,
      failures: 0,
      dial_timer: nil,
      runtime: runtime,
      unacked: 0,
      ack_batch: max(1, div(opts[:window], 4)),
      held: %{},
      port_deaths: [],
      # Liveness (:ping_interval): the timer of the next ping or of the
      # pong deadline, and a counter that tells stale timers apart.
      ping_timer: nil,
      ping_ref: 0,
      # Rotated secrets (name => a closure returning the value), pings sent
      # and pongs received on the current channel, and the callers of
      # rotate_credential/4 waiting for the pong that confirms their value
      # ({from, ping number}, or :pending until a channel exists).
      rotated: %{},
      pings: 0,
      pongs: 0,
      rotations: []
    }

    {:ok, state, {:continue, :dial}}
  end

  @impl true
  def handle_continue(:dial, state), do: dial(state)

  @impl true
  def handle_call({:rotate_credential, name, value}, from, state) do
    state = %{state | rotated: Map.put(state.rotated, name, value)}

    if state.chan do
      send_credential(state, name, value)
      state = send_ping(state)
      {:noreply, %{state | rotations: [{from, state.pings} | state.rotations]}}
    else
      {:noreply, %{state | rotations: [{from, :pending} | state.rotations]}}
    end
  end

  def handle_call(:info, _from, state) do
    os_pid =
      try do
        state.native && Native.os_pid(state.native)
      catch
        :exit, _ -> nil
      end

    info = %{
      status: if(state.chan, do: :connected, else: :connecting),
      chan: state.chan,
      failures: state.failures,
      native: state.native,
      os_pid: os_pid,
      running_deciders: DecideRuntime.running(state.runtime)
    }

    {:reply, info, state}
  end

  @impl true
  def handle_info(:dial, state), do: dial(%{state | dial_timer: nil})

  def handle_info({:condukt_control, native, chan, {:frame, frame}}, %{native: native, chan: chan} = state) do
    state = frame(frame, state)
    {:noreply, state |> credit() |> arm_ping()}
  end

  def handle_info({:condukt_control, native, chan, {:closed, reason}}, %{native: native, chan: chan} = state) do
    Logger.info("network policy (session #{inspect(state.session_id)}): control channel closed: #{reason}")
    Telemetry.control_disconnected(state.session_id, reason)
    {:noreply, schedule_dial(lost_channel(%{disarm_ping(state) | chan: nil, unacked: 0}))}
  end

  def handle_info({:ping, ref}, %{ping_ref: ref, chan: chan} = state) when chan != nil do
    state = send_ping(state)
    timer = Process.send_after(self(), {:pong_deadline, ref}, state.opts[:ping_timeout])
    {:noreply, %{state | ping_timer: timer}}
  end

  def handle_info({:pong_deadline, ref}, %{ping_ref: ref, chan: chan} = state) when chan != nil do
    Logger.info(
      "network policy (session #{inspect(state.session_id)}): control channel silent for " <>
        "#{state.opts[:ping_timeout]} ms after a ping; closing and re-dialling"
    )

    try do
      Native.control_detach(state.native, chan)
    catch
      :exit, _ -> :ok
    end

    Telemetry.control_disconnected(state.session_id, :ping_timeout)
    {:noreply, schedule_dial(lost_channel(%{disarm_ping(state) | chan: nil, unacked: 0}))}
  end

  def handle_info({tag, _ref}, state) when tag in [:ping, :pong_deadline] do
    # A timer of a channel we already left behind.
    {:noreply, state}
  end

  # A decision posted to the port that could not be queued on the socket
  # (the channel closed under it, the sidecar not reading, ...): held for
  # the sidecar's re-sent request, as if there had been no channel.
  def handle_info(
        {:condukt_control, native, _chan, {:send_failed, {:decision, id, answer, cache}, error}},
        %{native: native} = state
      ) do
    Logger.warning("network policy (session #{inspect(state.session_id)}): #{Exception.message(error)}")
    {:noreply, %{state | held: Map.put(state.held, id, {answer, cache, System.monotonic_time(:millisecond)})}}
  end

  def handle_info({:condukt_control, _native, _chan, _message}, state) do
    # From a channel or port we already left behind.
    {:noreply, state}
  end

  def handle_info({:EXIT, native, reason}, %{native: native} = state) do
    if state.chan, do: Telemetry.control_disconnected(state.session_id, {:port_exited, reason})
    now = System.monotonic_time(:millisecond)
    deaths = [now | Enum.filter(state.port_deaths, &(now - &1 < @port_death_window))]
    state = %{state | native: nil, port: nil, chan: nil, unacked: 0, port_deaths: deaths}

    if length(deaths) > @max_port_deaths do
      give_up(state, {:port_exited, reason})
    else
      Logger.warning(
        "network policy (session #{inspect(state.session_id)}): the port program exited " <>
          "(#{inspect(reason)}); restarting it and re-dialling"
      )

      {:noreply, schedule_dial(state)}
    end
  end

  def handle_info({:DOWN, _ref, :process, owner, _reason}, %{owner: owner} = state) do
    # Nothing left to gate: stop :normal so the :transient child is dropped.
    {:stop, :normal, state}
  end

  def handle_info(message, state) do
    case DecideRuntime.handle_info(state.runtime, message) do
      {:ok, replies, runtime} ->
        {:noreply, send_decisions(%{state | runtime: runtime}, replies)}

      :unknown ->
        {:noreply, state}
    end
  end

  @impl true
  def terminate(_reason, state) do
    DecideRuntime.cancel_all(state.runtime)

    if state.native do
      if state.chan do
        try do
          Native.control_detach(state.native, state.chan)
        catch
          :exit, _ -> :ok
        end
      end

      Native.stop(state.native)
    end

    :ok
  end

  ## Dialling -----------------------------------------------------------------

  defp dial(state) do
    opts = state.opts

    with {:ok, state} <- ensure_native(state),
         {:ok, {chan, welcome}} <- attach(state) do
      attempt = state.failures + 1
      Telemetry.control_connected(state.session_id, attempt, welcome_dropped(welcome))
      state = %{state | chan: chan, failures: 0, unacked: 0, held: expire_held(state.held)}
      {:noreply, state |> resend_credentials() |> arm_ping()}
    else
      {:error, reason, state} ->
        refused(state, reason)
        failures = state.failures + 1
        state = %{state | failures: failures}

        if opts[:attempts] != :infinity and failures >= opts[:attempts] do
          give_up(state, reason)
        else
          Logger.info(
            "network policy (session #{inspect(state.session_id)}): control channel attempt #{failures} " <>
              "of #{opts[:attempts]} failed: #{describe(reason)}"
          )

          {:noreply, schedule_dial(state)}
        end
    end
  end

  defp ensure_native(%{native: nil} = state) do
    case Native.start_link(state.opts[:native]) do
      {:ok, native} -> {:ok, %{state | native: native, port: Native.port(native)}}
      {:error, reason} -> {:error, reason, state}
    end
  catch
    # The program died at once; its EXIT message follows and restarts it.
    :exit, reason -> {:error, {:native_exited, reason}, state}
  end

  defp ensure_native(state), do: {:ok, state}

  defp attach(state) do
    opts = state.opts

    result =
      Native.control_attach(state.native, opts[:address], opts[:token],
        session_id: state.session_id,
        timeout: opts[:attach_timeout],
        window: opts[:window],
        owner: self()
      )

    case result do
      {:ok, _} = ok -> ok
      {:error, reason} -> {:error, reason, state}
    end
  catch
    # The port died under the call; its EXIT message follows and restarts it.
    :exit, reason -> {:error, {:native_exited, reason}, state}
  end

  # Any frame proves the channel alive: the next ping waits a full
  # interval again.
  defp arm_ping(state) do
    case state.opts[:ping_interval] do
      nil ->
        state

      interval ->
        state = disarm_ping(state)
        %{state | ping_timer: Process.send_after(self(), {:ping, state.ping_ref}, interval)}
    end
  end

  defp disarm_ping(%{ping_timer: nil} = state), do: %{state | ping_ref: state.ping_ref + 1}

  defp disarm_ping(state) do
    Process.cancel_timer(state.ping_timer)
    %{state | ping_timer: nil, ping_ref: state.ping_ref + 1}
  end

  # Counts the pings of the channel: the pongs come back in order, so
  # pong number n confirms every frame sent before ping number n.
  defp send_ping(state) do
    try do
      Native.control_send(state.native, state.chan, %{type: "ping"})
    catch
      :exit, _ -> :error
    end

    %{state | pings: state.pings + 1}
  end

  ## Credentials ---------------------------------------------------------------

  defp send_credential(state, name, value) do
    Native.control_send(state.native, state.chan, %{type: "credential", name: name, value: value.()})
  catch
    :exit, _ -> :error
  end

  # A channel that went away confirms nothing more: its waiters wait for
  # the next one, which is sent every rotated value again.
  defp lost_channel(state) do
    %{state | pings: 0, pongs: 0, rotations: Enum.map(state.rotations, fn {from, _} -> {from, :pending} end)}
  end

  defp resend_credentials(%{rotated: rotated} = state) when map_size(rotated) == 0, do: state

  defp resend_credentials(state) do
    for {name, value} <- state.rotated, do: send_credential(state, name, value)
    state = send_ping(state)
    %{state | rotations: Enum.map(state.rotations, fn {from, _} -> {from, state.pings} end)}
  end

  defp pong(state) do
    pongs = state.pongs + 1

    {done, waiting} = Enum.split_with(state.rotations, fn {_from, n} -> is_integer(n) and n <= pongs end)

    for {from, _} <- done, do: GenServer.reply(from, :ok)
    %{state | pongs: pongs, rotations: waiting}
  end

  defp schedule_dial(%{dial_timer: nil} = state) do
    {initial, max} = state.opts[:backoff]
    %{state | dial_timer: Process.send_after(self(), :dial, backoff(initial, max, state.failures))}
  end

  defp schedule_dial(state), do: state

  @doc false
  # Capped exponential backoff with jitter: the nth consecutive failure
  # waits a random time in [d/2, d] where d = min(max, initial * 2^n).
  @spec backoff(pos_integer(), pos_integer(), non_neg_integer()) :: pos_integer()
  def backoff(initial, max, failures) do
    d = min(max, initial * Integer.pow(2, min(failures, 30)))
    half = div(d, 2)
    Kernel.max(1, half + :rand.uniform(d - half + 1) - 1)
  end

  defp give_up(state, reason) do
    Logger.error(
      "network policy (session #{inspect(state.session_id)}): giving up on the control channel after " <>
        "#{state.failures} failed attempts (#{describe(reason)}); decide rules now fail closed"
    )

    Telemetry.control_gave_up(state.session_id, state.failures, reason)
    {:stop, :normal, state}
  end

  # The port refuses (:perm) a listener that cannot prove the session token
  # or gates another session: a process squatting the sidecar's address.
  defp refused(state, %Condukt.Native.Error{code: :perm, message: message}) do
    Logger.warning("network policy (session #{inspect(state.session_id)}): refused the control listener: #{message}")
    Telemetry.control_refused(state.session_id, :bridge, message, 1)
  end

  defp refused(_state, _reason), do: :ok

  defp welcome_dropped(%{"dropped" => n}) when is_integer(n), do: n
  defp welcome_dropped(_), do: 0

  defp describe(%{__exception__: true} = e), do: Exception.message(e)
  defp describe(other), do: inspect(other)

  ## Frames -------------------------------------------------------------------

  # Body previews are redacted (or dropped) before any handler or decider
  # sees them (Capture).
  defp frame(%{"type" => "event"} = frame, state) do
    Telemetry.emit_frame(Capture.filter_fields(frame, state.capture), state.session_id)
    state
  end

  defp frame(%{"type" => "decision_request", "id" => id} = frame, state) when is_binary(id) do
    fields = Capture.filter_fields(if(is_map(frame["request"]), do: frame["request"], else: frame), state.capture)
    # The decision id names the question; the request's own id is the proxy's.
    request = Request.from_sidecar(Map.put_new(fields, "id", frame["request_id"]))
    rule_index = get_in(frame, ["rule", "index"])

    case Map.pop(state.held, id) do
      {{answer, cache, _at}, held} ->
        send_decisions(%{state | held: held}, [{:decision, id, answer, cache}])

      {nil, _} ->
        {replies, runtime} = DecideRuntime.request(state.runtime, id, rule_index, request)
        send_decisions(%{state | runtime: runtime}, replies)
    end
  end

  defp frame(%{"type" => "pong"}, state), do: pong(state)

  defp frame(_other, state), do: state

  defp credit(state) do
    unacked = state.unacked + 1

    if unacked >= state.ack_batch do
      Native.ack(state.native, state.chan, unacked)
      %{state | unacked: 0}
    else
      %{state | unacked: unacked}
    end
  end

  defp send_decisions(state, replies) do
    Enum.reduce(replies, state, fn {:decision, id, answer, cache} = reply, state ->
      if state.chan && send_decision(state, reply) == :ok do
        state
      else
        # No channel now: hold the answer for the sidecar's re-sent request.
        %{state | held: Map.put(state.held, id, {answer, cache, System.monotonic_time(:millisecond)})}
      end
    end)
  end

  # Posted: written to the port from here, with no reply to wait for when
  # it is queued on the socket; a failure comes back as :send_failed with
  # the reply as its tag (handled above).
  defp send_decision(state, {:decision, id, answer, cache} = reply) do
    frame =
      case answer do
        :allow -> %{type: "decision", id: id, decision: "allow", cache: cache}
        {:deny, reason} -> %{type: "decision", id: id, decision: "deny", reason: wire_reason(reason), cache: cache}
      end

    case state.port && Native.control_post(state.port, state.chan, frame, reply) do
      :ok ->
        :ok

      {:error, error} ->
        Logger.warning("network policy (session #{inspect(state.session_id)}): #{Exception.message(error)}")
        :error

      nil ->
        :error
    end
  end

  defp wire_reason(reason) when is_atom(reason), do: wire_reason(Atom.to_string(reason))
  defp wire_reason(reason) when byte_size(reason) <= @max_reason_bytes, do: reason

  defp wire_reason(reason) do
    reason
    |> String.graphemes()
    |> Enum.reduce_while({[], 0}, fn g, {acc, n} ->
      if n + byte_size(g) > @max_reason_bytes, do: {:halt, {acc, n}}, else: {:cont, {[g | acc], n + byte_size(g)}}
    end)
    |> elem(0)
    |> Enum.reverse()
    |> IO.iodata_to_binary()
  end

  # A held answer is useless once its request has certainly timed out at
  # the sidecar (no rule waits longer than the sidecar's one-hour cap).
  defp expire_held(held) do
    now = System.monotonic_time(:millisecond)
    Map.reject(held, fn {_id, {_answer, _cache, at}} -> now - at > 3_600_000 end)
  end
end
