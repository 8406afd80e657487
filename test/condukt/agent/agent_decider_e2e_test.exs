defmodule Condukt.Sandbox.NetworkPolicy.AgentDeciderE2ETest do
  # End to end: a session whose Local sandbox enforces a policy with
  # `decide: {AgentDecider, agent: ...}` runs curl through its Bash tool;
  # the real sidecar asks the BEAM, the real local model decides, and the
  # telemetry shows it (netns tier + llm tier).
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.{Session, Tool, Tools}
  alias Condukt.Dev.{LLM, NetGuard}
  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.AgentDecider

  @moduletag :llm
  @moduletag :capture_log
  if reason = LLM.skip_reason(), do: @moduletag(skip: "llm tier: " <> reason)

  @events Enum.map(~w(request_allowed request_denied decider_failure)a, &[:condukt, :sandbox, :network_policy, &1])

  defmodule CodingAgent do
    use Condukt

    @impl true
    def system_prompt, do: "You are a coding agent. Answer in one short sentence."

    @impl true
    def tools, do: Condukt.Tools.coding_tools()
  end

  setup_all do
    %{tb: Testbed.start()}
  end

  setup %{tb: tb} do
    test = self()
    id = {__MODULE__, make_ref()}
    :telemetry.attach_many(id, @events, fn name, m, meta, _ -> send(test, {:telemetry, name, m, meta}) end, nil)
    on_exit(fn -> :telemetry.detach(id) end)

    cwd = Path.join(tb.dir, "scratch/agent-#{System.unique_integer([:positive])}")
    File.mkdir_p!(cwd)
    %{cwd: cwd}
  end

  defp network(tb) do
    [
      uplink: {:netns, tb.inet_ns},
      hosts: Map.new(~w(denied.test decide.test), &{&1, tb.inet.v4}),
      allow_private: [tb.inet.v4 <> "/32"],
      upstream_ca: tb.ca_cert,
      binary: Condukt.Test.Netns.Sidecar.bin()
    ]
  end

  defp start_session(tb, cwd, decide) do
    policy = NetworkPolicy.new!(rules: [deny: ["denied.test"], decide: decide], default: :deny)

    sandbox =
      {Condukt.Sandbox.Local, cwd: cwd, network_policy: policy, network: network(tb), network_policy_required: true}

    {:ok, agent} = CodingAgent.start_link([sandbox: sandbox] ++ LLM.openai_options())
    # The session is linked to the test process and shuts its sandbox
    # down (namespace, sidecar) when the test ends.
    agent
  end

  # The session's Bash tool, as the model would call it.
  defp curl(agent, url) do
    ctx = %{sandbox: Session.sandbox(agent), session_id: Session.id(agent), agent: CodingAgent}
    {:ok, out} = Tool.run(Tools.Bash, %{"command" => "curl -sS --max-time 60 -w '\\n%{http_code}' #{url}"}, ctx)
    String.replace_suffix(out, "\n[exit code: 0]", "")
  end

  test "the real model decides a request of the session's workspace", %{tb: tb, cwd: cwd} do
    agent = start_session(tb, cwd, call: {AgentDecider, [agent: NetGuard] ++ LLM.openai_options()}, timeout: 60_000)
    {:ok, _} = Session.run(agent, "We need the project page at decide.test for this task.")

    out = curl(agent, "https://decide.test/")

    assert_receive {:telemetry, [_, _, _, event], _, %{request: %{host: "decide.test"}, matched_rule: rule} = meta},
                   60_000

    assert event in [:request_allowed, :request_denied]
    assert rule == %{index: 1, kind: :decide}

    case event do
      :request_allowed ->
        assert out =~ "hello from decide.test"

      :request_denied ->
        # The model's own reason, not a failure.
        assert out =~ ~r/\n403\z/
        assert is_binary(meta.reason) and meta.reason != ""
        refute meta.reason =~ "decider_"
    end

    refute_received {:telemetry, [_, _, _, :decider_failure], _, _}

    # A static deny rule still wins before the decider is asked.
    assert curl(agent, "https://denied.test/") =~ ~r/\n403\z/

    assert_receive {:telemetry, [_, _, _, :request_denied], _,
                    %{request: %{host: "denied.test"}, matched_rule: %{index: 0}}},
                   30_000
  end

  test "the session's messages are the decider's recent_messages", %{tb: tb, cwd: cwd} do
    test = self()

    decide = [
      call: fn ctx, _req ->
        send(test, {:context, ctx})
        :allow
      end,
      context_messages: 2
    ]

    agent = start_session(tb, cwd, decide)
    {:ok, _} = Session.run(agent, "Fetch decide.test.")
    assert curl(agent, "https://decide.test/") =~ "hello from decide.test"

    assert_receive {:context, ctx}, 30_000
    assert ctx.recent_messages == Enum.take(Session.messages(agent), -2)
    assert [%{role: :user, content: "Fetch decide.test."}, %{role: :assistant}] = ctx.recent_messages
    assert ctx.session_id == Session.id(agent)
  end

  test "a decider timeout and a malformed answer fail closed", %{tb: tb, cwd: cwd} do
    slow = start_session(tb, cwd, call: {AgentDecider, [agent: NetGuard] ++ LLM.openai_options()}, timeout: 1)
    assert curl(slow, "https://decide.test/") =~ ~r/\n403\z/
    assert_receive {:telemetry, [_, _, _, :decider_failure], %{count: 1}, %{reason: :decider_timeout}}, 30_000

    assert_receive {:telemetry, [_, _, _, :request_denied], _, %{request: %{host: "decide.test"}, reason: reason}},
                   30_000

    assert to_string(reason) =~ "decider_timeout"

    # llama.cpp's Anthropic-style endpoint does not enforce the schema.
    prose = Keyword.merge(LLM.openai_options(), model: "anthropic:smollm2", base_url: LLM.url(), max_tokens: 40)
    bad = start_session(tb, cwd, call: {AgentDecider, [agent: NetGuard] ++ prose}, timeout: 60_000)
    assert curl(bad, "https://decide.test/") =~ ~r/\n403\z/
    assert_receive {:telemetry, [_, _, _, :decider_failure], %{count: 1}, %{reason: :decider_bad_return}}, 60_000

    assert_receive {:telemetry, [_, _, _, :request_denied], _, %{request: %{host: "decide.test"}, reason: reason}},
                   30_000

    assert to_string(reason) =~ "decider_bad_return"
  end
end
