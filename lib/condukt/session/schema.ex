defmodule Condukt.Session.Schema do
  @moduledoc false
  # The options of Condukt.Session.start_link/2 (and the session part of
  # Condukt.run/3), in one place so that validation and docs agree.

  @spec session() :: Condukt.Options.schema()
  def session do
    [
      id: [
        type: :any,
        doc:
          "the session id. Generated when absent. It flows into the sandbox as its `:id` unless the sandbox " <>
            "spec names its own, and keys the session store's snapshot."
      ],
      api_key: [
        type: {:custom, &string_or_nil/1},
        doc: "the provider's API key. Default: the provider's environment variable."
      ],
      model: [type: :any, doc: "`\"provider:model\"`, overriding the agent's `model/0`."],
      base_url: [type: :string, doc: "the provider's base URL (a local server, a proxy), overriding `model_options/0`."],
      max_tokens: [type: :pos_integer, doc: "the most tokens one answer may have. Default: 4096."],
      temperature: [type: {:custom, &temperature/1}, doc: "the sampling temperature. Default: the provider's."],
      timeout: [type: :pos_integer, doc: "milliseconds for one model request. Default: 120 000."],
      retries: [
        type: :non_neg_integer,
        doc: "retries of a model request on 429, 5xx and connection errors. Default: 3."
      ],
      system_prompt: [type: :string, doc: "overrides the agent's `system_prompt/0`."],
      tools: [type: {:custom, &tools/1}, doc: "overrides the agent's `tools/0` (a list of `Condukt.Tool` modules)."],
      sandbox: [
        type: :any,
        doc:
          "the sandbox: a module, `{module, opts}` or a started `Condukt.Sandbox`. Default: the agent's " <>
            "`sandbox/0`, then `{Condukt.Sandbox.Local, cwd: cwd}`."
      ],
      cwd: [type: :string, doc: "the directory of the default Local sandbox. Default: `File.cwd!/0`."],
      session_store: [
        type: :any,
        default: nil,
        doc:
          "a `Condukt.SessionStore` module or `{module, opts}`: restores the messages at start, saves them as they grow."
      ],
      load_project_instructions: [
        type: :boolean,
        default: true,
        doc: "read `AGENTS.md`, `CLAUDE.md` and `.agents/skills/*/SKILL.md` through the sandbox at start."
      ],
      max_turns: [
        type: :pos_integer,
        default: 25,
        doc: "how many model turns one `run` may take (each tool round is one)."
      ],
      parent_id: [type: :any, default: nil, doc: "the id of the session this one runs under, for sub-agents."],
      owner: [type: {:custom, &pid_or_nil/1}, default: nil, doc: "a process whose exit stops the session."],
      name: [type: :any, default: nil, doc: "a name to register the session process under."]
    ]
  end

  @doc false
  def string_or_nil(v) when is_binary(v) or is_nil(v), do: :ok
  def string_or_nil(_), do: {:error, "a string"}

  @doc false
  def temperature(v) when is_number(v) and v >= 0, do: :ok
  def temperature(nil), do: :ok
  def temperature(_), do: {:error, "a non-negative number"}

  @doc false
  def pid_or_nil(v) when is_pid(v) or is_nil(v), do: :ok
  def pid_or_nil(_), do: {:error, "a pid"}

  @doc false
  def tools(list) when is_list(list) do
    case Enum.reject(list, &tool?/1) do
      [] -> :ok
      bad -> {:error, "a list of Condukt.Tool modules (not: #{inspect(bad)})"}
    end
  end

  def tools(_), do: {:error, "a list of Condukt.Tool modules"}

  defp tool?(m),
    do: is_atom(m) and Code.ensure_loaded?(m) and function_exported?(m, :call, 2) and function_exported?(m, :name, 0)
end
