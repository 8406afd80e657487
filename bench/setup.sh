#!/bin/sh
# Installs what the benchmarks need beyond the project's own set-up
# (scripts/setup-debian.sh): the load generator and the peers. Debian
# packages only; idempotent (nothing is installed when everything is there).
#
#   nghttp2-client      h2load (HTTP/1.1 and h2 load generator)
#   mitmproxy           the mitmproxy peer (transparent mode)
#   squid-openssl       the Squid peer (ssl-bump needs the OpenSSL build)
#   python3-matplotlib  the chart
#   linux-perf          the profile of the sidecar
#   conntrack           flushing the pod's connection tracking between interceptors
#   heaptrack           the soak's --heaptrack (what the sidecar still holds, by call stack)
set -eu

PKGS="nghttp2-client mitmproxy squid-openssl python3-matplotlib linux-perf conntrack heaptrack"

missing=""
for p in $PKGS; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  echo "bench/setup.sh: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends keeps squid's and mitmproxy's extras out.
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# The Debian squid package enables and starts a system squid on port 3128.
# The benchmark runs its own instances inside namespaces; the system one is
# stopped and disabled when this script installed it (never touched otherwise).
case "$missing" in
  *squid-openssl*)
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now squid >/dev/null 2>&1 || true
    fi
    ;;
esac

for tool in h2load mitmdump squid conntrack perf heaptrack /usr/lib/squid/security_file_certgen; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "$tool" ] || { echo "bench/setup.sh: $tool missing after install" >&2; exit 1; }
done
echo "bench/setup.sh: ready"
