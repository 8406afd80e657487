defmodule Condukt.Providers.OpenAI do
  @moduledoc """
  The OpenAI-compatible chat completions API (`POST {base_url}/chat/completions`),
  spoken by OpenAI and by local servers (llama.cpp, vLLM, Ollama, LM Studio).

  `:base_url` defaults to `https://api.openai.com/v1`; for a local server
  pass its `/v1` URL. The API key, when there is one, goes in
  `Authorization: Bearer`; it defaults to `OPENAI_API_KEY`.

  With `:on_text` in the request (`Condukt.Session.run/3`'s `:on_event`)
  the answer is streamed (`stream: true`, server-sent events) and each
  piece of text is handed over as it arrives.

  With an `:output` schema the request carries
  `response_format: %{type: "json_schema", json_schema: %{name: "output", schema: schema, strict: true}}`,
  which the server enforces (llama.cpp compiles it to a grammar), so the
  answer is reported with `schema_enforced: true`. The session still
  validates it.
  """

  @behaviour Condukt.Provider

  alias Condukt.{Error, Message}
  alias Condukt.Provider.HTTP

  @default_base_url "https://api.openai.com/v1"

  @impl true
  def chat(req) do
    key = req.api_key || System.get_env("OPENAI_API_KEY")
    headers = if key, do: [{"authorization", "Bearer " <> key}], else: []

    case Map.get(req, :on_text) do
      nil ->
        with {:ok, answer} <- HTTP.post_turn(req, @default_base_url, "/chat/completions", headers, body(req)),
             do: parse(answer, req.output != nil)

      on_text ->
        body = Map.put(body(req), "stream", true)
        acc = %{text: [], calls: %{}, finish: nil, usage: %{}, error: nil}

        with {:ok, acc} <-
               HTTP.post_stream(
                 req,
                 @default_base_url,
                 "/chat/completions",
                 headers,
                 body,
                 {acc, &fold(&1, &2, on_text)}
               ),
             do: streamed(acc, req.output != nil)
    end
  end

  # One `data:` chunk of a streamed answer: text deltas go to `on_text` as
  # they come; tool-call deltas are put together by their index.
  defp fold({_event, "[DONE]"}, acc, _on_text), do: acc

  defp fold({_event, data}, acc, on_text) do
    case decode(data) do
      {:ok, %{"choices" => [%{"delta" => delta} = choice | _]} = chunk} ->
        text = delta["content"]
        if is_binary(text) and text != "", do: on_text.(text)

        %{
          acc
          | text: if(is_binary(text), do: [acc.text | text], else: acc.text),
            calls: Enum.reduce(List.wrap(delta["tool_calls"]), acc.calls, &call_delta/2),
            finish: choice["finish_reason"] || acc.finish,
            usage: chunk["usage"] || acc.usage
        }

      {:ok, %{"usage" => usage}} ->
        %{acc | usage: usage}

      {:ok, %{"error" => error}} ->
        %{acc | error: error}

      _ ->
        acc
    end
  end

  defp call_delta(%{"index" => i} = delta, calls) do
    f = delta["function"] || %{}
    call = Map.get(calls, i, %{id: nil, name: nil, args: []})

    Map.put(calls, i, %{
      id: delta["id"] || call.id,
      name: f["name"] || call.name,
      args: [call.args | List.wrap(f["arguments"])]
    })
  end

  defp call_delta(_other, calls), do: calls

  defp streamed(%{error: error}, _schema?) when error != nil,
    do: {:error, %Error{reason: :bad_response, detail: "the stream reported an error: #{inspect(error)}"}}

  defp streamed(acc, schema?) do
    calls =
      acc.calls
      |> Enum.sort()
      |> Enum.map(fn {i, c} ->
        %{id: c.id || "call_#{i}", name: c.name || "", arguments: arguments(IO.iodata_to_binary(c.args))}
      end)

    text = IO.iodata_to_binary(acc.text)

    {:ok,
     %{
       text: if(text == "" and calls != [], do: nil, else: text),
       tool_calls: calls,
       stop_reason: acc.finish,
       schema_enforced: schema?,
       usage: acc.usage
     }}
  end

  defp decode(json) do
    {:ok, Condukt.JSON.decode!(json)}
  rescue
    _ -> :error
  end

  @doc false
  @spec body(Condukt.Provider.request()) :: map()
  def body(req) do
    system = if req.system, do: [%{"role" => "system", "content" => req.system}], else: []

    %{"model" => req.model, "messages" => system ++ Enum.map(req.messages, &message/1), "max_tokens" => req.max_tokens}
    |> put_if(req.temperature != nil, "temperature", req.temperature)
    |> put_if(req.tools != [], "tools", Enum.map(req.tools, &tool/1))
    |> put_if(req.output != nil, "response_format", %{
      "type" => "json_schema",
      "json_schema" => %{"name" => "output", "schema" => req.output, "strict" => true}
    })
  end

  defp message(%Message{role: :user, content: text}), do: %{"role" => "user", "content" => text}

  defp message(%Message{role: :assistant, content: text, tool_calls: []}),
    do: %{"role" => "assistant", "content" => text || ""}

  defp message(%Message{role: :assistant, content: text, tool_calls: calls}) do
    %{
      "role" => "assistant",
      "content" => text,
      "tool_calls" =>
        Enum.map(calls, fn c ->
          %{
            "id" => c.id,
            "type" => "function",
            "function" => %{"name" => c.name, "arguments" => Condukt.JSON.encode!(c.arguments)}
          }
        end)
    }
  end

  defp message(%Message{role: :tool} = m),
    do: %{"role" => "tool", "tool_call_id" => m.tool_call_id, "content" => m.content}

  defp tool(spec),
    do: %{
      "type" => "function",
      "function" => %{"name" => spec.name, "description" => spec.description, "parameters" => spec.parameters}
    }

  defp parse(%{"choices" => [%{"message" => msg} = choice | _]} = answer, schema?) when is_map(msg) do
    with {:ok, calls} <- tool_calls(msg["tool_calls"] || []) do
      {:ok,
       %{
         text: if(is_binary(msg["content"]), do: msg["content"]),
         tool_calls: calls,
         stop_reason: choice["finish_reason"],
         schema_enforced: schema?,
         usage: answer["usage"] || %{}
       }}
    end
  end

  defp parse(other, _),
    do: {:error, %Error{reason: :bad_response, detail: "no choices[0].message in #{inspect(other, limit: 10)}"}}

  defp tool_calls(calls) when is_list(calls) do
    Condukt.Options.map_ok(calls, fn
      %{"id" => id, "function" => %{"name" => name} = f} when is_binary(name) ->
        {:ok, %{id: to_string(id), name: name, arguments: arguments(f["arguments"])}}

      other ->
        {:error, %Error{reason: :bad_response, detail: "malformed tool call: #{inspect(other, limit: 10)}"}}
    end)
  end

  defp tool_calls(_), do: {:error, %Error{reason: :bad_response, detail: "tool_calls is not a list"}}

  # Arguments arrive as a JSON string. What does not decode to an object is
  # kept under "_raw": the tool's schema check then refuses it, and the
  # model reads why.
  defp arguments(""), do: %{}

  defp arguments(json) when is_binary(json) do
    case Condukt.JSON.decode!(json) do
      %{} = map -> map
      other -> %{"_raw" => other}
    end
  rescue
    _ -> %{"_raw" => json}
  end

  defp arguments(%{} = map), do: map
  defp arguments(_), do: %{}

  defp put_if(map, true, key, value), do: Map.put(map, key, value)
  defp put_if(map, false, _key, _value), do: map
end
