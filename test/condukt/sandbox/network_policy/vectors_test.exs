defmodule Condukt.Sandbox.NetworkPolicy.VectorsTest do
  # Runs every vector of native_test/vectors/policy_vectors.json, the file
  # the C tests run too; the two evaluators agree by construction.
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.Host
  alias Condukt.Sandbox.NetworkPolicy.RequestPath
  alias Condukt.Test.Vectors

  setup_all do
    %{vectors: Vectors.load!()}
  end

  test "the file holds at least 300 policy cases", %{vectors: vectors} do
    count = vectors["groups"] |> Enum.map(&length(&1["cases"])) |> Enum.sum()
    assert count >= 300, "only #{count} cases in #{Vectors.path()}"
  end

  test "pattern vectors", %{vectors: vectors} do
    failures =
      Enum.flat_map(vectors["patterns"], fn v ->
        expected = if v["error"], do: {:error, v["error"]}, else: {:ok, v["normalized"]}

        got =
          case Host.normalize_pattern(v["pattern"]) do
            {:ok, p} -> {:ok, Host.to_text(p)}
            {:error, code} -> {:error, Atom.to_string(code)}
          end

        if got == expected,
          do: [],
          else: ["#{inspect(v["pattern"])}: expected #{inspect(expected)}, got #{inspect(got)}"]
      end)

    assert failures == []
  end

  test "host vectors", %{vectors: vectors} do
    failures =
      Enum.flat_map(vectors["hosts"], fn v ->
        got =
          case Host.normalize(v["host"]) do
            {:ok, h} -> Host.to_text(h)
            :error -> nil
          end

        if got == v["normalized"],
          do: [],
          else: ["#{inspect(v["host"])}: expected #{inspect(v["normalized"])}, got #{inspect(got)}"]
      end)

    assert failures == []
  end

  test "paths: request targets normalise as the sidecar normalises them", %{vectors: vectors} do
    assert vectors["paths"] != []

    failures =
      for %{"path" => path, "normalized" => want} <- vectors["paths"],
          got =
            (case RequestPath.normalize(path) do
               {:ok, p} -> p
               :error -> nil
             end),
          got != want,
          do: "#{inspect(path)}: expected #{inspect(want)}, got #{inspect(got)}"

    assert failures == []
  end

  test "path patterns: normalised or refused with the sidecar's code", %{vectors: vectors} do
    assert vectors["path_patterns"] != []

    failures =
      for v <- vectors["path_patterns"],
          got = RequestPath.normalize_pattern(v["pattern"]),
          want = if(v["error"], do: {:error, String.to_atom(v["error"])}, else: {:ok, v["normalized"]}),
          got != want,
          do: "#{inspect(v["pattern"])}: expected #{inspect(want)}, got #{inspect(got)}"

    assert failures == []
  end

  test "path matches", %{vectors: vectors} do
    assert vectors["path_matches"] != []

    failures =
      for %{"pattern" => pat, "path" => path, "match" => want} <- vectors["path_matches"],
          RequestPath.match?(pat, path) != want,
          do: "#{pat} ~ #{path}: expected #{want}"

    assert failures == []
  end

  test "policy cases", %{vectors: vectors} do
    failures =
      Enum.flat_map(vectors["groups"], fn group ->
        policy = Vectors.elixir_policy(group["policy"])

        Enum.flat_map(group["cases"], fn c ->
          opts = if c["method"], do: [method: c["method"]], else: []
          got = summarize(NetworkPolicy.evaluate(policy, c["input"], opts), c["input"])
          expected = Map.take(c, ["decision", "reason", "matched_rule", "host", "credentials"])

          got =
            if Map.has_key?(c, "credentials"),
              do: Map.put(got, "credentials", credential_indices(policy, c["input"], opts)),
              else: got

          if got == expected,
            do: [],
            else: ["#{group["name"]}: #{inspect(c["input"])}: expected #{inspect(expected)}, got #{inspect(got)}"]
        end)
      end)

    assert failures == []
  end

  test "to_sidecar_json/1 reproduces every group's document, patterns normalised", %{vectors: vectors} do
    for group <- vectors["groups"] do
      expected =
        Map.update!(group["policy"], "rules", fn rules ->
          Enum.map(rules, fn
            %{"hosts" => hosts} = rule ->
              %{rule | "hosts" => Enum.map(hosts, &normalized_entry/1)}

            rule ->
              rule
          end)
        end)
        |> Map.replace_lazy("credentials", fn creds -> Enum.map(creds, &normalized_credential/1) end)

      json = group["policy"] |> Vectors.elixir_policy() |> NetworkPolicy.to_sidecar_json()
      assert Condukt.JSON.decode!(json) == expected, group["name"]
    end
  end

  test "unreachable rules: the policies the C loader refuses, new/1 refuses too, naming both rules",
       %{vectors: vectors} do
    assert vectors["unreachable"] != []

    for v <- vectors["unreachable"] do
      rule = v["rule_index"]
      decide = v["decide_index"]

      assert {:error, %NetworkPolicy.Error{reason: :unreachable_rule, rule_index: ^rule, detail: ^decide} = e} =
               NetworkPolicy.new(Vectors.elixir_policy(v["policy"])),
             v["name"]

      assert Exception.message(e) =~ "network policy rule #{rule} "
      assert Exception.message(e) =~ "unreachable: rule #{decide} (:decide) before it answers every request"
    end
  end

  defp normalized_entry(%{"host" => host} = object) do
    object
    |> Map.put("host", normalized_host(host))
    |> Map.replace_lazy("paths", fn paths -> Enum.map(paths, &(&1 |> RequestPath.normalize_pattern() |> elem(1))) end)
  end

  defp normalized_entry(host), do: normalized_host(host)

  defp normalized_credential(object) do
    object |> normalized_entry() |> Map.update!("header", &String.downcase/1)
  end

  defp credential_indices(policy, input, opts) do
    for %{index: i, header: h, secret: s} <- NetworkPolicy.evaluate_credentials(policy, input, opts) do
      # The header and secret are the entry's own.
      {:secret, ^s} = Enum.at(policy.credentials, i) |> elem(1) |> Keyword.fetch!(:value)
      ^h = Enum.at(policy.credentials, i) |> elem(1) |> Keyword.fetch!(:header) |> String.downcase()
      i
    end
  end

  defp normalized_host(host), do: host |> Host.normalize_pattern() |> elem(1) |> Host.to_text()

  defp summarize({decision, matched}, input) do
    {name, reason} =
      case decision do
        :allow -> {"allow", nil}
        {:decide, _} -> {"decide", nil}
        {:deny, reason} -> {"deny", Atom.to_string(reason)}
      end

    host =
      case Host.parse_target(input) do
        {:ok, h} -> Host.to_text(h)
        {:error, _} -> nil
      end

    %{"decision" => name, "reason" => reason, "matched_rule" => matched && matched.index, "host" => host}
  end
end
