defmodule Condukt.Sandbox.Virtual.ContractTest do
  # The behaviour's contract: the same cases, run against Local (in a
  # temporary directory) and against Virtual (in memory). Whatever one
  # backend answers, the other must answer too, so that an agent written
  # against one runs unchanged on the other.
  use ExUnit.Case, async: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.{Error, Local, Virtual}

  @moduletag :tmp_dir
  @moduletag :virtual

  for backend <- [Local, Virtual] do
    describe "#{inspect(backend)}" do
      @describetag backend: backend

      setup %{backend: backend, tmp_dir: dir} do
        {:ok, sb} = new(backend, dir)
        on_exit(fn -> Sandbox.shutdown(sb) end)
        %{sb: sb}
      end

      test "exec: echo hi", %{sb: sb} do
        assert {:ok, %{output: "hi\n", exit_code: 0}} = Sandbox.exec(sb, "echo hi")
      end

      test "exec: the exit code, and stderr merged into the output", %{sb: sb} do
        assert {:ok, %{output: "out\nerr\n", exit_code: 3}} = Sandbox.exec(sb, "echo out; echo err >&2; exit 3")
      end

      test "exec: an unknown command exits 127, a syntax error 2, both with a message", %{sb: sb} do
        assert {:ok, %{exit_code: 127, output: out}} = Sandbox.exec(sb, "no_such_command_here")
        assert out =~ "no_such_command_here"
        assert {:ok, %{exit_code: 2, output: out}} = Sandbox.exec(sb, "if then")
        assert out =~ "syntax error"
      end

      test "exec is stateless: cd, export and variables do not persist, files do", %{sb: sb} do
        assert {:ok, %{exit_code: 0}} =
                 Sandbox.exec(sb, "mkdir -p sub && cd sub && export X=1 && Y=2 && echo kept > f.txt")

        assert {:ok, %{output: "<><>\n"}} = Sandbox.exec(sb, "echo \"<$X><$Y>\"")
        assert {:ok, %{output: "kept\n"}} = Sandbox.exec(sb, "cat sub/f.txt")
        assert {:ok, %{output: "kept\n"}} = Sandbox.exec(sb, "cat f.txt", cwd: "sub")
      end

      test "exec: :env per call", %{sb: sb} do
        assert {:ok, %{output: "v\n"}} = Sandbox.exec(sb, "echo $MY_VAR", env: %{"MY_VAR" => "v"})
      end

      test "exec: a missing :cwd, a NUL command and unknown options are refused", %{sb: sb} do
        assert {:error, %Error{reason: :enoent, op: :exec}} = Sandbox.exec(sb, "true", cwd: "nope")
        assert {:error, %Error{reason: :invalid_command}} = Sandbox.exec(sb, "echo \0")

        assert {:error, %Error{reason: :invalid_option, detail: {:unknown, :timeut, :timeout}}} =
                 Sandbox.exec(sb, "true", timeut: 5)
      end

      test "exec: output past :max_output_bytes is dropped with a marker", %{sb: sb} do
        {:ok, %{output: output}} =
          Sandbox.exec(sb, "for i in 1 2 3 4 5 6 7 8 9 10; do echo 0123456789; done", max_output_bytes: 25)

        assert String.starts_with?(
                 output,
                 "0123456789\n0123456789\n012\n[condukt: output truncated: kept the first 25 bytes"
               )
      end

      test "exec: a command past :timeout ends with :timeout", %{sb: sb} do
        assert {:error, %Error{reason: :timeout, detail: %{timeout: 300}}} = Sandbox.exec(sb, "sleep 5", timeout: 300)
      end

      test "write, read and edit round-trip relative to :cwd", %{sb: sb} do
        assert :ok = Sandbox.write(sb, "a/b/notes.md", "- ship it\n")
        assert {:ok, "- ship it\n"} = Sandbox.read(sb, "a/b/notes.md")
        assert :ok = Sandbox.edit(sb, "a/b/notes.md", "ship it", "ship it today")
        assert {:ok, "- ship it today\n"} = Sandbox.read(sb, "a/b/notes.md")
        assert {:ok, %{output: "- ship it today\n"}} = Sandbox.exec(sb, "cat a/b/notes.md")
      end

      test "files written by a command are read by read/2", %{sb: sb} do
        assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "printf 'x\\ny\\n' > out.txt")
        assert {:ok, "x\ny\n"} = Sandbox.read(sb, "out.txt")
      end

      test "binary content survives a round trip", %{sb: sb} do
        bytes = for i <- 0..255, into: <<>>, do: <<i>>
        assert :ok = Sandbox.write(sb, "bin.dat", bytes)
        assert {:ok, ^bytes} = Sandbox.read(sb, "bin.dat")
      end

      test "read of a missing file, a directory and a NUL path fail cleanly", %{sb: sb} do
        assert {:error, %Error{reason: :enoent, op: :read, path: "missing.txt"}} = Sandbox.read(sb, "missing.txt")
        :ok = Sandbox.write(sb, "d/f", "x")
        assert {:error, %Error{reason: reason, op: :read}} = Sandbox.read(sb, "d")
        assert reason in [:eisdir, :eio, :einval]
        assert {:error, %Error{reason: :invalid_path}} = Sandbox.read(sb, "a\0b")
      end

      test "edit: old_text must occur exactly once", %{sb: sb} do
        :ok = Sandbox.write(sb, "e.txt", "aaa b")
        assert {:error, %Error{reason: :old_text_not_found}} = Sandbox.edit(sb, "e.txt", "zzz", "y")
        assert {:error, %Error{reason: :old_text_not_unique, detail: 2}} = Sandbox.edit(sb, "e.txt", "aa", "y")
        assert {:error, %Error{reason: :empty_old_text}} = Sandbox.edit(sb, "e.txt", "", "y")
        assert {:error, %Error{reason: :enoent}} = Sandbox.edit(sb, "none.txt", "a", "b")
        assert {:ok, "aaa b"} = Sandbox.read(sb, "e.txt")
      end

      test "glob: wildcard semantics relative to :cwd, sorted, dot files hidden", %{sb: sb} do
        for f <- ~w(lib/a.ex lib/b.exs lib/sub/c.ex .hidden/d.ex top.ex), do: :ok = Sandbox.write(sb, f, "x")
        assert {:ok, ["lib/a.ex", "lib/sub/c.ex", "top.ex"]} = Sandbox.glob(sb, "**/*.ex")
        assert {:ok, ["lib/a.ex", "lib/b.exs"]} = Sandbox.glob(sb, "lib/*.{ex,exs}")
        assert {:ok, [".hidden/d.ex" | _]} = Sandbox.glob(sb, "**/*.ex", match_dot: true)
        assert {:ok, ["lib/a.ex"]} = Sandbox.glob(sb, "**/*.ex", max_results: 1)
        assert {:error, %Error{reason: :invalid_pattern}} = Sandbox.glob(sb, "a\0")
      end

      test "grep: path, line number and line, in path order", %{sb: sb} do
        :ok = Sandbox.write(sb, "src/a.txt", "alpha\nbeta\nAlphabet\n")
        :ok = Sandbox.write(sb, "src/b.txt", "gamma alpha\n")
        :ok = Sandbox.write(sb, "src/.h.txt", "alpha\n")

        assert {:ok,
                [
                  %{path: "src/a.txt", line_number: 1, line: "alpha"},
                  %{path: "src/b.txt", line_number: 1, line: "gamma alpha"}
                ]} = Sandbox.grep(sb, "alpha", path: "src")

        assert {:ok, [_, _, _]} = Sandbox.grep(sb, "alpha", path: "src", ignore_case: true)
        assert {:ok, [_, _, _]} = Sandbox.grep(sb, "alpha", path: "src", hidden: true)
        assert {:ok, [%{path: "src/b.txt"}]} = Sandbox.grep(sb, "alpha", path: "src", glob: "b.*")
        assert {:ok, [%{line: "beta", line_number: 2}]} = Sandbox.grep(sb, "^b.t", path: "src/a.txt")
        assert {:ok, []} = Sandbox.grep(sb, "b.t", path: "src/a.txt", literal: true)
        assert {:ok, [_]} = Sandbox.grep(sb, "alpha", path: "src", max_matches: 1)
        assert {:error, %Error{reason: :invalid_pattern}} = Sandbox.grep(sb, "(", path: "src")
        assert {:error, %Error{reason: :enoent}} = Sandbox.grep(sb, "x", path: "nope")
      end
    end
  end

  defp new(Local, dir), do: Sandbox.new({Local, cwd: dir})
  defp new(Virtual, _dir), do: Sandbox.new(Virtual)
end
