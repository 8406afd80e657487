"""A scripted HTTP/2 client (python3-h2) for the sidecar's h2 tests.

argv[1]: JSON {"host": SNI and first :authority, "mode": ..., "query": ...}
modes:
  coalesce     stream 1 for host, stream 3 for "other" (:authority of
               another name) and stream 5 for host again, one connection
  rapid_reset  HEADERS + RST_STREAM pairs until the server sends GOAWAY
  trailers     one POST stream (gRPC-style: te: trailers, a body, request
               trailers: "trailers", a list of [name, value], default
               x-req-trailer: yes) to "path"; the response's headers and trailers
  paths        one connection, one GET stream per entry of "paths", all
               sent at once
  continuation_flood / settings_flood / ping_flood
               raw frames: one HEADERS without END_HEADERS and then
               CONTINUATION frames / SETTINGS frames / PING frames, "count"
               of them, until the server sends GOAWAY; settings_flood and
               ping_flood first open a GET stream for "path" when given
  slow_reader  a 16 MiB window, one GET for "path", then "seconds" without
               reading a byte; then reads the whole response ("sha256")
  rest         one GET for "path" (stream 1), read to its end, or with
               "paths" one GET stream per entry, all at once, read to their
               ends ("query", when given, is added to every path); prints
               {"first": stream 1, "streams": those streams, "port": the
               local port}; then rests: sends nothing (every byte would be
               news to the proxy) but reads, and answers what the server
               sends (SETTINGS, PING), until the file "go" exists (at most
               "pause" seconds, default 60) or, without "go", for "pause"
               seconds (default 1); then one GET for "path2" (default
               "path") as the next stream on the same connection, read to
               its end; "port2" is the local port again. With "pauses" (a
               list of seconds), one such rest and GET of "path2" per entry,
               the first pause still "pause"/"go" when given
  uploads      one POST stream after the other, one per entry of "paths",
               each with a "size"-byte body sent as the windows allow; a
               stream that gets no answer within 5 s ends the run
  made_you_reset
               up to "count" streams, 20 at a time, each a POST whose
               trailers have 200 fields (more than the proxy keeps: it
               answers RST_STREAM), until the server sends GOAWAY
  fail_unread  a 16 MiB window, one GET for "path" never read; then a PING
               flood (a guard limit: the proxy's GOAWAY queues behind the
               unread response), then one PING every 0.25 s for up to
               "seconds": "closed_after" is when the proxy ended the
               connection (seconds after the flood), absent if it did not
  upload_open  one POST to "path" announcing "size" bytes of body, of which
               only 1000 are sent; then reads until the stream ends and
               for 3 s more (or until the stream is reset): "reset" is the
               RST_STREAM code the proxy sent after its response
  custom       one stream per entry of "streams", each a list of [name, value]
               header fields sent as given (no client-side validation; a
               value [s, n] is s repeated n times);
               once every one ended or was reset, the same for each list
               of streams in "then" (optional), on the same connection;
               "huffman": false sends the header strings as literals
  unread       SETTINGS_INITIAL_WINDOW_SIZE 0 (and a 64 MiB connection
               window); one GET stream per entry of "paths", one after the
               other, "gap" seconds apart, each read to "take" bytes (0:
               not read); prints {"waiting": true}, reads nothing for
               "seconds", then opens the stream windows (1 MiB) and reads
               every stream to its end ("sha256" per stream); with "early"
               (indices into "paths"), after "seconds" those streams alone
               are read to their end first ("read_at": when their windows
               opened), then nothing else for "early_seconds"
  window_zero  SETTINGS_INITIAL_WINDOW_SIZE 0 (and a 16 MiB connection
               window), one GET stream per entry of "paths", all at once;
               reads only HEADERS for "seconds", then asks "stats" (a path)
               on a second, HTTP/1.1 connection ("stats": its body); then
               opens the stream windows (INITIAL_WINDOW_SIZE 1 MiB) and
               reads every stream to its end ("sha256" per stream)
"port" (default 443) is the port dialled; :authority names it when not 443.
Prints one JSON line: statuses per stream, the GOAWAY seen, ALPN; for the
streams of "paths" (unread, window_zero) "sent_at" and "head_at", seconds
from the handshake's end to the request's queueing and to its response head.
Trust comes from SSL_CERT_FILE like every client in the testbed.
"""
import json
import os
import select
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.settings

spec = json.loads(sys.argv[1])
host = spec["host"]
ctx = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
ctx.set_alpn_protocols(["h2"])
port = int(spec.get("port", 443))
authority = host if port == 443 else "%s:%d" % (host, port)
sock = socket.create_connection((host, port), timeout=15)
tls = ctx.wrap_socket(sock, server_hostname=host)
t_start = time.monotonic()
out = {"alpn": tls.selected_alpn_protocol(), "streams": {}, "goaway": None, "resets_sent": 0}
conn = h2.connection.H2Connection(
    config=h2.config.H2Configuration(client_side=True, validate_outbound_headers=spec["mode"] != "custom")
)
conn.initiate_connection()
tls.sendall(conn.data_to_send())


def headers(authority, path):
    return [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", path)]


def field_value(v):
    """A custom field's value: a string, [s, n] (s repeated n times), or
    {"latin1": s} (the bytes of s in Latin-1: a value that is not UTF-8)."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return v["latin1"].encode("latin-1")
    return v[0] * v[1]


def pump(until):
    while not until():
        data = tls.recv(65536)
        if not data:
            out["closed"] = True
            return
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.InformationalResponseReceived):
                st = out["streams"].setdefault(str(ev.stream_id), {"body": ""})
                hd = {k.decode(): v.decode() for k, v in ev.headers}
                st.setdefault("interim", []).append([int(hd[":status"]), hd.get("link")])
            elif isinstance(ev, h2.events.ResponseReceived):
                st = out["streams"].setdefault(str(ev.stream_id), {"body": ""})
                st["status"] = int(dict(ev.headers)[b":status"])
                st["head_at"] = time.monotonic() - t_start
                st["headers"] = {k.decode(): v.decode() for k, v in ev.headers}
            elif isinstance(ev, h2.events.TrailersReceived):
                st = out["streams"].setdefault(str(ev.stream_id), {"body": ""})
                st["trailers"] = {k.decode(): v.decode() for k, v in ev.headers}
            elif isinstance(ev, h2.events.DataReceived):
                st = out["streams"].setdefault(str(ev.stream_id), {"body": ""})
                st["size"] = st.get("size", 0) + len(ev.data)
                if ev.stream_id in hashes:
                    hashes[ev.stream_id].update(ev.data)
                if len(st["body"]) < 4096:
                    st["body"] += ev.data.decode("utf-8", "replace")
                if ack[0]:
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                out["streams"].setdefault(str(ev.stream_id), {"body": ""})["ended"] = True
            elif isinstance(ev, h2.events.StreamReset):
                out["streams"].setdefault(str(ev.stream_id), {"body": ""})["reset"] = int(ev.error_code)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                out["goaway"] = int(ev.error_code)
        tls.sendall(conn.data_to_send())


q = spec.get("query", "")
hashes = {}
# Whether received DATA is acknowledged (its window opened again).
ack = [True]


def zero_windows(conn_window):
    """SETTINGS_INITIAL_WINDOW_SIZE 0 (no stream gets a byte of DATA until
    its window is opened) and a connection window of conn_window."""
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    conn.increment_flow_control_window(conn_window)


def get_hashed(i, path):
    """The i-th GET stream (path + "&" + the query), its body hashed."""
    import hashlib

    sid = 1 + 2 * i
    hashes[sid] = hashlib.sha256()
    conn.send_headers(sid, headers(authority, path + "&" + q), end_stream=True)
    out["streams"].setdefault(str(sid), {"body": ""})["sent_at"] = time.monotonic() - t_start
    return sid


def read_all(sids, keep):
    """Opens the stream windows (INITIAL_WINDOW_SIZE 1 MiB) and reads every
    stream to its end: "sha256" per stream, the first `keep` characters
    of its body."""
    tls.settimeout(30)
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1024 * 1024})
    tls.sendall(conn.data_to_send())
    ended = lambda s: out["streams"].get(str(s), {}).get("ended") or "reset" in out["streams"].get(str(s), {})
    pump(lambda: all(ended(s) for s in sids) or out["goaway"] is not None)
    for sid, hsh in hashes.items():
        st = out["streams"].setdefault(str(sid), {"body": ""})
        st["sha256"] = hsh.hexdigest()
        st["body"] = st["body"][:keep]


def pump_for(seconds):
    """Reads (HEADERS, and DATA as the windows allow) for `seconds`."""
    deadline = time.monotonic() + seconds
    tls.settimeout(0.2)
    while time.monotonic() < deadline and not out.get("closed"):
        try:
            pump(lambda: False)
        except (socket.timeout, ssl.SSLError, TimeoutError):
            pass


def raw_frame(length, ftype, flags, stream, payload=b""):
    return length.to_bytes(3, "big") + bytes([ftype, flags]) + stream.to_bytes(4, "big") + payload


def flood(frames):
    """Sends raw frames until the server answers GOAWAY (or closes).
    With "path" in the spec, a GET stream for it goes first (and has
    0.3 s to reach the upstream): a stream open when the connection fails."""
    if "path" in spec:
        conn.send_headers(1, headers(authority, spec["path"] + "?" + q), end_stream=True)
        tls.sendall(conn.data_to_send())
        time.sleep(0.3)
    try:
        for i in range(0, len(frames), 50):
            tls.sendall(b"".join(frames[i : i + 50]))
    except OSError:
        pass
    out["frames_sent"] = len(frames)
    try:
        pump(lambda: out["goaway"] is not None)
    except Exception as e:
        out["error"] = repr(e)


try:
    if spec["mode"] == "trailers":
        hd = headers(authority, spec["path"] + "?" + q)
        hd[0] = (":method", "POST")
        hd += [("content-type", "application/grpc"), ("te", "trailers")]
        conn.send_headers(1, hd)
        conn.send_data(1, b"x" * int(spec.get("size", 1000)))
        trailers = [tuple(t) for t in spec.get("trailers", [["x-req-trailer", "yes"]])]
        conn.send_headers(1, trailers, end_stream=True)
        tls.sendall(conn.data_to_send())
        pump(lambda: out["streams"].get("1", {}).get("ended") or "reset" in out["streams"].get("1", {}) or out["goaway"] is not None)
    elif spec["mode"] == "paths":
        sids = []
        for i, p in enumerate(spec["paths"]):
            sid = 1 + 2 * i
            sids.append(sid)
            sep = "&" if "?" in p else "?"
            conn.send_headers(sid, headers(authority, p + sep + q), end_stream=True)
        tls.sendall(conn.data_to_send())
        pump(
            lambda: all(out["streams"].get(str(s), {}).get("ended") or "reset" in out["streams"].get(str(s), {}) for s in sids)
            or out["goaway"] is not None
        )
    elif spec["mode"] == "uploads":
        tls.settimeout(5)
        size = int(spec.get("size", 65535))
        for i, p in enumerate(spec["paths"]):
            sid = 1 + 2 * i
            hd = headers(authority, p + "?" + q)
            hd[0] = (":method", "POST")
            conn.send_headers(sid, hd + [("content-length", str(size))])
            left = size
            done = lambda: out["streams"].get(str(sid), {}).get("ended") or "reset" in out["streams"].get(str(sid), {})
            while left > 0 and not done():
                w = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, left)
                if w > 0:
                    left -= w
                    conn.send_data(sid, b"u" * w, end_stream=left == 0)
                    tls.sendall(conn.data_to_send())
                else:
                    n = [0]
                    pump(lambda: n.__setitem__(0, n[0] + 1) or n[0] > 1)
            pump(done)
    elif spec["mode"] == "made_you_reset":
        tls.settimeout(5)
        try:
            sid = 1
            while out["resets_sent"] < int(spec.get("count", 400)) and out["goaway"] is None:
                batch = []
                for _ in range(20):
                    hd = headers(authority, "/?" + q)
                    hd[0] = (":method", "POST")
                    conn.send_headers(sid, hd)
                    conn.send_headers(sid, [("x-t%d" % k, "v") for k in range(200)], end_stream=True)
                    tls.sendall(conn.data_to_send())
                    batch.append(sid)
                    out["resets_sent"] += 1
                    sid += 2
                pump(lambda: all("reset" in out["streams"].get(str(s), {}) for s in batch) or out["goaway"] is not None)
        except Exception as e:
            out["error"] = repr(e)
        out["streams"] = {k: v for k, v in out["streams"].items() if "reset" not in v}
    elif spec["mode"] == "fail_unread":
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16 * 1024 * 1024})
        conn.increment_flow_control_window(16 * 1024 * 1024)
        conn.send_headers(1, headers(authority, spec["path"] + "?" + q), end_stream=True)
        tls.sendall(conn.data_to_send())
        time.sleep(1.5)
        tls.sendall(b"".join(raw_frame(8, 6, 0, 0, i.to_bytes(8, "big")) for i in range(int(spec.get("count", 1000)))))
        t0 = time.monotonic()
        tls.settimeout(1)
        while time.monotonic() - t0 < float(spec.get("seconds", 15)):
            time.sleep(0.25)
            try:
                tls.sendall(raw_frame(8, 6, 0, 0, b"12345678"))
            except socket.timeout:
                continue
            except (OSError, ssl.SSLError) as e:
                out["closed_after"] = time.monotonic() - t0
                out["close_error"] = repr(e)
                break
    elif spec["mode"] == "upload_open":
        tls.settimeout(3)
        hd = headers(authority, spec["path"] + "?" + q)
        hd[0] = (":method", "POST")
        conn.send_headers(1, hd + [("content-length", str(int(spec.get("size", 1 << 20))))])
        conn.send_data(1, b"u" * 1000)
        tls.sendall(conn.data_to_send())
        st = lambda: out["streams"].get("1", {})
        try:
            pump(lambda: st().get("ended") or "reset" in st() or out["goaway"] is not None)
            pump(lambda: "reset" in st() or out["goaway"] is not None)
        except socket.timeout:
            pass
    elif spec["mode"] == "custom":
        if spec.get("huffman", True) is False:
            # Literal strings: the pure-Python Huffman coder takes seconds
            # over megabytes of header values.
            encode = conn.encoder.encode
            conn.encoder.encode = lambda headers, huffman=True: encode(headers, huffman=False)
        sid = 1
        for streams in [spec["streams"]] + spec.get("then", []):
            sids = []
            for fields in streams:
                sids.append(sid)
                conn.send_headers(sid, [(n, field_value(v)) for n, v in fields], end_stream=True)
                sid += 2
            tls.sendall(conn.data_to_send())
            pump(
                lambda: all(out["streams"].get(str(s), {}).get("ended") or "reset" in out["streams"].get(str(s), {}) for s in sids)
                or out["goaway"] is not None
            )
            if out["goaway"] is not None or out.get("closed"):
                break
    elif spec["mode"] == "continuation_flood":
        # :method GET, :scheme https, :path / (static table), then literals.
        block = b"\x82\x87\x84"
        frames = [raw_frame(len(block), 1, 0, 1, block)]
        lit = b"\x00\x03x-a\x03aaa"
        frames += [raw_frame(len(lit), 9, 0, 1, lit) for _ in range(int(spec.get("count", 1000)))]
        flood(frames)
    elif spec["mode"] == "settings_flood":
        flood([raw_frame(0, 4, 0, 0) for _ in range(int(spec.get("count", 1000)))])
    elif spec["mode"] == "ping_flood":
        flood([raw_frame(8, 6, 0, 0, i.to_bytes(8, "big")) for i in range(int(spec.get("count", 1000)))])
    elif spec["mode"] == "slow_reader":
        import hashlib

        hashes[1] = hashlib.sha256()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 16 * 1024 * 1024})
        conn.increment_flow_control_window(16 * 1024 * 1024)
        conn.send_headers(1, headers(authority, spec["path"] + "?" + q), end_stream=True)
        tls.sendall(conn.data_to_send())
        print(json.dumps({"waiting": True}), flush=True)
        time.sleep(float(spec.get("seconds", 3)))
        pump(lambda: out["streams"].get("1", {}).get("ended") or out["goaway"] is not None)
        out["streams"]["1"]["body"] = ""
        out["streams"]["1"]["sha256"] = hashes[1].hexdigest()
    elif spec["mode"] == "rest":
        ended = lambda s: out["streams"].get(str(s), {}).get("ended") or "reset" in out["streams"].get(str(s), {})
        full = lambda p: p + ("&" if "?" in p else "?") + q if q else p
        out["port"] = tls.getsockname()[1]
        first = spec.get("paths") or [spec["path"]]
        for i, p in enumerate(first):
            conn.send_headers(1 + 2 * i, headers(authority, full(p)), end_stream=True)
        tls.sendall(conn.data_to_send())
        pump(lambda: all(ended(1 + 2 * i) for i in range(len(first))) or out["goaway"] is not None)
        print(json.dumps({"first": out["streams"].get("1"), "streams": out["streams"], "port": out["port"]}), flush=True)
        go = spec.get("go")
        path2 = spec.get("path2") or spec["path"]
        pauses = spec.get("pauses") or [None]
        for i, pause in enumerate(pauses):
            wait_go = go if i == 0 else None
            if pause is None or (i == 0 and "pause" in spec):
                pause = spec.get("pause", 60 if wait_go else 1)
            deadline = time.monotonic() + float(pause)
            tls.settimeout(15)
            while time.monotonic() < deadline and not out.get("closed") and not (wait_go and os.path.exists(wait_go)):
                # The pause ends on time (the go file is looked for every
                # 50 ms); what comes meanwhile is read and answered whole.
                ready, _, _ = select.select([tls], [], [], max(0, min(0.05, deadline - time.monotonic())))
                if ready or tls.pending():
                    n = [0]
                    pump(lambda: n.__setitem__(0, n[0] + 1) or n[0] > 1)
            if out.get("closed") or out["goaway"] is not None:
                break
            sid = 1 + 2 * len(first) + 2 * i
            conn.send_headers(sid, headers(authority, full(path2)), end_stream=True)
            tls.sendall(conn.data_to_send())
            pump(lambda: ended(sid) or out["goaway"] is not None)
        out["port2"] = tls.getsockname()[1]
    elif spec["mode"] == "unread":
        ack[0] = False
        zero_windows(64 * 1024 * 1024)
        tls.sendall(conn.data_to_send())
        take = int(spec.get("take", 0))
        sids = []
        size_of = lambda s: out["streams"].get(str(s), {}).get("size", 0)
        for i, p in enumerate(spec["paths"]):
            sid = get_hashed(i, p)
            sids.append(sid)
            tls.sendall(conn.data_to_send())
            pump_for(float(spec.get("gap", 0.5)))
            if take > 0:
                conn.increment_flow_control_window(take, stream_id=sid)
                tls.sendall(conn.data_to_send())
                tls.settimeout(10)
                pump(lambda: size_of(sid) >= take or out["goaway"] is not None)
        print(json.dumps({"waiting": True}), flush=True)
        pump_for(float(spec.get("seconds", 3)))
        early = [sids[i] for i in spec.get("early", [])]
        for sid in early:
            conn.increment_flow_control_window(1 << 30, stream_id=sid)
            out["streams"].setdefault(str(sid), {"body": ""})["read_at"] = time.monotonic() - t_start
        if early:
            tls.sendall(conn.data_to_send())
            tls.settimeout(10)
            pump(lambda: all(out["streams"].get(str(s), {}).get("ended") for s in early) or out["goaway"] is not None)
            pump_for(float(spec.get("early_seconds", 0)))
        ack[0] = True
        read_all(sids, 200)
    elif spec["mode"] == "window_zero":
        import http.client

        zero_windows(16 * 1024 * 1024)
        sids = [get_hashed(i, p) for i, p in enumerate(spec["paths"])]
        tls.sendall(conn.data_to_send())
        pump_for(float(spec.get("seconds", 3)))
        plain = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
        hc = http.client.HTTPSConnection(host, port, context=plain, timeout=15)
        hc.request("GET", spec["stats"])
        out["stats"] = hc.getresponse().read().decode()
        hc.close()
        read_all(sids, 0)
    elif spec["mode"] == "coalesce":
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
