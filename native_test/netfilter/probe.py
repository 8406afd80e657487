"""Listeners and clients for behaviour.sh (the netfilter-setup netns test).

    probe.py serve LOG READY SPEC...       listen until killed (at most 300 s)
    probe.py connect HOST PORT TAG [MARK]  one TCP exchange, prints the outcome
    probe.py udp HOST PORT TAG [MARK]      one datagram, prints the outcome
    probe.py hold HOST PORT TAG GO         connect now, send TAG once the
                                           file GO exists, print the outcome
    probe.py closefirst HOST PORT TAG [MARK]
                                           connect, send TAG, close at once
                                           (the server closes after us)
    probe.py join GROUP IFACE SECONDS      join a multicast group on IFACE,
                                           hold it, leave
    probe.py sniff IFACE OUT SECONDS       write every frame seen on IFACE
                                           to OUT, one hex line each
    probe.py seen OUT GROUP                how many frames in OUT carry the
                                           group address

A SPEC is PROTO,ADDR,PORT,NAME (e.g. tcp,::1,15001,proxy6). A TCP listener
reads one line (the client's TAG), logs "NAME TAG", answers "NAME" and
closes; a "tcpeof" listener logs "NAME TAG", waits for the client to close
and closes then; a UDP listener logs "NAME TAG" for each datagram. READY is a file
written once every socket is bound. The client prints exactly one line:
"reply NAME", "refused", "timeout", "mark-refused" (setsockopt(SO_MARK)
denied) or "error ERRNO_NAME", and always exits 0: the shell decides.
Every blocking call has a 2 s timeout, except the waits of a held
connection (HOLD_SECONDS).
"""

import errno
import os
import selectors
import socket
import struct
import sys
import threading
import time

TIMEOUT = 2.0
HOLD_SECONDS = 20.0
SERVE_MAX_SECONDS = 300
SO_MARK = getattr(socket, "SO_MARK", 36)


def family_of(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def answer(conn, name, log):
    conn.settimeout(HOLD_SECONDS)
    try:
        with conn:
            tag = conn.makefile("r").readline().strip()
            if tag:
                log.write("%s %s\n" % (name, tag))
                conn.sendall((name + "\n").encode())
    except OSError:
        pass


def answer_at_eof(conn, name, log):
    conn.settimeout(HOLD_SECONDS)
    try:
        with conn:
            f = conn.makefile("rb")
            tag = f.readline().decode().strip()
            log.write("%s %s\n" % (name, tag))
            f.read()  # until the client's FIN
    except OSError:
        pass


def serve(log_path, ready_path, specs):
    sel = selectors.DefaultSelector()
    for spec in specs:
        proto, addr, port, name = spec.split(",")
        fam = family_of(addr)
        kind = socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM
        s = socket.socket(fam, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            # Separate IPv4 and IPv6 sockets, so each family is tested alone.
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((addr, int(port)))
        if kind == socket.SOCK_STREAM:
            s.listen(16)
        sel.register(s, selectors.EVENT_READ, (proto, name))
    log = open(log_path, "a", buffering=1)
    with open(ready_path, "w") as f:
        f.write("ready\n")
    deadline = time.monotonic() + SERVE_MAX_SECONDS
    parent = os.getppid()
    # Gone with the shell that started us, even if it could not kill us: a
    # listener left behind would also keep its namespace alive.
    while time.monotonic() < deadline and os.getppid() == parent:
        for key, _ in sel.select(timeout=1.0):
            proto, name = key.data
            s = key.fileobj
            try:
                if proto == "udp":
                    data, _ = s.recvfrom(2048)
                    log.write("%s %s\n" % (name, data.decode().strip()))
                    continue
                conn, _ = s.accept()
                # One thread per connection, so a held one does not stall
                # the others.
                target = answer_at_eof if proto == "tcpeof" else answer
                threading.Thread(target=target, args=(conn, name, log), daemon=True).start()
            except OSError as e:
                log.write("%s server-error %s\n" % (name, e))


def client_socket(host, kind, mark):
    s = socket.socket(family_of(host), kind)
    s.settimeout(TIMEOUT)
    if mark is not None:
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_MARK, int(mark, 0))
        except PermissionError:
            s.close()
            return None
    return s


def exchange(host, port, mark, talk):
    """Connects and runs talk(s), which returns the outcome; connection
    errors become the outcome words of the module docstring."""
    s = client_socket(host, socket.SOCK_STREAM, mark)
    if s is None:
        return "mark-refused"
    try:
        with s:
            s.connect((host, int(port)))
            return talk(s)
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "error " + errno.errorcode.get(e.errno, str(e.errno))


def send_and_read(s, tag):
    s.sendall((tag + "\n").encode())
    reply = s.makefile("r").readline().strip()
    return "reply " + reply if reply else "error empty-reply"


def connect(host, port, tag, mark=None):
    return exchange(host, port, mark, lambda s: send_and_read(s, tag))


def hold(host, port, tag, go):
    def talk(s):
        deadline = time.monotonic() + HOLD_SECONDS
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
        return send_and_read(s, tag)

    return exchange(host, port, None, talk)


def closefirst(host, port, tag, mark=None):
    def talk(s):
        s.sendall((tag + "\n").encode())
        return "closed"

    return exchange(host, port, mark, talk)


def join(group, iface, seconds):
    idx = socket.if_nametoindex(iface)
    if ":" in group:
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        mreq = socket.inet_pton(socket.AF_INET6, group) + struct.pack("@i", idx)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP, mreq)
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        mreq = socket.inet_aton(group) + socket.inet_aton("0.0.0.0") + struct.pack("@i", idx)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    time.sleep(float(seconds))
    s.close()
    return "joined"


def sniff(iface, out, seconds):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
    s.bind((iface, 0))
    s.settimeout(0.2)
    deadline = time.monotonic() + float(seconds)
    with open(out, "w", buffering=1) as f:
        f.write("ready\n")
        while time.monotonic() < deadline:
            try:
                f.write(s.recv(65535).hex() + "\n")
            except socket.timeout:
                pass
    return "done"


def seen(out, group):
    fam = socket.AF_INET6 if ":" in group else socket.AF_INET
    needle = socket.inet_pton(fam, group).hex()
    with open(out) as f:
        return str(sum(1 for line in f if needle in line))


def udp(host, port, tag, mark=None):
    s = client_socket(host, socket.SOCK_DGRAM, mark)
    if s is None:
        return "mark-refused"
    try:
        with s:
            s.sendto((tag + "\n").encode(), (host, int(port)))
            return "sent"
    except OSError as e:
        return "error " + errno.errorcode.get(e.errno, str(e.errno))


def main(argv):
    if argv[1] == "serve":
        serve(argv[2], argv[3], argv[4:])
        return 0
    if argv[1] == "connect":
        print(connect(*argv[2:]))
        return 0
    if argv[1] == "hold":
        print(hold(*argv[2:]))
        return 0
    commands = {"udp": udp, "closefirst": closefirst, "join": join, "sniff": sniff, "seen": seen}
    if argv[1] in commands:
        print(commands[argv[1]](*argv[2:]))
        return 0
    print("usage: probe.py serve|connect|udp ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
