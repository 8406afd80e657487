defmodule Condukt.Kube.Error do
  @moduledoc """
  A Kubernetes API call that did not succeed.

  Built from the API server's `Status` object (or from the port's error
  when no HTTP answer came), so that the message names what to fix:

      forbidden: cannot create pods/portforward in namespace "agents" (grant "create" on "pods/portforward")
      not found: pods "condukt-job-42-1a2b3c4d5e" in namespace "agents"

  | `:reason` | HTTP status / cause |
  |-----------|---------------------|
  | `:unauthorized` | 401: the credentials were refused |
  | `:forbidden` | 403: RBAC denies `:verb` on `:resource` in `:namespace` |
  | `:not_found` | 404 |
  | `:already_exists` | 409 with `reason: AlreadyExists` |
  | `:conflict` | 409 otherwise (a stale `resourceVersion`) |
  | `:gone` | 410 |
  | `:invalid` | 422: the object was refused (`:message` says which field) |
  | `:bad_request` | 400 |
  | `:too_many_requests` | 429 |
  | `:server_error` | 5xx |
  | `:http_error` | any other non-2xx status |
  | `:timeout` | no answer in time (the port's `timedout`) |
  | `:unavailable` | the server could not be reached (`unavail`) |
  | `:tls` | the TLS handshake or the certificate check failed |
  | `:config` | the connection could not be resolved (kubeconfig, in-cluster files) |
  | `:native` | another failure of the `condukt-egress port` program (`:detail` is the `Condukt.Native.Error`) |

  `:verb`, `:resource` (with its subresource, `"pods/exec"`), `:namespace`
  and `:name` say what was asked; `:message` is the server's own sentence.
  """

  alias Condukt.Native

  @type reason ::
          :unauthorized
          | :forbidden
          | :not_found
          | :already_exists
          | :conflict
          | :gone
          | :invalid
          | :bad_request
          | :too_many_requests
          | :server_error
          | :http_error
          | :timeout
          | :unavailable
          | :tls
          | :config
          | :native

  @type t :: %__MODULE__{
          reason: reason(),
          status: 100..599 | nil,
          message: String.t() | nil,
          verb: String.t() | nil,
          resource: String.t() | nil,
          namespace: String.t() | nil,
          name: String.t() | nil,
          detail: term()
        }

  defexception [:reason, :status, :message, :verb, :resource, :namespace, :name, :detail]

  @typedoc "What was asked: the verb, resource (with subresource), namespace and name."
  @type request_info :: %{
          optional(:verb) => String.t() | nil,
          optional(:resource) => String.t() | nil,
          optional(:namespace) => String.t() | nil,
          optional(:name) => String.t() | nil
        }

  @doc """
  The error for an HTTP answer with a non-2xx `status` and `body` (a
  decoded `Status` map, or any other body). `info` is what the caller
  asked, used where the `Status` does not say.
  """
  @spec from_status(100..599, term(), request_info()) :: t()
  def from_status(status, body, info \\ %{}) do
    status_map = if is_map(body), do: body, else: %{}
    message = status_map["message"] || body_text(body)
    details = if is_map(status_map["details"]), do: status_map["details"], else: %{}

    base = %__MODULE__{
      reason: reason(status, status_map["reason"]),
      status: status,
      message: message,
      verb: info[:verb],
      resource: info[:resource] || resource_of(details),
      namespace: info[:namespace],
      name: info[:name] || details["name"],
      detail: if(is_map(body), do: body, else: nil)
    }

    refine(base, message)
  end

  @doc """
  The error for a failure of the port program (`Condukt.Native.Error`).
  An exec or port-forward upgrade refused with 403 or 404 arrives here as
  `perm` / `noent` with the server's message.
  """
  @spec from_native(Native.Error.t(), request_info()) :: t()
  def from_native(%Native.Error{code: code, message: message} = error, info \\ %{}) do
    {reason, status} =
      case code do
        :perm -> {:forbidden, 403}
        :noent -> {:not_found, 404}
        :timedout -> {:timeout, nil}
        :unavail -> {:unavailable, nil}
        :tls -> {:tls, nil}
        code when code in [:inval, :io, :notsup] and info == %{} -> {:config, nil}
        _ -> {:native, nil}
      end

    base = %__MODULE__{
      reason: reason,
      status: status,
      message: message,
      verb: info[:verb],
      resource: info[:resource],
      namespace: info[:namespace],
      name: info[:name],
      detail: error
    }

    if reason == :forbidden, do: refine(base, message), else: base
  end

  defp reason(401, _), do: :unauthorized
  defp reason(403, _), do: :forbidden
  defp reason(404, _), do: :not_found
  defp reason(409, "AlreadyExists"), do: :already_exists
  defp reason(409, _), do: :conflict
  defp reason(410, _), do: :gone
  defp reason(422, _), do: :invalid
  defp reason(400, _), do: :bad_request
  defp reason(429, _), do: :too_many_requests
  defp reason(s, _) when s in 500..599, do: :server_error
  defp reason(_, _), do: :http_error

  defp resource_of(%{"kind" => kind} = details) when is_binary(kind) and kind != "" do
    # details.kind is the resource for NotFound/AlreadyExists/Forbidden.
    group = details["group"]
    if is_binary(group) and group != "", do: "#{kind}.#{group}", else: kind
  end

  defp resource_of(_), do: nil

  # The API server's authorization message is the most precise source:
  #   User "u" cannot create resource "pods/portforward" in API group "" in the namespace "agents"
  @forbidden ~r/cannot (\S+) resource "([^"]+)"(?: in API group "([^"]*)")?(?: in the namespace "([^"]+)")?/
  defp refine(%__MODULE__{reason: :forbidden} = e, message) when is_binary(message) do
    case Regex.run(@forbidden, message) do
      [_ | groups] ->
        [verb, resource | rest] = groups ++ List.duplicate("", 4 - length(groups))
        [group, namespace] = Enum.take(rest, 2)
        resource = if group in ["", nil], do: resource, else: "#{resource}.#{group}"

        %{
          e
          | verb: verb,
            resource: resource,
            namespace: if(namespace in ["", nil], do: e.namespace, else: namespace)
        }

      nil ->
        e
    end
  end

  defp refine(e, _message), do: e

  defp body_text(body) when is_binary(body) and byte_size(body) <= 500, do: String.trim(body)
  defp body_text(body) when is_binary(body), do: binary_part(body, 0, 500) <> "…"
  defp body_text(_), do: nil

  @impl true
  def message(%__MODULE__{reason: :forbidden} = e) do
    what = e.resource || "this resource"
    where = if e.namespace, do: " in namespace #{inspect(e.namespace)}", else: ""

    if e.verb do
      "forbidden: cannot #{e.verb} #{what}#{where} (grant #{inspect(e.verb)} on #{inspect(what)})" <>
        server_says(e)
    else
      "forbidden: #{what}#{where}" <> server_says(e)
    end
  end

  def message(%__MODULE__{reason: :not_found} = e) do
    what = Enum.join(Enum.reject([e.resource, e.name && inspect(e.name)], &is_nil/1), " ")
    what = if what == "", do: "the object", else: what
    where = if e.namespace, do: " in namespace #{inspect(e.namespace)}", else: ""
    "not found: #{what}#{where}"
  end

  def message(%__MODULE__{reason: reason} = e) do
    status = if e.status, do: " (HTTP #{e.status})", else: ""
    what = if e.verb && e.resource, do: " on #{e.verb} #{e.resource}#{name_part(e)}", else: ""
    "#{label(reason)}#{status}#{what}: #{e.message || inspect(e.detail)}"
  end

  defp name_part(%{name: nil}), do: ""
  defp name_part(%{name: name}), do: " #{inspect(name)}"

  defp server_says(%{message: nil}), do: ""
  defp server_says(%{message: m}), do: "; the server said: #{m}"

  defp label(:unauthorized), do: "unauthorized (the credentials were refused)"
  defp label(:already_exists), do: "already exists"
  defp label(:conflict), do: "conflict"
  defp label(:gone), do: "gone"
  defp label(:invalid), do: "invalid object"
  defp label(:bad_request), do: "bad request"
  defp label(:too_many_requests), do: "too many requests"
  defp label(:server_error), do: "API server error"
  defp label(:http_error), do: "unexpected HTTP status"
  defp label(:timeout), do: "timed out"
  defp label(:unavailable), do: "API server unreachable"
  defp label(:tls), do: "TLS failure"
  defp label(:config), do: "cannot resolve the Kubernetes connection"
  defp label(:native), do: "Kubernetes client failure"
  defp label(other), do: to_string(other)
end
