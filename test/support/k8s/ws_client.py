#!/usr/bin/python3
"""A small WebSocket client for the API server's pods/exec and
pods/portforward, used by the Kubernetes tier's smoke tests
(docs/k8s-tier.md) until the port program's own client exists. It speaks
the published stream protocols; it does not stand in for the API.

  ws_client.py exec SERVER CA TOKEN NS POD CONTAINER [--stdin FILE] -- CMD...
      prints one JSON object: stdout, stderr, status (the error channel's
      Status), protocol; exit 0 when the stream completed.
  ws_client.py portforward SERVER CA TOKEN NS POD PORT DATA
      sends DATA on PORT's data channel, reads until the peer closes (or 5 s
      pass) and prints a JSON object: data, error, protocol.
"""
import asyncio
import json
import ssl
import sys
import urllib.parse

import websockets


def connect(url, ca, token, protocols):
    ctx = ssl.create_default_context(cafile=ca)
    return websockets.connect(
        url,
        ssl=ctx,
        subprotocols=protocols,
        extra_headers={"Authorization": "Bearer " + token},
        max_size=None,
        open_timeout=10,
    )


async def do_exec(server, ca, token, ns, pod, container, cmd, stdin_data):
    q = [("container", container), ("stdout", "1"), ("stderr", "1")]
    if stdin_data is not None:
        q.append(("stdin", "1"))
    q += [("command", c) for c in cmd]
    url = server.replace("https://", "wss://") + f"/api/v1/namespaces/{ns}/pods/{pod}/exec?" + urllib.parse.urlencode(q)
    out, err, status = bytearray(), bytearray(), None
    async with connect(url, ca, token, ["v5.channel.k8s.io", "v4.channel.k8s.io"]) as ws:
        proto = ws.subprotocol
        if stdin_data is not None:
            await ws.send(b"\x00" + stdin_data)
            if proto == "v5.channel.k8s.io":
                await ws.send(b"\xff\x00")  # v5: close stdin
        try:
            async for msg in ws:
                if not msg:
                    continue
                ch, data = msg[0], msg[1:]
                if ch == 1:
                    out += data
                elif ch == 2:
                    err += data
                elif ch == 3:
                    status = json.loads(data) if data else None
        except websockets.ConnectionClosed:
            pass
    return {"stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace"), "status": status, "protocol": proto}


async def do_portforward(server, ca, token, ns, pod, port, data):
    url = server.replace("https://", "wss://") + f"/api/v1/namespaces/{ns}/pods/{pod}/portforward?ports={port}"
    got, errs = bytearray(), bytearray()
    async with connect(url, ca, token, ["v4.channel.k8s.io"]) as ws:
        proto = ws.subprotocol
        seen = {0: False, 1: False}

        async def reader():
            async for msg in ws:
                ch, body = msg[0], msg[1:]
                # The first frame of each channel carries the port (2 bytes,
                # little endian).
                if not seen.get(ch, True):
                    seen[ch] = True
                    body = body[2:]
                if ch == 0:
                    got.extend(body)
                elif ch == 1:
                    errs.extend(body)

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.2)
        await ws.send(b"\x00" + data)
        try:
            await asyncio.wait_for(task, 5)
        except (asyncio.TimeoutError, websockets.ConnectionClosed):
            pass
    return {"data": got.decode(errors="replace"), "error": errs.decode(errors="replace"), "protocol": proto}


def main(argv):
    mode = argv[1]
    if mode == "exec":
        server, ca, token, ns, pod, container = argv[2:8]
        rest = argv[8:]
        stdin_data = None
        if rest[:1] == ["--stdin"]:
            stdin_data = open(rest[1], "rb").read()
            rest = rest[2:]
        assert rest[0] == "--"
        res = asyncio.run(do_exec(server, ca, token, ns, pod, container, rest[1:], stdin_data))
    elif mode == "portforward":
        server, ca, token, ns, pod, port, data = argv[2:9]
        res = asyncio.run(do_portforward(server, ca, token, ns, pod, int(port), data.encode()))
    else:
        raise SystemExit("unknown mode " + mode)
    print(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv)
