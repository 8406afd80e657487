defmodule Mix.Tasks.Compile.ConduktEgress do
  @moduledoc false
  # Builds priv/condukt-egress with the project's Makefile, so `mix compile`
  # (and a project that depends on :condukt) gets the native binary.
  use Mix.Task.Compiler

  @impl true
  def run(_args) do
    root = Path.dirname(__ENV__.file)

    make =
      System.find_executable("make") || Mix.raise("condukt: `make` is not installed (Debian: apt-get install make)")

    # One line naming the missing Debian packages, instead of the linker's
    # hundreds of undefined references.
    case System.cmd("sh", [Path.join(root, "scripts/check-build-deps.sh")], stderr_to_stdout: true) do
      {_, 0} -> :ok
      {out, _} -> Mix.raise(String.trim(out))
    end

    target = "priv/condukt-egress"
    args = ["-C", root, "--no-print-directory", "SKIP_DEPS_CHECK=1"]

    # `make -q` exits 0 when the binary is up to date.
    if elem(System.cmd(make, args ++ ["-q", target], stderr_to_stdout: true), 1) != 0 do
      Mix.shell().info("==> condukt: building #{target} (C; about a minute on two cores)")
    end

    jobs = "-j#{System.schedulers_online()}"

    case System.cmd(make, args ++ [jobs, target], stderr_to_stdout: true) do
      {_out, 0} ->
        virtual_nif(make, args)
        {:ok, []}

      {out, status} ->
        Mix.shell().error(out)
        Mix.raise("condukt: building #{target} failed (make exited #{status}); the compiler's output is above")
    end
  end

  # Condukt.Sandbox.Virtual's NIF (Rust), only where cargo is installed.
  # Optional: a failed build is reported and the Virtual sandbox then says
  # :not_available; nothing else depends on it.
  # CONDUKT_VIRTUAL=0 skips it (the demo, which has no use for it, sets
  # that: on a cold cache the crate takes minutes).
  defp virtual_nif(make, args) do
    wanted? = System.get_env("CONDUKT_VIRTUAL") != "0"

    if wanted? and (System.find_executable("cargo") || File.exists?(Path.expand("~/.cargo/bin/cargo"))) do
      if elem(System.cmd(make, args ++ ["-q", "virtual-nif"], stderr_to_stdout: true), 1) != 0,
        do: Mix.shell().info("==> condukt: building priv/condukt_virtual.so (Rust; minutes on a cold cache)")

      case System.cmd(make, args ++ ["virtual-nif"], stderr_to_stdout: true) do
        {_out, 0} ->
          :ok

        {out, status} ->
          Mix.shell().error(
            out <> "\ncondukt: make virtual-nif exited #{status}; Condukt.Sandbox.Virtual is not available"
          )
      end
    end
  end
end

defmodule Condukt.MixProject do
  use Mix.Project

  @version "0.1.0"
  @source_url "https://github.com/tuist/condukt"

  # Hex is not reachable on every build machine (our CI has no Hex at all).
  # Offline, :jiffy comes from Debian's erlang-jiffy (already on the code
  # path) and :telemetry from the clearly labelled stand-in under
  # offline/telemetry/, an OTP application of its own named :telemetry (so
  # a release can never hold two). With Hex, users get the real packages.
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
      elixirc_paths: elixirc_paths(Mix.env()),
      # dev/'s testbed registers its clean-up with ExUnit when a test runs
      # it; in :dev (the demo, the benchmark) ExUnit is not an application.
      xref: [exclude: [ExUnit, ExUnit.Callbacks]],
      deps: deps(),
      name: "Condukt",
      description: "Sandboxes for AI-agent sessions with an egress network policy.",
      source_url: @source_url,
      homepage_url: @source_url,
      docs: docs(),
      package: package()
    ]
  end

  def application do
    [
      mod: {Condukt.Application, []},
      extra_applications: [:logger, :crypto, :inets, :ssl, :public_key] ++ if(offline?(), do: [:jiffy], else: [])
    ]
  end

  # dev/ holds what the demo, the benchmark and the tests share (the
  # network-namespace testbed: Condukt.Dev.*). It is meant to be run, but
  # it is not part of the library: a project that depends on :condukt
  # compiles lib/ only.
  defp elixirc_paths(:test), do: ["lib", "dev", "test/support"]
  defp elixirc_paths(:dev), do: ["lib", "dev"]
  defp elixirc_paths(_), do: ["lib"]

  defp deps do
    if offline?() do
      [{:telemetry, path: "offline/telemetry"}]
    else
      [{:telemetry, "~> 1.2"}, {:jiffy, "~> 1.1"}, {:ex_doc, "~> 0.34", only: :dev, runtime: false}]
    end
  end

  # Hex package: the sources the native build needs (c_src, the Makefile
  # and the dependency check it runs, rebar.config, the Mozilla snapshot in
  # priv) with the Elixir code; the built binary and the tests stay out.
  defp package do
    [
      licenses: ["MIT"],
      links: %{"GitHub" => @source_url, "Changelog" => "#{@source_url}/blob/main/CHANGELOG.md"},
      files:
        ~w(lib c_src offline priv/ca-certificates scripts/check-build-deps.sh docs mix.exs rebar.config Makefile) ++
          ~w(native/condukt_virtual/Cargo.toml native/condukt_virtual/Cargo.lock native/condukt_virtual/src) ++
          ~w(README.md LICENSE CHANGELOG.md)
    ]
  end

  # ex_doc (`mix docs`, with Hex): the guides and reference pages for
  # users, the pages for contributors grouped apart.
  @guides ["docs/guides/getting-started.md", "docs/guides/running-on-kubernetes.md"]
  @reference ~w(docs/sandbox.md docs/virtual.md docs/host-matching.md docs/credentials.md docs/policy-json.md docs/kubernetes.md
                docs/local-network.md docs/trust.md docs/beam-side.md docs/control-channel.md docs/image.md
                docs/telemetry.md)
  @contributing ~w(docs/fuzzing.md docs/e2e-testbed.md docs/k8s-tier.md docs/tracing.md)

  defp docs do
    [
      main: "readme",
      source_ref: "v#{@version}",
      extras:
        ["README.md", "CHANGELOG.md", {"LICENSE", title: "License"}] ++
          @guides ++
          @reference ++ @contributing ++ [{"bench/README.md", filename: "benchmarks", title: "Benchmarks"}],
      groups_for_extras: [
        Guides: @guides,
        Reference: @reference,
        Contributing: @contributing ++ ["bench/README.md"]
      ],
      groups_for_modules: [
        Sandbox: [Condukt, Condukt.Sandbox, Condukt.Sandbox.Local, Condukt.Sandbox.Local.Network],
        "Network policy": [
          Condukt.Sandbox.NetworkPolicy,
          Condukt.Sandbox.NetworkPolicy.Decider,
          Condukt.Sandbox.NetworkPolicy.Context,
          Condukt.Sandbox.NetworkPolicy.Request,
          Condukt.Sandbox.NetworkPolicy.Telemetry,
          Condukt.Sandbox.NetworkPolicy.Credentials,
          Condukt.Sandbox.NetworkPolicy.CA
        ],
        Kubernetes: [
          Condukt.Sandbox.Kubernetes,
          Condukt.Kube,
          Condukt.Kube.Conn,
          Condukt.Sandbox.NetworkPolicy.K8s.Manifests
        ],
        Errors: [
          Condukt.Sandbox.Error,
          Condukt.Sandbox.NetworkPolicy.Error,
          Condukt.Sandbox.Local.NetworkError,
          Condukt.Kube.Error,
          Condukt.Native.Error,
          Condukt.Options.Error
        ],
        Internal: [
          Condukt.Native,
          Condukt.Options,
          Condukt.Sandbox.NetworkPolicy.ControlBridge,
          Condukt.Sandbox.NetworkPolicy.ControlChannelSupervisor,
          Condukt.Sandbox.NetworkPolicy.DecideRuntime,
          Condukt.Sandbox.NetworkPolicy.Host
        ]
      ]
    ]
  end
end
