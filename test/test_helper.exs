# The :netns end-to-end tier (docs/e2e-testbed.md) runs when this machine
# can run it; otherwise it is excluded with a printed reason, or the run
# fails under CONDUKT_REQUIRE_ALL_TIERS=1.
Condukt.Test.Netns.Tier.configure_exunit()
ExUnit.start()
