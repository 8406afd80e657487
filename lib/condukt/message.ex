defmodule Condukt.Message do
  @moduledoc """
  One entry of a session's history.

    * `:role` — `:user`, `:assistant` or `:tool`.
    * `:content` — the text (`nil` for an assistant turn that only called tools).
    * `:tool_calls` — on `:assistant` messages, the tools the model asked
      for: `%{id: id, name: name, arguments: map}`.
    * `:tool_call_id`, `:name`, `:is_error` — on `:tool` messages, which
      call this answers, the tool's name and whether the tool failed.

  `to_map/1` and `from_map/1` convert to and from the JSON form that
  session stores keep and that `Condukt.Sandbox.NetworkPolicy.AgentDecider`
  shows its agent.
  """

  @type role :: :user | :assistant | :tool
  @type tool_call :: %{id: String.t(), name: String.t(), arguments: map()}

  @type t :: %__MODULE__{
          role: role(),
          content: String.t() | nil,
          tool_calls: [tool_call()],
          tool_call_id: String.t() | nil,
          name: String.t() | nil,
          is_error: boolean()
        }

  @enforce_keys [:role]
  defstruct role: nil, content: nil, tool_calls: [], tool_call_id: nil, name: nil, is_error: false

  @doc "A user message."
  @spec user(String.t()) :: t()
  def user(text) when is_binary(text), do: %__MODULE__{role: :user, content: text}

  @doc "An assistant message: its text and the tools it called."
  @spec assistant(String.t() | nil, [tool_call()]) :: t()
  def assistant(text, tool_calls \\ []), do: %__MODULE__{role: :assistant, content: text, tool_calls: tool_calls}

  @doc "A tool's result, answering the call `id`."
  @spec tool_result(String.t(), String.t(), String.t(), boolean()) :: t()
  def tool_result(id, name, text, is_error \\ false),
    do: %__MODULE__{role: :tool, tool_call_id: id, name: name, content: text, is_error: is_error}

  @doc "The JSON form (string keys; absent fields left out)."
  @spec to_map(t()) :: map()
  def to_map(%__MODULE__{} = m) do
    base = %{"role" => Atom.to_string(m.role), "content" => m.content}

    case m.role do
      :assistant when m.tool_calls != [] ->
        calls = Enum.map(m.tool_calls, &%{"id" => &1.id, "name" => &1.name, "arguments" => &1.arguments})
        Map.put(base, "tool_calls", calls)

      :tool ->
        Map.merge(base, %{"tool_call_id" => m.tool_call_id, "name" => m.name, "is_error" => m.is_error})

      _ ->
        base
    end
  end

  @doc "Reads the JSON form back; `{:error, reason}` for anything else."
  @spec from_map(term()) :: {:ok, t()} | {:error, String.t()}
  def from_map(%{"role" => role} = map) when role in ["user", "assistant", "tool"] do
    content = map["content"]

    with :ok <- check(is_nil(content) or is_binary(content), "content must be a string or null"),
         {:ok, calls} <- calls(Map.get(map, "tool_calls", [])) do
      {:ok,
       %__MODULE__{
         role: String.to_existing_atom(role),
         content: content,
         tool_calls: calls,
         tool_call_id: string_or_nil(map["tool_call_id"]),
         name: string_or_nil(map["name"]),
         is_error: map["is_error"] == true
       }}
    end
  end

  def from_map(other), do: {:error, "not a message: #{inspect(other, limit: 10)}"}

  defp calls(list) when is_list(list) do
    Condukt.Options.map_ok(list, fn
      %{"id" => id, "name" => name, "arguments" => args} when is_binary(id) and is_binary(name) and is_map(args) ->
        {:ok, %{id: id, name: name, arguments: args}}

      other ->
        {:error, "not a tool call: #{inspect(other, limit: 10)}"}
    end)
  end

  defp calls(_), do: {:error, "tool_calls must be a list"}

  defp check(true, _), do: :ok
  defp check(false, why), do: {:error, why}

  defp string_or_nil(v) when is_binary(v), do: v
  defp string_or_nil(_), do: nil
end
