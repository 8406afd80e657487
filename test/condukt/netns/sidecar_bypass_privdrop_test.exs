defmodule Condukt.Netns.SidecarBypassPrivdropTest do
  # The sidecar as a Kubernetes pod runs it: started as root with
  # CAP_NET_ADMIN, CAP_SETUID and CAP_SETGID (runtimes give a non-root
  # process no ambient capabilities), it becomes uid 1337 with
  # CAP_NET_ADMIN alone (`proxy --user`, docs/netfilter.md, "The
  # exemption"). Its upstream connections then carry the mark from the uid
  # the rules exempt, and nothing of root is left to take back.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Test.Netns.Sidecar

  @policy [rules: [allow: ["allowed.test"]], default: :deny]

  setup_all do
    tb = Testbed.start()
    %{tb: tb, sc: Sidecar.start(tb, @policy, drop_from_root: true)}
  end

  defp status(pid) do
    for line <- String.split(File.read!("/proc/#{pid}/status"), "\n"),
        [k, v] <- [String.split(line, ":\t", parts: 2)],
        into: %{},
        do: {k, String.trim(v)}
  end

  test "the proxy runs as 1337 with CAP_NET_ADMIN alone, and no way back", %{sc: sc} do
    st = status(sc.pid)
    assert String.split(st["Uid"]) == ~w(1337 1337 1337 1337)
    assert String.split(st["Gid"]) == ~w(1337 1337 1337 1337)
    assert st["Groups"] == ""
    net_admin = Integer.to_string(Bitwise.bsl(1, 12), 16) |> String.pad_leading(16, "0")
    assert String.upcase(st["CapEff"]) == net_admin
    assert String.upcase(st["CapPrm"]) == net_admin
    assert st["CapInh"] == "0000000000000000" and st["CapAmb"] == "0000000000000000"
    assert st["NoNewPrivs"] == "1"
  end

  test "its upstream connections are exempt (allowed origin reached) and the policy still holds",
       %{tb: tb, sc: sc} do
    for family <- [4, 6] do
      r = Client.run(tb, :curl, "https://allowed.test/", ca: sc.ca_cert, family: family)
      assert r.status == 200, "IPv#{family}: #{inspect(r)}\n#{Sidecar.stderr(sc)}"
      r = Client.run(tb, :curl, "https://denied.test/", ca: sc.ca_cert, family: family)
      assert r.status == 403, inspect(r)
    end

    assert Sidecar.stop(sc) =~ "drained, exiting"
  end

  test "a root proxy that cannot change uid refuses to run rather than run as root", %{tb: tb, sc: sc} do
    # The pod's start without CAP_SETUID and CAP_SETGID: the proxy reads
    # its files, then says why it cannot become 1337 and exits, rather
    # than run as root, whose marked sockets are not exempt.
    args =
      ["proxy", "--policy", sc.policy_path, "--ca-cert", sc.ca_cert, "--ca-key", Path.join(sc.dir, "ca.key")] ++
        ["--token-file", Path.join(sc.dir, "token"), "--session-id", "norights", "--listen", "127.0.0.1:15091"] ++
        ["--control", "unix:" <> Path.join(tb.dir, "norights.sock"), "--trust-bundle", Path.join(sc.dir, "mozilla.pem")] ++
        ["--user", "1337"]

    setpriv = [Condukt.Dev.Netns.Tier.tool!("setpriv"), "--regid=1337", "--clear-groups"]
    caps = ["--bounding-set=-all,+net_admin", "--inh-caps=-all", "--no-new-privs", "--"]
    {out, status} = Testbed.exec_in(tb, :pod, setpriv ++ caps ++ [sc.bin | args])
    assert status == 1, out
    assert out =~ "--user 1337: root without CAP_SETUID and CAP_SETGID cannot change uid"
    refute out =~ "proxy ready"
  end
end
