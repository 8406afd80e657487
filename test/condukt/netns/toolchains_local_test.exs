defmodule Condukt.Netns.ToolchainsLocalTest do
  # A Local sandbox with a policy: the JVM and npm work through its
  # sidecar with nothing but the environment the sandbox gives (the
  # PKCS#12 trust store in the session directory, JAVA_TOOL_OPTIONS merged
  # with the operator's, NPM_CONFIG_CAFILE), install from the testbed's
  # registries, and a refused registry's reason reaches the JVM program and
  # the :telemetry handlers.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.Registries
  alias Condukt.Sandbox
  alias Condukt.Sandbox.NetworkPolicy

  @reason "other.test is not an approved package registry"

  def decider(_ctx, _req), do: {:deny, @reason}

  setup_all do
    %{tb: Testbed.start(big_size: 1024)}
  end

  test "Java and npm install through a Local session's sidecar; a refusal names the decider's reason", %{tb: tb} do
    test = self()
    id = "toolchains-#{System.unique_integer([:positive])}"
    events = for e <- ~w(request_allowed request_denied)a, do: [:condukt, :sandbox, :network_policy, e]

    :ok =
      :telemetry.attach_many(
        id,
        events,
        fn name, _, meta, _ -> send(test, {:telemetry, List.last(name), meta}) end,
        nil
      )

    on_exit(fn -> :telemetry.detach(id) end)

    policy = NetworkPolicy.new!(rules: [allow: [Registries.host()], decide: &__MODULE__.decider/2], default: :deny)

    cwd = Path.join(tb.dir, "scratch/local-#{System.unique_integer([:positive])}")
    File.mkdir_p!(cwd)
    File.chown!(cwd, 65_534)
    cp = Registries.java_fetch!(Testbed.scratch_dir(tb))

    network = [
      uplink: {:netns, tb.inet_ns},
      hosts: Map.new([Registries.host(), "other.test"], &{&1, tb.inet.v4}),
      allow_private: [tb.inet.v4 <> "/32"],
      upstream_ca: tb.ca_cert,
      binary: Condukt.Test.Netns.Sidecar.bin()
    ]

    {:ok, sb} = Sandbox.new({Sandbox.Local, id: id, cwd: cwd, network_policy: policy, network: network})
    on_exit(fn -> Sandbox.shutdown(sb) end)
    store = sb.state.network.trust_store
    assert File.stat!(store).mode |> Bitwise.band(0o777) == 0o644

    # The operator's own JVM options stay, the trust store's come last.
    env = [{"HOME", cwd}, {"JAVA_TOOL_OPTIONS", "-Xss2m"}]
    url = "https://#{Registries.host()}/maven/org/condukt/test/hello/maven-metadata.xml"

    assert {:ok, %{exit_code: 0, output: out}} =
             Sandbox.exec(sb, "java -cp #{cp} Fetch #{url}", env: env, timeout: 60_000)

    assert out =~ "Picked up JAVA_TOOL_OPTIONS: -Xss2m -Djavax.net.ssl.trustStore=#{store} "
    assert out =~ "status 200"
    assert_receive {:telemetry, :request_allowed, %{request: %{host: "registry.test"}}}, 10_000

    assert {:ok, %{exit_code: 1, output: out}} =
             Sandbox.exec(sb, "java -cp #{cp} Fetch https://other.test/", env: env, timeout: 60_000)

    assert out =~ "status 403"
    assert out =~ "reason: #{@reason}"
    assert_receive {:telemetry, :request_denied, %{request: %{host: "other.test"}, reason: @reason}}, 10_000

    npm =
      "npm install condukt-hello --registry https://#{Registries.host()}/npm/ --no-audit --no-fund --fetch-retries=0"

    assert {:ok, %{exit_code: 0, output: out}} = Sandbox.exec(sb, npm, env: env, timeout: 60_000)
    assert out =~ "added 1 package"
    assert File.read!(Path.join(cwd, "node_modules/condukt-hello/index.js")) =~ "hello from condukt-hello"
  end
end
