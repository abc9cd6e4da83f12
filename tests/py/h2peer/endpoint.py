"""An HTTP/2 endpoint over a socket (python-h2), the part the client and
the app share: sending bodies within the flow-control windows, sniffing
what arrives, and GOAWAY sent raw (python-h2 takes any GOAWAY as the end of
the connection, while a graceful one lets open streams finish)."""

import select
import socket
import threading
import time

import h2.config
import h2.connection
import h2.exceptions

from .frames import GOAWAY, Sniffer, goaway_frame, raw_frame, split_frames


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
