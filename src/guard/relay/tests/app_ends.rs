//! The application's own end, and the relay after it: its END_STREAM
//! after the guard's cancel (its answer wins, and its reset stream gets
//! nothing more of the client's), and its connection closed or reset while
//! the relay still had something to write to it (what it wrote before is
//! read all the same, and its end is clean only after a FIN). Issue 57's
//! attacks found each (helpers in the parent module).

use super::*;
use std::time::Duration;

/// Issue 57's attack: the application answers whole (its trailers) after
/// the guard's cancel went out but before it read it, while the client's
/// request is still open. Its answer wins, and its stream stays reset to
/// it: nothing more of the client's reaches it (DATA, trailers or a reset
/// on a stream it saw reset would be a stream error, or a connection error
/// where a stack treats it so), the client is asked to stop sending
/// (RST_STREAM(NO_ERROR) behind the trailers), and the stream counts as
/// completed.
#[tokio::test]
async fn the_apps_own_end_after_the_cancel_keeps_the_client_away_from_it() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    assert!(r.streams.app_cancelled(1), "the cancel went out");
    r.app.peer.write.clear();
    let done = wire::literal_block(&[("grpc-status", "0")]);
    wire::put(
        &mut r.app.peer.read,
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &done,
    );
    r.app_frames(now + BURST_GAP).expect("the app's trailers");
    let to_client: Vec<(u8, u8, u32)> = frames_in(&r.client.peer.write)
        .iter()
        .map(|f| (f.0, f.1, f.2))
        .filter(|f| f.2 == 1)
        .collect();
    assert_eq!(
        to_client,
        vec![
            (wire::HEADERS, wire::END_HEADERS | wire::END_STREAM, 1),
            (wire::RST_STREAM, 0, 1),
        ],
        "the app's trailers, then the client asked to stop"
    );
    let rst = frames_in(&r.client.peer.write)
        .into_iter()
        .find(|f| f.0 == wire::RST_STREAM)
        .expect("a reset");
    assert_eq!(
        u32::from_be_bytes(rst.3[..4].try_into().unwrap()),
        wire::NO_ERROR
    );
    assert_eq!(r.streams.len(), 0, "the stream is over");
    // The client's frames already on their way: none reaches the app, and
    // the window its DATA took is given back.
    r.client.peer.write.clear();
    let trailers = wire::literal_block(&[("x-end", "1")]);
    wire::put(
        &mut r.client.peer.read,
        wire::DATA,
        0,
        1,
        &[0, 0, 0, 0, 1, 5],
    );
    wire::put(
        &mut r.client.peer.read,
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &trailers,
    );
    r.client_frames(now + BURST_GAP)
        .expect("the client's frames in flight");
    wire::put(
        &mut r.client.peer.read,
        wire::RST_STREAM,
        0,
        1,
        &wire::CANCEL.to_be_bytes(),
    );
    r.client_frames(now + BURST_GAP)
        .expect("the client's reset");
    let to_app: Vec<(u8, u32)> = frames_in(&r.app.peer.write)
        .iter()
        .map(|f| (f.0, f.2))
        .collect();
    assert!(
        to_app.iter().all(|&(_, id)| id != 1),
        "nothing on stream 1 to the app: {to_app:?}"
    );
    assert_eq!(
        credit_in(&r.client.peer.write, 0),
        6,
        "the DATA's window back"
    );
    assert_eq!(
        (
            terminated(&metrics, Reason::drain),
            ungraceful(&metrics, Reason::drain)
        ),
        (0, 0),
        "the app's own end, neither the guard's nor a cut"
    );
}

/// The same answer before the cancel left: the application was never
/// reset, so the client's rest of the request still goes to it.
#[tokio::test]
async fn the_apps_own_end_before_any_cancel_leaves_the_request_to_it() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    let done = wire::literal_block(&[("grpc-status", "0")]);
    wire::put(
        &mut r.app.peer.read,
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &done,
    );
    r.app_frames(now).expect("the app's trailers");
    assert!(
        frames_in(&r.client.peer.write)
            .iter()
            .all(|f| f.0 != wire::RST_STREAM),
        "no reset of the guard's"
    );
    wire::put(
        &mut r.client.peer.read,
        wire::DATA,
        wire::END_STREAM,
        1,
        &[0, 0, 0, 0, 1, 5],
    );
    r.client_frames(now).expect("the client's last message");
    assert!(
        frames_in(&r.app.peer.write)
            .iter()
            .any(|f| f.0 == wire::DATA && f.2 == 1),
        "the client's message reaches the app"
    );
    assert_eq!(r.streams.len(), 0, "both halves over");
}

/// A relay with one stream open, between real loopback sockets: the
/// application's far end, whose last message (DATA on stream 1) has
/// reached the relay's side, and the client's.
struct Sockets<'a> {
    r: Relay<'a>,
    app_end: Option<TcpStream>,
    app: Option<TcpStream>,
    client: Prefixed<TcpStream>,
    _client_end: TcpStream,
}

/// The application's last message.
const LAST: [u8; 6] = [0, 0, 0, 0, 1, 8];

/// A connected pair of loopback sockets: (the far end, the near end).
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("its address");
    let (near, far) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (far.expect("accept").0, near.expect("connect"))
}

/// Every wait below is bounded by this.
fn deadline() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(10)
}

impl<'a> Sockets<'a> {
    async fn new(guard: &'a Handle, now: Instant) -> Sockets<'a> {
        let r = streams_open(guard, 1, now);
        let (app_end, near_app) = tcp_pair().await;
        let (client_end, near_client) = tcp_pair().await;
        let mut last = BytesMut::new();
        wire::put(&mut last, wire::DATA, 0, 1, &LAST);
        let until = deadline();
        let mut sent = 0;
        while sent < last.len() {
            app_end.writable().await.expect("writable");
            sent += app_end.try_write(&last[sent..]).unwrap_or(0);
            assert!(std::time::Instant::now() < until, "the app could not write");
        }
        let mut peek = [0u8; 64];
        while near_app.peek(&mut peek).await.expect("peek") < last.len() {
            assert!(
                std::time::Instant::now() < until,
                "the message never arrived"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Sockets {
            r,
            app_end: Some(app_end),
            app: Some(near_app),
            client: Prefixed::new(bytes::Bytes::new(), near_client),
            _client_end: client_end,
        }
    }

    /// The relay's next turn, with something queued for the application
    /// (so it writes to it first).
    async fn turn(&mut self) -> Wake {
        wire::window_update(&mut self.r.app.peer.write, 0, 100);
        let Sockets { r, app, client, .. } = self;
        poll_fn(|cx| r.poll_io(cx, client, app, true)).await
    }

    /// The first turn reads the application's last message, whole; the
    /// next finds its end.
    async fn read_last_then_end(&mut self) -> Wake {
        let wake = self.turn().await;
        assert!(
            matches!(wake, Wake::FromApp),
            "the app's last frames are read before its end"
        );
        assert_eq!(
            frames_in(&self.r.app.peer.read)
                .iter()
                .map(|f| (f.0, f.2, f.3.clone()))
                .collect::<Vec<_>>(),
            vec![(wire::DATA, 1, LAST.to_vec())],
            "the app's last message, whole"
        );
        self.r.app.peer.read.clear();
        self.turn().await
    }
}

/// Issue 57's attack: the application writes its last frames and closes;
/// the guard, with something queued for it, finds its socket failing on
/// the write before it read those frames. They are read all the same: a
/// failed write is not the application's end, its read is.
#[tokio::test]
async fn what_the_app_wrote_before_it_closed_is_read_though_a_write_to_it_fails() {
    let guard = test_guard();
    let mut s = Sockets::new(&guard, Instant::now()).await;
    let near_app = s.app.as_ref().expect("the app's socket");
    drop(s.app_end.take());
    // The near end learns the far end is gone: a write goes out, the far
    // kernel answers it with a reset, and a later write fails (bounded).
    let until = deadline();
    loop {
        match near_app.try_write(b"\0") {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
            Ok(_) => {}
        }
        assert!(
            std::time::Instant::now() < until,
            "writes to a closed peer never failed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wake = s.read_last_then_end().await;
    assert!(
        matches!(wake, Wake::AppGone(true)),
        "then its end, clean: its FIN came behind all it wrote"
    );
}

/// Whether a loopback TCP connection from `local` to `peer` is still
/// established, as the kernel lists it (`/proc/net/tcp`).
fn established(local: u16, peer: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |field: &str| {
        field
            .rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && port(f[1]) == Some(local) && port(f[2]) == Some(peer) && f[3] == "01"
    })
}

/// The same, but the application resets its connection (it closed with
/// bytes unread, or with linger 0): what reached the guard is still read,
/// but its end is not clean, since its kernel dropped what it had not sent,
/// and the streams that waited on it must not end as if all had arrived.
#[tokio::test]
async fn an_app_that_reset_its_connection_is_read_but_its_end_is_not_clean() {
    let guard = test_guard();
    let mut s = Sockets::new(&guard, Instant::now()).await;
    let near_app = s.app.as_ref().expect("the app's socket");
    let (local, peer) = (
        near_app.local_addr().expect("addr").port(),
        near_app.peer_addr().expect("addr").port(),
    );
    socket2::SockRef::from(s.app_end.as_ref().expect("the app's end"))
        .set_linger(Some(Duration::ZERO))
        .expect("linger 0");
    drop(s.app_end.take());
    let until = deadline();
    while established(local, peer) {
        assert!(std::time::Instant::now() < until, "the reset never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wake = s.read_last_then_end().await;
    assert!(
        matches!(wake, Wake::AppGone(false)),
        "then its end, not clean"
    );
}

/// An application whose socket failed a write is read to its end even
/// while the client takes nothing: only that end lets the connection's
/// streams end (before, such an app waited on a client that might never
/// read).
#[tokio::test]
async fn an_app_that_cannot_be_written_is_read_whatever_the_client_takes() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    r.client
        .peer
        .write
        .extend_from_slice(&vec![0u8; BLOCKED_HIGH_WATER]);
    assert!(!r.wants().1, "a backed-up client stops the app's reads");
    r.app.write_failed = Some(std::io::ErrorKind::ConnectionReset);
    assert!(r.wants().1, "but not those of an app that is gone");
}
