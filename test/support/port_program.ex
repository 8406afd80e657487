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

  # Asks the program for its version the way Condukt.Native does (stdin
  # and stdout must be pipes); a binary without the command exits 2 with
  # "unknown command".
  defp compute do
    bin = Condukt.egress_binary()

    if File.exists?(bin) do
      port =
        Port.open({:spawn_executable, bin}, [
          :binary,
          {:packet, 4},
          :exit_status,
          :use_stdio,
          :stderr_to_stdout,
          args: ["port"]
        ])

      Port.command(port, :erlang.term_to_binary({:call, 1, {:version}}))
      probe(port, "")
    else
      "#{bin} is not built (make priv/condukt-egress)"
    end
  end

  defp probe(port, out) do
    receive do
      {^port, {:data, data}} ->
        case safe_decode(data) do
          {:reply, 1, {:ok, _}} ->
            Port.close(port)
            nil

          _ ->
            probe(port, out <> data)
        end

      {^port, {:exit_status, status}} ->
        "#{Condukt.egress_binary()} has no working `port` command yet (exit #{status}: #{first_line(out)})"
    after
      5_000 ->
        Port.close(port)
        "#{Condukt.egress_binary()} port did not answer {version} within 5 s"
    end
  end

  defp safe_decode(data) do
    :erlang.binary_to_term(data)
  rescue
    ArgumentError -> nil
  end

  # With {packet, 4}, a stderr line shows up framed oddly; keep it readable.
  defp first_line(out),
    do: out |> String.replace(~r/[^[:print:]\n]/u, "") |> String.trim() |> String.split("\n") |> hd()
end
