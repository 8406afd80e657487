defmodule Condukt.Sandbox.Local.Network do
  # Debian's tools, never a user's shims.
  @path "/usr/sbin:/usr/bin:/sbin:/bin"
  # Every program the BEAM runs with its privileges for a session. Each is
  # looked up once, checked to be root's alone (TrustedPath), and run by
  # that path from then on. iptables-restore and ip6tables-restore are run
  # by netfilter-setup from beside iptables and ip6tables.
  @tools ~w(ip setpriv unshare mount mkdir iptables iptables-restore ip6tables ip6tables-restore sh env bash)

  @secrets_file "credentials.json"

  @schema [
    policy: [type: {:custom, &__MODULE__.check_policy/1}, required: true, doc: "the `%NetworkPolicy{}` to enforce."],
    session_id: [
      type: :string,
      default: "",
      doc: "the session id the sidecar reports (default: the namespace's name)."
    ],
    owner: [type: :any, doc: "the process whose exit tears the network down (default: the caller)."],
    uplink: [
      type: {:custom, &__MODULE__.check_uplink/1},
      default: :host,
      doc:
        "`:host` (a veth to the host, masqueraded out of it) or `{:netns, name}` " <>
          "(a veth into an existing namespace, e.g. a test's internet)."
    ],
    hosts: [
      type: {:custom, &__MODULE__.check_hosts/1},
      default: %{},
      doc: "extra `name => address` entries of the session's /etc/hosts (host names, IP literals)."
    ],
    dns: [
      type: {:custom, &__MODULE__.check_addresses/1},
      doc: "nameservers of the session (default: the host's, except loopback ones, which the namespace cannot reach)."
    ],
    allow_private: [
      type: {:list, :string},
      default: [],
      doc: "CIDRs of private upstream addresses the sidecar may connect to (`--allow-private`)."
    ],
    upstream_ca: [
      type: :string,
      doc: "an extra CA file the sidecar trusts for upstreams (`--upstream-extra-ca`, for test internets)."
    ],
    sidecar_uid: [type: :pos_integer, default: 1337, doc: "the uid the sidecar runs as."],
    user: [
      type: {:custom, &__MODULE__.check_user/1},
      default: 65_534,
      doc:
        "the uid (and gid) the session's commands run as, without supplementary groups. Never 0, the " <>
          "sidecar's uid or the BEAM's own: those could replace what the BEAM runs or read the sidecar's secrets."
    ],
    proxy_args: [type: {:list, :string}, default: [], doc: "more `condukt-egress proxy` flags."],
    credentials: [
      type: {:custom, &__MODULE__.check_credentials/1},
      doc:
        "a 0-arity function returning the values of the policy's secrets (`NetworkPolicy.Credentials.values/1`), " <>
          "written into a file only the sidecar's uid can read (`--credentials`); a function, so that no " <>
          "report of the network's process shows them."
    ],
    binary: [type: :string, doc: "the `condukt-egress` binary (default: priv/)."],
    tool_path: [
      type: :string,
      default: @path,
      doc:
        "where the programs the BEAM runs with its privileges (#{Enum.map_join(@tools, ", ", &"`#{&1}`")}) " <>
          "are looked up, once per session (a PATH-style list); each must be root's alone (see below)."
    ]
  ]

  @moduledoc """
  The network enforcement of `Condukt.Sandbox.Local` on Linux: a network
  namespace per session with the real egress sidecar in it, set up the way
  a Kubernetes pod has it (docs/local-network.md).

  ```
   host (or the uplink namespace)            session namespace condukt-<hex>
   ┌──────────────────────────┐   veth /30   ┌──────────────────────────────────┐
   │ ck<hex>  .1 ─────────────┼──────────────┼─ eth0 .2                          │
   │ (MASQUERADE when :host)  │              │  iptables: 80/443 → 15001, rest   │
   └──────────────────────────┘              │  rejected (netfilter-setup)       │
                                             │  condukt-egress proxy (uid 1337)  │
                                             │  the session's commands (no caps) │
                                             └──────────────────────────────────┘
  ```

  `start/1` creates the namespace and a veth pair to the uplink (the host,
  with masquerading, or a namespace you name), writes the session's
  `hosts` and `resolv.conf` under `/etc/netns/<name>/` (which `ip netns
  exec` mounts over `/etc`), mints a session CA and control token, applies
  `condukt-egress netfilter-setup` inside, and starts `condukt-egress
  proxy` there as its own uid with only CAP_NET_ADMIN (for the socket
  mark). Its secrets (CA key, token, policy) are readable by that uid only.

  Commands run through `wrap/2`: inside the namespace, each in a PID
  namespace of its own (no other process is visible or reachable, and none
  outlives the command) with an empty `/run` (no host service's socket),
  as an unprivileged uid (`:user`, by default
  65534, never root, the sidecar's uid or the BEAM's), with every
  capability dropped (no CAP_NET_ADMIN to flush the
  rules, no CAP_SYS_ADMIN to leave the namespace, no CAP_SETUID or DAC
  override to read the sidecar's secrets) and `no_new_privs` set. `env/1`
  gives them the CA variables, pointed at the trust bundle (Mozilla roots
  + session CA).

  Nothing the BEAM later runs or trusts is theirs to change: the programs
  it runs as root (`:tool_path`) and the sidecar binary and Mozilla roots
  it copies are checked once per session to be owned by root and writable
  by nobody else, along every directory and link of their path; the
  session's hosts and resolv.conf are root's, and the sidecar's events
  (the audit log) go to a directory only root can enter.

  The process owns the sidecar (a port on a small shell wrapper that
  terminates the proxy when the port closes, so a BEAM that dies takes the
  sidecar with it) and tears everything down in `stop/1` or when its owner
  exits. Namespaces left by a BEAM that was killed are swept by the next
  `start/1` on the machine.

  ## Options

  #{Condukt.Options.docs(@schema)}
  """

  use GenServer

  require Logger

  alias Condukt.Sandbox.Local.{NetworkError, TrustedPath}
  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.Capture
  alias Condukt.Sandbox.NetworkPolicy.TrustStore

  @proxy_port 15_001
  @mark "0x539"
  @state_dir "/run/condukt/local"
  @name_re ~r/^condukt-([0-9a-f]{10})$/
  # The proxy drains for 10 s on SIGTERM (docs/proxy.md); then it is killed.
  @stop_wait 15_000
  @ready_wait 15_000
  # What the BEAM needs, as bits of CapEff: CAP_NET_ADMIN (12) and
  # CAP_SYS_ADMIN (21) for the namespace, CAP_SETUID (7) and CAP_SETGID (6)
  # to run the sidecar and the commands as their uids, CAP_CHOWN (0) to
  # give the sidecar its secrets.
  @caps [{12, "CAP_NET_ADMIN"}, {21, "CAP_SYS_ADMIN"}, {7, "CAP_SETUID"}, {6, "CAP_SETGID"}, {0, "CAP_CHOWN"}]
  # Root's alone (0755 / 0700): the owner files the sweep trusts, and the
  # sidecar's events and stderr, out of reach of the session and of the
  # sidecar's uid (which owns @state_dir).
  @root_dir "/run/condukt"
  @owners_dir "/run/condukt/owners"
  @audit_dir "/run/condukt/audit"
  # How long one `condukt-egress ready` probe may take, and the pause
  # between probes while the sidecar starts.
  @probe_ms 1_000
  @probe_pause 20

  # Runs as root in the command's own mount namespace (unshare's, private)
  # before the privileges are dropped: an empty /run hides the host
  # services' Unix sockets (the system D-Bus, systemd-resolved's, nscd's,
  # databases'), which no network namespace covers, and which could make
  # requests from the host's network for the session. Only the session's
  # own directory (the trust bundle, the CA certificate) comes back, bound
  # from the hidden /run through the working directory. Programs are run
  # by absolute path: the caller's environment may name a PATH the session
  # can write. Any failure stops the command (exit 125) rather than run it
  # with /run visible.
  @hide_run ~S"""
  mount=$1; mkdir=$2; session=$3; shift 3
  here=$PWD
  cd "$session" || exit 125
  "$mount" -t tmpfs -o mode=0755,nosuid,nodev,noexec tmpfs /run || exit 125
  "$mkdir" -p "$session" || exit 125
  "$mount" --no-canonicalize --bind . "$session" || exit 125
  cd "$here" || exit 125
  exec "$@"
  """

  @doc false
  def __schema__, do: @schema

  @enforce_keys [:name, :dir]
  defstruct [
    :name,
    :dir,
    :session_id,
    :veth,
    :uplink,
    :subnet,
    :ca_cert,
    :bundle,
    :trust_store,
    :control,
    :token,
    :user,
    :proxy_pid,
    :events_log,
    :stderr_log,
    tools: %{},
    host_rules: []
  ]

  @typedoc "What a session needs to run commands behind the sidecar and to reach its control channel."
  @type t :: %__MODULE__{
          name: String.t(),
          dir: Path.t(),
          session_id: String.t(),
          veth: String.t() | nil,
          uplink: :host | {:netns, String.t()},
          subnet: {String.t(), String.t()} | nil,
          ca_cert: Path.t() | nil,
          bundle: Path.t() | nil,
          trust_store: Path.t() | nil,
          control: String.t() | nil,
          token: String.t() | nil,
          user: pos_integer() | nil,
          proxy_pid: pos_integer() | nil,
          events_log: Path.t() | nil,
          stderr_log: Path.t() | nil,
          tools: %{optional(String.t()) => Path.t()},
          host_rules: [[String.t()]]
        }

  ## Public API

  @doc """
  Whether this machine and this BEAM can enforce a policy: Linux, the
  capabilities, and the tools (`ip`, `setpriv`, `iptables`, …) in
  `opts[:tool_path]` (default: Debian's sbin and bin directories), each
  owned by root and writable by nobody else.
  """
  @spec available?(keyword()) :: :ok | {:error, NetworkError.t()}
  def available?(opts \\ []) do
    with {:ok, _tools} <- check(opts[:tool_path] || @path), do: :ok
  end

  defp check(path) do
    with :ok <- check_os(), :ok <- check_caps(), do: resolve_tools(path)
  end

  # Looks every tool up once and checks it is root's alone.
  defp resolve_tools(path) do
    Enum.reduce_while(@tools, {:ok, %{}}, fn tool, {:ok, acc} ->
      with exe when is_binary(exe) <- find_tool(tool, path),
           {:ok, exe} <- TrustedPath.check(exe) do
        {:cont, {:ok, Map.put(acc, tool, exe)}}
      else
        nil -> {:halt, {:error, %NetworkError{reason: :missing_tool, detail: tool}}}
        {:error, why} -> {:halt, {:error, %NetworkError{reason: :untrusted_path, detail: "`#{tool}`: #{why}"}}}
      end
    end)
  end

  @doc """
  Builds the session's network and starts its sidecar (options above).
  Returns the process and the `t:t/0` commands need.
  """
  @spec start(keyword()) :: {:ok, pid(), t()} | {:error, NetworkError.t()}
  def start(opts) do
    with {:ok, opts} <- validate(Keyword.put_new(opts, :owner, self())),
         {:ok, tools} <- check(opts[:tool_path]) do
      opts = Keyword.put(opts, :tools, tools)
      spec = %{id: __MODULE__, start: {GenServer, :start_link, [__MODULE__, opts]}, restart: :temporary}

      case DynamicSupervisor.start_child(Condukt.Sandbox.Local.NetworkSupervisor, spec) do
        {:ok, pid} -> {:ok, pid, GenServer.call(pid, :info)}
        {:error, {%NetworkError{} = error, _}} -> {:error, error}
        {:error, %NetworkError{} = error} -> {:error, error}
        {:error, other} -> {:error, %NetworkError{reason: :sidecar_failed, detail: inspect(other)}}
      end
    end
  end

  @doc """
  Replaces the value of one secret in the sidecar's file (the running
  sidecar gets it over the control channel; this copy is what a restart
  reads). `net` nil (the policy is not enforced): an error.
  """
  @spec rotate_credential(t() | nil, String.t(), String.t()) :: :ok | {:error, NetworkPolicy.Error.t()}
  def rotate_credential(nil, name, _value) do
    {:error,
     %NetworkPolicy.Error{
       reason: :rotation_failed,
       key: :secrets,
       value: name,
       detail: "the network policy is not enforced"
     }}
  end

  def rotate_credential(%__MODULE__{dir: dir}, name, value) do
    path = Path.join(dir, @secrets_file)

    with {:ok, text} <- File.read(path),
         %{"secrets" => values} <- decode(text) do
      # Truncated in place: the file keeps its owner and mode 0600.
      File.write!(path, NetworkPolicy.Credentials.sidecar_secrets_json(Map.put(values, name, value)))
    else
      _ ->
        {:error,
         %NetworkPolicy.Error{
           reason: :rotation_failed,
           key: :secrets,
           value: name,
           detail: "the sidecar's file is unreadable"
         }}
    end
  end

  defp decode(text) do
    Condukt.JSON.decode!(text)
  rescue
    _ -> nil
  end

  @doc "Tears the network down (sidecar drained, namespace deleted). Idempotent."
  @spec stop(pid()) :: :ok
  def stop(pid) do
    GenServer.stop(pid, :normal, @stop_wait + 10_000)
  catch
    :exit, _ -> :ok
  end

  @doc """
  The argv that runs `argv` inside the session's network namespace, in a
  PID namespace of its own (with its own `/proc`), as the session's uid
  (`:user`), without any capability or supplementary group. Environment
  is not touched: pass `env/1` along.

  The PID namespace keeps commands from seeing, signalling or tracing any
  process outside it (another session's with the same uid included), and
  when `argv` exits, everything it left in the namespace is killed. An IPC
  namespace keeps them from the host's System V and POSIX IPC objects, and
  a mount namespace gives them an empty `/run` (no host service's socket) with only
  the session's directory in it.
  """
  @spec wrap(t(), [String.t()]) :: [String.t()]
  def wrap(%__MODULE__{user: uid} = net, [_ | _] = argv) when is_integer(uid) do
    [net.tools["ip"], "netns", "exec", net.name] ++
      [net.tools["unshare"], "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc"] ++
      [net.tools["sh"], "-c", @hide_run, "condukt-hide-run", net.tools["mount"], net.tools["mkdir"], net.dir] ++
      [net.tools["setpriv"], "--reuid=#{uid}", "--regid=#{uid}"] ++
      ["--clear-groups", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"] ++ argv
  end

  @doc "The prefix `wrap/2` puts in front of a command."
  @spec prefix(t()) :: [String.t()]
  def prefix(%__MODULE__{} = net), do: net |> wrap(["x"]) |> Enum.drop(-1)

  @doc """
  The environment variables that make the session's clients trust the
  sidecar's CA: the six of `Condukt.Sandbox.NetworkPolicy.ca_env/1` and
  those of `Condukt.Sandbox.NetworkPolicy.TrustStore.env/3` (the JVM's
  PKCS#12 store, Deno, cargo, AWS), pointed at the session's files.
  """
  @spec env(t()) :: [{String.t(), String.t()}]
  def env(%__MODULE__{} = net), do: env(net, [])

  @doc """
  `env/1` followed by the caller's `env` (whose variables win), with one
  exception: a caller's `JAVA_TOOL_OPTIONS` is merged, its options first
  and the trust store's last (`TrustStore.java_tool_options/2`).
  """
  @spec env(t(), [{String.t(), String.t() | nil}]) :: [{String.t(), String.t() | nil}]
  def env(%__MODULE__{bundle: bundle, trust_store: store}, caller) do
    java = caller |> Enum.filter(&(elem(&1, 0) == "JAVA_TOOL_OPTIONS")) |> List.last({nil, nil}) |> elem(1)
    trust = TrustStore.env(bundle, store, java)
    NetworkPolicy.ca_env(bundle) ++ trust ++ caller ++ Enum.filter(trust, &(elem(&1, 0) == "JAVA_TOOL_OPTIONS"))
  end

  @doc "The sidecar's events written so far (its stdout, the audit trail of last resort), decoded."
  @spec events(t()) :: [map()]
  def events(%__MODULE__{events_log: path}) do
    case File.read(path) do
      {:ok, data} -> data |> String.split("\n", trim: true) |> Enum.map(&Condukt.JSON.decode!/1)
      {:error, _} -> []
    end
  end

  @doc """
  Removes the namespaces (and everything of theirs) that a BEAM which no
  longer runs left behind. `start/1` calls it; returns the names removed.
  """
  @spec sweep() :: [String.t()]
  def sweep do
    names = Enum.uniq(ls(@state_dir) ++ ls(@owners_dir))

    for name <- names, Regex.match?(@name_re, name), not owner_alive?(name) do
      net = read_owner(name)
      teardown(net)
      name
    end
  end

  ## GenServer

  @impl true
  def init(opts) do
    Process.flag(:trap_exit, true)
    sweep()
    owner = Keyword.fetch!(opts, :owner)
    ref = Process.monitor(owner)
    name = "condukt-" <> (:crypto.strong_rand_bytes(5) |> Base.encode16(case: :lower))

    net = %__MODULE__{
      name: name,
      dir: Path.join(@state_dir, name),
      session_id: if(opts[:session_id] == "", do: name, else: opts[:session_id]),
      uplink: opts[:uplink],
      user: opts[:user],
      tools: opts[:tools]
    }

    try do
      net = build!(net, opts)
      {port, net} = start_proxy!(net, opts)
      write_owner!(net)
      {:ok, %{net: net, port: port, owner: ref}}
    rescue
      e in NetworkError ->
        teardown(net)
        {:stop, e}
    end
  end

  @impl true
  def handle_call(:info, _from, state), do: {:reply, state.net, state}

  @impl true
  def handle_info({:DOWN, ref, :process, _, _}, %{owner: ref} = state), do: {:stop, :normal, state}

  def handle_info({port, {:exit_status, status}}, %{port: port} = state) do
    # The sidecar is gone: the namespace's rules still redirect 80/443 to
    # its port, so the session fails closed; say so once.
    Logger.error(
      "condukt: the egress sidecar of #{state.net.name} exited (status #{status}); " <>
        "the session's HTTP(S) now fails closed. #{tail(state.net.stderr_log)}"
    )

    {:noreply, %{state | port: nil}}
  end

  def handle_info({port, {:data, _}}, %{port: port} = state), do: {:noreply, state}
  def handle_info({:EXIT, _, _}, state), do: {:noreply, state}
  def handle_info(_other, state), do: {:noreply, state}

  @impl true
  def terminate(_reason, state) do
    if state.port, do: safe_close(state.port)
    teardown(state.net)
  end

  ## Building

  defp build!(net, opts) do
    # Both are copied and then run or trusted with the BEAM's privileges.
    bin = trusted!(opts[:binary] || Condukt.egress_binary(), "the sidecar binary")
    mozilla_src = trusted!(NetworkPolicy.CA.mozilla_path(), "the Mozilla roots")
    uid = opts[:sidecar_uid]
    root_dirs!()
    File.mkdir_p!(@state_dir)
    # The state directory and each session's belong to the sidecar's uid
    # (its control socket is made there), mode 0711: a session command,
    # never that uid nor root, can neither list them, read the secrets nor
    # rename anything in them. What the BEAM itself trusts later (owner
    # files, the audit log) is in root's @root_dir instead.
    File.chown!(@state_dir, uid)
    File.chmod!(@state_dir, 0o711)
    File.mkdir_p!(net.dir)

    copy = Path.join(net.dir, "condukt-egress")
    File.cp!(bin, copy)
    File.chmod!(copy, 0o755)
    mozilla = Path.join(net.dir, "mozilla.pem")
    File.cp!(mozilla_src, mozilla)

    policy = Path.join(net.dir, "policy.json")
    File.write!(policy, NetworkPolicy.to_sidecar_json(opts[:policy]))
    ca_cert = Path.join(net.dir, "ca.pem")
    ca_key = Path.join(net.dir, "ca.key")
    run!([copy, "ca", "new", "--cert", ca_cert, "--key", ca_key, "--common-name", "condukt session #{net.name}"])
    token = :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    token_file = Path.join(net.dir, "token")
    File.write!(token_file, token <> "\n")
    bundle = Path.join(net.dir, "trust-bundle.pem")
    File.write!(bundle, NetworkPolicy.CA.trust_bundle(File.read!(ca_cert)))
    store = Path.join(net.dir, TrustStore.file_name())
    File.write!(store, TrustStore.pkcs12(File.read!(ca_cert)))

    # The credentials' values: the file is the sidecar's alone before a
    # byte of a secret is written into it.
    secrets = Path.join(net.dir, @secrets_file)

    if opts[:credentials] do
      File.touch!(secrets)
      File.chmod!(secrets, 0o600)
      File.chown!(secrets, uid)
      File.write!(secrets, NetworkPolicy.Credentials.sidecar_secrets_json(opts[:credentials].()))
    end

    for f <- [ca_key, token_file, policy], do: File.chmod!(f, 0o600)
    for f <- [mozilla, ca_cert, bundle, store], do: File.chmod!(f, 0o644)
    for f <- [net.dir, ca_key, token_file, policy], do: File.chown!(f, uid)
    File.chmod!(net.dir, 0o711)

    net = %{
      net
      | ca_cert: ca_cert,
        bundle: bundle,
        trust_store: store,
        token: token,
        control: "unix:" <> Path.join(net.dir, "control.sock")
    }

    write_owner!(net)

    net
    |> make_namespace!(opts)
    |> tap(fn net ->
      run!(
        [net.tools["ip"], "netns", "exec", net.name, copy, "netfilter-setup", "--proxy-port", "#{@proxy_port}"] ++
          ["--mark", @mark, "--iptables", net.tools["iptables"], "--ip6tables", net.tools["ip6tables"]]
      )
    end)
  end

  defp make_namespace!(net, opts) do
    ip = net.tools["ip"]
    {gw, me} = subnet = pick_subnet!(ip, net.uplink)
    veth = "ck" <> String.replace_prefix(net.name, "condukt-", "")
    net = %{net | veth: veth, subnet: subnet}

    # `ip netns exec` mounts these over /etc for the session and the
    # sidecar: root's files in root's directories, which the session (never
    # root) cannot change.
    etc = Path.join("/etc/netns", net.name)
    File.mkdir_p!(etc)
    trusted!("/etc/netns", "/etc/netns")
    File.chmod!(etc, 0o755)
    File.write!(Path.join(etc, "hosts"), hosts_file(opts[:hosts]))
    File.write!(Path.join(etc, "resolv.conf"), resolv_file(opts[:dns] || host_nameservers(), gw))
    for f <- ~w(hosts resolv.conf), do: File.chmod!(Path.join(etc, f), 0o644)
    # The sidecar's own copy of the names (docs/dns.md): even if the
    # session could rewrite /etc/netns/<name>/hosts, the sidecar never
    # reads it.
    File.write!(Path.join(net.dir, "hosts"), hosts_file(opts[:hosts]))
    File.chmod!(Path.join(net.dir, "hosts"), 0o644)

    run!([ip, "netns", "add", net.name])
    # Recorded now, so that a failure below still removes the namespace.
    write_owner!(net)
    run!([ip, "-n", net.name, "link", "set", "lo", "up"])

    up = uplink_prefix(ip, net.uplink)
    run!(up ++ ["link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", net.name])
    run!(up ++ ["addr", "add", "#{gw}/30", "dev", veth])
    run!(up ++ ["link", "set", veth, "up"])
    run!([ip, "-n", net.name, "addr", "add", "#{me}/30", "dev", "eth0"])
    run!([ip, "-n", net.name, "link", "set", "eth0", "up"])
    run!([ip, "-n", net.name, "route", "add", "default", "via", gw])

    if net.uplink == :host, do: masquerade!(net), else: net
  end

  defp uplink_prefix(ip, :host), do: [ip]
  defp uplink_prefix(ip, {:netns, ns}), do: [ip, "-n", ns]

  # Traffic of the namespace leaves the host masqueraded; forwarding is
  # enabled for it. The rules carry the namespace's name as a comment and
  # are removed with it.
  defp masquerade!(net) do
    {gw, _} = net.subnet
    cidr = cidr30(gw)
    ipt = net.tools["iptables"]
    comment = ["-m", "comment", "--comment", "condukt:" <> net.name]

    rules = [
      ["-t", "nat", "POSTROUTING", "-s", cidr, "!", "-o", net.veth, "-j", "MASQUERADE"] ++ comment,
      ["-t", "filter", "FORWARD", "-i", net.veth, "-j", "ACCEPT"] ++ comment,
      ["-t", "filter", "FORWARD", "-o", net.veth, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED"] ++
        ["-j", "ACCEPT"] ++ comment
    ]

    File.write!("/proc/sys/net/ipv4/ip_forward", "1\n")

    Enum.reduce(rules, net, fn [flag_t, table, chain | spec], net ->
      run!([ipt, "-w", flag_t, table, "-I", chain | spec])
      net = %{net | host_rules: [[flag_t, table, chain | spec] | net.host_rules]}
      write_owner!(net)
      net
    end)
  end

  # A /30 from 100.127.0.0/16 (shared address space, RFC 6598, which hosts
  # rarely route) that no interface of the uplink uses yet.
  defp pick_subnet!(ip, uplink) do
    used = uplink_addresses(ip, uplink)

    Enum.find_value(1..64, fn _ ->
      n = :rand.uniform(16_383)
      base = {100, 127, div(n * 4, 256), rem(n * 4, 256)}
      gw = base |> put_elem(3, elem(base, 3) + 1) |> ip_string()
      me = base |> put_elem(3, elem(base, 3) + 2) |> ip_string()
      if Enum.any?(used, &(cidr30(&1) == cidr30(gw))), do: nil, else: {gw, me}
    end) || raise %NetworkError{reason: :command_failed, detail: {["pick a /30"], 1, "no free /30 in 100.127.0.0/16"}}
  end

  defp uplink_addresses(ip, uplink) do
    {out, _} = System.cmd(ip, tl(uplink_prefix(ip, uplink)) ++ ["-4", "-o", "addr", "show"])

    Regex.scan(~r/inet (\d+\.\d+\.\d+\.\d+)\//, out) |> Enum.map(fn [_, a] -> a end)
  end

  defp cidr30(addr) do
    {:ok, {a, b, c, d}} = :inet.parse_ipv4strict_address(String.to_charlist(addr))
    ip_string({a, b, c, Bitwise.band(d, 0xFC)}) <> "/30"
  end

  defp ip_string(tuple), do: tuple |> :inet.ntoa() |> to_string()

  defp hosts_file(extra) do
    {:ok, host} = :inet.gethostname()

    base = "127.0.0.1 localhost #{host}\n::1 localhost ip6-localhost ip6-loopback #{host}\n"

    extra
    |> Enum.sort()
    |> Enum.reduce(base, fn {name, addr}, acc -> acc <> "#{addr} #{name}\n" end)
  end

  # The resolvers the sidecar asks, given on its command line so that the
  # session's resolv.conf (which it may rewrite) never counts (docs/dns.md).
  # Scoped IPv6 addresses are left out (the proxy takes none); at most four.
  defp dns_upstream_args(opts, net) do
    {gw, _} = net.subnet

    case (opts[:dns] || host_nameservers()) |> Enum.reject(&String.contains?(&1, "%")) |> Enum.take(4) do
      [] -> ["--dns-upstream", gw]
      servers -> ["--dns-upstream", Enum.join(servers, ",")]
    end
  end

  defp resolv_file([], gw), do: "nameserver #{gw}\noptions timeout:1 attempts:1\n"
  defp resolv_file(servers, _gw), do: Enum.map_join(servers, "", &"nameserver #{&1}\n")

  defp host_nameservers do
    case File.read("/etc/resolv.conf") do
      {:ok, data} ->
        for [_, addr] <- Regex.scan(~r/^\s*nameserver\s+(\S+)/m, data),
            not String.starts_with?(addr, "127."),
            addr != "::1",
            do: addr

      {:error, _} ->
        []
    end
  end

  ## The sidecar

  defp start_proxy!(net, opts) do
    uid = opts[:sidecar_uid]
    bin = Path.join(net.dir, "condukt-egress")
    # The audit log and the sidecar's stderr are root's, in a directory
    # only root enters: the wrapper (root) opens them and the proxy
    # inherits the descriptors.
    {events, stderr} = audit_files(net.name)
    File.write!(events, "", [:exclusive])
    File.write!(stderr, "", [:exclusive])
    for f <- [events, stderr], do: File.chmod!(f, 0o600)

    args =
      ["proxy", "--policy", Path.join(net.dir, "policy.json"), "--ca-cert", net.ca_cert] ++
        ["--ca-key", Path.join(net.dir, "ca.key"), "--session-id", net.session_id] ++
        ["--token-file", Path.join(net.dir, "token"), "--control", net.control] ++
        ["--trust-bundle", Path.join(net.dir, "mozilla.pem"), "--mark", @mark] ++
        if(ca = opts[:upstream_ca], do: ["--upstream-extra-ca", ca], else: []) ++
        ["--hosts", Path.join(net.dir, "hosts")] ++
        dns_upstream_args(opts, net) ++
        Enum.flat_map(opts[:allow_private], &["--allow-private", &1]) ++
        Capture.sidecar_args(opts[:policy]) ++
        if(opts[:credentials], do: ["--credentials", Path.join(net.dir, @secrets_file)], else: []) ++
        opts[:proxy_args]

    argv =
      [net.tools["ip"], "netns", "exec", net.name, net.tools["setpriv"], "--reuid=#{uid}", "--regid=#{uid}"] ++
        ["--clear-groups", "--inh-caps=+net_admin", "--ambient-caps=+net_admin", "--"] ++
        [net.tools["env"], "-i", "PATH=#{@path}" | sanitizer_env()] ++ [bin | args]

    # The wrapper starts the proxy, prints its pid, and terminates it when
    # its standard input (the port) closes: when this process closes the
    # port, or when the BEAM dies. A background job's stdin is /dev/null
    # unless redirected, hence fd 3.
    script = ~S"""
    out=$1; err=$2; shift 2
    exec 3<&0 2>>"$err"
    "$@" </dev/null >>"$out" 2>>"$err" &
    child=$!
    echo "$child"
    { while read -r _; do :; done; kill -TERM "$child" 2>/dev/null; } <&3 &
    watcher=$!
    exec 3<&-
    wait "$child"
    status=$?
    kill "$watcher" 2>/dev/null
    exit "$status"
    """

    port =
      Port.open({:spawn_executable, net.tools["sh"]}, [
        :binary,
        :exit_status,
        args: ["-c", script, "sh", events, stderr | argv]
      ])

    pid =
      receive do
        {^port, {:data, data}} ->
          data |> String.trim() |> String.to_integer()

        {^port, {:exit_status, status}} ->
          raise %NetworkError{reason: :sidecar_failed, detail: "wrapper exited #{status}"}
      after
        5_000 -> raise %NetworkError{reason: :sidecar_failed, detail: "the wrapper did not start"}
      end

    net = %{net | proxy_pid: pid, events_log: events, stderr_log: stderr}
    write_owner!(net)
    probe = probe_argv(net, uid, bin)
    wait_ready!(port, net, probe, System.monotonic_time(:millisecond) + @ready_wait)
    {port, net}
  end

  # `condukt-egress ready` in the namespace, as the sidecar's uid without
  # any capability: it connects to both proxy listeners and the control
  # socket, and exits 0 once all three accept.
  defp probe_argv(net, uid, bin) do
    [net.tools["ip"], "netns", "exec", net.name, net.tools["setpriv"], "--reuid=#{uid}", "--regid=#{uid}"] ++
      ["--clear-groups", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--"] ++
      [bin, "ready", "--control", net.control, "--timeout-ms", "#{@probe_ms}"]
  end

  defp wait_ready!(port, net, [exe | args] = probe, deadline) do
    case System.cmd(exe, args, stderr_to_stdout: true, env: [{"PATH", @path}]) do
      {_, 0} ->
        :ok

      {out, _} ->
        if System.monotonic_time(:millisecond) > deadline do
          raise %NetworkError{
            reason: :sidecar_failed,
            detail: "not ready after 15 s (#{String.trim(out)}): " <> File.read!(net.stderr_log)
          }
        end

        receive do
          {^port, {:exit_status, _}} ->
            raise %NetworkError{reason: :sidecar_failed, detail: File.read!(net.stderr_log)}
        after
          @probe_pause -> wait_ready!(port, net, probe, deadline)
        end
    end
  end

  # The sanitizer build of the tests reports through these.
  defp sanitizer_env do
    for var <- ~w(ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS), value = System.get_env(var), do: "#{var}=#{value}"
  end

  ## Teardown

  defp safe_close(port) do
    Port.close(port)
  catch
    :error, _ -> :ok
  end

  # Undoes whatever of `build!` happened; safe on a half-built network and
  # when run twice.
  defp teardown(%__MODULE__{} = net) do
    # The tools checked at start (an owner file keeps them); a network
    # swept without one checks Debian's again.
    tools = if net.tools in [nil, %{}], do: fallback_tools(), else: net.tools
    sh = tools["sh"]

    if pid = net.proxy_pid do
      if alive?(pid), do: signal(sh, "TERM", ["#{pid}"])

      unless wait_dead(pid, System.monotonic_time(:millisecond) + @stop_wait) do
        signal(sh, "KILL", ["#{pid}"])
      end
    end

    ip = tools["ip"]

    if ip && net.name in namespaces(ip) do
      {pids, _} = System.cmd(ip, ["netns", "pids", net.name], stderr_to_stdout: true)
      pids = String.split(pids, ~r/\s+/, trim: true)
      if pids != [], do: signal(sh, "KILL", pids)
      System.cmd(ip, ["netns", "del", net.name], stderr_to_stdout: true)
    end

    # The host end of the veth pair goes with the namespace's end; a
    # namespace uplink's too. The host rules do not.
    ipt = tools["iptables"]

    for [flag_t, table, chain | spec] <- net.host_rules, ipt do
      System.cmd(ipt, ["-w", flag_t, table, "-D", chain | spec], stderr_to_stdout: true)
    end

    File.rm_rf(Path.join("/etc/netns", net.name))
    File.rm_rf(net.dir)
    {events, stderr} = audit_files(net.name)
    File.rm(events)
    File.rm(stderr)
    File.rm(owner_file(net.name))
    :ok
  end

  defp fallback_tools do
    case resolve_tools(@path) do
      {:ok, tools} -> tools
      {:error, _} -> %{}
    end
  end

  # kill(1) as the shell's builtin, so that no program is looked up.
  defp signal(nil, _sig, _pids), do: :ok
  defp signal(sh, sig, pids), do: System.cmd(sh, ["-c", ~s(kill -s #{sig} "$@"), "kill" | pids], stderr_to_stdout: true)

  defp wait_dead(pid, deadline) do
    cond do
      not alive?(pid) -> true
      System.monotonic_time(:millisecond) > deadline -> false
      true -> Process.sleep(20) && wait_dead(pid, deadline)
    end
  end

  defp alive?(pid), do: File.exists?("/proc/#{pid}")

  defp namespaces(ip) do
    {out, _} = System.cmd(ip, ["netns", "list"], stderr_to_stdout: true)
    out |> String.split("\n", trim: true) |> Enum.map(&(&1 |> String.split(" ") |> hd()))
  end

  ## Owner files: which BEAM made which namespace, for sweep/0.

  defp owner_file(name), do: Path.join(@owners_dir, name)

  defp audit_files(name),
    do: {Path.join(@audit_dir, name <> ".events.ndjson"), Path.join(@audit_dir, name <> ".stderr")}

  defp write_owner!(net) do
    data = :erlang.term_to_binary({System.pid(), boot_id(), net})
    File.write!(owner_file(net.name), data)
    File.chmod!(owner_file(net.name), 0o600)
  end

  # /run/condukt (0755) and its owners and audit directories (0700), all
  # root's: what the sweep trusts and the audit log live there, away from
  # the session and from the sidecar's uid.
  defp root_dirs! do
    for {dir, mode} <- [{@root_dir, 0o755}, {@owners_dir, 0o700}, {@audit_dir, 0o700}] do
      File.mkdir_p!(dir)
      File.chown!(dir, 0)
      File.chgrp!(dir, 0)
      File.chmod!(dir, mode)
    end

    trusted!(@audit_dir, @audit_dir)
    trusted!(@owners_dir, @owners_dir)
  end

  defp trusted!(path, what) do
    case TrustedPath.check(path) do
      {:ok, path} -> path
      {:error, why} -> raise %NetworkError{reason: :untrusted_path, detail: "#{what}: #{why}"}
    end
  end

  defp read_owner(name) do
    with {:ok, data} <- File.read(owner_file(name)),
         {_, _, %__MODULE__{name: ^name} = net} <- decode_owner(data) do
      net
    else
      _ -> %__MODULE__{name: name, dir: Path.join(@state_dir, name)}
    end
  end

  defp owner_alive?(name) do
    # Owner files used to live in @state_dir/owners: a namespace of an
    # older Condukt on this machine is only looked at, never trusted for
    # teardown (read_owner/1 reads root's directory only).
    found =
      with {:error, _} <- File.read(owner_file(name)),
           do: File.read(Path.join([@state_dir, "owners", name]))

    case found do
      {:ok, data} ->
        case decode_owner(data) do
          {os_pid, boot, _net} -> boot == boot_id() and beam_alive?(os_pid)
          nil -> false
        end

      {:error, _} ->
        # Created moments ago by a BEAM that has not written its owner file
        # yet, or left without one: only the second is old.
        case File.stat(Path.join(@state_dir, name), time: :posix) do
          {:ok, %{mtime: mtime}} -> System.os_time(:second) - mtime < 60
          {:error, _} -> false
        end
    end
  end

  defp decode_owner(data) do
    case :erlang.binary_to_term(data, [:safe]) do
      # System.pid/0 is a string; any pid-like term is only interpolated.
      {os_pid, boot, net} when (is_binary(os_pid) or is_integer(os_pid)) and is_binary(boot) -> {os_pid, boot, net}
      _ -> nil
    end
  rescue
    ArgumentError -> nil
  end

  defp beam_alive?(os_pid) do
    case File.read("/proc/#{os_pid}/cmdline") do
      {:ok, cmd} -> cmd =~ "beam"
      {:error, _} -> false
    end
  end

  defp boot_id do
    case File.read("/proc/sys/kernel/random/boot_id") do
      {:ok, id} -> String.trim(id)
      {:error, _} -> ""
    end
  end

  defp ls(dir) do
    case File.ls(dir) do
      {:ok, names} -> names
      {:error, _} -> []
    end
  end

  ## Checks and helpers

  defp check_os do
    case :os.type() do
      {:unix, :linux} -> :ok
      other -> {:error, %NetworkError{reason: :unsupported_os, detail: other}}
    end
  end

  defp check_caps do
    with {:ok, status} <- File.read("/proc/self/status"),
         [_, hex] <- Regex.run(~r/^CapEff:\s*([0-9a-f]+)/m, status) do
      eff = String.to_integer(hex, 16)
      missing = for {bit, cap} <- @caps, Bitwise.band(eff, Bitwise.bsl(1, bit)) == 0, do: cap
      if missing == [], do: :ok, else: {:error, %NetworkError{reason: :not_privileged, detail: missing}}
    else
      _ -> {:error, %NetworkError{reason: :not_privileged, detail: Enum.map(@caps, &elem(&1, 1))}}
    end
  end

  defp find_tool(name, path) do
    Enum.find_value(String.split(path, ":", trim: true), fn dir ->
      exe = Path.join(dir, name)
      if File.regular?(exe), do: exe
    end)
  end

  defp run!([exe | args] = argv) do
    case System.cmd(exe, args, stderr_to_stdout: true, env: [{"PATH", @path}]) do
      {_, 0} -> :ok
      {out, status} -> raise %NetworkError{reason: :command_failed, detail: {argv, status, out}}
    end
  end

  defp tail(nil), do: ""

  defp tail(path) do
    case File.read(path) do
      {:ok, data} -> "Its last words: " <> (data |> String.split("\n", trim: true) |> Enum.take(-5) |> Enum.join(" | "))
      {:error, _} -> ""
    end
  end

  defp validate(opts) do
    case Condukt.Options.validate(opts, @schema) do
      {:ok, opts} -> check_user_uid(opts)
      {:error, error} -> {:error, %NetworkError{reason: :invalid_option, detail: Condukt.Options.format_error(error)}}
    end
  end

  # The uids a session must never have besides root (check_user/1): the
  # sidecar's, which can read the control token and the CA key and so
  # answer decisions, and the BEAM's, which owns what the BEAM runs.
  defp check_user_uid(opts) do
    user = opts[:user]

    cond do
      user == opts[:sidecar_uid] ->
        {:error,
         %NetworkError{
           reason: :invalid_option,
           detail:
             ":user #{user} is the sidecar's uid: a session running as it could read the control token " <>
               "and the CA key and answer its own decisions; pick another uid"
         }}

      user == beam_uid() ->
        {:error,
         %NetworkError{
           reason: :invalid_option,
           detail:
             ":user #{user} is the BEAM's own uid: a session running as it could change what the BEAM " <>
               "runs and its audit log; pick another uid"
         }}

      true ->
        {:ok, opts}
    end
  end

  @doc """
  The BEAM's effective uid (from `/proc/self/status`; `nil` where that
  cannot be read).
  """
  @spec beam_uid() :: non_neg_integer() | nil
  def beam_uid do
    with {:ok, status} <- File.read("/proc/self/status"),
         [_, _real, effective] <- Regex.run(~r/^Uid:\s+(\d+)\s+(\d+)/m, status) do
      String.to_integer(effective)
    else
      _ -> nil
    end
  end

  @doc false
  def check_user(0),
    do:
      {:error,
       "a uid other than 0: uid 0 owns the host's root files, so a session running as it could replace " <>
         "the programs the BEAM runs as root, its audit log and the session's hosts file"}

  def check_user(uid) when is_integer(uid) and uid > 0 and uid < 4_294_967_295, do: :ok
  def check_user(_), do: {:error, "a uid (a positive integer)"}

  @doc false
  def check_policy(%NetworkPolicy{}), do: :ok
  def check_policy(_), do: {:error, "a %Condukt.Sandbox.NetworkPolicy{}"}

  @doc false
  def check_addresses(list) when is_list(list) do
    if Enum.all?(list, &ip?/1),
      do: :ok,
      else: {:error, "a list of IP address strings"}
  end

  def check_addresses(_), do: {:error, "a list of IP address strings"}

  @doc false
  def check_credentials(fun) when is_function(fun, 0), do: :ok
  def check_credentials(_), do: {:error, "a 0-arity function returning the secrets' values"}

  # Each entry becomes one line of /etc/netns/<name>/hosts: nothing but a
  # host name and an IP literal may reach it (no spaces, no newlines).
  @doc false
  def check_hosts(hosts) when is_map(hosts) do
    if Enum.all?(hosts, fn {name, addr} -> host_name?(name) and ip?(addr) end),
      do: :ok,
      else: {:error, "a map of host name => IP address strings"}
  end

  def check_hosts(_), do: {:error, "a map of host name => IP address strings"}

  defp host_name?(name), do: is_binary(name) and Regex.match?(~r/\A[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})\z/, name)
  defp ip?(addr), do: is_binary(addr) and match?({:ok, _}, :inet.parse_strict_address(String.to_charlist(addr)))

  @doc false
  def check_uplink(:host), do: :ok
  def check_uplink({:netns, name}) when is_binary(name), do: :ok
  def check_uplink(_), do: {:error, ":host or {:netns, name}"}
end
