defmodule Condukt.Kube.UnitTest do
  # Condukt.Kube without a server: the resolution order, paths, and the
  # errors made from a Status.
  use ExUnit.Case, async: true

  alias Condukt.Kube
  alias Condukt.Kube.{Conn, Error}

  doctest Condukt.Kube

  describe "source/2: the seeds' resolution order" do
    test ":conn wins over everything" do
      env = %{"KUBERNETES_SERVICE_HOST" => "10.0.0.1", "KUBECONFIG" => "/a"}

      assert {:ok, %{source: :explicit, server: "https://k:6443", token: "t"}} =
               Kube.source([conn: [server: "https://k:6443", token: "t"], kubeconfig: "/x", in_cluster: true], env)

      assert {:ok, %{source: :explicit, insecure: true}} =
               Kube.source([conn: %Conn{server: "https://k", insecure: true}], env)

      assert {:ok, src} = Kube.source([conn: %{server: "https://k", ca_pem: "CA"}], env)
      assert src == %{source: :explicit, server: "https://k", ca_pem: "CA"}
    end

    test "a bad :conn names the field" do
      assert {:error, %Error{reason: :config} = e} = Kube.source([conn: [server: "https://k", tokn: "x"]], %{})
      assert Exception.message(e) =~ ":tokn"
      assert {:error, %Error{} = e} = Kube.source([conn: [token: "x"]], %{})
      assert Exception.message(e) =~ ":server is required"
      assert {:error, %Error{} = e} = Kube.source([conn: [server: "k8s:6443"]], %{})
      assert Exception.message(e) =~ "https://"
      assert {:error, %Error{} = e} = Kube.source([conn: [server: "https://k", client_cert_pem: "C"]], %{})
      assert Exception.message(e) =~ "go together"
    end

    test "in-cluster when KUBERNETES_SERVICE_HOST is set or in_cluster: true" do
      assert {:ok, %{source: :in_cluster}} = Kube.source([], %{"KUBERNETES_SERVICE_HOST" => "10.0.0.1"})
      assert {:ok, %{source: :in_cluster}} = Kube.source([in_cluster: true], %{})

      assert {:ok, %{source: :kubeconfig}} =
               Kube.source([in_cluster: false], %{"KUBERNETES_SERVICE_HOST" => "10.0.0.1", "HOME" => "/h"})

      # an explicit kubeconfig beats auto-detection
      assert {:ok, %{source: :kubeconfig, paths: ["/k"]}} =
               Kube.source([kubeconfig: "/k"], %{"KUBERNETES_SERVICE_HOST" => "10.0.0.1"})
    end

    test "kubeconfig: the option, else $KUBECONFIG (a colon list), else ~/.kube/config" do
      assert {:ok, %{paths: ["/x"], context: "prod"}} =
               Kube.source([kubeconfig: "/x", context: "prod"], %{"KUBECONFIG" => "/a"})

      assert {:ok, %{paths: ["/x", "/y"]}} = Kube.source([kubeconfig: ["/x", "/y"]], %{})
      assert {:ok, %{paths: ["/a", "/b"]} = src} = Kube.source([], %{"KUBECONFIG" => "/a::/b:"})
      refute Map.has_key?(src, :context)
      assert {:ok, %{paths: ["/home/u/.kube/config"]}} = Kube.source([], %{"HOME" => "/home/u", "KUBECONFIG" => ""})
    end
  end

  test "paths escape every segment and the query" do
    assert Kube.path(:pods, "agents") == "/api/v1/namespaces/agents/pods"
    assert Kube.path(:pods, "agents", "a/b?c") == "/api/v1/namespaces/agents/pods/a%2Fb%3Fc"
    assert Kube.path(:pods, "agents", "p", subresource: "exec") == "/api/v1/namespaces/agents/pods/p/exec"

    assert Kube.path(:networkpolicies, "agents", nil, query: [labelSelector: "a=b,c=d", x: nil]) ==
             "/apis/networking.k8s.io/v1/namespaces/agents/networkpolicies?labelSelector=a%3Db%2Cc%3Dd"

    assert Kube.selector(%{"b" => "2", "a" => "1"}) == "a=1,b=2"
  end

  describe "errors from a Status" do
    test "403 names the verb, the resource with its subresource, and the namespace" do
      status = %{
        "kind" => "Status",
        "status" => "Failure",
        "reason" => "Forbidden",
        "code" => 403,
        "message" =>
          ~s(pods "p" is forbidden: User "system:serviceaccount:agents:condukt" cannot create resource ) <>
            ~s("pods/portforward" in API group "" in the namespace "agents"),
        "details" => %{"name" => "p", "kind" => "pods"}
      }

      e = Error.from_status(403, status, %{verb: "get", resource: "pods", namespace: "agents", name: "p"})
      assert %Error{reason: :forbidden, verb: "create", resource: "pods/portforward", namespace: "agents"} = e

      assert Exception.message(e) =~
               ~s[forbidden: cannot create pods/portforward in namespace "agents" (grant "create" on "pods/portforward")]

      assert Exception.message(e) =~ "system:serviceaccount:agents:condukt"
    end

    test "403 for an API group resource and without a parsable message" do
      msg =
        ~s(networkpolicies.networking.k8s.io is forbidden: User "u" cannot list resource "networkpolicies" in API group "networking.k8s.io" in the namespace "agents")

      e = Error.from_status(403, %{"kind" => "Status", "message" => msg}, %{})
      assert e.resource == "networkpolicies.networking.k8s.io"
      assert e.verb == "list"

      e = Error.from_status(403, "no", %{verb: "delete", resource: "secrets", namespace: "ns"})
      assert Exception.message(e) =~ ~s[cannot delete secrets in namespace "ns" (grant "delete" on "secrets")]
    end

    test "404, 409, 422 and others" do
      nf = %{
        "kind" => "Status",
        "reason" => "NotFound",
        "message" => ~s(pods "x" not found),
        "details" => %{"name" => "x", "kind" => "pods"}
      }

      e = Error.from_status(404, nf, %{namespace: "agents"})
      assert e.reason == :not_found
      assert Exception.message(e) == ~s(not found: pods "x" in namespace "agents")

      assert %Error{reason: :already_exists} = Error.from_status(409, %{"reason" => "AlreadyExists"})
      assert %Error{reason: :conflict} = Error.from_status(409, %{"reason" => "Conflict"})

      e =
        Error.from_status(422, %{"reason" => "Invalid", "message" => "spec.containers[0].image: Required value"}, %{
          verb: "create",
          resource: "pods",
          name: "p"
        })

      assert e.reason == :invalid
      assert Exception.message(e) =~ "spec.containers[0].image: Required value"
      assert Exception.message(e) =~ "create pods"

      assert %Error{reason: :unauthorized} = Error.from_status(401, "Unauthorized")
      assert %Error{reason: :server_error} = Error.from_status(503, "")
      assert %Error{reason: :gone} = Error.from_status(410, %{})
    end

    test "port errors" do
      ne = %Condukt.Native.Error{
        code: :perm,
        op: :kube_exec,
        message:
          ~s(pods "p" is forbidden: User "u" cannot get resource "pods/exec" in API group "" in the namespace "agents")
      }

      e = Error.from_native(ne, %{verb: "create", resource: "pods/exec", namespace: "agents"})
      assert %Error{reason: :forbidden, verb: "get", resource: "pods/exec"} = e

      assert %Error{reason: :timeout} =
               Error.from_native(%Condukt.Native.Error{code: :timedout, message: "x"}, %{verb: "get"})

      assert %Error{reason: :unavailable} =
               Error.from_native(%Condukt.Native.Error{code: :unavail, message: "refused"}, %{verb: "get"})
    end
  end
end
