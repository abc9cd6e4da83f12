"""RFC 9113 §3: starting HTTP/2. The client's connection preface, and what
is not one."""
import pytest

from h2peer import E, PING, PREFACE, ping_frame
from .harness import DEADLINE, assert_connection_error, settings


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
