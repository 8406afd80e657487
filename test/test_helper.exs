# The :netns end-to-end tier (docs/e2e-testbed.md) runs when this machine
# can run it; otherwise it is excluded with a printed reason, or the run
# fails under CONDUKT_REQUIRE_ALL_TIERS=1.
Condukt.Dev.Netns.Tier.configure_exunit()
# The :kubernetes tier (docs/k8s-tier.md): the same rule, for a real
# control plane and node built by scripts/k8s/binaries.sh.
Condukt.Test.K8s.Tier.configure_exunit()
# The :virtual tier: Condukt.Sandbox.Virtual's NIF (`make virtual-nif`,
# built by `mix compile` when cargo is installed). The same rule again.
with {:error, why} <- Condukt.Sandbox.Virtual.available() do
  if System.get_env("CONDUKT_REQUIRE_ALL_TIERS") == "1",
    do: Mix.raise("the :virtual tier is required (CONDUKT_REQUIRE_ALL_TIERS=1) but cannot run: #{why}")

  IO.puts(:stderr, "virtual tier skipped: #{why}")
  ExUnit.configure(exclude: Enum.uniq([:virtual | Keyword.get(ExUnit.configuration(), :exclude, [])]))
end

# The :llm tier (docs/agents.md): a real local model from
# scripts/setup-llm.sh, skipped with a printed reason when it is missing.
Condukt.Dev.LLM.configure_exunit()
ExUnit.start()
