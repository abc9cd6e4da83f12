"""What the test apps that serve the bench protocol without generated stubs
(grpc_app.py, slow_app.py) share: its few protobuf fields
(proto/drainshim/bench/v1/stream.proto), encoded and decoded by hand, and
how the tests tell an app to stop."""

import signal
import sys
import threading


def stop_event():
    """An event set on SIGTERM, SIGINT, a line `stop` on stdin or stdin's end
    (a closed stdin: the test is gone)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def stdin_reader():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=stdin_reader, daemon=True).start()
    return stop


def read_varint(buf, i):
    n, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, i
        shift += 7


def fields(buf):
    """Field number -> value for varint (int) and length-delimited (bytes) fields."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            out[number], i = read_varint(buf, i)
        elif wire == 2:
            size, i = read_varint(buf, i)
            out[number], i = buf[i : i + size], i + size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
    return out


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number, value):
    return varint(number << 3 | 2) + varint(len(value)) + value


def field_varint(number, value):
    return varint(number << 3) + varint(value)
