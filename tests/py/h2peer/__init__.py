"""HTTP/2 peers for the guard's conformance suite (tests/py/h2_conformance/).

Independent implementations drive both ends of the guard: python-h2 for the
protocol state (HPACK, flow control, stream states) and hyperframe for frames
built by hand. Each end also sniffs every frame it receives before h2 sees it,
so a test can assert on the exact frames on the wire.

- `Guard`: the real `drainshim sidecar` process with its stream guard.
- `App`: the application behind the guard, an h2 server on 127.0.0.1:0, a
  thread per connection; routes for bodies, echoes and gRPC streams, and
  hooks for tests that need the app to misbehave.
- `NoApp` and `Http1App`: no application at all (a port nothing listens
  on), and one that only speaks HTTP/1.1 (Python's `http.server`), for the
  guard serving the client alone.
- `Client`: an h2 client connection to the guard, driven from the test's own
  thread (`wait` pumps it until a condition holds or a deadline passes).

python-h2 treats any GOAWAY, sent or received, as the end of the connection,
while a graceful GOAWAY lets open streams finish: so GOAWAY frames are never
fed to h2 (the sniffer records them) and are sent raw. Every loop here is
bounded in time; nothing sleeps to synchronise.

A module per role: `frames` (constants, frames and header blocks by hand,
the sniffer), `waiting` (deadlines), `endpoint` (what both h2 ends share),
`client`, `app` and `guard`. The suite imports from the package itself.
"""

from .frames import (
    ACK, CONTINUATION, DATA, E, END_HEADERS, END_STREAM, GOAWAY, HEADERS, MAX_STREAM_ID,
    PADDED, PING, PREFACE, PRIORITY, PRIORITY_FLAG, PUSH_PROMISE, RST_STREAM, S,
    SETTINGS, Seen, Sniffer, TYPE_NAMES, WINDOW_UPDATE, assert_bytes, err_name,
    first_difference, frame_flags, goaway_frame, grpc_message, hpack_int, hpack_literal,
    literal_block, pattern, ping_frame, raw_frame, request_fields, split_frames,
    split_grpc,
)
from .waiting import (
    Deadline, wait_until,
)
from .endpoint import (
    Endpoint, Outgoing,
)
from .client import (
    Client, RawClient, StreamState,
)
from .app import (
    App, AppConn, AppRequest, Http1App, NoApp, default_route, grpc_tick, query,
)
from .guard import (
    DRAIN_FLAGS, Guard,
)

__all__ = [
    "ACK", "CONTINUATION", "DATA", "E", "END_HEADERS", "END_STREAM", "GOAWAY",
    "HEADERS", "MAX_STREAM_ID", "PADDED", "PING", "PREFACE", "PRIORITY",
    "PRIORITY_FLAG", "PUSH_PROMISE", "RST_STREAM", "S", "SETTINGS", "Seen", "Sniffer",
    "TYPE_NAMES", "WINDOW_UPDATE", "assert_bytes", "err_name", "first_difference",
    "frame_flags", "goaway_frame", "grpc_message", "hpack_int", "hpack_literal",
    "literal_block", "pattern", "ping_frame", "raw_frame", "request_fields",
    "split_frames", "split_grpc", "Deadline", "wait_until", "Endpoint", "Outgoing",
    "Client", "RawClient", "StreamState", "App", "AppConn", "AppRequest", "Http1App",
    "NoApp", "default_route", "grpc_tick", "query", "DRAIN_FLAGS", "Guard",
]
