defmodule Condukt.ToolsTest do
  # The built-in tools against a Local sandbox in a scratch directory.
  use ExUnit.Case, async: true

  alias Condukt.{Sandbox, Tool, Tools}

  @moduletag :tmp_dir

  setup %{tmp_dir: dir} do
    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: dir})
    %{ctx: %{sandbox: sb, session_id: "t", agent: nil}, dir: dir}
  end

  test "coding_tools/0 are six tools with unique names and object schemas" do
    names = Enum.map(Tools.coding_tools(), & &1.name())
    assert names == ~w(Read Write Edit Bash Glob Grep)

    for tool <- Tools.coding_tools() do
      spec = Tool.spec(tool)
      assert spec.parameters["type"] == "object"
      assert is_binary(spec.description)
    end
  end

  test "Write, Read, Edit round trip through the sandbox", %{ctx: ctx, dir: dir} do
    assert {:ok, "wrote 13 bytes to a/b.txt"} =
             Tool.run(Tools.Write, %{"path" => "a/b.txt", "content" => "one\ntwo\nthree"}, ctx)

    assert File.read!(Path.join(dir, "a/b.txt")) == "one\ntwo\nthree"
    assert {:ok, "one\ntwo\nthree"} = Tool.run(Tools.Read, %{"path" => "a/b.txt"}, ctx)

    assert {:ok, "two\n[condukt: shown up to line 2 of 3]"} =
             Tool.run(Tools.Read, %{"path" => "a/b.txt", "offset" => 2, "limit" => 1}, ctx)

    assert {:ok, "edited a/b.txt"} =
             Tool.run(Tools.Edit, %{"path" => "a/b.txt", "old_text" => "two", "new_text" => "2"}, ctx)

    assert File.read!(Path.join(dir, "a/b.txt")) == "one\n2\nthree"
  end

  test "Bash answers output and exit code; a failing command is still a result", %{ctx: ctx} do
    assert {:ok, "hi\n[exit code: 0]"} = Tool.run(Tools.Bash, %{"command" => "echo hi"}, ctx)
    assert {:ok, "oops\n[exit code: 3]"} = Tool.run(Tools.Bash, %{"command" => "echo oops >&2; exit 3"}, ctx)
    assert {:error, msg} = Tool.run(Tools.Bash, %{"command" => "sleep 5", "timeout" => 100}, ctx)
    assert msg =~ "timed out"
  end

  test "Glob and Grep", %{ctx: ctx, dir: dir} do
    File.mkdir_p!(Path.join(dir, "lib"))
    File.write!(Path.join(dir, "lib/a.ex"), "defmodule A do\nend\n")
    File.write!(Path.join(dir, "lib/b.ex"), "defmodule B do\nend\n")
    assert {:ok, "lib/a.ex\nlib/b.ex"} = Tool.run(Tools.Glob, %{"pattern" => "lib/*.ex"}, ctx)
    assert {:ok, "(no files match *.rs)"} = Tool.run(Tools.Glob, %{"pattern" => "*.rs"}, ctx)
    assert {:ok, out} = Tool.run(Tools.Grep, %{"pattern" => "defmodule B"}, ctx)
    assert out =~ "lib/b.ex:1: defmodule B do"
    assert {:ok, "(no matches)"} = Tool.run(Tools.Grep, %{"pattern" => "nothing here"}, ctx)
  end

  test "errors become tool results the model can act on", %{ctx: ctx} do
    assert {:error, msg} = Tool.run(Tools.Read, %{"path" => "missing.txt"}, ctx)
    assert msg =~ "missing.txt"
    assert {:error, msg} = Tool.run(Tools.Read, %{"file" => "x"}, ctx)
    assert msg =~ "invalid arguments"
    assert msg =~ "missing required property \"path\""
    assert {:error, msg} = Tool.run(Tools.Edit, %{"path" => "missing.txt", "old_text" => "a", "new_text" => "b"}, ctx)
    assert msg =~ "could not edit"
    assert {:error, msg} = Tool.run(Tools.Grep, %{"pattern" => "("}, ctx)
    assert msg =~ "invalid pattern"
  end

  defmodule Raising do
    use Condukt.Tool
    def name, do: "Raising"
    def description, do: "raises"
    def parameters, do: %{type: "object"}
    def call(_args, _ctx), do: raise("kaboom")
  end

  test "a raising tool is an error result, not a crash", %{ctx: ctx} do
    assert {:error, "the tool raised: kaboom"} = Tool.run(Raising, %{}, ctx)
  end
end
