"""HTTP/2 conformance of the stream guard, against the real `drainshim` binary.

Each test starts an app (python-h2 server, tests/py/h2peer/app.py), the guard in
front of it (`drainshim sidecar --guard-listen`), and a client
(python-h2, or raw frames where exactness matters), then asserts what an
RFC 9113/7541-conformant peer must see: no connection error, no lost byte,
no wedge. Run: `make conformance` (DRAINSHIM_BIN names the binary).
A missing binary or package fails the suite; nothing is skipped.

One module per section of the RFCs, where a maintainer looks for a rule:

- `test_s3_starting`: §3, the connection preface;
- `test_s4_frames`: §4, frame format, size and field blocks;
- `test_s5_streams`: §5, stream states, identifiers, concurrency, priority;
- `test_s6_frames`: §6, each frame's own rules (DATA, HEADERS, PRIORITY,
  RST_STREAM, PUSH_PROMISE, CONTINUATION; PING and GOAWAY on a stream);
- `test_s6_5_settings`, `test_s6_7_ping_goaway`, `test_s6_9_flow_control`:
  SETTINGS; PING and GOAWAY (the app's graceful shutdown among them);
  WINDOW_UPDATE and flow control;
- `test_s8_http`: §8, HTTP semantics (malformed requests, content-length,
  trailers);
- `test_rfc7541_hpack`: RFC 7541 through the guard;
- `test_alone`: the guard with no app (or one that does not speak HTTP/2),
  the client's server itself.

`harness` holds what they share (the rig, the checks, raw frames) and
`conftest` the `rig` fixture.

What the guard answers itself (RFC 9113 §3-§8.1, RFC 7541): the guard is
the client's server, so a frame that breaks a MUST of RFC 9113 is answered
by the guard with the code the RFC names, and never passed on. The app
behind it (python-h2) would answer many of these itself, but with its own
connection to the guard (every other stream on it cut, a GOAWAY the client
gets as the guard's), or not at all for frames the guard swallowed. Each
such case: raw frames from a hyperframe client, the exact code (GOAWAY's for
a connection error, RST_STREAM's for a stream error) within `DEADLINE`
seconds, and the app never saw the offending frame. A case that lets the
guard pass something on says why in its docstring.
"""
