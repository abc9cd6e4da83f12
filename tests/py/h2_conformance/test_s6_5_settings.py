"""RFC 9113 §6.5: SETTINGS. On the wrong stream, of the wrong length, out of
range, and changed mid-connection while data flows."""
import hashlib
import struct

import pytest

from h2peer import ACK, E, S, SETTINGS, err_name, pattern, raw_frame
from .harness import (
    MB, assert_clean, assert_complete, assert_connection_error, settings, sha_answer,
)


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
