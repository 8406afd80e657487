defmodule Condukt.Sandbox.Kubernetes.UnitTest do
  # What the Kubernetes backend decides without a cluster: names, option
  # validation, the manifests of docs/kubernetes.md, glob translation.
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.Kubernetes.{Glob, Heartbeat, Manifest, Names, Schema}
  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests

  describe "names" do
    test "any id gives a DNS-1123 label of at most 63 characters" do
      ids = [
        "job-42",
        "Job_42",
        "",
        "---",
        "日本語",
        String.duplicate("a", 253),
        String.duplicate("-a", 100),
        "UPPER.case/with spaces\n and\ttabs",
        "x" <> <<0>> <> "y",
        "a--b",
        String.duplicate("ab-", 20) <> "-"
      ]

      for id <- ids do
        name = Names.pod_name(id)
        assert byte_size(name) <= 63, "#{inspect(id)} -> #{name}"
        assert name =~ ~r/\A[a-z0-9]([-a-z0-9]*[a-z0-9])?\z/, "#{inspect(id)} -> #{name}"
        assert String.starts_with?(name, "condukt-")
        # and the derived object names stay valid names
        assert byte_size(Names.egress_secret(name)) <= 253
      end
    end

    test "the slug and hash rules" do
      assert Names.pod_name("Job 42") == "condukt-job-42-" <> Names.hash("Job 42")
      assert Names.pod_name("日本語") == "condukt-" <> Names.hash("日本語")
      assert Names.hash("job-42") =~ ~r/\A[0-9a-f]{10}\z/

      assert Names.hash("job-42") ==
               :crypto.hash(:sha256, "job-42") |> Base.encode16(case: :lower) |> binary_part(0, 10)

      long = Names.pod_name(String.duplicate("abc-", 30))
      [_, slug, _hash] = Regex.run(~r/\Acondukt-(.*)-([0-9a-f]{10})\z/, long)
      assert byte_size(slug) <= 40
      refute String.ends_with?(slug, "-")
    end

    test "distinct ids give distinct names, even when their slugs agree" do
      ids = ["job-42", "JOB-42", "job_42", "job 42", "job--42", "-job-42-"]
      names = Enum.map(ids, &Names.pod_name/1)
      assert length(Enum.uniq(names)) == length(ids)
      many = for i <- 1..2000, do: Names.pod_name("session-#{i}")
      assert length(Enum.uniq(many)) == 2000
    end

    test "label values are valid and ours win over the caller's" do
      labels =
        Names.pod_labels("job-42", %{
          "app.kubernetes.io/managed-by" => "me",
          "condukt.dev/sandbox" => "x",
          "tenant" => "acme"
        })

      assert labels["app.kubernetes.io/managed-by"] == "condukt"
      assert labels["condukt.dev/sandbox"] == Names.hash("job-42")
      assert labels["tenant"] == "acme"
      for {_k, v} <- labels, do: assert(v =~ ~r/\A[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\z/)
    end

    test "heartbeat timestamps are RFC 3339 UTC with second precision" do
      {:ok, t, 0} = DateTime.from_iso8601("2026-01-02T03:04:05.678Z")
      assert Names.timestamp(t) == "2026-01-02T03:04:05Z"
    end
  end

  describe "init options" do
    defp init_error(opts) do
      assert {:error, %Error{reason: :invalid_option, op: :new} = e} = Kubernetes.init(opts)
      Exception.message(e)
    end

    test "unknown options are refused with a hint" do
      assert init_error(namspace: "agents") =~ "unknown option :namspace (did you mean :namespace?)"
      assert init_error(heartbeat_intervall: 5) =~ ":heartbeat_interval"
    end

    test "bad values are refused naming the option and the value" do
      assert init_error(namespace: "Agents!") =~ ~s(:namespace to be a DNS-1123 label)
      assert init_error(namespace: "Agents!") =~ ~s("Agents!")
      assert init_error(cwd: "workspace") =~ ~s(:cwd to be an absolute path, got: "workspace")
      assert init_error(heartbeat_interval: 0) =~ ":heartbeat_interval to be a positive integer (milliseconds) or false"
      assert init_error(on_stale: :delete) =~ ":on_stale to be one of [:error, :recreate], got: :delete"
      assert init_error(id: "") =~ ":id"
      assert init_error(id: String.duplicate("a", 254)) =~ ":id"
      assert init_error(id: "a\0b") =~ "no NUL"
      assert init_error(env: %{"A=B" => "c"}) =~ ":env"
      assert init_error(labels: %{"tenant" => 1}) =~ ":labels"
      assert init_error(workspace_source: [git: "https://x", ref: "--upload-pack=evil"]) =~ ":workspace_source"
      assert init_error(workspace_source: [url: "https://x"]) =~ ":workspace_source"
      assert init_error(host_aliases: [%{ip: "not-an-ip", hostnames: ["a"]}]) =~ ":host_aliases"
      assert init_error(active_deadline_seconds: -1) =~ ":active_deadline_seconds"
      assert init_error(kubeconfig: []) =~ ":kubeconfig"
      assert init_error(delete_on_shutdown: "yes") =~ ":delete_on_shutdown"
    end

    test "a bad policy is refused before any connection" do
      assert {:error, %Error{reason: :invalid_network_policy}} =
               Kubernetes.init(network_policy: [rules: [allow: [42]]], kubeconfig: "/nonexistent")
    end

    test "defaults are the seed's" do
      {:ok, opts} = Condukt.Options.validate([], Schema.init())
      # Resolved at connection time ("namespace resolution" below).
      assert opts[:namespace] == nil
      assert opts[:image] == "debian:bookworm-slim"
      assert opts[:cwd] == "/workspace"
      assert opts[:active_deadline_seconds] == 8 * 3600
      assert opts[:heartbeat_interval] == 60_000
      assert opts[:workspace_source_timeout] == 300_000
      assert opts[:ready_timeout] == 120_000
      assert opts[:on_stale] == :error
      assert opts[:delete_on_shutdown] == nil
      assert opts[:network_policy_image] == Manifests.default_image()
      {:ok, _} = Condukt.Options.validate([heartbeat_interval: false], Schema.init())
    end

    test "the moduledoc renders every option" do
      {:docs_v1, _, _, _, %{"en" => doc}, _, _} = Code.fetch_docs(Kubernetes)

      for {key, _} <- Schema.init(), do: assert(doc =~ "`#{inspect(key)}`", "#{key} missing from the moduledoc")
    end

    test "terminate/2 and reap_stale/1 validate their options" do
      assert {:error, %Error{reason: :invalid_option} = e} = Kubernetes.terminate("x", namespce: "a")
      assert Exception.message(e) =~ ":namespace"
      assert {:error, %Error{reason: :invalid_option}} = Kubernetes.terminate("", [])
      assert {:error, %Error{reason: :invalid_option} = e} = Kubernetes.reap_stale(stale_after: 0)
      assert Exception.message(e) =~ ":stale_after"
      assert {:error, %Error{reason: :invalid_option}} = Kubernetes.reap_stale(now: "yesterday")
    end
  end

  describe "manifests" do
    @params %{
      pod: "condukt-job-42-0123456789",
      namespace: "agents",
      labels: %{"app.kubernetes.io/managed-by" => "condukt", "condukt.dev/sandbox" => "0123456789"},
      session_id: "job-42",
      image: "registry.example/condukt-egress:1",
      ca_cert_pem:
        :public_key.pem_encode([{:Certificate, :public_key.pkix_test_root_cert(~c"CA", [])[:cert], :not_encrypted}]),
      ca_key_pem: "KEY",
      token: String.duplicate("ab", 32),
      policy_json: ~s({"version":1}),
      upstream_ca: nil,
      allow_private: ["10.1.0.0/16"]
    }

    defp cfg(extra) do
      {:ok, opts} = Condukt.Options.validate(Keyword.take(extra, Keyword.keys(Schema.init())), Schema.init())

      opts
      |> Map.new()
      |> Map.merge(%{
        id: "job-42",
        pod: "condukt-job-42-0123456789",
        namespace: "agents",
        delete_on_shutdown: false,
        now: ~U[2026-01-02 03:04:05Z]
      })
      |> Map.merge(Map.new(Keyword.drop(extra, Keyword.keys(Schema.init()))))
    end

    test "capabilities and run_as_user reach the workspace's securityContext" do
      c = hd(Manifest.pod(cfg(capabilities: ["SYS_PTRACE", "cap_chown"], run_as_user: 1000))["spec"]["containers"])

      assert c["securityContext"]["capabilities"]["add"] ==
               ~w(CHOWN DAC_OVERRIDE FOWNER FSETID KILL NET_BIND_SERVICE SYS_PTRACE)

      assert c["securityContext"]["runAsUser"] == 1000
    end

    test "with a policy, capabilities that forge the exemption and the sidecar's uid are refused" do
      for cap <- ~w(NET_RAW net_admin CAP_SETUID SETGID SYS_ADMIN BPF SYS_MODULE ALL) do
        assert {:error, {:invalid, :capabilities, [^cap], expected}} =
                 Manifest.check_workspace([capabilities: [cap]], true)

        assert expected =~ "with a network policy the workspace may not have"
      end

      assert {:error, {:invalid, :run_as_user, 1337, _}} = Manifest.check_workspace([run_as_user: 1337], true)
      assert :ok = Manifest.check_workspace([capabilities: ["SYS_PTRACE"], run_as_user: 1000], true)
      # Without a policy there is no exemption to forge.
      assert :ok = Manifest.check_workspace([capabilities: ["NET_RAW"], run_as_user: 1337], false)

      # Through init: refused before any connection is attempted, naming the option.
      assert {:error, %Condukt.Sandbox.Error{reason: :invalid_option} = e} =
               Condukt.Sandbox.Kubernetes.init(
                 network_policy: [rules: [allow: ["a.test"]]],
                 capabilities: ["NET_RAW"],
                 conn: [server: "https://127.0.0.1:1"]
               )

      assert Exception.message(e) =~ ":capabilities"
      assert Exception.message(e) =~ "NET_RAW"

      assert {:error, %Condukt.Sandbox.Error{reason: :invalid_option, detail: {:invalid, :capabilities, _, _}}} =
               Condukt.Sandbox.Kubernetes.init(capabilities: ["NOT A CAP"])
    end

    test "the plain pod: keepalive workspace, emptyDir at cwd, no token, no secret" do
      pod = Manifest.pod(cfg(env: %{"A" => "1"}, labels: %{"tenant" => "acme"}, annotations: %{"x" => "y"}))
      spec = pod["spec"]
      assert spec["restartPolicy"] == "Always"
      assert spec["activeDeadlineSeconds"] == 28_800
      assert spec["automountServiceAccountToken"] == false
      refute Map.has_key?(spec, "initContainers")
      refute Map.has_key?(spec, "serviceAccountName")
      refute Map.has_key?(spec, "hostAliases")
      assert spec["volumes"] == [%{"name" => "workspace", "emptyDir" => %{}}]
      [c] = spec["containers"]
      assert c["name"] == "workspace"
      assert c["image"] == "debian:bookworm-slim"
      assert c["workingDir"] == "/workspace"
      assert c["env"] == [%{"name" => "A", "value" => "1"}]
      assert c["volumeMounts"] == [%{"name" => "workspace", "mountPath" => "/workspace"}]
      # Least privilege for the workspace too: the caps a root workspace
      # needs to edit its files, nothing to regain more.
      assert c["securityContext"] == %{
               "allowPrivilegeEscalation" => false,
               "capabilities" => %{
                 "drop" => ["ALL"],
                 "add" => ~w(CHOWN DAC_OVERRIDE FOWNER FSETID KILL NET_BIND_SERVICE)
               },
               "seccompProfile" => %{"type" => "RuntimeDefault"}
             }

      assert pod["metadata"]["labels"]["tenant"] == "acme"
      assert pod["metadata"]["annotations"]["condukt.dev/id"] == "job-42"
      assert pod["metadata"]["annotations"]["condukt.tuist.dev/heartbeat-at"] == "2026-01-02T03:04:05Z"
      refute Map.has_key?(pod["metadata"]["annotations"], "condukt.dev/heartbeat")
      assert pod["metadata"]["annotations"]["condukt.dev/delete-on-shutdown"] == "false"
      assert pod["metadata"]["annotations"]["x"] == "y"
      # JSON-ready
      assert is_binary(Condukt.JSON.encode!(pod))
    end

    test "with a policy: least-privilege init containers, six CA variables, subPath trust, no secret on the workspace" do
      pod =
        Manifest.pod(
          cfg(
            env: %{"SSL_CERT_FILE" => "/mine", "B" => "2", "JAVA_TOOL_OPTIONS" => "-Xmx1g"},
            host_aliases: [%{ip: "10.0.0.5", hostnames: ["git.internal"]}],
            service_account: "runner",
            policy_params: @params
          )
        )

      spec = pod["spec"]
      assert spec["securityContext"] == %{"fsGroup" => 1337}
      assert spec["serviceAccountName"] == "runner"
      assert spec["hostAliases"] == [%{"ip" => "10.0.0.5", "hostnames" => ["git.internal"]}]
      [netfilter, trust, sidecar] = spec["initContainers"]

      assert netfilter["name"] == "condukt-netfilter"
      assert netfilter["image"] == @params.image
      assert netfilter["securityContext"]["capabilities"] == %{"drop" => ["ALL"], "add" => ["NET_ADMIN", "NET_RAW"]}
      assert netfilter["securityContext"]["allowPrivilegeEscalation"] == false
      assert netfilter["securityContext"]["readOnlyRootFilesystem"] == true
      refute Map.has_key?(netfilter, "volumeMounts")

      assert sidecar["name"] == "condukt-egress"
      assert sidecar["restartPolicy"] == "Always"
      sc = sidecar["securityContext"]
      # Started as uid 0 with NET_ADMIN, SETUID and SETGID; the proxy then
      # becomes 1337 with NET_ADMIN alone (--user).
      assert sc["runAsUser"] == 0 and sc["runAsGroup"] == 1337 and sc["runAsNonRoot"] == false
      assert sc["capabilities"] == %{"drop" => ["ALL"], "add" => ["NET_ADMIN", "SETUID", "SETGID"]}
      assert Enum.chunk_every(sidecar["command"], 2, 1) |> Enum.member?(["--user", "1337"])
      assert Enum.chunk_every(sidecar["command"], 2, 1) |> Enum.member?(["--mark", "0x539"])

      nf_cmd = Enum.chunk_every(netfilter["command"], 2, 1)
      assert ["--sidecar-uid", "1337"] in nf_cmd and ["--mark", "0x539"] in nf_cmd
      assert ["--dns-port", "15053"] in nf_cmd
      refute "--dns" in netfilter["command"]
      assert sc["allowPrivilegeEscalation"] == false and sc["readOnlyRootFilesystem"] == true

      assert sidecar["volumeMounts"] == [
               %{"name" => "condukt-egress", "mountPath" => "/etc/condukt-egress", "readOnly" => true},
               %{"name" => "condukt-egress-state", "mountPath" => "/run/condukt-egress"}
             ]

      cmd = sidecar["command"]
      assert ["/usr/local/bin/condukt-egress", "proxy" | _] = cmd
      assert Enum.chunk_every(cmd, 2, 1) |> Enum.member?(["--session-id", "job-42"])
      assert Enum.chunk_every(cmd, 2, 1) |> Enum.member?(["--control", "127.0.0.1:15002"])
      assert Enum.chunk_every(cmd, 2, 1) |> Enum.member?(["--allow-private", "10.1.0.0/16"])
      assert Enum.chunk_every(cmd, 2, 1) |> Enum.member?(["--hosts", "/etc/condukt-egress/hosts"])
      assert Enum.chunk_every(cmd, 2, 1) |> Enum.member?(["--dns-state", "/run/condukt-egress/resolvers"])
      refute "--upstream-extra-ca" in cmd

      # The kubelet starts the workspace only once the proxy accepts on
      # the addresses it listens on (exec: it listens on loopback only).
      assert %{"exec" => %{"command" => ["/usr/local/bin/condukt-egress", "ready" | probe_args]}} =
               sidecar["startupProbe"]

      assert sidecar["startupProbe"]["periodSeconds"] == 1
      assert sidecar["startupProbe"]["timeoutSeconds"] == 1
      assert sidecar["startupProbe"]["failureThreshold"] == 30
      proxy_listen = cmd |> Enum.chunk_every(2, 1, :discard) |> Enum.filter(&match?(["--listen", _], &1))
      assert proxy_listen == [["--listen", "127.0.0.1:15001"], ["--listen", "[::1]:15001"]]
      assert Enum.chunk_every(probe_args, 2) == proxy_listen

      [c] = spec["containers"]
      assert c["securityContext"]["allowPrivilegeEscalation"] == false
      refute Enum.any?(c["securityContext"]["capabilities"]["add"], &(&1 in ~w(NET_RAW NET_ADMIN SETUID SETGID)))
      ca_vars = ~w(NODE_EXTRA_CA_CERTS REQUESTS_CA_BUNDLE SSL_CERT_FILE PIP_CERT CURL_CA_BUNDLE GIT_SSL_CAINFO)

      for v <- ca_vars,
          do: assert(%{"name" => v, "value" => "/etc/condukt/ca.pem"} in c["env"], "#{v} missing")

      # the JVM trusts the PKCS#12 store (the caller's options kept, first);
      # other stacks get the session CA
      assert [java] = Enum.filter(c["env"], &(&1["name"] == "JAVA_TOOL_OPTIONS"))

      assert java["value"] ==
               "-Xmx1g -Djavax.net.ssl.trustStore=/etc/condukt/trust-store.p12 -Djavax.net.ssl.trustStoreType=PKCS12"

      for v <- ~w(DENO_CERT CARGO_HTTP_CAINFO AWS_CA_BUNDLE),
          do: assert(%{"name" => v, "value" => "/etc/condukt/ca.pem"} in c["env"], "#{v} missing")

      # the caller's SSL_CERT_FILE does not shadow the session CA
      assert Enum.count(c["env"], &(&1["name"] == "SSL_CERT_FILE")) == 1
      assert %{"name" => "B", "value" => "2"} in c["env"]

      mounts = c["volumeMounts"]
      assert %{"name" => "workspace", "mountPath" => "/workspace"} in mounts
      refute Enum.any?(mounts, &(&1["name"] == "condukt-egress")), "the workspace must not see the sidecar's Secret"
      refute Enum.any?(mounts, &(&1["name"] == "condukt-egress-state")), "nor its state"

      for path <- ["/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/cert.pem"] do
        assert %{
                 "name" => "condukt-trust",
                 "mountPath" => ^path,
                 "subPath" => "ca-certificates.crt",
                 "readOnly" => true
               } = Enum.find(mounts, &(&1["mountPath"] == path))
      end

      # /etc/condukt (the PEM files and the JVM's store) is the emptyDir the
      # init container fills; no file of the session's Secret is mounted.
      assert %{"name" => "condukt-trust", "mountPath" => "/etc/condukt", "readOnly" => true} in mounts
      refute Enum.any?(mounts, &(&1["name"] == "condukt-session-ca")), "the store comes from the emptyDir"
      refute Enum.any?(mounts, &(&1["subPath"] == "trust-store.p12"))

      vols = Map.new(spec["volumes"], &{&1["name"], &1})
      assert vols["condukt-egress-state"]["emptyDir"] == %{"medium" => "Memory", "sizeLimit" => "1Mi"}

      assert vols["condukt-egress"]["secret"] == %{
               "secretName" => "condukt-job-42-0123456789-egress",
               "defaultMode" => 0o440
             }

      # The bundle is written in the pod, not stored: the trust Secret
      # holds the session certificate alone, the workspace mounts the
      # emptyDir the condukt-trust init container fills.
      assert vols["condukt-session-ca"]["secret"] == %{
               "secretName" => "condukt-job-42-0123456789-trust",
               "defaultMode" => 0o444
             }

      assert vols["condukt-trust"] == %{"name" => "condukt-trust", "emptyDir" => %{"sizeLimit" => "2Mi"}}
      assert trust["name"] == "condukt-trust"
      assert trust["image"] == @params.image

      assert trust["command"] ==
               ~w(/usr/local/bin/condukt-egress ca bundle --ca-cert /etc/condukt-session-ca/ca.pem --out-dir /etc/condukt)

      tsc = trust["securityContext"]
      assert tsc["runAsUser"] == 1337 and tsc["runAsNonRoot"] == true
      assert tsc["capabilities"] == %{"drop" => ["ALL"]} and tsc["readOnlyRootFilesystem"] == true
      assert tsc["allowPrivilegeEscalation"] == false

      assert trust["volumeMounts"] == [
               %{"name" => "condukt-session-ca", "mountPath" => "/etc/condukt-session-ca", "readOnly" => true},
               %{"name" => "condukt-trust", "mountPath" => "/etc/condukt"}
             ]

      refute Enum.any?(trust["volumeMounts"], &(&1["name"] == "condukt-egress")), "the trust step never sees the key"
      assert Enum.all?(Enum.filter(mounts, &(&1["name"] == "condukt-trust")), &(&1["readOnly"] == true))

      assert is_binary(Condukt.JSON.encode!(pod))
    end

    test "the Secrets and the NetworkPolicy" do
      egress = Manifests.egress_secret(%{@params | upstream_ca: "UP"})
      assert egress["metadata"]["name"] == "condukt-job-42-0123456789-egress"
      assert egress["metadata"]["labels"] == @params.labels
      data = Map.new(egress["data"], fn {k, v} -> {k, Base.decode64!(v)} end)

      assert data == %{
               "ca.pem" => @params.ca_cert_pem,
               "ca.key" => "KEY",
               "token" => @params.token,
               "policy.json" => @params.policy_json,
               "upstream-ca.pem" => "UP",
               "hosts" => "127.0.0.1 localhost\n::1 localhost\n"
             }

      aliases = [%{ip: "10.0.0.5", hostnames: ["git.internal", "g"]}]
      with_aliases = Manifests.egress_secret(Map.put(@params, :host_aliases, aliases))

      assert Base.decode64!(with_aliases["data"]["hosts"]) ==
               "127.0.0.1 localhost\n::1 localhost\n10.0.0.5 git.internal g\n"

      trust = Manifests.trust_secret(@params)
      tdata = Map.new(trust["data"], fn {k, v} -> {k, Base.decode64!(v)} end)
      # The session certificate only: the PEM bundle and the JVM's trust
      # store are written in the pod from the sidecar image's roots.
      assert Map.keys(tdata) == ["ca.pem"]
      assert tdata["ca.pem"] == @params.ca_cert_pem
      refute Map.has_key?(tdata, "ca.key")

      np = Manifests.network_policy(@params)
      assert np["spec"]["podSelector"] == %{"matchLabels" => %{"condukt.dev/sandbox" => "0123456789"}}
      assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
      assert np["spec"]["ingress"] == []
      [%{"ports" => ports}] = np["spec"]["egress"]

      assert Enum.sort_by(ports, &{&1["port"], &1["protocol"]}) == [
               %{"protocol" => "TCP", "port" => 53},
               %{"protocol" => "UDP", "port" => 53},
               %{"protocol" => "TCP", "port" => 80},
               %{"protocol" => "TCP", "port" => 443}
             ]

      assert Manifests.owner_patch("p", "uid-1") == %{
               "metadata" => %{
                 "ownerReferences" => [
                   %{
                     "apiVersion" => "v1",
                     "kind" => "Pod",
                     "name" => "p",
                     "uid" => "uid-1",
                     "controller" => false,
                     "blockOwnerDeletion" => false
                   }
                 ]
               }
             }
    end

    test "default_image/0 is the library version's tag" do
      assert Manifests.default_image() == "ghcr.io/tuist/condukt-egress:#{Application.spec(:condukt, :vsn)}"
    end
  end

  describe "glob translation (Path.wildcard semantics)" do
    defp matches?(pattern, path, dot) do
      {:ok, {_lit, re, _depth}} = Glob.compile(pattern, dot)
      Regex.match?(re, path)
    end

    test "agrees with Path.wildcard on a real tree" do
      dir = Path.join(System.tmp_dir!(), "glob-#{System.unique_integer([:positive])}")
      on_exit(fn -> File.rm_rf(dir) end)

      files = ~w(a.ex b.exs lib/x.ex lib/y/z.ex lib/.hidden.ex .dot/q.ex README.md lib/y/w.md [x].txt)

      for f <- files do
        File.mkdir_p!(Path.dirname(Path.join(dir, f)))
        File.write!(Path.join(dir, f), "")
      end

      all = for f <- Path.wildcard(Path.join(dir, "**"), match_dot: true), do: Path.relative_to(f, dir)

      patterns = ~w(*.ex **/*.ex lib/**/*.ex lib/* {lib,.dot}/*.ex lib/?/*.ex *.{ex,exs} [a-b].* lib/y/** ** README.md)

      for pattern <- patterns, dot <- [false, true] do
        expected =
          Path.wildcard(Path.join(dir, pattern), match_dot: dot) |> Enum.map(&Path.relative_to(&1, dir)) |> Enum.sort()

        got = Enum.filter(all, &matches?(pattern, &1, dot)) |> Enum.sort()
        assert got == expected, "pattern #{pattern} match_dot #{dot}"
      end
    end

    test "literal prefix and depth" do
      assert {:ok, {"lib/y", _, 1}} = Glob.compile("lib/y/*.ex", false)
      assert {:ok, {"lib", _, nil}} = Glob.compile("lib/**/*.ex", false)
      assert {:ok, {"", _, 1}} = Glob.compile("mix.exs", false)
      assert {:error, _} = Glob.compile("{a", false)
      assert {:error, _} = Glob.compile("[a", false)
    end
  end

  describe "heartbeat worker" do
    # The owner starts the worker (as init/1 does), reports it, waits
    # for :go, then ends with `how`.
    defp owner_with_worker(how) do
      test = self()

      owner =
        spawn(fn ->
          beat = fn ->
            send(test, {:beat, self()})
            {:error, :unreachable}
          end

          send(test, {:worker, Heartbeat.start(self(), beat, 20, "condukt-p")})

          receive do
            :go -> :ok
          end

          case how do
            :return -> :ok
            {:exit, reason} -> exit(reason)
          end
        end)

      assert_receive {:worker, worker}, 1_000
      assert_receive {:beat, ^worker}, 1_000
      {owner, worker}
    end

    @tag :capture_log
    test "stops with its owner, whatever the owner's exit reason" do
      for how <- [:return, {:exit, :normal}, {:exit, :shutdown}, {:exit, {:shutdown, :done}}, {:exit, :boom}, :kill] do
        {owner, worker} = owner_with_worker(how)
        ref = Process.monitor(worker)
        if how == :kill, do: Process.exit(owner, :kill), else: send(owner, :go)

        assert_receive {:DOWN, ^ref, :process, ^worker, _},
                       1_000,
                       "the worker outlived an owner that ended by #{inspect(how)}"

        # No beat (and no failure logged) after it is gone.
        flush_beats(worker)
        Process.sleep(60)
        refute_received {:beat, ^worker}
      end
    end

    test "an owner that returns right after starting it: the worker stops at once, before any beat" do
      test = self()

      owner =
        spawn(fn ->
          worker = Heartbeat.start(self(), fn -> send(test, :beat) && :ok end, 10_000, "condukt-p")

          send(test, {:worker, worker})
        end)

      assert_receive {:worker, worker}, 1_000
      ref = Process.monitor(worker)
      assert_receive {:DOWN, ^ref, :process, ^worker, _}, 1_000
      refute Process.alive?(owner)
      refute_received :beat
    end

    test "stop/1 ends it and leaves the owner alone" do
      worker = Heartbeat.start(self(), fn -> :ok end, 10, "condukt-p")
      assert :ok = Heartbeat.stop(worker)
      refute Process.alive?(worker)
      assert :ok = Heartbeat.stop(nil)
    end

    defp flush_beats(worker) do
      receive do
        {:beat, ^worker} -> flush_beats(worker)
      after
        0 -> :ok
      end
    end
  end

  describe "namespace resolution" do
    # A kubeconfig whose server refuses connections: every operation
    # fails at its first request, and the error names the namespace it
    # was made in.
    defp kubeconfig(context_namespace) do
      dir = Path.join(System.tmp_dir!(), "condukt-ns-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      on_exit(fn -> File.rm_rf(dir) end)
      ns = if context_namespace, do: ", namespace: #{context_namespace}", else: ""
      path = Path.join(dir, "config")

      File.write!(path, """
      apiVersion: v1
      kind: Config
      clusters:
      - name: c
        cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
      users:
      - name: u
        user: {token: abc}
      contexts:
      - name: x
        context: {cluster: c, user: u#{ns}}
      current-context: x
      """)

      path
    end

    defp namespace_tried({:error, %Error{reason: :backend, detail: %Condukt.Kube.Error{namespace: ns}}}), do: ns

    test "the kubeconfig context's namespace, unless :namespace is given; \"default\" when it has none" do
      agents = kubeconfig("agents")

      assert namespace_tried(Kubernetes.reap_stale(kubeconfig: agents)) == "agents"
      assert namespace_tried(Kubernetes.terminate("job-1", kubeconfig: agents)) == "agents"
      assert namespace_tried(Kubernetes.init(kubeconfig: agents, id: "job-1")) == "agents"

      assert namespace_tried(Kubernetes.reap_stale(kubeconfig: agents, namespace: "other")) == "other"
      assert namespace_tried(Kubernetes.terminate("job-1", kubeconfig: agents, namespace: "other")) == "other"
      assert namespace_tried(Kubernetes.init(kubeconfig: agents, id: "job-1", namespace: "other")) == "other"

      plain = kubeconfig(nil)
      assert namespace_tried(Kubernetes.reap_stale(kubeconfig: plain)) == "default"
      assert namespace_tried(Kubernetes.init(kubeconfig: plain, id: "job-1")) == "default"
    end

    test "a context namespace that is not a DNS-1123 label is refused, naming the context" do
      path = kubeconfig("Not_A_Label")

      assert {:error, %Error{reason: :backend, detail: %Condukt.Kube.Error{reason: :config}} = e} =
               Kubernetes.init(kubeconfig: path, id: "job-1")

      assert Exception.message(e) =~ ~s(the namespace "Not_A_Label" of the kubeconfig context "x")
      assert Exception.message(e) =~ "pass :namespace"
      # An explicit one is used instead.
      assert namespace_tried(Kubernetes.terminate("job-1", kubeconfig: path, namespace: "agents")) == "agents"
    end
  end
end
