# Pinned versions of the Kubernetes test tier (docs/k8s-tier.md).
# Sourced by the scripts beside it; changing a line here changes the cache
# key, so the next run builds the new set once.

# The Go toolchain every binary is built with. A bootstrap `go` of 1.21 or
# later (Debian's golang-1.23-go from bookworm-backports) fetches it as the
# module golang.org/toolchain through the Go module proxy.
K8S_GO_TOOLCHAIN=go1.26.8

# kube-apiserver, from the module k8s.io/kubernetes (its staging modules,
# k8s.io/api and the rest, at the matching v0.X.Y).
K8S_VERSION=v1.36.3

# etcd, from go.etcd.io/etcd/server/v3: the version k8s.io/kubernetes
# K8S_VERSION itself requires.
K8S_ETCD_VERSION=v3.6.8

# The node's add-ons: cluster DNS (CoreDNS, github.com/coredns/coredns) and
# the NetworkPolicy controller (kube-router's firewall, run alone:
# github.com/cloudnativelabs/kube-router/v2).
K8S_COREDNS_VERSION=v1.15.0
K8S_KUBE_ROUTER_VERSION=v2.1.0

# Debian's Go, used only to bootstrap K8S_GO_TOOLCHAIN.
K8S_DEBIAN_GO_PACKAGE=golang-1.23-go
K8S_DEBIAN_GO=/usr/lib/go-1.23/bin/go
