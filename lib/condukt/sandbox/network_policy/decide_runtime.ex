defmodule Condukt.Sandbox.NetworkPolicy.DecideRuntime do
  @moduledoc """
  Runs `:decide` rules: one session's deciders, their timeouts and their
  cache.

  The runtime is a data structure owned by one process (the session's
  `Condukt.Sandbox.NetworkPolicy.ControlBridge`). It never runs a decider
  in that process: each decision is a `Task` under
  `Condukt.Sandbox.NetworkPolicy.TaskSupervisor`, started with
  `Task.Supervisor.async_nolink/2`, so a slow or crashing decider neither
  blocks nor kills the owner, and two deciders run at the same time. The
  owner feeds the messages it receives to `handle_info/2`, which returns the
  decisions that are ready.

  ## What a decider gets and what it may answer

  The callable (any of the four shapes, see
  `Condukt.Sandbox.NetworkPolicy.Decider`) is called with a
  `Condukt.Sandbox.NetworkPolicy.Context` — `:session_id`, the last
  `:context_messages` entries of the session's history (oldest first, read
  from the `:messages` provider inside the task), the request and the
  rule's `:context_metadata` — and the `Condukt.Sandbox.NetworkPolicy.Request`.

  It must answer `:allow` or `{:deny, reason}` with `reason` an atom or a
  UTF-8 string (`nil` means no reason). Otherwise the request is denied:

  | what happened | reason |
  |---------------|--------|
  | no answer within the rule's `:timeout` (the task is killed) | `:decider_timeout` |
  | it raised, threw or exited (also: the `:messages` provider did) | `:decider_error` |
  | it answered anything else | `:decider_bad_return` |

  and `[:condukt, :sandbox, :network_policy, :decider_failure]` is emitted
  (`Condukt.Sandbox.NetworkPolicy.Telemetry`), once per denied request.

  ## Caching

  When the rule's `:cache` is true (the default), a definitive answer
  (`:allow` or `{:deny, reason}` from the decider) is remembered for the
  session and host (keyed by rule index and lower-cased host): later
  requests to that host are answered at once without calling the decider,
  and requests that arrive while a decision for the same host is running
  wait for that one instead of starting another. Failures are never cached:
  the next request calls the decider again. Every decision says whether it
  may be cached (the `cache` member of the control channel's `decision`
  frame), so the sidecar's own cache follows the same rule.
  """

  require Logger

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.{Context, Request, Telemetry}

  @typedoc "A decider's definitive answer."
  @type answer :: :allow | {:deny, atom() | String.t()}

  @typedoc "Why a decider produced no definitive answer."
  @type failure :: :decider_timeout | :decider_error | :decider_bad_return

  @typedoc "A decision ready to go back to the sidecar: its id, the answer, and may it be cached."
  @type reply :: {:decision, id :: String.t(), answer() | {:deny, failure()}, cache :: boolean()}

  @typedoc "Where the recent messages of the session come from."
  @type messages :: nil | [term()] | (() -> [term()]) | {module(), atom(), [term()]}

  @type t :: %__MODULE__{
          session_id: String.t() | nil,
          rules: %{non_neg_integer() => keyword()},
          messages: messages(),
          supervisor: Supervisor.supervisor(),
          cache: %{{non_neg_integer(), String.t()} => answer()},
          runs: %{reference() => map()},
          by_key: %{{non_neg_integer(), String.t()} => reference()},
          by_id: %{String.t() => reference()}
        }

  defstruct session_id: nil,
            rules: %{},
            messages: nil,
            supervisor: Condukt.Sandbox.NetworkPolicy.TaskSupervisor,
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
  runs; `nil` means none) and `:supervisor` (the `Task.Supervisor`, default
  `Condukt.Sandbox.NetworkPolicy.TaskSupervisor`). Raises
  `Condukt.Sandbox.NetworkPolicy.Error` for an invalid policy.
  """
  @spec new(keyword()) :: t()
  def new(opts) do
    policy = NetworkPolicy.new!(Keyword.fetch!(opts, :policy))

    rules = for {{:decide, rule}, index} <- Enum.with_index(policy.rules), into: %{}, do: {index, rule}

    %__MODULE__{
      session_id: Keyword.get(opts, :session_id),
      rules: rules,
      messages: Keyword.get(opts, :messages),
      supervisor: Keyword.get(opts, :supervisor, Condukt.Sandbox.NetworkPolicy.TaskSupervisor)
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
        key = {rule_index, String.downcase(request.host || "")}

        cond do
          rule[:cache] and is_map_key(rt.cache, key) ->
            {[{:decision, id, rt.cache[key], true}], rt}

          rule[:cache] and is_map_key(rt.by_key, key) ->
            ref = rt.by_key[key]
            rt = update_in(rt.runs[ref].ids, &[id | &1])
            {[], %{rt | by_id: Map.put(rt.by_id, id, ref)}}

          true ->
            {[], start(rt, id, rule_index, rule, key, request)}
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
      case Task.shutdown(run.task, :brutal_kill) do
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
      Task.shutdown(run.task, :brutal_kill)
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

  defp start(rt, id, rule_index, rule, key, request) do
    session_id = rt.session_id
    messages = rt.messages
    call = rule[:call]
    count = rule[:context_messages]
    metadata = rule[:context_metadata]

    task =
      Task.Supervisor.async_nolink(rt.supervisor, fn ->
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

    run = %{
      task: task,
      timer: timer,
      ids: [id],
      key: key,
      cache: rule[:cache],
      rule_index: rule_index,
      request: request
    }

    %{
      rt
      | runs: Map.put(rt.runs, task.ref, run),
        by_key: if(rule[:cache], do: Map.put(rt.by_key, key, task.ref), else: rt.by_key),
        by_id: Map.put(rt.by_id, id, task.ref)
    }
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

  defp classify({:returned, :allow}, _rt, _run), do: {:ok, :allow}
  defp classify({:returned, {:deny, nil}}, _rt, _run), do: {:ok, {:deny, ""}}
  defp classify({:returned, {:deny, reason}}, _rt, _run) when is_atom(reason), do: {:ok, {:deny, reason}}

  defp classify({:returned, {:deny, reason} = answer}, rt, run) when is_binary(reason) do
    if String.valid?(reason) do
      {:ok, answer}
    else
      log_failure(rt, run, "denied with a reason that is not UTF-8: #{inspect(reason)}")
      {:error, :decider_bad_return}
    end
  end

  defp classify({:returned, other}, rt, run) do
    log_failure(rt, run, "returned #{inspect(other)}; expected :allow or {:deny, reason}")
    {:error, :decider_bad_return}
  end

  defp classify({:raised, kind, reason, stack}, rt, run) do
    log_failure(rt, run, "failed:\n" <> Exception.format(kind, reason, stack))
    {:error, :decider_error}
  end

  defp finish(rt, ref, outcome) do
    {run, runs} = Map.pop(rt.runs, ref)
    by_id = Map.drop(rt.by_id, run.ids)
    by_key = if rt.by_key[run.key] == ref, do: Map.delete(rt.by_key, run.key), else: rt.by_key
    rt = %{rt | runs: runs, by_id: by_id, by_key: by_key}
    # Oldest question first.
    ids = Enum.reverse(run.ids)

    case outcome do
      {:ok, answer} ->
        cache = if run.cache, do: Map.put(rt.cache, run.key, answer), else: rt.cache
        {:ok, Enum.map(ids, &{:decision, &1, answer, run.cache}), %{rt | cache: cache}}

      {:error, failure} ->
        Enum.each(ids, fn _ -> fail(rt, failure, run.request, run.rule_index) end)
        {:ok, Enum.map(ids, &{:decision, &1, {:deny, failure}, false}), rt}
    end
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
