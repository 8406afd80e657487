defmodule Condukt.Sandbox.NetworkPolicy.Decider do
  @moduledoc """
  The behaviour of a `:decide` rule's callable.

  A module decider implements `c:decide/3`; it is named in a policy as the
  module alone (called with `opts = []`) or as `{module, opts}`. A 2-arity
  function and `{module, function}` (called as `module.function(ctx, req)`)
  are the other two accepted shapes.

  The answer becomes the request's decision: `:allow` or `{:deny, reason}`,
  optionally with the scope of the answer, `{:allow, scope: scope}` or
  `{:deny, reason, scope: scope}`, which says which later requests the
  cached answer also decides (`:once`, `:request`, `:path` or `:host`; see
  "Caching" in `Condukt.Sandbox.NetworkPolicy`). Without a scope an allow
  covers identical requests only and a deny covers the host.

  Anything else, a crash, or no answer within the rule's `:timeout` denies
  the request and emits
  `[:condukt, :sandbox, :network_policy, :decider_failure]`.
  """

  alias Condukt.Sandbox.NetworkPolicy.{Context, Request}

  @typedoc "Which later requests a cached answer also decides."
  @type scope :: :once | :request | :path | :host

  @type decision ::
          :allow
          | {:allow, [scope: scope()]}
          | {:deny, reason :: atom() | String.t()}
          | {:deny, reason :: atom() | String.t(), [scope: scope()]}

  @callback decide(Context.t(), Request.t(), opts :: keyword()) :: decision()
end
