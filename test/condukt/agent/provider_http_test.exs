defmodule Condukt.Provider.HTTPTest do
  # The providers' HTTP client refuses a server whose certificate the
  # system's CA store does not vouch for: a TLS listener on 127.0.0.1 with
  # a self-signed certificate (no model behind it; the handshake fails
  # before any request is sent).
  use ExUnit.Case, async: true

  alias Condukt.Error
  alias Condukt.Provider.HTTP

  @moduletag :tmp_dir

  test "an untrusted certificate is refused, not retried into success", %{tmp_dir: dir} do
    key = Path.join(dir, "key.pem")
    cert = Path.join(dir, "cert.pem")

    {_, 0} =
      System.cmd("openssl", ~w(req -x509 -newkey rsa:2048 -nodes -keyout #{key} -out #{cert} -subj /CN=localhost -days 1
          -addext subjectAltName=DNS:localhost,IP:127.0.0.1), stderr_to_stdout: true)

    {:ok, listen} =
      :ssl.listen(0, certfile: to_charlist(cert), keyfile: to_charlist(key), reuseaddr: true, active: false)

    {:ok, {_, port}} = :ssl.sockname(listen)
    test = self()

    spawn_link(fn ->
      {:ok, socket} = :ssl.transport_accept(listen)
      send(test, {:handshake, :ssl.handshake(socket, 5_000)})
    end)

    assert {:error, %Error{reason: :http, detail: detail}} =
             HTTP.post_json("https://localhost:#{port}/v1/chat/completions", %{}, retries: 0, timeout: 5_000)

    assert inspect(detail) =~ "tls_alert"
    assert inspect(detail) =~ "Bad Certificate"
    assert_receive {:handshake, {:error, _}}, 5_000
  end

  test "a connection refused is retried, then reported" do
    started = System.monotonic_time(:millisecond)
    assert {:error, %Error{reason: :http}} = HTTP.post_json("http://127.0.0.1:9/", %{}, retries: 2, timeout: 1_000)
    # Two backoffs: about 0.5 s and 1 s.
    assert System.monotonic_time(:millisecond) - started >= 1_500
  end
end
