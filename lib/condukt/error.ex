defmodule Condukt.Error do
  @moduledoc """
  Why an agent run failed: the error of `Condukt.run/3`,
  `Condukt.Session.run/3` and the providers.

  | reason | meaning |
  |--------|---------|
  | `:invalid_option` | an unknown or ill-typed option (`:detail` is a `t:Condukt.Options.error/0`) |
  | `:invalid_agent` | not a module that `use`s `Condukt` |
  | `:invalid_model` | the model is not `"provider:name"` with a known provider |
  | `:sandbox` | the sandbox did not start (`:detail` is a `Condukt.Sandbox.Error`) |
  | `:session_store` | the session store failed to load or save (`:detail` says why) |
  | `:http` | the provider could not be reached (`:detail` is the transport error) |
  | `:http_status` | the provider answered an error status after the retries (`:detail` has `:status` and `:body`) |
  | `:bad_response` | the provider's answer could not be understood (`:detail` says why) |
  | `:invalid_output` | the final answer is not JSON matching the `:output` schema (`:detail` has `:text` and `:errors`) |
  | `:max_turns` | the model kept calling tools past `:max_turns` |
  | `:busy` | the session is already running a prompt |
  | `:timeout` | the run did not finish within its `:timeout` |
  | `:session_exit` | the session process exited during the run (`:detail` is the exit reason) |
  """

  @type reason ::
          :invalid_option
          | :invalid_agent
          | :invalid_model
          | :sandbox
          | :session_store
          | :http
          | :http_status
          | :bad_response
          | :invalid_output
          | :max_turns
          | :busy
          | :timeout
          | :session_exit

  @type t :: %__MODULE__{reason: reason(), detail: term()}

  defexception [:reason, :detail]

  @impl true
  def message(%__MODULE__{reason: :invalid_option, detail: detail}),
    do: "invalid option: " <> if(is_tuple(detail), do: Condukt.Options.format_error(detail), else: describe(detail))

  def message(%__MODULE__{reason: :invalid_agent, detail: d}), do: "not a Condukt agent: #{describe(d)}"
  def message(%__MODULE__{reason: :invalid_model, detail: d}), do: "invalid model: #{describe(d)}"
  def message(%__MODULE__{reason: :sandbox, detail: d}), do: "the sandbox did not start: #{describe(d)}"
  def message(%__MODULE__{reason: :session_store, detail: d}), do: "session store: #{describe(d)}"
  def message(%__MODULE__{reason: :http, detail: d}), do: "the model provider could not be reached: #{describe(d)}"

  def message(%__MODULE__{reason: :http_status, detail: %{status: status, body: body}}),
    do: "the model provider answered HTTP #{status}: #{String.slice(to_string(body), 0, 500)}"

  def message(%__MODULE__{reason: :bad_response, detail: d}),
    do: "the model provider's answer could not be understood: #{describe(d)}"

  def message(%__MODULE__{reason: :invalid_output, detail: %{errors: errors}}),
    do: "the answer does not match the output schema: " <> Enum.join(errors, "; ")

  def message(%__MODULE__{reason: :max_turns, detail: n}), do: "the model was still calling tools after #{n} turns"
  def message(%__MODULE__{reason: :busy}), do: "the session is already running a prompt"
  def message(%__MODULE__{reason: :timeout, detail: ms}), do: "the run did not finish within #{ms} ms"
  def message(%__MODULE__{reason: :session_exit, detail: d}), do: "the session exited: #{describe(d)}"
  def message(%__MODULE__{reason: reason, detail: d}), do: "#{reason}: #{describe(d)}"

  defp describe(text) when is_binary(text), do: text
  defp describe(e) when is_exception(e), do: Exception.message(e)
  defp describe(other), do: inspect(other, limit: 20)
end
