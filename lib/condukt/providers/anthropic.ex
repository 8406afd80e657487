defmodule Condukt.Providers.Anthropic do
  @moduledoc """
  The Anthropic Messages API (`POST {base_url}/v1/messages`).

  `:base_url` defaults to `https://api.anthropic.com`; the API key goes in
  `x-api-key` and defaults to `ANTHROPIC_API_KEY`.

  With `:on_text` in the request (`Condukt.Session.run/3`'s `:on_event`)
  the answer is streamed (`stream: true`) and each piece of text is handed
  over as it arrives.

  The Messages API does not enforce an `:output` schema, so the answer is
  reported with `schema_enforced: false`; the session asks for JSON in the
  system prompt, then decodes and validates the answer, and rejects one
  that does not fit.
  """

  @behaviour Condukt.Provider

  alias Condukt.{Error, Message}
  alias Condukt.Provider.HTTP

  @default_base_url "https://api.anthropic.com"
  @version "2023-06-01"

  @impl true
  def chat(req) do
    key = req.api_key || System.get_env("ANTHROPIC_API_KEY")
    headers = [{"anthropic-version", @version}] ++ if(key, do: [{"x-api-key", key}], else: [])

    case Map.get(req, :on_text) do
      nil ->
        with {:ok, answer} <- HTTP.post_turn(req, @default_base_url, "/v1/messages", headers, body(req)),
             do: parse(answer)

      on_text ->
        body = Map.put(body(req), "stream", true)
        acc = %{blocks: %{}, stop: nil, usage: %{}, error: nil}

        with {:ok, acc} <-
               HTTP.post_stream(req, @default_base_url, "/v1/messages", headers, body, {acc, &fold(&1, &2, on_text)}),
             do: streamed(acc)
    end
  end

  # One event of a streamed answer. Content blocks are built by index: text
  # deltas go to `on_text` as they come, a tool_use block's input arrives
  # as pieces of JSON.
  defp fold({_event, data}, acc, on_text) do
    case decode(data) do
      {:ok, %{"type" => "content_block_start", "index" => i, "content_block" => block}} ->
        put_in(acc.blocks[i], %{type: block["type"], id: block["id"], name: block["name"], parts: []})

      {:ok, %{"type" => "content_block_delta", "index" => i, "delta" => delta}} ->
        piece = delta["text"] || delta["partial_json"] || ""
        if delta["type"] == "text_delta" and piece != "", do: on_text.(piece)
        block = Map.get(acc.blocks, i, %{type: "text", id: nil, name: nil, parts: []})
        put_in(acc.blocks[i], %{block | parts: [block.parts | piece]})

      {:ok, %{"type" => "message_delta", "delta" => delta} = event} ->
        %{acc | stop: delta["stop_reason"] || acc.stop, usage: event["usage"] || acc.usage}

      {:ok, %{"type" => "error", "error" => error}} ->
        %{acc | error: error}

      _ ->
        acc
    end
  end

  defp streamed(%{error: error}) when error != nil,
    do: {:error, %Error{reason: :bad_response, detail: "the stream reported an error: #{inspect(error)}"}}

  defp streamed(acc) do
    blocks =
      for {_i, b} <- Enum.sort(acc.blocks) do
        text = IO.iodata_to_binary(b.parts)

        case b.type do
          "tool_use" -> %{"type" => "tool_use", "id" => b.id, "name" => b.name, "input" => input(text)}
          _ -> %{"type" => "text", "text" => text}
        end
      end

    parse(%{"content" => blocks, "stop_reason" => acc.stop, "usage" => acc.usage})
  end

  defp input(""), do: %{}

  defp input(json) do
    case decode(json) do
      {:ok, %{} = map} -> map
      _ -> %{"_raw" => json}
    end
  end

  defp decode(json) do
    {:ok, Condukt.JSON.decode!(json)}
  rescue
    _ -> :error
  end

  @doc false
  @spec body(Condukt.Provider.request()) :: map()
  def body(req) do
    %{"model" => req.model, "max_tokens" => req.max_tokens, "messages" => messages(req.messages)}
    |> put_if(req.system != nil, "system", req.system)
    |> put_if(req.temperature != nil, "temperature", req.temperature)
    |> put_if(req.tools != [], "tools", Enum.map(req.tools, &tool/1))
  end

  # Tool results travel in a user turn; consecutive results share one.
  defp messages(messages) do
    messages
    |> Enum.chunk_by(&(&1.role == :tool))
    |> Enum.flat_map(fn
      [%Message{role: :tool} | _] = results -> [%{"role" => "user", "content" => Enum.map(results, &tool_result/1)}]
      others -> Enum.map(others, &message/1)
    end)
  end

  defp message(%Message{role: :user, content: text}), do: %{"role" => "user", "content" => text}

  defp message(%Message{role: :assistant, content: text, tool_calls: calls}) do
    blocks =
      if(text in [nil, ""], do: [], else: [%{"type" => "text", "text" => text}]) ++
        Enum.map(calls, &%{"type" => "tool_use", "id" => &1.id, "name" => &1.name, "input" => &1.arguments})

    %{"role" => "assistant", "content" => if(blocks == [], do: [%{"type" => "text", "text" => ""}], else: blocks)}
  end

  defp tool_result(m),
    do: %{
      "type" => "tool_result",
      "tool_use_id" => m.tool_call_id,
      "content" => m.content || "",
      "is_error" => m.is_error
    }

  defp tool(spec), do: %{"name" => spec.name, "description" => spec.description, "input_schema" => spec.parameters}

  defp parse(%{"content" => blocks} = answer) when is_list(blocks) do
    text = for(%{"type" => "text", "text" => t} <- blocks, do: t) |> Enum.join()

    calls =
      for %{"type" => "tool_use", "id" => id, "name" => name} = b <- blocks,
          do: %{id: id, name: name, arguments: if(is_map(b["input"]), do: b["input"], else: %{})}

    {:ok,
     %{
       text: if(text == "" and calls != [], do: nil, else: text),
       tool_calls: calls,
       stop_reason: answer["stop_reason"],
       schema_enforced: false,
       usage: answer["usage"] || %{}
     }}
  end

  defp parse(other), do: {:error, %Error{reason: :bad_response, detail: "no content in #{inspect(other, limit: 10)}"}}

  defp put_if(map, true, key, value), do: Map.put(map, key, value)
  defp put_if(map, false, _key, _value), do: map
end
