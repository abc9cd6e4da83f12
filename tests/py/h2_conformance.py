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
    ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, HEADERS, MAX_STREAM_ID,
    PADDED, PING, PREFACE, PRIORITY_FLAG, PUSH_PROMISE, RST_STREAM, SETTINGS, App, Client,
    Deadline, E, Guard, Http1App, NoApp, S, assert_bytes, err_name, grpc_message, grpc_tick, pattern,
    ping_frame, raw_frame, split_grpc,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("DRAINSHIM_BIN") or os.path.join(ROOT, "target", "debug", "drainshim")
MB = 1 << 20

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

    def start(self, app=None, guard_args=(), log=Guard.LOG):
        self.app = (app or App()).start()
        self.guard = Guard(BIN, self.app.addr, guard_args, log)
        return self.app

    def client(self, **kw):
        c = Client(self.guard.addr, name=f"client-{len(self.clients) + 1}", **kw)
        self.clients.append(c)
        return c

    def close(self):
        for c in self.clients:
            c.close()
        if self.guard is not None:
            self.guard.stop()   # kills it and waits for the exit
        if self.app is not None:
            self.app.close()

    def describe(self):
        parts = [c.describe() for c in self.clients]
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

