"""DNS queries from the workspace, for the tests of the sidecar's resolver.

Run: python3 dns_query.py SERVER PORT SPEC_JSON, where SPEC_JSON is
  {"queries": [[name, qtype], ...], "transport": "udp" | "tcp",
   "mode": "seq" | "burst", "timeout": seconds}
seq asks one query after the other (each waits up to timeout); burst
sends every query at once over UDP, then collects answers for timeout
seconds. Prints one JSON list: per query {"name", "type", "rcode", "tc",
"answers": [[type, text], ...]} or {"name", "type", "timeout": true}.
"""

import ipaddress
import json
import os
import select
import socket
import struct
import sys
import time

server, port, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
family = socket.AF_INET6 if ":" in server else socket.AF_INET
timeout = spec.get("timeout", 2.0)


def build(ident, name, qtype):
    q = b"".join(bytes([len(l)]) + l.encode() for l in name.strip(".").split(".") if l) + b"\x00"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + q + struct.pack("!HH", qtype, 1)


def read_name(msg, i):
    labels, jumped, end = [], False, None
    for _ in range(128):
        n = msg[i]
        if n & 0xC0 == 0xC0:
            if not jumped:
                end = i + 2
            jumped = True
            i = ((n & 0x3F) << 8) | msg[i + 1]
            continue
        if n == 0:
            i += 1
            break
        labels.append(msg[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels), (end if jumped else i)


def parse(msg):
    ident, flags, qd, an = struct.unpack("!HHHH", msg[:8])
    i = 12
    for _ in range(qd):
        _, i = read_name(msg, i)
        i += 4
    answers = []
    for _ in range(an):
        _, i = read_name(msg, i)
        rtype, _cls, _ttl, rdlen = struct.unpack("!HHIH", msg[i : i + 10])
        i += 10
        data = msg[i : i + rdlen]
        if rtype in (1, 28):
            answers.append([rtype, str(ipaddress.ip_address(data))])
        elif rtype == 5:
            answers.append([rtype, read_name(msg, i)[0]])
        else:
            answers.append([rtype, data.hex()])
        i += rdlen
    return ident, {"rcode": flags & 0xF, "tc": bool(flags & 0x0200), "answers": answers}


def ask_tcp(msg):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect((server, port))
        s.sendall(struct.pack("!H", len(msg)) + msg)
        (n,) = struct.unpack("!H", s.recv(2, socket.MSG_WAITALL))
        return s.recv(n, socket.MSG_WAITALL)


results = []
queries = spec["queries"]
if spec.get("mode") == "burst":
    s = socket.socket(family, socket.SOCK_DGRAM)
    ids = {}
    for k, (name, qtype) in enumerate(queries):
        ident = int.from_bytes(os.urandom(2), "big")
        ids[ident] = k
        s.sendto(build(ident, name, qtype), (server, port))
    got = {}
    end = time.time() + timeout
    while time.time() < end:
        r, _, _ = select.select([s], [], [], max(0.0, end - time.time()))
        if not r:
            break
        ident, res = parse(s.recv(4096))
        if ident in ids:
            got[ids[ident]] = res
    for k, (name, qtype) in enumerate(queries):
        results.append(dict(name=name, type=qtype, **got[k]) if k in got else {"name": name, "type": qtype, "timeout": True})
else:
    for name, qtype in queries:
        ident = int.from_bytes(os.urandom(2), "big")
        msg = build(ident, name, qtype)
        try:
            if spec.get("transport") == "tcp":
                out = ask_tcp(msg)
            else:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.settimeout(timeout)
                    s.sendto(msg, (server, port))
                    out = s.recv(4096)
            _, res = parse(out)
            results.append(dict(name=name, type=qtype, **res))
        except (socket.timeout, OSError):
            results.append({"name": name, "type": qtype, "timeout": True})
print(json.dumps(results))
