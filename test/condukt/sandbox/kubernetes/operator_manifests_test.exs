defmodule Condukt.Sandbox.Kubernetes.OperatorManifestsTest do
  # manifests/1, its YAML and `mix condukt.manifests`, without a cluster
  # (the tier compares manifests/1 with what the API server stored).
  use ExUnit.Case, async: true

  import ExUnit.CaptureIO

  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.Kubernetes.YAML

  test "the objects init/1 would create, in its order, with placeholders for the generated values" do
    {:ok, [egress, trust, np, pod]} =
      Kubernetes.manifests(namespace: "agents", id: "job-42", network_policy: [rules: [allow: ["a.test"]]])

    assert {egress["kind"], trust["kind"], np["kind"], pod["kind"]} == {"Secret", "Secret", "NetworkPolicy", "Pod"}
    assert pod["metadata"]["name"] == Kubernetes.pod_name("job-42")
    assert pod["metadata"]["namespace"] == "agents"
    assert Base.decode64!(egress["data"]["ca.key"]) == "generated-by-init"
    assert Base.decode64!(egress["data"]["token"]) == "generated-by-init"
    assert Base.decode64!(egress["data"]["policy.json"]) =~ ~s("hosts":["a.test"])

    {:ok, [plain]} = Kubernetes.manifests(namespace: "agents")
    assert plain["kind"] == "Pod"
    # Without an id the pod is single-use, as with init/1.
    assert plain["metadata"]["annotations"]["condukt.dev/delete-on-shutdown"] == "true"

    assert {:error, %Condukt.Sandbox.Error{reason: :invalid_option}} = Kubernetes.manifests(namespace: "Bad!")
  end

  test "YAML: block style, strings quoted when a reader could take them for something else" do
    doc = %{
      "kind" => "Pod",
      "apiVersion" => "v1",
      "metadata" => %{"name" => "p", "labels" => %{"a" => "true", "b" => "0123", "c" => "plain-text"}},
      "spec" => %{
        "list" => ["x", 1, true, nil, "", "a: b", "-dash", "line\nbreak", "tab\there", "quote\"s", "ünï"],
        "nested" => [%{"name" => "c", "ports" => [%{"port" => 80}]}, [1, 2]],
        "empty" => %{},
        "none" => []
      }
    }

    yaml = YAML.encode(doc)

    assert yaml == """
           apiVersion: v1
           kind: Pod
           metadata:
             name: p
             labels:
               a: "true"
               b: "0123"
               c: plain-text
           spec:
             empty: {}
             list:
               - x
               - 1
               - true
               - null
               - ""
               - "a: b"
               - "-dash"
               - "line\\nbreak"
               - "tab\\there"
               - "quote\\"s"
               - "ünï"
             nested:
               - name: c
                 ports:
                   - port: 80
               -
                 - 1
                 - 2
             none: []
           """

    # A YAML reader gives back the same document.
    assert parse_yaml(YAML.encode_documents([doc, %{"a" => 1}])) == [doc, %{"a" => 1}]
  end

  test "the YAML of real manifests reads back as the same objects" do
    {:ok, objects} =
      Kubernetes.manifests(
        namespace: "agents",
        id: "job-42",
        network_policy: [rules: [allow: ["a.test"]]],
        tolerations: [%{key: "k", operator: "Exists"}],
        env: %{"X" => "yes", "Y" => "1.5", "Z" => "~"}
      )

    assert parse_yaml(YAML.encode_documents(objects)) == objects
  end

  test "mix condukt.manifests prints the documents" do
    out =
      capture_io(fn ->
        Mix.Tasks.Condukt.Manifests.run(
          ~w(--namespace agents --id job-42 --allow a.test --allow b.test --default deny --runtime-class-name gvisor --image-pull-secret pull)
        )
      end)

    docs = parse_yaml(out)
    assert Enum.map(docs, & &1["kind"]) == ["Secret", "Secret", "NetworkPolicy", "Pod"]
    pod = List.last(docs)
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    assert pod["spec"]["imagePullSecrets"] == [%{"name" => "pull"}]
    policy = Base.decode64!(hd(docs)["data"]["policy.json"])
    assert policy =~ ~s("a.test") and policy =~ ~s("b.test")

    assert_raise Mix.Error, ~r/unknown or invalid option/, fn -> Mix.Tasks.Condukt.Manifests.run(~w(--bogus x)) end
  end

  # python3-yaml (scripts/setup-debian.sh), YAML 1.1 like most
  # Kubernetes tooling: the stricter reader for quoting.
  defp parse_yaml(text) do
    path = Path.join(System.tmp_dir!(), "condukt-yaml-#{System.unique_integer([:positive])}.yaml")
    File.write!(path, text)

    try do
      script = "import sys, json, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))"
      {out, 0} = System.cmd("python3", ["-c", script, path])
      Condukt.JSON.decode!(out)
    after
      File.rm(path)
    end
  end
end
