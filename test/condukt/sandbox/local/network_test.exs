defmodule Condukt.Sandbox.Local.NetworkTest do
  # The Local sandbox's enforcement plane on its own: a session namespace
  # uplinked into the testbed's "internet" namespace, the real sidecar in
  # it, and commands run through wrap/2 as a session would run them.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Sandbox.Local.{Network, NetworkError}
  alias Condukt.Sandbox.NetworkPolicy

  @state_dir "/run/condukt/local"

  setup_all do
    tb = Testbed.start(big_size: 1024)
    %{tb: tb}
  end

  defp start_network(tb, extra \\ []) do
    policy = NetworkPolicy.new!(rules: [deny: ["denied.test"], allow: ["allowed.test", "v4.test"]], default: :deny)

    opts =
      [
        policy: policy,
        session_id: "local-test",
        uplink: {:netns, tb.inet_ns},
        hosts: Map.new(~w(allowed.test denied.test other.test v4.test), &{&1, tb.inet.v4}),
        allow_private: [tb.inet.v4 <> "/32"],
        upstream_ca: tb.ca_cert,
        binary: Condukt.Test.Netns.Sidecar.bin()
      ] ++ extra

    {:ok, pid, net} = Network.start(opts)
    on_exit(fn -> Network.stop(pid) end)
    {pid, net}
  end

  # Runs `argv` as a session command: inside the namespace, no capability.
  defp session_cmd(net, argv, timeout \\ 20_000) do
    env = [{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}, {"HOME", "/tmp"} | Network.env(net)]
    Cmd.run(Network.wrap(net, argv), env: env, timeout: timeout)
  end

  defp curl(net, url),
    do: session_cmd(net, ["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}", url])

  test "requests pass through the sidecar: allowed, denied in words, other ports blocked", %{tb: tb} do
    {_pid, net} = start_network(tb)

    assert {out, 0} = curl(net, "https://allowed.test/")
    assert out =~ "hello from allowed.test"
    assert out =~ ~r/\n200$/

    assert {out, 0} = curl(net, "https://denied.test/")
    assert out =~ ~r/\n403$/
    assert out =~ "rule 0 (deny)"

    assert {out, 0} = curl(net, "http://other.test/")
    assert out =~ ~r/\n403$/
    assert out =~ "default"

    # A port the rules do not redirect is rejected by the namespace's filter.
    assert {_, status} = session_cmd(net, ["curl", "-sS", "--max-time", "5", "http://#{tb.inet.v4}:8080/"])
    assert status != 0

    events = Network.events(net)
    assert Enum.any?(events, &(&1["event"] == "request_allowed" and &1["host"] == "allowed.test"))
    assert Enum.any?(events, &(&1["event"] == "request_denied" and &1["host"] == "denied.test"))
  end

  test "a rewritten hosts file of the namespace does not move where the sidecar connects", %{tb: tb} do
    {_pid, net} = start_network(tb)
    # What a session that can write the namespace's /etc/hosts would do
    # (written here by the test, so that it holds whatever uid sessions
    # run as): allowed.test now names the testbed's decoy address.
    File.write!(Path.join(["/etc/netns", net.name, "hosts"]), "#{tb.inet.decoy} allowed.test\n")
    assert {out, 0} = session_cmd(net, ["getent", "hosts", "allowed.test"])
    assert out =~ tb.inet.decoy

    # curl dials the decoy; the REDIRECT brings it to the sidecar, which
    # connects where its own copy of the names says (docs/dns.md).
    assert {out, 0} = curl(net, "http://allowed.test/")
    assert out =~ "hello from allowed.test" and out =~ ~r/\n200$/, out
    refute out =~ "decoy"
  end

  test "session commands hold no capability and cannot read the sidecar's secrets", %{tb: tb} do
    {_pid, net} = start_network(tb)

    assert {out, status} = session_cmd(net, [Condukt.Dev.Netns.Tier.tool!("iptables"), "-t", "nat", "-F"])
    assert status != 0, "a session command flushed the rules: #{out}"

    for secret <- ~w(ca.key token policy.json) do
      assert {_, status} = session_cmd(net, ["cat", Path.join(net.dir, secret)])
      assert status != 0, "a session command read #{secret}"
    end

    # Leaving the namespace needs CAP_SYS_ADMIN.
    assert {_, status} = session_cmd(net, ["nsenter", "-t", "1", "-n", "true"])
    assert status != 0

    # The CA certificate and the trust bundle are readable.
    assert {pem, 0} = session_cmd(net, ["cat", net.ca_cert])
    assert pem =~ "BEGIN CERTIFICATE"
  end

  test "commands may run as another uid", %{tb: tb} do
    {_pid, net} = start_network(tb, user: 4242)
    assert {"4242\n", 0} = session_cmd(net, ["id", "-u"])
    assert {out, 0} = curl(net, "https://allowed.test/")
    assert out =~ ~r/\n200$/
  end

  test "programs and files the BEAM runs or trusts must be root's alone", %{tb: tb} do
    # A tool directory under /run (root's), with links to the real tools,
    # except `ip`, which is a copy the session's uid could rewrite.
    dir = "/run/condukt-tools-#{System.unique_integer([:positive])}"
    on_exit(fn -> File.rm_rf!(dir) end)
    File.mkdir_p!(dir)
    File.chmod!(dir, 0o755)

    debian = fn tool ->
      Enum.find(Enum.map(~w(/usr/sbin /usr/bin /sbin /bin), &Path.join(&1, tool)), &File.regular?/1)
    end

    for tool <- ~w(setpriv unshare mount mkdir iptables iptables-restore ip6tables ip6tables-restore sh env bash) do
      File.ln_s!(debian.(tool), Path.join(dir, tool))
    end

    File.cp!(debian.("ip"), Path.join(dir, "ip"))
    File.chmod!(Path.join(dir, "ip"), 0o755)

    # Root's and safe: enforcement is available.
    assert :ok = Network.available?(tool_path: dir)

    File.chown!(Path.join(dir, "ip"), 65_534)
    assert {:error, %NetworkError{reason: :untrusted_path} = e} = Network.available?(tool_path: dir)
    assert Exception.message(e) =~ "`ip`: #{dir}/ip belongs to uid 65534"

    # A directory others may write, on the way to a tool (links followed).
    File.chown!(Path.join(dir, "ip"), 0)
    File.chmod!(dir, 0o777)
    assert {:error, %NetworkError{reason: :untrusted_path} = e} = Network.available?(tool_path: dir)
    assert Exception.message(e) =~ "writable by everyone"
    File.chmod!(dir, 0o755)

    # A link to a tool in a directory anybody may write (not sticky).
    File.rm!(Path.join(dir, "ip"))
    open = Path.join(tb.dir, "open")
    File.mkdir_p!(open)
    File.chmod!(open, 0o777)
    writable = Path.join(open, "ip")
    File.cp!(debian.("ip"), writable)
    File.ln_s!(writable, Path.join(dir, "ip"))
    assert {:error, %NetworkError{reason: :untrusted_path} = e} = Network.available?(tool_path: dir)
    assert Exception.message(e) =~ "#{open} is writable by everyone"

    # The sidecar binary is copied and run as root: the same rule.
    bin = Path.join(open, "condukt-egress")
    File.cp!(Condukt.Test.Netns.Sidecar.bin(), bin)

    assert {:error, %NetworkError{reason: :untrusted_path} = e} =
             Network.start(policy: NetworkPolicy.new!(rules: []), uplink: {:netns, tb.inet_ns}, binary: bin)

    assert Exception.message(e) =~ "the sidecar binary"
  end

  test "the session's uid is never root, the sidecar's or the BEAM's", %{tb: tb} do
    {_pid, net} = start_network(tb)
    assert {"65534\n", 0} = session_cmd(net, ["id", "-u"])
    assert {"65534\n", 0} = session_cmd(net, ["id", "-G"])

    for {opts, said} <- [
          {[user: 0], "uid 0 owns the host's root files"},
          {[user: 1337], ":user 1337 is the sidecar's uid"},
          {[user: 5000, sidecar_uid: 5000], ":user 5000 is the sidecar's uid"},
          {[user: -1], "a uid"}
        ] do
      assert {:error, %NetworkError{reason: :invalid_option} = e} =
               Network.start([policy: NetworkPolicy.new!(rules: [])] ++ opts)

      assert Exception.message(e) =~ said
    end
  end

  test "sessions with the same uid cannot see, signal or trace each other's processes", %{tb: tb} do
    {_, a} = start_network(tb)
    {_, b} = start_network(tb)
    assert a.user == b.user

    # Session b runs a command holding a secret in its environment.
    env = [{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}, {"CONDUKT_SECRET", "s3cret-of-b"}]
    # Its sleep dies with b's namespace at the latest (stop/1 kills it).
    victim = Task.async(fn -> Cmd.run(Network.wrap(b, ["sleep", "30"]), env: env, timeout: 40_000) end)

    :ok =
      Cmd.poll(
        fn -> match?({_, 0}, Cmd.run(["pgrep", "-u", "#{b.user}", "-f", "^sleep 30$"], timeout: 2_000)) end,
        10_000
      )

    {pgrep, 0} = Cmd.run(["pgrep", "-u", "#{b.user}", "-f", "^sleep 30$"])
    host_pid = pgrep |> String.split() |> hd()

    # Session a looks for it, reads environments, signals by the host pid.
    script = """
    for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < "$f"; done 2>/dev/null | grep CONDUKT_SECRET
    ls /proc | grep -c '^[0-9]' ; kill -KILL #{host_pid} && echo killed
    """

    {out, _} = session_cmd(a, ["sh", "-c", script])
    refute out =~ "s3cret-of-b"
    refute out =~ "killed"
    # It sees its own few processes only (sh, tr/ls, grep).
    [count | _] = out |> String.split("\n", trim: true) |> Enum.filter(&(&1 =~ ~r/^\d+$/))
    assert String.to_integer(count) < 10
    assert File.exists?("/proc/#{host_pid}")
    Task.shutdown(victim, :brutal_kill)
  end

  test "stop/1 and the owner's exit remove everything", %{tb: tb} do
    {pid, net} = start_network(tb)
    assert net.name in Testbed.list_namespaces()
    :ok = Network.stop(pid)
    refute net.name in Testbed.list_namespaces()
    refute File.exists?(net.dir)
    refute File.exists?(Path.join("/etc/netns", net.name))
    refute File.exists?(net.events_log)
    refute File.exists?("/proc/#{net.proxy_pid}")
    # Idempotent.
    :ok = Network.stop(pid)

    test = self()

    owner =
      spawn(fn ->
        {:ok, pid, net} =
          Network.start(policy: NetworkPolicy.new!(rules: [], default: :deny), uplink: {:netns, tb.inet_ns})

        send(test, {:started, pid, net})
        receive do: (:exit -> :ok)
      end)

    assert_receive {:started, npid, net2}, 30_000
    ref = Process.monitor(npid)
    send(owner, :exit)
    assert_receive {:DOWN, ^ref, :process, ^npid, :normal}, 30_000
    refute net2.name in Testbed.list_namespaces()
    refute File.exists?(net2.dir)
  end

  test "sweep/0 removes what a dead BEAM left behind", %{tb: _tb} do
    name = "condukt-" <> (:crypto.strong_rand_bytes(5) |> Base.encode16(case: :lower))
    ip = Condukt.Dev.Netns.Tier.tool!("ip")
    {_, 0} = Cmd.run([ip, "netns", "add", name])
    on_exit(fn -> Cmd.run([ip, "netns", "del", name]) end)
    File.mkdir_p!("/run/condukt/owners")
    net = %Network{name: name, dir: Path.join(@state_dir, name)}
    File.mkdir_p!(net.dir)
    dead_pid = 2_000_000_000
    File.write!(Path.join("/run/condukt/owners", name), :erlang.term_to_binary({dead_pid, "boot", net}))

    assert name in Network.sweep()
    refute name in Testbed.list_namespaces()
    refute File.exists?(net.dir)
  end

  test "the :host uplink: a veth to the host, masqueraded, rules removed at stop", %{tb: _tb} do
    policy = NetworkPolicy.new!(rules: [deny: ["denied.test"]], default: :allow)

    {:ok, pid, net} =
      Network.start(
        policy: policy,
        uplink: :host,
        allow_private: ["100.127.0.0/16"],
        binary: Condukt.Test.Netns.Sidecar.bin()
      )

    on_exit(fn -> Network.stop(pid) end)
    {gw, _} = net.subnet

    {nat, 0} = Cmd.run([Condukt.Dev.Netns.Tier.tool!("iptables"), "-w", "-t", "nat", "-S", "POSTROUTING"])
    assert nat =~ "condukt:#{net.name}"

    # A web server on the host end of the veth, which this test created.
    www = Path.join(System.tmp_dir!(), "condukt-local-www-#{System.unique_integer([:positive])}")
    File.mkdir_p!(www)
    File.write!(Path.join(www, "hello.txt"), "hello from the host\n")
    on_exit(fn -> File.rm_rf!(www) end)

    server =
      Cmd.spawn_daemon(
        ["/usr/bin/python3", "-m", "http.server", "80", "--bind", gw, "--directory", www],
        Path.join(www, "log")
      )

    on_exit(fn -> Cmd.kill([server]) end)

    :ok =
      Cmd.poll(
        fn -> match?({_, 0}, Cmd.run(["curl", "-s", "-o", "/dev/null", "http://#{gw}/hello.txt"], timeout: 2_000)) end,
        10_000
      )

    assert {out, 0} = curl(net, "http://#{gw}/hello.txt")
    assert out =~ "hello from the host"
    assert Enum.any?(Network.events(net), &(&1["event"] == "request_allowed" and &1["host"] == gw))

    :ok = Network.stop(pid)
    {nat, 0} = Cmd.run([Condukt.Dev.Netns.Tier.tool!("iptables"), "-w", "-t", "nat", "-S", "POSTROUTING"])
    refute nat =~ "condukt:#{net.name}"
    {filter, 0} = Cmd.run([Condukt.Dev.Netns.Tier.tool!("iptables"), "-w", "-S", "FORWARD"])
    refute filter =~ "condukt:#{net.name}"
  end

  test "bad options are named" do
    assert {:error, %NetworkError{reason: :invalid_option} = e} = Network.start(policy: :nope)
    assert Exception.message(e) =~ ":policy"

    assert {:error, %NetworkError{reason: :invalid_option} = e} =
             Network.start(policy: NetworkPolicy.new!(rules: []), uplnk: :host)

    assert Exception.message(e) =~ "did you mean :uplink?"

    # A hosts entry is one line of /etc/hosts: nothing else may get in.
    for hosts <- [%{"evil.test\n10.0.0.1 bank.test" => "10.0.0.2"}, %{"ok.test" => "10.0.0.1 x"}, %{"a b" => "::1"}] do
      assert {:error, %NetworkError{reason: :invalid_option} = e} =
               Network.start(policy: NetworkPolicy.new!(rules: []), hosts: hosts)

      assert Exception.message(e) =~ ":hosts"
    end

    assert {:error, %NetworkError{reason: :invalid_option} = e} =
             Network.start(policy: NetworkPolicy.new!(rules: []), proxy_args: ["--verbose", 1])

    assert Exception.message(e) =~ "a list of strings"
  end
end
