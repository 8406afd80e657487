defmodule Condukt.Sandbox.NetworkPolicy.TrustStore do
  @moduledoc """
  Trust for runtimes that do not read PEM files: a per-session PKCS#12
  trust store (the Mozilla roots shipped in
  `priv/ca-certificates/mozilla.pem` plus the session CA) and the
  environment that points the JVM at it, plus the variables of the other
  stacks that read a PEM file of their own (docs/trust.md has the table).

  The store is written on the BEAM, so the host needs no `keytool` or
  `openssl pkcs12` at run time (`:public_key` reads and writes certificates
  but has no PKCS#12 writer; the few DER structures a trust store needs are
  encoded here). It has the form the JDK itself writes a password-less
  trust store in: every certificate in one unencrypted bag,
  marked as a trusted certificate entry (the JDK's "trusted key usage"
  attribute, any extended key usage), no integrity MAC and no password.
  Certificates are public, so nothing is lost by not encrypting them; the
  file's integrity comes from its read-only mount. The JDK loads it with
  `-Djavax.net.ssl.trustStoreType=PKCS12` and no password (tested with
  OpenJDK 17); `keytool -list` and `openssl pkcs12 -nomacver` read it too.

  `JAVA_TOOL_OPTIONS` is read by every JVM (java, mvn, gradle, sbt,
  kotlin, ...) at start-up, which prints `Picked up JAVA_TOOL_OPTIONS: ...`
  on its standard error.
  """

  alias Condukt.Sandbox.NetworkPolicy.CA

  # The file name of the store next to the PEM files.
  @file_name "trust-store.p12"

  # PKCS#7 data; PKCS#12 certBag; PKCS#9 x509Certificate and friendlyName;
  # the JDK's trusted-key-usage attribute; anyExtendedKeyUsage.
  @oid_data [1, 2, 840, 113_549, 1, 7, 1]
  @oid_cert_bag [1, 2, 840, 113_549, 1, 12, 10, 1, 3]
  @oid_x509 [1, 2, 840, 113_549, 1, 9, 22, 1]
  @oid_friendly_name [1, 2, 840, 113_549, 1, 9, 20]
  @oid_trusted_usage [2, 16, 840, 1, 113_894, 746_875, 1, 1]
  @oid_any_eku [2, 5, 29, 37, 0]

  @doc "The store's file name next to the PEM bundle (`trust-store.p12`)."
  @spec file_name() :: String.t()
  def file_name, do: @file_name

  @doc """
  The session's PKCS#12 trust store: every Mozilla root, then the session
  CA `ca_pem` (PEM), as trusted certificate entries. Raises
  `ArgumentError` when `ca_pem` holds no certificate.
  """
  @spec pkcs12(String.t()) :: binary()
  def pkcs12(ca_pem) when is_binary(ca_pem) do
    session = certificates(ca_pem)
    if session == [], do: raise(ArgumentError, "no PEM certificate in the session CA")

    mozilla = mozilla_path() |> File.read!() |> certificates()

    entries =
      Enum.with_index(mozilla, 1)
      |> Enum.map(fn {der, i} -> {"mozilla-#{String.pad_leading("#{i}", 3, "0")}", der} end)
      |> Kernel.++(Enum.with_index(session, 1) |> Enum.map(fn {der, i} -> {"condukt-session-ca-#{i}", der} end))

    encode(entries)
  end

  @doc """
  A PKCS#12 trust store of `entries` (`{alias, certificate DER}`), as
  described in the module documentation. Aliases should be lower-case:
  the JDK lower-cases them when it reads the store.
  """
  @spec encode([{String.t(), binary()}]) :: binary()
  def encode(entries) when is_list(entries) do
    bags = Enum.map(entries, fn {name, der} -> cert_bag(name, der) end)
    safe_contents = seq(bags)
    auth_safe = seq([content_info(safe_contents)])
    seq([int(3), content_info(auth_safe)])
  end

  @doc """
  The JVM options that make it trust the store at `path`:
  `-Djavax.net.ssl.trustStore=PATH -Djavax.net.ssl.trustStoreType=PKCS12`.
  Raises `ArgumentError` for a path with white space (the JVM splits
  `JAVA_TOOL_OPTIONS` on it).
  """
  @spec java_options(Path.t()) :: String.t()
  def java_options(path) do
    if path == "" or String.match?(path, ~r/[\s"']/u),
      do: raise(ArgumentError, "a trust store path without white space or quotes is needed, got: #{inspect(path)}")

    "-Djavax.net.ssl.trustStore=#{path} -Djavax.net.ssl.trustStoreType=PKCS12"
  end

  @doc """
  `JAVA_TOOL_OPTIONS` for the store at `path`, merged with the operator's
  value (`nil` or `""` for none): the operator's options first, then the
  trust store's, which the JVM applies last, so they win over a trust
  store the operator named (it could not verify the sidecar's
  certificates).
  """
  @spec java_tool_options(String.t() | nil, Path.t()) :: String.t()
  def java_tool_options(operator, path) do
    case String.trim(operator || "") do
      "" -> java_options(path)
      value -> value <> " " <> java_options(path)
    end
  end

  @doc """
  The variables, beyond the six of `Condukt.Sandbox.NetworkPolicy.ca_env/1`,
  that make other stacks trust the session: `JAVA_TOOL_OPTIONS` (the
  PKCS#12 store at `store_path`), and the PEM file `pem_path` as
  `NPM_CONFIG_CAFILE` (npm, whose own HTTP agent ignores
  `NODE_EXTRA_CA_CERTS`), `DENO_CERT` (Deno), `CARGO_HTTP_CAINFO` (cargo)
  and `AWS_CA_BUNDLE` (the AWS CLI and SDKs). `JAVA_TOOL_OPTIONS` is merged with `operator_java`
  (see `java_tool_options/2`).
  """
  @spec env(Path.t(), Path.t(), String.t() | nil) :: [{String.t(), String.t()}]
  def env(pem_path, store_path, operator_java \\ nil) do
    [
      {"JAVA_TOOL_OPTIONS", java_tool_options(operator_java, store_path)},
      {"NPM_CONFIG_CAFILE", pem_path},
      {"DENO_CERT", pem_path},
      {"CARGO_HTTP_CAINFO", pem_path},
      {"AWS_CA_BUNDLE", pem_path}
    ]
  end

  @doc "The names `env/3` sets."
  @spec env_names() :: [String.t()]
  def env_names, do: ~w(JAVA_TOOL_OPTIONS NPM_CONFIG_CAFILE DENO_CERT CARGO_HTTP_CAINFO AWS_CA_BUNDLE)

  defp mozilla_path, do: CA.mozilla_path()

  defp certificates(pem) do
    for {:Certificate, der, :not_encrypted} <- :public_key.pem_decode(pem) do
      # Decoded once to refuse what is not a certificate.
      _ = :public_key.pkix_decode_cert(der, :plain)
      der
    end
  rescue
    _ -> raise ArgumentError, "the session CA is not valid PEM"
  end

  ## DER

  defp cert_bag(name, der) do
    cert_bag = seq([oid(@oid_x509), explicit0(octets(der))])

    attrs =
      set([
        seq([oid(@oid_friendly_name), set([bmp(name)])]),
        seq([oid(@oid_trusted_usage), set([oid(@oid_any_eku)])])
      ])

    seq([oid(@oid_cert_bag), explicit0(cert_bag), attrs])
  end

  defp content_info(der), do: seq([oid(@oid_data), explicit0(octets(der))])

  defp seq(items), do: tlv(0x30, items)
  # DER orders the members of a SET OF by their encodings.
  defp set(items), do: tlv(0x31, Enum.sort(items))
  defp explicit0(der), do: tlv(0xA0, der)
  defp octets(bin), do: tlv(0x04, bin)
  defp int(n) when n in 0..127, do: tlv(0x02, <<n>>)
  defp bmp(text), do: tlv(0x1E, :unicode.characters_to_binary(text, :utf8, {:utf16, :big}))

  defp oid([a, b | rest]) do
    tlv(0x06, [base128(40 * a + b) | Enum.map(rest, &base128/1)])
  end

  defp base128(n) when n < 128, do: <<n>>
  defp base128(n), do: base128_high(div(n, 128)) <> <<rem(n, 128)>>
  defp base128_high(0), do: <<>>
  defp base128_high(n), do: base128_high(div(n, 128)) <> <<1::1, rem(n, 128)::7>>

  defp tlv(tag, content) do
    content = IO.iodata_to_binary(content)
    <<tag>> <> len(byte_size(content)) <> content
  end

  defp len(n) when n < 128, do: <<n>>

  defp len(n) do
    bytes = :binary.encode_unsigned(n)
    <<0x80 + byte_size(bytes)>> <> bytes
  end
end
