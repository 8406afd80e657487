"""A scripted HTTP/2 client (python3-h2) for the sidecar's h2 tests.

argv[1]: JSON {"host": SNI and first :authority, "mode": ..., "query": ...}
modes:
  coalesce     stream 1 for host, stream 3 for "other" (:authority of
               another name) and stream 5 for host again, one connection
  rapid_reset  HEADERS + RST_STREAM pairs until the server sends GOAWAY
Prints one JSON line: statuses per stream, the GOAWAY seen, ALPN.
Trust comes from SSL_CERT_FILE like every client in the testbed.
"""
import json
import os
import socket
import ssl
import sys

import h2.config
import h2.connection
import h2.events

spec = json.loads(sys.argv[1])
host = spec["host"]
ctx = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
ctx.set_alpn_protocols(["h2"])
sock = socket.create_connection((host, 443), timeout=15)
tls = ctx.wrap_socket(sock, server_hostname=host)
out = {"alpn": tls.selected_alpn_protocol(), "streams": {}, "goaway": None, "resets_sent": 0}
conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
conn.initiate_connection()
tls.sendall(conn.data_to_send())


def headers(authority, path):
    return [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", path)]


def pump(until):
    while not until():
        data = tls.recv(65536)
        if not data:
            out["closed"] = True
            return
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                st = out["streams"].setdefault(str(ev.stream_id), {"body": ""})
                st["status"] = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.DataReceived):
                st = out["streams"].setdefault(str(ev.stream_id), {"body": ""})
                st["body"] += ev.data.decode("utf-8", "replace")
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                out["streams"].setdefault(str(ev.stream_id), {"body": ""})["ended"] = True
            elif isinstance(ev, h2.events.StreamReset):
                out["streams"].setdefault(str(ev.stream_id), {"body": ""})["reset"] = int(ev.error_code)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                out["goaway"] = int(ev.error_code)
        tls.sendall(conn.data_to_send())


q = spec.get("query", "")
try:
    if spec["mode"] == "coalesce":
        for sid, auth in ((1, host), (3, spec["other"]), (5, host)):
            conn.send_headers(sid, headers(auth, "/?" + q), end_stream=True)
        tls.sendall(conn.data_to_send())
        pump(lambda: all(out["streams"].get(str(s), {}).get("ended") for s in (1, 3, 5)) or out["goaway"] is not None)
    elif spec["mode"] == "rapid_reset":
        sid = 1
        tls.settimeout(5)
        while out["goaway"] is None and sid < 2 * 5000:
            conn.send_headers(sid, headers(host, "/slow?ms=2000&" + q), end_stream=True)
            conn.reset_stream(sid)
            out["resets_sent"] += 1
            sid += 2
            try:
                tls.sendall(conn.data_to_send())
            except OSError:
                break
            if sid % 64 == 1:
                tls.setblocking(False)
                try:
                    data = tls.recv(65536)
                    if not data:
                        break
                    for ev in conn.receive_data(data):
                        if isinstance(ev, h2.events.ConnectionTerminated):
                            out["goaway"] = int(ev.error_code)
                except (ssl.SSLWantReadError, BlockingIOError):
                    pass
                except Exception:
                    break
                finally:
                    tls.setblocking(True)
                    tls.settimeout(5)
        if out["goaway"] is None:
            try:
                pump(lambda: out["goaway"] is not None)
            except Exception as e:
                out["error"] = repr(e)
except Exception as e:
    out["error"] = repr(e)
print(json.dumps(out))
