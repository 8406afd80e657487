defmodule Condukt.Test.ControlListener do
  @moduledoc false
  # A scripted stand-in for the sidecar's control listener on a Unix
  # socket, for the port program's own tests: the real sidecar cannot be
  # told to stall its welcome, burst 300 frames or watch for the peer's
  # close. (End-to-end tests use the real sidecar in the netns tier.)
  #
  # Every accepted connection is reported to the owner as
  # {:listener, :hello, frame, conn}; the owner then calls `welcome/3`
  # (which plays the sidecar's part of the handshake: a challenge, the
  # peer's proof checked, a welcome with the sidecar's proof; a wrong proof
  # closes and reports {:listener, :refused}), `send_frames/2`, `close/1`,
  # and receives {:listener, :line, map} for every line the peer writes and
  # {:listener, :closed} when it goes.

  # Unix socket paths are limited to 107 bytes, which ExUnit's tmp_dir
  # paths can exceed: the socket lives in /tmp under a short name.
  # `path` (optional) picks the socket's path, for a test that dials it
  # before it exists.
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge.Handshake

  def start(path \\ nil) do
    path = path || "/tmp/ce-ctl-#{System.unique_integer([:positive])}-#{:rand.uniform(1_000_000)}.sock"
    ExUnit.Callbacks.on_exit(fn -> File.rm(path) end)
    owner = self()

    {:ok, listen} =
      :gen_tcp.listen(0, [:binary, ifaddr: {:local, String.to_charlist(path)}, packet: :line, active: false])

    pid = spawn_link(fn -> accept_loop(listen, owner) end)
    :ok = :gen_tcp.controlling_process(listen, pid)
    %{path: path, pid: pid}
  end

  defp accept_loop(listen, owner) do
    case :gen_tcp.accept(listen) do
      {:ok, sock} ->
        conn = spawn(fn -> conn_loop(sock, owner) end)
        :ok = :gen_tcp.controlling_process(sock, conn)
        send(conn, :go)
        accept_loop(listen, owner)

      {:error, _} ->
        :ok
    end
  end

  defp conn_loop(sock, owner) do
    receive do
      :go -> :ok
    end

    {:ok, line} = :gen_tcp.recv(sock, 0, 5_000)
    hello = Condukt.JSON.decode!(line)
    send(owner, {:listener, :hello, hello, self()})

    receive do
      {:welcome, session_id, token} ->
        if handshake(sock, hello, session_id, Base.decode16!(token, case: :lower)) do
          :inet.setopts(sock, active: true)
          serve(sock, owner)
        else
          :gen_tcp.close(sock)
          send(owner, {:listener, :refused})
        end

      :close ->
        :gen_tcp.close(sock)
    end
  end

  defp handshake(sock, hello, session_id, token) do
    {:ok, peer_nonce} = Handshake.unhex(hello["nonce"], 32)
    nonce = Handshake.nonce()
    send_line(sock, Handshake.challenge(nonce))
    {:ok, line} = :gen_tcp.recv(sock, 0, 5_000)

    with %{"type" => "auth", "proof" => hex} <- Condukt.JSON.decode!(line),
         {:ok, proof} <- Handshake.unhex(hex, 32),
         true <- Handshake.proof_ok?(token, :peer, session_id, peer_nonce, nonce, proof) do
      send_line(sock, Handshake.welcome(session_id, Handshake.proof(token, :sidecar, session_id, peer_nonce, nonce)))
      true
    else
      _ -> false
    end
  end

  defp send_line(sock, frame), do: :ok = :gen_tcp.send(sock, Condukt.JSON.encode!(frame) <> "\n")

  defp serve(sock, owner) do
    receive do
      {:send, frames} ->
        Enum.each(frames, &:gen_tcp.send(sock, Condukt.JSON.encode!(&1) <> "\n"))
        serve(sock, owner)

      :close ->
        :gen_tcp.close(sock)

      {:tcp, _, line} ->
        send(owner, {:listener, :line, Condukt.JSON.decode!(line)})
        serve(sock, owner)

      {:tcp_closed, _} ->
        send(owner, {:listener, :closed})
    end
  end

  # The token the stand-in holds (lowercase hex): a peer that proves
  # another is refused.
  def welcome(conn, session_id \\ "test", token \\ String.duplicate("0f", 16)),
    do: send(conn, {:welcome, session_id, token})

  def send_frames(conn, frames), do: send(conn, {:send, frames})
  def close(conn), do: send(conn, :close)
end
