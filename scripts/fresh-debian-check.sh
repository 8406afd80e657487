#!/bin/sh
# Proves the README's two commands on a fresh Debian 12 root, as a new
# user would meet them: builds a bookworm root with mmdebstrap (the minimal
# base system plus git and make, which a user needs to clone and type
# `make`), clones this checkout into it, and runs, each in ONE invocation,
#
#   make setup demo                     always
#   make setup test                     with --test
#
# inside the root (made the root of a mount namespace of its own with
# pivot_root, as a container's is, so nothing is mounted on the host).
# Needs root; installs mmdebstrap if it is missing.
#
#   scripts/fresh-debian-check.sh [--test] [--keep] [--share-cache] [--root DIR]
#
#   --share-cache  bind the host's ~/.cache/condukt and Go caches into the
#                  root, so the Kubernetes binaries are not rebuilt (they
#                  are the one slow, network-heavy step); without it the
#                  run is as cold as a new machine's.
#   --keep         leave the root in place (it is removed otherwise).
#   --root DIR     where to build it (default /var/tmp/condukt-fresh-<id>).
#                  An existing DIR made by an earlier --keep run is reused
#                  (quicker, but no longer fresh: for iterating on a fix).
#
# Exit status: the first failing command's. Logs: <root>.log next to it.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
run_test=0 keep=0 share=0 root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --test) run_test=1 ;;
    --keep) keep=1 ;;
    --share-cache) share=1 ;;
    --root) root=$2; shift ;;
    *) echo "fresh-debian-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" -eq 0 ] || { echo "fresh-debian-check: needs root" >&2; exit 2; }
[ -n "$root" ] || root=/var/tmp/condukt-fresh-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')

if ! command -v mmdebstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap
fi

log=$root.log
start=$(date +%s)
if [ -d "$root/etc" ]; then
  echo "fresh-debian-check: reusing $root (NOT fresh; log: $log)"
  rm -rf "$root/root/condukt"
else
  echo "fresh-debian-check: building a bookworm root in $root (log: $log)"
  mmdebstrap --variant=minbase --include=git,make,ca-certificates bookworm "$root" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" >"$log" 2>&1
  echo "fresh-debian-check: root ready in $(( $(date +%s) - start )) s"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The machine's own network trust: a certificate authority the local
# administrator added (a TLS-inspecting egress proxy, say) is part of the
# machine, not of the project, so the root gets it too; without it, cargo
# and pip could not reach their registries through such a network.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1 ||
    { echo "fresh-debian-check: update-ca-certificates failed in the root" >&2; exit 1; }
fi
git clone -q "$here" "$root/root/condukt"

cleanup() {
  if [ "$keep" -eq 0 ]; then
    # The mounts lived in the unshared namespace and are gone with it.
    rm -rf "$root"
  else
    echo "fresh-debian-check: kept $root"
  fi
}
trap cleanup EXIT

caches=""
if [ "$share" -eq 1 ]; then
  mkdir -p "$HOME/.cache/condukt" "$HOME/go" "$HOME/.cache/go-build"
  caches="$HOME/.cache/condukt:/root/.cache/condukt $HOME/go:/root/go $HOME/.cache/go-build:/root/.cache/go-build"
fi

# One command in the root, in its own mount namespace: proc, sys, dev and a
# fresh /run (ip netns keeps its namespaces there).
in_root() {
  unshare --mount --propagation private sh -eu -c '
    root=$1; caches=$2; shift 2
    # The root is a mount point of its own, as in a container: `ip netns
    # exec` makes / a slave mount, which fails on a plain directory.
    mount --bind "$root" "$root"
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$root/run"
    for pair in $caches; do
      mkdir -p "$root${pair#*:}"
      mount --bind "${pair%%:*}" "$root${pair#*:}"
    done
    # The root becomes the root of the mount namespace (pivot_root), as
    # in a container, not a chroot: a chrooted runc would pivot the pods
    # into a mount namespace whose root is still the host, and runc exec,
    # which enters a pod by its namespaces, would land in the host tree.
    # The host tree is then detached. (No apostrophes here: this is all
    # one single-quoted argument.)
    cd "$root"
    mkdir -p .host
    pivot_root . .host
    exec env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      CONDUKT_REQUIRE_ALL_TIERS=1 sh -c "umount -l /.host && rmdir /.host && cd /root/condukt && $*"
  ' in_root "$root" "$caches" "$@"
}

step() {
  echo "fresh-debian-check: $* (one invocation)"
  t0=$(date +%s)
  if in_root "$@" >>"$log" 2>&1; then
    echo "fresh-debian-check: '$*' passed in $(( $(date +%s) - t0 )) s"
  else
    status=$?
    echo "fresh-debian-check: '$*' FAILED (exit $status) after $(( $(date +%s) - t0 )) s; the last lines of $log:" >&2
    tail -n 40 "$log" >&2
    exit "$status"
  fi
}

step make setup demo
[ "$run_test" -eq 0 ] || step make setup test
echo "fresh-debian-check: done in $(( $(date +%s) - start )) s"
