defmodule Condukt.Netns.SidecarBypassNetfilterTest do
  # Attacks on the pod's netfilter lock, performed by a root workspace with
  # the capabilities a container runtime gives by default (what a pod
  # without a securityContext gets) and with the ones the Kubernetes
  # sandbox's manifest leaves the workspace (docs/netfilter.md, "Threat
  # model"):
  #
  #   * the socket mark: since Linux 5.17 CAP_NET_RAW is enough to set
  #     SO_MARK, and the mark alone used to be the sidecar's exemption;
  #   * raw frames: an AF_PACKET socket writes Ethernet frames that never
  #     meet iptables;
  #   * MLD: joining a multicast group makes the kernel send a listener
  #     report naming it, a channel out of the pod;
  #   * DNS: port 53 to the pod's resolvers.
  #
  # Each attack also runs once where it must work (the sidecar's own uid
  # and capability, or the runtime's defaults for raw frames), so that its
  # failure under the manifest's capabilities means something.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Sandbox.Kubernetes.{Manifest, Schema}
  alias Condukt.Dev.Netns.Tier
  alias Condukt.Test.Netns.Sidecar

  @policy [rules: [allow: ["allowed.test"]], default: :deny]
  # containerd's and Docker's default capability set.
  @runtime_default ~w(chown dac_override fsetid fowner mknod net_raw setgid setuid setfcap setpcap
                      net_bind_service sys_chroot kill audit_write)

  @script ~S'''
  import os, socket, ssl, struct, sys, time

  SO_MARK = getattr(socket, "SO_MARK", 36)

  def family(host):
      return socket.AF_INET6 if ":" in host else socket.AF_INET

  def marked(host, kind):
      s = socket.socket(family(host), kind)
      s.settimeout(5)
      try:
          s.setsockopt(socket.SOL_SOCKET, SO_MARK, 0x539)
          return s, "marked"
      except PermissionError:
          return s, "mark-refused"

  def outcome(f):
      try:
          return f()
      except ConnectionRefusedError:
          return "refused"
      except PermissionError:
          return "eperm"
      except socket.timeout:
          return "timeout"
      except (OSError, ssl.SSLError) as e:
          return "error " + type(e).__name__ + " " + str(e)[:80]

  def tcp(host, port, tag):
      s, m = marked(host, socket.SOCK_STREAM)
      def go():
          s.connect((host, int(port)))
          s.sendall(tag.encode() + b"\n")
          return s.recv(100).decode().strip() or "empty"
      return m + " " + outcome(go)

  def tls(addr, name, tag, cafile):
      s, m = marked(addr, socket.SOCK_STREAM)
      def go():
          s.connect((addr, 443))
          ctx = ssl.create_default_context(cafile=cafile)
          t = ctx.wrap_socket(s, server_hostname=name)
          t.sendall(("GET /?%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (tag, name)).encode())
          head = t.recv(200).decode("latin-1").split("\r\n")[0]
          issuer = dict(x[0] for x in t.getpeercert()["issuer"]).get("commonName", "?")
          return head + " | issuer " + issuer
      return m + " " + outcome(go)

  def udp(host, port, tag):
      s, m = marked(host, socket.SOCK_DGRAM)
      def go():
          s.sendto(tag.encode(), (host, int(port)))
          return "sent"
      return m + " " + outcome(go)

  def checksum(b):
      if len(b) % 2:
          b += b"\0"
      s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
      while s >> 16:
          s = (s & 0xFFFF) + (s >> 16)
      return ~s & 0xFFFF

  def packet(iface, dst_mac, src_ip, dst_ip, tag):
      def go():
          s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
          s.bind((iface, 0))
          src_mac = open("/sys/class/net/%s/address" % iface).read().strip()
          payload = tag.encode()
          udp_h = struct.pack("!HHHH", 40000, 443, 8 + len(payload), 0)
          ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp_h) + len(payload), 1, 0, 64, 17, 0,
                           socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
          ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
          eth = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00"
          s.send(eth + ip + udp_h + payload)
          return "sent"
      return outcome(go)

  cmds = {"tcp": tcp, "tls": tls, "udp": udp, "packet": packet}
  print(cmds[sys.argv[1]](*sys.argv[2:]))
  '''

  setup_all do
    tb = Testbed.start()
    sc = Sidecar.start(tb, @policy)
    script = Path.join(tb.bin_dir, "bypass_attacks.py")
    File.write!(script, @script)
    # netfilter-setup's own probe (native_test/netfilter/probe.py): joins a
    # multicast group, captures frames, listens.
    probe = Path.join(tb.bin_dir, "nf_probe.py")
    File.cp!(Path.join(File.cwd!(), "native_test/netfilter/probe.py"), probe)
    for f <- [script, probe], do: File.chmod!(f, 0o644)
    %{tb: tb, sc: sc, script: script, probe: probe}
  end

  # The workspace container's capabilities, read from the manifest the
  # Kubernetes sandbox sends, applied as runc applies them: the bounding
  # set is the container's set, nothing inheritable or ambient, and
  # no_new_privs with allowPrivilegeEscalation: false.
  defp manifest_workspace do
    {:ok, opts} = Condukt.Options.validate([], Schema.init())
    cfg = Map.merge(Map.new(opts), %{id: "x", pod: "p", delete_on_shutdown: false, now: DateTime.utc_now()})
    [c] = Manifest.pod(cfg)["spec"]["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] == false
    caps = Enum.map(sc["capabilities"]["add"], &String.downcase/1)
    refute Enum.any?(caps, &(&1 in ~w(net_raw net_admin setuid setgid)))
    {:caps, caps, true}
  end

  defp runtime_default, do: {:caps, @runtime_default, false}

  # Runs the attack script (or, with `probe: true`, netfilter-setup's probe)
  # in the pod as root with the given capability set, or as the sidecar
  # (its uid with CAP_NET_ADMIN, as the proxy runs).
  defp attack(ctx, who, args, opts \\ []) do
    py = Tier.tool!("python3")

    prefix =
      case who do
        {:caps, caps, nnp} ->
          [Tier.tool!("setpriv"), "--bounding-set=-all" <> Enum.map_join(caps, "", &",+#{&1}"), "--inh-caps=-all"] ++
            if(nnp, do: ["--no-new-privs"], else: []) ++ ["--"]

        :sidecar ->
          [Tier.tool!("setpriv"), "--reuid=#{Sidecar.uid()}", "--regid=#{Sidecar.uid()}", "--clear-groups"] ++
            ["--inh-caps=+net_admin", "--ambient-caps=+net_admin", "--"]

        :sidecar_uid ->
          [Tier.tool!("setpriv"), "--reuid=#{Sidecar.uid()}", "--regid=#{Sidecar.uid()}", "--clear-groups", "--"]
      end

    script = if opts[:probe], do: ctx.probe, else: ctx.script
    {out, status} = Testbed.exec_in(ctx.tb, :pod, prefix ++ [py, script | args], timeout: 30_000)
    assert status == 0, out
    String.trim(out)
  end

  defp tag, do: "nf-#{System.unique_integer([:positive])}"

  defp bypass_tags(tb) do
    for l <- Testbed.bypass_log(tb), do: Base.decode64!(l["data_b64"]) |> String.trim()
  end

  defp events_for(sc, q), do: Enum.filter(Sidecar.stdout_events(sc), &(&1["query"] == q))

  describe "the socket mark" do
    test "root with the runtime's default capabilities sets the mark, and is still intercepted", ctx do
      %{tb: tb, sc: sc} = ctx

      for {addr, fam} <- [{tb.inet.v4, 4}, {tb.inet.v6, 6}] do
        # Another port: CAP_NET_RAW sets the mark, the rules refuse it.
        q = tag()
        assert attack(ctx, runtime_default(), ["tcp", addr, "8080", q]) == "marked refused", "IPv#{fam}"
        refute q in bypass_tags(tb)

        # TLS to the origin of a denied name: the sidecar answers, not the
        # origin, and refuses with an event.
        q = tag()
        bundle = Path.join(tb.dir, "both-cas.pem")
        File.write!(bundle, File.read!(tb.ca_cert) <> File.read!(sc.ca_cert))
        File.chmod!(bundle, 0o644)
        out = attack(ctx, runtime_default(), ["tls", addr, "denied.test", q, bundle])
        assert out =~ ~r/^marked HTTP\/1\.1 403 /, "IPv#{fam}: #{out}"

        denied? = fn ->
          Enum.any?(events_for(sc, q), &match?(%{"event" => "request_denied", "host" => "denied.test"}, &1))
        end

        assert :ok = Cmd.poll(denied?, 5_000)
      end
    end

    test "the manifest's workspace cannot set the mark at all", ctx do
      for addr <- [ctx.tb.inet.v4, ctx.tb.inet.v6] do
        assert attack(ctx, manifest_workspace(), ["tcp", addr, "8080", tag()]) == "mark-refused refused"
      end
    end

    test "control: the sidecar's uid with the mark does get through, so the attack code works", ctx do
      q = tag()
      assert attack(ctx, :sidecar, ["tcp", ctx.tb.inet.v4, "8080", q]) == "marked bypass-tcp-ok"
      assert q in bypass_tags(ctx.tb)
      # ... and that uid without the capability (no mark) does not.
      q = tag()
      assert attack(ctx, :sidecar_uid, ["tcp", ctx.tb.inet.v4, "8080", q]) == "mark-refused refused"
      refute q in bypass_tags(ctx.tb)
    end
  end

  describe "raw frames" do
    setup ctx do
      {out, 0} = Testbed.exec_in(ctx.tb, :inet, ["/bin/cat", "/sys/class/net/#{ctx.tb.inet.ifname}/address"])
      %{inet_mac: String.trim(out)}
    end

    defp frame(ctx, who, q) do
      attack(ctx, who, ["packet", ctx.tb.pod.ifname, ctx.inet_mac, ctx.tb.pod.v4, ctx.tb.inet.v4, q])
    end

    test "with the runtime's defaults an AF_PACKET frame skips every rule (why NET_RAW must go)", ctx do
      q = tag()
      assert frame(ctx, runtime_default(), q) == "sent"
      assert :ok = Cmd.poll(fn -> q in bypass_tags(ctx.tb) end, 5_000)
    end

    test "the manifest's workspace cannot open an AF_PACKET socket", ctx do
      q = tag()
      assert frame(ctx, manifest_workspace(), q) == "eperm"
      # The same from an ordinary UDP socket is rejected by the rules.
      assert attack(ctx, manifest_workspace(), ["udp", ctx.tb.inet.v4, "443", q]) =~ ~r/^mark-refused (eperm|sent)$/
      Process.sleep(500)
      refute q in bypass_tags(ctx.tb)
    end
  end

  describe "MLD" do
    # Kernel-made reports, so they are captured on the inet side of the
    # link. Only neighbour discovery may leave among ICMPv6.
    test "joining a group of the workspace's choosing sends no listener report out of the pod", ctx do
      %{tb: tb} = ctx
      group = "ff0e::c0de:#{:rand.uniform(0xFFFF) |> Integer.to_string(16) |> String.downcase()}"
      out = Path.join(tb.dir, "mld-#{System.unique_integer([:positive])}.hex")
      py = Tier.tool!("python3")
      sniffer = Testbed.spawn_in(tb, :inet, [py, ctx.probe, "sniff", tb.inet.ifname, out, "4"])
      on_exit(fn -> Cmd.kill([sniffer]) end)
      assert :ok = Cmd.poll(fn -> File.exists?(out) and File.read!(out) =~ "ready" end, 5_000)

      assert attack(ctx, manifest_workspace(), ["join", group, tb.pod.ifname, "2.5"], probe: true) == "joined"
      assert :ok = Cmd.poll(fn -> not Cmd.alive?(sniffer) end, 10_000)

      assert File.read!(out) |> String.split("\n", trim: true) |> length() > 1, "the capture saw nothing at all"
      {seen, 0} = Testbed.exec_in(tb, :inet, [py, ctx.probe, "seen", out, group])
      assert String.trim(seen) == "0"
    end

    test "IPv6 still works through the sidecar with the neighbour caches flushed", ctx do
      %{tb: tb, sc: sc} = ctx

      for ns <- [:pod, :inet] do
        {_, 0} = Testbed.exec_in(tb, ns, [Tier.tool!("ip"), "-6", "neigh", "flush", "all"])
      end

      r = Client.run(tb, :curl, "https://allowed.test/", ca: sc.ca_cert, family: 6)
      assert r.status == 200, inspect(r)
    end
  end

  describe "DNS" do
    # The testbed's resolv.conf names inet's addresses as the resolvers, so
    # netfilter-setup lets the sidecar's uid query them; the workspace's
    # port 53 goes to the sidecar's resolver port instead, whatever the
    # destination.
    test "the workspace's UDP 53 never reaches the resolver; the sidecar's uid does", ctx do
      %{tb: tb} = ctx
      dir = Path.join(tb.dir, "dns-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      {log, ready} = {Path.join(dir, "log"), Path.join(dir, "ready")}

      listener =
        Testbed.spawn_in(tb, :inet, [Tier.tool!("python3"), ctx.probe, "serve", log, ready, "udp,0.0.0.0,53,dns"])

      on_exit(fn -> Cmd.kill([listener]) end)
      assert :ok = Cmd.poll(fn -> File.exists?(ready) end, 5_000)

      ws = tag()
      assert attack(ctx, runtime_default(), ["udp", tb.inet.v4, "53", ws]) =~ ~r/^marked (sent|refused)$/

      assert attack(ctx, manifest_workspace(), ["udp", tb.inet.v4, "53", ws <> "-m"]) =~
               ~r/^mark-refused (sent|refused)$/

      # TCP 53 is REDIRECTed to the sidecar's own resolver, which takes the
      # connection and closes it on the junk it gets: the inet listener
      # never sees it (the refute below).
      assert attack(ctx, manifest_workspace(), ["tcp", tb.inet.v4, "53", ws <> "-t"]) == "mark-refused empty"
      sidecar = tag()
      assert attack(ctx, :sidecar_uid, ["udp", tb.inet.v4, "53", sidecar]) == "mark-refused sent"

      assert :ok = Cmd.poll(fn -> File.read!(log) =~ sidecar end, 5_000)
      refute File.read!(log) =~ ws
    end
  end
end
