defmodule Condukt.SessionTest do
  # Sessions against the real local model (scripts/setup-llm.sh): llama.cpp's
  # server with SmolLM2-135M, one thread, temperature 0.
  use ExUnit.Case, async: false

  alias Condukt.{Message, Sandbox, Session}
  alias Condukt.Dev.LLM

  @moduletag :llm
  @moduletag :tmp_dir
  # `mix test --only llm` overrides the exclusion: skip with the reason.
  if reason = LLM.skip_reason(), do: @moduletag(skip: "llm tier: " <> reason)

  defmodule Assistant do
    use Condukt

    @impl true
    def system_prompt, do: "You are a terse assistant. Answer in one short sentence."
  end

  # The Oban worker of the docs, with a Local sandbox instead of a pod.
  defmodule Worker do
    def perform(job_id, prompt, dir, model_opts) do
      {:ok, agent} =
        Assistant.start_link(
          [
            id: job_id,
            api_key: System.get_env("ANTHROPIC_API_KEY"),
            sandbox: {Condukt.Sandbox.Local, cwd: dir},
            session_store: {Condukt.SessionStore.Disk, dir: Path.join(dir, "store")}
          ] ++ model_opts
        )

      {Condukt.Session.run(agent, prompt), agent}
    end
  end

  setup do
    %{model: LLM.openai_options()}
  end

  test "run/2 answers and records the conversation", %{model: model, tmp_dir: dir} do
    {:ok, agent} = Assistant.start_link([cwd: dir] ++ model)
    assert {:ok, text} = Session.run(agent, "Say hello.")
    assert is_binary(text) and text != ""

    assert [%Message{role: :user, content: "Say hello."}, %Message{role: :assistant, content: ^text}] =
             Session.messages(agent)

    assert "ses_" <> _ = Session.id(agent)
    # The session id flowed into the sandbox.
    assert Session.sandbox(agent).state.id == Session.id(agent)
  end

  test "the worker example: a retried job with the same id restores its messages", %{model: model, tmp_dir: dir} do
    {{:ok, _}, agent} = Worker.perform(4242, "Name a colour.", dir, model)
    assert length(Session.messages(agent)) == 2
    Session.stop(agent)
    assert File.exists?(Path.join(dir, "store/4242.json"))

    {{:ok, _}, agent} = Worker.perform(4242, "Name another colour.", dir, model)

    assert [%{content: "Name a colour."}, _, %{content: "Name another colour."}, %{role: :assistant}] =
             Session.messages(agent)

    Session.stop(agent)
  end

  test "Condukt.run/3 with :output: the server enforces the schema, the answer is validated", %{model: model} do
    schema = %{
      type: "object",
      properties: %{colour: %{type: "string", maxLength: 20}, warm: %{type: "boolean"}},
      required: ["colour", "warm"],
      additionalProperties: false
    }

    assert {:ok, %{"colour" => colour, "warm" => warm}} =
             Condukt.run(Assistant, "Pick a colour.", model ++ [output: schema])

    assert is_binary(colour) and is_boolean(warm)
  end

  test "without enforcement (the Anthropic-style endpoint) a non-JSON answer is rejected", %{model: model} do
    opts = Keyword.merge(model, model: "anthropic:smollm2", base_url: LLM.url(), max_tokens: 40)
    schema = %{type: "object", properties: %{n: %{type: "integer"}}, required: ["n"]}

    assert {:error, %Condukt.Error{reason: :invalid_output, detail: %{text: text, errors: [_ | _]}} = e} =
             Condukt.run(Assistant, "Write a poem about the sea.", opts ++ [output: schema])

    assert is_binary(text)
    assert Exception.message(e) =~ "does not match the output schema"
  end

  test "streaming: the text arrives in pieces through :on_event, on both APIs", %{model: model} do
    test = self()
    on_event = fn {:text, chunk} -> send(test, {:chunk, chunk}) end

    for opts <- [model, Keyword.merge(model, model: "anthropic:smollm2", base_url: LLM.url())] do
      assert {:ok, text} = Condukt.run(Assistant, "Name three animals.", opts ++ [on_event: on_event])
      chunks = collect_chunks([])
      assert length(chunks) > 1
      assert Enum.join(chunks) == text
    end

    # A streamed structured answer is validated like any other.
    schema = %{type: "object", properties: %{animal: %{type: "string", maxLength: 20}}, required: ["animal"]}

    assert {:ok, %{"animal" => _}} =
             Condukt.run(Assistant, "Pick an animal.", model ++ [output: schema, on_event: on_event])
  end

  defp collect_chunks(acc) do
    receive do
      {:chunk, c} -> collect_chunks([c | acc])
    after
      0 -> Enum.reverse(acc)
    end
  end

  test "project instructions are read through the sandbox", %{model: model, tmp_dir: dir} do
    File.write!(Path.join(dir, "AGENTS.md"), "Run mix test before every commit.\n")
    File.mkdir_p!(Path.join(dir, ".agents/skills/release"))
    File.write!(Path.join(dir, ".agents/skills/release/SKILL.md"), "To release, tag vX.Y.Z.\n")

    {:ok, agent} = Assistant.start_link([sandbox: {Sandbox.Local, cwd: dir}] ++ model)
    prompt = Session.system_prompt(agent)
    assert prompt =~ "You are a terse assistant."
    assert prompt =~ "# Project instructions: AGENTS.md\n\nRun mix test before every commit."
    assert prompt =~ "# Project instructions: .agents/skills/release/SKILL.md"

    {:ok, agent} = Assistant.start_link([sandbox: {Sandbox.Local, cwd: dir}, load_project_instructions: false] ++ model)
    refute Session.system_prompt(agent) =~ "AGENTS.md"
  end
end
