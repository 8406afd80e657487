#!/usr/bin/python3
"""Opens N keep-alive HTTPS connections, one request each, and holds them
(the benchmark's memory test, and the netns tier's idle-connection test).

usage: idle.py URL N CAFILE HOLD_SECONDS

Each connection completes its TLS handshake and one GET (so that a proxy
has its upstream connection open too), then stays idle. Prints
"ready OPENED FAILED" on stdout once all were tried, then holds them for
HOLD_SECONDS (or until killed).
"""
import concurrent.futures
import http.client
import resource
import ssl
import sys
import time
import urllib.parse


def main():
    url = urllib.parse.urlsplit(sys.argv[1])
    n = int(sys.argv[2])
    ctx = ssl.create_default_context(cafile=sys.argv[3])
    hold = float(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, n + 256))
    path = url.path or "/"

    def one(_):
        try:
            c = http.client.HTTPSConnection(url.hostname, url.port or 443, context=ctx, timeout=30)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            return c if r.status == 200 else None
        except (OSError, http.client.HTTPException):
            return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        conns = list(pool.map(one, range(n)))

    opened = [c for c in conns if c is not None]
    print(f"ready {len(opened)} {n - len(opened)}", flush=True)
    time.sleep(hold)


if __name__ == "__main__":
    main()
