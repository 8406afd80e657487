defmodule Condukt.K8s.KubernetesOpsTest do
  # The operations of Condukt.Sandbox.Kubernetes (exec, read, write, edit,
  # glob, grep) through real pods/exec WebSockets to a real kubelet
  # (docs/k8s-tier.md, "The real node"): the workspace is the pod's
  # emptyDir at `:cwd` in the default image (debian:bookworm-slim, imported
  # into the node's containerd); what the tests check there they read
  # through the pod, never on the host.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Kubernetes

  @ws "/workspace"

  setup_all do
    tier = Condukt.Test.K8s.Case.start_node_tier!()
    c = tier.cluster
    conn = [server: c.server, ca_pem: File.read!(Cluster.ca(c)), token: c.token]

    {:ok, sb} =
      Sandbox.new(
        {Kubernetes, namespace: c.namespace, conn: conn, cwd: @ws, heartbeat_interval: false, ready_timeout: 60_000}
      )

    on_exit(fn -> Sandbox.shutdown(sb) end)
    %{cluster: c, sb: sb, ws: @ws}
  end

  # What is at `path` in the pod, through a command of its own.
  defp pod_file(sb, path) do
    case Sandbox.exec(sb, ~S(if [ -e "$P" ]; then base64 -w0 < "$P"; else echo MISSING; fi), env: %{"P" => path}) do
      {:ok, %{output: "MISSING\n"}} -> :missing
      {:ok, %{output: b64}} -> Base.decode64!(b64)
    end
  end

  test "exec: output interleaved, exit code, cwd, env, stateless", %{sb: sb, ws: ws} do
    assert {:ok, %{output: "hi\n", exit_code: 0}} = Sandbox.exec(sb, "echo hi")
    assert {:ok, %{output: "a\nb\nc\n", exit_code: 3}} = Sandbox.exec(sb, "echo a; echo b >&2; echo c; exit 3")
    assert {:ok, %{output: out}} = Sandbox.exec(sb, "pwd")
    assert String.trim(out) == ws
    assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "mkdir -p 'sub dir'")
    assert {:ok, %{output: out}} = Sandbox.exec(sb, "pwd", cwd: "sub dir")
    assert String.trim(out) == Path.join(ws, "sub dir")
    assert {:ok, %{output: "v $x\n"}} = Sandbox.exec(sb, "echo \"$V\" '$x'", env: %{"V" => "v"})
    # env names travel after "--": "-i" is no option (which would have
    # emptied the environment, PATH included); nil unsets
    assert {:ok, %{output: "set|\n"}} =
             Sandbox.exec(sb, ~S(echo "${PATH:+set}|$HOME"), env: [{"-i", "d"}, {"HOME", nil}])

    assert {:ok, %{output: "\n"}} = Sandbox.exec(sb, "cd /; export Q=1; echo $Q >/dev/null; echo $V")
    assert {:error, %Error{reason: :enoent, op: :exec}} = Sandbox.exec(sb, "true", cwd: "missing")
    assert {:error, %Error{reason: :invalid_command}} = Sandbox.exec(sb, "echo \0")
  end

  test "exec: a timeout kills the command and returns :timeout", %{sb: sb} do
    assert {:error, %Error{reason: :timeout, detail: %{timeout: 500, output: "before\n"}}} =
             Sandbox.exec(sb, "echo before; sleep 30", timeout: 500)
  end

  test "exec: output over the cap is dropped with a marker", %{sb: sb} do
    assert {:ok, %{output: out, exit_code: 0}} =
             Sandbox.exec(sb, "head -c 5000 /dev/zero | tr '\\0' x", max_output_bytes: 1000)

    assert out =~ "[condukt: output truncated: kept the first 1000 bytes, dropped 4000 more]"
  end

  test "write, read, edit: exact bytes, parents created, paths never reach a shell", %{sb: sb, ws: ws} do
    weird = "d ir/$(touch pwned)/'q\"; rm -rf x/-n.txt"
    content = :crypto.strong_rand_bytes(100_000) <> "tail\n"
    assert :ok = Sandbox.write(sb, weird, content)
    assert pod_file(sb, Path.join(ws, weird)) == content
    assert pod_file(sb, Path.join(ws, "pwned")) == :missing
    assert {:ok, ^content} = Sandbox.read(sb, weird)

    assert :ok = Sandbox.write(sb, "empty", "")
    assert {:ok, ""} = Sandbox.read(sb, "empty")

    assert :ok = Sandbox.write(sb, "e.txt", "one two two\n")
    assert :ok = Sandbox.edit(sb, "e.txt", "one", "1")
    assert {:ok, "1 two two\n"} = Sandbox.read(sb, "e.txt")
    assert {:error, %Error{reason: :old_text_not_unique, detail: 2}} = Sandbox.edit(sb, "e.txt", "two", "2")
    assert {:error, %Error{reason: :old_text_not_found}} = Sandbox.edit(sb, "e.txt", "zzz", "2")

    assert {:error, %Error{reason: :enoent, op: :read}} = Sandbox.read(sb, "nope")
    assert {:error, %Error{reason: :eisdir, op: :read}} = Sandbox.read(sb, ".")
    assert {:error, %Error{reason: :invalid_path}} = Sandbox.read(sb, "a\0b")
    assert {:error, %Error{reason: :enoent, op: :edit}} = Sandbox.edit(sb, "nope", "a", "b")
  end

  @tag timeout: 600_000
  test "write and read: content over one exec's stream goes in pieces", %{sb: sb} do
    big = :binary.copy(:crypto.strong_rand_bytes(1024 * 1024), 17) <> "end"
    assert :ok = Sandbox.write(sb, "big.bin", big)
    {:ok, %{output: sum}} = Sandbox.exec(sb, "sha256sum big.bin | cut -d' ' -f1")
    assert String.trim(sum) == Base.encode16(:crypto.hash(:sha256, big), case: :lower)
    assert {:ok, ^big} = Sandbox.read(sb, "big.bin")
  end

  test "glob and grep: Local's semantics and result shapes", %{sb: sb} do
    :ok = Sandbox.write(sb, "proj/lib/a.ex", "defmodule A do\n  # TODO: one\nend\n")
    :ok = Sandbox.write(sb, "proj/lib/y/b.ex", "todo two\n")
    :ok = Sandbox.write(sb, "proj/.git/c.ex", "TODO hidden\n")
    :ok = Sandbox.write(sb, "proj/bin.dat", <<"TODO", 0, 1, 2>>)

    assert {:ok, ["proj/lib/a.ex", "proj/lib/y/b.ex"]} = Sandbox.glob(sb, "proj/**/*.ex")

    assert {:ok, ["proj/.git/c.ex", "proj/lib/a.ex", "proj/lib/y/b.ex"]} =
             Sandbox.glob(sb, "proj/**/*.ex", match_dot: true)

    assert {:ok, ["proj/lib/a.ex"]} = Sandbox.glob(sb, "proj/lib/*.{ex,exs}")
    assert {:ok, []} = Sandbox.glob(sb, "nothing/**")
    assert {:error, %Error{reason: :invalid_pattern}} = Sandbox.glob(sb, "proj/{a")

    assert {:ok, [%{path: "proj/lib/a.ex", line_number: 2, line: "  # TODO: one"}]} =
             Sandbox.grep(sb, "TODO", path: "proj")

    assert {:ok, [%{path: "proj/lib/a.ex"}, %{path: "proj/lib/y/b.ex", line_number: 1}]} =
             Sandbox.grep(sb, "todo", path: "proj", ignore_case: true)

    assert {:ok, [_, _]} = Sandbox.grep(sb, "TODO", path: "proj", hidden: true)
    assert {:ok, [%{path: "proj/lib/y/b.ex"}]} = Sandbox.grep(sb, "t.do", path: "proj", glob: "lib/y/*.ex")
    assert {:ok, []} = Sandbox.grep(sb, "t.do", path: "proj", literal: true)
    assert {:error, %Error{reason: :invalid_pattern}} = Sandbox.grep(sb, "(", path: "proj")
    assert {:error, %Error{reason: :enoent}} = Sandbox.grep(sb, "x", path: "missing")
    assert {:error, :not_supported} = Sandbox.mount(sb, "/tmp", "/x")
  end
end
