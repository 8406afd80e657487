#!/usr/bin/python3
"""Writes a container's log in the CRI format kubelet (and kwok's log
endpoint) reads: one "<RFC 3339 time> <stream> F <line>" line per line of
output. The tier's pod runtime (docs/k8s-tier.md) starts one per long
running container:

  crilog.py STDOUT_FILE STDERR_FILE CRI_LOG

It follows both files (appended to by the container) and exits on SIGTERM
after copying what is left.
"""
import datetime
import signal
import sys
import time

stop = False


def on_term(_sig, _frame):
    global stop
    stop = True


def main(out_path, err_path, cri_path):
    signal.signal(signal.SIGTERM, on_term)
    pos = {out_path: 0, err_path: 0}
    rest = {out_path: b"", err_path: b""}
    names = {out_path: b"stdout", err_path: b"stderr"}
    with open(cri_path, "ab") as cri:
        while True:
            last = stop
            for path in (out_path, err_path):
                try:
                    with open(path, "rb") as f:
                        f.seek(pos[path])
                        data = f.read(1 << 20)
                except FileNotFoundError:
                    continue
                pos[path] += len(data)
                lines = (rest[path] + data).split(b"\n")
                rest[path] = lines.pop()
                for line in lines:
                    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    cri.write(now.encode() + b" " + names[path] + b" F " + line + b"\n")
            cri.flush()
            if last:
                return
            time.sleep(0.1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
