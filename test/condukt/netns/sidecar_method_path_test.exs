defmodule Condukt.Netns.SidecarMethodPathTest do
  # Method and path rules end to end (docs/path-matching.md), over HTTP/1.1
  # and h2: a GET-only rule refuses a POST with a 403 that names the rule
  # which refused it, and a path rule cannot be escaped with dot segments
  # or percent-encoding. The escapes are sent as written: curl with
  # --path-as-is, and a raw h2 client that puts the :path on the wire
  # byte for byte. Each refusal is checked in the event the sidecar sent.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  def decider(_ctx, _req), do: :deny

  # Rule 0 lets GET and HEAD reach two paths of allowed.test; rule 1
  # refuses everything else there. other.test has an admin area denied by
  # path (rule 2) and is otherwise allowed (rule 3). v4.test allows GET
  # (rule 4) and leaves the rest to the decider (rule 5).
  @policy [
    rules: [
      allow: [{"allowed.test", methods: ["GET", "HEAD"], paths: ["/repos/myorg/**", "/headers"]}],
      deny: ["allowed.test"],
      deny: [{"other.test", paths: ["/admin/**"]}],
      allow: ["other.test"],
      allow: [{"v4.test", methods: ["GET"]}],
      decide: &__MODULE__.decider/2
    ],
    default: :deny
  ]

  setup_all do
    tb = Testbed.start()
    sc = Sidecar.start(tb, @policy)
    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  setup %{sc: sc} do
    me = self()

    # The decider refuses for the whole host (a :host answer the sidecar
    # caches) and says so to the test.
    decide = fn req ->
      send(me, {:asked, req["method"], req["path"]})
      {{:deny, "not here"}, true}
    end

    {:ok, peer} = ControlPeer.start_link(sc, self(), decide)
    assert_receive {:egress_frame, %{"type" => "welcome", "version" => 2}}, 10_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  # The events of the request whose query is q, up to its last one.
  defp events_for(q, timeout \\ 10_000) do
    deadline = System.monotonic_time(:millisecond) + timeout
    collect(q, [], deadline)
  end

  defp collect(q, acc, deadline) do
    left = max(deadline - System.monotonic_time(:millisecond), 0)

    receive do
      {:egress_event, %{"query" => ^q} = ev} ->
        if ev["event"] in ~w(request_closed request_failed request_denied),
          do: Enum.reverse([ev | acc]),
          else: collect(q, [ev | acc], deadline)
    after
      left -> flunk("events for #{q}: got #{inspect(Enum.map(Enum.reverse(acc), & &1["event"]))}")
    end
  end

  defp curl(tb, sc, url, opts \\ []) do
    Client.run(tb, :curl, url, [ca: sc.ca_cert, extra_args: ["--path-as-is"]] ++ opts)
  end

  defp refused_by(ev, index, kind, reason) do
    assert ev["event"] == "request_denied", inspect(ev)
    assert ev["matched_rule"] == %{"index" => index, "kind" => kind}, inspect(ev)
    assert ev["reason"] == reason, inspect(ev)
  end

  for http <- [:h1, :h2] do
    describe "curl over #{http}" do
      test "a GET-only rule: GET passes, POST and DELETE get a 403 naming the rule", %{tb: tb, sc: sc} do
        q = tag()
        r = curl(tb, sc, "https://allowed.test/headers?#{q}", http: unquote(http))
        assert r.ok and r.status == 200, inspect(r)
        assert r.body =~ "method=GET\n"
        assert List.last(events_for(q))["event"] == "request_closed"

        for method <- ["POST", "DELETE"] do
          q = tag()
          r = curl(tb, sc, "https://allowed.test/headers?#{q}", http: unquote(http), method: method)
          assert r.ok and r.status == 403, inspect(r)
          assert Result.header(r, "x-condukt-egress") == "refused"
          assert r.body =~ "refused the request to allowed.test"
          assert r.body =~ "rule 1 (deny)"
          refute r.body =~ "method="
          refused_by(List.last(events_for(q)), 1, "deny", "denied_by_rule")
        end
      end

      test "dot segments and percent-encoding cannot escape a path rule", %{tb: tb, sc: sc} do
        # Inside the tree: allowed (nginx has no such file: 404, from the origin).
        q = tag()
        r = curl(tb, sc, "https://allowed.test/repos/myorg/x?#{q}", http: unquote(http))
        assert r.ok and r.status == 404 and Result.header(r, "x-condukt-egress") == nil, inspect(r)
        assert List.last(events_for(q))["event"] == "request_closed"

        # Climbing out: the normalised path is outside the rule, so rule 1 refuses.
        for path <- ["/repos/myorg/../../secret", "/repos/myorg/%2e%2e/%2E%2E/secret", "/repos/myorg/.%2e/x"] do
          q = tag()
          r = curl(tb, sc, "https://allowed.test#{path}?#{q}", http: unquote(http))
          assert r.ok and r.status == 403, "#{path}: #{inspect(r)}"
          assert r.body =~ "rule 1 (deny)"
          refused_by(List.last(events_for(q)), 1, "deny", "denied_by_rule")
        end

        # Spellings the sidecar cannot judge safely: refused at the path rule.
        for path <- [
              "/repos/myorg/%2E%2E%2F%2E%2E%2Fsecret",
              "/repos/myorg%2F..%2Fx",
              "/repos/myorg/..;/x",
              "/repos//myorg/x"
            ] do
          q = tag()
          r = curl(tb, sc, "https://allowed.test#{path}?#{q}", http: unquote(http))
          assert r.ok and r.status == 403, "#{path}: #{inspect(r)}"
          assert r.body =~ "rule 0 (allow)"
          assert r.body =~ "invalid_path"
          refused_by(List.last(events_for(q)), 0, "allow", "invalid_path")
        end
      end

      test "a deny by path holds whatever the spelling; the rest of the host is allowed", %{tb: tb, sc: sc} do
        for path <- ["/admin/x", "/public/../admin/x", "/%61dmin/x", "/./admin"] do
          q = tag()
          r = curl(tb, sc, "https://other.test#{path}?#{q}", http: unquote(http))
          assert r.ok and r.status == 403, "#{path}: #{inspect(r)}"
          refused_by(List.last(events_for(q)), 2, "deny", "denied_by_rule")
        end

        q = tag()
        r = curl(tb, sc, "https://other.test//admin/x?#{q}", http: unquote(http))
        assert r.ok and r.status == 403, inspect(r)
        refused_by(List.last(events_for(q)), 2, "deny", "invalid_path")

        q = tag()
        r = curl(tb, sc, "https://other.test/?#{q}", http: unquote(http))
        assert r.ok and r.status == 200 and r.body =~ "hello from other.test", inspect(r)
      end
    end
  end

  test "a decider's cached :host deny never covers what an earlier rule allows", %{tb: tb, sc: sc} do
    q = tag()
    r = curl(tb, sc, "https://v4.test/?#{q}", method: "POST", body: "x")
    assert r.status == 403, inspect(r)
    assert_receive {:asked, "POST", "/"}, 5_000
    refused_by(List.last(events_for(q)), 5, "decide", "not here")

    # GET is allowed by rule 4 before the decide rule is reached.
    q = tag()
    r = curl(tb, sc, "https://v4.test/?#{q}")
    assert r.ok and r.status == 200 and r.body =~ "hello from v4.test", inspect(r)
    refute_received {:asked, _, _}

    # Another POST: the cached answer, the decider is not asked again.
    q = tag()
    r = curl(tb, sc, "https://v4.test/?#{q}", method: "PUT", body: "x")
    assert r.status == 403, inspect(r)
    refute_received {:asked, _, _}
  end

  test "a raw h2 client: :method and :path as sent", %{tb: tb, sc: sc} do
    q = tag()

    f = fn method, path ->
      [[":method", method], [":scheme", "https"], [":authority", "allowed.test"], [":path", path]]
    end

    streams = [
      f.("GET", "/headers?#{q}"),
      f.("POST", "/headers?#{q}"),
      f.("get", "/headers?#{q}"),
      f.("GET", "/repos/myorg/../../secret?#{q}"),
      f.("GET", "/repos/myorg/%2e%2e/%2e%2e/secret?#{q}"),
      f.("GET", "/repos/myorg/%2E%2E%2F%2E%2E%2Fsecret?#{q}"),
      f.("GET", "/repos/myorg/..%5C..%5Csecret?#{q}"),
      f.("GET", "/../headers?#{q}")
    ]

    out = Client.h2_raw(tb, sc.ca_cert, %{host: "allowed.test", mode: "custom", streams: streams, query: q})
    assert out["goaway"] == nil, inspect(out)
    assert %{"status" => 200, "body" => body} = out["streams"]["1"]
    assert body =~ "method=GET\n"

    expected = %{
      "3" => {1, "deny", "denied_by_rule"},
      "5" => {1, "deny", "denied_by_rule"},
      "7" => {1, "deny", "denied_by_rule"},
      "9" => {1, "deny", "denied_by_rule"},
      "11" => {0, "allow", "invalid_path"},
      "13" => {0, "allow", "invalid_path"},
      "15" => {0, "allow", "invalid_path"}
    }

    denied = collect_denied(q, map_size(expected))

    for {sid, {index, kind, reason}} <- expected do
      st = out["streams"][sid]
      assert st["status"] == 403, "stream #{sid}: #{inspect(st)}"
      assert st["body"] =~ "rule #{index} (#{kind})", "stream #{sid}: #{inspect(st)}"
      refute st["body"] =~ "method="
      refused_by(denied[String.to_integer(sid)], index, kind, reason)
    end
  end

  # The request_denied events of one h2 connection, by stream id.
  defp collect_denied(q, n, acc \\ %{}) do
    if map_size(acc) == n do
      acc
    else
      receive do
        {:egress_event, %{"query" => ^q, "event" => "request_denied"} = ev} ->
          collect_denied(q, n, Map.put(acc, ev["stream_id"], ev))
      after
        10_000 -> flunk("request_denied events for #{q}: got #{inspect(Map.keys(acc))}")
      end
    end
  end
end
