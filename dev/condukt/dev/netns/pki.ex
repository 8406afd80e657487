defmodule Condukt.Dev.Netns.Pki do
  @moduledoc false
  # The testbed's certificates, made with the openssl CLI (P-256 keys, valid
  # for three days, from a root made fresh for every testbed):
  #
  #   * `ca.crt` / `ca.key`        the test root the clients trust;
  #   * `server.crt` / `.key`      one leaf for every served name and the
  #                                inet addresses (SAN DNS and IP entries);
  #   * `mismatch.crt` / `.key`    a valid leaf from the same root, but for
  #                                `other.test` only; nginx serves it under
  #                                mismatch.test (hostname verification fails);
  #   * `untrusted.crt` / `.key`   a self-signed leaf for untrusted.test
  #                                (chain verification fails).
  #
  # Every certificate carries SKI/AKI and the usual key usages, so strict
  # verifiers (Python's VERIFY_X509_STRICT, Node) accept the good ones for
  # the right reason.

  alias Condukt.Dev.Netns.{Cmd, Tier}

  @days "3"

  @doc "Writes the certificates into `dir` and returns their paths."
  @spec generate!(Path.t(), [String.t()], [String.t()], keyword()) :: map()
  def generate!(dir, dns_names, ip_addresses, opts \\ []) do
    File.mkdir_p!(dir)
    label = Keyword.get(opts, :label, "netns")
    p = &Path.join(dir, &1)

    write_cnf!(p.("ca.cnf"), "Condukt #{label} test root", ["basicConstraints = critical,CA:TRUE"] ++ ca_usage())

    openssl!([
      "req",
      "-x509",
      "-new",
      "-config",
      p.("ca.cnf"),
      "-extensions",
      "ext",
      "-days",
      @days,
      "-nodes",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-keyout",
      p.("ca.key"),
      "-out",
      p.("ca.crt")
    ])

    leaf!(dir, "server", hd(dns_names), dns_names, ip_addresses)
    leaf!(dir, "mismatch", "other.test", ["other.test"], [])
    self_signed!(dir, "untrusted", "untrusted.test")

    %{
      ca_cert: p.("ca.crt"),
      ca_key: p.("ca.key"),
      server: {p.("server.crt"), p.("server.key")},
      mismatch: {p.("mismatch.crt"), p.("mismatch.key")},
      untrusted: {p.("untrusted.crt"), p.("untrusted.key")}
    }
  end

  defp leaf!(dir, name, cn, dns, ips) do
    p = &Path.join(dir, &1)
    write_cnf!(p.("#{name}.cnf"), cn, leaf_ext(dns, ips) ++ ["authorityKeyIdentifier = keyid:always"])

    openssl!([
      "req",
      "-new",
      "-config",
      p.("#{name}.cnf"),
      "-nodes",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-keyout",
      p.("#{name}.key"),
      "-out",
      p.("#{name}.csr")
    ])

    openssl!([
      "x509",
      "-req",
      "-in",
      p.("#{name}.csr"),
      "-CA",
      p.("ca.crt"),
      "-CAkey",
      p.("ca.key"),
      "-set_serial",
      serial(),
      "-days",
      @days,
      "-extfile",
      p.("#{name}.cnf"),
      "-extensions",
      "ext",
      "-out",
      p.("#{name}.crt")
    ])
  end

  defp self_signed!(dir, name, cn) do
    p = &Path.join(dir, &1)
    write_cnf!(p.("#{name}.cnf"), cn, leaf_ext([cn], []))

    openssl!([
      "req",
      "-x509",
      "-new",
      "-config",
      p.("#{name}.cnf"),
      "-extensions",
      "ext",
      "-days",
      @days,
      "-nodes",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-keyout",
      p.("#{name}.key"),
      "-out",
      p.("#{name}.crt")
    ])
  end

  defp ca_usage, do: ["keyUsage = critical,keyCertSign,cRLSign", "subjectKeyIdentifier = hash"]

  defp leaf_ext(dns, ips) do
    alt = Enum.map(dns, &"DNS:#{&1}") ++ Enum.map(ips, &"IP:#{&1}")

    [
      "basicConstraints = critical,CA:FALSE",
      "keyUsage = critical,digitalSignature",
      "extendedKeyUsage = serverAuth",
      "subjectKeyIdentifier = hash",
      "subjectAltName = #{Enum.join(alt, ",")}"
    ]
  end

  # A self-contained config, so the system's openssl.cnf defaults cannot add
  # or duplicate extensions.
  defp write_cnf!(path, cn, ext) do
    File.write!(path, """
    [req]
    distinguished_name = dn
    prompt = no
    [dn]
    CN = #{cn}
    [ext]
    #{Enum.join(ext, "\n")}
    """)
  end

  defp serial, do: "0x7" <> Base.encode16(:crypto.strong_rand_bytes(15))

  defp openssl!(args), do: Cmd.run!([Tier.tool!("openssl") | args], timeout: 20_000)
end
