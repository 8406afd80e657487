"""A stand-in for `kubectl port-forward` of the sidecar's TCP control port.

The BEAM reaches a pod's control channel (127.0.0.1:15002 inside the pod)
through pods/portforward. In the testbed the BEAM lives outside the pod's
network namespace, so this relay runs inside it: it listens on a Unix
socket and joins every connection made there to HOST:PORT, bytes both
ways, until either side closes. HOST "localhost" is dialled as the
kubelet's port-forward does: 127.0.0.1, and ::1 when that refuses.

Run: /usr/bin/python3 port_forward.py UNIX_PATH HOST PORT
"""

import os
import socket
import sys
import threading


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def dial(host, port):
    # "localhost" as Kubernetes' port-forward dials it inside the pod:
    # IPv4 first, then IPv6 when nothing answers there.
    if host != "localhost":
        return socket.create_connection((host, port), timeout=5)
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return socket.create_connection(("::1", port), timeout=5)


def serve(client, host, port):
    try:
        upstream = dial(host, port)
        upstream.settimeout(None)
    except OSError as e:
        sys.stderr.write("port_forward: cannot connect: %s\n" % e)
        client.close()
        return
    threads = [
        threading.Thread(target=pipe, args=(client, upstream), daemon=True),
        threading.Thread(target=pipe, args=(upstream, client), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    upstream.close()


def main():
    path, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.chmod(path + ".tmp", 0o600)
    listener.listen(8)
    # Renamed once listening: a client that sees the path can connect.
    os.rename(path + ".tmp", path)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client, host, port), daemon=True).start()


if __name__ == "__main__":
    main()
