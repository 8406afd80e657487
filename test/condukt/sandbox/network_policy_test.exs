defmodule Condukt.Sandbox.NetworkPolicyTest do
  use ExUnit.Case, async: true
  doctest Condukt.Sandbox.NetworkPolicy

  alias Condukt.Sandbox.NetworkPolicy
  alias Condukt.Sandbox.NetworkPolicy.{Error, Request}
  alias Condukt.Test.{ModuleDecider, NotADecider}

  defp seed_policy(decide \\ {ModuleDecider, agent: :net_guard}) do
    %NetworkPolicy{
      rules: [
        deny: ["*.internal.example.com"],
        allow: ["api.github.com", "*.openai.com"],
        decide: decide
      ],
      default: :deny
    }
  end

  defp error!(policy) do
    assert {:error, %Error{} = error} = NetworkPolicy.new(policy)
    assert_raise Error, fn -> NetworkPolicy.new!(policy) end
    error
  end

  describe "new/1 accepts" do
    test "the struct, a keyword list and a map, with the same result" do
      rules = [deny: ["evil.example.com"], allow: ["*.example.com"]]
      {:ok, from_struct} = NetworkPolicy.new(%NetworkPolicy{rules: rules})
      {:ok, from_keyword} = NetworkPolicy.new(rules: rules)
      {:ok, from_map} = NetworkPolicy.new(%{rules: rules, default: :deny})
      assert from_struct == from_keyword
      assert from_keyword == from_map
      assert from_struct.default == :deny
      assert from_struct.rules == rules
    end

    test "an empty policy, which denies everything by default" do
      policy = NetworkPolicy.new!([])
      assert policy == %NetworkPolicy{rules: [], default: :deny}
      assert NetworkPolicy.evaluate(policy, "https://example.com") == {{:deny, :default_deny}, nil}
    end

    test "the four decide callable shapes, each filled in with the documented defaults" do
      fun = fn _ctx, _req -> :allow end

      for callable <- [fun, {ModuleDecider, :two}, ModuleDecider, {ModuleDecider, agent: :guard}] do
        policy = NetworkPolicy.new!(rules: [decide: callable])

        assert policy.rules == [
                 decide: [
                   call: callable,
                   timeout: 5_000,
                   cache: true,
                   context_messages: 5,
                   context_metadata: %{}
                 ]
               ]
      end
    end

    test "the configured decide form, keeping what was set and defaulting the rest" do
      policy =
        NetworkPolicy.new!(rules: [decide: [call: ModuleDecider, timeout: 250, context_metadata: %{tenant: "acme"}]])

      assert [decide: opts] = policy.rules
      assert opts[:timeout] == 250
      assert opts[:cache] == true
      assert opts[:context_messages] == 5
      assert opts[:context_metadata] == %{tenant: "acme"}
    end
  end

  describe "new/1 refuses, naming the rule, the key and the value:" do
    test "an unknown rule kind, with a suggestion" do
      error = error!(rules: [allow: ["a.com"], alow: ["b.com"]])
      assert %Error{reason: :unknown_rule_kind, rule_index: 1, key: :alow, detail: :allow} = error
      assert Exception.message(error) =~ "rule 1 (:alow)"
      assert Exception.message(error) =~ "did you mean :allow?"
    end

    test "a rule that is not a pair" do
      assert %Error{reason: :invalid_rule, rule_index: 0, value: "api.github.com"} =
               error!(%{rules: ["api.github.com"]})
    end

    test "an empty host list" do
      error = error!(rules: [allow: ["a.com"], deny: []])
      assert %Error{reason: :empty_host_list, rule_index: 1, key: :deny} = error
      assert Exception.message(error) =~ "rule 1 (:deny)"
    end

    test "a host list that is not a list of strings" do
      assert %Error{reason: :invalid_host_list, rule_index: 0, key: :allow, value: "a.com"} =
               error!(rules: [allow: "a.com"])

      assert %Error{reason: :invalid_host_list, value: [:a]} = error!(rules: [allow: [:a]])
    end

    test "every malformed glob, with the code of docs/host-matching.md" do
      cases = [
        {"***.example.com", :star_run},
        {"a.***", :star_run},
        {"a..example.com", :empty_label},
        {".example.com", :empty_label},
        {"https://api.github.com", :scheme},
        {"api.github.com/repos", :path},
        {"api.github.com:443", :port},
        {"", :empty},
        {"api github.com", :bad_char},
        {"user@api.github.com", :bad_char},
        {"mü*.de", :wildcard_idn},
        {<<0xFF, ".com">>, :bad_utf8},
        {String.duplicate("a", 64) <> ".com", :label_too_long},
        {Enum.map_join(1..64, ".", fn _ -> "abc" end), :name_too_long},
        {"1.2.3.256", :bad_ip},
        {"[::1", :bad_ip},
        {"1::2::3", :bad_ip}
      ]

      for {pattern, code} <- cases do
        error = error!(rules: [allow: ["ok.example.com"], deny: ["fine.com", pattern]])

        assert %Error{reason: :invalid_pattern, rule_index: 1, key: :deny, value: ^pattern, detail: ^code} = error,
               "#{inspect(pattern)} should be #{code}, got #{inspect(error)}"

        assert Exception.message(error) =~ inspect(pattern)
        assert Exception.message(error) =~ "(#{code})"
      end
    end

    test "a CIDR range, saying that CIDRs are not host patterns and what to write instead" do
      for cidr <- ["10.0.0.0/8", "169.254.169.254/32", "fd00::/8", "[2001:db8::]/32"] do
        error = error!(rules: [deny: [cidr], allow: ["api.github.com"]])
        assert %Error{reason: :invalid_pattern, rule_index: 0, key: :deny, value: ^cidr, detail: :cidr} = error
        message = Exception.message(error)
        assert message =~ "network policy rule 0 (:deny): invalid host pattern #{inspect(cidr)} (cidr)"
        assert message =~ "CIDR ranges are not host patterns"
        assert message =~ ~s[list the addresses one by one ("10.0.0.1") or name the hosts]
      end

      # A path that merely contains a slash is still a path.
      assert %Error{detail: :path} = error!(rules: [deny: ["example.com/8"]])
      # Single addresses are what to write.
      assert {:ok, _} = NetworkPolicy.new(rules: [deny: ["10.0.0.1", "fd00::1"]])
    end

    test "a rule after a decide rule, which can never match: its index and the decide rule's" do
      decide = fn _ctx, _req -> :allow end

      for {after_rule, kind} <- [
            {{:allow, ["c.example"]}, :allow},
            {{:deny, ["**"]}, :deny},
            {{:decide, decide}, :decide}
          ] do
        error = error!(rules: [{:deny, ["b.example"]}, {:decide, decide}, after_rule, {:allow, ["d.example"]}])

        assert %Error{reason: :unreachable_rule, rule_index: 2, key: ^kind, detail: 1} = error

        assert Exception.message(error) ==
                 "network policy rule 2 (#{inspect(kind)}): unreachable: rule 1 (:decide) before it answers " <>
                   "every request that reaches it, so this rule is never consulted; move it before rule 1, or remove it"
      end

      # The configured form is just as terminal.
      assert %Error{reason: :unreachable_rule, rule_index: 1, detail: 0} =
               error!(rules: [decide: [call: decide, timeout: 100], allow: ["a.example"]])

      # A rule's own error is reported first.
      assert %Error{reason: :invalid_pattern, rule_index: 1} = error!(rules: [decide: decide, allow: ["a..b"]])

      # Last, it is fine.
      assert {:ok, _} = NetworkPolicy.new(rules: [deny: ["b.example"], allow: ["a.example"], decide: decide])
    end

    test "a function decider of the wrong arity" do
      error = error!(rules: [decide: fn _req -> :allow end])
      assert %Error{reason: :invalid_callable, rule_index: 0, key: :call} = error
      assert Exception.message(error) =~ "takes 2 arguments (ctx, req), this one takes 1"
    end

    test "{module, function} whose function/2 does not exist" do
      error = error!(rules: [decide: {ModuleDecider, :missing}])
      assert %Error{reason: :invalid_callable} = error
      assert Exception.message(error) =~ "Condukt.Test.ModuleDecider.missing/2 is not exported"
    end

    test "a module that does not implement decide/3, alone or with options" do
      for callable <- [NotADecider, {NotADecider, agent: :x}] do
        error = error!(rules: [allow: ["a.com"], decide: callable])
        assert %Error{reason: :invalid_callable, rule_index: 1, value: ^callable} = error
        assert Exception.message(error) =~ "decide/3 is not exported"
      end
    end

    test "a module that does not exist" do
      error = error!(rules: [decide: NoSuch.Decider])
      assert Exception.message(error) =~ "module NoSuch.Decider is not available"
    end

    test "a callable of no known shape, bare or under :call" do
      for bad <- ["string", 42, {ModuleDecider, :two, :extra}, nil, {ModuleDecider, [:not_keyword]}] do
        assert %Error{reason: :invalid_callable, rule_index: 0, value: ^bad} = error!(rules: [decide: bad])
        assert %Error{reason: :invalid_callable, rule_index: 0} = error!(rules: [decide: [call: bad]])
      end
    end

    test "a configured decide rule without :call" do
      assert %Error{reason: :missing_call, rule_index: 0} = error!(rules: [decide: [timeout: 10]])
      assert %Error{reason: :missing_call, rule_index: 0} = error!(rules: [decide: []])
    end

    test "an unknown decide option, with a suggestion" do
      error = error!(rules: [decide: [call: ModuleDecider, timout: 10]])
      assert %Error{reason: :unknown_decide_option, rule_index: 0, key: :timout, detail: :timeout} = error
      assert Exception.message(error) =~ "did you mean :timeout?"
    end

    test "a non-positive or absurd timeout and other ill-typed options" do
      for {key, value} <- [
            timeout: 0,
            timeout: -5,
            timeout: 1.5,
            timeout: 3_600_001,
            cache: "yes",
            context_messages: -1,
            context_metadata: [tenant: "acme"]
          ] do
        error = error!(rules: [decide: [{:call, ModuleDecider}, {key, value}]])
        assert %Error{reason: :invalid_decide_option, rule_index: 0, key: ^key, value: ^value} = error
        assert Exception.message(error) =~ "rule 0 (#{inspect(key)})"
      end
    end

    test "a default other than :allow or :deny" do
      for bad <- [:drop, "deny", nil] do
        error = error!(rules: [], default: bad)
        assert %Error{reason: :invalid_default, key: :default, value: ^bad} = error
        assert Exception.message(error) =~ "expected :allow or :deny"
      end
    end

    test "policies over the sidecar's limits (docs/policy-json.md)" do
      assert %Error{reason: :too_many_rules, value: 4097} = error!(rules: List.duplicate({:allow, ["a.com"]}, 4097))

      assert {:ok, _} = NetworkPolicy.new(rules: List.duplicate({:allow, ["a.com"]}, 4096))

      error = error!(rules: [allow: ["a.com"], deny: List.duplicate("b.com", 4097)])
      assert %Error{reason: :too_many_patterns, rule_index: 1, key: :deny, value: 4097} = error

      # 20 rules of 4096 patterns fit the counts but not the 4 MiB document.
      long = String.duplicate("a", 60) <> ".example.com"
      rules = List.duplicate({:allow, List.duplicate(long, 4096)}, 20)
      assert %Error{reason: :document_too_large} = error = error!(rules: rules)
      assert Exception.message(error) =~ "4194304-byte limit"
    end

    test "unknown policy keys and inputs that are not policies" do
      assert %Error{reason: :unknown_key, value: :rule, detail: :rules} = error!(rule: [])
      assert %Error{reason: :invalid_policy} = error!("allow everything")
      assert %Error{reason: :invalid_policy} = error!([:allow])
      assert %Error{reason: :invalid_rules, value: %{}} = error!(rules: %{})
    end
  end

  describe "evaluate/2" do
    test "walks the seeds' example policy top to bottom" do
      policy = seed_policy()

      assert NetworkPolicy.evaluate(policy, "https://api.github.com/repos") ==
               {:allow, %{index: 1, kind: :allow}}

      assert NetworkPolicy.evaluate(policy, "https://db.internal.example.com/") ==
               {{:deny, :denied_by_rule}, %{index: 0, kind: :deny}}

      assert NetworkPolicy.evaluate(policy, "https://pypi.org/simple/") ==
               {{:decide, 2}, %{index: 2, kind: :decide}}
    end

    test "order matters: deny then allow differs from allow then deny" do
      deny_first = [deny: ["evil.example.com"], allow: ["*.example.com"]]
      allow_first = [allow: ["*.example.com"], deny: ["evil.example.com"]]

      assert {{:deny, :denied_by_rule}, %{index: 0}} = NetworkPolicy.evaluate([rules: deny_first], "evil.example.com")
      assert {:allow, %{index: 1}} = NetworkPolicy.evaluate([rules: deny_first], "good.example.com")
      assert {:allow, %{index: 0}} = NetworkPolicy.evaluate([rules: allow_first], "evil.example.com")
    end

    test "takes a %Request{} by its host, and denies one without a host" do
      policy = seed_policy()
      req = %Request{method: "GET", scheme: :https, host: "API.GitHub.com.", port: 443, path: "/"}
      assert NetworkPolicy.evaluate(policy, req) == {:allow, %{index: 1, kind: :allow}}
      assert NetworkPolicy.evaluate(policy, %Request{}) == {{:deny, :invalid_host}, nil}
    end

    test "denies invalid hosts and URLs even when the default is :allow" do
      policy = [rules: [], default: :allow]
      assert NetworkPolicy.evaluate(policy, "https://example.com") == {:allow, nil}
      assert NetworkPolicy.evaluate(policy, "https://127.1/") == {{:deny, :invalid_host}, nil}
      assert NetworkPolicy.evaluate(policy, "ftp://example.com/") == {{:deny, :invalid_url}, nil}
      assert NetworkPolicy.evaluate(policy, "https://evil.net\\@api.github.com/") == {{:deny, :invalid_url}, nil}
    end

    test "raises on an invalid policy" do
      assert_raise Error, ~r/rule 0 \(:allow\)/, fn ->
        NetworkPolicy.evaluate([rules: [allow: []]], "https://a.com")
      end
    end
  end

  describe "to_sidecar_json/1" do
    test "writes the versioned document with normalised patterns; decide rules keep index and timeout only" do
      policy =
        NetworkPolicy.new!(
          rules: [
            deny: ["*.Internal.Example.COM."],
            allow: ["Bücher.example", "[::FFFF:10.0.0.1]", "2001:DB8:0:0:0:0:0:1"],
            decide: [call: fn _ctx, _req -> :allow end, timeout: 1_500, cache: false]
          ],
          default: :allow
        )

      json = NetworkPolicy.to_sidecar_json(policy)
      refute json =~ "call"

      assert Condukt.JSON.decode!(json) == %{
               "version" => 1,
               "default" => "allow",
               "rules" => [
                 %{"index" => 0, "kind" => "deny", "hosts" => ["*.internal.example.com"]},
                 %{
                   "index" => 1,
                   "kind" => "allow",
                   "hosts" => ["xn--bcher-kva.example", "10.0.0.1", "2001:db8::1"]
                 },
                 %{"index" => 2, "kind" => "decide", "timeout_ms" => 1_500, "cache" => false}
               ]
             }
    end

    test "raises on an invalid policy" do
      assert_raise Error, fn -> NetworkPolicy.to_sidecar_json(rules: [allow: ["https://x"]]) end
    end
  end

  describe "method and path entries" do
    @gh {"api.github.com", methods: ["GET", "HEAD"], paths: ["/repos/myorg/**"]}

    test "new/1 keeps the entries as written next to plain hosts" do
      assert {:ok, %NetworkPolicy{rules: [allow: [@gh, "x.com"]]}} = NetworkPolicy.new(rules: [allow: [@gh, "x.com"]])
      assert {:ok, _} = NetworkPolicy.new(rules: [deny: [{"a.com", methods: ["DELETE"]}], allow: ["a.com"]])
      assert {:ok, _} = NetworkPolicy.new(rules: [allow: [{"a.com", paths: ["/**"]}]])
    end

    for {entry, reason, key, value} <- [
          {{"a.com", []}, :invalid_entry, :allow, {"a.com", []}},
          {{"a.com", [:methods]}, :invalid_entry, :allow, {"a.com", [:methods]}},
          {{"a.com", methods: ["GET"], methods: ["PUT"]}, :invalid_entry, :allow,
           {"a.com", methods: ["GET"], methods: ["PUT"]}},
          {{"a.com", method: ["GET"]}, :unknown_entry_option, :method, :method},
          {{"a.com", methods: []}, :invalid_condition_list, :methods, []},
          {{"a.com", methods: "GET"}, :invalid_condition_list, :methods, "GET"},
          {{"a.com", methods: [:get]}, :invalid_condition_list, :methods, [:get]},
          {{"a.com", methods: ["get"]}, :invalid_method, :methods, "get"},
          {{"a.com", methods: ["GET "]}, :invalid_method, :methods, "GET "},
          {{"a.com", methods: [String.duplicate("A", 33)]}, :invalid_method, :methods, String.duplicate("A", 33)},
          {{"a.com", paths: ["repos"]}, :invalid_path_pattern, :paths, "repos"},
          {{"a.com", paths: ["/a/../b"]}, :invalid_path_pattern, :paths, "/a/../b"},
          {{"a.com", paths: ["/a%2Fb"]}, :invalid_path_pattern, :paths, "/a%2Fb"},
          {{"a.com", paths: ["/a**"]}, :invalid_path_pattern, :paths, "/a**"},
          {{"a.com/x", methods: ["get"]}, :invalid_pattern, :allow, "a.com/x"},
          {{:host, methods: ["GET"]}, :invalid_host_list, :allow, [{:host, methods: ["GET"]}]}
        ] do
      test "new/1 refuses #{inspect(entry)} (#{reason})" do
        assert {:error, %Error{reason: unquote(reason), rule_index: 1, key: unquote(key), value: value} = e} =
                 NetworkPolicy.new(rules: [deny: ["b.com"], allow: [unquote(Macro.escape(entry))]])

        assert value == unquote(Macro.escape(value))
        assert Exception.message(e) =~ "network policy rule 1 "
      end
    end

    test "new/1 names the path pattern code and the sidecar's limits" do
      assert {:error, %Error{detail: :dot_segment} = e} =
               NetworkPolicy.new(rules: [allow: [{"a.com", paths: ["/a/./b"]}]])

      assert Exception.message(e) =~ ~s[invalid path pattern "/a/./b" (dot_segment)]

      many = for i <- 1..65, do: "M#{i}"

      assert {:error, %Error{reason: :too_many_conditions, key: :methods, value: 65, detail: 64}} =
               NetworkPolicy.new(rules: [allow: [{"a.com", methods: many}]])
    end

    test "evaluate/3: a GET-only rule, and what falls through" do
      policy = NetworkPolicy.new!(rules: [allow: [@gh], deny: ["api.github.com"]])
      url = "https://api.github.com/repos/myorg/x"
      assert NetworkPolicy.evaluate(policy, url, method: "GET") == {:allow, %{index: 0, kind: :allow}}
      assert NetworkPolicy.evaluate(policy, url, method: "HEAD") == {:allow, %{index: 0, kind: :allow}}
      assert NetworkPolicy.evaluate(policy, url, method: "POST") == {{:deny, :denied_by_rule}, %{index: 1, kind: :deny}}
      assert NetworkPolicy.evaluate(policy, url, method: "get") == {{:deny, :denied_by_rule}, %{index: 1, kind: :deny}}
      # no method known: the method entry does not match
      assert NetworkPolicy.evaluate(policy, url) == {{:deny, :denied_by_rule}, %{index: 1, kind: :deny}}
      # a bare host has no path
      assert NetworkPolicy.evaluate(policy, "api.github.com", method: "GET") ==
               {{:deny, :denied_by_rule}, %{index: 1, kind: :deny}}
    end

    test "evaluate/3: dot segments and encodings cannot escape a path rule" do
      policy = NetworkPolicy.new!(rules: [allow: [@gh]])

      for path <- ["/repos/myorg/../x", "/repos/myorg/%2e%2e/x", "/repos/myorg/%2E%2E/x", "/repos/myorgx"] do
        assert NetworkPolicy.evaluate(policy, "https://api.github.com" <> path, method: "GET") ==
                 {{:deny, :default_deny}, nil},
               path
      end

      for path <- ["/repos/myorg/%2E%2E%2Fx", "/repos/myorg//../x", "/../repos/myorg/x", "/repos/myorg/..;/x"] do
        assert NetworkPolicy.evaluate(policy, "https://api.github.com" <> path, method: "GET") ==
                 {{:deny, :invalid_path}, %{index: 0, kind: :allow}},
               path
      end

      assert NetworkPolicy.evaluate(policy, "https://api.github.com/repos/%6Dyorg/x?a=../..", method: "GET") ==
               {:allow, %{index: 0, kind: :allow}}
    end

    test "evaluate/3 on a Request takes its method and path" do
      policy = NetworkPolicy.new!(rules: [deny: [{"a.com", paths: ["/admin/**"]}], allow: ["a.com"]])
      req = %Request{host: "a.com", method: "GET", path: "/x/../admin/y"}
      assert NetworkPolicy.evaluate(policy, req) == {{:deny, :denied_by_rule}, %{index: 0, kind: :deny}}

      assert NetworkPolicy.evaluate(policy, %{req | path: "//admin"}) ==
               {{:deny, :invalid_path}, %{index: 0, kind: :deny}}

      assert NetworkPolicy.evaluate(policy, %{req | path: "/public"}) == {:allow, %{index: 1, kind: :allow}}
    end

    test "to_sidecar_json/1 writes version 2 only for entries with conditions" do
      assert %{"version" => 1} = Condukt.JSON.decode!(NetworkPolicy.to_sidecar_json(rules: [allow: ["a.com"]]))

      assert %{"version" => 2, "rules" => [%{"hosts" => [entry, "b.com"]}]} =
               Condukt.JSON.decode!(
                 NetworkPolicy.to_sidecar_json(
                   rules: [allow: [{"A.com.", methods: ["GET"], paths: ["/%72/**"]}, "b.com"]]
                 )
               )

      assert entry == %{"host" => "a.com", "methods" => ["GET"], "paths" => ["/r/**"]}
    end
  end
end
