"""RFC 9113 §6.9: WINDOW_UPDATE and flow control. Default and tiny windows
both ways, and the increments and window sizes the RFC forbids."""
import hashlib
import struct

import pytest

from h2peer import E, MAX_STREAM_ID, S, SETTINGS, WINDOW_UPDATE, App, pattern, raw_frame
from .harness import (
    MB, assert_clean, assert_complete, assert_connection_error, assert_stream_error, held,
    settings, sha_answer, window_update,
)


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
