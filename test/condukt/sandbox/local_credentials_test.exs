defmodule Condukt.Sandbox.LocalCredentialsTest do
  # Credential injection with Condukt.Sandbox.Local, through the facade
  # and the real bridge (netns tier): the session's commands never see the
  # secret (environment, the sidecar's files), the origin the entry names
  # does, and NetworkPolicy.rotate_credential/3 replaces it for the next
  # request and in the sidecar's file.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Sandbox
  alias Condukt.Sandbox.NetworkPolicy

  @secret "Bearer l0cal-s3cr3t-abcdef"
  @rotated "Bearer l0cal-r0tated-uvwxyz"
  @literal "lit3ral-k3y-123456"

  setup_all do
    %{tb: Testbed.start(big_size: 1024)}
  end

  # A cwd the session's user (nobody) owns.
  defp scratch(tb), do: Testbed.scratch_dir(tb, 65_534)

  defp network(tb) do
    [
      uplink: {:netns, tb.inet_ns},
      hosts: Map.new(~w(allowed.test other.test), &{&1, tb.inet.v4}),
      allow_private: [tb.inet.v4 <> "/32"],
      upstream_ca: tb.ca_cert,
      binary: Condukt.Test.Netns.Sidecar.bin()
    ]
  end

  defp policy do
    NetworkPolicy.new!(
      rules: [allow: ["allowed.test", "other.test"]],
      credentials: [
        {"allowed.test", header: "authorization", value: {:secret, "token"}, paths: ["/echo"]},
        {"allowed.test", header: "x-api-key", value: {:secret, "key"}, paths: ["/echo"]}
      ],
      secrets: %{"token" => fn -> @secret end, "key" => @literal}
    )
  end

  # Two copies of the field, in two spellings: the sidecar removes both
  # for the credential's host (nginx refuses a request that still has two).
  defp echo(sb, url, headers \\ "-H 'Authorization: Bearer workspace' -H 'AUTHORIZATION: again'") do
    cmd = "curl -sS --max-time 10 #{headers} #{url}"
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, cmd)

    headers =
      try do
        Condukt.JSON.decode!(out)["headers"]
      rescue
        _ -> flunk("#{url}: #{out}")
      end

    {for([k, v] <- headers, k == "authorization", do: v), for([k, v] <- headers, k == "x-api-key", do: v)}
  end

  test "the origin gets the credential; the session never sees it; rotation takes effect", %{tb: tb} do
    {:ok, sb} =
      Sandbox.new({Sandbox.Local, cwd: scratch(tb), id: "cred-1", network_policy: policy(), network: network(tb)})

    on_exit(fn -> Sandbox.shutdown(sb) end)
    net = sb.state.network

    assert echo(sb, "https://allowed.test/echo") == {[@secret], [@literal]}
    # Another host keeps the session's own fields.
    assert echo(sb, "https://other.test/echo", "-H 'Authorization: Bearer workspace'") == {["Bearer workspace"], []}

    # The session's environment and the sidecar's files hold no secret.
    path = Path.join(net.dir, "credentials.json")
    assert File.read!(path) =~ "l0cal-s3cr3t"

    assert {:ok, %{output: out}} =
             Sandbox.exec(sb, "env; cat /proc/self/environ; cat #{path}; grep -rs s3cr3t #{net.dir}; true")

    assert out =~ "Permission denied"
    refute out =~ "s3cr3t"
    refute out =~ @literal

    # Neither inspect output nor the events hold it.
    refute inspect(sb) =~ "s3cr3t"
    refute inspect(sb) =~ @literal
    refute inspect(Condukt.Sandbox.Local.Network.events(net)) =~ "s3cr3t"

    # Rotation: the next request has the new value, the file too.
    assert :ok = NetworkPolicy.rotate_credential(sb, "token", @rotated)
    assert echo(sb, "https://allowed.test/echo") == {[@rotated], [@literal]}
    assert File.read!(path) =~ "l0cal-r0tated"
    refute File.read!(path) =~ "l0cal-s3cr3t"
    assert %File.Stat{mode: mode} = File.stat!(path)
    assert Bitwise.band(mode, 0o777) == 0o600

    assert {:error, %NetworkPolicy.Error{reason: :unknown_secret}} = NetworkPolicy.rotate_credential(sb, "nope", "x")

    assert {:error, %NetworkPolicy.Error{reason: :secret_unavailable} = e} =
             NetworkPolicy.rotate_credential(sb, "token", "bad\nvalue")

    refute Exception.message(e) =~ "bad"
    assert echo(sb, "https://allowed.test/echo") == {[@rotated], [@literal]}
  end

  test "a secret that cannot be resolved stops the sandbox from starting, without its value", %{tb: tb} do
    p =
      NetworkPolicy.new!(
        rules: [allow: ["allowed.test"]],
        credentials: [{"allowed.test", header: "authorization", value: {:secret, "token"}}],
        secrets: %{"token" => {:env, "CONDUKT_TEST_UNSET_#{System.unique_integer([:positive])}"}}
      )

    assert {:error, %Sandbox.Error{reason: :invalid_network_policy, detail: %NetworkPolicy.Error{} = e}} =
             Sandbox.new({Sandbox.Local, cwd: scratch(tb), network_policy: p, network: network(tb)})

    assert e.reason == :secret_unavailable
    assert Exception.message(e) =~ "is not set"
  end
end
