#!/bin/sh
# Obtains the binaries of the Kubernetes test tier (docs/k8s-tier.md) at
# the versions pinned in versions.sh, built from their Go modules through
# the Go module proxy and cached outside the repository, so that only the
# first run builds.
#
#   sh scripts/k8s/binaries.sh           build what is missing; print the dir
#   sh scripts/k8s/binaries.sh --check   print the dir if complete, else exit 1
#
# The last line on stdout is a directory holding the control plane
# (`etcd`, `kube-apiserver`, `kube-scheduler`, `kube-controller-manager`:
# the scheduler binds pods to the node, the controller manager runs the
# garbage collector that owner references rely on), the node (`kubelet`,
# `kube-proxy`) and its add-ons (`coredns`, `kube-router`); progress goes
# to stderr.
#
# Environment:
#   CONDUKT_K8S_CACHE   cache root (default ${XDG_CACHE_HOME:-~/.cache}/condukt/k8s)
#   KUBEBUILDER_ASSETS  take etcd and kube-apiserver from there (envtest's
#                       assets carry nothing else: the rest is still
#                       built, at K8S_VERSION)
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
pins="k8s-$K8S_VERSION-etcd-$K8S_ETCD_VERSION"
tail="coredns-$K8S_COREDNS_VERSION-kr-$K8S_KUBE_ROUTER_VERSION-$K8S_GO_TOOLCHAIN"
tag="$pins-$tail"
# The node's add-ons (cluster DNS, the NetworkPolicy controller).
ADDONS="coredns kube-router"
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  assets=$(cd "$KUBEBUILDER_ASSETS" && pwd)
  for b in etcd kube-apiserver; do
    [ -x "$assets/$b" ] || { log "KUBEBUILDER_ASSETS=$assets has no executable $b"; exit 1; }
  done
  key=$(printf '%s' "$assets" | sha256sum | cut -c1-12)
  OUT="$CACHE/kubebuilder-$key-$tail/bin"
else
  assets=""
  OUT="$CACHE/$tag/bin"
fi

K8S_COMPONENTS="kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy"
complete() {
  for b in etcd $K8S_COMPONENTS $ADDONS; do [ -x "$OUT/$b" ] || return 1; done
}

# A cache directory of the same pins that also held a binary the tier no
# longer uses (its name has one more component between the pins and the
# add-ons) has every binary already: they are linked, not rebuilt.
reuse() {
  [ -z "${assets:-}" ] || return 0
  for old in "$CACHE/$pins"-*-"$tail"/bin; do
    [ -d "$old" ] && [ "$old" != "$OUT" ] || continue
    mkdir -p "$OUT"
    for b in etcd $K8S_COMPONENTS $ADDONS; do
      if [ ! -x "$OUT/$b" ] && [ -x "$old/$b" ]; then
        ln -f "$old/$b" "$OUT/$b" 2>/dev/null || cp -p "$old/$b" "$OUT/$b"
        log "reused $b from $old"
      fi
    done
  done
}

complete || reuse
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

# A throwaway module per build that requires the module to build: `go
# install pkg@version` refuses modules whose go.mod has replace
# directives, which k8s.io/kubernetes and etcd have.
new_module() { # name: prints the directory of a fresh module
  d="$work/mod-$1"
  rm -rf "$d" && mkdir -p "$d"
  printf 'module condukt.invalid/k8s-tier-build\n\ngo %s\n' \
    "$(echo "$K8S_GO_TOOLCHAIN" | sed 's/^go//')" >"$d/go.mod"
  echo "$d"
}

# `go build -o` of one or more packages in module `mod`, then the
# executables into $OUT (a directory output names them after their
# packages).
build() { # label mod ldflags out package...
  label=$1 mod=$2 ldflags=$3 out=$4
  shift 4
  log "building $label"
  start=$(date +%s)
  (cd "$mod" && $NICE "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$out" "$@")
  log "built $label in $(( $(date +%s) - start ))s"
}

# The Kubernetes components: one `go build` of every missing command,
# which compiles their shared packages once and links them in parallel.
kubernetes() {
  missing=""
  for b in $K8S_COMPONENTS; do [ -x "$OUT/$b" ] || missing="$missing $b"; done
  [ -n "$missing" ] || return 0
  mod=$(new_module kubernetes)
  # k8s.io/kubernetes replaces its staging modules (k8s.io/api, ...) with
  # ./staging/src/...; here they are the published v0.MINOR.PATCH.
  staging_version=$(echo "$K8S_VERSION" | sed 's/^v1\./v0./')
  $NICE "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" >"$mod/dl.json"
  modfile=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' "$mod/dl.json")
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    sed -n "s#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*#\t\1 => \1 $staging_version#p" "$modfile"
    echo ")"
  } >>"$mod/go.mod"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  v=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    v="$v -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    v="$v -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  pkgs=""
  for b in $missing; do pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
  # shellcheck disable=SC2046,SC2086
  (cd "$mod" && $NICE "$GO" get $(for p in $pkgs; do echo "$p@$K8S_VERSION"; done) >&2)
  mkdir -p "$work/out-kubernetes"
  # shellcheck disable=SC2086
  build "$missing" "$mod" "$v" "$work/out-kubernetes/" $pkgs
  for b in $missing; do mv -f "$work/out-kubernetes/$b" "$OUT/$b"; done
}

one() { # name module@version package version-ldflags
  [ -x "$OUT/$1" ] && return 0
  mod=$(new_module "$1")
  (cd "$mod" && $NICE "$GO" get "$2" >&2)
  build "$1" "$mod" "$4" "$work/$1" "$3"
  mv -f "$work/$1" "$OUT/$1"
}

# The builds are independent: the Kubernetes components, etcd, CoreDNS
# and kube-router run at once (Go's build and module caches take
# concurrent users), so that one's single-threaded steps (resolving
# modules, linking) overlap another's compiling. A failed build fails the
# script once all have ended.
pids=""
if [ -z "$assets" ]; then
  one etcd "go.etcd.io/etcd/server/v3@$K8S_ETCD_VERSION" go.etcd.io/etcd/server/v3 \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=$K8S_ETCD_VERSION" &
  pids="$pids $!"
else
  ln -sf "$assets/etcd" "$OUT/etcd"
  ln -sf "$assets/kube-apiserver" "$OUT/kube-apiserver"
fi
kubernetes &
pids="$pids $!"
one coredns "github.com/coredns/coredns@$K8S_COREDNS_VERSION" github.com/coredns/coredns \
  "-X github.com/coredns/coredns/coremain.GitCommit=$K8S_COREDNS_VERSION" &
pids="$pids $!"
one kube-router "github.com/cloudnativelabs/kube-router/v2@$K8S_KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router \
  "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$K8S_KUBE_ROUTER_VERSION" &
pids="$pids $!"
failed=0
for p in $pids; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { log "a build failed (see above)"; exit 1; }

complete || { log "incomplete: $OUT"; exit 1; }
echo "$OUT"
