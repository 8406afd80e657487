defmodule Condukt.K8s.ClusterSmokeTest do
  # The foundation of the Kubernetes tier (docs/k8s-tier.md): a real
  # kube-apiserver with etcd and the controllers starts and stops, and the
  # tests' identity is a ServiceAccount bound to exactly the documented
  # Role. API only: no node (pods run in real_node_test.exs).
  use Condukt.Test.K8s.Case, async: false

  setup_all do
    %{cluster: Cluster.start()}
  end

  defp pod(name) do
    %{
      apiVersion: "v1",
      kind: "Pod",
      metadata: %{name: name, labels: %{"app.kubernetes.io/managed-by" => "condukt"}},
      spec: %{
        automountServiceAccountToken: false,
        containers: [%{name: "workspace", image: "debian:bookworm-slim", command: ["sleep", "infinity"]}]
      }
    }
  end

  test "the ServiceAccount creates a pod, lists it by label and deletes it", %{cluster: c} do
    ns = c.namespace

    assert {201, %{"metadata" => %{"name" => "smoke"}}} =
             Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{ns}/pods", pod("smoke"))

    # No node: the scheduler cannot place it.
    assert {200, %{"status" => %{"phase" => "Pending"}}} =
             Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{ns}/pods/smoke")

    assert {200, %{"items" => [_]}} =
             Cluster.request(
               c,
               :sa,
               "GET",
               "/api/v1/namespaces/#{ns}/pods?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dcondukt"
             )

    assert {200, _} = Cluster.request(c, :sa, "DELETE", "/api/v1/namespaces/#{ns}/pods/smoke")

    assert :ok =
             Cluster.wait_until(fn ->
               match?({404, _}, Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{ns}/pods/smoke"))
             end)
  end

  test "the ServiceAccount can do exactly what the Role grants", %{cluster: c} do
    ns = c.namespace
    other = c.other_namespace

    # Granted by the Role (docs/kubernetes.md, RBAC).
    secret = %{apiVersion: "v1", kind: "Secret", metadata: %{name: "mine"}, stringData: %{"k" => "v"}}
    assert {201, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{ns}/secrets", secret)
    assert {200, _} = Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{ns}/secrets/mine")
    assert {200, _} = Cluster.request(c, :sa, "DELETE", "/api/v1/namespaces/#{ns}/secrets/mine")

    # Nothing in another namespace.
    assert {403, %{"reason" => "Forbidden"}} = Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{other}/secrets")
    assert {403, _} = Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{other}/secrets/not-yours")
    assert {403, _} = Cluster.request(c, :sa, "POST", "/api/v1/namespaces/#{other}/pods", pod("elsewhere"))

    # Outside the Role in its own namespace: secrets are not deletable as
    # a collection, pods not watchable, no services, no role changes, no nodes.
    assert {200, _} = Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{ns}/secrets")
    assert {403, %{"message" => msg}} = Cluster.request(c, :sa, "DELETE", "/api/v1/namespaces/#{ns}/secrets")
    assert msg =~ ~s(cannot deletecollection resource "secrets")
    assert {403, _} = Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{ns}/pods?watch=1&timeoutSeconds=1")
    assert {403, _} = Cluster.request(c, :sa, "GET", "/api/v1/namespaces/#{ns}/services")
    assert {403, _} = Cluster.request(c, :sa, "GET", "/apis/rbac.authorization.k8s.io/v1/namespaces/#{ns}/roles")
    assert {403, _} = Cluster.request(c, :sa, "GET", "/api/v1/nodes")
  end

  test "the kubeconfig names the cluster, its CA and the ServiceAccount's token", %{cluster: c} do
    text = File.read!(c.kubeconfig)
    assert text =~ "server: #{c.server}"
    assert text =~ "certificate-authority-data: "
    assert text =~ "token: #{c.token}"
  end
end
