defmodule Condukt.Sandbox.NetworkPolicy.ControlBridge.OptionsTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy.ControlBridge
  alias Condukt.Sandbox.NetworkPolicy.ControlBridge.Options

  @token String.duplicate("ab", 16)

  defp base,
    do: [
      session_id: "s",
      owner: self(),
      policy: [rules: [allow: ["a.test"]]],
      address: "unix:/tmp/x.sock",
      token: @token
    ]

  test "defaults are filled in and the address and policy are normalised" do
    assert {:ok, opts} = Options.validate(base())
    assert opts[:address] == {:unix, "/tmp/x.sock"}
    assert %Condukt.Sandbox.NetworkPolicy{} = opts[:policy]
    assert opts[:backoff] == {200, 10_000}
    assert opts[:attempts] == 10
    assert opts[:window] == 256
    assert opts[:messages] == nil
  end

  test "addresses" do
    assert Options.parse_address("127.0.0.1:15002") == {:tcp, "127.0.0.1", 15002}
    assert Options.parse_address("[::1]:15002") == {:tcp, "::1", 15002}
    assert Options.parse_address("localhost:7") == {:tcp, "localhost", 7}
    assert Options.parse_address({:tcp, "127.0.0.1", 1}) == {:tcp, "127.0.0.1", 1}

    for bad <- ["127.0.0.1", "::1:80", "h:0", "h:70000", "unix:", {:unix, ""}, 42],
        do: assert(Options.parse_address(bad) == :error)
  end

  test "errors name the option and the value" do
    assert {:error, e} = ControlBridge.start(Keyword.put(base(), :token, "XYZ"))

    assert Exception.message(e) =~
             ~s(ControlBridge: expected option :token to be lowercase hex of 32 to 256 digits, got: "XYZ")

    assert {:error, e} = ControlBridge.start(Keyword.put(base(), :atempts, 3))
    assert Exception.message(e) == "ControlBridge: unknown option :atempts (did you mean :attempts?)"

    assert {:ok, opts} = Options.validate(Keyword.put(base(), :attempts, :infinity))
    assert opts[:attempts] == :infinity

    for bad <- [0, -1, :forever, 1.5] do
      assert {:error, e} = ControlBridge.start(Keyword.put(base(), :attempts, bad))
      assert Exception.message(e) =~ "expected option :attempts to be a positive integer or :infinity"
    end

    assert {:error, e} = ControlBridge.start(Keyword.delete(base(), :owner))
    assert Exception.message(e) == "ControlBridge: the option :owner is required"

    assert {:error, e} = ControlBridge.start(Keyword.put(base(), :policy, rules: [allow: []]))
    assert Exception.message(e) =~ "expected option :policy to be a valid network policy"
    assert Exception.message(e) =~ "rule 0 (:allow)"

    assert {:error, e} = ControlBridge.start(Keyword.put(base(), :backoff, {500, 10}))
    assert Exception.message(e) =~ "{initial_ms, max_ms}"
  end

  test "backoff is capped exponential with jitter" do
    for failures <- 0..40 do
      d = min(10_000, 200 * Integer.pow(2, min(failures, 30)))
      b = ControlBridge.backoff(200, 10_000, failures)
      assert b >= div(d, 2) and b <= d
    end
  end
end
