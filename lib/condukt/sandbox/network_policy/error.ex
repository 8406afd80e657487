defmodule Condukt.Sandbox.NetworkPolicy.Error do
  @moduledoc """
  A policy that `Condukt.Sandbox.NetworkPolicy.new/1` refused.

  Every error names its culprit: `:rule_index` (the position in `:rules`,
  `nil` for a policy-level key), `:key` (the rule kind, decide option or
  policy key at fault) and `:value` (the offending value). `:reason` is one
  of the atoms below; `message/1` renders a sentence.

  | reason                   | meaning |
  |--------------------------|---------|
  | `:invalid_policy`        | not a keyword list, map or `%NetworkPolicy{}` |
  | `:unknown_key`           | a policy key other than `:rules`, `:default`, `:body_preview`, `:redact_headers` and `:redact_body` |
  | `:invalid_rules`         | `:rules` is not a list |
  | `:invalid_rule`          | a rule is not a `{kind, value}` pair |
  | `:unknown_rule_kind`     | a kind other than `:allow`, `:deny`, `:decide` |
  | `:empty_host_list`       | `allow: []` or `deny: []` |
  | `:invalid_host_list`     | the value of `allow:`/`deny:` is not a list of strings |
  | `:invalid_pattern`       | a host pattern is malformed (`:detail` holds the code of docs/host-matching.md §2) |
  | `:invalid_callable`      | a decide callable of the wrong shape or arity |
  | `:missing_call`          | a configured decide rule without `:call` |
  | `:unknown_decide_option` | a decide option other than the five documented ones |
  | `:invalid_decide_option` | a decide option with a value of the wrong type or range |
  | `:invalid_default`       | `:default` other than `:allow` or `:deny` |
  | `:too_many_rules`        | more rules than the sidecar loads (4096) |
  | `:too_many_patterns`     | more patterns in one rule than the sidecar loads (4096) |
  | `:document_too_large`    | the sidecar document would exceed 4 MiB |
  | `:invalid_capture_option` | `:body_preview`, `:redact_headers` or `:redact_body` of the wrong type or range (`:detail` says what is expected) |
  | `:unreachable_rule`      | a rule after a decide rule, which answers every request that reaches it: the rule would never be consulted (`:detail` is the decide rule's index) |
  """

  @type reason ::
          :invalid_policy
          | :unknown_key
          | :invalid_rules
          | :invalid_rule
          | :unknown_rule_kind
          | :empty_host_list
          | :invalid_host_list
          | :invalid_pattern
          | :invalid_callable
          | :missing_call
          | :unknown_decide_option
          | :invalid_decide_option
          | :invalid_default
          | :too_many_rules
          | :too_many_patterns
          | :document_too_large
          | :unreachable_rule
          | :invalid_capture_option

  @type t :: %__MODULE__{
          reason: reason(),
          rule_index: non_neg_integer() | nil,
          key: atom() | nil,
          value: term(),
          detail: term()
        }

  defexception [:reason, :rule_index, :key, :value, :detail]

  @impl true
  def message(%__MODULE__{} = error), do: where(error) <> what(error)

  defp where(%{rule_index: nil, key: nil}), do: "network policy: "
  defp where(%{rule_index: nil, key: key}), do: "network policy #{inspect(key)}: "
  defp where(%{rule_index: i, key: key}), do: "network policy rule #{i} (#{inspect(key)}): "

  defp what(%{reason: :invalid_policy, value: v}),
    do: "expected a keyword list, a map or a %NetworkPolicy{}, got: #{inspect(v)}"

  defp what(%{reason: :unknown_key, value: v, detail: hint}),
    do:
      "unknown key #{inspect(v)}#{hint(hint)}; the keys are :rules, :default, :body_preview, " <>
        ":redact_headers and :redact_body"

  defp what(%{reason: :invalid_capture_option, value: v, detail: expected}),
    do: "expected #{expected}, got: #{inspect(v)}"

  defp what(%{reason: :invalid_rules, value: v}),
    do: "expected :rules to be a keyword list of rules, got: #{inspect(v)}"

  defp what(%{reason: :invalid_rule, value: v}),
    do: "expected a {kind, value} pair such as allow: [\"api.github.com\"], got: #{inspect(v)}"

  defp what(%{reason: :unknown_rule_kind, value: v, detail: hint}),
    do: "unknown rule kind #{inspect(v)}#{hint(hint)}; the kinds are :allow, :deny and :decide"

  defp what(%{reason: :empty_host_list}),
    do: "the host list is empty; a rule needs at least one host pattern"

  defp what(%{reason: :invalid_host_list, value: v}),
    do: "expected a non-empty list of host pattern strings, got: #{inspect(v)}"

  defp what(%{reason: :invalid_pattern, value: v, detail: code}),
    do: "invalid host pattern #{inspect(v)} (#{code}): #{pattern_advice(code)}"

  defp what(%{reason: :invalid_callable, value: v, detail: detail}),
    do: "invalid decide callable #{inspect(v)}: #{detail}"

  defp what(%{reason: :missing_call, value: v}),
    do: "a configured decide rule needs :call, got: #{inspect(v)}"

  defp what(%{reason: :unknown_decide_option, value: v, detail: hint}),
    do:
      "unknown decide option #{inspect(v)}#{hint(hint)}; the options are " <>
        ":call, :timeout, :cache, :context_messages and :context_metadata"

  defp what(%{reason: :invalid_decide_option, value: v, detail: expected}),
    do: "expected #{expected}, got: #{inspect(v)}"

  defp what(%{reason: :invalid_default, value: v}),
    do: "expected :allow or :deny, got: #{inspect(v)}"

  defp what(%{reason: :too_many_rules, value: n, detail: max}),
    do: "#{n} rules, but the sidecar loads at most #{max}"

  defp what(%{reason: :too_many_patterns, value: n, detail: max}),
    do: "#{n} host patterns in one rule, but the sidecar loads at most #{max}"

  defp what(%{reason: :document_too_large, value: n, detail: max}),
    do: "the sidecar document would be #{n} bytes, over the #{max}-byte limit"

  defp what(%{reason: :unreachable_rule, detail: decide}),
    do:
      "unreachable: rule #{decide} (:decide) before it answers every request that reaches it, " <>
        "so this rule is never consulted; move it before rule #{decide}, or remove it"

  defp hint(nil), do: ""
  defp hint(suggestion), do: " (did you mean #{inspect(suggestion)}?)"

  defp pattern_advice(:empty), do: "a pattern cannot be empty"
  defp pattern_advice(:scheme), do: "write the host only, without a scheme and \"://\""

  defp pattern_advice(:cidr),
    do:
      "CIDR ranges are not host patterns; a rule names host names and single IP addresses, " <>
        "so list the addresses one by one (\"10.0.0.1\") or name the hosts " <>
        "(private ranges are refused by the sidecar anyway, unless allowed with :network_policy_allow_private)"

  defp pattern_advice(:path), do: "write the host only, without a path, query or fragment"
  defp pattern_advice(:port), do: "policies match hosts on every port; drop the \":port\""
  defp pattern_advice(:star_run), do: "use * (one label) or ** (several labels), never ***"
  defp pattern_advice(:empty_label), do: "a host has no empty labels (\"..\" or a leading \".\")"
  defp pattern_advice(:bad_char), do: "host labels may contain letters, digits, \"-\", \"_\" and \"*\""
  defp pattern_advice(:bad_utf8), do: "the pattern is not valid UTF-8"
  defp pattern_advice(:wildcard_idn), do: "\"*\" cannot share a label with non-ASCII characters"
  defp pattern_advice(:label_too_long), do: "a label is longer than 63 bytes (after IDN conversion)"
  defp pattern_advice(:name_too_long), do: "the host is longer than 253 bytes (after IDN conversion)"
  defp pattern_advice(:bad_ip), do: "not a valid IPv4 or IPv6 address"
end
