defmodule Condukt.AgentTest do
  # `use Condukt`, session start-up and the errors that need no model.
  use ExUnit.Case, async: true
  @moduletag :capture_log

  alias Condukt.{Error, Sandbox, Session}

  @moduletag :tmp_dir

  # The seeds' quick start, as written.
  defmodule MyApp.CodingAgent do
    use Condukt

    @impl true
    def sandbox do
      {
        Condukt.Sandbox.Kubernetes,
        namespace: "agents",
        image: "ghcr.io/myorg/agent:1.4",
        network_policy: %Condukt.Sandbox.NetworkPolicy{
          rules: [
            deny: ["*.internal.example.com"],
            allow: ["api.github.com", "*.openai.com"],
            decide: {Condukt.Sandbox.NetworkPolicy.AgentDecider, agent: MyApp.NetGuard}
          ],
          default: :deny
        }
      }
    end
  end

  defmodule MyApp.NetGuard do
    use Condukt

    @impl true
    def system_prompt do
      """
      You gate outbound network requests for an AI coding agent. You
      receive the request and recent session context. Allow well-known
      reputable API hosts the task plausibly needs; deny everything else.
      """
    end
  end

  defmodule Pinned do
    use Condukt

    @impl true
    def model, do: "openai:local"

    @impl true
    def model_options, do: [base_url: "http://127.0.0.1:9/v1", max_tokens: 64, retries: 0]

    @impl true
    def tools, do: Condukt.Tools.read_only_tools()
  end

  test "the quick start compiles and its policy is valid" do
    assert {Condukt.Sandbox.Kubernetes, opts} = MyApp.CodingAgent.sandbox()
    assert {:ok, policy} = Condukt.Sandbox.NetworkPolicy.new(opts[:network_policy])
    assert [_, _, {:decide, rule}] = policy.rules
    assert rule[:call] == {Condukt.Sandbox.NetworkPolicy.AgentDecider, agent: MyApp.NetGuard}
    assert MyApp.NetGuard.system_prompt() =~ "You gate outbound network requests"
    assert MyApp.NetGuard.model() == "anthropic:claude-sonnet-4-5"
    assert MyApp.NetGuard.tools() == []
  end

  test "sandbox resolution: :sandbox option, then sandbox/0, then Local at :cwd", %{tmp_dir: dir} do
    other = Path.join(dir, "other")
    File.mkdir_p!(other)

    {:ok, s} = Pinned.start_link(cwd: dir)
    assert %Sandbox{module: Sandbox.Local, state: %{cwd: ^dir}} = Session.sandbox(s)

    {:ok, s} = Pinned.start_link(cwd: dir, sandbox: {Sandbox.Local, cwd: other})
    assert %Sandbox{state: %{cwd: ^other}} = Session.sandbox(s)

    defmodule WithSandbox do
      use Condukt
      def sandbox, do: {Condukt.Sandbox.Local, cwd: System.tmp_dir!()}
    end

    {:ok, s} = WithSandbox.start_link(id: "job-7")
    assert Session.sandbox(s).state.cwd == System.tmp_dir!()
    # The session id flows into the sandbox...
    assert Session.sandbox(s).state.id == "job-7"
    # ...unless the spec names its own.
    {:ok, s} = WithSandbox.start_link(id: "job-7", sandbox: {Sandbox.Local, cwd: dir, id: "shared-pod"})
    assert Session.sandbox(s).state.id == "shared-pod"

    # A started sandbox is used as is and left running by the session.
    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: other})
    {:ok, s} = Pinned.start_link(sandbox: sb)
    assert Session.sandbox(s) == sb
    assert :ok = Session.stop(s)
  end

  test "start errors are values, and do not take the caller down" do
    assert {:error, %Error{reason: :invalid_option} = e} = Pinned.start_link(max_turn: 3)
    assert Exception.message(e) =~ "did you mean :max_turns?"

    assert {:error, %Error{reason: :invalid_model}} = Pinned.start_link(model: "nonsense")
    assert {:error, %Error{reason: :invalid_model}} = Pinned.start_link(model: "mistral:large")

    assert {:error, %Error{reason: :sandbox, detail: %Sandbox.Error{reason: :enoent}}} =
             Pinned.start_link(sandbox: {Sandbox.Local, cwd: "/nonexistent/dir"})

    assert {:error, %Error{reason: :invalid_agent}} = Condukt.run(String, "hi")
    assert {:error, %Error{reason: :invalid_option}} = Condukt.run(Pinned, "hi", bogus: 1)
  end

  test "an unreachable provider is an :http error, after the retries" do
    assert {:error, %Error{reason: :http} = e} = Condukt.run(Pinned, "hi", retries: 1)
    assert Exception.message(e) =~ "could not be reached"
  end

  test "a one-shot run's session goes away with its sandbox" do
    before = DynamicSupervisor.count_children(Condukt.SessionSupervisor).active
    assert {:error, _} = Condukt.run(Pinned, "hi")
    assert DynamicSupervisor.count_children(Condukt.SessionSupervisor).active == before
  end

  test "backoff grows and is capped" do
    assert Condukt.Provider.HTTP.backoff(0) in 500..625
    assert Condukt.Provider.HTTP.backoff(3) in 4000..5000
    assert Condukt.Provider.HTTP.backoff(20) in 20_000..25_000
  end
end
