defmodule Condukt.Sandbox.NetworkPolicy.ControlBridge.Handshake do
  @moduledoc """
  The control channel's handshake in Elixir (docs/control-channel.md,
  "Handshake"): the frames and the proofs, for peers and stand-ins written
  in Elixir. The bridge itself runs the handshake in the port program; both
  implementations check the same vectors.

  Neither side ever sends the session token. The peer sends a `hello`
  with a fresh nonce and the session id it wants, the sidecar answers with
  a `challenge` carrying its own nonce, the peer proves that it holds the
  token (`auth`), and only then does the sidecar prove it too, in its
  `welcome`. A proof is

      HMAC-SHA256(token, "condukt-control/2" <> <<0>> <> role <> <<0>> <>
                         <<byte_size(session_id)::16>> <> session_id <>
                         peer_nonce <> sidecar_nonce)

  with `role` `"peer"` or `"sidecar"`. The peer's hello may carry a
  ticket, the same HMAC with role `"ticket"` and 32 zero bytes in place of
  the sidecar's nonce: it ranks the peer's connection above others while
  the handshake runs, and proves nothing `auth` does not prove again.
  """

  @version 2
  @context "condukt-control/2"
  @nonce_bytes 32

  @typedoc "Which side a proof is for."
  @type role :: :peer | :sidecar

  @doc "The protocol version these frames speak."
  @spec version() :: pos_integer()
  def version, do: @version

  @doc "A fresh random nonce (32 bytes)."
  @spec nonce() :: binary()
  def nonce, do: :crypto.strong_rand_bytes(@nonce_bytes)

  @doc """
  The proof of `role` for one connection. `token` is the raw token (not
  hex), the nonces are 32 bytes each, `session_id` is 1 to 256 bytes.
  """
  @spec proof(binary(), role(), String.t(), binary(), binary()) :: binary()
  def proof(token, role, session_id, peer_nonce, sidecar_nonce)
      when role in [:peer, :sidecar] and byte_size(session_id) in 1..256 and
             byte_size(peer_nonce) == @nonce_bytes and byte_size(sidecar_nonce) == @nonce_bytes do
    message =
      <<@context, 0, Atom.to_string(role)::binary, 0, byte_size(session_id)::16, session_id::binary, peer_nonce::binary,
        sidecar_nonce::binary>>

    :crypto.mac(:hmac, :sha256, token, message)
  end

  @doc """
  The ticket of a hello with `peer_nonce` (see the moduledoc).
  """
  @spec ticket(binary(), String.t(), binary()) :: binary()
  def ticket(token, session_id, peer_nonce)
      when byte_size(session_id) in 1..256 and byte_size(peer_nonce) == @nonce_bytes do
    message =
      <<@context, 0, "ticket", 0, byte_size(session_id)::16, session_id::binary, peer_nonce::binary,
        0::size(@nonce_bytes)-unit(8)>>

    :crypto.mac(:hmac, :sha256, token, message)
  end

  @doc """
  Whether `given` is the proof of `role` (compared in constant time);
  false for arguments no proof can be made of.
  """
  @spec proof_ok?(binary(), role(), String.t(), binary(), binary(), binary()) :: boolean()
  def proof_ok?(token, role, session_id, peer_nonce, sidecar_nonce, given)
      when role in [:peer, :sidecar] and byte_size(session_id) in 1..256 and
             byte_size(peer_nonce) == @nonce_bytes and byte_size(sidecar_nonce) == @nonce_bytes and
             byte_size(given) == 32 do
    :crypto.hash_equals(proof(token, role, session_id, peer_nonce, sidecar_nonce), given)
  end

  def proof_ok?(_token, _role, _session_id, _peer_nonce, _sidecar_nonce, _given), do: false

  @doc "The peer's first frame."
  @spec hello(String.t(), binary()) :: map()
  def hello(session_id, peer_nonce),
    do: %{type: "hello", version: @version, session_id: session_id, nonce: hex(peer_nonce)}

  @doc "The sidecar's answer to a hello."
  @spec challenge(binary()) :: map()
  def challenge(sidecar_nonce), do: %{type: "challenge", version: @version, nonce: hex(sidecar_nonce)}

  @doc "The peer's proof."
  @spec auth(binary()) :: map()
  def auth(proof), do: %{type: "auth", proof: hex(proof)}

  @doc "The sidecar's welcome, with its proof."
  @spec welcome(String.t(), binary(), non_neg_integer()) :: map()
  def welcome(session_id, proof, dropped \\ 0),
    do: %{type: "welcome", version: @version, session_id: session_id, proof: hex(proof), dropped: dropped}

  @doc "Lowercase hex of a binary."
  @spec hex(binary()) :: String.t()
  def hex(bin), do: Base.encode16(bin, case: :lower)

  @doc "A binary from exactly `bytes` bytes of lowercase hex, or `:error`."
  @spec unhex(term(), pos_integer()) :: {:ok, binary()} | :error
  def unhex(text, bytes) when is_binary(text) and byte_size(text) == 2 * bytes do
    if text =~ ~r/\A[0-9a-f]*\z/, do: Base.decode16(text, case: :lower), else: :error
  end

  def unhex(_text, _bytes), do: :error
end
