"""RFC 9113 §6: the frame definitions, each frame's own rules: DATA,
HEADERS, PRIORITY, RST_STREAM, PUSH_PROMISE, PING, GOAWAY and CONTINUATION
where they belong, of the right length, with padding that fits. SETTINGS
(§6.5), PING and GOAWAY (§6.7, §6.8) and WINDOW_UPDATE (§6.9) have files of
their own."""
import struct

import pytest
from hyperframe.frame import PushPromiseFrame

from h2peer import (
    CONTINUATION, DATA, E, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PADDED, PING, PRIORITY,
    PUSH_PROMISE, RST_STREAM, err_name, literal_block, pattern, raw_frame,
)
from .harness import (
    BLOCK, MARK, assert_complete, assert_connection_error, assert_no_connection_error,
    assert_sane, assert_stream_error, held, is_frame, priority, rst,
)


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
