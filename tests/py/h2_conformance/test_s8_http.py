"""RFC 9113 §8: HTTP semantics. Malformed requests (§8.1.1, §8.2, §8.3),
content-length against the DATA, trailers."""
import pytest

from h2peer import (
    DATA, E, END_HEADERS, END_STREAM, HEADERS, literal_block, raw_frame, request_fields,
)
from .harness import MARK, assert_stream_error, held, is_frame


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
