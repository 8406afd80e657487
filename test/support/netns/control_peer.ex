defmodule Condukt.Test.Netns.ControlPeer do
  @moduledoc false
  # A test's end of the sidecar's control channel (docs/control-channel.md):
  # connects to the Unix socket, authenticates with the session token,
  # sends every event frame to the owner as {:egress_event, map}, and
  # answers decision requests with `decide.(request)`, which returns
  # :allow, {:deny, reason}, :ignore (never answer: the sidecar times out)
  # or {:allow | {:deny, reason}, cache?}. Frames that are neither are sent
  # to the owner as {:egress_frame, map} (the welcome among them, once its
  # proof checked out). Options: `:token` (another token), `:session_id`
  # (another session), `:path` (the Unix socket to dial; default the
  # sidecar's `unix:` control address, or its port-forward relay when the
  # control channel is TCP). A handshake that fails (a wrong token, a
  # listener that cannot prove the token) ends the peer: the owner gets
  # {:egress_frame, %{"type" => "closed", "why" => why}}.
  use GenServer

  alias Condukt.Sandbox.NetworkPolicy.ControlBridge.Handshake
  alias Condukt.Test.Netns.Sidecar

  def start_link(%Sidecar{} = sc, owner, decide, opts \\ []) do
    GenServer.start_link(__MODULE__, {sc, owner, decide, opts})
  end

  # A peer that already ended (its connection closed, or it went down with
  # the test process it is linked to, between a caller's alive check and
  # this call) is stopped too.
  def stop(pid) do
    GenServer.stop(pid)
  catch
    :exit, {:noproc, _} -> :ok
  end

  # Answers a decision request that `decide` left unanswered (:ignore):
  # decision is :allow or {:deny, reason}.
  def reply(pid, id, decision), do: GenServer.call(pid, {:reply, id, decision})

  # Sends any frame (a map) as one line, e.g. a "credential" or a "ping".
  def send_frame(pid, frame), do: GenServer.call(pid, {:send_frame, frame})

  @impl true
  def handle_call({:send_frame, frame}, _from, state) do
    {:reply, :gen_tcp.send(state.sock, Condukt.JSON.encode!(frame) <> "\n"), state}
  end

  def handle_call({:reply, id, decision}, _from, state) do
    :ok = :gen_tcp.send(state.sock, Condukt.JSON.encode!(decision_frame(id, decision, false)) <> "\n")
    {:reply, :ok, state}
  end

  @impl true
  def init({sc, owner, decide, opts}) do
    path =
      case {opts[:path], sc.control} do
        {nil, "unix:" <> path} -> path
        {nil, _tcp} -> sc.control_relay || raise("TCP control channel: start Sidecar.port_forward/1 first")
        {path, _} -> path
      end

    case :gen_tcp.connect(
           {:local, String.to_charlist(path)},
           0,
           [:binary, packet: :line, active: false, buffer: 1_048_576 * 2],
           5_000
         ) do
      {:ok, sock} ->
        token = Base.decode16!(Keyword.get(opts, :token, sc.token), case: :lower)
        session_id = Keyword.get(opts, :session_id, Sidecar.session_id(sc))
        {:ok, %{sock: sock, owner: owner, decide: decide}, {:continue, {:handshake, token, session_id}}}

      {:error, reason} ->
        {:stop, reason}
    end
  end

  @impl true
  def handle_continue({:handshake, token, session_id}, state) do
    case handshake(state.sock, token, session_id) do
      {:ok, welcome} ->
        :inet.setopts(state.sock, active: true)
        send(state.owner, {:egress_frame, welcome})
        {:noreply, state}

      {:error, why} ->
        :gen_tcp.close(state.sock)
        send(state.owner, {:egress_frame, %{"type" => "closed", "why" => why}})
        {:stop, :normal, state}
    end
  end

  # The peer's side of the handshake (Handshake), with the socket passive.
  defp handshake(sock, token, session_id) do
    np = Handshake.nonce()
    :ok = :gen_tcp.send(sock, Condukt.JSON.encode!(Handshake.hello(session_id, np)) <> "\n")

    with {:ok, line} <- :gen_tcp.recv(sock, 0, 5_000),
         %{"type" => "challenge", "nonce" => hex} <- Condukt.JSON.decode!(line),
         {:ok, ns} <- Handshake.unhex(hex, 32),
         :ok <-
           :gen_tcp.send(
             sock,
             Condukt.JSON.encode!(Handshake.auth(Handshake.proof(token, :peer, session_id, np, ns))) <> "\n"
           ),
         {:ok, line} <- :gen_tcp.recv(sock, 0, 5_000),
         %{"type" => "welcome", "proof" => phex, "session_id" => ^session_id} = welcome <- Condukt.JSON.decode!(line),
         {:ok, proof} <- Handshake.unhex(phex, 32),
         true <- Handshake.proof_ok?(token, :sidecar, session_id, np, ns, proof) do
      {:ok, welcome}
    else
      {:error, reason} -> {:error, reason}
      other -> {:error, {:unexpected, other}}
    end
  end

  @impl true
  def handle_info({:tcp, _sock, line}, state) do
    frame = Condukt.JSON.decode!(line)

    case frame["type"] do
      "event" ->
        send(state.owner, {:egress_event, frame})

      "decision_request" ->
        answer(state, frame)

      _ ->
        send(state.owner, {:egress_frame, frame})
    end

    {:noreply, state}
  end

  def handle_info({:tcp_closed, _}, state) do
    send(state.owner, {:egress_frame, %{"type" => "closed"}})
    {:stop, :normal, state}
  end

  defp answer(state, frame) do
    send(state.owner, {:egress_decision_request, frame})

    {decision, cache} =
      case state.decide.(frame["request"]) do
        {d, cache} when is_boolean(cache) -> {d, cache}
        d -> {d, true}
      end

    if decision != :ignore,
      do: :gen_tcp.send(state.sock, Condukt.JSON.encode!(decision_frame(frame["id"], decision, cache)) <> "\n")
  end

  defp decision_frame(id, :allow, cache), do: %{type: "decision", id: id, decision: "allow", cache: cache}

  defp decision_frame(id, {:deny, reason}, cache),
    do: %{type: "decision", id: id, decision: "deny", reason: reason, cache: cache}
end
