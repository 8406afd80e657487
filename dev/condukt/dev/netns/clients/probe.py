"""Raw TCP / UDP probe for bypass tests.

Spec (JSON argument): proto ("tcp" or "udp"), host, port, data (text to
send), timeout (seconds), family (4, 6 or null). Sends the data, waits for
one answer, and reports it as the body (client_common.py result; status is
null, there is no HTTP here). A UDP probe with no answer within the timeout
reports error_kind "timeout".
"""

import socket

from client_common import Body, emit, fail, load_spec


def main():
    spec = load_spec()
    kind = socket.SOCK_STREAM if spec["proto"] == "tcp" else socket.SOCK_DGRAM
    try:
        family, _, _, _, addr = socket.getaddrinfo(spec["host"], spec["port"], 0, kind)[0]
        with socket.socket(family, kind) as sock:
            sock.settimeout(spec["timeout"])
            sock.connect(addr)
            sock.sendall(spec["data"].encode())
            reply = sock.recv(65535)
            local = sock.getsockname()[0]
        body = Body(spec["max_body"])
        body.update(reply)
        result = {"ok": True, "data": {"peer": addr[0], "local": local}}
        result.update(body.fields())
        emit(result)
    except Exception as e:  # noqa: BLE001 - every failure is reported as data
        fail(e)


if __name__ == "__main__":
    main()
