//! Unit tests of the relay's own decisions, without sockets.

use http::StatusCode;

use super::limits::*;
use super::local::{connect_head, Local};
use super::peer::{literals, put_block, Block};
use super::settings::MAX_UNACKED_SETTINGS;
use super::*;
use crate::guard::grpc;
use crate::guard::relay::ending::BURST_GAP;
use crate::guard::sniff::H2_PREFACE;
use crate::metrics::{Reason, StreamProtocol};

mod app_ends;
mod counts;
mod endings;
mod limits;
mod local;
mod review;
mod when;

use counts::*;

/// Every frame in `buf`: (kind, flags, stream, data without padding).
fn frames_in(buf: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(h) = wire::head(&buf[at..]) {
        let payload = &buf[at + wire::FRAME_HEADER..at + wire::FRAME_HEADER + h.len];
        let data = if h.kind == wire::DATA {
            wire::content(h, payload).expect("well-formed").to_vec()
        } else {
            payload.to_vec()
        };
        out.push((h.kind, h.flags, h.id, data));
        at += wire::FRAME_HEADER + h.len;
    }
    assert_eq!(at, buf.len(), "whole frames only");
    out
}

fn credit_in(buf: &[u8], stream: u32) -> u64 {
    frames_in(buf)
        .iter()
        .filter(|f| f.0 == wire::WINDOW_UPDATE && f.2 == stream)
        .map(|f| u64::from(u32::from_be_bytes(f.3[..4].try_into().unwrap())))
        .sum()
}

fn test_relay(guard: &Handle) -> Relay<'_> {
    let info = ConnInfo {
        id: 1,
        peer: std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
        accepted_at: Instant::now(),
    };
    Relay::new(guard, info, false)
}

fn test_guard() -> Handle {
    let metrics =
        crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
    super::super::Guard::new(
        super::super::GuardConfig::new(([127, 0, 0, 1], 9).into()),
        metrics,
    )
    .handle()
}

#[tokio::test]
async fn the_client_window_pays_for_every_data_byte_and_credit_passes_on_once() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    // The application's DATA beyond the client's 65,535-byte window
    // (one frame padded), and 1,000 bytes of the guard's own.
    let app: Vec<u8> = (0..5 * 16_384u32).map(|i| i as u8).collect();
    let chunks: Vec<&[u8]> = app.chunks(16_384).collect();
    for chunk in &chunks[..3] {
        wire::put(&mut r.client.peer.write, wire::DATA, 0, 1, chunk);
    }
    // The fourth crosses the window's end: it is split.
    let mut padded = vec![10u8];
    padded.extend_from_slice(chunks[3]);
    padded.extend_from_slice(&[0u8; 10]);
    wire::put(
        &mut r.client.peer.write,
        wire::DATA,
        wire::PADDED,
        1,
        &padded,
    );
    wire::put(
        &mut r.client.peer.write,
        wire::DATA,
        wire::END_STREAM,
        1,
        chunks[4],
    );
    r.ends().own_data(3, &[9u8; 1_000], true);
    r.clear_gate();
    let cleared: usize = frames_in(&r.client.peer.write[..r.window.cleared()])
        .iter()
        .filter(|f| f.0 == wire::DATA)
        .map(|f| f.3.len())
        .sum();
    assert_eq!(cleared, 65_535, "the window is used up, never exceeded");
    assert_eq!(r.window.available(), 0);
    // The split dropped the padding (11 bytes): given back to the app.
    assert_eq!(credit_in(&r.app.peer.write, 0), 11);
    assert_eq!(credit_in(&r.app.peer.write, 1), 11);
    // The client's credit: the guard's own 1,000 bytes are withheld from
    // the application (its view never counted them), the rest passes on.
    r.conn().client_credit(20_000).expect("credit");
    assert_eq!(credit_in(&r.app.peer.write, 0), 11 + 19_000);
    assert_eq!(r.window.debt(), 0);
    r.clear_gate();
    assert_eq!(
        r.window.cleared(),
        r.client.peer.write.len(),
        "everything fits now"
    );
    // Both streams arrive whole, in order, ended once.
    let frames = frames_in(&r.client.peer.write);
    for (id, want) in [(1, app.clone()), (3, vec![9u8; 1_000])] {
        let got: Vec<u8> = frames
            .iter()
            .filter(|f| f.0 == wire::DATA && f.2 == id)
            .flat_map(|f| f.3.clone())
            .collect();
        assert_eq!(got, want, "stream {id}");
        let ends: Vec<bool> = frames
            .iter()
            .filter(|f| f.0 == wire::DATA && f.2 == id)
            .map(|f| f.1 & wire::END_STREAM != 0)
            .collect();
        assert_eq!(ends.iter().filter(|e| **e).count(), 1, "stream {id}");
        assert!(ends.last().copied().unwrap_or(false), "stream {id}");
    }
    // Over the whole run: the client paid exactly what it was sent.
    let sent: i64 = frames
        .iter()
        .filter(|f| f.0 == wire::DATA)
        .map(|f| f.3.len() as i64)
        .sum();
    assert_eq!(
        i64::from(DEFAULT_WINDOW) + 20_000 - sent,
        r.window.available()
    );
}

#[tokio::test]
async fn a_growing_goaway_is_never_sent() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    r.app.handshake.pending = false;
    r.client.ids.set_last(7);
    r.life.first_goaway(&mut r.client.peer.write);
    r.conn().app_goaway(5, wire::NO_ERROR, Instant::now());
    r.life.goaway(
        &mut r.client.peer.write,
        wire::MAX_STREAM_ID,
        wire::NO_ERROR,
    );
    r.life.goaway(
        &mut r.client.peer.write,
        r.client.ids.last(),
        wire::NO_ERROR,
    );
    let lasts: Vec<u32> = frames_in(&r.client.peer.write)
        .iter()
        .filter(|f| f.0 == wire::GOAWAY)
        .map(|f| u32::from_be_bytes(f.3[..4].try_into().unwrap()))
        .collect();
    // The guard's first, then (the application's lower id) only 5.
    assert_eq!(lasts[0], wire::MAX_STREAM_ID);
    assert!(
        lasts.len() >= 3 && lasts[1..].iter().all(|&l| l == 5),
        "{lasts:?}"
    );
}

#[test]
fn a_re_encoded_block_clears_the_table_then_decodes_alone() {
    let field = |n: &str, v: &str, never_indexed| wire::Field {
        name: n.as_bytes().to_vec(),
        value: v.as_bytes().to_vec(),
        never_indexed,
    };
    // A secret sent never-indexed stays so (RFC 7541 §6.2.3).
    let fields = vec![
        field(":status", "200", false),
        field("grpc-status", "0", false),
        field("authorization", "Bearer s3cret", true),
    ];
    let block = literals(true, &fields);
    // A decoder that holds an entry (`a: b`, literal with indexing).
    let mut dec = wire::Hpack::new(4096);
    let mut seed = vec![0x40, 1, b'a', 1, b'b'];
    let seeded = wire::decode(&mut dec, &mut seed, 1 << 16, None).unwrap();
    assert!(seeded.indexed);
    let mut all = Vec::new();
    let f = wire::decode(&mut dec, &mut block.clone(), 1 << 16, Some(&mut all)).unwrap();
    assert_eq!(all, fields);
    assert!(f.indexed, "the size updates count as table changes");
    let mut stale = vec![0x80 | 62];
    assert!(
        wire::decode(&mut dec, &mut stale, 1 << 16, None).is_err(),
        "the entry was evicted"
    );
}

#[test]
fn blocks_are_split_over_continuations_at_the_frame_size() {
    let mut out = BytesMut::new();
    put_block(&mut out, 3, true, &[7u8; 25], 10);
    let mut frames = Vec::new();
    let mut at = 0;
    while let Some(h) = wire::head(&out[at..]) {
        frames.push((h.kind, h.flags, h.len));
        at += wire::FRAME_HEADER + h.len;
    }
    assert_eq!(
        frames,
        [
            (wire::HEADERS, wire::END_STREAM, 10),
            (wire::CONTINUATION, 0, 10),
            (wire::CONTINUATION, wire::END_HEADERS, 5),
        ]
    );
    out.clear();
    put_block(&mut out, 3, false, &[], 10);
    assert_eq!(
        wire::head(&out).map(|h| (h.flags, h.len)),
        Some((wire::END_HEADERS, 0))
    );
}

#[test]
fn an_extended_connect_becomes_a_request_head() {
    let f = |n: &str, v: &str| wire::Field {
        name: n.as_bytes().to_vec(),
        value: v.as_bytes().to_vec(),
        never_indexed: false,
    };
    let head = connect_head(&[
        f(":method", "CONNECT"),
        f(":protocol", "websocket"),
        f(":scheme", "http"),
        f(":authority", "app.local"),
        f(":path", "/tick?id=1"),
        f("sec-websocket-version", "13"),
    ])
    .expect("a head");
    assert_eq!(head.method, http::Method::CONNECT);
    assert_eq!(head.uri.to_string(), "http://app.local/tick?id=1");
    assert_eq!(head.headers["sec-websocket-version"], "13");
    assert!(
        connect_head(&[f("bad header", "x")]).is_none(),
        "a name h2 would refuse"
    );
}

/// A gRPC request's header block, as a client sends it.
fn grpc_request() -> Vec<u8> {
    wire::literal_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/x.Y/Z"),
        (":authority", "app"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
}

/// A relay past both prefaces (the client's SETTINGS not acked yet).
fn handshaken(guard: &Handle, now: Instant) -> Relay<'_> {
    let mut r = test_relay(guard);
    r.client.peer.read.extend_from_slice(H2_PREFACE);
    wire::put(&mut r.client.peer.read, wire::SETTINGS, 0, 0, &[]);
    wire::put(&mut r.app.peer.read, wire::SETTINGS, 0, 0, &[]);
    r.app_frames(now).expect("the app's SETTINGS");
    r.client_frames(now).expect("the client's preface");
    r
}

/// The client opens gRPC stream `id`.
fn request(r: &mut Relay<'_>, id: u32, now: Instant) {
    let request = grpc_request();
    wire::put(
        &mut r.client.peer.read,
        wire::HEADERS,
        wire::END_HEADERS,
        id,
        &request,
    );
    r.client_frames(now).expect("a request");
}

/// A relay past its handshake with `n` gRPC server streams open (ids 1, 3,
/// ...), each answered with two messages, so each is long-lived, at a
/// boundary and endable; what either side was sent so far is cleared.
fn streams_open<'a>(guard: &'a Handle, n: u32, now: Instant) -> Relay<'a> {
    let mut r = handshaken(guard, now);
    let head = wire::literal_block(&[(":status", "200"), ("content-type", "application/grpc")]);
    let message = [0u8, 0, 0, 0, 1, 7];
    for id in (1..2 * n).step_by(2) {
        request(&mut r, id, now);
        wire::put(
            &mut r.app.peer.read,
            wire::HEADERS,
            wire::END_HEADERS,
            id,
            &head,
        );
        wire::put(&mut r.app.peer.read, wire::DATA, 0, id, &message);
        wire::put(&mut r.app.peer.read, wire::DATA, 0, id, &message);
    }
    // The ack of the client's SETTINGS.
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(now).expect("the answers");
    assert_eq!(r.streams.len(), n as usize);
    r.app.peer.write.clear();
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    r
}

/// Every open stream is asked to end (by a drain or the max age), and the
/// relay takes the asks at `at`.
fn ask_all(guard: &Handle, r: &mut Relay<'_>, reason: Reason, at: Instant) {
    for ctl in guard.open_streams() {
        ctl.end(reason);
    }
    for id in r.endings.queue.take() {
        r.ends().begin_end(id, at);
    }
}

/// Frames of `kind` in `buf`, and of those how many carry the ACK flag.
fn count(buf: &[u8], kind: u8) -> (usize, usize) {
    let f: Vec<_> = frames_in(buf).into_iter().filter(|f| f.0 == kind).collect();
    let acks = f.iter().filter(|f| f.1 & wire::ACK != 0).count();
    (f.len(), acks)
}

/// The streams the client got `grpc-status: 14` trailers for.
fn ended_gracefully(r: &Relay<'_>) -> usize {
    frames_in(&r.client.peer.write)
        .iter()
        .filter(|f| f.0 == wire::HEADERS && f.1 & wire::END_STREAM != 0)
        .count()
}

/// Acks every barrier SETTINGS the app was sent (as its stack would), with
/// the clock at `now`, until no more are sent. Returns how many.
fn ack_barriers(r: &mut Relay<'_>, now: Instant) -> usize {
    let mut acked = 0;
    for _ in 0..100 {
        let (settings, _) = count(&r.app.peer.write, wire::SETTINGS);
        if settings == acked {
            break;
        }
        for _ in acked..settings {
            wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
        }
        acked = settings;
        r.app_frames(now).expect("the acks");
    }
    acked
}

/// Issue 39 review, item 2: a client PING whose data looks like the
/// guard's own is the client's, and its ack reaches it; an app PING with
/// the old fixed probe data is acked to the app, not taken as the probe.
#[tokio::test]
async fn a_peers_ping_is_never_taken_for_the_guards_own() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    let lookalike = *b"dsb\0\xff\xff\xff\xff";
    wire::ping(&mut r.client.peer.read, false, lookalike);
    r.client_frames(now).expect("the client's PING");
    assert!(frames_in(&r.app.peer.write)
        .iter()
        .any(|f| f.0 == wire::PING && f.1 == 0 && f.3 == lookalike));
    wire::ping(&mut r.app.peer.read, true, lookalike);
    r.app_frames(now).expect("the app's ack");
    assert!(
        frames_in(&r.client.peer.write)
            .iter()
            .any(|f| f.0 == wire::PING && f.1 == wire::ACK && f.3 == lookalike),
        "the client gets the ack of its PING"
    );
    // The guard's GOAWAY probe is out; the client acks the app's PING
    // that carries the old fixed probe data: it goes to the app.
    r.client.peer.write.clear();
    r.app.peer.write.clear();
    r.life.first_goaway(&mut r.client.peer.write);
    assert!(r.life.probe().1);
    wire::ping(&mut r.client.peer.read, true, *b"dsgoaway");
    r.client_frames(now).expect("the client's ack");
    assert!(r.life.probe().1, "not the probe's ack");
    assert!(frames_in(&r.app.peer.write)
        .iter()
        .any(|f| f.0 == wire::PING && f.1 == wire::ACK && &f.3[..] == b"dsgoaway"));
    let probe = r.life.probe().0;
    wire::ping(&mut r.client.peer.read, true, probe);
    r.client_frames(now).expect("the probe's ack");
    assert!(!r.life.probe().1);
}

/// Issue 39 review, item 3: DATA that waits for the client's connection
/// window holds back nothing that does not depend on it. Acks, GOAWAY and
/// other streams' frames go first; a stream's trailers stay behind its
/// DATA, and a header block behind a waiting one (HPACK order).
#[tokio::test]
async fn control_frames_pass_data_that_waits_for_window() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    r.window.set_available(0);
    let trailers = wire::literal_block(&[("grpc-status", "0")]);
    let head = wire::literal_block(&[(":status", "200")]);
    let w = &mut r.client.peer.write;
    wire::put(w, wire::DATA, 0, 1, &[1u8; 100]);
    wire::ping(w, true, [7; 8]);
    wire::put(w, wire::SETTINGS, wire::ACK, 0, &[]);
    wire::put(w, wire::HEADERS, wire::END_HEADERS, 3, &head);
    wire::put(
        w,
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &trailers,
    );
    wire::put(w, wire::HEADERS, wire::END_HEADERS, 5, &head);
    wire::rst(w, 7, wire::CANCEL);
    wire::put(w, wire::DATA, 0, 3, &[3u8; 10]);
    wire::put(w, wire::GOAWAY, 0, 0, &[0, 0, 0, 7, 0, 0, 0, 0]);
    r.clear_gate();
    let shape =
        |buf: &[u8]| -> Vec<(u8, u32)> { frames_in(buf).iter().map(|f| (f.0, f.2)).collect() };
    assert_eq!(
        shape(&r.client.peer.write[..r.window.cleared()]),
        [
            (wire::PING, 0),
            (wire::SETTINGS, 0),
            (wire::HEADERS, 3),
            (wire::RST_STREAM, 7),
            (wire::GOAWAY, 0),
        ],
        "what may go now"
    );
    assert_eq!(
        shape(&r.client.peer.write[r.window.cleared()..]),
        [
            (wire::DATA, 1),
            (wire::HEADERS, 1),
            (wire::HEADERS, 5),
            (wire::DATA, 3),
        ],
        "what waits, in its order"
    );
    assert_eq!(r.window.available(), 0, "nothing charged");
    // Credit comes: the rest goes, in order, charged once.
    r.conn().client_credit(110).expect("credit");
    r.clear_gate();
    assert_eq!(r.window.cleared(), r.client.peer.write.len());
    assert_eq!(r.window.available(), 0);
}

/// Item 3, at the close: the client is still read for its connection
/// WINDOW_UPDATE, so the last DATA and the trailers behind it go out
/// before the connection closes (not a bare TCP close); nothing else the
/// client sends is acted on.
#[tokio::test]
async fn a_closing_connection_still_takes_window_updates() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    r.app.handshake.pending = false;
    r.window.set_available(0);
    let trailers = wire::literal_block(&[("grpc-status", "0")]);
    wire::put(&mut r.client.peer.write, wire::DATA, 0, 1, &[1u8; 100]);
    wire::put(
        &mut r.client.peer.write,
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &trailers,
    );
    r.conn().close_with(wire::NO_ERROR);
    r.clear_gate();
    assert!(r.life.closing());
    let (want_client, want_app) = r.wants();
    assert!(want_client && !want_app, "reads the client for its credit");
    wire::put(&mut r.client.peer.read, wire::SETTINGS, 0, 0, &[]);
    wire::window_update(&mut r.client.peer.read, 0, 100);
    r.window.credit_while_closing(&mut r.client.peer.read);
    assert!(r.app.peer.write.is_empty(), "nothing goes on to the app");
    r.clear_gate();
    assert_eq!(
        r.window.cleared(),
        r.client.peer.write.len(),
        "everything may go"
    );
    let (want_client, _) = r.wants();
    assert!(!want_client, "nothing left to wait for");
}

/// Issue 39 review, item 6: an application DATA frame whose padding is as
/// long as its payload is the application's protocol error, and never
/// reaches the client (which would fail the connection over it).
#[tokio::test]
async fn malformed_app_data_is_checked_before_it_goes_on() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    wire::put(
        &mut r.app.peer.read,
        wire::DATA,
        wire::PADDED,
        1,
        &[200, 1, 2],
    );
    assert!(matches!(r.app_frames(now), Err(Failure::AppProtocol)));
    assert!(r.client.peer.write.is_empty(), "nothing of it went on");
}

/// Issue 39 review, item 5: the first re-encoded block to the client, when
/// the client had also lowered its table, starts with ONE size update (to
/// 0: below any size it set), not three; the table is never raised again
/// (every later block is literals).
#[tokio::test]
async fn a_re_encoded_block_carries_one_size_update() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    r.client.peer.missed_block(true);
    r.settings.set_update_due(Some(100));
    let block = Block::start(wire::Head {
        len: 0,
        kind: wire::HEADERS,
        flags: wire::END_HEADERS,
        id: 1,
    });
    let fields = [wire::Field {
        name: b"grpc-status".to_vec(),
        value: b"0".to_vec(),
        never_indexed: false,
    }];
    let size_updates = |block: &[u8]| block.iter().take_while(|b| *b & 0xE0 == 0x20).count();
    r.conn().put_translated(&block, &fields);
    let frames = frames_in(&r.client.peer.write);
    assert_eq!(frames[0].3[0], 0x20, "an update to 0 first");
    assert_eq!(size_updates(&frames[0].3), 1);
    r.client.peer.write.clear();
    r.conn().put_translated(&block, &fields);
    assert_eq!(size_updates(&frames_in(&r.client.peer.write)[0].3), 0);
}

/// A relay past its handshake, its client's preface and SETTINGS taken.
fn open_relay(guard: &Handle) -> Relay<'_> {
    let mut r = test_relay(guard);
    r.app.handshake.pending = false;
    r.app.handshake.replay = None;
    r.client.preface = false;
    r.client.settings_due = false;
    r
}

fn frame(kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::put(&mut out, kind, flags, id, payload);
    out.to_vec()
}

/// Feeds `bytes` as read from the client.
fn from_client(r: &mut Relay<'_>, bytes: &[u8]) -> Result<(), Failure> {
    r.client.peer.read.extend_from_slice(bytes);
    r.client_frames(Instant::now())
}

#[tokio::test]
async fn endless_app_continuations_are_the_apps_error() {
    let guard = test_guard();
    let mut r = open_relay(&guard);
    let mut bytes = frame(wire::HEADERS, 0, 1, &[0x88]);
    for _ in 0..=MAX_CONTINUATIONS {
        bytes.extend(frame(wire::CONTINUATION, 0, 1, &[]));
    }
    r.app.peer.read.extend_from_slice(&bytes);
    assert!(matches!(
        r.app_frames(Instant::now()),
        Err(Failure::AppProtocol)
    ));
}

#[tokio::test]
async fn client_frames_are_held_to_the_frame_size_the_client_was_told() {
    let guard = test_guard();
    let mut r = open_relay(&guard);
    let get = wire::literal_block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        ("x-big", &"v".repeat(16_400)),
    ]);
    let big = frame(wire::HEADERS, wire::END_HEADERS | wire::END_STREAM, 1, &get);
    assert!(matches!(
        from_client(&mut r, &big),
        Err(Failure::FrameSize(_))
    ));
    // Once the application allows 32 KiB (and the client was told), it fits.
    let mut r = open_relay(&guard);
    let mut allow = Vec::new();
    allow.extend_from_slice(&wire::MAX_FRAME_SIZE.to_be_bytes());
    allow.extend_from_slice(&32_768u32.to_be_bytes());
    r.conn().app_settings(0, &allow);
    from_client(&mut r, &big).expect("within the told size");
}

#[tokio::test]
async fn every_settings_ack_pairs_with_its_own_frame() {
    // 65 SETTINGS unacked, the last lowering the table size; then 65 acks.
    // The last ack is the one for the lowered size: the next block to the
    // client must start with a size update (RFC 7541 §4.2).
    let guard = test_guard();
    let mut r = open_relay(&guard);
    let mut lower = Vec::new();
    lower.extend_from_slice(&wire::HEADER_TABLE_SIZE.to_be_bytes());
    lower.extend_from_slice(&0u32.to_be_bytes());
    let mut bytes = Vec::new();
    for _ in 0..MAX_UNACKED_SETTINGS {
        bytes.extend(frame(wire::SETTINGS, 0, 0, &[]));
    }
    bytes.extend(frame(wire::SETTINGS, 0, 0, &lower));
    from_client(&mut r, &bytes).expect("settings");
    let ack = frame(wire::SETTINGS, wire::ACK, 0, &[]);
    for _ in 0..=MAX_UNACKED_SETTINGS {
        r.app.peer.read.extend_from_slice(&ack);
        r.app_frames(Instant::now()).expect("ack");
        // The timer of a SETTINGS held back (`settings_waits`).
        if r.client.defences.lift_pause() {
            r.client_frames(Instant::now()).expect("the held SETTINGS");
        }
    }
    assert_eq!(r.settings.unacked(), 0);
    assert_eq!(r.settings.table_acked(), 0);
    assert_eq!(r.settings.update_due(), Some(0));
    let sent = frames_in(&r.app.peer.write)
        .iter()
        .filter(|f| f.0 == wire::SETTINGS)
        .count();
    assert_eq!(sent, MAX_UNACKED_SETTINGS + 1, "every SETTINGS went on");
}

#[test]
fn malformed_requests_are_told_apart() {
    let f = |n: &str, v: &str| wire::Field {
        name: n.as_bytes().to_vec(),
        value: v.as_bytes().to_vec(),
        never_indexed: false,
    };
    let get = |extra: &[(&str, &str)]| {
        let mut all = vec![f(":method", "GET"), f(":scheme", "http"), f(":path", "/")];
        all.extend(extra.iter().map(|(n, v)| f(n, v)));
        all
    };
    use super::admit::{malformed_request, trailers_ok};
    assert_eq!(malformed_request(&get(&[("te", "trailers")]), true), None);
    assert_eq!(
        malformed_request(&get(&[("content-length", "0")]), true),
        None
    );
    assert_eq!(
        malformed_request(&get(&[("content-length", "5, 5")]), false),
        None
    );
    for (extra, end) in [
        (&[("X-Up", "1")][..], true),
        (&[("te", "gzip")], true),
        (&[("connection", "close")], true),
        (&[(":status", "200")], true),
        (&[("content-length", "5")], true),
        (&[("content-length", "5, 6")], false),
        (&[("content-length", "-1")], false),
        (&[("x-a", "a\0b")], true),
    ] {
        assert!(
            malformed_request(&get(extra), end).is_some(),
            "{extra:?} {end}"
        );
    }
    let ws = [
        f(":method", "CONNECT"),
        f(":protocol", "websocket"),
        f(":scheme", "http"),
        f(":path", "/ws"),
        f(":authority", "a"),
    ];
    assert_eq!(malformed_request(&ws, false), None);
    assert!(
        malformed_request(&ws[..4], false).is_some(),
        "no :authority"
    );
    let tunnel = [f(":method", "CONNECT"), f(":authority", "a:443")];
    assert_eq!(malformed_request(&tunnel, false), None);
    assert!(trailers_ok(&[f("grpc-status", "0")]));
    assert!(!trailers_ok(&[f(":path", "/")]));
}
