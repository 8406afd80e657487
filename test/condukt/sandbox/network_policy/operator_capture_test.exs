defmodule Condukt.Sandbox.NetworkPolicy.OperatorCaptureTest do
  # Body previews and redaction: the policy keys, what each backend hands
  # its sidecar, and what a handler may see of a preview.
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.{Capture, Error}

  test "the keys default to no capture and are validated" do
    p = NetworkPolicy.new!(rules: [allow: ["a.test"]])
    assert p.body_preview == 0 and p.redact_headers == [] and p.redact_body == []
    assert Capture.sidecar_args(p) == []

    p = NetworkPolicy.new!(rules: [allow: ["a.test"]], body_preview: 512, redact_headers: ["X-Api-Key"])
    assert p.body_preview == 512 and p.redact_headers == ["x-api-key"]
    assert Capture.sidecar_args(p) == ["--body-preview", "512", "--redact-header", "x-api-key"]

    for {key, bad} <-
          [body_preview: -1, body_preview: 65_537, body_preview: "1k", redact_headers: ["bad header"]] ++
            [redact_headers: "x", redact_body: [42], redact_body: [""]] do
      assert {:error, %Error{reason: :invalid_capture_option, key: ^key} = e} =
               NetworkPolicy.new([{:rules, [allow: ["a.test"]]}, {key, bad}])

      assert Exception.message(e) =~ "network policy #{inspect(key)}: expected"
    end

    assert {:error, %Error{reason: :unknown_key} = e} = NetworkPolicy.new(body_previw: 1)
    assert Exception.message(e) =~ ":body_preview"
  end

  test "the Kubernetes sidecar gets the flags; without a preview it gets none" do
    sidecar = fn policy ->
      {:ok, objects} = Kubernetes.manifests(namespace: "agents", id: "cap", network_policy: policy)
      pod = List.last(objects)
      Enum.find(pod["spec"]["initContainers"], &(&1["name"] == "condukt-egress"))["command"]
    end

    cmd = sidecar.(rules: [allow: ["a.test"]], body_preview: 100, redact_headers: ["x-token"])
    pairs = Enum.chunk_every(cmd, 2, 1)
    assert ["--body-preview", "100"] in pairs and ["--redact-header", "x-token"] in pairs

    cmd = sidecar.(rules: [allow: ["a.test"]])
    refute "--body-preview" in cmd
    refute "--redact-header" in cmd
  end

  test "built-in credential shapes and configured patterns are redacted" do
    c = Capture.of(rules: [allow: ["a.test"]], body_preview: 4096, redact_body: [~r/card=\d+/, "tenant-7"])

    assert Capture.redact(~s({"password": "hunter2", "q": "hello"}), c) == ~s({"password": "[redacted]", "q": "hello"})
    assert Capture.redact("user=me&api_key=abc123&x=1", c) == "user=me&api_key=[redacted]&x=1"
    assert Capture.redact("Authorization: Bearer eyJhbGciOi.x.y", c) == "Authorization: [redacted]"
    assert Capture.redact("id AKIAABCDEFGHIJKLMNOP end", c) == "id [redacted] end"
    assert Capture.redact("t=ghp_" <> String.duplicate("a", 36), c) == "t=[redacted]"
    assert Capture.redact("key sk-" <> String.duplicate("Z", 40), c) == "key [redacted]"

    pem = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\nafter"
    assert Capture.redact(pem, c) == "[redacted]\nafter"
    # A key or a value cut by the preview's end is redacted to the end.
    assert Capture.redact("x -----BEGIN RSA PRIVATE KEY-----\nMIIEow", c) == "x [redacted]"
    assert Capture.redact(~s({"token": "abcd), c) == ~s({"token": "[redacted])

    assert Capture.redact("card=4111111111111111 for tenant-7", c) == "[redacted] for [redacted]"
    assert Capture.redact("nothing to see", c) == "nothing to see"
    # Bytes that are not UTF-8 are fine.
    assert Capture.redact(<<0xFF, 0x01, "password=x">>, c) == <<0xFF, 0x01, "password=[redacted]">>
  end

  test "no preview reaches a handler when the policy captures none" do
    off = Capture.of(rules: [allow: ["a.test"]])
    on = Capture.of(rules: [allow: ["a.test"]], body_preview: 64)
    fields = %{"host" => "a.test", "body_preview" => Base.encode64(~s({"secret":"x","n":1}))}

    refute Map.has_key?(Capture.filter_fields(fields, off), "body_preview")
    assert Capture.redact("anything", off) == nil

    assert Base.decode64!(Capture.filter_fields(fields, on)["body_preview"]) == ~s({"secret":"[redacted]","n":1})
    refute Map.has_key?(Capture.filter_fields(%{"body_preview" => "!!not base64"}, on), "body_preview")
    assert Capture.filter_fields(%{"host" => "a.test"}, on) == %{"host" => "a.test"}
  end
end
