defmodule Condukt.Test.Netns.ControlPeer do
  @moduledoc false
  # A test's end of the sidecar's control channel (docs/control-channel.md):
  # connects to the Unix socket, authenticates with the session token,
  # sends every event frame to the owner as {:egress_event, map}, and
  # answers decision requests with `decide.(request)`, which returns
  # :allow, {:deny, reason}, :ignore (never answer: the sidecar times out)
  # or {:allow | {:deny, reason}, cache?}. Frames that are neither are sent
  # to the owner as {:egress_frame, map}. Options: `:token` (another token),
  # `:path` (the Unix socket to dial; default the sidecar's `unix:` control
  # address, or its port-forward relay when the control channel is TCP).
  use GenServer

  alias Condukt.Test.Netns.Sidecar

  def start_link(%Sidecar{} = sc, owner, decide, opts \\ []) do
    GenServer.start_link(__MODULE__, {sc, owner, decide, opts})
  end

  def stop(pid), do: GenServer.stop(pid)

  # Answers a decision request that `decide` left unanswered (:ignore):
  # decision is :allow or {:deny, reason}.
  def reply(pid, id, decision), do: GenServer.call(pid, {:reply, id, decision})

  @impl true
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
           [:binary, packet: :line, active: true, buffer: 1_048_576 * 2],
           5_000
         ) do
      {:ok, sock} ->
        token = Keyword.get(opts, :token, sc.token)
        :ok = :gen_tcp.send(sock, Condukt.JSON.encode!(%{type: "hello", version: 1, token: token}) <> "\n")
        {:ok, %{sock: sock, owner: owner, decide: decide}}

      {:error, reason} ->
        {:stop, reason}
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
