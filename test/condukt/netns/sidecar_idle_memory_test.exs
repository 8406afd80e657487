defmodule Condukt.Netns.SidecarIdleMemoryTest do
  # What an idle keep-alive TLS connection holds, by the proxy's own
  # accounting (SIGUSR1, docs/proxy.md "Signals" and "Memory of an idle
  # connection"): no input buffer of the pool, nothing queued, and TLS
  # ciphertext buffers (OpenSSL's memory BIOs) trimmed after the exchange,
  # also after a response far larger than the bound. Counts, not timings:
  # RSS per connection is the benchmark's measure (bench/README.md).
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.{Cmd, Tier}
  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  # CE_TLSCONN_BIO_KEEP (c_src/tls/tlsconn.h): an empty BIO with more room
  # than this is swapped for a fresh one at the end of an exchange.
  @bio_keep 32 * 1024
  @small 20
  @large 8
  @large_size 512 * 1024

  setup_all do
    tb = Testbed.start(big_size: 1024 * 1024)
    www = Path.join([tb.dir, "www", "allowed.test"])
    File.write!(Path.join(www, "1k.bin"), :binary.copy("x", 1023) <> "\n")
    File.write!(Path.join(www, "512k.bin"), :binary.copy("y", @large_size))
    sc = Sidecar.start(tb, rules: [allow: ["allowed.test"]], default: :deny)
    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  setup %{sc: sc} do
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> {:deny, "no decider here"} end)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  test "idle keep-alive connections hold no pool buffer, nothing queued, and trimmed TLS buffers", %{tb: tb, sc: sc} do
    assert %{"connections" => 0, "input" => 0, "queued" => 0, "tls" => 0} = Sidecar.buffer_stats(sc)

    small = hold(tb, sc, "https://allowed.test/1k.bin", @small)
    s1 = Sidecar.buffer_stats(sc)

    assert %{"connections" => @small, "input" => 0, "queued" => 0, "h2_streams" => 0, "held" => 0} = s1,
           inspect(s1)

    # After a 1 KiB exchange, the workspace's and the upstream's TLS
    # connections keep some ciphertext room each (a record or two), never
    # the bound's worth.
    assert s1["tls"] > 0, inspect(s1)
    assert s1["tls"] <= @small * 16 * 1024, "#{div(s1["tls"], @small)} bytes of TLS room per idle connection"

    # A response of 512 KiB grows the BIOs it passes through (the
    # upstream's input, the workspace's output) far past the bound, 64 KiB
    # or more each; the end of the exchange swaps every empty one above the
    # bound for a fresh one, so what is left is the other two BIOs' room
    # (heads) and less than the bound each.
    large = hold(tb, sc, "https://allowed.test/512k.bin", @large)
    s2 = Sidecar.buffer_stats(sc)

    assert %{"connections" => n, "input" => 0, "queued" => 0, "held" => 0} = s2
    assert n == @small + @large, inspect(s2)
    grown = s2["tls"] - s1["tls"]
    assert grown <= @large * 2 * @bio_keep, "#{div(grown, @large)} bytes of TLS room per idle connection after 512 KiB"

    Cmd.kill([small, large])
    :ok = Cmd.poll(fn -> Sidecar.buffer_stats(sc)["connections"] == 0 end, 15_000, 200)
    assert %{"connections" => 0, "input" => 0, "queued" => 0, "tls" => 0} = Sidecar.buffer_stats(sc)
  end

  # Opens n keep-alive connections through the proxy, one GET of `url`
  # each, and leaves them open; returns the client's pid.
  defp hold(tb, sc, url, n) do
    log = Path.join(tb.logs.dir, "idle-#{System.unique_integer([:positive])}.log")
    py = Tier.tool!("python3")
    pid = Testbed.spawn_in(tb, :pod, [py, Path.join(tb.bin_dir, "idle.py"), url, "#{n}", sc.ca_cert, "300"], log: log)
    on_exit(fn -> Cmd.kill([pid]) end)
    :ok = Cmd.poll(fn -> File.read!(log) =~ "ready" end, 60_000, 100)
    assert File.read!(log) =~ "ready #{n} 0", File.read!(log)
    pid
  end
end
