defmodule Condukt.Test.Containerd do
  @moduledoc """
  A private containerd for one test module: its own root, state, socket and
  namespace under a temporary directory, so it never touches a containerd
  the machine already runs. `start/1` returns a handle; `ctr/2` runs `ctr`
  against it; `stop/1` stops it and removes what it made.
  """
  alias Condukt.Dev.Netns.Cmd

  defstruct [:dir, :pid, :socket, namespace: "condukt-test"]
  @type t :: %__MODULE__{dir: Path.t(), pid: pos_integer(), socket: Path.t(), namespace: String.t()}

  @doc "Why this machine cannot run it, or `:ok`."
  @spec check() :: :ok | {:skip, String.t()}
  def check do
    cond do
      elem(System.cmd("id", ["-u"]), 0) != "0\n" -> {:skip, "needs root"}
      System.find_executable("containerd") == nil -> {:skip, "containerd is not installed (make setup)"}
      System.find_executable("runc") == nil -> {:skip, "runc is not installed (make setup)"}
      System.find_executable("mmdebstrap") == nil -> {:skip, "mmdebstrap is not installed (make setup)"}
      true -> :ok
    end
  end

  @spec start(Path.t()) :: t()
  def start(dir) do
    File.mkdir_p!(dir)
    socket = Path.join(dir, "containerd.sock")
    config = Path.join(dir, "config.toml")

    File.write!(config, """
    version = 2
    root = "#{dir}/root"
    state = "#{dir}/state"
    [grpc]
      address = "#{socket}"
    [ttrpc]
      address = "#{socket}.ttrpc"
    # Without it runc fails on this kind of machine (no CAP_SYS_RESOURCE):
    # "can't get final child's PID from pipe: EOF".
    [plugins."io.containerd.grpc.v1.cri"]
      restrict_oom_score_adj = true
    """)

    pid = Cmd.spawn_daemon(["containerd", "--config", config], Path.join(dir, "containerd.log"))
    c = %__MODULE__{dir: dir, pid: pid, socket: socket}

    case Cmd.poll(fn -> match?({_, 0}, ctr(c, ["version"])) end, 15_000, 100) do
      :ok -> c
      {:error, :timeout} -> raise "containerd did not start: #{File.read!(Path.join(dir, "containerd.log"))}"
    end
  end

  @doc "Runs `ctr` against this containerd; `{output, status}`."
  @spec ctr(t(), [String.t()], keyword()) :: {String.t(), integer()}
  def ctr(%__MODULE__{} = c, args, opts \\ []) do
    Cmd.run(["ctr", "--address", c.socket, "--namespace", c.namespace | args], Keyword.put_new(opts, :timeout, 60_000))
  end

  @doc "Stops containerd (its tasks first) and removes its directory."
  @spec stop(t()) :: :ok
  def stop(%__MODULE__{} = c) do
    {tasks, _} = ctr(c, ["tasks", "ls", "--quiet"])
    for t <- String.split(tasks, "\n", trim: true), do: ctr(c, ["tasks", "kill", "--signal", "SIGKILL", t])
    {containers, _} = ctr(c, ["containers", "ls", "--quiet"])
    for id <- String.split(containers, "\n", trim: true), do: ctr(c, ["containers", "rm", id])
    Cmd.kill([c.pid], 5_000)
    # Snapshots and task state may still be mounted.
    Cmd.run(["sh", "-c", ~s(grep -o " #{c.dir}/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l)])
    File.rm_rf(c.dir)
    :ok
  end
end
