defmodule Condukt.Test.K8s.Runtime do
  @moduledoc """
  The Kubernetes tier's pod runtime (docs/kubernetes.md, "The tier's pod
  runtime"; docs/k8s-tier.md, "The pod runtime"): it makes real the pods
  that the scheduler binds to the netns nodes it manages. kwok only plays
  their status; this process runs their containers.

  Started per cluster (`start/3`), it polls the pods as the administrator
  (every 200 ms). For a pod bound to one of its nodes it:

    1. writes every volume into a per-pod directory under
       `<cluster>/pods/` (Secret keys as files with the volume's mode,
       owner root, group `fsGroup`; emptyDir as a 0777 directory), and
       `/etc/hosts` (kubelet's layout plus `hostAliases`), `/etc/resolv.conf`
       (the namespace's, as `ip netns exec` would give it) and
       `/etc/hostname`; a Secret that does not exist yet is waited for, as
       a kubelet would;
    2. runs every init container in the node's network namespace and in a
       mount namespace of its own (`container.sh`: an overlay of the
       host's root file system as the image, the container's volumeMounts
       with subPath as file bind mounts, the runtime's directory hidden,
       `pivot_root`), as the uid/gid of its securityContext with exactly
       its capability set (`setpriv`: the bounding set and nothing ambient, as runc:
       no_new_privs when `allowPrivilegeEscalation: false`); an image
       whose name contains "condukt-egress" gets `/usr/local/bin` =
       `condukt-egress` (the sanitizer build when `CONDUKT_EGRESS_SAN_BIN`
       is set) plus `ca-certificates/mozilla.pem`. A run-to-completion init
       container that exits non-zero fails the pod; a native sidecar
       (`restartPolicy: Always`) is left running, its stdout and stderr
       are its log, and, as a kubelet, the next step waits until it has
       started: its process runs its command and, when it has a
       `startupProbe` (exec only), the probe's command, run in the
       sidecar's namespaces with its identity and environment at the
       probe's period and timeout, succeeded (`failureThreshold` failures
       fail the pod; `pod/3`'s `:startup` holds the outcome);
    3. restarts the node's kwok (which serves exec and port-forward) inside
       the first regular container's view and capability set, with an
       `Exec` (workingDir, env), a `PortForward` (the runtime's
       `:forward_ports`, default 15002) and a `Logs` (each container's log
       file) for the pod;
    4. only then sets `Cluster.runtime_ready_annotation/0` to "true", which
       kwok's pod stage waits for: `Running` means the sidecar's
       startupProbe succeeded (with the contract's manifest: the proxy
       accepts on its listeners). A sidecar without a startupProbe counts
       as started as soon as its process runs, as it does for a kubelet.

  A failed pod stays `Pending`: its status gets `Initialized: False`
  (reason `ContainersNotInitialized`), the failed init container's
  `terminated` state (exit code, reason `Error`, the tail of its output)
  and an Event of reason `Failed` (`pod_failure/3` polls for it). A deleted
  pod (or one replaced by a new uid) has its processes stopped (TERM, a
  15 s drain, then KILL), the node's kwok restarted outside the pod's view,
  and its directory removed. Container mounts live only in mount namespaces
  that die with their last process: nothing is added to the host's mount
  table (`host_mounts/1` lets a test check).

  `stop/1` (registered with `on_exit` by `start/3`) tears every pod down
  and raises when a sidecar's log holds a sanitizer report, so an ASan or
  UBSan finding fails the test that caused it.

  The "image" is the host's root file system (what is installed on the
  test machine): `debian:bookworm-slim` and the sidecar image both run
  Debian's programs. Only the first regular container is realized (as the
  exec target; its own command is not run, kwok stands in for it); more
  regular containers, or volume types other than secret and emptyDir, fail
  the pod with a message saying so.
  """
  use GenServer

  alias Condukt.Test.K8s.{Cluster, Tier}
  alias Condukt.Dev.Netns.Cmd

  require Logger

  @poll_ms 200
  @init_timeout 60_000
  @start_timeout 20_000
  @drain_ms 15_000
  # containerd's default capability set: what a container has unless its
  # securityContext drops or adds.
  @default_caps ~w(chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw sys_chroot mknod audit_write setfcap)
  # Debian images' PATH.
  @image_path "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  @container_sh Path.expand("container.sh", __DIR__)
  @crilog Path.expand("crilog.py", __DIR__)

  @type option ::
          {:nodes, [map()]}
          | {:egress_bin, Path.t()}
          | {:forward_ports, [pos_integer()]}
          | {:on_exit, boolean()}

  @doc """
  Starts a runtime for `cluster` managing `nodes` (maps returned by
  `Cluster.add_netns_node!/2` with `runtime: true`). Returns its pid.

  Options: `:egress_bin` (default the sanitizer build from
  `CONDUKT_EGRESS_SAN_BIN` when set, else `Condukt.egress_binary/0`),
  `:forward_ports` (pod ports port-forward reaches, default [15002]),
  `:on_exit` (register `stop/1`, default true).
  """
  @spec start(Cluster.t(), [map()], [option()]) :: pid()
  def start(%Cluster{} = c, nodes, opts \\ []) do
    {:ok, pid} = GenServer.start(__MODULE__, {c, nodes, opts})

    if Keyword.get(opts, :on_exit, true) do
      ExUnit.Callbacks.on_exit({__MODULE__, pid}, fn -> stop(pid) end)
    end

    pid
  end

  @doc """
  Tears every pod down and stops the runtime. Raises when a container's
  log held a sanitizer report. Idempotent.
  """
  @spec stop(pid()) :: :ok
  def stop(pid) do
    problems =
      try do
        GenServer.call(pid, :stop, 120_000)
      catch
        :exit, _ -> []
      end

    case problems do
      [] -> :ok
      _ -> raise "the pod runtime found problems:\n" <> Enum.join(problems, "\n")
    end
  end

  @doc """
  What the runtime knows about pod `namespace/name`: nil, or a map with
  `:uid`, `:dir` (the per-pod directory), `:log_dir`, `:logs` (container
  name => log file), `:pids` (container name => OS pid of running ones),
  `:state` (`:running` or `{:failed, message}`), `:kubelet` (`:up`, or
  `:down` after `stop_kubelet/3`), `:startup` (native sidecar name =>
  `%{probe: :none}` or `%{probe: :exec, attempts: n, output: text}`, the
  startupProbe's successful run).
  """
  @spec pod(pid(), String.t(), String.t()) :: map() | nil
  def pod(pid, namespace, name), do: GenServer.call(pid, {:pod, namespace, name}, 120_000)

  @doc """
  Stops the kubelet of pod `namespace/name`: the node's kwok, which serves
  the pod's exec, port-forward and log streams, is ended (TERM, then KILL
  after 5 s) by the pid the runtime recorded, as a kubelet restart would
  end it: every streaming connection through it breaks, the pod's
  containers keep running. Until `start_kubelet/3`, exec and port-forward
  to the pod fail at the API server. `{:error, :not_found}` when the
  runtime does not run that pod.
  """
  @spec stop_kubelet(pid(), String.t(), String.t()) :: :ok | {:error, :not_found}
  def stop_kubelet(pid, namespace, name), do: GenServer.call(pid, {:kubelet, :stop, namespace, name}, 120_000)

  @doc """
  Starts the kubelet of pod `namespace/name` again after `stop_kubelet/3`,
  exactly as it was started (the same kwok command and configuration, in
  the workspace's view); returns when it serves again. A kubelet that is
  already up is restarted. `{:error, :not_found}` when the runtime does not
  run that pod.
  """
  @spec start_kubelet(pid(), String.t(), String.t()) :: :ok | {:error, :not_found}
  def start_kubelet(pid, namespace, name), do: GenServer.call(pid, {:kubelet, :start, namespace, name}, 120_000)

  @doc """
  `stop_kubelet/3`, `down_ms` milliseconds of outage (default 0), then
  `start_kubelet/3`: the kubelet restart case.
  """
  @spec restart_kubelet(pid(), String.t(), String.t(), non_neg_integer()) :: :ok | {:error, :not_found}
  def restart_kubelet(pid, namespace, name, down_ms \\ 0) do
    with :ok <- stop_kubelet(pid, namespace, name) do
      Process.sleep(down_ms)
      start_kubelet(pid, namespace, name)
    end
  end

  @doc "The lines of the host's mount table that mention `path` (a pod directory)."
  @spec host_mounts(Path.t()) :: [String.t()]
  def host_mounts(path) do
    "/proc/1/mountinfo"
    |> File.read!()
    |> Kernel.<>(File.read!("/proc/self/mountinfo"))
    |> String.split("\n", trim: true)
    |> Enum.filter(&String.contains?(&1, path))
  end

  @doc """
  Polls (up to `timeout` ms) until pod `namespace/name` reports an init
  container failure set by the runtime; returns `{:ok, status}` (the pod's
  status map) or `{:error, :timeout}`.
  """
  @spec pod_failure(Cluster.t(), String.t(), String.t(), non_neg_integer()) :: {:ok, map()} | {:error, :timeout}
  def pod_failure(c, namespace, name, timeout \\ 30_000) do
    fetch = fn ->
      case Cluster.request(c, :admin, "GET", "/api/v1/namespaces/#{namespace}/pods/#{name}") do
        {200, %{"status" => %{"conditions" => conds} = st}} ->
          if Enum.any?(conds, &match?(%{"type" => "Initialized", "status" => "False"}, &1)), do: st

        _ ->
          nil
      end
    end

    case Cmd.poll(fetch, timeout, 200) do
      :ok -> {:ok, fetch.()}
      err -> err
    end
  end

  # --- GenServer -------------------------------------------------------------

  @impl true
  def init({c, nodes, opts}) do
    pods_dir = Path.join(c.dir, "pods")
    File.mkdir_p!(pods_dir)
    File.chmod!(pods_dir, 0o700)

    egress =
      Keyword.get_lazy(opts, :egress_bin, fn ->
        case System.get_env("CONDUKT_EGRESS_SAN_BIN") do
          p when is_binary(p) and p != "" -> p
          _ -> Condukt.egress_binary()
        end
      end)

    nodes =
      Map.new(nodes, fn node ->
        unless node.runtime, do: raise("node #{node.name} was not added with runtime: true")
        {node.name, %{node: node, kwok_pid: node.kwok_pid, pod: nil}}
      end)

    state = %{
      c: c,
      pods_dir: pods_dir,
      nodes: nodes,
      egress: egress,
      san: egress != Condukt.egress_binary(),
      forward_ports: Keyword.get(opts, :forward_ports, [15_002]),
      problems: [],
      waiting: %{}
    }

    send(self(), :tick)
    {:ok, state}
  end

  @impl true
  def handle_info(:tick, state) do
    state = tick(state)
    Process.send_after(self(), :tick, @poll_ms)
    {:noreply, state}
  end

  @impl true
  def handle_call(:stop, _from, state) do
    state =
      Enum.reduce(state.nodes, state, fn {name, ns}, st ->
        if ns.pod, do: teardown(st, name, restart_kwok: false), else: st
      end)

    {:stop, :normal, Enum.reverse(state.problems), state}
  end

  def handle_call({:pod, namespace, name}, _from, state) do
    found =
      Enum.find_value(state.nodes, fn {_, ns} ->
        p = ns.pod
        if p && p.namespace == namespace && p.name == name, do: public(p)
      end)

    {:reply, found, state}
  end

  def handle_call({:kubelet, op, namespace, name}, _from, state) do
    found =
      Enum.find(state.nodes, fn {_, ns} ->
        p = ns.pod
        p && p.namespace == namespace && p.name == name && p.kwok_argv
      end)

    case {op, found} do
      {_, nil} ->
        {:reply, {:error, :not_found}, state}

      {:stop, {node_name, ns}} ->
        Cmd.kill([ns.kwok_pid], 5_000)
        :ok = Cmd.poll(fn -> not Cmd.alive?(ns.kwok_pid) end, 5_000)
        {:reply, :ok, put_pod(state, node_name, %{ns.pod | kubelet: :down})}

      {:start, {node_name, ns}} ->
        state = replace_kwok!(state, ns.node, ns.pod.kwok_argv)
        {:reply, :ok, put_pod(state, node_name, %{ns.pod | kubelet: :up})}
    end
  end

  defp public(p) do
    p
    |> Map.take([:uid, :dir, :log_dir, :logs, :state, :kubelet, :startup])
    |> Map.put(:pids, for(%{name: n, pid: pid} when n != nil <- p.procs, into: %{}, do: {n, pid}))
  end

  # --- the loop ----------------------------------------------------------------

  defp tick(state) do
    case Cluster.request(state.c, :admin, "GET", "/api/v1/pods") do
      {200, %{"items" => items}} ->
        Enum.reduce(state.nodes, state, fn {name, ns}, st ->
          live =
            Enum.find(items, fn p ->
              get_in(p, ["spec", "nodeName"]) == name and is_nil(get_in(p, ["metadata", "deletionTimestamp"]))
            end)

          cond do
            ns.pod && (is_nil(live) || live["metadata"]["uid"] != ns.pod.uid) ->
              teardown(st, name, restart_kwok: true)

            is_nil(ns.pod) && live ->
              realize(st, name, live)

            true ->
              st
          end
        end)

      _ ->
        state
    end
  end

  # --- realizing a pod ---------------------------------------------------------

  defp realize(state, node_name, pod) do
    %{"metadata" => %{"name" => name, "namespace" => namespace, "uid" => uid}} = pod
    node = state.nodes[node_name].node

    ps = %{
      uid: uid,
      name: name,
      namespace: namespace,
      dir: Path.join(state.pods_dir, "#{namespace}_#{name}_#{String.slice(uid, 0, 8)}"),
      log_dir: Path.join([state.c.dir, "log", "pods", "#{namespace}_#{name}_#{String.slice(uid, 0, 8)}"]),
      logs: %{},
      procs: [],
      kwok_in_view: false,
      kwok_argv: nil,
      kubelet: :up,
      startup: %{},
      state: :starting
    }

    try do
      File.rm_rf!(ps.dir)
      File.mkdir_p!(ps.dir)
      File.mkdir_p!(ps.log_dir)
      volumes = write_volumes!(state, ps, pod)
      write_etc!(ps, pod, node)
      write_image!(state, ps)

      {state, ps} =
        Enum.reduce(pod["spec"]["initContainers"] || [], {state, ps}, fn ctr, {st, p} ->
          run_init!(st, p, pod, node, volumes, ctr)
        end)

      state = put_pod(state, node_name, ps)

      case pod["spec"]["containers"] do
        [_workspace] -> :ok
        _ -> throw({:fail, "containers", "the tier realizes exactly one regular container (the exec target)"})
      end

      {state, ps} = start_kwok_in_view!(state, ps, pod, node, volumes, hd(pod["spec"]["containers"]))
      ps = %{ps | state: :running}
      state = put_pod(state, node_name, ps)
      annotate_ready!(state.c, ps)
      state
    catch
      {:pending, why} ->
        # The kubelet waits (ContainerCreating) for a Secret that does not
        # exist yet; so does the runtime, quietly retrying every tick.
        stop_procs(state, ps)
        File.rm_rf(ps.dir)

        unless state.waiting[uid] == why,
          do: Logger.info("pod runtime: #{namespace}/#{name} waits: #{why}")

        %{state | waiting: Map.put(state.waiting, uid, why)}

      {:fail, container, why} ->
        message = report_failure(state.c, pod, container, why)
        Logger.warning("pod runtime: #{namespace}/#{name}: #{message}")
        put_pod(state, node_name, %{ps | state: {:failed, message}})
    end
  end

  defp put_pod(state, node_name, ps), do: put_in(state, [:nodes, node_name, :pod], ps)

  defp write_volumes!(state, ps, pod) do
    spec = pod["spec"]
    fs_group = get_in(spec, ["securityContext", "fsGroup"])
    root = Path.join(ps.dir, "volumes")
    File.mkdir_p!(root)

    Map.new(spec["volumes"] || [], fn vol ->
      path = Path.join(root, vol["name"])
      File.mkdir_p!(path)

      cond do
        Map.has_key?(vol, "emptyDir") ->
          File.chmod!(path, 0o777)

        secret = vol["secret"] ->
          write_secret!(state, ps, path, secret, fs_group)

        true ->
          throw({:fail, "volumes", "volume #{vol["name"]}: only secret and emptyDir volumes are supported by the tier"})
      end

      {vol["name"], path}
    end)
  end

  defp write_secret!(state, ps, path, vol, fs_group) do
    sname = vol["secretName"]

    data =
      case Cluster.request(state.c, :admin, "GET", "/api/v1/namespaces/#{ps.namespace}/secrets/#{sname}") do
        {200, %{"data" => data}} when is_map(data) -> data
        {200, _} -> %{}
        {404, _} -> throw({:pending, "secret #{sname} not found"})
        {code, body} -> throw({:pending, "secret #{sname}: HTTP #{code} #{inspect(body)}"})
      end

    default_mode = vol["defaultMode"] || 0o644

    files =
      case vol["items"] do
        nil -> Enum.map(data, fn {k, _} -> {k, k, default_mode} end)
        items -> Enum.map(items, &{&1["key"], &1["path"], &1["mode"] || default_mode})
      end

    for {key, rel, mode} <- files do
      value = data[key] || throw({:fail, "volumes", "secret #{sname} has no key #{key}"})
      file = Path.join(path, rel)
      File.mkdir_p!(Path.dirname(file))
      File.write!(file, Base.decode64!(value))
      File.chmod!(file, mode)
      if fs_group, do: File.chgrp!(file, fs_group)
    end

    File.chmod!(path, 0o755)
    if fs_group, do: File.chgrp!(path, fs_group)
  end

  defp write_etc!(ps, pod, node) do
    etc = Path.join(ps.dir, "etc")
    File.mkdir_p!(etc)
    {:ok, host} = :inet.gethostname()

    aliases =
      Enum.map_join(pod["spec"]["hostAliases"] || [], "", fn %{"ip" => ip} = a ->
        "#{ip}\t#{Enum.join(a["hostnames"] || [], "\t")}\n"
      end)

    # kubelet's layout; the machine's own name stays on loopback (libcurl
    # resolves it at start-up: docs/e2e-testbed.md).
    File.write!(Path.join(etc, "hosts"), """
    # Kubernetes-managed hosts file (condukt tier runtime).
    127.0.0.1\tlocalhost #{host}
    ::1\tlocalhost ip6-localhost ip6-loopback #{host}
    fe00::0\tip6-localnet
    fe00::0\tip6-mcastprefix
    fe00::1\tip6-allnodes
    fe00::2\tip6-allrouters
    127.0.0.1\t#{ps.name}

    # Entries added by HostAliases.
    #{aliases}\
    """)

    resolv = Enum.find(["/etc/netns/#{node.netns}/resolv.conf", "/etc/resolv.conf"], &File.regular?/1)

    File.write!(Path.join(etc, "resolv.conf"), if(resolv, do: File.read!(resolv), else: ""))
    File.write!(Path.join(etc, "hostname"), ps.name <> "\n")
    for f <- ~w(hosts resolv.conf hostname), do: File.chmod!(Path.join(etc, f), 0o644)
  end

  # The sidecar image's /usr/local/bin: the binary and its Mozilla
  # snapshot "next to the binary" (its default --trust-bundle).
  defp write_image!(state, ps) do
    bin = Path.join([ps.dir, "image", "usr-local-bin"])
    File.mkdir_p!(Path.join(bin, "ca-certificates"))
    File.cp!(state.egress, Path.join(bin, "condukt-egress"))
    File.chmod!(Path.join(bin, "condukt-egress"), 0o755)
    mozilla = Path.join(bin, "ca-certificates/mozilla.pem")
    File.cp!(Path.join(:code.priv_dir(:condukt), "ca-certificates/mozilla.pem"), mozilla)
    File.chmod!(mozilla, 0o644)
    for d <- [Path.join(ps.dir, "image"), bin, Path.join(bin, "ca-certificates")], do: File.chmod!(d, 0o755)
  end

  # --- containers ----------------------------------------------------------------

  defp run_init!(state, ps, pod, node, volumes, ctr) do
    cname = ctr["name"]
    log = Path.join(ps.log_dir, "#{cname}.log")
    ps = %{ps | logs: Map.put(ps.logs, cname, log)}
    argv = container_argv!(state, ps, pod, node, volumes, ctr, command!(ctr))

    if ctr["restartPolicy"] == "Always" do
      stdout = Path.join(ps.log_dir, "#{cname}.stdout")
      stderr = Path.join(ps.log_dir, "#{cname}.stderr")
      pid = spawn_split!(state.c, "pod-#{ps.name}-#{cname}", argv, stdout, stderr)

      writer =
        Cluster.spawn_recorded!(
          state.c,
          "crilog-#{ps.name}-#{cname}",
          ["/usr/bin/python3", @crilog, stdout, stderr, log],
          Path.join(ps.log_dir, "#{cname}.crilog.log")
        )

      procs = [%{name: cname, pid: pid, stdout: stdout, stderr: stderr}, %{name: nil, pid: writer, stderr: nil}]
      ps = %{ps | procs: ps.procs ++ procs}

      started =
        try do
          wait_started!(state, ps, pod, ctr, pid, stderr)
        catch
          {:fail, _, _} = failure ->
            # As a kubelet ends a container that failed its startupProbe:
            # the failed pod keeps no process (its record has none).
            case stop_procs(state, ps) do
              [] -> throw(failure)
              reports -> throw({:fail, cname, Enum.join(reports, "\n")})
            end
        end

      {state, %{ps | startup: Map.put(ps.startup, cname, started)}}
    else
      {out, status} = Cmd.run(argv, timeout: @init_timeout, stderr: :stdout)
      File.write!(log, cri_lines(out, "stdout"), [:append])

      if status != 0 do
        throw({:fail, cname, {status, out}})
      end

      {state, ps}
    end
  end

  # Starts `argv` detached with stdout and stderr in two files (as a
  # container runtime keeps the two streams apart); returns its pid,
  # recorded in the cluster's pids file.
  defp spawn_split!(c, name, argv, stdout, stderr) do
    script = ~S(out=$1; err=$2; shift 2; setsid "$@" </dev/null >>"$out" 2>>"$err" & echo $!)
    pid = Cmd.run!(["/bin/sh", "-c", script, "sh", stdout, stderr | argv]) |> String.trim() |> String.to_integer()
    File.write!(Path.join(c.dir, "pids"), "#{name} #{pid}\n", [:append])
    pid
  end

  # kubelet's (CRI) log lines, which kwok's log endpoint parses.
  defp cri_lines(text, stream) do
    now = DateTime.utc_now() |> DateTime.to_iso8601()
    text |> String.split("\n", trim: true) |> Enum.map_join("", &"#{now} #{stream} F #{&1}\n")
  end

  defp command!(ctr) do
    case (ctr["command"] || []) ++ (ctr["args"] || []) do
      [] -> throw({:fail, ctr["name"], "no command: the tier does not know the image's entrypoint"})
      argv -> argv
    end
  end

  # The argv that runs `cmd` as container `ctr` of the pod: the node's
  # network namespace, a private mount namespace built by container.sh,
  # the container's identity and capabilities, its environment.
  defp container_argv!(state, ps, pod, node, volumes, ctr, cmd, identity \\ nil) do
    dir = prepare_container!(state, ps, volumes, ctr)
    {setpriv, env} = identity || identity!(state, ps, pod, ctr)

    [Tier.tool!("nsenter"), "--net=/run/netns/#{node.netns}", "--"] ++
      [Tier.tool!("unshare"), "--mount", "--propagation", "private", "--"] ++
      ["/bin/sh", @container_sh, dir, "--"] ++
      setpriv ++ ["--", "/usr/bin/env", "-i"] ++ Enum.map(env, fn {k, v} -> "#{k}=#{v}" end) ++ cmd
  end

  defp prepare_container!(state, ps, volumes, ctr) do
    dir = Path.join([ps.dir, "containers", ctr["name"]])
    File.mkdir_p!(Path.join(dir, "fs"))
    etc = Path.join(ps.dir, "etc")

    base = [
      {"file", Path.join(etc, "hosts"), "/etc/hosts", "ro"},
      {"file", Path.join(etc, "resolv.conf"), "/etc/resolv.conf", "ro"},
      {"file", Path.join(etc, "hostname"), "/etc/hostname", "ro"}
    ]

    image =
      if egress_image?(ctr),
        do: [{"dir", Path.join([ps.dir, "image", "usr-local-bin"]), "/usr/local/bin", "ro"}],
        else: []

    mounts =
      Enum.map(ctr["volumeMounts"] || [], fn m ->
        vol = volumes[m["name"]] || throw({:fail, ctr["name"], "volumeMount of unknown volume #{m["name"]}"})
        src = if sub = m["subPath"], do: Path.join(vol, sub), else: vol

        kind =
          cond do
            File.dir?(src) -> "dir"
            File.regular?(src) -> "file"
            true -> throw({:fail, ctr["name"], "subPath #{m["subPath"]} does not exist in volume #{m["name"]}"})
          end

        {kind, src, m["mountPath"], if(m["readOnly"], do: "ro", else: "rw")}
      end)

    lines =
      for {kind, src, dst, mode} <- base ++ image ++ mounts do
        if String.contains?(src <> dst, ["\t", "\n"]), do: throw({:fail, ctr["name"], "a path holds a tab or newline"})
        Enum.join([kind, src, dst, mode], "\t") <> "\n"
      end

    File.write!(Path.join(dir, "mounts"), lines)
    File.write!(Path.join(dir, "hide"), state.pods_dir <> "\n")
    File.write!(Path.join(dir, "workdir"), ctr["workingDir"] || "/")

    if get_in(ctr, ["securityContext", "readOnlyRootFilesystem"]) == true,
      do: File.write!(Path.join(dir, "rootro"), ""),
      else: File.rm(Path.join(dir, "rootro"))

    dir
  end

  defp egress_image?(ctr), do: String.contains?(ctr["image"] || "", "condukt-egress")

  # setpriv's arguments and the environment for container `ctr`.
  defp identity!(state, ps, pod, ctr) do
    sc = ctr["securityContext"] || %{}
    psc = pod["spec"]["securityContext"] || %{}
    uid = sc["runAsUser"] || psc["runAsUser"] || 0
    gid = sc["runAsGroup"] || psc["runAsGroup"] || 0
    non_root = Map.get(sc, "runAsNonRoot", psc["runAsNonRoot"])

    if non_root == true and uid == 0 do
      throw({:fail, ctr["name"], "runAsNonRoot is set and the container would run as root"})
    end

    groups = Enum.reject([psc["fsGroup"] | psc["supplementalGroups"] || []], &is_nil/1)
    caps = capabilities(sc["capabilities"] || %{})
    capstr = Enum.map_join(caps, "", &",+#{&1}")

    # As runc does: the bounding set is the container's capabilities
    # and nothing is ambient, so a non-root process keeps none of them
    # after execve (and no_new_privs rules out file capabilities).
    setpriv =
      [Tier.tool!("setpriv"), "--reuid=#{uid}", "--regid=#{gid}"] ++
        if(groups == [], do: ["--clear-groups"], else: ["--groups=#{Enum.join(groups, ",")}"]) ++
        ["--bounding-set=-all#{capstr}", "--inh-caps=-all"] ++
        if(sc["allowPrivilegeEscalation"] == false, do: ["--no-new-privs"], else: [])

    env =
      [{"PATH", @image_path}, {"HOSTNAME", ps.name}, {"HOME", if(uid == 0, do: "/root", else: "/")}] ++
        if(state.san and egress_image?(ctr), do: san_env(), else: []) ++
        Enum.flat_map(ctr["env"] || [], fn
          %{"name" => n, "value" => v} -> [{n, v}]
          %{"name" => n} -> throw({:fail, ctr["name"], "env #{n}: only literal values are supported by the tier"})
        end)

    {setpriv, env}
  end

  defp capabilities(caps) do
    norm = fn list -> Enum.map(list || [], &(&1 |> String.downcase() |> String.replace_prefix("cap_", ""))) end
    drop = norm.(caps["drop"])
    base = if "all" in drop, do: [], else: @default_caps -- drop
    Enum.uniq(base ++ norm.(caps["add"]))
  end

  defp san_env do
    [{"ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1"}, {"UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1"}]
  end

  # As the kubelet: a native sidecar has started once its process runs
  # its command and, when it has a startupProbe, once the probe succeeds;
  # only then does the next container start. The probe's exec runs in the
  # sidecar's namespaces (network, mount: its root and working directory)
  # with its identity and environment, as CRI's ExecSync would, at the
  # probe's initialDelaySeconds, periodSeconds and timeoutSeconds.
  # failureThreshold failures fail the pod (a kubelet would restart the
  # container; the tier reports it instead). Returns `%{probe: :none}` or
  # `%{probe: :exec, attempts: n, output: text}`.
  defp wait_started!(state, ps, pod, ctr, pid, log) do
    cname = ctr["name"]
    cmd = command!(ctr)
    running = fn -> (not Cmd.alive?(pid) and :dead) || cmdline(pid) == cmd end

    case Cmd.poll(running, @start_timeout, 20) do
      :ok ->
        unless Cmd.alive?(pid), do: throw({:fail, cname, {:exited, File.read!(log)}})

      {:error, :timeout} ->
        throw({:fail, cname, "its process did not run its command within #{@start_timeout} ms"})
    end

    case ctr["startupProbe"] do
      nil ->
        %{probe: :none}

      %{"exec" => %{"command" => [_ | _] = probe_cmd}} = probe ->
        {setpriv, env} = identity!(state, ps, pod, ctr)

        argv =
          [Tier.tool!("nsenter"), "--target", "#{pid}", "--net", "--mount", "--root", "--wd", "--"] ++
            setpriv ++ ["--", "/usr/bin/env", "-i"] ++ Enum.map(env, fn {k, v} -> "#{k}=#{v}" end) ++ probe_cmd

        timing = %{
          period: (probe["periodSeconds"] || 10) * 1000,
          timeout: (probe["timeoutSeconds"] || 1) * 1000,
          threshold: probe["failureThreshold"] || 3
        }

        Process.sleep((probe["initialDelaySeconds"] || 0) * 1000)
        probe_until_started!(argv, timing, 1, pid, log, cname)

      other ->
        kinds = other |> Map.keys() |> Enum.join(", ")
        throw({:fail, cname, "startupProbe (#{kinds}): the tier runs exec probes only"})
    end
  end

  defp probe_until_started!(argv, t, attempt, pid, log, cname) do
    unless Cmd.alive?(pid), do: throw({:fail, cname, {:exited, File.read!(log)}})
    began = System.monotonic_time(:millisecond)
    {out, status} = Cmd.run(argv, timeout: t.timeout, stderr: :stdout)

    cond do
      out =~ ~r/Sanitizer|runtime error:/ ->
        throw({:fail, cname, "its startupProbe reported a sanitizer error:\n#{out}"})

      status == 0 ->
        %{probe: :exec, attempts: attempt, output: out}

      attempt >= t.threshold ->
        throw({:fail, cname, "startupProbe failed #{attempt} times (exit #{status}): #{out}"})

      true ->
        Process.sleep(max(0, t.period - (System.monotonic_time(:millisecond) - began)))
        probe_until_started!(argv, t, attempt + 1, pid, log, cname)
    end
  end

  defp cmdline(pid) do
    case File.read("/proc/#{pid}/cmdline") do
      {:ok, text} -> String.split(text, <<0>>, trim: true)
      _ -> nil
    end
  end

  # --- kwok in the workspace's view ----------------------------------------------

  defp start_kwok_in_view!(state, ps, pod, node, volumes, ctr) do
    {setpriv, env} = identity!(state, ps, pod, ctr)
    config = Path.join(node.dir, "kwok-#{ps.namespace}-#{ps.name}.yaml")
    log = Path.join(ps.log_dir, "#{ctr["name"]}.log")
    File.write!(log, "")
    ps = %{ps | logs: Map.put(ps.logs, ctr["name"], log)}
    File.write!(config, kwok_pod_config(state, ps, ctr, env, node))

    # kwok itself stays root (it serves exec as the container's uid
    # through its Exec securityContext) with the container's bounding set.
    {setpriv, kwok_env} =
      {Enum.map(setpriv, fn
         "--reuid=" <> _ -> "--reuid=0"
         "--regid=" <> _ -> "--regid=0"
         "--ambient-caps=" <> _ -> "--inh-caps=-all"
         "--inh-caps=" <> _ -> "--inh-caps=-all"
         arg -> arg
       end)
       |> Enum.uniq(), [{"PATH", @image_path}, {"HOME", "/root"}, {"HOSTNAME", ps.name}]}

    kwok_args = Cluster.kwok_node_args(state.c, node.kwok_kubeconfig, config, node.name)
    argv = container_argv!(state, ps, pod, node, volumes, ctr, kwok_args, {setpriv, kwok_env})
    state = replace_kwok!(state, node, argv)
    {state, %{ps | kwok_in_view: true, kwok_argv: argv}}
  end

  defp kwok_pod_config(state, ps, ctr, env, node) do
    sc = ctr["securityContext"] || %{}
    uid = sc["runAsUser"]
    gid = sc["runAsGroup"]

    user =
      if uid && uid != 0,
        do: "      securityContext: {runAsUser: #{uid}#{if gid, do: ", runAsGroup: #{gid}"}}\n",
        else: ""

    envs = Enum.map_join(env, "", fn {k, v} -> "      - {name: #{yaml_str(k)}, value: #{yaml_str(v)}}\n" end)

    forwards =
      Enum.map_join(Enum.uniq(state.forward_ports ++ node.forward_ports), "", fn port ->
        "  - ports: [#{port}]\n    target: {address: 127.0.0.1, port: #{port}}\n"
      end)

    logs =
      Enum.map_join(ps.logs, "", fn {name, file} ->
        "  - containers: [#{yaml_str(name)}]\n    logsFile: #{yaml_str(file)}\n    follow: true\n"
      end)

    meta = "metadata: {name: #{yaml_str(ps.name)}, namespace: #{yaml_str(ps.namespace)}}\n"

    Cluster.kwok_stages(true) <>
      "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: Exec\n" <>
      meta <>
      "spec:\n  execs:\n  - containers: [#{yaml_str(ctr["name"])}]\n    local:\n" <>
      "      workDir: #{yaml_str(ctr["workingDir"] || "/")}\n      envs:\n" <>
      envs <>
      user <>
      "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: PortForward\n" <>
      meta <>
      if(forwards == "", do: "spec:\n  forwards: []\n", else: "spec:\n  forwards:\n" <> forwards) <>
      "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: Logs\n" <>
      meta <> if(logs == "", do: "spec:\n  logs: []\n", else: "spec:\n  logs:\n" <> logs)
  end

  # JSON strings are YAML strings.
  defp yaml_str(s), do: :jiffy.encode(s)

  # Stops the node's current kwok and starts `argv` in its place; returns
  # when the new one serves 127.0.0.1:10250 in the node's namespace.
  defp replace_kwok!(state, node, argv) do
    old = state.nodes[node.name].kwok_pid
    Cmd.kill([old], 5_000)
    :ok = Cmd.poll(fn -> not Cmd.alive?(old) end, 5_000)
    log = Path.join([state.c.dir, "log", "kwok-#{node.name}.log"])
    pid = Cluster.spawn_recorded!(state.c, "kwok-#{node.name}", argv, log)
    state = put_in(state, [:nodes, node.name, :kwok_pid], pid)

    serving = fn ->
      (not Cmd.alive?(pid) and :dead) ||
        match?(
          {out, 0} when out != "",
          Cmd.run(
            [
              Tier.tool!("nsenter"),
              "--net=/run/netns/#{node.netns}",
              "--",
              Tier.tool!("ss"),
              "-Hltn",
              "sport = :10250"
            ],
            timeout: 5_000,
            stderr: :discard
          )
        )
    end

    case Cmd.poll(serving, 30_000, 100) do
      :ok ->
        unless Cmd.alive?(pid), do: raise("kwok for #{node.name} exited:\n#{tail(log)}")

      {:error, :timeout} ->
        raise "kwok for #{node.name} does not serve after 30 s:\n#{tail(log)}"
    end

    state
  end

  defp annotate_ready!(c, ps) do
    Cluster.request!(
      c,
      :admin,
      "PATCH",
      "/api/v1/namespaces/#{ps.namespace}/pods/#{ps.name}",
      %{metadata: %{annotations: %{Cluster.runtime_ready_annotation() => "true"}}},
      content_type: "application/merge-patch+json"
    )
  end

  # --- failure -----------------------------------------------------------------

  defp report_failure(c, pod, container, why) do
    %{"metadata" => %{"name" => name, "namespace" => ns, "uid" => uid}} = pod

    {code, output} =
      case why do
        {status, out} when is_integer(status) -> {status, out}
        {:exited, out} -> {1, out}
        text -> {1, text}
      end

    tail = output |> String.split("\n", trim: true) |> Enum.take(-10) |> Enum.join("\n")
    message = "init container #{container} failed (exit #{code}): #{tail}"

    statuses =
      for ctr <- pod["spec"]["initContainers"] || [], ctr["name"] == container do
        %{
          name: ctr["name"],
          image: ctr["image"],
          ready: false,
          restartCount: 0,
          state: %{terminated: %{exitCode: code, reason: "Error", message: tail}}
        }
      end

    now = DateTime.utc_now() |> DateTime.truncate(:second) |> DateTime.to_iso8601()

    Cluster.request(
      c,
      :admin,
      "PATCH",
      "/api/v1/namespaces/#{ns}/pods/#{name}/status",
      %{
        status: %{
          phase: "Pending",
          message: message,
          conditions: [
            %{
              type: "Initialized",
              status: "False",
              reason: "ContainersNotInitialized",
              message: message,
              lastTransitionTime: now
            }
          ],
          initContainerStatuses: statuses
        }
      },
      content_type: "application/merge-patch+json"
    )

    Cluster.request(c, :admin, "POST", "/api/v1/namespaces/#{ns}/events", %{
      apiVersion: "v1",
      kind: "Event",
      metadata: %{generateName: "#{name}."},
      involvedObject: %{kind: "Pod", name: name, namespace: ns, uid: uid, apiVersion: "v1"},
      reason: "Failed",
      message: message,
      type: "Warning",
      source: %{component: "condukt-tier-runtime"},
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1
    })

    message
  end

  # --- teardown ----------------------------------------------------------------

  defp teardown(state, node_name, opts) do
    ns = state.nodes[node_name]
    ps = ns.pod
    node = ns.node

    state =
      if ps.kwok_in_view do
        if opts[:restart_kwok] do
          argv = [
            Tier.tool!("ip"),
            "netns",
            "exec",
            node.netns | Cluster.kwok_node_args(state.c, node.kwok_kubeconfig, node.kwok_config, node.name)
          ]

          replace_kwok!(state, node, argv)
        else
          Cmd.kill([ns.kwok_pid], 5_000)
          state
        end
      else
        state
      end

    problems = stop_procs(state, ps)
    reset_netns(node)
    File.rm_rf(ps.dir)

    problems =
      case host_mounts(ps.dir) do
        [] -> problems
        left -> ["#{ps.namespace}/#{ps.name}: mounts left on the host: #{inspect(left)}" | problems]
      end

    state = %{state | problems: problems ++ state.problems, waiting: Map.delete(state.waiting, ps.uid)}
    put_pod(state, node_name, nil)
  end

  # A real pod's network namespace dies with it; the node's namespace
  # outlives its pod, so the pod's netfilter rules are removed instead.
  defp reset_netns(node) do
    for tool <- ~w(iptables ip6tables), table <- ~w(filter nat mangle raw) do
      for op <- ["-F", "-X"] do
        Cmd.run([Tier.tool!("nsenter"), "--net=/run/netns/#{node.netns}", "--", Tier.tool!(tool), "-t", table, op],
          timeout: 10_000,
          stderr: :discard
        )
      end
    end
  end

  # TERM, a drain period, then KILL; returns the sanitizer reports found
  # in the containers' logs.
  defp stop_procs(_state, ps) do
    # The containers first (they drain), then their log writers (which
    # copy what is left and exit).
    {containers, writers} = Enum.split_with(ps.procs, & &1.name)

    for group <- [containers, writers] do
      pids = Enum.map(group, & &1.pid)
      Cmd.kill(pids, @drain_ms)
      Cmd.poll(fn -> Enum.all?(pids, &(not Cmd.alive?(&1))) end, 5_000)
    end

    for %{name: name, stderr: log} <- containers,
        {:ok, text} <- [File.read(log)],
        text =~ ~r/Sanitizer|runtime error:/ do
      "#{ps.namespace}/#{ps.name}: container #{name} reported a sanitizer error:\n#{text}"
    end
  end

  defp tail(path) do
    case File.read(path) do
      {:ok, text} -> text |> String.split("\n") |> Enum.take(-30) |> Enum.join("\n")
      _ -> "(no log)"
    end
  end
end
