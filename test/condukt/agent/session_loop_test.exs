defmodule Condukt.SessionLoopTest do
  # The session's loop mechanics when the model calls tools: dispatch
  # through the sandbox, errors as tool results, unknown tools, max_turns.
  # The local model of the :llm tier cannot call tools (its chat template
  # has no tool support), so these tests use a provider module that
  # replays fixed turns. It is a Condukt.Provider, not an HTTP server: the
  # HTTP providers are exercised against the real model in session_test.exs.
  use ExUnit.Case, async: true

  alias Condukt.{Error, Message, Session}

  @moduletag :tmp_dir

  defmodule Replay do
    @behaviour Condukt.Provider
    # The turns to replay are in the model name: an Agent's pid.
    @impl true
    def chat(req) do
      agent = req.model |> String.to_charlist() |> :erlang.list_to_pid()
      Agent.get_and_update(agent, fn [turn | rest] -> {turn.(req), rest} end)
    end
  end

  defmodule Coder do
    use Condukt

    @impl true
    def tools, do: Condukt.Tools.coding_tools()
  end

  defp replay(turns) do
    {:ok, agent} = Agent.start_link(fn -> turns end)
    {Replay, :erlang.pid_to_list(agent) |> to_string()}
  end

  defp answer(text),
    do: fn _req -> {:ok, %{text: text, tool_calls: [], stop_reason: "stop", schema_enforced: false, usage: %{}}} end

  defp call(calls),
    do: fn _req ->
      {:ok, %{text: nil, tool_calls: calls, stop_reason: "tool_calls", schema_enforced: false, usage: %{}}}
    end

  test "tool calls run through the sandbox and their results go back to the model", %{tmp_dir: dir} do
    File.write!(Path.join(dir, "notes.txt"), "buy milk\n")
    test = self()

    model =
      replay([
        call([
          %{id: "c1", name: "Read", arguments: %{"path" => "notes.txt"}},
          %{id: "c2", name: "Read", arguments: %{"path" => "missing.txt"}},
          %{id: "c3", name: "Fly", arguments: %{}},
          %{id: "c4", name: "Write", arguments: %{"path" => 42}}
        ]),
        fn req ->
          send(test, {:second_turn, req.messages})
          answer("You need to buy milk.").(req)
        end
      ])

    {:ok, s} = Coder.start_link(cwd: dir, model: model)
    on_event = fn event -> send(test, {:event, event}) end
    assert {:ok, "You need to buy milk."} = Session.run(s, "What is in notes.txt?", on_event: on_event)

    # Each tool call is announced, then its result.
    assert_received {:event, {:tool_call, %{id: "c1", name: "Read"}}}
    assert_received {:event, {:tool_result, %Message{tool_call_id: "c1"}}}
    assert_received {:event, {:tool_call, %{id: "c4"}}}
    assert_received {:event, {:tool_result, %Message{tool_call_id: "c4", is_error: true}}}

    assert_received {:second_turn, sent}
    assert [%Message{role: :user}, %Message{role: :assistant, tool_calls: [_, _, _, _]} | results] = sent

    assert [
             %Message{role: :tool, tool_call_id: "c1", name: "Read", content: "buy milk\n", is_error: false},
             %Message{tool_call_id: "c2", is_error: true, content: missing},
             %Message{tool_call_id: "c3", is_error: true, content: unknown},
             %Message{tool_call_id: "c4", is_error: true, content: invalid}
           ] = results

    assert missing =~ "missing.txt"
    assert unknown =~ "there is no tool named \"Fly\""
    assert invalid =~ "invalid arguments"
    # The session's history is what the model saw, plus the final answer.
    assert Session.messages(s) == sent ++ [Message.assistant("You need to buy milk.")]
  end

  test "a model that never stops calling tools ends at :max_turns", %{tmp_dir: dir} do
    loop = call([%{id: "x", name: "Bash", arguments: %{"command" => "true"}}])
    {:ok, s} = Coder.start_link(cwd: dir, model: replay(List.duplicate(loop, 3)), max_turns: 3)
    assert {:error, %Error{reason: :max_turns, detail: 3}} = Session.run(s, "go")
    assert length(Session.messages(s)) == 1 + 3 * 2
  end

  test "one run at a time; a run past its timeout is cancelled", %{tmp_dir: dir} do
    slow = fn req ->
      Process.sleep(300)
      answer("late").(req)
    end

    {:ok, s} = Coder.start_link(cwd: dir, model: replay([slow, answer("ok")]))
    task = Task.async(fn -> Session.run(s, "first") end)
    Process.sleep(50)
    assert {:error, %Error{reason: :busy}} = Session.run(s, "second")
    assert {:ok, "late"} = Task.await(task)

    {:ok, s} = Coder.start_link(cwd: dir, model: replay([slow]))
    assert {:error, %Error{reason: :timeout}} = Session.run(s, "first", timeout: 50)
    # The session is still there and free.
    assert [%Message{content: "first"}] = Session.messages(s)
  end

  test "Condukt.run/3 on a running session, by pid or by registered name; a map input is sent as JSON", %{tmp_dir: dir} do
    test = self()

    echo = fn req ->
      send(test, {:asked, List.last(req.messages).content})
      answer("ok").(req)
    end

    {:ok, s} = Coder.start_link(cwd: dir, model: replay([echo, echo]), name: :condukt_loop_test_session)
    assert {:ok, "ok"} = Condukt.run(s, "by pid")
    assert_received {:asked, "by pid"}
    assert {:ok, "ok"} = Condukt.run(:condukt_loop_test_session, %{task: "by name"})
    assert_received {:asked, ~s({"task":"by name"})}
  end
end
