"""An HTTP/2-only origin (python3-h2) for the sidecar's h2 tests.

Listens in the inet namespace on PORT (TLS with the testbed's server
certificate, ALPN "h2" only: a client that cannot speak h2 fails the
handshake), IPv4 and IPv6. Answers by path:

  /fields    answers 200 with the request's header fields as received,
             JSON [[name, value], ...] (pseudo-header fields included)
  /trailers  reads the request body and its trailers; answers 200 with
             content-type application/grpc, the body
             "got <n> bytes; trailers <name>=<value>,...\\n", and the
             response trailers grpc-status: 0, grpc-message: ok
  /early     a 103 Early Hints (link: </style.css>; rel=preload), then
             200 "after hints\\n"
  /goaway-once...
             the first time this path (with its query) comes, once its
             request ended: GOAWAY NO_ERROR with a last stream id below it
             (the stream is refused, nothing of it processed) and the
             connection closes; every later time 200 "h2 origin <path>
             seen <n> body <bytes>\\n" (<n>: how many times the path came)
  /goaway-error
             once its request ended: GOAWAY INTERNAL_ERROR with a last
             stream id below it, and the connection closes
  /goaway-wait...
             the first time this path (with its query) comes: 2 s later,
             GOAWAY NO_ERROR refusing it (as /goaway-once); every later
             time 200 "h2 origin <path> seen <n>\n"
  /goaway-hold?ms=N...
             once its request ended: the head (200), GOAWAY NO_ERROR with
             this stream as the last (it is served, the connection takes
             no other), "held\n"; N ms later "done\n" and the end of the
             stream, then the connection closes once the client closes it;
             with err=1 a second GOAWAY (INTERNAL_ERROR) comes before "done\n"
  /bytes?size=N...
             200 with N bytes ("0123456789abcdef" repeated), sent as the
             client's windows allow
  /close-after?size=N...
             the same, then GOAWAY NO_ERROR naming this stream as the last,
             and the connection closes once the client closes it (or
             after 10 s); with hold=MS the stream's end (an empty DATA
             frame) comes MS ms after the GOAWAY: the connection drains
             that long, its stream open
  ...&delay_next=MS (any path)
             the next connection accepted after this request (within
             10 s) waits MS ms before its TLS handshake (a slow upstream
             being opened)
  /late-end?size=N&ms=M...
             200 with content-length N and the N bytes, the stream's end
             (an empty DATA frame) only M ms later (a client may close
             once it has the N bytes)
  /count...  200 "h2 origin <path> seen <n>\n" (<n>: how many times it came)
  /count-refuse...
             RST_STREAM REFUSED_STREAM, counted like /count
  anything   200 "h2 origin <path>\\n"

Run: /usr/bin/python3 h2_origin.py PORT CERT KEY
"""
import json
import socket
import ssl
import sys
import threading
import time

import h2.config
import h2.connection
import h2.events
from hyperframe.frame import GoAwayFrame


# /goaway-once paths seen, across connections.
SEEN = {}
SEEN_LOCK = threading.Lock()
# delay_next=MS: the next accepted connection's wait before its handshake,
# and until when (monotonic) it applies: a test that fails before its slow
# connection is opened leaves no slow handshake to the next (under SEEN_LOCK).
DELAY_NEXT = [0, 0.0]
DELAY_NEXT_FOR = 10.0


def serve(tls):
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    tls.sendall(conn.data_to_send())
    streams = {}
    while True:
        data = tls.recv(65536)
        if not data:
            return
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                hd = {k.decode(): v.decode() for k, v in ev.headers}
                streams[ev.stream_id] = {"path": hd.get(":path", "/"), "size": 0, "trailers": [],
                                         "fields": [[k.decode(), v.decode()] for k, v in ev.headers]}
            elif isinstance(ev, h2.events.DataReceived):
                streams[ev.stream_id]["size"] += len(ev.data)
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.TrailersReceived):
                streams[ev.stream_id]["trailers"] = [(k.decode(), v.decode()) for k, v in ev.headers]
            elif isinstance(ev, h2.events.StreamEnded):
                st = streams.pop(ev.stream_id)
                if query_int(st["path"], "delay_next", 0) > 0:
                    with SEEN_LOCK:
                        DELAY_NEXT[0] = query_int(st["path"], "delay_next", 0)
                        DELAY_NEXT[1] = time.monotonic() + DELAY_NEXT_FOR
                if st["path"].startswith("/bytes") or st["path"].startswith("/close-after"):
                    hold_ms = query_int(st["path"], "hold", 0) if st["path"].startswith("/close-after") else 0
                    send_bytes(tls, conn, ev.stream_id, query_int(st["path"], "size", 1000), end=hold_ms == 0)
                    if st["path"].startswith("/close-after"):
                        goaway = GoAwayFrame(0)
                        goaway.last_stream_id = ev.stream_id
                        goaway.error_code = 0
                        tls.sendall(goaway.serialize())
                        if hold_ms > 0:
                            time.sleep(hold_ms / 1000.0)
                            conn.send_data(ev.stream_id, b"", end_stream=True)
                            tls.sendall(conn.data_to_send())
                        read_until_closed(tls, 10)
                        return
                    continue
                if st["path"].startswith("/late-end"):
                    send_bytes(tls, conn, ev.stream_id, query_int(st["path"], "size", 1000), end=False)
                    time.sleep(query_int(st["path"], "ms", 1000) / 1000.0)
                    try:
                        conn.send_data(ev.stream_id, b"", end_stream=True)
                        tls.sendall(conn.data_to_send())
                    except Exception:  # the stream was reset, or the connection went: done either way
                        return
                    continue
                if st["path"].startswith("/goaway-hold"):
                    hold(tls, conn, ev.stream_id, st["path"])
                    return
                elif st["path"].startswith("/goaway-wait"):
                    with SEEN_LOCK:
                        n = SEEN.get(st["path"], 0) + 1
                        SEEN[st["path"]] = n
                    if n == 1:
                        time.sleep(2)
                        conn.close_connection(error_code=0, last_stream_id=max(ev.stream_id - 2, 0))
                        tls.sendall(conn.data_to_send())
                        read_until_closed(tls, 5)
                        return
                    body = ("h2 origin %s seen %d\n" % (st["path"], n)).encode()
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                    conn.send_data(ev.stream_id, body, end_stream=True)
                elif st["path"].startswith("/count"):
                    with SEEN_LOCK:
                        n = SEEN.get(st["path"], 0) + 1
                        SEEN[st["path"]] = n
                    if st["path"].startswith("/count-refuse"):
                        conn.reset_stream(ev.stream_id, error_code=7)
                    else:
                        body = ("h2 origin %s seen %d\n" % (st["path"], n)).encode()
                        conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                        conn.send_data(ev.stream_id, body, end_stream=True)
                elif st["path"].startswith("/goaway-once") or st["path"].startswith("/goaway-error"):
                    with SEEN_LOCK:
                        n = SEEN.get(st["path"], 0) + 1
                        SEEN[st["path"]] = n
                    if n == 1 or st["path"].startswith("/goaway-error"):
                        code = 2 if st["path"].startswith("/goaway-error") else 0
                        conn.close_connection(error_code=code, last_stream_id=max(ev.stream_id - 2, 0))
                        tls.sendall(conn.data_to_send())
                        # Closed once the client is done: a close with
                        # bytes unread would be a reset, which may take the
                        # GOAWAY with it.
                        read_until_closed(tls, 5)
                        return
                    body = ("h2 origin %s seen %d body %d\n" % (st["path"], n, st["size"])).encode()
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                    conn.send_data(ev.stream_id, body, end_stream=True)
                elif st["path"].startswith("/refuse"):
                    # RST_STREAM REFUSED_STREAM: nothing was processed.
                    conn.reset_stream(ev.stream_id, error_code=7)
                elif st["path"].startswith("/trailers"):
                    tr = ",".join("%s=%s" % kv for kv in st["trailers"])
                    body = ("got %d bytes; trailers %s\n" % (st["size"], tr)).encode()
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
                    conn.send_data(ev.stream_id, body)
                    conn.send_headers(ev.stream_id, [("grpc-status", "0"), ("grpc-message", "ok")], end_stream=True)
                elif st["path"].startswith("/fields"):
                    body = (json.dumps(st["fields"]) + "\n").encode()
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                    conn.send_data(ev.stream_id, body, end_stream=True)
                elif st["path"].startswith("/early"):
                    conn.send_headers(ev.stream_id, [(":status", "103"), ("link", "</style.css>; rel=preload")])
                    body = b"after hints\n"
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                    conn.send_data(ev.stream_id, body, end_stream=True)
                else:
                    body = ("h2 origin %s\n" % st["path"]).encode()
                    conn.send_headers(ev.stream_id, [(":status", "200"), ("content-length", str(len(body)))])
                    conn.send_data(ev.stream_id, body, end_stream=True)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                tls.sendall(conn.data_to_send())
                return
        tls.sendall(conn.data_to_send())


def read_until_closed(tls, seconds):
    """Reads until the client closes (or `seconds` pass without a byte): a
    close with bytes unread would be a reset, which may take what was sent
    last with it."""
    tls.settimeout(seconds)
    try:
        while tls.recv(65536):
            pass
    except OSError:
        pass


def query_int(path, name, default):
    for kv in path.partition("?")[2].split("&"):
        if kv.startswith(name + "="):
            return int(kv[len(name) + 1 :])
    return default


def send_bytes(tls, conn, sid, size, end=True):
    """200 and `size` bytes of "0123456789abcdef" repeated, as fast as the
    client's windows allow (this connection serves nothing else meanwhile);
    the last of them ends the stream when `end`."""
    body = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    conn.send_headers(sid, [(":status", "200"), ("content-length", str(size))])
    tls.sendall(conn.data_to_send())
    off = 0
    while off < size:
        w = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, size - off)
        if w <= 0:
            data = tls.recv(65536)
            if not data:
                return
            conn.receive_data(data)
            tls.sendall(conn.data_to_send())
            continue
        conn.send_data(sid, body[off : off + w], end_stream=end and off + w == size)
        off += w
        tls.sendall(conn.data_to_send())


def hold(tls, conn, sid, path):
    """/goaway-hold: served on a connection that takes no other stream
    (its GOAWAY names it as the last one), held open for ms=N."""
    ms, err = 5000, False
    for kv in path.partition("?")[2].split("&"):
        if kv.startswith("ms="):
            ms = int(kv[3:])
        err = err or kv.startswith("err=1")
    conn.send_headers(sid, [(":status", "200")])
    conn.send_data(sid, b"held\n")
    tls.sendall(conn.data_to_send())
    # The GOAWAY goes as a raw frame: the h2 state machine takes no DATA
    # after its own close_connection().
    goaway = GoAwayFrame(0)
    goaway.last_stream_id = sid
    goaway.error_code = 0
    tls.sendall(goaway.serialize())
    time.sleep(ms / 1000.0)
    if err:
        # A second GOAWAY, with an error, before the held stream ends (a
        # server whose drain timed out): it ends this connection only.
        goaway.error_code = 2
        tls.sendall(goaway.serialize())
    conn.send_data(sid, b"done\n", end_stream=True)
    tls.sendall(conn.data_to_send())
    read_until_closed(tls, 10)


def handle(sock, ctx):
    try:
        with SEEN_LOCK:
            delay = DELAY_NEXT[0] if time.monotonic() < DELAY_NEXT[1] else 0
            DELAY_NEXT[0] = 0
        time.sleep(delay / 1000.0)
        tls = ctx.wrap_socket(sock, server_side=True)
        serve(tls)
    except Exception as e:  # one connection's failure is not the server's
        sys.stderr.write("h2_origin: %r\n" % (e,))
    finally:
        try:
            sock.close()
        except OSError:
            pass


def listen(family, addr, port, ctx):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((addr, port))
    s.listen(128)

    def loop():
        while True:
            c, _ = s.accept()
            threading.Thread(target=handle, args=(c, ctx), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def main():
    port, cert, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        listen(family, addr, port, ctx)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
