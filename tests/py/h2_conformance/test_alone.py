"""The guard alone: no app, or one that does not speak HTTP/2. The guard is
then the client's server itself, and conformant as one (RFC 9113 §3-§6):
its own SETTINGS, every request answered retryably, a drain's GOAWAYs, and
the client held to the RFC."""
import pytest

from h2peer import DATA, E, END_HEADERS, HEADERS, S, SETTINGS, Http1App, NoApp, pattern, raw_frame
from .harness import assert_goaway_ids_never_grow, assert_no_connection_error, assert_sane


@pytest.mark.parametrize("absent", ["unreachable", "http1-only"])
def test_guard_alone_is_a_conformant_server(rig, absent):
    """With no application to relay to (nothing listens on its port, or it
    answers HTTP/2's preface as HTTP/1.1), the guard is the client's server
    itself: its own SETTINGS (extended CONNECT on), the client's SETTINGS
    and PINGs acked, every request answered retryably (gRPC: trailers-only
    grpc-status 14; HTTP: 502), the DATA of answered requests given back to
    the connection window, and a drain's GOAWAY sequence; never a
    connection error."""
    app = rig.start(app=NoApp() if absent == "unreachable" else Http1App())
    c = rig.client()
    c.wait(lambda: any(f.type == SETTINGS and not f.ack for f in c.frames_in)
           and any(f.type == SETTINGS and f.ack for f in c.frames_in), 10,
           "the guard's SETTINGS and its ack of the client's")
    assert c.conn.remote_settings.enable_connect_protocol == 1, "extended CONNECT must be on"
    c.conn.update_settings({S.INITIAL_WINDOW_SIZE: 1 << 20, S.HEADER_TABLE_SIZE: 1024})
    c.conn.ping(b"alone!!!")
    c.flush()
    c.wait(lambda: b"alone!!!" in c.acks_in
           and sum(1 for f in c.frames_in if f.type == SETTINGS and f.ack) >= 2, 10,
           "the PING ack and the second SETTINGS ack")

    call = c.grpc("test.Unary/Hold", b"x")
    get = c.get("/bytes?n=10")
    # Uploads bigger than the connection window: what the guard does not
    # pass on, it must give back, or the connection would stall.
    uploads = [c.request("POST", "/sha", body=pattern(200_000, i)) for i in range(4)]
    ws = c.request("CONNECT", "/ws", [(":protocol", "websocket"),
                                      ("sec-websocket-version", "13")], end=False)
    c.wait_done([call, get, *uploads, ws], 15, "every stream answered")
    st = c.stream(call)
    assert st.trailers_only() and st.grpc_status() == "14", f"gRPC: {st!r}"
    assert "grpc-message" in dict(st.headers), f"gRPC without a message: {st!r}"
    for sid in [get, *uploads]:
        st = c.stream(sid)
        assert st.status() == "502" and st.reset in (None, E.NO_ERROR), f"HTTP: {st!r}"
    st = c.stream(ws)
    want = "502" if absent == "unreachable" else "501"
    assert st.status() == want, f"the WebSocket's answer (the app's, or 502): {st!r}"
    # Every DATA byte the client sent came back as connection window.
    c.wait(lambda: c.conn.outbound_flow_control_window == 65535, 10,
           "the connection window given back in full")

    if absent == "http1-only":
        # The guard tried HTTP/2 first: the app saw its preface as a request.
        assert any("HTTP/2.0" in line and str(code) == "505" for line, code in app.requests), (
            app.describe())

    # A drain: the guard's GOAWAY sequence, then the connection closes.
    status, text = rig.guard.drain()
    assert status == 202, f"POST /drain answered {status}: {text}"
    c.wait(lambda: c.eof, 15, "the connection closed after the drain")
    assert c.goaways() and all(code == E.NO_ERROR for _, code, _ in c.goaways()), c.goaways()
    assert_goaway_ids_never_grow(c)
    assert_sane(rig)
    assert_no_connection_error(c)


@pytest.mark.parametrize("absent", ["unreachable", "http1-only"])
def test_guard_alone_holds_the_client_to_the_rfc(rig, absent):
    """Alone, the guard judges what an application would: DATA on a stream
    the client never opened is a connection error PROTOCOL_ERROR (RFC 9113
    §5.1), and so is a stream id the client may not open (even, §5.1.1)."""
    rig.start(app=NoApp() if absent == "unreachable" else Http1App())
    for frame in [raw_frame(DATA, 0, 99, b"x"), raw_frame(HEADERS, END_HEADERS, 2, b"\x82")]:
        c = rig.client()
        c.wait(lambda: any(f.type == SETTINGS and f.ack for f in c.frames_in), 10,
               "the guard's SETTINGS ack")
        c.send_raw(frame)
        c.wait(lambda: c.goaways(), 10, "a GOAWAY")
        assert [code for _, code, _ in c.goaways()] == [E.PROTOCOL_ERROR], c.describe()
        c.wait(lambda: c.eof, 10, "the connection closed")
    assert rig.guard.alive(), rig.guard.log()
