#!/usr/bin/python3
"""Opens N keep-alive HTTPS connections, one request each, and holds them
(the benchmark's memory test, and the netns tier's idle-connection tests).

usage: idle.py URL N CAFILE HOLD_SECONDS [PROTOCOL]

PROTOCOL is "http/1.1" (the default; http.client) or "h2" (also chosen by
the environment variable IDLE_H2=1): each connection offers ALPN h2 only
and does its GET as one HTTP/2 stream (python3-h2), reading and answering
frames (SETTINGS) until the stream ended, and then sends nothing more.

Each connection completes its TLS handshake and one GET (so that a proxy
has its upstream connection open too), then stays idle. Prints
"ready OPENED FAILED" on stdout once all were tried (a connection counts
as opened when its GET got a 200), then holds them for HOLD_SECONDS (or
until killed).
"""
import concurrent.futures
import http.client
import os
import resource
import socket
import ssl
import sys
import time
import urllib.parse


def h1_get(url, ctx, path):
    """One GET over HTTP/1.1; the connection, or None unless it got 200."""
    try:
        c = http.client.HTTPSConnection(url.hostname, url.port or 443, context=ctx, timeout=30)
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return c if r.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None


def h2_get(url, ctx, path):
    """One GET as stream 1 of an HTTP/2 connection; the TLS socket (kept
    open by the caller), or None unless it got 200."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    port = url.port or 443
    authority = url.hostname if port == 443 else "%s:%d" % (url.hostname, port)
    tls = None
    try:
        sock = socket.create_connection((url.hostname, port), timeout=30)
        tls = ctx.wrap_socket(sock, server_hostname=url.hostname)
        if tls.selected_alpn_protocol() != "h2":
            tls.close()
            return None
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        headers = [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", path)]
        conn.send_headers(1, headers, end_stream=True)
        tls.sendall(conn.data_to_send())
        status, ended = None, False
        while not ended:
            data = tls.recv(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == 1:
                    status = int(dict(ev.headers)[b":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and ev.stream_id == 1:
                    ended = True
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    ended = True
            tls.sendall(conn.data_to_send())
        if status == 200 and ended:
            return (tls, conn)
    except (OSError, h2.exceptions.ProtocolError):
        pass
    if tls is not None:
        tls.close()
    return None


def main():
    url = urllib.parse.urlsplit(sys.argv[1])
    n = int(sys.argv[2])
    ctx = ssl.create_default_context(cafile=sys.argv[3])
    hold = float(sys.argv[4])
    proto = sys.argv[5] if len(sys.argv) > 5 else ("h2" if os.environ.get("IDLE_H2") == "1" else "http/1.1")
    if proto not in ("http/1.1", "h2"):
        sys.exit("idle.py: PROTOCOL is http/1.1 or h2, not %r" % proto)
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, n + 256))
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    if proto == "h2":
        ctx.set_alpn_protocols(["h2"])
        get = h2_get
    else:
        get = h1_get

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        conns = list(pool.map(lambda _: get(url, ctx, path), range(n)))

    opened = [c for c in conns if c is not None]
    print(f"ready {len(opened)} {n - len(opened)}", flush=True)
    time.sleep(hold)


if __name__ == "__main__":
    main()
