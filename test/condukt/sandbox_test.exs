defmodule Condukt.SandboxTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Error

  # A sandbox with only the required callbacks. Its state is the test
  # process, to which every call reports; the path (or command) chooses
  # how the callback answers, so one module exercises every return shape.
  defmodule Minimal do
    use Condukt.Sandbox

    @impl true
    def init(opts) do
      case opts[:fail] do
        nil -> {:ok, %{test: opts[:test], opts: opts}}
        :raise -> raise "init exploded"
        :bad_return -> :ok
        reason -> {:error, reason}
      end
    end

    @impl true
    def read_file(state, path), do: answer(state, {:read, path}, path, {:ok, "content of " <> path})

    @impl true
    def write_file(state, path, content), do: answer(state, {:write, path, content}, path, :ok)

    @impl true
    def edit_file(state, path, old, new), do: answer(state, {:edit, path, old, new}, path, :ok)

    @impl true
    def exec(state, command, opts),
      do: answer(state, {:exec, command, opts}, command, {:ok, %{output: "ran " <> command, exit_code: 0}})

    defp answer(%{test: test}, call, key, ok) do
      send(test, call)

      case key do
        "enoent" -> {:error, :enoent}
        "string error" -> {:error, "the backend said no"}
        "tuple error" -> {:error, {:http, 503}}
        "error struct" -> {:error, %Error{reason: :eacces}}
        "raise" -> raise ArgumentError, "kaboom"
        "bad return" -> {:weird, :shape}
        _ -> ok
      end
    end
  end

  # A sandbox that also implements every optional callback and shutdown/1.
  defmodule Full do
    @behaviour Condukt.Sandbox

    @impl true
    def init(opts), do: {:ok, opts[:test]}
    @impl true
    def shutdown(test), do: send(test, :shutdown) && :ok
    @impl true
    def read_file(_test, _path), do: {:ok, ""}
    @impl true
    def write_file(_test, _path, _content), do: :ok
    @impl true
    def edit_file(_test, _path, _old, _new), do: :ok
    @impl true
    def exec(_test, _command, _opts), do: {:ok, %{output: "", exit_code: 0}}
    @impl true
    def glob(test, pattern, opts), do: send(test, {:glob, pattern, opts}) && {:ok, ["a.ex"]}

    @impl true
    def grep(test, pattern, opts),
      do: send(test, {:grep, pattern, opts}) && {:ok, [%{path: "a.ex", line_number: 1, line: pattern}]}

    @impl true
    def mount(test, host, path), do: send(test, {:mount, host, path}) && :ok
  end

  defmodule HalfDone do
    def init(_opts), do: {:ok, nil}
    def read_file(_, _), do: {:ok, ""}
  end

  defp minimal!(opts \\ []) do
    {:ok, sb} = Sandbox.new({Minimal, Keyword.put(opts, :test, self())})
    sb
  end

  describe "new/2" do
    test "takes a module with options, or {module, options}" do
      assert {:ok, %Sandbox{module: Minimal, state: %{opts: opts}}} = Sandbox.new(Minimal, test: self(), a: 1)
      assert opts[:a] == 1
      assert {:ok, %Sandbox{module: Minimal, state: %{opts: opts}}} = Sandbox.new({Minimal, a: 2})
      assert opts[:a] == 2
    end

    test "options in the spec win over the extra options" do
      {:ok, sb} = Sandbox.new({Minimal, id: "pinned"}, id: "session", other: :default)
      assert sb.state.opts[:id] == "pinned"
      assert sb.state.opts[:other] == :default
    end

    test "refuses what is not a sandbox, naming what is missing" do
      assert {:error, %Error{reason: :invalid_sandbox, op: :new} = e} = Sandbox.new(HalfDone)
      assert Exception.message(e) =~ "does not implement the Condukt.Sandbox behaviour"
      assert Exception.message(e) =~ "write_file/3"
      assert Exception.message(e) =~ "exec/3"

      assert {:error, %Error{reason: :invalid_sandbox} = e} = Sandbox.new(No.Such.Module)
      assert Exception.message(e) =~ "No.Such.Module is not an available module"

      assert {:error, %Error{reason: :invalid_sandbox}} = Sandbox.new("Local")
      assert {:error, %Error{reason: :invalid_sandbox}} = Sandbox.new({Minimal, :not_a_list})
    end

    test "normalises init failures" do
      assert {:error, %Error{reason: :boom, op: :new}} = Sandbox.new(Minimal, fail: :boom)
      assert {:error, %Error{reason: :exception, op: :new} = e} = Sandbox.new(Minimal, fail: :raise)
      assert Exception.message(e) =~ "init exploded"
      assert {:error, %Error{reason: :bad_return, detail: :ok}} = Sandbox.new(Minimal, fail: :bad_return)
    end
  end

  describe "the required operations" do
    test "route to the callbacks" do
      sb = minimal!()

      assert {:ok, "content of a.txt"} = Sandbox.read(sb, "a.txt")
      assert_received {:read, "a.txt"}

      assert :ok = Sandbox.write(sb, "b.txt", "hello")
      assert_received {:write, "b.txt", "hello"}

      assert :ok = Sandbox.edit(sb, "b.txt", "hello", "bye")
      assert_received {:edit, "b.txt", "hello", "bye"}

      assert {:ok, %{output: "ran ls", exit_code: 0}} = Sandbox.exec(sb, "ls", timeout: 5)
      assert_received {:exec, "ls", [timeout: 5]}

      assert {:ok, _} = Sandbox.exec(sb, "pwd")
      assert_received {:exec, "pwd", []}
    end

    test "shutdown/1 calls the callback; `use Condukt.Sandbox` provides a default" do
      assert :ok = Sandbox.shutdown(minimal!())

      {:ok, sb} = Sandbox.new(Full, test: self())
      assert :ok = Sandbox.shutdown(sb)
      assert_received :shutdown
    end
  end

  describe "errors are normalised at the boundary" do
    test "an atom becomes the reason, with the operation and path" do
      assert {:error, %Error{reason: :enoent, op: :read, path: "enoent"} = e} = Sandbox.read(minimal!(), "enoent")
      assert Exception.message(e) == ~s[could not read "enoent": no such file or directory (enoent)]
    end

    test "other terms are kept in :detail under reason :backend" do
      assert {:error, %Error{reason: :backend, op: :write, detail: "the backend said no"} = e} =
               Sandbox.write(minimal!(), "string error", "")

      assert Exception.message(e) == ~s[could not write "string error": the backend said no]

      assert {:error, %Error{reason: :backend, detail: {:http, 503}}} =
               Sandbox.edit(minimal!(), "tuple error", "a", "b")
    end

    test "an Error struct is kept, with the operation and path filled in" do
      assert {:error, %Error{reason: :eacces, op: :read, path: "error struct"}} =
               Sandbox.read(minimal!(), "error struct")
    end

    test "a raising callback becomes reason :exception" do
      assert {:error, %Error{reason: :exception, op: :exec, detail: %ArgumentError{}} = e} =
               Sandbox.exec(minimal!(), "raise")

      assert Exception.message(e) =~ "kaboom"
    end

    test "a return outside the contract becomes reason :bad_return" do
      assert {:error, %Error{reason: :bad_return, detail: {:weird, :shape}}} = Sandbox.read(minimal!(), "bad return")
    end
  end

  describe "optional callbacks" do
    test "return exactly {:error, :not_supported} when the sandbox lacks them" do
      sb = minimal!()
      assert {:error, :not_supported} = Sandbox.glob(sb, "**/*.ex")
      assert {:error, :not_supported} = Sandbox.glob(sb, "*", match_dot: true)
      assert {:error, :not_supported} = Sandbox.grep(sb, "defmodule")
      assert {:error, :not_supported} = Sandbox.grep(sb, "x", path: "lib")
      assert {:error, :not_supported} = Sandbox.mount(sb, "/host", "/vfs")
      refute Sandbox.supports?(sb, :glob)
      refute Sandbox.supports?(sb, :grep)
      refute Sandbox.supports?(sb, :mount)
    end

    test "route to the callbacks when present" do
      {:ok, sb} = Sandbox.new(Full, test: self())

      assert {:ok, ["a.ex"]} = Sandbox.glob(sb, "*.ex", match_dot: true)
      assert_received {:glob, "*.ex", [match_dot: true]}

      assert {:ok, [%{path: "a.ex", line_number: 1, line: "def"}]} = Sandbox.grep(sb, "def")
      assert_received {:grep, "def", []}

      assert :ok = Sandbox.mount(sb, "/host", "/vfs")
      assert_received {:mount, "/host", "/vfs"}

      assert Sandbox.supports?(sb, :glob) and Sandbox.supports?(sb, :grep) and Sandbox.supports?(sb, :mount)
    end
  end
end
