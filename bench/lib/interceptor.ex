defmodule Bench.Os do
  @moduledoc false
  # Small OS helpers of the benchmark: CPU pinning, process trees, RSS.

  alias Condukt.Dev.Netns.{Cmd, Testbed}

  # The proxy under test runs on CPU 0; the load generator (and nginx, the
  # origin) on CPU 1.
  @proxy_cpu "0"
  @load_cpu "1"
  @path "/usr/sbin:/usr/bin:/sbin:/bin"

  def proxy_cpu, do: @proxy_cpu
  def load_cpu, do: @load_cpu

  @doc "Runs a client in the pod, pinned to the load generator's CPU."
  def client(tb, argv, opts \\ []) do
    Testbed.exec_in(tb, :pod, ["/usr/bin/taskset", "-c", @load_cpu | argv], opts)
  end

  @doc "Starts a long-lived client in the pod (pinned), output to `log`."
  def spawn_client(tb, argv, log, opts \\ []) do
    Testbed.spawn_in(tb, :pod, ["/usr/bin/taskset", "-c", @load_cpu | argv], Keyword.put(opts, :log, log))
  end

  @doc """
  The argv that runs `argv` in the pod as the proxy under test: pinned to
  CPU 0, 16384 file descriptors, as `uid` (nil: root) with `caps` ambient,
  under a clean environment plus `env`.
  """
  def proxy_argv(tb, argv, opts \\ []) do
    user =
      case opts[:uid] do
        nil ->
          []

        uid ->
          caps = if c = opts[:caps], do: ["--inh-caps=+#{c}", "--ambient-caps=+#{c}"], else: []
          ["/usr/bin/setpriv", "--reuid=#{uid}", "--regid=#{uid}", "--clear-groups"] ++ caps ++ ["--"]
      end

    env = [{"PATH", @path}, {"LANG", "C.UTF-8"}, {"HOME", opts[:home] || "/root"}] ++ (opts[:env] || [])

    ["/usr/sbin/ip", "netns", "exec", tb.pod_ns, "/usr/bin/taskset", "-c", @proxy_cpu] ++
      ["/usr/bin/prlimit", "--nofile=16384:16384"] ++
      user ++ ["/usr/bin/env", "-i"] ++ Enum.map(env, fn {k, v} -> "#{k}=#{v}" end) ++ argv
  end

  @doc "Starts `argv` detached, stdout and stderr to files; returns its pid."
  def spawn(argv, stdout, stderr) do
    script = ~S(out=$1; err=$2; shift 2; setsid "$@" </dev/null >>"$out" 2>>"$err" & echo $!)
    Cmd.run!(["/bin/sh", "-c", script, "sh", stdout, stderr | argv]) |> String.trim() |> String.to_integer()
  end

  @doc "`pid` and all its descendants (from /proc)."
  def tree(pid) do
    parents =
      for entry <- File.ls!("/proc"), Regex.match?(~r/^\d+$/, entry), reduce: %{} do
        acc ->
          case File.read("/proc/#{entry}/stat") do
            {:ok, stat} ->
              [_, rest] = String.split(stat, ") ", parts: 2)
              ppid = rest |> String.split() |> Enum.at(1) |> String.to_integer()
              Map.update(acc, ppid, [String.to_integer(entry)], &[String.to_integer(entry) | &1])

            _ ->
              acc
          end
      end

    collect([pid], parents, [])
  end

  defp collect([], _parents, acc), do: Enum.reverse(acc)

  defp collect([p | rest], parents, acc) do
    collect(Map.get(parents, p, []) ++ rest, parents, [p | acc])
  end

  @doc "Sum of VmRSS (KiB) of `pids` (those that are gone count 0)."
  def rss_kib(pids) do
    Enum.reduce(pids, 0, fn pid, sum ->
      case File.read("/proc/#{pid}/status") do
        {:ok, status} ->
          case Regex.run(~r/^VmRSS:\s+(\d+) kB/m, status) do
            [_, kb] -> sum + String.to_integer(kb)
            nil -> sum
          end

        _ ->
          sum
      end
    end)
  end

  @doc "Pins every process now in the inet namespace (nginx, backends) to the load CPU."
  def pin_inet(tb) do
    {out, 0} = Cmd.run(["/usr/sbin/ip", "netns", "pids", tb.inet_ns])

    for pid <- String.split(out) do
      Cmd.run(["/usr/bin/taskset", "-a", "-p", "-c", @load_cpu, pid], stderr: :discard)
    end

    :ok
  end

  @doc "Runs a command as root in the pod; raises on failure."
  def pod!(tb, argv), do: Cmd.run!(["/usr/sbin/ip", "netns", "exec", tb.pod_ns | argv], timeout: 15_000)
end

defmodule Bench.Interceptor do
  @moduledoc false
  # Each interceptor the benchmark compares, started transparently in the
  # testbed's pod namespace (iptables REDIRECT of TCP 80/443 in the nat
  # OUTPUT chain, as the sidecar's netfilter-setup does) and pinned to
  # CPU 0. `start/3` returns a map with
  #   :name, :ca (the bundle the clients trust), :pid (the process whose
  #   tree is the proxy, nil for direct), :dir, and what `stop/1` needs.
  #
  # Every start, whoever calls it (the main rounds, the decide rounds, the
  # profile), flushes the pod's conntrack table once the new redirection is
  # in place: see flush_conntrack/1.

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Dev.Netns.{Cmd, Testbed}

  @condukt_uid 1337
  @mitm_uid 1338
  @squid_uid 13
  @mark "0x539"

  def kinds, do: ~w(direct condukt mitmproxy squid)

  def start(kind, tb, opts \\ [])

  def start("direct", tb, _opts) do
    flush_conntrack(tb)
    %{name: "direct", ca: tb.ca_cert, pid: nil, dir: nil, tb: tb}
  end

  def start("condukt", tb, opts) do
    dir = fresh_dir(tb, "condukt")
    bin = Path.join(dir, "condukt-egress")
    # CONDUKT_BENCH_BIN: another build to measure (two builds compared in
    # one sitting); priv/condukt-egress otherwise.
    File.cp!(Keyword.get(opts, :bin, System.get_env("CONDUKT_BENCH_BIN") || Condukt.egress_binary()), bin)
    File.chmod!(bin, 0o755)

    policy = Keyword.get(opts, :policy, NetworkPolicy.new!(rules: [allow: ["allowed.test"]], default: :deny))
    policy_path = Path.join(dir, "policy.json")
    File.write!(policy_path, NetworkPolicy.to_sidecar_json(policy))
    ca_cert = Path.join(dir, "ca.pem")
    ca_key = Path.join(dir, "ca.key")
    Cmd.run!([bin, "ca", "new", "--cert", ca_cert, "--key", ca_key])
    token = :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    token_path = Path.join(dir, "token")
    File.write!(token_path, token <> "\n")
    mozilla = Path.join(dir, "mozilla.pem")
    File.cp!(Path.join(:code.priv_dir(:condukt), "ca-certificates/mozilla.pem"), mozilla)
    File.chmod!(mozilla, 0o644)

    # The proxy's own names (docs/dns.md): it never reads the pod's /etc/hosts.
    hosts_path = Path.join(dir, "hosts")
    File.write!(hosts_path, Testbed.hosts_file(tb))
    File.chmod!(hosts_path, 0o644)

    for f <- [ca_key, token_path, policy_path], do: File.chmod!(f, 0o600)
    for f <- [dir, ca_key, token_path, policy_path], do: File.chown!(f, @condukt_uid)
    File.chmod!(dir, 0o711)
    File.chmod!(ca_cert, 0o644)

    Bench.Os.pod!(tb, [bin, "netfilter-setup", "--proxy-port", "15001", "--mark", @mark])
    flush_conntrack(tb)

    control = "unix:" <> Path.join(dir, "control.sock")

    args =
      ["proxy", "--policy", policy_path, "--ca-cert", ca_cert, "--ca-key", ca_key, "--session-id", "bench-#{tb.id}"] ++
        ["--token-file", token_path, "--control", control, "--upstream-extra-ca", tb.ca_cert] ++
        ["--trust-bundle", mozilla, "--mark", @mark, "--allow-private", tb.inet.v4 <> "/32"] ++
        ["--max-connections", "4096", "--hosts", hosts_path, "--dns-listen", "none"]

    # opts[:wrap]: a command to run the sidecar under (heaptrack, valgrind).
    argv = Bench.Os.proxy_argv(tb, Keyword.get(opts, :wrap, []) ++ [bin | args], uid: @condukt_uid, caps: "net_admin")
    stderr = Path.join(dir, "proxy.stderr")
    pid = Bench.Os.spawn(argv, Path.join(dir, "events.ndjson"), stderr)

    ic = %{name: "condukt", ca: ca_cert, pid: pid, dir: dir, tb: tb, bin: bin, control: control, token: token}

    case Cmd.poll(fn -> File.read!(stderr) =~ "proxy ready" or not Cmd.alive?(pid) end, 15_000) do
      :ok when is_integer(pid) -> :ok
      _ -> :ok
    end

    unless Cmd.alive?(pid) and File.read!(stderr) =~ "proxy ready" do
      stop(ic)
      raise "condukt-egress did not start:\n" <> File.read!(stderr)
    end

    ic
  end

  def start("mitmproxy", tb, _opts) do
    dir = fresh_dir(tb, "mitmproxy")
    conf = Path.join(dir, "conf")
    File.mkdir_p!(conf)
    for d <- [dir, conf], do: File.chown!(d, @mitm_uid)
    port = 15081

    args =
      ["/usr/bin/mitmdump", "--mode", "transparent", "--listen-host", "127.0.0.1", "--listen-port", "#{port}"] ++
        ["--set", "confdir=#{conf}", "--set", "ssl_verify_upstream_trusted_ca=#{tb.ca_cert}"] ++
        ["--set", "stream_large_bodies=1m", "--set", "block_global=false", "--set", "flow_detail=0", "-q"]

    argv = Bench.Os.proxy_argv(tb, args, uid: @mitm_uid, home: dir)
    pid = Bench.Os.spawn(argv, Path.join(dir, "mitmdump.out"), Path.join(dir, "mitmdump.err"))
    ic = %{name: "mitmproxy", ca: Path.join(conf, "mitmproxy-ca-cert.pem"), pid: pid, dir: dir, tb: tb}
    await_listening!(ic, ["127.0.0.1:#{port}"], [Path.join(dir, "mitmdump.err"), Path.join(dir, "mitmdump.out")])
    redirect!(tb, @mitm_uid, port, port)
    flush_conntrack(tb)
    ic
  end

  def start("squid", tb, _opts) do
    dir = fresh_dir(tb, "squid")
    ca_cert = Path.join(dir, "ca.pem")
    ca_key = Path.join(dir, "ca.key")

    Cmd.run!(
      ["/usr/bin/openssl", "req", "-x509", "-new", "-nodes", "-days", "3"] ++
        ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-keyout", ca_key, "-out", ca_cert] ++
        ["-subj", "/CN=bench squid CA", "-addext", "basicConstraints=critical,CA:TRUE"] ++
        ["-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    )

    ssl_db = Path.join(dir, "ssl_db")
    certgen = "/usr/lib/squid/security_file_certgen"
    Cmd.run!([certgen, "-c", "-s", ssl_db, "-M", "16MB"])
    Cmd.run!(["/bin/chown", "-R", "#{@squid_uid}:#{@squid_uid}", dir])
    File.chmod!(ca_cert, 0o644)
    {http, https} = {15080, 15443}

    conf = Path.join(dir, "squid.conf")

    File.write!(conf, """
    # Generated by bench/lib/interceptor.ex: Squid as a transparent TLS
    # interceptor (ssl-bump), no caching, no logging of requests.
    http_port 127.0.0.1:15128
    http_port 127.0.0.1:#{http} intercept
    https_port 127.0.0.1:#{https} intercept ssl-bump tls-cert=#{ca_cert} tls-key=#{ca_key} generate-host-certificates=on dynamic_cert_mem_cache_size=16MB
    sslcrtd_program #{certgen} -s #{ssl_db} -M 16MB
    sslcrtd_children 4 startup=1 idle=1
    acl step1 at_step SslBump1
    ssl_bump peek step1
    ssl_bump bump all
    tls_outgoing_options cafile=#{tb.ca_cert}
    http_access allow all
    cache deny all
    cache_mem 0 MB
    access_log none
    cache_store_log none
    cache_log #{dir}/cache.log
    pid_filename #{dir}/squid.pid
    coredump_dir #{dir}
    max_filedescriptors 16384
    cache_effective_user proxy
    cache_effective_group proxy
    shutdown_lifetime 0 seconds
    pinger_enable off
    hosts_file /etc/hosts
    dns_nameservers #{tb.inet.v4}
    client_persistent_connections on
    server_persistent_connections on
    via off
    forwarded_for delete
    """)

    argv = Bench.Os.proxy_argv(tb, ["/usr/sbin/squid", "-N", "-f", conf])
    pid = Bench.Os.spawn(argv, Path.join(dir, "squid.out"), Path.join(dir, "squid.err"))
    ic = %{name: "squid", ca: ca_cert, pid: pid, dir: dir, tb: tb}

    await_listening!(ic, ["127.0.0.1:#{http}", "127.0.0.1:#{https}"], [
      Path.join(dir, "squid.err"),
      Path.join(dir, "cache.log")
    ])

    redirect!(tb, @squid_uid, http, https)
    flush_conntrack(tb)
    ic
  end

  @doc "Stops the interceptor and removes its redirection; idempotent."
  def stop(%{name: "direct"}), do: :ok

  def stop(%{name: "condukt"} = ic) do
    Cmd.run(["/usr/sbin/ip", "netns", "exec", ic.tb.pod_ns, ic.bin, "netfilter-setup", "--remove"], timeout: 15_000)
    Cmd.kill(Bench.Os.tree(ic.pid))
  end

  def stop(ic) do
    unredirect(ic.tb)
    Cmd.kill(Bench.Os.tree(ic.pid))
  end

  @doc """
  How many connections the nat table of the pod has redirected so far (the
  packet counters of its REDIRECT rules: a NAT rule sees only the first
  packet of a connection); nil for direct.
  """
  def redirected(%{name: "direct"}), do: nil

  def redirected(ic) do
    {out, 0} =
      Cmd.run(["/usr/sbin/ip", "netns", "exec", ic.tb.pod_ns, "/usr/sbin/iptables", "-t", "nat", "-L", "-n", "-v", "-x"])

    out
    |> String.split("\n")
    |> Enum.filter(&(&1 =~ "REDIRECT"))
    |> Enum.map(&(&1 |> String.split() |> hd() |> String.to_integer()))
    |> Enum.sum()
  end

  # Flushes the pod's connection tracking table; every start/3 calls it
  # once its redirection is installed (and before the clients run), so that
  # any entry made afterwards gets the new NAT decision. NAT is decided when
  # a connection's conntrack entry is made, and a client's new connection
  # whose addresses and ports match an entry left by the previous
  # interceptor keeps that entry's NAT: conntrack ignores a SYN that hits
  # an ESTABLISHED entry and does not re-decide. After a full-mode Squid
  # round the pod holds hundreds of ESTABLISHED, un-NATed entries of Squid's
  # upstream connections to allowed.test:443, left so after Squid closed
  # them. Without the flush a client SYN from one of their source ports went
  # past a peer's REDIRECT straight to nginx, or, under the sidecar's
  # fail-closed filter rules, hit their final `REJECT --reject-with
  # tcp-reset`: the client's ECONNREFUSED (bench/README.md, the decide path).
  defp flush_conntrack(tb) do
    Cmd.run(["/usr/sbin/ip", "netns", "exec", tb.pod_ns, "/usr/sbin/conntrack", "-F"], stderr: :discard)
    :ok
  end

  @doc "nil while the interceptor runs; else why not, with the end of its log."
  def died(%{pid: nil}), do: nil

  def died(ic) do
    if Cmd.alive?(ic.pid) do
      nil
    else
      log =
        case ic.name do
          "condukt" -> "proxy.stderr"
          "mitmproxy" -> "mitmdump.err"
          "squid" -> "cache.log"
        end

      tail =
        case File.read(Path.join(ic.dir, log)) do
          {:ok, text} -> String.slice(text, -1500, 1500)
          _ -> "(no log)"
        end

      "#{ic.name} (pid #{ic.pid}) exited during the round; the end of #{log}:\n#{tail}"
    end
  end

  @doc "The proxy's processes (the tree under its pid): what the RSS counts."
  def pids(%{pid: nil}), do: []
  def pids(%{pid: pid}), do: Bench.Os.tree(pid)

  # TCP 80 and 443 from every uid but the proxy's own go to its ports, as
  # the sidecar's netfilter-setup does (which excludes by mark instead; the
  # peers cannot set one, so they are excluded by uid).
  defp redirect!(tb, uid, http, https) do
    rules = """
    *nat
    :BENCH_NAT - [0:0]
    -A OUTPUT -p tcp -j BENCH_NAT
    -A BENCH_NAT -m owner --uid-owner #{uid} -j RETURN
    -A BENCH_NAT -o lo -j RETURN
    -A BENCH_NAT -p tcp --dport 80 -j REDIRECT --to-ports #{http}
    -A BENCH_NAT -p tcp --dport 443 -j REDIRECT --to-ports #{https}
    COMMIT
    """

    path = Path.join(tb.dir, "bench-nat.rules")
    File.write!(path, rules)
    Cmd.run!(["/usr/sbin/ip", "netns", "exec", tb.pod_ns, "/usr/sbin/iptables-restore", "--noflush"], stdin: path)
  end

  defp unredirect(tb) do
    ipt = ["/usr/sbin/ip", "netns", "exec", tb.pod_ns, "/usr/sbin/iptables", "-t", "nat"]
    Cmd.run(ipt ++ ["-D", "OUTPUT", "-p", "tcp", "-j", "BENCH_NAT"], stderr: :discard)
    Cmd.run(ipt ++ ["-F", "BENCH_NAT"], stderr: :discard)
    Cmd.run(ipt ++ ["-X", "BENCH_NAT"], stderr: :discard)
  end

  defp await_listening!(ic, tcp, logs) do
    case Testbed.wait_listening(ic.tb, :pod, tcp: tcp, pids: [ic.pid], timeout: 30_000) do
      :ok ->
        :ok

      {:error, why} ->
        stop(ic)
        text = Enum.map_join(logs, "\n", &"--- #{&1}\n#{File.read(&1) |> elem(1)}")
        raise "#{ic.name} not listening (#{why}):\n#{text}"
    end
  end

  defp fresh_dir(tb, name) do
    dir = Path.join(tb.dir, "#{name}-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    File.chmod!(dir, 0o755)
    dir
  end
end
