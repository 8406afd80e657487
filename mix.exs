defmodule Mix.Tasks.Compile.ConduktEgress do
  @moduledoc false
  # Builds priv/condukt-egress with the project's Makefile, so `mix compile`
  # (and a project that depends on :condukt) gets the native binary.
  use Mix.Task.Compiler

  @impl true
  def run(_args) do
    root = Path.dirname(__ENV__.file)
    make = System.find_executable("make") || Mix.raise("condukt: `make` is not installed")

    case System.cmd(make, ["-C", root, "--no-print-directory", "priv/condukt-egress"], stderr_to_stdout: true) do
      {_out, 0} ->
        {:ok, []}

      {out, status} ->
        Mix.shell().error(out)
        Mix.raise("condukt: building priv/condukt-egress failed (make exited #{status})")
    end
  end
end

defmodule Condukt.MixProject do
  use Mix.Project

  @version "0.1.0"

  # Hex is not reachable on every build machine (our CI has no Hex at all).
  # Offline, :jiffy comes from Debian's erlang-jiffy (already on the code
  # path) and :telemetry from the clearly labelled stand-in under
  # offline/telemetry/. With Hex, users get the real packages.
  # CONDUKT_OFFLINE=1 / 0 forces either mode.
  defp offline? do
    case System.get_env("CONDUKT_OFFLINE") do
      "1" -> true
      "0" -> false
      _ -> not Code.ensure_loaded?(Hex)
    end
  end

  def project do
    [
      app: :condukt,
      version: @version,
      elixir: "~> 1.14",
      start_permanent: Mix.env() == :prod,
      compilers: [:condukt_egress] ++ Mix.compilers(),
      erlc_paths: erlc_paths(),
      elixirc_paths: elixirc_paths(Mix.env()),
      deps: deps(),
      docs: [main: "readme", extras: ["README.md" | Path.wildcard("docs/*.md")]],
      description: "Sandboxes for AI-agent sessions with an egress network policy.",
      package: [files: ~w(lib c_src priv offline docs mix.exs rebar.config Makefile README.md)]
    ]
  end

  def application do
    [
      mod: {Condukt.Application, []},
      extra_applications: [:logger, :crypto] ++ if(offline?(), do: [:jiffy], else: [])
    ]
  end

  defp erlc_paths, do: if(offline?(), do: ["offline/telemetry"], else: [])

  defp elixirc_paths(:test), do: ["lib", "test/support"]
  defp elixirc_paths(_), do: ["lib"]

  defp deps do
    if offline?() do
      []
    else
      [{:telemetry, "~> 1.2"}, {:jiffy, "~> 1.1"}]
    end
  end
end
