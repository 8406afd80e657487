#!/bin/sh
# What netfilter-setup's rules do to real traffic (docs/netfilter.md).
# Driven by native_test/netfilter/test_netfilter_cmd.c; needs root.
#
#   sh behaviour.sh /path/to/condukt-egress
#
# Two network namespaces joined by a veth pair:
#   pod   10.200.1.1/24  fd00:200::1/64   runs netfilter-setup; a stand-in
#                                         proxy on 127.0.0.1:15001 and
#                                         [::1]:15001, a stand-in resolver
#                                         on port 15053 (UDP and TCP)
#   inet  10.200.1.2-3   fd00:200::2-3    TCP 80, 443, 8080, 8082, 53 and
#                                         UDP 443, 53 listeners
# "The sidecar" is uid 1337 with CAP_NET_ADMIN; "the workspace" is root,
# as root without capabilities, or as root with the container runtime's
# default capability set (which includes CAP_NET_RAW, enough for SO_MARK).
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
SIDECAR_UID=1337
# containerd's and Docker's default capability set.
DEFAULT_CAPS=-all,+chown,+dac_override,+fsetid,+fowner,+mknod,+net_raw,+setgid,+setuid,+setfcap,+setpcap,+net_bind_service,+sys_chroot,+kill,+audit_write

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
# The sidecar: its uid with CAP_NET_ADMIN, as the proxy runs.
sidecar_probe() {
  in_pod setpriv --reuid $SIDECAR_UID --regid $SIDECAR_UID --clear-groups \
    --inh-caps +net_admin --ambient-caps +net_admin "$PY" "$WORK/probe.py" "$@"
}
# Its uid without any capability (cannot set the mark).
sidecar_nocap_probe() {
  in_pod setpriv --reuid $SIDECAR_UID --regid $SIDECAR_UID --clear-groups \
    "$PY" "$WORK/probe.py" "$@"
}
# A root workspace with the runtime's default capabilities.
default_probe() {
  in_pod setpriv --bounding-set "$DEFAULT_CAPS" --inh-caps -all \
    "$PY" "$WORK/probe.py" "$@"
}
# Joins GROUP in the pod while inet captures; prints how many captured
# frames carry the group's address (the listener report).
multicast_reports() { # multicast_reports GROUP TAG
  rm -f "$WORK/sniff-$2"
  in_inet "$PY" "$WORK/probe.py" sniff "cenf${ID}i" "$WORK/sniff-$2" 3 >/dev/null &
  sniffer=$!
  for _ in $(seq 20); do [ -s "$WORK/sniff-$2" ] && break; sleep 0.05; done
  pod_probe join "$1" "cenf${ID}p" 2 >/dev/null
  wait $sniffer
  "$PY" "$WORK/probe.py" seen "$WORK/sniff-$2" "$1"
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
  tcpeof,0.0.0.0,8082,eof tcpeof,::,8082,eof \
  udp,0.0.0.0,443,udp443 udp,::,443,udp443 \
  tcp,10.200.1.2,53,dnsA tcp,10.200.1.3,53,dnsB \
  tcp,fd00:200::2,53,dnsA tcp,fd00:200::3,53,dnsB \
  udp,10.200.1.2,53,udpdnsA udp,10.200.1.3,53,udpdnsB \
  udp,fd00:200::2,53,udpdnsA udp,fd00:200::3,53,udpdnsB &
PIDS="$PIDS $!"
ip netns exec "$POD" "$PY" "$WORK/probe.py" serve "$WORK/pod.log" "$WORK/pod.ready" \
  tcp,127.0.0.1,15001,proxy4 tcp,::1,15001,proxy6 \
  tcp,127.0.0.1,15053,dnsredir4 tcp,::1,15053,dnsredir6 \
  udp,127.0.0.1,15053,udpredir4 udp,::1,15053,udpredir6 \
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
# Joining a multicast group makes the kernel send listener reports (MLD
# for IPv6, IGMP for IPv4) naming the group: without the rules they leave
# the pod, which is what makes them a channel.
check "before setup, joining ff0e::c0de:1 sends an MLD report out" yes \
  "$([ "$(multicast_reports ff0e::c0de:1 pre6)" -ge 1 ] && echo yes)"
check "before setup, joining 239.1.2.3 sends an IGMP report out" yes \
  "$([ "$(multicast_reports 239.1.2.3 pre4)" -ge 1 ] && echo yes)"

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

# The exemption is the mark on a socket of the sidecar's uid: both halves.
for fam in 4 6; do
  [ $fam = 4 ] && A=10.200.1.2 || A=fd00:200::2
  check "the sidecar's marked socket -> inet:443 directly (IPv$fam)" "reply inet443" \
    "$(sidecar_probe connect $A 443 marked$fam $MARK)"
  check "the sidecar's marked socket -> inet:8080 directly (IPv$fam)" "reply inet8080" \
    "$(sidecar_probe connect $A 8080 marked8080-$fam $MARK)"
  check "the sidecar's uid without the mark -> inet:8080 is refused (IPv$fam)" refused \
    "$(sidecar_nocap_probe connect $A 8080 uidonly$fam)"
  check "the sidecar's uid without the mark -> inet:443 lands on the proxy (IPv$fam)" "reply proxy$fam" \
    "$(sidecar_nocap_probe connect $A 443 uidonly443-$fam)"
  # Root with the runtime's default capabilities can set the mark
  # (CAP_NET_RAW suffices since Linux 5.17), but is not the sidecar's uid.
  check "root with the default capabilities, marked -> inet:443 lands on the proxy (IPv$fam)" "reply proxy$fam" \
    "$(default_probe connect $A 443 rootmark$fam $MARK)"
  check "root with the default capabilities, marked -> inet:8080 is refused (IPv$fam)" refused \
    "$(default_probe connect $A 8080 rootmark8080-$fam $MARK)"
  # A socket the sidecar closed first still sends its last ACK: the
  # server sees the whole close and does not linger in LAST-ACK.
  check "the sidecar's marked socket can close first (IPv$fam)" closed \
    "$(sidecar_probe closefirst $A 8082 eof$fam $MARK)"
done
sleep 0.3
check "after the sidecar closed first, no server socket waits in LAST-ACK" 0 \
  "$(in_inet ss -Htan state last-ack '( sport = :8082 )' | wc -l)"
check "a different mark is no exemption" "reply proxy4" \
  "$(sidecar_probe connect 10.200.1.2 443 othermark 0x538)"
# The proxy's connections carry its mark as their connection mark too (the
# proxy deletes their conntrack entries by it when it starts), and only
# they do: the redirected connections to inet:443 above (plain, uid 65534,
# the sidecar's uid unmarked, root marked; mark 0x538 in IPv4) keep
# connection mark 0.
if command -v conntrack >/dev/null 2>&1; then
  for f in ipv4 ipv6; do
    check "only the sidecar's marked connection to inet:443 has connection mark $MARK ($f)" 1 \
      "$(in_pod conntrack -L -f $f -p tcp --dport 443 -m $MARK 2>/dev/null | grep -c 'dport=443')"
    check "the redirected connections to inet:443 have connection mark 0 ($f)" yes \
      "$([ "$(in_pod conntrack -L -f $f -p tcp --dport 443 -m 0 2>/dev/null | grep -c 'dport=443')" -ge 4 ] && echo yes)"
  done
else
  echo "ok - # skip connection marks: conntrack (the conntrack package) not installed"
fi

# DNS: the workspace's port 53, to any address, lands on the sidecar's
# resolver; only the sidecar's uid reaches the real resolver, and only it.
for fam in 4 6; do
  [ $fam = 4 ] && A=10.200.1.2 B=10.200.1.3 || A=fd00:200::2 B=fd00:200::3
  check "TCP 53 to the resolver is redirected to the sidecar's resolver (IPv$fam)" "reply dnsredir$fam" \
    "$(pod_probe connect $A 53 wsdns$fam)"
  check "TCP 53 to another address is redirected too (IPv$fam)" "reply dnsredir$fam" \
    "$(default_probe connect $B 53 wsdnsB$fam)"
  check "the sidecar's uid reaches the resolver on TCP 53 (IPv$fam)" "reply dnsA" \
    "$(sidecar_nocap_probe connect $A 53 sidecardns$fam)"
  check "the sidecar's uid cannot reach another address on TCP 53 (IPv$fam)" refused \
    "$(sidecar_nocap_probe connect $B 53 sidecardnsB$fam)"
done

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
for a in 10.200.1.2 fd00:200::2; do
  pod_probe udp $a 443 udp-unmarked >/dev/null
  default_probe udp $a 443 udp-rootmarked $MARK >/dev/null
  sidecar_nocap_probe udp $a 443 udp-uidonly >/dev/null
done
for a in 10.200.1.3 fd00:200::3; do sidecar_nocap_probe udp $a 53 udp-dns-other >/dev/null; done
for a in 10.200.1.2 fd00:200::2; do
  sidecar_probe udp $a 443 udp-marked $MARK >/dev/null
  sidecar_nocap_probe udp $a 53 udp-dns >/dev/null
  pod_probe udp $a 53 udp-redirected >/dev/null
done
for _ in $(seq 40); do
  [ "$(grep -c -e '^udp443 udp-marked$' -e '^udpdnsA udp-dns$' -e 'udp-redirected$' "$WORK/inet.log" "$WORK/pod.log" | awk -F: '{s+=$2} END {print s}')" = 6 ] && break
  sleep 0.05
done
check "the sidecar's marked UDP 443 arrives (both families)" 2 \
  "$(grep -c '^udp443 udp-marked$' "$WORK/inet.log")"
check "the sidecar's UDP 53 to the resolver arrives (both families)" 2 \
  "$(grep -c '^udpdnsA udp-dns$' "$WORK/inet.log")"
check "the workspace's UDP 53 lands on the sidecar's resolver (both families)" 2 \
  "$(grep -c -e '^udpredir4 udp-redirected$' -e '^udpredir6 udp-redirected$' "$WORK/pod.log")"
check "unmarked, root-marked or uid-only UDP 443 never arrives" 0 \
  "$(grep -c -e 'udp-unmarked' -e 'udp-rootmarked' -e 'udp-uidonly' "$WORK/inet.log")"
check "UDP 53 to another address never arrives" 0 \
  "$(grep -c 'udp-dns-other' "$WORK/inet.log")"
check "the workspace's UDP 53 never reaches a resolver" 0 \
  "$(grep -c 'udp-redirected' "$WORK/inet.log")"
check "no redirected connection reached inet" 0 \
  "$(grep -c -e redir -e nobody -e othermark -e uidonly -e rootmark -e wsdns "$WORK/inet.log")"
check "the proxy saw all 11 redirected connections" 11 \
  "$(grep -c -e 'proxy[46] redir' -e 'proxy[46] nobody[46]$' -e 'proxy[46] uidonly443' -e 'proxy[46] rootmark[46]$' -e 'proxy4 othermark' "$WORK/pod.log")"

# Only neighbour discovery leaves among ICMPv6: joining a group the
# workspace chooses sends no report out any more (nor IGMP for IPv4),
# while the IPv6 checks above worked with the neighbour caches flushed.
check "after setup, joining ff0e::c0de:2 sends no MLD report out" 0 \
  "$(multicast_reports ff0e::c0de:2 post6)"
check "after setup, joining 239.1.2.4 sends no IGMP report out" 0 \
  "$(multicast_reports 239.1.2.4 post4)"

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
