defmodule Condukt.Netns.ToolchainsRegistriesTest do
  # Package managers and the JVM through the real sidecar: npm, pip,
  # cargo, go, Maven and Java's own HttpClient install from the testbed's
  # registries (registry.test, allowed) and fail, with the refusal in
  # their own output as far as the tool shows it, against a host the
  # decider refuses (docs/trust.md, "What a refusal looks like"). The
  # workspace gets exactly what a pod gets: the six CA variables and the
  # trust store's (JAVA_TOOL_OPTIONS naming the PKCS#12 store, nothing
  # added to the JDK's own cacerts). Every request shows on the control
  # channel.
  use Condukt.Test.Netns.Case, async: false

  alias Condukt.Dev.Netns.Registries
  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.TrustStore
  alias Condukt.Test.Netns.{ControlPeer, Sidecar}

  @reason "other.test is not an approved package registry"
  @refused "condukt: the network policy of this sandbox refused the request to other.test"
  # A workspace uid: neither root nor the sidecar's.
  @uid 4242
  @reg "registry.test"

  def decider(_ctx, _req), do: :allow

  setup_all do
    tb = Testbed.start(big_size: 1024)
    policy = [rules: [allow: [@reg], deny: ["denied.test"], decide: &__MODULE__.decider/2], default: :deny]
    sc = Sidecar.start(tb, policy)
    on_exit(fn -> Sidecar.stop(sc) end)

    # As in a pod: the session CA for the PEM readers, the PKCS#12 store
    # for the JVM, read-only for the workspace.
    store = Path.join(Testbed.scratch_dir(tb), TrustStore.file_name())
    File.write!(store, TrustStore.pkcs12(File.read!(sc.ca_cert)))
    File.chmod!(store, 0o444)
    env = NetworkPolicy.ca_env(sc.ca_cert) ++ TrustStore.env(sc.ca_cert, store)
    %{tb: tb, sc: sc, env: env}
  end

  setup %{sc: sc} do
    decide = fn request ->
      case request["host"] do
        "other.test" -> {:deny, @reason}
        _ -> {:deny, "unexpected"}
      end
    end

    {:ok, peer} = ControlPeer.start_link(sc, self(), decide)
    assert_receive {:egress_frame, %{"type" => "welcome"}}, 5_000
    on_exit(fn -> if Process.alive?(peer), do: ControlPeer.stop(peer) end)
    :ok
  end

  # Runs `argv` in the pod as the workspace uid, in `dir` (also HOME).
  defp run(ctx, dir, argv, extra_env \\ []) do
    Testbed.exec_in(ctx.tb, :pod, ["/usr/bin/env", "-C", dir | argv],
      uid: @uid,
      home: dir,
      env: ctx.env ++ extra_env,
      timeout: 120_000
    )
  end

  defp ok!({out, 0}), do: out
  defp ok!({out, status}), do: flunk("exit #{status}:\n#{out}")

  defp scratch(ctx), do: Testbed.scratch_dir(ctx.tb, @uid)

  # The events that arrived so far (the last ones within 300 ms).
  defp events(acc \\ []) do
    receive do
      {:egress_event, ev} -> events([ev | acc])
    after
      300 -> Enum.reverse(acc)
    end
  end

  # Allowed, then denied: each tool's two runs, checked on the events too.
  defp assert_events(paths) do
    evs = events()
    allowed = for %{"event" => "request_allowed", "host" => @reg, "path" => p} <- evs, do: p
    closed = for %{"event" => "request_closed", "host" => @reg, "path" => p, "status" => s} <- evs, do: {p, s}

    for p <- paths do
      assert p in allowed, "no request_allowed for #{p}: #{inspect(allowed)}"
      assert {p, 200} in closed, "no request_closed with 200 for #{p}: #{inspect(closed)}"
    end

    assert [%{"reason" => @reason, "status" => 403} | _] =
             for(%{"event" => "request_denied", "host" => "other.test"} = ev <- evs, do: ev)
  end

  test "npm installs a package; refused, it shows the 403 (not the reason)", ctx do
    npm = fn host -> ["npm", "install", "condukt-hello", "--registry", "https://#{host}/npm/", "--fetch-retries=0"] end
    dir = scratch(ctx)
    ok!(run(ctx, dir, npm.(@reg) ++ ["--no-audit", "--no-fund"]))
    assert File.read!(Path.join(dir, "node_modules/condukt-hello/index.js")) =~ "hello from condukt-hello 1.0.0"

    assert {out, status} = run(ctx, scratch(ctx), npm.("other.test"))
    assert status != 0
    # npm 10 and later say "npm error", Debian 12's npm 9 "npm ERR!".
    assert out =~ ~r"npm (error|ERR!) 403 403 Forbidden - GET https://other\.test/npm/condukt-hello"

    assert_events(["/npm/condukt-hello", "/npm/condukt-hello/-/condukt-hello-1.0.0.tgz"])
  end

  test "pip installs a wheel; refused, it only finds no distribution", ctx do
    pip = fn host ->
      ["python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--retries", "0"] ++
        ["--target", "t", "--index-url", Registries.pip_index(host), "condukt-hello"]
    end

    dir = scratch(ctx)
    # Debian marks its Python as externally managed; --target needs this.
    env = [{"PIP_BREAK_SYSTEM_PACKAGES", "1"}]
    out = ok!(run(ctx, dir, pip.(@reg), env))
    assert out =~ "Successfully installed condukt-hello-0.1.0"
    assert File.read!(Path.join(dir, "t/condukt_hello/__init__.py")) =~ "hello from condukt-hello"

    assert {out, status} = run(ctx, scratch(ctx), pip.("other.test"), env)
    assert status != 0
    assert out =~ "No matching distribution found for condukt-hello"

    assert_events(["/pypi/simple/condukt-hello/", "/pypi/files/condukt_hello-0.1.0-py3-none-any.whl"])
  end

  test "cargo fetches a crate from a sparse index; refused, it prints the 403 page", ctx do
    dir = Registries.cargo_project!(scratch(ctx), @reg)
    out = ok!(run(ctx, dir, ["cargo", "fetch"], [{"CARGO_HOME", Path.join(dir, "cargo-home")}]))
    assert out =~ "Downloaded condukt-hello v0.1.0"
    assert Path.wildcard(Path.join(dir, "cargo-home/registry/cache/*/condukt-hello-0.1.0.crate")) != []

    dir = Registries.cargo_project!(scratch(ctx), "other.test")
    assert {out, 101} = run(ctx, dir, ["cargo", "fetch"], [{"CARGO_HOME", Path.join(dir, "cargo-home")}])
    assert out =~ "got 403"
    assert out =~ @refused
    assert out =~ "reason: #{@reason}"

    assert_events([
      "/crates/index/config.json",
      "/crates/index/co/nd/condukt-hello",
      "/crates/dl/condukt-hello/0.1.0/download"
    ])
  end

  test "go downloads a module from a GOPROXY; refused, it prints the 403 page", ctx do
    go = fn dir, host ->
      {["go", "mod", "download", "-json", "registry.test/hello@v1.0.0"],
       [
         {"GOPROXY", Registries.goproxy(host)},
         # No checksum database in the test internet.
         {"GONOSUMDB", @reg},
         {"GOPATH", Path.join(dir, "gopath")},
         {"GOCACHE", Path.join(dir, "gocache")},
         {"GOFLAGS", "-modcacherw"}
       ]}
    end

    dir = scratch(ctx)
    {argv, env} = go.(dir, @reg)
    out = ok!(run(ctx, dir, argv, env))
    assert %{"Version" => "v1.0.0", "Sum" => "h1:" <> _} = Condukt.JSON.decode!(out)
    assert File.read!(Path.join(dir, "gopath/pkg/mod/registry.test/hello@v1.0.0/hello.go")) =~ "func Hello"

    dir = scratch(ctx)
    {argv, env} = go.(dir, "other.test")
    assert {out, 1} = run(ctx, dir, argv, env)
    assert out =~ "403 Forbidden"
    assert out =~ "reason: #{@reason}"

    assert_events(Enum.map(~w(info mod zip), &"/go/registry.test/hello/@v/v1.0.0.#{&1}"))
  end

  test "mvn resolves an artifact (metadata, pom, jar) with the session's trust store; refused, a 403", ctx do
    mvn = fn dir, host ->
      ["mvn", "-B", "-s", Registries.maven_project!(dir, host), "-Dmaven.repo.local=#{dir}/m2", "validate"]
    end

    dir = scratch(ctx)
    out = ok!(run(ctx, dir, mvn.(dir, @reg)))
    assert out =~ "BUILD SUCCESS"
    assert File.exists?(Path.join(dir, "m2/org/condukt/test/hello/1.0/hello-1.0.jar"))

    dir = scratch(ctx)
    assert {out, 1} = run(ctx, dir, mvn.(dir, "other.test"))
    assert out =~ "status: 403 Forbidden"

    base = "/maven/org/condukt/test/hello"
    assert_events(["#{base}/maven-metadata.xml", "#{base}/1.0/hello-1.0.pom", "#{base}/1.0/hello-1.0.jar"])
  end

  test "Java's HttpClient trusts the session through JAVA_TOOL_OPTIONS alone; refused, it reads the 403 page",
       ctx do
    dir = scratch(ctx)
    cp = Registries.java_fetch!(Testbed.scratch_dir(ctx.tb))
    url = "https://#{@reg}/maven/org/condukt/test/hello/maven-metadata.xml"

    out = ok!(run(ctx, dir, ["java", "-cp", cp, "Fetch", url]))
    assert out =~ "status 200"
    assert out =~ "<latest>1.0</latest>"

    assert {out, 1} = run(ctx, dir, ["java", "-cp", cp, "Fetch", "https://other.test/"])
    assert out =~ "status 403"
    assert out =~ "reason: #{@reason}"
    assert_events(["/maven/org/condukt/test/hello/maven-metadata.xml"])

    # Without the trust store the JDK's own cacerts cannot verify the
    # sidecar's certificate: the store is what makes it work.
    no_store = Enum.reject(ctx.env, &(elem(&1, 0) == "JAVA_TOOL_OPTIONS"))

    assert {out, 1} =
             Testbed.exec_in(ctx.tb, :pod, ["/usr/bin/env", "-C", dir, "java", "-cp", cp, "Fetch", url],
               uid: @uid,
               home: dir,
               env: no_store,
               timeout: 60_000
             )

    assert out =~ "PKIX path building failed"
  end
end
