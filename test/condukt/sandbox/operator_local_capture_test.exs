defmodule Condukt.Sandbox.OperatorLocalCaptureTest do
  # Body previews on the Local backend, through the real sidecar (netns
  # tier): the policy's body_preview and redact_headers reach the sidecar,
  # previews reach handlers redacted, and none appears without them.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Sandbox
  alias Condukt.Sandbox.NetworkPolicy

  setup_all do
    %{tb: Testbed.start()}
  end

  defp start(tb, id, capture, rules \\ [allow: ["allowed.test"]]) do
    me = self()

    :telemetry.attach(
      {__MODULE__, id},
      [:condukt, :sandbox, :network_policy, :request_closed],
      fn _, m, %{session_id: ^id} = meta, _ -> send(me, {:closed, m, meta.request}) end,
      nil
    )

    on_exit(fn -> :telemetry.detach({__MODULE__, id}) end)
    policy = NetworkPolicy.new!([rules: rules] ++ capture)

    network = [
      uplink: {:netns, tb.inet_ns},
      hosts: %{"allowed.test" => tb.inet.v4},
      allow_private: [tb.inet.v4 <> "/32"],
      upstream_ca: tb.ca_cert,
      binary: Condukt.Test.Netns.Sidecar.bin()
    ]

    {:ok, sb} = Sandbox.new({Sandbox.Local, id: id, cwd: scratch(tb), network_policy: policy, network: network})
    on_exit(fn -> Sandbox.shutdown(sb) end)
    sb
  end

  # A cwd the session's user (nobody) owns.
  defp scratch(tb) do
    cwd = Path.join(tb.dir, "scratch/capture-#{System.unique_integer([:positive])}")
    File.mkdir_p!(cwd)
    File.chown!(cwd, 65_534)
    cwd
  end

  defp post(sb) do
    cmd =
      "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' -H 'X-Api-Key: k-123' " <>
        ~s(--data-binary '{"password":"hunter2","who":"tenant-7","n":1}' https://allowed.test/echo)

    assert {:ok, %{output: "200"}} = Sandbox.exec(sb, cmd)
  end

  test "with body_preview the preview arrives redacted, with the request's duration", %{tb: tb} do
    id = "cap-#{System.unique_integer([:positive])}"
    sb = start(tb, id, body_preview: 64, redact_headers: ["x-api-key"], redact_body: ["tenant-7"])
    post(sb)
    # A Local session's first request on a loaded machine (the sanitizer
    # build of the sidecar) can take several seconds.
    assert_receive {:closed, %{duration: d}, request}, 30_000
    assert is_integer(d) and d > 0
    assert request.body_preview == ~s({"password":"[redacted]","who":"[redacted]","n":1})
    assert {"x-api-key", "[redacted]"} in request.headers

    # The sidecar redacted the header itself; body patterns run on the
    # BEAM, so its root-only audit log keeps the raw preview (documented).
    events = Condukt.Sandbox.Local.Network.events(sb.state.network)
    closed = Enum.find(events, &(&1["event"] == "request_closed"))
    assert ["x-api-key", "[redacted]"] in Enum.map(closed["headers"], fn [k, v] -> [String.downcase(k), v] end)
    assert Base.decode64!(closed["body_preview"]) == ~s({"password":"hunter2","who":"tenant-7","n":1})
  end

  test "without body_preview no preview reaches anything", %{tb: tb} do
    id = "nocap-#{System.unique_integer([:positive])}"
    sb = start(tb, id, [])
    post(sb)
    # A Local session's first request on a loaded machine (the sanitizer
    # build of the sidecar) can take several seconds.
    assert_receive {:closed, _m, request}, 30_000
    assert request.body_preview == nil
    events = Condukt.Sandbox.Local.Network.events(sb.state.network)
    refute Enum.any?(events, &Map.has_key?(&1, "body_preview"))
  end

  # A decider that reports what it was asked: the body preview travels in
  # the question (the sidecar waits for the first body bytes before
  # asking), redacted by the policy's patterns before the decider sees it.
  defp asking_decider do
    me = self()
    [decide: [call: fn _ctx, req -> send(me, {:asked, req}) && :allow end, cache: false]]
  end

  test "a decider's request carries the body preview, redacted, when body_preview is set", %{tb: tb} do
    id = "dcap-#{System.unique_integer([:positive])}"
    sb = start(tb, id, [body_preview: 64, redact_body: ["tenant-7"]], asking_decider())
    post(sb)
    assert_receive {:asked, request}, 30_000
    assert request.host == "allowed.test" and request.method == "POST"
    assert request.body_preview == ~s({"password":"[redacted]","who":"[redacted]","n":1})
  end

  test "without body_preview a decider's request has no preview", %{tb: tb} do
    id = "dnocap-#{System.unique_integer([:positive])}"
    sb = start(tb, id, [], asking_decider())
    post(sb)
    assert_receive {:asked, request}, 30_000
    assert request.host == "allowed.test"
    assert request.body_preview == nil
  end
end
