//! The relay's stream endings, unit by unit: the SETTINGS barrier and its
//! acks, the one protocol (cancel, barrier, held messages, ends counted once
//! written), a stream's cadence, and the fuzz
//! harness reaching them (helpers in the parent module).

use super::*;
use crate::guard::relay::feed::{feed, FeedStep};
use crate::metrics::Dropped;
use std::time::Duration;

/// Issue 39: every gRPC server strikes a PING that comes within 5 minutes
/// of the last one with no DATA or HEADERS written since, and drops the
/// connection at the third. Twenty quiet streams ended one by one over a
/// drain window, with the application silent throughout, must cost the
/// application connection no PING at all; the barrier is SETTINGS round
/// trips, two per ending that asks alone, and each stream still waits for
/// two of them started after it asked.
#[tokio::test]
async fn quiet_endings_spread_over_a_drain_send_the_app_no_ping() {
    let guard = test_guard();
    let start = Instant::now();
    let mut r = streams_open(&guard, 20, start);
    let settle = guard.config().limits.end_settle;
    let ctls = guard.open_streams();
    assert_eq!(ctls.len(), 20);
    let mut now = start;
    for (i, ctl) in ctls.iter().enumerate() {
        now += std::time::Duration::from_millis(400);
        ctl.end(Reason::drain);
        for id in r.endings.queue.take() {
            r.ends().begin_end(id, now);
        }
        // Its quiet moment passes; the barrier starts.
        now += settle + BURST_GAP;
        r.timers(now).expect("timers");
        let before = ended_gracefully(&r);
        assert_eq!(before, i, "no stream ends before its barrier is acked");
        ack_barriers(&mut r, now);
        assert_eq!(
            ended_gracefully(&r),
            i + 1,
            "stream {i} ends on the second ack"
        );
    }
    let (pings, _) = count(&r.app.peer.write, wire::PING);
    assert_eq!(pings, 0, "no PING to the application");
    let (settings, acks) = count(&r.app.peer.write, wire::SETTINGS);
    assert_eq!(
        (settings, acks),
        (40, 0),
        "two empty SETTINGS per lone ending"
    );
    assert!(frames_in(&r.app.peer.write)
        .iter()
        .filter(|f| f.0 == wire::SETTINGS)
        .all(|f| f.3.is_empty()));
    // Every ack was the guard's own: none reached the client.
    assert_eq!(count(&r.client.peer.write, wire::SETTINGS), (0, 0));
    assert!(r.streams.is_empty());
}

/// Endings asked together share the barrier: the first cancel's pair of
/// round trips, and one more, for the whole wave. Every other cancel went
/// out behind the first round trip's SETTINGS, which therefore does not
/// count for it: each stream waits for two round trips begun after its own
/// cancel (issue 55's review: before, they waited for one).
#[tokio::test]
async fn endings_asked_together_share_three_round_trips() {
    let guard = test_guard();
    let start = Instant::now();
    let mut r = streams_open(&guard, 20, start);
    ask_all(&guard, &mut r, Reason::max_age, start);
    let now = start + guard.config().limits.end_settle + BURST_GAP;
    r.timers(now).expect("timers");
    // The first stream's cancel, the barrier, then the other cancels.
    let order: Vec<u8> = frames_in(&r.app.peer.write).iter().map(|f| f.0).collect();
    assert_eq!(
        order[..3],
        [wire::RST_STREAM, wire::SETTINGS, wire::RST_STREAM]
    );
    // Two acks: only the first stream's end may go.
    for _ in 0..2 {
        wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
        r.app_frames(now).expect("an ack");
    }
    assert_eq!(ended_gracefully(&r), 1);
    // A message of the last stream, written before it read its cancel,
    // after the second ack: forwarded, not dropped.
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 39, &[0, 0, 0, 0, 1, 9]);
    r.app_frames(now).expect("a late message");
    assert!(
        r.streams.contains_key(&39),
        "still waiting for its round trips"
    );
    assert_eq!(
        count(&r.app.peer.write, wire::SETTINGS),
        (3, 0),
        "the third is out"
    );
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(now).expect("the third ack");
    assert_eq!(ended_gracefully(&r), 20);
    let to_client = frames_in(&r.client.peer.write);
    let late = to_client
        .iter()
        .position(|f| f.0 == wire::DATA && f.2 == 39 && f.3 == [0, 0, 0, 0, 1, 9])
        .expect("the late message reached the client");
    let end = to_client
        .iter()
        .position(|f| f.0 == wire::HEADERS && f.2 == 39)
        .expect("stream 39's trailers");
    assert!(late < end, "the message before the trailers");
    assert_eq!(count(&r.app.peer.write, wire::PING), (0, 0));
}

/// A client SETTINGS and the guard's barrier in flight together: each ack
/// goes to what it acknowledges, in order (the client gets exactly one ack,
/// for its own), and a table size the client lowered binds only on its ack.
#[tokio::test]
async fn settings_acks_pair_with_what_they_acknowledge() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    let later = now + guard.config().limits.end_settle + BURST_GAP;
    r.timers(later).expect("timers");
    // The client lowers its table while the first barrier is in flight.
    let mut lower = Vec::new();
    lower.extend_from_slice(&wire::HEADER_TABLE_SIZE.to_be_bytes());
    lower.extend_from_slice(&0u32.to_be_bytes());
    wire::put(&mut r.client.peer.read, wire::SETTINGS, 0, 0, &lower);
    r.client_frames(later).expect("the client's SETTINGS");
    // The app acks the barrier: not the client's.
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(later).expect("ack 1");
    assert_eq!(count(&r.client.peer.write, wire::SETTINGS), (0, 0));
    assert_eq!(r.settings.table_acked(), DEFAULT_TABLE, "not acked yet");
    // The client's, then the second barrier's.
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(later).expect("ack 2");
    assert_eq!(count(&r.client.peer.write, wire::SETTINGS), (1, 1));
    assert_eq!(r.settings.table_acked(), 0);
    assert_eq!(
        ended_gracefully(&r),
        0,
        "the second round trip is still out"
    );
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(later).expect("ack 3");
    assert_eq!(ended_gracefully(&r), 1);
    assert_eq!(count(&r.client.peer.write, wire::SETTINGS), (1, 1));
}
/// The fuzz target's harness reaches the guard's own endings: a drain, the
/// clock past the quiet moment, the app's acks of the barrier, and every
/// quiet stream is ended gracefully (none by the barrier's bound).
#[tokio::test]
async fn feed_reaches_the_barrier_and_the_endings() {
    let metrics =
        crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
    let g = crate::guard::Guard::new(
        crate::guard::GuardConfig::new(([127, 0, 0, 1], 9).into()),
        metrics.clone(),
    );
    let guard = g.handle();
    let mut client = BytesMut::new();
    client.extend_from_slice(H2_PREFACE);
    wire::put(&mut client, wire::SETTINGS, 0, 0, &[]);
    let request = wire::literal_block(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/x.Y/Z"),
        (":authority", "app"),
        ("content-type", "application/grpc"),
    ]);
    let head = wire::literal_block(&[(":status", "200"), ("content-type", "application/grpc")]);
    let mut app = BytesMut::new();
    wire::put(&mut app, wire::SETTINGS, 0, 0, &[]);
    for id in [1, 3, 5] {
        wire::put(&mut client, wire::HEADERS, wire::END_HEADERS, id, &request);
        wire::put(&mut app, wire::HEADERS, wire::END_HEADERS, id, &head);
        wire::put(
            &mut app,
            wire::DATA,
            0,
            id,
            &[0, 0, 0, 0, 1, 7, 0, 0, 0, 0, 1, 7],
        );
    }
    // The ack of the client's SETTINGS, then of the barrier's three (the
    // first cancel's two, and one begun after the other two cancels).
    let mut acks = BytesMut::new();
    for _ in 0..4 {
        wire::put(&mut acks, wire::SETTINGS, wire::ACK, 0, &[]);
    }
    let wait = guard.config().limits.end_settle + std::time::Duration::from_millis(5);
    let steps = [
        FeedStep::Read(true, &client),
        FeedStep::Read(false, &app),
        FeedStep::EndAll,
        FeedStep::Wait(wait),
        FeedStep::Read(false, &acks),
    ];
    feed(&guard, &steps, false);
    let ended = metrics
        .streams_terminated
        .get_or_create(&crate::metrics::TerminatedLabels {
            reason: Reason::drain,
            protocol: StreamProtocol::grpc,
        })
        .get();
    assert_eq!(ended, 3);
}
/// Issue 39, nothing lost: a quiet stream's end lands at a random moment,
/// so the guard cancels the application's stream first (RST_STREAM ahead
/// of the barrier's SETTINGS), and a message it hands its transport until
/// it reads the cancel is forwarded:
/// every DATA that arrives before the barrier's acks, and one in the same
/// read as the last ack, reaches the client ahead of the trailers.
#[tokio::test]
async fn the_app_is_cancelled_first_and_what_it_wrote_meanwhile_goes_on() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    // Asked a second after its last message: a quiet stream.
    let asked = now + std::time::Duration::from_secs(1);
    ask_all(&guard, &mut r, Reason::drain, asked);
    let later = asked + guard.config().limits.end_settle + BURST_GAP;
    r.timers(later).expect("timers");
    let to_app: Vec<(u8, u32)> = frames_in(&r.app.peer.write)
        .iter()
        .map(|f| (f.0, f.2))
        .collect();
    assert_eq!(
        to_app,
        [(wire::RST_STREAM, 1), (wire::SETTINGS, 0)],
        "the cancel, then the barrier"
    );
    let message = [0u8, 0, 0, 0, 1, 9];
    // Written before the app read the cancel; then the first ack.
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &message);
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(later).expect("data, ack 1");
    // The second ack, with one more message behind it in the same read.
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &message);
    r.app_frames(later).expect("ack 2, data");
    let to_client: Vec<(u8, u32, bool)> = frames_in(&r.client.peer.write)
        .iter()
        .map(|f| (f.0, f.2, f.1 & wire::END_STREAM != 0))
        .collect();
    assert_eq!(
        to_client,
        [
            (wire::DATA, 1, false),
            (wire::DATA, 1, false),
            (wire::HEADERS, 1, true),
            (wire::RST_STREAM, 1, false),
        ],
        "both messages, then the trailers (and the request's end)"
    );
    let cancels = frames_in(&r.app.peer.write)
        .iter()
        .filter(|f| f.0 == wire::RST_STREAM)
        .count();
    assert_eq!(cancels, 1, "the app's stream is cancelled once");
}

/// An app in its graceful stop closes its connection once its last stream
/// is cancelled, before it acks the barrier: its close follows all it
/// wrote, so a stream at a boundary still gets the guard's graceful end
/// (the drain's message), not "the connection to the application was lost".
#[tokio::test]
async fn an_app_that_closes_after_the_cancel_still_gets_a_graceful_end() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    let asked = now + std::time::Duration::from_secs(1);
    ask_all(&guard, &mut r, Reason::drain, asked);
    r.timers(asked + guard.config().limits.end_settle + BURST_GAP)
        .expect("timers");
    assert!(r.streams.app_cancelled(1));
    r.conn().app_lost(true);
    let has = |needle: &str| {
        r.client
            .peer
            .write
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    };
    assert!(has(grpc::end_message(Reason::drain)), "the drain's own end");
    assert!(!has(grpc::UPSTREAM_LOST_MESSAGE));
    assert!(r.streams.is_empty());
}

/// Issue 55 review: a DATA frame that finishes one message and starts the
/// next after the cancel (tonic packs messages so): the whole message goes
/// on, only the start of the next is held, and dropped when cut short.
#[tokio::test]
async fn a_frame_with_a_whole_message_and_the_start_of_the_next_is_split() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    let frame = [0, 0, 0, 0, 1, 9, 0, 0, 0, 0, 3, 4];
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &frame);
    r.app_frames(now + BURST_GAP)
        .expect("a whole message and a start");
    ack_barriers(&mut r, now + BURST_GAP);
    let data: Vec<u8> = frames_in(&r.client.peer.write)
        .iter()
        .filter(|f| f.0 == wire::DATA)
        .flat_map(|f| f.3.clone())
        .collect();
    assert_eq!(data, [0, 0, 0, 0, 1, 9], "the whole message, alone");
    assert_eq!(ended_gracefully(&r), 1);
    assert_eq!(dropped(&metrics, Dropped::partial_message), (1, 6));
    // The held start's window goes back to the app.
    assert_eq!(credit_in(&r.app.peer.write, 0), 6);
}

/// Issue 55 review: a write may stop inside a frame; the ends still queued
/// behind it are found from the first whole frame, never by reading a
/// payload as a frame head.
#[tokio::test]
async fn an_end_behind_a_half_written_frame_is_not_counted_written() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    let mut message = vec![0u8, 0, 0, 0x10, 0];
    message.resize(5 + 0x1000, 0xff);
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &message);
    r.app_frames(now + BURST_GAP).expect("a message");
    ack_barriers(&mut r, now + BURST_GAP);
    r.clear_gate();
    // The socket takes 19 bytes: the DATA frame's head and 10 of it.
    let mut sink = Vec::new();
    let mut limited = Limited(&mut sink, 19);
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    r.window
        .write(&mut cx, &mut limited, &mut r.client.peer.write)
        .expect("a partial write");
    assert_eq!(sink.len(), 19);
    r.ends().settle_written(None);
    assert_eq!(
        terminated(&metrics, Reason::drain),
        0,
        "the trailers still wait"
    );
    // Then the rest goes.
    let mut all = Vec::new();
    let mut open = Limited(&mut all, usize::MAX);
    r.window
        .write(&mut cx, &mut open, &mut r.client.peer.write)
        .expect("the rest");
    r.ends().settle_written(None);
    assert_eq!(terminated(&metrics, Reason::drain), 1);
}

/// A socket that takes `1` more bytes at most, then is full.
pub(super) struct Limited<'a>(pub(super) &'a mut Vec<u8>, pub(super) usize);

impl tokio::io::AsyncWrite for Limited<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.1);
        if n == 0 {
            return std::task::Poll::Pending;
        }
        self.1 -= n;
        self.0.extend_from_slice(&buf[..n]);
        std::task::Poll::Ready(Ok(n))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Issue 55 review: an app that dies with half a frame unread, or whose
/// connection fails on a write, has not confirmed anything: a stream being
/// ended is not counted graceful; only a clean close is.
#[tokio::test]
async fn an_app_lost_mid_frame_never_gives_a_graceful_end() {
    for (half_frame, clean) in [(true, true), (false, false)] {
        let (guard, metrics) = guard_and_metrics();
        let now = Instant::now();
        let mut r = streams_open(&guard, 1, now);
        ask_all(&guard, &mut r, Reason::drain, now);
        r.timers(now + BURST_GAP).expect("the cancel");
        if half_frame {
            let mut f = BytesMut::new();
            wire::put(&mut f, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 9]);
            r.app.peer.read.extend_from_slice(&f[..12]);
            r.app_frames(now + BURST_GAP).expect("half a frame");
        }
        r.conn().app_lost(clean);
        r.client.peer.write.clear();
        r.window.buffer_dropped();
        r.ends().settle_written(None);
        assert_eq!(
            terminated(&metrics, Reason::drain),
            0,
            "{half_frame} {clean}"
        );
        let has_lost = {
            let needle = grpc::UPSTREAM_LOST_MESSAGE.as_bytes();
            r.streams.is_empty()
                && !r
                    .client
                    .peer
                    .write
                    .windows(needle.len())
                    .any(|w| w == needle)
        };
        assert!(has_lost, "the stream ended as a lost app's");
    }
}

/// Issue 55 review: the client's trailers and WINDOW_UPDATEs for a stream
/// the guard cancelled at the app never reach the app (a frame on a closed
/// stream, RFC 9113 §5.1, which an app may answer with a connection error).
#[tokio::test]
async fn nothing_but_priority_goes_to_the_app_on_a_stream_it_cancelled() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("the cancel");
    r.app.peer.write.clear();
    let trailers = wire::literal_block(&[("x-end", "1")]);
    wire::put(
        &mut r.client.peer.read,
        wire::WINDOW_UPDATE,
        0,
        1,
        &100u32.to_be_bytes(),
    );
    wire::put(
        &mut r.client.peer.read,
        wire::HEADERS,
        wire::END_HEADERS | wire::END_STREAM,
        1,
        &trailers,
    );
    r.client_frames(now + BURST_GAP)
        .expect("the client's frames");
    let to_app: Vec<(u8, u32)> = frames_in(&r.app.peer.write)
        .iter()
        .map(|f| (f.0, f.2))
        .collect();
    assert!(
        to_app.iter().all(|&(_, id)| id != 1),
        "nothing on stream 1: {to_app:?}"
    );
}

/// Issue 55 review: a stream with no response yet is cancelled at once;
/// its head and a message behind the last ack in one read both reach the
/// client before the trailers.
#[tokio::test]
async fn a_head_and_a_message_behind_the_ack_in_one_read_come_first() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = handshaken(&guard, now);
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(now).expect("the ack of the client's SETTINGS");
    request(&mut r, 1, now);
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    ask_all(&guard, &mut r, Reason::drain, now);
    assert!(
        r.streams.app_cancelled(1),
        "no answer yet: cancelled at once"
    );
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    r.app_frames(now).expect("ack 1");
    let head = wire::literal_block(&[(":status", "200"), ("content-type", "application/grpc")]);
    wire::put(&mut r.app.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    wire::put(
        &mut r.app.peer.read,
        wire::HEADERS,
        wire::END_HEADERS,
        1,
        &head,
    );
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 9]);
    r.app_frames(now).expect("ack 2, the head, a message");
    let to_client: Vec<(u8, bool)> = frames_in(&r.client.peer.write)
        .iter()
        .map(|f| (f.0, f.1 & wire::END_STREAM != 0))
        .collect();
    assert_eq!(
        &to_client[..3],
        [
            (wire::HEADERS, false),
            (wire::DATA, false),
            (wire::HEADERS, true)
        ]
    );
    assert_eq!(dropped(&metrics, Dropped::after_end), (0, 0));
}

/// Issue 55: a stream whose messages span frames (a producer of large
/// messages) gets the same protocol: the cancel first, the barrier behind
/// it. A message its stack cut short once it read the cancel is held and
/// dropped (counted), never half-delivered: the trailers come at the
/// boundary before it. One it finished before the ack goes on whole.
#[tokio::test]
async fn a_stream_of_split_messages_is_cancelled_first_and_never_gets_half_a_message() {
    for finished in [false, true] {
        let (guard, metrics) = guard_and_metrics();
        let now = Instant::now();
        let mut r = streams_open(&guard, 1, now);
        // A message of 3 bytes in two frames.
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 3, 1]);
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[2, 3]);
        r.app_frames(now).expect("a split message");
        r.app.peer.write.clear();
        r.client.peer.write.clear();
        r.window.buffer_dropped();
        ask_all(&guard, &mut r, Reason::drain, now);
        r.timers(now + BURST_GAP).expect("timers");
        let to_app: Vec<u8> = frames_in(&r.app.peer.write).iter().map(|f| f.0).collect();
        assert_eq!(
            to_app,
            [wire::RST_STREAM, wire::SETTINGS],
            "the cancel first"
        );
        // Written before it read the cancel: the start of the next message.
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 3, 4]);
        if finished {
            wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[5, 6]);
        }
        r.app_frames(now + BURST_GAP).expect("a message begun");
        ack_barriers(&mut r, now + BURST_GAP);
        assert_eq!(ended_gracefully(&r), 1, "finished: {finished}");
        let data: Vec<u8> = frames_in(&r.client.peer.write)
            .iter()
            .filter(|f| f.0 == wire::DATA)
            .flat_map(|f| f.3.clone())
            .collect();
        let partial = dropped(&metrics, Dropped::partial_message);
        if finished {
            assert_eq!(
                data,
                [0, 0, 0, 0, 3, 4, 5, 6],
                "the whole message, before the trailers"
            );
            assert_eq!(partial, (0, 0));
        } else {
            assert!(data.is_empty(), "never half a message: {data:?}");
            assert_eq!(partial, (1, 6), "the dropped start is counted");
            // Its window goes back to the application.
            assert_eq!(credit_in(&r.app.peer.write, 0), 6);
        }
        let cancels = count(&r.app.peer.write, wire::RST_STREAM).0;
        assert_eq!(cancels, 1, "the app's stream is cancelled once");
    }
}

/// Issue 55's example: a quiet stream asked to end; the app, frozen (a
/// CPU quota, a GC pause), reads the cancel late: a message and both acks
/// arrive 51 ms after the cancel, and 1,990 ms after it (the cancel came at
/// the end of `end_settle`, so the ending's bound leaves it `ACK_MIN`).
/// No clock cuts the barrier short: the message reaches the client before
/// the trailers, and nothing is dropped.
#[tokio::test]
async fn a_slow_app_s_message_and_acks_long_after_the_cancel_still_come_first() {
    for late in [Duration::from_millis(51), Duration::from_millis(1_990)] {
        let (guard, metrics) = guard_and_metrics();
        let now = Instant::now();
        let mut r = streams_open(&guard, 1, now);
        let asked = now + Duration::from_secs(1);
        ask_all(&guard, &mut r, Reason::drain, asked);
        let cancel_at = asked + guard.config().limits.end_settle + BURST_GAP;
        r.timers(cancel_at).expect("timers");
        assert!(r.streams.app_cancelled(1));
        r.client.peer.write.clear();
        r.window.buffer_dropped();
        r.timers(cancel_at + late).expect("the clock runs on");
        assert_eq!(ended_gracefully(&r), 0, "still waiting, {late:?}");
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 9]);
        ack_barriers(&mut r, cancel_at + late);
        let to_client: Vec<(u8, bool)> = frames_in(&r.client.peer.write)
            .iter()
            .map(|f| (f.0, f.1 & wire::END_STREAM != 0))
            .collect();
        assert_eq!(
            &to_client[..2],
            [(wire::DATA, false), (wire::HEADERS, true)],
            "{late:?}"
        );
        assert_eq!(dropped(&metrics, Dropped::after_end), (0, 0));
        assert_eq!(dropped(&metrics, Dropped::partial_message), (0, 0));
    }
}

/// The bound is the ending's own: an app that never acks within
/// `end_timeout` of the cancel gets its stream ended anyway, counted
/// ungraceful (never graceful), and DATA it sends after that is counted
/// as dropped, with its bytes.
#[tokio::test]
async fn an_ending_past_its_bound_is_never_counted_graceful_and_later_data_is_counted() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    let cancel_at = now + BURST_GAP;
    r.timers(cancel_at).expect("timers");
    assert!(r.streams.app_cancelled(1));
    let bound = cancel_at + guard.config().limits.end_timeout;
    assert!(r.next_deadline().is_some_and(|at| at <= bound));
    r.timers(bound).expect("the bound");
    assert!(r.streams.is_empty());
    assert_eq!(ended_gracefully(&r), 1, "the client still gets trailers");
    r.client.peer.write.clear();
    r.window.buffer_dropped();
    r.ends().settle_written(None);
    assert_eq!(terminated(&metrics, Reason::drain), 0, "not graceful");
    assert_eq!(ungraceful(&metrics, Reason::drain), 1);
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 9]);
    r.app_frames(bound).expect("data after the end");
    assert_eq!(dropped(&metrics, Dropped::after_end), (1, 6));
    assert!(
        frames_in(&r.client.peer.write).is_empty(),
        "nothing after the end"
    );
}

/// An end counts as graceful only once it has been written to the client:
/// one still queued is not counted, and one the close drops is a cut.
#[tokio::test]
async fn a_graceful_end_counts_once_written_and_a_dropped_one_is_a_cut() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 2, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    r.timers(now + BURST_GAP).expect("timers");
    ack_barriers(&mut r, now + BURST_GAP);
    assert_eq!(ended_gracefully(&r), 2);
    r.ends().settle_written(None);
    assert_eq!(
        terminated(&metrics, Reason::drain),
        0,
        "queued, not written"
    );
    assert_eq!(guard.registered(), 2, "a drain still waits for them");
    // Stream 1's end leaves; stream 3's is dropped with the connection.
    let mut cut = std::collections::HashSet::new();
    cut.insert(3);
    r.client.peer.write.clear();
    r.ends().settle_written(Some(&cut));
    assert_eq!(terminated(&metrics, Reason::drain), 1);
    assert_eq!(ungraceful(&metrics, Reason::drain), 1);
    assert_eq!(guard.registered(), 0);
}
