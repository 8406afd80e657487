defmodule Condukt.K8s.OperatorE2ETest do
  # The operator features with real pods on the real node: the trust
  # bundle the condukt-trust init container writes from the sidecar
  # image, body previews with redaction, the sidecar's request duration
  # and decide spans, through the real sidecar and the control bridge.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Kubernetes

  @prefix [:condukt, :sandbox, :network_policy]

  setup_all do
    %{tier: Condukt.Test.K8s.Case.start_node_tier!()}
  end

  defp conn(tier) do
    c = tier.cluster
    [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]
  end

  # Names resolve through cluster DNS, as in a cluster.
  defp sandbox(tier, id, policy) do
    {:ok, sb} =
      Sandbox.new(
        {Kubernetes,
         id: id,
         namespace: tier.cluster.namespace,
         conn: conn(tier),
         image: "condukt.test/workspace-tools:bookworm",
         heartbeat_interval: false,
         network_policy: policy,
         network_policy_image: tier.egress_image,
         network_policy_upstream_ca: tier.upstream_ca_pem,
         network_policy_allow_private: tier.allow_private}
      )

    on_exit(fn -> Kubernetes.terminate(id, namespace: tier.cluster.namespace, conn: conn(tier)) end)
    sb
  end

  defp attach(id) do
    me = self()
    handler = "op-e2e-#{System.unique_integer([:positive])}"

    :telemetry.attach_many(
      handler,
      Condukt.Sandbox.NetworkPolicy.Telemetry.events(),
      fn
        e, m, %{session_id: ^id} = meta, _ -> send(me, {:event, e -- @prefix, m, meta})
        _, _, _, _ -> :ok
      end,
      nil
    )

    on_exit(fn -> :telemetry.detach(handler) end)
  end

  defp post(sb, url, body) do
    {:ok, %{output: out}} =
      Sandbox.exec(
        sb,
        "curl -sS --max-time 15 -o /dev/null -w '%{http_code}' -H 'X-Api-Key: k-123' -H 'Content-Type: application/json' " <>
          "--data-binary '#{body}' #{url}"
      )

    out
  end

  test "the workspace's trust bundle is written in the pod: Mozilla roots and the session CA at both system paths",
       %{tier: tier} do
    id = "op-trust-#{System.unique_integer([:positive])}"
    attach(id)
    sb = sandbox(tier, id, rules: [allow: ["allowed.test"]])
    assert_receive {:event, [:control_connected], _, _}, 30_000

    mozilla = File.read!(Condukt.Sandbox.NetworkPolicy.CA.mozilla_path())
    roots = mozilla |> String.split("BEGIN CERTIFICATE") |> length() |> Kernel.-(1)
    {:ok, ca} = Sandbox.read(sb, "/etc/condukt/ca.pem")
    assert ca =~ "BEGIN CERTIFICATE"

    for path <- ["/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/cert.pem"] do
      {:ok, bundle} = Sandbox.read(sb, path)
      assert String.starts_with?(bundle, mozilla), path
      assert String.ends_with?(bundle, ca), path
      assert length(String.split(bundle, "BEGIN CERTIFICATE")) - 1 == roots + 1
    end

    # Read-only for the workspace.
    assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "echo x >> /etc/condukt/ca-certificates.crt")
    assert code != 0

    # curl trusts the sidecar through the system bundle alone.
    {:ok, %{output: out}} =
      Sandbox.exec(
        sb,
        "env -u CURL_CA_BUNDLE -u SSL_CERT_FILE curl -sS --max-time 15 -o /dev/null -w '%{http_code}' https://allowed.test/"
      )

    assert out == "200"
  end

  test "body previews reach the events redacted when enabled, with the request's duration; never when not",
       %{tier: tier} do
    id = "op-body-#{System.unique_integer([:positive])}"
    attach(id)
    me = self()

    decider = fn _ctx, req ->
      send(me, {:asked, req.body_preview})
      :allow
    end

    policy = [
      rules: [decide: [call: decider, cache: false]],
      body_preview: 64,
      redact_headers: ["x-api-key"],
      redact_body: ["tenant-7"]
    ]

    sb = sandbox(tier, id, policy)
    assert_receive {:event, [:control_connected], _, _}, 30_000

    assert post(sb, "https://allowed.test/echo", ~s({"password":"hunter2","who":"tenant-7","n":1})) == "200"
    # The decider's question carries the preview, redacted like the events'.
    assert_receive {:asked, ~s({"password":"[redacted]","who":"[redacted]","n":1})}, 10_000
    assert_receive {:event, [:decide, :start], _, %{request: %{host: "allowed.test"}}}, 10_000

    assert_receive {:event, [:decide, :stop], %{duration: d}, %{result: :allow, request: %{host: "allowed.test"}}},
                   10_000

    assert is_integer(d) and d >= 0

    assert_receive {:event, [:request_closed], %{duration: duration}, %{request: %{host: "allowed.test"} = request}},
                   10_000

    assert is_integer(duration) and duration > 0
    assert request.body_preview == ~s({"password":"[redacted]","who":"[redacted]","n":1})
    assert {"x-api-key", "[redacted]"} in request.headers

    # The same request without a preview in the policy: none anywhere.
    :ok = Sandbox.shutdown(sb)
    id2 = "op-nobody-#{System.unique_integer([:positive])}"
    attach(id2)
    sb2 = sandbox(tier, id2, rules: [allow: ["allowed.test"]])
    assert_receive {:event, [:control_connected], _, %{session_id: ^id2}}, 30_000
    assert post(sb2, "https://allowed.test/echo", ~s({"password":"hunter2"})) == "200"

    assert_receive {:event, [:request_closed], _, %{session_id: ^id2, request: %{host: "allowed.test"} = request}},
                   10_000

    assert request.body_preview == nil
  end
end
