defmodule Condukt.Provider do
  @moduledoc """
  The behaviour of a model provider: one chat turn in, one answer out.

  Two providers ship, picked by the prefix of the agent's model:

  | model | provider | API |
  |-------|----------|-----|
  | `"anthropic:claude-sonnet-4-5"` | `Condukt.Providers.Anthropic` | Anthropic Messages (`POST /v1/messages`) |
  | `"openai:gpt-4.1-mini"` | `Condukt.Providers.OpenAI` | OpenAI-compatible chat completions (`POST /chat/completions`), which local servers such as llama.cpp, vLLM or Ollama also speak |

  `:base_url` points either at another server (`"http://127.0.0.1:8080/v1"`
  for a local OpenAI-compatible one). A custom provider is a module
  implementing `c:chat/1`, named as `{MyProvider, "model-name"}` in the
  `:model` option.

  ## Structured output

  When the request carries an `:output` schema, a provider that can make
  the server enforce it says so by returning `schema_enforced: true`
  (OpenAI-compatible servers get `response_format: json_schema`); the
  Anthropic Messages API has no such switch. Either way the session then
  decodes the answer and validates it against the schema
  (`Condukt.JSONSchema`), so an unenforced answer that does not fit is
  rejected rather than trusted.

  ## HTTP

  Providers talk HTTP through `Condukt.Provider.HTTP` (OTP's `:httpc`,
  certificate verification against the system's CA store, timeouts, retries
  with backoff on 429 and 5xx).
  """

  alias Condukt.{Error, Message}

  @type tool_spec :: %{name: String.t(), description: String.t(), parameters: map()}

  @typedoc "One chat turn, as the session hands it to a provider."
  @type request :: %{
          model: String.t(),
          system: String.t() | nil,
          messages: [Message.t()],
          tools: [tool_spec()],
          output: map() | nil,
          max_tokens: pos_integer(),
          temperature: number() | nil,
          base_url: String.t() | nil,
          api_key: String.t() | nil,
          timeout: pos_integer(),
          retries: non_neg_integer()
        }

  @typedoc "The provider's answer."
  @type response :: %{
          text: String.t() | nil,
          tool_calls: [Message.tool_call()],
          stop_reason: String.t() | nil,
          schema_enforced: boolean(),
          usage: map()
        }

  @doc "Sends one turn and returns the model's answer."
  @callback chat(request()) :: {:ok, response()} | {:error, Error.t()}

  @providers %{"anthropic" => Condukt.Providers.Anthropic, "openai" => Condukt.Providers.OpenAI}

  @doc """
  Splits a model setting into the provider module and the model name:
  `"anthropic:claude-sonnet-4-5"` → `{Condukt.Providers.Anthropic, "claude-sonnet-4-5"}`.
  """
  @spec resolve(String.t() | {module(), String.t()}) :: {:ok, {module(), String.t()}} | {:error, Error.t()}
  def resolve({module, name}) when is_atom(module) and is_binary(name) do
    if Code.ensure_loaded?(module) and function_exported?(module, :chat, 1),
      do: {:ok, {module, name}},
      else: {:error, %Error{reason: :invalid_model, detail: "#{inspect(module)} does not implement Condukt.Provider"}}
  end

  def resolve(model) when is_binary(model) do
    with [prefix, name] when name != "" <- String.split(model, ":", parts: 2),
         {:ok, module} <- Map.fetch(@providers, prefix) do
      {:ok, {module, name}}
    else
      _ ->
        {:error,
         %Error{
           reason: :invalid_model,
           detail:
             "expected \"provider:model\" with provider one of #{inspect(Map.keys(@providers))}, got: #{inspect(model)}"
         }}
    end
  end

  def resolve(other), do: {:error, %Error{reason: :invalid_model, detail: "expected a string, got: #{inspect(other)}"}}
end
