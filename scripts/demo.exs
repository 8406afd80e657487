# The main job: the embedded default, for real, on one machine.
#
# A Condukt.Sandbox.Local session with the seeds' kind of policy (a deny,
# an allow, and an Elixir function decider) runs real clients (curl,
# Python requests, Node fetch, git) against a small local "internet": a
# network namespace with nginx, a git server and a few names, built by the
# same testbed the end-to-end tests use (Condukt.Dev.Netns under dev/, docs/
# e2e-testbed.md). The session's commands run in their own namespace behind
# the real condukt-egress sidecar (docs/local-network.md); every request is
# decided there or, for the decide rule, by the function below on this
# BEAM, and comes back as :telemetry events, printed as a live table.
#
# Needs root (network namespaces, iptables). Works offline.

alias Condukt.Sandbox
alias Condukt.Sandbox.NetworkPolicy
alias Condukt.Dev.Netns.{Testbed, Tier}

case Tier.check() do
  :ok ->
    :ok

  {:skip, reason} ->
    IO.puts(:stderr, "The demo needs what the end-to-end tier needs: #{reason}")
    System.halt(1)
end

# ── the live table ─────────────────────────────────────────────────────────
defmodule Demo.Table do
  @columns [{"event", 16}, {"method", 6}, {"url", 34}, {"status", 6}, {"rule", 11}, {"in/out", 13}, {"reason", 44}]

  def header do
    IO.puts(row(Enum.map(@columns, &elem(&1, 0))))
    IO.puts(String.duplicate("─", Enum.sum(Enum.map(@columns, &(elem(&1, 1) + 1)))))
  end

  def handle([_, _, _, :decider_failure], %{count: n}, meta, _) do
    IO.puts(row(["decider_failure", "", "", "", "", "#{n}", inspect(meta.reason)]))
  end

  def handle([_, _, _, event], measurements, meta, _) do
    req = meta.request

    url =
      if req.host,
        do: "#{req.scheme}://#{req.host}#{if req.port in [80, 443], do: "", else: ":#{req.port}"}#{req.path}",
        else: ""

    rule =
      case meta.matched_rule do
        %{index: i, kind: kind} -> "#{i} (#{kind})"
        nil when event in [:request_allowed, :request_denied] -> "default"
        nil -> ""
      end

    bytes =
      if event in [:request_closed, :request_failed], do: "#{measurements.bytes_in}/#{measurements.bytes_out}", else: ""

    IO.puts(
      row([to_string(event), req.method || "", url, to_string(req.status || ""), rule, bytes, reason(meta.reason)])
    )
  end

  defp reason(nil), do: ""
  defp reason(r) when is_atom(r), do: inspect(r)
  defp reason(r), do: r

  defp row(cells) do
    @columns
    |> Enum.zip(cells)
    |> Enum.map_join(" ", fn {{_, w}, c} -> c |> to_string() |> String.slice(0, w) |> String.pad_trailing(w) end)
  end
end

# ── the local internet ─────────────────────────────────────────────────────
IO.puts("Building a small local internet (nginx, a git server) in a network namespace…")
tb = Testbed.start(on_exit: false, big_size: 64 * 1024)

try do
  names = ~w(allowed.test denied.test decide.test other.test git.test registry.test)

  # ── the policy: a deny, an allow and an Elixir function decider ──────────
  decider = fn ctx, req ->
    if req.host == "decide.test" and ctx.metadata.purpose == "demo",
      do: :allow,
      else: {:deny, "#{req.host} is not needed for this task"}
  end

  policy =
    NetworkPolicy.new!(
      rules: [
        deny: ["denied.test"],
        allow: ["allowed.test", "git.test", "registry.test"],
        decide: [call: decider, timeout: 2_000, context_metadata: %{purpose: "demo"}]
      ],
      default: :deny
    )

  events = ~w(request_opened request_allowed request_denied request_closed request_failed decider_failure)a

  :ok =
    :telemetry.attach_many(
      "demo",
      Enum.map(events, &[:condukt, :sandbox, :network_policy, &1]),
      &Demo.Table.handle/4,
      nil
    )

  work = Testbed.scratch_dir(tb)
  # An enforced session never runs as root: by default as nobody (65534),
  # so the work directory is given to nobody, which can then clone into
  # it; it is the session's HOME too (the BEAM's, /root, is not its).
  File.chown!(work, 65_534)

  {:ok, sb} =
    Sandbox.new(
      {Sandbox.Local,
       id: "demo-session",
       cwd: work,
       env: %{"HOME" => work},
       network_policy: policy,
       network_policy_required: true,
       network: [
         uplink: {:netns, tb.inet_ns},
         hosts: Map.new(names, &{&1, tb.inet.v4}),
         allow_private: [tb.inet.v4 <> "/32"],
         upstream_ca: tb.ca_cert
       ]}
    )

  IO.puts("Session namespace #{sb.state.network.name}; sidecar pid #{sb.state.network.proxy_pid}.\n")

  commands = [
    {"curl, an allowed host", "curl -sS https://allowed.test/"},
    {"curl, plain HTTP (the proxy resolves Host itself)", "curl -sS http://allowed.test/"},
    {"Python requests, decided by the Elixir function: allow",
     ~S|python3 -c 'import requests; r = requests.get("https://decide.test/"); print(r.status_code, r.text.strip())'|},
    {"Node fetch, decided by the Elixir function: deny",
     ~S|node -e 'fetch("https://other.test/x").then(async r => console.log(r.status, (await r.text()).trim()))'|},
    {"curl, a denied host", "curl -sS https://denied.test/"},
    {"git clone over HTTPS", "git clone -q https://git.test/repo.git && head -1 repo/README.md"},
    {"a port the policy cannot see (TCP 8080): rejected by the kernel",
     "curl -sS --max-time 3 http://#{tb.inet.v4}:8080/ || echo \"exit $?\""},
    {"flushing the rules from inside the session", "iptables -t nat -F 2>&1 || echo \"exit $?\""}
  ]

  # ── a package install: pip from the local internet's PyPI ───────────────
  # registry.test serves a PyPI simple index with one wheel (and npm, cargo,
  # Go and Maven registries: Condukt.Dev.Netns.Registries). pip trusts the
  # sidecar through PIP_CERT; Debian's Python wants --target here.
  commands =
    commands ++
      [
        {"pip install from the local PyPI",
         "PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check --no-cache-dir " <>
           "--target pkgs --index-url https://registry.test/pypi/simple/ condukt-hello && " <>
           ~S|PYTHONPATH=pkgs python3 -c 'import condukt_hello; print(condukt_hello.hello())'|}
      ]

  Demo.Table.header()

  results =
    for {title, command} <- commands do
      {:ok, %{output: out, exit_code: code}} = Sandbox.exec(sb, command, timeout: 30_000)
      # Let the request's last events print before the next command.
      Process.sleep(150)
      {title, command, code, out}
    end

  IO.puts("\nWhat each command saw:")

  for {title, command, code, out} <- results do
    IO.puts(
      "\n  #{title}\n  $ #{command}\n  exit #{code}: " <> (out |> String.trim() |> String.replace("\n", "\n    "))
    )
  end

  :ok = Sandbox.shutdown(sb)
  :telemetry.detach("demo")
  IO.puts("\nSession shut down: namespace, sidecar and secrets removed.")

  # ── second act: an agent session whose policy asks a model ───────────────
  # A Condukt.Session (use Condukt) with the same local internet; its
  # decide rule is AgentDecider running a gatekeeper agent on a real local
  # model (SmolLM2-135M through llama.cpp's server, installed by
  # scripts/setup-llm.sh). Skipped, with the reason, when it is missing.
  case Condukt.Dev.LLM.check() do
    {:skip, reason} ->
      IO.puts("\nSecond act skipped (an agent deciding): #{reason}")

    :ok ->
      IO.puts("\nSecond act: an agent session; the decide rule asks a local model (SmolLM2-135M)…")
      model = Condukt.Dev.LLM.openai_options()

      defmodule Demo.Coder do
        use Condukt
        def system_prompt, do: "You are a coding agent. Answer in one short sentence."
        def tools, do: Condukt.Tools.coding_tools()
      end

      agent_policy =
        NetworkPolicy.new!(
          rules: [
            deny: ["denied.test"],
            decide: [
              call: {NetworkPolicy.AgentDecider, [agent: Condukt.Dev.NetGuard] ++ model},
              timeout: 30_000
            ]
          ],
          default: :deny
        )

      :ok =
        :telemetry.attach_many(
          "demo-agent",
          Enum.map(events, &[:condukt, :sandbox, :network_policy, &1]),
          &Demo.Table.handle/4,
          nil
        )

      {:ok, agent} =
        Demo.Coder.start_link(
          [
            id: "demo-agent-session",
            sandbox:
              {Sandbox.Local,
               cwd: work,
               network_policy: agent_policy,
               network_policy_required: true,
               network: [
                 uplink: {:netns, tb.inet_ns},
                 hosts: Map.new(names, &{&1, tb.inet.v4}),
                 allow_private: [tb.inet.v4 <> "/32"],
                 upstream_ca: tb.ca_cert
               ]}
          ] ++ model
        )

      prompt = "Fetch the project page from decide.test and tell me what it says."
      {:ok, reply} = Condukt.Session.run(agent, prompt)
      IO.puts("  user: #{prompt}\n  model: #{String.trim(reply)}\n")

      # The session's Bash tool, as the model would call it.
      ctx = %{sandbox: Condukt.Session.sandbox(agent), session_id: "demo-agent-session", agent: Demo.Coder}
      Demo.Table.header()

      seen =
        for url <- ~w(https://decide.test/ https://other.test/ https://denied.test/) do
          {_, out} = Condukt.Tool.run(Condukt.Tools.Bash, %{"command" => "curl -sS --max-time 40 #{url}"}, ctx)
          Process.sleep(150)
          {url, out}
        end

      IO.puts("\nWhat the agent's commands saw:")

      for {url, out} <- seen,
          do: IO.puts("\n  $ curl #{url}\n    " <> (out |> String.trim() |> String.replace("\n", "\n    ")))

      Condukt.Session.stop(agent)
      :telemetry.detach("demo-agent")
      IO.puts("\nAgent session stopped; its sandbox was shut down with it.")
  end
after
  Testbed.stop(tb)
end
