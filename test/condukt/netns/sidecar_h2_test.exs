defmodule Condukt.Netns.SidecarH2Test do
  # HTTP/2 through the sidecar (issue 4, docs/http2.md): real h2 clients
  # (curl --http2, python3-h2, node's http2) in the pod, nginx speaking h2
  # in the internet namespace. Every stream is a request of its own with its
  # own events; a stream naming another host than the SNI gets 421 while the
  # others on the same connection go on; a rapid-reset attack ends with
  # GOAWAY ENHANCE_YOUR_CALM and an event.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Test.Netns.{ControlPeer, Sidecar, Tier}

  def decider(_ctx, _req), do: :deny

  defp policy do
    [
      rules: [deny: ["denied.test"], allow: ~w(allowed.test other.test), decide: &__MODULE__.decider/2],
      default: :deny
    ]
  end

  setup_all do
    tb = Testbed.start(big_size: 20 * 1024 * 1024)
    sc = Sidecar.start(tb, policy())
    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  setup %{sc: sc} do
    {:ok, peer} = ControlPeer.start_link(sc, self(), fn _ -> {:deny, "no"} end)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 1}}, 5_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  defp events_for(query, n_last \\ 1, timeout \\ 10_000) do
    collect(query, n_last, [], System.monotonic_time(:millisecond) + timeout)
  end

  @last ~w(request_closed request_failed request_denied)

  defp collect(query, n_last, acc, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {:egress_event, %{"query" => ^query} = ev} ->
        acc = [ev | acc]
        n = if ev["event"] in @last, do: n_last - 1, else: n_last
        if n == 0, do: Enum.reverse(acc), else: collect(query, n, acc, deadline)
    after
      left -> flunk("events for #{query}: got #{inspect(Enum.map(Enum.reverse(acc), & &1["event"]))}")
    end
  end

  defp h2_raw(tb, sc, spec) do
    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "h2_raw.py"), Condukt.JSON.encode!(spec)]
    {out, status} = Testbed.exec_in(tb, :pod, argv, ca: sc.ca_cert, timeout: 60_000)
    assert status == 0, out
    out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
  end

  test "curl --http2: h2 on both sides, one stream, HTTP/2 events with the stream id", %{tb: tb, sc: sc} do
    q = tag()
    r = Client.run(tb, :curl, "https://allowed.test/headers?#{q}", ca: sc.ca_cert, http: :h2)
    assert r.ok and r.status == 200, inspect(r)
    assert r.http_version == "2"
    assert r.body =~ "alpn=h2\n"
    assert r.body =~ "protocol=HTTP/2.0\n"
    assert r.body =~ "host=allowed.test\n"

    events = events_for(q)
    assert Enum.map(events, & &1["event"]) == ~w(request_opened request_allowed request_closed)
    closed = List.last(events)
    assert closed["http_version"] == "HTTP/2"
    assert closed["stream_id"] == 1
    assert closed["status"] == 200
    assert closed["host"] == "allowed.test"
    assert closed["path"] == "/headers"
    assert closed["bytes_in"] > 0
  end

  test "an upload and a 20 MiB download over h2 arrive intact (flow control end to end)", %{tb: tb, sc: sc} do
    {path, sha} = Testbed.make_file(tb, "h2-upload-#{System.unique_integer([:positive])}.bin", 3_000_000)
    q = tag()

    r =
      Client.run(tb, :curl, "https://allowed.test/upload?#{q}",
        method: "POST",
        body: {:file, path},
        ca: sc.ca_cert,
        http: :h2
      )

    assert r.ok and r.status == 200, inspect(r)
    body = Condukt.JSON.decode!(r.body)
    assert body["body_sha256"] == sha
    assert body["body_size"] == 3_000_000
    assert List.last(events_for(q))["bytes_out"] >= 3_000_000

    q = tag()
    r = Client.run(tb, :curl, "https://allowed.test/big.bin?#{q}", ca: sc.ca_cert, http: :h2, timeout: 120_000)
    assert r.ok and r.status == 200 and r.http_version == "2", inspect(r)
    assert r.body_sha256 == tb.big_file.sha256
  end

  test "a denied host is never pre-connected: the workspace still gets h2, and a 403 on the stream", %{tb: tb, sc: sc} do
    q = tag()
    r = Client.run(tb, :curl, "https://denied.test/?#{q}", ca: sc.ca_cert, http: :h2)
    assert r.status == 403 and r.http_version == "2", inspect(r)
    assert r.body =~ "refused the request to denied.test"
    assert [%{"event" => "request_opened"}, %{"event" => "request_denied"} = d] = events_for(q)
    assert d["stream_id"] == 1 and d["http_version"] == "HTTP/2"
  end

  test "coalescing: a stream for another name gets 421, the others on the connection succeed", %{tb: tb, sc: sc} do
    q = tag()
    out = h2_raw(tb, sc, %{host: "allowed.test", other: "other.test", mode: "coalesce", query: q})
    assert out["alpn"] == "h2"
    assert %{"status" => 200, "body" => "hello from allowed.test\n", "ended" => true} = out["streams"]["1"]
    assert %{"status" => 421, "ended" => true} = out["streams"]["3"]
    assert out["streams"]["3"]["body"] =~ "misdirected request"
    assert %{"status" => 200, "ended" => true} = out["streams"]["5"]
    assert out["goaway"] == nil

    events = events_for(q, 3)
    denied = Enum.find(events, &(&1["event"] == "request_denied"))
    assert denied["reason"] == "misdirected_request"
    assert denied["stream_id"] == 3
    assert denied["host"] == "other.test"
    closed = Enum.filter(events, &(&1["event"] == "request_closed"))
    assert Enum.sort(Enum.map(closed, & &1["stream_id"])) == [1, 5]
  end

  test "rapid reset (CVE-2023-44487): GOAWAY ENHANCE_YOUR_CALM and an event", %{tb: tb, sc: sc} do
    q = tag()
    out = h2_raw(tb, sc, %{host: "allowed.test", mode: "rapid_reset", query: q})
    # 0xb ENHANCE_YOUR_CALM
    assert out["goaway"] == 11, inspect(out)
    assert out["resets_sent"] > 200 and out["resets_sent"] < 2000, inspect(out)

    assert_receive {:egress_event, %{"event" => "request_failed", "reason" => "h2_rapid_reset"} = ev}, 10_000
    assert ev["sni"] == "allowed.test"
  end

  test "node's http2 client: two concurrent streams on one session", %{tb: tb, sc: sc} do
    q = tag()

    js = """
    const http2 = require('http2');
    const s = http2.connect('https://allowed.test');
    let left = 2; const out = [];
    for (const p of ['/?#{q}&a=1', '/?#{q}&a=2']) {
      const r = s.request({':path': p});
      let body = ''; let status = 0;
      r.on('response', h => { status = h[':status']; });
      r.setEncoding('utf8'); r.on('data', d => body += d);
      r.on('end', () => { out.push({status, body}); if (--left === 0) { console.log(JSON.stringify(out)); s.close(); } });
    }
    s.on('error', e => { console.log(JSON.stringify({error: String(e)})); process.exit(1); });
    """

    {out, status} = Testbed.exec_in(tb, :pod, [Tier.tool!("node"), "-e", js], ca: sc.ca_cert, timeout: 30_000)
    assert status == 0, out
    results = out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
    assert [%{"status" => 200, "body" => "hello from allowed.test\n"}, %{"status" => 200}] = results
  end
end
