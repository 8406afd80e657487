defmodule Condukt.K8s.CredentialsNodeTest do
  # Credential injection on the real node (docs/credentials.md): a
  # Kubernetes sandbox whose policy gives allowed.test a credential. The
  # origin (the testbed's nginx, whose /echo answers with the header
  # fields it received) gets the secret in place of the workspace's own
  # Authorization; another host gets the workspace's header untouched; the
  # workspace holds the value nowhere (environment, files, its mounts,
  # /proc); `rotate_credential/3` replaces the value in the sidecar's Secret
  # and, through the control channel, in the running sidecar, whose next
  # request carries it.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.NetworkPolicy

  @tools_image "condukt.test/workspace-tools:bookworm"
  @secret "Bearer k8s-s3cr3t-a1b2c3d4e5f6"
  @rotated "Bearer k8s-r0tated-f6e5d4c3b2a1"

  setup_all do
    Condukt.Test.K8s.Case.start_node_tier!()
  end

  test "the sidecar adds the credential, the workspace never holds it, a rotation reaches the Secret and the sidecar",
       ctx do
    me = self()
    handler = "cred-node-#{System.unique_integer([:positive])}"

    :telemetry.attach(
      handler,
      [:condukt, :sandbox, :network_policy, :control_connected],
      fn _, _, meta, _ -> send(me, {:connected, meta.session_id}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach(handler) end)

    c = ctx.cluster
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]
    id = "cred-#{System.unique_integer([:positive])}"

    policy = [
      rules: [allow: ["allowed.test", "other.test"]],
      credentials: [{"allowed.test", header: "authorization", value: {:secret, "token"}, paths: ["/echo"]}],
      # A function: resolved on the BEAM when the sandbox starts, never in
      # the pod's spec.
      secrets: %{"token" => fn -> @secret end},
      default: :deny
    ]

    on_exit({:terminate, id}, fn -> Kubernetes.terminate(id, namespace: c.namespace, conn: conn) end)

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes,
         id: id,
         namespace: c.namespace,
         conn: conn,
         image: @tools_image,
         heartbeat_interval: false,
         network_policy: policy,
         network_policy_image: ctx.egress_image,
         network_policy_upstream_ca: ctx.upstream_ca_pem,
         network_policy_allow_private: ctx.allow_private}
      )

    assert_receive {:connected, ^id}, 30_000

    # The origin receives exactly one Authorization: the credential, in
    # place of the one the workspace sent.
    assert authorizations(sb, "https://allowed.test/echo") == [@secret]
    # Another host (allowed, no credential) gets the workspace's own.
    assert authorizations(sb, "https://other.test/echo") == ["Bearer mine"]

    # The workspace holds the value nowhere.
    refute_held!(sb, @secret)

    # The pod's spec names the Secret, never a value.
    pod = Kubernetes.Names.pod_name(id)
    {200, spec} = Cluster.request(c, :admin, "GET", "/api/v1/namespaces/#{c.namespace}/pods/#{pod}")
    refute inspect(spec) =~ "s3cr3t"
    assert secret_values(c, pod) == %{"token" => @secret}

    # Rotation: the Secret first, then the running sidecar; the next
    # request carries the new value.
    assert :ok = NetworkPolicy.rotate_credential(sb, "token", @rotated)
    assert secret_values(c, pod) == %{"token" => @rotated}
    assert authorizations(sb, "https://allowed.test/echo") == [@rotated]
    assert authorizations(sb, "https://other.test/echo") == ["Bearer mine"]
    refute_held!(sb, @rotated)
    refute_held!(sb, @secret)

    # A name the policy has no secret for changes nothing.
    assert {:error, %NetworkPolicy.Error{reason: :unknown_secret}} =
             NetworkPolicy.rotate_credential(sb, "other", "Bearer x")

    assert secret_values(c, pod) == %{"token" => @rotated}
  end

  # The Authorization values the origin's /echo received from a workspace
  # request that sent its own "Bearer mine". The answer goes to stdout
  # only: no file of the workspace holds it.
  defp authorizations(sb, url) do
    cmd = "curl -sS --max-time 15 -H 'Authorization: Bearer mine' '#{url}?t=#{System.unique_integer([:positive])}'"
    {:ok, %{output: out, exit_code: code}} = Sandbox.exec(sb, cmd)
    assert code == 0, out
    %{"headers" => headers} = Condukt.JSON.decode!(out)
    for [k, v] <- headers, k == "authorization", do: v
  end

  # Searches the workspace for the value: its environment, every file of
  # its file system and mounts (the image's /usr aside, /proc and /sys
  # apart), every process's environ and cmdline, and checks that the
  # sidecar's directory is not mounted. The needle travels as hex, so the
  # search's own command line does not hold it.
  defp refute_held!(sb, value) do
    script = """
    import os, sys
    needle = bytes.fromhex(sys.argv[1])
    hits, seen = [], 0
    def scan(path):
        global seen
        try:
            with open(path, "rb") as f:
                data = f.read(4 << 20)
        except OSError:
            return
        seen += 1
        if needle in data:
            hits.append(path)
    skip = ("/proc", "/sys", "/dev", "/usr")
    for root, dirs, files in os.walk("/", followlinks=False):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in skip]
        for name in files:
            p = os.path.join(root, name)
            if os.path.isfile(p) and not os.path.islink(p):
                scan(p)
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for f in ("environ", "cmdline"):
                scan("/proc/%s/%s" % (pid, f))
    mounts = [l.split()[4] for l in open("/proc/self/mountinfo")]
    print("scanned=%d" % seen)
    print("mounts=" + ",".join(mounts))
    print("hits=" + ",".join(hits))
    """

    :ok = Sandbox.write(sb, ".scan.py", script)
    hex = Base.encode16(value, case: :lower)
    {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, "python3 .scan.py #{hex}; env")
    {:ok, _} = Sandbox.exec(sb, "rm -f .scan.py")

    [_, scanned] = Regex.run(~r/^scanned=(\d+)$/m, out)
    assert String.to_integer(scanned) > 100, out
    [_, mounts] = Regex.run(~r/^mounts=(.*)$/m, out)
    assert "/etc/condukt" in String.split(mounts, ",")
    refute Enum.any?(String.split(mounts, ","), &String.starts_with?(&1, "/etc/condukt-egress")), mounts
    assert Regex.run(~r/^hits=(.*)$/m, out) == ["hits=", ""], out
    # `env` printed the shell's environment after the scan.
    refute out =~ value
    refute out =~ "s3cr3t"
    refute out =~ "r0tated"
  end

  defp secret_values(c, pod) do
    path = "/api/v1/namespaces/#{c.namespace}/secrets/#{Kubernetes.Names.egress_secret(pod)}"
    {200, %{"data" => %{"credentials.json" => b64}}} = Cluster.request(c, :admin, "GET", path)
    %{"version" => 1, "secrets" => values} = b64 |> Base.decode64!() |> Condukt.JSON.decode!()
    values
  end
end
