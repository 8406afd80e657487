"""A DNS server the tests control, in the testbed's inet namespace.

It stands for the resolvers of a cluster: the sidecar's own stub asks it
(`proxy --dns-upstream`), and the tests count what reaches it (a DNS
tunnel that got out would show here). It answers from a zone file it
reads again for every query, so a test changes an answer by rewriting
the file: {"name": ["address", ...], ...}; A and AAAA come from the
addresses of that family, a name not in the file is NXDOMAIN, a name with
no address of the asked family gets an empty answer. Every query is
logged as one JSON line: {"name", "type", "transport"}.

Run: /usr/bin/python3 dns_server.py ZONE_FILE LOG_FILE ADDR [ADDR...]
(UDP and TCP port 53 on each address).
"""

import ipaddress
import json
import socket
import struct
import sys
import threading

ZONE, LOG = sys.argv[1], sys.argv[2]
ADDRS = sys.argv[3:]
LOCK = threading.Lock()


def parse_question(msg):
    labels, i = [], 12
    while True:
        n = msg[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0:
            raise ValueError("compressed question")
        labels.append(msg[i + 1 : i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    qtype, qclass = struct.unpack("!HH", msg[i : i + 4])
    return ".".join(labels), qtype, qclass, msg[12 : i + 4]


def answer(msg, transport):
    ident, flags = struct.unpack("!HH", msg[:4])
    name, qtype, _qclass, question = parse_question(msg)
    with LOCK:
        with open(LOG, "a") as log:
            log.write(json.dumps({"name": name, "type": qtype, "transport": transport}) + "\n")
    try:
        with open(ZONE) as f:
            zone = json.load(f)
    except (OSError, ValueError):
        zone = {}
    rcode, records = 0, []
    if name not in zone:
        rcode = 3
    else:
        for text in zone[name]:
            ip = ipaddress.ip_address(text)
            if (qtype == 1 and ip.version == 4) or (qtype == 28 and ip.version == 6):
                records.append(struct.pack("!HHHIH", 0xC00C, qtype, 1, 5, len(ip.packed)) + ip.packed)
    rd = flags & 0x0100
    head = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | 0x0080 | rd | rcode, 1, len(records), 0, 0)
    return head + question + b"".join(records)


def serve_udp(addr):
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        msg, peer = s.recvfrom(4096)
        try:
            s.sendto(answer(msg, "udp"), peer)
        except (ValueError, IndexError, struct.error):
            pass


def serve_tcp_conn(conn):
    with conn:
        while True:
            head = conn.recv(2, socket.MSG_WAITALL)
            if len(head) < 2:
                return
            (n,) = struct.unpack("!H", head)
            msg = conn.recv(n, socket.MSG_WAITALL)
            try:
                out = answer(msg, "tcp")
            except (ValueError, IndexError, struct.error):
                return
            conn.sendall(struct.pack("!H", len(out)) + out)


def serve_tcp(addr):
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 53))
    s.listen(16)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve_tcp_conn, args=(conn,), daemon=True).start()


threads = []
for a in ADDRS:
    for fn in (serve_udp, serve_tcp):
        t = threading.Thread(target=fn, args=(a,), daemon=True)
        t.start()
        threads.append(t)
print("dns_server: listening on " + ", ".join(ADDRS), flush=True)
for t in threads:
    t.join()
