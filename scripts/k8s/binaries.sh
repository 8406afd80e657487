#!/bin/sh
# Obtains the binaries of the Kubernetes test tier (docs/k8s-tier.md):
# etcd, kube-apiserver and kwok at the versions pinned in versions.sh, built
# from their Go modules through the Go module proxy and cached outside the
# repository, so that only the first run builds.
#
#   sh scripts/k8s/binaries.sh           build what is missing; print the dir
#   sh scripts/k8s/binaries.sh --check   print the dir if complete, else exit 1
#
# The last line on stdout is a directory holding `etcd`, `kube-apiserver`,
# `kube-scheduler`, `kube-controller-manager` and `kwok`; progress goes to
# stderr. (No kubelet: kwok stands in for the nodes. The scheduler binds
# pods to kwok's nodes; the controller manager runs the garbage collector
# that owner references rely on.)
#
# Environment:
#   CONDUKT_K8S_CACHE   cache root (default ${XDG_CACHE_HOME:-~/.cache}/condukt/k8s)
#   KUBEBUILDER_ASSETS  take etcd and kube-apiserver from there (envtest's
#                       assets carry no scheduler, controller manager or
#                       kwok: those are still built, at K8S_VERSION)
#   CONDUKT_K8S_GO      the bootstrap `go` (>= 1.21); default Debian's
#                       golang-1.23-go (scripts/k8s/setup-go.sh), else PATH
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/versions.sh"

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

log() { echo "k8s-binaries: $*" >&2; }

CACHE=${CONDUKT_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/condukt/k8s}
tag="k8s-$K8S_VERSION-etcd-$K8S_ETCD_VERSION-kwok-$K8S_KWOK_VERSION-coredns-$K8S_COREDNS_VERSION-kr-$K8S_KUBE_ROUTER_VERSION-$K8S_GO_TOOLCHAIN"
# The node's add-ons (cluster DNS, the NetworkPolicy controller).
ADDONS="coredns kube-router"
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  assets=$(cd "$KUBEBUILDER_ASSETS" && pwd)
  for b in etcd kube-apiserver; do
    [ -x "$assets/$b" ] || { log "KUBEBUILDER_ASSETS=$assets has no executable $b"; exit 1; }
  done
  key=$(printf '%s' "$assets" | sha256sum | cut -c1-12)
  OUT="$CACHE/kubebuilder-$key-kwok-$K8S_KWOK_VERSION-$K8S_GO_TOOLCHAIN/bin"
else
  assets=""
  OUT="$CACHE/$tag/bin"
fi

K8S_COMPONENTS="kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy"
complete() {
  for b in etcd $K8S_COMPONENTS kwok $ADDONS; do [ -x "$OUT/$b" ] || return 1; done
}

if complete; then
  echo "$OUT"
  exit 0
fi
if [ "$check_only" = 1 ]; then
  log "not built yet: $OUT (run scripts/k8s/binaries.sh)"
  exit 1
fi

# --- the bootstrap go -------------------------------------------------------
go_ok() {
  v=$("$1" env GOVERSION 2>/dev/null) || return 1
  minor=$(echo "$v" | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
  [ -n "$minor" ] && [ "$minor" -ge 21 ]
}
GO=""
for cand in ${CONDUKT_K8S_GO:-} "$K8S_DEBIAN_GO" "$(command -v go 2>/dev/null || true)"; do
  if [ -n "$cand" ] && [ -x "$cand" ] && go_ok "$cand"; then GO=$cand; break; fi
done
if [ -z "$GO" ]; then
  log "no Go >= 1.21 to bootstrap $K8S_GO_TOOLCHAIN: run scripts/k8s/setup-go.sh (Debian's $K8S_DEBIAN_GO_PACKAGE)"
  exit 1
fi

mkdir -p "$CACHE" "$OUT"
# One build at a time per cache (two test runs may start together).
exec 9>"$CACHE/.lock"
flock 9
if complete; then echo "$OUT"; exit 0; fi

# Everything Go writes stays under the cache; the user's go env is ignored.
# Only the module proxy is asked (never `direct`, i.e. never a VCS host);
# checksums are verified against sum.golang.org through the proxy.
export GOENV=off GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
export GOTOOLCHAIN="$K8S_GO_TOOLCHAIN"
export GOPROXY=https://proxy.golang.org GOSUMDB=sum.golang.org GONOSUMDB= GOPRIVATE= GONOPROXY=
export GOPATH="$CACHE/gopath" GOMODCACHE="$CACHE/gomod" GOCACHE="$CACHE/gocache"
export GOTMPDIR="$CACHE/tmp"
mkdir -p "$GOTMPDIR"
NICE="nice -n 19"

log "bootstrap $("$GO" version | cut -d' ' -f3) at $GO; toolchain $K8S_GO_TOOLCHAIN"
# Resolves (and on first use downloads) the pinned toolchain.
$NICE "$GO" version >&2

work=$(mktemp -d "$CACHE/tmp/build.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# A throwaway module that requires the module to build: `go install
# pkg@version` refuses modules whose go.mod has replace directives, which
# k8s.io/kubernetes and etcd have.
new_module() {
  rm -rf "$work/mod" && mkdir -p "$work/mod"
  printf 'module condukt.invalid/k8s-tier-build\n\ngo %s\n' \
    "$(echo "$K8S_GO_TOOLCHAIN" | sed 's/^go//')" >"$work/mod/go.mod"
}

build() { # name package version-ldflags
  name=$1 pkg=$2 ldflags=$3
  log "building $name ($pkg)"
  start=$(date +%s)
  (cd "$work/mod" && $NICE "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$work/$name" "$pkg")
  mv -f "$work/$name" "$OUT/$name"
  log "built $name in $(( $(date +%s) - start ))s"
}

if [ -z "$assets" ]; then
  if [ ! -x "$OUT/etcd" ]; then
    new_module
    (cd "$work/mod" && $NICE "$GO" get "go.etcd.io/etcd/server/v3@$K8S_ETCD_VERSION" >&2)
    build etcd go.etcd.io/etcd/server/v3 \
      "-X go.etcd.io/etcd/api/v3/version.GitSHA=$K8S_ETCD_VERSION"
  fi
else
  ln -sf "$assets/etcd" "$OUT/etcd"
  ln -sf "$assets/kube-apiserver" "$OUT/kube-apiserver"
fi
missing=""
for b in $K8S_COMPONENTS; do [ -x "$OUT/$b" ] || missing="$missing $b"; done
if [ -n "$missing" ]; then
  new_module
  # k8s.io/kubernetes replaces its staging modules (k8s.io/api, ...) with
  # ./staging/src/...; here they are the published v0.MINOR.PATCH.
  staging_version=$(echo "$K8S_VERSION" | sed 's/^v1\./v0./')
  modfile="$work/kubernetes.mod"
  $NICE "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" >"$work/dl.json"
  cp "$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' "$work/dl.json")" "$modfile"
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    sed -n "s#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*#\t\1 => \1 $staging_version#p" "$modfile"
    echo ")"
  } >>"$work/mod/go.mod"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  v=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    v="$v -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    v="$v -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for b in $missing; do
    (cd "$work/mod" && $NICE "$GO" get "k8s.io/kubernetes/cmd/$b@$K8S_VERSION" >&2)
    build "$b" "k8s.io/kubernetes/cmd/$b" "$v"
  done
fi

if [ ! -x "$OUT/kwok" ]; then
  new_module
  (cd "$work/mod" && $NICE "$GO" get "sigs.k8s.io/kwok@$K8S_KWOK_VERSION" >&2)
  build kwok sigs.k8s.io/kwok/cmd/kwok \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$K8S_KWOK_VERSION"
fi

if [ ! -x "$OUT/coredns" ]; then
  new_module
  (cd "$work/mod" && $NICE "$GO" get "github.com/coredns/coredns@$K8S_COREDNS_VERSION" >&2)
  build coredns github.com/coredns/coredns \
    "-X github.com/coredns/coredns/coremain.GitCommit=$K8S_COREDNS_VERSION"
fi
if [ ! -x "$OUT/kube-router" ]; then
  new_module
  (cd "$work/mod" && $NICE "$GO" get "github.com/cloudnativelabs/kube-router/v2@$K8S_KUBE_ROUTER_VERSION" >&2)
  build kube-router github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
    "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$K8S_KUBE_ROUTER_VERSION"
fi

complete || { log "incomplete: $OUT"; exit 1; }
echo "$OUT"
