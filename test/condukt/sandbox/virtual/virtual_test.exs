defmodule Condukt.Sandbox.VirtualTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox
  alias Condukt.Sandbox.{Error, Virtual}

  @moduletag :tmp_dir
  @moduletag :virtual

  setup do
    {:ok, sb} = Sandbox.new(Virtual)
    on_exit(fn -> Sandbox.shutdown(sb) end)
    %{sb: sb}
  end

  describe "new" do
    test "the done-when example" do
      {:ok, sb} = Condukt.Sandbox.new(Condukt.Sandbox.Virtual)
      assert {:ok, %{output: "hi\n", exit_code: 0}} = Condukt.Sandbox.exec(sb, "echo hi")
    end

    test "starts in /workspace, or in :cwd (created)" do
      {:ok, sb} = Sandbox.new(Virtual)
      assert {:ok, %{output: "/workspace\n"}} = Sandbox.exec(sb, "pwd")
      {:ok, sb} = Sandbox.new({Virtual, cwd: "/srv/app"})
      assert {:ok, %{output: "/srv/app\n"}} = Sandbox.exec(sb, "pwd")
    end

    test "refuses unknown and ill-typed options, and a bad policy" do
      assert {:error, %Error{reason: :invalid_option, detail: {:unknown, :mount, :mounts}}} =
               Sandbox.new({Virtual, mount: []})

      assert {:error, %Error{reason: :invalid_option}} = Sandbox.new({Virtual, cwd: "relative"})
      assert {:error, %Error{reason: :invalid_option}} = Sandbox.new({Virtual, mounts: [{"/tmp", "rel", :readonly}]})
      assert {:error, %Error{reason: :invalid_network_policy}} = Sandbox.new({Virtual, network_policy: [rules: :x]})
    end

    test "two sandboxes share nothing" do
      {:ok, a} = Sandbox.new(Virtual)
      {:ok, b} = Sandbox.new(Virtual)
      :ok = Sandbox.write(a, "only-a.txt", "a")
      assert {:error, %Error{reason: :enoent}} = Sandbox.read(b, "only-a.txt")
    end
  end

  describe "paths" do
    test "'..' cannot leave the virtual root, and nothing of the host is visible", %{sb: sb} do
      :ok = Sandbox.write(sb, "../../../../x.txt", "root")
      assert {:ok, "root"} = Sandbox.read(sb, "/x.txt")

      assert {:error, %Error{reason: :enoent}} =
               Sandbox.read(sb, "/etc/hostname-of-the-host-#{System.unique_integer()}")

      host_file = Path.join(System.tmp_dir!(), "condukt-virtual-#{System.unique_integer([:positive])}")
      File.write!(host_file, "host secret")
      on_exit(fn -> File.rm(host_file) end)
      assert {:error, %Error{reason: :enoent}} = Sandbox.read(sb, host_file)
      assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "cat #{host_file}")
      assert code != 0
    end
  end

  describe "mounts" do
    setup %{tmp_dir: dir} do
      File.mkdir_p!(Path.join(dir, "ro"))
      File.mkdir_p!(Path.join(dir, "rw"))
      File.write!(Path.join(dir, "ro/readme.txt"), "read me\n")
      File.write!(Path.join(dir, "rw/data.txt"), "v1\n")
      :ok
    end

    test "a :readonly mount can be read and never written", %{tmp_dir: dir} do
      {:ok, sb} = Sandbox.new({Virtual, mounts: [{Path.join(dir, "ro"), "/mnt/ro", :readonly}]})
      assert {:ok, "read me\n"} = Sandbox.read(sb, "/mnt/ro/readme.txt")
      assert {:ok, %{output: "read me\n"}} = Sandbox.exec(sb, "cat /mnt/ro/readme.txt")
      assert {:ok, ["/mnt/ro/readme.txt"]} = Sandbox.glob(sb, "/mnt/ro/*.txt")

      assert {:error, %Error{reason: :eacces}} = Sandbox.write(sb, "/mnt/ro/new.txt", "x")
      assert {:error, %Error{reason: :eacces}} = Sandbox.edit(sb, "/mnt/ro/readme.txt", "read", "write")
      assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "echo pwned > /mnt/ro/readme.txt")
      assert code != 0
      assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "rm /mnt/ro/readme.txt")
      assert code != 0

      assert File.read!(Path.join(dir, "ro/readme.txt")) == "read me\n"
      refute File.exists?(Path.join(dir, "ro/new.txt"))
    end

    test "a :readwrite mount writes through to the host", %{tmp_dir: dir} do
      {:ok, sb} = Sandbox.new({Virtual, mounts: [{Path.join(dir, "rw"), "/data", :readwrite}]})
      assert :ok = Sandbox.edit(sb, "/data/data.txt", "v1", "v2")
      assert {:ok, %{exit_code: 0}} = Sandbox.exec(sb, "echo made > /data/made.txt")
      assert File.read!(Path.join(dir, "rw/data.txt")) == "v2\n"
      assert File.read!(Path.join(dir, "rw/made.txt")) == "made\n"
    end

    test "a mount cannot be left through '..' or a symbolic link", %{tmp_dir: dir} do
      File.write!(Path.join(dir, "outside.txt"), "SECRET-OUTSIDE")
      File.ln_s!(Path.join(dir, "outside.txt"), Path.join(dir, "ro/link.txt"))
      {:ok, sb} = Sandbox.new({Virtual, mounts: [{Path.join(dir, "ro"), "/mnt/ro", :readonly}]})
      assert {:error, %Error{reason: :enoent}} = Sandbox.read(sb, "/mnt/ro/../outside.txt")
      assert {:ok, %{output: output}} = Sandbox.exec(sb, "cat /mnt/ro/../../outside.txt; cat /mnt/ro/link.txt")
      refute output =~ "SECRET-OUTSIDE"
    end

    test "mount/3 at runtime is read-write; a missing host directory fails", %{sb: sb, tmp_dir: dir} do
      assert Sandbox.supports?(sb, :mount)
      assert :ok = Sandbox.mount(sb, Path.join(dir, "rw"), "/late")
      assert {:ok, %{output: "v1\n"}} = Sandbox.exec(sb, "cat /late/data.txt")
      assert {:error, %Error{reason: :mount_failed}} = Sandbox.mount(sb, Path.join(dir, "nope"), "/x")
    end
  end

  describe "limits" do
    test "an endless loop ends with :limit_exceeded" do
      {:ok, sb} = Sandbox.new({Virtual, max_loop_iterations: 1_000})
      assert {:error, %Error{reason: :limit_exceeded} = e} = Sandbox.exec(sb, "while true; do :; done")
      assert Exception.message(e) =~ "resource limit"
    end

    test "the in-memory file system is bounded" do
      {:ok, sb} = Sandbox.new({Virtual, max_file_bytes: 1_000, max_fs_bytes: 2_500})
      assert :ok = Sandbox.write(sb, "a", String.duplicate("a", 1_000))
      assert {:error, %Error{reason: :efbig}} = Sandbox.write(sb, "b", String.duplicate("b", 1_001))
      assert :ok = Sandbox.write(sb, "c", String.duplicate("c", 1_000))
      assert {:error, %Error{reason: :efbig}} = Sandbox.write(sb, "d", String.duplicate("d", 900))
      assert {:ok, %{exit_code: code}} = Sandbox.exec(sb, "printf '%2000s' x > e")
      assert code != 0
    end

    test "too many commands end with :limit_exceeded" do
      {:ok, sb} = Sandbox.new({Virtual, max_commands: 50})
      assert {:error, %Error{reason: :limit_exceeded}} = Sandbox.exec(sb, "for i in $(seq 1 200); do echo $i; done")
    end

    test "the wall clock ends a slow command; the scheduler stays free", %{sb: sb} do
      parent = self()
      ticker = spawn(fn -> tick(parent, 20) end)
      started = System.monotonic_time(:millisecond)
      assert {:error, %Error{reason: :timeout}} = Sandbox.exec(sb, "sleep 10", timeout: 500)
      assert System.monotonic_time(:millisecond) - started < 5_000
      Process.exit(ticker, :kill)
      # The ticker ran all along: nothing here blocked the BEAM.
      assert_received {:tick, n} when n >= 5
    end
  end

  describe "the caller" do
    test "a command stops when the process that called exec dies", %{tmp_dir: dir} do
      File.mkdir_p!(Path.join(dir, "out"))
      log = Path.join(dir, "out/ticks")
      {:ok, sb} = Sandbox.new({Virtual, mounts: [{Path.join(dir, "out"), "/out", :readwrite}]})

      caller =
        spawn(fn -> Sandbox.exec(sb, "while true; do echo t >> /out/ticks; sleep 0.05; done", timeout: 60_000) end)

      wait_until(fn -> File.exists?(log) and byte_size(File.read!(log)) > 10 end)
      Process.exit(caller, :kill)
      # Garbage collection of the dead caller releases the command's handle.
      :erlang.garbage_collect()
      Process.sleep(500)
      size = byte_size(File.read!(log))
      Process.sleep(500)
      assert byte_size(File.read!(log)) == size
    end
  end

  test "exec leaves no messages behind, even when the command timed out", %{sb: sb} do
    Process.flag(:trap_exit, true)
    assert {:ok, _} = Sandbox.exec(sb, "echo hi")
    assert {:error, %Error{reason: :timeout}} = Sandbox.exec(sb, "sleep 3", timeout: 100)
    Process.sleep(3_500)
    assert {:messages, []} = Process.info(self(), :messages)
  end

  describe "concurrency" do
    test "many sandboxes at once, each with its own files" do
      results =
        1..24
        |> Task.async_stream(
          fn i ->
            {:ok, sb} = Sandbox.new(Virtual)
            :ok = Sandbox.write(sb, "n.txt", "#{i}")

            {:ok, %{output: out}} =
              Sandbox.exec(sb, "s=0; for j in $(seq 1 200); do s=$((s + j)); done; echo $(cat n.txt) $s")

            out
          end,
          max_concurrency: 24,
          timeout: 60_000
        )
        |> Enum.map(fn {:ok, out} -> out end)

      assert results == for(i <- 1..24, do: "#{i} 20100\n")
    end
  end

  test "the network is off without a policy", %{sb: sb} do
    assert {:ok, %{exit_code: code, output: output}} = Sandbox.exec(sb, "curl -s https://example.com/")
    assert code != 0
    assert output =~ "curl"
  end

  defp wait_until(fun, tries \\ 200) do
    cond do
      fun.() -> :ok
      tries == 0 -> flunk("condition never held")
      true -> Process.sleep(25) && wait_until(fun, tries - 1)
    end
  end

  defp tick(parent, every) do
    Enum.reduce(Stream.repeatedly(fn -> :ok end), 0, fn _, n ->
      Process.sleep(every)
      send(parent, {:tick, n + 1})
      n + 1
    end)
  end
end
