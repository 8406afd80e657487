defmodule Condukt.NativeKubeTest do
  # The port's Kubernetes client (docs/port-protocol.md, "Kubernetes")
  # against a real kube-apiserver (docs/k8s-tier.md): kubeconfig, client
  # certificate and exec plugin authentication, REST, exec and
  # port-forward over WebSocket into a pod on the real node.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Native
  alias Condukt.Dev.Netns.Cmd
  alias Condukt.Test.K8s.Node

  @port 18_081

  setup_all do
    # WebSocket exec and port-forward need `get` (docs/k8s-tier.md, RBAC).
    rules =
      Enum.map(Cluster.role_rules(), fn
        %{resources: [r]} = rule when r in ["pods/exec", "pods/portforward"] -> %{rule | verbs: ["get", "create"]}
        rule -> rule
      end)

    tier = Condukt.Test.K8s.Case.start_node_tier!(role_rules: rules)
    c = tier.cluster

    pod = %{
      apiVersion: "v1",
      kind: "Pod",
      metadata: %{name: "nk"},
      spec: %{
        automountServiceAccountToken: false,
        containers: [%{name: "workspace", image: "debian:bookworm-slim", command: ["sleep", "infinity"]}]
      }
    }

    {201, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{c.namespace}/pods", pod)

    :ok =
      Cluster.wait_until(
        fn ->
          match?(
            {200, %{"status" => %{"phase" => "Running"}}},
            Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{c.namespace}/pods/nk")
          )
        end,
        60_000
      )

    # Servers for port-forward run in the pod's network namespace (the
    # host's python3, entered into it).
    nk = Cluster.request!(c, :admin, "GET", "/api/v1/namespaces/#{c.namespace}/pods/nk")
    in_pod = ["nsenter", "--net=/proc/#{Node.container_pid(tier.node, nk, "workspace")}/ns/net"]
    %{cluster: c, in_pod: in_pod}
  end

  setup do
    {:ok, n} = Native.start_link(bin: System.get_env("CONDUKT_EGRESS_SAN_BIN") || Condukt.egress_binary())
    on_exit(fn -> Native.stop(n) end)
    %{n: n}
  end

  defp open!(n, c) do
    assert {:ok, %{kube: k} = info} = Native.kube_open(n, %{source: :kubeconfig, paths: [c.kubeconfig]})
    {k, info}
  end

  defp pod(name, labels) do
    %{
      "apiVersion" => "v1",
      "kind" => "Pod",
      "metadata" => %{"name" => name, "labels" => labels},
      "spec" => %{
        "automountServiceAccountToken" => false,
        "containers" => [%{"name" => "workspace", "image" => "debian:bookworm-slim"}]
      }
    }
  end

  describe "REST" do
    test "kube_open reads the ServiceAccount kubeconfig and sends nothing", %{n: n, cluster: c} do
      {_k, info} = open!(n, c)
      assert info.server == c.server
      assert info.context == "condukt-test"
      assert info.namespace == c.namespace
      assert info.user == "condukt-test-user"
      assert info.auth == :token
    end

    test "create, get, list with a labelSelector, merge-patch and delete a pod", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      base = "/api/v1/namespaces/#{c.namespace}/pods"

      assert {:ok, %{status: 201, body: %{"metadata" => %{"name" => "rest1"}}}} =
               Native.kube_request(n, k, %{method: :post, path: base, body: pod("rest1", %{"t" => "rest"})})

      assert {:ok, %{status: 200, body: %{"kind" => "Pod", "metadata" => %{"labels" => %{"t" => "rest"}}}}} =
               Native.kube_request(n, k, %{method: :get, path: "#{base}/rest1"})

      assert {:ok, %{status: 200, body: %{"items" => [%{"metadata" => %{"name" => "rest1"}}]}}} =
               Native.kube_request(n, k, %{method: :get, path: "#{base}?labelSelector=t%3Drest"})

      assert {:ok, %{status: 200, body: %{"items" => []}}} =
               Native.kube_request(n, k, %{method: :get, path: "#{base}?labelSelector=t%3Dnone"})

      assert {:ok, %{status: 200, body: %{"metadata" => %{"labels" => %{"t" => "rest", "extra" => "yes"}}}}} =
               Native.kube_request(n, k, %{
                 method: :patch,
                 path: "#{base}/rest1",
                 body: %{"metadata" => %{"labels" => %{"extra" => "yes"}}}
               })

      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :delete, path: "#{base}/rest1"})

      assert :ok =
               Cluster.wait_until(fn ->
                 match?({:ok, %{status: 404}}, Native.kube_request(n, k, %{method: :get, path: "#{base}/rest1"}))
               end)
    end

    test "a 404 and a 403 are answers with the Status body", %{n: n, cluster: c} do
      {k, _} = open!(n, c)

      assert {:ok, %{status: 404, body: %{"kind" => "Status", "reason" => "NotFound"}}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/namespaces/#{c.namespace}/pods/nope"})

      # The Role grants nothing on nodes, nor anything in another namespace.
      assert {:ok, %{status: 403, body: %{"kind" => "Status", "reason" => "Forbidden", "message" => msg}}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/nodes"})

      assert msg =~ "cannot list resource \"nodes\""

      assert {:ok, %{status: 403}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/namespaces/#{c.other_namespace}/secrets"})
    end

    test "a 403 answer to a POST is the answer, on one handle and on fresh ones", %{n: n, cluster: c} do
      # The API server answers a forbidden create before it reads the body
      # and may close the connection while the body is still being sent.
      secret = %{"apiVersion" => "v1", "kind" => "Secret", "metadata" => %{"name" => "nope"}, "data" => %{}}
      path = "/api/v1/namespaces/#{c.other_namespace}/secrets"
      {k, _} = open!(n, c)

      for _ <- 1..20 do
        assert {:ok, %{status: 403, body: %{"kind" => "Status", "reason" => "Forbidden"}}} =
                 Native.kube_request(n, k, %{method: :post, path: path, body: secret})
      end

      for _ <- 1..10 do
        {k2, _} = open!(n, c)

        assert {:ok, %{status: 403, body: %{"kind" => "Status", "reason" => "Forbidden"}}} =
                 Native.kube_request(n, k2, %{method: :post, path: path, body: secret})

        assert :ok = Native.kube_close(n, k2)
      end
    end

    test "a server that refuses the connection is unavail", %{n: n} do
      {:ok, l} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
      {:ok, port} = :inet.port(l)
      :gen_tcp.close(l)

      assert {:ok, %{kube: k}} =
               Native.kube_open(n, %{source: :explicit, server: "https://127.0.0.1:#{port}", token: "x"})

      assert {:error, %Native.Error{code: :unavail}} = Native.kube_request(n, k, %{method: :get, path: "/api"})
    end

    test "a server whose certificate another CA signed is tls", %{n: n, cluster: c} do
      {:ok, %{cert_pem: other_ca}} = Native.ca_new(n, common_name: "not the cluster's CA")

      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: other_ca, token: c.token})

      assert {:error, %Native.Error{code: :tls, message: msg}} =
               Native.kube_request(n, k, %{method: :get, path: "/api"})

      assert msg =~ "not trusted"

      # The cluster's own CA, but a name the certificate may not carry. The
      # API server listens on 127.0.0.1 only; where localhost is ::1 first
      # (Debian's /etc/hosts), the client reaches it on its second address.
      {:ok, %{kube: k2}} =
        Native.kube_open(n, %{
          source: :explicit,
          server: String.replace(c.server, "127.0.0.1", "localhost"),
          ca_pem: File.read!(Cluster.ca(c)),
          token: c.token
        })

      case Native.kube_request(n, k2, %{method: :get, path: "/api"}) do
        {:error, %Native.Error{code: :tls, message: msg}} ->
          assert msg =~ "does not name"

        # The serving certificate may name localhost too.
        {:ok, %{status: 200}} ->
          :ok
      end
    end

    test "explicit source with the cluster CA and the token works", %{n: n, cluster: c} do
      {:ok, %{kube: k, auth: :token}} =
        Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token})

      assert {:ok, %{status: 200, body: %{"kind" => "PodList"}}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/namespaces/#{c.namespace}/pods"})
    end

    test "client certificate authentication (the administrator's kubeconfig)", %{n: n, cluster: c} do
      admin = Path.join(c.dir, "admin.kubeconfig")
      assert {:ok, %{kube: k, auth: :client_cert}} = Native.kube_open(n, %{source: :kubeconfig, paths: [admin]})
      # system:masters may list nodes; the ServiceAccount may not.
      assert {:ok, %{status: 200, body: %{"kind" => "NodeList"}}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/nodes"})
    end

    test "each handle trusts its own CA only (a later handle changes nothing)", %{n: n, cluster: c} do
      {:ok, %{cert_pem: other_ca}} = Native.ca_new(n, common_name: "not the cluster's CA")
      ca = File.read!(Cluster.ca(c))
      path = "/api/v1/namespaces/#{c.namespace}/pods"

      {:ok, %{kube: a}} = Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: other_ca, token: c.token})
      {:ok, %{kube: b}} = Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: ca, token: c.token})

      assert {:ok, %{status: 200}} = Native.kube_request(n, b, %{method: :get, path: path})
      assert {:error, %Native.Error{code: :tls}} = Native.kube_request(n, a, %{method: :get, path: path})

      # And the other way round: the right CA first, the wrong one after.
      {:ok, %{kube: d}} = Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: other_ca, token: c.token})
      assert {:error, %Native.Error{code: :tls}} = Native.kube_request(n, d, %{method: :get, path: path})
      assert {:ok, %{status: 200}} = Native.kube_request(n, b, %{method: :get, path: path})
    end

    test "a client certificate stays with its handle", %{n: n, cluster: c} do
      admin = Path.join(c.dir, "admin.kubeconfig")
      assert {:ok, %{kube: a, auth: :client_cert}} = Native.kube_open(n, %{source: :kubeconfig, paths: [admin]})
      {sa, _} = open!(n, c)

      assert {:ok, %{status: 403}} = Native.kube_request(n, sa, %{method: :get, path: "/api/v1/nodes"})
      assert {:ok, %{status: 200}} = Native.kube_request(n, a, %{method: :get, path: "/api/v1/nodes"})
      assert {:ok, %{status: 403}} = Native.kube_request(n, sa, %{method: :get, path: "/api/v1/nodes"})

      # A handle with no credential at all is anonymous, not the administrator.
      {:ok, %{kube: anon}} =
        Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: File.read!(Cluster.ca(c))})

      assert {:ok, %{status: status}} = Native.kube_request(n, anon, %{method: :get, path: "/api/v1/nodes"})
      assert status in [401, 403]
    end

    test "exec plugin authentication, cached, and re-run once after a 401", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "plugin-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      count = Path.join(dir, "count")
      token_file = Path.join(dir, "token")
      File.write!(token_file, c.token)
      plugin = Path.join(dir, "plugin.sh")

      File.write!(plugin, """
      #!/bin/sh
      echo run >> #{count}
      [ -n "$KUBERNETES_EXEC_INFO" ] || exit 9
      printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}' "$(cat #{token_file})"
      """)

      File.chmod!(plugin, 0o755)
      ca = c |> Cluster.ca() |> File.read!() |> Base.encode64()
      kubeconfig = Path.join(dir, "kubeconfig")

      File.write!(kubeconfig, """
      apiVersion: v1
      kind: Config
      clusters:
      - name: c
        cluster:
          server: #{c.server}
          certificate-authority-data: #{ca}
      users:
      - name: u
        user:
          exec:
            apiVersion: client.authentication.k8s.io/v1
            command: ./plugin.sh
            interactiveMode: Never
      contexts:
      - name: x
        context: {cluster: c, user: u}
      current-context: x
      """)

      assert {:ok, %{kube: k, auth: :exec}} = Native.kube_open(n, %{source: :kubeconfig, paths: [kubeconfig]})
      path = "/api/v1/namespaces/#{c.namespace}/pods"
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path})
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path})
      assert File.read!(count) == "run\n"

      # A credential the server refuses: one re-run, with the new token.
      File.write!(token_file, "not-a-token")
      # (the cached token is still good: no re-run)
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path})
      assert File.read!(count) == "run\n"

      {:ok, %{kube: k2}} = Native.kube_open(n, %{source: :kubeconfig, paths: [kubeconfig]})
      assert {:ok, %{status: 401}} = Native.kube_request(n, k2, %{method: :get, path: path})
      # first run (bad token), 401, second run (still bad): the 401 is the answer.
      assert File.read!(count) == "run\nrun\nrun\n"
      File.write!(token_file, c.token)
      # The next request runs the plugin again (the cached one was refused).
      assert {:ok, %{status: 200}} = Native.kube_request(n, k2, %{method: :get, path: path})
    end

    defp plugin_kubeconfig!(c, dir, script) do
      File.mkdir_p!(dir)
      plugin = Path.join(dir, "plugin.sh")
      File.write!(plugin, script)
      File.chmod!(plugin, 0o755)
      ca = c |> Cluster.ca() |> File.read!() |> Base.encode64()
      kubeconfig = Path.join(dir, "kubeconfig")

      File.write!(kubeconfig, """
      clusters:
      - name: c
        cluster: {server: "#{c.server}", certificate-authority-data: #{ca}}
      users:
      - name: u
        user:
          exec: {apiVersion: client.authentication.k8s.io/v1, command: #{plugin}}
      contexts:
      - name: x
        context: {cluster: c, user: u}
      current-context: x
      """)

      kubeconfig
    end

    defp read_pid!(file) do
      :ok = Cluster.wait_until(fn -> match?({:ok, <<_, _::binary>>}, File.read(file)) end, 10_000)
      file |> File.read!() |> String.trim()
    end

    # Gone, or a zombie someone else must reap (not ours: we are not its parent).
    defp gone_or_zombie?(pid) do
      case File.read("/proc/#{pid}/stat") do
        {:error, _} -> true
        {:ok, stat} -> stat |> String.split(") ") |> List.last() |> String.starts_with?("Z")
      end
    end

    test "a plugin that leaves a child holding its stdout: the credential is used, the child killed",
         %{n: n, cluster: c} do
      dir = Path.join(c.dir, "plugin-bg-#{System.unique_integer([:positive])}")
      pidfile = Path.join(dir, "child")

      kubeconfig =
        plugin_kubeconfig!(c, dir, """
        #!/bin/sh
        printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}' '#{c.token}'
        /bin/sleep 1000 &
        echo $! > #{pidfile}
        exit 0
        """)

      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :kubeconfig, paths: [kubeconfig]})
      path = "/api/v1/namespaces/#{c.namespace}/pods"
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path, timeout: 15_000})
      child = read_pid!(pidfile)
      assert :ok = Cluster.wait_until(fn -> gone_or_zombie?(child) end, 10_000)
      # The handle is not wedged: the cached credential serves the next one.
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path, timeout: 15_000})
    end

    test "closing a handle while its plugin runs kills and reaps the plugin", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "plugin-slow-#{System.unique_integer([:positive])}")
      pidfile = Path.join(dir, "pid")
      kubeconfig = plugin_kubeconfig!(c, dir, "#!/bin/sh
echo $$ > #{pidfile}
exec /bin/sleep 1000
")
      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :kubeconfig, paths: [kubeconfig]})
      req = Task.async(fn -> Native.kube_request(n, k, %{method: :get, path: "/api", timeout: 30_000}) end)
      pid = read_pid!(pidfile)
      assert File.exists?("/proc/#{pid}")
      assert :ok = Native.kube_close(n, k)
      assert {:error, %Native.Error{code: :closed}} = Task.await(req, 10_000)
      # Reaped by the port (its parent): no zombie left behind.
      assert :ok = Cluster.wait_until(fn -> not File.exists?("/proc/#{pid}") end, 10_000)
    end

    test "a reply over the port's packet limit is toobig, not lost", %{n: n, cluster: c} do
      admin = Path.join(c.dir, "admin.kubeconfig")
      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :kubeconfig, paths: [admin]})
      # Free-form objects (a CRD that keeps unknown fields) holding floats:
      # "0.5," is 4 bytes of JSON and 9 as a term.
      crd = %{
        "apiVersion" => "apiextensions.k8s.io/v1",
        "kind" => "CustomResourceDefinition",
        "metadata" => %{"name" => "blobs.condukt.test"},
        "spec" => %{
          "group" => "condukt.test",
          "scope" => "Namespaced",
          "names" => %{"plural" => "blobs", "singular" => "blob", "kind" => "Blob", "listKind" => "BlobList"},
          "versions" => [
            %{
              "name" => "v1",
              "served" => true,
              "storage" => true,
              "schema" => %{"openAPIV3Schema" => %{"type" => "object", "x-kubernetes-preserve-unknown-fields" => true}}
            }
          ]
        }
      }

      crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
      assert {:ok, %{status: 201}} = Native.kube_request(n, k, %{method: :post, path: crds, body: crd})

      try do
        base = "/apis/condukt.test/v1/namespaces/#{c.namespace}/blobs"

        :ok =
          Cluster.wait_until(fn ->
            match?({:ok, %{status: 200}}, Native.kube_request(n, k, %{method: :get, path: base}))
          end)

        # 8 objects of 250000 floats: about 8 MB of JSON (under the 15 MiB
        # body limit), about 18 MB as terms (over the 16 MiB packet limit).
        floats = List.duplicate(0.5, 250_000)

        for i <- 1..8 do
          blob = %{
            "apiVersion" => "condukt.test/v1",
            "kind" => "Blob",
            "metadata" => %{"name" => "b#{i}"},
            "x" => floats
          }

          assert {:ok, %{status: 201}} = Native.kube_request(n, k, %{method: :post, path: base, body: blob})
        end

        assert {:error, %Native.Error{code: :toobig, message: msg}} =
                 Native.kube_request(n, k, %{method: :get, path: base, timeout: 30_000})

        assert msg =~ "packet limit"
        # The handle and the port carry on.
        assert {:ok, %{status: 200, body: %{"x" => [0.5 | _]}}} =
                 Native.kube_request(n, k, %{method: :get, path: base <> "/b1"})
      after
        Native.kube_request(n, k, %{method: :delete, path: crds <> "/blobs.condukt.test"})
      end
    end

    test "a redirect is not followed: the 3xx is the answer, the token stays home", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "redirect-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      landed = Path.join(dir, "landed")
      {:ok, l} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
      {:ok, port} = :inet.port(l)
      :gen_tcp.close(l)

      # Serves /r with a 302 to /landed on itself; /landed records its headers.
      script = """
      import http.server, ssl
      class H(http.server.BaseHTTPRequestHandler):
          def do_GET(self):
              if self.path == '/landed':
                  open('#{landed}', 'w').write(str(self.headers))
                  self.send_response(200); self.send_header('Content-Length', '0'); self.end_headers()
              else:
                  self.send_response(302)
                  self.send_header('Location', 'https://127.0.0.1:#{port}/landed')
                  self.send_header('Content-Length', '0'); self.end_headers()
      s = http.server.HTTPServer(('127.0.0.1', #{port}), H)
      ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      ctx.load_cert_chain('#{c.dir}/pki/apiserver.crt', '#{c.dir}/pki/apiserver.key')
      s.socket = ctx.wrap_socket(s.socket, server_side=True)
      s.timeout = 5
      s.handle_request(); s.handle_request()
      """

      server = Task.async(fn -> Cmd.run(["/usr/bin/python3", "-c", script], timeout: 30_000) end)
      Process.sleep(700)

      {:ok, %{kube: k}} =
        Native.kube_open(n, %{
          source: :explicit,
          server: "https://127.0.0.1:#{port}",
          ca_pem: File.read!(Cluster.ca(c)),
          token: "secret-token"
        })

      assert {:ok, %{status: 302}} = Native.kube_request(n, k, %{method: :get, path: "/r"})
      Task.await(server, 30_000)
      refute File.exists?(landed)
    end

    test "tls-server-name is the name checked; insecure checks nothing", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "tsn-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      ca = c |> Cluster.ca() |> File.read!() |> Base.encode64()
      path = "/api/v1/namespaces/#{c.namespace}/pods"

      kubeconfig = fn name, cluster ->
        file = Path.join(dir, name)

        File.write!(file, """
        clusters:
        - name: c
          cluster: {server: "#{c.server}", #{cluster}}
        users:
        - name: u
          user: {token: #{c.token}}
        contexts:
        - name: x
          context: {cluster: c, user: u}
        current-context: x
        """)

        {:ok, %{kube: k}} = Native.kube_open(n, %{source: :kubeconfig, paths: [file]})
        k
      end

      good = kubeconfig.("good", "certificate-authority-data: #{ca}, tls-server-name: kubernetes")
      assert {:ok, %{status: 200}} = Native.kube_request(n, good, %{method: :get, path: path})

      wrong = kubeconfig.("wrong", "certificate-authority-data: #{ca}, tls-server-name: wrong.example")

      assert {:error, %Native.Error{code: :tls, message: msg}} =
               Native.kube_request(n, wrong, %{method: :get, path: path})

      assert msg =~ "does not name \"wrong.example\""

      insecure = kubeconfig.("insecure", "insecure-skip-tls-verify: true, tls-server-name: wrong.example")
      assert {:ok, %{status: 200}} = Native.kube_request(n, insecure, %{method: :get, path: path})
    end

    test "a token file is re-read when it changes", %{n: n, cluster: c} do
      file = Path.join(c.dir, "tok-#{System.unique_integer([:positive])}")
      File.write!(file, c.token <> "\n")

      {:ok, %{kube: k, auth: :token_file}} =
        Native.kube_open(n, %{source: :explicit, server: c.server, ca_pem: File.read!(Cluster.ca(c)), token_file: file})

      path = "/api/v1/namespaces/#{c.namespace}/pods"
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path})
      File.write!(file, "rotated-away")
      File.touch!(file, System.os_time(:second) + 5)
      assert {:ok, %{status: 401}} = Native.kube_request(n, k, %{method: :get, path: path})
      File.write!(file, c.token)
      File.touch!(file, System.os_time(:second) + 10)
      assert {:ok, %{status: 200}} = Native.kube_request(n, k, %{method: :get, path: path})
    end

    test "in_cluster: the ServiceAccount directory, namespace and all", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "sa-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      File.write!(Path.join(dir, "token"), c.token)
      File.cp!(Cluster.ca(c), Path.join(dir, "ca.crt"))
      File.write!(Path.join(dir, "namespace"), c.namespace)
      %URI{host: host, port: port} = URI.parse(c.server)

      assert {:ok, %{kube: k, auth: :token_file, namespace: ns, context: nil}} =
               Native.kube_open(n, %{source: :in_cluster, dir: dir, host: host, port: port})

      assert ns == c.namespace

      assert {:ok, %{status: 200, body: %{"kind" => "PodList"}}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/namespaces/#{ns}/pods"})
    end

    test "an exec plugin that gives a client certificate", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "plugin-cert-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      plugin = Path.join(dir, "cert.py")

      File.write!(plugin, """
      #!/usr/bin/python3
      import json
      print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
        "status": {"clientCertificateData": open("#{c.admin.cert}").read(),
                   "clientKeyData": open("#{c.admin.key}").read(),
                   "expirationTimestamp": "2099-01-01T00:00:00Z"}}))
      """)

      File.chmod!(plugin, 0o755)
      ca = c |> Cluster.ca() |> File.read!() |> Base.encode64()
      kubeconfig = Path.join(dir, "kubeconfig")

      File.write!(kubeconfig, """
      clusters:
      - name: c
        cluster: {server: "#{c.server}", certificate-authority-data: #{ca}}
      users:
      - name: u
        user:
          exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: #{plugin}, provideClusterInfo: true}
      contexts:
      - name: x
        context: {cluster: c, user: u}
      current-context: x
      """)

      {:ok, %{kube: k, auth: :exec}} = Native.kube_open(n, %{source: :kubeconfig, paths: [kubeconfig]})
      # Only the administrator's certificate may list nodes.
      assert {:ok, %{status: 200, body: %{"kind" => "NodeList"}}} =
               Native.kube_request(n, k, %{method: :get, path: "/api/v1/nodes"})
    end

    test "a failing exec plugin is an error naming it", %{n: n, cluster: c} do
      dir = Path.join(c.dir, "plugin-bad-#{System.unique_integer([:positive])}")
      File.mkdir_p!(dir)
      plugin = Path.join(dir, "bad.sh")
      File.write!(plugin, "#!/bin/sh\necho 'no credentials here' >&2\nexit 4\n")
      File.chmod!(plugin, 0o755)
      kubeconfig = Path.join(dir, "kubeconfig")

      File.write!(kubeconfig, """
      clusters:
      - name: c
        cluster: {server: "#{c.server}", insecure-skip-tls-verify: true}
      users:
      - name: u
        user:
          exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: #{plugin}}
      contexts:
      - name: x
        context: {cluster: c, user: u}
      current-context: x
      """)

      {:ok, %{kube: k}} = Native.kube_open(n, %{source: :kubeconfig, paths: [kubeconfig]})

      assert {:error, %Native.Error{code: :perm, message: msg}} =
               Native.kube_request(n, k, %{method: :get, path: "/api"})

      assert msg =~ "bad.sh"
      assert msg =~ "exit status 4"
      assert msg =~ "no credentials here"
    end

    test "kube_open refuses bad kubeconfigs with the file and the YAML path", %{n: n, cluster: c} do
      bad = Path.join(c.dir, "bad-#{System.unique_integer([:positive])}.kubeconfig")

      File.write!(bad, """
      clusters:
      - name: c
        cluster: {server: "https://127.0.0.1:1"}
      users:
      - name: u
        user: {username: a, password: b}
      contexts:
      - name: x
        context: {cluster: c, user: u}
      current-context: x
      """)

      assert {:error, %Native.Error{code: :inval, message: msg}} =
               Native.kube_open(n, %{source: :kubeconfig, paths: [bad]})

      assert msg =~ bad
      assert msg =~ "users[0].user.username"

      assert {:error, %Native.Error{code: :noent}} =
               Native.kube_open(n, %{source: :kubeconfig, paths: [bad <> ".missing"]})

      assert {:error, %Native.Error{code: :badarg}} = Native.kube_open(n, %{source: :kubeconfig})
      assert {:error, %Native.Error{code: :closed}} = Native.kube_request(n, 999, %{method: :get, path: "/"})
    end

    test "kube_close ends the handle", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      assert :ok = Native.kube_close(n, k)
      assert :ok = Native.kube_close(n, k)

      assert {:error, %Native.Error{code: :closed}} = Native.kube_request(n, k, %{method: :get, path: "/api"})
    end
  end

  describe "exec" do
    defp exec(n, k, c, command, extra \\ %{}) do
      Native.kube_exec(
        n,
        k,
        Map.merge(%{namespace: c.namespace, pod: "nk", container: "workspace", command: command}, extra)
      )
    end

    test "stdout, exit 0, in the pod", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      assert {:ok, r} = exec(n, k, c, ["/bin/cat", "/etc/hostname"])
      assert r.protocol == "v5.channel.k8s.io"
      assert r.stdout == "nk\n"
      assert r.exit_code == 0
      assert %{"status" => "Success"} = r.status
    end

    test "stderr and a non-zero exit code", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      assert {:ok, r} = exec(n, k, c, ["/bin/sh", "-c", "echo out; echo oops >&2; exit 3"])
      assert r.stdout == "out\n"
      assert r.stderr == "oops\n"
      assert r.exit_code == 3
      assert %{"status" => "Failure"} = r.status
    end

    test "stdin is streamed (head -c N)", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      data = :crypto.strong_rand_bytes(200_000)
      assert {:ok, r} = exec(n, k, c, ["/usr/bin/head", "-c", "200000"], %{stdin: data})
      assert r.exit_code == 0
      assert byte_size(r.stdout) == 200_000
      assert r.stdout == data
    end

    test "output over max_output is counted, not kept", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      assert {:ok, r} = exec(n, k, c, ["/bin/sh", "-c", "head -c 5000 /dev/zero"], %{max_output: 1000})
      assert byte_size(r.stdout) == 1000
      assert r.stdout_dropped == 4000
    end

    test "a timeout is timedout", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      assert {:error, %Native.Error{code: :timedout}} = exec(n, k, c, ["/bin/sleep", "30"], %{timeout: 1000})
    end

    test "an upgrade that agrees no subprotocol we speak is refused, not run", %{n: n, cluster: c} do
      {:ok, l} = :gen_tcp.listen(0, ip: {127, 0, 0, 1})
      {:ok, port} = :inet.port(l)
      :gen_tcp.close(l)

      # Answers each upgrade with 101 and a correct accept key, but with no
      # Sec-WebSocket-Protocol (first) or one that was not offered
      # (second); then a status-channel "Success" and a close.
      script = """
      import base64, hashlib, socket, ssl
      ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
      ctx.load_cert_chain('#{c.dir}/pki/apiserver.crt', '#{c.dir}/pki/apiserver.key')
      srv = socket.create_server(('127.0.0.1', #{port}))
      srv.settimeout(20)
      for proto in (None, 'v1.channel.k8s.io'):
          raw, _ = srv.accept()
          s = ctx.wrap_socket(raw, server_side=True)
          s.settimeout(10)
          req = b''
          while b'\\r\\n\\r\\n' not in req:
              chunk = s.recv(4096)
              if not chunk: break
              req += chunk
          key = [l.split(b':', 1)[1].strip() for l in req.split(b'\\r\\n') if l.lower().startswith(b'sec-websocket-key:')][0]
          accept = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
          head = b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + accept + b'\\r\\n'
          if proto: head += b'Sec-WebSocket-Protocol: ' + proto.encode() + b'\\r\\n'
          s.sendall(head + b'\\r\\n')
          status = b'\\x03{"metadata":{},"status":"Success"}'
          try:
              s.sendall(bytes([0x82, len(status)]) + status + bytes([0x88, 0x02, 0x03, 0xe8]))
              s.recv(4096)
          except OSError:
              pass
          s.close()
      """

      server = Task.async(fn -> Cmd.run(["/usr/bin/python3", "-c", script], timeout: 60_000) end)
      Process.sleep(700)

      {:ok, %{kube: k}} =
        Native.kube_open(n, %{
          source: :explicit,
          server: "https://127.0.0.1:#{port}",
          ca_pem: File.read!(Cluster.ca(c)),
          token: "secret-token"
        })

      spec = %{namespace: "ns", pod: "p", container: "x", command: ["true"], timeout: 10_000}
      assert {:error, %Native.Error{code: :proto, message: msg}} = Native.kube_exec(n, k, spec)
      assert msg =~ ~s(agreed the subprotocol "", not v5.channel.k8s.io or v4.channel.k8s.io)
      assert {:error, %Native.Error{code: code}} = Native.kube_exec(n, k, spec)
      assert code in [:proto, :unavail], "an unoffered subprotocol must not run: #{inspect(code)}"
      Task.await(server, 60_000)
    end

    test "a pod that does not exist is an error", %{n: n, cluster: c} do
      {k, _} = open!(n, c)

      assert {:error, %Native.Error{code: code}} =
               Native.kube_exec(n, k, %{namespace: c.namespace, pod: "absent", container: "x", command: ["true"]})

      assert code in [:noent, :proto]

      assert {:error, %Native.Error{code: :perm}} =
               Native.kube_exec(n, k, %{namespace: c.other_namespace, pod: "x", container: "x", command: ["true"]})
    end
  end

  describe "port-forward" do
    # A server inside the pod's network namespace: for each connection,
    # echoes "pong:" + what it read until the client's first newline, then
    # closes.
    defp echo_server(in_pod, conns) do
      script = """
      import socket
      s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(('127.0.0.1', #{@port})); s.listen()
      for _ in range(#{conns}):
          c, _ = s.accept(); buf = b''
          while not buf.endswith(b'\\n'):
              d = c.recv(65536)
              if not d: break
              buf += d
          c.sendall(b'pong:' + buf); c.close()
      """

      task =
        Task.async(fn ->
          Cmd.run(in_pod ++ ["/usr/bin/python3", "-c", script], timeout: 60_000)
        end)

      Process.sleep(500)
      task
    end

    defp connect(addr) do
      {:ok, s} =
        case addr do
          {:tcp, host, port} -> :gen_tcp.connect(String.to_charlist(host), port, [:binary, active: false], 5_000)
          {:unix, path} -> :gen_tcp.connect({:local, path}, 0, [:binary, active: false], 5_000)
        end

      s
    end

    # Sends payload and reads the echo's length, then closes.
    defp roundtrip(addr, payload) do
      s = connect(addr)
      :ok = :gen_tcp.send(s, payload)
      got = recv_n(s, byte_size("pong:" <> payload), "")
      :gen_tcp.close(s)
      got
    end

    defp recv_n(_s, n, acc) when byte_size(acc) >= n, do: acc

    defp recv_n(s, n, acc) do
      case :gen_tcp.recv(s, 0, 10_000) do
        {:ok, d} -> recv_n(s, n, acc <> d)
        {:error, _} -> acc
      end
    end

    test "bytes both ways over several connections", %{n: n, cluster: c, in_pod: in_pod} do
      {k, _} = open!(n, c)
      server = echo_server(in_pod, 3)

      assert {:ok, {f, %{address: {:tcp, "127.0.0.1", port} = addr}}} =
               Native.kube_forward(n, k, %{
                 namespace: c.namespace,
                 pod: "nk",
                 port: @port,
                 listen: {:tcp, "127.0.0.1", 0}
               })

      assert port > 0
      assert roundtrip(addr, "one\n") == "pong:one\n"
      # Over the 1 MiB queue bound both ways.
      big = :binary.copy("x", 3_000_000) <> "\n"
      assert roundtrip(addr, big) == "pong:" <> big
      assert roundtrip(addr, "three\n") == "pong:three\n"
      assert {_, 0} = Task.await(server, 30_000)
      assert :ok = Native.kube_forward_close(n, f)
      assert {:error, _} = :gen_tcp.connect(~c"127.0.0.1", port, [], 1_000)
    end

    test "a unix listener; a port with no listener closes the tunnel", %{n: n, cluster: c} do
      {k, _} = open!(n, c)
      path = Path.join(c.dir, "fwd-#{System.unique_integer([:positive])}.sock")

      assert {:ok, {f, %{address: {:unix, ^path}}}} =
               Native.kube_forward(n, k, %{namespace: c.namespace, pod: "nk", port: @port + 1, listen: {:unix, path}})

      # Nothing listens in the pod: the kubelet says so on the error
      # channel; the local socket is closed, nothing came.
      s = connect({:unix, path})
      :ok = :gen_tcp.send(s, "anyone?\n")
      assert {:error, :closed} = :gen_tcp.recv(s, 0, 10_000)
      assert_receive {:condukt_kube_forward, ^n, ^f, {:error, msg}}, 10_000
      assert msg =~ "port-forward to #{c.namespace}/nk:#{@port + 1}"
      assert :ok = Native.kube_forward_close(n, f)
      refute File.exists?(path)
    end

    test "a refused upgrade is reported to the listener's owner; the listener stays", %{n: n, cluster: c} do
      {k, _} = open!(n, c)

      assert {:ok, {f, %{address: addr}}} =
               Native.kube_forward(n, k, %{
                 namespace: c.namespace,
                 pod: "absent",
                 port: 80,
                 listen: {:tcp, "127.0.0.1", 0}
               })

      for _ <- 1..2 do
        s = connect(addr)
        assert {:error, :closed} = :gen_tcp.recv(s, 0, 10_000)
        assert_receive {:condukt_kube_forward, ^n, ^f, {:error, msg}}, 10_000
        assert msg =~ "HTTP 404"
      end
    end

    test "a listener holds at most 16 tunnels; the next connection is refused and reported",
         %{n: n, cluster: c, in_pod: in_pod} do
      {k, _} = open!(n, c)
      # Accepts 17 connections (16, then one more after one closed) and holds them.
      script = """
      import socket, time
      s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(('127.0.0.1', #{@port})); s.listen(64); s.settimeout(30)
      held = [s.accept()[0] for _ in range(17)]
      time.sleep(1)
      """

      server =
        Task.async(fn ->
          Cmd.run(in_pod ++ ["/usr/bin/python3", "-c", script], timeout: 60_000)
        end)

      Process.sleep(500)

      {:ok, {f, %{address: addr}}} =
        Native.kube_forward(n, k, %{namespace: c.namespace, pod: "nk", port: @port, listen: {:tcp, "127.0.0.1", 0}})

      socks =
        for _ <- 1..16 do
          s = connect(addr)
          :ok = :gen_tcp.send(s, "x")
          s
        end

      Process.sleep(1000)
      extra = connect(addr)
      assert {:error, :closed} = :gen_tcp.recv(extra, 0, 5_000)
      assert_receive {:condukt_kube_forward, ^n, ^f, {:error, msg}}, 5_000
      assert msg =~ "16 tunnels"

      # One closes: a place is free again.
      [first | rest] = socks
      :gen_tcp.close(first)
      Process.sleep(1500)
      again = connect(addr)
      :ok = :gen_tcp.send(again, "x")
      assert {:error, :timeout} = :gen_tcp.recv(again, 0, 1_500)
      refute_received {:condukt_kube_forward, ^n, ^f, _}

      Enum.each([again | rest], &:gen_tcp.close/1)
      assert {_, 0} = Task.await(server, 60_000)
      assert :ok = Native.kube_forward_close(n, f)
    end

    test "a non-loopback listener is refused", %{n: n, cluster: c} do
      {k, _} = open!(n, c)

      assert {:error, %Native.Error{code: :inval}} =
               Native.kube_forward(n, k, %{namespace: c.namespace, pod: "nk", port: 80, listen: {:tcp, "0.0.0.0", 0}})
    end
  end
end
