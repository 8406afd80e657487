defmodule Condukt.Test.PortProgram do
  @moduledoc false
  # Whether the built condukt-egress has the `port` command (docs/port-protocol.md).
  # Tests that drive the real port program tag themselves `:port_program`
  # and are skipped with this printed reason when it does not: never
  # silently, and CONDUKT_REQUIRE_ALL_TIERS=1 makes a missing port program
  # a failure instead.

  @key {__MODULE__, :check}

  @spec skip_reason() :: String.t() | nil
  def skip_reason do
    case :persistent_term.get(@key, :unset) do
      :unset ->
        reason = compute()
        :persistent_term.put(@key, reason)

        if reason do
          if System.get_env("CONDUKT_REQUIRE_ALL_TIERS") == "1",
            do: raise("the port program is required (CONDUKT_REQUIRE_ALL_TIERS=1): #{reason}")

          IO.puts(:stderr, "port-program tests skipped: #{reason}")
        end

        reason

      reason ->
        reason
    end
  end

  # `condukt-egress port` exits 0 at once on stdin EOF; a binary without
  # the command exits 2 with "unknown command".
  defp compute do
    bin = Condukt.egress_binary()

    cond do
      not File.exists?(bin) ->
        "#{bin} is not built (make priv/condukt-egress)"

      true ->
        case System.cmd("/bin/sh", ["-c", ~s("$0" port </dev/null 2>&1), bin]) do
          {_, 0} ->
            nil

          {out, status} ->
            "#{bin} has no working `port` command yet (exit #{status}: #{String.trim(out) |> String.split("\n") |> hd()})"
        end
    end
  end
end
