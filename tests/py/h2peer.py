"""HTTP/2 peers for the guard's conformance suite (tests/py/h2_conformance/).

Independent implementations drive both ends of the guard: python-h2 for the
protocol state (HPACK, flow control, stream states) and hyperframe for frames
built by hand. Each end also sniffs every frame it receives before h2 sees it,
so a test can assert on the exact frames on the wire.

- `Guard`: the real `drainshim sidecar` process with its stream guard.
- `App`: the application behind the guard, an h2 server on 127.0.0.1:0, a
  thread per connection; routes for bodies, echoes and gRPC streams, and
  hooks for tests that need the app to misbehave.
- `NoApp` and `Http1App`: no application at all (a port nothing listens
  on), and one that only speaks HTTP/1.1 (Python's `http.server`), for the
  guard serving the client alone.
- `Client`: an h2 client connection to the guard, driven from the test's own
  thread (`wait` pumps it until a condition holds or a deadline passes).

python-h2 treats any GOAWAY, sent or received, as the end of the connection,
while a graceful GOAWAY lets open streams finish: so GOAWAY frames are never
fed to h2 (the sniffer records them) and are sent raw. Every loop here is
bounded in time; nothing sleeps to synchronise.
"""
import hashlib
import heapq
import http.client
import http.server
import json
import os
import queue
import re
import select
import socket
import struct
import subprocess
import threading
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PingFrame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE = 0, 1, 2, 3, 4, 5
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 6, 7, 8, 9
TYPE_NAMES = {
    DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM",
    SETTINGS: "SETTINGS", PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY",
    WINDOW_UPDATE: "WINDOW_UPDATE", CONTINUATION: "CONTINUATION",
}
# Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

E = h2.errors.ErrorCodes
S = h2.settings.SettingCodes
MAX_STREAM_ID = 2**31 - 1


def err_name(code):
    try:
        return E(code).name
    except ValueError:
        return f"0x{code:x}"


# --- deadlines and waiting -------------------------------------------------

class Deadline:
    def __init__(self, seconds):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def remaining(self):
        return max(0.0, self.end - time.monotonic())

    def expired(self):
        return time.monotonic() >= self.end


def wait_until(pred, timeout, what, step=None, describe=None):
    """Waits until pred() is true, for at most `timeout` seconds.

    `step(t)` makes progress for at most t seconds (pumps a client, or waits
    on a condition); the default waits on nothing for t. On timeout raises
    AssertionError naming `what` and, if given, describe()'s text."""
    d = Deadline(timeout)
    while True:
        if pred():
            return
        if d.expired():
            text = f"timed out after {timeout}s waiting for {what}"
            if describe is not None:
                text += "\n" + describe()
            raise AssertionError(text)
        t = min(0.05, d.remaining())
        if step is not None:
            step(t)
        else:
            threading.Event().wait(t)


# --- bytes -------------------------------------------------------------------

def raw_frame(ftype, flags, stream_id, payload=b""):
    """A frame as bytes, built by hand: for frames hyperframe refuses to build
    (SETTINGS on a stream, a short PING) and for rewriting h2's own frames."""
    return (len(payload).to_bytes(3, "big") + bytes([ftype, flags])
            + (stream_id & MAX_STREAM_ID).to_bytes(4, "big") + payload)


def split_frames(data):
    """Whole frames in `data` as (type, flags, stream_id, payload) tuples."""
    out, i = [], 0
    while i + 9 <= len(data):
        n = int.from_bytes(data[i:i + 3], "big")
        out.append((data[i + 3], data[i + 4],
                    int.from_bytes(data[i + 5:i + 9], "big") & MAX_STREAM_ID,
                    bytes(data[i + 9:i + 9 + n])))
        i += 9 + n
    assert i == len(data), "split_frames: trailing partial frame"
    return out


def goaway_frame(last_stream_id, code=0, debug=b""):
    return GoAwayFrame(0, last_stream_id=last_stream_id, error_code=code,
                       additional_data=debug).serialize()


def ping_frame(data, ack=False):
    return PingFrame(0, opaque_data=data, flags=["ACK"] if ack else []).serialize()


def pattern(n, seed=0):
    """n deterministic bytes; a 251-byte period, so no frame size lines up."""
    block = bytes((i * 7 + seed * 13) % 256 for i in range(251))
    return (block * (n // 251 + 1))[:n]


def first_difference(got, want):
    if got == want:
        return None
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return min(len(got), len(want))


def assert_bytes(got, want, what):
    i = first_difference(bytes(got), want)
    assert i is None, (f"{what}: got {len(got)} bytes, want {len(want)}; "
                       f"first difference at byte {i}")


def grpc_message(payload):
    return b"\0" + struct.pack(">I", len(payload)) + payload


def split_grpc(data):
    """gRPC length-prefixed messages in data, and the bytes left over (a
    partial message: non-empty means data does not end on a boundary)."""
    msgs, i = [], 0
    data = bytes(data)
    while len(data) - i >= 5:
        n = struct.unpack(">I", data[i + 1:i + 5])[0]
        if len(data) - i - 5 < n:
            break
        msgs.append(data[i + 5:i + 5 + n])
        i += 5 + n
    return msgs, data[i:]


# --- frames on the wire --------------------------------------------------------

class Seen:
    """One frame received, as it was on the wire."""

    def __init__(self, ftype, flags, stream_id, payload):
        self.t = time.monotonic()
        self.type, self.flags, self.stream, self.payload = ftype, flags, stream_id, payload

    @property
    def length(self):
        return len(self.payload)

    @property
    def name(self):
        return TYPE_NAMES.get(self.type, f"type0x{self.type:x}")

    @property
    def ack(self):
        return self.type in (SETTINGS, PING) and bool(self.flags & ACK)

    @property
    def end_stream(self):
        return self.type in (DATA, HEADERS) and bool(self.flags & END_STREAM)

    def goaway(self):
        """(last_stream_id, error_code, debug) of a GOAWAY."""
        last, code = struct.unpack(">II", self.payload[:8])
        return last & MAX_STREAM_ID, code, self.payload[8:]

    def rst_code(self):
        return struct.unpack(">I", self.payload[:4])[0]

    def __repr__(self):
        extra = ""
        if self.type == GOAWAY and self.length >= 8:
            last, code, debug = self.goaway()
            extra = f" last={last} {err_name(code)} {debug[:40]!r}"
        elif self.type == RST_STREAM and self.length == 4:
            extra = " " + err_name(self.rst_code())
        elif self.type == PING:
            extra = f" {self.payload!r}"
        elif self.type == WINDOW_UPDATE and self.length == 4:
            extra = f" +{int.from_bytes(self.payload, 'big') & MAX_STREAM_ID}"
        flags = f" flags=0x{self.flags:x}" if self.flags else ""
        return f"{self.name}(s={self.stream} len={self.length}{flags}{extra})"


class Sniffer:
    """Splits received bytes into frames; the server side first takes the
    connection preface. Yields (Seen or None for the preface, raw bytes)."""

    def __init__(self, server):
        self.buf = bytearray()
        self.preface_pending = server

    def feed(self, data):
        self.buf += data
        out = []
        if self.preface_pending:
            if len(self.buf) < len(PREFACE):
                return out
            out.append((None, bytes(self.buf[:len(PREFACE)])))
            del self.buf[:len(PREFACE)]
            self.preface_pending = False
        i = 0
        while len(self.buf) - i >= 9:
            n = int.from_bytes(self.buf[i:i + 3], "big")
            if len(self.buf) - i < 9 + n:
                break
            raw = bytes(self.buf[i:i + 9 + n])
            sid = int.from_bytes(raw[5:9], "big") & MAX_STREAM_ID
            out.append((Seen(raw[3], raw[4], sid, raw[9:]), raw))
            i += 9 + n
        del self.buf[:i]
        return out


# --- an HTTP/2 endpoint over a socket -----------------------------------------

class Outgoing:
    """A body being sent on one stream, within the flow-control windows."""

    def __init__(self):
        self.data = bytearray()
        self.offset = 0
        self.finish = False      # end the stream once the data is out
        self.trailers = None     # ...with these trailers
        self.pad = None          # pad every DATA frame with this many bytes


class Endpoint:
    """An h2 connection over a non-blocking socket: sniffs what it receives,
    keeps GOAWAY away from h2, sends bodies as the windows allow, and keeps
    its own write buffer so it never blocks on a peer that does not read."""

    def __init__(self, sock, server, name):
        self.name = name
        self.sock = sock
        sock.setblocking(False)
        config = h2.config.H2Configuration(client_side=not server, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config=config)
        self.sniffer = Sniffer(server)
        self.frames_in = []
        self.wbuf = bytearray()
        self.outbox = {}
        self.eof = False            # the peer closed (or reset) the connection
        self.closed = False         # we closed it
        self.linger_until = None    # closing: FIN sent, the peer's last bytes dropped until then
        self.h2_error = None        # h2 rejected what the peer sent
        self.io_error = None
        self.drop = None            # fn(Seen) -> True to keep a frame from h2
        self.rewrite = None         # fn([(type, flags, sid, payload)]) -> same, on h2's output
        self.goaways_sent = []

    # Outgoing -------------------------------------------------------------

    def send_body(self, sid, data, end=True, trailers=None, pad=None):
        o = self.outbox.setdefault(sid, Outgoing())
        o.data += data
        o.finish = o.finish or end or trailers is not None
        if trailers is not None:
            o.trailers = trailers
        if pad is not None:
            o.pad = pad
        self.flush()

    def _pump_bodies(self):
        for sid, o in list(self.outbox.items()):
            try:
                while o.offset < len(o.data):
                    overhead = (o.pad + 1) if o.pad is not None else 0
                    n = min(self.conn.local_flow_control_window(sid) - overhead,
                            self.conn.max_outbound_frame_size - overhead,
                            len(o.data) - o.offset)
                    if n <= 0:
                        break
                    self.conn.send_data(sid, bytes(o.data[o.offset:o.offset + n]),
                                        pad_length=o.pad)
                    o.offset += n
                if o.offset >= len(o.data):
                    o.data, o.offset = bytearray(), 0
                    if o.finish:
                        if o.trailers is not None:
                            self.conn.send_headers(sid, o.trailers, end_stream=True)
                        else:
                            self.conn.end_stream(sid)
                        del self.outbox[sid]
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
                self.outbox.pop(sid, None)

    def flush(self):
        """Moves h2's output (rewritten if asked) to the socket, as far as it takes it."""
        if self.closed:
            return
        self._pump_bodies()
        data = self.conn.data_to_send()
        if data:
            if self.rewrite is not None:
                data = b"".join(raw_frame(*f) for f in self.rewrite(split_frames(data)))
            self.wbuf += data
        self._try_send()

    def send_raw(self, data):
        """Bytes of our own after everything h2 produced so far."""
        self.flush()
        self.wbuf += data
        self._try_send()

    def send_goaway(self, last, code=0, debug=b""):
        self.goaways_sent.append((last, code))
        self.send_raw(goaway_frame(last, code, debug))

    def _try_send(self):
        while self.wbuf and not self.closed and not self.eof:
            try:
                n = self.sock.send(self.wbuf)
            except BlockingIOError:
                return
            except OSError as e:
                self.io_error = f"send: {e}"
                self.eof = True
                return
            del self.wbuf[:n]

    # Incoming -------------------------------------------------------------

    def _read(self):
        """Reads what is there (bounded), feeds it; False once the peer is gone."""
        for _ in range(16):
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return True
            except OSError as e:
                self.io_error = f"recv: {e}"
                self.eof = True
                return False
            if not data:
                self.eof = True
                return False
            if self.linger_until is None:
                self.receive(data)
        return True

    def receive(self, data):
        for seen, raw in self.sniffer.feed(data):
            if seen is not None:
                self.frames_in.append(seen)
                self.on_frame(seen)
                if seen.type == GOAWAY or (self.drop is not None and self.drop(seen)):
                    continue
            if self.h2_error is not None:
                continue
            try:
                events = self.conn.receive_data(raw)
            except Exception as e:  # noqa: BLE001 - the test reports it
                self.h2_error = f"{type(e).__name__}: {e} (on {seen!r})"
                continue
            for ev in events:
                self.on_event(ev)

    def on_frame(self, seen):
        pass

    def on_event(self, ev):
        pass

    def step(self, timeout):
        """One round of I/O: waits at most `timeout` for the socket."""
        if self.linger_until is not None and time.monotonic() >= self.linger_until:
            self.close()
        self.flush()
        if self.closed:
            threading.Event().wait(timeout)
            return
        r = [] if self.eof else [self.sock]
        w = [self.sock] if (self.wbuf and not self.eof) else []
        if not r and not w:
            threading.Event().wait(timeout)
            return
        rr, ww, _ = select.select(r, w, [], timeout)
        if ww:
            self._try_send()
        if rr:
            self._read()
        self.flush()

    def close(self):
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass

    def linger_close(self, seconds=1.0):
        """Closes as servers do once their streams are done (a lingering
        close): FIN first, then whatever the peer still sends (its
        WINDOW_UPDATEs) is read and dropped until it closes too, or for
        `seconds`. A bare close() with unread bytes sends RST instead of FIN,
        and the peer's kernel may then drop data it had not read yet: lost
        before any proxy could see it, which no proxy can be held to."""
        if self.closed or self.linger_until is not None:
            return
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close()
            return
        self.linger_until = time.monotonic() + seconds

    # Reading the record -----------------------------------------------------

    def frames(self, ftype):
        return [f for f in self.frames_in if f.type == ftype]

    def goaways(self):
        return [f.goaway() for f in self.frames(GOAWAY) if f.length >= 8]


# --- the client ------------------------------------------------------------

class StreamState:
    """What a client saw of one stream."""

    def __init__(self, sid):
        self.sid = sid
        self.headers = None
        self.data = bytearray()
        self.trailers = None
        self.ended = False          # END_STREAM received
        self.reset = None           # RST_STREAM code received
        self.reset_by_me = False
        self.lost = False           # the connection ended first
        self.above_goaway = False   # above a GOAWAY's last-stream-id: not processed

    @property
    def done(self):
        return self.ended or self.reset is not None or self.lost or self.refused_by_goaway

    @property
    def refused_by_goaway(self):
        """Unanswered and above a GOAWAY's last-stream-id: RFC 9113 §6.8 says
        it was not processed; clients (nghttp2, Envoy) close it as refused."""
        return self.above_goaway and self.headers is None and not self.ended

    def status(self):
        return dict(self.headers or []).get(":status")

    def grpc_status(self):
        """From the trailers, or from a trailers-only response."""
        if self.trailers is not None:
            return dict(self.trailers).get("grpc-status")
        if self.ended and self.headers is not None:
            return dict(self.headers).get("grpc-status")
        return None

    def trailers_only(self):
        return self.ended and self.trailers is None and not self.data and self.headers is not None

    def __repr__(self):
        return (f"stream {self.sid}: status={self.status()} bytes={len(self.data)} "
                f"ended={self.ended} reset={err_name(self.reset) if self.reset is not None else None} "
                f"lost={self.lost} above_goaway={self.above_goaway} grpc-status={self.grpc_status()} headers={self.headers} trailers={self.trailers}")


class Client(Endpoint):
    """An h2 client connection to `addr`, driven by the caller's thread."""

    def __init__(self, addr, settings=None, conn_window=None, name="client"):
        sock = socket.create_connection(addr, timeout=5)
        super().__init__(sock, server=False, name=name)
        self.streams = {}
        self.pings_in = []
        self.acks_in = []
        initial = {S.ENABLE_PUSH: 0, S.MAX_CONCURRENT_STREAMS: 100,
                   S.MAX_HEADER_LIST_SIZE: self.conn.DEFAULT_MAX_HEADER_LIST_SIZE}
        initial.update(settings or {})
        # The client's first SETTINGS carry these, and h2 holds the peer to
        # them from the start: nothing reaches the client before them.
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values=initial)
        self.conn.max_inbound_frame_size = self.conn.local_settings.max_frame_size
        self.conn.initiate_connection()
        if conn_window:
            self.conn.increment_flow_control_window(conn_window)
        self.flush()

    def on_frame(self, seen):
        if seen.type == RST_STREAM and seen.stream in self.streams and seen.length == 4:
            st = self.streams[seen.stream]
            if st.reset is None and not st.ended:
                st.reset = seen.rst_code()
        elif seen.type == GOAWAY and seen.length >= 8:
            last = seen.goaway()[0]
            for st in self.streams.values():
                if st.sid > last:
                    st.above_goaway = True

    def on_event(self, ev):
        sid = getattr(ev, "stream_id", None)
        st = self.streams.get(sid) if sid else None
        if isinstance(ev, h2.events.ResponseReceived) and st:
            st.headers = list(ev.headers)
        elif isinstance(ev, h2.events.InformationalResponseReceived):
            pass
        elif isinstance(ev, h2.events.DataReceived):
            if st:
                st.data += ev.data
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.TrailersReceived) and st:
            st.trailers = list(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded) and st:
            st.ended = True
        elif isinstance(ev, h2.events.StreamReset) and st:
            if st.reset is None and not st.ended:
                st.reset = ev.error_code
        elif isinstance(ev, h2.events.PingReceived):
            self.pings_in.append(ev.ping_data)
        elif isinstance(ev, h2.events.PingAckReceived):
            self.acks_in.append(ev.ping_data)
        elif isinstance(ev, h2.events.SettingsAcknowledged):
            ch = ev.changed_settings.get(S.INITIAL_WINDOW_SIZE)
            if ch is not None and ch.new_value < ch.original_value:
                self._top_up_stream_windows()

    def _top_up_stream_windows(self):
        """python-h2 4.4.1 stalls a stream whose INITIAL_WINDOW_SIZE we lower
        while data is unacknowledged: the window goes negative and it only
        ever returns the bytes processed since, so the window never gets back
        above 0 and no more DATA arrives to trigger an update. Grant each open
        stream's window back up to the new size (always legal, §6.9)."""
        for sid, stream in list(self.conn.streams.items()):
            wm = stream._inbound_window_manager
            gap = wm.max_window_size - wm.current_window_size
            if gap <= 0:
                continue
            try:
                self.conn.increment_flow_control_window(gap, stream_id=sid)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                continue
            wm._bytes_processed = 0

    def step(self, timeout):
        super().step(timeout)
        if self.eof:
            for st in self.streams.values():
                if not st.done:
                    st.lost = True

    # Requests ------------------------------------------------------------

    def request(self, method, path, headers=(), body=None, end=True, trailers=None,
                pad=None, **h2_kwargs):
        """Opens a stream; returns its id. A body is sent as windows allow."""
        sid = self.conn.get_next_available_stream_id()
        self.streams[sid] = StreamState(sid)
        hdrs = [(":method", method), (":scheme", "http"), (":authority", "guard.test"),
                (":path", path), *headers]
        no_body = body is None and trailers is None
        self.conn.send_headers(sid, hdrs, end_stream=end and no_body, **h2_kwargs)
        if not no_body:
            self.send_body(sid, body or b"", end=end, trailers=trailers, pad=pad)
        self.flush()
        return sid

    def get(self, path, headers=()):
        return self.request("GET", path, headers)

    def grpc(self, method, message=b"", headers=(), end=True):
        """A gRPC call: one request message."""
        return self.request("POST", f"/{method}",
                            [("content-type", "application/grpc"), ("te", "trailers"), *headers],
                            body=grpc_message(message), end=end)

    def reset_stream(self, sid, code=E.CANCEL):
        self.streams[sid].reset_by_me = True
        self.conn.reset_stream(sid, code)
        self.flush()

    def stream(self, sid):
        return self.streams[sid]

    # Waiting ---------------------------------------------------------------

    def wait(self, pred, timeout, what):
        wait_until(pred, timeout, what, step=self.step, describe=self.describe)

    def wait_done(self, sids, timeout, what="streams to end"):
        self.wait(lambda: all(self.streams[s].done for s in sids), timeout,
                  f"{what} ({', '.join(map(str, sids))})")

    def pump_for(self, seconds):
        """Keeps the connection serviced for `seconds` (for asserting that
        something does NOT happen within a time)."""
        d = Deadline(seconds)
        while not d.expired():
            self.step(min(0.05, d.remaining()))

    def describe(self, frames=40):
        lines = [f"{self.name}: eof={self.eof} io_error={self.io_error} h2_error={self.h2_error}"]
        lines += [f"  {st!r}"[:600] for st in self.streams.values()]
        lines.append(f"  GOAWAYs received: {[(l, err_name(c), d[:60]) for l, c, d in self.goaways()]}")
        tail = self.frames_in[-frames:]
        lines.append(f"  last {len(tail)} of {len(self.frames_in)} frames received: {tail}")
        return "\n".join(lines)


# --- a client of raw frames ------------------------------------------------

def hpack_int(value, prefix, mask=0):
    """An HPACK integer with a `prefix`-bit prefix (RFC 7541 §5.1)."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes([mask | value])
    out, value = bytearray([mask | top]), value - top
    while value >= 128:
        out.append(value % 128 | 0x80)
        value //= 128
    return bytes(out + bytes([value]))


def hpack_literal(name, value):
    """One field as an HPACK literal without indexing, name and value as
    plain strings (RFC 7541 §6.2.2): it touches no dynamic table, so a test
    can put any bytes in a header block (an uppercase name, a second
    `:path`) without the encoder's validation or state."""
    name = name.encode() if isinstance(name, str) else name
    value = value.encode() if isinstance(value, str) else value
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def literal_block(fields):
    return b"".join(hpack_literal(n, v) for n, v in fields)


def request_fields(path, method="GET", extra=()):
    return [(":method", method), (":scheme", "http"), (":authority", "guard.test"),
            (":path", path), *extra]


class RawClient:
    """A client that writes frames by hand (hyperframe, or raw bytes where a
    frame must be wrong) and records every frame the guard sends, exactly as
    it came. Nothing it receives is validated: a test sends what no
    conformant client would and asserts on the exact answer. It acks the
    guard's SETTINGS and PINGs, decodes the response header blocks (RFC 7541,
    the `hpack` package) and never sends WINDOW_UPDATE: its answers are
    small."""

    def __init__(self, addr, settings=None, preface=True, name="raw"):
        self.name = name
        self.sock = socket.create_connection(addr, timeout=5)
        self.sock.setblocking(False)
        self.sniffer = Sniffer(server=False)
        self.frames_in = []
        self.wbuf = bytearray()
        self.rbytes = bytearray()   # everything received, for a non-HTTP/2 answer
        self.eof = False
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.block = None           # (stream, fragments) of a header block in progress
        self.heads = {}             # stream -> [header list, ...]
        self.data = {}              # stream -> bytes
        if preface:
            payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
            self.send(PREFACE + raw_frame(SETTINGS, 0, 0, payload))

    # Sending ---------------------------------------------------------------

    def send(self, *chunks):
        for c in chunks:
            self.wbuf += c
        self._flush()

    def _flush(self):
        while self.wbuf and not self.eof:
            try:
                n = self.sock.send(self.wbuf)
            except BlockingIOError:
                return
            except OSError:
                self.eof = True
                return
            del self.wbuf[:n]

    def headers(self, sid, fields, end_stream=True, end_headers=True, block=None, flags=0):
        """A HEADERS frame: `fields` encoded by the client's HPACK encoder
        (it indexes, as clients do), or `block` as it is."""
        block = self.encoder.encode(fields) if block is None else block
        flags |= (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
        return HeadersFrame(sid, data=block, flags=frame_flags(flags)).serialize()

    def request(self, sid, path, method="GET", extra=(), end_stream=True):
        return self.headers(sid, request_fields(path, method, extra), end_stream=end_stream)

    def data_frame(self, sid, data, end_stream=False):
        return DataFrame(sid, data=data, flags=["END_STREAM"] if end_stream else []).serialize()

    # Receiving -------------------------------------------------------------

    def step(self, timeout):
        self._flush()
        if self.eof:
            threading.Event().wait(timeout)
            return
        w = [self.sock] if self.wbuf else []
        r, ww, _ = select.select([self.sock], w, [], timeout)
        if ww:
            self._flush()
        if not r:
            return
        for _ in range(16):
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                self.eof = True
                return
            if not data:
                self.eof = True
                return
            self.rbytes += data
            if self.rbytes.startswith(b"HTTP/"):
                continue   # an HTTP/1.1 answer: not frames
            for seen, _ in self.sniffer.feed(data):
                self.frames_in.append(seen)
                self._on_frame(seen)

    def _on_frame(self, f):
        if f.type == SETTINGS and not f.ack:
            self.send(raw_frame(SETTINGS, ACK, 0))
        elif f.type == PING and not f.ack and f.length == 8:
            self.send(raw_frame(PING, ACK, 0, f.payload))
        elif f.type in (HEADERS, CONTINUATION):
            block = f.payload
            if f.type == HEADERS:
                if f.flags & PADDED:
                    block = block[1:len(block) - block[0]]
                if f.flags & PRIORITY_FLAG:
                    block = block[5:]
                self.block = (f.stream, bytearray())
            if self.block is None:
                return
            self.block[1].extend(block)
            if f.flags & END_HEADERS:
                sid, whole = self.block
                self.block = None
                self.heads.setdefault(sid, []).append(self.decoder.decode(bytes(whole)))
        elif f.type == DATA:
            body = f.payload
            if f.flags & PADDED:
                body = body[1:len(body) - body[0]]
            self.data[f.stream] = self.data.get(f.stream, b"") + body

    def wait(self, pred, timeout, what):
        wait_until(pred, timeout, what, step=self.step, describe=self.describe)

    def frames(self, ftype, sid=None):
        return [f for f in self.frames_in if f.type == ftype and (sid is None or f.stream == sid)]

    def goaways(self):
        return [f.goaway() for f in self.frames(GOAWAY) if f.length >= 8]

    def resets(self, sid):
        return [f.rst_code() for f in self.frames(RST_STREAM, sid) if f.length == 4]

    def ended(self, sid):
        """The guard ended stream `sid` (END_STREAM or RST_STREAM)."""
        return any(f.stream == sid and (f.end_stream or f.type == RST_STREAM)
                   for f in self.frames_in)

    def status(self, sid):
        heads = self.heads.get(sid) or [[]]
        return dict(heads[0]).get(":status")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def describe(self):
        return (f"{self.name}: eof={self.eof} GOAWAYs {[(l, err_name(c)) for l, c, _ in self.goaways()]}\n"
                f"  frames received: {self.frames_in[-40:]}\n"
                f"  bytes received: {bytes(self.rbytes[:120])!r}")


def frame_flags(bits):
    """hyperframe's flag names for a HEADERS frame's flag bits."""
    names = {END_STREAM: "END_STREAM", END_HEADERS: "END_HEADERS", PADDED: "PADDED",
             PRIORITY_FLAG: "PRIORITY"}
    return [n for b, n in names.items() if bits & b]


# --- the application -----------------------------------------------------

class AppRequest:
    """A request as the app received it."""

    def __init__(self, conn, sid, headers):
        self.conn, self.sid = conn, sid
        self.headers = list(headers)
        self.h = dict(self.headers)
        self.path = self.h.get(":path", "")
        self.body = bytearray()
        self.ended = False      # END_STREAM received
        self.reset = None       # RST_STREAM code received
        self.answered = False   # we sent END_STREAM
        self.ignored = False    # above our final GOAWAY: never processed
        self.t = time.monotonic()

    @property
    def done(self):
        return self.reset is not None or (self.ended and self.answered) or self.ignored

    @property
    def call(self):
        """The test's label for the call (header x-call)."""
        return self.h.get("x-call")

    def __repr__(self):
        return (f"app-request s={self.sid} {self.path} call={self.call} body={len(self.body)} "
                f"ended={self.ended} answered={self.answered} ignored={self.ignored} "
                f"reset={err_name(self.reset) if self.reset is not None else None}")


def grpc_tick(seq):
    return grpc_message(b"tick %08d " % seq + b"x" * 18)


class AppConn(Endpoint):
    """One connection of the app: an h2 server in its own thread."""

    def __init__(self, app, sock, index):
        super().__init__(sock, server=True, name=f"app-conn-{index}")
        self.app = app
        self.index = index
        self.requests = {}
        self.calls = queue.Queue()
        self.timers = []          # heap of (when, seq, fn)
        self.timer_seq = 0
        self.preface = False
        self.highest_in = 0
        self.final_last = None    # last-stream-id of our final GOAWAY
        self.answer_held = False  # held calls are answered as they come
        self.acks_in = []
        self.ping_waiters = {}    # PING payload -> fn(self) on its ack
        self.stopping = False
        self.conn.initiate_connection()
        if app.settings:
            self.conn.update_settings(app.settings)
        if app.conn_window:
            self.conn.increment_flow_control_window(app.conn_window)
        self.flush()

    # Scheduling (from any thread) ---------------------------------------

    def call(self, fn):
        """Runs fn(self) on this connection's thread."""
        self.calls.put(fn)

    def after(self, seconds, fn):
        """Runs fn(self) after `seconds` (connection thread only)."""
        self.timer_seq += 1
        heapq.heappush(self.timers, (time.monotonic() + seconds, self.timer_seq, fn))

    def run(self):
        try:
            while not self.stopping and not self.closed:
                while True:
                    try:
                        fn = self.calls.get_nowait()
                    except queue.Empty:
                        break
                    fn(self)
                now = time.monotonic()
                while self.timers and self.timers[0][0] <= now:
                    _, _, fn = heapq.heappop(self.timers)
                    fn(self)
                timeout = 0.05
                if self.timers:
                    timeout = max(0.0, min(timeout, self.timers[0][0] - time.monotonic()))
                self.step(timeout)
                self.maybe_finish_shutdown()
                self.app.notify()
                if self.eof and not self.wbuf:
                    break
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.app.errors.append(f"{self.name}: {type(e).__name__}: {e}")
            raise
        finally:
            self.close()
            self.app.notify()

    # Incoming --------------------------------------------------------------

    def on_frame(self, seen):
        if seen.stream % 2 == 1 and seen.type in (HEADERS, DATA):
            self.highest_in = max(self.highest_in, seen.stream)
        if not self.preface:
            self.preface = True
            self.app.add_conn(self)

    def on_event(self, ev):
        sid = getattr(ev, "stream_id", None)
        req = self.requests.get(sid) if sid else None
        if isinstance(ev, h2.events.RequestReceived):
            req = AppRequest(self, ev.stream_id, ev.headers)
            self.requests[ev.stream_id] = req
            self.app.add_request(req)
            if self.final_last is not None and ev.stream_id > self.final_last:
                req.ignored = True   # RFC 9113 §6.8: not processed
                return
            self.app.dispatch(self, req, "headers")
            if ev.stream_ended is not None:
                req.ended = True
                self.app.dispatch(self, req, "end")
        elif isinstance(ev, h2.events.DataReceived):
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if req and not req.ignored:
                req.body += ev.data
                self.app.dispatch(self, req, "data", ev.data)
        elif isinstance(ev, h2.events.StreamEnded) and req and not req.ended:
            req.ended = True
            if not req.ignored:
                self.app.dispatch(self, req, "end")
        elif isinstance(ev, h2.events.StreamReset) and req:
            req.reset = ev.error_code
            self.outbox.pop(ev.stream_id, None)
        elif isinstance(ev, h2.events.PingAckReceived):
            self.acks_in.append(ev.ping_data)
            waiter = self.ping_waiters.pop(ev.ping_data, None)
            if waiter:
                waiter(self)
        self.maybe_finish_shutdown()

    # Answers (connection thread) -----------------------------------------

    def respond(self, req, headers, body=b"", end=True, trailers=None):
        if req.reset is not None or self.closed:
            return
        self.conn.send_headers(req.sid, headers, end_stream=(end and not body and trailers is None))
        if body or trailers is not None:
            self.send_body(req.sid, body, end=end, trailers=trailers)
        if end:
            req.answered = True
        self.flush()

    def answer_grpc(self, req, message, status=0):
        if req.answered or req.reset is not None:
            return
        self.respond(req, [(":status", "200"), ("content-type", "application/grpc")],
                     grpc_message(message), trailers=[("grpc-status", str(status))])

    # A graceful shutdown like grpc servers do ------------------------------

    def graceful_shutdown(self, answer_after=1.0, grace=10.0):
        """GOAWAY(2^31-1) + PING; on the ack (or after 2 s) GOAWAY(highest
        stream received); held calls answered `answer_after` later; the
        socket closed once every processed stream is done, or after `grace`."""
        self.shutdown_started = time.monotonic()
        self.ping_waiters[b"appdown1"] = lambda c: c._final_goaway(answer_after)
        self.send_goaway(MAX_STREAM_ID)
        self.send_raw(ping_frame(b"appdown1"))
        self.after(2.0, lambda c: c._final_goaway(answer_after))
        self.after(grace, lambda c: c.close())

    def _final_goaway(self, answer_after):
        if self.final_last is not None:
            return
        self.final_last = self.highest_in
        self.send_goaway(self.final_last)
        self.app.notify()
        self.after(answer_after, lambda c: c._answer_all_held())

    def _answer_all_held(self):
        self.answer_held = True
        for req in self.requests.values():
            if not req.ignored and req.ended and req.path.endswith("/Hold"):
                self.answer_grpc(req, b"answer:" + (req.call or "").encode())

    def maybe_finish_shutdown(self):
        if self.final_last is None or self.closed or self.linger_until is not None:
            return
        if all(r.done for r in self.requests.values()):
            self.flush()
            if not self.outbox and not self.wbuf:
                self.linger_close()


class App:
    """The application: an h2 server on 127.0.0.1:0.

    Routes (by path), each answered on the connection's thread:
      GET  /bytes?n=N&seed=S     N bytes of pattern(N, S)
      POST /sha                  {"len": .., "sha256": ..} of the body
      POST /echo                 the body back, as it arrives
      GET  /headers              200, headers x-echo (x-probe's value) and x-big
      POST /<svc>/Ticks          gRPC: a message every 100 ms until the stream ends
      POST /<svc>/Hold           gRPC: held; answered by the test (or a shutdown)
      GET  /hold                 held; never answered
    A test adds its own with `route(prefix, fn)`: fn(conn, req, event, data)
    with event "headers", "data" or "end"."""

    def __init__(self, settings=None, conn_window=None):
        self.settings = settings or {}
        self.conn_window = conn_window
        self.routes = []
        self.conns = []
        self.requests = []
        self.errors = []
        self.cond = threading.Condition()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.addr = self.listener.getsockname()
        self.stop = threading.Event()
        self.accepting = True
        self.threads = []
        self.accepted = 0
        self.all_conns = []

    def start(self):
        t = threading.Thread(target=self._accept_loop, name="app-accept", daemon=True)
        t.start()
        self.threads.append(t)
        return self

    def _accept_loop(self):
        # Bounded: at most 256 connections, and it stops with the app.
        while not self.stop.is_set() and self.accepted < 256:
            try:
                r, _, _ = select.select([self.listener], [], [], 0.1)
            except (OSError, ValueError):
                return
            if not r or not self.accepting:
                continue
            try:
                sock, _ = self.listener.accept()
            except OSError:
                continue
            self.accepted += 1
            conn = AppConn(self, sock, self.accepted)
            t = threading.Thread(target=conn.run, name=conn.name, daemon=True)
            t.start()
            self.threads.append(t)
            # Connections that never send a preface (readiness probes) are
            # not listed in self.conns.
            self.all_conns.append(conn)

    def stop_accepting(self):
        """Closes the listener, as a server that shuts down does."""
        self.accepting = False
        try:
            self.listener.close()
        except OSError:
            pass

    def close(self):
        self.stop.set()
        self.stop_accepting()
        for c in self.all_conns:
            c.stopping = True
        for t in self.threads:
            t.join(timeout=5)
        for c in self.all_conns:
            c.close()

    # Record ---------------------------------------------------------------

    def notify(self):
        with self.cond:
            self.cond.notify_all()

    def add_conn(self, conn):
        with self.cond:
            self.conns.append(conn)
            self.cond.notify_all()

    def add_request(self, req):
        with self.cond:
            self.requests.append(req)
            self.cond.notify_all()

    def find(self, call=None, path=None):
        """Requests with x-call `call` (or whose path ends with `path`)."""
        return [r for r in list(self.requests)
                if (call is None or r.call == call) and (path is None or r.path.endswith(path))]

    def wait(self, pred, timeout, what):
        def step(t):
            with self.cond:
                self.cond.wait(t)
        wait_until(pred, timeout, what, step=step, describe=self.describe)

    def h2_errors(self):
        return [f"{c.name}: {c.h2_error}" for c in list(self.conns) if c.h2_error] + self.errors

    def describe(self):
        lines = [f"app: {len(self.conns)} h2 connections, errors={self.h2_errors()}"]
        for c in list(self.conns):
            lines.append(f"  {c.name}: eof={c.eof} closed={c.closed} goaways sent={c.goaways_sent} "
                         f"received={[(l, err_name(k)) for l, k, _ in c.goaways()]}")
            lines += [f"    {r!r}" for r in list(c.requests.values())]
        return "\n".join(lines)

    # Routing (connection thread) ---------------------------------------------

    def route(self, prefix, fn):
        self.routes.insert(0, (prefix, fn))

    def dispatch(self, conn, req, event, data=None):
        path = req.path.split("?")[0]
        for prefix, fn in self.routes:
            if path.startswith(prefix):
                fn(conn, req, event, data)
                return
        default_route(conn, req, event, data)


def query(path):
    q = path.split("?", 1)[1] if "?" in path else ""
    return dict(kv.split("=", 1) for kv in q.split("&") if "=" in kv)


def default_route(conn, req, event, data):
    path = req.path.split("?")[0]
    if path == "/bytes" and event == "end":
        q = query(req.path)
        conn.respond(req, [(":status", "200")], pattern(int(q["n"]), int(q.get("seed", 0))))
    elif path == "/sha" and event == "end":
        body = json.dumps({"len": len(req.body),
                           "sha256": hashlib.sha256(req.body).hexdigest()}).encode()
        conn.respond(req, [(":status", "200"), ("content-type", "application/json")], body)
    elif path == "/echo":
        if event == "headers":
            conn.respond(req, [(":status", "200")], end=False)
        elif event == "data":
            conn.send_body(req.sid, data, end=False)
        elif event == "end":
            conn.send_body(req.sid, b"", end=True)
            req.answered = True
    elif path == "/headers" and event == "end":
        conn.respond(req, [(":status", "200"), ("x-echo", req.h.get("x-probe", "")),
                           ("x-big", "b" * 300)], b"ok")
    elif path.endswith("/Ticks") and event == "headers":
        conn.respond(req, [(":status", "200"), ("content-type", "application/grpc")], end=False)
        seq = [0]

        def tick(c):
            if req.reset is not None or c.closed or c.eof or req.answered:
                return
            c.send_body(req.sid, grpc_tick(seq[0]), end=False)
            seq[0] += 1
            c.after(0.1, tick)
        tick(conn)
    elif path.endswith("/Hold") and event == "end":
        if conn.answer_held:
            conn.answer_grpc(req, b"answer:" + (req.call or "").encode())
    elif path == "/hold":
        pass
    elif event == "end" and not req.answered and not any(
            path == p or path.endswith(p) for p in ("/echo", "/Ticks", "/Hold", "/hold")):
        conn.respond(req, [(":status", "404")], b"no route\n")


# --- applications that are not there, or do not speak HTTP/2 -------------------

class NoApp:
    """No application: a port on 127.0.0.1 that nothing listens on (bound
    to be free, then closed), as while a pod's app has not started yet."""

    def start(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        self.addr = s.getsockname()
        s.close()
        return self

    def close(self):
        pass

    def h2_errors(self):
        return []

    def describe(self):
        return f"no app (nothing listens on {self.addr})"


class Http1App:
    """An application that only speaks HTTP/1.1: Python's `http.server`,
    serving no route. HTTP/2's preface reaches it as a request line for
    HTTP/2.0, which it answers 505 before it closes."""

    def start(self):
        self.requests = []
        app = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_request(self, code="-", size="-"):
                app.requests.append((self.requestline, code))

            def log_message(self, format, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.addr = self.server.server_address
        self.thread = threading.Thread(target=self.server.serve_forever, name="http1-app",
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def h2_errors(self):
        return []

    def describe(self):
        return f"HTTP/1.1 app at {self.addr}: requests {self.requests[-10:]}"


# --- the guard -------------------------------------------------------------

# A drain that fits a test: no deregistration delay, streams ended within 4 s.
DRAIN_FLAGS = ["--deregistration-delay", "0s", "--drain-time", "4s", "--min-drain-time", "0s",
               "--parent-shutdown-time", "6s", "--termination-grace-period", "8s",
               "--linger", "0s"]


class Guard:
    """The real `drainshim sidecar` with its stream guard in front of `upstream`."""

    # DRAINSHIM_TEST_LOG replaces it, to look into a failure.
    LOG = os.environ.get("DRAINSHIM_TEST_LOG") or "warn,drainshim::sidecar=info,drainshim::drain=info"

    def __init__(self, binary, upstream, extra_args=(), log=LOG):
        args = [binary, "sidecar", "--listen", "127.0.0.1:0",
                "--envoy-admin", "http://127.0.0.1:9",
                "--guard-listen", "127.0.0.1:0",
                "--guard-upstream", f"{upstream[0]}:{upstream[1]}",
                "--log", log,
                *DRAIN_FLAGS, *extra_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAINSHIM_")}
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, env=env)
        self.reader = threading.Thread(target=self._read, name="guard-stderr", daemon=True)
        self.reader.start()
        self.addr = self._wait_addr(r"guard_listen=Some\((127\.0\.0\.1):(\d+)\)", "guard_listen")
        self.admin = self._wait_addr(r"sidecar ready listen=(127\.0\.0\.1):(\d+)", "listen")

    def _read(self):
        for line in iter(self.proc.stderr.readline, b""):
            with self.cond:
                self.lines.append(line.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _wait_addr(self, regex, what):
        d = Deadline(30)
        with self.cond:
            while True:
                for line in self.lines:
                    m = re.search(regex, line)
                    if m:
                        return m.group(1), int(m.group(2))
                if self.proc.poll() is not None and not self.reader.is_alive():
                    raise AssertionError(f"drainshim exited with {self.proc.returncode} before "
                                         f"printing {what}:\n{self.log()}")
                if d.expired():
                    raise AssertionError(f"drainshim printed no {what} within 30 s:\n{self.log()}")
                self.cond.wait(min(0.1, d.remaining()))

    def alive(self):
        return self.proc.poll() is None

    def log(self, tail=60):
        with self.cond:
            return "\n".join(self.lines[-tail:])

    def drain(self):
        """POST /drain on the sidecar's control endpoint: starts a drain."""
        c = http.client.HTTPConnection(*self.admin, timeout=5)
        try:
            c.request("POST", "/drain")
            r = c.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            c.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        finally:
            self.reader.join(timeout=5)
            if self.proc.stderr:
                self.proc.stderr.close()
