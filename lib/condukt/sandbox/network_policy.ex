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
    * An entry of an `allow:` or `deny:` list may also be
      `{host, methods: [...], paths: [...]}` (either list may be left
      out): it matches a request to the host only when the method is one
      of `methods` (upper case, compared exactly) and the path matches one
      of the `paths` globs (`*` within one segment, `**` any number of
      segments). The path is normalised first: escapes of unreserved
      characters decoded, dot segments removed, and `%2F`, `%5C`, `%00`,
      `//` and a climb above the root refused, so `/repos/myorg/../x`
      cannot pass for `/repos/myorg/x`. A request that matches the host but
      not the method or path falls through to the next rule; a path that
      cannot be judged is denied at the first rule with a path entry for
      the host (`:invalid_path`). `docs/path-matching.md` has the exact
      rules.

          allow: [{"api.github.com", methods: ["GET", "HEAD"], paths: ["/repos/myorg/**"]}],
          deny: ["api.github.com"]

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

  ## Credentials

  `:credentials` and `:secrets` keep API tokens out of the workspace: the
  sidecar adds a header holding a secret to the allowed requests of the
  hosts (and methods, paths) an entry names, replacing any copy the
  workspace sent; the values stay in the sidecar.

      credentials: [{"api.github.com", header: "authorization", value: {:secret, "github"}, paths: ["/repos/myorg/**"]}],
      secrets: %{"github" => {:env, "GITHUB_AUTH_HEADER"}}

  `Condukt.Sandbox.NetworkPolicy.Credentials` has the rules, where the
  values live and the limits; `rotate_credential/3` replaces a value in a
  running sandbox.

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

  `evaluate/3` runs the pipeline on a URL (with a `method:` option) or a
  `Request` without calling any decider. `to_sidecar_json/1` compiles the policy into the versioned JSON
  document the `condukt-egress` sidecar evaluates (`docs/policy-json.md`);
  decide callables stay on the BEAM.
  """

  alias Condukt.Sandbox.NetworkPolicy.{Context, Credentials, Error, Host, Request, RequestPath, Schema}

  @typedoc "A host glob such as `\"api.github.com\"` or `\"*.openai.com\"`."
  @type host_pattern :: String.t()

  @typedoc """
  One entry of an `allow:` or `deny:` list: a host pattern, or a host
  pattern with the methods and paths it covers.
  """
  @type entry :: host_pattern() | {host_pattern(), [methods: [String.t()], paths: [String.t()]]}

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
          {:allow, [entry()]}
          | {:deny, [entry()]}
          | {:decide, callable() | decide_options()}

  @type t :: %__MODULE__{
          rules: [rule()],
          default: :allow | :deny,
          body_preview: 0..65_536,
          redact_headers: [String.t()],
          redact_body: [Regex.t() | String.t()],
          credentials: [Credentials.entry()],
          secrets: %{String.t() => Credentials.source()}
        }

  @typedoc "Why `evaluate/2` denied a request."
  @type deny_reason :: :denied_by_rule | :default_deny | :invalid_host | :invalid_url | :invalid_path

  @type decision :: :allow | {:deny, deny_reason()} | {:decide, non_neg_integer()}

  @type matched_rule :: %{index: non_neg_integer(), kind: :allow | :deny | :decide} | nil

  # Version 2 adds entry objects (methods, paths), version 3 credentials;
  # a policy without them compiles to the lowest version that holds it, so
  # an older sidecar reads every policy it can enforce.
  @sidecar_version 3
  # The sidecar's limits (docs/policy-json.md); new/1 enforces them so a
  # policy the sidecar would refuse never leaves the BEAM.
  @max_rules 4096
  @max_patterns 4096
  @max_methods 64
  @max_paths 256
  @method_re ~r/\A[A-Z0-9_-]{1,32}\z/
  @max_document_bytes 4 * 1024 * 1024

  defstruct rules: [],
            default: :deny,
            body_preview: 0,
            redact_headers: [],
            redact_body: [],
            credentials: [],
            secrets: %{}

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
  `host[:port]`, or a `%Request{}` (its `:host`, `:method` and `:path`).

  `opts` takes `method: "POST"`, the method of a URL or host (a `Request`
  carries its own). Without a method, entries with `methods:` do not match;
  a bare host has no path, so entries with `paths:` do not match it.

  Returns `{decision, matched_rule}`. Decide rules are not called: they
  yield `{:decide, index}`. An invalid host or URL is denied before any rule
  with reason `:invalid_host` or `:invalid_url`; a path that path entries
  cannot judge (`docs/path-matching.md`) is denied at the first rule with
  such an entry for the host, with reason `:invalid_path`. Raises
  `Condukt.Sandbox.NetworkPolicy.Error` if the policy is invalid.

      iex> policy = Condukt.Sandbox.NetworkPolicy.new!(rules: [allow: ["*.github.com"]])
      iex> Condukt.Sandbox.NetworkPolicy.evaluate(policy, "https://api.github.com/repos")
      {:allow, %{index: 0, kind: :allow}}
      iex> Condukt.Sandbox.NetworkPolicy.evaluate(policy, "https://api.github.com.evil.net/")
      {{:deny, :default_deny}, nil}
      iex> policy = Condukt.Sandbox.NetworkPolicy.new!(rules: [allow: [{"api.github.com", methods: ["GET"], paths: ["/repos/myorg/**"]}]])
      iex> Condukt.Sandbox.NetworkPolicy.evaluate(policy, "https://api.github.com/repos/myorg/x", method: "GET")
      {:allow, %{index: 0, kind: :allow}}
      iex> Condukt.Sandbox.NetworkPolicy.evaluate(policy, "https://api.github.com/repos/myorg/../x", method: "GET")
      {{:deny, :default_deny}, nil}
  """
  @spec evaluate(t() | keyword() | map(), Request.t() | String.t(), [{:method, String.t()}]) ::
          {decision(), matched_rule()}
  def evaluate(policy, target, opts \\ []) do
    {rules, default, _credentials} = compile!(policy)

    case target_host(target) do
      {:ok, host} -> walk(rules, {host, target_method(target, opts), target_path(target)}, default)
      {:error, reason} -> {{:deny, reason}, nil}
    end
  end

  @doc """
  Dry-runs credential injection (`Condukt.Sandbox.NetworkPolicy.Credentials`):
  which of the policy's credentials the sidecar would add to a request
  for `target` (a URL, a bare `host[:port]` or a `%Request{}`, as in
  `evaluate/3`, with the same `method:` option), so that you can check
  their scopes before a sandbox runs.

  Returns one `%{index: i, header: header, secret: name}` per header the
  request would get: `index` is the entry's position in `:credentials`
  (the first matching entry for each header wins), `header` the header in
  lower case, `secret` the name of the secret whose value it takes. Never
  a value: the dry run resolves no secret. The list is empty when
  `evaluate/3` denies the request, when `target` is a plain `http://` or
  `ws://` URL (a credential never crosses the network in clear), or when
  no entry matches. A bare host counts as HTTPS and has no path, so
  entries with `paths:` do not match it. When the decision is a decide
  rule, the list says what the request would get if the decider allowed
  it. `condukt-egress policy eval` prints the same list.

      iex> policy = Condukt.Sandbox.NetworkPolicy.new!(
      ...>   rules: [allow: ["api.github.com"]],
      ...>   credentials: [{"api.github.com", header: "Authorization", value: {:secret, "gh"}, methods: ["GET"]}],
      ...>   secrets: %{"gh" => "Bearer t0ken"}
      ...> )
      iex> Condukt.Sandbox.NetworkPolicy.evaluate_credentials(policy, "https://api.github.com/user", method: "GET")
      [%{index: 0, header: "authorization", secret: "gh"}]
      iex> Condukt.Sandbox.NetworkPolicy.evaluate_credentials(policy, "https://api.github.com/user", method: "POST")
      []
      iex> Condukt.Sandbox.NetworkPolicy.evaluate_credentials(policy, "http://api.github.com/user", method: "GET")
      []

  Raises `Condukt.Sandbox.NetworkPolicy.Error` if the policy is invalid.
  """
  @spec evaluate_credentials(t() | keyword() | map(), Request.t() | String.t(), [{:method, String.t()}]) :: [
          %{index: non_neg_integer(), header: String.t(), secret: String.t()}
        ]
  def evaluate_credentials(policy, target, opts \\ []) do
    {rules, default, credentials} = compile!(policy)

    with false <- plain?(target),
         {:ok, host} <- target_host(target),
         request = {host, target_method(target, opts), target_path(target)},
         {decision, _} when decision == :allow or (is_tuple(decision) and elem(decision, 0) == :decide) <-
           walk(rules, request, default) do
      credentials
      |> Enum.with_index()
      |> Enum.filter(fn {{pattern, conditions, _header, _name}, _i} ->
        entry_match({pattern, conditions}, request) == :yes
      end)
      |> Enum.uniq_by(fn {{_, _, header, _}, _i} -> header end)
      |> Enum.map(fn {{_, _, header, name}, i} -> %{index: i, header: header, secret: name} end)
    else
      _ -> []
    end
  end

  # Requests that go upstream in clear (or are not HTTP) never get one.
  defp plain?(%Request{scheme: scheme}), do: scheme in [:http, :dns]

  defp plain?(url) when is_binary(url) do
    case :binary.split(url, "://") do
      [scheme, _] -> String.downcase(scheme, :ascii) in ["http", "ws"]
      [_host] -> false
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
  Gives a running sandbox a new value for the secret `name` of its
  policy's `:secrets` (`Condukt.Sandbox.NetworkPolicy.Credentials`). The
  sidecar uses it from its next request on; the sidecar's stored copy
  (Kubernetes: its Secret; Local: its file) is replaced too, so a
  restarted sidecar keeps it.

  Returns `:ok`, or `{:error, %Condukt.Sandbox.NetworkPolicy.Error{}}`
  with reason `:unknown_secret` (the policy has no such secret),
  `:secret_unavailable` (the value is not a header value; the message
  never shows it) or `:rotation_failed` (the sandbox has no network policy
  or no sidecar, or the sidecar did not confirm in time: `:detail` says
  which).
  """
  @spec rotate_credential(Condukt.Sandbox.t(), String.t(), String.t()) :: :ok | {:error, Error.t()}
  def rotate_credential(%Condukt.Sandbox{module: module, state: state}, name, value) do
    cond do
      (why = Credentials.value_problem(value)) != nil ->
        {:error, %Error{reason: :secret_unavailable, key: :secrets, value: name, detail: why}}

      not function_exported?(module, :rotate_credential, 3) ->
        {:error,
         %Error{reason: :rotation_failed, key: :secrets, value: name, detail: "#{inspect(module)} has no sidecar"}}

      true ->
        module.rotate_credential(state, name, value)
    end
  end

  @doc false
  # For the backends: the policy's secret has that name, or the error.
  @spec check_rotation(t() | nil, term()) :: :ok | {:error, Error.t()}
  def check_rotation(%__MODULE__{secrets: secrets}, name) when is_map_key(secrets, name), do: :ok

  def check_rotation(%__MODULE__{}, name),
    do: {:error, %Error{reason: :unknown_secret, key: :secrets, value: name}}

  def check_rotation(nil, name),
    do:
      {:error,
       %Error{reason: :rotation_failed, key: :secrets, value: name, detail: "the sandbox has no network policy"}}

  @doc """
  Compiles the policy into the sidecar's JSON document (version
  #{@sidecar_version}, `docs/policy-json.md`): patterns normalised, decide
  rules reduced to their index, timeout and cache flag. Raises
  `Condukt.Sandbox.NetworkPolicy.Error` if the policy is invalid.
  """
  @spec to_sidecar_json(t() | keyword() | map()) :: String.t()
  def to_sidecar_json(policy), do: policy |> compile!() |> sidecar_document()

  # From compiled rules (patterns already normalised).
  defp sidecar_document({rules, default, credentials}) do
    json_rules =
      rules
      |> Enum.with_index()
      |> Enum.map(fn
        {{:decide, opts}, i} ->
          {[{"index", i}, {"kind", "decide"}, {"timeout_ms", opts[:timeout]}, {"cache", opts[:cache]}]}

        {{kind, entries}, i} ->
          {[{"index", i}, {"kind", Atom.to_string(kind)}, {"hosts", Enum.map(entries, &json_entry/1)}]}
      end)

    version =
      cond do
        credentials != [] -> 3
        Enum.any?(rules, &conditional?/1) -> 2
        true -> 1
      end

    extra = if credentials == [], do: [], else: [{"credentials", Credentials.sidecar_entries(credentials)}]

    Condukt.JSON.encode!({[{"version", version}, {"default", Atom.to_string(default)}, {"rules", json_rules}] ++ extra})
  end

  defp json_entry({host, nil}), do: Host.to_text(host)

  defp json_entry({host, conditions}) do
    {[{"host", Host.to_text(host)}] ++
       for(
         {key, list} <- [methods: conditions.methods, paths: conditions.paths],
         list != nil,
         do: {Atom.to_string(key), list}
       )}
  end

  defp conditional?({kind, entries}) when kind in [:allow, :deny], do: Enum.any?(entries, &match?({_, %{}}, &1))
  defp conditional?(_rule), do: false

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

  defp target_method(%Request{method: method}, opts), do: Keyword.get(opts, :method, method)
  defp target_method(_url, opts), do: Keyword.get(opts, :method)

  # nil: no path known; {:ok, normalised} or :error (refused).
  defp target_path(%Request{path: nil}), do: nil
  defp target_path(%Request{path: path}), do: RequestPath.normalize(path)

  defp target_path(url) do
    case RequestPath.url_path(url) do
      nil -> nil
      path -> RequestPath.normalize(path)
    end
  end

  defp walk(rules, request, default) do
    rules
    |> Enum.with_index()
    |> Enum.find_value(fn {rule, index} -> rule_decision(rule, index, request) end)
    |> case do
      nil when default == :allow -> {:allow, nil}
      nil -> {{:deny, :default_deny}, nil}
      found -> found
    end
  end

  defp rule_decision({:decide, _opts}, i, _request), do: {{:decide, i}, %{index: i, kind: :decide}}

  # An entry whose host matches but whose method or path does not lets the
  # request fall through; a path that a path entry cannot judge is denied
  # here rather than let through to a later rule (docs/path-matching.md).
  defp rule_decision({kind, entries}, i, request) do
    results = Enum.map(entries, &entry_match(&1, request))

    cond do
      :yes in results ->
        decision = if kind == :allow, do: :allow, else: {:deny, :denied_by_rule}
        {decision, %{index: i, kind: kind}}

      :invalid_path in results ->
        {{:deny, :invalid_path}, %{index: i, kind: kind}}

      true ->
        nil
    end
  end

  defp entry_match({pattern, conditions}, {host, method, path}) do
    cond do
      not Host.match?(pattern, host) -> :no
      conditions == nil -> :yes
      conditions.methods != nil and method not in conditions.methods -> :no
      conditions.paths == nil -> :yes
      path == nil -> :no
      path == :error -> :invalid_path
      Enum.any?(conditions.paths, &RequestPath.match?(&1, elem(path, 1))) -> :yes
      true -> :no
    end
  end

  ## Validation ---------------------------------------------------------------

  @policy_keys [:rules, :default, :body_preview, :redact_headers, :redact_body, :credentials, :secrets]

  defp fields(%__MODULE__{} = policy), do: {:ok, Map.from_struct(policy)}

  defp fields(policy) when is_map(policy) and not is_struct(policy) do
    check_policy_keys(Map.to_list(policy))
  end

  defp fields(policy) when is_list(policy) do
    if Keyword.keyword?(policy),
      do: check_policy_keys(policy),
      else: {:error, %Error{reason: :invalid_policy, value: Enum.map(policy, &hide_secrets/1)}}
  end

  defp fields(policy), do: {:error, %Error{reason: :invalid_policy, value: policy}}

  # An error shows the value it refused: never a secret's.
  defp hide_secrets({:secrets, secrets}), do: {:secrets, Credentials.redact_secrets(secrets)}
  defp hide_secrets(other), do: other

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
         {:ok, credentials, secrets, compiled_creds} <-
           Credentials.validate(
             Map.get(fields, :credentials, []),
             Map.get(fields, :secrets, %{}),
             &credential_conditions/3
           ),
         compiled = {compiled_rules, default, compiled_creds},
         :ok <- check_document_size(compiled),
         {:ok, capture} <- validate_capture(fields) do
      {:ok, struct!(%__MODULE__{rules: rules, default: default, credentials: credentials, secrets: secrets}, capture),
       compiled}
    end
  end

  # A credential's methods and paths, checked as an allow entry's are.
  defp credential_conditions(key, list, index) do
    result = if key == :methods, do: validate_methods(list, index), else: validate_paths(list, index)

    case result do
      {:error, error} -> {:error, %{error | rule_index: nil, credential_index: index}}
      ok -> ok
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

      not is_list(patterns) or not Enum.all?(patterns, &entry_shape?/1) ->
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
        |> Condukt.Options.map_ok(&validate_entry(&1, kind, index))
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

  defp entry_shape?(pattern) when is_binary(pattern), do: true
  defp entry_shape?({pattern, opts}) when is_binary(pattern) and is_list(opts), do: true
  defp entry_shape?(_entry), do: false

  # Compiled: {normalised host, nil | %{methods: list | nil, paths: list | nil}}.
  defp validate_entry(pattern, kind, index) when is_binary(pattern) do
    with {:ok, host} <- validate_host(pattern, kind, index), do: {:ok, {host, nil}}
  end

  defp validate_entry({pattern, opts} = entry, kind, index) do
    with {:ok, host} <- validate_host(pattern, kind, index),
         :ok <- check_entry_options(entry, opts, kind, index),
         {:ok, methods} <- validate_methods(Keyword.get(opts, :methods), index),
         {:ok, paths} <- validate_paths(Keyword.get(opts, :paths), index) do
      {:ok, {host, %{methods: methods, paths: paths}}}
    end
  end

  defp validate_host(pattern, kind, index) do
    with {:error, code} <- Host.normalize_pattern(pattern) do
      {:error, %Error{reason: :invalid_pattern, rule_index: index, key: kind, value: pattern, detail: code}}
    end
  end

  @entry_options [:methods, :paths]

  defp check_entry_options(entry, opts, kind, index) do
    invalid = fn detail ->
      {:error, %Error{reason: :invalid_entry, rule_index: index, key: kind, value: entry, detail: detail}}
    end

    cond do
      not Keyword.keyword?(opts) ->
        invalid.("the options of {host, options} are a keyword list")

      key = Enum.find(Keyword.keys(opts), &(&1 not in @entry_options)) ->
        {:error,
         %Error{
           reason: :unknown_entry_option,
           rule_index: index,
           key: key,
           value: key,
           detail: Condukt.Options.suggest(key, @entry_options)
         }}

      opts == [] ->
        invalid.("name :methods or :paths, or write the host as a plain string")

      length(Keyword.keys(opts)) != length(Enum.uniq(Keyword.keys(opts))) ->
        invalid.("each of :methods and :paths is given once")

      true ->
        :ok
    end
  end

  defp validate_methods(nil, _index), do: {:ok, nil}

  defp validate_methods(methods, index) do
    with :ok <- check_condition_list(methods, :methods, @max_methods, index) do
      case Enum.find(methods, &(not (is_binary(&1) and Regex.match?(@method_re, &1)))) do
        nil -> {:ok, methods}
        bad -> {:error, %Error{reason: :invalid_method, rule_index: index, key: :methods, value: bad}}
      end
    end
  end

  defp validate_paths(nil, _index), do: {:ok, nil}

  defp validate_paths(paths, index) do
    with :ok <- check_condition_list(paths, :paths, @max_paths, index) do
      Condukt.Options.map_ok(paths, fn path ->
        with {:error, code} <- RequestPath.normalize_pattern(path) do
          {:error, %Error{reason: :invalid_path_pattern, rule_index: index, key: :paths, value: path, detail: code}}
        end
      end)
    end
  end

  defp check_condition_list(list, key, max, index) do
    cond do
      not is_list(list) or list == [] or not Enum.all?(list, &is_binary/1) ->
        {:error, %Error{reason: :invalid_condition_list, rule_index: index, key: key, value: list}}

      length(list) > max ->
        {:error, %Error{reason: :too_many_conditions, rule_index: index, key: key, value: length(list), detail: max}}

      true ->
        :ok
    end
  end

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

defimpl Inspect, for: Condukt.Sandbox.NetworkPolicy do
  # A literal secret value never appears in inspect output (logs, crash
  # reports, the state of processes that hold a policy).
  def inspect(%{secrets: secrets} = policy, opts) when is_map(secrets) do
    Inspect.Any.inspect(%{policy | secrets: Condukt.Sandbox.NetworkPolicy.Credentials.redact_secrets(secrets)}, opts)
  end

  def inspect(policy, opts), do: Inspect.Any.inspect(policy, opts)
end
