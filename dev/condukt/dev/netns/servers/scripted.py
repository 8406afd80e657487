"""A misbehaving HTTP/1.1 origin for the testbed's robustness tests.

Listens in the inet namespace on PLAIN (cleartext) and TLS_PORT (TLS with
the testbed's server certificate), on IPv4 and IPv6. Every connection
reads request heads in a loop and answers by path, byte for byte as
written here, so that a test can make the proxy face what real servers
sometimes do:

  /            200, Content-Length, "scripted <path>\\n"; keep-alive
  /extra       200 "ok" (Content-Length: 2) followed at once by a second,
               unasked-for response (X-Injected: yes)
  /unsolicited 200 "ok", then 300 ms later an unasked-for response on the
               idle keep-alive connection
  /early       ?size=N: does not read the request body; answers 413 with
               an N-byte body at once, then waits 5 s without reading
               and closes
  /101         101 Switching Protocols whatever the request said
  /interim     100 Continue, 103 Early Hints, then 200 "ok\\n"
  /chunked     ?n=N: a chunked body of N chunks "chunk <i>\\n"
  /tiny        ?n=N: a chunked body of N one-byte chunks ("a")
  /close       ?notify=0|1: 200 without framing (body until close), body
               "close-delimited body\\n", then close: on TLS with
               close_notify (notify=1) or without (notify=0, a truncation)
  /tunnel      101 to a WebSocket upgrade; then reads until the client's
               end of stream and only then answers "got: <bytes>" and closes
  /fields      answers the request's header fields as received, every
               copy in order with its spelling, as JSON [[name, value], ...]
  /sink        reads a chunked or Content-Length body; answers its size
  /trailers    a chunked body "with trailers\\n" followed by the trailers
               Grpc-Status: 0 and X-Checksum: abc, among fields a trailer
               section must not carry (Content-Length: 99,
               Transfer-Encoding: chunked, Host: evil.test, Connection:
               close, Set-Cookie: t=1), which the proxy must drop
  /trailers-in reads a chunked request body and its trailer section;
               answers "got <n> bytes; trailers <Name>=<value>,...\\n"
               (names as received, in order)
  /slow        ?key=K: sleeps 1 s, then 200 "slow"; counts the /slow
               requests of key K in progress at once
  /slow-max    ?key=K: answers the most /slow requests of key K that were
               in progress at once, and the connections they came on
  /blob        ?key=K&i=I&size=N: 200 with an N-byte body, "blob I " over
               and over, written 16 KiB at a time; counts the /blob
               requests of key K received and the body bytes written
  /blob-stats  ?key=K: answers "<requests> <bytes>" of /blob for key K

With a fifth argument ONE_PORT, also listens there (TLS) for one
connection at a time: a connection that comes while another is open is
closed at once, before its TLS handshake (an upstream that refuses a
client's extra connections).

Run: /usr/bin/python3 scripted.py PLAIN TLS_PORT CERT KEY [ONE_PORT]
"""

import json
import socket
import ssl
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

SLOW_LOCK = threading.Lock()
SLOW = {}  # key -> {"now": n, "max": n, "conns": set()}
BLOB = {}  # key -> [requests, body bytes written]


def read_head(f):
    line = f.readline(65536)
    if not line:
        return None
    headers = {}
    fields = []
    while True:
        h = f.readline(65536)
        if h in (b"\r\n", b"\n", b""):
            break
        k, v = h.decode("latin-1").split(":", 1)
        headers[k.strip().lower()] = v.strip()
        fields.append([k.strip(), v.strip()])
    method, target, version = line.decode("latin-1").split()
    headers[""] = fields
    return method, target, version, headers


def read_body(f, headers, trailers=None):
    if "chunked" in headers.get("transfer-encoding", "").lower():
        size = 0
        while True:
            n = int(f.readline(1024).split(b";")[0].strip(), 16)
            if n == 0:
                while True:
                    line = f.readline(8192)
                    if line in (b"\r\n", b"\n", b""):
                        break
                    if trailers is not None:
                        k, v = line.decode("latin-1").split(":", 1)
                        trailers.append((k, v.strip()))
                return size
            size += len(f.read(n))
            f.readline(16)
    n = int(headers.get("content-length") or 0)
    return len(f.read(n)) if n else 0


def ok(body, extra=""):
    return ("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra)).encode() + body


def serve(sock, tls):
    f = sock.makefile("rb")
    while True:
        head = read_head(f)
        if head is None:
            break
        method, target, _version, headers = head
        url = urlsplit(target)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path == "/extra":
            read_body(f, headers)
            sock.sendall(ok(b"ok") + ok(b"injected", "X-Injected: yes\r\n"))
        elif path == "/unsolicited":
            read_body(f, headers)
            sock.sendall(ok(b"ok"))
            time.sleep(0.3)
            sock.sendall(ok(b"injected", "X-Injected: idle\r\n"))
        elif path == "/early":
            size = int(q.get("size", "1000"))
            sock.sendall(("HTTP/1.1 413 Content Too Large\r\nContent-Length: %d\r\n\r\n" % size).encode() + b"e" * size)
            time.sleep(5)
            break
        elif path == "/101":
            read_body(f, headers)
            sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw bytes")
            time.sleep(1)
            break
        elif path == "/interim":
            read_body(f, headers)
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n" + ok(b"ok\n"))
        elif path == "/chunked":
            read_body(f, headers)
            n = int(q.get("n", "3"))
            out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            for i in range(n):
                c = b"chunk %d\n" % i
                out += b"%x\r\n%s\r\n" % (len(c), c)
            sock.sendall(out + b"0\r\n\r\n")
        elif path == "/tiny":
            read_body(f, headers)
            n = int(q.get("n", "1000"))
            sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1\r\na\r\n" * n + b"0\r\n\r\n")
        elif path == "/close":
            read_body(f, headers)
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nclose-delimited body\n")
            if tls and q.get("notify") == "1":
                sock = sock.unwrap()
            # Without unwrap() Python closes the TCP connection without a
            # close_notify: to the peer, a truncated body.
            sock.close()
            return
        elif path == "/tunnel":
            sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            got = f.read()  # until the client's end of stream
            sock.sendall(b"got: " + got)
            sock.shutdown(socket.SHUT_WR)
            time.sleep(0.5)
            break
        elif path == "/trailers":
            read_body(f, headers)
            sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Grpc-Status, X-Checksum\r\n\r\n"
                         b"e\r\nwith trailers\n\r\n0\r\nGrpc-Status: 0\r\nContent-Length: 99\r\n"
                         b"Transfer-Encoding: chunked\r\nHost: evil.test\r\nConnection: close\r\n"
                         b"Set-Cookie: t=1\r\nX-Checksum: abc\r\n\r\n")
        elif path == "/trailers-in":
            trailers = []
            n = read_body(f, headers, trailers)
            tr = ",".join("%s=%s" % kv for kv in trailers)
            sock.sendall(ok(("got %d bytes; trailers %s\n" % (n, tr)).encode()))
        elif path == "/slow":
            read_body(f, headers)
            key = q.get("key", "")
            with SLOW_LOCK:
                st = SLOW.setdefault(key, {"now": 0, "max": 0, "conns": set()})
                st["now"] += 1
                st["max"] = max(st["max"], st["now"])
                st["conns"].add(id(sock))
            time.sleep(1)
            with SLOW_LOCK:
                st["now"] -= 1
            sock.sendall(ok(b"slow"))
        elif path == "/slow-max":
            read_body(f, headers)
            with SLOW_LOCK:
                st = SLOW.get(q.get("key", ""), {"max": 0, "conns": set()})
                body = b"%d %d" % (st["max"], len(st["conns"]))
            sock.sendall(ok(body))
        elif path == "/blob":
            read_body(f, headers)
            key, size = q.get("key", ""), int(q.get("size", "60000"))
            with SLOW_LOCK:
                BLOB.setdefault(key, [0, 0])[0] += 1
            unit = b"blob %s " % q.get("i", "0").encode()
            body = (unit * (size // len(unit) + 1))[:size]
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % size)
            for off in range(0, size, 16384):
                sock.sendall(body[off:off + 16384])
                with SLOW_LOCK:
                    BLOB[key][1] += len(body[off:off + 16384])
        elif path == "/blob-stats":
            read_body(f, headers)
            with SLOW_LOCK:
                st = BLOB.get(q.get("key", ""), [0, 0])
            sock.sendall(ok(b"%d %d" % (st[0], st[1])))
        elif path == "/fields":
            read_body(f, headers)
            sock.sendall(ok((json.dumps(headers[""]) + "\n").encode()))
        elif path == "/sink":
            n = read_body(f, headers)
            sock.sendall(ok(b"%d\n" % n))
        else:
            read_body(f, headers)
            sock.sendall(ok(("scripted %s\n" % path).encode()))
    sock.close()


ONE_LOCK = threading.Lock()
ONE_OPEN = [0]


def handle(sock, ctx, one=False):
    if one:
        with ONE_LOCK:
            if ONE_OPEN[0] > 0:
                sock.close()
                return
            ONE_OPEN[0] += 1
    try:
        if ctx is not None:
            sock = ctx.wrap_socket(sock, server_side=True)
        serve(sock, ctx is not None)
    except (OSError, ValueError) as e:
        sys.stderr.write("scripted: %r\n" % (e,))
    finally:
        try:
            sock.close()
        except OSError:
            pass
        if one:
            with ONE_LOCK:
                ONE_OPEN[0] -= 1


def listen(family, addr, port, ctx, one=False):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, port))
    s.listen(128)

    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=handle, args=(c, ctx, one), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def main():
    plain, tls_port, cert, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        listen(family, addr, plain, None)
        listen(family, addr, tls_port, ctx)
        if len(sys.argv) > 5:
            listen(family, addr, int(sys.argv[5]), ctx, one=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
