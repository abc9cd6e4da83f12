#!/usr/bin/env python3
"""Writes the seed inputs of the frame_relay fuzz target (fuzz/seeds/frame_relay/).

The target's input is `Input` in fuzz/fuzz_targets/frame_relay.rs, decoded
from the fuzzer's bytes by the `arbitrary` crate (1.x). This script encodes
a few whole conversations the way `arbitrary` decodes them, so the fuzzer
starts from streams that open, get answered and end:

- an enum variant: a little-endian u32 whose (value * variants) >> 32 is the
  variant's index (the target's own `Step`, `StreamId` and `Block` read one
  selector byte instead);
- a bool, or an Option's presence: one byte, odd for true;
- an integer: its little-endian bytes;
- a Vec: each element behind a byte 1, then a byte 0 (the input's last
  field, its steps, just ends).

Whenever `Input` changes, update the encoders below to match and run this
again (`python3 fuzz/seeds/frame_relay.py`); check a seed with
`RUST_LIBFUZZER_DEBUG_PATH=/tmp/input.txt <frame_relay binary> <seed>`,
which writes the input as the target decoded it.
"""

import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frame_relay")


def variant(index, count):
    """The u32 that `arbitrary`'s derive reads as variant `index` of `count`."""
    return struct.pack("<I", -(-(index << 32) // count))


def boolean(b):
    return b"\x01" if b else b"\x00"


def u8(v):
    return struct.pack("<B", v)


def u16(v):
    return struct.pack("<H", v)


def u32(v):
    return struct.pack("<I", v)


def vec(items):
    return b"".join(b"\x01" + i for i in items) + b"\x00"


def byte_vec(data):
    return vec([bytes([b]) for b in data])


def option(encoded):
    return b"\x00" if encoded is None else b"\x01" + encoded


# Prelude
HANDSHAKE, PREFACE, NOTHING, ALONE = (variant(i, 4) for i in range(4))

# Step selectors (one byte; see `impl Arbitrary for Step`).
FRAME, BATCHED, SPLIT, REPEAT, DRAIN, WAIT, RAW = 0, 140, 185, 210, 230, 240, 245

# Flags
END_STREAM = ACK = 0x1
END_HEADERS = 0x4


def stream(n):
    """StreamId::Small(n) for n < 16; 'max' for 2^31-1."""
    return u8(224) if n == "max" else u8(n)


def frame(from_client, flags, sid, kind):
    return boolean(from_client) + u8(flags) + stream(sid) + kind


# Kind variants, in their order in `enum Kind`.
KINDS = 12


def data(body, padding=None):
    return variant(0, KINDS) + body + option(None if padding is None else u8(padding))


def headers(block, padding=None, priority=None, continuations=0):
    return (
        variant(1, KINDS)
        + block
        + option(None if padding is None else u8(padding))
        + option(priority)
        + u8(continuations)
    )


def priority(fields):
    return variant(2, KINDS) + fields


def rst_stream(code):
    return variant(3, KINDS) + u32(code)


def settings(pairs):
    return variant(4, KINDS) + vec([setting + value for setting, value in pairs])


def push_promise(promised, block):
    return variant(5, KINDS) + stream(promised) + block + option(None)


def ping(p):
    return variant(6, KINDS) + p


def goaway(last, code):
    return variant(7, KINDS) + stream(last) + u32(code) + byte_vec(b"")


def window_update(connection, increment):
    return variant(8, KINDS) + boolean(connection) + increment


# Body
def grpc(*messages):
    return variant(0, 4) + vec([byte_vec(m) for m in messages])


def sse(*events):
    return variant(1, 4) + vec([byte_vec(e) for e in events])


def zeros(n):
    return variant(2, 4) + u16(n)


# Block (one selector byte) and Head
(
    GRPC_REQUEST,
    GRPC_WEB_REQUEST,
    GET_REQUEST,
    WEBSOCKET,
    GRPC_RESPONSE,
    SSE_RESPONSE,
    CONTINUE,
    NOT_FOUND,
    TRAILERS,
    TRAILERS_ONLY,
) = range(10)

# Repr
STATIC, INDEXING, LITERAL, NEVER_INDEXED = (variant(i, 6) for i in range(4))


def dynamic(n):
    return variant(4, 6) + u8(n)


def head(which, reprs=()):
    return u8(0) + variant(which, 10) + vec(list(reprs))


def fields(indices):
    """Block::Fields: FIELDS entries by index, each as `Repr::Static`."""
    return u8(192) + vec([u8(i) + STATIC for i in indices])


# FIELDS indices (fuzz_targets/frame_relay.rs).
F_POST, F_SCHEME, F_PATH, F_X_FUZZ = 0, 3, 4, 17


# Ping
def ping_opaque(b):
    return variant(0, 4) + b


PROBE_ACK = variant(2, 4)


def ping_any(b):
    return variant(3, 4) + byte_vec(b)


# Increment
def small(n):
    return variant(1, 4) + u16(n)


INCREMENT_ZERO = variant(0, 4)

# Setting
(
    HEADER_TABLE_SIZE,
    ENABLE_PUSH,
    MAX_CONCURRENT_STREAMS,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    ENABLE_CONNECT_PROTOCOL,
) = (variant(i, 8) for i in range(7))


def raw_value(v):
    return variant(2, 3) + u32(v)


def step(selector, *parts):
    return b"\x01" + u8(selector) + b"".join(parts)


def seed(prelude, *steps):
    return prelude + b"".join(steps)


C, A = True, False
MSG = b"\x0a\x03abc"
# A gRPC request's five fields as the dynamic entries indexing them added.
REUSED = [dynamic(i) for i in (4, 3, 2, 1, 0)]

SEEDS = {
    # A unary gRPC call, whole.
    "grpc_unary": seed(
        HANDSHAKE,
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(C, END_STREAM, 1, data(grpc(MSG)))),
        step(FRAME, frame(A, END_HEADERS, 1, headers(head(GRPC_RESPONSE)))),
        step(BATCHED, frame(A, 0, 1, data(grpc(MSG)))),
        step(BATCHED, frame(A, END_HEADERS | END_STREAM, 1, headers(head(TRAILERS)))),
    ),
    # A long-lived stream (3 messages), then the application's graceful
    # stop: GOAWAY(2^31-1), the client acks the guard's probe, GOAWAY(1),
    # and a stream above it refused.
    "app_goaway": seed(
        HANDSHAKE,
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(A, END_HEADERS, 1, headers(head(GRPC_RESPONSE)))),
        step(FRAME, frame(A, 0, 1, data(grpc(MSG, MSG, MSG)))),
        step(FRAME, frame(C, END_HEADERS, 3, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(A, 0, 0, goaway("max", 0))),
        step(FRAME, frame(C, ACK, 0, ping(PROBE_ACK))),
        step(FRAME, frame(A, 0, 0, goaway(1, 0))),
        step(FRAME, frame(A, END_HEADERS | END_STREAM, 1, headers(head(TRAILERS)))),
    ),
    # SETTINGS both ways, HPACK with indexing (and the dynamic entries
    # used), then the application runs the client's connection window dry
    # (the gate splits its DATA) until the client's WINDOW_UPDATEs.
    "windows": seed(
        HANDSHAKE,
        step(
            FRAME,
            frame(
                C,
                0,
                0,
                settings(
                    [
                        (MAX_FRAME_SIZE, raw_value(65536)),
                        (INITIAL_WINDOW_SIZE, raw_value(1 << 20)),
                        (HEADER_TABLE_SIZE, raw_value(8192)),
                    ]
                ),
            ),
        ),
        step(
            FRAME,
            frame(
                A,
                0,
                0,
                settings(
                    [
                        (MAX_CONCURRENT_STREAMS, raw_value(10)),
                        (HEADER_TABLE_SIZE, raw_value(8192)),
                        (ENABLE_PUSH, raw_value(0)),
                    ]
                ),
            ),
        ),
        step(FRAME, frame(A, ACK, 0, settings([]))),
        step(FRAME, frame(C, ACK, 0, settings([]))),
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GRPC_REQUEST, [INDEXING] * 5)))),
        # The same request again, from the five entries the first added
        # (62 is the newest: te).
        step(FRAME, frame(C, END_HEADERS, 3, headers(head(GRPC_REQUEST, REUSED)))),
        step(FRAME, frame(A, END_HEADERS, 1, headers(head(GRPC_RESPONSE, [INDEXING, INDEXING])))),
        step(
            FRAME,
            frame(A, END_HEADERS, 3, headers(head(GRPC_RESPONSE, [dynamic(1), dynamic(0)]))),
        ),
        step(REPEAT, frame(A, 0, 1, data(zeros(16384), padding=7)), u8(3)),
        step(FRAME, frame(C, 0, 0, window_update(True, small(40000)))),
        step(FRAME, frame(C, 0, 1, window_update(False, small(40000)))),
        step(FRAME, frame(C, 0, 0, window_update(True, INCREMENT_ZERO))),
    ),
    # The application pushes (refused), answers with 100 then 200 over a
    # CONTINUATION, and the client's request is split mid-frame.
    "push_and_continuations": seed(
        HANDSHAKE,
        # Padded, with priority fields, and 3 CONTINUATIONs; cut after 11 bytes.
        step(
            SPLIT,
            frame(
                C,
                END_HEADERS,
                1,
                headers(
                    head(GRPC_REQUEST), padding=3, priority=b"\0\0\0\0\x10", continuations=200
                ),
            ),
            u16(11),
        ),
        step(FRAME, frame(A, END_HEADERS, 1, push_promise(2, head(GET_REQUEST)))),
        step(FRAME, frame(A, END_HEADERS, 1, headers(head(CONTINUE)))),
        step(FRAME, frame(A, END_HEADERS, 1, headers(head(GRPC_RESPONSE), continuations=255))),
        step(FRAME, frame(C, 0, 1, rst_stream(8))),
        step(FRAME, frame(A, 0, 1, data(grpc(MSG)))),
    ),
    # The preface alone: the SETTINGS are sent here, the application's
    # last (the client's frames wait for them); an SSE stream and a
    # gRPC-Web one; a short PING from the application.
    "preface_sse": seed(
        PREFACE,
        step(FRAME, frame(C, 0, 0, settings([(ENABLE_CONNECT_PROTOCOL, raw_value(1))]))),
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GET_REQUEST)))),
        step(FRAME, frame(C, END_HEADERS | END_STREAM, 3, headers(head(GRPC_WEB_REQUEST)))),
        step(FRAME, frame(A, 0, 0, settings([]))),
        step(
            FRAME,
            frame(A, END_HEADERS, 1, headers(head(SSE_RESPONSE, [LITERAL, NEVER_INDEXED]))),
        ),
        step(FRAME, frame(A, 0, 1, data(sse(b"one", b"two")))),
        step(FRAME, frame(A, END_HEADERS | END_STREAM, 3, headers(head(TRAILERS_ONLY)))),
        step(FRAME, frame(A, 0, 0, ping(ping_any(b"short")))),
    ),
    # A WebSocket over extended CONNECT (served by the guard itself) beside
    # a relayed stream the application resets.
    "websocket": seed(
        HANDSHAKE,
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(WEBSOCKET)))),
        step(FRAME, frame(C, 0, 1, data(variant(3, 4) + byte_vec(b"\x81\x02hi")))),
        step(FRAME, frame(C, END_HEADERS, 3, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(A, 0, 3, rst_stream(7))),
        step(FRAME, frame(C, 0, 1, window_update(False, small(100)))),
        step(FRAME, frame(A, 0, 0, ping(ping_opaque(b"12345678")))),
    ),
    # Three quiet long-lived streams (two messages each), a drain: each ends
    # after its quiet moment and two SETTINGS round trips to the application
    # (its acks: first the client's SETTINGS, then the barrier's), while the
    # client lowers its table and the application pings.
    "quiet_drain": seed(
        HANDSHAKE,
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(C, END_HEADERS, 3, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(C, END_HEADERS, 5, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(A, END_HEADERS, 1, headers(head(GRPC_RESPONSE)))),
        step(BATCHED, frame(A, 0, 1, data(grpc(MSG, MSG)))),
        step(BATCHED, frame(A, END_HEADERS, 3, headers(head(GRPC_RESPONSE)))),
        step(BATCHED, frame(A, 0, 3, data(grpc(MSG, MSG)))),
        step(BATCHED, frame(A, END_HEADERS, 5, headers(head(GRPC_RESPONSE)))),
        step(BATCHED, frame(A, 0, 5, data(grpc(MSG, MSG)))),
        step(DRAIN),
        step(WAIT, u16(600)),
        step(FRAME, frame(C, 0, 0, settings([(HEADER_TABLE_SIZE, raw_value(0))]))),
        step(FRAME, frame(A, ACK, 0, settings([]))),
        step(FRAME, frame(A, ACK, 0, settings([]))),
        step(FRAME, frame(A, 0, 0, ping(ping_opaque(b"12345678")))),
        step(FRAME, frame(A, ACK, 0, settings([]))),
        step(FRAME, frame(A, ACK, 0, settings([]))),
        step(WAIT, u16(100)),
        step(FRAME, frame(C, 0, 0, window_update(True, small(1000)))),
    ),
    # What the guard answers itself (RFC 9113): a stream depending on
    # itself, a WINDOW_UPDATE of 0, DATA after the client's END_STREAM,
    # trailers without END_STREAM, a pseudo-header after a regular field,
    # content-length against the DATA; then a MAX_FRAME_SIZE below 2^14
    # (a connection error, last).
    "client_errors": seed(
        HANDSHAKE,
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(C, 0, 1, priority(b"\0\0\0\x01\x10"))),
        step(FRAME, frame(C, END_HEADERS, 3, headers(head(GRPC_REQUEST)))),
        step(BATCHED, frame(C, 0, 3, window_update(False, INCREMENT_ZERO))),
        step(FRAME, frame(C, END_HEADERS | END_STREAM, 5, headers(head(GET_REQUEST)))),
        step(BATCHED, frame(C, 0, 5, data(grpc(MSG)))),
        step(FRAME, frame(C, END_HEADERS, 7, headers(head(GRPC_REQUEST)))),
        step(FRAME, frame(C, END_HEADERS, 7, headers(head(TRAILERS)))),
        step(FRAME, frame(C, END_HEADERS, 9, headers(fields([F_X_FUZZ, F_POST, F_SCHEME, F_PATH])))),
        step(FRAME, frame(C, 0, 11, settings([(MAX_FRAME_SIZE, raw_value(16383))]))),
    ),
    # A WebSocket whose client sends past the window the guard granted
    # (FLOW_CONTROL_ERROR, its data given back), and one it resets.
    "websocket_window": seed(
        HANDSHAKE,
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(WEBSOCKET)))),
        step(REPEAT, frame(C, 0, 1, data(zeros(16384))), u8(2)),
        step(FRAME, frame(C, 0, 1, data(zeros(16384)))),
        step(FRAME, frame(C, END_HEADERS, 3, headers(head(WEBSOCKET)))),
        step(FRAME, frame(C, 0, 3, data(zeros(100)))),
        step(FRAME, frame(C, 0, 3, rst_stream(8))),
    ),
    # No application: the guard answers a gRPC call and a GET itself, acks
    # a PING and a SETTINGS, takes an upload's DATA, serves a WebSocket.
    "alone": seed(
        ALONE,
        step(FRAME, frame(C, 0, 0, settings([(HEADER_TABLE_SIZE, raw_value(256))]))),
        step(FRAME, frame(C, 0, 0, ping(ping_opaque(b"12345678")))),
        step(FRAME, frame(C, END_HEADERS, 1, headers(head(GRPC_REQUEST)))),
        step(BATCHED, frame(C, 0, 1, data(grpc(MSG)))),
        step(FRAME, frame(C, END_HEADERS | END_STREAM, 3, headers(head(GET_REQUEST)))),
        step(FRAME, frame(C, END_HEADERS, 5, headers(head(WEBSOCKET)))),
        step(FRAME, frame(C, 0, 5, data(variant(3, 4) + byte_vec(b"\x81\x02hi")))),
        step(FRAME, frame(C, 0, 9, data(zeros(100)))),
    ),
}


def main():
    os.makedirs(HERE, exist_ok=True)
    for name, data_ in SEEDS.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data_)


if __name__ == "__main__":
    main()
