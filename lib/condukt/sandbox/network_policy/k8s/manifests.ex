defmodule Condukt.Sandbox.NetworkPolicy.K8s.Manifests do
  @moduledoc """
  The Kubernetes objects the network policy adds to a sandbox pod
  (docs/kubernetes.md, "Objects" and "Pod"), as plain maps ready to be
  sent as JSON: the sidecar's Secret, the trust Secret (the session
  certificate), the NetworkPolicy, and the pod's init containers
  (`condukt-netfilter`, `condukt-trust`, which writes the workspace's
  trust bundle and the JVM's trust store from the image's roots, and the
  `condukt-egress` sidecar),
  volumes, mounts and CA environment.

  `default_image/0` is the sidecar image matching this library's version
  (`ghcr.io/tuist/condukt-egress:<version>`); `Condukt.Sandbox.Kubernetes`
  takes another with `:network_policy_image`.
  """

  alias Condukt.Sandbox.NetworkPolicy

  @version Mix.Project.config()[:version]
  @binary "/usr/local/bin/condukt-egress"
  @egress_dir "/etc/condukt-egress"
  @state_dir "/run/condukt-egress"
  @trust_dir "/etc/condukt"
  @proxy_port 15_001
  @control_port 15_002
  @mark "0x539"
  @sidecar_uid 1337
  @dns_port 15_053
  @listen ["127.0.0.1:#{@proxy_port}", "[::1]:#{@proxy_port}"]

  @doc "`ghcr.io/tuist/condukt-egress:<library version>`."
  @spec default_image() :: String.t()
  def default_image, do: "ghcr.io/tuist/condukt-egress:#{@version}"

  @doc "The sidecar's control port inside the pod (loopback only)."
  @spec control_port() :: 15_002
  def control_port, do: @control_port

  # Enough for the proxy under a steady agent's traffic (it holds a few
  # MiB per connection at most); small enough that a LimitRange or a
  # ResourceQuota that requires requests and limits admits the pod. The
  # init containers run for milliseconds.
  @sidecar_resources %{requests: %{cpu: "50m", memory: "32Mi"}, limits: %{cpu: "1", memory: "256Mi"}}
  @init_resources %{requests: %{cpu: "10m", memory: "16Mi"}, limits: %{cpu: "100m", memory: "64Mi"}}

  @doc "The sidecar container's default `resources`."
  @spec default_sidecar_resources() :: map()
  def default_sidecar_resources, do: @sidecar_resources

  @doc "The default `resources` of the init containers that run to completion."
  @spec default_init_resources() :: map()
  def default_init_resources, do: @init_resources

  @doc "The sidecar's group: the pod-level `fsGroup` of the egress Secret."
  @spec sidecar_uid() :: 1337
  def sidecar_uid, do: @sidecar_uid

  @typedoc """
  What the objects are made from: the pod's name and namespace, the
  selector labels, the session id, and the session's CA, token and policy.
  """
  @type params :: %{
          required(:pod) => String.t(),
          required(:namespace) => String.t(),
          required(:labels) => %{String.t() => String.t()},
          optional(:session_id) => String.t(),
          optional(:image) => String.t(),
          optional(:ca_cert_pem) => String.t(),
          optional(:ca_key_pem) => String.t(),
          optional(:token) => String.t(),
          optional(:policy_json) => String.t(),
          optional(:credentials_json) => String.t() | nil,
          optional(:upstream_ca) => String.t() | nil,
          optional(:allow_private) => [String.t()],
          optional(:host_aliases) => [map()],
          optional(:sidecar_resources) => map() | nil,
          optional(:init_resources) => map() | nil,
          optional(:proxy_args) => [String.t()]
        }

  @doc """
  Secret `<pod>-egress`: the sidecar's CA, key, token and policy, its
  own hosts file (the pod's `hostAliases`) and, with credentials, their
  secrets (`credentials.json`); only the sidecar mounts it.
  """
  @spec egress_secret(params()) :: map()
  def egress_secret(p) do
    data =
      %{
        "ca.pem" => p.ca_cert_pem,
        "ca.key" => p.ca_key_pem,
        "token" => p.token,
        "policy.json" => p.policy_json,
        "hosts" => hosts_file(p[:host_aliases] || [])
      }
      |> then(fn d -> if p[:upstream_ca], do: Map.put(d, "upstream-ca.pem", p.upstream_ca), else: d end)
      |> then(fn d -> if p[:credentials_json], do: Map.put(d, "credentials.json", p.credentials_json), else: d end)

    secret(p.pod <> "-egress", p, data)
  end

  @doc """
  The sidecar's hosts file (hosts(5)): the pod's `hostAliases`, which the
  kubelet also writes into the pod's shared /etc/hosts. The proxy reads
  this copy (`proxy --hosts`, docs/dns.md): the workspace can rewrite the
  shared file, never the Secret.
  """
  @spec hosts_file([map()]) :: String.t()
  def hosts_file(aliases) do
    lines =
      for a <- aliases,
          m = Map.new(a),
          names = m[:hostnames] || m["hostnames"] || [],
          names != [],
          do: "#{m[:ip] || m["ip"]} #{Enum.join(names, " ")}\n"

    "127.0.0.1 localhost\n::1 localhost\n" <> Enum.join(lines)
  end

  @doc """
  Secret `<pod>-trust`: the session CA certificate only. The PEM trust
  bundle and the JVM's PKCS#12 trust store (the Mozilla roots + the
  session CA) are not stored: the `condukt-trust` init container writes
  both into the pod from the sidecar image's roots.
  """
  @spec trust_secret(params()) :: map()
  def trust_secret(p) do
    secret(p.pod <> "-trust", p, %{"ca.pem" => p.ca_cert_pem})
  end

  defp secret(name, p, data) do
    %{
      "apiVersion" => "v1",
      "kind" => "Secret",
      "type" => "Opaque",
      "metadata" => %{"name" => name, "namespace" => p.namespace, "labels" => p.labels},
      "data" => Map.new(data, fn {k, v} -> {k, Base.encode64(v)} end)
    }
  end

  @doc """
  NetworkPolicy `<pod>-egress`: no ingress at all; egress only to DNS
  (UDP and TCP 53) and TCP 80 and 443.
  """
  @spec network_policy(params()) :: map()
  def network_policy(p) do
    %{
      "apiVersion" => "networking.k8s.io/v1",
      "kind" => "NetworkPolicy",
      "metadata" => %{"name" => p.pod <> "-egress", "namespace" => p.namespace, "labels" => p.labels},
      "spec" => %{
        "podSelector" => %{"matchLabels" => Map.take(p.labels, ["condukt.dev/sandbox"])},
        "policyTypes" => ["Ingress", "Egress"],
        "ingress" => [],
        "egress" => [
          %{
            "ports" => [
              %{"protocol" => "UDP", "port" => 53},
              %{"protocol" => "TCP", "port" => 53},
              %{"protocol" => "TCP", "port" => 80},
              %{"protocol" => "TCP", "port" => 443}
            ]
          }
        ]
      }
    }
  end

  @doc """
  The init containers: `condukt-netfilter` (iptables), `condukt-trust`
  (writes the workspace's trust bundle and the JVM's trust store) and the
  native sidecar
  `condukt-egress`.
  """
  @spec init_containers(params()) :: [map()]
  def init_containers(p) do
    netfilter =
      %{
        "name" => "condukt-netfilter",
        "image" => p.image,
        "command" =>
          [@binary, "netfilter-setup", "--proxy-port", "#{@proxy_port}", "--mark", @mark] ++
            ["--sidecar-uid", "#{@sidecar_uid}", "--dns-port", "#{@dns_port}"],
        "securityContext" => %{
          "runAsUser" => 0,
          "runAsNonRoot" => false,
          "allowPrivilegeEscalation" => false,
          "readOnlyRootFilesystem" => true,
          "capabilities" => %{"drop" => ["ALL"], "add" => ["NET_ADMIN", "NET_RAW"]}
        }
      }
      |> put_resources(Map.get(p, :init_resources, @init_resources))

    # Runs as the sidecar's uid, without any capability, on a read-only
    # root: it reads the image's roots and the session certificate, and
    # writes two files into the emptyDir the workspace mounts read-only.
    trust =
      %{
        "name" => "condukt-trust",
        "image" => p.image,
        # ca.pem and ca-certificates.crt = the image's Mozilla roots (next
        # to the binary's real path, as the proxy finds them) + the session
        # CA; the image has no shell.
        "command" => [
          @binary,
          "ca",
          "bundle",
          "--ca-cert",
          "/etc/condukt-session-ca/ca.pem",
          "--out-dir",
          @trust_dir
        ],
        "securityContext" => %{
          "runAsUser" => @sidecar_uid,
          "runAsGroup" => @sidecar_uid,
          "runAsNonRoot" => true,
          "allowPrivilegeEscalation" => false,
          "readOnlyRootFilesystem" => true,
          "capabilities" => %{"drop" => ["ALL"]},
          "seccompProfile" => %{"type" => "RuntimeDefault"}
        },
        "volumeMounts" => [
          %{"name" => "condukt-session-ca", "mountPath" => "/etc/condukt-session-ca", "readOnly" => true},
          %{"name" => "condukt-trust", "mountPath" => @trust_dir}
        ]
      }
      |> put_resources(Map.get(p, :init_resources, @init_resources))

    upstream = if p[:upstream_ca], do: ["--upstream-extra-ca", "#{@egress_dir}/upstream-ca.pem"], else: []
    private = Enum.flat_map(p[:allow_private] || [], &["--allow-private", &1])
    credentials = if p[:credentials_json], do: ["--credentials", "#{@egress_dir}/credentials.json"], else: []

    sidecar =
      %{
        "name" => "condukt-egress",
        "image" => p.image,
        "restartPolicy" => "Always",
        "command" =>
          [
            @binary,
            "proxy",
            "--policy",
            "#{@egress_dir}/policy.json",
            "--ca-cert",
            "#{@egress_dir}/ca.pem",
            "--ca-key",
            "#{@egress_dir}/ca.key",
            "--token-file",
            "#{@egress_dir}/token",
            "--session-id",
            p.session_id,
            "--control",
            "127.0.0.1:#{@control_port}",
            "--mark",
            @mark,
            "--user",
            "#{@sidecar_uid}",
            # Its own names, never the pod's shared /etc/hosts (docs/dns.md);
            # its resolvers are those of /etc/resolv.conf as the kubelet
            # wrote it, read when it first starts, before the workspace.
            "--hosts",
            "#{@egress_dir}/hosts",
            # The resolvers of its first start, kept where only it can write
            # and a restart of its container finds them (docs/dns.md).
            "--dns-state",
            "#{@state_dir}/resolvers"
          ] ++ listen_args() ++ upstream ++ private ++ credentials ++ Map.get(p, :proxy_args, []),
        # The kubelet starts the workspace once this succeeds, not once the
        # sidecar's process started: until the proxy listens, the
        # workspace's REDIRECTed connections would be refused. exec, not
        # tcpSocket: the proxy listens on loopback only and the kubelet
        # probes from the node's network namespace. `ready` connects to the
        # same --listen addresses (the proxy starts its control channel
        # before them) and closes; the proxy logs that at debug level only.
        "startupProbe" => %{
          "exec" => %{"command" => [@binary, "ready" | listen_args()]},
          "periodSeconds" => 1,
          "timeoutSeconds" => 1,
          "failureThreshold" => 30
        },
        # Started as uid 0 with NET_ADMIN, SETUID and SETGID, the proxy
        # reads its files and then becomes uid 1337 keeping NET_ADMIN alone
        # (`--user`, docs/netfilter.md, "The exemption"): runtimes give a
        # non-root process no ambient capabilities, and no_new_privs rules
        # out file capabilities, so this is the one way to hold SO_MARK's
        # capability as the uid the rules exempt.
        "securityContext" => %{
          "runAsUser" => 0,
          "runAsGroup" => @sidecar_uid,
          "runAsNonRoot" => false,
          "allowPrivilegeEscalation" => false,
          "readOnlyRootFilesystem" => true,
          "capabilities" => %{"drop" => ["ALL"], "add" => ["NET_ADMIN", "SETUID", "SETGID"]}
        },
        "volumeMounts" => [
          %{"name" => "condukt-egress", "mountPath" => @egress_dir, "readOnly" => true},
          %{"name" => "condukt-egress-state", "mountPath" => @state_dir}
        ]
      }
      |> put_resources(Map.get(p, :sidecar_resources, @sidecar_resources))

    [netfilter, trust, sidecar]
  end

  defp put_resources(container, nil), do: container
  defp put_resources(container, r), do: Map.put(container, "resources", Condukt.Sandbox.Kubernetes.Manifest.to_k8s(r))

  defp listen_args, do: Enum.flat_map(@listen, &["--listen", &1])

  @doc """
  The pod volumes: the two Secrets (the egress one group-readable only,
  0440), `condukt-trust`, the emptyDir the `condukt-trust` init
  container fills and the workspace mounts, and the sidecar's own state
  directory (an emptyDir only the sidecar mounts: it outlives a restart of
  the sidecar's container).
  """
  @spec volumes(params()) :: [map()]
  def volumes(p) do
    [
      %{"name" => "condukt-egress", "secret" => %{"secretName" => p.pod <> "-egress", "defaultMode" => 0o440}},
      %{"name" => "condukt-session-ca", "secret" => %{"secretName" => p.pod <> "-trust", "defaultMode" => 0o444}},
      %{"name" => "condukt-trust", "emptyDir" => %{"sizeLimit" => "2Mi"}},
      %{"name" => "condukt-egress-state", "emptyDir" => %{"medium" => "Memory", "sizeLimit" => "1Mi"}}
    ]
  end

  @doc """
  The workspace container's read-only mounts of the trust files:
  `/etc/condukt` (`ca.pem`, `ca-certificates.crt`, `trust-store.p12`), and
  the bundle over the two system trust-store paths (subPath).
  """
  @spec workspace_mounts() :: [map()]
  def workspace_mounts do
    [
      %{"name" => "condukt-trust", "mountPath" => @trust_dir, "readOnly" => true},
      %{
        "name" => "condukt-trust",
        "mountPath" => "/etc/ssl/certs/ca-certificates.crt",
        "subPath" => "ca-certificates.crt",
        "readOnly" => true
      },
      %{
        "name" => "condukt-trust",
        "mountPath" => "/etc/ssl/cert.pem",
        "subPath" => "ca-certificates.crt",
        "readOnly" => true
      }
    ]
  end

  @doc "The six CA variables (`Condukt.Sandbox.NetworkPolicy.ca_env/1`), pointed at `/etc/condukt/ca.pem`, as pod `env` entries."
  @spec ca_env() :: [map()]
  def ca_env, do: Enum.map(NetworkPolicy.ca_env("#{@trust_dir}/ca.pem"), fn {k, v} -> %{"name" => k, "value" => v} end)

  @doc """
  The other stacks' variables (`Condukt.Sandbox.NetworkPolicy.TrustStore.env/3`):
  `JAVA_TOOL_OPTIONS` naming `/etc/condukt/trust-store.p12`, merged with
  the operator's `java_tool_options` (or `nil`), and the PEM variables
  naming `/etc/condukt/ca.pem`, as pod `env` entries.
  """
  @spec trust_env(String.t() | nil) :: [map()]
  def trust_env(java_tool_options \\ nil) do
    "#{@trust_dir}/ca.pem"
    |> NetworkPolicy.TrustStore.env("#{@trust_dir}/#{NetworkPolicy.TrustStore.file_name()}", java_tool_options)
    |> Enum.map(fn {k, v} -> %{"name" => k, "value" => v} end)
  end

  @doc "A merge patch that makes `obj` owned (not controlled) by the pod, for the garbage collector."
  @spec owner_patch(String.t(), String.t()) :: map()
  def owner_patch(pod_name, pod_uid) do
    %{
      "metadata" => %{
        "ownerReferences" => [
          %{
            "apiVersion" => "v1",
            "kind" => "Pod",
            "name" => pod_name,
            "uid" => pod_uid,
            "controller" => false,
            "blockOwnerDeletion" => false
          }
        ]
      }
    }
  end
end
