"""A gRPC application written with grpcio (PyPI), for tests/it/guard_app_shutdown.rs
and tests/it/peer_matrix.rs.

It serves the bench protocol (proto/drainshim/bench/v1/stream.proto) without
generated stubs: a generic handler with identity (bytes) serializers, and the
few protobuf fields it needs encoded by hand. The server has grpcio's default
options (one is changed: no SO_REUSEPORT), so gRPC C-core's keepalive
enforcement is the default one: a PING less than 5 minutes after the previous
one, with no DATA or HEADERS sent in between, is a strike, and past 2 strikes
(grpc.http2.max_ping_strikes) the connection gets GOAWAY(ENHANCE_YOUR_CALM,
"too_many_pings") and is closed.

  Subscribe  a Tick (stream id, sequence number 1, 2, ...) every
             `interval_ms` (100 ms when 0); `count` of them, or forever when 0.
  Echo       answers with the request's body after `delay_ms` (3 s when 0).

On SIGTERM, SIGINT or a line `stop` on stdin it stops gracefully with
`server.stop(grace=GRACE)`: no new calls, the calls in flight get GRACE
seconds to finish, then grpcio cancels what is left. Then it exits 0.

Stdout, one line each, flushed at once (the test waits on them):
  listening 127.0.0.1:PORT
  subscribe ID PEER      a Subscribe call started; PEER is the client's address
  ended ID LAST HOW      a Subscribe call is over: the last sequence number
                         handed to grpcio, and how it ended
  echo BODY              an Echo call started
  stopping               the graceful stop began
  report {json}          once stopped: per stream, the last sequence number
                         handed to grpcio and how the call ended
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc

from benchproto import field_bytes, field_varint, fields, stop_event

SERVICE = "drainshim.bench.v1.Stream"
GRACE = 20.0
# Most calls in flight at once: each takes a worker thread (the peer matrix
# holds about a hundred streams on one app).
WORKERS = 256


SAY = threading.Lock()


def say(line):
    # One write per line under a lock: the handlers run on many threads,
    # and print() writes the text and its newline apart.
    with SAY:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.streams = {}

    def set(self, sid, **kv):
        with self.lock:
            self.streams.setdefault(sid, {"last_written": 0, "ended": None}).update(kv)

    def last_written(self, sid):
        with self.lock:
            return self.streams.get(sid, {}).get("last_written", 0)

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps(self.streams))


LEDGER = Ledger()


def subscribe(request, context):
    f = fields(request)
    sid = f.get(1, b"").decode()
    count = f.get(2, 0)
    interval = (f.get(3, 0) or 100) / 1000.0
    payload = b"\0" * f.get(4, 0)
    LEDGER.set(sid)
    # Set when the call is over, so a quiet stream's wait ends with it (a
    # worker asleep for minutes would hold the process's exit).
    over = threading.Event()
    done = []

    def at_end():
        over.set()
        how = ended(context, done)
        LEDGER.set(sid, ended=how)
        say(f"ended {sid} {LEDGER.last_written(sid)} {how}")

    context.add_callback(at_end)
    say(f"subscribe {sid} {context.peer().removeprefix('ipv4:')}")
    seq = 0
    while context.is_active() and (count == 0 or seq < count):
        seq += 1
        yield field_bytes(1, sid.encode()) + field_varint(2, seq) + field_bytes(3, payload)
        # grpcio took it: from here only the transport can lose it.
        LEDGER.set(sid, last_written=seq)
        if count and seq >= count:
            break
        # The application's own cadence, not a synchronisation.
        over.wait(interval)
    done.append(True)


def ended(context, done):
    # The callback runs when the call is over; `code()` is what the server
    # set, None when it never set one: OK when the handler returned, else
    # cancelled (by the peer, or at the grace).
    code = context.code()
    if code:
        return code.name
    return "OK" if done else "cancelled"


def echo(request, context):
    f = fields(request)
    body = f.get(1, b"")
    delay = (f.get(2, 0) or 3000) / 1000.0
    say(f"echo {body.decode()}")
    time.sleep(delay)
    return field_bytes(1, body)


def identity(b):
    return b


def main():
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=WORKERS),
        options=[("grpc.so_reuseport", 0)],
    )
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                subscribe, request_deserializer=identity, response_serializer=identity
            ),
            "Echo": grpc.unary_unary_rpc_method_handler(
                echo, request_deserializer=identity, response_serializer=identity
            ),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    stop = stop_event()
    say(f"listening 127.0.0.1:{port}")
    stop.wait()
    say("stopping")
    server.stop(grace=GRACE).wait()
    say("report " + json.dumps({"streams": LEDGER.snapshot()}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
