defmodule Condukt.Sandbox do
  @moduledoc """
  The backend through which tools reach the outside world: read, write and
  edit files, run shell commands, glob and search files.

  A sandbox is a module implementing this behaviour. `new/2` starts one and
  returns a handle (`t:t/0`); tools call the facade functions below with
  that handle and never `File.*` or `System.cmd/3` directly, so the same
  agent runs against the host (`Condukt.Sandbox.Local`) or against an
  isolated backend (`Condukt.Sandbox.Kubernetes`, `Condukt.Sandbox.Virtual`,
  or your own) by changing one option.

      {:ok, sb} = Condukt.Sandbox.new({Condukt.Sandbox.Local, cwd: "/path/to/project"})
      {:ok, %{output: "hi\\n", exit_code: 0}} = Condukt.Sandbox.exec(sb, "echo hi")
      :ok = Condukt.Sandbox.write(sb, "notes/todo.md", "- ship it\\n")
      :ok = Condukt.Sandbox.edit(sb, "notes/todo.md", "ship it", "ship it today")
      {:ok, "- ship it today\\n"} = Condukt.Sandbox.read(sb, "notes/todo.md")
      :ok = Condukt.Sandbox.shutdown(sb)

  ## Errors

  Every failure is `{:error, %Condukt.Sandbox.Error{}}` with a typed
  `:reason`, the operation and the path it was about, whatever the backend
  returned or raised: the facade normalises it. The one exception is
  `{:error, :not_supported}`, returned as is when the sandbox does not
  implement an optional callback (`glob/3`, `grep/3`, `mount/3`).

  ## Writing a sandbox

  Implement the callbacks below; `use Condukt.Sandbox` declares the
  behaviour and a default `c:shutdown/1` that returns `:ok`. The state
  returned by `c:init/1` is passed unchanged to every other callback:
  sandboxes are stateless between calls (each `c:exec/3` is a fresh shell),
  so a backend that needs mutable state keeps it in a process it owns and
  stops that process in `c:shutdown/1`. `docs/sandbox.md` walks through an
  example.
  """

  alias Condukt.Sandbox.Error

  @enforce_keys [:module, :state]
  defstruct [:module, :state]

  @typedoc "A running sandbox: its module and the state its `c:init/1` returned."
  @type t :: %__MODULE__{module: module(), state: state()}

  @typedoc "A sandbox module, or a module with its init options."
  @type spec :: module() | {module(), keyword()}

  @typedoc "Whatever `c:init/1` returned; opaque to the facade."
  @type state :: term()

  @typedoc """
  The result of a command: everything it wrote to stdout and stderr,
  interleaved, and its exit code (128 + the signal number when a signal
  killed it).
  """
  @type exec_result :: %{output: binary(), exit_code: integer()}

  @typedoc "One matching line of `c:grep/3`; `:line_number` counts from 1."
  @type grep_match :: %{path: String.t(), line_number: pos_integer(), line: binary()}

  @typedoc """
  What a callback may return on failure. Atoms and `Condukt.Sandbox.Error`
  structs are kept as the reason; anything else is wrapped with reason
  `:backend`.
  """
  @type callback_error :: {:error, Error.t() | atom() | term()}

  @doc "Builds the per-session state from the init options."
  @callback init(opts :: keyword()) :: {:ok, state()} | callback_error()

  @doc "Releases whatever `c:init/1` acquired. Called once, by `Condukt.Sandbox.shutdown/1`."
  @callback shutdown(state()) :: :ok | callback_error()

  @doc "Reads a whole file."
  @callback read_file(state(), path :: String.t()) :: {:ok, binary()} | callback_error()

  @doc "Writes a whole file, replacing any previous content."
  @callback write_file(state(), path :: String.t(), content :: binary()) :: :ok | callback_error()

  @doc """
  Replaces the one occurrence of `old_text` in a file with `new_text`;
  fails when `old_text` occurs zero times or more than once.
  """
  @callback edit_file(state(), path :: String.t(), old_text :: binary(), new_text :: binary()) ::
              :ok | callback_error()

  @doc """
  Runs a shell command. Each call is stateless: `cd`, `export` and shell
  variables do not carry over to the next call.
  """
  @callback exec(state(), command :: String.t(), opts :: keyword()) :: {:ok, exec_result()} | callback_error()

  @doc "Lists the paths matching a wildcard pattern."
  @callback glob(state(), pattern :: String.t(), opts :: keyword()) :: {:ok, [String.t()]} | callback_error()

  @doc "Searches file contents, returning the matching lines."
  @callback grep(state(), pattern :: String.t(), opts :: keyword()) :: {:ok, [grep_match()]} | callback_error()

  @doc "Makes a host directory visible inside the sandbox at `sandbox_path`."
  @callback mount(state(), host_path :: String.t(), sandbox_path :: String.t()) :: :ok | callback_error()

  @optional_callbacks glob: 3, grep: 3, mount: 3

  @required [init: 1, shutdown: 1, read_file: 2, write_file: 3, edit_file: 4, exec: 3]

  @doc false
  defmacro __using__(_opts) do
    quote do
      @behaviour Condukt.Sandbox

      @impl Condukt.Sandbox
      def shutdown(_state), do: :ok

      defoverridable shutdown: 1
    end
  end

  @doc """
  Starts a sandbox.

  `spec` is a module or `{module, opts}`. `opts` are extra init options; where
  both give a key, the spec's value wins (so a caller can pass defaults, such
  as a session id, without overriding what the spec pins).

      {:ok, sb} = Condukt.Sandbox.new(Condukt.Sandbox.Local)
      {:ok, sb} = Condukt.Sandbox.new(Condukt.Sandbox.Local, cwd: "/srv/project")
      {:ok, sb} = Condukt.Sandbox.new({Condukt.Sandbox.Local, cwd: "/srv/project"}, id: "job-42")
  """
  @spec new(spec(), keyword()) :: {:ok, t()} | {:error, Error.t()}
  def new(spec, opts \\ [])

  def new({module, spec_opts}, opts) when is_atom(module) and is_list(spec_opts) and is_list(opts),
    do: start(module, Keyword.merge(opts, spec_opts))

  def new(module, opts) when is_atom(module) and is_list(opts), do: start(module, opts)

  def new(other, _opts),
    do:
      {:error,
       %Error{reason: :invalid_sandbox, op: :new, detail: "expected a module or {module, opts}, got: #{inspect(other)}"}}

  defp start(module, opts) do
    with :ok <- check_module(module) do
      case call(:new, nil, fn -> module.init(opts) end) do
        {:ok, state} -> {:ok, %__MODULE__{module: module, state: state}}
        {:error, _} = error -> error
        other -> {:error, %Error{reason: :bad_return, op: :new, detail: other}}
      end
    end
  end

  defp check_module(module) do
    missing =
      if Code.ensure_loaded?(module), do: Enum.reject(@required, fn {f, a} -> function_exported?(module, f, a) end)

    case missing do
      [] ->
        :ok

      nil ->
        {:error, %Error{reason: :invalid_sandbox, op: :new, detail: "#{inspect(module)} is not an available module"}}

      missing ->
        names = Enum.map_join(missing, ", ", fn {f, a} -> "#{f}/#{a}" end)

        {:error,
         %Error{
           reason: :invalid_sandbox,
           op: :new,
           detail: "#{inspect(module)} does not implement the Condukt.Sandbox behaviour (missing #{names})"
         }}
    end
  end

  @doc "Shuts the sandbox down, releasing what `new/2` acquired."
  @spec shutdown(t()) :: :ok | {:error, Error.t()}
  def shutdown(%__MODULE__{module: m, state: s}), do: call(:shutdown, nil, fn -> m.shutdown(s) end)

  @doc "Reads a whole file."
  @spec read(t(), String.t()) :: {:ok, binary()} | {:error, Error.t()}
  def read(%__MODULE__{module: m, state: s}, path) when is_binary(path),
    do: call(:read, path, fn -> m.read_file(s, path) end)

  @doc "Writes a whole file, replacing any previous content."
  @spec write(t(), String.t(), binary()) :: :ok | {:error, Error.t()}
  def write(%__MODULE__{module: m, state: s}, path, content) when is_binary(path) and is_binary(content),
    do: call(:write, path, fn -> m.write_file(s, path, content) end)

  @doc """
  Replaces the single occurrence of `old_text` in the file at `path` with
  `new_text`. Fails with reason `:old_text_not_found` or
  `:old_text_not_unique` (the error names the count) otherwise.
  """
  @spec edit(t(), String.t(), binary(), binary()) :: :ok | {:error, Error.t()}
  def edit(%__MODULE__{module: m, state: s}, path, old_text, new_text)
      when is_binary(path) and is_binary(old_text) and is_binary(new_text),
      do: call(:edit, path, fn -> m.edit_file(s, path, old_text, new_text) end)

  @doc """
  Runs `command` in a fresh shell and returns its combined output and exit
  code. A non-zero exit code is still `{:ok, _}`; errors are reserved for
  commands that could not run or ran out of time. The options depend on the
  sandbox (see `Condukt.Sandbox.Local` for its `:timeout`, `:cwd`, `:env`
  and `:max_output_bytes`).
  """
  @spec exec(t(), String.t(), keyword()) :: {:ok, exec_result()} | {:error, Error.t()}
  def exec(%__MODULE__{module: m, state: s}, command, opts \\ []) when is_binary(command) and is_list(opts),
    do: call(:exec, if(Keyword.keyword?(opts), do: opts[:cwd]), fn -> m.exec(s, command, opts) end)

  @doc "Lists the paths matching `pattern`, or `{:error, :not_supported}`."
  @spec glob(t(), String.t(), keyword()) :: {:ok, [String.t()]} | {:error, :not_supported | Error.t()}
  def glob(%__MODULE__{} = sb, pattern, opts \\ []) when is_binary(pattern) and is_list(opts),
    do: optional(sb, :glob, pattern, [pattern, opts])

  @doc "Searches file contents for `pattern`, or `{:error, :not_supported}`."
  @spec grep(t(), String.t(), keyword()) :: {:ok, [grep_match()]} | {:error, :not_supported | Error.t()}
  def grep(%__MODULE__{} = sb, pattern, opts \\ []) when is_binary(pattern) and is_list(opts),
    do: optional(sb, :grep, pattern, [pattern, opts])

  @doc """
  Makes the host directory `host_path` visible inside the sandbox at
  `sandbox_path`, or `{:error, :not_supported}` (Local and Kubernetes do not
  support it).
  """
  @spec mount(t(), String.t(), String.t()) :: :ok | {:error, :not_supported | Error.t()}
  def mount(%__MODULE__{} = sb, host_path, sandbox_path) when is_binary(host_path) and is_binary(sandbox_path),
    do: optional(sb, :mount, sandbox_path, [host_path, sandbox_path])

  @doc "Whether the sandbox implements the optional callback `name` (`:glob`, `:grep` or `:mount`)."
  @spec supports?(t(), :glob | :grep | :mount) :: boolean()
  def supports?(%__MODULE__{module: m}, name) when name in [:glob, :grep, :mount],
    do: function_exported?(m, name, 3)

  defp optional(%__MODULE__{module: m, state: s} = sb, name, path, args) do
    if supports?(sb, name),
      do: call(name, path, fn -> apply(m, name, [s | args]) end),
      else: {:error, :not_supported}
  end

  # The boundary: whatever the backend returned or raised leaves as :ok,
  # {:ok, _}, {:error, :not_supported} or {:error, %Error{}}.
  defp call(op, path, fun) do
    fun.()
  rescue
    exception -> {:error, %Error{reason: :exception, op: op, path: path, detail: exception}}
  else
    :ok -> :ok
    {:ok, _} = ok -> ok
    {:error, :not_supported} = error -> error
    {:error, %Error{} = e} -> {:error, %Error{e | op: e.op || op, path: e.path || path}}
    {:error, reason} when is_atom(reason) -> {:error, %Error{reason: reason, op: op, path: path}}
    {:error, other} -> {:error, %Error{reason: :backend, op: op, path: path, detail: other}}
    other -> {:error, %Error{reason: :bad_return, op: op, path: path, detail: other}}
  end
end
