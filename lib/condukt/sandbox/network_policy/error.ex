defmodule Condukt.Sandbox.NetworkPolicy.Error do
  @moduledoc """
  A policy that `Condukt.Sandbox.NetworkPolicy.new/1` refused.

  Every error names its culprit: `:rule_index` (the position in `:rules`,
  `nil` for a policy-level key), `:credential_index` (the position in
  `:credentials`, or `nil`), `:key` (the rule kind, decide option or
  policy key at fault) and `:value` (the offending value; a secret's name,
  never its value). `:reason` is one of the atoms below; `message/1`
  renders a sentence.

  | reason                   | meaning |
  |--------------------------|---------|
  | `:invalid_policy`        | not a keyword list, map or `%NetworkPolicy{}` |
  | `:unknown_key`           | a policy key other than `:rules`, `:default`, `:body_preview`, `:redact_headers`, `:redact_body`, `:credentials` and `:secrets` |
  | `:invalid_rules`         | `:rules` is not a list |
  | `:invalid_rule`          | a rule is not a `{kind, value}` pair |
  | `:unknown_rule_kind`     | a kind other than `:allow`, `:deny`, `:decide` |
  | `:empty_host_list`       | `allow: []` or `deny: []` |
  | `:invalid_host_list`     | the value of `allow:`/`deny:` is not a list of host patterns and `{host, options}` entries |
  | `:invalid_pattern`       | a host pattern is malformed (`:detail` holds the code of docs/host-matching.md §2) |
  | `:invalid_entry`         | a `{host, options}` entry whose options are not a keyword list, are empty, or repeat a key (`:detail` says which) |
  | `:unknown_entry_option`  | an entry option other than `:methods` and `:paths` |
  | `:invalid_condition_list`| `:methods` or `:paths` is not a non-empty list of strings |
  | `:too_many_conditions`   | more methods (64) or paths (256) in one entry than the sidecar loads |
  | `:invalid_method`        | a method that is not an upper-case token (`A-Z`, `0-9`, `-`, `_`; at most 32 bytes) |
  | `:invalid_path_pattern`  | a path pattern is malformed (`:detail` holds the code of docs/path-matching.md §2) |
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
  | `:invalid_credentials`   | `:credentials` is not a list |
  | `:invalid_credential`    | a credential entry of the wrong shape, without `:header` or `:value`, or whose `:value` is not `{:secret, name}` (`:detail` says which) |
  | `:unknown_credential_option` | a credential option other than `:header`, `:value`, `:methods` and `:paths` |
  | `:invalid_credential_header` | a header name that is not a token, or a field the proxy owns (`:detail` says which) |
  | `:too_many_credentials`  | more than 256 credentials or secrets |
  | `:invalid_secrets`       | `:secrets` is not a map |
  | `:invalid_secret_name`   | a secret name that is not 1 to 128 bytes of `A-Z`, `a-z`, `0-9`, `.`, `_`, `-` |
  | `:invalid_secret`        | a secret's source is not a 0-arity function, `{:env, var}` or a valid header value (`:detail` says why, without the value) |
  | `:unknown_secret`        | a credential names a secret that `:secrets` does not define |
  | `:unused_secret`         | a secret that no credential names |
  | `:credentials_unsupported` | a sandbox without a sidecar (`Condukt.Sandbox.Virtual`) was given a policy with credentials (`:value` is the sandbox module) |
  | `:rotation_failed`       | `rotate_credential/3` on a sandbox without a policy or sidecar, or a sidecar that did not confirm in time (`:detail` says which) |
  | `:secret_unavailable`    | when a sandbox starts or a credential is rotated: a secret's environment variable is not set, its function failed, or its value is not a header value |
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
          | :invalid_entry
          | :unknown_entry_option
          | :invalid_condition_list
          | :too_many_conditions
          | :invalid_method
          | :invalid_path_pattern
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
          | :invalid_credentials
          | :invalid_credential
          | :unknown_credential_option
          | :invalid_credential_header
          | :too_many_credentials
          | :invalid_secrets
          | :invalid_secret_name
          | :invalid_secret
          | :unknown_secret
          | :unused_secret
          | :secret_unavailable
          | :rotation_failed
          | :credentials_unsupported

  @type t :: %__MODULE__{
          reason: reason(),
          rule_index: non_neg_integer() | nil,
          credential_index: non_neg_integer() | nil,
          key: atom() | nil,
          value: term(),
          detail: term()
        }

  defexception [:reason, :rule_index, :credential_index, :key, :value, :detail]

  @impl true
  def message(%__MODULE__{} = error), do: where(error) <> what(error)

  defp where(%{credential_index: i, key: key}) when is_integer(i),
    do: "network policy credential #{i} (#{inspect(key)}): "

  defp where(%{rule_index: nil, key: nil}), do: "network policy: "
  defp where(%{rule_index: nil, key: key}), do: "network policy #{inspect(key)}: "
  defp where(%{rule_index: i, key: key}), do: "network policy rule #{i} (#{inspect(key)}): "

  defp what(%{reason: :invalid_policy, value: v}),
    do: "expected a keyword list, a map or a %NetworkPolicy{}, got: #{inspect(v)}"

  defp what(%{reason: :unknown_key, value: v, detail: hint}),
    do:
      "unknown key #{inspect(v)}#{hint(hint)}; the keys are :rules, :default, :body_preview, " <>
        ":redact_headers, :redact_body, :credentials and :secrets"

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
    do:
      "expected a non-empty list of host patterns (strings, or {host, methods: [...], paths: [...]}), " <>
        "got: #{inspect(v)}"

  defp what(%{reason: :invalid_entry, value: v, detail: detail}),
    do: "invalid entry #{inspect(v)}: #{detail}"

  defp what(%{reason: :unknown_entry_option, value: v, detail: hint}),
    do: "unknown entry option #{inspect(v)}#{hint(hint)}; the options are :methods and :paths"

  defp what(%{reason: :invalid_condition_list, value: v}),
    do: "expected a non-empty list of strings, got: #{inspect(v)}"

  defp what(%{reason: :too_many_conditions, value: n, detail: max}),
    do: "#{n} entries, but the sidecar loads at most #{max}"

  defp what(%{reason: :invalid_method, value: v}),
    do:
      "invalid method #{inspect(v)}: methods are matched case-sensitively and written as " <>
        "upper-case tokens (A-Z, 0-9, \"-\", \"_\"; at most 32 bytes), such as \"GET\""

  defp what(%{reason: :invalid_path_pattern, value: v, detail: code}),
    do: "invalid path pattern #{inspect(v)} (#{code}): #{path_advice(code)}"

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

  defp what(%{reason: :invalid_credentials, value: v}),
    do: "expected :credentials to be a list of {host, header: ..., value: {:secret, name}}, got: #{inspect(v)}"

  defp what(%{reason: :invalid_credential, value: v, detail: detail}),
    do: "invalid credential #{inspect(v)}: #{detail}"

  defp what(%{reason: :unknown_credential_option, value: v, detail: hint}),
    do: "unknown credential option #{inspect(v)}#{hint(hint)}; the options are :header, :value, :methods and :paths"

  defp what(%{reason: :invalid_credential_header, value: v, detail: detail}),
    do: "invalid header #{inspect(v)}: #{detail}"

  defp what(%{reason: :too_many_credentials, value: n, detail: max}),
    do: "#{n} entries, but the sidecar loads at most #{max}"

  defp what(%{reason: :invalid_secrets, value: v}),
    do: "expected :secrets to be a map of secret names to sources, got: #{inspect(v)}"

  defp what(%{reason: :invalid_secret_name, value: v}),
    do: "invalid secret name #{inspect(v)}: 1 to 128 bytes of A-Z, a-z, 0-9, \".\", \"_\" and \"-\""

  defp what(%{reason: :invalid_secret, value: name, detail: why}),
    do: "secret #{inspect(name)}: #{why}"

  defp what(%{reason: :unknown_secret, value: name}),
    do: "the credential names the secret #{inspect(name)}, which :secrets does not define"

  defp what(%{reason: :unused_secret, value: name}),
    do: "the secret #{inspect(name)} is not named by any credential (a misspelt name?)"

  defp what(%{reason: :secret_unavailable, value: name, detail: why}),
    do: "the value of the secret #{inspect(name)} is not available: #{why}"

  defp what(%{reason: :credentials_unsupported, value: module}),
    do:
      "#{inspect(module)} has no sidecar to hold secrets apart from the workspace, so it cannot inject " <>
        "credentials; run the session in Condukt.Sandbox.Local or Condukt.Sandbox.Kubernetes, or drop :credentials"

  defp what(%{reason: :rotation_failed, value: name, detail: why}),
    do: "the secret #{inspect(name)} was not rotated: #{why}"

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

  # In the words of the sidecar (c_src/policy/path.c).
  defp path_advice(:empty), do: "a path pattern cannot be empty; \"/**\" matches every path"
  defp path_advice(:too_long), do: "a path pattern is at most 1024 bytes"
  defp path_advice(:not_absolute), do: "a path pattern starts with \"/\""
  defp path_advice(:query), do: "a path pattern has no query or fragment: the query is never matched"

  defp path_advice(:invalid_byte),
    do: "write visible ASCII only, no \"\\\", and %-escapes as \"%\" and two hex digits"

  defp path_advice(:encoded_separator),
    do: "%2F, %5C and %00 are refused in request paths, so a pattern cannot name them"

  defp path_advice(:empty_segment), do: "\"//\" is refused in request paths, so a pattern cannot name it"

  defp path_advice(:dot_segment),
    do: "request paths are matched with \".\" and \"..\" removed; write the path they lead to"

  defp path_advice(:stars), do: "\"**\" must be a whole segment (\"/a/**\"); use \"*\" inside a segment"
end
