defmodule Condukt.K8s.ContainerfileTest do
  # The `Containerfile` for users who build the sidecar image with docker
  # or podman (docs/image.md): built with podman (Debian's), FROM the
  # tier's own Debian bookworm image (scripts/k8s/images.sh, loaded into
  # podman: no registry is asked for the base; the build's apt-get fetches
  # Debian packages as mmdebstrap does), and run: the binary answers
  # `--version` with the library's version, as user 1337, and the image
  # carries iptables for the init step. podman's storage is cached under
  # ~/.cache/condukt/podman, so only the first run builds every layer.
  use Condukt.Test.K8s.Case, async: false, node: true

  alias Condukt.Dev.Netns.Cmd

  @root Path.expand("../../..", __DIR__)
  @tag_name "condukt.test/condukt-egress-containerfile:test"

  if System.find_executable("podman") == nil do
    if System.get_env("CONDUKT_REQUIRE_ALL_TIERS") == "1" do
      raise "the Containerfile test is required (CONDUKT_REQUIRE_ALL_TIERS=1) but podman is missing (make setup)"
    end

    @moduletag skip: "podman is not installed (make setup)"
  end

  setup_all do
    cache = Path.join(System.get_env("XDG_CACHE_HOME") || Path.join(System.user_home!(), ".cache"), "condukt/podman")
    File.mkdir_p!(cache)
    # Its own storage (vfs: works on any file system, inside a container
    # too), never the machine's /var/lib/containers.
    podman = [
      "podman",
      "--root",
      Path.join(cache, "root"),
      "--runroot",
      Path.join(cache, "run"),
      "--storage-driver",
      "vfs"
    ]

    {out, 0} = Cmd.run(["sh", Path.join(@root, "scripts/k8s/images.sh")], timeout: 1_800_000, stderr: :discard)
    base = Path.join(out |> String.split("\n", trim: true) |> List.last(), "workspace.oci.tar")
    {out, status} = Cmd.run(podman ++ ["load", "-i", base], timeout: 300_000, stderr: :stdout)
    assert status == 0, out
    assert out =~ "docker.io/library/debian:bookworm-slim"

    {out, status} =
      Cmd.run(
        podman ++
          [
            "build",
            "--pull=never",
            "--network",
            "host",
            "-t",
            @tag_name,
            "-f",
            Path.join(@root, "Containerfile"),
            @root
          ],
        timeout: 1_800_000,
        stderr: :stdout
      )

    assert status == 0, String.slice(out, -4000, 4000)
    %{podman: podman}
  end

  # podman's default ulimits (nofile, nproc) are above what root may set
  # without CAP_SYS_RESOURCE on the machines the tier runs on: lower ones.
  defp run(podman, args) do
    Cmd.run(
      podman ++
        ["run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024" | args],
      timeout: 120_000,
      stderr: :stdout
    )
  end

  test "the image built from the Containerfile runs condukt-egress --version as user 1337, with iptables",
       %{podman: podman} do
    assert {"condukt-egress #{Application.spec(:condukt, :vsn)}\n", 0} == run(podman, [@tag_name, "--version"])

    assert {"uid=1337(condukt) gid=1337(condukt) groups=1337(condukt)\n", 0} ==
             run(podman, ["--entrypoint", "id", @tag_name])

    {out, 0} = run(podman, ["--entrypoint", "iptables", @tag_name, "--version"])
    assert out =~ "nf_tables"
    # The Mozilla snapshot next to the binary's real path, as the sidecar looks for it.
    {out, 0} = run(podman, ["--entrypoint", "readlink", @tag_name, "-f", "/usr/local/bin/condukt-egress"])
    assert out == "/usr/local/lib/condukt/condukt-egress\n"

    {_, 0} =
      run(podman, ["--entrypoint", "test", @tag_name, "-s", "/usr/local/lib/condukt/ca-certificates/mozilla.pem"])
  end
end
