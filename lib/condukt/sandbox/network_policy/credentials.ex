defmodule Condukt.Sandbox.NetworkPolicy.Credentials do
  @moduledoc """
  Credential injection: the sidecar adds a header holding a secret to the
  requests the policy allows, for the hosts (and methods, paths) a
  credential names, so that the workspace never holds the secret.

      Condukt.Sandbox.NetworkPolicy.new!(
        rules: [allow: ["api.github.com"]],
        credentials: [
          {"api.github.com",
           header: "authorization",
           value: {:secret, "github"},
           methods: ["GET", "POST"],
           paths: ["/repos/myorg/**"]}
        ],
        secrets: %{"github" => fn -> "Bearer " <> System.fetch_env!("GITHUB_TOKEN") end}
      )

  ## Credentials

  `:credentials` is a list of `{host, options}` entries:

    * `host` - a host pattern, as in `allow:` (`docs/host-matching.md`);
    * `:header` (required) - the header to set, any case (sent in lower
      case). Fields the proxy owns cannot carry a credential: `host`,
      `content-length`, `transfer-encoding`, `connection`, `keep-alive`,
      `proxy-connection`, `te`, `trailer`, `upgrade`,
      `proxy-authorization`;
    * `:value` (required) - `{:secret, name}`: the header's value is the
      whole value of that secret (write `"Bearer "` and the like into the
      secret);
    * `:methods`, `:paths` (optional) - as in an `allow:` entry: the
      credential is added only to requests with one of these methods and
      a path matching one of these globs (`docs/path-matching.md`).

  A credential is added only to a request that the policy **allowed**
  (an `allow:` rule, the default, or a decider), that matches the entry,
  and that goes upstream over verified TLS (plain `http://` never gets
  one: the secret would cross the network in clear). Every field of the
  same name the workspace sent is removed first, whatever its case, over
  HTTP/1.1 and HTTP/2 alike, so the workspace cannot send its own value
  next to it. When several entries match a request, the first one for each
  header wins. The proxy does not follow redirects: a redirect to another
  host comes back to the workspace, whose next request is matched afresh
  and gets no credential unless an entry names that host too.

  A `Connection` field of the workspace names fields of its own hop, never
  the credential: naming the credential's header there does not remove it.

  `Condukt.Sandbox.NetworkPolicy.evaluate_credentials/3` dry-runs this:
  which entries (index, header, secret name; never a value) a request
  would get.

  Events and decider requests show the request as the workspace sent it,
  never the credential; headers named by a credential are redacted in
  them like `authorization`.

  ## Secrets

  `:secrets` maps each secret name (1 to 128 bytes of `A-Z`, `a-z`,
  `0-9`, `.`, `_`, `-`) to where its value comes from:

    * a 0-arity function, called when the sandbox starts;
    * `{:env, "VAR"}` - the BEAM's environment variable, read when the
      sandbox starts;
    * a string - the value itself.

  Values are 1 to 8192 bytes of a header value: no control characters
  (CR, LF, NUL...) and no leading or trailing space. Every secret is named
  by some credential, and every credential's secret is defined. `inspect/1`
  of a policy shows `"[redacted]"` for a literal value, and no error
  message ever contains a value.

  ## Where the values go

  Only to the sidecar: on Kubernetes in the sidecar's own Secret (which
  the workspace container does not mount; `Condukt.Sandbox.Kubernetes.manifests/1`
  shows a placeholder), on Local in a file of the sidecar's directory that
  only the sidecar's uid can read. Never into the workspace's environment
  or files. The Virtual sandbox has no sidecar: a policy with credentials
  is refused there.

  ## Rotation

  `Condukt.Sandbox.NetworkPolicy.rotate_credential/3` gives a running
  sandbox a new value for a secret: the sidecar uses it from the next
  request on, and the stored copy is replaced so that a restarted sidecar
  keeps it.

  ## Limits

    * An origin you give a credential to can send it back (an endpoint that
      echoes request headers, `TRACE`): the workspace then sees it. Name
      hosts and paths narrowly.
    * At most 256 credentials and 256 secrets.
  """

  alias Condukt.Sandbox.NetworkPolicy.{Error, Host}

  @max_credentials 256
  @max_value 8192
  @name_re ~r/\A[A-Za-z0-9._-]{1,128}\z/
  @header_re ~r/\A[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}\z/
  @owned ~w(host content-length transfer-encoding connection keep-alive proxy-connection te trailer upgrade proxy-authorization)
  @options [:header, :value, :methods, :paths]

  @typedoc "Where a secret's value comes from."
  @type source :: String.t() | {:env, String.t()} | (() -> String.t())

  @typedoc "A credential entry of `:credentials`."
  @type entry ::
          {String.t(), [header: String.t(), value: {:secret, String.t()}, methods: [String.t()], paths: [String.t()]]}

  @typedoc false
  # {normalised host, conditions (as an allow entry's), header (lower case), secret name}
  @type compiled :: {term(), map() | nil, String.t(), String.t()}

  @doc false
  # Validates :credentials against :secrets. Returns {:ok, credentials,
  # secrets, compiled} or {:error, %Error{}}; checks condition lists with
  # the functions given (the policy's own, shared with allow entries).
  @spec validate(term(), term(), (term(), non_neg_integer() -> {:ok, term()} | {:error, Error.t()})) ::
          {:ok, [entry()], %{String.t() => source()}, [compiled()]} | {:error, Error.t()}
  def validate(credentials, secrets, conditions) do
    with {:ok, secrets} <- validate_secrets(secrets),
         {:ok, compiled} <- validate_credentials(credentials, conditions),
         :ok <- check_references(compiled, secrets) do
      {:ok, credentials, secrets, compiled}
    end
  end

  defp validate_secrets(secrets) when is_map(secrets) do
    cond do
      map_size(secrets) > @max_credentials ->
        {:error,
         %Error{reason: :too_many_credentials, key: :secrets, value: map_size(secrets), detail: @max_credentials}}

      true ->
        problem =
          secrets
          |> Enum.sort()
          |> Enum.find_value(fn {name, source} ->
            cond do
              not (is_binary(name) and Regex.match?(@name_re, name)) ->
                %Error{reason: :invalid_secret_name, key: :secrets, value: name}

              (why = source_problem(source)) != nil ->
                %Error{reason: :invalid_secret, key: :secrets, value: name, detail: why}

              true ->
                nil
            end
          end)

        if problem, do: {:error, problem}, else: {:ok, secrets}
    end
  end

  defp validate_secrets(other),
    do: {:error, %Error{reason: :invalid_secrets, key: :secrets, value: redact_secrets(other)}}

  defp source_problem(fun) when is_function(fun, 0), do: nil
  defp source_problem({:env, var}) when is_binary(var) and var != "", do: nil
  defp source_problem(value) when is_binary(value), do: value_problem(value)

  defp source_problem(_other),
    do: "expected a 0-arity function, {:env, \"VAR\"} or the value as a string"

  @doc """
  Why `value` cannot be a credential's header value, or `nil` when it
  can: 1 to #{@max_value} bytes, no control characters, no leading or
  trailing space or tab. The sentence never contains the value.
  """
  @spec value_problem(term()) :: String.t() | nil
  def value_problem(value) when is_binary(value) do
    cond do
      value == "" ->
        "the value is empty"

      byte_size(value) > @max_value ->
        "the value is longer than #{@max_value} bytes"

      :binary.bin_to_list(value) |> Enum.any?(&((&1 < 0x20 and &1 != ?\t) or &1 == 0x7F)) ->
        "the value holds a control character (CR, LF, NUL, ...), which no header value may"

      String.first(value) in [" ", "\t"] or String.last(value) in [" ", "\t"] ->
        "the value starts or ends with a space or a tab"

      true ->
        nil
    end
  end

  def value_problem(_value), do: "the value is not a string"

  defp validate_credentials(list, conditions) when is_list(list) do
    if length(list) > @max_credentials do
      {:error, %Error{reason: :too_many_credentials, key: :credentials, value: length(list), detail: @max_credentials}}
    else
      list |> Enum.with_index() |> Condukt.Options.map_ok(fn {entry, i} -> validate_entry(entry, i, conditions) end)
    end
  end

  defp validate_credentials(other, _conditions),
    do: {:error, %Error{reason: :invalid_credentials, key: :credentials, value: redact(other)}}

  defp validate_entry({host, opts} = entry, i, conditions) when is_binary(host) and is_list(opts) do
    bad = fn detail ->
      {:error,
       %Error{reason: :invalid_credential, credential_index: i, key: :credentials, value: redact(entry), detail: detail}}
    end

    with :ok <- check_options(opts, i, bad),
         {:ok, norm} <- normalize_host(host, i),
         {:ok, header} <- check_header(opts[:header], i),
         {:ok, name} <- check_value(opts[:value], bad),
         {:ok, methods} <- conditions.(:methods, opts[:methods], i),
         {:ok, paths} <- conditions.(:paths, opts[:paths], i) do
      cond_map = if methods == nil and paths == nil, do: nil, else: %{methods: methods, paths: paths}
      {:ok, {norm, cond_map, header, name}}
    end
  end

  defp validate_entry(entry, i, _conditions) do
    {:error,
     %Error{
       reason: :invalid_credential,
       credential_index: i,
       key: :credentials,
       value: redact(entry),
       detail: "expected {host, header: ..., value: {:secret, name}}"
     }}
  end

  defp check_options(opts, i, bad) do
    keys = if Keyword.keyword?(opts), do: Keyword.keys(opts), else: nil

    cond do
      keys == nil ->
        bad.("the options of {host, options} are a keyword list")

      key = Enum.find(keys, &(&1 not in @options)) ->
        {:error,
         %Error{
           reason: :unknown_credential_option,
           credential_index: i,
           key: key,
           value: key,
           detail: Condukt.Options.suggest(key, @options)
         }}

      length(keys) != length(Enum.uniq(keys)) ->
        bad.("each option is given once")

      not Keyword.has_key?(opts, :header) ->
        bad.("name the header to set with :header")

      not Keyword.has_key?(opts, :value) ->
        bad.("name the secret with value: {:secret, name}")

      true ->
        :ok
    end
  end

  defp normalize_host(host, i) do
    with {:error, code} <- Host.normalize_pattern(host) do
      {:error, %Error{reason: :invalid_pattern, credential_index: i, key: :credentials, value: host, detail: code}}
    end
  end

  defp check_header(header, i) do
    lower = if is_binary(header), do: String.downcase(header, :ascii)

    problem =
      cond do
        not (is_binary(header) and Regex.match?(@header_re, header)) ->
          "a header name is a token of 1 to 64 bytes (letters, digits and !#$%&'*+-.^_`|~)"

        lower in @owned ->
          "the proxy owns this field (routing, framing or connection): a credential cannot be sent in it"

        true ->
          nil
      end

    if problem,
      do:
        {:error,
         %Error{reason: :invalid_credential_header, credential_index: i, key: :header, value: header, detail: problem}},
      else: {:ok, lower}
  end

  defp check_value({:secret, name}, bad) do
    if is_binary(name) and Regex.match?(@name_re, name),
      do: {:ok, name},
      else: bad.("the secret name is 1 to 128 bytes of A-Z, a-z, 0-9, \".\", \"_\" and \"-\"")
  end

  defp check_value(_other, bad),
    do: bad.("value: is {:secret, name}, naming one of :secrets (a value is never written into a credential)")

  defp check_references(compiled, secrets) do
    used = compiled |> Enum.map(&elem(&1, 3)) |> MapSet.new()

    case Enum.find_index(compiled, fn {_, _, _, name} -> not Map.has_key?(secrets, name) end) do
      nil ->
        case secrets |> Map.keys() |> Enum.sort() |> Enum.find(&(not MapSet.member?(used, &1))) do
          nil -> :ok
          name -> {:error, %Error{reason: :unused_secret, key: :secrets, value: name}}
        end

      i ->
        {:error,
         %Error{reason: :unknown_secret, credential_index: i, key: :value, value: elem(Enum.at(compiled, i), 3)}}
    end
  end

  # A value that cannot be shown: anything but {:secret, name} in :value.
  @doc false
  @spec redact(term()) :: term()
  def redact({host, opts}) when is_list(opts) do
    {host,
     Enum.map(opts, fn
       {:value, {:secret, _} = v} -> {:value, v}
       {:value, _} -> {:value, "[redacted]"}
       other -> other
     end)}
  end

  def redact(list) when is_list(list), do: Enum.map(list, &redact/1)
  def redact(map) when is_map(map) and not is_struct(map), do: Map.new(map, fn {k, v} -> {k, redact_source(v)} end)
  def redact(other), do: other

  @doc false
  # Anything given as :secrets, for an error or inspect: every string in it
  # (at any depth) may be a value, but the name of an environment variable.
  @spec redact_secrets(term()) :: term()
  def redact_secrets(map) when is_map(map) and not is_struct(map),
    do: Map.new(map, fn {k, v} -> {k, redact_secrets(v)} end)

  def redact_secrets({:env, var}) when is_binary(var), do: {:env, var}
  def redact_secrets(list) when is_list(list), do: Enum.map(list, &redact_secrets/1)
  def redact_secrets(tuple) when is_tuple(tuple), do: tuple |> Tuple.to_list() |> redact_secrets() |> List.to_tuple()
  def redact_secrets(v), do: redact_source(v)

  @doc false
  @spec redact_source(term()) :: term()
  def redact_source(v) when is_binary(v), do: "[redacted]"
  def redact_source(v), do: v

  @doc false
  # The "credentials" member of the sidecar document (docs/policy-json.md).
  @spec sidecar_entries([compiled()]) :: [term()]
  def sidecar_entries(compiled) do
    for {host, conditions, header, name} <- compiled do
      extra =
        for {key, list} <- [methods: conditions && conditions.methods, paths: conditions && conditions.paths],
            list != nil,
            do: {Atom.to_string(key), list}

      {[{"host", Host.to_text(host)}] ++ extra ++ [{"header", header}, {"secret", name}]}
    end
  end

  @doc """
  Resolves every secret of a validated policy: calls the functions and
  reads the environment variables. Returns `{:ok, %{name => value}}`, or
  `{:error, %Condukt.Sandbox.NetworkPolicy.Error{reason: :secret_unavailable}}`
  naming the secret and why (never its value).
  """
  @spec values(%{String.t() => source()}) :: {:ok, %{String.t() => String.t()}} | {:error, Error.t()}
  def values(secrets) do
    secrets
    |> Enum.sort()
    |> Condukt.Options.map_ok(fn {name, source} ->
      with {:ok, value} <- resolve(name, source) do
        case value_problem(value) do
          nil -> {:ok, {name, value}}
          why -> unavailable(name, why)
        end
      end
    end)
    |> case do
      {:ok, pairs} -> {:ok, Map.new(pairs)}
      error -> error
    end
  end

  defp resolve(name, {:env, var}) do
    case System.get_env(var) do
      nil -> unavailable(name, "the environment variable #{var} is not set")
      value -> {:ok, value}
    end
  end

  defp resolve(name, fun) when is_function(fun, 0) do
    {:ok, fun.()}
  rescue
    e -> unavailable(name, "its function raised #{inspect(e.__struct__)}")
  catch
    kind, _ -> unavailable(name, "its function failed (#{kind})")
  end

  defp resolve(_name, value) when is_binary(value), do: {:ok, value}

  defp unavailable(name, why),
    do: {:error, %Error{reason: :secret_unavailable, key: :secrets, value: name, detail: why}}

  @doc """
  The sidecar's secrets file (`condukt-egress proxy --credentials FILE`):
  `{"version": 1, "secrets": {name: value}}`.
  """
  @spec sidecar_secrets_json(%{String.t() => String.t()}) :: String.t()
  def sidecar_secrets_json(values) do
    Condukt.JSON.encode!({[{"version", 1}, {"secrets", {Enum.sort(values)}}]})
  end
end
