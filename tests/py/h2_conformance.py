"""HTTP/2 conformance of the stream guard, against the real `drainshim` binary.

Each test starts an app (python-h2 server, tests/py/h2peer.py), the guard in
front of it (`drainshim sidecar --guard-listen`), and a client
(python-h2, or raw frames where exactness matters), then asserts what an
RFC 9113/7541-conformant peer must see: no connection error, no lost byte,
no wedge. Run: `make conformance` (DRAINSHIM_BIN names the binary).
A missing binary or package fails the suite; nothing is skipped.
"""
import hashlib
import json
import os
import select
import socket
import struct

import pytest
from hyperframe.frame import PriorityFrame, PushPromiseFrame

from h2peer import (
    ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, MAX_STREAM_ID,
    PADDED, PING, PREFACE, PRIORITY, PRIORITY_FLAG, PUSH_PROMISE, RST_STREAM, SETTINGS,
    WINDOW_UPDATE, App, Client, Deadline, E, Guard, Http1App, NoApp, RawClient, S,
    assert_bytes, err_name, grpc_message, grpc_tick, hpack_int, literal_block, pattern,
    ping_frame, raw_frame, request_fields, split_grpc,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


@pytest.fixture
def rig():
    assert os.access(BIN, os.X_OK), (
        f"no drainshim binary at {BIN}: run `cargo build --locked` or set DRAINSHIM_BIN")
    r = Rig()
    yield r
    # Shown by pytest only when the test failed.
    print(r.describe())
    r.close()


# --- assertions ------------------------------------------------------------

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


# --- 1, 2: the app's own graceful shutdown ------------------------------------

def app_goaway(rig, drain):
    app = rig.start()
    c = rig.client()
    long = c.grpc("test.Stream/Ticks", b"go", [("x-call", "long")])
    a = c.grpc("test.Unary/Hold", b"a", [("x-call", "unary-a")])
    b = c.grpc("test.Unary/Hold", b"b", [("x-call", "unary-b")])
    tick = len(grpc_tick(0))
    c.wait(lambda: len(c.stream(long).data) >= 3 * tick
           and all(r.ended for r in app.find(call="unary-a") + app.find(call="unary-b"))
           and len(app.find(path="/Hold")) == 2,
           10, "the long stream's first messages and both unary calls at the app")

    # A grpc server's graceful stop: GOAWAY(2^31-1) + PING, GOAWAY(last) on
    # the ack, then the pending calls are answered; no new connections.
    conns = [k for k in app.conns if not (k.closed or k.eof)]
    app.stop_accepting()
    for k in conns:
        k.call(lambda k: k.graceful_shutdown(answer_after=1.0, grace=10.0))
    # The late stream (and the drain) come right after the app's final GOAWAY,
    # a PING round trip after its first: the app ignores the stream (it is
    # above its last-stream-id) and the guard's GOAWAYs have to stay below
    # the app's. The client is not pumped until the stream is open: what the
    # guard sent meanwhile is still in flight for it, so opening a stream is
    # legal (RFC 9113 §6.8 forbids it only once a GOAWAY is received).
    budget = Deadline(15)
    app.wait(lambda: all(k.final_last is not None for k in conns), 5, "the app's final GOAWAY")
    late = c.grpc("test.Unary/Hold", b"late", [("x-call", "late")])
    if drain:
        # The drain's GOAWAY sequence starts once the client has seen the end
        # of the app's (a GOAWAY below 2^31-1), or its late stream end (a
        # guard that shows the client no GOAWAY for the app's).
        c.wait(lambda: any(last < MAX_STREAM_ID for last, _, _ in c.goaways())
               or c.stream(late).done, 5, "a final GOAWAY or the late stream's end")
        status, text = rig.guard.drain()
        assert status == 202, f"POST /drain answered {status}: {text}"
    c.wait_done([long, a, b, late], budget.remaining(), "every stream to end")

    assert_sane(rig)
    assert_no_connection_error(c)
    assert_goaway_ids_never_grow(c)
    assert_grpc_ok(c.stream(a), b"answer:unary-a", "unary call a")
    assert_grpc_ok(c.stream(b), b"answer:unary-b", "unary call b")
    seen = (f"long stream: {c.stream(long)!r}\nlate stream: {c.stream(late)!r}\n"
            f"app: {app.find(call='late')}\nGOAWAYs: {c.goaways()}")
    print(seen)
    assert_only_graceful_resets(c)
    # The late stream: refused retryably and never processed by the app, or
    # processed (it reached the app before its final GOAWAY) and answered.
    st = c.stream(late)
    processed = [r for r in app.find(call="late") if not r.ignored]
    if retryable_end(st):
        assert not processed, f"late stream refused, yet the app processed it: {processed}"
    else:
        assert processed and st.grpc_status() == "0", (
            f"the late stream must be refused (REFUSED_STREAM or trailers-only grpc-status 14) "
            f"or answered by the app: {st!r}; app: {app.find(call='late')}")
        assert_grpc_ok(st, b"answer:late", "late stream")
    # The long stream: ended gracefully, on a message boundary.
    st = c.stream(long)
    assert st.ended and st.grpc_status() == "14", (
        f"the long stream must end with trailers grpc-status 14: {st!r}")
    msgs, rest = split_grpc(st.data)
    assert not rest, f"the long stream ended mid-message: {len(rest)} bytes of a partial message"
    assert msgs == [grpc_tick(i)[5:] for i in range(len(msgs))], "long stream messages lost or reordered"


def test_app_goaway_during_calls(rig):
    app_goaway(rig, drain=False)


def test_app_goaway_then_drain(rig):
    app_goaway(rig, drain=True)


# --- 3-7: flow control, settings, frame sizes ------------------------------------

def test_default_window_large_response(rig):
    rig.start()
    c = rig.client()   # python-h2 defaults: 65,535-byte windows
    sid = c.get(f"/bytes?n={10 * MB}&seed=3")
    c.wait_done([sid], 60, "the 10 MB response")
    assert_complete(c.stream(sid), pattern(10 * MB, 3), "10 MB response")
    sids = [c.get(f"/bytes?n={MB}&seed={i}") for i in range(8)]
    c.wait_done(sids, 60, "8 concurrent 1 MB responses")
    for i, s in enumerate(sids):
        assert_complete(c.stream(s), pattern(MB, i), f"1 MB response #{i}")
    assert_clean(rig, c)


def test_default_window_large_upload(rig):
    rig.start()
    c = rig.client()
    body = pattern(10 * MB, 4)
    sid = c.request("POST", "/sha", body=body)
    c.wait_done([sid], 60, "the 10 MB upload's answer")
    got = sha_answer(c.stream(sid))
    assert got == {"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}, got
    assert_clean(rig, c)


def test_tiny_windows_both_ways(rig):
    rig.start(App(settings={S.INITIAL_WINDOW_SIZE: 1024}))
    c = rig.client(settings={S.INITIAL_WINDOW_SIZE: 1024})
    bodies = [pattern(MB, 50 + i) for i in range(4)]
    sids = [c.request("POST", "/echo", body=b) for b in bodies]
    c.wait_done(sids, 60, "4 echoes of 1 MB over 1 KiB windows")
    for i, (s, b) in enumerate(zip(sids, bodies)):
        assert_complete(c.stream(s), b, f"echo #{i}")
    assert_clean(rig, c)


def test_settings_changes_mid_connection(rig):
    rig.start()
    c = rig.client()
    down, up = pattern(4 * MB, 6), pattern(4 * MB, 7)
    get = c.get(f"/bytes?n={len(down)}&seed=6")
    put = c.request("POST", "/sha", body=up)
    c.wait(lambda: len(c.stream(get).data) >= MB, 30, "the first MB")
    c.conn.update_settings({S.INITIAL_WINDOW_SIZE: 1 << 20})
    c.flush()
    c.wait(lambda: len(c.stream(get).data) >= 2 * MB + MB // 2, 30, "2.5 MB")
    c.conn.update_settings({S.INITIAL_WINDOW_SIZE: 4096, S.HEADER_TABLE_SIZE: 0})
    c.flush()
    # After HEADER_TABLE_SIZE 0 the peer's encoder may not use its table.
    probes = [c.request("GET", "/headers", [("x-probe", f"probe-{i}-" + "p" * 200),
                                            ("x-same", "s" * 300)])
              for i in range(5)]
    c.wait_done([get, put] + probes, 60, "the transfers and the header probes")
    assert_complete(c.stream(get), down, "4 MB download")
    assert sha_answer(c.stream(put)) == {"len": len(up), "sha256": hashlib.sha256(up).hexdigest()}
    for i, s in enumerate(probes):
        h = dict(c.stream(s).headers or [])
        assert h.get("x-echo") == f"probe-{i}-" + "p" * 200 and h.get("x-big") == "b" * 300, (
            f"probe {i} decoded wrong: {h}")
    assert_clean(rig, c)


def test_max_frame_size_each_side(rig):
    app = rig.start(App(settings={S.MAX_FRAME_SIZE: 32768, S.INITIAL_WINDOW_SIZE: 4 * MB},
                        conn_window=8 * MB))
    c = rig.client(settings={S.MAX_FRAME_SIZE: 65536, S.INITIAL_WINDOW_SIZE: 4 * MB},
                   conn_window=8 * MB)
    down, up = pattern(4 * MB, 8), pattern(4 * MB, 9)
    get = c.get(f"/bytes?n={len(down)}&seed=8")
    echo = c.request("POST", "/echo", body=up)
    c.wait_done([get, echo], 60, "4 MB each way")
    assert_complete(c.stream(get), down, "4 MB download")
    assert_complete(c.stream(echo), up, "4 MB echo")
    big = max(f.length for f in c.frames_in)
    assert big <= 65536, f"the client got a {big}-byte frame over its MAX_FRAME_SIZE 65536"
    app_big = max(f.length for k in app.conns for f in k.frames_in)
    assert app_big <= 32768, f"the app got a {app_big}-byte frame over its MAX_FRAME_SIZE 32768"
    print(f"largest frame: to the client {big}, to the app {app_big}")
    assert_clean(rig, c)


# --- 8-11: legal frames the guard must pass or ignore ---------------------------

def pad_headers(frames):
    """h2's own HEADERS frames, padded (same header block)."""
    out = []
    for t, f, s, p in frames:
        if t == HEADERS and not f & PADDED:
            t, f, p = HEADERS, f | PADDED, bytes([9]) + p + b"\0" * 9
        out.append((t, f, s, p))
    return out


def test_padding_priority_unknown_frames(rig):
    app = rig.start()
    c = rig.client()
    c.rewrite = pad_headers
    c.conn.update_settings({0x4242: 7})                       # an unknown setting
    # Unknown frame types (hyperframe's ExtensionFrame only re-serializes
    # parsed frames: its length field is 0 otherwise), ignored per §4.1.
    c.send_raw(raw_frame(0x20, 0x5, 0, b"unknown frame"))
    c.send_raw(PriorityFrame(1001, depends_on=0, stream_weight=99).serialize())  # idle stream
    up = pattern(300_000, 10)
    put = c.request("POST", "/sha", [("x-probe", "padded")], body=up, pad=20,
                    priority_weight=200, priority_depends_on=0, priority_exclusive=False)
    c.send_raw(raw_frame(0x20, 0, put, b"on a stream"))
    c.conn.prioritize(put, weight=16, depends_on=0, exclusive=False)
    get = c.get("/bytes?n=200000&seed=11")
    c.send_raw(PriorityFrame(get, depends_on=put, stream_weight=1).serialize())
    probe = c.request("GET", "/headers", [("x-probe", "after-unknown")])
    c.wait_done([put, get, probe], 30, "the requests")
    assert sha_answer(c.stream(put)) == {"len": len(up), "sha256": hashlib.sha256(up).hexdigest()}
    assert_complete(c.stream(get), pattern(200000, 11), "download")
    assert dict(c.stream(probe).headers).get("x-echo") == "after-unknown"
    assert [r.h.get("x-probe") for r in app.find(path="/sha")] == ["padded"]
    assert_clean(rig, c)


def split_headers(piece):
    """Rewrites h2's HEADERS frames into HEADERS + CONTINUATIONs of `piece` bytes."""
    def rewrite(frames):
        out = []
        for t, f, s, p in frames:
            if t != HEADERS or len(p) <= piece or f & (PADDED | PRIORITY_FLAG):
                out.append((t, f, s, p))
                continue
            chunks = [p[i:i + piece] for i in range(0, len(p), piece)]
            out.append((HEADERS, f & ~END_HEADERS, s, chunks[0]))
            for j, chunk in enumerate(chunks[1:], start=1):
                out.append((CONTINUATION, END_HEADERS if j == len(chunks) - 1 else 0, s, chunk))
        return out
    return rewrite


def test_continuation_sequences(rig):
    app = rig.start()
    c = rig.client()
    c.rewrite = split_headers(1500)

    def big_headers(tag):
        return [(f"x-long-{i}", hashlib.sha256(f"{tag}{i}".encode()).hexdigest() * 40)
                for i in range(5)]   # 5 x 2,560 characters
    sets = [big_headers("one"), big_headers("one"), big_headers("two")]
    sids = [c.request("GET", "/headers", [("x-call", f"c{i}"), *h]) for i, h in enumerate(sets)]
    c.wait_done(sids, 20, "the requests with long header blocks")
    pieces = [f for f in c.frames_in if f.type == CONTINUATION]
    for i, (s, h) in enumerate(zip(sids, sets)):
        assert c.stream(s).status() == "200", f"request {i}: {c.stream(s)!r}"
        got = app.find(call=f"c{i}")
        assert len(got) == 1, f"request {i} reached the app {len(got)} times"
        for name, value in h:
            assert got[0].h.get(name) == value, f"request {i}: header {name} arrived altered"
    print(f"continuation frames received by the client: {len(pieces)}")
    assert_clean(rig, c)


def test_client_goaway(rig):
    app = rig.start()
    c = rig.client()
    up = pattern(MB, 12)
    get = c.get(f"/bytes?n={MB}&seed=13")
    put = c.request("POST", "/sha", body=up)
    hold = c.grpc("test.Unary/Hold", b"h", [("x-call", "held")])
    c.wait(lambda: app.find(call="held") and app.find(call="held")[0].ended and app.find(path="/sha"),
           10, "the calls at the app")
    c.send_goaway(0)   # the client takes no pushed streams; its own go on
    req = app.find(call="held")[0]
    req.conn.call(lambda k: k.answer_grpc(req, b"late answer"))
    c.wait_done([get, put, hold], 30, "the client's streams after its GOAWAY")
    assert_complete(c.stream(get), pattern(MB, 13), "download")
    assert sha_answer(c.stream(put)) == {"len": len(up), "sha256": hashlib.sha256(up).hexdigest()}
    assert_grpc_ok(c.stream(hold), b"late answer", "held call")
    assert_sane(rig)
    assert_no_connection_error(c)
    assert_only_graceful_resets(c)


def test_both_goaway_at_once(rig):
    app = rig.start()
    c = rig.client()
    up = pattern(MB, 14)
    get = c.get(f"/bytes?n={MB}&seed=15")
    put = c.request("POST", "/sha", body=up)
    hold = c.grpc("test.Unary/Hold", b"h", [("x-call", "held")])
    c.wait(lambda: app.find(call="held") and app.find(call="held")[0].ended and app.find(path="/sha"),
           10, "the calls at the app")
    req = app.find(call="held")[0]

    def goaway_then_answer(k):
        k.send_goaway(k.highest_in)
        k.final_last = k.highest_in   # closes once its streams are done
        k.answer_grpc(req, b"answered after GOAWAY")
    req.conn.call(goaway_then_answer)
    c.send_goaway(0)
    c.wait_done([get, put, hold], 30, "the open streams after both GOAWAYs")
    assert_complete(c.stream(get), pattern(MB, 15), "download")
    assert sha_answer(c.stream(put)) == {"len": len(up), "sha256": hashlib.sha256(up).hexdigest()}
    assert_grpc_ok(c.stream(hold), b"answered after GOAWAY", "held call")
    assert_sane(rig)
    assert_no_connection_error(c)
    assert_goaway_ids_never_grow(c)
    assert_only_graceful_resets(c)


# --- 12-17: misbehaving peers -------------------------------------------------

def test_app_ping_ack_short_payload(rig):
    app = rig.start()

    def bad_ack(k, req, event, data):
        if event == "end":   # a malformed PING ACK: 5 bytes (RFC 9113 §6.7)
            k.send_raw(raw_frame(PING, ACK, 0, b"dsb\0x"))
    app.route("/test.Bad/", bad_ack)
    c = rig.client()
    sid = c.grpc("test.Bad/PingAck", b"x")
    c.wait(lambda: c.stream(sid).done, 15, "the stream's end")
    assert rig.guard.alive(), f"the guard exited:\n{rig.guard.log()}"
    st = c.stream(sid)
    assert retryable_end(st), f"the stream must end retryably (REFUSED_STREAM or trailers-only 14): {st!r}"
    blamed = [(last, err_name(code)) for last, code, _ in c.goaways() if code in BLAMES_CLIENT]
    assert not blamed, f"the client is blamed for the app's malformed frame: {blamed}"
    # The client's connection either goes away gracefully (GOAWAY first) or
    # stays usable (a guard that pools app connections need not close it).
    if not c.goaways():
        assert not c.eof, f"the connection closed without a GOAWAY\n{c.describe()}"
        s1 = c.get("/bytes?n=1000&seed=1")
        c.wait_done([s1], 10, "a request on the same connection")
        assert_complete(c.stream(s1), pattern(1000, 1), "request on the same connection")
    c2 = rig.client()
    s2 = c2.get("/bytes?n=1000&seed=1")
    c2.wait_done([s2], 10, "a request on a new connection")
    assert_complete(c2.stream(s2), pattern(1000, 1), "request after the malformed PING")
    assert c.h2_error is None and c2.h2_error is None, f"{c.h2_error} {c2.h2_error}"


def test_settings_on_nonzero_stream(rig):
    rig.start()
    c = rig.client()
    sid = c.get("/bytes?n=100")
    c.wait_done([sid], 10, "a first request")
    c.send_raw(raw_frame(SETTINGS, 0, 1, b""))   # SETTINGS must be on stream 0 (§6.5)
    c.wait(lambda: c.goaways() or c.eof, 10, "GOAWAY(PROTOCOL_ERROR)")
    codes = [err_name(code) for _, code, _ in c.goaways()]
    assert "PROTOCOL_ERROR" in codes, f"want GOAWAY(PROTOCOL_ERROR), got GOAWAYs {codes}, eof={c.eof}"
    assert rig.guard.alive()


def test_unsolicited_client_ping_ack(rig):
    rig.start()
    c = rig.client()
    first = c.get("/bytes?n=100")
    c.wait_done([first], 10, "a first request")
    c.send_raw(ping_frame(b"dsgoaway", ack=True))
    c.pump_for(2.0)
    assert not c.goaways() and not c.eof, f"an unsolicited PING ACK ended the connection\n{c.describe()}"
    sid = c.get("/bytes?n=5000&seed=2")
    c.wait_done([sid], 10, "a request after the PING ACK")
    assert_complete(c.stream(sid), pattern(5000, 2), "request after the PING ACK")
    assert_clean(rig, c)


def test_push_promise_never_reaches_client(rig):
    app = rig.start()
    body = pattern(50_000, 16)

    def push(k, req, event, data):
        if event != "end":
            return
        k.flush()
        block = k.conn.encoder.encode([(":method", "GET"), (":scheme", "http"),
                                       (":authority", "guard.test"), (":path", "/pushed")])
        k.send_raw(PushPromiseFrame(req.sid, promised_stream_id=2, data=block,
                                    flags=["END_HEADERS"]).serialize())
        k.respond(req, [(":status", "200")], body)
    app.route("/push", push)
    c = rig.client()   # ENABLE_PUSH=0
    sid = c.get("/push")
    c.wait_done([sid], 15, "the response")
    c.pump_for(0.5)
    assert not c.frames(PUSH_PROMISE), f"the client got PUSH_PROMISE: {c.frames(PUSH_PROMISE)}"
    assert_sane(rig)
    assert_no_connection_error(c)
    k = app.find(path="/push")[0].conn
    app.wait(lambda: any(f.stream == 2 for f in k.frames(RST_STREAM)) or k.goaways(), 5,
             "the guard's answer to the PUSH_PROMISE")
    st = c.stream(sid)
    app_goaway = [(last, err_name(x)) for last, x, _ in k.goaways()]
    print(f"app got RST_STREAM {k.frames(RST_STREAM)}, GOAWAY {app_goaway}; client: {st!r}")
    if any(f.stream == 2 for f in k.frames(RST_STREAM)):
        # The promise refused, the response relayed whole (what the brief asks).
        assert_complete(st, body, "response with a push promise")
    else:
        # RFC 9113 §6.6: once ENABLE_PUSH=0 is acknowledged, a PUSH_PROMISE is
        # a connection error (PROTOCOL_ERROR) towards the app. The client then
        # must not get a truncated 200 passed off as complete.
        assert any(x == E.PROTOCOL_ERROR for _, x, _ in k.goaways()), (
            f"the app must get RST_STREAM on promised stream 2 (or GOAWAY(PROTOCOL_ERROR)); "
            f"it got RST_STREAM {k.frames(RST_STREAM)}, GOAWAY {app_goaway}")
        assert st.reset is not None or st.lost or (st.status() or "").startswith("5") or (
            st.status() == "200" and bytes(st.data) == body), (
            f"after the app's connection error the client's stream must fail visibly: {st!r}"[:2000])


def test_oversized_frame_from_app(rig):
    app = rig.start()

    def oversized(k, req, event, data):
        if event == "end":
            k.respond(req, [(":status", "200"), ("content-type", "application/grpc")], end=False)
            k.send_raw(raw_frame(DATA, 0, req.sid, grpc_message(pattern(19_995, 17))))
    app.route("/test.Big/", oversized)
    c = rig.client()   # MAX_FRAME_SIZE 16,384
    sid = c.grpc("test.Big/Frame", b"x")
    c.wait_done([sid], 15, "the stream's end")
    c.pump_for(0.2)
    big = [f for f in c.frames_in if f.length > 16384]
    assert not big, f"the client got frames over its MAX_FRAME_SIZE: {big}"
    blamed = [(last, err_name(code)) for last, code, _ in c.goaways() if code in BLAMES_CLIENT]
    assert not blamed, f"the client is blamed for the app's oversized frame: {blamed}"
    st = c.stream(sid)
    msgs, rest = split_grpc(st.data)
    ok = (st.reset in (E.REFUSED_STREAM, E.CANCEL)
          or (st.ended and st.grpc_status() == "14" and not rest))
    assert ok, f"the stream must end retryably (REFUSED_STREAM, CANCEL or grpc-status 14): {st!r}"
    assert rig.guard.alive()
    assert c.h2_error is None, c.h2_error


def rss_kib(rig):
    with open(f"/proc/{rig.guard.proc.pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def test_peer_that_never_reads(rig):
    app = rig.start(guard_args=["--guard-max-streams", "1"])
    sock = socket.create_connection(rig.guard.addr, timeout=5)
    try:
        # Header blocks of static-table entries and literals: no HPACK state.
        def block(path):
            return b"\x82\x86\x04" + bytes([len(path)]) + path + b"\x01\x0aguard.test"
        sock.sendall(PREFACE + raw_frame(SETTINGS, 0, 0)
                     + raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, block(b"/hold")))
        app.wait(lambda: app.find(path="/hold"), 10, "the held request at the app")
        # Every further stream is over --guard-max-streams: refused by the
        # guard, which has to write a RST_STREAM for each, to a client that
        # never reads.
        refused = raw_frame(HEADERS, END_HEADERS | END_STREAM, 0, block(b"/bytes?n=1"))
        batch = bytearray(refused * 16384)
        sock.setblocking(False)
        sent, sid, buf, outcome = 0, 3, b"", None
        budget = Deadline(20)
        rss0 = rss_kib(rig)
        while outcome is None:
            assert sent < 64 * MB, (
                f"the guard read {sent} bytes in {20 - budget.remaining():.1f} s from a client that "
                f"never reads; guard RSS {rss_kib(rig)} KiB (at start {rss0})")
            assert not budget.expired(), (
                f"the guard kept reading for 20 s ({sent} bytes); guard RSS {rss_kib(rig)} KiB "
                f"(at start {rss0})")
            if not buf:   # as fast as Python goes: the same frames, new stream ids
                for i in range(16384):
                    struct.pack_into(">I", batch, i * len(refused) + 5, sid + 2 * i)
                buf = memoryview(bytes(batch))
                sid += 2 * 16384
                assert sid < MAX_STREAM_ID
            try:
                n = sock.send(buf)
            except BlockingIOError:
                # Backpressure once the socket stays full for 2 s.
                _, w, _ = select.select([], [sock], [], min(2.0, budget.remaining()))
                if not w and not budget.expired():
                    outcome = "blocked"
                continue
            except (BrokenPipeError, ConnectionResetError) as e:
                outcome = f"closed by the guard ({e})"
                continue
            sent += n
            buf = buf[n:]
        print(f"never-reading client: {outcome} after {sent} bytes ({sid // 2} streams), "
              f"{20 - budget.remaining():.1f} s, guard RSS {rss_kib(rig)} KiB (at start {rss0})")
    finally:
        sock.close()
    assert rig.guard.alive(), f"the guard exited:\n{rig.guard.log()}"
    # The guard still serves; the held stream is released once it sees the
    # close, so a first try may be refused.
    c = rig.client()
    d = Deadline(15)
    for _ in range(30):
        s = c.get("/bytes?n=1000&seed=5")
        c.wait_done([s], d.remaining(), "a request after the flood")
        if c.stream(s).reset != E.REFUSED_STREAM or d.expired():
            break
    assert_complete(c.stream(s), pattern(1000, 5), "request after the flood")


# --- 18 ---------------------------------------------------------------------

def test_many_streams_large_bodies(rig):
    rig.start()
    c = rig.client()
    sids = [c.get(f"/bytes?n=200000&seed={i}") for i in range(50)]
    c.wait_done(sids, 60, "50 responses of 200 KB")
    for i, s in enumerate(sids):
        assert_complete(c.stream(s), pattern(200000, i), f"response #{i}")
    assert_clean(rig, c)


# --- 19: RFC 7541 §6.2.3 through re-encoding ---------------------------------

def test_never_indexed_survives_re_encoding(rig):
    """A field the client sends never-indexed (a secret) reaches the app
    never-indexed, also once the guard re-encodes the client's blocks (it
    dropped a refused request whose block changed the HPACK table)."""
    from hpack import NeverIndexedHeaderTuple
    app = rig.start(guard_args=["--guard-max-streams", "1"],
                    log=Guard.LOG + ",drainshim::guard::relay=debug")
    c = rig.client()
    held = c.get("/hold")
    app.wait(lambda: app.find(path="/hold"), 10, "the held request at the app")
    # Over the stream cap: refused before the app sees it. python-h2 indexes
    # this field, so the app's table no longer follows the client's.
    refused = c.request("GET", "/bytes?n=1", [("x-fresh", "indexed-by-the-client")])
    c.wait(lambda: c.stream(refused).done, 10, "the over-cap request refused")
    assert c.stream(refused).reset == E.REFUSED_STREAM, repr(c.stream(refused))
    c.reset_stream(held)
    app.wait(lambda: all(r.reset is not None for r in app.find(path="/hold")), 10,
             "the held request reset at the app")
    d = Deadline(15)
    for _ in range(30):   # the guard may see the reset a moment after the app
        s = c.request("GET", "/bytes?n=100&seed=3",
                      [NeverIndexedHeaderTuple("authorization", "Bearer s3cret"),
                       ("x-fresh", "indexed-by-the-client")])
        c.wait_done([s], d.remaining(), "the request with a secret")
        if c.stream(s).reset != E.REFUSED_STREAM or d.expired():
            break
    assert_complete(c.stream(s), pattern(100, 3), "the request with a secret")
    [req] = [r for r in app.find(path="/bytes?n=100&seed=3")]
    fields = {(bytes(n) if isinstance(n, (bytes, bytearray)) else n.encode()): h
              for h in req.headers for n in [h[0]]}
    auth = fields.get(b"authorization")
    assert auth is not None and isinstance(auth, NeverIndexedHeaderTuple), (
        f"authorization must arrive never-indexed: {req.headers}")
    fresh = fields.get(b"x-fresh")
    assert fresh is not None and not isinstance(fresh, NeverIndexedHeaderTuple)
    assert "re-encoding the client's blocks" in rig.guard.log(), (
        "the case must go through the guard's re-encoding:\n" + rig.guard.log(30))
    assert_sane(rig)


# --- 20: RFC 7541 §4.2 in the guard's own blocks ------------------------------

def test_own_block_after_a_lowered_table_size_starts_with_the_update(rig):
    """The client lowers HEADER_TABLE_SIZE; once the app acked it, the next
    header block the client gets must start with a dynamic table size update
    (RFC 7541 §4.2; Envoy's HPACK decoder enforces it). When that block is
    the guard's own (here its 431 for a header list over its limit), the
    guard must put the update in."""
    app = rig.start()
    c = rig.client()
    c.conn.update_settings({S.HEADER_TABLE_SIZE: 256})
    c.flush()
    acks_before = len([f for f in c.frames(SETTINGS) if f.ack])
    c.wait(lambda: len([f for f in c.frames(SETTINGS) if f.ack]) > acks_before, 10,
           "the app's ack of the lowered table size")
    big = c.request("GET", "/bytes?n=1", [(f"x-big-{i}", "v" * 4000) for i in range(20)])
    c.wait_done([big], 10, "the request over the header list limit")
    st = c.stream(big)
    assert st.status() == "431", f"the guard answers 431 itself: {st!r}"
    assert not app.find(path="/bytes?n=1"), "the app never saw the refused request"
    [first] = [f for f in c.frames(HEADERS) if f.stream == big][:1]
    block = first.payload
    if first.flags & PADDED:
        block = block[1:len(block) - block[0]]
    assert block and block[0] & 0xE0 == 0x20, (
        f"the block does not start with a dynamic table size update: {bytes(block[:8]).hex()}")
    size = block[0] & 0x1F
    assert size <= 256, f"the update names {size}, above the client's 256"
    # And the app's next block still decodes.
    ok = c.get("/bytes?n=10&seed=1")
    c.wait_done([ok], 10, "a request after the 431")
    assert_complete(c.stream(ok), pattern(10, 1), "the request after the 431")
    assert_sane(rig)
    assert_no_connection_error(c)


# --- 21: a block for a stream the client reset ---------------------------------

# The frame relay only: it is about when the relay starts re-encoding.
@pytest.mark.parametrize("rig", ["frames"], indirect=True)
def test_app_block_for_a_stream_the_client_reset_goes_on(rig):
    """The app answers a stream the client already reset (the two crossed).
    The client must still decode that block (RFC 9113 §5.1: HPACK state), so
    the guard passes it on; dropping it would leave the client's table behind
    the app's and force the guard to re-encode every later block."""
    app = rig.start(log=Guard.LOG + ",drainshim::guard::relay=debug")
    c = rig.client()
    held = c.get("/hold")
    app.wait(lambda: app.find(path="/hold"), 10, "the held request at the app")
    c.reset_stream(held)
    [req] = app.find(path="/hold")
    app.wait(lambda: req.reset is not None, 10, "the reset at the app")
    # The app's answer, crossing the reset: encoded with the app's own
    # encoder (a field it indexes), sent as a raw HEADERS frame.
    sent = []

    def answer(k):
        block = k.conn.encoder.encode([(":status", "200"), ("x-crossed", "indexed-by-the-app")])
        k.send_raw(raw_frame(HEADERS, END_HEADERS | END_STREAM, req.sid, block))
        sent.append(True)
    req.conn.call(answer)
    app.wait(lambda: sent, 5, "the crossed answer sent")
    # The app's next blocks use its table; they must decode at the client.
    for i in range(3):
        s = c.request("GET", f"/headers?i={i}", [("x-probe", f"p{i}")])
        c.wait_done([s], 10, f"request {i} after the crossed answer")
        h = dict(c.stream(s).headers or [])
        assert c.stream(s).status() == "200" and h.get("x-echo") == f"p{i}", (
            f"request {i}: {c.stream(s)!r}")
    assert "re-encoding its blocks" not in rig.guard.log(200), (
        "the guard dropped the crossed block and re-encodes:\n" + rig.guard.log(20))
    assert_sane(rig)
    assert_no_connection_error(c)


# --- 22: the guard alone: no app, or an app that does not speak HTTP/2 -------

@pytest.mark.parametrize("absent", ["unreachable", "http1-only"])
def test_guard_alone_is_a_conformant_server(rig, absent):
    """With no application to relay to (nothing listens on its port, or it
    answers HTTP/2's preface as HTTP/1.1), the guard is the client's server
    itself: its own SETTINGS (extended CONNECT on), the client's SETTINGS
    and PINGs acked, every request answered retryably (gRPC: trailers-only
    grpc-status 14; HTTP: 502), the DATA of answered requests given back to
    the connection window, and a drain's GOAWAY sequence; never a
    connection error."""
    app = rig.start(app=NoApp() if absent == "unreachable" else Http1App())
    c = rig.client()
    c.wait(lambda: any(f.type == SETTINGS and not f.ack for f in c.frames_in)
           and any(f.type == SETTINGS and f.ack for f in c.frames_in), 10,
           "the guard's SETTINGS and its ack of the client's")
    assert c.conn.remote_settings.enable_connect_protocol == 1, "extended CONNECT must be on"
    c.conn.update_settings({S.INITIAL_WINDOW_SIZE: 1 << 20, S.HEADER_TABLE_SIZE: 1024})
    c.conn.ping(b"alone!!!")
    c.flush()
    c.wait(lambda: b"alone!!!" in c.acks_in
           and sum(1 for f in c.frames_in if f.type == SETTINGS and f.ack) >= 2, 10,
           "the PING ack and the second SETTINGS ack")

    call = c.grpc("test.Unary/Hold", b"x")
    get = c.get("/bytes?n=10")
    # Uploads bigger than the connection window: what the guard does not
    # pass on, it must give back, or the connection would stall.
    uploads = [c.request("POST", "/sha", body=pattern(200_000, i)) for i in range(4)]
    ws = c.request("CONNECT", "/ws", [(":protocol", "websocket"),
                                      ("sec-websocket-version", "13")], end=False)
    c.wait_done([call, get, *uploads, ws], 15, "every stream answered")
    st = c.stream(call)
    assert st.trailers_only() and st.grpc_status() == "14", f"gRPC: {st!r}"
    assert "grpc-message" in dict(st.headers), f"gRPC without a message: {st!r}"
    for sid in [get, *uploads]:
        st = c.stream(sid)
        assert st.status() == "502" and st.reset in (None, E.NO_ERROR), f"HTTP: {st!r}"
    st = c.stream(ws)
    want = "502" if absent == "unreachable" else "501"
    assert st.status() == want, f"the WebSocket's answer (the app's, or 502): {st!r}"
    # Every DATA byte the client sent came back as connection window.
    c.wait(lambda: c.conn.outbound_flow_control_window == 65535, 10,
           "the connection window given back in full")

    if absent == "http1-only":
        # The guard tried HTTP/2 first: the app saw its preface as a request.
        assert any("HTTP/2.0" in line and str(code) == "505" for line, code in app.requests), (
            app.describe())

    # A drain: the guard's GOAWAY sequence, then the connection closes.
    status, text = rig.guard.drain()
    assert status == 202, f"POST /drain answered {status}: {text}"
    c.wait(lambda: c.eof, 15, "the connection closed after the drain")
    assert c.goaways() and all(code == E.NO_ERROR for _, code, _ in c.goaways()), c.goaways()
    assert_goaway_ids_never_grow(c)
    assert_sane(rig)
    assert_no_connection_error(c)


@pytest.mark.parametrize("absent", ["unreachable", "http1-only"])
def test_guard_alone_holds_the_client_to_the_rfc(rig, absent):
    """Alone, the guard judges what an application would: DATA on a stream
    the client never opened is a connection error PROTOCOL_ERROR (RFC 9113
    §5.1), and so is a stream id the client may not open (even, §5.1.1)."""
    rig.start(app=NoApp() if absent == "unreachable" else Http1App())
    for frame in [raw_frame(DATA, 0, 99, b"x"), raw_frame(HEADERS, END_HEADERS, 2, b"\x82")]:
        c = rig.client()
        c.wait(lambda: any(f.type == SETTINGS and f.ack for f in c.frames_in), 10,
               "the guard's SETTINGS ack")
        c.send_raw(frame)
        c.wait(lambda: c.goaways(), 10, "a GOAWAY")
        assert [code for _, code, _ in c.goaways()] == [E.PROTOCOL_ERROR], c.describe()
        c.wait(lambda: c.eof, 10, "the connection closed")
    assert rig.guard.alive(), rig.guard.log()



# --- 23-: what the guard answers itself (RFC 9113 §3-§8.1, RFC 7541) -------
#
# The guard is the client's server: a frame that breaks a MUST of RFC 9113
# is answered by the guard with the code the RFC names, and never passed on.
# The app behind it (python-h2) would answer many of these itself, but with
# its own connection to the guard (every other stream on it cut, a GOAWAY
# the client gets as the guard's), or not at all for frames the guard
# swallowed. Each case: raw frames from a hyperframe client, the exact code
# (GOAWAY's for a connection error, RST_STREAM's for a stream error) within
# DEADLINE seconds, and the app never saw the offending frame. A case that
# lets the guard pass something on says why in its docstring.

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


@pytest.mark.parametrize("kind,frame,section", [
    ("DATA", raw_frame(DATA, 0, 0, MARK), "§6.1"),
    ("HEADERS", raw_frame(HEADERS, END_HEADERS | END_STREAM, 0, BLOCK), "§6.2"),
    ("PRIORITY", priority(0, 1), "§6.3"),
    ("RST_STREAM", rst(0), "§6.4"),
    ("PUSH_PROMISE", raw_frame(PUSH_PROMISE, END_HEADERS, 0, struct.pack(">I", 2) + BLOCK), "§6.6"),
    ("CONTINUATION", raw_frame(CONTINUATION, END_HEADERS, 0, BLOCK), "§6.10"),
], ids=["DATA", "HEADERS", "PRIORITY", "RST_STREAM", "PUSH_PROMISE", "CONTINUATION"])
def test_a_stream_frame_on_stream_zero(rig, kind, frame, section):
    """RFC 9113 §6.1-§6.4, §6.6, §6.10: DATA, HEADERS, PRIORITY, RST_STREAM,
    PUSH_PROMISE and CONTINUATION belong to a stream; on stream 0 each is a
    connection error PROTOCOL_ERROR. The guard answers it: stream 0 is the
    connection, which the guard terminates (the app's would be another)."""
    rig.start()
    c = rig.raw()
    c.send(frame)
    ftype = frame[3]
    assert_connection_error(rig, c, E.PROTOCOL_ERROR, lambda f: f.type == ftype and f.stream == 0,
                            f"{kind} on stream 0 ({section})")


@pytest.mark.parametrize("kind", ["DATA", "RST_STREAM", "WINDOW_UPDATE", "CONTINUATION"])
@pytest.mark.parametrize("sid", [9, 2], ids=["above-the-last", "even"])
def test_a_frame_on_an_idle_stream(rig, kind, sid):
    """RFC 9113 §5.1 (idle): a frame other than HEADERS or PRIORITY on an
    idle stream is a connection error PROTOCOL_ERROR (§6.1, §6.4, §6.9,
    §6.10 repeat it for DATA, RST_STREAM, WINDOW_UPDATE, CONTINUATION). The
    client opened stream 1; 9 is above it, and an even stream is one only
    the server may open, which the guard never does (it passes no push on):
    both are idle, and the guard, which knows which streams the client
    opened, answers itself."""
    rig.start()
    c = rig.raw()
    answered(c, 1)
    frame = {
        "DATA": raw_frame(DATA, 0, sid, MARK),
        "RST_STREAM": rst(sid),
        "WINDOW_UPDATE": window_update(sid, 100),
        "CONTINUATION": raw_frame(CONTINUATION, END_HEADERS, sid, BLOCK),
    }[kind]
    c.send(frame)
    ftype = frame[3]
    assert_connection_error(rig, c, E.PROTOCOL_ERROR, is_frame(ftype, sid),
                            f"{kind} on idle stream {sid} (§5.1)")


@pytest.mark.parametrize("kind", ["DATA", "HEADERS"])
@pytest.mark.parametrize("state", ["half-closed", "closed", "reset"])
def test_a_frame_after_the_clients_end(rig, kind, state):
    """RFC 9113 §5.1, §6.1: DATA or HEADERS from the client after it ended
    its side of a stream is STREAM_CLOSED. Half-closed (remote) (its
    END_STREAM sent, the app still answering): a stream error (§5.1). Closed
    (both sides ended): a stream error for DATA (§6.1), and for HEADERS a
    connection error (§5.1: any frame after the END_STREAM it received, on
    a closed stream; h2spec requires GOAWAY(STREAM_CLOSED)). After the
    client's own RST_STREAM: a stream error (§5.1). The guard answers each
    itself and passes nothing on: the app's stream is over, or cancelled
    with it. (A stream the *guard* or the app reset may still get frames
    the client sent before it saw the reset: those are dropped silently.)"""
    rig.start()
    c = rig.raw()
    if state == "half-closed":
        held(rig, c, 1, end_stream=True)
    elif state == "closed":
        answered(c, 1)
    else:
        held(rig, c, 1)
        c.send(rst(1))
    if kind == "DATA":
        c.send(raw_frame(DATA, END_STREAM, 1, MARK))
        offending = is_frame(DATA, 1, MARK)
    else:
        c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, literal_block([(MARK, "trailer")])))
        offending = is_frame(HEADERS, 1, MARK)
    if kind == "HEADERS" and state == "closed":
        return assert_connection_error(rig, c, E.STREAM_CLOSED, offending,
                                       "HEADERS on a closed stream (§5.1)")
    assert_stream_error(rig, c, 1, E.STREAM_CLOSED, offending,
                        f"{kind} on a {state} stream (§5.1)", probe_sid=3, connection_ok=True)


@pytest.mark.parametrize("length", [3, 5])
def test_rst_stream_of_the_wrong_length(rig, length):
    """RFC 9113 §6.4: a RST_STREAM whose length is not 4 is a connection
    error FRAME_SIZE_ERROR. Answered by the guard: the frame would also end
    the app's stream, which it must not be shown."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(raw_frame(RST_STREAM, 0, 1, b"\0" * length))
    assert_connection_error(rig, c, E.FRAME_SIZE_ERROR, is_frame(RST_STREAM, 1),
                            f"RST_STREAM of {length} bytes (§6.4)")


@pytest.mark.parametrize("sid", [0, 1], ids=["connection", "stream"])
def test_window_update_of_the_wrong_length(rig, sid):
    """RFC 9113 §6.9: a WINDOW_UPDATE whose length is not 4 is a connection
    error FRAME_SIZE_ERROR (on the connection and on a stream alike). The
    guard owns the client's connection window and reads every stream's, so
    it answers itself."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(raw_frame(WINDOW_UPDATE, 0, sid, b"\0\0\x01\0\0"))
    assert_connection_error(rig, c, E.FRAME_SIZE_ERROR,
                            lambda f: f.type == WINDOW_UPDATE and f.length != 4,
                            "WINDOW_UPDATE of 5 bytes (§6.9)")


@pytest.mark.parametrize("setting,value,code", [
    (S.MAX_FRAME_SIZE, (1 << 14) - 1, E.PROTOCOL_ERROR),
    (S.MAX_FRAME_SIZE, 1 << 24, E.PROTOCOL_ERROR),
    (S.INITIAL_WINDOW_SIZE, 1 << 31, E.FLOW_CONTROL_ERROR),
    (S.ENABLE_PUSH, 2, E.PROTOCOL_ERROR),
    (S.ENABLE_CONNECT_PROTOCOL, 2, E.PROTOCOL_ERROR),
    (0x9, 2, E.PROTOCOL_ERROR),
], ids=["max-frame-size-below-2^14", "max-frame-size-above-2^24-1",
        "initial-window-above-2^31-1", "enable-push-2", "enable-connect-protocol-2",
        "no-rfc7540-priorities-2"])
def test_a_setting_out_of_its_range(rig, setting, value, code):
    """RFC 9113 §6.5.2: SETTINGS_MAX_FRAME_SIZE outside 2^14..2^24-1 and
    SETTINGS_ENABLE_PUSH other than 0 or 1 are connection errors
    PROTOCOL_ERROR; SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1 is
    FLOW_CONTROL_ERROR. RFC 8441 §3: SETTINGS_ENABLE_CONNECT_PROTOCOL other
    than 0 or 1, PROTOCOL_ERROR; RFC 9218 §2.1: the same for
    SETTINGS_NO_RFC7540_PRIORITIES (0x9). The guard rewrites the client's SETTINGS
    on their way and acts on them itself (frame size, windows), so it judges
    them before: a bad one never reaches the app."""
    rig.start()
    c = rig.raw()
    payload = struct.pack(">HI", setting, value)
    c.send(settings([(setting, value)]))
    assert_connection_error(rig, c, code, lambda f: f.type == SETTINGS and payload in f.payload,
                            f"SETTINGS 0x{setting:x}={value} (§6.5.2)")


@pytest.mark.parametrize("frame", [raw_frame(SETTINGS, 0, 0, b"\0" * 5),
                                   settings([(S.MAX_CONCURRENT_STREAMS, 5)], flags=ACK)],
                         ids=["length-not-a-multiple-of-6", "ack-with-a-payload"])
def test_settings_of_the_wrong_length(rig, frame):
    """RFC 9113 §6.5: a SETTINGS whose length is not a multiple of 6, or an
    ACK with a payload, is a connection error FRAME_SIZE_ERROR. Judged by
    the guard, which reads every SETTINGS (see above)."""
    rig.start()
    c = rig.raw()
    c.send(frame)
    assert_connection_error(rig, c, E.FRAME_SIZE_ERROR,
                            lambda f: f.type == SETTINGS and f.payload == frame[9:] and f.length,
                            "a SETTINGS of a wrong length (§6.5)")


@pytest.mark.parametrize("case", ["skipped", "reused"])
def test_a_stream_id_smaller_than_a_previous_one(rig, case):
    """RFC 9113 §5.1.1: a new stream's id must be greater than every id the
    client opened before, and is never reused; an unexpected id is a
    connection error PROTOCOL_ERROR. Skipped: HEADERS on 3 after 5 opened
    (which closed 1 and 3 unused, §5.1). Reused: a request's HEADERS (no
    END_STREAM, so not trailers) on 1, which the app reset. The guard knows
    which ids the client opened and answers itself. (Trailers, with
    END_STREAM, on a stream the guard or app reset are legal: the client
    may not have seen the reset; they are dropped.)"""
    app = rig.start()
    app.route("/reset", lambda k, req, event, data:
              event == "headers" and (k.conn.reset_stream(req.sid, E.CANCEL), k.flush()))
    c = rig.raw()
    if case == "skipped":
        answered(c, 5)
        c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 3, BLOCK))
        sid = 3
    else:
        c.send(c.request(1, "/reset", end_stream=False))
        c.wait(lambda: c.resets(1), DEADLINE, "the app's reset of stream 1")
        c.send(raw_frame(HEADERS, END_HEADERS, 1, BLOCK))
        sid = 1
    assert_connection_error(rig, c, E.PROTOCOL_ERROR,
                            lambda f: f.type == HEADERS and f.stream == sid and MARK in f.payload,
                            f"HEADERS on stream {sid}, {case} (§5.1.1)")


def test_an_even_stream_id_from_the_client(rig):
    """RFC 9113 §5.1.1: streams a client opens have odd ids; HEADERS on an
    even one is a connection error PROTOCOL_ERROR. Answered by the guard."""
    rig.start()
    c = rig.raw()
    c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 2, BLOCK))
    assert_connection_error(rig, c, E.PROTOCOL_ERROR, is_frame(HEADERS, 2),
                            "HEADERS on stream 2 (§5.1.1)")


@pytest.mark.parametrize("hello", [
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + settings([]),
    PREFACE + ping_frame(b"12345678"),
    b"INVALID CONNECTION PREFACE\r\n\r\n",
], ids=["preface-diverges", "no-settings-first", "neither-protocol"])
def test_an_invalid_connection_preface(rig, hello):
    """RFC 9113 §3.4: the client's preface is the string
    `PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n` and a SETTINGS frame; an invalid
    one is a connection error PROTOCOL_ERROR, which the guard signals with
    its SETTINGS and a GOAWAY before it closes, not a bare close (nor an
    HTTP/1.1 answer: the request line `PRI * HTTP/2.0` says HTTP/2). A first
    line that is no HTTP/1.x request line either (h2spec's `INVALID
    CONNECTION PREFACE`) gets the same refusal. The app never sees the
    client's frames."""
    rig.start()
    c = rig.raw(preface=False, handshake=False)
    c.send(hello)
    assert_connection_error(rig, c, E.PROTOCOL_ERROR, lambda f: f.type == PING,
                            "an invalid preface (§3.4)")
    assert not c.rbytes.startswith(b"HTTP/"), bytes(c.rbytes[:80])


def test_an_http1_request_line_is_not_an_http2_preface(rig):
    """RFC 9113 §3.4, the other side: `PRI * HTTP/1.1` is HTTP/1.1 (it
    diverges from the preface before its request line is whole). The guard
    answers it as HTTP/1.1, never with HTTP/2 frames."""
    rig.start()
    c = rig.raw(preface=False, handshake=False)
    c.send(b"PRI * HTTP/1.1\r\nhost: guard.test\r\n\r\n")
    c.wait(lambda: c.rbytes or c.eof, DEADLINE, "an answer")
    assert c.rbytes.startswith(b"HTTP/1.1"), bytes(c.rbytes[:80])


@pytest.mark.parametrize("kind", ["DATA", "HEADERS"])
def test_a_frame_over_the_advertised_max_frame_size(rig, kind):
    """RFC 9113 §4.2: a frame larger than the SETTINGS_MAX_FRAME_SIZE the
    receiver advertised is FRAME_SIZE_ERROR; a connection error for any
    frame carrying a field block (and the guard makes DATA one too, §5.4.1
    allows it). The guard advertised the app's (python-h2: the default
    16,384), and checks the client against it rather than against its own
    buffer limit (1 MiB)."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    if kind == "DATA":
        frame = raw_frame(DATA, 0, 1, MARK + b"\0" * (16385 - len(MARK)))
    else:
        fields = request_fields("/bytes?n=1") + [(MARK.decode(), "v" * 16400)]
        frame = raw_frame(HEADERS, END_HEADERS | END_STREAM, 3, literal_block(fields))
    assert len(frame) - 9 > 16384
    c.send(frame)
    assert_connection_error(rig, c, E.FRAME_SIZE_ERROR, lambda f: f.length > 16384,
                            f"a {len(frame) - 9}-byte {kind} frame (§4.2)")


def test_a_frame_of_the_advertised_max_frame_size_passes(rig):
    """RFC 9113 §4.2, the other side: a DATA frame of exactly
    SETTINGS_MAX_FRAME_SIZE (16,384) is legal and reaches the app."""
    rig.start()
    c = rig.raw()
    body = pattern(16384, 2)
    c.send(c.request(1, "/sha", method="POST", end_stream=False),
           raw_frame(DATA, END_STREAM, 1, body))
    c.wait(lambda: c.ended(1), DEADLINE, "the answer")
    assert json.loads(c.data[1]) == {"len": 16384, "sha256": hashlib.sha256(body).hexdigest()}
    assert not c.goaways() and not c.resets(1), c.describe()


@pytest.mark.parametrize("interruption", [
    priority(1, 0),
    raw_frame(DATA, 0, 1, MARK),
    raw_frame(HEADERS, END_HEADERS, 3, BLOCK),
    raw_frame(0x20, 0, 0, MARK),
    raw_frame(CONTINUATION, END_HEADERS, 3, BLOCK),
], ids=["PRIORITY", "DATA", "HEADERS-of-another-stream", "unknown-type",
        "CONTINUATION-of-another-stream"])
def test_a_header_block_interrupted(rig, interruption):
    """RFC 9113 §4.3, §6.2, §6.10: a field block is a contiguous sequence of
    frames (HEADERS then CONTINUATIONs of the same stream); any other frame
    (an unknown type too), or a CONTINUATION of another stream, in between
    is a connection error PROTOCOL_ERROR. The guard decodes every block, so
    it judges this itself; the app never sees the block."""
    rig.start()
    c = rig.raw()
    c.send(raw_frame(HEADERS, 0, 1, literal_block(request_fields("/hold"))), interruption)
    assert_connection_error(rig, c, E.PROTOCOL_ERROR,
                            lambda f: f.type in (HEADERS, CONTINUATION) and f.stream in (1, 3),
                            "an interrupted header block (§4.3)")


@pytest.mark.parametrize("case", ["after-END_HEADERS", "after-DATA", "idle-stream"])
def test_continuation_without_its_headers(rig, case):
    """RFC 9113 §6.10: a CONTINUATION not preceded by a HEADERS, PUSH_PROMISE
    or CONTINUATION without END_HEADERS on its stream is a connection error
    PROTOCOL_ERROR. Answered by the guard (it gathers every block)."""
    rig.start()
    c = rig.raw()
    before = []
    if case != "idle-stream":
        held(rig, c, 1)
    if case == "after-DATA":
        before.append(raw_frame(DATA, 0, 1, b"body"))
    sid = 7 if case == "idle-stream" else 1
    c.send(*before, raw_frame(CONTINUATION, END_HEADERS, sid, literal_block([(MARK.decode(), "1")])))
    assert_connection_error(rig, c, E.PROTOCOL_ERROR, is_frame(CONTINUATION, sid, MARK),
                            f"CONTINUATION {case} (§6.10)")


@pytest.mark.parametrize("block", [
    b"\x82\x86\x84" + hpack_int(70, 7, 0x80),
    b"\x82\x86\x84" + hpack_int(62, 4) + b"\x01a",
    hpack_int(8192, 5, 0x20) + b"\x82\x86\x84",
    b"\x82" + hpack_int(0, 5, 0x20) + b"\x86\x84",
    b"\x82\x86\x84\x41\x84\xff\xff\xff\xff",
], ids=["index-past-the-tables", "name-index-past-the-tables", "size-update-above-the-setting",
        "size-update-after-a-field", "huffman-eos"])
def test_a_header_block_that_does_not_decode(rig, block):
    """RFC 7541 §2.3.3 (an index past both tables), §4.2 and §6.3 (a table
    size update above SETTINGS_HEADER_TABLE_SIZE, or after the block's first
    field), §5.2 (EOS in a Huffman string): decoding errors, which RFC 9113
    §4.3 makes a connection error COMPRESSION_ERROR. The guard decodes every
    client block (to follow the table), so it fails first; the app never
    sees the block."""
    rig.start()
    c = rig.raw()
    c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    assert_connection_error(rig, c, E.COMPRESSION_ERROR, is_frame(HEADERS, 1),
                            "an undecodable header block")


@pytest.mark.parametrize("kind", ["DATA", "HEADERS"])
def test_padding_as_long_as_the_payload(rig, kind):
    """RFC 9113 §6.1, §6.2: padding whose length is at least the frame
    payload's is a connection error PROTOCOL_ERROR. The guard reads every
    DATA and HEADERS frame's padding (it gives a dropped frame's window
    back, and decodes every block), so it answers itself."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    if kind == "DATA":
        frame = raw_frame(DATA, PADDED, 1, bytes([len(MARK) + 1]) + MARK)
        sid = 1
    else:
        frame = raw_frame(HEADERS, PADDED | END_HEADERS | END_STREAM, 3, bytes([len(BLOCK) + 1]) + BLOCK)
        sid = 3
    c.send(frame)
    assert_connection_error(rig, c, E.PROTOCOL_ERROR,
                            lambda f: f.type == frame[3] and f.stream == sid and f.flags & PADDED,
                            f"{kind} with too much padding (§6.1, §6.2)")


@pytest.mark.parametrize("sid", [0, 1], ids=["connection", "stream"])
def test_window_update_of_zero(rig, sid):
    """RFC 9113 §6.9: a WINDOW_UPDATE increment of 0 is a stream error
    PROTOCOL_ERROR on a stream, a connection error on the connection. The
    guard tracks both windows (they bound what it writes), so it answers;
    on a stream, the app's stream is cancelled with it."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(window_update(sid, 0))
    offending = lambda f: f.type == WINDOW_UPDATE and f.payload == b"\0\0\0\0"  # noqa: E731
    if sid == 0:
        assert_connection_error(rig, c, E.PROTOCOL_ERROR, offending, "WINDOW_UPDATE 0 (§6.9)")
    else:
        assert_stream_error(rig, c, 1, E.PROTOCOL_ERROR, offending, "WINDOW_UPDATE 0 (§6.9)",
                            probe_sid=3)


@pytest.mark.parametrize("sid", [0, 1], ids=["connection", "stream"])
def test_a_window_over_2_31_minus_1(rig, sid):
    """RFC 9113 §6.9.1: a WINDOW_UPDATE that takes a window past 2^31-1 is
    FLOW_CONTROL_ERROR: a connection error on the connection's window, a
    stream error on a stream's. The guard holds both windows (see above)."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(window_update(sid, MAX_STREAM_ID))
    offending = lambda f: f.type == WINDOW_UPDATE and f.payload == struct.pack(">I", MAX_STREAM_ID)  # noqa: E731
    if sid == 0:
        assert_connection_error(rig, c, E.FLOW_CONTROL_ERROR, offending, "connection window overflow")
    else:
        assert_stream_error(rig, c, 1, E.FLOW_CONTROL_ERROR, offending, "stream window overflow",
                            probe_sid=3)


def test_an_initial_window_change_that_overflows_a_stream(rig):
    """RFC 9113 §6.9.2: a SETTINGS_INITIAL_WINDOW_SIZE change that takes any
    stream's window past 2^31-1 is a connection error FLOW_CONTROL_ERROR.
    The guard applies the change to the windows it holds, and answers."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(window_update(1, MAX_STREAM_ID - 65535), settings([(S.INITIAL_WINDOW_SIZE, 65536)]))
    payload = struct.pack(">HI", S.INITIAL_WINDOW_SIZE, 65536)
    assert_connection_error(rig, c, E.FLOW_CONTROL_ERROR,
                            lambda f: f.type == SETTINGS and payload in f.payload,
                            "an INITIAL_WINDOW_SIZE that overflows a stream (§6.9.2)")


@pytest.mark.parametrize("case", ["PRIORITY-on-an-open-stream", "HEADERS-opening-a-stream",
                                  "PRIORITY-on-an-idle-stream"])
def test_a_stream_that_depends_on_itself(rig, case):
    """RFC 9113 §5.3.1 (RFC 7540 §5.3.1's rule, kept for the PRIORITY frame
    and HEADERS' priority fields, §6.2, §6.3): a stream cannot depend on
    itself; a stream error PROTOCOL_ERROR. On an idle stream no RST_STREAM
    may be sent (§6.4), so the guard makes it a connection error (§5.4.1
    allows that). The guard answers: a HEADERS that opens a stream this
    way is refused before the app sees it."""
    rig.start()
    c = rig.raw()
    if case == "PRIORITY-on-an-open-stream":
        held(rig, c, 1)
        c.send(priority(1, 1))
        assert_stream_error(rig, c, 1, E.PROTOCOL_ERROR, lambda f: f.type == PRIORITY,
                            case, probe_sid=3)
    elif case == "HEADERS-opening-a-stream":
        c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM | PRIORITY_FLAG, 1,
                         struct.pack(">IB", 1, 16) + BLOCK))
        assert_stream_error(rig, c, 1, E.PROTOCOL_ERROR, is_frame(HEADERS, 1), case, probe_sid=3)
    else:
        c.send(priority(9, 9))
        assert_connection_error(rig, c, E.PROTOCOL_ERROR, lambda f: f.type == PRIORITY, case)


def test_priority_of_the_wrong_length(rig):
    """RFC 9113 §6.3: a PRIORITY frame whose length is not 5 is a stream
    error FRAME_SIZE_ERROR. Answered by the guard on the open stream (the
    app's is cancelled)."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(priority(1, 0, length=4))
    assert_stream_error(rig, c, 1, E.FRAME_SIZE_ERROR, lambda f: f.type == PRIORITY,
                        "PRIORITY of 4 bytes (§6.3)", probe_sid=3)


def test_push_promise_from_the_client(rig):
    """RFC 9113 §8.4 (and §6.6): a client cannot push; a server MUST treat a
    PUSH_PROMISE as a connection error PROTOCOL_ERROR. The guard is the
    client's server and answers it."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    c.send(raw_frame(PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2) + BLOCK))
    assert_connection_error(rig, c, E.PROTOCOL_ERROR, lambda f: f.type == PUSH_PROMISE,
                            "PUSH_PROMISE from the client (§8.4)")


@pytest.mark.parametrize("frame,code", [
    (raw_frame(PING, 0, 0, b"1234567"), E.FRAME_SIZE_ERROR),
    (raw_frame(PING, 0, 1, b"12345678"), E.PROTOCOL_ERROR),
    (raw_frame(GOAWAY, 0, 1, struct.pack(">II", 0, 0)), E.PROTOCOL_ERROR),
    (raw_frame(GOAWAY, 0, 0, b"\0\0\0\0"), E.FRAME_SIZE_ERROR),
], ids=["PING-of-7-bytes", "PING-on-a-stream", "GOAWAY-on-a-stream", "GOAWAY-of-4-bytes"])
def test_a_connection_frame_malformed(rig, frame, code):
    """RFC 9113 §6.7: a PING whose length is not 8 is a connection error
    FRAME_SIZE_ERROR, one on a stream PROTOCOL_ERROR; §6.8: a GOAWAY on a
    stream, PROTOCOL_ERROR; §4.2: a frame too short for its fields (a
    4-byte GOAWAY), FRAME_SIZE_ERROR. Connection frames are the guard's
    (it acks PINGs alone, and runs its own GOAWAY sequence): it answers."""
    rig.start()
    c = rig.raw()
    c.send(frame)
    assert_connection_error(rig, c, code, lambda f: f.type == frame[3] and f.payload == frame[9:]
                            and not f.ack, "a malformed PING or GOAWAY")


def test_the_concurrent_stream_limit(rig):
    """RFC 9113 §5.1.2: a HEADERS that takes the client past the
    SETTINGS_MAX_CONCURRENT_STREAMS it was sent is a stream error
    PROTOCOL_ERROR or REFUSED_STREAM. The guard advertises the app's limit
    (here 2; lowered to its own when that is lower) and refuses the third
    stream itself, REFUSED_STREAM: never processed, safe to retry (§8.7).
    The app, whose limit it is, never sees the stream."""
    app = rig.start(App(settings={S.MAX_CONCURRENT_STREAMS: 2}))
    c = rig.raw()

    def limits():
        return [struct.unpack(">I", f.payload[i + 2:i + 6])[0] for f in c.frames(SETTINGS)
                for i in range(0, f.length, 6)
                if struct.unpack(">H", f.payload[i:i + 2])[0] == S.MAX_CONCURRENT_STREAMS]
    c.wait(lambda: limits()[-1:] == [2], DEADLINE, "SETTINGS_MAX_CONCURRENT_STREAMS 2")
    held(rig, c, 1)
    held(rig, c, 3)
    c.send(c.request(5, "/hold"))
    c.wait(lambda: c.resets(5), DEADLINE, "RST_STREAM on stream 5")
    assert c.resets(5) == [E.REFUSED_STREAM], c.describe()
    c.send(rst(1))
    c.wait(lambda: app.find(path="/hold")[0].reset is not None, DEADLINE, "the reset at the app")
    probe(c, 7)
    assert not [f for f in app_frames(app) if f.stream == 5], "the app saw the refused stream"


@pytest.mark.parametrize("fields", [
    request_fields("/bytes?n=1", extra=[("X-Upper", "1")]),
    request_fields("/bytes?n=1", extra=[("connection", "keep-alive")]),
    request_fields("/bytes?n=1", extra=[("keep-alive", "timeout=5")]),
    request_fields("/bytes?n=1", extra=[("proxy-connection", "keep-alive")]),
    request_fields("/bytes?n=1", extra=[("transfer-encoding", "chunked")]),
    request_fields("/bytes?n=1", extra=[("upgrade", "websocket")]),
    request_fields("/bytes?n=1", extra=[("te", "gzip")]),
    request_fields("/bytes?n=1", extra=[(":foo", "bar")]),
    request_fields("/bytes?n=1", extra=[(":status", "200")]),
    [(":method", "GET"), (":scheme", "http"), ("x-a", "1"), (":path", "/bytes?n=1")],
    request_fields("/bytes?n=1", extra=[(":path", "/bytes?n=2")]),
    request_fields("/bytes?n=1", extra=[(":method", "POST")]),
    [(":scheme", "http"), (":path", "/bytes?n=1")],
    [(":method", "GET"), (":path", "/bytes?n=1")],
    [(":method", "GET"), (":scheme", "http")],
    request_fields(""),
    [(":method", "CONNECT"), (":authority", "guard.test:443"), (":path", "/")],
    [(":method", "CONNECT")],
    request_fields("/bytes?n=1", extra=[(":protocol", "websocket")]),
    request_fields("/bytes?n=1", extra=[("x-bad name", "1")]),
    request_fields("/bytes?n=1", extra=[("x-a", "1\r\nx-b: 2")]),
], ids=["uppercase-name", "connection", "keep-alive", "proxy-connection", "transfer-encoding",
        "upgrade", "te-not-trailers", "unknown-pseudo-header", "response-pseudo-header",
        "pseudo-header-after-a-field", "path-twice", "method-twice", "no-method", "no-scheme",
        "no-path", "empty-path", "connect-with-a-path", "connect-without-authority",
        "protocol-without-connect", "space-in-a-name", "newline-in-a-value"])
def test_a_malformed_request(rig, fields):
    """RFC 9113 §8.1.1: a malformed request is a stream error PROTOCOL_ERROR,
    and an intermediary MUST NOT forward it. Malformed: an uppercase field
    name (§8.2); a connection-specific field, or TE other than `trailers`
    (§8.2.2); an unknown or response pseudo-header, one after a regular
    field, or one twice; :method, :scheme or :path missing, or :path empty
    (§8.3, §8.3.1); a CONNECT with :path or without :authority (§8.5);
    :protocol on anything but CONNECT (RFC 8441 §4). And, as §8.2.1 says
    implementations SHOULD check, a name with a space, a value with CR/LF.
    The guard refuses the stream itself: the app never sees it."""
    rig.start()
    c = rig.raw()
    c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, literal_block(fields)))
    assert_stream_error(rig, c, 1, E.PROTOCOL_ERROR, is_frame(HEADERS, 1),
                        f"a malformed request {fields}", probe_sid=3)


@pytest.mark.parametrize("case", ["data-beyond-it", "data-short-of-it", "no-data",
                                  "trailers-short-of-it"])
def test_content_length_and_the_data(rig, case):
    """RFC 9113 §8.1.1: a request whose content-length is not the sum of its
    DATA frames' payloads is malformed: a stream error PROTOCOL_ERROR, and
    not forwarded. The guard counts the request's DATA against it; the
    frame that proves it wrong never reaches the app (which gets RST_STREAM
    CANCEL for the part it already has)."""
    rig.start()
    c = rig.raw()
    cl = [("content-length", "10")]
    if case == "no-data":
        c.send(c.request(1, "/sha", method="POST", extra=cl, end_stream=True))
        offending = is_frame(HEADERS, 1)
    else:
        c.send(c.request(1, "/sha", method="POST", extra=cl, end_stream=False))
        if case == "data-beyond-it":
            frames = [raw_frame(DATA, 0, 1, b"12345"), raw_frame(DATA, 0, 1, b"67890" + MARK)]
            offending = is_frame(DATA, 1, MARK)
        elif case == "data-short-of-it":
            frames = [raw_frame(DATA, 0, 1, b"12345"), raw_frame(DATA, END_STREAM, 1, MARK[:4])]
            offending = lambda f: f.type == DATA and f.stream == 1 and f.end_stream  # noqa: E731
        else:
            frames = [raw_frame(DATA, 0, 1, b"12345"), c.headers(1, [("x-trailer", "1")])]
            offending = lambda f: f.type == HEADERS and f.stream == 1 and f.end_stream  # noqa: E731
        c.send(*frames)
    assert_stream_error(rig, c, 1, E.PROTOCOL_ERROR, offending,
                        f"content-length 10, {case} (§8.1.1)", probe_sid=3)


@pytest.mark.parametrize("case", ["without-END_STREAM", "with-a-pseudo-header"])
def test_malformed_trailers(rig, case):
    """RFC 9113 §8.1: a HEADERS after the request's head without END_STREAM
    (trailers must end the stream), or trailers with a pseudo-header
    (§8.1, §8.3), make the request malformed: a stream error PROTOCOL_ERROR
    (§8.1.1). The guard answers; the app's stream is cancelled and never
    gets the block."""
    rig.start()
    c = rig.raw()
    held(rig, c, 1)
    if case == "without-END_STREAM":
        block = literal_block([(MARK.decode(), "1")])
        c.send(raw_frame(HEADERS, END_HEADERS, 1, block))
    else:
        block = literal_block([(":path", "/again"), (MARK.decode(), "1")])
        c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    assert_stream_error(rig, c, 1, E.PROTOCOL_ERROR, is_frame(HEADERS, 1, MARK),
                        f"trailers {case} (§8.1)", probe_sid=3)


def test_unknown_types_flags_and_the_reserved_bit_are_ignored(rig):
    """RFC 9113 §4.1, §5.5: unknown frame types (outside a header block),
    flags a frame type does not define, and the reserved bit of the stream
    id are ignored; an unknown setting too (§6.5.2). Nothing here is an
    error: the request is answered, the connection stays up. (Unknown frames
    pass on to the app, which ignores them as well: extensions are end to
    end.)"""
    rig.start()
    c = rig.raw()
    c.send(raw_frame(0x20, 0xff, 0, b"unknown on the connection"),
           settings([(0x4242, 7)]),
           c.request(1, "/sha", method="POST", end_stream=False),
           raw_frame(0x21, 0, 1, b"unknown on a stream"),
           raw_frame(DATA, 0xf0 | 0x02, 1, b"odd flags"),
           reserved_bit(raw_frame(DATA, END_STREAM, 1, b"; reserved bit")))
    c.wait(lambda: c.ended(1), DEADLINE, "the answer")
    body = b"odd flags; reserved bit"
    assert json.loads(c.data[1]) == {"len": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    assert not c.goaways() and not c.resets(1), c.describe()
    assert not rig.app.h2_errors(), rig.app.h2_errors()


def test_frames_a_stream_still_takes_as_it_closes(rig):
    """RFC 9113 §5.1, the frames that are not errors, so the guard's rules
    above stop where the RFC's do: on a half-closed (remote) stream,
    WINDOW_UPDATE, PRIORITY and RST_STREAM; on a half-closed (local) one
    (answered before its request ended), DATA; on a closed one, PRIORITY,
    and WINDOW_UPDATE and RST_STREAM for a while after it ended; and no
    RST_STREAM answers a RST_STREAM (§5.4.2). Each is passed on or dropped,
    none is answered."""
    app = rig.start()
    app.route("/early", lambda k, req, event, data:
              event == "headers" and k.respond(req, [(":status", "200")], b"early"))
    c = rig.raw()
    held(rig, c, 1, end_stream=True)
    c.send(window_update(1, 100), priority(1, 0), rst(1))
    c.send(c.request(3, "/early", end_stream=False))
    c.wait(lambda: c.ended(3), DEADLINE, "the early answer")
    c.send(raw_frame(DATA, END_STREAM, 3, b"after the answer"))
    answered(c, 5)
    c.send(priority(5, 0), window_update(5, 100), rst(5), rst(5), rst(1))
    app.wait(lambda: [r.body for r in app.find(path="/early")] == [b"after the answer"], DEADLINE,
             "the request body after its answer at the app")
    probe(c, 7)
    assert not c.goaways(), c.describe()
    got = {sid: c.resets(sid) for sid in (1, 3, 5, 7)}
    assert all(not codes for codes in got.values()), f"RST_STREAM from the guard: {got}"
    assert not app.h2_errors(), app.h2_errors()


def test_a_ping_is_acked(rig):
    """RFC 9113 §6.7: a PING without ACK is answered with a PING with ACK and
    the same payload (here by the app, through the guard; alone, by the
    guard: test_guard_alone_is_a_conformant_server)."""
    rig.start()
    c = rig.raw()
    c.send(ping_frame(b"conform!"))
    c.wait(lambda: any(f.ack and f.payload == b"conform!" for f in c.frames(PING)), DEADLINE,
           "the PING's ack")
    assert not c.goaways(), c.describe()
