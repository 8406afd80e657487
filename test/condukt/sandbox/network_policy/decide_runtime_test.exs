defmodule Condukt.Sandbox.NetworkPolicy.DecideRuntimeTest do
  use ExUnit.Case, async: true

  import ExUnit.CaptureLog

  alias Condukt.Sandbox.NetworkPolicy.{Context, DecideRuntime, Request}

  defmodule Shapes do
    @moduledoc false
    @behaviour Condukt.Sandbox.NetworkPolicy.Decider

    @impl true
    def decide(_ctx, %Request{host: host}, opts) do
      case Keyword.get(opts, :deny) do
        nil -> :allow
        reason -> {:deny, "#{reason} #{host}"}
      end
    end

    def by_function(_ctx, %Request{host: "evil.test"}), do: {:deny, :evil}
    def by_function(_ctx, _req), do: :allow
  end

  @failure [:condukt, :sandbox, :network_policy, :decider_failure]

  setup do
    session = "s-#{System.unique_integer([:positive])}"
    me = self()
    id = {__MODULE__, session}

    # Handlers are global and tests run concurrently: forward only this
    # test's session.
    :telemetry.attach(
      id,
      @failure,
      fn
        _event, measurements, %{session_id: ^session} = meta, _ -> send(me, {:failure, measurements, meta})
        _event, _measurements, _meta, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
    %{session: session}
  end

  defp req(host), do: %Request{host: host, method: "GET", path: "/", scheme: :https, port: 443}

  defp run(rule, host, session), do: DecideRuntime.run(rule, req(host), session_id: session)

  # Feeds this process's messages to the runtime until `n` replies came.
  defp drain(rt, n, acc \\ [], timeout \\ 2_000)
  defp drain(rt, n, acc, _timeout) when length(acc) >= n, do: {Enum.reverse(acc), rt}

  defp drain(rt, n, acc, timeout) do
    runs = rt.runs

    # Only the runtime's own messages: the test's stay in the mailbox.
    receive do
      {ref, _} = message when is_map_key(runs, ref) -> step(rt, n, acc, timeout, message)
      {:DOWN, ref, _, _, _} = message when is_map_key(runs, ref) -> step(rt, n, acc, timeout, message)
      {DecideRuntime, :timeout, ref} = message when is_map_key(runs, ref) -> step(rt, n, acc, timeout, message)
    after
      timeout -> flunk("only #{length(acc)} of #{n} replies: #{inspect(Enum.reverse(acc))}")
    end
  end

  defp step(rt, n, acc, timeout, message) do
    {:ok, replies, rt} = DecideRuntime.handle_info(rt, message)
    drain(rt, n, Enum.reverse(replies) ++ acc, timeout)
  end

  describe "the four callable shapes" do
    test "a 2-arity function", %{session: s} do
      assert run(fn _ctx, _req -> :allow end, "a.test", s) == {:ok, :allow}
      assert run(fn _ctx, req -> {:deny, "no " <> req.host} end, "a.test", s) == {:ok, {:deny, "no a.test"}}
    end

    test "{module, function}", %{session: s} do
      assert run({Shapes, :by_function}, "ok.test", s) == {:ok, :allow}
      assert run({Shapes, :by_function}, "evil.test", s) == {:ok, {:deny, :evil}}
    end

    test "a module alone is called with opts = []", %{session: s} do
      assert run(Shapes, "ok.test", s) == {:ok, :allow}
    end

    test "{module, opts} passes the opts", %{session: s} do
      assert run({Shapes, deny: "not"}, "x.test", s) == {:ok, {:deny, "not x.test"}}
    end

    test "the configured form", %{session: s} do
      assert run([call: {Shapes, deny: "cfg"}, timeout: 1_000, cache: false], "y.test", s) ==
               {:ok, {:deny, "cfg y.test"}}
    end
  end

  test "the context: session, last :context_messages oldest first, request, metadata", %{session: s} do
    me = self()
    history = Enum.map(1..8, &"message #{&1}")

    rule = [
      call: fn ctx, req -> send(me, {:ctx, ctx, req}) && :allow end,
      context_messages: 3,
      context_metadata: %{tenant: "acme"}
    ]

    request = req("ctx.test")
    assert DecideRuntime.run(rule, request, session_id: s, messages: fn -> history end) == {:ok, :allow}
    assert_received {:ctx, %Context{} = ctx, ^request}
    assert ctx.session_id == s
    assert ctx.recent_messages == ["message 6", "message 7", "message 8"]
    assert ctx.request == request
    assert ctx.metadata == %{tenant: "acme"}

    # A list and {m, f, a} work too; 0 messages means none; the default is 5.
    assert {:ok, :allow} = DecideRuntime.run(Keyword.put(rule, :context_messages, 0), request, messages: history)
    assert_received {:ctx, %Context{recent_messages: []}, _}

    assert {:ok, :allow} =
             DecideRuntime.run(Keyword.delete(rule, :context_messages), request, messages: {Enum, :to_list, [1..10]})

    assert_received {:ctx, %Context{recent_messages: [6, 7, 8, 9, 10]}, _}
  end

  describe "failures deny and emit :decider_failure" do
    test "timeout: the decider is killed", %{session: s} do
      me = self()

      rule = [
        call: fn _, _ ->
          send(me, {:decider, self()})
          Process.sleep(:infinity)
        end,
        timeout: 50
      ]

      assert run(rule, "slow.test", s) == {:error, :decider_timeout}
      assert_received {:decider, pid}
      refute Process.alive?(pid)
      assert_received {:failure, %{count: 1}, %{reason: :decider_timeout, request: %Request{host: "slow.test"}}}
    end

    test "crash", %{session: s} do
      log =
        capture_log(fn ->
          assert run(fn _, _ -> raise "boom" end, "crash.test", s) == {:error, :decider_error}
          assert run(fn _, _ -> exit(:bye) end, "crash.test", s) == {:error, :decider_error}
          assert run(fn _, _ -> throw(:up) end, "crash.test", s) == {:error, :decider_error}
        end)

      assert log =~ "boom"
      assert log =~ "crash.test"

      for _ <- 1..3 do
        assert_received {:failure, %{count: 1}, %{reason: :decider_error, rule_index: 0}}
      end
    end

    test "a crashing :messages provider is a decider error", %{session: s} do
      capture_log(fn ->
        assert DecideRuntime.run(fn _, _ -> :allow end, req("m.test"), session_id: s, messages: fn -> :nope end) ==
                 {:error, :decider_error}
      end)

      assert_received {:failure, _, %{reason: :decider_error}}
    end

    test "bad return", %{session: s} do
      capture_log(fn ->
        bad_scopes = [{:allow, scope: :everything}, {:allow, [scope: :host, also: 1]}, {:deny, "x", scope: nil}]

        for bad <- [:deny, :maybe, {:deny, 42}, {:allow, "x"}, {:deny, <<0xFF>>}, nil, {:deny, "x", "y"}] ++ bad_scopes do
          assert run(fn _, _ -> bad end, "bad.test", s) == {:error, :decider_bad_return}, inspect(bad)
          assert_received {:failure, %{count: 1}, %{reason: :decider_bad_return}}
        end
      end)
    end

    test "a rule index that is not a decide rule is denied at once", %{session: s} do
      rt = DecideRuntime.new(policy: [rules: [allow: ["a.test"], decide: fn _, _ -> :allow end]], session_id: s)

      capture_log(fn ->
        assert {[{:decision, "7", {:deny, :decider_error}, false}], _} =
                 DecideRuntime.request(rt, "7", 0, req("a.test"))
      end)

      assert_received {:failure, _, %{reason: :decider_error, rule_index: 0}}
    end
  end

  describe "caching" do
    defp counting_runtime(session, rule_opts) do
      me = self()

      call = fn _ctx, req ->
        send(me, {:called, req.host})
        if req.host == "evil.test", do: {:deny, "no"}, else: :allow
      end

      DecideRuntime.new(policy: [rules: [decide: Keyword.put(rule_opts, :call, call)]], session_id: session)
    end

    test "a deny covers the host by default; the decision says so", %{session: s} do
      rt = counting_runtime(s, [])
      {[], rt} = DecideRuntime.request(rt, "1", 0, req("evil.test"))
      {[{:decision, "1", {:deny, "no"}, true}], rt} = drain(rt, 1)
      assert_received {:called, "evil.test"}

      # Same host (any case), another method and path: answered at once.
      other = %{req("EVIL.test") | method: "POST", path: "/upload"}
      assert {[{:decision, "2", {:deny, "no"}, true}], rt} = DecideRuntime.request(rt, "2", 0, other)
      refute_received {:called, _}

      # Another host asks again.
      {[], rt} = DecideRuntime.request(rt, "3", 0, req("good.test"))
      {[{:decision, "3", :allow, false}], _rt} = drain(rt, 1)
      assert_received {:called, "good.test"}
    end

    test "an allow covers identical requests only: a POST elsewhere is asked again", %{session: s} do
      rt = counting_runtime(s, [])
      get = %{req("api.test") | path: "/public", headers: [{"accept", "*/*"}]}
      {[], rt} = DecideRuntime.request(rt, "1", 0, get)
      # Not host-wide: the sidecar must not cache it.
      {[{:decision, "1", :allow, false}], rt} = drain(rt, 1)
      assert_received {:called, "api.test"}

      # The same request again (another id, other timestamps): from the cache.
      again = %{get | id: "r2", opened_at: DateTime.utc_now()}
      assert {[{:decision, "2", :allow, false}], rt} = DecideRuntime.request(rt, "2", 0, again)
      refute_received {:called, _}

      # Anything the decider was shown differs: it is asked again.
      changed = [
        %{get | method: "POST", path: "/upload", headers: [{"content-length", "9"}]},
        %{get | method: "POST"},
        %{get | path: "/private"},
        %{get | query: "q=secret"},
        %{get | headers: [{"accept", "*/*"}, {"x-exfil", "secret"}]},
        %{get | scheme: :http, port: 80}
      ]

      Enum.reduce(Enum.with_index(changed, 3), rt, fn {request, i}, rt ->
        {[], rt} = DecideRuntime.request(rt, "#{i}", 0, request)
        {[{:decision, _, :allow, false}], rt} = drain(rt, 1)
        assert_received {:called, "api.test"}, inspect(request)
        rt
      end)
    end

    test "a cached :path answer never covers another method or path, however the path is spelt",
         %{session: s} do
      me = self()

      call = fn _ctx, req ->
        send(me, {:called, req.method, req.path})
        {:allow, scope: :path}
      end

      rt = DecideRuntime.new(policy: [rules: [decide: call]], session_id: s)

      ask = fn rt, id, method, path ->
        request = %{req("p.test") | method: method, path: path}

        case DecideRuntime.request(rt, id, 0, request) do
          {[], rt} -> drain(rt, 1)
          {replies, rt} -> {replies, rt}
        end
      end

      {[{:decision, "0", :allow, false}], rt} = ask.(rt, "0", "GET", "/repos/myorg")
      assert_received {:called, "GET", "/repos/myorg"}

      # Each of these is another request for the decider: a different
      # method, a path below, beside or above, or the same path spelt with
      # dot segments or escapes (the key holds the path as sent, so a new
      # spelling is asked about, never matched to an old answer).
      others = [
        {"POST", "/repos/myorg"},
        {"get", "/repos/myorg"},
        {"GET", "/repos/myorg/x"},
        {"GET", "/repos/myorgx"},
        {"GET", "/repos"},
        {"GET", "/repos/myorg/../other"},
        {"GET", "/repos/myorg/%2e%2e/other"},
        {"GET", "/repos/%6Dyorg"},
        {"GET", "/REPOS/myorg"}
      ]

      Enum.reduce(Enum.with_index(others, 1), rt, fn {{method, path}, i}, rt ->
        {[{:decision, _, :allow, false}], rt} = ask.(rt, "#{i}", method, path)
        assert_received {:called, ^method, ^path}, "#{method} #{path} was answered from the cache"
        rt
      end)
    end

    test "a cached :host answer covers only the rule it was given under", %{session: s} do
      me = self()

      call = fn _ctx, req ->
        send(me, {:called, req.method, req.path})
        {:deny, "no", scope: :host}
      end

      rt = DecideRuntime.new(policy: [rules: [allow: [{"h.test", methods: ["GET"]}], decide: call]], session_id: s)
      request = %{req("h.test") | method: "POST"}
      {[], rt} = DecideRuntime.request(rt, "1", 1, request)
      {[{:decision, "1", {:deny, "no"}, true}], rt} = drain(rt, 1)
      assert_received {:called, "POST", "/"}
      # The key names the rule: the same request asked under another
      # index is not answered from the cache (rule 0 is no decide rule).
      assert Map.keys(rt.cache) == [{1, :host, "h.test"}]
      assert {[{:decision, "2", {:deny, :decider_error}, false}], _rt} = DecideRuntime.request(rt, "2", 0, request)
    end

    test "the decider states the scope of its answer", %{session: s} do
      me = self()

      call = fn _ctx, req ->
        send(me, {:called, req.method, req.path})

        case req.path do
          "/host" -> {:allow, scope: :host}
          "/path" -> {:allow, scope: :path}
          "/once" -> {:allow, scope: :once}
          "/deny-once" -> {:deny, "not this one", scope: :request}
          _ -> :allow
        end
      end

      rt = DecideRuntime.new(policy: [rules: [decide: call]], session_id: s)

      ask = fn rt, id, host, method, path, headers ->
        request = %{req(host) | method: method, path: path, headers: headers}

        case DecideRuntime.request(rt, id, 0, request) do
          {[], rt} -> drain(rt, 1)
          {replies, rt} -> {replies, rt}
        end
      end

      # :path: same method and URL whatever the headers; not another method.
      {[{:decision, "1", :allow, false}], rt} = ask.(rt, "1", "p.test", "GET", "/path", [])
      assert_received {:called, "GET", "/path"}
      {[{:decision, "2", :allow, false}], rt} = ask.(rt, "2", "p.test", "GET", "/path", [{"x-a", "b"}])
      refute_received {:called, _, _}
      {[{:decision, "3", :allow, false}], rt} = ask.(rt, "3", "p.test", "PUT", "/path", [])
      assert_received {:called, "PUT", "/path"}

      # :once: not even an identical request reuses it.
      {[{:decision, "4", :allow, false}], rt} = ask.(rt, "4", "o.test", "GET", "/once", [])
      {[{:decision, "5", :allow, false}], rt} = ask.(rt, "5", "o.test", "GET", "/once", [])
      assert_received {:called, "GET", "/once"}
      assert_received {:called, "GET", "/once"}

      # A deny stated for this request only leaves the host open to asking.
      {[{:decision, "6", {:deny, "not this one"}, false}], rt} = ask.(rt, "6", "d.test", "POST", "/deny-once", [])
      {[{:decision, "7", :allow, false}], rt} = ask.(rt, "7", "d.test", "GET", "/other", [])
      assert_received {:called, "POST", "/deny-once"}
      assert_received {:called, "GET", "/other"}

      # :host: everything to that host, and the sidecar may cache it.
      {[{:decision, "8", :allow, true}], rt} = ask.(rt, "8", "h.test", "GET", "/host", [])
      {[{:decision, "9", :allow, true}], _rt} = ask.(rt, "9", "H.TEST", "DELETE", "/anything", [{"x", "y"}])
      assert_received {:called, "GET", "/host"}
      refute_received {:called, "DELETE", _}
    end

    test "cache: false asks every time and tells the sidecar not to cache", %{session: s} do
      rt = counting_runtime(s, cache: false)

      rt =
        Enum.reduce(1..2, rt, fn i, rt ->
          {[], rt} = DecideRuntime.request(rt, "#{i}", 0, req("evil.test"))
          {[{:decision, _, {:deny, "no"}, false}], rt} = drain(rt, 1)
          rt
        end)

      assert_received {:called, "evil.test"}
      assert_received {:called, "evil.test"}
      assert DecideRuntime.running(rt) == 0

      # A host scope does not make a non-caching rule cache.
      rt = DecideRuntime.new(policy: [rules: [decide: [call: fn _, _ -> {:allow, scope: :host} end, cache: false]]])
      {[], rt} = DecideRuntime.request(rt, "1", 0, req("h.test"))
      {[{:decision, "1", :allow, false}], rt} = drain(rt, 1)
      assert {[], _} = DecideRuntime.request(rt, "2", 0, req("h.test"))
    end

    test "the cache is bounded: past its size it starts over", %{session: s} do
      rt = counting_runtime(s, [])

      rt =
        Enum.reduce(1..4097, rt, fn i, rt ->
          {[], rt} = DecideRuntime.request(rt, "#{i}", 0, %{req("big.test") | path: "/#{i}"})
          {[{:decision, _, :allow, false}], rt} = drain(rt, 1)
          rt
        end)

      assert map_size(rt.cache) == 1
    end

    test "failures are never cached", %{session: s} do
      me = self()
      {:ok, calls} = Agent.start_link(fn -> 0 end)

      call = fn _, _ ->
        n = Agent.get_and_update(calls, &{&1, &1 + 1})
        send(me, {:called, n})
        if n == 0, do: raise("first call fails"), else: :allow
      end

      rt = DecideRuntime.new(policy: [rules: [decide: call]], session_id: s)

      capture_log(fn ->
        {[], rt} = DecideRuntime.request(rt, "1", 0, req("flaky.test"))
        {[{:decision, "1", {:deny, :decider_error}, false}], rt} = drain(rt, 1)
        {[], rt} = DecideRuntime.request(rt, "2", 0, req("flaky.test"))
        {[{:decision, "2", :allow, false}], rt} = drain(rt, 1)
        # Now it is cached.
        assert {[{:decision, "3", :allow, false}], _} = DecideRuntime.request(rt, "3", 0, req("flaky.test"))
      end)

      assert_received {:called, 0}
      assert_received {:called, 1}
      refute_received {:called, 2}
    end

    test "requests for a host being decided wait for that decision", %{session: s} do
      me = self()

      call = fn _, req ->
        send(me, {:started, req.host, self()})

        receive do
          :go -> :allow
        end
      end

      rt = DecideRuntime.new(policy: [rules: [decide: call]], session_id: s)
      {[], rt} = DecideRuntime.request(rt, "1", 0, req("same.test"))
      {[], rt} = DecideRuntime.request(rt, "2", 0, req("same.test"))
      # The sidecar re-sends a pending id after a re-dial: nothing new starts.
      {[], rt} = DecideRuntime.request(rt, "1", 0, req("same.test"))
      assert DecideRuntime.running(rt) == 1
      assert_receive {:started, "same.test", pid}
      send(pid, :go)
      {replies, _} = drain(rt, 2)
      assert replies == [{:decision, "1", :allow, false}, {:decision, "2", :allow, false}]
      refute_received {:started, _, _}
    end

    test "identical requests waiting for a :once answer are asked again", %{session: s} do
      me = self()

      call = fn _, req ->
        send(me, {:started, req.id, self()})

        receive do
          :go -> {:allow, scope: :once}
        end
      end

      rt = DecideRuntime.new(policy: [rules: [decide: call]], session_id: s)
      {[], rt} = DecideRuntime.request(rt, "1", 0, %{req("same.test") | id: "a"})
      {[], rt} = DecideRuntime.request(rt, "2", 0, %{req("same.test") | id: "b"})
      # Another path does not wait: it is another question.
      {[], rt} = DecideRuntime.request(rt, "3", 0, %{req("same.test") | id: "c", path: "/x"})
      assert DecideRuntime.running(rt) == 2
      assert_receive {:started, "a", pid}
      assert_receive {:started, "c", pid3}
      send(pid, :go)
      {[{:decision, "1", :allow, false}], rt} = drain(rt, 1)
      # "2" is asked with its own request.
      assert_receive {:started, "b", pid2}
      send(pid2, :go)
      send(pid3, :go)
      {replies, rt} = drain(rt, 2)
      assert Enum.sort(replies) == [{:decision, "2", :allow, false}, {:decision, "3", :allow, false}]
      assert DecideRuntime.running(rt) == 0
    end
  end

  test "deciders run concurrently, each under its own timeout", %{session: s} do
    me = self()

    call = fn _, req ->
      send(me, {:started, req.host, self()})

      receive do
        :go -> :allow
      end
    end

    rt = DecideRuntime.new(policy: [rules: [decide: [call: call, timeout: 1_000]]], session_id: s)
    {[], rt} = DecideRuntime.request(rt, "1", 0, req("one.test"))
    {[], rt} = DecideRuntime.request(rt, "2", 0, req("two.test"))
    {[], rt} = DecideRuntime.request(rt, "3", 0, req("three.test"))

    # All three are running at once: each waits for :go, which only comes
    # after every one has started.
    pids = for host <- ~w(one.test two.test three.test), do: assert_receive({:started, ^host, pid}) && pid
    assert DecideRuntime.running(rt) == 3
    [p1, p2, _p3] = pids
    send(p2, :go)
    send(p1, :go)
    # The third never gets :go and times out on its own.
    {replies, rt} = drain(rt, 3)

    assert Enum.sort(replies) == [
             {:decision, "1", :allow, false},
             {:decision, "2", :allow, false},
             {:decision, "3", {:deny, :decider_timeout}, false}
           ]

    # The answered ones came back before the third timed out.
    assert List.last(replies) == {:decision, "3", {:deny, :decider_timeout}, false}

    assert DecideRuntime.running(rt) == 0
  end

  test "cancel_all kills every running decider", %{session: s} do
    me = self()

    rt =
      DecideRuntime.new(
        policy: [rules: [decide: fn _, _ -> send(me, {:pid, self()}) && Process.sleep(:infinity) end]],
        session_id: s
      )

    {[], rt} = DecideRuntime.request(rt, "1", 0, req("a.test"))
    assert_receive {:pid, pid}
    rt = DecideRuntime.cancel_all(rt)
    refute Process.alive?(pid)
    assert DecideRuntime.running(rt) == 0
  end
end
