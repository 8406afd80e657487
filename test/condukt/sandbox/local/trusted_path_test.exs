defmodule Condukt.Sandbox.Local.TrustedPathTest do
  use ExUnit.Case, async: true

  alias Condukt.Sandbox.Local.TrustedPath

  test "Debian's programs are root's alone, through their links; the path is kept as given" do
    for path <- ~w(/usr/bin/env /bin/sh /usr/bin/../bin/env /usr/bin/./env) do
      assert TrustedPath.check(path) == {:ok, path}
    end
  end

  test "anything others may write on the way is refused, and says where" do
    assert {:error, "/tmp is writable by everyone (mode 01777)"} = TrustedPath.check("/tmp")

    dir = Path.join(System.tmp_dir!(), "trusted-path-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    on_exit(fn -> File.rm_rf!(dir) end)
    File.write!(Path.join(dir, "tool"), "")
    assert {:error, why} = TrustedPath.check(Path.join(dir, "tool"))
    assert why =~ "writable by everyone"

    # A link from a safe place into an unsafe one is followed.
    File.ln_s!("/tmp", Path.join(dir, "link"))
    assert {:error, _} = TrustedPath.check(Path.join([dir, "link", "x"]))
  end

  test "not absolute, missing, or not a file or directory" do
    assert {:error, "bin/sh is not an absolute path"} = TrustedPath.check("bin/sh")
    assert {:error, why} = TrustedPath.check("/usr/bin/condukt-no-such-program")
    assert why =~ "no such file"
    assert {:error, why} = TrustedPath.check("/dev/null")
    assert why =~ "device"
  end
end
