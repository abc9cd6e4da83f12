"""RFC 9113 §6.7, §6.8: PING and GOAWAY. The app's own graceful shutdown
(GOAWAY, then PING, then the last stream id), the client's GOAWAY, both at
once, and PINGs malformed, unsolicited or to be acked."""
import hashlib

from h2peer import (
    ACK, MAX_STREAM_ID, PING, Deadline, err_name, grpc_tick, pattern, ping_frame, raw_frame,
    split_grpc,
)
from .harness import (
    BLAMES_CLIENT, DEADLINE, MB, assert_clean, assert_complete, assert_goaway_ids_never_grow,
    assert_grpc_ok, assert_no_connection_error, assert_only_graceful_resets, assert_sane,
    retryable_end, sha_answer,
)


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
