"""Raw HTTP/1.1 helpers for the end-to-end tests' in-pod programs.

Imported by the scripts that Condukt.Test.Netns.RawHttp.py/4 runs (argv[1]
is the session CA): connect (TLS on TLS_PORTS, trusting the CA), read one
response with its framing, and see how a connection ends.
"""
import base64, hashlib, json, socket, ssl, sys, threading, time

CA = sys.argv[1]
# Ports on which connect() speaks TLS (the robustness tests' origin adds 8091).
TLS_PORTS = (443, 8091)

def connect(host, port, timeout=20):
    s = socket.create_connection((host, port), timeout=timeout)
    if port in TLS_PORTS:
        ctx = ssl.create_default_context(cafile=CA)
        s = ctx.wrap_socket(s, server_hostname=host)
    return s

class Reader:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def fill(self):
        try:
            d = self.sock.recv(65536)
        except ssl.SSLEOFError:
            d = b""
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def line(self):
        while b"\r\n" not in self.buf:
            self.fill()
        l, self.buf = self.buf.split(b"\r\n", 1)
        return l

    def exact(self, n):
        while len(self.buf) < n:
            self.fill()
        d, self.buf = self.buf[:n], self.buf[n:]
        return d

    def head(self):
        status = self.line().decode("latin-1")
        headers = []
        while True:
            l = self.line()
            if l == b"":
                break
            k, v = l.decode("latin-1").split(":", 1)
            headers.append([k.strip().lower(), v.strip()])
        return int(status.split(" ")[1]), headers

    def response(self, method="GET"):
        interim = []
        while True:
            status, headers = self.head()
            if 100 <= status < 200 and status != 101:
                interim.append(status)
                continue
            break
        h = {}
        for k, v in headers:
            h.setdefault(k, v)
        body = b""
        if method == "HEAD" or status in (204, 304):
            pass
        elif "chunked" in h.get("transfer-encoding", ""):
            while True:
                size = int(self.line().split(b";")[0], 16)
                if size == 0:
                    while self.line() != b"":
                        pass
                    break
                body += self.exact(size)
                assert self.exact(2) == b"\r\n", "chunk not followed by CRLF"
        elif "content-length" in h:
            body = self.exact(int(h["content-length"]))
        else:
            try:
                while True:
                    self.fill()
            except EOFError:
                pass
            body, self.buf = self.buf, b""
        return {"status": status, "headers": headers, "interim": interim,
                "body": body.decode("latin-1") if len(body) < 4096 else None,
                "body_sha256": hashlib.sha256(body).hexdigest(), "body_size": len(body)}

def ending(sock, timeout):
    """How the peer ends the connection within timeout: eof, reset or
    timeout, the bytes it sent first, and after how long."""
    sock.settimeout(timeout)
    got, t0, how = b"", time.monotonic(), "timeout"
    try:
        while True:
            d = sock.recv(65536)
            if not d:
                how = "eof"
                break
            got += d
    except (socket.timeout, TimeoutError):
        how = "timeout"
    except (ConnectionResetError, BrokenPipeError):
        how = "reset"
    except ssl.SSLError:
        how = "eof"
    return {"how": how, "bytes": len(got), "data": got[:200].decode("latin-1"),
            "after_ms": int((time.monotonic() - t0) * 1000)}

def request(method, path, host, extra=""):
    return ("%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (method, path, host, extra)).encode()
