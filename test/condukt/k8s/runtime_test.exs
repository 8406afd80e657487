defmodule Condukt.K8s.RuntimeTest do
  # The tier's pod runtime (docs/k8s-tier.md, "The pod runtime"): a pod
  # made exactly as docs/kubernetes.md says (two Secrets, netfilter init
  # container, native sidecar, workspace) runs for real: the sidecar
  # listens before the pod is Running, exec and port-forward (over the
  # API server's WebSocket, as the ServiceAccount) reach into it, the
  # workspace's curl goes through the iptables rules and the sidecar to
  # the testbed's nginx, and deleting the pod cleans up.
  use Condukt.Test.K8s.Case, async: false, pods: true

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests
  alias Condukt.Test.K8s.Case, as: K8sCase
  alias Condukt.Dev.Netns.{Cmd, Testbed}

  @client Path.expand("../../support/k8s/ws_client.py", __DIR__)
  @policy [rules: [deny: ["denied.test"], allow: ["allowed.test"]], default: :deny]

  setup_all do
    tier = K8sCase.start_pod_tier!()
    # The session CA, made as the backend makes it (`ca new`).
    dir = Path.join(tier.cluster.dir, "session")
    File.mkdir_p!(dir)

    Cmd.run!([
      Condukt.egress_binary(),
      "ca",
      "new",
      "--cert",
      Path.join(dir, "ca.pem"),
      "--key",
      Path.join(dir, "ca.key")
    ])

    mozilla = File.read!(Path.join(:code.priv_dir(:condukt), "ca-certificates/mozilla.pem"))

    session = %{
      ca_pem: File.read!(Path.join(dir, "ca.pem")),
      ca_key: File.read!(Path.join(dir, "ca.key")),
      token: :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower),
      bundle: mozilla <> File.read!(Path.join(dir, "ca.pem"))
    }

    %{tier: tier, session: session}
  end

  setup %{tier: tier, session: session} = ctx do
    if ctx[:no_pod] do
      :ok
    else
      name = "condukt-rt-#{System.unique_integer([:positive])}"
      create_pod!(tier, session, name)
      wait_running!(tier, name)
      on_exit(fn -> delete_pod(tier, name) end)
      %{pod: name}
    end
  end

  # --- the objects of docs/kubernetes.md -------------------------------------

  defp create_pod!(tier, session, name, opts \\ []) do
    c = tier.cluster
    ns = c.namespace

    egress = %{
      "ca.pem" => session.ca_pem,
      "ca.key" => session.ca_key,
      "token" => session.token,
      "policy.json" => NetworkPolicy.to_sidecar_json(NetworkPolicy.new!(@policy)),
      "upstream-ca.pem" => tier.upstream_ca_pem,
      "hosts" => Manifests.hosts_file(tier.host_aliases)
    }

    trust = %{"ca.pem" => session.ca_pem, "ca-certificates.crt" => session.bundle}

    for {sname, data} <- [{"#{name}-egress", egress}, {"#{name}-trust", trust}] do
      {201, _} =
        Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{ns}/secrets", %{
          apiVersion: "v1",
          kind: "Secret",
          type: "Opaque",
          metadata: %{name: sname},
          data: Map.new(data, fn {k, v} -> {k, Base.encode64(v)} end)
        })
    end

    {201, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{ns}/pods", pod_manifest(tier, name, opts))
    name
  end

  defp pod_manifest(tier, name, opts) do
    image = tier.egress_image
    cwd = "/workspace"

    netfilter =
      Keyword.get(opts, :netfilter_command, [
        "/usr/local/bin/condukt-egress",
        "netfilter-setup",
        "--proxy-port",
        "15001",
        "--mark",
        "0x539"
      ])

    proxy =
      [
        "/usr/local/bin/condukt-egress",
        "proxy",
        "--policy",
        "/etc/condukt-egress/policy.json",
        "--ca-cert",
        "/etc/condukt-egress/ca.pem",
        "--ca-key",
        "/etc/condukt-egress/ca.key",
        "--token-file",
        "/etc/condukt-egress/token",
        "--session-id",
        name,
        "--control",
        "127.0.0.1:15002",
        "--hosts",
        "/etc/condukt-egress/hosts",
        "--listen",
        "127.0.0.1:15001",
        "--listen",
        "[::1]:15001",
        "--upstream-extra-ca",
        "/etc/condukt-egress/upstream-ca.pem",
        "--user",
        "1337"
      ] ++ Enum.flat_map(tier.allow_private, &["--allow-private", &1])

    %{
      apiVersion: "v1",
      kind: "Pod",
      metadata: %{
        name: name,
        labels: %{"app.kubernetes.io/managed-by" => "condukt"},
        annotations: %{"condukt.dev/id" => name}
      },
      spec: %{
        restartPolicy: "Always",
        activeDeadlineSeconds: 28_800,
        serviceAccountName: "condukt",
        automountServiceAccountToken: false,
        hostAliases: tier.host_aliases,
        securityContext: %{fsGroup: 1337},
        volumes: [
          %{name: "workspace", emptyDir: %{}},
          %{name: "condukt-egress", secret: %{secretName: "#{name}-egress", defaultMode: 0o440}},
          %{name: "condukt-trust", secret: %{secretName: "#{name}-trust", defaultMode: 0o444}}
        ],
        initContainers: [
          %{
            name: "condukt-netfilter",
            image: image,
            command: netfilter,
            securityContext: %{
              runAsUser: 0,
              runAsNonRoot: false,
              allowPrivilegeEscalation: false,
              readOnlyRootFilesystem: true,
              capabilities: %{drop: ["ALL"], add: ["NET_ADMIN", "NET_RAW"]}
            }
          },
          %{
            name: "condukt-egress",
            image: image,
            restartPolicy: "Always",
            command: proxy,
            startupProbe:
              Keyword.get(opts, :startup_probe, %{
                exec: %{
                  command: [
                    "/usr/local/bin/condukt-egress",
                    "ready",
                    "--listen",
                    "127.0.0.1:15001",
                    "--listen",
                    "[::1]:15001"
                  ]
                },
                periodSeconds: 1,
                timeoutSeconds: 1,
                failureThreshold: 30
              }),
            securityContext: %{
              runAsUser: 0,
              runAsGroup: 1337,
              runAsNonRoot: false,
              allowPrivilegeEscalation: false,
              readOnlyRootFilesystem: true,
              capabilities: %{drop: ["ALL"], add: ["NET_ADMIN", "SETUID", "SETGID"]}
            },
            volumeMounts: [%{name: "condukt-egress", mountPath: "/etc/condukt-egress", readOnly: true}]
          }
        ],
        containers: [
          %{
            name: "workspace",
            image: "debian:bookworm-slim",
            command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"],
            workingDir: cwd,
            env: Enum.map(NetworkPolicy.ca_env("/etc/condukt/ca.pem"), fn {k, v} -> %{name: k, value: v} end),
            volumeMounts: [
              %{name: "workspace", mountPath: cwd},
              %{name: "condukt-trust", mountPath: "/etc/condukt", readOnly: true},
              %{
                name: "condukt-trust",
                mountPath: "/etc/ssl/certs/ca-certificates.crt",
                subPath: "ca-certificates.crt",
                readOnly: true
              },
              %{name: "condukt-trust", mountPath: "/etc/ssl/cert.pem", subPath: "ca-certificates.crt", readOnly: true}
            ]
          }
        ]
      }
    }
  end

  defp pod_path(tier, name), do: "/api/v1/namespaces/#{tier.namespace}/pods/#{name}"

  defp wait_running!(tier, name) do
    result =
      Cluster.wait_until(
        fn ->
          match?(
            {200, %{"status" => %{"phase" => "Running"}}},
            Cluster.request(tier.cluster, :sa, "GET", pod_path(tier, name))
          )
        end,
        60_000
      )

    assert result == :ok,
           "pod #{name} not Running: #{inspect(Cluster.request(tier.cluster, :admin, "GET", pod_path(tier, name)))}"
  end

  defp delete_pod(tier, name) do
    c = tier.cluster
    Cluster.request(c, :sa, "DELETE", pod_path(tier, name))

    for s <- ["#{name}-egress", "#{name}-trust"],
        do: Cluster.request(c, :sa, "DELETE", "/api/v1/namespaces/#{tier.namespace}/secrets/#{s}")

    Cluster.wait_until(fn -> match?({404, _}, Cluster.request(c, :admin, "GET", pod_path(tier, name))) end, 30_000)
    Cluster.wait_until(fn -> is_nil(Runtime.pod(tier.runtime, tier.namespace, name)) end, 30_000)
  end

  # --- clients ---------------------------------------------------------------

  defp exec(tier, pod, argv) do
    {out, status} =
      Cmd.run(
        ["/usr/bin/python3", @client, "exec", tier.server, tier.ca, tier.token, tier.namespace, pod, "workspace", "--"] ++
          argv,
        timeout: 40_000,
        stderr: :stdout
      )

    assert status == 0, out
    res = :jiffy.decode(out |> String.split("\n", trim: true) |> List.last(), [:return_maps])
    Map.put(res, "ok", match?(%{"status" => "Success"}, res["status"]))
  end

  defp sh(tier, pod, script), do: exec(tier, pod, ["/bin/sh", "-c", script])

  # --- tests -----------------------------------------------------------------

  test "Running means the sidecar's startupProbe succeeded; the status shows it as a running native sidecar", %{
    tier: tier,
    pod: pod
  } do
    {out, 0} = Cmd.run(["/usr/bin/nsenter", "--net=/run/netns/#{tier.node.netns}", "--", "/usr/bin/ss", "-Hltn"])

    for addr <- ["127.0.0.1:15001", "[::1]:15001", "127.0.0.1:15002"], do: assert(out =~ addr)

    # The runtime ran the probe's exec in the sidecar, as a kubelet, before
    # it started the workspace; the proxy took the probe's connection
    # quietly (no "not redirected" warning in its log).
    info = Runtime.pod(tier.runtime, tier.namespace, pod)

    assert %{probe: :exec, attempts: attempts, output: "condukt-egress: ready (2 listener(s))\n"} =
             info.startup["condukt-egress"]

    assert attempts >= 1
    refute File.read!(info.logs["condukt-egress"]) =~ "not redirected"

    {200, %{"status" => st}} = Cluster.request(tier.cluster, :sa, "GET", pod_path(tier, pod))
    statuses = Map.new(st["initContainerStatuses"], &{&1["name"], &1})
    assert %{"running" => _} = statuses["condukt-egress"]["state"]
    assert %{"terminated" => %{"exitCode" => 0}} = statuses["condukt-netfilter"]["state"]

    # The sidecar starts as root with NET_ADMIN, SETUID and SETGID and
    # becomes 1337 with CAP_NET_ADMIN alone, no_new_privs
    # (docs/kubernetes.md: the one combination runc makes work).
    status = File.read!("/proc/#{info.pids["condukt-egress"]}/status")
    assert status =~ ~r/^Uid:\s+1337\s+1337\s+1337\s+1337$/m
    assert status =~ ~r/^Gid:\s+1337\s+1337\s+1337\s+1337$/m
    assert status =~ ~r/^CapPrm:\s+0000000000001000$/m
    assert status =~ ~r/^CapEff:\s+0000000000001000$/m
    assert status =~ ~r/^NoNewPrivs:\s+1$/m

    # Its log (stdout and stderr) is the pod's log for that container:
    # kwok serves the file.
    log =
      Cluster.wait_until(
        fn ->
          # As the administrator: the contract's Role has no pods/log.
          case Cluster.request(tier.cluster, :admin, "GET", pod_path(tier, pod) <> "/log?container=condukt-egress") do
            {200, text} when is_binary(text) -> text =~ "proxy ready"
            _ -> false
          end
        end,
        10_000
      )

    assert log == :ok,
           inspect(Cluster.request(tier.cluster, :admin, "GET", pod_path(tier, pod) <> "/log?container=condukt-egress"))
  end

  # The control channel's first exchange (docs/control-channel.md): the
  # sidecar answers a hello for its session with a challenge carrying its
  # own nonce; no token crosses the tunnel.
  test "port-forward to 15002 reaches the sidecar's control port (hello → challenge)", %{tier: tier, pod: pod} do
    nonce = :crypto.strong_rand_bytes(32) |> Base.encode16(case: :lower)
    hello = ~s({"type":"hello","version":2,"session_id":"#{pod}","nonce":"#{nonce}"}\n)

    {out, status} =
      Cmd.run(
        [
          "/usr/bin/python3",
          @client,
          "portforward",
          tier.server,
          tier.ca,
          tier.token,
          tier.namespace,
          pod,
          "15002",
          hello
        ],
        timeout: 30_000,
        stderr: :stdout
      )

    assert status == 0, out
    res = :jiffy.decode(out |> String.split("\n", trim: true) |> List.last(), [:return_maps])
    assert res["data"] =~ ~s("type":"challenge"), out
    assert res["data"] =~ ~r/"nonce":"[0-9a-f]{64}"/, out
  end

  test "exec sees the workspace's view: its mounts, its env, none of the sidecar's files", %{
    tier: tier,
    pod: pod,
    session: session
  } do
    res = sh(tier, pod, "pwd; echo $CURL_CA_BUNDLE $SSL_CERT_FILE; id -u")
    assert res["ok"], inspect(res)
    assert res["stdout"] == "/workspace\n/etc/condukt/ca.pem /etc/condukt/ca.pem\n0\n"

    res = exec(tier, pod, ["/bin/cat", "/etc/condukt/ca.pem"])
    assert res["stdout"] == session.ca_pem

    for path <- ["/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/cert.pem"] do
      assert exec(tier, pod, ["/bin/cat", path])["stdout"] == session.bundle
    end

    # The workspace's writes land in the emptyDir volume.
    assert sh(tier, pod, "echo hi > /workspace/f && cat /workspace/f")["stdout"] == "hi\n"
    info = Runtime.pod(tier.runtime, tier.namespace, pod)
    assert File.read!(Path.join([info.dir, "volumes", "workspace", "f"])) == "hi\n"

    # The sidecar's Secret is not in the view, nor is the runtime's directory
    # (every pod's volumes), even to root with DAC_OVERRIDE.
    for file <- ["/etc/condukt-egress/ca.key", "/etc/condukt-egress/token"] do
      res = exec(tier, pod, ["/bin/cat", file])
      refute res["ok"]
      assert res["stderr"] =~ "No such file"
    end

    res = exec(tier, pod, ["/bin/ls", "-A", Path.dirname(info.dir)])
    assert res["ok"] and res["stdout"] == ""
    res = sh(tier, pod, "grep -rsl #{session.token} /etc /workspace; echo done")
    assert res["stdout"] == "done\n"

    # No NET_ADMIN: the rules the init container set cannot be changed.
    res = exec(tier, pod, ["/usr/sbin/iptables", "-t", "nat", "-F"])
    refute res["ok"]
    assert res["stderr"] =~ ~r/Permission denied|not permitted/

    {rules, 0} = Testbed.exec_in(tier.testbed, :pod, ["iptables-save", "-t", "nat"])
    assert rules =~ "REDIRECT"
  end

  test "curl from exec: allowed.test through the sidecar (session CA via the mounted bundle), denied.test 403", %{
    tier: tier,
    pod: pod
  } do
    curl = "curl -sS --max-time 15 -o /dev/stdout -w ' %{http_code}\\n'"

    # With the pod's env (CURL_CA_BUNDLE = /etc/condukt/ca.pem).
    res = sh(tier, pod, "#{curl} https://allowed.test/")
    assert res["stdout"] == "hello from allowed.test\n 200\n", inspect(res)

    # Without any CA variable: Debian's curl reads the mounted bundle.
    res = sh(tier, pod, "env -u CURL_CA_BUNDLE -u SSL_CERT_FILE #{curl} https://allowed.test/")
    assert res["stdout"] == "hello from allowed.test\n 200\n", inspect(res)

    res = sh(tier, pod, "#{curl} https://denied.test/")
    assert res["stdout"] =~ ~r/ 403\n$/, inspect(res)

    # The sidecar minted the certificate curl accepted.
    res =
      sh(
        tier,
        pod,
        "echo | openssl s_client -connect allowed.test:443 -servername allowed.test 2>/dev/null | openssl x509 -noout -issuer"
      )

    assert res["stdout"] =~ "issuer="
    refute res["stdout"] =~ "condukt-netns"
  end

  test "a direct connection to another port of the internet is refused by the init container's rules", %{
    tier: tier,
    pod: pod
  } do
    res = sh(tier, pod, "curl -sS --max-time 5 http://#{tier.testbed.inet.v4}:8080/; echo exit=$?")
    assert res["stdout"] =~ ~r/exit=(7|28|56)/, inspect(res)
    assert Testbed.bypass_log(tier.testbed) == []
  end

  @tag :no_pod
  test "deleting the pod stops its processes, removes its directory and leaves no mount", %{
    tier: tier,
    session: session
  } do
    name = create_pod!(tier, session, "condukt-rt-del")
    wait_running!(tier, name)
    info = Runtime.pod(tier.runtime, tier.namespace, name)
    sidecar = info.pids["condukt-egress"]
    assert Cmd.alive?(sidecar)

    delete_pod(tier, name)
    assert {404, _} = Cluster.request(tier.cluster, :admin, "GET", pod_path(tier, name))
    assert is_nil(Runtime.pod(tier.runtime, tier.namespace, name))
    refute Cmd.alive?(sidecar)
    refute File.exists?(info.dir)
    assert Runtime.host_mounts(info.dir) == []
    assert Runtime.host_mounts(Path.dirname(info.dir)) == []

    # The node's namespace is a fresh pod's again: no rules, nothing listening on 15001.
    {rules, 0} = Testbed.exec_in(tier.testbed, :pod, ["iptables-save"])
    refute rules =~ "REDIRECT"
    {out, 0} = Testbed.exec_in(tier.testbed, :pod, ["ss", "-Hltn"])
    refute out =~ ":15001"
  end

  @tag :no_pod
  @tag capture_log: true
  test "a failing init container keeps the pod Pending, with the failure in its status and an Event", %{
    tier: tier,
    session: session
  } do
    name =
      create_pod!(tier, session, "condukt-rt-fail",
        netfilter_command: ["/usr/local/bin/condukt-egress", "netfilter-setup", "--proxy-port", "nope"]
      )

    on_exit(fn -> delete_pod(tier, name) end)

    assert {:ok, st} = Runtime.pod_failure(tier.cluster, tier.namespace, name)
    assert st["phase"] == "Pending"
    [failed] = st["initContainerStatuses"]
    assert failed["name"] == "condukt-netfilter"
    assert %{"terminated" => %{"exitCode" => code, "reason" => "Error"}} = failed["state"]
    assert code != 0

    {200, %{"items" => events}} =
      Cluster.request(tier.cluster, :admin, "GET", "/api/v1/namespaces/#{tier.namespace}/events")

    assert Enum.any?(events, &(&1["involvedObject"]["name"] == name and &1["reason"] == "Failed"))

    # It never becomes Running: the sidecar was never started.
    Process.sleep(1_000)

    assert {200, %{"status" => %{"phase" => "Pending"}}} =
             Cluster.request(tier.cluster, :sa, "GET", pod_path(tier, name))

    assert %{state: {:failed, _}, pids: pids} = Runtime.pod(tier.runtime, tier.namespace, name)
    assert pids == %{}
  end

  @tag :no_pod
  @tag capture_log: true
  test "a sidecar whose startupProbe never succeeds fails the pod with the probe's output; the workspace never starts",
       %{tier: tier, session: session} do
    probe = %{
      exec: %{command: ["/usr/local/bin/condukt-egress", "ready", "--listen", "127.0.0.1:1"]},
      periodSeconds: 1,
      failureThreshold: 2
    }

    name = create_pod!(tier, session, "condukt-rt-probe", startup_probe: probe)
    on_exit(fn -> delete_pod(tier, name) end)

    assert {:ok, st} = Runtime.pod_failure(tier.cluster, tier.namespace, name)
    assert st["phase"] == "Pending"
    assert st["message"] =~ "init container condukt-egress failed"
    assert st["message"] =~ "startupProbe failed 2 times (exit 1)"
    assert st["message"] =~ "condukt-egress ready: listen 127.0.0.1:1: not ready: Connection refused"

    assert %{state: {:failed, _}, startup: startup} = Runtime.pod(tier.runtime, tier.namespace, name)
    refute Map.has_key?(startup, "condukt-egress")
  end
end
