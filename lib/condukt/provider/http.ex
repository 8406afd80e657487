defmodule Condukt.Provider.HTTP do
  @moduledoc """
  JSON over HTTP(S) for the providers, with OTP's `:httpc`.

  HTTPS verifies the server's certificate chain against the operating
  system's CA store (`:public_key.cacerts_get/0`) and its host name; there
  is no switch to turn that off. Each attempt is bounded by `:timeout`
  (connect included). A 429 or 5xx answer, or a connection that failed
  before any answer, is retried up to `:retries` times with exponential
  backoff (0.5 s, 1 s, 2 s, … plus jitter, at most 20 s, or the server's
  `retry-after` when it gives one, capped the same way).

  `post_stream/6` reads a server-sent-events answer as it arrives
  (`:httpc`'s `stream: :self`), for providers that stream. It is retried
  like `post_json/3` only while nothing has been received; `:timeout` is
  then the longest silence between two chunks.

  What `:httpc` costs compared with Finch or Req: no HTTP/2 (one request
  per connection at a time, a small pool per host), streaming only as
  whole chunks delivered to the calling process, and TLS settings that
  are ours to keep right rather than a library's.
  """

  require Logger

  alias Condukt.Error

  @max_backoff 20_000

  @doc """
  POSTs `body` (encoded as JSON) to `url` and decodes the JSON answer.
  Options: `:headers` (a list of `{name, value}` strings), `:timeout`
  (ms per attempt), `:retries`.
  """
  @spec post_json(String.t(), term(), keyword()) :: {:ok, term()} | {:error, Error.t()}
  def post_json(url, body, opts) do
    headers = Enum.map(Keyword.get(opts, :headers, []), fn {k, v} -> {to_charlist(k), to_charlist(v)} end)
    request = {to_charlist(url), headers, ~c"application/json", Condukt.JSON.encode!(body)}
    attempt(url, request, Keyword.get(opts, :timeout, 120_000), Keyword.get(opts, :retries, 3), 0)
  end

  @doc """
  POSTs one provider turn: `body` to the request's `:base_url` (or
  `default_base`) followed by `path`, with the request's `:timeout` and
  `:retries`.
  """
  @spec post_turn(Condukt.Provider.request(), String.t(), String.t(), [{String.t(), String.t()}], map()) ::
          {:ok, term()} | {:error, Error.t()}
  def post_turn(req, default_base, path, headers, body) do
    base = String.trim_trailing(req.base_url || default_base, "/")
    post_json(base <> path, body, headers: headers, timeout: req.timeout, retries: req.retries)
  end

  @doc """
  POSTs `body` like `post_turn/5`, asking for a stream, and folds every
  server-sent event of the answer into `acc` with
  `fun.({event_name, data}, acc)` (`event_name` is nil when the event has
  none). Returns `{:ok, acc}` when the stream ends.
  """
  @spec post_stream(Condukt.Provider.request(), String.t(), String.t(), [{String.t(), String.t()}], map(), {acc, fun}) ::
          {:ok, acc} | {:error, Error.t()}
        when acc: term(), fun: ({String.t() | nil, String.t()}, acc -> acc)
  def post_stream(req, default_base, path, headers, body, {acc, fun}) do
    url = String.trim_trailing(req.base_url || default_base, "/") <> path

    headers = [
      {~c"accept", ~c"text/event-stream"} | Enum.map(headers, fn {k, v} -> {to_charlist(k), to_charlist(v)} end)
    ]

    request = {to_charlist(url), headers, ~c"application/json", Condukt.JSON.encode!(body)}
    stream_attempt(url, request, req.timeout, req.retries, 0, {acc, fun})
  end

  defp stream_attempt(url, request, timeout, retries, n, folder) do
    http_opts = [timeout: :infinity, connect_timeout: min(timeout, 15_000), autoredirect: false] ++ ssl(url)
    {:ok, ref} = :httpc.request(:post, request, http_opts, sync: false, stream: :self, body_format: :binary)

    case receive_stream(ref, timeout, "", folder, false) do
      {:retry, after_ms, error} ->
        retry_with(retries, n, after_ms, error, url, fn ->
          stream_attempt(url, request, timeout, retries, n + 1, folder)
        end)

      other ->
        other
    end
  end

  defp receive_stream(ref, timeout, buffer, {acc, fun} = folder, started?) do
    receive do
      {:http, {^ref, :stream_start, _headers}} ->
        receive_stream(ref, timeout, buffer, folder, true)

      {:http, {^ref, :stream, chunk}} ->
        {events, rest} = sse_events(buffer <> chunk)
        receive_stream(ref, timeout, rest, {Enum.reduce(events, acc, fun), fun}, true)

      {:http, {^ref, :stream_end, _headers}} ->
        {events, _} = sse_events(buffer <> "\n\n")
        {:ok, Enum.reduce(events, acc, fun)}

      {:http, {^ref, {{_, status, _}, headers, body}}} when status == 429 or status >= 500 ->
        {:retry, retry_after(headers), %Error{reason: :http_status, detail: %{status: status, body: body}}}

      {:http, {^ref, {{_, status, _}, _headers, body}}} ->
        {:error, %Error{reason: :http_status, detail: %{status: status, body: body}}}

      {:http, {^ref, {:error, reason}}} when not started? ->
        {:retry, nil, %Error{reason: :http, detail: reason}}

      {:http, {^ref, {:error, reason}}} ->
        {:error, %Error{reason: :http, detail: reason}}
    after
      timeout ->
        :httpc.cancel_request(ref)
        {:error, %Error{reason: :http, detail: "no data for #{timeout} ms"}}
    end
  end

  @doc false
  # Splits server-sent events off the front of `buffer` (RFC-less but
  # per the WHATWG EventSource format: blank-line separated blocks of
  # `field: value` lines). Returns the complete events and the rest.
  @spec sse_events(binary()) :: {[{String.t() | nil, String.t()}], binary()}
  def sse_events(buffer) do
    blocks = buffer |> String.replace("\r\n", "\n") |> String.split("\n\n")
    {complete, [rest]} = Enum.split(blocks, -1)

    events =
      for block <- complete, block != "" do
        lines = String.split(block, "\n")
        name = Enum.find_value(lines, fn l -> field(l, "event") end)
        data = lines |> Enum.map(&field(&1, "data")) |> Enum.reject(&is_nil/1) |> Enum.join("\n")
        {name, data}
      end

    {Enum.reject(events, fn {_, data} -> data == "" end), rest}
  end

  defp field(line, name) do
    case String.split(line, ":", parts: 2) do
      [^name, value] -> String.replace_prefix(value, " ", "")
      _ -> nil
    end
  end

  defp attempt(url, request, timeout, retries, n) do
    http_opts = [timeout: timeout, connect_timeout: min(timeout, 15_000), autoredirect: false] ++ ssl(url)

    case :httpc.request(:post, request, http_opts, body_format: :binary) do
      {:ok, {{_, status, _}, _headers, body}} when status in 200..299 ->
        decode(body)

      {:ok, {{_, status, _}, headers, body}} when status == 429 or status >= 500 ->
        retry(url, request, timeout, retries, n, retry_after(headers), %Error{
          reason: :http_status,
          detail: %{status: status, body: body}
        })

      {:ok, {{_, status, _}, _headers, body}} ->
        {:error, %Error{reason: :http_status, detail: %{status: status, body: body}}}

      {:error, :timeout} ->
        {:error, %Error{reason: :http, detail: "no answer within #{timeout} ms"}}

      {:error, reason} ->
        retry(url, request, timeout, retries, n, nil, %Error{reason: :http, detail: reason})
    end
  end

  defp retry(url, request, timeout, retries, n, after_ms, error),
    do: retry_with(retries, n, after_ms, error, url, fn -> attempt(url, request, timeout, retries, n + 1) end)

  # :httpc reuses kept-alive connections, and a server may have closed one
  # just before we used it; that first failure says nothing about the
  # server, so it is tried again at once, whatever the retry budget.
  defp retry_with(_retries, 0, _after, %Error{reason: :http, detail: :socket_closed_remotely}, _url, again),
    do: again.()

  defp retry_with(retries, n, _after, error, _url, _again) when n >= retries, do: {:error, error}

  defp retry_with(_retries, n, after_ms, error, url, again) do
    delay = min(after_ms || backoff(n), @max_backoff)
    Logger.debug("condukt: #{url}: #{Exception.message(error)}; retrying in #{delay} ms")
    Process.sleep(delay)
    again.()
  end

  @doc false
  # 500 ms, 1 s, 2 s, ... with up to 25% jitter, so that many sessions
  # hitting the same rate limit do not retry in lockstep.
  @spec backoff(non_neg_integer()) :: pos_integer()
  def backoff(n) do
    base = min(500 * Integer.pow(2, n), @max_backoff)
    base + :rand.uniform(div(base, 4) + 1) - 1
  end

  defp retry_after(headers) do
    with {_, value} <- List.keyfind(headers, ~c"retry-after", 0),
         {seconds, ""} <- Integer.parse(to_string(value)) do
      seconds * 1000
    else
      _ -> nil
    end
  end

  defp decode(body) do
    {:ok, Condukt.JSON.decode!(body)}
  rescue
    _ -> {:error, %Error{reason: :bad_response, detail: "not JSON: #{String.slice(body, 0, 200)}"}}
  end

  defp ssl("https://" <> rest) do
    host = rest |> String.split(["/", ":"], parts: 2) |> hd() |> to_charlist()

    [
      ssl: [
        verify: :verify_peer,
        cacerts: :public_key.cacerts_get(),
        server_name_indication: host,
        depth: 10,
        customize_hostname_check: [match_fun: :public_key.pkix_verify_hostname_match_fun(:https)]
      ]
    ]
  end

  defp ssl(_plain_http), do: []
end
