defmodule Condukt.Sandbox.Virtual.Policy do
  @moduledoc false
  # The network policy of one Virtual sandbox, on the BEAM.
  #
  # The NIF's HTTP transport asks this process about every request a script
  # makes, before any connection opens (native/condukt_virtual/src/net.rs has
  # the message grammar), and reports how each allowed request ended. This
  # process evaluates the policy with NetworkPolicy.evaluate/2 (the
  # sidecar's host matching), runs decide rules through a DecideRuntime it
  # owns (timeouts, cache, decider failures exactly as with the sidecar),
  # answers with Native.http_reply/3, and emits the sidecar's five lifecycle
  # events through NetworkPolicy.Telemetry.emit_frame/2, from frames shaped
  # like the sidecar's, so handlers cannot tell the two apart.
  #
  # It monitors the sandbox's owner and stops with it. When it is gone the
  # transport gets no answer and refuses every request (fail closed).

  use GenServer

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.{DecideRuntime, Request, Telemetry}
  alias Condukt.Sandbox.Virtual.Native

  # Header values that never leave the sandbox in events or decider
  # requests (the sidecar's default list).
  @redacted ~w(authorization proxy-authorization cookie set-cookie)

  @doc false
  @spec start(keyword()) :: {:ok, pid(), reference()} | {:error, term()}
  def start(opts) do
    with {:ok, pid} <- GenServer.start(__MODULE__, Keyword.put(opts, :owner, self())) do
      {:ok, pid, GenServer.call(pid, :link)}
    end
  end

  @doc false
  @spec stop(pid()) :: :ok
  def stop(pid) do
    GenServer.stop(pid, :normal, 5_000)
  catch
    :exit, _ -> :ok
  end

  @doc """
  How long the transport waits for an answer: past the longest decide
  timeout, so a decider timing out is reported as such, not as silence.
  """
  @spec answer_timeout(NetworkPolicy.t()) :: pos_integer()
  def answer_timeout(%NetworkPolicy{rules: rules}) do
    longest = for({:decide, opts} <- rules, do: opts[:timeout]) |> Enum.max(fn -> 0 end)
    longest + 5_000
  end

  @impl true
  def init(opts) do
    owner = Keyword.fetch!(opts, :owner)
    policy = Keyword.fetch!(opts, :policy)
    session_id = Keyword.get(opts, :session_id, "")

    state = %{
      policy: policy,
      session_id: session_id,
      link: Native.policy_link(self()),
      rt: DecideRuntime.new(policy: policy, session_id: session_id, messages: opts[:messages]),
      requests: %{},
      seq: 0,
      owner_ref: Process.monitor(owner)
    }

    {:ok, state}
  end

  @impl true
  def handle_call(:link, _from, state), do: {:reply, state.link, state}

  @impl true
  def handle_info({:condukt_virtual_http, id, method, url, headers}, state) do
    request = request(id, method, url, headers)
    state = state |> put_in([:requests, id], request) |> emit("request_opened", request, %{})

    case NetworkPolicy.evaluate(state.policy, request) do
      {{:decide, index}, _matched} ->
        {replies, rt} = DecideRuntime.request(state.rt, Integer.to_string(id), index, request)
        {:noreply, answer_decisions(%{state | rt: rt}, replies)}

      {decision, matched} ->
        {:noreply, answer(state, id, decision, matched)}
    end
  end

  def handle_info({:condukt_virtual_http_done, id, outcome}, state) do
    case Map.pop(state.requests, id) do
      {nil, _} -> {:noreply, state}
      {request, requests} -> {:noreply, finish(%{state | requests: requests}, request, outcome)}
    end
  end

  def handle_info({:DOWN, ref, :process, _pid, _reason}, %{owner_ref: ref} = state),
    do: {:stop, :normal, state}

  def handle_info(message, state) do
    case DecideRuntime.handle_info(state.rt, message) do
      {:ok, replies, rt} -> {:noreply, answer_decisions(%{state | rt: rt}, replies)}
      :unknown -> {:noreply, state}
    end
  end

  @impl true
  def terminate(_reason, state) do
    DecideRuntime.cancel_all(state.rt)
    :ok
  end

  ## Answers ------------------------------------------------------------------

  defp answer_decisions(state, replies) do
    Enum.reduce(replies, state, fn {:decision, id, answer, _cache}, state ->
      id = String.to_integer(id)

      case state.requests do
        %{^id => request} ->
          {:decide, index} = decide_index(state.policy, request)
          decision = if answer == :allow, do: :allow, else: answer
          answer(state, id, decision, %{index: index, kind: :decide})

        _ ->
          state
      end
    end)
  end

  defp decide_index(policy, request) do
    {{:decide, index}, _} = NetworkPolicy.evaluate(policy, request)
    {:decide, index}
  end

  defp answer(state, id, :allow, matched) do
    request = state.requests[id]
    state = emit(state, "request_allowed", request, %{"matched_rule" => wire_rule(matched)})

    # Nobody waits any more (the command ended, or gave up waiting): no
    # outcome will come, so the request is forgotten here.
    if Native.http_reply(state.link, id, {:allow, names_address?(matched, request)}),
      do: state,
      else: %{state | requests: Map.delete(state.requests, id)}
  end

  defp answer(state, id, {:deny, reason}, matched) do
    {request, requests} = Map.pop(state.requests, id)
    reason = reason_text(reason)

    state =
      emit(%{state | requests: requests}, "request_denied", request, %{
        "reason" => reason,
        "matched_rule" => wire_rule(matched)
      })

    Native.http_reply(state.link, id, {:deny, deny_text(request, matched, reason)})
    state
  end

  # An allow rule that names the IP literal itself may reach a private
  # address; nothing else may (the sidecar's rule).
  defp names_address?(%{kind: :allow}, %Request{host: host}) when is_binary(host),
    do: match?({:ok, _}, :inet.parse_address(String.to_charlist(String.trim(host, "[") |> String.trim("]"))))

  defp names_address?(_matched, _request), do: false

  defp finish(state, request, {:closed, status, headers, bytes_in, bytes_out}) do
    request = %{request | status: status, response_headers: redact(headers), responded_at: now()}
    emit(state, "request_closed", request, %{"bytes_in" => bytes_in, "bytes_out" => bytes_out})
  end

  defp finish(state, request, {:failed, reason, bytes_in, bytes_out}),
    do: emit(state, "request_failed", request, %{"reason" => reason, "bytes_in" => bytes_in, "bytes_out" => bytes_out})

  defp finish(state, request, {:refused, reason}),
    do: emit(state, "request_denied", request, %{"reason" => reason})

  # The words a refused script reads (curl prints them after "access denied: ").
  defp deny_text(request, matched, reason) do
    "the network policy of this sandbox refused the request to #{request.host || "(no host)"} " <>
      "(refused by: #{who(matched, reason)}; reason: #{reason})"
  end

  defp who(nil, "invalid_host"), do: "the policy (the URL names no valid host)"
  defp who(nil, _reason), do: "the policy default (deny)"
  defp who(%{index: i, kind: :decide}, _reason), do: "the decider of rule #{i}"
  defp who(%{index: i, kind: kind}, _reason), do: "rule #{i} (#{kind})"

  defp reason_text(""), do: "(no reason given)"
  defp reason_text(reason) when is_atom(reason), do: Atom.to_string(reason)
  defp reason_text(reason) when is_binary(reason), do: reason

  ## Requests and frames --------------------------------------------------------

  defp request(id, method, url, headers) do
    uri = URI.parse(url)

    %Request{
      id: Integer.to_string(id),
      scheme: scheme(uri.scheme),
      method: method,
      host: uri.host,
      port: uri.port,
      path: if(uri.path in [nil, ""], do: "/", else: uri.path),
      query: uri.query,
      http_version: "HTTP/1.1",
      sni: if(uri.scheme == "https", do: uri.host),
      headers: redact(Enum.map(headers, fn {name, value} -> {String.downcase(name), value} end)),
      opened_at: now()
    }
  end

  defp scheme("https"), do: :https
  defp scheme("http"), do: :http
  defp scheme(_), do: nil

  defp redact(headers) do
    Enum.map(headers, fn {name, value} ->
      name = String.downcase(name)
      if name in @redacted, do: {name, "[redacted]"}, else: {name, value}
    end)
  end

  defp now, do: DateTime.utc_now()

  # One event, through the same path as the sidecar's frames.
  defp emit(state, event, %Request{} = request, extra) do
    seq = state.seq + 1

    frame =
      Map.merge(
        %{
          "event" => event,
          "id" => request.id,
          "scheme" => request.scheme && Atom.to_string(request.scheme),
          "method" => request.method,
          "host" => request.host,
          "port" => request.port,
          "path" => request.path,
          "query" => request.query,
          "http_version" => request.http_version,
          "sni" => request.sni,
          "headers" => Enum.map(request.headers, &Tuple.to_list/1),
          "status" => request.status,
          "response_headers" => Enum.map(request.response_headers, &Tuple.to_list/1),
          "opened_at" => stamp(request.opened_at),
          "responded_at" => stamp(request.responded_at),
          "closed_at" => if(event in ["request_closed", "request_failed"], do: stamp(now())),
          "bytes_in" => 0,
          "bytes_out" => 0,
          "at" => stamp(now()),
          "seq" => seq
        },
        extra
      )

    Telemetry.emit_frame(frame, state.session_id)
    %{state | seq: seq}
  end

  defp stamp(nil), do: nil
  defp stamp(%DateTime{} = at), do: DateTime.to_iso8601(at)

  defp wire_rule(nil), do: nil
  defp wire_rule(%{index: index, kind: kind}), do: %{"index" => index, "kind" => Atom.to_string(kind)}
end
