defmodule Condukt.Sandbox.LocalEnforcedTest do
  # Condukt.Sandbox.Local with a network policy, through the facade: the
  # session's commands run behind the real sidecar (netns tier).
  use Condukt.Test.Netns.Case, async: false

  import ExUnit.CaptureLog

  alias Condukt.Sandbox
  alias Condukt.Sandbox.NetworkPolicy

  setup_all do
    %{tb: Testbed.start(big_size: 1024)}
  end

  defp network(tb, extra \\ []) do
    [
      uplink: {:netns, tb.inet_ns},
      hosts: Map.new(~w(allowed.test denied.test other.test), &{&1, tb.inet.v4}),
      allow_private: [tb.inet.v4 <> "/32"],
      upstream_ca: tb.ca_cert,
      binary: Condukt.Test.Netns.Sidecar.bin()
    ]
    |> Keyword.merge(extra)
  end

  defp policy, do: NetworkPolicy.new!(rules: [deny: ["denied.test"], allow: ["allowed.test"]], default: :deny)

  test "exec runs behind the sidecar; shutdown removes the namespace", %{tb: tb} do
    cwd = scratch(tb)
    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: cwd, id: "sess-1", network_policy: policy(), network: network(tb)})

    net = sb.state.network
    assert net.name in Testbed.list_namespaces()

    curl = "curl -sS --max-time 10 -w '\\n%{http_code}' "
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, curl <> "https://allowed.test/")
    assert out =~ "hello from allowed.test"
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, curl <> "https://denied.test/")
    assert out =~ ~r/\n403$/
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, curl <> "https://other.test/")
    assert out =~ "policy default"

    # The command starts in the sandbox's cwd, even inside the namespace.
    assert {:ok, %{output: out}} = Sandbox.exec(sb, "pwd")
    assert String.trim(out) == cwd

    # A timeout still kills the whole command inside the namespace.
    assert {:error, %Sandbox.Error{reason: :timeout}} = Sandbox.exec(sb, "sleep 30", timeout: 500)

    # A process that leaves the process group (setsid) does not outlive
    # the command either: it dies with the command's PID namespace.
    marker = "#{3000 + rem(System.unique_integer([:positive]), 1000)}.5"
    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "setsid sleep #{marker} </dev/null >/dev/null 2>&1 & sleep 0.2")

    :ok =
      Condukt.Dev.Netns.Cmd.poll(
        fn -> match?({_, 1}, Condukt.Dev.Netns.Cmd.run(["pgrep", "-f", "^sleep #{marker}$"])) end,
        5_000
      )

    events = Condukt.Sandbox.Local.Network.events(net)
    assert Enum.any?(events, &(&1["event"] == "request_denied" and &1["host"] == "denied.test"))

    :ok = Sandbox.shutdown(sb)
    refute net.name in Testbed.list_namespaces()
  end

  def decider(_ctx, %{host: "decide.test"}), do: :allow
  def decider(_ctx, %{host: host}), do: {:deny, "#{host} is not needed for this task"}

  test "an Elixir decider and :telemetry handlers, through the real sidecar", %{tb: tb} do
    test = self()
    id = "telemetry-#{System.unique_integer([:positive])}"

    events =
      Enum.map(
        ~w(request_opened request_allowed request_denied request_closed request_failed decider_failure)a,
        &[:condukt, :sandbox, :network_policy, &1]
      )

    # One handler per event, attached with :telemetry.attach/4 as a user would.
    for event <- events do
      :ok =
        :telemetry.attach(
          {id, event},
          event,
          fn name, measurements, metadata, _ -> send(test, {:telemetry, name, measurements, metadata}) end,
          nil
        )
    end

    on_exit(fn -> Enum.each(events, &:telemetry.detach({id, &1})) end)

    policy =
      NetworkPolicy.new!(
        rules: [deny: ["denied.test"], allow: ["allowed.test"], decide: &__MODULE__.decider/2],
        default: :deny
      )

    hosts = Map.new(~w(allowed.test denied.test decide.test other.test), &{&1, tb.inet.v4})

    {:ok, sb} =
      Sandbox.new({Sandbox.Local, id: id, cwd: scratch(tb), network_policy: policy, network: network(tb, hosts: hosts)})

    on_exit(fn -> Sandbox.shutdown(sb) end)

    curl = "curl -sS --max-time 10 -w '\\n%{http_code}' "
    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://decide.test/")
    assert out =~ "hello from decide.test"

    assert_receive {:telemetry, [_, _, _, :request_allowed], %{bytes_in: _, bytes_out: _},
                    %{request: %{host: "decide.test"}, matched_rule: %{index: 2, kind: :decide}}},
                   10_000

    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://other.test/")
    assert out =~ ~r/\n403$/
    assert out =~ "other.test is not needed for this task"

    assert_receive {:telemetry, [_, _, _, :request_denied], _,
                    %{request: %{host: "other.test"}, reason: reason, matched_rule: %{kind: :decide}}},
                   10_000

    assert reason =~ "not needed"

    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://denied.test/")
    assert out =~ ~r/\n403$/

    assert_receive {:telemetry, [_, _, _, :request_denied], _,
                    %{request: %{host: "denied.test"}, matched_rule: %{index: 0, kind: :deny}}},
                   10_000

    assert_receive {:telemetry, [_, _, _, :request_closed], %{bytes_in: bytes}, %{request: %{host: "decide.test"}}},
                   10_000

    assert bytes > 0
  end

  # The decider of the cache attack: it allows reading /headers and
  # nothing else, and tells the test each time it is asked. It decides by
  # method and path, so its denies are for the request (a bare deny would
  # cover the host).
  def public_only(ctx, req) do
    send(ctx.metadata.test, {:asked, req.method, req.path})

    if req.method == "GET" and req.path == "/headers",
      do: :allow,
      else: {:deny, "only GET /headers", scope: :request}
  end

  test "an allowed GET does not let a POST elsewhere out without asking the decider", %{tb: tb} do
    test = self()
    id = "cache-#{System.unique_integer([:positive])}"
    denied = [:condukt, :sandbox, :network_policy, :request_denied]

    :ok =
      :telemetry.attach(
        id,
        denied,
        fn _, _, %{request: %{host: "decide.test"}} = meta, _ -> send(test, {:denied, meta}) end,
        nil
      )

    on_exit(fn -> :telemetry.detach(id) end)

    # cache: true is the default; spelt out because it is what is attacked.
    rule = [call: &__MODULE__.public_only/2, cache: true, context_metadata: %{test: test}]
    policy = NetworkPolicy.new!(rules: [decide: rule], default: :deny)
    hosts = %{"decide.test" => tb.inet.v4}

    {:ok, sb} =
      Sandbox.new({Sandbox.Local, id: id, cwd: scratch(tb), network_policy: policy, network: network(tb, hosts: hosts)})

    on_exit(fn -> Sandbox.shutdown(sb) end)

    curl = "curl -sS --max-time 10 -w '\n%{http_code}' "
    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://decide.test/headers")
    assert out =~ "method=GET" and out =~ ~r/\n200$/
    assert_receive {:asked, "GET", "/headers"}, 10_000

    # The same request again is answered from the cache: the decider is
    # not asked.
    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://decide.test/headers")
    assert out =~ ~r/\n200$/
    refute_received {:asked, _, _}

    # The attack: a POST with a body to another path of the same host.
    assert {:ok, %{output: out}} =
             Sandbox.exec(sb, curl <> "-X POST --data-binary 'the secret' https://decide.test/upload")

    assert_receive {:asked, "POST", "/upload"}, 10_000
    assert out =~ ~r/\n403$/
    assert out =~ "only GET /headers"
    assert_receive {:denied, %{reason: "only GET /headers", request: %{method: "POST", path: "/upload"}}}, 10_000

    # Another method on the allowed path is asked too.
    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "-X DELETE https://decide.test/headers")
    assert_receive {:asked, "DELETE", "/headers"}, 10_000
    assert out =~ ~r/\n403$/

    # And the allowed request is still allowed, from the cache.
    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://decide.test/headers")
    assert out =~ ~r/\n200$/
    refute_received {:asked, _, _}
  end

  # A working directory the session's default uid (nobody) owns.
  # A cwd the session's user (nobody) owns.
  defp scratch(tb), do: Testbed.scratch_dir(tb, 65_534)

  test "a session cannot replace what the BEAM runs, nor touch the audit log or its hosts file", %{tb: tb} do
    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: scratch(tb), network_policy: policy(), network: network(tb)})
    on_exit(fn -> Sandbox.shutdown(sb) end)
    net = sb.state.network

    # Not root (whose uid owns every root file, capabilities or not):
    # nobody.
    assert {:ok, %{output: "65534\n"}} = Sandbox.exec(sb, "id -u")

    assert {:ok, %{output: out}} = Sandbox.exec(sb, "curl -sS --max-time 10 https://allowed.test/")
    assert out =~ "hello from allowed.test"
    hosts = File.read!(Path.join(["/etc/netns", net.name, "hosts"]))
    audit = File.read!(net.events_log)
    assert audit =~ "allowed.test"

    probe = "condukt-probe-#{System.unique_integer([:positive])}"
    tool_dirs = net.tools |> Map.values() |> Enum.map(&Path.dirname/1) |> Enum.uniq()
    # Only there if an attack below worked.
    on_exit(fn -> Enum.each(tool_dirs, &File.rm(Path.join(&1, probe))) end)

    # Each opens for writing (appending nothing, so that a success would
    # change no file) or creates a file: every one must be refused.
    attacks =
      for({tool, path} <- net.tools, do: {"write #{tool}", ": >> #{path}"}) ++
        for(dir <- tool_dirs, do: {"add a program to #{dir}", ": > #{dir}/#{probe}"}) ++
        [
          {"write the sidecar binary", ": >> #{Path.join(net.dir, "condukt-egress")}"},
          {"write the sidecar binary's source", ": >> #{Condukt.Test.Netns.Sidecar.bin()}"},
          {"truncate the audit log", ": > #{net.events_log}"},
          {"append to the audit log", "echo '{\"event\":\"request_closed\"}' >> #{net.events_log}"},
          {"read the audit log", "cat #{net.events_log}"},
          {"list the audit directory", "ls #{Path.dirname(net.events_log)}"},
          {"rewrite the hosts file", "echo '203.0.113.9 allowed.test' >> /etc/hosts"},
          {"rewrite it by its own name", "echo '203.0.113.9 allowed.test' >> /etc/netns/#{net.name}/hosts"},
          {"rewrite resolv.conf", "echo 'nameserver 203.0.113.9' >> /etc/resolv.conf"},
          {"signal the sidecar", "kill -0 #{net.proxy_pid}"}
        ]

    for {what, command} <- attacks do
      assert {:ok, %{exit_code: code, output: out}} = Sandbox.exec(sb, command)
      assert code != 0, "the session could #{what} (#{command}): #{out}"

      assert out =~ ~r/Permission denied|Operation not permitted|No such process|No such file or directory/,
             "#{what}: #{out}"
    end

    assert File.read!(Path.join(["/etc/netns", net.name, "hosts"])) == hosts
    assert String.starts_with?(File.read!(net.events_log), audit)
    refute File.read!(net.events_log) =~ "203.0.113.9"
    assert {:ok, %{output: out}} = Sandbox.exec(sb, "curl -sS --max-time 10 https://allowed.test/")
    assert out =~ "hello from allowed.test"
  end

  test "a host service's Unix socket under /run is out of the session's reach", %{tb: tb} do
    # A world-connectable socket, as the system D-Bus or systemd-resolved
    # offer: a resolver would make DNS queries from the host's network.
    sock = "/run/condukt-test-service-#{System.unique_integer([:positive])}.sock"
    on_exit(fn -> File.rm(sock) end)

    server = """
    import os, socket
    s = socket.socket(socket.AF_UNIX); s.bind(#{inspect(sock)}); os.chmod(#{inspect(sock)}, 0o777); s.listen(4)
    while True:
        c, _ = s.accept(); c.sendall(b"host service here\\n"); c.close()
    """

    daemon = Condukt.Dev.Netns.Cmd.spawn_daemon(["python3", "-c", server], Path.join(tb.dir, "service.log"))
    on_exit(fn -> Condukt.Dev.Netns.Cmd.kill([daemon]) end)

    client =
      "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); " <>
        "s.connect(\"#{sock}\"); print(s.recv(64).decode(), end=\"\")'"

    :ok = Condukt.Dev.Netns.Cmd.poll(fn -> File.exists?(sock) end, 5_000)
    # Any uid on the host reaches it.
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", client]
    assert {"host service here\n", 0} = Condukt.Dev.Netns.Cmd.run(nobody)

    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: scratch(tb), network_policy: policy(), network: network(tb)})
    on_exit(fn -> Sandbox.shutdown(sb) end)
    assert {:ok, %{output: out, exit_code: code}} = Sandbox.exec(sb, client)
    assert code != 0
    assert out =~ "No such file or directory"
    refute out =~ "host service here"

    # The session's own directory is still there (its trust bundle).
    assert {:ok, %{output: pem, exit_code: 0}} = Sandbox.exec(sb, "cat #{sb.state.network.bundle}")
    assert pem =~ "BEGIN CERTIFICATE"
  end

  test "variables set for the commands never make the BEAM run the session's files as root", %{tb: tb} do
    cwd = scratch(tb)
    File.chown!(cwd, 4242)
    # Only root can write here: the marker exists only if root ran a hook.
    marks = "/run/condukt-test-marks-#{System.unique_integer([:positive])}"
    File.mkdir_p!(marks)
    File.chmod!(marks, 0o755)
    on_exit(fn -> File.rm_rf!(marks) end)
    marker = Path.join(marks, "ran-as-root")

    # A preload library whose constructor marks a root process; the test
    # compiles it, the session owns it (it could write one like it).
    src = Path.join(tb.dir, "hook-#{System.unique_integer([:positive])}.c")

    File.write!(src, """
    #include <stdio.h>
    #include <unistd.h>
    __attribute__((constructor)) static void hook(void) {
      if (getuid() == 0 || geteuid() == 0) { FILE *f = fopen("#{marker}", "a"); if (f) { fputs("preload\\n", f); fclose(f); } }
    }
    """)

    {_, 0} = Condukt.Dev.Netns.Cmd.run(["cc", "-shared", "-fPIC", "-o", Path.join(cwd, "hook.so"), src])
    File.chown!(Path.join(cwd, "hook.so"), 4242)

    env = %{
      "BASH_ENV" => Path.join(cwd, "hook.sh"),
      "LD_PRELOAD" => Path.join(cwd, "hook.so"),
      "BASH_FUNC_kill%%" => "() { echo function >> #{marker}; }"
    }

    {:ok, sb} =
      Sandbox.new({Sandbox.Local, cwd: cwd, env: env, network_policy: policy(), network: network(tb, user: 4242)})

    on_exit(fn -> Sandbox.shutdown(sb) end)

    # The session writes the file BASH_ENV names.
    hook = "[ \"$(id -u)\" = 0 ] && echo bash_env >> #{marker}; echo \"hook as $(id -u)\""
    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "printf '%s\\n' '#{hook}' > hook.sh")

    # The command's own shell, as the session, gets the variables ...
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, "echo \"$LD_PRELOAD\"; kill -0 $$ && echo alive")
    assert out =~ "hook as 4242"
    assert out =~ Path.join(cwd, "hook.so")
    assert out =~ "alive"
    # ... and nothing ran as root with them (the wrapper's bash sources
    # BASH_ENV and calls kill; ip, unshare and setpriv load LD_PRELOAD).
    assert {:error, :enoent} = File.read(marker)
    # The watchdog's kill on a timeout is the builtin, not the function.
    assert {:error, %Sandbox.Error{reason: :timeout}} = Sandbox.exec(sb, "sleep 5", timeout: 300)
    assert {:error, :enoent} = File.read(marker)
  end

  test "the session's uid: nobody by default, another on request; root and the sidecar's uid are refused",
       %{tb: tb} do
    cwd = scratch(tb)
    File.chown!(cwd, 4242)

    # Not the cwd's owner by default (its own processes and dotfiles live
    # outside the namespace): nobody, and a warning that it cannot write.
    log =
      capture_log(fn ->
        {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: cwd, network_policy: policy(), network: network(tb)})
        assert {:ok, %{output: out}} = Sandbox.exec(sb, "id -u; echo made > made.txt")
        assert out =~ "65534\n"
        assert out =~ "Permission denied"
        :ok = Sandbox.shutdown(sb)
      end)

    assert log =~ "commands run as uid 65534, which cannot write the cwd #{cwd} (owned by uid 4242)"

    # The uid that owns the cwd, asked for, works in it.
    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: cwd, network_policy: policy(), network: network(tb, user: 4242)})
    on_exit(fn -> Sandbox.shutdown(sb) end)
    assert {:ok, %{output: "4242\n", exit_code: 0}} = Sandbox.exec(sb, "echo made > made.txt && id -u")
    assert File.read!(Path.join(cwd, "made.txt")) == "made\n"
    :ok = Sandbox.shutdown(sb)

    # The sidecar's uid reads the control token and answers decisions.
    before = Testbed.list_namespaces()

    for {network, said} <- [
          {[user: 1337], "sidecar's uid"},
          {[user: 4000, sidecar_uid: 4000], "sidecar's uid"},
          {[user: 0], "uid 0 owns the host's root files"}
        ] do
      assert {:error, %Sandbox.Error{reason: :network_policy_unenforceable} = e} =
               Sandbox.new({Sandbox.Local, cwd: cwd, network_policy: policy(), network: network(tb, network)})

      assert Exception.message(e) =~ said
    end

    # Refused before anything was made.
    assert Testbed.list_namespaces() -- before == []

    # The default session cannot read the token either.
    File.chown!(cwd, 65_534)

    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: cwd, network_policy: policy(), network: network(tb)})
    assert {:ok, %{output: "65534\n"}} = Sandbox.exec(sb, "id -u")
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "cat #{Path.join(sb.state.network.dir, "token")}")
    assert code != 0
    :ok = Sandbox.shutdown(sb)
  end

  test "unenforceable: one warning and unenforced, or an error when required", %{tb: tb} do
    # No `setpriv` in this tool path: enforcement is impossible.
    empty = Path.join(tb.dir, "no-tools-#{System.unique_integer([:positive])}")
    File.mkdir_p!(empty)
    opts = [network_policy: policy(), network: network(tb, tool_path: empty)]

    log =
      capture_log(fn ->
        assert {:ok, sb} = Sandbox.new({Sandbox.Local, opts})
        assert sb.state.network == nil
        assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "true")
      end)

    assert log =~ "network policy is NOT enforced"
    assert log =~ "`ip`"

    assert {:error, %Sandbox.Error{reason: :network_policy_unenforceable} = e} =
             Sandbox.new({Sandbox.Local, opts ++ [network_policy_required: true]})

    assert Exception.message(e) =~ "not installed"
  end
end
