defmodule Condukt.Sandbox.Virtual.Tools.MountTest do
  # The agent's Mount tool: only inside :agent_mounts, read-write only where
  # allowed, and no way around the bounds with "..", a symbolic link or
  # another sandbox.
  use ExUnit.Case, async: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Virtual
  alias Condukt.Sandbox.Virtual.Tools.Mount

  @moduletag :tmp_dir
  @moduletag :virtual

  setup %{tmp_dir: dir} do
    for d <- ~w(ro/data rw/out secret), do: File.mkdir_p!(Path.join(dir, d))
    File.write!(Path.join(dir, "ro/data/a.txt"), "a\n")
    File.write!(Path.join(dir, "secret/key"), "SECRET-KEY\n")
    File.ln_s!(Path.join(dir, "secret"), Path.join(dir, "ro/link"))

    {:ok, sb} =
      Sandbox.new({Virtual, agent_mounts: [{Path.join(dir, "ro"), :readonly}, {Path.join(dir, "rw"), :readwrite}]})

    %{sb: sb, dir: dir, ctx: %{sandbox: sb, session_id: "s", agent: nil}}
  end

  test "mounts a directory inside an allowed root, read-only by default", %{sb: sb, dir: dir, ctx: ctx} do
    assert {:ok, "mounted " <> _} =
             Condukt.Tool.run(Mount, %{"host_path" => Path.join(dir, "ro/data"), "sandbox_path" => "/data"}, ctx)

    assert {:ok, %{output: "a\n"}} = Sandbox.exec(sb, "cat /data/a.txt")
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "echo x > /data/new.txt")
    assert code != 0
    refute File.exists?(Path.join(dir, "ro/data/new.txt"))
  end

  test "read-write only inside a :readwrite root", %{sb: sb, dir: dir, ctx: ctx} do
    assert {:error, text} =
             Condukt.Tool.run(
               Mount,
               %{"host_path" => Path.join(dir, "ro/data"), "sandbox_path" => "/d", "mode" => "readwrite"},
               ctx
             )

    assert text =~ "read-only"

    assert {:ok, _} =
             Condukt.Tool.run(
               Mount,
               %{"host_path" => Path.join(dir, "rw/out"), "sandbox_path" => "/out", "mode" => "readwrite"},
               ctx
             )

    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "echo made > /out/made.txt")
    assert File.read!(Path.join(dir, "rw/out/made.txt")) == "made\n"
  end

  test "refuses anything outside the roots, through '..' or a symbolic link", %{sb: sb, dir: dir, ctx: ctx} do
    for host <- [Path.join(dir, "secret"), Path.join(dir, "ro/../secret"), Path.join(dir, "ro/link"), "/", "/etc"] do
      assert {:error, text} = Condukt.Tool.run(Mount, %{"host_path" => host, "sandbox_path" => "/x"}, ctx)
      assert text =~ "outside the directories", "#{host}: #{text}"
    end

    assert {:ok, %{output: output}} = Sandbox.exec(sb, "cat /x/key")
    refute output =~ "SECRET-KEY"
  end

  test "a sandbox without :agent_mounts lets the agent mount nothing", %{dir: dir} do
    {:ok, sb} = Sandbox.new(Virtual)
    ctx = %{sandbox: sb, session_id: "s", agent: nil}
    assert {:error, text} = Condukt.Tool.run(Mount, %{"host_path" => Path.join(dir, "ro"), "sandbox_path" => "/x"}, ctx)
    assert text =~ "outside the directories"
  end

  test "other sandboxes answer that mounting is not supported", %{dir: dir} do
    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: dir})
    ctx = %{sandbox: sb, session_id: "s", agent: nil}
    assert {:error, text} = Condukt.Tool.run(Mount, %{"host_path" => dir, "sandbox_path" => "/x"}, ctx)
    assert text =~ "not supported"
    assert text =~ "Condukt.Sandbox.Local"
  end

  test "invalid arguments are refused before anything runs", %{ctx: ctx} do
    assert {:error, "invalid arguments" <> _} = Condukt.Tool.run(Mount, %{"host_path" => "/x"}, ctx)

    assert {:error, "invalid arguments" <> _} =
             Condukt.Tool.run(Mount, %{"host_path" => "/x", "sandbox_path" => "/y", "mode" => "rw"}, ctx)
  end
end
