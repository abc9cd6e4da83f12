"""A slow gRPC application on raw HTTP/2 (python-h2), for tests/it/peer_matrix:
one thread and one loop, as an application under a CPU limit or in GC pauses
runs. Each turn of the loop it

  1. writes the message due on every open stream, each message whole, in one
     write to its socket (the frames of a large one together);
  2. reads what has arrived (the guard's cancels, its barrier SETTINGS, window
     updates, new calls) and writes what that calls for (h2's acks);
  3. works for --pause-ms without reading its sockets.

So the guard's cancel of a stream is read up to --pause-ms after it arrived,
and every message the app wrote before it is on its way. A message counts as
written once its last byte is in the socket: that is what the guard must never
lose. It serves the bench protocol (proto/drainshim/bench/v1/stream.proto,
Subscribe only; the few protobuf fields encoded by hand, as grpc_app.py does):

  Subscribe  a Tick (stream id, sequence number 1, 2, ...) every interval_ms
             (100 ms when 0), but at most one per turn; `count` of them, or
             forever when 0; `payload_bytes` of payload each. A message
             waits for a turn with window enough for all of it.

On SIGTERM, SIGINT, a line `stop` on stdin or stdin's end it stops gracefully:
GOAWAY (2^31-1, then the last stream it took) on every connection, no new
calls, the calls in flight go on until they end or GRACE passes. Then it exits 0.

Stdout, one line each, flushed at once (the test waits on them), as grpc_app.py:
  listening 127.0.0.1:PORT
  subscribe ID PEER      a Subscribe call started; PEER is the client's address
  ended ID LAST HOW      a Subscribe call is over: the last sequence number
                         written whole to the socket, and how it ended
  stopping               the graceful stop began
"""

import argparse
import os
import select
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from hyperframe.frame import GoAwayFrame

from benchproto import field_bytes, field_varint, fields, stop_event

SERVICE = "drainshim.bench.v1.Stream"
GRACE = 20.0
READ = 65536


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def grpc_message(body):
    return b"\0" + len(body).to_bytes(4, "big") + body


class Call:
    """One Subscribe call: its request as it comes, then its ticks."""

    def __init__(self):
        self.request = b""
        self.sid = None
        self.count = 0
        self.interval = 0.1
        self.payload = b""
        self.seq = 0
        self.written = 0
        self.due = 0.0


class Conn:
    def __init__(self, sock, peer):
        self.sock = sock
        self.peer = f"{peer[0]}:{peer[1]}"
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.initiate_connection()
        self.calls = {}
        self.last_stream = 0
        self.closed = False
        self.flush()

    def flush(self):
        data = self.h2.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.close("connection closed")

    def close(self, how):
        if self.closed:
            return
        self.closed = True
        for call in self.calls.values():
            if call.sid is not None:
                say(f"ended {call.sid} {call.written} {how}")
        self.calls.clear()
        try:
            self.sock.close()
        except OSError:
            pass

    def end_call(self, stream_id, how):
        call = self.calls.pop(stream_id, None)
        if call is not None and call.sid is not None:
            say(f"ended {call.sid} {call.written} {how}")

    def write_due(self, now):
        """Writes the message due on each call, whole, in one write."""
        for stream_id, call in list(self.calls.items()):
            if self.closed:
                return
            if call.sid is None or now < call.due:
                continue
            body = field_bytes(1, call.sid.encode()) + field_varint(2, call.seq + 1)
            body += field_bytes(3, call.payload)
            message = grpc_message(body)
            if self.h2.local_flow_control_window(stream_id) < len(message):
                continue
            frame = self.h2.max_outbound_frame_size
            try:
                for at in range(0, len(message), frame):
                    self.h2.send_data(stream_id, message[at : at + frame])
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                self.end_call(stream_id, "closed")
                continue
            call.seq += 1
            self.flush()
            if self.closed:
                return
            call.written = call.seq
            call.due = now + call.interval
            if call.count and call.seq >= call.count:
                self.h2.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)
                self.flush()
                self.end_call(stream_id, "OK")

    def read(self, stopping):
        """Reads what has arrived; answers it."""
        try:
            data = self.sock.recv(READ)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close("connection closed")
            return
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            self.close("protocol error")
            return
        for ev in events:
            self.on_event(ev, stopping)
        self.flush()

    def on_event(self, ev, stopping):
        if isinstance(ev, h2.events.RequestReceived):
            headers = dict(ev.headers)
            if stopping or headers.get(":path") != f"/{SERVICE}/Subscribe":
                self.h2.send_headers(
                    ev.stream_id,
                    [(":status", "200"), ("content-type", "application/grpc"),
                     ("grpc-status", "14" if stopping else "12")],
                    end_stream=True,
                )
                return
            self.last_stream = max(self.last_stream, ev.stream_id)
            self.calls[ev.stream_id] = Call()
        elif isinstance(ev, h2.events.DataReceived):
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            call = self.calls.get(ev.stream_id)
            if call is not None and call.sid is None:
                call.request += ev.data
        elif isinstance(ev, h2.events.StreamEnded):
            call = self.calls.get(ev.stream_id)
            if call is not None and call.sid is None:
                self.start(ev.stream_id, call)
        elif isinstance(ev, h2.events.StreamReset):
            self.end_call(ev.stream_id, "cancelled")
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.close("connection closed")

    def start(self, stream_id, call):
        f = fields(call.request[5:])
        call.sid = f.get(1, b"").decode()
        call.count = f.get(2, 0)
        call.interval = (f.get(3, 0) or 100) / 1000.0
        call.payload = b"\0" * f.get(4, 0)
        self.h2.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
        say(f"subscribe {call.sid} {self.peer}")

    def goaway(self, last):
        """A GOAWAY of the app's graceful stop, beside h2 (which would close)."""
        frame = GoAwayFrame(0)
        frame.last_stream_id = last
        try:
            self.sock.sendall(frame.serialize())
        except OSError:
            self.close("connection closed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause-ms", type=int, default=100,
                        help="how long each turn works without reading its sockets")
    args = parser.parse_args()
    pause = args.pause_ms / 1000.0

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.setblocking(False)

    stop = stop_event()
    say(f"listening 127.0.0.1:{listener.getsockname()[1]}")

    conns = []
    stopping_since = None
    while True:
        now = time.monotonic()
        if stop.is_set() and stopping_since is None:
            stopping_since = now
            say("stopping")
            listener.close()
            for c in conns:
                c.goaway(2**31 - 1)
                c.goaway(c.last_stream)
        if stopping_since is not None:
            conns = [c for c in conns if not c.closed]
            if not any(c.calls for c in conns) or now - stopping_since > GRACE:
                for c in conns:
                    c.close("grace" if c.calls else "connection closed")
                break
        # 1. What is due, each message whole.
        for c in conns:
            c.write_due(now)
        # 2. What has arrived.
        if stopping_since is None:
            while True:
                try:
                    sock, peer = listener.accept()
                except BlockingIOError:
                    break
                sock.setblocking(True)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conns.append(Conn(sock, peer))
        conns = [c for c in conns if not c.closed]
        socks = [c.sock for c in conns]
        if socks:
            ready, _, _ = select.select(socks, [], [], 0)
            for c in conns:
                if c.sock in ready:
                    c.read(stopping_since is not None)
        # 3. Work, not reading: a frozen or busy app. With no pause, wait
        # for the next due message or a read (never a busy loop).
        if pause > 0:
            time.sleep(pause)
        else:
            socks = [c.sock for c in conns if not c.closed] + (
                [] if stopping_since is not None else [listener])
            waits = [c2.due for c in conns for c2 in c.calls.values() if c2.sid is not None]
            timeout = max(0.0, min(waits) - time.monotonic()) if waits else 0.05
            select.select(socks, [], [], min(timeout, 0.05))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
