# The main job, until the data plane exists: the seeds' example policy,
# validated on the BEAM, compiled to the sidecar document, and evaluated by
# both engines — NetworkPolicy.evaluate/2 in Elixir and the real
# `condukt-egress policy eval` in C — on a handful of URLs, side by side.
# Exits non-zero if the two ever disagree.

alias Condukt.Sandbox.NetworkPolicy

# The seed uses {AgentDecider, agent: MyApp.NetGuard}; the agent runtime is
# not part of this build yet, so the decide rule here is a plain function.
policy =
  NetworkPolicy.new!(%NetworkPolicy{
    rules: [
      deny: ["*.internal.example.com"],
      allow: ["api.github.com", "*.openai.com"],
      decide: [call: fn _ctx, req -> if req.host =~ "pypi", do: :allow, else: {:deny, :not_needed} end, timeout: 2_000]
    ],
    default: :deny
  })

urls = [
  "https://api.github.com/repos/elixir-lang/elixir",
  "https://API.GitHub.com./graphql",
  "https://api.openai.com/v1/chat/completions",
  "https://db.internal.example.com/admin",
  "https://api.github.com.evil.net/exfil",
  "https://api.github.com@evil.net/",
  "https://evil.net\\@api.github.com/",
  "https://127.1/",
  "http://[::ffff:10.0.0.1]:8080/",
  "https://pypi.org/simple/requests/",
  "ftp://api.github.com/"
]

dir = Path.join(System.tmp_dir!(), "condukt-demo-#{System.unique_integer([:positive])}")
File.mkdir_p!(dir)
file = Path.join(dir, "policy.json")
File.write!(file, NetworkPolicy.to_sidecar_json(policy))

IO.puts("Sidecar policy document (#{file}):\n  #{File.read!(file)}\n")

show = fn
  :allow -> "allow"
  {:deny, reason} -> "deny (#{reason})"
  {:decide, i} -> "decide (rule #{i})"
end

from_c = fn out ->
  case Condukt.JSON.decode!(out) do
    %{"decision" => "deny", "reason" => r} -> "deny (#{r})"
    %{"decision" => "decide", "matched_rule" => %{"index" => i}} -> "decide (rule #{i})"
    %{"decision" => d} -> d
  end
end

row = fn cols ->
  cols |> Enum.zip([50, 22, 14, 22]) |> Enum.map_join(" ", fn {c, w} -> String.pad_trailing(c, w) end)
end

IO.puts(row.(["URL", "Elixir evaluate/2", "matched rule", "C policy eval"]))
IO.puts(String.duplicate("-", 111))

disagreements =
  Enum.count(urls, fn url ->
    {decision, matched} = NetworkPolicy.evaluate(policy, url)
    {out, 0} = System.cmd(Condukt.egress_binary(), ["policy", "eval", file, url])
    c = from_c.(out)

    rule =
      cond do
        matched -> "#{matched.index} (#{matched.kind})"
        match?({:deny, r} when r in [:invalid_host, :invalid_url], decision) -> "none"
        true -> "default"
      end

    IO.puts(row.([url, show.(decision), rule, c]))
    show.(decision) != c
  end)

IO.puts("\nA bad policy is refused before it can reach a sidecar:")

case NetworkPolicy.new(rules: [allow: ["https://api.github.com"]]) do
  {:error, error} -> IO.puts("  " <> Exception.message(error))
end

File.rm_rf!(dir)

if disagreements > 0 do
  IO.puts(:stderr, "\n#{disagreements} disagreement(s) between the Elixir and C evaluators")
  System.halt(1)
else
  IO.puts("\nBoth evaluators agree on all #{length(urls)} URLs.")
end
