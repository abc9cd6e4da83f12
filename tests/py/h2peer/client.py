"""The clients of the guard: `Client`, an h2 connection driven from the
test's own thread (`wait` pumps it until a condition holds or a deadline
passes), and `RawClient`, which writes frames by hand for what python-h2
would refuse to send."""

import select
import socket
import struct
import threading

import h2.events
import h2.exceptions
import h2.settings
import hpack
from hyperframe.frame import DataFrame, HeadersFrame

from .endpoint import Endpoint
from .frames import (
    ACK, CONTINUATION, DATA, E, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PADDED, PING,
    PREFACE, PRIORITY_FLAG, RST_STREAM, S, SETTINGS, Sniffer, err_name, frame_flags,
    grpc_message, raw_frame, request_fields,
)
from .waiting import Deadline, wait_until


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
