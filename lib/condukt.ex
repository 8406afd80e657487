defmodule Condukt do
  @moduledoc """
  AI-agent sessions in sandboxes, with an egress network policy enforced by
  a native sidecar (`condukt-egress`).

  ## Defining an agent

  `use Condukt` makes a module an agent. Every callback has a default and
  can be overridden:

      defmodule MyApp.CodingAgent do
        use Condukt

        @impl true
        def system_prompt, do: "You are a careful Elixir engineer."

        @impl true
        def tools, do: Condukt.Tools.coding_tools()

        @impl true
        def sandbox do
          {Condukt.Sandbox.Local,
           cwd: "/srv/project",
           network_policy: %Condukt.Sandbox.NetworkPolicy{
             rules: [
               allow: ["api.github.com", "hex.pm"],
               decide: {Condukt.Sandbox.NetworkPolicy.AgentDecider, agent: MyApp.NetGuard}
             ],
             default: :deny
           }}
        end
      end

  | callback | default | what |
  |----------|---------|------|
  | `c:system_prompt/0` | `nil` | the agent's instructions |
  | `c:tools/0` | `[]` | `Condukt.Tool` modules the model may call |
  | `c:sandbox/0` | `nil` (Local at the cwd) | where the tools act: a module or `{module, opts}` |
  | `c:model/0` | `"anthropic:claude-sonnet-4-5"` | `"provider:model"` (`Condukt.Provider`) |
  | `c:model_options/0` | `[]` | `:base_url`, `:api_key`, `:max_tokens`, `:temperature`, `:timeout`, `:retries` |

  The module gets `start_link/1` and `child_spec/1`, which start a
  `Condukt.Session` (see its options).

  ## Running it

      # A session that lives on, one prompt after another:
      {:ok, agent} = MyApp.CodingAgent.start_link(api_key: System.fetch_env!("ANTHROPIC_API_KEY"))
      {:ok, answer} = Condukt.Session.run(agent, "What does lib/my_app.ex do?")

      # One shot: start, run, stop.
      {:ok, answer} = Condukt.run(MyApp.CodingAgent, "Summarize README.md")

      # A structured answer, validated against a JSON schema:
      {:ok, %{"verdict" => _, "summary" => _}} =
        Condukt.run(MyApp.Reviewer, %{diff: diff},
          output: %{
            type: "object",
            properties: %{verdict: %{type: "string", enum: ["approve", "comment"]}, summary: %{type: "string"}},
            required: ["verdict", "summary"]
          }
        )

  `docs/agents.md` is the guide.
  """

  alias Condukt.{Error, Session}

  @doc "The agent's instructions (the system prompt), or nil."
  @callback system_prompt() :: String.t() | nil

  @doc "The tools the model may call."
  @callback tools() :: [module()]

  @doc "The agent's default sandbox, or nil for `{Condukt.Sandbox.Local, cwd: File.cwd!()}`."
  @callback sandbox() :: nil | module() | {module(), keyword()}

  @doc "The model, as `\"provider:model\"` (for example `\"openai:gpt-4.1-mini\"`)."
  @callback model() :: String.t() | {module(), String.t()}

  @doc """
  Model settings: `:base_url`, `:api_key`, `:max_tokens`, `:temperature`,
  `:timeout` (per request, ms) and `:retries`. `start_link/1` options of
  the same names win.
  """
  @callback model_options() :: keyword()

  @doc false
  defmacro __using__(_opts) do
    quote location: :keep do
      @behaviour Condukt

      @doc false
      def __condukt_agent__, do: true

      @impl Condukt
      def system_prompt, do: nil

      @impl Condukt
      def tools, do: []

      @impl Condukt
      def sandbox, do: nil

      @impl Condukt
      def model, do: "anthropic:claude-sonnet-4-5"

      @impl Condukt
      def model_options, do: []

      defoverridable system_prompt: 0, tools: 0, sandbox: 0, model: 0, model_options: 0

      @doc "Starts a `Condukt.Session` of this agent; see its options."
      @spec start_link(keyword()) :: {:ok, pid()} | {:error, Condukt.Error.t()}
      def start_link(opts \\ []), do: Condukt.Session.start_link(__MODULE__, opts)

      @doc false
      def child_spec(opts) do
        %{id: __MODULE__, start: {__MODULE__, :start_link, [opts]}, type: :worker, restart: :permanent}
      end

      defoverridable child_spec: 1
    end
  end

  @run_keys [:output, :timeout, :on_event]

  @doc """
  Runs an agent on `input` and returns its final answer.

  `agent` is an agent module (a session is started for this run, under
  Condukt's supervisor, and stopped afterwards, also when the caller
  dies) or a running session (`Condukt.Session.run/3`). `input` is the
  prompt, or a map that is sent as JSON.

  Options: everything `Condukt.Session` accepts (for a module), plus

    * `:output` — a JSON schema. The answer must be one JSON object
      matching it; `{:ok, map}` carries it decoded (string keys). Where the
      provider can enforce a schema it is passed through
      (OpenAI-compatible servers); otherwise the answer is decoded and
      validated, and a mismatch is
      `{:error, %Condukt.Error{reason: :invalid_output}}`.
    * `:timeout` — milliseconds for the whole run (default 300 000).
    * `:on_event` — streams the answer's text and reports tool calls; see
      `Condukt.Session.run/3`.

  ## Examples

      {:ok, text} = Condukt.run(MyApp.CodingAgent, "What does this project do?")

      {:ok, %{"decision" => "allow"}} =
        Condukt.run(MyApp.NetGuard, "api.github.com, GET /repos/elixir-lang/elixir",
          output: %{type: "object", properties: %{decision: %{enum: ["allow", "deny"]}}, required: ["decision"]}
        )
  """
  @spec run(module() | GenServer.server(), String.t() | map(), keyword()) ::
          {:ok, String.t() | map()} | {:error, Error.t()}
  def run(agent, input, opts \\ [])

  def run(agent, input, opts) when is_map(input), do: run(agent, Condukt.JSON.encode!(input), opts)

  def run(agent, input, opts) when is_atom(agent) and is_binary(input) and is_list(opts) do
    {run_opts, session_opts} = Keyword.split(opts, @run_keys)

    # An atom is an agent module or a registered session's name.
    agent? = Code.ensure_loaded?(agent) and function_exported?(agent, :__condukt_agent__, 0)

    if agent? or is_nil(Process.whereis(agent)),
      do: one_shot(agent, input, session_opts, run_opts),
      else: Session.run(agent, input, run_opts)
  end

  def run(session, input, opts) when is_binary(input) and is_list(opts), do: Session.run(session, input, opts)

  defp one_shot(agent, input, session_opts, run_opts) do
    spec = {Session, {agent, Keyword.put(session_opts, :owner, self())}}

    case DynamicSupervisor.start_child(Condukt.SessionSupervisor, spec) do
      {:ok, pid} ->
        try do
          Session.run(pid, input, run_opts)
        after
          stop_quietly(pid)
        end

      {:error, %Error{} = error} ->
        {:error, error}

      {:error, other} ->
        {:error, %Error{reason: :session_exit, detail: other}}
    end
  end

  defp stop_quietly(pid) do
    DynamicSupervisor.terminate_child(Condukt.SessionSupervisor, pid)
    :ok
  end

  @doc """
  The path of the `condukt-egress` binary built into this application's
  `priv/` directory.
  """
  @spec egress_binary() :: Path.t()
  def egress_binary, do: Application.app_dir(:condukt, "priv/condukt-egress")
end
