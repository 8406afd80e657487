defmodule Condukt.Netns.SidecarTlsResumeTest do
  # Upstream TLS session resumption (docs/proxy.md): the sidecar keeps the
  # TLS 1.3 tickets an origin sends after a verified handshake and offers
  # one on its next connection to the same name, port and ALPN. nginx logs
  # $ssl_session_reused per request: the first connection is a full
  # handshake, the next ones resume. (That a failed verification never
  # stores a session is shown by the C unit tests: such a connection
  # never reaches nginx's access log.)
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Test.Netns.Sidecar

  @policy [rules: [allow: ~w(other.test)], default: :deny]

  setup_all do
    tb = Testbed.start()
    sc = Sidecar.start(tb, @policy)
    on_exit(fn -> Sidecar.stop(sc) end)
    %{tb: tb, sc: sc}
  end

  defp tag, do: "t=#{System.unique_integer([:positive])}"

  defp get(tb, sc, host, q) do
    Client.run(tb, :curl, "https://#{host}/headers?#{q}", ca: sc.ca_cert, http: :h1)
  end

  defp logged(tb, q) do
    Enum.filter(Testbed.access_log(tb), &String.contains?(&1["uri"] || "", q))
  end

  test "the second connection to the same origin resumes the TLS session", %{tb: tb, sc: sc} do
    q = tag()

    for _ <- 1..3 do
      r = get(tb, sc, "other.test", q)
      assert r.ok and r.status == 200, inspect(r)
    end

    [first | rest] = logged(tb, q)
    assert first["tls"] == "TLSv1.3", inspect(first)
    assert first["tls_reused"] == ".", inspect(first)
    assert length(rest) == 2
    # Three workspace connections, three upstream connections.
    assert length(Enum.uniq_by([first | rest], & &1["connection"])) == 3
    for e <- rest, do: assert(e["tls_reused"] == "r", inspect(e))
  end
end
