#!/bin/sh
# Installs the bootstrap Go of the Kubernetes tier from Debian: golang-1.23-go
# from bookworm-backports (bookworm itself has only Go 1.19, too old to fetch
# a pinned toolchain). The Go that builds the tier's binaries is the
# toolchain pinned in versions.sh, which this Go fetches through the Go
# module proxy (scripts/k8s/binaries.sh). Idempotent; needs root or sudo
# only when something is missing.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/versions.sh"

status=$(dpkg-query -W -f='${Status}' "$K8S_DEBIAN_GO_PACKAGE" 2>/dev/null || true)
if [ "$status" = "install ok installed" ] && [ -x "$K8S_DEBIAN_GO" ]; then
  echo "setup-go: $K8S_DEBIAN_GO_PACKAGE present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  SUDO=""
elif command -v sudo >/dev/null 2>&1; then
  SUDO="sudo"
else
  echo "setup-go: $K8S_DEBIAN_GO_PACKAGE missing; run this as root or install sudo" >&2
  exit 1
fi

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [ "$codename" != "bookworm" ]; then
  # Later Debian releases carry a Go >= 1.21 in their main suite.
  echo "setup-go: installing golang-go from $codename"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends golang-go
  exit 0
fi

# bookworm-backports, at its default priority (100): nothing else on the
# machine is upgraded from it, only what is asked for with -t.
list=/etc/apt/sources.list.d/condukt-bookworm-backports.sources
if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "setup-go: adding bookworm-backports ($list)"
  printf '%s\n' \
    'Types: deb' \
    'URIs: http://deb.debian.org/debian' \
    'Suites: bookworm-backports' \
    'Components: main' \
    'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' | $SUDO tee "$list" >/dev/null
fi

echo "setup-go: installing $K8S_DEBIAN_GO_PACKAGE from bookworm-backports"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  -t bookworm-backports "$K8S_DEBIAN_GO_PACKAGE"
