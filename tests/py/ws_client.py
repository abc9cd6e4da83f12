"""An independent WebSocket client (PyPI `websockets`) for the guard tests.

Opens N connections to URL_BASE/tick?id=<prefix><i>&interval_ms=..., prints
"ready" on stdout once every connection got its first tick, then records
every tick until the server closes, and prints one JSON line: per connection
the id, the tick sequence numbers, the close code received (None if the
connection ended without a Close frame, i.e. 1006) and the error if any.
Every wait is bounded.
"""
import argparse
import asyncio
import json
import sys
import time

import websockets


async def one(url, conn_id, first, results):
    seqs = []
    code = None
    error = None
    try:
        async with websockets.connect(url, max_size=None, open_timeout=30) as ws:
            try:
                async for msg in ws:
                    parts = msg.split(" ", 2) if isinstance(msg, str) else []
                    if len(parts) >= 2 and parts[0] == conn_id:
                        seqs.append(int(parts[1]))
                        if len(seqs) == 1:
                            first.set()
            except websockets.ConnectionClosed as e:
                error = str(e)
            rcvd = ws.protocol.close_rcvd
            code = rcvd.code if rcvd is not None else None
    except Exception as e:  # noqa: BLE001 - reported to the test as data
        error = f"{type(e).__name__}: {e}"
    first.set()
    # CLOCK_MONOTONIC, the clock a test's own Instant reads: comparable.
    ended = time.clock_gettime(time.CLOCK_MONOTONIC)
    results.append(
        {"id": conn_id, "seqs": seqs, "close_code": code, "error": error, "ended": ended}
    )


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True, help="ws://host:port")
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--prefix", default="py")
    p.add_argument("--interval-ms", type=int, default=20)
    p.add_argument("--size", type=int, default=10)
    p.add_argument("--limit", type=float, default=60.0)
    a = p.parse_args()
    results = []
    firsts = []
    tasks = []
    for i in range(a.n):
        conn_id = f"{a.prefix}{i}"
        url = f"{a.base}/tick?id={conn_id}&interval_ms={a.interval_ms}&size={a.size}"
        first = asyncio.Event()
        firsts.append(first)
        tasks.append(asyncio.create_task(one(url, conn_id, first, results)))
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), a.limit)
    print("ready", flush=True)
    done, pending = await asyncio.wait(tasks, timeout=a.limit)
    for t in pending:
        t.cancel()
    print(json.dumps({"connections": results, "unfinished": len(pending)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
