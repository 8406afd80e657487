#!/usr/bin/python3
"""The soak's mixed traffic (everything but the h2load parts), until killed.

usage: soak.py BASE_URL CAFILE STATS_PATH [SCALE]

BASE_URL is https://allowed.test (its /1k.bin and /big.bin are used); the
other names of the testbed are reached on the same scheme. Each kind of
traffic runs in its own thread at a fixed pace (SCALE multiplies the
rates, default 1):

  newconn   a new TLS connection, one GET, closed            20/s
  deny      a GET to denied.test (no rule allows it)           5/s
  decide    a GET to decide.test (the decider allows it)       5/s
  decide_deny  a GET to decide.test/deny/ (the decider denies) 2/s
  slow      every 10 s, a download of /big.bin read at about 256 KiB/s
            for 12 s, then dropped with an RST mid-body
  reset     connections reset (SO_LINGER 0) at three points:
            after connect, mid-request, mid-response              6/s

Every STATS_INTERVAL (5 s) it rewrites STATS_PATH with one JSON object:
the counts of each kind's outcomes since the start ({"kind": {"ok": N,
"refused": N, "error": N}}). "ok" is what the kind expects (a 200 for the
allowed ones, a refusal for the denied ones), "error" anything else.
"""
import http.client
import json
import os
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse

BASE = urllib.parse.urlsplit(sys.argv[1])
CTX = ssl.create_default_context(cafile=sys.argv[2])
STATS_PATH = sys.argv[3]
SCALE = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
STATS_INTERVAL = 5.0

lock = threading.Lock()
counts = {}


def count(kind, outcome):
    with lock:
        counts.setdefault(kind, {"ok": 0, "refused": 0, "error": 0})[outcome] += 1


def paced(kind, rate, fn):
    """Runs fn() rate times a second (after SCALE), forever; fn returns an outcome."""
    period = 1.0 / (rate * SCALE)
    nxt = time.monotonic()
    while True:
        try:
            outcome = fn()
        except Exception:  # a client-side surprise is an error, never the end of the thread
            outcome = "error"
        count(kind, outcome)
        nxt += period
        delay = nxt - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            nxt = time.monotonic()


def get(host, path, close=True, timeout=10):
    c = http.client.HTTPSConnection(host, 443, context=CTX, timeout=timeout)
    try:
        c.request("GET", path, headers={"Connection": "close"} if close else {})
        r = c.getresponse()
        r.read()
        return r.status
    finally:
        c.close()


def expect_ok(host, path):
    def one():
        try:
            return "ok" if get(host, path) == 200 else "error"
        except (OSError, http.client.HTTPException):
            return "error"
    return one


def expect_refusal(host, path):
    """A denial shows as a 403 from the proxy or a refused TLS handshake/reset."""
    def one():
        try:
            status = get(host, path)
        except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected):
            return "ok"
        except (OSError, http.client.HTTPException):
            return "error"
        return "ok" if status == 403 else "error"
    return one


def rst(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def reset_kinds():
    n = 0

    def one():
        nonlocal n
        n += 1
        raw = socket.create_connection((BASE.hostname, 443), timeout=10)
        where = n % 3
        if where == 0:
            rst(raw)
            return "ok"
        s = CTX.wrap_socket(raw, server_hostname=BASE.hostname)
        if where == 1:
            s.sendall(b"GET /1k.bin HTTP/1.1\r\nHost: " + BASE.hostname.encode() + b"\r\nX-Half: ")
        else:
            s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: " + BASE.hostname.encode() + b"\r\n\r\n")
            got = 0
            while got < 256 * 1024:
                chunk = s.recv(65536)
                if not chunk:
                    return "error"
                got += len(chunk)
        rst(s)
        return "ok"
    return one


def slow_reader():
    """One slow download, dropped mid-body with an RST."""
    s = CTX.wrap_socket(socket.create_connection((BASE.hostname, 443), timeout=30),
                        server_hostname=BASE.hostname)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: " + BASE.hostname.encode() + b"\r\n\r\n")
    end = time.monotonic() + 12
    got = 0
    while time.monotonic() < end:
        chunk = s.recv(16384)
        if not chunk:
            s.close()
            return "error"
        got += len(chunk)
        time.sleep(0.0625)
    rst(s)
    return "ok" if got > 0 else "error"


def slow_loop():
    while True:
        threading.Thread(target=lambda: count("slow", safe(slow_reader)), daemon=True).start()
        time.sleep(10 / SCALE)


def safe(fn):
    try:
        return fn()
    except Exception:
        return "error"


def stats_loop():
    while True:
        time.sleep(STATS_INTERVAL)
        with lock:
            text = json.dumps(counts)
        tmp = STATS_PATH + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, STATS_PATH)


def main():
    host = BASE.hostname
    kinds = [
        ("newconn", 20, expect_ok(host, "/1k.bin")),
        ("deny", 5, expect_refusal("denied.test", "/1k.bin")),
        ("decide", 5, expect_ok("decide.test", "/1k.bin")),
        ("decide_deny", 2, expect_refusal("decide.test", "/deny/1k.bin")),
        ("reset", 6, reset_kinds()),
    ]
    for kind, rate, fn in kinds:
        threading.Thread(target=paced, args=(kind, rate, fn), daemon=True).start()
    threading.Thread(target=slow_loop, daemon=True).start()
    stats_loop()


if __name__ == "__main__":
    main()
