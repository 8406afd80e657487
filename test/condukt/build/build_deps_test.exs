defmodule Condukt.Build.BuildDepsTest do
  # A user who adds :condukt to a project on a machine that lacks a -dev
  # package gets one line naming the Debian package, not the linker's
  # hundreds of undefined references.
  use ExUnit.Case, async: true

  @root Path.expand("../../..", __DIR__)
  @script Path.join(@root, "scripts/check-build-deps.sh")

  # pkg-config that finds no module at all: every library looks missing.
  @no_pkgs [{"PKG_CONFIG_LIBDIR", "/nonexistent"}, {"PKG_CONFIG_PATH", ""}]

  test "this machine has everything the build and the tests need" do
    assert {"", 0} = System.cmd("sh", [@script, "--test"], stderr_to_stdout: true)
  end

  test "a missing library is named by its Debian package, in one line" do
    {out, status} = System.cmd("sh", [@script], env: @no_pkgs, stderr_to_stdout: true)
    assert status == 1
    assert [line] = String.split(out, "\n", trim: true)

    for pkg <- ~w(libjansson-dev libuv1-dev libssl-dev libwebsockets-dev libyaml-dev libnghttp2-dev) do
      assert line =~ pkg
    end

    assert line =~ "apt-get install"
  end

  test "a missing compiler and erl_interface are named too" do
    env = [{"CC", "condukt-no-such-cc"}, {"EI_DIR", "/nonexistent"}]
    {out, 1} = System.cmd("sh", [@script], env: env, stderr_to_stdout: true)
    assert [line] = String.split(out, "\n", trim: true)
    assert line =~ "gcc"
    assert line =~ "erlang-dev"
    refute line =~ "libssl-dev"
  end

  @tag :tmp_dir
  test "a project depending on :condukt fails with that one line", %{tmp_dir: dir} do
    File.write!(Path.join(dir, "mix.exs"), """
    defmodule BuildDepsUser.MixProject do
      use Mix.Project
      def project, do: [app: :build_deps_user, version: "0.1.0", deps: [{:condukt, path: #{inspect(@root)}}]]
    end
    """)

    # The dependency's build writes under the user's _build only; the
    # native check runs before anything is compiled.
    env = @no_pkgs ++ [{"MIX_ENV", "prod"}, {"MIX_BUILD_PATH", Path.join(dir, "_build")}]
    {out, status} = System.cmd("mix", ["compile"], cd: dir, env: env, stderr_to_stdout: true)
    assert status != 0
    lines = out |> String.split("\n", trim: true) |> Enum.filter(&(&1 =~ "condukt: cannot build"))
    assert [line] = lines
    assert line =~ "libssl-dev"
    refute out =~ "undefined reference"
  end
end
