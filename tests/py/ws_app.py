"""A WebSocket server on PyPI `websockets`, for the guard tests: a server
users run, not the project's own.

`GET /tick?id=ID&interval_ms=N` upgrades, then sends text ticks "ID SEQ"
every N ms, SEQ counting from 1. Prints "listening HOST:PORT" once bound,
and for each connection that ends, one JSON line: its id, the last tick
the server's transport took (`sent`) and the close code it got (None if
the connection ended without one). Stops when its stdin closes.
"""
import asyncio
import json
import sys
from urllib.parse import parse_qs, urlparse

import websockets


async def tick(ws):
    query = parse_qs(urlparse(ws.request.path).query)
    conn_id = query.get("id", ["?"])[0]
    interval = int(query.get("interval_ms", ["100"])[0]) / 1000.0
    sent = 0
    try:
        while True:
            await ws.send(f"{conn_id} {sent + 1}")
            sent += 1
            await asyncio.sleep(interval)
    except websockets.ConnectionClosed:
        pass
    rcvd = ws.protocol.close_rcvd
    code = rcvd.code if rcvd is not None else None
    print(json.dumps({"id": conn_id, "sent": sent, "close_code": code}), flush=True)


async def main():
    async with websockets.serve(tick, "127.0.0.1", 0, max_size=None, ping_interval=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"listening 127.0.0.1:{port}", flush=True)
        loop = asyncio.get_running_loop()
        # Until stdin closes (the test's handle dropped).
        await loop.run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(main())
