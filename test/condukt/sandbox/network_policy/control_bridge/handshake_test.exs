defmodule Condukt.Sandbox.NetworkPolicy.ControlBridge.HandshakeTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy.ControlBridge.Handshake

  # The same vectors the C side checks (native_test/control/test_handshake.c),
  # computed by a third implementation (Python's hmac).
  @vectors Path.expand("../../../../../native_test/vectors/control_handshake.json", __DIR__)

  test "proofs match the shared vectors, for both roles" do
    vectors = @vectors |> File.read!() |> Condukt.JSON.decode!() |> Map.fetch!("vectors")
    assert length(vectors) >= 4

    for v <- vectors do
      token = Base.decode16!(v["token"], case: :lower)
      np = Base.decode16!(v["peer_nonce"], case: :lower)
      ns = Base.decode16!(v["sidecar_nonce"], case: :lower)
      sid = v["session_id"]
      assert Handshake.hex(Handshake.proof(token, :peer, sid, np, ns)) == v["peer_proof"]
      assert Handshake.hex(Handshake.proof(token, :sidecar, sid, np, ns)) == v["sidecar_proof"]

      peer = Base.decode16!(v["peer_proof"], case: :lower)
      assert Handshake.proof_ok?(token, :peer, sid, np, ns, peer)
      refute Handshake.proof_ok?(token, :sidecar, sid, np, ns, peer)
      refute Handshake.proof_ok?(token, :peer, sid, ns, np, peer)
      refute Handshake.proof_ok?(token, :peer, sid <> "x", np, ns, peer)
      refute Handshake.proof_ok?(token, :peer, sid, np, ns, binary_part(peer, 0, 31))

      assert Handshake.hex(Handshake.ticket(token, sid, np)) == v["ticket"]
    end
  end

  test "frames and hex" do
    np = Handshake.nonce()
    assert byte_size(np) == 32 and np != Handshake.nonce()
    hello = Handshake.hello("ws-1", np)
    assert hello == %{type: "hello", version: 2, session_id: "ws-1", nonce: Handshake.hex(np)}
    refute Map.has_key?(hello, :token)
    assert {:ok, ^np} = Handshake.unhex(hello.nonce, 32)
    assert Handshake.unhex(String.upcase(hello.nonce), 32) == :error
    assert Handshake.unhex("abcd", 32) == :error
    assert Handshake.unhex(nil, 32) == :error
  end
end
