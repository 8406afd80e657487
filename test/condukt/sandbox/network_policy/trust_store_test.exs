defmodule Condukt.Sandbox.NetworkPolicy.TrustStoreTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy.TrustStore

  @moduletag :tmp_dir

  defp ca_pem do
    der = :public_key.pkix_test_root_cert(~c"Session CA", key: {:namedCurve, :secp256r1})[:cert]
    {der, :public_key.pem_encode([{:Certificate, der, :not_encrypted}])}
  end

  defp mozilla_count do
    Condukt.Sandbox.NetworkPolicy.CA.mozilla_path() |> File.read!() |> :public_key.pem_decode() |> length()
  end

  test "the store holds every Mozilla root and the session CA, as trusted entries the JDK lists", %{tmp_dir: dir} do
    {der, pem} = ca_pem()
    p12 = TrustStore.pkcs12(pem)
    path = Path.join(dir, "t.p12")
    File.write!(path, p12)
    assert :binary.match(p12, der) != :nomatch

    # Cross-checks with the JDK's keytool and OpenSSL, which this machine
    # (and CI, scripts/setup-debian.sh) has: no password, no MAC.
    {out, 0} = System.cmd("keytool", ~w(-list -storetype PKCS12 -storepass) ++ ["", "-keystore", path])
    n = mozilla_count() + 1
    assert out =~ "Your keystore contains #{n} entries"
    assert length(Regex.scan(~r/trustedCertEntry/, out)) == n
    assert out =~ "condukt-session-ca-1,"
    assert out =~ "mozilla-001,"

    {out, 0} = System.cmd("openssl", ~w(pkcs12 -nokeys -passin pass: -nomacver -in) ++ [path], stderr_to_stdout: true)
    assert length(Regex.scan(~r/BEGIN CERTIFICATE/, out)) == n
  end

  test "condukt-egress ca bundle writes the same store in the pod, byte for byte", %{tmp_dir: dir} do
    {_der, pem} = ca_pem()
    ca = Path.join(dir, "session.pem")
    File.write!(ca, pem)
    out = Path.join(dir, "out")
    File.mkdir_p!(out)
    roots = Condukt.Sandbox.NetworkPolicy.CA.mozilla_path()
    args = ~w(ca bundle --ca-cert) ++ [ca, "--roots", roots, "--out-dir", out]
    assert {"", 0} = System.cmd(Condukt.egress_binary(), args, stderr_to_stdout: true)
    assert File.read!(Path.join(out, TrustStore.file_name())) == TrustStore.pkcs12(pem)
  end

  test "a session CA that is not a PEM certificate is refused" do
    assert_raise ArgumentError, ~r/no PEM certificate/, fn -> TrustStore.pkcs12("not a certificate") end

    assert_raise ArgumentError, ~r/not valid PEM/, fn ->
      TrustStore.pkcs12("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n")
    end
  end

  test "encode/1 writes DER the JDK's layout expects: lengths in long form, OIDs base 128" do
    big = :binary.copy(<<0xAB>>, 300)
    p12 = TrustStore.encode([{"a", big}])
    # SEQUENCE with a two-byte long-form length, then INTEGER 3
    assert <<0x30, 0x82, len::16, 0x02, 0x01, 0x03, _::binary>> = p12
    assert len == byte_size(p12) - 4
    # the certificate's OCTET STRING: long form, 300 bytes
    assert :binary.match(p12, <<0x04, 0x82, 300::16>> <> big) != :nomatch
    # the JDK's trusted-key-usage OID 2.16.840.1.113894.746875.1.1
    assert :binary.match(p12, <<0x06, 0x0C, 0x60, 0x86, 0x48, 0x01, 0x86, 0xF9, 0x66, 0xAD, 0xCA, 0x7B, 0x01, 0x01>>) !=
             :nomatch
  end

  test "JAVA_TOOL_OPTIONS: the operator's options first, the trust store's last" do
    opts = "-Djavax.net.ssl.trustStore=/s.p12 -Djavax.net.ssl.trustStoreType=PKCS12"
    assert TrustStore.java_tool_options(nil, "/s.p12") == opts
    assert TrustStore.java_tool_options("  ", "/s.p12") == opts
    assert TrustStore.java_tool_options(" -Xmx1g ", "/s.p12") == "-Xmx1g " <> opts
    assert_raise ArgumentError, fn -> TrustStore.java_options("/a b/s.p12") end
    assert_raise ArgumentError, fn -> TrustStore.java_options("") end

    env = TrustStore.env("/ca.pem", "/s.p12", "-Xss2m")
    assert Enum.map(env, &elem(&1, 0)) == TrustStore.env_names()
    assert {"JAVA_TOOL_OPTIONS", "-Xss2m " <> opts} in env
    for v <- ~w(DENO_CERT CARGO_HTTP_CAINFO AWS_CA_BUNDLE), do: assert({v, "/ca.pem"} in env)
  end

  test "Local: the operator's JAVA_TOOL_OPTIONS is merged, other variables are the operator's" do
    net = %Condukt.Sandbox.Local.Network{name: "n", dir: "/d", bundle: "/d/b.pem", trust_store: "/d/s.p12"}
    env = Condukt.Sandbox.Local.Network.env(net, [{"JAVA_TOOL_OPTIONS", "-Xmx1g"}, {"SSL_CERT_FILE", "/mine"}])
    # last wins, as the command's environment is built
    last = env |> Enum.reverse() |> Enum.uniq_by(&elem(&1, 0)) |> Map.new()
    assert last["JAVA_TOOL_OPTIONS"] == "-Xmx1g " <> TrustStore.java_options("/d/s.p12")
    assert last["SSL_CERT_FILE"] == "/mine"
    assert last["DENO_CERT"] == "/d/b.pem"
    assert last["NODE_EXTRA_CA_CERTS"] == "/d/b.pem"
  end
end
