#!/bin/sh
# What netfilter-setup's rules do to real traffic (docs/netfilter.md).
# Driven by native_test/netfilter/test_netfilter_cmd.c; needs root.
#
#   sh behaviour.sh /path/to/condukt-egress
#
# Two network namespaces joined by a veth pair:
#   pod   10.200.1.1/24  fd00:200::1/64   runs netfilter-setup; a stand-in
#                                         proxy on 127.0.0.1:15001 and
#                                         [::1]:15001
#   inet  10.200.1.2-3   fd00:200::2-3    TCP 80, 443, 8080, 53 and UDP
#                                         443, 53 listeners
# Each check prints "ok - ..." or "not ok - ..."; the exit status is 0 when
# all pass, 1 otherwise, 77 when a prerequisite is missing (the last line
# says which). Namespaces (and with them the veth pair) and listeners are
# removed on every exit path.
set -u
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3
PROBE=$HERE/probe.py
MARK=0x539

skip() {
  echo "skip: $1"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "not root"
[ -x "$PY" ] || skip "$PY not found"
command -v setpriv >/dev/null 2>&1 || skip "setpriv not found"
command -v ip >/dev/null 2>&1 || skip "ip (iproute2) not found"

ID=$$
POD=ce-nf-$ID-pod
INET=ce-nf-$ID-inet
WORK=$(mktemp -d /tmp/ce_nf_behaviour.XXXXXX)
PIDS=""

cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  # Deleting a namespace destroys the veth end inside it, and a veth pair
  # dies with either end.
  ip netns del "$POD" 2>/dev/null
  ip netns del "$INET" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE

FAILED=0
check() { # check DESCRIPTION EXPECTED ACTUAL
  if [ "$2" = "$3" ]; then
    echo "ok - $1"
  else
    echo "not ok - $1: expected '$2', got '$3'"
    FAILED=1
  fi
}
in_pod() { ip netns exec "$POD" "$@"; }
in_inet() { ip netns exec "$INET" "$@"; }
# The probe is copied where uid 65534 can read it whatever the checkout's
# permissions are.
cp "$PROBE" "$WORK/probe.py" && chmod 755 "$WORK" && chmod 644 "$WORK/probe.py"
pod_probe() { in_pod "$PY" "$WORK/probe.py" "$@"; }
inet_probe() { in_inet "$PY" "$WORK/probe.py" "$@"; }
nobody_probe() {
  in_pod setpriv --reuid 65534 --regid 65534 --clear-groups \
    "$PY" "$WORK/probe.py" "$@"
}

ip netns add "$POD" || skip "ip netns add failed"
ip netns add "$INET" || exit 1
ip link add "cenf${ID}p" netns "$POD" type veth peer name "cenf${ID}i" \
  netns "$INET" || exit 1
ip -n "$POD" link set lo up
ip -n "$INET" link set lo up
ip -n "$POD" addr add 10.200.1.1/24 dev "cenf${ID}p"
ip -n "$POD" addr add fd00:200::1/64 dev "cenf${ID}p" nodad
ip -n "$INET" addr add 10.200.1.2/24 dev "cenf${ID}i"
ip -n "$INET" addr add 10.200.1.3/24 dev "cenf${ID}i"
ip -n "$INET" addr add fd00:200::2/64 dev "cenf${ID}i" nodad
ip -n "$INET" addr add fd00:200::3/64 dev "cenf${ID}i" nodad
ip -n "$POD" link set "cenf${ID}p" up
ip -n "$INET" link set "cenf${ID}i" up

# Started directly, not through the shell functions: a backgrounded
# function is a subshell, and killing it would leave python running (and
# with it the namespace). `ip netns exec` execs python in its own process,
# so $! is python's pid.
ip netns exec "$INET" "$PY" "$WORK/probe.py" serve "$WORK/inet.log" "$WORK/inet.ready" \
  tcp,0.0.0.0,80,inet80 tcp,::,80,inet80 \
  tcp,0.0.0.0,443,inet443 tcp,::,443,inet443 \
  tcp,0.0.0.0,8080,inet8080 tcp,::,8080,inet8080 \
  udp,0.0.0.0,443,udp443 udp,::,443,udp443 \
  tcp,10.200.1.2,53,dnsA tcp,10.200.1.3,53,dnsB \
  tcp,fd00:200::2,53,dnsA tcp,fd00:200::3,53,dnsB \
  udp,10.200.1.2,53,udpdnsA udp,10.200.1.3,53,udpdnsB \
  udp,fd00:200::2,53,udpdnsA udp,fd00:200::3,53,udpdnsB &
PIDS="$PIDS $!"
ip netns exec "$POD" "$PY" "$WORK/probe.py" serve "$WORK/pod.log" "$WORK/pod.ready" \
  tcp,127.0.0.1,15001,proxy4 tcp,::1,15001,proxy6 \
  tcp,127.0.0.1,8080,podlocal \
  tcp,0.0.0.0,8081,pod tcp,::,8081,pod &
PIDS="$PIDS $!"
for _ in $(seq 50); do
  [ -e "$WORK/inet.ready" ] && [ -e "$WORK/pod.ready" ] && break
  sleep 0.1
done
[ -e "$WORK/inet.ready" ] && [ -e "$WORK/pod.ready" ] || {
  echo "not ok - listeners did not start"
  exit 1
}

# Without the rules the pod reaches inet directly: the topology works.
check "before setup, inet:80 is reached directly (IPv4)" "reply inet80" \
  "$(pod_probe connect 10.200.1.2 80 pre4)"
check "before setup, inet:80 is reached directly (IPv6)" "reply inet80" \
  "$(pod_probe connect fd00:200::2 80 pre6)"

# A connection opened before the rules: it must stop when they arrive,
# since conntrack's ESTABLISHED only admits the reply direction. A
# namespace only runs conntrack once some rule needs it; without these
# (harmless, ACCEPT-policy) rules the held connection would have no
# conntrack entry and the check would prove nothing. They also show that
# the setup leaves other rules alone.
in_pod iptables -A INPUT -m conntrack --ctstate ESTABLISHED -j ACCEPT
in_pod ip6tables -A INPUT -m conntrack --ctstate ESTABLISHED -j ACCEPT
pod_probe hold 10.200.1.2 8080 held "$WORK/go" >"$WORK/held.out" &
HOLD=$!
PIDS="$PIDS $HOLD"
sleep 0.3

for run in 1 2; do
  out=$(in_pod "$BIN" netfilter-setup --dns 10.200.1.2,fd00:200::2 --ipv6 on 2>&1)
  check "netfilter-setup run $run exits 0 ($out)" 0 $?
done

touch "$WORK/go"
wait $HOLD
check "a connection opened before the rules cannot send after them ($(cat "$WORK/held.out"))" no \
  "$(grep -q 'reply inet8080' "$WORK/held.out" && echo yes || echo no)"
check "... and its data never arrives" 0 "$(grep -c 'held' "$WORK/inet.log")"

# Forget the neighbours learnt before the rules, so the IPv6 checks below
# also prove that neighbour discovery gets through them.
ip -n "$POD" neigh flush all
ip -n "$INET" neigh flush all

for port in 80 443; do
  check "pod -> inet:$port lands on the proxy (IPv4)" "reply proxy4" \
    "$(pod_probe connect 10.200.1.2 $port redir4-$port)"
  check "pod -> inet:$port lands on the proxy (IPv6)" "reply proxy6" \
    "$(pod_probe connect fd00:200::2 $port redir6-$port)"
done
check "pod -> inet:8080 is refused (IPv4)" refused \
  "$(pod_probe connect 10.200.1.2 8080 no4)"
check "pod -> inet:8080 is refused (IPv6)" refused \
  "$(pod_probe connect fd00:200::2 8080 no6)"

check "uid 65534 -> inet:443 lands on the proxy (IPv4)" "reply proxy4" \
  "$(nobody_probe connect 10.200.1.2 443 nobody4)"
check "uid 65534 -> inet:443 lands on the proxy (IPv6)" "reply proxy6" \
  "$(nobody_probe connect fd00:200::2 443 nobody6)"
check "uid 65534 cannot set the mark" mark-refused \
  "$(nobody_probe connect 10.200.1.2 443 nobodymark $MARK)"

check "marked socket -> inet:443 directly (IPv4)" "reply inet443" \
  "$(pod_probe connect 10.200.1.2 443 marked4 $MARK)"
check "marked socket -> inet:443 directly (IPv6)" "reply inet443" \
  "$(pod_probe connect fd00:200::2 443 marked6 $MARK)"
check "a different mark is no exemption" "reply proxy4" \
  "$(pod_probe connect 10.200.1.2 443 othermark 0x538)"
# The proxy's connections carry its mark as their connection mark too (the
# proxy deletes their conntrack entries by it when it starts), and only
# they do: the redirected connections to inet:443 above (plain and uid
# 65534 in each family, mark 0x538 in IPv4) keep connection mark 0.
if command -v conntrack >/dev/null 2>&1; then
  for f in ipv4 ipv6; do
    check "only the marked connection to inet:443 has connection mark $MARK ($f)" 1 \
      "$(in_pod conntrack -L -f $f -p tcp --dport 443 -m $MARK 2>/dev/null | grep -c 'dport=443')"
    check "the redirected connections to inet:443 have connection mark 0 ($f)" yes \
      "$([ "$(in_pod conntrack -L -f $f -p tcp --dport 443 -m 0 2>/dev/null | grep -c 'dport=443')" -ge 2 ] && echo yes)"
  done
else
  echo "ok - # skip connection marks: conntrack (the conntrack package) not installed"
fi

check "TCP 53 to the allowed resolver (IPv4)" "reply dnsA" \
  "$(pod_probe connect 10.200.1.2 53 dns4)"
check "TCP 53 to the allowed resolver (IPv6)" "reply dnsA" \
  "$(pod_probe connect fd00:200::2 53 dns6)"
check "TCP 53 to another address is refused (IPv4)" refused \
  "$(pod_probe connect 10.200.1.3 53 dnsB4)"
check "TCP 53 to another address is refused (IPv6)" refused \
  "$(pod_probe connect fd00:200::3 53 dnsB6)"

check "loopback stays open" "reply podlocal" \
  "$(pod_probe connect 127.0.0.1 8080 lo)"
check "the pod's own address stays open" "reply pod" \
  "$(pod_probe connect 10.200.1.1 8081 self)"
check "inet -> pod:8081 gets its replies (IPv4)" "reply pod" \
  "$(inet_probe connect 10.200.1.1 8081 inbound4)"
check "inet -> pod:8081 gets its replies (IPv6)" "reply pod" \
  "$(inet_probe connect fd00:200::1 8081 inbound6)"

# Datagrams: the refused ones first, then the allowed ones, so that once
# the allowed ones have arrived, a refused one that got through would have
# arrived too.
for a in 10.200.1.2 fd00:200::2; do pod_probe udp $a 443 udp-unmarked >/dev/null; done
for a in 10.200.1.3 fd00:200::3; do pod_probe udp $a 53 udp-dns-other >/dev/null; done
for a in 10.200.1.2 fd00:200::2; do
  pod_probe udp $a 443 udp-marked $MARK >/dev/null
  pod_probe udp $a 53 udp-dns >/dev/null
done
for _ in $(seq 40); do
  [ "$(grep -c -e '^udp443 udp-marked$' -e '^udpdnsA udp-dns$' "$WORK/inet.log")" = 4 ] && break
  sleep 0.05
done
check "marked UDP 443 arrives (both families)" 2 \
  "$(grep -c '^udp443 udp-marked$' "$WORK/inet.log")"
check "UDP 53 to the allowed resolver arrives (both families)" 2 \
  "$(grep -c '^udpdnsA udp-dns$' "$WORK/inet.log")"
check "unmarked UDP 443 never arrives" 0 \
  "$(grep -c 'udp-unmarked' "$WORK/inet.log")"
check "UDP 53 to another address never arrives" 0 \
  "$(grep -c 'udp-dns-other' "$WORK/inet.log")"
check "no redirected connection reached inet" 0 \
  "$(grep -c -e redir -e nobody -e othermark "$WORK/inet.log")"
check "the proxy saw all 6 redirected connections" 6 \
  "$(grep -c -e 'proxy[46] redir' -e 'proxy[46] nobody[46]$' "$WORK/pod.log")"

for run in 1 2; do
  out=$(in_pod "$BIN" netfilter-setup --remove 2>&1)
  check "netfilter-setup --remove run $run exits 0 ($out)" 0 $?
done
check "after --remove, no trace of our chains" 0 \
  "$( (in_pod iptables-save; in_pod ip6tables-save) | grep -c CONDUKT)"
check "after --remove, the other rules are still there" 2 \
  "$( (in_pod iptables -S INPUT; in_pod ip6tables -S INPUT) | grep -c ctstate)"
check "after --remove, inet:80 is reached directly (IPv4)" "reply inet80" \
  "$(pod_probe connect 10.200.1.2 80 post4)"
check "after --remove, inet:8080 is reached directly (IPv6)" "reply inet8080" \
  "$(pod_probe connect fd00:200::2 8080 post6)"

exit $FAILED
