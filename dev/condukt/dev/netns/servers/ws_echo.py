"""WebSocket echo server for the testbed (python3-websockets).

Listens on 127.0.0.1:PORT in the inet namespace; nginx proxies /ws to it
with the Upgrade headers. Every text or binary message is sent back as is;
the path the client asked for is sent first as "hello <path>", so a test
can see that the upgrade request reached the origin intact.

Run: /usr/bin/python3 ws_echo.py PORT
"""

import asyncio
import sys

import websockets


async def echo(websocket, path=None):
    # websockets < 10.1 passes the path as a second argument; later
    # versions keep it on the connection.
    path = path if path is not None else getattr(websocket, "path", "?")
    await websocket.send("hello " + str(path))
    async for message in websocket:
        await websocket.send(message)


async def main(port):
    async with websockets.serve(echo, "127.0.0.1", port, max_size=16 * 1024 * 1024):
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
