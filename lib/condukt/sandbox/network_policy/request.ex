defmodule Condukt.Sandbox.NetworkPolicy.Request do
  @moduledoc """
  One HTTP request the workspace made (or is about to make), as the sidecar
  saw it.

  Deciders receive it with the request line and headers filled in; the
  telemetry events carry it with whatever the sidecar had learnt by then
  (response status and headers, timestamps). Fields the sidecar could not
  derive are `nil`. Header names are lower case; the values of
  `authorization`, `proxy-authorization`, `cookie`, `set-cookie` and any
  configured header are replaced by `"[REDACTED]"` before they leave the
  sidecar.
  """

  @type headers :: [{String.t(), String.t()}]

  @type t :: %__MODULE__{
          id: String.t() | nil,
          scheme: :http | :https | nil,
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
end
