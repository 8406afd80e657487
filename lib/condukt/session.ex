defmodule Condukt.Session do
  @moduledoc """
  One agent session: a process that holds the session's id, its message
  history and its sandbox, and runs the model/tool loop.

  Start one through the agent module (`use Condukt` defines `start_link/1`
  and `child_spec/1`, so a session can sit in your supervision tree):

      {:ok, agent} = MyApp.CodingAgent.start_link(api_key: System.fetch_env!("ANTHROPIC_API_KEY"))
      {:ok, answer} = Condukt.Session.run(agent, "What does lib/my_app.ex do?")
      {:ok, answer} = Condukt.Session.run(agent, "Now add a test for it.")

  A job runner that retries passes the same id each time; with a session
  store the conversation survives the retry, and the sandbox (a Kubernetes
  pod, say) is found again by the same id:

      def perform(%Oban.Job{id: job_id, args: %{"prompt" => prompt}}) do
        {:ok, agent} =
          MyApp.CodingAgent.start_link(
            id: job_id,
            api_key: System.get_env("ANTHROPIC_API_KEY"),
            sandbox: {Condukt.Sandbox.Kubernetes, namespace: "agents"},
            session_store: Condukt.SessionStore.Disk
          )

        Condukt.Session.run(agent, prompt)
      end

  ## Options

  #{Condukt.Options.docs(Condukt.Session.Schema.session())}

  ## At start

  The sandbox is resolved in this order: the `:sandbox` option, the agent's
  `sandbox/0`, then `{Condukt.Sandbox.Local, cwd: cwd}`. It is started with
  two defaults that the sandbox spec may override: `:id` (the session id)
  and `:messages` (a reader of this session's history, which the network
  policy's decide rules receive as `recent_messages`). A sandbox module of
  your own should accept and may ignore both. A started `Condukt.Sandbox`
  passed as `:sandbox` is used as is and not shut down by the session.

  Then `AGENTS.md`, `CLAUDE.md` and `.agents/skills/*/SKILL.md` are read
  through that sandbox (so a session in a pod reads the pod's workspace)
  and appended to the system prompt, unless `load_project_instructions:
  false`. With a `:session_store`, the messages saved under the session id
  are restored.

  ## The loop

  `run/3` appends the prompt as a user message and asks the model. When the
  model calls tools, the session runs them (`Condukt.Tool.run/3`, through
  the sandbox) and sends their results back, until the model answers
  without calling a tool; that answer is the result. A failing tool is a
  tool result marked as an error, never a crash. The loop runs in a task, so
  the session process keeps answering `messages/1` (which the network
  policy's deciders read while a command waits for a decision).
  """

  use GenServer

  require Logger

  alias Condukt.{Error, Message, Options, Sandbox}
  alias Condukt.Session.{Instructions, Loop, Schema}

  @default_model "anthropic:claude-sonnet-4-5"

  @type session :: GenServer.server()

  @doc """
  Starts a session of `agent` (a module that `use`s `Condukt`). Returns
  `{:error, %Condukt.Error{}}` when an option is invalid, the sandbox does
  not start or the session store cannot be read.
  """
  @spec start_link(module(), keyword()) :: {:ok, pid()} | {:error, Error.t()}
  def start_link(agent, opts \\ []), do: start(agent, opts, :link)

  @doc "Like `start_link/2`, without a link to the caller."
  @spec start(module(), keyword(), :link | :nolink) :: {:ok, pid()} | {:error, Error.t()}
  def start(agent, opts, link \\ :nolink) do
    with :ok <- check_agent(agent),
         {:ok, opts} <- validate(opts) do
      ref = make_ref()
      gen_opts = if opts[:name], do: [name: opts[:name]], else: []
      starter = self()
      args = {agent, opts, starter, ref}

      result =
        if link == :link,
          do: GenServer.start_link(__MODULE__, args, gen_opts),
          else: GenServer.start(__MODULE__, args, gen_opts)

      # init/1 answers :ignore after sending why; see init/1.
      case result do
        :ignore -> receive(do: ({^ref, error} -> {:error, error}))
        other -> other
      end
    end
  end

  @doc false
  def child_spec({agent, opts}) do
    %{id: {__MODULE__, opts[:id]}, start: {__MODULE__, :start_link, [agent, opts]}, restart: :temporary}
  end

  @doc """
  Runs `prompt` to a final answer: `{:ok, text}`, or with an `:output`
  schema `{:ok, map}` (the decoded, validated JSON answer).

  Options:

    * `:output` — a JSON schema for a structured answer (see `Condukt.run/3`).
    * `:timeout` — milliseconds for the whole run (default 300 000); on
      expiry the run is cancelled.
    * `:on_event` — a 1-arity function called, in the session's loop task,
      with `{:text, chunk}` as the model's text streams in (the providers
      then stream), `{:tool_call, %{id:, name:, arguments:}}` before a tool
      runs and `{:tool_result, %Condukt.Message{}}` after. An exception in
      it is logged and ignored.

      {:ok, text} = Condukt.Session.run(agent, "List the modules under lib/.")

      Condukt.Session.run(agent, "Explain OTP.", on_event: fn
        {:text, chunk} -> IO.write(chunk)
        {:tool_call, call} -> IO.puts("\n→ \#{call.name}")
        {:tool_result, _message} -> :ok
      end)
  """
  @spec run(session(), String.t(), keyword()) :: {:ok, String.t() | map()} | {:error, Error.t()}
  def run(session, prompt, opts \\ []) when is_binary(prompt) do
    timeout = Keyword.get(opts, :timeout, 300_000)

    try do
      GenServer.call(session, {:run, prompt, Keyword.take(opts, [:output, :on_event])}, timeout)
    catch
      :exit, {:timeout, _} ->
        GenServer.cast(session, :cancel)
        {:error, %Error{reason: :timeout, detail: timeout}}

      :exit, {reason, _} ->
        {:error, %Error{reason: :session_exit, detail: reason}}
    end
  end

  @doc "The session's messages, oldest first."
  @spec messages(session()) :: [Message.t()]
  def messages(session), do: GenServer.call(session, :messages)

  @doc "The session id."
  @spec id(session()) :: term()
  def id(session), do: GenServer.call(session, :id)

  @doc "The session's sandbox (for tools and tests that act as the session)."
  @spec sandbox(session()) :: Sandbox.t()
  def sandbox(session), do: GenServer.call(session, :sandbox)

  @doc """
  The system prompt the session sends: the agent's prompt followed by the
  project instructions it found in the sandbox.
  """
  @spec system_prompt(session()) :: String.t() | nil
  def system_prompt(session), do: GenServer.call(session, :system_prompt)

  @doc "Stops the session; its sandbox is shut down."
  @spec stop(session()) :: :ok
  def stop(session), do: GenServer.stop(session, :normal)

  ## Server --------------------------------------------------------------

  @impl true
  def init({agent, opts, starter, ref}) do
    # terminate/2 shuts the sandbox down, also when the parent exits.
    Process.flag(:trap_exit, true)
    id = opts[:id] || generate_id()

    case setup(agent, id, opts) do
      {:ok, state} ->
        {:ok, %{state | owner_ref: opts[:owner] && Process.monitor(opts[:owner])}}

      {:error, error} ->
        # {:stop, reason} would also kill a linked caller; :ignore does
        # not, and start/3 picks the reason up from this message.
        send(starter, {ref, error})
        :ignore
    end
  end

  defp setup(agent, id, opts) do
    settings = settings(agent, opts)

    with {:ok, {provider, model}} <- Condukt.Provider.resolve(settings.model),
         {:ok, messages} <- restore(opts[:session_store], id, agent),
         {:ok, sandbox, owned?} <- start_sandbox(agent, id, opts) do
      system = system_prompt(agent, opts, sandbox)
      tools = opts[:tools] || agent.tools()

      state = %{
        id: id,
        agent: agent,
        store: opts[:session_store],
        sandbox: sandbox,
        sandbox_owned?: owned?,
        messages: messages,
        provider: provider,
        request: %{
          model: model,
          system: system,
          messages: [],
          tools: Enum.map(tools, &Condukt.Tool.spec/1),
          output: nil,
          max_tokens: settings.max_tokens,
          temperature: settings.temperature,
          base_url: settings.base_url,
          api_key: opts[:api_key] || settings.api_key,
          timeout: settings.timeout,
          retries: settings.retries,
          on_text: nil
        },
        tools: Map.new(tools, &{&1.name(), &1}),
        max_turns: opts[:max_turns],
        parent_id: opts[:parent_id],
        owner_ref: nil,
        running: nil
      }

      {:ok, state}
    end
  end

  # start_link options win over model_options/0, which win over defaults.
  defp settings(agent, opts) do
    mo = agent.model_options()

    %{
      model: opts[:model] || agent.model() || @default_model,
      base_url: opts[:base_url] || mo[:base_url],
      api_key: mo[:api_key],
      max_tokens: opts[:max_tokens] || mo[:max_tokens] || 4096,
      temperature: if(Map.has_key?(opts, :temperature), do: opts[:temperature], else: mo[:temperature]),
      timeout: opts[:timeout] || mo[:timeout] || 120_000,
      retries: opts[:retries] || mo[:retries] || 3
    }
  end

  defp system_prompt(agent, opts, sandbox) do
    base = opts[:system_prompt] || agent.system_prompt()
    project = if opts[:load_project_instructions], do: Instructions.load(sandbox)

    case Enum.reject([base, project], &(&1 in [nil, ""])) do
      [] -> nil
      parts -> Enum.join(parts, "\n\n")
    end
  end

  defp start_sandbox(_agent, _id, %{sandbox: %Sandbox{} = sb}), do: {:ok, sb, false}

  defp start_sandbox(agent, id, opts) do
    spec =
      case opts[:sandbox] do
        %Sandbox{} = sb -> sb
        nil -> agent.sandbox() || {Sandbox.Local, cwd: opts[:cwd] || File.cwd!()}
        spec -> spec
      end

    if match?(%Sandbox{}, spec) do
      {:ok, spec, false}
    else
      # The spec's own :id and :messages win (Condukt.Sandbox.new/2).
      case Sandbox.new(spec, id: id, messages: {__MODULE__, :messages, [self()]}) do
        {:ok, sb} -> {:ok, sb, true}
        {:error, e} -> {:error, %Error{reason: :sandbox, detail: e}}
      end
    end
  end

  defp restore(nil, _id, _agent), do: {:ok, []}

  defp restore(store, id, _agent) do
    case Condukt.SessionStore.load(store, id) do
      {:ok, messages} -> {:ok, messages}
      :not_found -> {:ok, []}
      {:error, why} -> {:error, %Error{reason: :session_store, detail: why}}
    end
  end

  @impl true
  def handle_call({:run, _prompt, _opts}, _from, %{running: %{}} = state),
    do: {:reply, {:error, %Error{reason: :busy}}, state}

  def handle_call({:run, prompt, opts}, from, state) do
    state = append(state, Message.user(prompt))
    session = self()
    tag = make_ref()
    output = if opts[:output], do: Condukt.JSONSchema.stringify(opts[:output])

    emit = emitter(opts[:on_event])

    cfg = %{
      provider: state.provider,
      request: %{
        state.request
        | output: output,
          system: output_system(state.request.system, output),
          on_text: emit && fn chunk -> emit.({:text, chunk}) end
      },
      emit: emit,
      tools: state.tools,
      tool_context: %{sandbox: state.sandbox, session_id: state.id, agent: state.agent},
      output: output,
      max_turns: state.max_turns
    }

    messages = state.messages
    task = Task.async(fn -> Loop.run(cfg, messages, &send(session, {tag, :message, &1})) end)
    {:noreply, %{state | running: %{task: task, from: from, tag: tag}}}
  end

  def handle_call(:messages, _from, state), do: {:reply, state.messages, state}
  def handle_call(:id, _from, state), do: {:reply, state.id, state}
  def handle_call(:sandbox, _from, state), do: {:reply, state.sandbox, state}
  def handle_call(:system_prompt, _from, state), do: {:reply, state.request.system, state}

  @impl true
  def handle_cast(:cancel, %{running: %{task: task, from: from}} = state) do
    Task.shutdown(task, :brutal_kill)
    GenServer.reply(from, {:error, %Error{reason: :timeout, detail: :cancelled}})
    {:noreply, %{state | running: nil}}
  end

  def handle_cast(:cancel, state), do: {:noreply, state}

  @impl true
  def handle_info({tag, :message, %Message{} = msg}, %{running: %{tag: tag}} = state),
    do: {:noreply, append(state, msg)}

  def handle_info({ref, result}, %{running: %{task: %{ref: ref}, from: from}} = state) do
    Process.demonitor(ref, [:flush])
    GenServer.reply(from, result)
    {:noreply, %{state | running: nil}}
  end

  def handle_info({:DOWN, ref, :process, _, reason}, %{running: %{task: %{ref: ref}, from: from}} = state) do
    GenServer.reply(from, {:error, %Error{reason: :session_exit, detail: reason}})
    {:noreply, %{state | running: nil}}
  end

  # The owner of a one-shot run (Condukt.run/3) went away: nobody waits
  # for this session any more.
  def handle_info({:DOWN, ref, :process, _pid, _reason}, %{owner_ref: ref} = state), do: {:stop, :normal, state}
  def handle_info({:EXIT, _pid, _reason}, state), do: {:noreply, state}
  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state) do
    if state.running, do: Task.shutdown(state.running.task, :brutal_kill)
    if state.sandbox_owned?, do: Sandbox.shutdown(state.sandbox)
    :ok
  end

  defp append(state, msg) do
    state = %{state | messages: state.messages ++ [msg]}

    if state.store do
      case Condukt.SessionStore.save(state.store, state.id, state.messages) do
        :ok -> :ok
        {:error, why} -> Logger.error("condukt: session #{inspect(state.id)}: could not save: #{inspect(why)}")
      end
    end

    state
  end

  # The agent's prompt describes the task; the wire format of a structured
  # answer is the caller's business and is added here, not by the agent.
  defp output_system(system, nil), do: system

  defp output_system(system, schema) do
    format =
      "Answer with one JSON object and nothing else. It must match this JSON schema:\n" <>
        Condukt.JSON.encode!(schema)

    Enum.join(Enum.reject([system, format], &is_nil/1), "\n\n")
  end

  defp emitter(nil), do: nil

  defp emitter(fun) when is_function(fun, 1) do
    fn event ->
      try do
        fun.(event)
      rescue
        e -> Logger.error("condukt: an :on_event function raised: " <> Exception.message(e))
      end
    end
  end

  defp check_agent(agent) do
    if is_atom(agent) and Code.ensure_loaded?(agent) and function_exported?(agent, :__condukt_agent__, 0),
      do: :ok,
      else: {:error, %Error{reason: :invalid_agent, detail: "#{inspect(agent)} does not `use Condukt`"}}
  end

  defp validate(opts) when is_list(opts) do
    case Options.validate(opts, Schema.session()) do
      {:ok, opts} -> {:ok, Map.new(opts)}
      {:error, e} -> {:error, %Error{reason: :invalid_option, detail: e}}
    end
  end

  defp validate(other),
    do: {:error, %Error{reason: :invalid_option, detail: "expected a keyword list, got: #{inspect(other)}"}}

  defp generate_id, do: "ses_" <> Base.encode16(:crypto.strong_rand_bytes(8), case: :lower)
end
