"""Bypass witnesses: a plain TCP listener and a UDP listener in inet.

Traffic that is neither TCP 80 nor TCP 443 must not leave the pod once the
sidecar's filter is in place. These listeners prove such traffic reaches
inet when nothing blocks it, so a later "it was blocked" result means
something. Every connection or datagram is written as one JSON line to LOG:

  {"proto": "tcp"|"udp", "port": N, "peer": "addr", "local": "addr",
   "data_b64": "...", "ts": unix seconds}

TCP: reads up to 4096 bytes (two seconds at most), logs, answers
"bypass-tcp-ok\\n" and closes. UDP: logs each datagram and answers
"bypass-udp-ok\\n".

Run: /usr/bin/python3 bypass.py LOG TCP_PORT UDP_PORT
"""

import base64
import json
import selectors
import socket
import sys
import threading
import time

LOG_LOCK = threading.Lock()


def log(path, proto, port, peer, local, data):
    line = json.dumps(
        {
            "proto": proto,
            "port": port,
            "peer": peer[0],
            "local": local[0],
            "data_b64": base64.b64encode(data).decode(),
            "ts": time.time(),
        }
    )
    with LOG_LOCK, open(path, "a") as f:
        f.write(line + "\n")


def bind(family, kind, port):
    sock = socket.socket(family, kind)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(("::", port))
    else:
        sock.bind(("0.0.0.0", port))
    if kind == socket.SOCK_STREAM:
        sock.listen(64)
    sock.setblocking(False)
    return sock


def serve_tcp(path, port, conn, peer):
    try:
        conn.settimeout(2.0)
        data = b""
        try:
            while len(data) < 4096:
                chunk = conn.recv(4096 - len(data))
                if not chunk:
                    break
                data += chunk
                if b"\n" in data:
                    break
        except socket.timeout:
            pass
        log(path, "tcp", port, peer, conn.getsockname(), data)
        conn.sendall(b"bypass-tcp-ok\n")
    except OSError as e:
        sys.stderr.write("bypass tcp: %r\n" % (e,))
    finally:
        conn.close()


def main(path, tcp_port, udp_port):
    sel = selectors.DefaultSelector()
    for family in (socket.AF_INET, socket.AF_INET6):
        sel.register(bind(family, socket.SOCK_STREAM, tcp_port), selectors.EVENT_READ, "tcp")
        sel.register(bind(family, socket.SOCK_DGRAM, udp_port), selectors.EVENT_READ, "udp")
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if key.data == "tcp":
                conn, peer = sock.accept()
                threading.Thread(target=serve_tcp, args=(path, tcp_port, conn, peer), daemon=True).start()
            else:
                data, peer = sock.recvfrom(65535)
                log(path, "udp", udp_port, peer, sock.getsockname(), data)
                sock.sendto(b"bypass-udp-ok\n", peer)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
