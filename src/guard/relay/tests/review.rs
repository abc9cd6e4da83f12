//! The second review of issue 55's ending protocol: each finding, with a
//! test that fails on the code before its fix.

use super::endings::Limited;
use super::*;
use crate::guard::relay::ending::state::HOLD_MAX;
use crate::metrics::Dropped;

/// One stream being ended, cancelled at `now` + [`BURST_GAP`], with the
/// first 3 of a 10-byte message the app began after the cancel held.
fn half_message_held(guard: &Handle, now: Instant) -> Relay<'_> {
    let mut r = streams_open(guard, 1, now);
    ask_all(guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    wire::put(
        &mut r.app.peer.read,
        wire::DATA,
        0,
        1,
        &[0, 0, 0, 0, 10, 1, 2, 3],
    );
    r.app_frames(now + BURST_GAP).expect("half a message");
    r
}

/// An ending whose stream has a message waiting behind a shut client
/// window when the connection closes: its trailers never leave, so it is a
/// cut, never counted graceful (before: the window's cut dropped the
/// trailers first, and the end was counted written).
#[tokio::test]
async fn an_end_held_behind_a_shut_window_at_the_close_is_a_cut() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    r.window.set_available(0);
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 7]);
    r.app_frames(now + BURST_GAP).expect("a message");
    ack_barriers(&mut r, now + BURST_GAP);
    r.clear_gate();
    let ends = r.ends().closing_ends();
    assert!(r.client.peer.write.is_empty(), "the window cleared nothing");
    r.ends().settle_closed(&ends, 0);
    assert_eq!(terminated(&metrics, Reason::drain), 0);
    assert_eq!(ungraceful(&metrics, Reason::drain), 1);
}

/// Trailers a write stopped inside are not written: counted once the rest
/// of their frame went (before: the front moved past them, and they
/// counted at once), and cut if the close drops that rest.
#[tokio::test]
async fn trailers_half_written_are_not_counted_written() {
    for close in [false, true] {
        let (guard, metrics) = guard_and_metrics();
        let now = Instant::now();
        let mut r = streams_open(&guard, 1, now);
        r.client.peer.write.clear();
        r.window.buffer_dropped();
        ask_all(&guard, &mut r, Reason::drain, now);
        r.timers(now + BURST_GAP).expect("the cancel");
        ack_barriers(&mut r, now + BURST_GAP);
        r.clear_gate();
        let trailers = frames_in(&r.client.peer.write)
            .iter()
            .position(|f| f.0 == wire::HEADERS && f.1 & wire::END_STREAM != 0)
            .expect("the trailers are queued");
        let before: usize = frames_in(&r.client.peer.write)[..trailers]
            .iter()
            .map(|f| wire::FRAME_HEADER + f.3.len())
            .sum();
        // The socket takes what is before the trailers, and one byte more.
        let mut sink = Vec::new();
        let mut limited = Limited(&mut sink, before + 1);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        r.window
            .write(&mut cx, &mut limited, &mut r.client.peer.write)
            .expect("a partial write");
        r.ends().settle_written(None);
        assert_eq!(terminated(&metrics, Reason::drain), 0, "close {close}");
        if close {
            r.clear_gate();
            let ends = r.ends().closing_ends();
            r.ends().settle_closed(&ends, 0);
            assert_eq!(ungraceful(&metrics, Reason::drain), 1);
        } else {
            let mut all = Vec::new();
            let mut open = Limited(&mut all, usize::MAX);
            r.window
                .write(&mut cx, &mut open, &mut r.client.peer.write)
                .expect("the rest");
            r.ends().settle_written(None);
            assert_eq!(terminated(&metrics, Reason::drain), 1);
        }
    }
}

/// A message begun after the cancel and still held when its stream goes
/// (the app's connection lost): dropped with it, counted, and the held
/// total goes down (before: nothing counted, and the total leaked, so
/// other streams' holds were released early).
#[tokio::test]
async fn a_held_message_dropped_with_its_stream_is_counted() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = half_message_held(&guard, now);
    assert_eq!(r.streams.held(), 8);
    r.conn().app_lost(false);
    assert_eq!(r.streams.held(), 0);
    assert_eq!(dropped(&metrics, Dropped::partial_message), (1, 8));
    // A client's own reset drops it too, but it is not counted: the
    // client gave the stream up.
    let (guard, metrics) = guard_and_metrics();
    let mut r = half_message_held(&guard, now);
    wire::rst(&mut r.client.peer.read, 1, wire::CANCEL);
    r.client_frames(now + BURST_GAP)
        .expect("the client's reset");
    assert_eq!(r.streams.held(), 0);
    assert_eq!(dropped(&metrics, Dropped::partial_message), (0, 0));
}

/// A held-bytes count that drifted past the bound with nothing held (a bug
/// the store's methods leave no room for) never stops the application's
/// reads: the relay would otherwise wait on a release that cannot come.
#[tokio::test]
async fn a_drifted_held_count_never_stops_the_apps_reads() {
    let (guard, _) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    r.streams.drift_held(HOLD_MAX);
    assert!(!r.streams.holds_too_much());
    assert!(r.wants().1, "the application is read");
    // With a message really held, the bound holds.
    let mut r = half_message_held(&guard, now);
    r.streams.drift_held(HOLD_MAX);
    assert!(r.streams.holds_too_much());
    assert!(!r.wants().1, "the application waits for a release");
}

/// An empty DATA frame behind a held message joins it: the half message
/// is not released to the client by it (before: it was, and the end that
/// followed was a reset).
#[tokio::test]
async fn an_empty_data_frame_keeps_a_held_message_held() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    wire::put(
        &mut r.app.peer.read,
        wire::DATA,
        0,
        1,
        &[0, 0, 0, 0, 10, 1, 2, 3],
    );
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[]);
    r.app_frames(now + BURST_GAP)
        .expect("half a message, then nothing");
    assert!(
        !frames_in(&r.client.peer.write)
            .iter()
            .any(|f| f.0 == wire::DATA),
        "nothing of the half message reached the client"
    );
    ack_barriers(&mut r, now + BURST_GAP);
    assert_eq!(ended_gracefully(&r), 1);
    assert_eq!(terminated(&metrics, Reason::drain), 0, "not written yet");
    assert_eq!(dropped(&metrics, Dropped::partial_message), (1, 8));
    assert!(!frames_in(&r.client.peer.write)
        .iter()
        .any(|f| f.0 == wire::RST_STREAM && f.3 == wire::REFUSED_STREAM.to_be_bytes()));
}

/// A stream being ended whose client took nothing for the write-stall
/// timeout is reset: a cut, and DATA the app sent before it read that
/// reset is counted as dropped (before: silently).
#[tokio::test]
async fn data_after_a_write_stall_reset_is_counted() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    let stall = guard.config().limits.write_stall_timeout;
    if let Some(s) = r.streams.get_mut(&1) {
        s.shut_at(now);
    }
    r.endings.stalled.insert(1);
    r.timers(now + stall).expect("the stall");
    assert!(r.streams.is_empty());
    assert_eq!(ungraceful(&metrics, Reason::drain), 1);
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 7]);
    r.app_frames(now + stall).expect("a late message");
    assert_eq!(dropped(&metrics, Dropped::after_end), (1, 6));
}

/// Issue 57's attack: a stream the guard already cancelled at the app (its
/// ending) whose client then takes nothing for the write-stall timeout is
/// reset to the client, and not again to the app, which saw it reset
/// (RFC 9113 §5.1: a frame after its RST_STREAM is a stream error there).
#[tokio::test]
async fn a_write_stall_after_the_cancel_resets_the_app_once() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    assert!(r.streams.app_cancelled(1), "the cancel went out");
    let resets = |buf: &[u8]| {
        frames_in(buf)
            .iter()
            .filter(|f| f.0 == wire::RST_STREAM && f.2 == 1)
            .count()
    };
    assert_eq!(resets(&r.app.peer.write), 1, "the cancel");
    r.app.peer.write.clear();
    r.client.peer.write.clear();
    let stall = guard.config().limits.write_stall_timeout;
    if let Some(s) = r.streams.get_mut(&1) {
        s.shut_at(now);
    }
    r.endings.stalled.insert(1);
    r.timers(now + BURST_GAP + stall).expect("the stall");
    assert!(r.streams.is_empty(), "the stream is over");
    assert_eq!(resets(&r.client.peer.write), 1, "the client's reset");
    assert_eq!(resets(&r.app.peer.write), 0, "no second reset to the app");
}

/// A client that shuts and reopens windows by the byte, stream after
/// stream, with no timer ever running: the stall set keeps only streams
/// still open and shut (before: one id per stream, for the connection's
/// life, walked on every turn).
#[tokio::test]
async fn the_stall_set_never_outgrows_the_open_streams() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = handshaken(&guard, now);
    let mut tiny = Vec::new();
    tiny.extend_from_slice(&wire::INITIAL_WINDOW_SIZE.to_be_bytes());
    tiny.extend_from_slice(&16u32.to_be_bytes());
    wire::put(&mut r.client.peer.read, wire::SETTINGS, 0, 0, &tiny);
    r.client_frames(now).expect("a tiny window");
    let head = wire::literal_block(&[(":status", "200"), ("content-type", "application/grpc")]);
    for i in 0..500u32 {
        let id = 1 + 2 * i;
        request(&mut r, id, now);
        wire::put(
            &mut r.app.peer.read,
            wire::HEADERS,
            wire::END_HEADERS,
            id,
            &head,
        );
        wire::put(&mut r.app.peer.read, wire::DATA, 0, id, &[0u8; 16]);
        r.app_frames(now).expect("a window's worth");
        wire::window_update(&mut r.client.peer.read, id, 16);
        r.client_frames(now).expect("credit");
        wire::put(
            &mut r.app.peer.read,
            wire::DATA,
            wire::END_STREAM,
            id,
            &[0u8; 16],
        );
        r.app_frames(now).expect("the rest");
        r.client.peer.write.clear();
        r.window.buffer_dropped();
        r.app.peer.write.clear();
        r.endings.prune_stalled(|id| r.streams.shut(id));
        assert!(r.endings.stalled.len() <= r.streams.len(), "round {i}");
    }
}

/// The app sends the client 65 SETTINGS before it acks any, the second
/// lowering MAX_CONCURRENT_STREAMS to 1: one ack does not bind that limit
/// (before: the 65th frame pushed the first out of the queue, and each ack
/// after paired with the next frame).
#[tokio::test]
async fn a_flood_of_settings_keeps_acks_paired_with_their_frames() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = handshaken(&guard, now);
    request(&mut r, 1, now);
    let limit = |v: u32| {
        let mut p = Vec::new();
        p.extend_from_slice(&wire::MAX_CONCURRENT_STREAMS.to_be_bytes());
        p.extend_from_slice(&v.to_be_bytes());
        p
    };
    wire::put(&mut r.app.peer.read, wire::SETTINGS, 0, 0, &limit(1));
    for _ in 0..64 {
        wire::put(&mut r.app.peer.read, wire::SETTINGS, 0, 0, &[]);
    }
    r.app_frames(now).expect("the app's SETTINGS");
    // The client acks the handshake's SETTINGS only.
    wire::put(&mut r.client.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.client_frames(now).expect("one ack");
    r.app.peer.write.clear();
    request(&mut r, 3, now);
    assert!(
        frames_in(&r.app.peer.write)
            .iter()
            .any(|f| f.0 == wire::HEADERS && f.2 == 3),
        "the lower limit is not acked yet"
    );
    // Every ack: now it binds.
    for _ in 0..65 {
        wire::put(&mut r.client.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    }
    r.client_frames(now).expect("the acks");
    r.app.peer.write.clear();
    request(&mut r, 5, now);
    assert!(!frames_in(&r.app.peer.write)
        .iter()
        .any(|f| f.0 == wire::HEADERS && f.2 == 5));
}

/// The third look: a held half message dropped by the guard's own
/// write-stall reset is counted too (the guard cut the stream).
#[tokio::test]
async fn a_held_message_dropped_by_a_stall_reset_is_counted() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = half_message_held(&guard, now);
    let stall = guard.config().limits.write_stall_timeout;
    if let Some(s) = r.streams.get_mut(&1) {
        s.shut_at(now);
    }
    r.endings.stalled.insert(1);
    r.timers(now + stall).expect("the stall");
    assert_eq!(dropped(&metrics, Dropped::partial_message), (1, 8));
    assert_eq!(r.streams.held(), 0);
}
