defmodule Condukt.Native do
  @moduledoc """
  **Internal.** Part of the library's plumbing, documented for those who
  work on Condukt; its API may change in any release.

  The owner of one `condukt-egress port` process: the BEAM's native helper
  for tokens, session CAs, policy files, sidecar control channels and the
  Kubernetes API client (`kube_*`).

  The two sides exchange Erlang terms, one per `{:packet, 4}` frame; the
  grammar is normative in `docs/port-protocol.md` (and heads
  `c_src/port/port.c`). In short:

      BEAM → port   {call, Id, Op} | {ack, Chan, N} | {post, Chan, Tag, Frame}
      port → BEAM   {reply, Id, ok | {ok, Value} | {error, {Code, Message}}}
                    {control, Chan, {frame, Frame} | {closed, Reason}}
                    {control, Chan, {send_failed, Tag, {Code, Message}}}
                    {error, Kind, Message}

  Every call carries an integer id; the server keeps `%{id => from}` and
  answers with `GenServer.reply/2` when the matching `reply` arrives, so it
  never blocks on the port and many calls can be outstanding.

  ## Control channels

  `control_attach/4` connects the port to a sidecar's control listener.
  The channel's frames then arrive at the channel's owner (the caller, or
  the `:owner` option) as

      {:condukt_control, native :: pid(), chan :: pos_integer(), {:frame, map()}}
      {:condukt_control, native, chan, {:closed, reason :: String.t()}}

  Frames go the other way with `control_send/3` (a call: `:ok` once the
  frame is queued on the socket) or `control_post/4` (no reply: the caller
  writes to the port itself and hears back only when the frame could not
  be queued, as `{:condukt_control, native, chan, {:send_failed, tag,
  %Condukt.Native.Error{}}}`).

  Frames are credited: the port sends at most `:window` (default 256)
  frames the owner has not acknowledged with `ack/3`. An owner that dies
  has its channels detached.

  ## Lifetime

  The port program exits when its stdin closes, so it never outlives this
  process. When the program exits (or is killed) the server answers every
  pending call with `{:error, %Condukt.Native.Error{code: :port_exited}}`,
  tells every channel owner `{:closed, "the port program exited ..."}`, and
  stops with `{:port_exited, status}` so that whoever supervises it (for a
  session, its `ControlBridge`) restarts what needs restarting.
  `stop/1` closes the port and waits (at most 2 s, then SIGKILL) for the
  OS process to be gone.
  """

  use GenServer
  require Logger

  alias Condukt.Native.Error

  @typedoc "A control channel number, given out by the port."
  @type chan :: pos_integer()

  @typedoc "A sidecar control address: a Unix socket or loopback TCP."
  @type address :: {:unix, Path.t()} | {:tcp, String.t(), :inet.port_number()}

  @type server :: GenServer.server()
  @type error :: {:error, Error.t()}

  # Margin over an operation's own timeout for the GenServer.call, so that
  # the port's {error, {timedout, _}} wins over the caller's exit.
  @call_margin 5_000
  @default_call_timeout 15_000
  @exit_wait 2_000

  ## Public API ---------------------------------------------------------------

  @doc """
  Starts the port program and links it to the caller.

  Options: `:bin` (the executable; default the `condukt-egress` in
  `:condukt`'s priv directory), `:name`.
  """
  @spec start_link(keyword()) :: GenServer.on_start()
  def start_link(opts \\ []) do
    {gen_opts, opts} = Keyword.split(opts, [:name])
    GenServer.start_link(__MODULE__, opts, gen_opts)
  end

  @doc "Closes the port program and waits for it to exit. Idempotent."
  @spec stop(server()) :: :ok
  def stop(server) do
    GenServer.stop(server, :normal, @exit_wait + @call_margin)
  catch
    :exit, _ -> :ok
  end

  @doc "The OS process id of the port program."
  @spec os_pid(server()) :: non_neg_integer()
  def os_pid(server), do: GenServer.call(server, :os_pid)

  @doc "The program's version: `%{version: binary(), protocol: 1}`."
  @spec version(server()) :: {:ok, %{version: String.t(), protocol: pos_integer()}} | error()
  def version(server) do
    with {:ok, value} <- call(server, {:version}) do
      {:ok, atomize(value, [:version, :protocol])}
    end
  end

  @doc "A fresh random token of `bytes` (16..128) bytes, as lowercase hex."
  @spec token_new(server(), 16..128) :: {:ok, String.t()} | error()
  def token_new(server, bytes \\ 32), do: call(server, {:token_new, bytes})

  @doc """
  A fresh ECDSA P-256 session CA. Options: `:common_name` (required),
  `:days` (1..3650, default 3), `:cert_path` and `:key_path` (also write
  the files; the key `0600`, never over an existing file).
  """
  @spec ca_new(server(), keyword() | map()) :: {:ok, %{cert_pem: String.t(), key_pem: String.t()}} | error()
  def ca_new(server, opts) do
    opts = Map.new(opts)
    ca_opts = Map.merge(%{days: 3}, Map.take(opts, [:common_name, :days, :cert_path, :key_path]))

    with {:ok, value} <- call(server, {:ca_new, ca_opts}) do
      {:ok, atomize(value, [:cert_pem, :key_pem])}
    end
  end

  @doc """
  Validates `json` with the sidecar's own policy loader and writes it to
  `path` (atomically, `0600`).
  """
  @spec policy_write(server(), Path.t(), iodata()) :: :ok | error()
  def policy_write(server, path, json) do
    call(server, {:policy_write, IO.iodata_to_binary(Path.expand(path)), IO.iodata_to_binary(json)})
  end

  @doc """
  Attaches a control channel to the sidecar at `address` for the session
  `:session_id` (required) and returns its number and the sidecar's
  `welcome` frame. `token` (lowercase hex) is never sent: the port and the
  sidecar each prove that they hold it (docs/control-channel.md). A
  listener that cannot prove it, or that gates another session, is
  refused with `{:error, %Condukt.Native.Error{code: :perm}}`.

  Options: `:session_id` (the session the sidecar must gate), `:timeout`
  (ms to connect and complete the handshake, default 5000), `:window`
  (frame credit, default 256), `:owner` (the process that gets the
  channel's frames; default the caller).
  """
  @spec control_attach(server(), address(), String.t(), keyword()) :: {:ok, {chan(), map()}} | error()
  def control_attach(server, address, token, opts \\ []) do
    {owner, opts} = Keyword.pop(opts, :owner, self())
    attach = Map.new(Keyword.take(opts, [:timeout, :window, :session_id]))
    timeout = Map.get(attach, :timeout, 5_000) + @call_margin
    call(server, {:control_attach, encode_address(address), token, attach}, timeout, owner)
  end

  @doc "Queues `frame` (a map; docs/port-protocol.md maps it to JSON) on channel `chan`."
  @spec control_send(server(), chan(), map()) :: :ok | error()
  def control_send(server, chan, frame) when is_map(frame), do: call(server, {:control_send, chan, frame})

  @doc """
  The port of the program (for `control_post/4`).
  """
  @spec port(server()) :: port()
  def port(server), do: GenServer.call(server, :port)

  @doc """
  Queues `frame` on channel `chan` like `control_send/3`, without a
  round trip: the calling process writes the request to `port` (from
  `port/1`) itself, and the port program answers only when the frame
  cannot be queued (every error `control_send/3` would return), with
  `{:condukt_control, native, chan, {:send_failed, tag, %Condukt.Native.Error{}}}`
  to the calling process. So a decision reaches the socket without a
  process hop on the way and without a reply waking the caller after it.

  Returns `:ok`, or `{:error, %Condukt.Native.Error{code: :port_exited}}`
  when the port is closed (the server's `{:closed, _}` or exit follows).
  """
  @spec control_post(port(), chan(), map(), term()) :: :ok | error()
  def control_post(port, chan, frame, tag) when is_port(port) and is_map(frame) do
    true = Port.command(port, :erlang.term_to_binary({:post, chan, {self(), tag}, frame}))
    :ok
  rescue
    ArgumentError ->
      {:error, %Error{code: :port_exited, message: "the port program is closed", op: :control_post}}
  end

  @doc "Closes channel `chan`; no `{:closed, _}` message follows."
  @spec control_detach(server(), chan()) :: :ok | error()
  def control_detach(server, chan), do: call(server, {:control_detach, chan})

  @doc "Gives channel `chan` credit for `n` more frames."
  @spec ack(server(), chan(), pos_integer()) :: :ok
  def ack(server, chan, n) when is_integer(n) and n > 0, do: GenServer.cast(server, {:ack, chan, n})

  ## Kubernetes ---------------------------------------------------------------

  @typedoc "A Kubernetes client handle, given out by the port."
  @type kube :: pos_integer()

  @typedoc "A port-forward listener, given out by the port."
  @type fchan :: pos_integer()

  @doc """
  Opens a Kubernetes client handle (docs/port-protocol.md, "Kubernetes").
  Nothing is sent to the API server; the kubeconfig (or the in-cluster
  files) is read and checked now.

  `opts` is one of

      %{source: :kubeconfig, paths: [path, ...], context: binary}   # context optional
      %{source: :in_cluster, dir: path, host: binary, port: 1..65535} # all optional
      %{source: :explicit, server: "https://host:port", ca_pem: binary, insecure: boolean,
        token: binary, token_file: path, client_cert_pem: binary, client_key_pem: binary}

  and the value `%{kube: kube, server: binary, context: binary | nil,
  namespace: binary | nil, user: binary | nil, auth: :none | :token |
  :token_file | :client_cert | :exec}`.
  """
  @spec kube_open(server(), map()) :: {:ok, map()} | error()
  def kube_open(server, opts) when is_map(opts) do
    opts = Map.new(opts, fn {k, v} -> {k, kube_encode_opt(k, v)} end)
    call(server, {:kube_open, opts})
  end

  @doc "Closes a handle and its forward listeners; `:ok` also for one already closed."
  @spec kube_close(server(), kube()) :: :ok | error()
  def kube_close(server, kube), do: call(server, {:kube_close, kube})

  @doc """
  One API request: `req` is `%{method: :get | :post | :put | :patch | :delete,
  path: "/api/v1/...", body: map() | list() | binary(), content_type: binary(),
  timeout: ms}` (path escaped by the caller; `body` a map or list is sent as
  JSON, a binary as it is; PATCH defaults to `application/merge-patch+json`;
  timeout default 30000). The value is `%{status: 100..599, body: term |
  binary}` for every HTTP status: a JSON body decoded (binary keys), any
  other body as a binary. Errors are only for no HTTP answer: `:unavail`,
  `:tls`, `:timedout`, `:toobig`, `:proto`, `:closed`.
  """
  @spec kube_request(server(), kube(), map()) :: {:ok, %{status: integer(), body: term()}} | error()
  def kube_request(server, kube, req) when is_map(req) do
    req = Map.update(req, :path, nil, &IO.iodata_to_binary/1)
    call(server, {:kube_request, kube, req}, Map.get(req, :timeout, 30_000) + @call_margin)
  end

  @doc """
  Runs a command in a container over the exec WebSocket: `exec` is
  `%{namespace:, pod:, container:, command: [binary, ...], stdin: binary,
  timeout: ms, max_output: bytes}` (stdin, timeout (default 60000) and
  max_output (default 8 MiB per stream) optional). The value is
  `%{exit_code: integer | nil, status: map | nil, stdout:, stderr:,
  stdout_dropped:, stderr_dropped:, protocol:}`.
  """
  @spec kube_exec(server(), kube(), map()) :: {:ok, map()} | error()
  def kube_exec(server, kube, exec) when is_map(exec) do
    call(server, {:kube_exec, kube, exec}, Map.get(exec, :timeout, 60_000) + @call_margin)
  end

  @doc """
  Opens a port-forward listener: `fwd` is `%{namespace:, pod:, port:
  1..65535, listen: {:unix, path} | {:tcp, host, port}}` (loopback only;
  port 0 picks one). Each accepted connection is tunnelled to the pod's
  port. The value is `{fchan, %{address: {:unix, path} | {:tcp, host,
  port}}}`. A tunnel that fails is reported to the caller as

      {:condukt_kube_forward, native :: pid(), fchan, {:error, message}}

  and the listener stays. A caller that dies has its listeners closed.
  """
  @spec kube_forward(server(), kube(), map()) :: {:ok, {fchan(), map()}} | error()
  def kube_forward(server, kube, fwd) when is_map(fwd) do
    fwd = Map.update(fwd, :listen, nil, &encode_address/1)
    call(server, {:kube_forward, kube, fwd}, @default_call_timeout, self())
  end

  @doc "Closes a forward listener and its tunnels; `:ok` also for one already closed."
  @spec kube_forward_close(server(), fchan()) :: :ok | error()
  def kube_forward_close(server, fchan), do: call(server, {:kube_forward_close, fchan})

  defp kube_encode_opt(:paths, paths) when is_list(paths), do: Enum.map(paths, &IO.iodata_to_binary/1)
  defp kube_encode_opt(key, path) when key in [:dir, :token_file], do: IO.iodata_to_binary(path)
  defp kube_encode_opt(_key, value), do: value

  defp call(server, op, timeout \\ @default_call_timeout, owner \\ nil) do
    GenServer.call(server, {:call, op, owner}, timeout)
  end

  defp encode_address({:unix, path}), do: {:unix, IO.iodata_to_binary(path)}
  defp encode_address({:tcp, host, port}), do: {:tcp, IO.iodata_to_binary(host), port}

  # The port writes maps with atom keys; accept binary keys too, as the
  # JSON mapping of the protocol allows either.
  defp atomize(map, keys) when is_map(map) do
    Map.new(keys, fn key -> {key, Map.get(map, key, Map.get(map, Atom.to_string(key)))} end)
  end

  ## Server -------------------------------------------------------------------

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)
    bin = Keyword.get_lazy(opts, :bin, &Condukt.egress_binary/0)

    try do
      port = Port.open({:spawn_executable, bin}, [:binary, {:packet, 4}, :exit_status, :use_stdio, args: ["port"]])

      {:os_pid, os_pid} = Port.info(port, :os_pid)

      {:ok,
       %{
         port: port,
         os_pid: os_pid,
         next_id: 1,
         # id => {from | nil, op, owner | nil}
         pending: %{},
         # chan => owner pid
         chans: %{},
         # owner pid => monitor ref
         owners: %{},
         # forward listener => owner pid (monitored apart)
         fwds: %{}
       }}
    rescue
      e in ErlangError ->
        {:stop, %Error{code: :port_exited, op: :start, message: "cannot start #{bin}: #{inspect(e.original)}"}}
    end
  end

  @impl true
  def handle_call({:call, {:kube_forward_close, fchan} = op, owner}, from, state) do
    handle_call({:call, op, owner, :forgotten}, from, %{state | fwds: Map.delete(state.fwds, fchan)})
  end

  def handle_call({:call, op, owner}, from, state), do: handle_call({:call, op, owner, :sent}, from, state)

  def handle_call({:call, op, owner, _}, from, state) do
    id = state.next_id
    send_term(state, {:call, id, op})
    pending = Map.put(state.pending, id, {from, elem(op, 0), owner})
    {:noreply, %{state | next_id: id + 1, pending: pending}}
  end

  def handle_call(:os_pid, _from, state), do: {:reply, state.os_pid, state}
  def handle_call(:port, _from, state), do: {:reply, state.port, state}

  @impl true
  def handle_cast({:ack, chan, n}, state) do
    if Map.has_key?(state.chans, chan), do: send_term(state, {:ack, chan, n})
    {:noreply, state}
  end

  @impl true
  def handle_info({port, {:data, data}}, %{port: port} = state) do
    # The port is our own program, so its atoms (error codes) are trusted;
    # :safe would refuse an error code this VM has not seen yet.
    data |> :erlang.binary_to_term() |> handle_term(state)
  end

  def handle_info({port, {:exit_status, status}}, %{port: port} = state) do
    port_gone(state, status)
  end

  def handle_info({:EXIT, port, reason}, %{port: port} = state) do
    port_gone(state, reason)
  end

  def handle_info({:DOWN, _ref, :process, owner, _reason}, state) do
    {chans, kept} = Enum.split_with(state.chans, fn {_chan, pid} -> pid == owner end)
    {fwds, kept_fwds} = Enum.split_with(state.fwds, fn {_fchan, pid} -> pid == owner end)

    # Close the dead owner's forward listeners; the replies are dropped.
    state =
      Enum.reduce(fwds, %{state | fwds: Map.new(kept_fwds)}, fn {fchan, _}, acc ->
        send_term(acc, {:call, acc.next_id, {:kube_forward_close, fchan}})
        %{acc | next_id: acc.next_id + 1, pending: Map.put(acc.pending, acc.next_id, {nil, :kube_forward_close, nil})}
      end)

    # Detach the dead owner's channels; the replies are dropped (from = nil).
    state =
      Enum.reduce(chans, %{state | chans: Map.new(kept), owners: Map.delete(state.owners, owner)}, fn {chan, _}, acc ->
        send_term(acc, {:call, acc.next_id, {:control_detach, chan}})
        %{acc | next_id: acc.next_id + 1, pending: Map.put(acc.pending, acc.next_id, {nil, :control_detach, nil})}
      end)

    {:noreply, state}
  end

  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, %{port: port, os_pid: os_pid} = state) do
    fail_pending(state, "the port owner stopped")

    if Port.info(port) != nil do
      Port.close(port)
      await_os_exit(os_pid, @exit_wait)
    end

    :ok
  catch
    # The port may already be closed.
    :error, _ -> :ok
  end

  defp handle_term({:reply, id, result}, state) when is_map_key(state.pending, id) do
    {{from, op, owner}, pending} = Map.pop(state.pending, id)
    state = %{state | pending: pending}
    {reply, state} = reply(op, result, owner, state)
    if from, do: GenServer.reply(from, reply)
    {:noreply, state}
  end

  # A post that could not be queued: to the poster (the Tag carries it),
  # whether or not the channel is still known here.
  defp handle_term({:control, chan, {:send_failed, {poster, tag}, {code, message}}}, state)
       when is_pid(poster) and is_atom(code) do
    error = %Error{code: code, message: to_string(message), op: :control_post}
    send(poster, {:condukt_control, self(), chan, {:send_failed, tag, error}})
    {:noreply, state}
  end

  defp handle_term({:control, chan, message}, state) when is_map_key(state.chans, chan) do
    owner = state.chans[chan]
    send(owner, {:condukt_control, self(), chan, message})

    case message do
      {:closed, _} -> {:noreply, forget_chan(state, chan)}
      _ -> {:noreply, state}
    end
  end

  defp handle_term({:control, chan, _message}, state) do
    # A channel whose owner died and that we detached; its last frames
    # may still be in flight.
    Logger.debug("condukt-egress port: frame for unowned channel #{chan} dropped")
    {:noreply, state}
  end

  defp handle_term({:kube_forward, fchan, {:error, message}}, state) do
    case state.fwds do
      %{^fchan => owner} -> send(owner, {:condukt_kube_forward, self(), fchan, {:error, message}})
      _ -> Logger.debug("condukt-egress port: error for a closed forward listener #{fchan}: #{message}")
    end

    {:noreply, state}
  end

  defp handle_term({:error, kind, message}, state) do
    Logger.error("condukt-egress port refused a packet (#{inspect(kind)}): #{message}")
    {:noreply, state}
  end

  defp handle_term(other, state) do
    Logger.error("condukt-egress port sent a term outside the protocol: #{inspect(other, limit: 20)}")
    {:noreply, state}
  end

  defp reply(:control_attach, {:ok, {chan, welcome}}, owner, state) when is_integer(chan) do
    owners =
      if Map.has_key?(state.owners, owner),
        do: state.owners,
        else: Map.put(state.owners, owner, Process.monitor(owner))

    {{:ok, {chan, welcome}}, %{state | chans: Map.put(state.chans, chan, owner), owners: owners}}
  end

  defp reply(:control_detach, :ok, _owner, state), do: {:ok, state}

  defp reply(:kube_forward, {:ok, {fchan, info}}, owner, state) when is_integer(fchan) do
    Process.monitor(owner)
    {{:ok, {fchan, info}}, %{state | fwds: Map.put(state.fwds, fchan, owner)}}
  end

  defp reply(op, result, _owner, state) do
    reply =
      case result do
        :ok ->
          :ok

        {:ok, value} ->
          {:ok, value}

        {:error, {code, message}} when is_atom(code) ->
          {:error, %Error{code: code, message: to_string(message), op: op}}

        other ->
          {:error, %Error{code: :bad_reply, message: "unexpected reply #{inspect(other)}", op: op}}
      end

    {reply, state}
  end

  defp forget_chan(state, chan) do
    {owner, chans} = Map.pop(state.chans, chan)

    if owner in Map.values(chans) do
      %{state | chans: chans}
    else
      if ref = state.owners[owner], do: Process.demonitor(ref, [:flush])
      %{state | chans: chans, owners: Map.delete(state.owners, owner)}
    end
  end

  defp port_gone(state, how) do
    message = "the port program exited (#{format_exit(how)})"
    fail_pending(state, message)
    for {chan, owner} <- state.chans, do: send(owner, {:condukt_control, self(), chan, {:closed, message}})
    for {fchan, owner} <- state.fwds, do: send(owner, {:condukt_kube_forward, self(), fchan, {:error, message}})
    state = %{state | pending: %{}, chans: %{}, fwds: %{}}
    Logger.error("condukt-egress port: #{message}")
    {:stop, {:port_exited, how}, state}
  end

  defp format_exit(status) when is_integer(status), do: "status #{status}"
  defp format_exit(reason), do: inspect(reason)

  defp fail_pending(state, message) do
    for {_id, {from, op, _owner}} <- state.pending, from != nil do
      GenServer.reply(from, {:error, %Error{code: :port_exited, message: message, op: op}})
    end
  end

  defp send_term(state, term) do
    Port.command(state.port, :erlang.term_to_binary(term))
  end

  # The program exits as soon as it reads EOF on stdin; wait for that, so
  # that a stopped owner never leaves the process behind, and SIGKILL it
  # if it does not go in time.
  defp await_os_exit(os_pid, wait) do
    deadline = System.monotonic_time(:millisecond) + wait

    if poll_exit(os_pid, deadline) == :alive do
      Logger.warning("condukt-egress port (os pid #{os_pid}) ignored EOF on stdin; killing it")
      System.cmd("kill", ["-KILL", Integer.to_string(os_pid)], stderr_to_stdout: true)
    end

    :ok
  end

  defp poll_exit(os_pid, deadline) do
    cond do
      not os_alive?(os_pid) ->
        :gone

      System.monotonic_time(:millisecond) >= deadline ->
        :alive

      true ->
        Process.sleep(10)
        poll_exit(os_pid, deadline)
    end
  end

  # Zombies count as gone: erl_child_setup reaps them.
  defp os_alive?(os_pid) do
    case File.read("/proc/#{os_pid}/stat") do
      {:ok, stat} -> not String.match?(stat, ~r/^\d+ \(.*\) [ZX] /s)
      {:error, _} -> false
    end
  end
end
