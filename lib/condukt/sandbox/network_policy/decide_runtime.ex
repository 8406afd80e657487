defmodule Condukt.Sandbox.NetworkPolicy.DecideRuntime do
  # Answers kept per session; past this the cache starts over (each entry
  # is a short key and the answer, so this bounds the memory a workspace
  # making ever new requests can make the BEAM hold).
  @cache_max 4096

  @moduledoc """
  **Internal.** Part of the library's plumbing, documented for those who
  work on Condukt; its API may change in any release.

  Runs `:decide` rules: one session's deciders, their timeouts and their
  cache.

  The runtime is a data structure owned by one process (the session's
  `Condukt.Sandbox.NetworkPolicy.ControlBridge`). It never runs a decider
  in that process: each decision runs in a process of its own, started by
  the owner and monitored, not linked, so a slow or crashing decider
  neither blocks nor kills the owner, and two deciders run at the same
  time; a decider still running when its `:timeout` is up is killed. The
  owner feeds the messages it receives to `handle_info/2`, which returns the
  decisions that are ready.

  ## What a decider gets and what it may answer

  The callable (any of the four shapes, see
  `Condukt.Sandbox.NetworkPolicy.Decider`) is called with a
  `Condukt.Sandbox.NetworkPolicy.Context` — `:session_id`, the last
  `:context_messages` entries of the session's history (oldest first, read
  from the `:messages` provider inside the task), the request and the
  rule's `:context_metadata` — and the `Condukt.Sandbox.NetworkPolicy.Request`.

  It must answer `:allow`, `{:allow, scope: scope}`, `{:deny, reason}` or
  `{:deny, reason, scope: scope}`, with `reason` an atom or a UTF-8 string
  (`nil` means no reason) and `scope` one of the four below. Otherwise the
  request is denied:

  | what happened | reason |
  |---------------|--------|
  | no answer within the rule's `:timeout` (the task is killed) | `:decider_timeout` |
  | it raised, threw or exited (also: the `:messages` provider did) | `:decider_error` |
  | it answered anything else (an unknown scope or option too) | `:decider_bad_return` |

  and `[:condukt, :sandbox, :network_policy, :decider_failure]` is emitted
  (`Condukt.Sandbox.NetworkPolicy.Telemetry`), once per denied request.

  ## Caching

  A decider sees one request: its method, URL and headers. Its answer is
  reused for a later request only when the rule's `:cache` is true (the
  default) and the later request lies in the answer's *scope*:

  | scope | the answer also decides |
  |-------|-------------------------|
  | `:once` | nothing else: only this request |
  | `:request` | requests identical to this one as the decider saw it: same method, scheme, host (any case), port, path, query, HTTP version, SNI and header fields (names and values, in order; redacted values as redacted) |
  | `:path` | requests with the same method, scheme, host (any case), port, path and query, whatever their headers |
  | `:host` | every request to this host name under this rule: any method, path, port, scheme or header |

  An `:allow` without a scope is `:request`: allowing `GET /public` never
  lets a `POST` to another path out without asking. A `{:deny, reason}`
  without a scope is `:host`: a deny only ever refuses more, and once a
  decider has refused a host the next attempt does not call it again. A
  decider that refuses by method or path and would allow other requests to
  the same host says `{:deny, reason, scope: :request}` (or `:path`).

  What is not part of any key: the request's body (deciders are asked
  before it is read),
  its id and timestamps, and the session's recent messages (an answer
  stands for the session, whatever was said since).

  Requests identical to one being decided (the `:request` key) wait for
  that decision instead of starting another; when its scope is `:once`, the
  waiting ones are asked again, one decision each. Failures are never
  cached: the next request calls the decider again. The cache holds at
  most #{@cache_max} answers per session; past that it starts over, which only
  costs repeated decider calls.

  The sidecar keeps a cache of its own, per rule and host, and only for
  answers whose scope is `:host`: the `cache` member of the control
  channel's `decision` frame is true exactly then. Any other answer is
  asked again over the control channel, and this runtime answers from its
  own cache at once.
  """

  require Logger

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.{Context, Request, Telemetry}

  @typedoc "A decider's definitive answer, as it goes to the sidecar."
  @type answer :: :allow | {:deny, atom() | String.t()}

  @typedoc "Which later requests a decider's answer also decides (see \"Caching\")."
  @type scope :: :once | :request | :path | :host

  @typedoc "Why a decider produced no definitive answer."
  @type failure :: :decider_timeout | :decider_error | :decider_bad_return

  @typedoc """
  A decision ready to go back to the sidecar: its id, the answer, and may
  the sidecar cache it for the rule and host (true only for a `:host`
  scope under a caching rule).
  """
  @type reply :: {:decision, id :: String.t(), answer() | {:deny, failure()}, cache :: boolean()}

  @typedoc "Where the recent messages of the session come from."
  @type messages :: nil | [term()] | (() -> [term()]) | {module(), atom(), [term()]}

  @typep key :: {non_neg_integer(), :host, String.t()} | {non_neg_integer(), :path | :request, binary()}

  @type t :: %__MODULE__{
          session_id: String.t() | nil,
          rules: %{non_neg_integer() => keyword()},
          messages: messages(),
          cache: %{key() => {answer(), scope()}},
          runs: %{reference() => map()},
          by_key: %{key() => reference()},
          by_id: %{String.t() => reference()}
        }

  defstruct session_id: nil,
            rules: %{},
            messages: nil,
            cache: %{},
            runs: %{},
            by_key: %{},
            by_id: %{}

  @doc """
  A runtime for one session.

  Options: `:policy` (required; a `%NetworkPolicy{}` or anything
  `NetworkPolicy.new/1` accepts), `:session_id`, `:messages` (the session's
  message history, oldest first: a list, a 0-arity function or an
  `{m, f, a}` returning one; read in the decider's task each time a decider
  runs; `nil` means none). Raises
  `Condukt.Sandbox.NetworkPolicy.Error` for an invalid policy.
  """
  @spec new(keyword()) :: t()
  def new(opts) do
    policy = NetworkPolicy.new!(Keyword.fetch!(opts, :policy))

    rules = for {{:decide, rule}, index} <- Enum.with_index(policy.rules), into: %{}, do: {index, rule}

    %__MODULE__{
      session_id: Keyword.get(opts, :session_id),
      rules: rules,
      messages: Keyword.get(opts, :messages)
    }
  end

  @doc """
  Asks for a decision on `request` by the decide rule at `rule_index`;
  `id` identifies the question (the sidecar's decision id) in the replies.

  Returns the replies that are ready at once (a cache hit, a rule index
  that is not a decide rule) and the new runtime. An `id` that is already
  being decided (the sidecar sends pending requests again after a
  re-dial) starts nothing new.
  """
  @spec request(t(), String.t(), non_neg_integer(), Request.t()) :: {[reply()], t()}
  def request(%__MODULE__{} = rt, id, rule_index, %Request{} = request) do
    case rt.rules do
      _ when is_map_key(rt.by_id, id) ->
        {[], rt}

      %{^rule_index => rule} ->
        # Nothing is shared or remembered without a cache: no key to make.
        key = if rule[:cache], do: key(rule_index, :request, request)

        cond do
          not rule[:cache] ->
            {[], start(rt, [{id, request}], rule_index, rule, key)}

          hit = cached(rt, rule_index, request) ->
            {answer, scope} = hit
            {[{:decision, id, answer, scope == :host}], rt}

          is_map_key(rt.by_key, key) ->
            ref = rt.by_key[key]
            rt = update_in(rt.runs[ref].waiting, &[{id, request} | &1])
            {[], %{rt | by_id: Map.put(rt.by_id, id, ref)}}

          true ->
            {[], start(rt, [{id, request}], rule_index, rule, key)}
        end

      _ ->
        Logger.error(
          "network policy (session #{inspect(rt.session_id)}): the sidecar asked rule #{inspect(rule_index)} " <>
            "to decide, but that rule is not a decide rule of this policy; denying"
        )

        fail(rt, :decider_error, request, rule_index)
        {[{:decision, id, {:deny, :decider_error}, false}], rt}
    end
  end

  # The widest scope first. It is also the newest answer that covers the
  # request: once a wider answer is cached, every request it covers is a
  # hit, so no narrower answer for them is asked for afterwards.
  defp cached(rt, rule_index, request) do
    Enum.find_value([:host, :path, :request], fn scope -> rt.cache[key(rule_index, scope, request)] end)
  end

  # A scope's key holds exactly what the scope promises to compare (see the
  # moduledoc); the longer ones are hashed so that an entry stays small.
  defp key(rule_index, :host, request), do: {rule_index, :host, host(request)}

  defp key(rule_index, :path, request) do
    shown = {request.method, request.scheme, host(request), request.port, request.path, request.query}
    {rule_index, :path, digest(shown)}
  end

  defp key(rule_index, :request, request) do
    shown = %{request | id: nil, host: host(request), opened_at: nil, responded_at: nil, closed_at: nil}
    {rule_index, :request, digest(shown)}
  end

  defp host(request), do: String.downcase(request.host || "")

  defp digest(term), do: :crypto.hash(:sha256, :erlang.term_to_binary(term, [:deterministic]))

  @doc """
  Handles a message the owner received. Returns `{:ok, replies, rt}` for a
  message of this runtime (a task's answer or exit, a timeout) and
  `:unknown` for any other message.
  """
  @spec handle_info(t(), term()) :: {:ok, [reply()], t()} | :unknown
  def handle_info(%__MODULE__{} = rt, {ref, result}) when is_reference(ref) and is_map_key(rt.runs, ref) do
    run = rt.runs[ref]
    Process.demonitor(ref, [:flush])
    Process.cancel_timer(run.timer)
    finish(rt, ref, classify(result, rt, run))
  end

  def handle_info(%__MODULE__{} = rt, {:DOWN, ref, :process, _pid, reason}) when is_map_key(rt.runs, ref) do
    run = rt.runs[ref]
    Process.cancel_timer(run.timer)
    log_failure(rt, run, "exited: #{Exception.format_exit(reason)}")
    finish(rt, ref, {:error, :decider_error})
  end

  def handle_info(%__MODULE__{} = rt, {__MODULE__, :timeout, ref}) when is_map_key(rt.runs, ref) do
    run = rt.runs[ref]

    # The answer may have arrived between the timer firing and now;
    # Task.shutdown/2 hands it over if so, and kills the task otherwise.
    outcome =
      case shutdown(run.task) do
        {:ok, result} ->
          classify(result, rt, run)

        {:exit, reason} ->
          log_failure(rt, run, "exited: #{Exception.format_exit(reason)}")
          {:error, :decider_error}

        nil ->
          {:error, :decider_timeout}
      end

    finish(rt, ref, outcome)
  end

  def handle_info(%__MODULE__{}, _message), do: :unknown

  @doc "Kills every running decider; their requests get no reply (the sidecar times them out)."
  @spec cancel_all(t()) :: t()
  def cancel_all(%__MODULE__{} = rt) do
    for {_ref, run} <- rt.runs do
      Process.cancel_timer(run.timer)
      shutdown(run.task)
      Telemetry.decide_stop(run.span, :exception, %{kind: :exit, reason: :cancelled, stacktrace: []})
    end

    %{rt | runs: %{}, by_key: %{}, by_id: %{}}
  end

  @doc "How many deciders are running."
  @spec running(t()) :: non_neg_integer()
  def running(%__MODULE__{runs: runs}), do: map_size(runs)

  @doc """
  Runs one decide rule on `request` and waits for the answer: the decide
  runtime without a sidecar, for dry runs and tests. `rule` is a callable
  or the configured keyword form. Options are those of `new/1` except
  `:policy`. Emits `:decider_failure` like the bridge does.
  """
  @spec run(NetworkPolicy.callable() | NetworkPolicy.decide_options(), Request.t(), keyword()) ::
          {:ok, answer()} | {:error, failure()}
  def run(rule, %Request{} = request, opts \\ []) do
    rt = new(Keyword.put(opts, :policy, rules: [decide: rule]))
    {[], rt} = request(rt, "run", 0, request)
    await(rt, rt.by_id["run"])
  end

  # Receives only this run's messages: the caller's mailbox is its own.
  defp await(rt, ref) do
    message =
      receive do
        {^ref, _} = m -> m
        {:DOWN, ^ref, :process, _, _} = m -> m
        {__MODULE__, :timeout, ^ref} = m -> m
      end

    {:ok, [{:decision, "run", answer, _cache}], _rt} = handle_info(rt, message)
    result(answer)
  end

  defp result({:deny, reason}) when reason in [:decider_timeout, :decider_error, :decider_bad_return],
    do: {:error, reason}

  defp result(answer), do: {:ok, answer}

  ## Running ------------------------------------------------------------------

  # Starts the decider on the first waiting request; the others (identical
  # requests, oldest last) wait for its answer.
  defp start(rt, waiting, rule_index, rule, key) do
    {_id, request} = List.last(waiting)
    session_id = rt.session_id
    messages = rt.messages
    call = rule[:call]
    count = rule[:context_messages]
    metadata = rule[:context_metadata]

    task =
      spawn_task(fn ->
        # Everything that can fail runs here, so that the owner only ever
        # sees a value: the answer or what went wrong.
        try do
          ctx = %Context{
            session_id: session_id,
            recent_messages: recent(messages, count),
            request: request,
            metadata: metadata
          }

          {:returned, invoke(call, ctx, request)}
        catch
          kind, reason -> {:raised, kind, reason, __STACKTRACE__}
        end
      end)

    timer = Process.send_after(self(), {__MODULE__, :timeout, task.ref}, rule[:timeout])
    span = Telemetry.decide_start(%{session_id: session_id, request: request, rule_index: rule_index})

    run = %{
      span: span,
      task: task,
      timer: timer,
      waiting: waiting,
      key: key,
      cache: rule[:cache],
      rule_index: rule_index,
      request: request
    }

    by_id = Enum.reduce(waiting, rt.by_id, fn {id, _}, acc -> Map.put(acc, id, task.ref) end)

    %{
      rt
      | runs: Map.put(rt.runs, task.ref, run),
        by_key: if(rule[:cache], do: Map.put(rt.by_key, key, task.ref), else: rt.by_key),
        by_id: by_id
    }
  end

  # A decider runs in a process of its own, monitored and not linked (a
  # crash or a kill reaches the owner as :DOWN, never as an exit signal),
  # started by the owner itself: no round trip to a supervisor on the way
  # to every answer. It answers {ref, result} like a Task, so that
  # handle_info/2 and await/2 see one protocol; shutdown/1 ends it.
  defp spawn_task(fun) do
    owner = self()
    # As a Task would: test helpers that follow $callers (Mox, Req.Test)
    # find the owner's allowances from the decider.
    callers = [owner | Process.get(:"$callers", [])]

    {pid, ref} =
      spawn_monitor(fn ->
        Process.put(:"$callers", callers)

        receive do
          {^owner, ref} -> send(owner, {ref, fun.()})
        end
      end)

    send(pid, {owner, ref})
    %{pid: pid, ref: ref}
  end

  # Kills the task; an answer already sent is handed over.
  defp shutdown(%{pid: pid, ref: ref}) do
    Process.exit(pid, :kill)

    receive do
      {^ref, result} ->
        Process.demonitor(ref, [:flush])
        {:ok, result}

      {:DOWN, ^ref, :process, _, :killed} ->
        nil

      {:DOWN, ^ref, :process, _, reason} ->
        {:exit, reason}
    end
  end

  defp invoke(fun, ctx, req) when is_function(fun, 2), do: fun.(ctx, req)
  defp invoke({module, opts}, ctx, req) when is_atom(module) and is_list(opts), do: module.decide(ctx, req, opts)

  defp invoke({module, function}, ctx, req) when is_atom(module) and is_atom(function),
    do: apply(module, function, [ctx, req])

  defp invoke(module, ctx, req) when is_atom(module), do: module.decide(ctx, req, [])

  defp recent(_messages, 0), do: []
  defp recent(nil, _count), do: []
  defp recent(list, count) when is_list(list), do: Enum.take(list, -count)
  defp recent(fun, count) when is_function(fun, 0), do: recent_list(fun.(), count)
  defp recent({m, f, a}, count), do: recent_list(apply(m, f, a), count)

  defp recent_list(list, count) when is_list(list), do: Enum.take(list, -count)

  defp recent_list(other, _count),
    do: raise(ArgumentError, "the :messages provider must return a list, got: #{inspect(other)}")

  defp classify({:returned, :allow}, _rt, _run), do: {:ok, :allow, :request}
  defp classify({:returned, {:allow, opts}}, rt, run), do: with_scope(:allow, opts, rt, run)
  defp classify({:returned, {:deny, reason}}, rt, run), do: deny(reason, :host, rt, run)

  defp classify({:returned, {:deny, reason, opts}}, rt, run) do
    with {:ok, :deny, scope} <- with_scope(:deny, opts, rt, run), do: deny(reason, scope, rt, run)
  end

  defp classify({:returned, other}, rt, run), do: bad_return(other, rt, run)

  defp classify({:raised, kind, reason, stack}, rt, run) do
    log_failure(rt, run, "failed:\n" <> Exception.format(kind, reason, stack))
    {:error, :decider_error}
  end

  @scopes [:once, :request, :path, :host]

  defp with_scope(answer, [scope: scope], _rt, _run) when scope in @scopes, do: {:ok, answer, scope}

  defp with_scope(answer, opts, rt, run) do
    log_failure(
      rt,
      run,
      "answered #{inspect(answer)} with #{inspect(opts)}; the options may only be [scope: s], s one of #{inspect(@scopes)}"
    )

    {:error, :decider_bad_return}
  end

  defp deny(nil, scope, _rt, _run), do: {:ok, {:deny, ""}, scope}
  defp deny(reason, scope, _rt, _run) when is_atom(reason), do: {:ok, {:deny, reason}, scope}

  defp deny(reason, scope, rt, run) when is_binary(reason) do
    if String.valid?(reason) do
      {:ok, {:deny, reason}, scope}
    else
      log_failure(rt, run, "denied with a reason that is not UTF-8: #{inspect(reason)}")
      {:error, :decider_bad_return}
    end
  end

  defp deny(reason, _scope, rt, run), do: bad_return({:deny, reason}, rt, run)

  defp bad_return(other, rt, run) do
    log_failure(rt, run, "returned #{inspect(other)}; expected :allow or {:deny, reason}, optionally with [scope: s]")
    {:error, :decider_bad_return}
  end

  defp finish(rt, ref, outcome) do
    {run, runs} = Map.pop(rt.runs, ref)
    ids = Enum.map(run.waiting, &elem(&1, 0))
    by_id = Map.drop(rt.by_id, ids)
    by_key = if rt.by_key[run.key] == ref, do: Map.delete(rt.by_key, run.key), else: rt.by_key
    rt = %{rt | runs: runs, by_id: by_id, by_key: by_key}
    # Oldest question first.
    [{first, _} | others] = waiting = Enum.reverse(run.waiting)
    end_span(run.span, outcome)

    case outcome do
      {:ok, answer, :once} ->
        # The answer is for the first request only; the others ask anew.
        replies = [{:decision, first, answer, false}]
        if others == [], do: {:ok, replies, rt}, else: {:ok, replies, restart(rt, others, run)}

      {:ok, answer, scope} ->
        rt = if run.cache, do: remember(rt, key(run.rule_index, scope, run.request), {answer, scope}), else: rt
        {:ok, Enum.map(waiting, fn {id, _} -> {:decision, id, answer, run.cache and scope == :host} end), rt}

      {:error, failure} ->
        Enum.each(waiting, fn {_, request} -> fail(rt, failure, request, run.rule_index) end)
        {:ok, Enum.map(waiting, fn {id, _} -> {:decision, id, {:deny, failure}, false} end), rt}
    end
  end

  defp end_span(span, {:ok, :allow, scope}),
    do: Telemetry.decide_stop(span, :stop, %{result: :allow, reason: nil, scope: scope})

  defp end_span(span, {:ok, {:deny, reason}, scope}),
    do:
      Telemetry.decide_stop(span, :stop, %{result: :deny, reason: if(reason == "", do: nil, else: reason), scope: scope})

  defp end_span(span, {:error, failure}) do
    kind = if failure == :decider_timeout, do: :exit, else: :error
    Telemetry.decide_stop(span, :exception, %{kind: kind, reason: failure, stacktrace: []})
  end

  defp restart(rt, [{_id, request} | _] = waiting, run) do
    rule = rt.rules[run.rule_index]
    start(rt, Enum.reverse(waiting), run.rule_index, rule, key(run.rule_index, :request, request))
  end

  defp remember(rt, key, value) do
    cache = if map_size(rt.cache) >= @cache_max, do: %{}, else: rt.cache
    %{rt | cache: Map.put(cache, key, value)}
  end

  defp fail(rt, failure, request, rule_index) do
    Telemetry.decider_failure(failure, %{session_id: rt.session_id, request: request, rule_index: rule_index})
  end

  defp log_failure(rt, run, what) do
    Logger.warning(
      "network policy (session #{inspect(rt.session_id)}): the decider of rule #{run.rule_index} " <>
        "(host #{inspect(run.request.host)}) #{what}"
    )
  end
end
