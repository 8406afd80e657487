defmodule Condukt.Image.SidecarImageTest do
  # `make image`'s sidecar image, built from Debian packages and run by a
  # real containerd and runc: the binary starts in it, as the image's
  # non-root user, with what the init step needs (iptables-restore for
  # both families), and the name is the one the Kubernetes sandbox uses by
  # default. Two builds from the same checkout give the same bytes.
  use ExUnit.Case, async: false

  alias Condukt.Sandbox.NetworkPolicy.K8s.Manifests
  alias Condukt.Test.Containerd
  alias Condukt.Dev.Netns.Cmd

  @moduletag :image
  @moduletag timeout: 600_000
  @root Path.expand("../../..", __DIR__)

  setup_all do
    case Containerd.check() do
      {:skip, reason} ->
        if System.get_env("CONDUKT_REQUIRE_ALL_TIERS") == "1", do: flunk("image tier required but: #{reason}")
        IO.puts(:stderr, "image tier skipped: #{reason}")
        {:ok, skip: reason}

      :ok ->
        dir = Path.join(System.tmp_dir!(), "condukt-image-#{System.unique_integer([:positive])}")
        File.mkdir_p!(dir)
        archive = Path.join(dir, "a.oci.tar")
        build!(archive)
        c = Containerd.start(Path.join(dir, "containerd"))

        on_exit(fn ->
          Containerd.stop(c)
          File.rm_rf(dir)
        end)

        {:ok, dir: dir, archive: archive, c: c}
    end
  end

  setup ctx do
    if ctx[:skip], do: {:skip, ctx.skip}, else: :ok
  end

  defp build!(archive) do
    Cmd.run!(["sh", Path.join(@root, "scripts/image/build.sh"), "sidecar", archive], timeout: 300_000)
    |> String.split("\n", trim: true)
    |> List.last()
    |> Condukt.JSON.decode!()
  end

  defp run(c, id, argv) do
    Containerd.ctr(c, ["run", "--rm", Manifests.default_image(), id | argv])
  end

  test "imports under the default image name and runs as uid 1337", %{c: c, archive: archive} do
    {out, 0} = Containerd.ctr(c, ["images", "import", archive])
    assert out =~ Manifests.default_image()

    {version, 0} = run(c, "version", ["/usr/local/bin/condukt-egress", "--version"])
    assert version =~ ~r/^condukt-egress \d+\.\d+\.\d+/

    # The user comes from the image's config: containerd writes it into the
    # runtime spec it hands to runc.
    {_, 0} = Containerd.ctr(c, ["containers", "create", Manifests.default_image(), "spec"])
    {info, 0} = Containerd.ctr(c, ["containers", "info", "spec"])
    {_, 0} = Containerd.ctr(c, ["containers", "rm", "spec"])
    user = Condukt.JSON.decode!(info)["Spec"]["process"]["user"]
    assert %{"uid" => 1337, "gid" => 1337} = user
  end

  test "the init step's programs and the Mozilla snapshot are in the image", %{c: c, archive: archive} do
    {_, 0} = Containerd.ctr(c, ["images", "import", archive])
    # --dry-run prints both families' rules through the image's own
    # iptables-restore lookup (they must be found before anything runs).
    {out, 0} =
      run(c, "nf", ["/usr/local/bin/condukt-egress", "netfilter-setup", "--dry-run", "--dns", "none", "--ipv6", "on"])

    assert out =~ "*nat"
    assert out =~ "REDIRECT --to-ports 15001"
    assert out =~ "IPv6"

    # The proxy finds the Mozilla roots next to its real path and refuses
    # to start only for want of its own files.
    {out, status} = run(c, "proxy", ["/usr/local/bin/condukt-egress", "proxy"])
    assert status != 0
    refute out =~ "mozilla.pem"
    refute out =~ "error while loading shared libraries"
  end

  test "is small and reproducible", %{dir: dir, archive: archive} do
    again = Path.join(dir, "b.oci.tar")
    second = build!(again)
    assert File.read!(archive) == File.read!(again)
    # A few MiB of libraries, iptables and the binary.
    assert second["layer_bytes"] < 16 * 1024 * 1024
  end
end
