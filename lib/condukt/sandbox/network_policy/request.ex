defmodule Condukt.Sandbox.NetworkPolicy.Request do
  @moduledoc """
  One HTTP request the workspace made (or is about to make), as the sidecar
  saw it.

  Deciders receive it with the request line and headers filled in; the
  telemetry events carry it with whatever the sidecar had learnt by then
  (response status and headers, timestamps). Fields the sidecar could not
  derive are `nil`. Header names are lower case; the values of
  `authorization`, `proxy-authorization`, `cookie`, `set-cookie` and any
  configured header are replaced by `"[redacted]"` before they leave the
  sidecar.

  The sidecar's DNS resolver reports the names it refuses (and those it
  defers to a decider) as requests too: `scheme: :dns`, `host` the name
  asked, `port` 53, the HTTP fields `nil` (docs/dns.md).
  """

  @type headers :: [{String.t(), String.t()}]

  @type t :: %__MODULE__{
          id: String.t() | nil,
          scheme: :http | :https | :dns | nil,
          method: String.t() | nil,
          host: String.t() | nil,
          port: :inet.port_number() | nil,
          path: String.t() | nil,
          query: String.t() | nil,
          http_version: String.t() | nil,
          sni: String.t() | nil,
          headers: headers(),
          status: non_neg_integer() | nil,
          response_headers: headers(),
          body_preview: binary() | nil,
          opened_at: DateTime.t() | nil,
          responded_at: DateTime.t() | nil,
          closed_at: DateTime.t() | nil
        }

  defstruct id: nil,
            scheme: nil,
            method: nil,
            host: nil,
            port: nil,
            path: nil,
            query: nil,
            http_version: nil,
            sni: nil,
            headers: [],
            status: nil,
            response_headers: [],
            body_preview: nil,
            opened_at: nil,
            responded_at: nil,
            closed_at: nil

  @doc """
  Builds a request from the sidecar's request fields: the members of an
  `event` frame or the `request` object of a `decision_request`
  (docs/control-channel.md). Keys are strings, as the JSON had them.

  RFC 3339 timestamps become `DateTime`s, `"https"`/`"http"` become atoms,
  `[name, value]` header pairs become tuples, and an optional
  `body_preview` (base64) is decoded. A field that is missing, `null` or
  malformed is `nil` (or `[]` for header lists): the sidecar's telemetry
  must never be lost to one odd field.
  """
  @spec from_sidecar(map()) :: t()
  def from_sidecar(fields) when is_map(fields) do
    %__MODULE__{
      id: string(fields["id"]),
      scheme: scheme(fields["scheme"]),
      method: string(fields["method"]),
      host: string(fields["host"]),
      port: port_number(fields["port"]),
      path: string(fields["path"]),
      query: string(fields["query"]),
      http_version: string(fields["http_version"]),
      sni: string(fields["sni"]),
      headers: headers(fields["headers"]),
      status: status(fields["status"]),
      response_headers: headers(fields["response_headers"]),
      body_preview: base64(fields["body_preview"]),
      opened_at: timestamp(fields["opened_at"]),
      responded_at: timestamp(fields["responded_at"]),
      closed_at: timestamp(fields["closed_at"])
    }
  end

  @doc """
  Parses one of the sidecar's RFC 3339 UTC timestamps
  (`"2026-11-22T05:11:57.123456Z"`); anything else is `nil`.
  """
  @spec timestamp(term()) :: DateTime.t() | nil
  def timestamp(value) when is_binary(value) do
    case DateTime.from_iso8601(value) do
      {:ok, at, _offset} -> at
      {:error, _} -> nil
    end
  end

  def timestamp(_), do: nil

  defp string(value) when is_binary(value), do: value
  defp string(_), do: nil

  defp scheme("https"), do: :https
  defp scheme("http"), do: :http
  defp scheme("dns"), do: :dns
  defp scheme(_), do: nil

  defp port_number(p) when is_integer(p) and p >= 0 and p <= 65_535, do: p
  defp port_number(_), do: nil

  defp status(s) when is_integer(s) and s >= 0, do: s
  defp status(_), do: nil

  defp headers(list) when is_list(list) do
    for [name, value] <- list, is_binary(name) and is_binary(value), do: {name, value}
  end

  defp headers(_), do: []

  defp base64(value) when is_binary(value) do
    case Base.decode64(value) do
      {:ok, bytes} -> bytes
      :error -> nil
    end
  end

  defp base64(_), do: nil
end
