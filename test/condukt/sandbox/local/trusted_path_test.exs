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
    File.chmod!(Path.join(dir, "tool"), 0o666)
    assert {:error, why} = TrustedPath.check(Path.join(dir, "tool"))
    assert why =~ "tool is writable by everyone"

    # Others cannot rename or remove root's entries of a sticky directory
    # (/tmp): root's own directory inside it is a safe place.
    File.chmod!(Path.join(dir, "tool"), 0o755)
    assert {:ok, _} = TrustedPath.check(Path.join(dir, "tool"))

    # ...but not a directory anybody may write without the sticky bit.
    File.chmod!(dir, 0o777)
    assert {:error, why} = TrustedPath.check(Path.join(dir, "tool"))
    assert why =~ "is writable by everyone (mode 0777)"
    File.chmod!(dir, 0o755)

    # A link from a safe place into an unsafe one is followed.
    open = Path.join(dir, "open")
    File.mkdir_p!(Path.join(open, "x"))
    File.write!(Path.join([open, "x", "tool"]), "")
    File.chmod!(open, 0o777)
    File.ln_s!(open, Path.join(dir, "link"))
    assert {:error, why} = TrustedPath.check(Path.join([dir, "link", "x", "tool"]))
    assert why =~ "open is writable by everyone"
  end

  test "not absolute, missing, or not a file or directory" do
    assert {:error, "bin/sh is not an absolute path"} = TrustedPath.check("bin/sh")
    assert {:error, why} = TrustedPath.check("/usr/bin/condukt-no-such-program")
    assert why =~ "no such file"
    assert {:error, why} = TrustedPath.check("/dev/null")
    assert why =~ "device"
  end
end
