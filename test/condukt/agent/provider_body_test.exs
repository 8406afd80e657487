defmodule Condukt.ProviderBodyTest do
  # What each provider puts on the wire for one turn (no server involved).
  use ExUnit.Case, async: true

  alias Condukt.Message
  alias Condukt.Providers.{Anthropic, OpenAI}

  @tool %{name: "Read", description: "Read a file", parameters: %{"type" => "object"}}

  defp req(extra) do
    Map.merge(
      %{
        model: "m",
        system: "be brief",
        messages: [
          Message.user("read a and b"),
          Message.assistant("ok", [
            %{id: "c1", name: "Read", arguments: %{"path" => "a"}},
            %{id: "c2", name: "Read", arguments: %{"path" => "b"}}
          ]),
          Message.tool_result("c1", "Read", "A"),
          Message.tool_result("c2", "Read", "missing", true)
        ],
        tools: [@tool],
        output: nil,
        max_tokens: 100,
        temperature: 0,
        base_url: nil,
        api_key: nil,
        timeout: 1000,
        retries: 0
      },
      Map.new(extra)
    )
  end

  test "OpenAI-compatible: system first, tool calls with JSON-string arguments, tool results by id, response_format" do
    body = OpenAI.body(req(output: %{"type" => "object"}))
    assert [%{"role" => "system", "content" => "be brief"}, %{"role" => "user"}, assistant, r1, r2] = body["messages"]

    assert [
             %{"id" => "c1", "type" => "function", "function" => %{"name" => "Read", "arguments" => ~s({"path":"a"})}},
             _
           ] = assistant["tool_calls"]

    assert r1 == %{"role" => "tool", "tool_call_id" => "c1", "content" => "A"}
    assert r2["tool_call_id"] == "c2"

    assert [%{"type" => "function", "function" => %{"name" => "Read", "parameters" => %{"type" => "object"}}}] =
             body["tools"]

    assert body["response_format"] == %{
             "type" => "json_schema",
             "json_schema" => %{"name" => "output", "schema" => %{"type" => "object"}, "strict" => true}
           }

    assert body["temperature"] == 0
    refute Map.has_key?(OpenAI.body(req(output: nil)), "response_format")
  end

  test "Anthropic: system apart, tool_use blocks, consecutive tool results in one user turn" do
    body = Anthropic.body(req([]))
    assert body["system"] == "be brief"
    assert [%{"role" => "user", "content" => "read a and b"}, assistant, results] = body["messages"]

    assert [%{"type" => "text", "text" => "ok"}, %{"type" => "tool_use", "id" => "c1", "input" => %{"path" => "a"}}, _] =
             assistant["content"]

    assert %{"role" => "user", "content" => [r1, r2]} = results
    assert r1 == %{"type" => "tool_result", "tool_use_id" => "c1", "content" => "A", "is_error" => false}
    assert r2["is_error"] == true
    assert [%{"name" => "Read", "input_schema" => %{"type" => "object"}}] = body["tools"]
  end

  test "model settings resolve to a provider" do
    assert {:ok, {Anthropic, "claude-sonnet-4-5"}} = Condukt.Provider.resolve("anthropic:claude-sonnet-4-5")
    assert {:ok, {OpenAI, "llama3:8b"}} = Condukt.Provider.resolve("openai:llama3:8b")
    assert {:ok, {OpenAI, "x"}} = Condukt.Provider.resolve({OpenAI, "x"})
    assert {:error, %Condukt.Error{reason: :invalid_model}} = Condukt.Provider.resolve({String, "x"})
    assert {:error, %Condukt.Error{reason: :invalid_model}} = Condukt.Provider.resolve("openai:")
  end
end
