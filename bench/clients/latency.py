#!/usr/bin/python3
"""Sequential HTTPS requests on one keep-alive connection, timed one by one.

usage: latency.py URL SECONDS CAFILE [PAUSE_MS]

Prints one JSON object: n, errors, reconnects, p50_us, p90_us, p99_us, mean_us.
Light load: one request in flight, PAUSE_MS (default 1) between requests.
"""
import http.client
import json
import ssl
import sys
import time
import urllib.parse


def main():
    url = urllib.parse.urlsplit(sys.argv[1])
    seconds = float(sys.argv[2])
    ctx = ssl.create_default_context(cafile=sys.argv[3])
    pause = float(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.001
    path = url.path or "/"

    def connect():
        c = http.client.HTTPSConnection(url.hostname, url.port or 443, context=ctx, timeout=10)
        c.connect()
        return c

    conn = connect()
    # One warm-up request: the connection (and, through a proxy, its
    # upstream) is established before timing starts.
    conn.request("GET", path)
    conn.getresponse().read()

    samples, errors, reconnects = [], 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter_ns()
        try:
            conn.request("GET", path)
            resp = resp_body = None
            resp = conn.getresponse()
            resp_body = resp.read()
            ok = resp.status == 200 and resp_body is not None
        except (OSError, http.client.HTTPException):
            ok = False
        t1 = time.perf_counter_ns()
        if ok:
            samples.append((t1 - t0) / 1000)
        else:
            errors += 1
            conn.close()
            conn = connect()
            reconnects += 1
        if resp is not None and resp.will_close:
            conn.close()
            conn = connect()
            reconnects += 1
        time.sleep(pause)

    samples.sort()

    def pct(p):
        if not samples:
            return None
        return samples[min(len(samples) - 1, int(round(p / 100 * (len(samples) - 1))))]

    print(json.dumps({
        "n": len(samples),
        "errors": errors,
        "reconnects": reconnects,
        "p50_us": pct(50),
        "p90_us": pct(90),
        "p99_us": pct(99),
        "mean_us": sum(samples) / len(samples) if samples else None,
    }))


if __name__ == "__main__":
    main()
