defmodule Condukt.Sandbox.Virtual.NotAvailableTest do
  # Without its native library the Virtual sandbox refuses to start, and says
  # how to build it. (The library's load status is global: not async.)
  use ExUnit.Case, async: false

  alias Condukt.Sandbox
  alias Condukt.Sandbox.{Error, Virtual}

  test "new/2 answers :not_available with a message naming the build step" do
    key = {Virtual.Native, :status}
    saved = :persistent_term.get(key)
    on_exit(fn -> :persistent_term.put(key, saved) end)

    :persistent_term.put(
      key,
      {:error, "priv/condukt_virtual.so could not be loaded (enoent); build it with `make virtual-nif`"}
    )

    assert {:error, %Error{reason: :not_available, op: :new} = error} = Sandbox.new(Virtual)
    assert Exception.message(error) =~ "make virtual-nif"
    assert {:error, _} = Virtual.available()

    # Everything else still works.
    assert {:ok, sb} = Sandbox.new(Sandbox.Local)
    assert {:ok, %{output: "ok\n"}} = Sandbox.exec(sb, "echo ok")
  end
end
