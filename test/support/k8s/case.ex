defmodule Condukt.Test.K8s.Case do
  @moduledoc false
  # `use Condukt.Test.K8s.Case` in a `:kubernetes` tier module: tags it,
  # gives it a generous timeout, and marks every test skipped with the
  # tier's reason when this machine cannot run the tier (test_helper.exs
  # has printed the reason, or failed the run under
  # CONDUKT_REQUIRE_ALL_TIERS=1); the skip matters for `mix test --only
  # kubernetes`, whose include overrides the exclusion.
  use ExUnit.CaseTemplate

  using do
    quote do
      @moduletag :kubernetes
      @moduletag timeout: 300_000

      if reason = Condukt.Test.K8s.Tier.skip_reason() do
        @moduletag skip: "kubernetes tier: " <> reason
      end

      alias Condukt.Test.K8s.Cluster
    end
  end
end
