defmodule Condukt.Test.K8s.Case do
  @moduledoc """
  `use Condukt.Test.K8s.Case` in a `:kubernetes` tier module: tags it,
  gives it a generous timeout, and marks every test skipped with the
  tier's reason when this machine cannot run the tier (test_helper.exs
  has printed the reason, or failed the run under
  CONDUKT_REQUIRE_ALL_TIERS=1); the skip matters for `mix test --only
  kubernetes`, whose include overrides the exclusion.

  `use Condukt.Test.K8s.Case, node: true` is for tests whose pods must
  really run, on the real node (`start_node_tier!/1`): it also tags the
  module `:netns` and skips it with the netns tier's reason (root, nginx,
  ...) when that tier cannot run, or with the node's
  (`Condukt.Test.K8s.Node.skip_reason/0`: containerd, runc, the CNI
  plugins); under CONDUKT_REQUIRE_ALL_TIERS=1 a machine that cannot run
  the node fails the run instead.
  """
  use ExUnit.CaseTemplate

  alias Condukt.Test.K8s.Cluster
  alias Condukt.Dev.Netns.{Cmd, Testbed}

  using opts do
    node = Keyword.get(opts, :node, false)

    quote do
      @moduletag :kubernetes
      @moduletag timeout: 300_000

      if reason = Condukt.Test.K8s.Tier.skip_reason() do
        @moduletag skip: "kubernetes tier: " <> reason
      end

      if unquote(node) do
        @moduletag :netns

        if reason = Condukt.Dev.Netns.Tier.skip_reason() do
          @moduletag skip: "kubernetes tier (real pods need the netns tier): " <> reason
        end
      end

      if unquote(node) do
        if reason = Condukt.Test.K8s.Node.skip_reason() do
          if System.get_env("CONDUKT_REQUIRE_ALL_TIERS") == "1" and is_nil(Condukt.Test.K8s.Tier.skip_reason()) do
            raise "the real Kubernetes node is required (CONDUKT_REQUIRE_ALL_TIERS=1) but cannot run: " <> reason
          end

          @moduletag skip: "kubernetes tier (real node): " <> reason
        end
      end

      alias Condukt.Test.K8s.Cluster
    end
  end

  @typedoc """
  What `start_node_tier!/1` returns:

    * `:cluster` — the `Cluster` (API server, controllers, RBAC; its
      `kubeconfig`, `token`, `namespace` are the ServiceAccount's, bound
      to `Cluster.contract_role_rules/0`); the namespace enforces the Pod
      Security level `privileged`, as the user guide asks for sandboxes
      with a network policy;
    * `:node` — the real node (`Condukt.Test.K8s.Node`);
    * `:testbed` — the netns `Testbed` (nginx, the git server and friends
      in "inet", the pods' outside network);
    * `:upstream_ca_pem` — the testbed's root CA (PEM): pass it as
      `network_policy_upstream_ca` so the sidecar trusts nginx;
    * `:host_aliases` — the pod `hostAliases` mapping the testbed's names
      (allowed.test, denied.test, decide.test, other.test, ws.test,
      git.test) to its "inet" IPv4 address, for a test that must not
      depend on DNS (cluster DNS resolves them too);
    * `:allow_private` — the CIDRs to give the sidecar as
      `--allow-private` (the testbed's addresses are private);
    * `:egress_image` — the sidecar image's name, as imported into the
      node (`Manifests.default_image/0`'s).
  """
  @type node_tier :: %{
          cluster: Cluster.t(),
          node: Condukt.Test.K8s.Node.t(),
          testbed: Testbed.t(),
          upstream_ca_pem: String.t(),
          host_aliases: [map()],
          allow_private: [String.t()],
          egress_image: String.t()
        }

  @doc """
  Starts a netns testbed, a cluster whose ServiceAccount has the
  contract's Role, and a real node (kubelet, containerd, CNI,
  kube-router, kube-proxy, CoreDNS) in the testbed's pod namespace, with
  the images of scripts/k8s/images.sh (built on first use) imported
  (docs/k8s-tier.md, "The real node"). Call it from `setup_all`;
  everything stops on exit.
  """
  @spec start_node_tier!(keyword()) :: node_tier()
  def start_node_tier!(opts \\ []) do
    script = Path.expand("../../../scripts/k8s/images.sh", __DIR__)
    {out, status} = Cmd.run(["sh", script], timeout: 1_800_000, stderr: :stdout)
    if status != 0, do: raise("scripts/k8s/images.sh failed:\n#{out}")
    dir = out |> String.split("\n", trim: true) |> List.last()
    images = for f <- ~w(pause workspace workspace-tools condukt-egress), do: Path.join(dir, "#{f}.oci.tar")

    tb = Testbed.start(Keyword.get(opts, :testbed, big_size: 1024 * 1024))

    c =
      Cluster.start(
        role_rules: Keyword.get(opts, :role_rules, Cluster.contract_role_rules()),
        kubelet_address_types: Condukt.Test.K8s.Node.kubelet_address_types()
      )

    Cluster.request!(
      c,
      :admin,
      "PATCH",
      "/api/v1/namespaces/#{c.namespace}",
      %{metadata: %{labels: %{"pod-security.kubernetes.io/enforce" => "privileged"}}},
      content_type: "application/merge-patch+json"
    )

    node = Condukt.Test.K8s.Node.start(c, tb.pod_ns, tb.pod.v4, images, upstream_hosts: v4_hosts(tb))

    %{
      cluster: c,
      node: node,
      testbed: tb,
      upstream_ca_pem: File.read!(tb.ca_cert),
      host_aliases: [%{"ip" => tb.inet.v4, "hostnames" => Testbed.names()}],
      allow_private: [String.replace(tb.inet.v4, ~r/\.\d+$/, ".0/24"), tb.inet.v6 <> "/128"],
      egress_image: "ghcr.io/tuist/condukt-egress:#{Application.spec(:condukt, :vsn)}"
    }
  end

  # The "internet" has no DNS server: its names are in the testbed's hosts
  # file, which cluster DNS serves in its stead (IPv4 only: the pod network
  # is IPv4).
  defp v4_hosts(tb) do
    path = Path.join(tb.dir, "hosts.v4")
    text = File.read!(Path.join(["/etc/netns", tb.pod_ns, "hosts"]))
    File.write!(path, text |> String.split("\n") |> Enum.reject(&String.contains?(&1, ":")) |> Enum.join("\n"))
    path
  end
end
