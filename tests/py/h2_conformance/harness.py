"""What every section of the conformance suite shares: the rig (an app, the
guard in front of it, the clients of one test), the checks a conformant peer
must pass, and the raw frames the guard's own answers are probed with."""
import json
import os
import struct

from h2peer import (
    E, PRIORITY, RST_STREAM, SETTINGS, WINDOW_UPDATE, App, Client, Guard, RawClient, assert_bytes,
    err_name, grpc_message, literal_block, pattern, raw_frame, request_fields,
)


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
BIN = os.environ.get("DRAINSHIM_BIN") or os.path.join(ROOT, "target", "debug", "drainshim")
MB = 1 << 20

# Seconds the guard has to answer a frame it must refuse, and to close.
DEADLINE = 5

# RST_STREAM codes a client may get without anything having gone wrong.
GRACEFUL_RST = {E.NO_ERROR, E.REFUSED_STREAM, E.CANCEL}

# Connection error codes that would blame the client for the app's fault.
BLAMES_CLIENT = {E.PROTOCOL_ERROR, E.FRAME_SIZE_ERROR, E.FLOW_CONTROL_ERROR,
                 E.COMPRESSION_ERROR, E.STREAM_CLOSED}


class Rig:
    """An app, the guard in front of it, and the clients of one test."""

    def __init__(self):
        self.app = None
        self.guard = None
        self.clients = []
        self.raws = []

    def start(self, app=None, guard_args=(), log=Guard.LOG):
        self.app = (app or App()).start()
        self.guard = Guard(BIN, self.app.addr, guard_args, log)
        return self.app

    def client(self, **kw):
        c = Client(self.guard.addr, name=f"client-{len(self.clients) + 1}", **kw)
        self.clients.append(c)
        return c

    def raw(self, settings=None, preface=True, handshake=True):
        """A client of raw frames (h2peer.RawClient); with `handshake`, once
        the guard's SETTINGS came and the client's were acked."""
        c = RawClient(self.guard.addr, settings=settings, preface=preface,
                      name=f"raw-{len(self.raws) + 1}")
        self.raws.append(c)
        if handshake:
            c.wait(lambda: c.frames(SETTINGS) and any(f.ack for f in c.frames(SETTINGS)),
                   DEADLINE, "the guard's SETTINGS and its ack of the client's")
        return c

    def close(self):
        for c in self.clients + self.raws:
            c.close()
        if self.guard is not None:
            self.guard.stop()   # kills it and waits for the exit
        if self.app is not None:
            self.app.close()

    def describe(self):
        parts = [c.describe() for c in self.clients + self.raws]
        if self.app is not None:
            parts.append(self.app.describe())
        if self.guard is not None:
            parts.append(f"guard alive={self.guard.alive()}, log tail:\n"
                         + self.guard.log(30))
        return "\n".join(parts)


def assert_sane(rig):
    """The guard still runs and never sent either peer a frame h2 rejects."""
    assert rig.guard.alive(), f"the guard exited ({rig.guard.proc.returncode}):\n{rig.guard.log()}"
    for c in rig.clients:
        assert c.h2_error is None, f"{c.name} got an invalid frame: {c.h2_error}\n{c.describe()}"
    assert not rig.app.h2_errors(), f"the app got invalid frames: {rig.app.h2_errors()}"


def assert_no_connection_error(c):
    assert c.h2_error is None, f"{c.name} got an invalid frame: {c.h2_error}\n{c.describe()}"
    bad = [(last, err_name(code)) for last, code, _ in c.goaways() if code != E.NO_ERROR]
    assert not bad, f"{c.name} got GOAWAY with an error: {bad}\n{c.describe()}"


def assert_goaway_ids_never_grow(c):
    ids = [last for last, _, _ in c.goaways()]
    assert all(b <= a for a, b in zip(ids, ids[1:])), (
        f"GOAWAY last-stream-ids must never increase (RFC 9113 §6.8); {c.name} got {ids}")


def assert_only_graceful_resets(c):
    bad = [f for f in c.frames(RST_STREAM)
           if f.length == 4 and f.rst_code() not in GRACEFUL_RST
           and not (f.stream in c.streams and c.streams[f.stream].reset_by_me)]
    assert not bad, f"{c.name} got RST_STREAM with an error on its own streams: {bad}"


def assert_clean(rig, *clients):
    """Nothing went wrong at all: no GOAWAY, no RST_STREAM."""
    assert_sane(rig)
    for c in clients:
        assert_no_connection_error(c)
        assert not c.goaways(), f"{c.name} got GOAWAY: {c.goaways()}"
        resets = c.frames(RST_STREAM)
        assert not resets, f"{c.name} got RST_STREAM: {resets}"


def assert_complete(st, body, what):
    assert st.ended and st.reset is None, f"{what} did not complete: {st!r}"[:2000]
    assert st.status() == "200", f"{what}: status {st.status()}: {st!r}"[:2000]
    assert_bytes(st.data, body, what)


def assert_grpc_ok(st, message, what):
    assert st.ended and st.reset is None, f"{what} did not complete: {st!r}"
    assert st.status() == "200" and st.grpc_status() == "0", f"{what}: {st!r}"
    assert bytes(st.data) == grpc_message(message), f"{what}: body {bytes(st.data)[:80]!r}"


def retryable_end(st):
    """REFUSED_STREAM, a trailers-only response with grpc-status 14, or no
    answer on a stream above a GOAWAY's last-stream-id (RFC 9113 §6.8: not
    processed, safe to retry)."""
    return (st.reset == E.REFUSED_STREAM
            or (st.trailers_only() and st.grpc_status() == "14")
            or st.refused_by_goaway)


def sha_answer(st):
    assert st.ended and st.status() == "200", f"/sha did not answer: {st!r}"
    return json.loads(bytes(st.data))


def app_frames(app):
    """Every frame the app received, on every connection."""
    return [f for k in list(app.all_conns) for f in list(k.frames_in)]


def assert_connection_error(rig, c, code, offending, what):
    """`what` is a connection error of type `code` (RFC 9113 §5.4.1): one
    GOAWAY with that code, then the close, within DEADLINE; the app's
    connection is closed too, and none of the frames it got matches
    `offending`."""
    c.wait(lambda: c.goaways() and c.eof, DEADLINE, f"GOAWAY({err_name(code)}) and the close")
    codes = [err_name(x) for _, x, _ in c.goaways()]
    assert codes == [err_name(code)], f"{what}: want GOAWAY({err_name(code)}), got {codes}"
    rig.app.wait(lambda: all(k.eof or k.closed for k in list(rig.app.all_conns)), DEADLINE,
                 "the guard to close the app's connection")
    assert_app_never_saw(rig, offending, what)


def assert_stream_error(rig, c, sid, code, offending, what, probe_sid, connection_ok=False):
    """`what` is a stream error of type `code` on `sid` (RFC 9113 §5.4.2):
    RST_STREAM with that code within DEADLINE (or, where §5.1 lets it be a
    connection error and `connection_ok`, GOAWAY with it). The connection
    then still serves a request on `probe_sid`; the app got that request
    after anything sent before it, and none of its frames matches
    `offending`."""
    c.wait(lambda: c.resets(sid) or c.goaways(), DEADLINE,
           f"RST_STREAM({err_name(code)}) on stream {sid}")
    if connection_ok and c.goaways():
        return assert_connection_error(rig, c, code, offending, what)
    assert not c.goaways(), f"{what}: a stream error, not GOAWAY {c.goaways()}"
    got = [err_name(x) for x in c.resets(sid)]
    assert got == [err_name(code)], f"{what}: want RST_STREAM({err_name(code)}) on {sid}, got {got}"
    probe(c, probe_sid)
    assert_app_never_saw(rig, offending, what)


def probe(c, sid):
    """A request on stream `sid`: the connection still serves."""
    c.send(c.request(sid, "/bytes?n=10&seed=1"))
    c.wait(lambda: c.ended(sid), DEADLINE, f"the answer to probe stream {sid}")
    assert c.status(sid) == "200" and c.data.get(sid) == pattern(10, 1), (
        f"probe stream {sid}: {c.heads.get(sid)} {c.data.get(sid)!r}\n{c.describe()}")


def assert_app_never_saw(rig, offending, what):
    got = [f for f in app_frames(rig.app) if offending(f)]
    assert not got, f"{what}: the app got the offending frame(s) {got}"


def held(rig, c, sid, end_stream=False):
    """Opens stream `sid` on GET /hold (the app holds it, unanswered) and
    waits until the app has it."""
    c.send(c.request(sid, "/hold", end_stream=end_stream))
    rig.app.wait(lambda: any(r.sid == sid for r in rig.app.find(path="/hold")), DEADLINE,
                 f"stream {sid} at the app")


def answered(c, sid):
    """Stream `sid` asked for 1 byte and answered in full (closed both ways)."""
    c.send(c.request(sid, "/bytes?n=1"))
    c.wait(lambda: c.ended(sid), DEADLINE, f"the answer on stream {sid}")


def is_frame(ftype, sid, marker=None):
    def match(f):
        return f.type == ftype and f.stream == sid and (marker is None or marker in f.payload)
    return match


def rst(sid, code=E.CANCEL):
    return raw_frame(RST_STREAM, 0, sid, struct.pack(">I", code))


def window_update(sid, increment):
    return raw_frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", increment))


def settings(pairs, flags=0):
    return raw_frame(SETTINGS, flags, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def priority(sid, depends_on, weight=16, length=5):
    return raw_frame(PRIORITY, 0, sid, (struct.pack(">IB", depends_on, weight))[:length])


def reserved_bit(frame):
    """`frame` with the reserved bit of its stream id set (RFC 9113 §4.1)."""
    return frame[:5] + bytes([frame[5] | 0x80]) + frame[6:]


MARK = b"x-offending"
BLOCK = literal_block(request_fields("/bytes?n=1") + [(MARK.decode(), "1")])
