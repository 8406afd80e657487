defmodule Condukt.Sandbox.NetworkPolicy do
  @moduledoc """
  The per-session egress policy: an ordered pipeline of rules that every
  HTTP(S) request of the sandboxed workspace walks, top to bottom, until one
  matches.

      %Condukt.Sandbox.NetworkPolicy{
        rules: [
          deny: ["*.internal.example.com"],
          allow: ["api.github.com", "*.openai.com"],
          decide: fn _ctx, _req -> :allow end
        ],
        default: :deny
      }

  ## Rules

    * `allow: patterns` and `deny: patterns` match the request's host
      against a non-empty list of glob patterns: `*` matches within one DNS
      label, `**` across labels. Matching is case-insensitive, ignores a
      trailing dot and the port, and compares IDN names in their ASCII form
      and IP literals by address; `docs/host-matching.md` has the exact
      rules. An address range such as `"10.0.0.0/8"` is not a pattern
      (`new/1` says so): name single addresses, or the hosts.
    * `decide: callable` defers to code (or to an agent). It matches every
      request that reaches it and is terminal: whatever the callable answers
      is the decision, so it comes last (a rule after it could never match
      and `new/1` refuses it; put narrower `allow:` and `deny:` rules
      before it). Four shapes are accepted — a 2-arity function,
      `{module, function}`, a module (called as `module.decide(ctx, req, [])`)
      and `{module, opts}` (`module.decide(ctx, req, opts)`); see
      `Condukt.Sandbox.NetworkPolicy.Decider`. A keyword list is the
      configured form:

  #{Condukt.Options.docs(Condukt.Sandbox.NetworkPolicy.Schema.decide())}

  If no rule matches, `:default` fires (`:deny` unless set to `:allow`).

  ## Body previews and redaction

  `:body_preview` (bytes, default 0: none), `:redact_headers` and
  `:redact_body` say what the events carry of a request body and what is
  redacted first; every backend passes them to its sidecar.
  `Condukt.Sandbox.NetworkPolicy.Capture` has the details and the limits.

      Condukt.Sandbox.NetworkPolicy.new!(
        rules: [allow: ["api.example.com"]],
        body_preview: 1024,
        redact_headers: ["x-api-key"],
        redact_body: [~r/"card_number":\s*"[0-9 ]+"/]
      )

  ## Caching

  A decider is shown one request: its method, URL and headers. With
  `cache: true` (the default) its answer is remembered for the session and
  reused for a later request only inside the answer's scope, which the
  decider may state as `{:allow, scope: scope}` or
  `{:deny, reason, scope: scope}`:

    * `:once` — this request only;
    * `:request` — identical requests: the same method, scheme, host (any
      case), port, path, query, HTTP version, SNI and header fields as the
      decider saw them (the default of `:allow`);
    * `:path` — the same method, scheme, host, port, path and query, any
      headers;
    * `:host` — every request to this host under this rule (the default of
      `{:deny, reason}`).

  So after a decider allowed `GET /public`, a `POST` with a body to
  another path is asked again, while a host it refused is not asked about
  again. The request body, the session's recent messages and the request's
  id and timestamps are never part of the key. Failures (timeouts, crashes,
  bad answers) are never cached. At most 4096 answers are kept per
  session. `Condukt.Sandbox.NetworkPolicy.DecideRuntime` has the details,
  including the sidecar's own cache, which only holds `:host` answers.
  (Upstream Condukt caches every answer per host; an allow is narrower
  here because a decider that sees the method, path and headers may have
  allowed only what it saw.)

  ## Validation

  `new/1` and `new!/1` validate a policy and fill in the decide defaults;
  each error is a `Condukt.Sandbox.NetworkPolicy.Error` naming the rule
  index, the key and the bad value. Sandboxes validate the policy they are
  given, so a bad policy never reaches a pod.

  ## Dry runs and the sidecar form

  `evaluate/2` runs the pipeline on a URL or a `Request` without calling any
  decider. `to_sidecar_json/1` compiles the policy into the versioned JSON
  document the `condukt-egress` sidecar evaluates (`docs/policy-json.md`);
  decide callables stay on the BEAM.
  """

  alias Condukt.Sandbox.NetworkPolicy.{Context, Error, Host, Request, Schema}

  @typedoc "A host glob such as `\"api.github.com\"` or `\"*.openai.com\"`."
  @type host_pattern :: String.t()

  @typedoc "The four shapes of a decide callable."
  @type callable ::
          (Context.t(), Request.t() -> Condukt.Sandbox.NetworkPolicy.Decider.decision())
          | {module(), atom()}
          | module()
          | {module(), keyword()}

  @typedoc "The configured form of a decide rule."
  @type decide_options :: [
          call: callable(),
          timeout: pos_integer(),
          cache: boolean(),
          context_messages: non_neg_integer(),
          context_metadata: map()
        ]

  @type rule ::
          {:allow, [host_pattern()]}
          | {:deny, [host_pattern()]}
          | {:decide, callable() | decide_options()}

  @type t :: %__MODULE__{
          rules: [rule()],
          default: :allow | :deny,
          body_preview: 0..65_536,
          redact_headers: [String.t()],
          redact_body: [Regex.t() | String.t()]
        }

  @typedoc "Why `evaluate/2` denied a request."
  @type deny_reason :: :denied_by_rule | :default_deny | :invalid_host | :invalid_url

  @type decision :: :allow | {:deny, deny_reason()} | {:decide, non_neg_integer()}

  @type matched_rule :: %{index: non_neg_integer(), kind: :allow | :deny | :decide} | nil

  @sidecar_version 1
  # The sidecar's limits (docs/policy-json.md); new/1 enforces them so a
  # policy the sidecar would refuse never leaves the BEAM.
  @max_rules 4096
  @max_patterns 4096
  @max_document_bytes 4 * 1024 * 1024

  defstruct rules: [], default: :deny, body_preview: 0, redact_headers: [], redact_body: []

  @doc """
  Validates a policy given as a keyword list, a map or a struct.

  Returns the policy as a struct whose decide rules are in their configured
  form with every default filled in. Host patterns are kept as written.
  """
  @spec new(t() | keyword() | map()) :: {:ok, t()} | {:error, Error.t()}
  def new(policy) do
    with {:ok, policy, _compiled} <- validate(policy), do: {:ok, policy}
  end

  @doc "Like `new/1`, but raises `Condukt.Sandbox.NetworkPolicy.Error`."
  @spec new!(t() | keyword() | map()) :: t()
  def new!(policy) do
    case new(policy) do
      {:ok, policy} -> policy
      {:error, error} -> raise error
    end
  end

  @doc """
  Dry-runs the policy on a URL (`"https://api.github.com/repos"`), a bare
  `host[:port]`, or a `%Request{}` (its `:host`).

  Returns `{decision, matched_rule}`. Decide rules are not called: they
  yield `{:decide, index}`. An invalid host or URL is denied before any rule
  with reason `:invalid_host` or `:invalid_url`. Raises
  `Condukt.Sandbox.NetworkPolicy.Error` if the policy is invalid.

      iex> policy = Condukt.Sandbox.NetworkPolicy.new!(rules: [allow: ["*.github.com"]])
      iex> Condukt.Sandbox.NetworkPolicy.evaluate(policy, "https://api.github.com/repos")
      {:allow, %{index: 0, kind: :allow}}
      iex> Condukt.Sandbox.NetworkPolicy.evaluate(policy, "https://api.github.com.evil.net/")
      {{:deny, :default_deny}, nil}
  """
  @spec evaluate(t() | keyword() | map(), Request.t() | String.t()) :: {decision(), matched_rule()}
  def evaluate(policy, target) do
    {rules, default} = compile!(policy)

    case target_host(target) do
      {:ok, host} -> walk(rules, host, default)
      {:error, reason} -> {{:deny, reason}, nil}
    end
  end

  @ca_env_vars ~w(NODE_EXTRA_CA_CERTS REQUESTS_CA_BUNDLE SSL_CERT_FILE PIP_CERT CURL_CA_BUNDLE GIT_SSL_CAINFO)

  @doc """
  The six environment variables that make
  Node, Python, pip, curl, git and OpenSSL-based clients trust the CA
  bundle at `path`, as `{name, value}` pairs.
  """
  @spec ca_env(Path.t()) :: [{String.t(), Path.t()}]
  def ca_env(path), do: Enum.map(@ca_env_vars, &{&1, path})

  @doc """
  Compiles the policy into the sidecar's JSON document (version
  #{@sidecar_version}, `docs/policy-json.md`): patterns normalised, decide
  rules reduced to their index, timeout and cache flag. Raises
  `Condukt.Sandbox.NetworkPolicy.Error` if the policy is invalid.
  """
  @spec to_sidecar_json(t() | keyword() | map()) :: String.t()
  def to_sidecar_json(policy), do: policy |> compile!() |> sidecar_document()

  # From compiled rules (patterns already normalised).
  defp sidecar_document({rules, default}) do
    json_rules =
      rules
      |> Enum.with_index()
      |> Enum.map(fn
        {{:decide, opts}, i} ->
          {[{"index", i}, {"kind", "decide"}, {"timeout_ms", opts[:timeout]}, {"cache", opts[:cache]}]}

        {{kind, patterns}, i} ->
          {[{"index", i}, {"kind", Atom.to_string(kind)}, {"hosts", Enum.map(patterns, &Host.to_text/1)}]}
      end)

    Condukt.JSON.encode!({[{"version", @sidecar_version}, {"default", Atom.to_string(default)}, {"rules", json_rules}]})
  end

  ## Evaluation ---------------------------------------------------------------

  # Validates once and returns {compiled_rules, default}: decide rules in
  # their configured form, allow/deny patterns normalised.
  defp compile!(policy) do
    case validate(policy) do
      {:ok, _policy, compiled} -> compiled
      {:error, error} -> raise error
    end
  end

  defp target_host(%Request{host: host}) when is_binary(host) do
    case Host.normalize(host) do
      {:ok, normalized} -> {:ok, normalized}
      :error -> {:error, :invalid_host}
    end
  end

  defp target_host(%Request{}), do: {:error, :invalid_host}
  defp target_host(url) when is_binary(url), do: Host.parse_target(url)

  defp walk(rules, host, default) do
    rules
    |> Enum.with_index()
    |> Enum.find_value(fn {rule, index} -> rule_decision(rule, index, host) end)
    |> case do
      nil when default == :allow -> {:allow, nil}
      nil -> {{:deny, :default_deny}, nil}
      found -> found
    end
  end

  defp rule_decision({:decide, _opts}, i, _host), do: {{:decide, i}, %{index: i, kind: :decide}}

  defp rule_decision({kind, patterns}, i, host) do
    if Enum.any?(patterns, &Host.match?(&1, host)) do
      decision = if kind == :allow, do: :allow, else: {:deny, :denied_by_rule}
      {decision, %{index: i, kind: kind}}
    end
  end

  ## Validation ---------------------------------------------------------------

  @policy_keys [:rules, :default, :body_preview, :redact_headers, :redact_body]

  defp fields(%__MODULE__{} = policy), do: {:ok, Map.from_struct(policy)}

  defp fields(policy) when is_map(policy) and not is_struct(policy) do
    check_policy_keys(Map.to_list(policy))
  end

  defp fields(policy) when is_list(policy) do
    if Keyword.keyword?(policy),
      do: check_policy_keys(policy),
      else: {:error, %Error{reason: :invalid_policy, value: policy}}
  end

  defp fields(policy), do: {:error, %Error{reason: :invalid_policy, value: policy}}

  defp check_policy_keys(pairs) do
    case Enum.find(pairs, fn {key, _} -> key not in @policy_keys end) do
      nil ->
        {:ok, Map.new(pairs)}

      {key, _} ->
        {:error,
         %Error{
           reason: :unknown_key,
           key: nil,
           value: key,
           detail: Condukt.Options.suggest(key, @policy_keys)
         }}
    end
  end

  # Returns the validated struct (patterns as written, decide rules filled
  # in) and its compiled form, so callers never normalise twice.
  defp validate(policy) do
    with {:ok, fields} <- fields(policy),
         {:ok, default} <- validate_default(Map.get(fields, :default, :deny)),
         {:ok, validated} <- validate_rules(Map.get(fields, :rules, [])),
         {rules, compiled_rules} = Enum.unzip(validated),
         compiled = {compiled_rules, default},
         :ok <- check_document_size(compiled),
         {:ok, capture} <- validate_capture(fields) do
      {:ok, struct!(%__MODULE__{rules: rules, default: default}, capture), compiled}
    end
  end

  defp validate_capture(fields) do
    case Condukt.Sandbox.NetworkPolicy.Capture.validate(fields) do
      {:ok, capture} ->
        {:ok, capture}

      {:error, {key, value, expected}} ->
        {:error, %Error{reason: :invalid_capture_option, key: key, value: value, detail: expected}}
    end
  end

  defp check_document_size(compiled) do
    size = compiled |> sidecar_document() |> byte_size()

    if size > @max_document_bytes,
      do: {:error, %Error{reason: :document_too_large, key: :rules, value: size, detail: @max_document_bytes}},
      else: :ok
  end

  defp validate_default(default) when default in [:allow, :deny], do: {:ok, default}
  defp validate_default(default), do: {:error, %Error{reason: :invalid_default, key: :default, value: default}}

  defp validate_rules(rules) when is_list(rules) and length(rules) > @max_rules do
    {:error, %Error{reason: :too_many_rules, key: :rules, value: length(rules), detail: @max_rules}}
  end

  defp validate_rules(rules) when is_list(rules) do
    # A decide rule matches every request that reaches it and its answer
    # is final: a rule after the first one could never match.
    terminal = Enum.find_index(rules, &match?({:decide, _}, &1))

    rules
    |> Enum.with_index()
    |> Condukt.Options.map_ok(fn {rule, index} ->
      with {:ok, validated} <- validate_rule(rule, index),
           :ok <- check_reachable(rule, index, terminal),
           do: {:ok, validated}
    end)
  end

  defp validate_rules(rules), do: {:error, %Error{reason: :invalid_rules, key: :rules, value: rules}}

  defp check_reachable({kind, _}, index, terminal) when is_integer(terminal) and index > terminal,
    do: {:error, %Error{reason: :unreachable_rule, rule_index: index, key: kind, value: kind, detail: terminal}}

  defp check_reachable(_rule, _index, _terminal), do: :ok

  defp validate_rule({kind, patterns}, index) when kind in [:allow, :deny] do
    cond do
      patterns == [] ->
        {:error, %Error{reason: :empty_host_list, rule_index: index, key: kind, value: []}}

      not is_list(patterns) or not Enum.all?(patterns, &is_binary/1) ->
        {:error, %Error{reason: :invalid_host_list, rule_index: index, key: kind, value: patterns}}

      length(patterns) > @max_patterns ->
        {:error,
         %Error{
           reason: :too_many_patterns,
           rule_index: index,
           key: kind,
           value: length(patterns),
           detail: @max_patterns
         }}

      true ->
        patterns
        |> Condukt.Options.map_ok(fn pattern ->
          with {:error, code} <- Host.normalize_pattern(pattern) do
            {:error, %Error{reason: :invalid_pattern, rule_index: index, key: kind, value: pattern, detail: code}}
          end
        end)
        |> case do
          {:ok, normalized} -> {:ok, {{kind, patterns}, {kind, normalized}}}
          error -> error
        end
    end
  end

  defp validate_rule({:decide, options}, index) when is_list(options) do
    if Keyword.keyword?(options) and options != [] do
      validate_decide_options(options, index)
    else
      {:error, %Error{reason: :missing_call, rule_index: index, key: :decide, value: options}}
    end
  end

  defp validate_rule({:decide, callable}, index) do
    with :ok <- check_callable(callable, index) do
      validate_decide_options([call: callable], index)
    end
  end

  defp validate_rule({kind, _value}, index) when is_atom(kind) do
    {:error,
     %Error{
       reason: :unknown_rule_kind,
       rule_index: index,
       key: kind,
       value: kind,
       detail: Condukt.Options.suggest(kind, [:allow, :deny, :decide])
     }}
  end

  defp validate_rule(rule, index), do: {:error, %Error{reason: :invalid_rule, rule_index: index, value: rule}}

  defp validate_decide_options(options, index) do
    case Condukt.Options.validate(options, Schema.decide()) do
      {:ok, valid} ->
        with :ok <- check_callable(valid[:call], index), do: {:ok, {{:decide, valid}, {:decide, valid}}}

      {:error, {:unknown, key, suggestion}} ->
        {:error, %Error{reason: :unknown_decide_option, rule_index: index, key: key, value: key, detail: suggestion}}

      {:error, {:missing, :call}} ->
        {:error, %Error{reason: :missing_call, rule_index: index, key: :decide, value: options}}

      {:error, {:invalid, key, value, expected}} ->
        {:error, %Error{reason: :invalid_decide_option, rule_index: index, key: key, value: value, detail: expected}}
    end
  end

  defp check_callable(callable, index) do
    case callable_problem(callable) do
      nil ->
        :ok

      problem ->
        {:error, %Error{reason: :invalid_callable, rule_index: index, key: :call, value: callable, detail: problem}}
    end
  end

  defp callable_problem(fun) when is_function(fun, 2), do: nil

  defp callable_problem(fun) when is_function(fun) do
    {:arity, arity} = Function.info(fun, :arity)
    "a function decider takes 2 arguments (ctx, req), this one takes #{arity}"
  end

  defp callable_problem({module, opts}) when is_atom(module) and is_list(opts) do
    if Keyword.keyword?(opts),
      do: exported_problem(module, :decide, 3),
      else: "the options of {module, opts} must be a keyword list"
  end

  defp callable_problem({module, function}) when is_atom(module) and is_atom(function),
    do: exported_problem(module, function, 2)

  defp callable_problem(module) when is_atom(module) and module not in [nil, true, false],
    do: exported_problem(module, :decide, 3)

  defp callable_problem(_other) do
    "expected a 2-arity function, {module, function}, a module or {module, opts}"
  end

  defp exported_problem(module, function, arity) do
    cond do
      not match?({:module, _}, Code.ensure_loaded(module)) ->
        "module #{inspect(module)} is not available"

      not function_exported?(module, function, arity) ->
        "#{inspect(module)}.#{function}/#{arity} is not exported" <>
          if(function == :decide, do: " (the Condukt.Sandbox.NetworkPolicy.Decider callback)", else: "")

      true ->
        nil
    end
  end
end
