#!/usr/bin/python3
"""Byte relays between the host's loopback and a network namespace, for the
Kubernetes tier's per-node namespaces (docs/k8s-tier.md). Unix sockets live
in the file system, which both namespaces share, so a pair of relays (one
started in each namespace) joins a TCP port on one side to a TCP port on
the other without any interface or route on the host.

  relay.py LISTEN=CONNECT ...
      each pair: tcp:HOST:PORT or unix:PATH on both sides. Prints "ready"
      once every listener is open; runs until killed.
"""
import asyncio
import os
import sys


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except OSError:
            writer.close()


def opener(spec):
    kind, _, rest = spec.partition(":")
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        return lambda: asyncio.open_connection(host, int(port))
    return lambda: asyncio.open_unix_connection(rest)


async def serve(listen, connect):
    open_peer = opener(connect)

    async def handle(r1, w1):
        try:
            r2, w2 = await open_peer()
        except OSError:
            w1.close()
            return
        await asyncio.gather(pipe(r1, w2), pipe(r2, w1))
        w1.close()
        w2.close()

    kind, _, rest = listen.partition(":")
    if kind == "tcp":
        host, _, port = rest.rpartition(":")
        return await asyncio.start_server(handle, host, int(port), reuse_address=True)
    if os.path.exists(rest):
        os.unlink(rest)
    return await asyncio.start_unix_server(handle, rest)


async def main(pairs):
    servers = [await serve(*p.split("=", 1)) for p in pairs]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
