#!/bin/sh
# Builds a container image from Debian packages, without a registry or a
# daemon: mmdebstrap makes the root file system, scripts/image/oci.py
# writes it as an OCI image archive. Needs root (mmdebstrap) and
# mmdebstrap itself (make setup installs it).
#
#   scripts/image/build.sh KIND OUT.oci.tar [NAME]
#
# KIND:
#   sidecar          condukt-egress (priv/condukt-egress, which must be
#                    built), the shared libraries it needs, the Mozilla
#                    snapshot, iptables/ip6tables (nf_tables) for the init
#                    step; user 1337; NAME defaults to
#                    ghcr.io/tuist/condukt-egress:<version>
#   workspace        a minimal Debian bookworm (minbase), named
#                    docker.io/library/debian:bookworm-slim by default so
#                    that a pod's default image runs on a test node
#   workspace-tools  the same plus curl, git, python3 and nodejs, named
#                    condukt.test/workspace-tools:bookworm
#
# Reproducible: the same packages and SOURCE_DATE_EPOCH (default: the
# time of the checkout's last commit) give the same bytes. Debian's
# archive moves on with security updates; pin MIRROR to a
# snapshot.debian.org URL for bit-for-bit rebuilds later.
set -eu

kind=${1:?usage: build.sh KIND OUT.oci.tar [NAME]}
out=${2:?usage: build.sh KIND OUT.oci.tar [NAME]}
here=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^ *@version "\(.*\)"/\1/p' "$here/mix.exs")
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH

command -v mmdebstrap >/dev/null 2>&1 || {
  echo "image: mmdebstrap is missing (apt-get install mmdebstrap, or make setup)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "image: needs root (mmdebstrap writes files owned by root)" >&2; exit 1; }

work=$(mktemp -d /var/tmp/condukt-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
strip="--dpkgopt=path-exclude=/usr/share/doc/* --dpkgopt=path-exclude=/usr/share/man/*
       --dpkgopt=path-exclude=/usr/share/locale/* --dpkgopt=path-exclude=/usr/share/info/*"

case "$kind" in
  sidecar)
    bin=$here/priv/condukt-egress
    [ -x "$bin" ] || { echo "image: $bin is not built (make priv/condukt-egress)" >&2; exit 1; }
    name=${3:-ghcr.io/tuist/condukt-egress:$version}
    # extract: only the files of these packages and their dependencies,
    # no shell scripts run, no package manager left in the image.
    # shellcheck disable=SC2086
    mmdebstrap --quiet --variant=extract $strip \
      --include=libc6,libjansson4,libuv1,libssl3,libwebsockets17,libyaml-0-2,libnghttp2-14,libunistring2,libcap2,zlib1g,iptables \
      bookworm "$rootfs" "deb $MIRROR bookworm main" >"$work/mmdebstrap.log" 2>&1 ||
      { cat "$work/mmdebstrap.log" >&2; exit 1; }
    # Not needed by a program that only speaks UTF-8 and ASCII.
    rm -rf "$rootfs/usr/lib/x86_64-linux-gnu/gconv" "$rootfs/var/cache" "$rootfs/var/lib/apt" "$rootfs/var/log"
    # What update-alternatives would do on install (extract runs no
    # maintainer scripts): iptables means the nf_tables backend, as on
    # Debian by default.
    for t in iptables iptables-restore iptables-save ip6tables ip6tables-restore ip6tables-save; do
      ln -sf "${t%%-*}-nft${t#${t%%-*}}" "$rootfs/usr/sbin/$t"
    done
    # The binary finds its Mozilla snapshot next to its real path.
    install -d -m 0755 "$rootfs/usr/local/lib/condukt/ca-certificates" "$rootfs/usr/local/bin"
    install -m 0755 "$bin" "$rootfs/usr/local/lib/condukt/condukt-egress"
    install -m 0644 "$here/priv/ca-certificates/mozilla.pem" "$rootfs/usr/local/lib/condukt/ca-certificates/mozilla.pem"
    ln -sf ../lib/condukt/condukt-egress "$rootfs/usr/local/bin/condukt-egress"
    install -d -m 0755 "$rootfs/etc"
    printf 'root:x:0:0:root:/root:/usr/sbin/nologin\ncondukt:x:1337:1337:condukt-egress:/nonexistent:/usr/sbin/nologin\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\ncondukt:x:1337:\n' >"$rootfs/etc/group"
    printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
    set -- --user 1337:1337 --entrypoint '["/usr/local/bin/condukt-egress"]' --cmd '["--help"]' \
      --label "org.opencontainers.image.title=condukt-egress" \
      --label "org.opencontainers.image.version=$version" \
      --label "org.opencontainers.image.licenses=MIT"
    ;;
  workspace|workspace-tools)
    pkgs=ca-certificates
    if [ "$kind" = workspace ]; then
      name=${3:-docker.io/library/debian:bookworm-slim}
    else
      name=${3:-condukt.test/workspace-tools:bookworm}
      pkgs=$pkgs,curl,git,python3,python3-requests,nodejs
    fi
    # shellcheck disable=SC2086
    mmdebstrap --quiet --variant=minbase $strip --include=$pkgs \
      bookworm "$rootfs" "deb $MIRROR bookworm main" >"$work/mmdebstrap.log" 2>&1 ||
      { cat "$work/mmdebstrap.log" >&2; exit 1; }
    rm -rf "$rootfs/var/cache/apt/"*.bin "$rootfs/var/lib/apt/lists/"* "$rootfs/var/log/"*
    set -- --cmd '["bash"]'
    ;;
  *)
    echo "image: unknown kind '$kind' (sidecar, workspace, workspace-tools)" >&2; exit 2 ;;
esac

# Mount points a runtime fills; empty in the image.
mkdir -p "$rootfs/proc" "$rootfs/sys" "$rootfs/run" "$rootfs/dev" "$rootfs/tmp"
mkdir -p "$(dirname "$out")"
python3 "$here/scripts/image/oci.py" "$rootfs" "$out" --name "$name" "$@"
