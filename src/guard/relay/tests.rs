//! Unit tests of the relay's own decisions, without sockets.

use super::blocks::literals;
use super::local::connect_head;
use super::*;

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
        wire::put(&mut r.client.write, wire::DATA, 0, 1, chunk);
    }
    // The fourth crosses the window's end: it is split.
    let mut padded = vec![10u8];
    padded.extend_from_slice(chunks[3]);
    padded.extend_from_slice(&[0u8; 10]);
    wire::put(&mut r.client.write, wire::DATA, wire::PADDED, 1, &padded);
    wire::put(
        &mut r.client.write,
        wire::DATA,
        wire::END_STREAM,
        1,
        chunks[4],
    );
    r.own_data(3, &[9u8; 1_000], true);
    r.clear_gate();
    let cleared: usize = frames_in(&r.client.write[..r.cleared])
        .iter()
        .filter(|f| f.0 == wire::DATA)
        .map(|f| f.3.len())
        .sum();
    assert_eq!(cleared, 65_535, "the window is used up, never exceeded");
    assert_eq!(r.conn_window, 0);
    // The split dropped the padding (11 bytes): given back to the app.
    assert_eq!(credit_in(&r.app.write, 0), 11);
    assert_eq!(credit_in(&r.app.write, 1), 11);
    // The client's credit: the guard's own 1,000 bytes are withheld from
    // the application (its view never counted them), the rest passes on.
    r.client_credit(20_000).expect("credit");
    assert_eq!(credit_in(&r.app.write, 0), 11 + 19_000);
    assert_eq!(r.debt, 0);
    r.clear_gate();
    assert_eq!(r.cleared, r.client.write.len(), "everything fits now");
    // Both streams arrive whole, in order, ended once.
    let frames = frames_in(&r.client.write);
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
    assert_eq!(i64::from(DEFAULT_WINDOW) + 20_000 - sent, r.conn_window);
}

#[tokio::test]
async fn a_growing_goaway_is_never_sent() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    r.handshake = false;
    r.last_id = 7;
    r.first_goaway();
    r.app_goaway(5, wire::NO_ERROR, Instant::now());
    r.goaway_to_client(wire::MAX_STREAM_ID, wire::NO_ERROR);
    r.goaway_to_client(r.last_id, wire::NO_ERROR);
    let lasts: Vec<u32> = frames_in(&r.client.write)
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
    let block = literals(Some(4096), &fields);
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
