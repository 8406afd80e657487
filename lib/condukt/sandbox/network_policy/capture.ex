defmodule Condukt.Sandbox.NetworkPolicy.Capture do
  @moduledoc """
  What the sidecar captures of a request beyond its line and headers, and
  what is redacted before anything leaves it or reaches a handler.

  Three policy keys (`Condukt.Sandbox.NetworkPolicy`):

    * `:body_preview` - how many bytes of each request body the events
      carry (`Request.body_preview`), 0 to 65536; default 0, no body at all.
      Each backend passes it to the sidecar (`--body-preview`).
    * `:redact_headers` - header names (any case) whose values the sidecar
      replaces by `"[redacted]"` in every event and decider request, on top
      of `authorization`, `proxy-authorization`, `cookie` and `set-cookie`,
      which it always redacts (`--redact-header`).
    * `:redact_body` - patterns (`Regex`es, or strings matched literally)
      whose matches in a body preview are replaced by `"[redacted]"` on the
      BEAM, before any telemetry handler sees the preview. A few credential
      shapes are always redacted (`default_body_patterns/0`): private keys,
      `password=`/`"token": "..."`-style fields, bearer tokens, and the key
      formats of AWS, GitHub and the `sk-` family.

  ## Limits

    * The preview is the first bytes of the body *as the workspace sent
      it*: compressed or binary bodies are previewed as bytes, and the cap
      may cut a value (a pattern then sees only its start; the built-in
      ones redact a cut value to the end of the preview).
    * A decider's `Request` carries the preview of the body that arrived
      within a second of the request head (the sidecar waits that long,
      forwarding nothing); a client that sends its body later, or only
      after a `100 Continue`, is asked about with what came (often
      `nil`). The events of the request's end (`:request_closed`,
      `:request_failed`) carry the preview of the body as forwarded.
      A decision that depends on the body should not be cached.
    * Redaction is pattern matching: a credential in a shape no pattern
      knows stays. Keep `:body_preview` at 0 (the default) where bodies
      may hold secrets you cannot describe.
    * When `:body_preview` is 0 the bridge drops any preview that arrives
      anyway: none ever reaches a handler.
    * Header redaction happens in the sidecar; body patterns run on the
      BEAM. The Local backend's audit log of the sidecar's events (a file
      only root can read) therefore holds the unredacted preview.
  """

  @max_preview 65_536
  @redacted "[redacted]"

  # Built-in credential shapes. The value part stops at a quote, a space,
  # '&', ',' or '}', or runs to the end of a cut preview.
  @field ~r/((?:"|\b)(?:password|passwd|secret|client_secret|token|access_token|refresh_token|id_token|api_key|apikey|api-key|private_key)"?\s*[:=]\s*)("[^"]*"?|[^"\s&,}]+)/i
  @defaults [
    ~r/-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.|\n)*?(?:-----END [A-Z ]*PRIVATE KEY-----|\z)/,
    @field,
    ~r/\bBearer\s+[A-Za-z0-9._~+\/-]+=*/i,
    ~r/\bAKIA[0-9A-Z]{16}\b/,
    ~r/\bgh[pousr]_[A-Za-z0-9]{20,}/,
    ~r/\b(?:sk|rk)-[A-Za-z0-9_-]{16,}/
  ]

  @typedoc "The capture keys of a policy."
  @type t :: %{body_preview: 0..65_536, redact_headers: [String.t()], redact_body: [Regex.t() | String.t()]}

  @doc "The largest `:body_preview` the sidecar accepts."
  @spec max_preview() :: 65_536
  def max_preview, do: @max_preview

  @doc "The credential patterns always redacted from body previews."
  @spec default_body_patterns() :: [Regex.t()]
  def default_body_patterns, do: @defaults

  @doc """
  Validates the three keys (missing ones take their default). Returns
  `{:ok, map}` or `{:error, {key, value, expected}}`.
  """
  @spec validate(map()) :: {:ok, t()} | {:error, {atom(), term(), String.t()}}
  def validate(fields) do
    preview = Map.get(fields, :body_preview, 0)
    headers = Map.get(fields, :redact_headers, [])
    body = Map.get(fields, :redact_body, [])

    cond do
      not (is_integer(preview) and preview in 0..@max_preview) ->
        {:error, {:body_preview, preview, "an integer from 0 to #{@max_preview} (bytes)"}}

      not (is_list(headers) and Enum.all?(headers, &header_name?/1)) ->
        {:error, {:redact_headers, headers, "a list of header names (RFC 9110 tokens)"}}

      not (is_list(body) and Enum.all?(body, &pattern?/1)) ->
        {:error, {:redact_body, body, "a list of Regex patterns or non-empty strings"}}

      true ->
        {:ok, %{body_preview: preview, redact_headers: Enum.map(headers, &String.downcase/1), redact_body: body}}
    end
  end

  defp header_name?(h), do: is_binary(h) and h =~ ~r/\A[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}\z/
  defp pattern?(%Regex{}), do: true
  defp pattern?(s), do: is_binary(s) and s != ""

  @doc "The `condukt-egress proxy` flags of a policy's capture keys."
  @spec sidecar_args(%{optional(:body_preview) => non_neg_integer(), optional(:redact_headers) => [String.t()]}) ::
          [String.t()]
  def sidecar_args(policy) do
    preview = Map.get(policy, :body_preview, 0)
    headers = Map.get(policy, :redact_headers, [])

    if(preview > 0, do: ["--body-preview", Integer.to_string(preview)], else: []) ++
      Enum.flat_map(headers, &["--redact-header", &1])
  end

  @doc """
  The capture keys of a policy (a struct, keyword list or map that
  `Condukt.Sandbox.NetworkPolicy.new/1` accepts).
  """
  @spec of(term()) :: t()
  def of(policy) do
    policy
    |> Condukt.Sandbox.NetworkPolicy.new!()
    |> Map.take([:body_preview, :redact_headers, :redact_body])
  end

  @doc """
  A sidecar frame's request fields (string keys) with their
  `body_preview` (base64) redacted by `redact/2`, or removed when the
  policy captures no body or it is not base64.
  """
  @spec filter_fields(map(), map()) :: map()
  def filter_fields(%{"body_preview" => b64} = fields, capture) do
    with true <- is_binary(b64),
         {:ok, preview} <- Base.decode64(b64),
         redacted when is_binary(redacted) <- redact(preview, capture) do
      Map.put(fields, "body_preview", Base.encode64(redacted))
    else
      _ -> Map.delete(fields, "body_preview")
    end
  end

  def filter_fields(fields, _capture), do: fields

  @doc """
  The preview a handler may see: `nil` when the policy captures no body,
  else `preview` with every match of the built-in patterns and of
  `:redact_body` replaced by `"[redacted]"`.
  """
  @spec redact(binary() | nil, map()) :: binary() | nil
  def redact(nil, _policy), do: nil

  def redact(preview, policy) when is_binary(preview) do
    if Map.get(policy, :body_preview, 0) == 0 do
      nil
    else
      # A field keeps its name, its separator and its quotes.
      preview = Regex.replace(@field, preview, fn _whole, name, value -> name <> redact_value(value) end)
      Enum.reduce((@defaults -- [@field]) ++ Map.get(policy, :redact_body, []), preview, &replace/2)
    end
  end

  defp redact_value("\"" <> rest) do
    closed = if String.ends_with?(rest, "\""), do: "\"", else: ""
    "\"" <> @redacted <> closed
  end

  defp redact_value(_value), do: @redacted

  defp replace(%Regex{} = re, text), do: Regex.replace(re, text, @redacted)
  defp replace(literal, text) when is_binary(literal), do: String.replace(text, literal, @redacted)
end
