defmodule Condukt.Test.Netns.Case do
  @moduledoc false
  # `use Condukt.Test.Netns.Case` in an end-to-end module: tags it `:netns`,
  # gives it a generous timeout, aliases Testbed, Client and Result, and
  # marks every test skipped with the tier's reason when this machine
  # cannot run the tier (test_helper.exs has already printed the reason,
  # or failed the run under CONDUKT_REQUIRE_ALL_TIERS=1). The skip matters
  # for `mix test --only netns`, whose include overrides the exclusion.
  use ExUnit.CaseTemplate

  using do
    quote do
      @moduletag :netns
      @moduletag timeout: 180_000

      if reason = Condukt.Dev.Netns.Tier.skip_reason() do
        @moduletag skip: "netns tier: " <> reason
      end

      alias Condukt.Dev.Netns.{Client, Cmd, Testbed}
      alias Condukt.Dev.Netns.Client.Result
    end
  end
end
