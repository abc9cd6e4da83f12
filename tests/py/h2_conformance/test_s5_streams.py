"""RFC 9113 §5: streams and multiplexing. Stream states (§5.1), identifiers
(§5.1.1), the concurrency limit (§5.1.2: refused streams, a client that
never reads its refusals), dependencies (§5.3), and many streams of large
bodies at once."""
import select
import socket
import struct

import pytest

from h2peer import (
    CONTINUATION, DATA, E, END_HEADERS, END_STREAM, HEADERS, MAX_STREAM_ID, PREFACE, PRIORITY,
    PRIORITY_FLAG, S, SETTINGS, App, Deadline, Guard, literal_block, pattern, raw_frame,
)
from .harness import (
    BLOCK, DEADLINE, MARK, MB, answered, app_frames, assert_clean, assert_complete,
    assert_connection_error, assert_no_connection_error, assert_sane, assert_stream_error, held,
    is_frame, priority, probe, rst, window_update,
)


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


def test_many_streams_large_bodies(rig):
    rig.start()
    c = rig.client()
    sids = [c.get(f"/bytes?n=200000&seed={i}") for i in range(50)]
    c.wait_done(sids, 60, "50 responses of 200 KB")
    for i, s in enumerate(sids):
        assert_complete(c.stream(s), pattern(200000, i), f"response #{i}")
    assert_clean(rig, c)


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
