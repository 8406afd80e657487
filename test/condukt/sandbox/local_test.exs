defmodule Condukt.Sandbox.LocalTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.{Error, Local, NetworkPolicy}

  @moduletag :tmp_dir

  # File names a shell would mangle; Local must treat them as plain bytes.
  @hostile_names [
    "with space.txt",
    ~s(it's "quoted".txt),
    "$(touch pwned).txt",
    "`touch pwned`.txt",
    "line\nbreak.txt",
    "-rf",
    "--help.txt",
    "semi;colon|pipe&amp>redirect.txt",
    "star*question?[bracket].txt",
    "tab\tand\\backslash.txt",
    "ünïcödé.txt"
  ]

  setup %{tmp_dir: dir} do
    {:ok, sb} = Sandbox.new({Local, cwd: dir})
    on_exit(fn -> refute File.exists?(Path.join(dir, "pwned")), "a name or pattern reached a shell" end)
    %{sb: sb, dir: dir}
  end

  # /proc/PID/stat exists until the process is reaped; the PID 1 of a
  # container may never reap an orphan, so a zombie (state Z) counts as dead.
  defp dead?(pid) do
    case File.read("/proc/#{pid}/stat") do
      {:error, :enoent} -> true
      {:ok, stat} -> stat |> String.split(") ") |> List.last() |> String.starts_with?("Z")
    end
  end

  defp assert_dead(pid, tries \\ 100) do
    cond do
      dead?(pid) -> :ok
      tries == 0 -> flunk("process #{pid} is still alive")
      true -> Process.sleep(20) && assert_dead(pid, tries - 1)
    end
  end

  defp read_pid!(path) do
    Enum.reduce_while(1..250, nil, fn _, _ ->
      case File.read(path) do
        {:ok, text} when text != "" -> {:halt, String.trim(text)}
        _ -> Process.sleep(20) && {:cont, nil}
      end
    end) || flunk("#{path} was never written")
  end

  describe "init" do
    test "defaults :cwd to the BEAM's current directory" do
      {:ok, sb} = Sandbox.new(Local)
      assert sb.state.cwd == File.cwd!()
    end

    test "expands a relative :cwd", %{dir: dir} do
      File.mkdir_p!(Path.join(dir, "sub"))
      {:ok, sb} = Sandbox.new(Local, cwd: Path.relative_to_cwd(Path.join(dir, "sub")))
      assert sb.state.cwd == Path.join(dir, "sub")
    end

    test "refuses unknown options with a suggestion" do
      assert {:error, %Error{reason: :invalid_option, op: :new} = e} = Sandbox.new(Local, cwdd: "/tmp")
      assert Exception.message(e) == "could not start the sandbox: unknown option :cwdd (did you mean :cwd?)"

      assert {:error, %Error{reason: :invalid_option} = e} = Sandbox.new(Local, timeout: 0)
      assert Exception.message(e) =~ "expected the option :timeout to be a positive integer, got: 0"

      assert {:error, %Error{reason: :invalid_option}} = Sandbox.new(Local, env: %{"A=B" => "x"})
    end

    test "refuses a :cwd that is not a directory", %{dir: dir} do
      missing = Path.join(dir, "missing")
      assert {:error, %Error{reason: :enoent, path: ^missing} = e} = Sandbox.new(Local, cwd: missing)
      assert Exception.message(e) =~ missing

      File.write!(Path.join(dir, "file"), "")
      assert {:error, %Error{reason: :enotdir}} = Sandbox.new(Local, cwd: Path.join(dir, "file"))
    end

    test "accepts the session :id" do
      assert {:ok, %Sandbox{state: %Local{id: "job-42"}}} = Sandbox.new({Local, id: "job-42"})
    end

    test "validates and keeps :network_policy", %{dir: dir} do
      {:ok, sb} = Sandbox.new(Local, cwd: dir, network_policy: [rules: [allow: ["api.github.com"]]])
      assert %NetworkPolicy{rules: [allow: ["api.github.com"]], default: :deny} = sb.state.network_policy

      {:ok, sb} = Sandbox.new(Local, cwd: dir)
      assert sb.state.network_policy == nil

      assert {:error, %Error{reason: :invalid_network_policy, detail: %NetworkPolicy.Error{}} = e} =
               Sandbox.new(Local, network_policy: [rules: [allow: []]])

      assert Exception.message(e) =~ "host list is empty"
    end
  end

  describe "read, write, edit" do
    test "round-trip relative to :cwd", %{sb: sb, dir: dir} do
      assert :ok = Sandbox.write(sb, "a.txt", "one\ntwo\n")
      assert File.read!(Path.join(dir, "a.txt")) == "one\ntwo\n"
      assert {:ok, "one\ntwo\n"} = Sandbox.read(sb, "a.txt")
      assert {:ok, "one\ntwo\n"} = Sandbox.read(sb, Path.join(dir, "a.txt"))
      assert :ok = Sandbox.edit(sb, "a.txt", "two", "2")
      assert {:ok, "one\n2\n"} = Sandbox.read(sb, "a.txt")
    end

    test "handle names with shell metacharacters, newlines and leading dashes", %{sb: sb, dir: dir} do
      for name <- @hostile_names do
        path = Path.join("dir with space/-sub", name)
        assert :ok = Sandbox.write(sb, path, "hello #{name}\n"), inspect(name)
        assert {:ok, "hello " <> _} = Sandbox.read(sb, path)
        assert :ok = Sandbox.edit(sb, path, "hello", "bye")
        assert File.read!(Path.join([dir, path])) == "bye #{name}\n"
      end
    end

    test "read of a missing file names the path", %{sb: sb} do
      assert {:error, %Error{reason: :enoent, op: :read, path: "no/such file.txt"} = e} =
               Sandbox.read(sb, "no/such file.txt")

      assert Exception.message(e) == ~s[could not read "no/such file.txt": no such file or directory (enoent)]
    end

    test "read of a directory and of a NUL path fail cleanly", %{sb: sb, dir: dir} do
      File.mkdir_p!(Path.join(dir, "d"))
      assert {:error, %Error{reason: :eisdir}} = Sandbox.read(sb, "d")
      assert {:error, %Error{reason: :invalid_path} = e} = Sandbox.read(sb, "a\0b")
      assert Exception.message(e) =~ "NUL"
      assert {:error, %Error{reason: :invalid_path}} = Sandbox.write(sb, "a\0b", "x")
    end

    test "write creates parent directories and leaves no temporary file", %{sb: sb, dir: dir} do
      assert :ok = Sandbox.write(sb, "deep/er/still/f.txt", "x")
      assert File.read!(Path.join(dir, "deep/er/still/f.txt")) == "x"
      assert File.ls!(Path.join(dir, "deep/er/still")) == ["f.txt"]
      assert :ok = Sandbox.write(sb, "deep/er/still/f.txt", "y")
      assert File.ls!(Path.join(dir, "deep/er/still")) == ["f.txt"]
    end

    test "write keeps permission bits and symbolic links", %{sb: sb, dir: dir} do
      script = Path.join(dir, "run.sh")
      File.write!(script, "#!/bin/sh\n")
      File.chmod!(script, 0o750)
      assert :ok = Sandbox.write(sb, "run.sh", "#!/bin/sh\necho hi\n")
      assert Bitwise.band(File.stat!(script).mode, 0o777) == 0o750

      File.ln_s!("run.sh", Path.join(dir, "link.sh"))
      assert :ok = Sandbox.edit(sb, "link.sh", "echo hi", "echo bye")
      assert {:ok, "run.sh"} = File.read_link(Path.join(dir, "link.sh"))
      assert File.read!(script) =~ "echo bye"
    end

    test "write onto a directory fails and cleans up", %{sb: sb, dir: dir} do
      File.mkdir_p!(Path.join(dir, "d"))
      assert {:error, %Error{op: :write, path: "d"}} = Sandbox.write(sb, "d", "x")
      assert File.ls!(dir) == ["d"]
    end

    test "edit fails unless old_text occurs exactly once, naming the count", %{sb: sb, dir: dir} do
      File.write!(Path.join(dir, "e.txt"), "foo foo foo\n")

      assert {:error, %Error{reason: :old_text_not_unique, detail: 3} = e} = Sandbox.edit(sb, "e.txt", "foo", "bar")
      assert Exception.message(e) =~ ~s[could not edit "e.txt": old_text occurs 3 times]

      assert {:error, %Error{reason: :old_text_not_found} = e} = Sandbox.edit(sb, "e.txt", "baz", "bar")
      assert Exception.message(e) =~ "was not found"

      assert {:error, %Error{reason: :empty_old_text}} = Sandbox.edit(sb, "e.txt", "", "bar")
      assert {:error, %Error{reason: :enoent, op: :edit, path: "nope.txt"}} = Sandbox.edit(sb, "nope.txt", "a", "b")
      assert File.read!(Path.join(dir, "e.txt")) == "foo foo foo\n"
    end

    test "edit counts overlapping occurrences", %{sb: sb, dir: dir} do
      File.write!(Path.join(dir, "o.txt"), "aaa")
      assert {:error, %Error{reason: :old_text_not_unique, detail: 2}} = Sandbox.edit(sb, "o.txt", "aa", "b")
    end
  end

  describe "exec" do
    test "returns output and exit code, stderr merged", %{sb: sb} do
      assert {:ok, %{output: "hi\n", exit_code: 0}} = Sandbox.exec(sb, "echo hi")
      assert {:ok, %{output: "out\nerr\n", exit_code: 3}} = Sandbox.exec(sb, "echo out; echo err >&2; exit 3")
      assert {:ok, %{exit_code: 127}} = Sandbox.exec(sb, "definitely-not-a-command-xyz")
      assert {:ok, %{exit_code: 137}} = Sandbox.exec(sb, "kill -KILL $$")
    end

    test "runs in :cwd and is stateless", %{sb: sb, dir: dir} do
      File.mkdir_p!(Path.join(dir, "sub"))
      assert {:ok, %{output: out}} = Sandbox.exec(sb, "pwd")
      assert String.trim(out) == dir

      assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "cd sub && export FOO=1 && BAR=2")
      assert {:ok, %{output: out}} = Sandbox.exec(sb, ~s[pwd; echo "${FOO:-unset} ${BAR:-unset}"])
      assert out == "#{dir}\nunset unset\n"
    end

    test "honours :cwd and :env per call, over the sandbox's :env", %{dir: dir} do
      File.mkdir_p!(Path.join(dir, "sub dir"))
      {:ok, sb} = Sandbox.new(Local, cwd: dir, env: %{"CONDUKT_A" => "sandbox", "CONDUKT_B" => "sandbox"})

      assert {:ok, %{output: out}} =
               Sandbox.exec(sb, ~s[pwd; echo "$CONDUKT_A ${CONDUKT_B:-unset} $CONDUKT_C"],
                 cwd: "sub dir",
                 env: [{"CONDUKT_A", "call"}, {"CONDUKT_B", nil}, {"CONDUKT_C", "c"}]
               )

      assert out == "#{dir}/sub dir\ncall unset c\n"
    end

    test "reads /dev/null on stdin", %{sb: sb} do
      assert {:ok, %{output: "", exit_code: 0}} = Sandbox.exec(sb, "cat", timeout: 5_000)
    end

    test "refuses a missing :cwd, a NUL command and unknown options", %{sb: sb} do
      assert {:error, %Error{reason: :enoent, op: :exec, path: "nope"} = e} = Sandbox.exec(sb, "true", cwd: "nope")
      assert Exception.message(e) =~ ~s[could not run the command in "nope"]
      assert {:error, %Error{reason: :invalid_command}} = Sandbox.exec(sb, "echo \0")
      assert {:error, %Error{reason: :invalid_option} = e} = Sandbox.exec(sb, "true", timout: 5)
      assert Exception.message(e) =~ "did you mean :timeout?"
    end

    test "caps the output with a marker", %{sb: sb} do
      assert {:ok, %{output: out, exit_code: 0}} =
               Sandbox.exec(sb, "head -c 100000 /dev/zero | tr '\\0' a", max_output_bytes: 1_000)

      assert out ==
               String.duplicate("a", 1_000) <>
                 "\n[condukt: output truncated: kept the first 1000 bytes, dropped 99000 more]\n"
    end

    test "a timeout kills the command and its children", %{sb: sb, dir: dir} do
      started = System.monotonic_time(:millisecond)

      assert {:error, %Error{reason: :timeout, op: :exec, detail: %{timeout: 300, output: "started\n"}} = e} =
               Sandbox.exec(sb, "sleep 100 & echo $! > child.pid; echo started; trap '' TERM; sleep 100", timeout: 300)

      assert System.monotonic_time(:millisecond) - started < 5_000
      assert Exception.message(e) =~ "timed out after 300 ms"
      assert_dead(read_pid!(Path.join(dir, "child.pid")))
    end

    test "background children die when the command exits", %{sb: sb, dir: dir} do
      started = System.monotonic_time(:millisecond)
      assert {:ok, %{output: "", exit_code: 0}} = Sandbox.exec(sb, "sleep 100 & echo $! > bg.pid")
      assert System.monotonic_time(:millisecond) - started < 5_000
      assert_dead(read_pid!(Path.join(dir, "bg.pid")))
    end

    test "the command dies with the process that called exec", %{sb: sb, dir: dir} do
      caller = spawn(fn -> Sandbox.exec(sb, "echo $$ > cmd.pid; sleep 100 & echo $! > child.pid; wait") end)
      child = read_pid!(Path.join(dir, "child.pid"))
      command = read_pid!(Path.join(dir, "cmd.pid"))
      Process.exit(caller, :kill)
      assert_dead(child)
      assert_dead(command)
    end

    test "leaves no port messages in a caller that traps exits", %{sb: sb} do
      Process.flag(:trap_exit, true)
      assert {:ok, _} = Sandbox.exec(sb, "true")
      refute_receive _, 100
    end
  end

  describe "glob" do
    setup %{dir: dir} do
      for path <- ["a.ex", "b.exs", "lib/c.ex", "lib/deep/d.ex", ".hidden.ex", ".git/e.ex"] do
        File.mkdir_p!(Path.dirname(Path.join(dir, path)))
        File.write!(Path.join(dir, path), "")
      end

      :ok
    end

    test "has Path.wildcard semantics relative to :cwd", %{sb: sb, dir: dir} do
      assert {:ok, ["a.ex", "lib/c.ex", "lib/deep/d.ex"]} = Sandbox.glob(sb, "**/*.ex")
      assert {:ok, ["a.ex", "b.exs"]} = Sandbox.glob(sb, "*.{ex,exs}")

      assert {:ok, [".git/e.ex", ".hidden.ex", "a.ex", "lib/c.ex", "lib/deep/d.ex"]} =
               Sandbox.glob(sb, "**/*.ex", match_dot: true)

      assert {:ok, [".hidden.ex"]} = Sandbox.glob(sb, ".hidden.ex")
      assert {:ok, ["a.ex"]} = Sandbox.glob(sb, "a.ex", max_results: 1)
      assert {:ok, ["a.ex", "b.exs"]} = Sandbox.glob(sb, "*.ex*", max_results: 2)
      assert {:ok, [abs]} = Sandbox.glob(sb, Path.join(dir, "lib/*.ex"))
      assert abs == Path.join(dir, "lib/c.ex")
      assert {:ok, []} = Sandbox.glob(sb, "nothing-*")
    end

    test "matches hostile names and is safe for any pattern", %{sb: sb} do
      for name <- @hostile_names, do: :ok = Sandbox.write(sb, "h/" <> name, "")

      assert {:ok, found} = Sandbox.glob(sb, "h/*")
      assert Enum.sort(found) == Enum.sort(Enum.map(@hostile_names, &("h/" <> &1)))

      for pattern <- [
            "$(touch pwned)*",
            "`touch pwned`",
            "; touch pwned",
            "h/$(touch pwned).txt",
            "| touch pwned",
            "-rf"
          ] do
        assert {:ok, _} = Sandbox.glob(sb, pattern), inspect(pattern)
      end

      assert {:ok, ["h/$(touch pwned).txt"]} = Sandbox.glob(sb, "h/$(touch pwned).txt")
      assert {:error, %Error{reason: :invalid_pattern, op: :glob}} = Sandbox.glob(sb, "{a")
      assert {:error, %Error{reason: :invalid_pattern}} = Sandbox.glob(sb, "a\0b")
    end
  end

  describe "grep" do
    setup %{dir: dir} do
      files = %{
        "lib/a.ex" => "defmodule A do\n  def hello, do: :world\nend\n",
        "lib/b.ex" => "defmodule B do\n  # Hello again\nend\n",
        "notes with space/-n.txt" => "hello from a dash file\r\n",
        ".secret/x.txt" => "hello hidden\n",
        "bin.dat" => "hello\0binary"
      }

      for {path, content} <- files do
        File.mkdir_p!(Path.dirname(Path.join(dir, path)))
        File.write!(Path.join(dir, path), content)
      end

      :ok
    end

    test "returns path, line number and line, in path order", %{sb: sb} do
      assert {:ok, matches} = Sandbox.grep(sb, "hello")

      assert matches == [
               %{path: "lib/a.ex", line_number: 2, line: "  def hello, do: :world"},
               %{path: "notes with space/-n.txt", line_number: 1, line: "hello from a dash file"}
             ]
    end

    test "supports regexes, literals, case folding, hidden files and globs", %{sb: sb} do
      assert {:ok, [%{path: "lib/a.ex"}, %{path: "lib/b.ex"}]} = Sandbox.grep(sb, "^defmodule [AB] do$")
      assert {:ok, [_, _, _]} = Sandbox.grep(sb, "hello", ignore_case: true)
      assert {:ok, [%{path: "lib/a.ex", line_number: 2}]} = Sandbox.grep(sb, "hello, do:", literal: true)
      assert {:ok, []} = Sandbox.grep(sb, "hello.", literal: true)
      assert {:ok, [%{line: "  # Hello again"}]} = Sandbox.grep(sb, "HELLO AGAIN", literal: true, ignore_case: true)
      assert {:ok, [%{path: ".secret/x.txt"}, _, _]} = Sandbox.grep(sb, "hello", hidden: true)
      assert {:ok, [%{path: "lib/a.ex"}]} = Sandbox.grep(sb, "hello", glob: "**/*.ex")
    end

    test "searches one file or one directory given by :path", %{sb: sb} do
      assert {:ok, [%{path: "lib/b.ex", line_number: 1}]} = Sandbox.grep(sb, "B", path: "lib/b.ex")
      assert {:ok, [%{path: "lib/a.ex"}, %{path: "lib/b.ex"}]} = Sandbox.grep(sb, "^end", path: "lib")

      assert {:ok, [%{path: "notes with space/-n.txt"}]} = Sandbox.grep(sb, "dash", path: "notes with space/-n.txt")
    end

    test "is bounded by :max_matches", %{sb: sb, dir: dir} do
      File.write!(Path.join(dir, "many.txt"), String.duplicate("x\n", 5_000))
      assert {:ok, matches} = Sandbox.grep(sb, "x", max_matches: 10, path: "many.txt")
      assert length(matches) == 10
      assert List.last(matches).line_number == 10
    end

    test "is safe for any pattern and path", %{sb: sb} do
      for name <- @hostile_names, do: :ok = Sandbox.write(sb, "h/" <> name, "needle in #{name}\n")

      assert {:ok, matches} = Sandbox.grep(sb, "needle", path: "h")
      assert Enum.sort(Enum.map(matches, & &1.path)) == Enum.sort(Enum.map(@hostile_names, &("h/" <> &1)))

      for pattern <- ["$(touch pwned)", "`touch pwned`", "-e", "--help", "'; touch pwned; '"] do
        assert {:ok, _} = Sandbox.grep(sb, pattern, literal: true), inspect(pattern)
      end

      assert {:ok, [_]} = Sandbox.grep(sb, "needle", path: "h/$(touch pwned).txt")
      assert {:ok, [_]} = Sandbox.grep(sb, "needle", path: "h/-rf")
    end

    test "reports a bad regex and a missing path", %{sb: sb} do
      assert {:error, %Error{reason: :invalid_pattern, op: :grep, path: "("} = e} = Sandbox.grep(sb, "(")
      assert Exception.message(e) =~ "missing )"

      assert {:error, %Error{reason: :enoent, op: :grep, path: "nope dir"} = e} =
               Sandbox.grep(sb, "x", path: "nope dir")

      assert Exception.message(e) =~ ~s["nope dir"]
    end
  end

  test "mount is not supported", %{sb: sb} do
    assert {:error, :not_supported} = Sandbox.mount(sb, "/tmp", "/workspace")
    refute Sandbox.supports?(sb, :mount)
    assert Sandbox.supports?(sb, :glob) and Sandbox.supports?(sb, :grep)
  end

  test "shutdown", %{sb: sb} do
    assert :ok = Sandbox.shutdown(sb)
  end
end
