"""Shared parts of the testbed's Python clients.

Every client takes one JSON argument (the request spec) and prints one JSON
line (the result), so Condukt.Test.Netns.Client can compare clients field
by field. Spec keys:

  url, method, headers ([[name, value], ...]), body_file (path or null),
  chunked (send body_file with Transfer-Encoding: chunked), timeout
  (seconds), max_body (bodies up to this size are returned whole),
  family (4, 6 or null: restrict name resolution to one address family)

Result keys:

  ok, status, http_version, headers ([[lower-case name, value], ...]),
  body_b64 (when body_size <= max_body), body_sha256, body_size,
  error (text), error_kind (tls_verify | refused | reset | timeout | dns |
  http | other), data (client-specific extras)

Trust comes from the environment only (SSL_CERT_FILE, REQUESTS_CA_BUNDLE),
as it would in a workspace.
"""

import base64
import hashlib
import json
import socket
import sys


def load_spec():
    spec = json.loads(sys.argv[1])
    spec.setdefault("method", "GET")
    spec.setdefault("headers", [])
    spec.setdefault("body_file", None)
    spec.setdefault("chunked", False)
    spec.setdefault("timeout", 20)
    spec.setdefault("max_body", 1 << 20)
    spec.setdefault("family", None)
    restrict_family(spec["family"])
    return spec


def restrict_family(family):
    """Makes every getaddrinfo call answer for one address family only."""
    if family not in (4, 6):
        return
    wanted = socket.AF_INET if family == 4 else socket.AF_INET6
    real = socket.getaddrinfo

    def getaddrinfo(host, port, fam=0, *args, **kwargs):
        return real(host, port, wanted, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


def file_chunks(path, size=1 << 16):
    with open(path, "rb") as f:
        while True:
            data = f.read(size)
            if not data:
                return
            yield data


class Body:
    """Hashes a streamed body and keeps it whole while it is small."""

    def __init__(self, max_body):
        self.max_body = max_body
        self.digest = hashlib.sha256()
        self.size = 0
        self.kept = []

    def update(self, data):
        self.digest.update(data)
        self.size += len(data)
        if self.size <= self.max_body:
            self.kept.append(data)

    def fields(self):
        return {
            "body_sha256": self.digest.hexdigest(),
            "body_size": self.size,
            "body_b64": base64.b64encode(b"".join(self.kept)).decode()
            if self.size <= self.max_body
            else None,
        }


def classify(exc):
    """Maps an exception (and its causes) to a coarse error kind."""
    text = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text.append(type(exc).__name__ + ": " + str(exc))
        exc = exc.__cause__ or exc.__context__ or (exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None)
    joined = " | ".join(text)
    lowered = joined.lower()
    if (
        "certificate_verify_failed" in lowered
        or "certificate verify failed" in lowered
        or "certverification" in lowered
        or "certificateerror" in lowered  # urllib3's own hostname check
    ):
        kind = "tls_verify"
    elif "refused" in lowered:
        kind = "refused"
    elif "timed out" in lowered or "timeout" in lowered:
        kind = "timeout"
    elif "name or service not known" in lowered or "gaierror" in lowered or "nodename nor servname" in lowered:
        kind = "dns"
    elif (
        "reset" in lowered
        or "eof occurred" in lowered
        or "unexpected_eof" in lowered
        or "remotedisconnected" in lowered
        or "connection aborted" in lowered
        or "broken pipe" in lowered
    ):
        kind = "reset"
    else:
        kind = "other"
    return joined, kind


def emit(result):
    base = {
        "ok": False,
        "status": None,
        "http_version": None,
        "headers": [],
        "body_b64": None,
        "body_sha256": None,
        "body_size": None,
        "error": None,
        "error_kind": None,
        "data": {},
    }
    base.update(result)
    sys.stdout.write(json.dumps(base) + "\n")
    sys.stdout.flush()


def fail(exc):
    error, kind = classify(exc)
    emit({"ok": False, "error": error, "error_kind": kind})
    sys.exit(1)
