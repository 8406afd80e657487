defmodule Condukt.Tool do
  @moduledoc """
  A capability the model may call: a name, a description, a JSON schema of
  its arguments and `c:call/2`.

      defmodule MyApp.Tools.WordCount do
        use Condukt.Tool

        @impl true
        def name, do: "WordCount"

        @impl true
        def description, do: "Counts the words of a file."

        @impl true
        def parameters,
          do: %{type: "object", properties: %{path: %{type: "string"}}, required: ["path"]}

        @impl true
        def call(%{"path" => path}, ctx) do
          with {:ok, text} <- Condukt.Sandbox.read(ctx.sandbox, path),
               do: {:ok, "\#{length(String.split(text))} words"}
        end
      end

  The session validates the model's arguments against `c:parameters/0`
  (`Condukt.JSONSchema`) before calling the tool. Whatever goes wrong, an
  invalid argument, `{:error, reason}`, an exception, comes back to the
  model as the tool's result, marked as an error, so that it can correct
  itself; it never stops the session.

  ## Context

  `call/2` receives `%{sandbox: sandbox, session_id: id, agent: module}`.
  A tool that touches files or runs processes goes through
  `ctx.sandbox` (the `Condukt.Sandbox` facade), never `File` or
  `System.cmd/3`: that is what lets the same agent run against the host
  or inside a pod, and what puts its network traffic behind the sandbox's
  network policy.
  """

  @type context :: %{sandbox: Condukt.Sandbox.t(), session_id: term(), agent: module() | nil}

  @doc "The name the model calls the tool by (letters, digits, `_` and `-`)."
  @callback name() :: String.t()

  @doc "What the tool does, for the model."
  @callback description() :: String.t()

  @doc "The JSON schema of the arguments (an object)."
  @callback parameters() :: map()

  @doc "Runs the tool. `args` is the decoded JSON the model sent, already validated."
  @callback call(args :: map(), context()) :: {:ok, String.t()} | {:error, term()}

  @doc false
  defmacro __using__(_opts) do
    quote do
      @behaviour Condukt.Tool
    end
  end

  @doc "The tool's declaration for a provider: `%{name:, description:, parameters:}`."
  @spec spec(module()) :: %{name: String.t(), description: String.t(), parameters: map()}
  def spec(tool),
    do: %{
      name: tool.name(),
      description: tool.description(),
      parameters: Condukt.JSONSchema.stringify(tool.parameters())
    }

  @doc """
  Calls `tool` with the model's arguments: validates them, runs the tool
  and turns every outcome into `{:ok, text}` or `{:error, text}`, the two
  shapes a tool result can take in the conversation.
  """
  @spec run(module(), map(), context()) :: {:ok, String.t()} | {:error, String.t()}
  def run(tool, args, ctx) when is_map(args) do
    with :ok <- validate(tool, args) do
      result(tool.call(args, ctx))
    end
  rescue
    e -> {:error, "the tool raised: " <> Exception.message(e)}
  catch
    kind, reason -> {:error, "the tool failed: #{Exception.format_banner(kind, reason)}"}
  end

  def run(_tool, args, _ctx), do: {:error, "the arguments must be a JSON object, got: #{inspect(args, limit: 10)}"}

  defp validate(tool, args) do
    case Condukt.JSONSchema.validate(args, tool.parameters()) do
      :ok -> :ok
      {:error, errors} -> {:error, "invalid arguments: " <> Enum.join(errors, "; ")}
    end
  end

  defp result({:ok, text}) when is_binary(text), do: {:ok, text}
  defp result({:ok, other}), do: {:ok, inspect(other)}
  defp result(:ok), do: {:ok, "ok"}
  defp result({:error, e}) when is_exception(e), do: {:error, Exception.message(e)}
  defp result({:error, text}) when is_binary(text), do: {:error, text}
  defp result({:error, other}), do: {:error, inspect(other)}

  defp result(other),
    do: {:error, "the tool returned #{inspect(other, limit: 10)}, expected {:ok, text} or {:error, reason}"}
end
