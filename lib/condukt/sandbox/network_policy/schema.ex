defmodule Condukt.Sandbox.NetworkPolicy.Schema do
  @moduledoc false
  # Option schemas of the network policy, in one place so that validation
  # and the rendered docs cannot disagree (see Condukt.Options).

  # The sidecar accepts decide timeouts up to one hour (docs/policy-json.md).
  @max_decide_timeout 3_600_000

  @spec decide() :: Condukt.Options.schema()
  def decide do
    [
      call: [
        type: :any,
        required: true,
        doc: "the decider: one of the four callable shapes."
      ],
      timeout: [
        type: :pos_integer,
        max: @max_decide_timeout,
        default: 5_000,
        doc:
          "milliseconds to wait for the decider; past it the request is " <>
            "denied with reason `:decider_timeout`."
      ],
      cache: [
        type: :boolean,
        default: true,
        doc:
          "memoise definitive answers for the session, each within the scope the decider gives it: " <>
            "by default an `:allow` covers identical requests only and a deny covers the host " <>
            "(see \"Caching\" below)."
      ],
      context_messages: [
        type: :non_neg_integer,
        default: 5,
        doc: "how many recent session messages the decider's context carries."
      ],
      context_metadata: [
        type: :map,
        default: %{},
        doc: "static per-session metadata handed to the decider (tenant, user, purpose)."
      ]
    ]
  end
end
