defmodule Condukt.Kube do
  @moduledoc """
  A small Kubernetes API client over the `condukt-egress port` program
  (`Condukt.Native`'s `kube_*` operations, docs/port-protocol.md): REST
  calls, exec and port-forward, with errors that name what to fix
  (`Condukt.Kube.Error`).

      {:ok, kube} = Condukt.Kube.connect(context: "prod")
      {:ok, pod} = Condukt.Kube.get(kube, :pods, "agents", "condukt-job-42-1a2b3c4d5e")
      {:ok, %{exit_code: 0, stdout: out}} = Condukt.Kube.exec(kube, "agents", pod_name, "workspace", ["ls", "/"])
      :ok = Condukt.Kube.close(kube)

  ## Connection resolution

  `connect/1` resolves one source, in this order:

    1. `:conn` — a `Condukt.Kube.Conn` (or a keyword list / map of its
       fields: `:server`, `:ca_pem`, `:insecure`, `:token`, `:token_file`,
       `:client_cert_pem`, `:client_key_pem`), or an already connected
       `Condukt.Kube` (reused, not closed by `close/1` of a borrower);
    2. the in-cluster ServiceAccount (`/var/run/secrets/kubernetes.io/serviceaccount/`)
       when `in_cluster: true`, or when `KUBERNETES_SERVICE_HOST` is set and
       `:in_cluster` is not `false`;
    3. a kubeconfig: `:kubeconfig` (a path or a list of paths), else
       `$KUBECONFIG` (a colon-separated list), else `~/.kube/config`, with
       `:context` (default: the file's `current-context`).

  Nothing is sent to the server by `connect/1`.
  """

  alias Condukt.Kube.{Conn, Error}
  alias Condukt.Native

  @enforce_keys [:native, :handle]
  defstruct [:native, :handle, :server, :context, :namespace, :user, :auth, owned: true]

  @typedoc "A connection: the port program that holds it and its handle there."
  @type t :: %__MODULE__{
          native: pid(),
          handle: pos_integer(),
          server: String.t() | nil,
          context: String.t() | nil,
          namespace: String.t() | nil,
          user: String.t() | nil,
          auth: atom() | nil,
          owned: boolean()
        }

  @typedoc "A resource this client knows the API path of."
  @type resource :: :pods | :secrets | :networkpolicies

  @typedoc "Connection options (see \"Connection resolution\")."
  @type conn_opts :: [
          conn: Conn.t() | keyword() | map() | t(),
          in_cluster: boolean(),
          kubeconfig: Path.t() | [Path.t()],
          context: String.t(),
          native: GenServer.server()
        ]

  @resources %{
    pods: {"/api/v1", "pods"},
    secrets: {"/api/v1", "secrets"},
    networkpolicies: {"/apis/networking.k8s.io/v1", "networkpolicies"}
  }

  @default_timeout 30_000

  ## Connection ---------------------------------------------------------------

  @doc """
  The `kube_open` source for `opts`, without opening anything: the
  resolution order above as a map (docs/port-protocol.md). `env` is the
  environment to read `KUBERNETES_SERVICE_HOST`, `KUBECONFIG` and `HOME`
  from (default: the BEAM's).
  """
  @spec source(keyword(), %{optional(String.t()) => String.t()}) :: {:ok, map() | t()} | {:error, Error.t()}
  def source(opts, env \\ System.get_env()) do
    cond do
      Keyword.get(opts, :conn) != nil ->
        case opts[:conn] do
          %__MODULE__{} = kube ->
            {:ok, kube}

          conn ->
            case Conn.new(conn) do
              {:ok, conn} -> {:ok, Conn.to_source(conn)}
              {:error, why} -> {:error, %Error{reason: :config, message: "option :conn: " <> why}}
            end
        end

      in_cluster?(opts, env) ->
        {:ok, %{source: :in_cluster}}

      true ->
        kubeconfig_source(opts, env)
    end
  end

  defp in_cluster?(opts, env) do
    case Keyword.get(opts, :in_cluster) do
      true -> true
      false -> false
      nil -> Map.get(env, "KUBERNETES_SERVICE_HOST", "") != "" and opts[:kubeconfig] == nil
    end
  end

  defp kubeconfig_source(opts, env) do
    paths =
      case opts[:kubeconfig] do
        nil ->
          case Map.get(env, "KUBECONFIG", "") |> String.split(":", trim: true) do
            [] -> [Path.join(Map.get(env, "HOME") || System.user_home() || "/", ".kube/config")]
            list -> list
          end

        path when is_binary(path) ->
          [path]

        paths when is_list(paths) ->
          paths
      end

    cond do
      paths == [] or not Enum.all?(paths, &(is_binary(&1) and &1 != "")) ->
        {:error, %Error{reason: :config, message: "option :kubeconfig must be a path or a list of paths"}}

      opts[:context] != nil and not is_binary(opts[:context]) ->
        {:error, %Error{reason: :config, message: "option :context must be a string, got: #{inspect(opts[:context])}"}}

      true ->
        source = %{source: :kubeconfig, paths: Enum.map(paths, &Path.expand/1)}
        {:ok, if(opts[:context], do: Map.put(source, :context, opts[:context]), else: source)}
    end
  end

  @doc """
  Opens a connection. Starts a `Condukt.Native` linked to the caller
  unless `:native` names one to use; `close/1` stops what it started.
  """
  @spec connect(conn_opts()) :: {:ok, t()} | {:error, Error.t()}
  def connect(opts \\ []) do
    with {:ok, source} <- source(opts) do
      case source do
        %__MODULE__{} = kube -> {:ok, %{kube | owned: false}}
        source -> open(source, opts[:native])
      end
    end
  end

  defp open(source, nil) do
    case Native.start_link() do
      {:ok, pid} ->
        open(source, pid, true)

      {:error, reason} ->
        {:error, %Error{reason: :native, message: "the port program did not start: #{inspect(reason)}"}}
    end
  end

  defp open(source, native), do: open(source, native, false)

  defp open(source, native, started?) do
    case native_call(fn -> Native.kube_open(native, source) end, nil) do
      {:ok, info} ->
        {:ok,
         %__MODULE__{
           native: native,
           handle: get(info, :kube),
           server: get(info, :server),
           context: get(info, :context),
           namespace: get(info, :namespace),
           user: get(info, :user),
           auth: get(info, :auth),
           owned: started?
         }}

      {:error, %Native.Error{} = e} ->
        if started?, do: Native.stop(native)
        {:error, %{Error.from_native(e) | reason: :config, status: nil}}
    end
  end

  defp get(map, key), do: Map.get(map, key, Map.get(map, Atom.to_string(key)))

  @doc "Closes the connection (and its port program, when `connect/1` started it). Idempotent."
  @spec close(t() | nil) :: :ok
  def close(nil), do: :ok
  def close(%__MODULE__{owned: false}), do: :ok

  def close(%__MODULE__{native: native, handle: handle}) do
    try do
      Native.kube_close(native, handle)
    catch
      :exit, _ -> :ok
    end

    Native.stop(native)
  end

  ## REST ---------------------------------------------------------------------

  @doc """
  The API path of `resource` in `namespace` (and `name`, and a
  subresource), every segment escaped; `query` is appended encoded.

      iex> Condukt.Kube.path(:pods, "agents", "p 1", query: [labelSelector: "a=b"])
      "/api/v1/namespaces/agents/pods/p%201?labelSelector=a%3Db"
  """
  @spec path(resource(), String.t(), String.t() | nil, keyword()) :: String.t()
  def path(resource, namespace, name \\ nil, opts \\ []) do
    {prefix, plural} = Map.fetch!(@resources, resource)
    segs = ["namespaces", namespace, plural] ++ List.wrap(name) ++ List.wrap(opts[:subresource])
    base = prefix <> "/" <> Enum.map_join(segs, "/", &escape/1)

    case Keyword.get(opts, :query, []) |> Enum.reject(fn {_, v} -> is_nil(v) end) do
      [] -> base
      query -> base <> "?" <> URI.encode_query(query, :rfc3986)
    end
  end

  defp escape(seg), do: URI.encode(to_string(seg), &URI.char_unreserved?/1)

  @doc """
  A label selector string from a map or keyword list (`k=v,k2=v2`), or
  the string itself.
  """
  @spec selector(map() | keyword() | String.t()) :: String.t()
  def selector(s) when is_binary(s), do: s
  def selector(labels), do: labels |> Enum.sort() |> Enum.map_join(",", fn {k, v} -> "#{k}=#{v}" end)

  @doc "GET one object."
  @spec get(t(), resource(), String.t(), String.t(), keyword()) :: {:ok, map()} | {:error, Error.t()}
  def get(kube, resource, namespace, name, opts \\ []) do
    request(kube, :get, path(resource, namespace, name), nil, opts, info("get", resource, namespace, name))
  end

  @doc "POST (create) an object; the body's namespace is the path's."
  @spec create(t(), resource(), String.t(), map(), keyword()) :: {:ok, map()} | {:error, Error.t()}
  def create(kube, resource, namespace, body, opts \\ []) do
    name = get_in(body, [:metadata, :name]) || get_in(body, ["metadata", "name"])
    request(kube, :post, path(resource, namespace), body, opts, info("create", resource, namespace, name))
  end

  @doc """
  LIST objects; `:label_selector` (map, keyword or string) filters.
  Returns the items.
  """
  @spec list(t(), resource(), String.t(), keyword()) :: {:ok, [map()]} | {:error, Error.t()}
  def list(kube, resource, namespace, opts \\ []) do
    query = [labelSelector: opts[:label_selector] && selector(opts[:label_selector])]

    with {:ok, body} <-
           request(
             kube,
             :get,
             path(resource, namespace, nil, query: query),
             nil,
             opts,
             info("list", resource, namespace, nil)
           ) do
      {:ok, (is_map(body) && body["items"]) || []}
    end
  end

  @doc "A JSON merge patch (RFC 7386) of one object."
  @spec patch(t(), resource(), String.t(), String.t(), map(), keyword()) :: {:ok, map()} | {:error, Error.t()}
  def patch(kube, resource, namespace, name, patch, opts \\ []) do
    opts = Keyword.put_new(opts, :content_type, "application/merge-patch+json")
    request(kube, :patch, path(resource, namespace, name), patch, opts, info("patch", resource, namespace, name))
  end

  @doc """
  DELETE one object. Options: `:grace_period_seconds`,
  `:propagation_policy` (`"Background"`, …), `:ignore_missing` (a 404 is
  `:ok`; default `false`).
  """
  @spec delete(t(), resource(), String.t(), String.t(), keyword()) :: :ok | {:error, Error.t()}
  def delete(kube, resource, namespace, name, opts \\ []) do
    query = [gracePeriodSeconds: opts[:grace_period_seconds], propagationPolicy: opts[:propagation_policy]]

    ignore_missing? = Keyword.get(opts, :ignore_missing, false)

    case request(
           kube,
           :delete,
           path(resource, namespace, name, query: query),
           nil,
           opts,
           info("delete", resource, namespace, name)
         ) do
      {:ok, _} -> :ok
      {:error, %Error{reason: :not_found}} when ignore_missing? -> :ok
      {:error, _} = error -> error
    end
  end

  defp info(verb, resource, namespace, name) do
    %{verb: verb, resource: resource_name(resource), namespace: namespace, name: name}
  end

  defp resource_name(:networkpolicies), do: "networkpolicies.networking.k8s.io"
  defp resource_name(resource), do: Atom.to_string(resource)

  @doc """
  One raw API request. `body` (a map) is sent as JSON. Options:
  `:timeout` (ms, default 30000), `:content_type`. A 2xx answer is
  `{:ok, decoded_body}`; anything else a `Condukt.Kube.Error`.
  """
  @spec request(t(), :get | :post | :put | :patch | :delete, String.t(), map() | nil, keyword(), Error.request_info()) ::
          {:ok, term()} | {:error, Error.t()}
  def request(%__MODULE__{} = kube, method, path, body \\ nil, opts \\ [], info \\ %{}) do
    req =
      %{method: method, path: path, timeout: Keyword.get(opts, :timeout, @default_timeout)}
      |> put_if(:body, body)
      |> put_if(:content_type, opts[:content_type])

    case native_call(fn -> Native.kube_request(kube.native, kube.handle, req) end, req.timeout) do
      {:ok, %{status: status, body: resp}} when status in 200..299 -> {:ok, resp}
      {:ok, %{status: status, body: resp}} -> {:error, Error.from_status(status, resp, info)}
      {:ok, %{"status" => status, "body" => resp}} when status in 200..299 -> {:ok, resp}
      {:ok, %{"status" => status, "body" => resp}} -> {:error, Error.from_status(status, resp, info)}
      {:error, %Native.Error{} = e} -> {:error, Error.from_native(e, info)}
    end
  end

  defp put_if(map, _key, nil), do: map
  defp put_if(map, key, value), do: Map.put(map, key, value)

  # A port program that died under the call is an error, not an exit.
  defp native_call(fun, _timeout) do
    fun.()
  catch
    :exit, reason ->
      {:error, %Native.Error{code: :port_exited, message: "the port program is gone: #{inspect(reason)}"}}
  end

  ## exec and port-forward ----------------------------------------------------

  @typedoc "What `exec/6` returns (docs/port-protocol.md, `kube_exec`)."
  @type exec_result :: %{
          exit_code: integer() | nil,
          status: term(),
          stdout: binary(),
          stderr: binary(),
          stdout_dropped: non_neg_integer(),
          stderr_dropped: non_neg_integer(),
          protocol: String.t()
        }

  @doc """
  Runs `argv` (never a shell line) in `container` of `pod`. Options:
  `:stdin` (a binary, streamed), `:timeout` (ms, default 60000),
  `:max_output` (bytes kept per stream, default 8 MiB).
  """
  @spec exec(t(), String.t(), String.t(), String.t(), [String.t(), ...], keyword()) ::
          {:ok, exec_result()} | {:error, Error.t()}
  def exec(%__MODULE__{} = kube, namespace, pod, container, [_ | _] = argv, opts \\ []) do
    req =
      %{namespace: namespace, pod: pod, container: container, command: argv}
      |> put_if(:stdin, opts[:stdin])
      |> put_if(:timeout, opts[:timeout])
      |> put_if(:max_output, opts[:max_output])

    # A WebSocket upgrade is a GET: RBAC wants `get` on the subresource.
    info = %{verb: "get", resource: "pods/exec", namespace: namespace, name: pod}

    case native_call(fn -> Native.kube_exec(kube.native, kube.handle, req) end, opts[:timeout]) do
      {:ok, result} -> {:ok, atomize_exec(result)}
      {:error, %Native.Error{} = e} -> {:error, Error.from_native(e, info)}
    end
  end

  @exec_keys [:exit_code, :status, :stdout, :stderr, :stdout_dropped, :stderr_dropped, :protocol]
  defp atomize_exec(result), do: Map.new(@exec_keys, &{&1, get(result, &1)})

  @doc """
  Opens a local listener (`{:unix, path}` or `{:tcp, "127.0.0.1", port}`)
  whose every accepted connection is tunnelled to `port` of `pod`.
  Returns the listener's number and its address. A tunnelled connection
  that fails is reported to the caller as
  `{:condukt_kube_forward, native, fchan, {:error, message}}`.
  """
  @spec forward(t(), String.t(), String.t(), 1..65_535, Native.address()) ::
          {:ok, {pos_integer(), Native.address()}} | {:error, Error.t()}
  def forward(%__MODULE__{} = kube, namespace, pod, port, listen) do
    req = %{namespace: namespace, pod: pod, port: port, listen: listen}
    info = %{verb: "get", resource: "pods/portforward", namespace: namespace, name: pod}

    case native_call(fn -> Native.kube_forward(kube.native, kube.handle, req) end, nil) do
      {:ok, {fchan, %{} = value}} -> {:ok, {fchan, get(value, :address)}}
      {:error, %Native.Error{} = e} -> {:error, Error.from_native(e, info)}
    end
  end

  @doc "Closes a forward listener. Idempotent."
  @spec forward_close(t(), pos_integer()) :: :ok
  def forward_close(%__MODULE__{} = kube, fchan) do
    _ = native_call(fn -> Native.kube_forward_close(kube.native, fchan) end, nil)
    :ok
  end
end
