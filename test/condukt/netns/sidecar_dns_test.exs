defmodule Condukt.Netns.SidecarDnsTest do
  # The sidecar's name resolution on the netns testbed (docs/dns.md), as
  # a workspace that is root in the pod would attack it:
  #
  # * the proxy resolves names on its own terms: the workspace rewrites the
  #   pod's hosts file and resolv.conf, and an allowed name's plain-HTTP
  #   request still goes where the sidecar's own view says;
  # * DNS under the policy: the sidecar's resolver (127.0.0.1:15053 and
  #   [::1]:15053, UDP and TCP) answers allowed names, refuses the others
  #   with a request_denied event that says dns, and a tunnel (many random
  #   labels under a denied domain, or under one only a decider may allow)
  #   gets nothing out: the DNS server in the inet namespace, which stands
  #   for the cluster's resolvers, counts what reaches it.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.Tier
  alias Condukt.Test.Netns.{ControlPeer, DnsServer, Sidecar}

  def decider(_ctx, _req), do: :allow

  @with_decide [
    rules: [
      deny: ~w(denied.test *.evil.test),
      allow: ~w(allowed.test *.allowed.test),
      decide: &__MODULE__.decider/2
    ],
    default: :deny
  ]

  @no_decide [rules: [allow: ~w(allowed.test *.allowed.test)], default: :deny]

  # The zone of the DNS server in inet: a name the sidecar's hosts file
  # does not have, so only its upstream can answer it.
  @api_v4 "192.0.2.55"

  setup_all do
    tb = Testbed.start()
    dns = DnsServer.start(tb, %{"api.allowed.test" => [@api_v4, "2001:db8::55"]})
    %{tb: tb, dns: dns}
  end

  # One proxy per test: @tag policy: chooses its policy; @tag sidecar:
  # false leaves starting it to the test.
  setup %{tb: tb} = ctx do
    if Map.get(ctx, :sidecar, true), do: start_sidecar(tb, Map.get(ctx, :policy, @with_decide)), else: :ok
  end

  defp start_sidecar(tb, policy, opts \\ []) do
    sc = Sidecar.start(tb, policy, opts)
    on_exit(fn -> Sidecar.stop(sc) end)
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> :allow end)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    %{sc: sc, peer: peer}
  end

  ## Helpers

  # Runs clients/dns_query.py in the pod (as the workspace's uid 1000).
  defp dig(tb, queries, opts \\ []) do
    server = Keyword.get(opts, :server, "127.0.0.1")
    port = Keyword.get(opts, :port, 15053)

    spec = %{
      queries: Enum.map(queries, fn {name, type} -> [name, type] end),
      transport: Keyword.get(opts, :transport, "udp"),
      mode: Keyword.get(opts, :mode, "seq"),
      timeout: Keyword.get(opts, :timeout, 3.0)
    }

    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "dns_query.py"), server, "#{port}", Condukt.JSON.encode!(spec)]
    {out, status} = Testbed.exec_in(tb, :pod, argv, uid: 1000, timeout: 60_000)
    assert status == 0, out
    out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
  end

  # The dns events of the proxy so far for `host`.
  defp dns_events(host, acc \\ []) do
    receive do
      {:egress_event, %{"scheme" => "dns", "host" => ^host} = ev} -> dns_events(host, [ev | acc])
    after
      500 -> Enum.reverse(acc)
    end
  end

  defp random_label, do: Base.encode32(:crypto.strong_rand_bytes(20), case: :lower, padding: false)

  @a 1
  @aaaa 28
  @txt 16
  @nxdomain 3
  @refused 5

  ## The proxy's own resolution

  describe "the workspace rewrites the pod's hosts file and resolv.conf" do
    test "an allowed name's plain-HTTP request still goes where the sidecar's own view says", %{tb: tb} do
      hosts = "/etc/netns/#{tb.pod_ns}/hosts"
      resolv = "/etc/netns/#{tb.pod_ns}/resolv.conf"
      {orig_hosts, orig_resolv} = {File.read!(hosts), File.read!(resolv)}
      decoy = tb.inet.decoy
      q = tag()

      try do
        # As root in the pod (ip netns exec binds these files over
        # /etc/hosts and /etc/resolv.conf): allowed.test now means the
        # decoy, and the resolver is the decoy too.
        script =
          "printf '#{decoy} allowed.test\\n127.0.0.1 localhost\\n' > /etc/hosts && " <>
            "printf 'nameserver #{decoy}\\n' > /etc/resolv.conf"

        assert {_, 0} = Testbed.exec_in(tb, :pod, ["/bin/sh", "-c", script])
        assert File.read!(hosts) =~ "#{decoy} allowed.test"

        r = Client.run(tb, :curl, "http://allowed.test/?#{q}", timeout: 20_000)
        # curl connected to the decoy (the workspace's view), the REDIRECT
        # brought it to the proxy, and the proxy went to allowed.test's
        # real address (its own hosts file): the decoy saw nothing.
        assert r.ok and r.status == 200, inspect(r)
        refute r.body =~ "decoy", r.body

        [hit] = Enum.filter(Testbed.access_log(tb), &String.contains?(&1["uri"] || "", q))
        assert hit["host"] == "allowed.test" and hit["server_addr"] in [tb.inet.v4, tb.inet.v6], inspect(hit)
        assert_receive {:egress_event, %{"event" => "request_allowed", "query" => ^q, "host" => "allowed.test"}}, 5_000
      after
        File.write!(hosts, orig_hosts)
        File.write!(resolv, orig_resolv)
      end
    end

    test "a name the sidecar resolves through its upstream, not the workspace's resolv.conf", %{tb: tb, dns: dns} do
      resolv = "/etc/netns/#{tb.pod_ns}/resolv.conf"
      orig = File.read!(resolv)

      try do
        assert {_, 0} =
                 Testbed.exec_in(tb, :pod, ["/bin/sh", "-c", "printf 'nameserver 127.0.0.1\\n' > /etc/resolv.conf"])

        before = length(DnsServer.queries(dns))
        [a] = dig(tb, [{"api.allowed.test", @a}])
        assert a["rcode"] == 0 and a["answers"] == [[@a, @api_v4]], inspect(a)
        # The sidecar asked its own upstream (the server in inet), once.
        asked = dns |> DnsServer.queries() |> Enum.drop(before) |> Enum.map(& &1["name"])
        assert asked == ["api.allowed.test"], inspect(asked)
      after
        File.write!(resolv, orig)
      end
    end
  end

  describe "a sidecar that reads the pod's resolv.conf (no --dns-upstream)" do
    @tag sidecar: false
    test "keeps the resolvers of its first start (--dns-state): a restart after the workspace rewrote resolv.conf",
         %{tb: tb, dns: dns} do
      resolv = "/etc/netns/#{tb.pod_ns}/resolv.conf"
      orig = File.read!(resolv)
      # A directory only the sidecar's uid can write, as an emptyDir
      # mounted into the sidecar alone.
      state_dir = Path.join(tb.dir, "dns-state-#{System.unique_integer([:positive])}")
      File.mkdir_p!(state_dir)
      File.chown!(state_dir, Sidecar.uid())
      File.chmod!(state_dir, 0o700)
      state = Path.join(state_dir, "resolvers")
      opts = [dns_upstream: nil, extra_args: ["--dns-state", state]]

      try do
        %{sc: sc1, peer: peer1} = start_sidecar(tb, @with_decide, opts)
        assert File.read!(state) == "nameserver #{tb.inet.v4}\nnameserver #{tb.inet.v6}\n"
        [a] = dig(tb, [{"api.allowed.test", @a}])
        assert a["answers"] == [[@a, @api_v4]], inspect(a)
        ControlPeer.stop(peer1)
        Sidecar.stop(sc1)

        # The workspace (root in the pod) points resolv.conf at a resolver
        # of its own; the sidecar restarts.
        assert {_, 0} =
                 Testbed.exec_in(tb, :pod, ["/bin/sh", "-c", "printf 'nameserver 127.0.0.53\\n' > /etc/resolv.conf"])

        before = length(DnsServer.queries(dns))
        %{sc: sc2} = start_sidecar(tb, @with_decide, opts)
        [b] = dig(tb, [{"api.allowed.test", @a}])
        assert b["answers"] == [[@a, @api_v4]], inspect(b)
        asked = dns |> DnsServer.queries() |> Enum.drop(before) |> Enum.map(& &1["name"])
        assert asked == ["api.allowed.test"], inspect(asked)
        assert Sidecar.stop(sc2) =~ "drained"
      after
        File.write!(resolv, orig)
      end
    end
  end

  ## DNS under the policy

  describe "the workspace's resolver" do
    test "allowed names are answered (hosts file and upstream), over UDP and TCP, IPv4 and IPv6", %{tb: tb} do
      for opts <- [[], [server: "::1"], [transport: "tcp"], [server: "::1", transport: "tcp"]] do
        [a, aaaa, api] = dig(tb, [{"allowed.test", @a}, {"Allowed.Test.", @aaaa}, {"api.allowed.test", @a}], opts)
        assert a["rcode"] == 0 and a["answers"] == [[@a, tb.inet.v4]], inspect({opts, a})
        assert aaaa["rcode"] == 0 and aaaa["answers"] == [[@aaaa, tb.inet.v6]], inspect({opts, aaaa})
        assert api["answers"] == [[@a, @api_v4]], inspect({opts, api})
      end
    end

    test "a denied name gets NXDOMAIN and a request_denied event that says dns", %{tb: tb, dns: dns} do
      before = length(DnsServer.queries(dns))
      [d, e] = dig(tb, [{"denied.test", @a}, {"secret.evil.test", @aaaa}])
      assert d["rcode"] == @nxdomain and d["answers"] == [], inspect(d)
      assert e["rcode"] == @nxdomain, inspect(e)

      [ev] = dns_events("denied.test")
      assert ev["event"] == "request_denied"
      assert ev["reason"] == "dns: denied_by_rule"
      assert ev["protocol"] == "dns" and ev["port"] == 53
      assert ev["matched_rule"] == %{"index" => 0, "kind" => "deny"}
      assert %{"qname" => "denied.test", "qtype" => "A", "rcode" => "NXDOMAIN", "transport" => "udp"} = ev["dns"]
      assert [%{"reason" => "dns: denied_by_rule"}] = dns_events("secret.evil.test")
      assert Enum.drop(DnsServer.queries(dns), before) == []
    end

    @tag policy: @no_decide
    test "the default deny: NXDOMAIN, reason dns: default_deny", %{tb: tb} do
      [r] = dig(tb, [{"unknown.example", @a}], transport: "tcp")
      assert r["rcode"] == @nxdomain, inspect(r)
      [ev] = dns_events("unknown.example")
      assert ev["reason"] == "dns: default_deny" and ev["matched_rule"] == nil, inspect(ev)
      assert ev["dns"]["transport"] == "tcp"
    end

    test "a name only the decider may allow: a synthetic answer, nothing asked upstream; the HTTP request is decided",
         %{tb: tb, dns: dns} do
      before = length(DnsServer.queries(dns))
      [a, aaaa] = dig(tb, [{"other.test", @a}, {"other.test", @aaaa}])
      assert a["answers"] == [[@a, "198.18.0.1"]], inspect(a)
      assert aaaa["rcode"] == 0 and aaaa["answers"] == [], inspect(aaaa)
      assert Enum.drop(DnsServer.queries(dns), before) == []
      [ev | _] = dns_events("other.test")
      assert ev["event"] == "request_allowed" and ev["reason"] == "dns: deferred to the decider"
      assert ev["matched_rule"]["kind"] == "decide"

      # The request itself reaches the proxy (the synthetic address is
      # REDIRECTed like any other) and is decided there.
      q = tag()
      r = Client.run(tb, :curl, "http://other.test/?#{q}", extra_args: ["--resolve", "other.test:80:198.18.0.1"])
      assert r.ok and r.status == 200, inspect(r)
      assert_receive {:egress_event, %{"event" => "request_allowed", "query" => ^q, "host" => "other.test"}}, 5_000
    end

    test "other query types: TXT refused with an event, HTTPS empty, ANY not implemented", %{tb: tb} do
      [txt, https, any] = dig(tb, [{"allowed.test", @txt}, {"allowed.test", 65}, {"allowed.test", 255}])
      assert txt["rcode"] == @refused, inspect(txt)
      assert https["rcode"] == 0 and https["answers"] == [], inspect(https)
      assert any["rcode"] == 4, inspect(any)
      assert [%{"event" => "request_denied", "reason" => "dns: query type TXT not served"}] = dns_events("allowed.test")
    end
  end

  describe "port 53 anywhere is the sidecar's" do
    # netfilter-setup REDIRECTs the workspace's port 53 (UDP and TCP, any
    # address) to the sidecar's resolver, so a workspace that skips the
    # pod's resolv.conf and asks a resolver of its choosing directly still
    # gets the policy's answers, and that resolver never sees the query.
    test "a query sent straight to the inet resolver is answered by the sidecar", %{tb: tb, dns: dns} do
      for {server, transport} <- [{tb.inet.v4, "udp"}, {tb.inet.v4, "tcp"}, {tb.inet.v6, "udp"}] do
        before = length(DnsServer.queries(dns))
        name = "#{random_label()}.evil.test"
        [r] = dig(tb, [{name, @a}], server: server, port: 53, transport: transport)
        assert r["rcode"] == @nxdomain, inspect({server, transport, r})
        assert [%{"event" => "request_denied", "reason" => "dns: denied_by_rule"}] = dns_events(name)
        assert Enum.drop(DnsServer.queries(dns), before) == [], "#{server}/#{transport} reached the inet resolver"
      end

      # An allowed name is answered too: through the sidecar's own stub,
      # which is the only one that asks the inet resolver.
      [ok] = dig(tb, [{"api.allowed.test", @a}], server: tb.inet.v4, port: 53)
      assert ok["answers"] == [[@a, @api_v4]], inspect(ok)
    end

    test "a port-53 query to an address with no resolver is answered all the same", %{tb: tb} do
      [r] = dig(tb, [{"allowed.test", @a}], server: "203.0.113.9", port: 53)
      assert r["rcode"] == 0 and r["answers"] == [[@a, tb.inet.v4]], inspect(r)
    end
  end

  describe "a DNS tunnel" do
    test "random labels under a denied domain and under a decide-only one: nothing reaches the resolvers",
         %{tb: tb, dns: dns} do
      before = length(DnsServer.queries(dns))
      denied = for _ <- 1..40, do: {"#{random_label()}.evil.test", @a}
      deferred = for _ <- 1..40, do: {"#{random_label()}.exfil.example", @aaaa}
      txt = for _ <- 1..10, do: {"#{random_label()}.allowed.test", @txt}
      results = dig(tb, denied ++ deferred ++ txt, timeout: 2.0)
      assert Enum.all?(Enum.take(results, 40), &(&1["rcode"] == @nxdomain)), inspect(results)
      assert Enum.all?(Enum.slice(results, 40, 40), &(&1["rcode"] == 0 and &1["answers"] == [])), inspect(results)
      assert Enum.all?(Enum.drop(results, 80), &(&1["rcode"] == @refused)), inspect(results)

      # The positive control: an allowed name does reach the server, so
      # the server would have seen the tunnel's names had they got out.
      [ok] = dig(tb, [{"api.allowed.test", @a}])
      assert ok["answers"] == [[@a, @api_v4]]
      asked = dns |> DnsServer.queries() |> Enum.drop(before) |> Enum.map(& &1["name"])
      assert asked == ["api.allowed.test"], inspect(asked)
    end

    test "the query rate is capped per source: a burst past it goes unanswered", %{tb: tb, dns: dns} do
      before = length(DnsServer.queries(dns))
      burst = for _ <- 1..300, do: {"#{random_label()}.evil.test", @a}
      results = dig(tb, burst, mode: "burst", timeout: 2.0)
      {answered, dropped} = Enum.split_with(results, &(not Map.has_key?(&1, "timeout")))
      assert Enum.all?(answered, &(&1["rcode"] == @nxdomain)), inspect(answered)
      assert length(dropped) > 0 and length(answered) <= 200, "#{length(answered)} answered"
      assert Enum.drop(DnsServer.queries(dns), before) == []
    end
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"
end
