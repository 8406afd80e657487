#!/bin/sh
# Installs the Debian 12 packages condukt needs to build, test and run.
# Idempotent: packages already installed are left alone, and apt is not
# touched at all when nothing is missing. Needs root (or sudo).
set -eu

PACKAGES="
  make gcc pkg-config git curl ca-certificates
  elixir erlang-nox erlang-dev erlang-jiffy
  libjansson-dev libunistring-dev libssl-dev libuv1-dev libnghttp2-dev
  libwebsockets-dev libwebsockets-evlib-uv libyaml-dev
  libcriterion-dev clang libclang-rt-14-dev
  iptables iproute2 util-linux openssl nginx-light nodejs conntrack
  python3 python3-requests python3-websockets python3-venv python3-yaml
  python3-h2 python3-httpx nghttp2-client
  mmdebstrap containerd runc containernetworking-plugins ipset podman
  python3-pip default-jdk-headless maven golang-go cargo-web
"

# The package managers the end-to-end tier installs with (npm, pip, cargo,
# go, mvn): npm is Debian's own package unless the nodejs installed
# already ships it (NodeSource's does, and conflicts with Debian's npm).
if ! [ -x /usr/bin/npm ]; then
  PACKAGES="$PACKAGES npm"
fi

missing=""
for p in $PACKAGES; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$status" in
    "install ok installed") ;;
    *) missing="$missing $p" ;;
  esac
done

if [ -z "$missing" ]; then
  echo "setup: all Debian packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "setup: missing packages:$missing; run this as root or install sudo" >&2
  exit 1
fi

echo "setup: installing$missing"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing

# Debian starts nginx as a service on install; the end-to-end tier runs its
# own nginx inside a network namespace and needs port 80/443 of the host
# left alone.
if command -v service >/dev/null 2>&1; then
  $SUDO service nginx stop >/dev/null 2>&1 || true
fi
