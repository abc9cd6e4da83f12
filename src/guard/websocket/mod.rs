//! WebSocket (RFC 6455, HTTP/1.1 `Upgrade: websocket`) through the guard,
//! and its graceful end on a drain or at max connection age.
//!
//! **Relay.** After the application answered 101, both upgraded connections
//! are taken back from hyper as plain TCP sockets and relayed byte for byte
//! in both directions. The bytes are never re-encoded: the client's frames
//! reach the application still masked as the client masked them, any message
//! size, fragmentation, extensions (`permessage-deflate`), ping, pong and
//! close pass through as they are. The guard only *reads* the frame headers
//! (tungstenite's [`FrameHeader::parse`]) to know where frames begin, so it
//! can stop at a frame boundary. Nothing is buffered beyond one read, and an
//! idle WebSocket holds no buffer at all (reads wait for readiness first), so
//! thousands of open WebSockets cost little memory.
//!
//! **Graceful end** (the registry asked the stream to end: a drain, spread
//! over its window, or max connection age after its grace):
//!
//! 1. *App side first.* At the next frame boundary of the client → app
//!    direction the guard sends the application a Close **1001 (Going Away)**,
//!    masked with a fresh random key as a client's frames must be. Frames the
//!    client sends after that are discarded: RFC 6455 §5.5.1 forbids data
//!    after a Close, and the application would not read them.
//! 2. *Everything the app sent, in order.* The app → client direction keeps
//!    forwarding every frame until the application's own Close arrives (its
//!    answer to 1001). Every byte the application's transport accepted
//!    before that Close is in front of it on the same TCP stream, so all of
//!    it has been forwarded by then: nothing is lost and the order is kept.
//!    The application's Close itself is not forwarded.
//! 3. *Then the client.* At that boundary the client gets a Close **1012
//!    (Service Restart)**, which browsers and client libraries take as
//!    "reconnect". The guard waits for the client's Close (its answer), then
//!    closes the TCP connection (FIN first, then reads until the client closes
//!    too, so no RST can destroy the Close in flight).
//!
//! Every wait is bounded by [`Limits::end_timeout`](super::Limits): an
//! application that never answers 1001 still gets its client a 1012 after
//! everything it sent, if the app → client direction is at a frame boundary
//! then; a client that never answers 1012 is closed anyway. Only a frame left
//! half-sent at the bound (a peer stalled mid-frame) makes the end abrupt:
//! that is logged and counted in `drainshim_streams_ungraceful_total`, never
//! silent. The whole ending is also capped at three times the limit.
//!
//! If the client or the application started a close handshake before the
//! end was asked, the guard lets it finish as it is.
//!
//! Upgrades to any other protocol are relayed as raw bytes ([`tunnel`]); the
//! guard cannot end them with an in-protocol goodbye, so it says so in the
//! log when they open and when it closes them, and counts each close in
//! `drainshim_streams_ungraceful_total{protocol="other"}`.

mod frames;

use crate::timer::sleep_until_opt;
use std::io::{self};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tungstenite::protocol::frame::coding::CloseCode;

use frames::{close_code, close_frame, Scanner, Stop};

use crate::guard::conn::ConnInfo;
use crate::guard::handle::Handle;
use crate::guard::keepalive::Counted;
use crate::guard::registry::Registered;
use crate::guard::sniff::{Prefixed, MAX_LINGER};
use crate::metrics::StreamProtocol;

/// Bytes read from a socket at a time while data flows; a WebSocket with
/// nothing to read holds no buffer.
const READ_CHUNK: usize = 16 * 1024;

/// What the client is told: reconnect, the service restarts.
pub(crate) const CLIENT_CLOSE_REASON: &str = "service restart: reconnect";
/// What the application is told: this client goes away.
pub(crate) const APP_CLOSE_REASON: &str = "going away: proxy draining";

/// The plain sockets under both upgraded connections, with any bytes hyper
/// read past the HTTP heads.
struct Sockets {
    client: TcpStream,
    client_early: bytes::Bytes,
    app: TcpStream,
    app_early: bytes::Bytes,
}

/// Takes the TCP sockets back from hyper's upgraded connections.
fn sockets(client: Upgraded, app: Upgraded) -> Result<Sockets, &'static str> {
    let client = client
        .downcast::<TokioIo<Counted<Prefixed<TcpStream>>>>()
        .map_err(|_| "the client connection is not a TCP socket")?;
    let (prefix, tcp) = client.io.into_inner().into_inner().into_parts();
    let tcp = tcp.ok_or("the client connection was already closed")?;
    // The sniffed prefix was handed to hyper long before the upgrade; any
    // left would precede the bytes hyper buffered.
    let mut early = BytesMut::from(&prefix[..]);
    early.extend_from_slice(&client.read_buf);
    let app = app
        .downcast::<TokioIo<TcpStream>>()
        .map_err(|_| "the application connection is not a TCP socket")?;
    Ok(Sockets {
        client: tcp,
        client_early: early.freeze(),
        app: app.io.into_inner(),
        app_early: app.read_buf,
    })
}

/// What both directions share.
struct Shared {
    /// The stream's registration: `ended()` says when the guard wants it to end.
    registered: Registered,
    /// The guard sent the application its Close 1001.
    app_close_sent: CancellationToken,
    /// The client's Close arrived after the guard's (its answer to 1012).
    client_answered: CancellationToken,
    /// The client started a close handshake on its own (passed through).
    client_closing: CancellationToken,
    /// The application started a close handshake on its own (passed through).
    app_closing: CancellationToken,
    /// Each close handshake waits this long for its answer.
    close_timeout: Duration,
}

impl Shared {
    /// Whether the guard must run its own close handshake: nobody else
    /// started one.
    fn guard_closes(&self) -> bool {
        !self.client_closing.is_cancelled() && !self.app_closing.is_cancelled()
    }
}

/// Relays one WebSocket after its 101 until either side closes, or the
/// guard ends it gracefully. True when the guard ended it (see
/// [`relay_sides`]).
pub async fn relay(
    guard: Handle,
    client: OnUpgrade,
    app: OnUpgrade,
    registered: Registered,
    info: ConnInfo,
) -> bool {
    let _live = guard.count_connection();
    let limit = guard.config().limits.end_timeout;
    // Both upgrades complete as soon as the 101 is written and read.
    let pair = tokio::time::timeout(limit, async { tokio::try_join!(client, app) }).await;
    let (client, app) = match pair {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            tracing::debug!(peer = %info.peer, error = %e, "guard: WebSocket upgrade did not complete");
            return false;
        }
        Err(_) => {
            tracing::debug!(peer = %info.peer, "guard: WebSocket upgrade did not complete in time");
            return false;
        }
    };
    let s = match sockets(client, app) {
        Ok(s) => s,
        Err(why) => {
            tracing::warn!(peer = %info.peer, why, "guard: WebSocket cannot be relayed; closing it");
            return false;
        }
    };
    let _ = s.client.set_nodelay(true);
    let _ = s.app.set_nodelay(true);
    let (client_rd, client_wr) = s.client.into_split();
    let (app_rd, app_wr) = s.app.into_split();
    let client = Side {
        rd: client_rd,
        wr: client_wr,
        early: BytesMut::from(&s.client_early[..]),
    };
    let app = Side {
        rd: app_rd,
        wr: app_wr,
        early: BytesMut::from(&s.app_early[..]),
    };
    relay_sides(&guard, client, app, registered, info).await
}

/// One end of a relayed WebSocket: its two directions and what was already
/// read from it before the relay began.
struct Side<R, W> {
    rd: R,
    wr: W,
    early: BytesMut,
}

/// Relays a WebSocket the client opened over HTTP/2 (RFC 8441 extended
/// CONNECT; `client` is that stream) to the application's HTTP/1.1
/// upgraded connection, with the same graceful end.
pub async fn relay_streams<C>(
    guard: Handle,
    client: C,
    app: Upgraded,
    registered: Registered,
    info: ConnInfo,
) where
    C: tokio::io::AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let _live = guard.count_connection();
    let app = match app.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => parts,
        Err(_) => {
            tracing::warn!(peer = %info.peer, "guard: WebSocket (HTTP/2): the application connection is not a TCP socket; closing it");
            return;
        }
    };
    let app_early = BytesMut::from(&app.read_buf[..]);
    let tcp = app.io.into_inner();
    let _ = tcp.set_nodelay(true);
    let (app_rd, app_wr) = tcp.into_split();
    let (client_rd, client_wr) = tokio::io::split(client);
    let client = Side {
        rd: client_rd,
        wr: client_wr,
        early: BytesMut::new(),
    };
    let app = Side {
        rd: app_rd,
        wr: app_wr,
        early: app_early,
    };
    relay_sides(&guard, client, app, registered, info).await;
}

/// The relay itself, whatever carries each side. True when the guard ended
/// the WebSocket (gracefully or not): then it is counted as terminated or
/// ungraceful, and it is not one of the application's outcomes.
async fn relay_sides<CR, CW, AR, AW>(
    guard: &Handle,
    client: Side<CR, CW>,
    app: Side<AR, AW>,
    registered: Registered,
    info: ConnInfo,
) -> bool
where
    CR: ReadSome,
    CW: AsyncWrite + Unpin,
    AR: ReadSome,
    AW: AsyncWrite + Unpin,
{
    let limit = guard.config().limits.end_timeout;
    registered.ctl.set_long_lived();
    let (client_rd, client_wr) = (client.rd, client.wr);
    let (app_rd, app_wr) = (app.rd, app.wr);
    let sh = Shared {
        registered,
        app_close_sent: CancellationToken::new(),
        client_answered: CancellationToken::new(),
        client_closing: CancellationToken::new(),
        app_closing: CancellationToken::new(),
        close_timeout: limit,
    };
    let up = client_to_app(client_rd, app_wr, client.early, &sh);
    let down = app_to_client(app_rd, client_wr, app.early, &sh);
    // The backstop: an ending never takes longer than both handshakes and
    // the lingering close.
    let backstop = async {
        sh.registered.ctl.ended().await;
        tokio::time::sleep(limit * 3 + MAX_LINGER).await;
    };
    tokio::pin!(up, down, backstop);
    let mut up_done = false;
    let mut down_res: Option<io::Result<Down>> = None;
    // Once one direction is done, the other gets this long to finish.
    let mut done_by: Option<Instant> = None;
    while !(up_done && down_res.is_some()) {
        tokio::select! {
            r = &mut up, if !up_done => {
                if let Err(e) = r {
                    tracing::debug!(peer = %info.peer, error = %e, "guard: WebSocket client side ended");
                }
                up_done = true;
                done_by.get_or_insert(Instant::now() + limit);
            }
            r = &mut down, if down_res.is_none() => {
                down_res = Some(r);
                done_by.get_or_insert(Instant::now() + limit);
            }
            _ = sleep_until_opt(done_by) => break,
            _ = &mut backstop => break,
        }
    }
    if !sh.registered.ctl.is_ended() {
        return false;
    }
    let reason = sh.registered.ctl.ended().await.0;
    let outcome = down_res.unwrap_or(Ok(Down::Abrupt(
        "the application side did not finish within its bound",
    )));
    match outcome {
        Ok(Down::Graceful) => guard.record_termination(reason, StreamProtocol::websocket),
        Ok(Down::Passed) => return false,
        Ok(Down::Abrupt(why)) => {
            tracing::warn!(peer = %info.peer, ?reason, why, "guard: WebSocket closed without a Close frame to the client");
            guard.record_ungraceful(reason, StreamProtocol::websocket);
        }
        Err(e) => {
            tracing::warn!(peer = %info.peer, ?reason, error = %e, "guard: WebSocket failed while ending");
            guard.record_ungraceful(reason, StreamProtocol::websocket);
        }
    }
    true
}

/// How the app → client direction ended.
#[derive(Debug)]
enum Down {
    /// The guard sent the client its Close 1012 after everything the app sent.
    Graceful,
    /// The peers closed on their own (or a socket failed before any end).
    Passed,
    /// The guard had to close without a Close frame to the client.
    Abrupt(&'static str),
}

/// Reads one chunk into a buffer. Ok(false) on EOF.
trait ReadSome {
    fn read_some(
        &mut self,
        buf: &mut BytesMut,
    ) -> impl std::future::Future<Output = io::Result<bool>>;
}

impl ReadSome for OwnedReadHalf {
    /// Waits for readiness before taking a buffer, so an idle WebSocket holds none.
    async fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<bool> {
        loop {
            self.readable().await?;
            buf.reserve(READ_CHUNK);
            match self.try_read_buf(buf) {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> ReadSome for tokio::io::ReadHalf<T> {
    async fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<bool> {
        use tokio::io::AsyncReadExt;
        buf.reserve(READ_CHUNK);
        Ok(self.read_buf(buf).await? > 0)
    }
}

/// Frees an emptied buffer, so an idle WebSocket holds none.
fn release(buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        *buf = BytesMut::new();
    }
}

/// Client → application. Passes frames through; once the end is asked,
/// sends the application Close 1001 at a frame boundary, then discards what
/// the client sends until its Close (its answer to 1012), then reads until
/// the client closes the connection.
async fn client_to_app(
    mut rd: impl ReadSome,
    mut wr: impl AsyncWrite + Unpin,
    mut buf: BytesMut,
    sh: &Shared,
) -> io::Result<()> {
    let mut scan = Scanner::default();
    // The guard sent its Close: client frames are dropped from here on.
    let mut closing = false;
    // When the end was asked: the 1001 must go out within the limit.
    let mut end_by: Option<Instant> = None;
    let mut client_eof = false;
    loop {
        // Act on what is buffered.
        loop {
            if sh.client_answered.is_cancelled() {
                // The client's Close was the last frame it may send: nothing
                // unread is left to turn the close into a reset, and a proxy
                // in front (Envoy) closes its side only once this one is
                // fully closed, so stop reading now.
                let _ = wr.shutdown().await;
                return Ok(());
            }
            if closing {
                let (n, stop) = scan.scan(&buf, false, true).map_err(proto)?;
                buf.advance(n);
                match stop {
                    Stop::Close { len } if buf.len() >= len => {
                        buf.clear();
                        sh.client_answered.cancel();
                        continue;
                    }
                    Stop::Close { .. } | Stop::NeedMore | Stop::Boundary => {}
                }
                break;
            }
            let guard_closes = end_by.is_some() && sh.guard_closes();
            let (n, stop) = scan.scan(&buf, guard_closes, false).map_err(proto)?;
            if n > 0 {
                wr.write_all(&buf[..n]).await?;
                buf.advance(n);
            }
            if scan.saw_close {
                sh.client_closing.cancel();
            }
            match stop {
                Stop::Boundary => {
                    wr.write_all(&close_frame(CloseCode::Away, APP_CLOSE_REASON, true))
                        .await?;
                    closing = true;
                    sh.app_close_sent.cancel();
                }
                Stop::NeedMore | Stop::Close { .. } => break,
            }
        }
        if client_eof {
            let _ = wr.shutdown().await;
            return Ok(());
        }
        release(&mut buf);
        // A client stalled mid-frame cannot be sent its 1001 boundary: the
        // app side is then closed without one.
        let give_up = end_by.filter(|_| !closing && sh.guard_closes());
        tokio::select! {
            r = rd.read_some(&mut buf) => {
                if !r? {
                    client_eof = true;
                }
            }
            _ = sh.registered.ctl.ended(), if end_by.is_none() => {
                end_by = Some(Instant::now() + sh.close_timeout);
            }
            _ = sleep_until_opt(give_up) => {
                let _ = wr.shutdown().await;
                // Keep reading the client until the other direction is done.
                closing = true;
                sh.app_close_sent.cancel();
            }
        }
    }
}

/// Application → client. Passes frames through; once the end is asked (and
/// nobody is closing yet), forwards everything up to the application's
/// Close, withholds that Close, and sends the client Close 1012 instead;
/// then waits (bounded) for the client's answer and closes the connection.
async fn app_to_client(
    mut rd: impl ReadSome,
    mut wr: impl AsyncWrite + Unpin,
    mut buf: BytesMut,
    sh: &Shared,
) -> io::Result<Down> {
    let mut scan = Scanner::default();
    let mut end_seen = false;
    // Set once intercepting: the app must answer 1001 by then.
    let mut answer_by: Option<Instant> = None;
    loop {
        // The guard runs the close handshake (it sent, or is about to send,
        // the app its 1001): stop before the app's Close, its answer. Decided
        // at every scan, since the 1001 may have gone out before this
        // direction saw the end.
        let intercept = !sh.app_closing.is_cancelled()
            && (sh.app_close_sent.is_cancelled() || (end_seen && sh.guard_closes()));
        if intercept && answer_by.is_none() {
            answer_by = Some(Instant::now() + sh.close_timeout);
        }
        let (n, stop) = scan.scan(&buf, false, intercept).map_err(proto)?;
        if n > 0 {
            wr.write_all(&buf[..n]).await?;
            buf.advance(n);
        }
        if scan.saw_close {
            sh.app_closing.cancel();
        }
        if let Stop::Close { len } = stop {
            if buf.len() >= len {
                let code = close_code(&buf[..len]);
                tracing::debug!(
                    ?code,
                    "guard: the application answered Close; closing the client"
                );
                return finish_client(rd, wr, sh).await;
            }
        }
        release(&mut buf);
        tokio::select! {
            r = rd.read_some(&mut buf) => {
                if !r? {
                    // The application closed its connection.
                    if intercept && scan.at_boundary() && buf.is_empty() {
                        return finish_client(rd, wr, sh).await;
                    }
                    let _ = wr.shutdown().await;
                    return Ok(if intercept { Down::Abrupt("the application closed mid-frame") } else { Down::Passed });
                }
            }
            _ = sh.registered.ctl.ended(), if !end_seen => {
                end_seen = true;
            }
            _ = sh.app_close_sent.cancelled(), if !intercept => {}
            _ = sleep_until_opt(answer_by), if intercept => {
                if scan.at_boundary() && buf.is_empty() {
                    tracing::debug!("guard: the application did not answer Close in time; closing the client after everything it sent");
                    return finish_client(rd, wr, sh).await;
                }
                let _ = wr.shutdown().await;
                return Ok(Down::Abrupt("the application stalled mid-frame"));
            }
        }
    }
}

/// Sends the client its Close 1012, waits (bounded) for its answer, closes
/// the client connection (FIN) and lets the application's side finish.
async fn finish_client(
    mut app_rd: impl ReadSome,
    mut wr: impl AsyncWrite + Unpin,
    sh: &Shared,
) -> io::Result<Down> {
    wr.write_all(&close_frame(CloseCode::Restart, CLIENT_CLOSE_REASON, false))
        .await?;
    // A client that started its own close handshake already sent its Close.
    let _ = tokio::time::timeout(sh.close_timeout, async {
        tokio::select! {
            _ = sh.client_answered.cancelled() => {}
            _ = sh.client_closing.cancelled() => {}
        }
    })
    .await;
    // The server closes the TCP connection first (RFC 6455 §7.1.1).
    let _ = wr.shutdown().await;
    // The application closes its side after its Close; read until it does,
    // so its socket is not reset with unread bytes.
    let mut sink = BytesMut::new();
    let _ = tokio::time::timeout(MAX_LINGER, async {
        while let Ok(true) = app_rd.read_some(&mut sink).await {
            sink.clear();
        }
    })
    .await;
    Ok(Down::Graceful)
}

fn proto(e: tungstenite::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Relays an upgrade the guard cannot end gracefully (any protocol but
/// WebSocket) as raw bytes. At the end it closes both connections, logs it
/// and counts it as ungraceful. True when the guard ended it.
pub async fn tunnel(
    guard: Handle,
    client: OnUpgrade,
    app: OnUpgrade,
    registered: Registered,
    info: ConnInfo,
    protocol: String,
) -> bool {
    let _live = guard.count_connection();
    let limit = guard.config().limits.end_timeout;
    let Ok(Ok((client, app))) =
        tokio::time::timeout(limit, async { tokio::try_join!(client, app) }).await
    else {
        return false;
    };
    registered.ctl.set_long_lived();
    tracing::warn!(peer = %info.peer, protocol, "guard: upgrade relayed as raw bytes; a drain or max age will close it without a goodbye");
    let mut client = TokioIo::new(client);
    let mut app = TokioIo::new(app);
    tokio::select! {
        r = tokio::io::copy_bidirectional(&mut client, &mut app) => {
            if let Err(e) = r {
                tracing::debug!(peer = %info.peer, protocol, error = %e, "guard: upgraded connection ended");
            }
            false
        }
        (reason, _) = registered.ctl.ended() => {
            tracing::warn!(peer = %info.peer, protocol, ?reason, "guard: closing an upgraded connection it cannot end gracefully");
            guard.record_ungraceful(reason, StreamProtocol::other);
            let _ = tokio::time::timeout(MAX_LINGER, async {
                let _ = client.shutdown().await;
                let _ = app.shutdown().await;
            })
            .await;
            true
        }
    }
}
