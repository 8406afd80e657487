defmodule Condukt.Sandbox.NetworkPolicy.SidecarCliTest do
  # The policy as the sidecar sees it: documents written by
  # NetworkPolicy.to_sidecar_json/1 and read by the real condukt-egress
  # binary (`policy check`, `policy eval`).
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Test.Vectors

  @moduletag :tmp_dir

  defp egress(args), do: System.cmd(Condukt.egress_binary(), args, stderr_to_stdout: true)

  defp write!(dir, name, contents) do
    path = Path.join(dir, name)
    File.write!(path, contents)
    path
  end

  test "the C evaluator agrees with evaluate/2 on every vector, through to_sidecar_json/1", %{tmp_dir: dir} do
    vectors = Vectors.load!()

    failures =
      vectors["groups"]
      |> Enum.with_index()
      |> Enum.flat_map(fn {group, i} ->
        policy = Vectors.elixir_policy(group["policy"])
        file = write!(dir, "group#{i}.json", NetworkPolicy.to_sidecar_json(policy))
        assert {_, 0} = egress(["policy", "check", file])

        # A command-line argument cannot carry a NUL byte; those vectors are
        # run in-process by the C tests (test_vectors.c) instead.
        group["cases"]
        |> Enum.reject(&String.contains?(&1["input"], <<0>>))
        |> Enum.flat_map(fn c ->
          {out, 0} = egress(["policy", "eval", "--", file, c["input"]])
          from_c = Condukt.JSON.decode!(out)

          {decision, matched} = NetworkPolicy.evaluate(policy, c["input"])
          assert matched_json(matched) == from_c["matched_rule"], inspect(c["input"])

          if same_decision?(decision, from_c),
            do: [],
            else: ["#{group["name"]}: #{inspect(c["input"])}: Elixir #{inspect(decision)}, C #{out}"]
        end)
      end)

    assert failures == []
  end

  defp matched_json(nil), do: nil
  defp matched_json(%{index: i, kind: k}), do: %{"index" => i, "kind" => Atom.to_string(k)}

  defp same_decision?(:allow, %{"decision" => "allow", "reason" => nil}), do: true
  defp same_decision?({:decide, _}, %{"decision" => "decide", "reason" => nil}), do: true
  defp same_decision?({:deny, r}, %{"decision" => "deny", "reason" => r2}), do: Atom.to_string(r) == r2
  defp same_decision?(_, _), do: false

  test "policy check and new/1 refuse the same policies: unreachable rules and CIDR patterns, naming them alike",
       %{tmp_dir: dir} do
    for v <- Vectors.load!()["unreachable"] do
      file = write!(dir, "unreachable.json", Condukt.JSON.encode!(v["policy"]))
      {out, 1} = egress(["policy", "check", file])
      i = v["rule_index"]
      d = v["decide_index"]
      assert out =~ "$.rules[#{i}]: unreachable: rule #{d} (decide) before it answers every request", out

      {:error, e} = NetworkPolicy.new(Vectors.elixir_policy(v["policy"]))
      assert Exception.message(e) =~ "rule #{i} "
      assert Exception.message(e) =~ "unreachable: rule #{d} (:decide) before it answers every request"
    end

    doc = ~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"deny","hosts":["10.0.0.0/8"]}]})
    {out, 1} = egress(["policy", "check", write!(dir, "cidr.json", doc)])
    assert out =~ ~s{$.rules[0].hosts[0]: bad pattern "10.0.0.0/8" (cidr): CIDR ranges are not host patterns}

    {:error, e} = NetworkPolicy.new(rules: [deny: ["10.0.0.0/8"]])
    assert Exception.message(e) =~ ~s{invalid host pattern "10.0.0.0/8" (cidr): CIDR ranges are not host patterns}
  end

  describe "policy check names the culprit of every bad policy" do
    @bad [
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"alow","hosts":["a.com"]}]}), "$.rules[0].kind"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"deny","hosts":[]}]}), "$.rules[0].hosts"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":["a.com","***.b.com"]}]}),
       "$.rules[0].hosts[1]"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":["a..b.com"]}]}),
       "$.rules[0].hosts[0]"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":["https://a.com"]}]}),
       "$.rules[0].hosts[0]"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":["a.com/x"]}]}),
       "$.rules[0].hosts[0]"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":["a.com:443"]}]}),
       "$.rules[0].hosts[0]"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"decide","timeout_ms":0,"cache":true}]}),
       "$.rules[0].timeout_ms"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"decide","timeout_ms":-1,"cache":true}]}),
       "$.rules[0].timeout_ms"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"decide","timeout_ms":5,"cache":true,"call":"x"}]}),
       "$.rules[0].call"},
      {~s({"version":1,"default":"drop","rules":[]}), "$.default"},
      {~s({"version":4,"default":"deny","rules":[]}), "$.version"},
      {~s({"version":1,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":[{"host":"a.com","methods":["GET"]}]}]}),
       "$.rules[0].hosts[0]"},
      {~s({"version":2,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":[{"host":"a.com","methods":["get"]}]}]}),
       "$.rules[0].hosts[0].methods[0]"},
      {~s({"version":2,"default":"deny","rules":[{"index":0,"kind":"allow","hosts":[{"host":"a.com","paths":["/a/../b"]}]}]}),
       "$.rules[0].hosts[0].paths[0]"},
      {~s({"version":"1","default":"deny","rules":[]}), "$.version"},
      {~s({"version":1,"default":"deny","rules":[],"extra":1}), "$.extra"},
      {~s({"version":1,"default":"deny","rules":[{"index":1,"kind":"allow","hosts":["a.com"]}]}), "$.rules[0].index"}
    ]

    for {{doc, path}, i} <- Enum.with_index(@bad) do
      test "case #{i}: #{path}", %{tmp_dir: dir} do
        file = write!(dir, "bad.json", unquote(doc))
        {out, status} = egress(["policy", "check", file])
        assert status == 1, out
        assert out =~ unquote(path) <> ":", out
      end
    end
  end

  test "policy eval --method: the sidecar and evaluate/3 agree on methods and paths", %{tmp_dir: dir} do
    policy =
      NetworkPolicy.new!(
        rules: [
          allow: [{"api.github.com", methods: ["GET", "HEAD"], paths: ["/repos/myorg/**"]}],
          deny: ["api.github.com"]
        ]
      )

    file = write!(dir, "mp.json", NetworkPolicy.to_sidecar_json(policy))

    for {method, url} <- [
          {"GET", "https://api.github.com/repos/myorg/x"},
          {"POST", "https://api.github.com/repos/myorg/x"},
          {"GET", "https://api.github.com/repos/myorg/../x"},
          {"GET", "https://api.github.com/repos/myorg/%2e%2e/x"},
          {"GET", "https://api.github.com/repos/myorg/%2E%2E%2Fx"}
        ] do
      {out, 0} = egress(["policy", "eval", "--method", method, file, url])
      sidecar = Condukt.JSON.decode!(out)
      {decision, matched} = NetworkPolicy.evaluate(policy, url, method: method)

      {name, reason} =
        case decision do
          :allow -> {"allow", nil}
          {:deny, r} -> {"deny", Atom.to_string(r)}
        end

      assert sidecar["decision"] == name, "#{method} #{url}"
      assert sidecar["reason"] == reason, "#{method} #{url}"
      assert sidecar["matched_rule"] == (matched && %{"index" => matched.index, "kind" => Atom.to_string(matched.kind)})
    end
  end

  test "policy eval names the credentials a request would get, as evaluate_credentials/3 does", %{tmp_dir: dir} do
    groups = Enum.filter(Vectors.load!()["groups"], &Map.has_key?(&1["policy"], "credentials"))
    assert groups != []

    for group <- groups, c <- group["cases"] do
      policy = Vectors.elixir_policy(group["policy"])
      file = write!(dir, "cred.json", NetworkPolicy.to_sidecar_json(policy))
      method = if c["method"], do: ["--method", c["method"]], else: []
      {out, 0} = egress(["policy", "eval"] ++ method ++ ["--", file, c["input"]])
      opts = if c["method"], do: [method: c["method"]], else: []

      expected =
        for %{index: i, header: h, secret: s} <- NetworkPolicy.evaluate_credentials(policy, c["input"], opts),
            do: %{"index" => i, "header" => h, "secret" => s}

      assert Condukt.JSON.decode!(out)["credentials"] == expected, "#{inspect(c["method"])} #{c["input"]}"
      assert Enum.map(expected, & &1["index"]) == c["credentials"], "#{inspect(c["method"])} #{c["input"]}"
    end

    # Names, never values: the value is not in the document, nor in the line.
    policy =
      NetworkPolicy.new!(
        rules: [allow: ["api.github.com"]],
        credentials: [{"api.github.com", header: "Authorization", value: {:secret, "gh"}}],
        secrets: %{"gh" => "Bearer ghp_v4lue"}
      )

    file = write!(dir, "gh.json", NetworkPolicy.to_sidecar_json(policy))
    {out, 0} = egress(["policy", "eval", file, "https://api.github.com/user"])
    refute out =~ "v4lue"

    assert Condukt.JSON.decode!(out)["credentials"] == [
             %{"index" => 0, "header" => "authorization", "secret" => "gh"}
           ]

    # A policy without credentials prints no "credentials" member.
    file = write!(dir, "none.json", NetworkPolicy.to_sidecar_json(rules: [allow: ["api.github.com"]]))
    {out, 0} = egress(["policy", "eval", file, "https://api.github.com/user"])
    refute Map.has_key?(Condukt.JSON.decode!(out), "credentials")
  end

  test "policy eval prints one JSON object", %{tmp_dir: dir} do
    file =
      write!(
        dir,
        "seed.json",
        NetworkPolicy.to_sidecar_json(rules: [deny: ["*.internal.example.com"], allow: ["api.github.com"]])
      )

    {out, 0} = egress(["policy", "eval", file, "https://API.github.com./repos"])

    assert Condukt.JSON.decode!(out) == %{
             "decision" => "allow",
             "reason" => nil,
             "matched_rule" => %{"index" => 1, "kind" => "allow"},
             "host" => "api.github.com"
           }
  end

  test "usage errors exit 2 and name the bad word" do
    assert {out, 2} = egress(["polcy"])
    assert out =~ "polcy"
    assert {out, 2} = egress(["policy", "frobnicate"])
    assert out =~ "frobnicate"
    assert {_out, 2} = egress(["policy", "check"])
    assert {out, 2} = egress(["policy", "check", "--verbose", "x.json"])
    assert out =~ "--verbose"
  end

  test "a missing file is an error naming it" do
    {out, 1} = egress(["policy", "check", "/nonexistent/policy.json"])
    assert out =~ "/nonexistent/policy.json"
  end
end
