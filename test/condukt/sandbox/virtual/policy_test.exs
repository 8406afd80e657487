defmodule Condukt.Sandbox.Virtual.PolicyTest do
  # The network policy inside the interpreter, against a real HTTPS server
  # on loopback (a leaf of a fresh test root for the *.test names, served
  # with :ssl): allowed, denied, decided, decider timeout, redirects and
  # private addresses, with the sidecar's telemetry events.
  use ExUnit.Case, async: true

  alias Condukt.Dev.Netns.Pki
  alias Condukt.Sandbox
  alias Condukt.Sandbox.{NetworkPolicy, Virtual}
  alias Condukt.Sandbox.NetworkPolicy.Telemetry

  @moduletag :tmp_dir
  @moduletag :virtual
  # The untrusted-root case makes :ssl log the client's alert.
  @moduletag :capture_log
  @names ~w(allowed.test denied.test decide.test slow.test private.test)

  setup %{tmp_dir: dir} do
    {:ok, _} = Application.ensure_all_started(:ssl)
    pki = Pki.generate!(Path.join(dir, "pki"), @names, ["127.0.0.1"], label: "virtual")
    {cert, key} = pki.server
    test_pid = self()

    {:ok, listen} =
      :ssl.listen(0,
        certfile: String.to_charlist(cert),
        keyfile: String.to_charlist(key),
        active: false,
        reuseaddr: true,
        ip: {127, 0, 0, 1}
      )

    {:ok, {_, port}} = :ssl.sockname(listen)
    server = spawn_link(fn -> accept(listen, port, test_pid) end)

    on_exit(fn ->
      Process.exit(server, :kill)
      :ssl.close(listen)
    end)

    handler = "virtual-policy-#{System.unique_integer([:positive])}"
    :telemetry.attach_many(handler, Telemetry.events(), &__MODULE__.forward/4, test_pid)
    on_exit(fn -> :telemetry.detach(handler) end)

    %{ca: pki.ca_cert, port: port}
  end

  # The request and decider events the sidecar also emits; the decide
  # spans ([..., :decide, :start | :stop | :exception]) are counted apart.
  @doc false
  def forward(event, measurements, metadata, pid) do
    case event do
      [_, _, _, :decide, phase] -> send(pid, {:span, phase, metadata})
      _ -> send(pid, {:event, List.last(event), measurements, metadata})
    end
  end

  defp sandbox(ctx, rules, extra \\ []) do
    session = "s-#{System.unique_integer([:positive])}"

    {:ok, sb} =
      Sandbox.new(
        {Virtual,
         [
           id: session,
           network_policy: [rules: rules],
           ca_files: [ctx.ca],
           resolve: Map.new(@names, &{&1, "127.0.0.1"}),
           allow_private_networks: Keyword.get(extra, :allow_private_networks, true)
         ]}
      )

    # From a task, the sandbox's policy process ends with the task.
    if Keyword.get(extra, :on_exit, true), do: on_exit(fn -> Sandbox.shutdown(sb) end)
    {sb, session}
  end

  defp url(ctx, host, path \\ "/"), do: "https://#{host}:#{ctx.port}#{path}"

  defp events(session, acc \\ []) do
    receive do
      {:event, name, m, %{session_id: ^session} = meta} -> events(session, [{name, m, meta} | acc])
    after
      300 -> Enum.reverse(acc)
    end
  end

  test "an allowed host answers 200 and emits the sidecar's events", ctx do
    {sb, session} = sandbox(ctx, allow: ["allowed.test"])

    assert {:ok, %{exit_code: 0, output: "hello from allowed.test GET /\n"}} =
             Sandbox.exec(sb, "curl -s #{url(ctx, "allowed.test")}")

    assert_received {:connected, "allowed.test"}

    assert [
             {:request_opened, %{bytes_in: 0}, %{request: opened}},
             {:request_allowed, _, %{matched_rule: %{index: 0, kind: :allow}, request: allowed}},
             {:request_closed, %{bytes_in: bytes_in}, %{request: closed, reason: nil}}
           ] = events(session)

    assert opened.host == "allowed.test" and opened.method == "GET" and opened.scheme == :https
    assert opened.port == ctx.port and opened.path == "/"
    assert allowed.id == opened.id and closed.id == opened.id
    assert closed.status == 200
    assert bytes_in == byte_size("hello from allowed.test GET /\n")
  end

  test "a denied host is refused before any connection, with the rule and reason", ctx do
    {sb, session} = sandbox(ctx, deny: ["denied.test"], allow: ["allowed.test"])
    assert {:ok, %{exit_code: 7, output: output}} = Sandbox.exec(sb, "curl -s #{url(ctx, "denied.test")}")
    assert output =~ "refused the request to denied.test"
    assert output =~ "refused by: rule 0 (deny)"
    assert output =~ "reason: denied_by_rule"
    refute_received {:connected, _}

    assert [
             {:request_opened, _, _},
             {:request_denied, _, %{reason: :denied_by_rule, matched_rule: %{index: 0, kind: :deny}}}
           ] = events(session)
  end

  test "the policy default denies an unlisted host", ctx do
    {sb, session} = sandbox(ctx, allow: ["allowed.test"])
    # wget reports a refusal as a network failure (exit 4), as GNU wget does.
    assert {:ok, %{exit_code: 4, output: output}} = Sandbox.exec(sb, "wget -q -O - #{url(ctx, "decide.test")}")
    assert output =~ "reason: default_deny"
    refute_received {:connected, _}

    assert [{:request_opened, _, _}, {:request_denied, _, %{reason: :default_deny, matched_rule: nil}}] =
             events(session)
  end

  test "a decide rule's function decider allows one host and denies another, in its own words", ctx do
    parent = self()

    decider = fn ctx_, req ->
      send(parent, {:asked, ctx_.session_id, req.host, req.path})
      if req.host == "decide.test", do: :allow, else: {:deny, "not on my list"}
    end

    {sb, session} = sandbox(ctx, decide: decider)

    assert {:ok, %{exit_code: 0, output: "hello from decide.test GET /x\n"}} =
             Sandbox.exec(sb, "curl -s #{url(ctx, "decide.test", "/x")}")

    assert_received {:asked, ^session, "decide.test", "/x"}
    # The decider's call is a telemetry span, as with the sidecar.
    assert_received {:span, :start, %{session_id: ^session, rule_index: 0}}
    assert_received {:span, :stop, %{session_id: ^session}}

    assert [_, {:request_allowed, _, %{matched_rule: %{index: 0, kind: :decide}}}, {:request_closed, _, _}] =
             events(session)

    assert {:ok, %{exit_code: 7, output: output}} = Sandbox.exec(sb, "curl -s #{url(ctx, "denied.test")}")
    assert output =~ "refused by: the decider of rule 0"
    assert output =~ "reason: not on my list"
    assert [_, {:request_denied, _, %{reason: "not on my list", matched_rule: %{kind: :decide}}}] = events(session)
    refute_received {:connected, "denied.test"}
  end

  test "a decider that does not answer in time denies with decider_timeout", ctx do
    decider = fn _ctx, _req -> Process.sleep(5_000) && :allow end
    {sb, session} = sandbox(ctx, decide: [call: decider, timeout: 200])
    assert {:ok, %{exit_code: 7, output: output}} = Sandbox.exec(sb, "curl -s #{url(ctx, "slow.test")}")
    assert output =~ "reason: decider_timeout"
    refute_received {:connected, _}
    events = events(session)

    assert {:decider_failure, %{count: 1}, %{reason: :decider_timeout}} in Enum.map(events, fn {n, m, meta} ->
             {n, m, Map.take(meta, [:reason])}
           end)

    assert {:request_denied, _, %{reason: :decider_timeout}} = List.last(events)
  end

  test "each redirect hop is evaluated: a redirect to a denied host is refused", ctx do
    {sb, session} = sandbox(ctx, allow: ["allowed.test"])

    assert {:ok, %{exit_code: 7, output: output}} =
             Sandbox.exec(sb, "curl -s -L #{url(ctx, "allowed.test", "/redirect/denied.test")}")

    assert output =~ "refused the request to denied.test"
    assert_received {:connected, "allowed.test"}
    refute_received {:connected, "denied.test"}

    assert [
             {:request_opened, _, _},
             {:request_allowed, _, _},
             {:request_closed, _, %{request: %{status: 302}}},
             {:request_opened, _, %{request: %{host: "denied.test"}}},
             {:request_denied, _, %{reason: :default_deny}}
           ] = events(session)
  end

  test "an allowed host on a private address is refused unless the policy names the address", ctx do
    {sb, session} = sandbox(ctx, [allow: ["private.test"]], allow_private_networks: false)
    assert {:ok, %{exit_code: 7, output: output}} = Sandbox.exec(sb, "curl -s #{url(ctx, "private.test")}")
    assert output =~ "upstream_private_address: 127.0.0.1"
    refute_received {:connected, _}

    assert [_, {:request_allowed, _, _}, {:request_denied, _, %{reason: "upstream_private_address: 127.0.0.1"}}] =
             events(session)

    {sb, _session} = sandbox(ctx, [allow: ["127.0.0.1"]], allow_private_networks: false)

    assert {:ok, %{exit_code: 0, output: "hello from 127.0.0.1 GET /\n"}} =
             Sandbox.exec(sb, "curl -s https://127.0.0.1:#{ctx.port}/")
  end

  test "the testbed root is required: without :ca_files the server is not trusted", ctx do
    session = "s-#{System.unique_integer([:positive])}"

    {:ok, sb} =
      Sandbox.new(
        {Virtual,
         id: session,
         network_policy: [rules: [allow: ["allowed.test"]]],
         resolve: %{"allowed.test" => "127.0.0.1"},
         allow_private_networks: true}
      )

    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "curl -s #{url(ctx, "allowed.test")}")
    assert code != 0
    assert [_, {:request_allowed, _, _}, {:request_failed, _, %{reason: "upstream_tls: " <> _}}] = events(session)
  end

  test "an allowed request that runs out of time ends with request_failed", ctx do
    {sb, session} = sandbox(ctx, allow: ["allowed.test"])
    assert {:ok, %{exit_code: 28}} = Sandbox.exec(sb, "curl -s -m 1 #{url(ctx, "allowed.test", "/slow")}")

    assert [_, {:request_allowed, _, _}, {:request_failed, _, %{reason: "upstream_timeout" <> _}}] = events(session)
  end

  test "credentials never leave the sandbox in events or decider requests", ctx do
    parent = self()
    decider = fn _ctx, req -> send(parent, {:headers, req.headers}) && :allow end
    {sb, session} = sandbox(ctx, decide: decider)

    assert {:ok, %{exit_code: 0}} =
             Sandbox.exec(sb, "curl -s -H 'Authorization: Bearer s3cr3t' -H 'X-Trace: t1' #{url(ctx, "decide.test")}")

    assert_received {:headers, headers}
    assert {"authorization", "[redacted]"} in headers
    assert {"x-trace", "t1"} in headers

    for {_name, _m, %{request: request}} <- events(session) do
      refute inspect(request) =~ "s3cr3t"
      assert {"authorization", "[redacted]"} in request.headers
    end
  end

  test "the decide cache: an answer covers its scope, as with the sidecar", ctx do
    parent = self()

    decider = fn _ctx, req ->
      send(parent, {:asked, req.host, req.path})
      if req.host == "decide.test", do: :allow, else: {:allow, scope: :host}
    end

    {sb, session} = sandbox(ctx, decide: decider)
    one = url(ctx, "decide.test", "/1")

    assert {:ok, %{exit_code: 0}} =
             Sandbox.exec(sb, "curl -s #{one}; curl -s #{one}; curl -s #{url(ctx, "decide.test", "/2")}")

    # A plain :allow covers the same request only.
    assert_received {:asked, "decide.test", "/1"}
    assert_received {:asked, "decide.test", "/2"}
    refute_received {:asked, _, _}

    assert {:ok, %{exit_code: 0}} =
             Sandbox.exec(sb, "curl -s #{url(ctx, "allowed.test", "/a")}; curl -s #{url(ctx, "allowed.test", "/b")}")

    # {:allow, scope: :host} covers the whole host.
    assert_received {:asked, "allowed.test", "/a"}
    refute_received {:asked, _, _}
    assert 5 == Enum.count(events(session), &match?({:request_closed, _, _}, &1))
  end

  test "no other way out: /dev/tcp, a proxy option and the http builtin all meet the policy", ctx do
    {sb, session} = sandbox(ctx, allow: ["allowed.test"])

    script = """
    (exec 3<>/dev/tcp/127.0.0.1/#{ctx.port}) 2>/dev/null && echo TCP-OPEN
    curl -s -x http://127.0.0.1:#{ctx.port} #{url(ctx, "denied.test")}
    http GET #{url(ctx, "denied.test")}
    true
    """

    assert {:ok, %{output: output}} = Sandbox.exec(sb, script)
    refute output =~ "TCP-OPEN"
    refute output =~ "hello from"
    refute_received {:connected, _}
    assert Enum.all?(events(session), fn {name, _, _} -> name in [:request_opened, :request_denied] end)
  end

  test "many sandboxes with policies at once, each gets its own answers", ctx do
    results =
      1..12
      |> Task.async_stream(
        fn i ->
          {sb, _session} = sandbox(ctx, [allow: ["allowed.test"]], on_exit: false)
          host = if rem(i, 2) == 0, do: "allowed.test", else: "denied.test"
          {:ok, %{exit_code: code}} = Sandbox.exec(sb, "curl -s #{url(ctx, host, "/#{i}")}")
          {host, code}
        end,
        max_concurrency: 12,
        timeout: 60_000
      )
      |> Enum.map(fn {:ok, r} -> r end)

    for {host, code} <- results, do: assert(code == if(host == "allowed.test", do: 0, else: 7))
  end

  test "the policy is the same module the sidecar compiles" do
    assert {:ok, %NetworkPolicy{}} = NetworkPolicy.new(rules: [allow: ["allowed.test"]])
  end

  ## A tiny HTTPS server --------------------------------------------------------

  defp accept(listen, port, test_pid) do
    case :ssl.transport_accept(listen) do
      {:ok, socket} ->
        spawn(fn -> serve(socket, port, test_pid) end)
        accept(listen, port, test_pid)

      {:error, _} ->
        :ok
    end
  end

  defp serve(socket, port, test_pid) do
    with {:ok, socket} <- :ssl.handshake(socket, 5_000),
         {:ok, info} <- :ssl.connection_information(socket, [:sni_hostname]),
         {:ok, head} <- recv_head(socket, "") do
      # No SNI: the client dialled the IP literal.
      host = if is_list(info[:sni_hostname]), do: to_string(info[:sni_hostname]), else: "127.0.0.1"
      send(test_pid, {:connected, host})
      [method, path | _] = head |> String.split("\r\n") |> hd() |> String.split(" ")

      response =
        case path do
          "/slow" ->
            Process.sleep(3_000)
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"

          "/redirect/" <> to ->
            "HTTP/1.1 302 Found\r\nlocation: https://#{to}:#{port}/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"

          _ ->
            body = "hello from #{host} #{method} #{path}\n"

            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: #{byte_size(body)}\r\nconnection: close\r\n\r\n" <>
              body
        end

      :ssl.send(socket, response)
      :ssl.close(socket)
    end
  end

  defp recv_head(socket, acc) do
    if String.contains?(acc, "\r\n\r\n") do
      {:ok, acc}
    else
      case :ssl.recv(socket, 0, 5_000) do
        {:ok, data} -> recv_head(socket, acc <> IO.iodata_to_binary(data))
        error -> error
      end
    end
  end
end
