"""Stale conntrack entries (test/condukt/netns/sidecar_conntrack_test.exs).

  ctstale.py stale IPTABLES SPORT DST DPORT MARK UID
      As root in the pod: a socket owned by UID (created with that
      effective uid) with SO_MARK MARK (what the sidecar's upstream sockets
      are) connects from SPORT to DST:DPORT, then goes
      away the way a killed sidecar's socket can without conntrack seeing
      it: a raw-table rule (which runs before conntrack) drops its reset,
      and the socket is closed with SO_LINGER 0, so it is gone at once
      while its conntrack entry stays ESTABLISHED, un-NATed, with the
      connection mark netfilter-setup gave it. Prints "stale".
  ctstale.py connect SPORT DST DPORT SNI CAFILE
      A workspace connection from source port SPORT to DST:DPORT, then TLS
      (SNI, verified against CAFILE) and GET /. Prints "status N", or
      "refused", "reset", "timeout" or "error TEXT".
  ctstale.py serve PORT
      Echoes every line of every connection (inbound connections to the pod).
  ctstale.py hold HOST PORT GOFILE
      Connects, exchanges one line ("first ok"), waits until GOFILE
      exists, exchanges another ("second ok"), or prints what failed.
"""

import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

SO_MARK = getattr(socket, "SO_MARK", 36)


def family_of(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def stale(iptables, sport, dst, dport, mark, uid):
    # The socket's owner is the effective uid that creates it.
    os.seteuid(int(uid))
    try:
        s = socket.socket(family_of(dst), socket.SOCK_STREAM)
    finally:
        os.seteuid(0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, SO_MARK, int(mark, 0))
    s.bind(("::" if ":" in dst else "0.0.0.0", int(sport)))
    s.settimeout(5)
    s.connect((dst, int(dport)))
    rule = ["-t", "raw", "-p", "tcp", "--sport", sport, "-d", dst, "-j", "DROP"]
    subprocess.run([iptables, "-w", "5", "-I", "OUTPUT"] + rule, check=True)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        time.sleep(0.2)
    finally:
        subprocess.run([iptables, "-w", "5", "-D", "OUTPUT"] + rule, check=True)
    print("stale", flush=True)


def connect(sport, dst, dport, sni, cafile):
    s = socket.socket(family_of(dst), socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::" if ":" in dst else "0.0.0.0", int(sport)))
    s.settimeout(5)
    try:
        s.connect((dst, int(dport)))
        ctx = ssl.create_default_context(cafile=cafile)
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % sni).encode())
        head = b""
        while b"\r\n" not in head:
            chunk = t.recv(4096)
            if not chunk:
                break
            head += chunk
        t.close()
        print("status", head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "none", flush=True)
    except ConnectionRefusedError:
        print("refused", flush=True)
    except ConnectionResetError:
        print("reset", flush=True)
    except socket.timeout:
        print("timeout", flush=True)
    except OSError as e:
        print("error", e, flush=True)


def serve(port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", int(port)))
    ls.listen(8)
    print("listening", flush=True)

    def echo(c):
        f = c.makefile("rwb", buffering=0)
        for line in f:
            f.write(line)

    while True:
        c, _ = ls.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def hold(host, port, gofile):
    s = socket.create_connection((host, int(port)), timeout=5)
    f = s.makefile("rwb", buffering=0)
    for name in ("first", "second"):
        if name == "second":
            while not os.path.exists(gofile):
                time.sleep(0.05)
        try:
            f.write(name.encode() + b"\n")
            line = f.readline()
            print(name, "ok" if line == name.encode() + b"\n" else "got %r" % line, flush=True)
        except OSError as e:
            print(name, "error", e, flush=True)
            return


def main(argv):
    cmd = argv[1]
    if cmd == "stale":
        stale(*argv[2:8])
    elif cmd == "connect":
        connect(*argv[2:7])
    elif cmd == "serve":
        serve(argv[2])
    elif cmd == "hold":
        hold(*argv[2:5])
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
