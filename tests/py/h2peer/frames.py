"""Frames and bytes: the constants of RFC 9113 §6, frames and header blocks
built by hand (hyperframe, or HPACK literals that touch no dynamic table),
gRPC messages, and the sniffer that records every frame an end receives
before python-h2 sees it."""

import struct
import time

import h2.errors
import h2.settings
from hyperframe.frame import GoAwayFrame, PingFrame


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE = 0, 1, 2, 3, 4, 5
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 6, 7, 8, 9
TYPE_NAMES = {
    DATA: "DATA", HEADERS: "HEADERS", PRIORITY: "PRIORITY", RST_STREAM: "RST_STREAM",
    SETTINGS: "SETTINGS", PUSH_PROMISE: "PUSH_PROMISE", PING: "PING", GOAWAY: "GOAWAY",
    WINDOW_UPDATE: "WINDOW_UPDATE", CONTINUATION: "CONTINUATION",
}
# Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

E = h2.errors.ErrorCodes
S = h2.settings.SettingCodes
MAX_STREAM_ID = 2**31 - 1


def err_name(code):
    try:
        return E(code).name
    except ValueError:
        return f"0x{code:x}"


# --- bytes -------------------------------------------------------------------

def raw_frame(ftype, flags, stream_id, payload=b""):
    """A frame as bytes, built by hand: for frames hyperframe refuses to build
    (SETTINGS on a stream, a short PING) and for rewriting h2's own frames."""
    return (len(payload).to_bytes(3, "big") + bytes([ftype, flags])
            + (stream_id & MAX_STREAM_ID).to_bytes(4, "big") + payload)


def split_frames(data):
    """Whole frames in `data` as (type, flags, stream_id, payload) tuples."""
    out, i = [], 0
    while i + 9 <= len(data):
        n = int.from_bytes(data[i:i + 3], "big")
        out.append((data[i + 3], data[i + 4],
                    int.from_bytes(data[i + 5:i + 9], "big") & MAX_STREAM_ID,
                    bytes(data[i + 9:i + 9 + n])))
        i += 9 + n
    assert i == len(data), "split_frames: trailing partial frame"
    return out


def goaway_frame(last_stream_id, code=0, debug=b""):
    return GoAwayFrame(0, last_stream_id=last_stream_id, error_code=code,
                       additional_data=debug).serialize()


def ping_frame(data, ack=False):
    return PingFrame(0, opaque_data=data, flags=["ACK"] if ack else []).serialize()


def pattern(n, seed=0):
    """n deterministic bytes; a 251-byte period, so no frame size lines up."""
    block = bytes((i * 7 + seed * 13) % 256 for i in range(251))
    return (block * (n // 251 + 1))[:n]


def first_difference(got, want):
    if got == want:
        return None
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return min(len(got), len(want))


def assert_bytes(got, want, what):
    i = first_difference(bytes(got), want)
    assert i is None, (f"{what}: got {len(got)} bytes, want {len(want)}; "
                       f"first difference at byte {i}")


def grpc_message(payload):
    return b"\0" + struct.pack(">I", len(payload)) + payload


def split_grpc(data):
    """gRPC length-prefixed messages in data, and the bytes left over (a
    partial message: non-empty means data does not end on a boundary)."""
    msgs, i = [], 0
    data = bytes(data)
    while len(data) - i >= 5:
        n = struct.unpack(">I", data[i + 1:i + 5])[0]
        if len(data) - i - 5 < n:
            break
        msgs.append(data[i + 5:i + 5 + n])
        i += 5 + n
    return msgs, data[i:]


# --- frames on the wire --------------------------------------------------------

class Seen:
    """One frame received, as it was on the wire."""

    def __init__(self, ftype, flags, stream_id, payload):
        self.t = time.monotonic()
        self.type, self.flags, self.stream, self.payload = ftype, flags, stream_id, payload

    @property
    def length(self):
        return len(self.payload)

    @property
    def name(self):
        return TYPE_NAMES.get(self.type, f"type0x{self.type:x}")

    @property
    def ack(self):
        return self.type in (SETTINGS, PING) and bool(self.flags & ACK)

    @property
    def end_stream(self):
        return self.type in (DATA, HEADERS) and bool(self.flags & END_STREAM)

    def goaway(self):
        """(last_stream_id, error_code, debug) of a GOAWAY."""
        last, code = struct.unpack(">II", self.payload[:8])
        return last & MAX_STREAM_ID, code, self.payload[8:]

    def rst_code(self):
        return struct.unpack(">I", self.payload[:4])[0]

    def __repr__(self):
        extra = ""
        if self.type == GOAWAY and self.length >= 8:
            last, code, debug = self.goaway()
            extra = f" last={last} {err_name(code)} {debug[:40]!r}"
        elif self.type == RST_STREAM and self.length == 4:
            extra = " " + err_name(self.rst_code())
        elif self.type == PING:
            extra = f" {self.payload!r}"
        elif self.type == WINDOW_UPDATE and self.length == 4:
            extra = f" +{int.from_bytes(self.payload, 'big') & MAX_STREAM_ID}"
        flags = f" flags=0x{self.flags:x}" if self.flags else ""
        return f"{self.name}(s={self.stream} len={self.length}{flags}{extra})"


class Sniffer:
    """Splits received bytes into frames; the server side first takes the
    connection preface. Yields (Seen or None for the preface, raw bytes)."""

    def __init__(self, server):
        self.buf = bytearray()
        self.preface_pending = server

    def feed(self, data):
        self.buf += data
        out = []
        if self.preface_pending:
            if len(self.buf) < len(PREFACE):
                return out
            out.append((None, bytes(self.buf[:len(PREFACE)])))
            del self.buf[:len(PREFACE)]
            self.preface_pending = False
        i = 0
        while len(self.buf) - i >= 9:
            n = int.from_bytes(self.buf[i:i + 3], "big")
            if len(self.buf) - i < 9 + n:
                break
            raw = bytes(self.buf[i:i + 9 + n])
            sid = int.from_bytes(raw[5:9], "big") & MAX_STREAM_ID
            out.append((Seen(raw[3], raw[4], sid, raw[9:]), raw))
            i += 9 + n
        del self.buf[:i]
        return out


# --- header blocks by hand (RFC 7541) ----------------------------------------

def hpack_int(value, prefix, mask=0):
    """An HPACK integer with a `prefix`-bit prefix (RFC 7541 §5.1)."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes([mask | value])
    out, value = bytearray([mask | top]), value - top
    while value >= 128:
        out.append(value % 128 | 0x80)
        value //= 128
    return bytes(out + bytes([value]))


def hpack_literal(name, value):
    """One field as an HPACK literal without indexing, name and value as
    plain strings (RFC 7541 §6.2.2): it touches no dynamic table, so a test
    can put any bytes in a header block (an uppercase name, a second
    `:path`) without the encoder's validation or state."""
    name = name.encode() if isinstance(name, str) else name
    value = value.encode() if isinstance(value, str) else value
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def literal_block(fields):
    return b"".join(hpack_literal(n, v) for n, v in fields)


def request_fields(path, method="GET", extra=()):
    return [(":method", method), (":scheme", "http"), (":authority", "guard.test"),
            (":path", path), *extra]


def frame_flags(bits):
    """hyperframe's flag names for a HEADERS frame's flag bits."""
    names = {END_STREAM: "END_STREAM", END_HEADERS: "END_HEADERS", PADDED: "PADDED",
             PRIORITY_FLAG: "PRIORITY"}
    return [n for b, n in names.items() if bits & b]
