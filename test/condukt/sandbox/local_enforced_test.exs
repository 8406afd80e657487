defmodule Condukt.Sandbox.LocalEnforcedTest do
  # Condukt.Sandbox.Local with a network policy, through the facade: the
  # session's commands run behind the real sidecar (netns tier).
  use Condukt.Test.Netns.Case, async: false

  import ExUnit.CaptureLog

  alias Condukt.Sandbox
  alias Condukt.Sandbox.NetworkPolicy

  setup_all do
    %{tb: Testbed.start(big_size: 1024)}
  end

  defp network(tb, extra \\ []) do
    [
      uplink: {:netns, tb.inet_ns},
      hosts: Map.new(~w(allowed.test denied.test other.test), &{&1, tb.inet.v4}),
      allow_private: [tb.inet.v4 <> "/32"],
      upstream_ca: tb.ca_cert,
      binary: Condukt.Test.Netns.Sidecar.bin()
    ]
    |> Keyword.merge(extra)
  end

  defp policy, do: NetworkPolicy.new!(rules: [deny: ["denied.test"], allow: ["allowed.test"]], default: :deny)

  test "exec runs behind the sidecar; shutdown removes the namespace", %{tb: tb} do
    cwd = Path.join(tb.dir, "scratch/local-#{System.unique_integer([:positive])}")
    File.mkdir_p!(cwd)

    {:ok, sb} = Sandbox.new({Sandbox.Local, cwd: cwd, id: "sess-1", network_policy: policy(), network: network(tb)})

    net = sb.state.network
    assert net.name in Testbed.list_namespaces()

    curl = "curl -sS --max-time 10 -w '\\n%{http_code}' "
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, curl <> "https://allowed.test/")
    assert out =~ "hello from allowed.test"
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, curl <> "https://denied.test/")
    assert out =~ ~r/\n403$/
    assert {:ok, %{output: out, exit_code: 0}} = Sandbox.exec(sb, curl <> "https://other.test/")
    assert out =~ "policy default"

    # The command starts in the sandbox's cwd, even inside the namespace.
    assert {:ok, %{output: out}} = Sandbox.exec(sb, "pwd")
    assert String.trim(out) == cwd

    # A timeout still kills the whole command inside the namespace.
    assert {:error, %Sandbox.Error{reason: :timeout}} = Sandbox.exec(sb, "sleep 30", timeout: 500)

    events = Condukt.Sandbox.Local.Network.events(net)
    assert Enum.any?(events, &(&1["event"] == "request_denied" and &1["host"] == "denied.test"))

    :ok = Sandbox.shutdown(sb)
    refute net.name in Testbed.list_namespaces()
  end

  def decider(_ctx, %{host: "decide.test"}), do: :allow
  def decider(_ctx, %{host: host}), do: {:deny, "#{host} is not needed for this task"}

  test "an Elixir decider and :telemetry handlers, through the real sidecar", %{tb: tb} do
    test = self()
    id = "telemetry-#{System.unique_integer([:positive])}"

    events =
      Enum.map(
        ~w(request_opened request_allowed request_denied request_closed request_failed decider_failure)a,
        &[:condukt, :sandbox, :network_policy, &1]
      )

    # One handler per event, attached with :telemetry.attach/4 as a user would.
    for event <- events do
      :ok =
        :telemetry.attach(
          {id, event},
          event,
          fn name, measurements, metadata, _ -> send(test, {:telemetry, name, measurements, metadata}) end,
          nil
        )
    end

    on_exit(fn -> Enum.each(events, &:telemetry.detach({id, &1})) end)

    policy =
      NetworkPolicy.new!(
        rules: [deny: ["denied.test"], allow: ["allowed.test"], decide: &__MODULE__.decider/2],
        default: :deny
      )

    hosts = Map.new(~w(allowed.test denied.test decide.test other.test), &{&1, tb.inet.v4})
    {:ok, sb} = Sandbox.new({Sandbox.Local, id: id, network_policy: policy, network: network(tb, hosts: hosts)})
    on_exit(fn -> Sandbox.shutdown(sb) end)

    curl = "curl -sS --max-time 10 -w '\\n%{http_code}' "
    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://decide.test/")
    assert out =~ "hello from decide.test"

    assert_receive {:telemetry, [_, _, _, :request_allowed], %{bytes_in: _, bytes_out: _},
                    %{request: %{host: "decide.test"}, matched_rule: %{index: 2, kind: :decide}}},
                   10_000

    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://other.test/")
    assert out =~ ~r/\n403$/
    assert out =~ "other.test is not needed for this task"

    assert_receive {:telemetry, [_, _, _, :request_denied], _,
                    %{request: %{host: "other.test"}, reason: reason, matched_rule: %{kind: :decide}}},
                   10_000

    assert reason =~ "not needed"

    assert {:ok, %{output: out}} = Sandbox.exec(sb, curl <> "https://denied.test/")
    assert out =~ ~r/\n403$/

    assert_receive {:telemetry, [_, _, _, :request_denied], _,
                    %{request: %{host: "denied.test"}, matched_rule: %{index: 0, kind: :deny}}},
                   10_000

    assert_receive {:telemetry, [_, _, _, :request_closed], %{bytes_in: bytes}, %{request: %{host: "decide.test"}}},
                   10_000

    assert bytes > 0
  end

  test "unenforceable: one warning and unenforced, or an error when required", %{tb: tb} do
    # No `setpriv` in this tool path: enforcement is impossible.
    empty = Path.join(tb.dir, "no-tools-#{System.unique_integer([:positive])}")
    File.mkdir_p!(empty)
    opts = [network_policy: policy(), network: network(tb, tool_path: empty)]

    log =
      capture_log(fn ->
        assert {:ok, sb} = Sandbox.new({Sandbox.Local, opts})
        assert sb.state.network == nil
        assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "true")
      end)

    assert log =~ "network policy is NOT enforced"
    assert log =~ "`ip`"

    assert {:error, %Sandbox.Error{reason: :network_policy_unenforceable} = e} =
             Sandbox.new({Sandbox.Local, opts ++ [network_policy_required: true]})

    assert Exception.message(e) =~ "not installed"
  end
end
