defmodule Condukt.Sandbox.NetworkPolicy.HostTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy.Host

  # RFC 3492 §7.1 sample strings (code points), with their published
  # Punycode encodings.
  @rfc3492 [
    {"(A) Arabic (Egyptian)",
     [
       0x0644,
       0x064A,
       0x0647,
       0x0645,
       0x0627,
       0x0628,
       0x062A,
       0x0643,
       0x0644,
       0x0645,
       0x0648,
       0x0634,
       0x0639,
       0x0631,
       0x0628,
       0x064A,
       0x061F
     ], "egbpdaj6bu4bxfgehfvwxn"},
    {"(B) Chinese (simplified)", [0x4ED6, 0x4EEC, 0x4E3A, 0x4EC0, 0x4E48, 0x4E0D, 0x8BF4, 0x4E2D, 0x6587],
     "ihqwcrb4cv8a8dqg056pqjye"},
    {"(L) 3<nen>B<gumi><kinpachi><sensei>", [0x0033, 0x5E74, 0x0042, 0x7D44, 0x91D1, 0x516B, 0x5148, 0x751F],
     "3B-ww4c5e180e575a65lsy2b"},
    {"(M) <amuro><namie>-with-SUPER-MONKEYS",
     [
       0x5B89,
       0x5BA4,
       0x5948,
       0x7F8E,
       0x6075,
       0x002D,
       0x0077,
       0x0069,
       0x0074,
       0x0068,
       0x002D,
       0x0053,
       0x0055,
       0x0050,
       0x0045,
       0x0052,
       0x002D,
       0x004D,
       0x004F,
       0x004E,
       0x004B,
       0x0045,
       0x0059,
       0x0053
     ], "-with-SUPER-MONKEYS-pc58ag80a8qai00g7n9n"},
    {"(S) -> $1.00 <-", [0x002D, 0x003E, 0x0020, 0x0024, 0x0031, 0x002E, 0x0030, 0x0030, 0x0020, 0x003C, 0x002D],
     "-> $1.00 <--"}
  ]

  test "Punycode encodes the RFC 3492 §7.1 samples" do
    for {name, codepoints, expected} <- @rfc3492 do
      assert Host.punycode_encode(codepoints) == expected, name
    end
  end

  test "normalises names: case, trailing dot, port, IDN" do
    assert Host.normalize("API.GitHub.COM.:8443") == {:ok, {:name, "api.github.com"}}
    assert Host.normalize("Bücher.Example") == {:ok, {:name, "xn--bcher-kva.example"}}
    assert Host.normalize("ÜBER.de") == {:ok, {:name, "xn--ber-goa.de"}}
    # The Kelvin sign lower-cases to an ASCII "k".
    assert Host.normalize("\u212Aa.example") == {:ok, {:name, "ka.example"}}
  end

  test "refuses ambiguous hosts" do
    for bad <- [
          "",
          "a..b",
          ".a",
          "a.b..",
          "127.1",
          "0x7f.0.0.1",
          "010.0.0.1",
          "host:",
          "host:65536",
          "host:x",
          "a b.com",
          "*.example.com",
          "[::1",
          "[fe80::1%eth0]",
          "1::2::3",
          <<0xC3, 0x28>>
        ] do
      assert Host.normalize(bad) == :error, inspect(bad)
    end
  end

  test "IP literals: strict IPv4, IPv6 spellings, IPv4-mapped addresses" do
    assert Host.normalize("10.0.0.1") == {:ok, {:ipv4, <<10, 0, 0, 1>>}}
    assert Host.normalize("[::ffff:10.0.0.1]:443") == {:ok, {:ipv4, <<10, 0, 0, 1>>}}
    assert Host.normalize("[::FFFF:a00:1]") == {:ok, {:ipv4, <<10, 0, 0, 1>>}}
    assert {:ok, {:ipv6, v6}} = Host.normalize("2001:DB8:0:0:0:0:0:1")
    assert Host.normalize("[2001:db8::1]:8443") == {:ok, {:ipv6, v6}}
    assert Host.to_text({:ipv6, v6}) == "2001:db8::1"
  end

  test "RFC 5952 text: longest zero run, first on a tie, single zero groups kept" do
    text = fn addr ->
      {:ok, ip} = Host.normalize(addr)
      Host.to_text(ip)
    end

    assert text.("2001:db8:0:0:1:0:0:1") == "2001:db8::1:0:0:1"
    assert text.("2001:0:0:1:0:0:0:1") == "2001:0:0:1::1"
    assert text.("2001:db8:0:1:1:1:1:1") == "2001:db8:0:1:1:1:1:1"
    assert text.("::") == "::"
    assert text.("::1") == "::1"
    assert text.("1::") == "1::"
    assert text.("::1.2.3.4") == "::102:304"
  end

  test "globs: * stays in one label, ** crosses labels, neither matches nothing" do
    match = fn pattern, host ->
      {:ok, p} = Host.normalize_pattern(pattern)
      {:ok, h} = Host.normalize(host)
      Host.match?(p, h)
    end

    assert match.("*.example.com", "a.example.com")
    refute match.("*.example.com", "example.com")
    refute match.("*.example.com", "a.b.example.com")
    assert match.("**.example.com", "a.b.example.com")
    refute match.("**.example.com", "example.com")
    assert match.("api*.example.com", "api-eu.example.com")
    refute match.("api*.example.com", "api.example.com")
    assert Host.normalize_pattern("127.0.0.*") == {:error, :bad_ip}
    refute match.("**", "[::1]")
    assert match.("**", "anything.at.all")
  end

  test "adversarial many-star patterns finish and answer correctly" do
    pattern = Enum.map_join(1..6, ".", fn _ -> String.duplicate("*a", 15) end) <> ".com"
    name = Enum.map_join(1..6, ".", fn _ -> String.duplicate("a", 29) end) <> ".com"
    {:ok, p} = Host.normalize_pattern(pattern)
    {:ok, h} = Host.normalize(name)
    refute Host.match?(p, h)
    {:ok, h} = Host.normalize(Enum.map_join(1..6, ".", fn _ -> String.duplicate("a", 30) end) <> ".com")
    assert Host.match?(p, h)

    {:ok, p} = Host.normalize_pattern(String.duplicate("**a", 20) <> "b")
    {:ok, h} = Host.normalize(Enum.map_join(1..30, ".", fn _ -> "aaaaaa" end) <> "c")
    refute Host.match?(p, h)
  end

  test "over-long IDN labels are refused before conversion, as the C engine does" do
    long = String.duplicate("ü", 600)
    assert Host.normalize_pattern(long <> ".com") == {:error, :label_too_long}
    assert Host.normalize_pattern(long <> "@x.com") == {:error, :bad_char}
    assert Host.normalize(String.duplicate(long, 40) <> ".com") == :error
  end

  test "NFC composes starter pairs that OTP leaves apart (Bengali o-sign)" do
    decomposed = "\u0995\u09C7\u09BE\u09A1.com"
    assert Host.normalize(decomposed) == {:ok, {:name, "xn--p5by0j.com"}}
    assert Host.normalize("\u0995\u09CB\u09A1.com") == {:ok, {:name, "xn--p5by0j.com"}}
  end
end
