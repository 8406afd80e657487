defmodule Condukt.Netns.SidecarConntrackTest do
  # Conntrack entries left by an earlier sidecar (docs/netfilter.md, "Stale
  # conntrack entries"). The sidecar's upstream connections are exempt
  # from the REDIRECT, so their conntrack entries are un-NATed; when the
  # sidecar dies such an entry can stay ESTABLISHED for days, and a
  # workspace connection whose source port collides with it matches it:
  # conntrack ignores a SYN on an ESTABLISHED entry and does not decide NAT
  # again, so the connection is not redirected and the final REJECT
  # refuses it. netfilter-setup copies the sidecar's mark into the
  # connection mark, and the proxy deletes the entries carrying it when it
  # starts: the same workspace connection then reaches the new sidecar.
  # Everything else in the table stays (an inbound connection keeps
  # working across the restart).
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.Tier
  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  @policy [rules: [allow: ["allowed.test"]], default: :deny]
  @mark "0x539"
  @inbound_port 8097

  setup_all do
    %{tb: Testbed.start()}
  end

  defp py(tb, ns, args, opts \\ []) do
    {out, status} = Testbed.exec_in(tb, ns, [Tier.tool!("python3"), Path.join(tb.bin_dir, "ctstale.py") | args], opts)

    assert status == 0, out
    String.trim(out)
  end

  # A workspace connection (uid 65534) from source port `sport` to the
  # origin at `dst`:443, through whatever the rules do with it.
  defp workspace(tb, sc, sport, dst) do
    py(tb, :pod, ["connect", "#{sport}", dst, "443", "allowed.test", sc.ca_cert], uid: 65534)
  end

  defp start_sidecar(tb) do
    sc = Sidecar.start(tb, @policy)
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> {:deny, "no decider here"} end)
    assert_receive {:egress_frame, %{"type" => "welcome"}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    {sc, peer}
  end

  test "after a sidecar restart, a workspace connection from a stale entry's source port reaches the sidecar",
       %{tb: tb} do
    # An inbound connection, opened before anything else: its entry is not
    # the sidecar's, so it must survive the restart.
    serve =
      Testbed.spawn_in(tb, :pod, [
        Tier.tool!("python3"),
        Path.join(tb.bin_dir, "ctstale.py"),
        "serve",
        "#{@inbound_port}"
      ])

    :ok = Testbed.wait_listening(tb, :pod, tcp: ["0.0.0.0:#{@inbound_port}"], pids: [serve])
    go = Path.join(tb.dir, "ct-go-#{System.unique_integer([:positive])}")
    hold_log = Path.join(tb.dir, "logs/ct-hold.log")

    hold =
      Testbed.spawn_in(
        tb,
        :inet,
        [Tier.tool!("python3"), Path.join(tb.bin_dir, "ctstale.py"), "hold", tb.pod.v4, "#{@inbound_port}", go],
        log: hold_log
      )

    on_exit(fn -> Cmd.kill([serve, hold]) end)
    :ok = Cmd.poll(fn -> File.read!(hold_log) =~ "first" end, 10_000)
    assert File.read!(hold_log) =~ "first ok"

    {sc1, peer1} = start_sidecar(tb)

    # The state a killed sidecar's upstream connections can leave: marked,
    # un-NATed, ESTABLISHED, no socket. One per family.
    sports = %{tb.inet.v4 => 41_017, tb.inet.v6 => 41_019}

    for {dst, sport} <- sports do
      iptables = Tier.tool!(if String.contains?(dst, ":"), do: "ip6tables", else: "iptables")
      assert py(tb, :pod, ["stale", iptables, "#{sport}", dst, "443", @mark, "#{Sidecar.uid()}"]) == "stale"
    end

    # The fault, with the sidecar that was running when the entries were
    # made: the colliding connection is refused; another port is not.
    for {dst, sport} <- sports do
      assert {dst, sport, workspace(tb, sc1, sport, dst)} == {dst, sport, "refused"}
      assert {dst, sport + 100, workspace(tb, sc1, sport + 100, dst)} == {dst, sport + 100, "status 200"}
    end

    # The sidecar crashes and comes back (a native sidecar restarts in the
    # same pod).
    ControlPeer.stop(peer1)
    System.cmd("kill", ["-KILL", "#{sc1.pid}"])
    :ok = Cmd.poll(fn -> not Cmd.alive?(sc1.pid) end, 10_000)
    {sc2, _peer2} = start_sidecar(tb)
    refute Sidecar.stderr(sc2) =~ "warning", Sidecar.stderr(sc2)

    for {dst, sport} <- sports do
      assert {dst, sport, workspace(tb, sc2, sport, dst)} == {dst, sport, "status 200"}
    end

    # The inbound connection's entry was left alone.
    File.write!(go, "")
    :ok = Cmd.poll(fn -> File.read!(hold_log) =~ "second" end, 10_000)
    assert File.read!(hold_log) =~ "second ok"

    Sidecar.stop(sc2)
  end

  test "a sidecar without CAP_NET_ADMIN warns and starts", %{tb: tb} do
    # Without the capability it cannot mark sockets either, so upstream
    # connections fail closed; the flush failing must not stop it.
    sc = Sidecar.start(tb, @policy, netfilter: false, caps: false)
    err = Sidecar.stderr(sc)
    assert err =~ "warning: cannot delete the conntrack entries left by earlier upstream connections"
    assert err =~ "CAP_NET_ADMIN"
    assert err =~ "proxy ready"
    Sidecar.stop(sc)
  end
end
