"""Git smart HTTP for the testbed: `git http-backend` behind a tiny CGI shim.

nginx has no CGI, so it proxies /<name>.git/ here (127.0.0.1:8082), and
this server runs `git http-backend` once per request with the CGI
environment git documents (GIT_PROJECT_ROOT, PATH_INFO, QUERY_STRING,
REQUEST_METHOD, CONTENT_TYPE, ...). The `Git-Protocol` header becomes
GIT_PROTOCOL so protocol v2 works; a gzip request body is left to
http-backend through HTTP_CONTENT_ENCODING. The repositories are small, so
the CGI output is read whole and answered with a Content-Length.

Run: /usr/bin/python3 git_http.py PORT PROJECT_ROOT
"""

import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

PROJECT_ROOT = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("git_http: " + (fmt % args) + "\n")

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                n = int(self.rfile.readline(1024).split(b";", 1)[0].strip(), 16)
                if n == 0:
                    while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(n))
                self.rfile.readline(16)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def handle_any(self):
        url = urlsplit(self.path)
        body = self.read_body()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": PROJECT_ROOT,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": url.path,
            "QUERY_STRING": url.query,
            "REMOTE_ADDR": self.client_address[0],
            "CONTENT_LENGTH": str(len(body)),
        }
        for header, var in (
            ("Content-Type", "CONTENT_TYPE"),
            ("Content-Encoding", "HTTP_CONTENT_ENCODING"),
            ("Git-Protocol", "GIT_PROTOCOL"),
        ):
            if self.headers.get(header):
                env[var] = self.headers[header]
        proc = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60
        )
        if proc.stderr:
            sys.stderr.write("git http-backend: " + proc.stderr.decode(errors="replace"))
        head, _, payload = proc.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = proc.stdout.partition(b"\n\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = handle_any


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    PROJECT_ROOT = sys.argv[2]
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
