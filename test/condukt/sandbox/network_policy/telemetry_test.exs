defmodule Condukt.Sandbox.NetworkPolicy.TelemetryTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy.{Request, Telemetry}

  # The example event of docs/control-channel.md.
  @frame %{
    "type" => "event",
    "seq" => 41,
    "event" => "request_denied",
    "id" => "r-0000002a",
    "at" => "2026-11-22T05:11:57.123456Z",
    "connection_id" => "c-00000009",
    "scheme" => "https",
    "method" => "POST",
    "host" => "evil.com",
    "port" => 443,
    "path" => "/upload",
    "query" => nil,
    "http_version" => "1.1",
    "sni" => "evil.com",
    "headers" => [["content-type", "application/json"], ["authorization", "[redacted]"]],
    "status" => 403,
    "response_headers" => [],
    "bytes_in" => 0,
    "bytes_out" => 0,
    "opened_at" => "2026-11-22T05:11:57.101002Z",
    "responded_at" => "2026-11-22T05:11:57.123456Z",
    "closed_at" => nil,
    "matched_rule" => %{"index" => 2, "kind" => "decide"},
    "reason" => "evil.com is a known exfiltration host"
  }

  setup do
    session = "t-#{System.unique_integer([:positive])}"
    me = self()
    id = {__MODULE__, session}

    :telemetry.attach_many(
      id,
      Telemetry.events(),
      fn
        event, m, %{session_id: ^session} = meta, _ -> send(me, {:event, event, m, meta})
        _, _, _, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(id) end)
    %{session: session}
  end

  test "an event frame becomes its lifecycle event with the seed's measurements and metadata", %{session: s} do
    assert :ok = Telemetry.emit_frame(@frame, s)
    assert_received {:event, [:condukt, :sandbox, :network_policy, :request_denied], measurements, meta}
    assert measurements == %{bytes_in: 0, bytes_out: 0}
    assert meta.reason == "evil.com is a known exfiltration host"
    assert meta.matched_rule == %{index: 2, kind: :decide}
    assert meta.at == ~U[2026-11-22 05:11:57.123456Z]
    assert meta.seq == 41

    assert %Request{
             id: "r-0000002a",
             scheme: :https,
             method: "POST",
             host: "evil.com",
             port: 443,
             path: "/upload",
             query: nil,
             http_version: "1.1",
             sni: "evil.com",
             headers: [{"content-type", "application/json"}, {"authorization", "[redacted]"}],
             status: 403,
             response_headers: [],
             opened_at: ~U[2026-11-22 05:11:57.101002Z],
             responded_at: ~U[2026-11-22 05:11:57.123456Z],
             closed_at: nil
           } = meta.request
  end

  test "each of the five lifecycle names, and nothing for an unknown one", %{session: s} do
    for name <- ~w(request_opened request_allowed request_denied request_closed request_failed) do
      assert :ok = Telemetry.emit_frame(%{@frame | "event" => name, "matched_rule" => nil}, s)
      event = [:condukt, :sandbox, :network_policy, String.to_existing_atom(name)]
      assert_received {:event, ^event, _, %{matched_rule: nil}}
    end

    assert {:error, :unknown_event} = Telemetry.emit_frame(%{@frame | "event" => "request_teleported"}, s)
    refute_received {:event, _, _, _}
  end

  test "the policy's own reasons are atoms; every other reason stays a string" do
    for r <- ~w(default_deny denied_by_rule invalid_host decider_timeout decider_error decider_bad_return
                control_channel_unavailable) do
      assert Telemetry.reason(r) == String.to_existing_atom(r)
    end

    assert Telemetry.reason("tls_client_rejected_ca") == "tls_client_rejected_ca"
    assert Telemetry.reason("upstream_unreachable: connection refused") == "upstream_unreachable: connection refused"
    assert Telemetry.reason(nil) == nil
  end

  test "odd fields never lose the event", %{session: s} do
    frame = %{
      "event" => "request_closed",
      "bytes_in" => nil,
      "at" => "yesterday",
      "scheme" => "gopher",
      "headers" => [["ok", "1"], ["broken"]],
      "matched_rule" => %{"index" => 1, "kind" => "teleport"}
    }

    assert :ok = Telemetry.emit_frame(frame, s)
    assert_received {:event, _, %{bytes_in: 0, bytes_out: 0}, meta}
    assert meta.at == nil and meta.matched_rule == nil
    assert meta.request.scheme == nil
    assert meta.request.headers == [{"ok", "1"}]
  end

  test "a control_refused event frame is the sidecar's refusal summary, not a request", %{session: s} do
    frame = %{
      "type" => "event",
      "seq" => 7,
      "event" => "control_refused",
      "at" => "2026-11-27T01:04:08.120331Z",
      "reason" => "wrong proof",
      "count" => 20
    }

    assert :ok = Telemetry.emit_frame(frame, s)
    assert_received {:event, [:condukt, :sandbox, :network_policy, :control_refused], %{count: 20}, meta}
    assert meta == %{session_id: s, side: :sidecar, reason: "wrong proof", at: ~U[2026-11-27 01:04:08.120331Z], seq: 7}

    # Malformed members do not crash the handler: at least one refusal.
    assert :ok = Telemetry.emit_frame(%{"event" => "control_refused", "count" => -1}, s)
    assert_received {:event, [:condukt, :sandbox, :network_policy, :control_refused], %{count: 1}, %{reason: "refused"}}
  end

  test "a refusal of the sidecar's DNS resolver (docs/dns.md): scheme :dns, the reason as sent", %{session: s} do
    frame = %{
      @frame
      | "scheme" => "dns",
        "method" => nil,
        "host" => "secret.evil.example",
        "port" => 53,
        "path" => nil,
        "http_version" => nil,
        "sni" => nil,
        "headers" => [],
        "status" => nil,
        "matched_rule" => %{"index" => 0, "kind" => "deny"},
        "reason" => "dns: denied_by_rule"
    }

    assert :ok = Telemetry.emit_frame(Map.put(frame, "dns", %{"qname" => "secret.evil.example", "qtype" => "A"}), s)
    assert_received {:event, [:condukt, :sandbox, :network_policy, :request_denied], _, meta}
    assert %Request{scheme: :dns, host: "secret.evil.example", port: 53, method: nil} = meta.request
    assert meta.reason == "dns: denied_by_rule"
    assert meta.matched_rule == %{index: 0, kind: :deny}
  end
end
