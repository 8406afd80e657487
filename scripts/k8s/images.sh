#!/bin/sh
# The images the Kubernetes tier's node runs (docs/k8s-tier.md), as OCI
# archives that the tier imports into its containerd (no registry):
#
#   workspace.oci.tar        docker.io/library/debian:bookworm-slim
#   workspace-tools.oci.tar  condukt.test/workspace-tools:bookworm
#   pause.oci.tar            condukt.test/pause:1 (the pod sandbox)
#   condukt-egress.oci.tar   ghcr.io/tuist/condukt-egress:<version>, from
#                            priv/condukt-egress (rebuilt when that changes)
#
#   sh scripts/k8s/images.sh           build what is missing; print the dir
#   sh scripts/k8s/images.sh --check   print the dir if complete, else exit 1
#
# The Debian images are cached under ${CONDUKT_K8S_CACHE:-~/.cache/condukt/k8s}
# (keyed by scripts/image/build.sh); the sidecar image is cached by the
# binary's hash. The pause image is the host's own `sleep` (coreutils) and
# the C library it needs: the sandbox only has to hold the pod's
# namespaces, and a PID 1 without handlers ignores SIGTERM, so containerd
# stops it with SIGKILL as it does any sandbox. Needs root (mmdebstrap).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
log() { echo "k8s-images: $*" >&2; }

CACHE=${CONDUKT_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/condukt/k8s}
key=$(cat "$ROOT/scripts/image/build.sh" "$ROOT/scripts/image/oci.py" "$0" | sha256sum | cut -c1-12)
OUT=$CACHE/images-$key
bin=$ROOT/priv/condukt-egress
sidecar_key() { sha256sum "$bin" "$ROOT/priv/ca-certificates/mozilla.pem" | sha256sum | cut -c1-12; }

complete() {
  for f in workspace workspace-tools pause; do [ -s "$OUT/$f.oci.tar" ] || return 1; done
  [ -x "$bin" ] && [ -s "$OUT/egress-$(sidecar_key).oci.tar" ]
}
done_() { ln -sf "egress-$(sidecar_key).oci.tar" "$OUT/condukt-egress.oci.tar"; echo "$OUT"; exit 0; }

if complete; then done_; fi
if [ "$check_only" = 1 ]; then
  log "not built yet: $OUT (run scripts/k8s/images.sh)"
  exit 1
fi
[ -x "$bin" ] || { log "$bin is not built (make priv/condukt-egress)"; exit 1; }
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if complete; then done_; fi

# The three Debian images are independent (each mmdebstrap has its own
# directory, and most of their time is downloading): built at once; a
# failure fails the script once all have ended.
debian() { # kind archive
  start=$(date +%s)
  sh "$ROOT/scripts/image/build.sh" "$1" "$2.tmp" && mv -f "$2.tmp" "$2" &&
    log "built $1 in $(( $(date +%s) - start ))s"
}
k=$(sidecar_key)
pids=""
for kind in workspace workspace-tools; do
  if [ ! -s "$OUT/$kind.oci.tar" ]; then
    debian "$kind" "$OUT/$kind.oci.tar" &
    pids="$pids $!"
  fi
done
if [ ! -s "$OUT/egress-$k.oci.tar" ]; then
  rm -f "$OUT"/egress-*.oci.tar
  debian sidecar "$OUT/egress-$k.oci.tar" &
  pids="$pids $!"
fi

if [ ! -s "$OUT/pause.oci.tar" ]; then
  work=$(mktemp -d /var/tmp/condukt-pause.XXXXXX)
  trap 'rm -rf "$work"' EXIT
  install -d "$work/rootfs/usr/bin"
  install -m 0755 "$(command -v sleep)" "$work/rootfs/usr/bin/sleep"
  for lib in $(ldd "$(command -v sleep)" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'); do
    install -D -m 0755 "$lib" "$work/rootfs$lib"
  done
  python3 "$ROOT/scripts/image/oci.py" "$work/rootfs" "$OUT/pause.tmp.tar" \
    --name condukt.test/pause:1 --user 65535:65535 --entrypoint '["/usr/bin/sleep","infinity"]'
  mv -f "$OUT/pause.tmp.tar" "$OUT/pause.oci.tar"
fi
failed=0
for p in $pids; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { log "an image build failed (see above)"; exit 1; }
complete || { log "incomplete: $OUT"; exit 1; }
done_
