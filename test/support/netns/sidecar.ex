defmodule Condukt.Test.Netns.Sidecar do
  @moduledoc false
  # The real sidecar inside a testbed's pod, set up as a pod would have it
  # (DESIGN §4–§6): `netfilter-setup` applied by root in the pod namespace,
  # then `condukt-egress proxy` running as its own uid with only
  # CAP_NET_ADMIN (for SO_MARK), a fresh session CA made by `ca new`, a
  # random control token, and the policy compiled by
  # `NetworkPolicy.to_sidecar_json/1`. The workspace side gets the trust
  # bundle (Mozilla snapshot + session CA) and the session CA file.
  #
  # The proxy runs from $CONDUKT_EGRESS_SAN_BIN when set (the ASan+UBSan
  # build `make elixir-test` passes), so that every end-to-end request also
  # runs under the sanitizers; `stop/1` fails the test on any report.

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Dev.Netns.{Cmd, Testbed, Tier}

  @uid 1337
  @mark "0x539"
  @port 15001

  defstruct [:tb, :dir, :bin, :pid, :stdout, :stderr, :control, :token, :ca_cert, :bundle, :policy_path, :control_relay]

  @type t :: %__MODULE__{}

  @doc "The session id the proxy was started with (its control peer must name it)."
  def session_id(%__MODULE__{tb: tb}), do: "e2e-#{tb.id}"

  @doc "The uid the proxy runs as (a workspace process may use it too)."
  def uid, do: @uid

  @doc "The binary the end-to-end tier runs (the sanitizer build when given)."
  def bin do
    case System.get_env("CONDUKT_EGRESS_SAN_BIN") do
      path when is_binary(path) and path != "" -> path
      _ -> Condukt.egress_binary()
    end
  end

  @doc """
  Applies netfilter-setup in the pod and starts the proxy with `policy`
  (a `%NetworkPolicy{}` or the keyword given to `NetworkPolicy.new!/1`).

  Options: `:control` ("unix" (default) or "tcp": 127.0.0.1:15002 in the
  pod), `:extra_args` (more proxy flags), `:allow_private` (default: the
  testbed's veth /24 and /64, where its "internet" lives), `:netfilter`
  (default true), `:ports` (the TCP ports redirected to the proxy; default
  netfilter-setup's 80 and 443), `:caps` (default true: the proxy gets
  CAP_NET_ADMIN; false runs it with no capability at all), `:drop_from_root`
  (default false; true starts it as a Kubernetes pod does: root with
  NET_ADMIN, SETUID and SETGID, group 1337, and `--user 1337`), `:token`
  (the control token as lowercase hex; default a fresh one), `:dns_upstream`
  (the resolvers the proxy asks; default the inet namespace's two
  addresses; nil: none given, the proxy reads the pod's resolv.conf at
  start; no DNS server listens there unless a test starts one,
  `Condukt.Test.Netns.DnsServer`), `:hosts` (the text of the proxy's own
  hosts file; default the testbed's, `Testbed.hosts_file/1`),
  `:credentials` (the values of the policy's secrets, `%{name => value}`,
  written to the sidecar's own `--credentials` file).

  The proxy's names come from its own copy of the testbed's hosts file
  (`--hosts`, in the sidecar's directory), never from the pod's
  /etc/hosts (docs/dns.md).
  """
  @spec start(Testbed.t(), NetworkPolicy.t() | keyword(), keyword()) :: t()
  def start(tb, policy, opts \\ []) do
    policy = if is_struct(policy, NetworkPolicy), do: policy, else: NetworkPolicy.new!(policy)
    dir = Path.join(tb.dir, "sidecar-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    # The proxy's uid may not traverse the build tree: it gets its own copy
    # of the binary and of the Mozilla snapshot, as in a sidecar image.
    bin = Path.join(dir, "condukt-egress")
    File.cp!(bin(), bin)
    File.chmod!(bin, 0o755)

    policy_path = Path.join(dir, "policy.json")
    File.write!(policy_path, NetworkPolicy.to_sidecar_json(policy))
    ca_cert = Path.join(dir, "ca.pem")
    ca_key = Path.join(dir, "ca.key")
    Cmd.run!([bin, "ca", "new", "--cert", ca_cert, "--key", ca_key], env: san_env())
    token = opts[:token] || :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    token_path = Path.join(dir, "token")
    File.write!(token_path, token <> "\n")

    # The sidecar's own static names: a copy the workspace cannot write
    # (docs/dns.md); the pod's /etc/netns/<pod>/hosts is the workspace's.
    hosts_path = Path.join(dir, "hosts")
    File.write!(hosts_path, Keyword.get_lazy(opts, :hosts, fn -> Testbed.hosts_file(tb) end))
    File.chmod!(hosts_path, 0o644)
    dns_upstream = Keyword.get(opts, :dns_upstream, [tb.inet.v4, tb.inet.v6])

    bundle = Path.join(dir, "trust-bundle.pem")
    mozilla = Path.join(dir, "mozilla.pem")
    File.cp!(Path.join(:code.priv_dir(:condukt), "ca-certificates/mozilla.pem"), mozilla)
    File.chmod!(mozilla, 0o644)
    File.write!(bundle, File.read!(mozilla) <> File.read!(ca_cert))

    # The credentials' values (`:credentials`, a map of secret name to
    # value), in the sidecar's own file: 0600, its uid, written only after
    # that (docs/credentials.md).
    secrets_path = Path.join(dir, "credentials.json")

    if values = opts[:credentials] do
      File.touch!(secrets_path)
      File.chmod!(secrets_path, 0o600)
      File.chown!(secrets_path, @uid)
      File.write!(secrets_path, NetworkPolicy.Credentials.sidecar_secrets_json(values))
    end

    # Secrets are the sidecar's alone (DESIGN §6): 0600, owned by its uid.
    for f <- [ca_key, token_path, policy_path], do: File.chmod!(f, 0o600)
    for f <- [dir, ca_key, token_path, policy_path], do: File.chown!(f, @uid)
    File.chmod!(dir, 0o711)

    # As the pod's Secret volume: group 1337, 0440 (root without
    # CAP_DAC_OVERRIDE reads them through its group).
    if opts[:drop_from_root] do
      for f <- [ca_key, token_path, policy_path], do: File.chgrp!(f, @uid) && File.chmod!(f, 0o440)
    end

    File.chmod!(ca_cert, 0o644)
    File.chmod!(bundle, 0o644)

    if Keyword.get(opts, :netfilter, true) do
      Cmd.run!(
        Testbed.command(
          tb,
          :pod,
          [bin, "netfilter-setup", "--proxy-port", "#{@port}", "--mark", @mark, "--sidecar-uid", "#{@uid}"] ++
            if(ports = opts[:ports], do: ["--ports", Enum.join(ports, ",")], else: []),
          env: san_env()
        )
      )
    end

    control =
      case Keyword.get(opts, :control, "unix") do
        "unix" -> "unix:" <> Path.join(dir, "control.sock")
        "tcp" -> "127.0.0.1:15002"
      end

    private =
      Keyword.get(opts, :allow_private, [
        String.replace(tb.inet.v4, ~r/\.\d+$/, ".0/24"),
        tb.inet.v6 <> "/128",
        tb.pod.v6 <> "/128"
      ])

    args =
      ["proxy", "--policy", policy_path, "--ca-cert", ca_cert, "--ca-key", ca_key, "--session-id", "e2e-#{tb.id}"] ++
        ["--token-file", token_path, "--control", control, "--upstream-extra-ca", tb.ca_cert] ++
        ["--trust-bundle", mozilla, "--mark", @mark, "--hosts", hosts_path] ++
        if(dns_upstream, do: ["--dns-upstream", Enum.join(dns_upstream, ",")], else: []) ++
        Enum.flat_map(private, &["--allow-private", &1]) ++
        if(opts[:credentials], do: ["--credentials", secrets_path], else: []) ++
        Keyword.get(opts, :extra_args, []) ++
        if(opts[:drop_from_root], do: ["--user", "#{@uid}"], else: [])

    env =
      ["/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"] ++ Enum.map(san_env(), fn {k, v} -> "#{k}=#{v}" end)

    identity =
      cond do
        opts[:drop_from_root] ->
          ["--regid=#{@uid}", "--clear-groups", "--bounding-set=-all,+net_admin,+setuid,+setgid"] ++
            ["--inh-caps=-all", "--no-new-privs"]

        Keyword.get(opts, :caps, true) ->
          ["--reuid=#{@uid}", "--regid=#{@uid}", "--clear-groups", "--inh-caps=+net_admin", "--ambient-caps=+net_admin"]

        true ->
          ["--reuid=#{@uid}", "--regid=#{@uid}", "--clear-groups"]
      end

    argv =
      [Tier.tool!("ip"), "netns", "exec", tb.pod_ns, Tier.tool!("setpriv")] ++ identity ++ ["--"] ++ env ++ [bin | args]

    stdout = Path.join(dir, "events.ndjson")
    stderr = Path.join(dir, "proxy.stderr")
    script = ~S(out=$1; err=$2; shift 2; setsid "$@" </dev/null >>"$out" 2>>"$err" & echo $!)
    pid = Cmd.run!(["/bin/sh", "-c", script, "sh", stdout, stderr | argv]) |> String.trim() |> String.to_integer()

    sc = %__MODULE__{
      tb: tb,
      dir: dir,
      bin: bin,
      pid: pid,
      stdout: stdout,
      stderr: stderr,
      control: control,
      token: token,
      ca_cert: ca_cert,
      bundle: bundle,
      policy_path: policy_path
    }

    ExUnit.Callbacks.on_exit({__MODULE__, dir}, fn -> kill(sc) end)

    # Ready as the Kubernetes startupProbe sees it: `condukt-egress ready`
    # in the pod connects to every proxy listener (docs/cli.md), rather than
    # a line of the proxy's stderr. Not to the control port: the proxy
    # opens that before its listeners, and a connection that closes before
    # the handshake is a refusal event some tests count.
    ready = [Tier.tool!("ip"), "netns", "exec", tb.pod_ns, bin, "ready", "--timeout-ms", "500"] ++ listen_args(args)

    case Cmd.poll(fn -> not Cmd.alive?(pid) or match?({_, 0}, Cmd.run(ready, timeout: 5_000)) end, 15_000, 100) do
      :ok -> :ok
      {:error, :timeout} -> raise "the sidecar did not start:\n" <> File.read!(stderr)
    end

    unless Cmd.alive?(pid), do: raise("the sidecar exited at start:\n" <> File.read!(stderr))
    sc
  end

  # The proxy's own --listen flags, which `ready` must check instead of its
  # defaults.
  defp listen_args(["--listen", addr | rest]), do: ["--listen", addr | listen_args(rest)]
  defp listen_args([_ | rest]), do: listen_args(rest)
  defp listen_args([]), do: []

  @doc """
  Stops the proxy with SIGTERM (it drains and exits 0) and returns its
  stderr; raises when it did not exit cleanly or a sanitizer reported.
  """
  @spec stop(t()) :: String.t()
  def stop(%__MODULE__{} = sc) do
    System.cmd("kill", ["-TERM", "#{sc.pid}"])
    await_exit(sc)
  end

  @doc """
  Waits (at most `timeout` ms) for a proxy that was sent SIGTERM to exit
  (never signal it twice: during the drain a second SIGTERM kills it), then
  checks its stderr as `stop/1` does and returns it.
  """
  @spec await_exit(t(), non_neg_integer()) :: String.t()
  def await_exit(%__MODULE__{} = sc, timeout \\ 15_000) do
    case Cmd.poll(fn -> not Cmd.alive?(sc.pid) end, timeout) do
      :ok -> :ok
      {:error, :timeout} -> raise "the sidecar did not drain within #{timeout} ms:\n" <> File.read!(sc.stderr)
    end

    err = File.read!(sc.stderr)

    if err =~ ~r/Sanitizer|runtime error:/ do
      raise "the sidecar reported a sanitizer error:\n" <> err
    end

    unless err =~ "drained, exiting", do: raise("the sidecar did not exit cleanly:\n" <> err)
    err
  end

  defp kill(sc), do: Cmd.kill([sc.pid])

  @doc """
  For a sidecar started with `control: "tcp"`: starts, inside the pod, the
  testbed's stand-in for `kubectl port-forward` (servers/port_forward.py),
  which joins every connection to a Unix socket outside the pod to the
  control port 15002 inside it, dialled as Kubernetes does: 127.0.0.1, and
  [::1] when that refuses. Returns the sidecar with
  `control_relay` set, which `ControlPeer` then dials. The relay is killed
  with everything else in the pod by `Testbed.stop/1`, or by `Cmd.kill/1`
  through the on_exit registered here.
  """
  @spec port_forward(t()) :: t()
  def port_forward(%__MODULE__{control: "127.0.0.1:" <> port} = sc) do
    path = Path.join(sc.dir, "control-forward.sock")
    py = Tier.tool!("python3")
    log = Path.join(sc.dir, "port_forward.log")

    pid =
      Testbed.spawn_in(sc.tb, :pod, [py, Path.join(sc.tb.bin_dir, "port_forward.py"), path, "localhost", port], log: log)

    ExUnit.Callbacks.on_exit({__MODULE__, path}, fn -> Cmd.kill([pid]) end)

    case Cmd.poll(fn -> File.exists?(path) or not Cmd.alive?(pid) end, 10_000) do
      :ok -> :ok
      {:error, :timeout} -> raise "the control port-forward did not start:\n" <> File.read!(log)
    end

    unless Cmd.alive?(pid), do: raise("the control port-forward exited:\n" <> File.read!(log))
    %{sc | control_relay: path}
  end

  @doc "Every event the proxy wrote to stdout so far, decoded."
  @spec stdout_events(t()) :: [map()]
  def stdout_events(sc) do
    sc.stdout
    |> File.read!()
    |> String.split("\n", trim: true)
    |> Enum.map(&Condukt.JSON.decode!/1)
  end

  @doc "The proxy's stderr so far."
  def stderr(sc), do: File.read!(sc.stderr)

  @doc """
  The proxy's debug trace lines (a proxy started with `--verbose`) of the
  workspace connection `id` (an event's "connection_id"), in order:
  `{monotonic seconds, message}`.
  """
  @spec trace(t(), String.t()) :: [{float(), String.t()}]
  def trace(sc, id) do
    tag = "c-" <> String.pad_leading(String.downcase(Integer.to_string(String.to_integer(id), 16)), 8, "0")

    for [_, t, msg] <- Regex.scan(~r/^condukt-egress: (\d+\.\d+) debug proxy #{tag}: (.*)$/m, stderr(sc)),
        do: {String.to_float(t), msg}
  end

  @doc "The lines of `trace/2` about HTTP/2 (their message starts with \"h2: \")."
  @spec h2_trace(t(), String.t()) :: [{float(), String.t()}]
  def h2_trace(sc, id), do: Enum.filter(trace(sc, id), fn {_, msg} -> String.starts_with?(msg, "h2: ") end)

  @doc "The times of the lines of `trace` (`h2_trace/2`) whose message matches `re`."
  @spec trace_at([{float(), String.t()}], Regex.t()) :: [float()]
  def trace_at(trace, re), do: for({t, msg} <- trace, msg =~ re, do: t)

  @doc """
  The proxy's buffer statistics now, as a map of integers ("connections",
  "held", "input", "queued", "h2_streams", "tls"): SIGUSR1 makes it write
  one line of them on its stderr (docs/proxy.md, "Signals").
  """
  @spec buffer_stats(t()) :: %{String.t() => non_neg_integer()}
  def buffer_stats(sc) do
    seen = length(stats_lines(sc))
    {_, 0} = System.cmd("kill", ["-USR1", "#{sc.pid}"])
    :ok = Cmd.poll(fn -> length(stats_lines(sc)) > seen end, 5_000)
    [line] = List.last(stats_lines(sc))

    Regex.scan(~r/(\w+)=(\d+)/, line)
    |> Map.new(fn [_, k, v] -> {k, String.to_integer(v)} end)
  end

  defp stats_lines(sc), do: Regex.scan(~r/^condukt-egress: buffers: .*$/m, stderr(sc))

  defp san_env do
    [
      {"ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1"},
      {"UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"}
    ]
  end
end
