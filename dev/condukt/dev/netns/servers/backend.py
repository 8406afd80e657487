"""HTTP/1.1 backend behind nginx in the testbed's inet namespace.

nginx serves static files but cannot hash a request body or stream a
chunked answer on demand, so it proxies these paths here (127.0.0.1:8081):

  /echo...    any method: JSON with the method, path, request headers as
              nginx passed them, and the body's sha256 and length
  /upload...  the same (the name says what the test is about)
  /chunked    ?n=CHUNKS&size=BYTES: a Transfer-Encoding: chunked answer of
              n chunks of `size` bytes each (a byte pattern), flushed one
              by one
  /slow       ?ms=DELAY: answers "slow\\n" after DELAY milliseconds

Request bodies may come with Content-Length or chunked; both are read.
Run: /usr/bin/python3 backend.py PORT
"""

import hashlib
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("backend: " + (fmt % args) + "\n")

    def read_body(self):
        """Returns (sha256 hex, length, framing) of the request body."""
        digest = hashlib.sha256()
        size = 0
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            while True:
                line = self.rfile.readline(1024)
                chunk_len = int(line.split(b";", 1)[0].strip(), 16)
                if chunk_len == 0:
                    # Trailer section, ended by an empty line.
                    while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                remaining = chunk_len
                while remaining:
                    data = self.rfile.read(min(remaining, 1 << 16))
                    if not data:
                        raise ConnectionError("body ended inside a chunk")
                    digest.update(data)
                    size += len(data)
                    remaining -= len(data)
                self.rfile.readline(16)
            return digest.hexdigest(), size, "chunked"
        length = int(self.headers.get("Content-Length") or 0)
        remaining = length
        while remaining:
            data = self.rfile.read(min(remaining, 1 << 16))
            if not data:
                raise ConnectionError("body shorter than Content-Length")
            digest.update(data)
            size += len(data)
            remaining -= len(data)
        return digest.hexdigest(), size, "content-length" if "Content-Length" in self.headers else "none"

    def send_json(self, status, obj):
        body = (json.dumps(obj, sort_keys=True) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        sha, size, framing = self.read_body()
        if url.path.startswith("/echo") or url.path.startswith("/upload"):
            self.send_json(
                200,
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": [[k.lower(), v] for k, v in self.headers.items()],
                    "body_sha256": sha,
                    "body_size": size,
                    "framing": framing,
                },
            )
        elif url.path == "/chunked":
            n = int(query.get("n", ["5"])[0])
            chunk_size = int(query.get("size", ["1000"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(n):
                data = bytes((i + j) % 251 for j in range(chunk_size))
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        elif url.path == "/slow":
            time.sleep(int(query.get("ms", ["1000"])[0]) / 1000)
            body = b"slow\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_json(404, {"error": "no such path", "path": self.path})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
