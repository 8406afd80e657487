defmodule Bench.Decide do
  @moduledoc false
  # The decide path (condukt only): a request whose matching rule is
  # `decide` waits for a `decision_request` to travel the control channel to
  # the BEAM, where ControlBridge runs an Elixir function decider, and for
  # the `decision` to come back. Measured from the client, as the latency
  # of sequential keep-alive requests to decide.test, against the latency
  # of allowed.test (an allow rule: no round trip) on the same sidecar.
  # With `cache: true` every request after the first is a hit in the
  # sidecar's decision cache.

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge
  alias Condukt.Dev.Netns.Cmd

  def run(tb, cache?, secs) do
    # With the cache on, the answer covers the whole host (scope :host), so
    # the sidecar keeps it and answers later requests itself; a plain
    # :allow covers one request only, and each later one would still make
    # the round trip to the BEAM's own cache.
    allow = if cache?, do: {:allow, scope: :host}, else: :allow
    decider = fn _ctx, req -> if req.host == "decide.test", do: allow, else: {:deny, "not decide.test"} end

    policy =
      NetworkPolicy.new!(
        rules: [allow: ["allowed.test"], decide: [call: decider, timeout: 5_000, cache: cache?]],
        default: :deny
      )

    ic = Bench.Interceptor.start("condukt", tb, policy: policy)

    try do
      bridge = bridge!(tb, ic, policy)

      try do
        decide = Bench.Measure.latency(tb, "https://decide.test/1k.bin", ic.ca, secs)
        allow = Bench.Measure.latency(tb, "https://allowed.test/1k.bin", ic.ca, secs)
        r = %{decide: decide, allow: allow}

        case Bench.Interceptor.died(ic) do
          nil -> r
          why -> Map.put(r, :proxy, %{error: why})
        end
      after
        ControlBridge.stop(bridge)
      end
    after
      Bench.Interceptor.stop(ic)
    end
  end

  @doc "A ControlBridge on this BEAM attached to the sidecar `ic`'s control channel, connected."
  def bridge!(tb, ic, policy) do
    {:ok, bridge} =
      ControlBridge.start(
        session_id: "bench-#{tb.id}",
        owner: self(),
        policy: policy,
        address: ic.control,
        token: ic.token
      )

    :ok = Cmd.poll(fn -> ControlBridge.info(bridge).status == :connected end, 10_000)
    bridge
  end
end
