defmodule Condukt.Sandbox.NetworkPolicy.CredentialsTest do
  # Credential entries and secrets: validation with errors that name the
  # bad input (and never a secret's value), the sidecar document (version
  # 3, read by the sidecar's own loader), the secrets file, inspect output,
  # and the manifests of a Kubernetes sandbox.
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.{Kubernetes, NetworkPolicy}
  alias Condukt.Sandbox.NetworkPolicy.{Credentials, Error}

  @secret "ghp_s3cretvalue0123456789abcdef"

  defp policy(extra) do
    Keyword.merge(
      [
        rules: [allow: ["api.github.com", "*.example.com"]],
        credentials: [
          {"api.github.com",
           header: "Authorization", value: {:secret, "github"}, methods: ["GET"], paths: ["/repos/myorg/**"]},
          {"*.example.com", header: "x-api-key", value: {:secret, "example"}}
        ],
        secrets: %{"github" => "Bearer " <> @secret, "example" => {:env, "CONDUKT_TEST_EXAMPLE_KEY"}}
      ],
      extra
    )
  end

  defp refused(policy) do
    assert {:error, %Error{} = e} = NetworkPolicy.new(policy)
    message = Exception.message(e)
    refute message =~ @secret
    {e, message}
  end

  test "a valid policy keeps its entries as written and compiles to a version 3 document" do
    p = NetworkPolicy.new!(policy([]))
    assert length(p.credentials) == 2

    doc = p |> NetworkPolicy.to_sidecar_json() |> Condukt.JSON.decode!()
    assert doc["version"] == 3

    assert doc["credentials"] == [
             %{
               "host" => "api.github.com",
               "methods" => ["GET"],
               "paths" => ["/repos/myorg/**"],
               "header" => "authorization",
               "secret" => "github"
             },
             %{"host" => "*.example.com", "header" => "x-api-key", "secret" => "example"}
           ]

    # The policy document carries names, never values.
    refute NetworkPolicy.to_sidecar_json(p) =~ @secret
    # Without credentials the document keeps its lower version.
    assert NetworkPolicy.to_sidecar_json(rules: [allow: ["a.test"]]) =~ ~s("version":1)
  end

  test "the sidecar's own loader reads the document and the secrets file" do
    dir = Path.join(System.tmp_dir!(), "condukt-cred-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    path = Path.join(dir, "policy.json")
    File.write!(path, NetworkPolicy.to_sidecar_json(policy([])))
    assert {_, 0} = System.cmd(Condukt.egress_binary(), ["policy", "check", path], stderr_to_stdout: true)
  end

  test "errors name the credential, the option and the value" do
    {e, m} = refused(policy(credentials: [{"api.github.com", header: "Host", value: {:secret, "github"}}]))
    assert %Error{reason: :invalid_credential_header, credential_index: 0, key: :header, value: "Host"} = e
    assert m =~ "network policy credential 0 (:header): invalid header \"Host\": the proxy owns this field"

    {e, _} = refused(policy(credentials: [{"a.test", header: "x y", value: {:secret, "github"}}]))
    assert e.reason == :invalid_credential_header

    {e, m} = refused(policy(credentials: [{"a.test", headr: "x", value: {:secret, "github"}}]))
    assert %Error{reason: :unknown_credential_option, value: :headr, detail: :header} = e
    assert m =~ "did you mean :header?"

    {e, m} = refused(policy(credentials: [{"a.test", header: "x"}]))
    assert e.reason == :invalid_credential
    assert m =~ "name the secret with value: {:secret, name}"

    # A literal in :value is refused, and not shown.
    {e, m} = refused(policy(credentials: [{"a.test", header: "x", value: "Bearer " <> @secret}]))
    assert e.reason == :invalid_credential
    assert m =~ "[redacted]"

    {e, _} = refused(policy(credentials: [{"https://a.test", header: "x", value: {:secret, "github"}}]))
    assert %Error{reason: :invalid_pattern, credential_index: 0, detail: :scheme} = e

    {e, m} = refused(policy(credentials: [{"a.test", header: "x", value: {:secret, "github"}, methods: ["get"]}]))
    assert %Error{reason: :invalid_method, credential_index: 0, value: "get"} = e
    assert m =~ "network policy credential 0 (:methods)"

    {e, _} = refused(policy(credentials: [{"a.test", header: "x", value: {:secret, "github"}, paths: ["/a/../b"]}]))
    assert %Error{reason: :invalid_path_pattern, credential_index: 0} = e

    {e, _} = refused(policy(credentials: [{"a.test", header: "x", value: {:secret, "nope"}}]))
    assert %Error{reason: :unknown_secret, value: "nope"} = e

    {e, m} = refused(policy(credentials: :nope))
    assert e.reason == :invalid_credentials
    assert m =~ ":credentials"

    {e, _} = refused(policy(credentials: ["a.test"]))
    assert e.reason == :invalid_credential
  end

  test "secrets: names, sources and values are checked without showing a value" do
    {e, _} = refused(policy(secrets: %{"github" => "x", "example" => "y", "unused" => "z"}))
    assert %Error{reason: :unused_secret, value: "unused"} = e

    {e, m} = refused(policy(secrets: %{"github" => "Bearer " <> @secret <> "\r\nX-Evil: 1", "example" => "y"}))
    assert %Error{reason: :invalid_secret, value: "github"} = e
    assert m =~ "control character"

    {e, _} = refused(policy(secrets: %{"github" => " " <> @secret, "example" => "y"}))
    assert e.reason == :invalid_secret

    {e, _} = refused(policy(secrets: %{"github" => {:file, "/x"}, "example" => "y"}))
    assert e.reason == :invalid_secret

    {e, _} = refused(policy(secrets: %{"git hub" => "x", "example" => "y"}))
    assert e.reason == :invalid_secret_name

    {e, m} = refused(policy(secrets: [{"github", @secret}]))
    assert e.reason == :invalid_secrets
    assert m =~ "[redacted]"

    {e, m} = refused([{:secrets, %{"github" => @secret}}, :oops])
    assert e.reason == :invalid_policy
    refute m =~ @secret
  end

  test "values/1 resolves functions and environment variables, never showing a value" do
    System.put_env("CONDUKT_TEST_EXAMPLE_KEY", "k-123")
    on_exit(fn -> System.delete_env("CONDUKT_TEST_EXAMPLE_KEY") end)

    p =
      NetworkPolicy.new!(
        policy(secrets: %{"github" => fn -> "Bearer " <> @secret end, "example" => {:env, "CONDUKT_TEST_EXAMPLE_KEY"}})
      )

    assert {:ok, %{"github" => "Bearer " <> @secret, "example" => "k-123"}} = Credentials.values(p.secrets)

    json = Credentials.sidecar_secrets_json(%{"github" => "v1", "example" => "v2"})
    assert Condukt.JSON.decode!(json) == %{"version" => 1, "secrets" => %{"github" => "v1", "example" => "v2"}}

    assert {:error, %Error{reason: :secret_unavailable, value: "example"} = e} =
             Credentials.values(%{"example" => {:env, "CONDUKT_TEST_UNSET_#{System.unique_integer([:positive])}"}})

    assert Exception.message(e) =~ "is not set"

    assert {:error, %Error{reason: :secret_unavailable} = e} =
             Credentials.values(%{"github" => fn -> @secret <> "\n" end})

    refute Exception.message(e) =~ @secret
    assert {:error, %Error{reason: :secret_unavailable}} = Credentials.values(%{"github" => fn -> raise "boom" end})
  end

  test "inspect never shows a literal secret" do
    p = NetworkPolicy.new!(policy([]))
    text = inspect(p)
    refute text =~ @secret
    assert text =~ "[redacted]"
    assert text =~ "CONDUKT_TEST_EXAMPLE_KEY"
  end

  test "evaluate/3 is not changed by credentials" do
    p = NetworkPolicy.new!(policy([]))
    assert {:allow, %{index: 0}} = NetworkPolicy.evaluate(p, "https://api.github.com/repos/myorg/x", method: "GET")
  end

  test "Kubernetes manifests: the secrets file is in the sidecar's Secret only, values redacted" do
    System.put_env("CONDUKT_TEST_EXAMPLE_KEY", "k-123")
    on_exit(fn -> System.delete_env("CONDUKT_TEST_EXAMPLE_KEY") end)
    me = self()
    fun = fn -> send(me, :resolved) && "Bearer " <> @secret end
    p = policy(secrets: %{"github" => fun, "example" => {:env, "CONDUKT_TEST_EXAMPLE_KEY"}})

    {:ok, [egress, trust, _np, pod] = objects} = Kubernetes.manifests(namespace: "agents", id: "c-1", network_policy: p)

    # manifests/1 resolves nothing: no function called, no variable read into it.
    refute_received :resolved
    yaml = Kubernetes.YAML.encode_documents(objects)
    refute yaml =~ @secret
    refute yaml =~ "k-123"

    creds = egress["data"]["credentials.json"] |> Base.decode64!() |> Condukt.JSON.decode!()
    assert creds == %{"version" => 1, "secrets" => %{"github" => "[redacted]", "example" => "[redacted]"}}
    refute Map.has_key?(trust["data"], "credentials.json")

    [sidecar] = for c <- pod["spec"]["initContainers"], c["name"] == "condukt-egress", do: c

    assert ["--credentials", "/etc/condukt-egress/credentials.json"] ==
             Enum.drop_while(sidecar["command"], &(&1 != "--credentials")) |> Enum.take(2)

    # The workspace container mounts neither the egress Secret nor any of it.
    [workspace] = pod["spec"]["containers"]
    refute inspect(workspace) =~ "condukt-egress\""
    refute Enum.any?(workspace["volumeMounts"] || [], &(&1["name"] == "condukt-egress"))
    refute Enum.any?(workspace["env"] || [], &(inspect(&1) =~ "credentials"))

    # Without credentials there is no such key and no flag.
    {:ok, [plain | _]} =
      Kubernetes.manifests(namespace: "agents", id: "c-2", network_policy: [rules: [allow: ["a.test"]]])

    refute Map.has_key?(plain["data"], "credentials.json")
  end

  test "the Virtual sandbox refuses a policy with credentials" do
    result = Condukt.Sandbox.Virtual.init(network_policy: policy([]))

    case result do
      {:error, %Condukt.Sandbox.Error{reason: :not_available}} ->
        :ok

      {:error,
       %Condukt.Sandbox.Error{reason: :invalid_network_policy, detail: %Error{reason: :credentials_unsupported} = e}} ->
        assert Exception.message(e) =~ "no sidecar"
    end
  end

  test "rotate_credential/3 checks the value and the sandbox" do
    sb = %Condukt.Sandbox{module: Condukt.Sandbox.Virtual, state: nil}

    assert {:error, %Error{reason: :secret_unavailable} = e} =
             NetworkPolicy.rotate_credential(sb, "github", "bad\r\nvalue")

    refute Exception.message(e) =~ "bad"
    assert {:error, %Error{reason: :rotation_failed}} = NetworkPolicy.rotate_credential(sb, "github", "ok")
    assert {:error, %Error{reason: :unknown_secret}} = NetworkPolicy.check_rotation(NetworkPolicy.new!(policy([])), "x")
  end
end
