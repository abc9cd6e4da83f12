"""RFC 9113 §4: frames. Their format (§4.1: padding, priority and unknown
types or flags passed or ignored), their size (§4.2: each side's
SETTINGS_MAX_FRAME_SIZE held), and field blocks (§4.3: CONTINUATION
sequences, a block interrupted)."""
import hashlib
import json

import pytest
from hyperframe.frame import PriorityFrame

from h2peer import (
    CONTINUATION, DATA, E, END_HEADERS, END_STREAM, HEADERS, PADDED, PRIORITY_FLAG, S, App,
    err_name, grpc_message, literal_block, pattern, raw_frame, request_fields, split_grpc,
)
from .harness import (
    BLAMES_CLIENT, BLOCK, DEADLINE, MARK, MB, assert_clean, assert_complete,
    assert_connection_error, held, priority, probe, reserved_bit, settings, sha_answer,
)


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
