defmodule Condukt.Session.Loop do
  @moduledoc false
  # The model/tool loop of one `run`: ask the model, run the tools it
  # called, give it their results, until it answers without calling a
  # tool. It runs in a task of the session, so that the session process
  # keeps answering (its message history feeds the network policy's
  # deciders while a tool's command is blocked on a decision). Every
  # message it adds is reported through `notify` as soon as it exists.

  alias Condukt.{Error, Message, Tool}

  @type config :: %{
          provider: module(),
          request: map(),
          tools: %{String.t() => module()},
          tool_context: Tool.context(),
          emit: (term() -> any()) | nil,
          output: map() | nil,
          max_turns: pos_integer()
        }

  @spec run(config(), [Message.t()], (Message.t() -> any())) :: {:ok, String.t() | map()} | {:error, Error.t()}
  def run(cfg, messages, notify), do: turn(cfg, messages, notify, 1)

  defp turn(cfg, _messages, _notify, n) when n > cfg.max_turns,
    do: {:error, %Error{reason: :max_turns, detail: cfg.max_turns}}

  defp turn(cfg, messages, notify, n) do
    with {:ok, resp} <- cfg.provider.chat(Map.put(cfg.request, :messages, messages)) do
      reply = Message.assistant(resp.text, resp.tool_calls)
      notify.(reply)

      case resp.tool_calls do
        [] ->
          finish(cfg.output, resp.text || "")

        calls ->
          results =
            Enum.map(calls, fn call ->
              emit(cfg, {:tool_call, call})
              result = call_tool(cfg, call)
              emit(cfg, {:tool_result, result})
              notify.(result)
              result
            end)

          turn(cfg, messages ++ [reply | results], notify, n + 1)
      end
    end
  end

  defp emit(%{emit: nil}, _event), do: :ok
  defp emit(%{emit: emit}, event), do: emit.(event)

  defp call_tool(cfg, %{id: id, name: name, arguments: args}) do
    case Map.fetch(cfg.tools, name) do
      {:ok, tool} ->
        case Tool.run(tool, args, cfg.tool_context) do
          {:ok, text} -> Message.tool_result(id, name, text)
          {:error, text} -> Message.tool_result(id, name, text, true)
        end

      :error ->
        known = cfg.tools |> Map.keys() |> Enum.sort() |> Enum.join(", ")
        Message.tool_result(id, name, "there is no tool named #{inspect(name)}; the tools are: #{known}", true)
    end
  end

  defp finish(nil, text), do: {:ok, text}

  defp finish(schema, text) do
    with {:ok, value} <- decode(text),
         :ok <- validate(value, schema, text) do
      {:ok, value}
    end
  end

  @doc false
  # The answer as JSON: the whole text, or the text inside one Markdown
  # code fence (models that were not forced into JSON like to add one).
  @spec decode(String.t()) :: {:ok, term()} | {:error, Error.t()}
  def decode(text) do
    trimmed = String.trim(text)

    candidate =
      case Regex.run(~r/\A```(?:json)?\s*\n(.*)\n```\z/s, trimmed) do
        [_, inner] -> inner
        nil -> trimmed
      end

    {:ok, Condukt.JSON.decode!(candidate)}
  rescue
    _ -> {:error, %Error{reason: :invalid_output, detail: %{text: text, errors: ["the answer is not JSON"]}}}
  end

  defp validate(value, schema, text) do
    case Condukt.JSONSchema.validate(value, schema) do
      :ok -> :ok
      {:error, errors} -> {:error, %Error{reason: :invalid_output, detail: %{text: text, errors: errors}}}
    end
  end
end
