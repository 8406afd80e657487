defmodule Bench.Setup do
  @moduledoc false
  # What the benchmark and the soak change on the end-to-end testbed
  # (bench/README.md, "Testbed").

  alias Condukt.Dev.Netns.Cmd

  @doc """
  The 1 KiB body on allowed.test and decide.test, IPv4-only names in the
  pod, a wide local port range and TIME_WAIT reuse there, nginx with
  unlimited keep-alive requests (re-pinned to the load CPU), and the
  Python clients next to the testbed's own.
  """
  def prepare!(tb) do
    # The 1 KiB body, on the two names the benchmark uses.
    for site <- ~w(allowed.test decide.test) do
      File.write!(Path.join([tb.dir, "www", site, "1k.bin"]), :binary.copy("x", 1023) <> "\n")
    end

    # IPv4 only in the pod: every client and proxy takes the same path.
    hosts = Path.join(["/etc/netns", tb.pod_ns, "hosts"])

    File.write!(
      hosts,
      hosts |> File.read!() |> String.split("\n") |> Enum.reject(&(&1 =~ ~r/^fd00:/)) |> Enum.join("\n")
    )

    # Many short connections: a wide port range, TIME_WAIT reuse (both are
    # per namespace).
    Bench.Os.pod!(tb, ["/usr/sbin/sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000", "net.ipv4.tcp_tw_reuse=1"])
    # nginx ends a keep-alive connection after 1000 requests by default, and
    # h2load does not reconnect an h2 connection: the benchmark's nginx
    # serves any number (a reload; the new workers are pinned below).
    conf = Path.join([tb.dir, "nginx", "nginx.conf"])
    # 1000 idle connections may land on one worker: more than its 1024.
    text =
      conf
      |> File.read!()
      |> String.replace("keepalive_timeout 30s;", "keepalive_timeout 30s;\n  keepalive_requests 100000000;")
      |> String.replace("worker_connections 1024;", "worker_connections 8192;")

    File.write!(conf, text)
    {nginx_pid, _} = Integer.parse(File.read!(Path.join([tb.dir, "nginx", "nginx.pid"])))
    old_workers = Bench.Os.tree(nginx_pid) -- [nginx_pid]
    System.cmd("kill", ["-HUP", "#{nginx_pid}"])
    :ok = Cmd.poll(fn -> Enum.all?(old_workers, &(not Cmd.alive?(&1))) end, 10_000)
    Bench.Os.pin_inet(tb)
    Bench.Measure.install_clients(tb)
    :ok
  end
end
