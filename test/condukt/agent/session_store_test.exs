defmodule Condukt.SessionStore.DiskTest do
  use ExUnit.Case, async: true

  alias Condukt.{Error, Message}
  alias Condukt.SessionStore.Disk

  @moduletag :tmp_dir

  defmodule Agent0 do
    use Condukt
    def model, do: "openai:none"
    def model_options, do: [base_url: "http://127.0.0.1:9/v1", retries: 0]
  end

  test "save, load, clear; every message field survives", %{tmp_dir: dir} do
    opts = [dir: dir]

    messages = [
      Message.user("hi"),
      Message.assistant(nil, [%{id: "c1", name: "Read", arguments: %{"path" => "a"}}]),
      Message.tool_result("c1", "Read", "no such file", true),
      Message.assistant("done")
    ]

    assert :not_found = Disk.load("job-1", opts)
    assert :ok = Disk.save("job-1", messages, opts)
    assert {:ok, ^messages} = Disk.load("job-1", opts)
    assert Path.basename(Disk.path("job-1", opts)) == "job-1.json"
    assert :ok = Disk.clear("job-1", opts)
    assert :ok = Disk.clear("job-1", opts)
    assert :not_found = Disk.load("job-1", opts)
    # No temporary file is left behind.
    assert File.ls!(dir) == []
  end

  test "an id never names a path outside the directory", %{tmp_dir: dir} do
    for id <- ["../../etc/passwd", ".hidden", "a/b", {:job, 1}, String.duplicate("x", 200)] do
      path = Disk.path(id, dir: dir)
      assert Path.dirname(path) == dir
      assert Path.basename(path) =~ ~r/\A[0-9a-f]{64}\.json\z/
    end

    assert Path.basename(Disk.path(42, dir: dir)) == "42.json"
  end

  test "a damaged snapshot stops the session from starting, with the reason", %{tmp_dir: dir} do
    File.write!(Path.join(dir, "s1.json"), "{not json")
    store = {Disk, dir: dir}
    assert {:error, %Error{reason: :session_store} = e} = Agent0.start_link(id: "s1", session_store: store, cwd: dir)
    assert Exception.message(e) =~ "not JSON"

    File.write!(Path.join(dir, "s2.json"), ~s({"version": 1, "messages": [{"role": "robot"}]}))
    assert {:error, %Error{reason: :session_store}} = Agent0.start_link(id: "s2", session_store: store, cwd: dir)
  end
end
