defmodule Condukt.Test.K8s.Cluster do
  @moduledoc false
  # A real, throwaway Kubernetes control plane on loopback for the
  # `:kubernetes` tier (docs/k8s-tier.md): etcd, kube-apiserver (TLS from a
  # per-cluster CA made with the openssl CLI, service-account signing keys,
  # RBAC authorization), kube-scheduler and kube-controller-manager (garbage
  # collector, namespaces, service accounts). The nodes are added by
  # `Condukt.Test.K8s.Node` (a real kubelet); without one, pods are stored
  # and scheduled nowhere, which is all the API-only tests need.
  #
  # `start/1` also creates, as the administrator: the namespace the tests
  # use, a second namespace with a Secret in it (for "cannot read another
  # namespace"), the ServiceAccount `condukt` bound by a RoleBinding to
  # exactly the Role of `role_rules/0` (docs/kubernetes.md, "RBAC"), and a
  # token for the ServiceAccount (TokenRequest). `kubeconfig` is a kubeconfig for that
  # ServiceAccount: the tests run as it, never as the administrator.
  #
  # Life cycle: every process is started detached (its own session) and
  # stopped by pid; `stop/1` is idempotent and removes the directory. Waits
  # are bounded. Nothing here listens outside 127.0.0.1.

  alias Condukt.Test.K8s.Tier
  alias Condukt.Dev.Netns.Cmd

  defstruct [
    :id,
    :dir,
    :bin_dir,
    :server,
    :ports,
    :namespace,
    :other_namespace,
    :service_account,
    :token,
    :kubeconfig,
    :admin,
    kubelet_address_types: "InternalIP",
    pids: %{},
    keep_dir: false
  ]

  @type t :: %__MODULE__{}

  @start_timeout 90_000

  @doc """
  The Role the ServiceAccount is bound to: exactly the RBAC section of
  docs/kubernetes.md (the documented Role of `Condukt.Sandbox.Kubernetes`),
  which the tier proves sufficient. It differs from the seeds' lists
  (`seed_role_rules/0`) in two ways: WebSocket exec and port-forward are
  GETs, so `pods/exec` and `pods/portforward` need `get` as well as
  `create`; and `list`/`patch` on Secrets and NetworkPolicies are what the
  owner-reference patch and the label-selected cleanup of `terminate/2`
  and `reap_stale/1` use.
  """
  @spec role_rules() :: [map()]
  def role_rules do
    [
      %{apiGroups: [""], resources: ["pods"], verbs: ~w(get list create patch delete)},
      %{apiGroups: [""], resources: ["pods/exec", "pods/portforward"], verbs: ~w(get create)},
      %{apiGroups: [""], resources: ["secrets"], verbs: ~w(get list create patch delete)},
      %{apiGroups: ["networking.k8s.io"], resources: ["networkpolicies"], verbs: ~w(get list create patch delete)}
    ]
  end

  @doc """
  The seeds' Role, verbatim: 003/004's pod rules plus 000's network-policy
  extras. Kept to show where it falls short (docs/k8s-tier.md, RBAC).
  """
  @spec seed_role_rules() :: [map()]
  def seed_role_rules do
    [
      %{apiGroups: [""], resources: ["pods"], verbs: ~w(get list create patch delete)},
      %{apiGroups: [""], resources: ["pods/exec"], verbs: ~w(create)},
      %{apiGroups: [""], resources: ["secrets"], verbs: ~w(get create delete)},
      %{apiGroups: ["networking.k8s.io"], resources: ["networkpolicies"], verbs: ~w(get create delete)},
      %{apiGroups: [""], resources: ["pods/portforward"], verbs: ~w(create)}
    ]
  end

  @doc "The Role of docs/kubernetes.md (\"RBAC\"); the same as `role_rules/0`."
  @spec contract_role_rules() :: [map()]
  def contract_role_rules, do: role_rules()

  @doc """
  Starts a cluster and returns its struct.

  Options: `:on_exit` (register `stop/1` with ExUnit, default true),
  `:namespace` (default "agents"), `:role_rules` (default `role_rules/0`),
  `:controllers` (scheduler and controller manager when built, default
  true), `:kubelet_address_types` (the API server's
  --kubelet-preferred-address-types, default "InternalIP"), `:keep_dir`
  (default env CONDUKT_K8S_KEEP=1).
  """
  @spec start(keyword()) :: t()
  def start(opts \\ []) do
    sweep()
    id = :crypto.strong_rand_bytes(3) |> Base.encode16(case: :lower)
    dir = Path.join(System.tmp_dir!(), "condukt-k8s-#{id}")

    c = %__MODULE__{
      id: id,
      dir: dir,
      bin_dir: Tier.bin_dir!(),
      namespace: Keyword.get(opts, :namespace, "agents"),
      other_namespace: "other-#{id}",
      service_account: "condukt",
      kubelet_address_types: Keyword.get(opts, :kubelet_address_types, "InternalIP"),
      keep_dir: Keyword.get(opts, :keep_dir, System.get_env("CONDUKT_K8S_KEEP") == "1")
    }

    File.mkdir_p!(Path.join(dir, "log"))
    # The pids file lets a later run (or a person) find what a crashed run
    # left: one "name pid" line per process, appended as each starts.
    File.write!(Path.join(dir, "pids"), "")
    # The VM that owns the cluster: `sweep/0` stops clusters whose owner
    # is gone (a run killed before its on_exit ran).
    File.write!(Path.join(dir, "owner"), System.pid())

    if Keyword.get(opts, :on_exit, true) do
      ExUnit.Callbacks.on_exit({__MODULE__, id}, fn -> stop(c) end)
    end

    try do
      c
      |> make_pki!()
      |> start_etcd!()
      |> start_apiserver!()
      |> maybe(Keyword.get(opts, :controllers, true), &start_controllers!/1)
      |> bootstrap!(Keyword.get(opts, :role_rules, role_rules()))
    rescue
      e ->
        stop(c)
        reraise e, __STACKTRACE__
    end
  end

  @doc "Stops every process the cluster started and removes its directory. Idempotent."
  @spec stop(t()) :: :ok
  def stop(%__MODULE__{dir: dir} = c) do
    pids =
      case File.read(Path.join(dir, "pids")) do
        {:ok, text} ->
          for line <- String.split(text, "\n", trim: true),
              [_, pid] = String.split(line, " "),
              do: String.to_integer(pid)

        _ ->
          Map.values(c.pids)
      end

    # Clients first (the node, the controllers), the API server, etcd last.
    Cmd.kill(Enum.reverse(pids), 5_000)

    # rm(1), not File.rm_rf/1: a node's image layers are many files, and
    # --one-file-system leaves alone whatever a crashed run left mounted.
    unless c.keep_dir, do: Cmd.run(["rm", "-rf", "--one-file-system", dir], timeout: 120_000)
    :ok
  end

  @doc """
  Stops the clusters a dead VM left behind: every `condukt-k8s-*`
  directory whose `owner` VM no longer runs. Only processes whose command
  line names that directory are killed (a recycled pid is left alone).
  """
  @spec sweep() :: :ok
  def sweep do
    for dir <- Path.wildcard(Path.join(System.tmp_dir!(), "condukt-k8s-*")),
        {:ok, owner} <- [File.read(Path.join(dir, "owner"))],
        not beam_alive?(String.trim(owner)) do
      pids =
        case File.read(Path.join(dir, "pids")) do
          {:ok, text} ->
            for line <- String.split(text, "\n", trim: true),
                [_, pid] <- [String.split(line, " ")],
                {n, ""} <- [Integer.parse(pid)],
                names_dir?(n, dir),
                do: n

          _ ->
            []
        end

      File.write!(Path.join(dir, "pids"), Enum.map_join(pids, &"swept #{&1}\n"))
      stop(%__MODULE__{id: Path.basename(dir), dir: dir, namespace: nil, other_namespace: nil})
    end

    :ok
  end

  defp beam_alive?(pid) do
    case File.read("/proc/#{pid}/cmdline") do
      {:ok, cmd} -> String.contains?(cmd, "beam")
      _ -> false
    end
  end

  defp names_dir?(pid, dir) do
    case File.read("/proc/#{pid}/cmdline") do
      {:ok, cmd} -> String.contains?(cmd, dir)
      _ -> false
    end
  end

  @doc """
  An API request. `as` is `:admin` (client certificate, system:masters) or
  `:sa` (the ServiceAccount's token). Returns `{status, body}` with the
  body decoded from JSON when it is JSON.
  """
  @spec request(t(), :admin | :sa, String.t(), String.t(), map() | nil, keyword()) ::
          {non_neg_integer(), term()}
  def request(%__MODULE__{} = c, as, method, path, body \\ nil, opts \\ []) do
    content_type = Keyword.get(opts, :content_type, "application/json")

    auth =
      if as == :admin,
        do: ["--cert", c.admin.cert, "--key", c.admin.key],
        else: ["-H", "Authorization: Bearer #{c.token}"]

    {data, stdin} =
      case body do
        nil ->
          {[], "/dev/null"}

        body ->
          file = Path.join(c.dir, "req-#{System.unique_integer([:positive])}.json")
          File.write!(file, :jiffy.encode(body))
          {["-H", "Content-Type: #{content_type}", "--data-binary", "@-"], file}
      end

    argv =
      [Tier.tool!("curl"), "-sS", "--max-time", "20", "--cacert", ca(c), "-X", method, "-w", "\n%{http_code}"] ++
        auth ++ data ++ [c.server <> path]

    {out, status} = Cmd.run(argv, stdin: stdin, stderr: :discard, timeout: 25_000)
    if stdin != "/dev/null", do: File.rm(stdin)
    # curl failed (connection refused while a server starts): status 0.
    {text, code} = if status == 0, do: split_status(out), else: {"curl exit #{status}", 0}

    decoded =
      try do
        :jiffy.decode(text, [:return_maps])
      catch
        _, _ -> text
      end

    {code, decoded}
  end

  @doc "Like `request/6` but raises unless the status is 2xx; returns the body."
  def request!(c, as, method, path, body \\ nil, opts \\ []) do
    case request(c, as, method, path, body, opts) do
      {code, body} when code in 200..299 -> body
      {code, body} -> raise "#{method} #{path} as #{as}: HTTP #{code}: #{inspect(body)}"
    end
  end

  @doc "Polls `fun` (truthy means done) every 100 ms for up to `timeout` ms."
  def wait_until(fun, timeout \\ 30_000), do: Cmd.poll(fun, timeout, 100)

  def ca(%__MODULE__{dir: dir}), do: Path.join(dir, "pki/ca.crt")

  # --- PKI ------------------------------------------------------------------

  defp make_pki!(c) do
    pki = Path.join(c.dir, "pki")
    File.mkdir_p!(pki)
    openssl = Tier.tool!("openssl")
    p = &Path.join(pki, &1)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    Cmd.run!(
      [openssl, "req", "-x509"] ++
        ec ++ ["-keyout", p.("ca.key"), "-out", p.("ca.crt"), "-days", "2", "-subj", "/CN=condukt-k8s-#{c.id}-ca"]
    )

    leaf = fn name, subj, ext ->
      File.write!(p.("#{name}.ext"), ext)
      Cmd.run!([openssl, "req"] ++ ec ++ ["-keyout", p.("#{name}.key"), "-out", p.("#{name}.csr"), "-subj", subj])

      Cmd.run!([
        openssl,
        "x509",
        "-req",
        "-in",
        p.("#{name}.csr"),
        "-CA",
        p.("ca.crt"),
        "-CAkey",
        p.("ca.key"),
        "-CAcreateserial",
        "-out",
        p.("#{name}.crt"),
        "-days",
        "2",
        "-extfile",
        p.("#{name}.ext")
      ])
    end

    leaf.(
      "apiserver",
      "/CN=kube-apiserver",
      "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n"
    )

    leaf.("admin", "/O=system:masters/CN=condukt-admin", "extendedKeyUsage=clientAuth\n")

    # The service-account token signing key pair.
    Cmd.run!([openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", p.("sa.key")])
    Cmd.run!([openssl, "pkey", "-in", p.("sa.key"), "-pubout", "-out", p.("sa.pub")])

    %{c | admin: %{cert: p.("admin.crt"), key: p.("admin.key")}}
  end

  # --- processes ------------------------------------------------------------

  defp start_etcd!(c) do
    [client, peer] = free_ports(2)
    data = Path.join(c.dir, "etcd")

    args = [
      "--name=default",
      "--data-dir=#{data}",
      "--listen-client-urls=http://127.0.0.1:#{client}",
      "--advertise-client-urls=http://127.0.0.1:#{client}",
      "--listen-peer-urls=http://127.0.0.1:#{peer}",
      "--initial-advertise-peer-urls=http://127.0.0.1:#{peer}",
      "--initial-cluster=default=http://127.0.0.1:#{peer}",
      "--listen-metrics-urls=",
      "--unsafe-no-fsync",
      "--log-level=warn"
    ]

    c = spawn!(c, :etcd, [bin(c, "etcd") | args])
    c = %{c | ports: %{etcd: client}}

    wait!(c, :etcd, fn ->
      match?(
        {~s({"health":"true") <> _, 0},
        Cmd.run([Tier.tool!("curl"), "-s", "--max-time", "2", "http://127.0.0.1:#{client}/health"], timeout: 5_000)
      )
    end)

    c
  end

  defp start_apiserver!(c) do
    [port] = free_ports(1)
    p = &Path.join([c.dir, "pki", &1])

    args = [
      "--etcd-servers=http://127.0.0.1:#{c.ports.etcd}",
      "--bind-address=127.0.0.1",
      "--advertise-address=127.0.0.1",
      "--secure-port=#{port}",
      "--cert-dir=#{Path.join(c.dir, "apiserver")}",
      "--tls-cert-file=#{p.("apiserver.crt")}",
      "--tls-private-key-file=#{p.("apiserver.key")}",
      "--client-ca-file=#{p.("ca.crt")}",
      "--service-account-issuer=https://kubernetes.default.svc",
      "--api-audiences=https://kubernetes.default.svc",
      "--service-account-key-file=#{p.("sa.pub")}",
      "--service-account-signing-key-file=#{p.("sa.key")}",
      "--service-cluster-ip-range=10.96.0.0/24",
      "--authorization-mode=RBAC",
      "--allow-privileged=true",
      # The API server's client certificate towards the kubelet for exec,
      # attach, port-forward and logs.
      "--kubelet-client-certificate=#{p.("admin.crt")}",
      "--kubelet-client-key=#{p.("admin.key")}",
      "--kubelet-preferred-address-types=#{c.kubelet_address_types}",
      "--profiling=false",
      "--v=1"
    ]

    c = spawn!(c, :"kube-apiserver", [bin(c, "kube-apiserver") | args])
    c = %{c | server: "https://127.0.0.1:#{port}", ports: Map.put(c.ports, :apiserver, port)}

    wait!(c, :"kube-apiserver", fn ->
      match?({200, "ok"}, request(c, :admin, "GET", "/readyz"))
    end)

    write_kubeconfig(c, "admin.kubeconfig", %{cert: c.admin.cert, key: c.admin.key})
    c
  end

  defp start_controllers!(c) do
    admin = Path.join(c.dir, "admin.kubeconfig")
    p = &Path.join([c.dir, "pki", &1])

    c =
      if File.exists?(bin(c, "kube-scheduler")) do
        spawn!(c, :"kube-scheduler", [
          bin(c, "kube-scheduler"),
          "--kubeconfig=#{admin}",
          "--authentication-kubeconfig=#{admin}",
          "--authorization-kubeconfig=#{admin}",
          "--leader-elect=false",
          "--bind-address=127.0.0.1",
          "--secure-port=#{hd(free_ports(1))}"
        ])
      else
        c
      end

    if File.exists?(bin(c, "kube-controller-manager")) do
      spawn!(c, :"kube-controller-manager", [
        bin(c, "kube-controller-manager"),
        "--kubeconfig=#{admin}",
        "--authentication-kubeconfig=#{admin}",
        "--authorization-kubeconfig=#{admin}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        "--secure-port=#{hd(free_ports(1))}",
        "--controllers=garbagecollector,namespace,serviceaccount,root-ca-cert-publisher,endpointslice",
        "--service-account-private-key-file=#{p.("sa.key")}",
        "--root-ca-file=#{p.("ca.crt")}",
        "--use-service-account-credentials=false"
      ])
    else
      c
    end
  end

  @doc """
  Starts a detached process (its own session, output to `log`) and
  records it in the cluster's pids file, so `stop/1` kills it even when
  its owner did not. Returns the OS pid.
  """
  @spec spawn_recorded!(t(), String.t(), [String.t()], Path.t()) :: pos_integer()
  def spawn_recorded!(%__MODULE__{dir: dir}, name, argv, log) do
    pid = Cmd.spawn_daemon(argv, log)
    File.write!(Path.join(dir, "pids"), "#{name} #{pid}\n", [:append])
    pid
  end

  @doc "Whether node `name` reports the Ready condition."
  @spec node_ready?(t(), String.t()) :: boolean()
  def node_ready?(c, name) do
    case request(c, :admin, "GET", "/api/v1/nodes/#{name}") do
      {200, %{"status" => %{"conditions" => conds}}} ->
        Enum.any?(conds, &match?(%{"type" => "Ready", "status" => "True"}, &1))

      _ ->
        false
    end
  end

  @doc "Removes every taint of node `name` (the not-ready taint admission put there)."
  @spec untaint_node!(t(), String.t()) :: map()
  def untaint_node!(c, name) do
    request!(c, :admin, "PATCH", "/api/v1/nodes/#{name}", %{spec: %{taints: :null}},
      content_type: "application/merge-patch+json"
    )
  end

  # --- objects --------------------------------------------------------------

  defp bootstrap!(c, rules) do
    ns = c.namespace
    sa = c.service_account

    for name <- [ns, c.other_namespace] do
      request!(c, :admin, "POST", "/api/v1/namespaces", %{apiVersion: "v1", kind: "Namespace", metadata: %{name: name}})
      # The ServiceAccount admission plugin wants `default` before any pod;
      # the controller manager makes it too, but may not have yet.
      create_ignoring_conflict(c, "/api/v1/namespaces/#{name}/serviceaccounts", %{metadata: %{name: "default"}})
    end

    request!(c, :admin, "POST", "/api/v1/namespaces/#{c.other_namespace}/secrets", %{
      apiVersion: "v1",
      kind: "Secret",
      metadata: %{name: "not-yours"},
      stringData: %{"token" => "secret"}
    })

    request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: sa}})

    request!(c, :admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/roles", %{
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "Role",
      metadata: %{name: "condukt-sandbox"},
      rules: rules
    })

    request!(c, :admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/rolebindings", %{
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "RoleBinding",
      metadata: %{name: "condukt-sandbox"},
      subjects: [%{kind: "ServiceAccount", name: sa, namespace: ns}],
      roleRef: %{kind: "Role", name: "condukt-sandbox", apiGroup: "rbac.authorization.k8s.io"}
    })

    %{"status" => %{"token" => token}} =
      request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts/#{sa}/token", %{
        apiVersion: "authentication.k8s.io/v1",
        kind: "TokenRequest",
        spec: %{audiences: ["https://kubernetes.default.svc"], expirationSeconds: 7200}
      })

    c = %{c | token: token}
    %{c | kubeconfig: write_kubeconfig(c, "sa.kubeconfig", %{token: token})}
  end

  @doc """
  A token of a new ServiceAccount `name` in `ns`, bound by a Role and a
  RoleBinding of the same name to exactly `rules`: how the tests act as a
  user with a given grant.
  """
  @spec bound_token!(t(), String.t(), String.t(), [map()]) :: String.t()
  def bound_token!(c, ns, name, rules) do
    request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts", %{metadata: %{name: name}})

    request!(c, :admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/roles", %{
      metadata: %{name: name},
      rules: rules
    })

    request!(c, :admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/rolebindings", %{
      metadata: %{name: name},
      subjects: [%{kind: "ServiceAccount", name: name, namespace: ns}],
      roleRef: %{kind: "Role", name: name, apiGroup: "rbac.authorization.k8s.io"}
    })

    %{"status" => %{"token" => token}} =
      request!(c, :admin, "POST", "/api/v1/namespaces/#{ns}/serviceaccounts/#{name}/token", %{
        spec: %{audiences: ["https://kubernetes.default.svc"], expirationSeconds: 600}
      })

    token
  end

  defp create_ignoring_conflict(c, path, body) do
    case request(c, :admin, "POST", path, body) do
      {code, _} when code in [200, 201, 409] -> :ok
      {code, body} -> raise "POST #{path}: HTTP #{code}: #{inspect(body)}"
    end
  end

  defp write_kubeconfig(c, name, user) do
    ca = c |> ca() |> File.read!() |> Base.encode64()

    user_yaml =
      case user do
        %{token: t} -> "    token: #{t}\n"
        %{cert: cert, key: key} -> "    client-certificate: #{cert}\n    client-key: #{key}\n"
      end

    path = Path.join(c.dir, name)

    File.write!(path, """
    apiVersion: v1
    kind: Config
    clusters:
    - name: condukt-test
      cluster:
        server: #{c.server}
        certificate-authority-data: #{ca}
    users:
    - name: condukt-test-user
      user:
    #{user_yaml}contexts:
    - name: condukt-test
      context:
        cluster: condukt-test
        user: condukt-test-user
        namespace: #{c.namespace}
    current-context: condukt-test
    """)

    path
  end

  # --- helpers --------------------------------------------------------------

  defp maybe(c, true, fun), do: fun.(c)
  defp maybe(c, _, _fun), do: c

  defp bin(c, name), do: Path.join(c.bin_dir, name)

  defp spawn!(c, name, argv) do
    log = Path.join([c.dir, "log", "#{name}.log"])
    pid = Cmd.spawn_daemon(argv, log)
    File.write!(Path.join(c.dir, "pids"), "#{name} #{pid}\n", [:append])
    %{c | pids: Map.put(c.pids, name, pid)}
  end

  defp wait!(c, name, fun) do
    pid = Map.fetch!(c.pids, name)

    case Cmd.poll(fn -> (not Cmd.alive?(pid) and :dead) || fun.() end, @start_timeout, 200) do
      :ok ->
        if Cmd.alive?(pid), do: :ok, else: raise("#{name} exited:\n#{tail_log(c, name)}")

      {:error, :timeout} ->
        raise "#{name} not ready after #{@start_timeout} ms:\n#{tail_log(c, name)}"
    end
  end

  defp tail_log(c, name) do
    case File.read(Path.join([c.dir, "log", "#{name}.log"])) do
      {:ok, text} -> text |> String.split("\n") |> Enum.take(-40) |> Enum.join("\n")
      _ -> "(no log)"
    end
  end

  @doc "`n` TCP ports free on 127.0.0.1 right now."
  @spec free_ports(pos_integer()) :: [pos_integer()]
  def free_ports(n) do
    socks =
      for _ <- 1..n do
        {:ok, s} = :gen_tcp.listen(0, ip: {127, 0, 0, 1}, reuseaddr: true)
        s
      end

    ports = Enum.map(socks, fn s -> elem(:inet.port(s), 1) end)
    Enum.each(socks, &:gen_tcp.close/1)
    ports
  end

  defp split_status(out) do
    case :binary.matches(out, "\n") do
      [] ->
        {"", String.to_integer(String.trim(out))}

      matches ->
        {pos, 1} = List.last(matches)

        {binary_part(out, 0, pos),
         out |> binary_part(pos + 1, byte_size(out) - pos - 1) |> String.trim() |> String.to_integer()}
    end
  end
end
