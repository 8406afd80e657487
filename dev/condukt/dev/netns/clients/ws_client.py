"""WebSocket client: python3-websockets.

Spec (JSON argument): url (ws:// or wss://), messages (texts to send),
headers ([[name, value]]), timeout (seconds), family (4, 6 or null).
Connects, reads the server's greeting, sends every message and reads one
answer per message. The result (client_common.py) has status 101 on a
completed upgrade, and data.received: the greeting then the echoes.
"""

import asyncio

import websockets

from client_common import emit, fail, load_spec


async def run(spec):
    kwargs = {"open_timeout": spec["timeout"], "max_size": 16 * 1024 * 1024}
    if spec["headers"]:
        kwargs["extra_headers"] = [tuple(h) for h in spec["headers"]]
    async with websockets.connect(spec["url"], **kwargs) as ws:
        received = [await asyncio.wait_for(ws.recv(), spec["timeout"])]
        for message in spec.get("messages", []):
            await ws.send(message)
            received.append(await asyncio.wait_for(ws.recv(), spec["timeout"]))
        headers = [[k.lower(), v] for k, v in ws.response_headers.raw_items()]
    return {"ok": True, "status": 101, "http_version": "1.1", "headers": headers, "data": {"received": received}}


def main():
    spec = load_spec()
    try:
        emit(asyncio.run(run(spec)))
    except websockets.exceptions.InvalidStatusCode as e:
        emit({"ok": False, "status": e.status_code, "error": str(e), "error_kind": "http"})
        raise SystemExit(1)
    except Exception as e:  # noqa: BLE001 - every failure is reported as data
        fail(e)


if __name__ == "__main__":
    main()
