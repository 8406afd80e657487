defmodule Condukt.Dev.Netns.Testbed do
  @moduledoc false
  # A two-namespace end-to-end testbed: a "pod" (where the workspace's
  # clients, and later the sidecar, run) and an "inet" (the internet: nginx,
  # a few small Python servers), joined by one veth pair, with IPv4 and
  # IPv6. docs/e2e-testbed.md has the diagram, the names, the addresses and
  # the endpoints.
  #
  # Life cycle: `start/1` builds everything and registers `stop/1` with
  # ExUnit's on_exit, so a failing test still cleans up; `stop/1` is
  # idempotent and needs nothing but the struct. Names are unique per
  # testbed ("ce-<6 hex>-pod"), so parallel runs never collide; a crashed
  # run's leftovers are swept by the next `start/1` (owner files under
  # /run/condukt-netns say which VM made what, and a namespace whose owner
  # is gone is removed with whatever still runs in it).
  #
  # Nothing here changes the host's own network: the veth pair is created
  # directly inside the two namespaces and no address or route is added
  # outside them.

  alias Condukt.Dev.Netns.{Client, Cmd, Nginx, Pki, Registries, Tier}

  @enforce_keys [:id, :pod_ns, :inet_ns, :dir]
  defstruct [
    :id,
    :pod_ns,
    :inet_ns,
    :dir,
    :bin_dir,
    :pod,
    :inet,
    :names,
    :hosts,
    :pki,
    :ca_cert,
    :big_file,
    :git,
    :registries,
    :ports,
    :logs,
    :urls,
    pids: [],
    keep_dir: false
  ]

  @type ns :: :pod | :inet
  @type t :: %__MODULE__{}

  # The names every client can reach, served by the main certificate.
  @names ~w(allowed.test denied.test decide.test other.test ws.test git.test)
  # Served too, on purpose with a bad certificate.
  @bad_tls_names ~w(mismatch.test untrusted.test)
  # The package registries (Registries), with the main certificate.
  @registry_names ~w(registry.test)
  @ports %{http: 80, https: 443, backend: 8081, git: 8082, ws: 8083, bypass_tcp: 8080, bypass_udp: 443}
  @metadata "169.254.169.254"
  @decoy "192.0.2.80"
  @big_size 100 * 1024 * 1024
  @owner_dir "/run/condukt-netns"
  @ns_re ~r/^ce-([0-9a-f]{6})-(pod|inet)$/
  # The PATH every command in a namespace gets: Debian's tools, never a
  # user's shims (pyenv, nvm).
  @path "/usr/sbin:/usr/bin:/sbin:/bin"

  @doc "The names served with the main certificate."
  def names, do: @names

  @doc """
  Builds a testbed and returns its struct.

  Options:
    * `:on_exit` — register `stop/1` with `ExUnit.Callbacks.on_exit/1`
      (default true; needs a test or setup_all process);
    * `:sweep` — remove leftovers of dead runs first (default true);
    * `:v4_prefix` — the /24 of the veth link (default "10.233.0": inet is
      .1, pod is .2);
    * `:v6_prefix` — the /64 of the veth link (default "fd00:ce::": inet is
      ::1, pod is ::2);
    * `:big_size` — size of /big.bin (default 100 MiB);
    * `:keep_dir` — keep the temporary directory (logs) after stop
      (default: env CONDUKT_NETNS_KEEP=1).
  """
  @spec start(keyword()) :: t()
  def start(opts \\ []) do
    if Keyword.get(opts, :sweep, true), do: sweep()

    id = :crypto.strong_rand_bytes(3) |> Base.encode16(case: :lower)
    dir = Path.join(System.tmp_dir!(), "condukt-netns-#{id}")
    v4 = Keyword.get(opts, :v4_prefix, "10.233.0")
    v6 = Keyword.get(opts, :v6_prefix, "fd00:ce::")

    tb = %__MODULE__{
      id: id,
      pod_ns: "ce-#{id}-pod",
      inet_ns: "ce-#{id}-inet",
      dir: dir,
      bin_dir: Path.join(dir, "bin"),
      pod: %{v4: "#{v4}.2", v6: "#{v6}2", ifname: "eth0"},
      inet: %{v4: "#{v4}.1", v6: "#{v6}1", ifname: "eth0", metadata: @metadata, decoy: @decoy},
      names: @names,
      ports: @ports,
      keep_dir: Keyword.get(opts, :keep_dir, System.get_env("CONDUKT_NETNS_KEEP") == "1")
    }

    tb = %{tb | hosts: hosts_map(tb)}
    write_owner!(tb)

    if Keyword.get(opts, :on_exit, true) do
      ExUnit.Callbacks.on_exit({__MODULE__, id}, fn -> stop(tb) end)
    end

    try do
      tb
      |> make_dirs!()
      |> make_namespaces!()
      |> make_pki!()
      |> make_content!(Keyword.get(opts, :big_size, @big_size))
      |> make_git_repo!()
      |> start_servers!()
    rescue
      e ->
        stop(tb)
        reraise e, __STACKTRACE__
    end
  end

  @doc """
  Stops everything the testbed started and removes what it made: kills
  every process still inside its namespaces, deletes them, removes
  /etc/netns/<ns>, the owner file and (unless kept) the directory.
  Idempotent; returns :ok.
  """
  @spec stop(t()) :: :ok
  def stop(%__MODULE__{} = tb) do
    ip = Tier.tool!("ip")
    namespaces = [tb.pod_ns, tb.inet_ns]
    # Deleting a namespace does not end the processes inside it, so they go
    # first. Only what `ip netns pids` finds is signalled (never tb.pids
    # again on a second stop: those numbers may belong to others by then).
    Cmd.kill(Enum.flat_map(namespaces, &ns_pids/1))

    for ns <- namespaces do
      if ns in list_namespaces(), do: Cmd.run([ip, "netns", "del", ns], timeout: 10_000)
      File.rm_rf!(Path.join("/etc/netns", ns))
    end

    File.rm(owner_file(tb.id))
    unless tb.keep_dir, do: File.rm_rf!(tb.dir)
    :ok
  end

  @doc "The namespaces `ip netns list` shows (names only)."
  @spec list_namespaces() :: [String.t()]
  def list_namespaces do
    {out, 0} = Cmd.run([Tier.tool!("ip"), "netns", "list"], timeout: 10_000)
    out |> String.split("\n", trim: true) |> Enum.map(&(&1 |> String.split(" ") |> hd()))
  end

  @doc """
  Removes the leftovers of testbeds whose owning VM is gone: namespaces
  named ce-<6 hex>-pod/inet (and the processes inside them),
  /etc/netns/<ns> directories, owner files and temporary directories.
  Testbeds of live VMs (a parallel run) are left alone.
  """
  @spec sweep() :: :ok
  def sweep do
    ids =
      (list_namespaces() ++ ls("/etc/netns"))
      |> Enum.flat_map(fn ns ->
        case Regex.run(@ns_re, ns) do
          [_, id, _] -> [id]
          nil -> []
        end
      end)
      |> Kernel.++(ls(@owner_dir))
      |> Enum.uniq()

    for id <- ids, not owner_alive?(id) do
      stop(%__MODULE__{
        id: id,
        pod_ns: "ce-#{id}-pod",
        inet_ns: "ce-#{id}-inet",
        dir: Path.join(System.tmp_dir!(), "condukt-netns-#{id}")
      })
    end

    :ok
  end

  @doc "The namespace name of `:pod` or `:inet`."
  @spec ns_name(t(), ns()) :: String.t()
  def ns_name(tb, :pod), do: tb.pod_ns
  def ns_name(tb, :inet), do: tb.inet_ns

  @doc """
  The environment variables that make every supported client trust the CA
  bundle at `path` (the six of the seeds).
  """
  @spec ca_env(Path.t()) :: [{String.t(), String.t()}]
  def ca_env(path), do: Condukt.Sandbox.NetworkPolicy.ca_env(path)

  @doc """
  The argv that runs `argv` inside namespace `ns`, under a clean
  environment (PATH of Debian's tools, HOME, LANG, plus `:env`), as
  `:uid`/`:gid` when given (setpriv, supplementary groups cleared). Use it
  to open your own Port; `exec_in/4` runs it under a deadline.

  Options: `:env` (list or map of name => value), `:ca` (a CA bundle path:
  adds `ca_env/1`), `:uid`, `:gid` (default: the uid), `:home`.
  """
  @spec command(t(), ns(), [String.t()], keyword()) :: [String.t()]
  def command(tb, ns, [_ | _] = argv, opts \\ []) do
    uid = opts[:uid]

    user =
      if uid,
        do: [Tier.tool!("setpriv"), "--reuid=#{uid}", "--regid=#{opts[:gid] || uid}", "--clear-groups", "--"],
        else: []

    home = opts[:home] || if(uid, do: Path.join(tb.dir, "home"), else: "/root")
    ca = if path = opts[:ca], do: ca_env(path), else: []
    env = [{"PATH", @path}, {"HOME", home}, {"LANG", "C.UTF-8"}] ++ ca ++ Enum.to_list(opts[:env] || [])

    [Tier.tool!("ip"), "netns", "exec", ns_name(tb, ns)] ++
      user ++ ["/usr/bin/env", "-i"] ++ Enum.map(env, fn {k, v} -> "#{k}=#{v}" end) ++ argv
  end

  @doc """
  Runs `argv` inside namespace `ns` and returns `{output, exit_status}`;
  exit status 124 means the deadline passed and it was killed. Options:
  those of `command/4`, plus `:timeout` (ms, default 30 s), `:stdin`,
  `:stderr` (see `Condukt.Dev.Netns.Cmd.run/2`).
  """
  @spec exec_in(t(), ns(), [String.t()], keyword()) :: Cmd.result()
  def exec_in(tb, ns, argv, opts \\ []) do
    Cmd.run(command(tb, ns, argv, opts), Keyword.take(opts, [:timeout, :stdin, :stderr]))
  end

  @doc """
  Starts a long-lived process in namespace `ns` (options of `command/4`),
  output appended to `log` (default: a file named after the program in the
  testbed's log directory). Returns its OS pid; `stop/1` kills it with
  everything else in the namespaces, or call `Cmd.kill/1` yourself.
  """
  @spec spawn_in(t(), ns(), [String.t()], keyword()) :: pos_integer()
  def spawn_in(tb, ns, argv, opts \\ []) do
    log =
      opts[:log] || Path.join([tb.dir, "logs", "#{Path.basename(hd(argv))}-#{System.unique_integer([:positive])}.log"])

    Cmd.spawn_daemon(command(tb, ns, argv, opts), log)
  end

  @doc "Runs an HTTP client in the pod; see `Condukt.Dev.Netns.Client.run/4`."
  defdelegate client(tb, client, url, opts \\ []), to: Client, as: :run

  @doc "The JSON lines the bypass listeners (TCP 8080, UDP 443) recorded, decoded."
  @spec bypass_log(t()) :: [map()]
  def bypass_log(tb), do: json_lines(tb.logs.bypass)

  @doc "nginx's access log (one map per request: host, sni, alpn, protocol, status, ...)."
  @spec access_log(t()) :: [map()]
  def access_log(tb), do: json_lines(tb.logs.nginx_access)

  @doc """
  Writes a deterministic file of `size` bytes under the testbed's
  directory (readable by any uid) and returns `{path, sha256_hex}`.
  """
  @spec make_file(t(), String.t(), non_neg_integer()) :: {Path.t(), String.t()}
  def make_file(tb, name, size) do
    path = Path.join([tb.dir, "files", name])
    {path, write_pattern!(path, size, name)}
  end

  @doc """
  A directory under the testbed's that `uid` may write (a clone target, a
  client's scratch space).
  """
  @spec scratch_dir(t(), non_neg_integer() | nil) :: Path.t()
  def scratch_dir(tb, uid \\ nil) do
    path = Path.join([tb.dir, "scratch", "#{System.unique_integer([:positive])}"])
    File.mkdir_p!(path)
    if uid, do: File.chown!(path, uid), else: :ok
    path
  end

  ## Building

  defp hosts_map(tb) do
    both = Map.new(@names ++ @bad_tls_names ++ @registry_names, &{&1, [tb.inet.v4, tb.inet.v6]})

    Map.merge(both, %{
      "v4.test" => [tb.inet.v4],
      "v6.test" => [tb.inet.v6],
      "metadata.test" => [@metadata],
      "pod.test" => [tb.pod.v4, tb.pod.v6]
    })
  end

  defp make_dirs!(tb) do
    for sub <- ~w(bin logs files scratch home git pki www nginx nginx/tmp) do
      File.mkdir_p!(Path.join(tb.dir, sub))
    end

    # Clients may run as another uid (setpriv): the tree is world-readable,
    # and home, scratch and the call directories world-writable.
    File.chmod!(tb.dir, 0o755)
    for sub <- ~w(home scratch), do: File.chmod!(Path.join(tb.dir, sub), 0o1777)

    src = Path.expand(".", __DIR__)

    for sub <- ~w(clients servers), file <- File.ls!(Path.join(src, sub)), Path.extname(file) in [".py", ".js"] do
      File.cp!(Path.join([src, sub, file]), Path.join(tb.bin_dir, file))
    end

    %{
      tb
      | logs: %{
          dir: Path.join(tb.dir, "logs"),
          nginx_access: Path.join(tb.dir, "nginx/access.log"),
          nginx_error: Path.join(tb.dir, "nginx/error.log"),
          bypass: Path.join(tb.dir, "logs/bypass.jsonl")
        }
    }
  end

  defp make_namespaces!(tb) do
    ip = Tier.tool!("ip")
    run = fn args -> Cmd.run!([ip | args], timeout: 10_000) end

    for ns <- [tb.pod_ns, tb.inet_ns] do
      etc = Path.join("/etc/netns", ns)
      File.mkdir_p!(etc)
      # `ip netns exec` bind-mounts every file here over /etc/<file>.
      File.write!(Path.join(etc, "hosts"), hosts_file(tb))
      # No DNS server answers there (names come from the hosts file), so a
      # stray query should fail within a second rather than five.
      File.write!(
        Path.join(etc, "resolv.conf"),
        "nameserver #{tb.inet.v4}\nnameserver #{tb.inet.v6}\noptions timeout:1 attempts:1\n"
      )

      run.(["netns", "add", ns])
      run.(["-n", ns, "link", "set", "lo", "up"])
    end

    {pod, inet} = {tb.pod_ns, tb.inet_ns}
    run.(["link", "add", "eth0", "netns", pod, "type", "veth", "peer", "name", "eth0", "netns", inet])

    for {ns, me} <- [{pod, tb.pod}, {inet, tb.inet}] do
      run.(["-n", ns, "addr", "add", "#{me.v4}/24", "dev", "eth0"])
      # nodad: the address is usable at once, not after duplicate detection.
      run.(["-n", ns, "addr", "add", "#{me.v6}/64", "dev", "eth0", "nodad"])
      run.(["-n", ns, "link", "set", "eth0", "up"])
    end

    # Everything the pod sends off-link goes to inet, as to a default
    # gateway; inet also owns the metadata and decoy addresses.
    run.(["-n", pod, "route", "add", "default", "via", tb.inet.v4])
    run.(["-n", pod, "-6", "route", "add", "default", "via", tb.inet.v6])
    run.(["-n", inet, "addr", "add", "#{@metadata}/32", "dev", "lo"])
    run.(["-n", inet, "addr", "add", "#{@decoy}/32", "dev", "lo"])

    # The veth carrier comes up asynchronously.
    :ok =
      Cmd.poll(
        fn ->
          {out, _} = Cmd.run([ip, "-n", pod, "-o", "link", "show", "eth0"], timeout: 5_000)
          String.contains?(out, "LOWER_UP") and not String.contains?(out, "NO-CARRIER")
        end,
        5_000
      )

    tb
  end

  @doc """
  The pod's hosts file as the testbed writes it to /etc/netns/<pod>/hosts
  (the sidecar gets its own copy, `proxy --hosts`, docs/dns.md).
  """
  @spec hosts_file(t()) :: String.t()
  def hosts_file(tb) do
    by_addr =
      tb.hosts
      |> Enum.flat_map(fn {name, addrs} -> Enum.map(addrs, &{&1, name}) end)
      |> Enum.group_by(&elem(&1, 0), &elem(&1, 1))
      |> Enum.sort()
      |> Enum.map_join("\n", fn {addr, names} -> "#{addr} #{Enum.join(Enum.sort(names), " ")}" end)

    # The machine's own hostname stays resolvable from the file: some
    # libraries resolve it at start-up (libcurl's SASL, through libldap),
    # and without it every such lookup goes to the (absent) DNS server.
    {:ok, host} = :inet.gethostname()

    "127.0.0.1 localhost #{host}\n::1 localhost ip6-localhost ip6-loopback #{host}\n" <> by_addr <> "\n"
  end

  defp make_pki!(tb) do
    dns = @names ++ @registry_names ++ ~w(v4.test v6.test metadata.test)
    ips = [tb.inet.v4, tb.inet.v6, @metadata, @decoy]
    pki = Pki.generate!(Path.join(tb.dir, "pki"), dns, ips, label: tb.id)
    %{tb | pki: pki, ca_cert: pki.ca_cert}
  end

  defp make_content!(tb, big_size) do
    www = Path.join(tb.dir, "www")
    sites = @names ++ @bad_tls_names ++ @registry_names ++ ~w(v4.test v6.test)

    for site <- sites do
      File.mkdir_p!(Path.join(www, site))
      File.write!(Path.join([www, site, "index.txt"]), "hello from #{site}\n")
    end

    File.mkdir_p!(Path.join(www, "default"))
    File.write!(Path.join([www, "default", "index.txt"]), "hello from the default server\n")

    registries = Registries.build!(Path.join(www, Registries.host()))
    %{tb | big_file: big_file!(big_size), urls: urls(tb), registries: registries}
  end

  defp urls(tb) do
    %{
      hello: &"https://#{&1}/",
      big: "https://allowed.test/big.bin",
      upload: "https://allowed.test/upload",
      echo: "https://allowed.test/echo",
      chunked: "https://allowed.test/chunked?n=20&size=4096",
      headers: "https://allowed.test/headers",
      no_content: "https://allowed.test/204",
      redirect: "https://allowed.test/redirect",
      ws: "wss://ws.test/ws",
      git: "https://git.test/repo.git",
      metadata: "http://#{@metadata}/",
      decoy: "http://#{@decoy}/",
      inet_v4: tb.inet.v4,
      inet_v6: tb.inet.v6
    }
  end

  # The big file is the same for every run (an AES-CTR keystream of a fixed
  # key), so it is made once per machine and shared by every testbed.
  defp big_file!(size) do
    cache = Path.join(System.tmp_dir!(), "condukt-netns-cache")
    File.mkdir_p!(cache)
    File.chmod!(cache, 0o755)
    path = Path.join(cache, "big-v1-#{size}.bin")
    sha_path = path <> ".sha256"

    sha =
      with {:ok, %{size: ^size}} <- File.stat(path),
           {:ok, sha} <- File.read(sha_path) do
        sha
      else
        _ ->
          # Written under a private name, then renamed: a parallel run sees
          # either no file or a whole one.
          tmp = "#{path}.#{System.unique_integer([:positive])}.tmp"
          sha = write_pattern!(tmp, size, "big-v1")
          File.write!(sha_path <> ".tmp", sha)
          File.rename!(tmp, path)
          File.rename!(sha_path <> ".tmp", sha_path)
          sha
      end

    %{path: path, size: size, sha256: sha, url_path: "/big.bin"}
  end

  # Deterministic bytes from a seed name: AES-128-CTR over zeros, written in
  # 1 MiB blocks and hashed on the way.
  defp write_pattern!(path, size, seed) do
    File.mkdir_p!(Path.dirname(path))
    key = :crypto.hash(:sha256, seed) |> binary_part(0, 16)
    state = :crypto.crypto_init(:aes_128_ctr, key, <<0::128>>, true)
    block = 1024 * 1024

    hash =
      File.open!(path, [:write, :binary, :raw], fn file ->
        Enum.reduce(0..div(size + block - 1, block), :crypto.hash_init(:sha256), fn i, acc ->
          n = min(block, size - i * block)

          if n > 0 do
            data = :crypto.crypto_update(state, <<0::size(n)-unit(8)>>)
            :ok = IO.binwrite(file, data)
            :crypto.hash_update(acc, data)
          else
            acc
          end
        end)
      end)

    File.chmod!(path, 0o644)
    hash |> :crypto.hash_final() |> Base.encode16(case: :lower)
  end

  # A bare repository with one deterministic commit (fixed author, dates
  # and content, so HEAD has the same id in every run).
  defp make_git_repo!(tb) do
    git = Tier.tool!("git")
    root = Path.join(tb.dir, "git")
    work = Path.join(tb.dir, "git-work")
    bare = Path.join(root, "repo.git")
    File.mkdir_p!(work)
    File.write!(Path.join(work, "README.md"), "# repo.git\n\nServed by the condukt netns testbed.\n")
    File.write!(Path.join(work, "data.txt"), Enum.map_join(1..2000, "\n", &"line #{&1}") <> "\n")

    env = [
      {"GIT_AUTHOR_NAME", "Testbed"},
      {"GIT_AUTHOR_EMAIL", "testbed@condukt.test"},
      {"GIT_AUTHOR_DATE", "2024-01-01T00:00:00Z"},
      {"GIT_COMMITTER_NAME", "Testbed"},
      {"GIT_COMMITTER_EMAIL", "testbed@condukt.test"},
      {"GIT_COMMITTER_DATE", "2024-01-01T00:00:00Z"},
      {"GIT_CONFIG_NOSYSTEM", "1"},
      {"GIT_CONFIG_GLOBAL", "/dev/null"}
    ]

    g = fn args, cd -> Cmd.run!([git | args], cd: cd, env: env, timeout: 20_000) end
    g.(["init", "--quiet", "--initial-branch=main", "."], work)
    g.(["add", "."], work)
    g.(["commit", "--quiet", "-m", "testbed content"], work)
    g.(["clone", "--quiet", "--bare", work, bare], root)
    head = g.(["rev-parse", "HEAD"], work) |> String.trim()
    %{tb | git: %{bare: bare, head: head, url: "https://git.test/repo.git"}}
  end

  defp start_servers!(tb) do
    prefix = Path.join(tb.dir, "nginx")

    conf =
      Nginx.config(%{
        prefix: prefix,
        www: Path.join(tb.dir, "www"),
        sites: @names ++ @bad_tls_names ++ @registry_names ++ ~w(v4.test v6.test),
        names: @names ++ @registry_names ++ ~w(v4.test v6.test metadata.test),
        pki: tb.pki,
        big_file: tb.big_file,
        ports: tb.ports,
        metadata: @metadata,
        decoy: @decoy
      })

    conf_path = Path.join(prefix, "nginx.conf")
    File.write!(conf_path, conf)
    nginx = [Tier.tool!("nginx"), "-p", prefix, "-c", conf_path]

    case exec_in(tb, :inet, nginx ++ ["-t", "-q"], timeout: 10_000) do
      {_, 0} -> :ok
      {out, status} -> raise "nginx -t failed (exit #{status}):\n#{out}"
    end

    py = Tier.tool!("python3")
    bin = &Path.join(tb.bin_dir, &1)
    log = &Path.join(tb.logs.dir, &1)

    pids = [
      spawn_in(tb, :inet, nginx, log: log.("nginx.out")),
      spawn_in(tb, :inet, [py, bin.("backend.py"), "#{tb.ports.backend}"], log: log.("backend.log")),
      spawn_in(tb, :inet, [py, bin.("git_http.py"), "#{tb.ports.git}", Path.join(tb.dir, "git")],
        log: log.("git_http.log")
      ),
      spawn_in(tb, :inet, [py, bin.("ws_echo.py"), "#{tb.ports.ws}"], log: log.("ws_echo.log")),
      spawn_in(
        tb,
        :inet,
        [py, bin.("bypass.py"), tb.logs.bypass, "#{tb.ports.bypass_tcp}", "#{tb.ports.bypass_udp}"],
        log: log.("bypass.log")
      )
    ]

    tb = %{tb | pids: pids}
    wait_ready!(tb)
    tb
  end

  @doc """
  Starts the testbed's scripted origins in the internet namespace and waits
  until they listen: servers/scripted.py, HTTP/1.1 only (no ALPN), plain
  on 8090, TLS on 8091 and TLS on 8094 taking one connection at a time;
  servers/h2_origin.py, h2 only, on 8093 (both describe their paths).
  Returns their pids.
  """
  @spec start_origins(t()) :: [pos_integer()]
  def start_origins(tb) do
    {crt, key} = tb.pki.server
    py = Tier.tool!("python3")
    s1 = spawn_in(tb, :inet, [py, Path.join(tb.bin_dir, "scripted.py"), "8090", "8091", crt, key, "8094"])
    s2 = spawn_in(tb, :inet, [py, Path.join(tb.bin_dir, "h2_origin.py"), "8093", crt, key])
    :ok = wait_listening(tb, :inet, tcp: ~w(0.0.0.0:8091 0.0.0.0:8093 0.0.0.0:8094), pids: [s1, s2])
    [s1, s2]
  end

  @doc """
  Waits until every listener is up in namespace `ns`, as `ss` prints local
  addresses ("127.0.0.1:15001", "[::1]:15001", "0.0.0.0:443", "[::]:443").
  Options: `:tcp`, `:udp` (lists of those), `:pids` (give up early when
  one of them died), `:timeout` (ms, default 15 s). Returns `:ok` or
  `{:error, :timeout | :died}`.
  """
  @spec wait_listening(t(), ns(), keyword()) :: :ok | {:error, :timeout | :died}
  def wait_listening(tb, ns, opts) do
    ss = Tier.tool!("ss")
    pids = Keyword.get(opts, :pids, [])

    listening = fn flags ->
      {out, _} = exec_in(tb, ns, [ss, "-Hn", flags], timeout: 5_000)

      out
      |> String.split("\n", trim: true)
      |> Enum.map(&(&1 |> String.split() |> Enum.at(3)))
      |> MapSet.new()
    end

    ready = fn ->
      Enum.all?(pids, &Cmd.alive?/1) || throw(:died)

      MapSet.subset?(MapSet.new(opts[:tcp] || []), listening.("-lt")) and
        MapSet.subset?(MapSet.new(opts[:udp] || []), listening.("-lu"))
    end

    try do
      Cmd.poll(ready, Keyword.get(opts, :timeout, 15_000), 50)
    catch
      :died -> {:error, :died}
    end
  end

  # Ready when every listener shows in `ss` inside inet: TCP 80, 443 (v4
  # and v6), the three backends, 8080 (v4 and v6) and UDP 443.
  defp wait_ready!(tb) do
    p = tb.ports

    tcp = [
      "0.0.0.0:#{p.http}",
      "[::]:#{p.http}",
      "0.0.0.0:#{p.https}",
      "[::]:#{p.https}",
      "127.0.0.1:#{p.backend}",
      "127.0.0.1:#{p.git}",
      "127.0.0.1:#{p.ws}",
      "0.0.0.0:#{p.bypass_tcp}",
      "[::]:#{p.bypass_tcp}"
    ]

    udp = ["0.0.0.0:#{p.bypass_udp}", "[::]:#{p.bypass_udp}"]

    case wait_listening(tb, :inet, tcp: tcp, udp: udp, pids: tb.pids) do
      :ok ->
        :ok

      {:error, why} ->
        logs = Path.wildcard(Path.join(tb.logs.dir, "*")) ++ [tb.logs.nginx_error]

        details = Enum.map_join(logs, "\n", &"--- #{&1}\n#{File.read(&1) |> elem(1)}")
        raise "netns testbed #{tb.id}: servers not ready (#{why})\n#{details}"
    end
  end

  ## Leftovers

  defp write_owner!(tb) do
    File.mkdir_p!(@owner_dir)
    File.write!(owner_file(tb.id), "#{System.pid()} #{start_time(System.pid())}\n")
  end

  defp owner_file(id), do: Path.join(@owner_dir, id)

  # The owner is alive when its pid runs with the start time it had when it
  # wrote the file (a reused pid has another).
  defp owner_alive?(id) do
    with {:ok, text} <- File.read(owner_file(id)),
         [pid, started] <- String.split(text),
         true <- started == start_time(pid) do
      true
    else
      _ -> false
    end
  end

  defp start_time(pid) do
    case File.read("/proc/#{pid}/stat") do
      {:ok, stat} -> stat |> String.split(") ") |> List.last() |> String.split() |> Enum.at(19)
      _ -> nil
    end
  end

  defp ns_pids(ns) do
    case Cmd.run([Tier.tool!("ip"), "netns", "pids", ns], timeout: 10_000, stderr: :discard) do
      {out, 0} -> out |> String.split() |> Enum.map(&String.to_integer/1)
      _ -> []
    end
  end

  defp ls(dir) do
    case File.ls(dir) do
      {:ok, entries} -> entries
      _ -> []
    end
  end

  defp json_lines(path) do
    case File.read(path) do
      {:ok, text} -> text |> String.split("\n", trim: true) |> Enum.map(&Condukt.JSON.decode!/1)
      {:error, :enoent} -> []
    end
  end
end
