defmodule Condukt.Test.K8s.Node do
  @moduledoc false
  # A real Kubernetes node for the `:kubernetes` tier (docs/k8s-tier.md):
  # containerd (Debian's, CRI plugin, runc with the cgroupfs driver), the
  # CNI plugins (Debian's containernetworking-plugins: bridge, host-local,
  # loopback, portmap) and kubelet (built by scripts/k8s/binaries.sh at the
  # API server's version), all inside one network namespace: the netns
  # testbed's "pod" side, so the pod network sits behind it and the
  # testbed's "inet" (nginx, the git server, its DNS) is an ordinary outside
  # network reached through the node's default route, masqueraded.
  #
  # The images come from scripts/k8s/images.sh (OCI archives) and are
  # imported into containerd's `k8s.io` namespace before the kubelet
  # starts: `imagePullPolicy: IfNotPresent` finds them, nothing is pulled.
  #
  #  host (127.0.0.1)                         netns = testbed pod side
  #  kube-apiserver :A <- relay <- api.sock <- relay <- 127.0.0.1:6443 <- kubelet
  #  API server -> "localhost":K -> relay -> kubelet.sock -> relay -> kubelet :K
  #                                           containerd -> runc, CNI bridge cnik0
  #                                           pods 10.244.0.0/24 --masq--> inet
  #
  # The kubelet's node name and `Hostname` address are "localhost" and the
  # API server prefers the Hostname address (`kubelet_address_types/0`),
  # so its exec, port-forward and log requests reach the relay on the
  # host's loopback; the node's InternalIP is the namespace's own address.
  #
  # Life cycle: `start/3` registers `stop/1` with on_exit (before the
  # cluster's, so it runs first); every process is recorded in the
  # cluster's pids file; the kubelet's cgroups live under a root of their
  # own (`/condukt-<id>` in every v1 hierarchy), containerd's state and the
  # pods' network namespaces under the node's directory; `stop/1` deletes
  # the pods, stops the processes, unmounts what is left and removes the
  # cgroups.

  alias Condukt.Test.K8s.{Cluster, Tier}
  alias Condukt.Dev.Netns.Cmd

  defstruct [:name, :dir, :netns, :ip, :socket, :cgroup_root, :port, :pod_cidr, :images, :kubelet_argv, pids: %{}]
  @type t :: %__MODULE__{}

  @name "localhost"
  @pod_cidr "10.244.0.0/24"
  @sandbox_image "condukt.test/pause:1"
  @cgroup_base "/sys/fs/cgroup"
  @runtime_handler "condukt-test"

  @doc """
  The name of the node's second container runtime handler (runc, as the
  default one), for a RuntimeClass whose pods must run.
  """
  @spec runtime_handler() :: String.t()
  def runtime_handler, do: @runtime_handler

  @doc "The API server's --kubelet-preferred-address-types a cluster with this node needs."
  @spec kubelet_address_types() :: String.t()
  def kubelet_address_types, do: "Hostname,InternalIP"

  @doc "Why this machine cannot run a real node, or nil."
  @spec skip_reason() :: String.t() | nil
  def skip_reason do
    cond do
      elem(System.cmd("id", ["-u"]), 0) != "0\n" ->
        "a real node needs root"

      missing = Enum.find(~w(containerd runc ctr nsenter), &(System.find_executable(&1) == nil)) ->
        "#{missing} is not installed (make setup)"

      not File.exists?("/usr/lib/cni/bridge") ->
        "the CNI plugins are not installed (containernetworking-plugins, make setup)"

      cgroup_hierarchies() == [] ->
        "no cgroup hierarchy under #{@cgroup_base}"

      true ->
        nil
    end
  end

  @doc """
  Starts a node in network namespace `netns` (whose address `ip` becomes
  the node's InternalIP) for cluster `c` (started with
  `kubelet_address_types: kubelet_address_types()`), imports
  `images` (a list of OCI archive paths) and waits until the node is Ready.
  Options: `:upstream_hosts` (a hosts file cluster DNS answers other names
  from, standing in for the internet's DNS; default: none, only cluster
  names resolve).
  """
  @spec start(Cluster.t(), String.t(), String.t(), [Path.t()], keyword()) :: t()
  def start(%Cluster{} = c, netns, ip, images, opts \\ []) do
    dir = Path.join(c.dir, "node")
    File.mkdir_p!(Path.join(dir, "log"))
    [port] = Cluster.free_ports(1)

    n = %__MODULE__{
      name: @name,
      dir: dir,
      netns: netns,
      ip: ip,
      socket: Path.join(dir, "containerd.sock"),
      cgroup_root: "/condukt-#{c.id}",
      port: port,
      pod_cidr: @pod_cidr,
      images: images
    }

    ExUnit.Callbacks.on_exit({__MODULE__, c.id}, fn -> stop(n, c) end)

    try do
      n =
        n
        |> start_relays!(c)
        |> start_containerd!(c)
        |> import_images!()
        |> start_kubelet!(c)
        |> wait_ready!(c)
        |> start_network_policy!(c)
        |> start_proxy!(c)
        |> start_dns!(c, Keyword.get(opts, :upstream_hosts))

      # The same key: replaces the callback above, now with every pid.
      ExUnit.Callbacks.on_exit({__MODULE__, c.id}, fn -> stop(n, c) end)
      n
    rescue
      e ->
        stop(n, c)
        reraise e, __STACKTRACE__
    end
  end

  # --- relays ---------------------------------------------------------------

  defp start_relays!(n, c) do
    python = "/usr/bin/python3"
    relay = Path.expand("relay.py", __DIR__)
    api_sock = Path.join(n.dir, "api.sock")
    kubelet_sock = Path.join(n.dir, "kubelet.sock")

    n
    |> spawn!(c, :relay_host, [
      python,
      relay,
      "unix:#{api_sock}=tcp:127.0.0.1:#{c.ports.apiserver}",
      "tcp:127.0.0.1:#{n.port}=unix:#{kubelet_sock}"
    ])
    |> spawn!(c, :relay_node, [
      Tier.tool!("ip"),
      "netns",
      "exec",
      n.netns,
      python,
      relay,
      "tcp:127.0.0.1:6443=unix:#{api_sock}",
      "unix:#{kubelet_sock}=tcp:127.0.0.1:#{n.port}"
    ])
  end

  # --- containerd -----------------------------------------------------------

  defp start_containerd!(n, c) do
    cni_conf = Path.join(n.dir, "cni")
    File.mkdir_p!(cni_conf)

    File.write!(Path.join(cni_conf, "10-condukt.conflist"), """
    {
      "cniVersion": "1.0.0",
      "name": "condukt-pods",
      "plugins": [
        {"type": "bridge", "bridge": "cnik0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "#{n.pod_cidr}"}]],
                  "dataDir": "#{n.dir}/ipam", "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": true}}
      ]
    }
    """)

    config = Path.join(n.dir, "containerd.toml")

    File.write!(config, """
    version = 2
    root = "#{n.dir}/containerd/root"
    state = "#{n.dir}/containerd/state"
    [grpc]
      address = "#{n.socket}"
    [ttrpc]
      address = "#{n.socket}.ttrpc"
    [plugins."io.containerd.grpc.v1.cri"]
      sandbox_image = "#{@sandbox_image}"
      # Without it runc fails on this kind of machine (no CAP_SYS_RESOURCE):
      # "can't get final child's PID from pipe: EOF".
      restrict_oom_score_adj = true
      # The pods' network namespaces under the state directory, not in the
      # host's /run/netns.
      netns_mounts_under_state_dir = true
      enable_selinux = false
      disable_apparmor = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
    # A second handler for RuntimeClass (`runtime_handler/0`): runc again.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.#{@runtime_handler}]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.#{@runtime_handler}.options]
      SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "#{cni_conf}"
      max_conf_num = 1
    """)

    n = spawn!(n, c, :containerd, in_node(n, ["containerd", "--config", config]))

    wait!(n, :containerd, 30_000, fn -> match?({_, 0}, ctr(n, ["version"])) end)
    n
  end

  @doc "Runs `ctr` in containerd's `k8s.io` namespace; `{output, status}`."
  @spec ctr(t(), [String.t()], keyword()) :: {String.t(), integer()}
  def ctr(%__MODULE__{} = n, args, opts \\ []) do
    Cmd.run(["ctr", "--address", n.socket, "--namespace", "k8s.io" | args],
      timeout: Keyword.get(opts, :timeout, 120_000),
      stderr: :stdout
    )
  end

  defp import_images!(n) do
    for archive <- n.images do
      case ctr(n, ["images", "import", archive]) do
        {_, 0} -> :ok
        {out, st} -> raise "importing #{archive} failed (#{st}): #{out}"
      end
    end

    n
  end

  # --- kubelet --------------------------------------------------------------

  # The administrator's credentials, pointed at the relay inside the
  # namespace, for the kubelet, the NetworkPolicy controller and CoreDNS.
  # (A node of a real cluster has its own identity, which the Node
  # authorizer limits; the tier runs RBAC only.)
  defp node_kubeconfig(n, c) do
    kubeconfig = Path.join(n.dir, "node.kubeconfig")

    unless File.exists?(kubeconfig) do
      File.write!(
        kubeconfig,
        c.dir |> Path.join("admin.kubeconfig") |> File.read!() |> String.replace(c.server, "https://127.0.0.1:6443")
      )
    end

    kubeconfig
  end

  defp start_kubelet!(n, c) do
    kubeconfig = node_kubeconfig(n, c)
    # The node's own resolver configuration: nothing (the pods' DNS is the
    # cluster's, `clusterDNS`, which forwards the rest).
    resolv = Path.join(n.dir, "resolv.conf")
    File.write!(resolv, "")

    # The kubelet refuses a --cgroup-root that does not exist.
    for h <- cgroup_hierarchies(), do: File.mkdir_p!(Path.join(h, n.cgroup_root))

    config = Path.join(n.dir, "kubelet.yaml")

    File.write!(config, """
    apiVersion: kubelet.config.k8s.io/v1beta1
    kind: KubeletConfiguration
    # cgroup v1 on the machines the tier was written on (the cgroup2 mount
    # is empty), and systemd is not PID 1.
    failCgroupV1: false
    cgroupDriver: cgroupfs
    cgroupRoot: #{n.cgroup_root}
    containerRuntimeEndpoint: unix://#{n.socket}
    address: 0.0.0.0
    port: #{n.port}
    readOnlyPort: 0
    healthzPort: 0
    authentication:
      anonymous: {enabled: false}
      webhook: {enabled: false}
      x509: {clientCAFile: #{Cluster.ca(c)}}
    authorization:
      mode: AlwaysAllow
    resolvConf: #{resolv}
    clusterDNS: [#{n.ip}]
    clusterDomain: cluster.local
    podLogsDir: #{n.dir}/pod-logs
    failSwapOn: false
    # Imported images are never garbage-collected (nothing can pull them
    # again) and a full shared disk does not evict the tests' pods.
    imageGCHighThresholdPercent: 100
    imageGCLowThresholdPercent: 99
    evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
    syncFrequency: 10s
    fileCheckFrequency: 5s
    nodeStatusUpdateFrequency: 5s
    serializeImagePulls: false
    registerNode: true
    """)

    argv =
      in_node(n, [
        Path.join(c.bin_dir, "kubelet"),
        "--config=#{config}",
        "--kubeconfig=#{kubeconfig}",
        "--root-dir=#{n.dir}/kubelet",
        "--hostname-override=#{n.name}",
        "--node-ip=#{n.ip}",
        "--v=2"
      ])

    spawn!(%{n | kubelet_argv: argv}, c, :kubelet, argv)
  end

  @doc "The pid of the node's running kubelet (`restart_kubelet!/3` replaces it), or nil."
  @spec kubelet_pid(t()) :: pos_integer() | nil
  def kubelet_pid(%__MODULE__{} = n), do: Enum.at(pids_naming("--config=#{n.dir}/kubelet.yaml"), 0)

  @doc """
  Restarts the kubelet as an upgrade or a crash would: `stop_kubelet!/1`,
  `outage_ms` without it, then `start_kubelet!/2`.
  """
  @spec restart_kubelet!(t(), Cluster.t(), non_neg_integer()) :: t()
  def restart_kubelet!(%__MODULE__{} = n, %Cluster{} = c, outage_ms) do
    stop_kubelet!(n)
    Process.sleep(outage_ms)
    start_kubelet_again!(n, c)
  end

  @doc """
  Stops the kubelet (TERM, KILL after 5 s). The containers keep running;
  exec, port-forward and logs through it fail, and the port-forward
  streams it served end.
  """
  @spec stop_kubelet!(t()) :: :ok
  def stop_kubelet!(%__MODULE__{} = n) do
    Cmd.kill(Enum.reject([kubelet_pid(n)], &is_nil/1), 5_000)
    :ok
  end

  @doc """
  Starts the kubelet stopped by `stop_kubelet!/1` again, with the same
  command, returning once it listens. Does nothing when it runs.
  """
  @spec start_kubelet_again!(t(), Cluster.t()) :: t()
  def start_kubelet_again!(%__MODULE__{} = n, %Cluster{} = c) do
    n =
      case kubelet_pid(n) do
        nil -> spawn!(n, c, :kubelet, n.kubelet_argv)
        pid -> %{n | pids: Map.put(n.pids, :kubelet, pid)}
      end

    # Listening on its port again. (The API server's node proxy would
    # tell more, but it refuses a loopback address: the tier's relay.)
    wait!(n, :kubelet, 60_000, fn ->
      {out, _} = Cmd.run(["ip", "netns", "exec", n.netns, "ss", "-ltnH", "sport = :#{n.port}"], timeout: 5_000)
      out =~ "LISTEN"
    end)

    n
  end

  @doc """
  The host pid of container `container` of the pod `pod` (as the API
  server returns it), through containerd: for `nsenter` into its
  namespaces, or `/proc/PID/root` to see its file system.
  """
  @spec container_pid(t(), map(), String.t()) :: pos_integer()
  def container_pid(%__MODULE__{} = n, pod, container) do
    statuses = (pod["status"]["initContainerStatuses"] || []) ++ (pod["status"]["containerStatuses"] || [])
    %{"containerID" => "containerd://" <> cid} = Enum.find(statuses, &(&1["name"] == container))
    {out, 0} = ctr(n, ["tasks", "ls"])

    out
    |> String.split("\n", trim: true)
    |> Enum.find_value(fn line ->
      case String.split(line) do
        [^cid, pid | _] -> String.to_integer(pid)
        _ -> nil
      end
    end) || raise("container #{container} (#{cid}) has no task")
  end

  @doc "The host directory of the pod's emptyDir volume `volume` (as the kubelet made it)."
  @spec empty_dir(t(), map(), String.t()) :: Path.t()
  def empty_dir(%__MODULE__{} = n, pod, volume) do
    Path.join([n.dir, "kubelet", "pods", pod["metadata"]["uid"], "volumes", "kubernetes.io~empty-dir", volume])
  end

  @doc """
  The lines the container `container` of `pod` wrote (stdout and stderr,
  every restart in order), read from the kubelet's log files (CRI format:
  `TIME STREAM TAG LINE`, one line per entry) with the time, stream and
  tag removed. Works while the kubelet is down.
  """
  @spec container_log(t(), map(), String.t()) :: [String.t()]
  def container_log(%__MODULE__{} = n, pod, container) do
    m = pod["metadata"]
    dir = Path.join([n.dir, "pod-logs", "#{m["namespace"]}_#{m["name"]}_#{m["uid"]}", container])

    for file <- Enum.sort(Path.wildcard(Path.join(dir, "*.log"))),
        {:ok, text} <- [File.read(file)],
        line <- String.split(text, "\n", trim: true),
        [_, _, _, entry] <- [String.split(line, " ", parts: 4)],
        do: entry
  end

  # The TaintNodesByCondition admission plugin gives the new node the
  # not-ready taint; the node lifecycle controller (not run: it also
  # evicts) would lift it once the kubelet reports Ready.
  defp wait_ready!(n, c) do
    wait!(n, :kubelet, 90_000, fn -> Cluster.node_ready?(c, n.name) end)
    Cluster.untaint_node!(c, n.name)
    n
  end

  # --- add-ons --------------------------------------------------------------

  # NetworkPolicy, enforced: kube-router's firewall alone (no routing, no
  # service proxy, no CNI of its own), with iptables and ipset in the
  # node's namespace, where every pod's traffic is forwarded.
  defp start_network_policy!(n, c) do
    start_addon!(
      n,
      c,
      :kube_router,
      [
        Path.join(c.bin_dir, "kube-router"),
        "--kubeconfig=#{node_kubeconfig(n, c)}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        "--hostname-override=#{n.name}",
        "--health-port=0",
        "--metrics-port=0",
        "--service-cluster-ip-range=10.96.0.0/24",
        "--iptables-sync-period=30s",
        "--v=1"
      ],
      ["iptables", "-S", "FORWARD"],
      "KUBE-ROUTER-FORWARD"
    )
  end

  # Services: kube-proxy in iptables mode in the node's namespace.
  # masqueradeAll: a pod reaching a Service backed by a pod on the same
  # bridge gets the reply through the node (no br_netfilter needed); the
  # conntrack settings are left as the kernel has them (0 = do not set).
  defp start_proxy!(n, c) do
    config = Path.join(n.dir, "kube-proxy.yaml")

    File.write!(config, """
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    clientConnection:
      kubeconfig: #{node_kubeconfig(n, c)}
    hostnameOverride: #{n.name}
    mode: iptables
    clusterCIDR: #{n.pod_cidr}
    iptables:
      masqueradeAll: true
    conntrack:
      maxPerCore: 0
      min: 0
      tcpEstablishedTimeout: 0s
      tcpCloseWaitTimeout: 0s
    healthzBindAddress: ""
    metricsBindAddress: ""
    """)

    start_addon!(
      n,
      c,
      :kube_proxy,
      [Path.join(c.bin_dir, "kube-proxy"), "--config=#{config}", "--v=1"],
      ["iptables", "-t", "nat", "-S", "PREROUTING"],
      "KUBE-SERVICES"
    )
  end

  # Cluster DNS: CoreDNS on the node's address (the kubelet's
  # `clusterDNS`), serving cluster.local from the API server and the
  # other names from the `hosts` file (the test internet has no DNS server
  # of its own).
  defp start_dns!(n, c, upstream) do
    corefile = Path.join(n.dir, "Corefile")

    File.write!(corefile, """
    .:53 {
        bind #{n.ip}
        errors
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            kubeconfig #{node_kubeconfig(n, c)} condukt-test
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        #{if upstream, do: "hosts #{upstream} {\n        fallthrough\n    }", else: ""}
        cache 5
    }
    """)

    start_addon!(
      n,
      c,
      :coredns,
      [
        Path.join(c.bin_dir, "coredns"),
        "-conf",
        corefile
      ],
      ["ss", "-lnu"],
      "#{n.ip}:53"
    )
  end

  # Starts an add-on in the node's namespace and waits until `probe`, run
  # there, prints `ready`.
  defp start_addon!(n, c, name, argv, probe, ready) do
    n = spawn!(n, c, name, in_node(n, argv))

    wait!(n, name, 60_000, fn ->
      {out, _} = Cmd.run(["ip", "netns", "exec", n.netns | probe], timeout: 5_000)
      out =~ ready
    end)

    n
  end

  # --- stop -----------------------------------------------------------------

  @doc """
  Deletes every pod (the kubelet stops their containers and tears their
  networks down), then stops the kubelet, containerd and what containerd
  left (shims, mounts, network namespaces), and removes the cgroups.
  Idempotent.
  """
  @spec stop(t(), Cluster.t()) :: :ok
  def stop(%__MODULE__{} = n, %Cluster{} = c) do
    kubelet = kubelet_pid(n)

    if kubelet && Cmd.alive?(kubelet) do
      for ns <- [c.namespace, c.other_namespace, "kube-system", "default"] do
        Cluster.request(c, :admin, "DELETE", "/api/v1/namespaces/#{ns}/pods?gracePeriodSeconds=0")
      end

      Cmd.poll(fn -> match?({"", 0}, ctr(n, ["tasks", "ls", "--quiet"], timeout: 5_000)) end, 30_000, 500)
    end

    Cmd.kill(Enum.reject([kubelet], &is_nil/1), 5_000)

    if n.pids[:containerd] && Cmd.alive?(n.pids[:containerd]) do
      {tasks, _} = ctr(n, ["tasks", "ls", "--quiet"], timeout: 10_000)
      for t <- String.split(tasks, "\n", trim: true), do: ctr(n, ["tasks", "kill", "--signal", "SIGKILL", t])
    end

    Cmd.kill(n.pids |> Map.delete(:kubelet) |> Map.values(), 5_000)
    # The shims (and a container's processes) outlive containerd.
    shims = for pid <- pids_naming(n.dir), do: pid
    Cmd.kill(shims, 2_000)

    Cmd.run(["sh", "-c", ~s(grep -o " #{n.dir}/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l)])

    for h <- cgroup_hierarchies(), root = Path.join(h, n.cgroup_root), File.dir?(root) do
      # Depth first: a cgroup directory goes once its children have.
      Cmd.run(["sh", "-c", ~s(find "#{root}" -depth -type d -exec rmdir {} + 2>/dev/null; true)])
    end

    :ok
  end

  # cgroup v2: the one unified hierarchy; v1: every mounted controller
  # (the empty cgroup2 mount of a v1 machine has no controllers to use).
  defp cgroup_hierarchies do
    cond do
      File.exists?(Path.join(@cgroup_base, "cgroup.controllers")) ->
        [@cgroup_base]

      File.dir?(@cgroup_base) ->
        @cgroup_base
        |> File.ls!()
        |> Enum.map(&Path.join(@cgroup_base, &1))
        |> Enum.filter(
          &(File.exists?(Path.join(&1, "cgroup.procs")) and not File.exists?(Path.join(&1, "cgroup.controllers")))
        )

      true ->
        []
    end
  end

  defp pids_naming(dir) do
    for entry <- File.ls!("/proc"),
        {pid, ""} <- [Integer.parse(entry)],
        {:ok, cmd} <- [File.read("/proc/#{pid}/cmdline")],
        String.contains?(cmd, dir),
        do: pid
  end

  # --- helpers --------------------------------------------------------------

  # argv run in the node's network namespace (and the host's mount
  # namespace: the kubelet's volume mounts must be containerd's too).
  defp in_node(n, argv), do: ["nsenter", "--net=/run/netns/#{n.netns}" | argv]

  defp spawn!(n, c, name, argv) do
    pid = Cluster.spawn_recorded!(c, "node-#{name}", argv, Path.join([n.dir, "log", "#{name}.log"]))
    %{n | pids: Map.put(n.pids, name, pid)}
  end

  defp wait!(n, name, timeout, fun) do
    pid = Map.fetch!(n.pids, name)

    case Cmd.poll(fn -> (not Cmd.alive?(pid) and :dead) || fun.() end, timeout, 300) do
      :ok ->
        if Cmd.alive?(pid), do: :ok, else: raise("#{name} exited:\n#{tail_log(n, name)}")

      {:error, :timeout} ->
        raise "#{name} not ready after #{timeout} ms:\n#{tail_log(n, name)}"
    end
  end

  @doc "The last lines of a node process's log (:containerd, :kubelet, ...)."
  @spec tail_log(t(), atom(), pos_integer()) :: String.t()
  def tail_log(n, name, lines \\ 40) do
    case File.read(Path.join([n.dir, "log", "#{name}.log"])) do
      {:ok, text} -> text |> String.split("\n") |> Enum.take(-lines) |> Enum.join("\n")
      _ -> "(no log)"
    end
  end
end
