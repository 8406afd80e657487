defmodule Condukt.Dev.Netns.Client do
  @moduledoc false
  # Real clients run inside the testbed's pod, each reporting one comparable
  # `Result`: curl, Python urllib, python3-requests, Node https, Node fetch
  # (`run/4`), git clone (`git_clone/3`), openssl s_client (`s_client/3`),
  # a python3-websockets client (`websocket/4`) and raw TCP/UDP probes
  # (`probe/5`). The Python and Node clients are the scripts under
  # clients/ (copied into the testbed's bin directory so any uid can run
  # them); they take one JSON spec and print one JSON result.
  #
  # Trust comes from the environment only, as in a workspace: `:ca`
  # (default: the testbed's root) sets the six CA variables of
  # `Testbed.ca_env/1`; `ca: nil` leaves the system's trust store. No client
  # follows redirects.

  alias Condukt.Dev.Netns.{Cmd, Testbed, Tier}

  defmodule Result do
    @moduledoc false
    # One client's answer. `headers` are `{lower-case name, value}` in
    # order; `body` is set when the body is at most `:max_body` bytes;
    # `error_kind` is one of :tls_verify, :tls, :refused, :reset, :timeout,
    # :dns, :http, :other; `data` holds client-specific extras (git: head,
    # dir; s_client: verify, alpn, protocol, subject; websocket: received;
    # probes: peer, local). `output` is the client's stderr, for messages.
    defstruct [
      :client,
      :ok,
      :status,
      :http_version,
      :body,
      :body_sha256,
      :body_size,
      :error,
      :error_kind,
      :exit_status,
      headers: [],
      data: %{},
      output: ""
    ]

    @type t :: %__MODULE__{}

    @doc "The first value of header `name` (case-insensitive), or nil."
    def header(%__MODULE__{headers: headers}, name) do
      name = String.downcase(name)
      Enum.find_value(headers, fn {k, v} -> if k == name, do: v end)
    end
  end

  @http_clients [:curl, :python_urllib, :python_requests, :node_https, :node_fetch]
  @default_timeout 30_000
  @default_max_body 1024 * 1024

  @doc "The HTTP clients `run/4` knows."
  def http_clients, do: @http_clients

  @doc """
  Sends one HTTP request from the pod with `client` and returns a `Result`.

  Options: `:method` (default "GET"), `:headers` (`[{name, value}]`),
  `:body` (binary or `{:file, path}`), `:chunked` (send the body with
  Transfer-Encoding: chunked), `:family` (4 or 6; not for :node_fetch),
  `:http` (:h1 or :h2, curl only; curl offers h2 over TLS by default),
  `:ca`, `:uid`, `:env`, `:ns` (default :pod), `:timeout` (ms, default
  30 s), `:max_body` (default 1 MiB), `:extra_args` (curl only).
  """
  @spec run(Testbed.t(), atom(), String.t(), keyword()) :: Result.t()
  def run(tb, client, url, opts \\ []) when client in @http_clients do
    call = call_dir(tb, opts[:uid])
    body_file = body_file(call, opts[:body])

    if client == :curl do
      curl(tb, call, url, body_file, opts)
    else
      spec = %{
        url: url,
        method: opts[:method] || "GET",
        headers: Enum.map(opts[:headers] || [], &Tuple.to_list/1),
        body_file: body_file,
        chunked: opts[:chunked] || false,
        timeout: inner_timeout(opts),
        max_body: opts[:max_body] || @default_max_body,
        family: opts[:family]
      }

      {exe, script} =
        case client do
          :python_urllib -> {Tier.tool!("python3"), "py_urllib.py"}
          :python_requests -> {Tier.tool!("python3"), "py_requests.py"}
          :node_https -> {Tier.tool!("node"), "node_https.js"}
          :node_fetch -> {Tier.tool!("node"), "node_fetch.js"}
        end

      script_result(tb, client, call, [exe, Path.join(tb.bin_dir, script), Condukt.JSON.encode!(spec)], opts)
    end
  end

  @doc """
  Opens a WebSocket from the pod (python3-websockets), reads the server's
  greeting, sends `messages` and reads one answer each. `data.received`
  holds the greeting and the echoes. Options as `run/4` (`:headers`,
  `:family`, `:ca`, `:uid`, `:timeout`).
  """
  @spec websocket(Testbed.t(), String.t(), [String.t()], keyword()) :: Result.t()
  def websocket(tb, url, messages, opts \\ []) do
    spec = %{
      url: url,
      messages: messages,
      headers: Enum.map(opts[:headers] || [], &Tuple.to_list/1),
      timeout: inner_timeout(opts),
      family: opts[:family]
    }

    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "ws_client.py"), Condukt.JSON.encode!(spec)]
    script_result(tb, :websocket, call_dir(tb, opts[:uid]), argv, opts)
  end

  @doc """
  Sends `data` over `proto` (:tcp or :udp) to `host`:`port` from the pod
  and waits for one answer (the body). Options: `:family`, `:uid`,
  `:timeout` (ms; the probe's own wait is 3 s less, at least 1 s).
  """
  @spec probe(Testbed.t(), :tcp | :udp, String.t(), :inet.port_number(), String.t(), keyword()) :: Result.t()
  def probe(tb, proto, host, port, data, opts \\ []) do
    spec = %{
      proto: proto,
      host: host,
      port: port,
      data: data,
      timeout: max(div(Keyword.get(opts, :timeout, 10_000), 1000) - 3, 1),
      family: opts[:family]
    }

    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "probe.py"), Condukt.JSON.encode!(spec)]
    script_result(tb, :"#{proto}_probe", call_dir(tb, opts[:uid]), argv, Keyword.put(opts, :ca, nil))
  end

  @doc """
  `git clone` from the pod into a fresh directory. On success `data.head`
  is the clone's HEAD commit and `data.dir` the clone. Failures carry the
  HTTP status when git names one (`status`) and an `error_kind`.
  Options: `:ca`, `:uid`, `:env`, `:timeout`.
  """
  @spec git_clone(Testbed.t(), String.t(), keyword()) :: Result.t()
  def git_clone(tb, url, opts \\ []) do
    dir = Path.join(Testbed.scratch_dir(tb, opts[:uid]), "clone")
    env = [{"GIT_TERMINAL_PROMPT", "0"}, {"GIT_CONFIG_NOSYSTEM", "1"}]
    git = Tier.tool!("git")

    {out, status} =
      Testbed.exec_in(tb, Keyword.get(opts, :ns, :pod), [git, "clone", "--quiet", url, dir], exec_opts(tb, opts, env))

    if status == 0 do
      {head, 0} = System.cmd(git, ["-c", "safe.directory=*", "-C", dir, "rev-parse", "HEAD"])
      %Result{client: :git, ok: true, exit_status: 0, output: out, data: %{head: String.trim(head), dir: dir}}
    else
      http = Regex.run(~r/returned error: (\d{3})/, out)

      %Result{
        client: :git,
        ok: false,
        exit_status: status,
        output: out,
        error: String.trim(out),
        status: http && String.to_integer(Enum.at(http, 1)),
        error_kind: if(http, do: :http, else: kind_from_text(out, status))
      }
    end
  end

  @doc """
  Runs the scripted HTTP/2 client (`clients/h2_raw.py`, python3-h2) in the
  pod with `spec` (its modes are described at the top of the script),
  trusting `ca`; returns its JSON result (the last line it prints).
  """
  @spec h2_raw(Testbed.t(), Path.t(), map()) :: map()
  def h2_raw(tb, ca, spec) do
    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "h2_raw.py"), Condukt.JSON.encode!(spec)]
    {out, status} = Testbed.exec_in(tb, :pod, argv, ca: ca, timeout: 60_000)
    if status != 0, do: raise("h2_raw.py exited #{status}: #{out}")
    out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
  end

  @doc """
  Starts the idle-connection client (`clients/idle.py`) in the pod: `n`
  keep-alive connections to `url`, one GET each over `protocol`
  ("http/1.1" or "h2"), then held for 300 s, trusting `ca`. Waits (up to
  60 s) until every connection was tried and returns
  `{pid, opened, failed}`; kill the pid when done (`Cmd.kill/1`).
  """
  @spec idle(Testbed.t(), Path.t(), String.t(), pos_integer(), String.t()) ::
          {pos_integer(), non_neg_integer(), non_neg_integer()}
  def idle(tb, ca, url, n, protocol \\ "http/1.1") do
    log = Path.join(tb.logs.dir, "idle-#{System.unique_integer([:positive])}.log")
    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "idle.py"), url, "#{n}", ca, "300", protocol]
    pid = Testbed.spawn_in(tb, :pod, argv, log: log)

    ready = fn ->
      case File.read(log) do
        {:ok, text} -> Regex.run(~r/^ready (\d+) (\d+)$/m, text)
        {:error, _} -> nil
      end
    end

    case Cmd.poll(fn -> ready.() != nil end, 60_000, 100) do
      :ok ->
        [_, opened, failed] = ready.()
        {pid, String.to_integer(opened), String.to_integer(failed)}

      {:error, :timeout} ->
        Cmd.kill([pid])
        raise "idle.py did not get ready:\n" <> File.read!(log)
    end
  end

  @doc "Runs h2load (Debian's nghttp2-client) in the pod with `args`; returns its output (raises unless it exits 0)."
  @spec h2load(Testbed.t(), Path.t(), [String.t()]) :: String.t()
  def h2load(tb, ca, args) do
    h2load = System.find_executable("h2load") || raise "h2load (Debian nghttp2-client) is not installed"
    {out, status} = Testbed.exec_in(tb, :pod, [h2load | args], ca: ca, timeout: 120_000)
    if status != 0, do: raise("h2load exited #{status}: #{out}")
    out
  end

  @doc """
  A TLS handshake (and, over http/1.1, one GET) with openssl s_client from
  the pod. `data` holds `:verify` (the verify return code line),
  `:verified` (boolean), `:alpn`, `:protocol` and `:subject`; over
  http/1.1 the answer is parsed into status, headers and body.

  Options: `:port` (443), `:servername` (default `host`; `false` sends no
  SNI), `:alpn` (list, default ["http/1.1"]), `:path` ("/"), `:family`,
  `:ca`, `:uid`, `:timeout`.
  """
  @spec s_client(Testbed.t(), String.t(), keyword()) :: Result.t()
  def s_client(tb, host, opts \\ []) do
    call = call_dir(tb, opts[:uid])
    port = Keyword.get(opts, :port, 443)
    sni = Keyword.get(opts, :servername, host)
    alpn = Keyword.get(opts, :alpn, ["http/1.1"])
    connect = if String.contains?(host, ":"), do: "[#{host}]:#{port}", else: "#{host}:#{port}"
    request? = "http/1.1" in alpn and "h2" not in alpn

    stdin = Path.join(call, "request")
    authority = if sni, do: sni, else: host

    File.write!(
      stdin,
      if(request?,
        do: "GET #{Keyword.get(opts, :path, "/")} HTTP/1.1\r\nHost: #{authority}\r\nConnection: close\r\n\r\n",
        else: ""
      )
    )

    argv =
      [Tier.tool!("openssl"), "s_client", "-connect", connect, "-verify_return_error", "-alpn", Enum.join(alpn, ",")] ++
        if(sni, do: ["-servername", sni, "-verify_hostname", sni], else: ["-noservername"]) ++
        if(request?, do: ["-ign_eof"], else: []) ++
        case opts[:family] do
          4 -> ["-4"]
          6 -> ["-6"]
          _ -> []
        end

    stderr = Path.join(call, "stderr")
    exec = exec_opts(tb, opts, []) |> Keyword.merge(stdin: stdin, stderr: stderr)
    {out, status} = Testbed.exec_in(tb, Keyword.get(opts, :ns, :pod), argv, exec)
    err = File.read!(stderr)
    info = out <> "\n" <> err

    data = %{
      verify: capture(info, ~r/Verify return code: (.+)/),
      verified: String.contains?(info, "Verify return code: 0 (ok)"),
      alpn: capture(info, ~r/ALPN protocol: (.+)/),
      protocol: capture(info, ~r/Protocol\s*: (TLS\S+)/) || capture(info, ~r/New, (TLS\S+),/),
      subject: capture(info, ~r/subject=(.+)/)
    }

    http = if request?, do: parse_http_response(out), else: nil

    base = %Result{
      client: :s_client,
      exit_status: status,
      output: err,
      data: data,
      ok: status == 0 and data.verified
    }

    cond do
      base.ok and http ->
        {status_code, headers, body} = http
        max_body = opts[:max_body] || @default_max_body

        %{base | status: status_code, http_version: "1.1", headers: headers}
        |> with_body(body, max_body)

      base.ok ->
        base

      true ->
        %{base | error: String.trim(err), error_kind: kind_from_s_client(info, status)}
    end
  end

  ## curl

  defp curl(tb, call, url, body_file, opts) do
    body_out = Path.join(call, "body")
    headers_out = Path.join(call, "headers")
    stderr = Path.join(call, "stderr")
    method = opts[:method] || "GET"

    argv =
      [Tier.tool!("curl"), "-sS", "--max-time", "#{inner_timeout(opts)}"] ++
        ["-o", body_out, "-D", headers_out, "-w", "%{json}"] ++
        case opts[:http] do
          :h1 -> ["--http1.1"]
          :h2 -> ["--http2"]
          nil -> []
        end ++
        case opts[:family] do
          4 -> ["-4"]
          6 -> ["-6"]
          nil -> []
        end ++
        if(method == "HEAD", do: ["--head"], else: ["-X", method]) ++
        Enum.flat_map(opts[:headers] || [], fn {k, v} -> ["-H", "#{k}: #{v}"] end) ++
        if(body_file, do: ["--data-binary", "@" <> body_file, "-H", "Content-Type: application/octet-stream"], else: []) ++
        if(body_file && opts[:chunked], do: ["-H", "Transfer-Encoding: chunked"], else: []) ++
        (opts[:extra_args] || []) ++ [url]

    {out, status} = Testbed.exec_in(tb, Keyword.get(opts, :ns, :pod), argv, exec_opts(tb, opts, []) ++ [stderr: stderr])
    err = File.read!(stderr)
    info = decode_json(out) || %{}
    base = %Result{client: :curl, exit_status: status, output: err}

    if status == 0 do
      {code, headers} = parse_header_file(headers_out)
      version = info["http_version"]

      result = %{base | ok: true, status: code, http_version: version, headers: headers}
      max_body = opts[:max_body] || @default_max_body

      cond do
        method == "HEAD" -> with_body(result, "", max_body)
        File.exists?(body_out) -> with_file_body(result, body_out, max_body)
        true -> with_body(result, "", max_body)
      end
    else
      %{base | ok: false, error: String.trim(err), error_kind: curl_kind(status, err)}
    end
  end

  # curl's exit codes (curl(1) "EXIT CODES").
  defp curl_kind(status, err) do
    case status do
      6 -> :dns
      7 -> if String.contains?(err, "refused"), do: :refused, else: :other
      28 -> :timeout
      35 -> if err =~ ~r/reset|unexpected eof|SSL_ERROR_SYSCALL/i, do: :reset, else: :tls
      s when s in [51, 60] -> :tls_verify
      s when s in [16, 52, 55, 56, 92] -> :reset
      124 -> :timeout
      _ -> :other
    end
  end

  defp parse_header_file(path) do
    # -D writes every header block (1xx, then the final one); keep the last.
    block =
      path
      |> File.read!()
      |> String.split(~r/\r?\n\r?\n/, trim: true)
      |> List.last()

    [status_line | lines] = String.split(block, ~r/\r?\n/, trim: true)
    [_, code | _] = String.split(status_line, " ")

    headers =
      Enum.flat_map(lines, fn line ->
        case String.split(line, ":", parts: 2) do
          [k, v] -> [{String.downcase(k), String.trim(v)}]
          _ -> []
        end
      end)

    {String.to_integer(code), headers}
  end

  ## Scripts

  defp script_result(tb, client, call, argv, opts) do
    stderr = Path.join(call, "stderr")
    exec = exec_opts(tb, opts, []) ++ [stderr: stderr]
    {out, status} = Testbed.exec_in(tb, Keyword.get(opts, :ns, :pod), argv, exec)
    err = File.read!(stderr)

    case out |> String.split("\n", trim: true) |> List.last() |> decode_json() do
      %{} = r ->
        headers = Enum.map(r["headers"] || [], fn [k, v] -> {k, v} end)

        %Result{
          client: client,
          ok: r["ok"] == true,
          status: r["status"],
          http_version: r["http_version"],
          headers: headers,
          body: r["body_b64"] && Base.decode64!(r["body_b64"]),
          body_sha256: r["body_sha256"],
          body_size: r["body_size"],
          error: r["error"],
          error_kind: r["error_kind"] && String.to_atom(r["error_kind"]),
          data: atomize(r["data"] || %{}),
          exit_status: status,
          output: err
        }

      nil ->
        %Result{
          client: client,
          ok: false,
          exit_status: status,
          error: String.trim(out <> "\n" <> err),
          error_kind: if(status == 124, do: :timeout, else: :other),
          output: err
        }
    end
  end

  ## Helpers

  defp exec_opts(tb, opts, env) do
    [
      ca: Keyword.get(opts, :ca, tb.ca_cert),
      uid: opts[:uid],
      gid: opts[:gid],
      env: env ++ Enum.to_list(opts[:env] || []),
      timeout: timeout(opts)
    ]
  end

  defp timeout(opts), do: Keyword.get(opts, :timeout, @default_timeout)

  # The client's own deadline (whole seconds), a second inside ours, so a
  # slow answer is reported by the client rather than killed.
  defp inner_timeout(opts), do: max(div(timeout(opts), 1000) - 1, 1)

  defp call_dir(tb, uid) do
    dir = Testbed.scratch_dir(tb, uid)
    if uid, do: File.chmod!(dir, 0o777)
    dir
  end

  defp body_file(_call, nil), do: nil
  defp body_file(_call, {:file, path}), do: path

  defp body_file(call, data) when is_binary(data) do
    path = Path.join(call, "request-body")
    File.write!(path, data)
    File.chmod!(path, 0o644)
    path
  end

  defp with_body(result, body, max_body) do
    %{
      result
      | body: if(byte_size(body) <= max_body, do: body),
        body_size: byte_size(body),
        body_sha256: :crypto.hash(:sha256, body) |> Base.encode16(case: :lower)
    }
  end

  defp with_file_body(result, path, max_body) do
    %{size: size} = File.stat!(path)

    sha =
      File.stream!(path, [], 1024 * 1024)
      |> Enum.reduce(:crypto.hash_init(:sha256), &:crypto.hash_update(&2, &1))
      |> :crypto.hash_final()
      |> Base.encode16(case: :lower)

    %{result | body: if(size <= max_body, do: File.read!(path)), body_size: size, body_sha256: sha}
  end

  # An HTTP/1.1 answer as s_client printed it: status line, headers, then a
  # body framed by Content-Length or chunked.
  defp parse_http_response(out) do
    with [_, rest] <- Regex.run(~r/(HTTP\/1\.[01] \d{3}.*)/s, out),
         [head, body] <- String.split(rest, ~r/\r\n\r\n/, parts: 2) do
      [status_line | lines] = String.split(head, "\r\n")
      [_, code | _] = String.split(status_line, " ")

      headers =
        Enum.flat_map(lines, fn line ->
          case String.split(line, ":", parts: 2) do
            [k, v] -> [{String.downcase(k), String.trim(v)}]
            _ -> []
          end
        end)

      body =
        case List.keyfind(headers, "content-length", 0) do
          {_, n} -> binary_part(body, 0, min(String.to_integer(n), byte_size(body)))
          nil -> if List.keyfind(headers, "transfer-encoding", 0), do: dechunk(body, []), else: body
        end

      {String.to_integer(code), headers, body}
    else
      _ -> nil
    end
  end

  defp dechunk(data, acc) do
    with [size_line, rest] <- String.split(data, "\r\n", parts: 2),
         {n, _} when n > 0 <- size_line |> String.split(";") |> hd() |> Integer.parse(16),
         <<chunk::binary-size(n), "\r\n", more::binary>> <- rest do
      dechunk(more, [acc | chunk])
    else
      _ -> IO.iodata_to_binary(acc)
    end
  end

  defp kind_from_s_client(info, status) do
    cond do
      status == 124 -> :timeout
      info =~ ~r/verify error|Verify return code: [1-9]|certificate verify failed/i -> :tls_verify
      true -> kind_from_text(info, status)
    end
  end

  defp kind_from_text(text, status) do
    cond do
      status == 124 ->
        :timeout

      text =~
          ~r/SSL certificate problem|certificate verif|verify failed|no alternative certificate subject|does not match target host name/i ->
        :tls_verify

      text =~ ~r/Could not resolve host|Name or service not known/i ->
        :dns

      text =~ ~r/refused/i ->
        :refused

      text =~ ~r/timed out|timeout/i ->
        :timeout

      text =~ ~r/reset|Empty reply|unexpected eof|SSL_ERROR_SYSCALL|errno=104/i ->
        :reset

      text =~ ~r/alert|handshake failure|SSL/i ->
        :tls

      true ->
        :other
    end
  end

  defp capture(text, re) do
    case Regex.run(re, text) do
      [_, v] -> String.trim(v)
      _ -> nil
    end
  end

  defp decode_json(nil), do: nil

  defp decode_json(text) do
    Condukt.JSON.decode!(text)
  rescue
    _ -> nil
  catch
    _, _ -> nil
  end

  defp atomize(map), do: Map.new(map, fn {k, v} -> {String.to_atom(k), v} end)
end
