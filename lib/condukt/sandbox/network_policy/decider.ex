defmodule Condukt.Sandbox.NetworkPolicy.Decider do
  @moduledoc """
  The behaviour of a `:decide` rule's callable.

  A module decider implements `c:decide/3`; it is named in a policy as the
  module alone (called with `opts = []`) or as `{module, opts}`. A 2-arity
  function and `{module, function}` (called as `module.function(ctx, req)`)
  are the other two accepted shapes.

  The answer becomes the request's decision. Anything other than `:allow`
  or `{:deny, reason}`, a crash, or no answer within the rule's `:timeout`
  denies the request and emits
  `[:condukt, :sandbox, :network_policy, :decider_failure]`.
  """

  alias Condukt.Sandbox.NetworkPolicy.{Context, Request}

  @type decision :: :allow | {:deny, reason :: atom() | String.t()}

  @callback decide(Context.t(), Request.t(), opts :: keyword()) :: decision()
end
