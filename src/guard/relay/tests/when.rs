//! When an ending begins: in a producer's pause, at once for a steady one
//! asked between writes, at its bound for one that never pauses, and for
//! every stream of a connection at its max age.

use super::*;
use crate::metrics::Dropped;
use std::time::Duration;

/// Past `end_timeout`, a producer that never pauses is cancelled at a
/// boundary like any other: a message on its way when the bound came still
/// reaches the client, ahead of the trailers (it was lost before).
#[tokio::test]
async fn a_producer_that_never_pauses_is_cancelled_at_its_bound_and_loses_nothing() {
    let (guard, metrics) = guard_and_metrics();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    let timeout = guard.config().limits.end_timeout;
    let mut t = now;
    while t < now + timeout {
        t += Duration::from_millis(1);
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 7]);
        r.app_frames(t).expect("a message");
        r.timers(t).expect("timers");
    }
    assert!(count(&r.app.peer.write, wire::RST_STREAM).0 == 0 || r.streams.app_cancelled(1));
    r.timers(now + timeout).expect("the bound");
    assert!(r.streams.app_cancelled(1), "cancelled at its bound");
    assert_eq!(ended_gracefully(&r), 0, "the trailers wait for the ack");
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 8]);
    ack_barriers(&mut r, now + timeout);
    let frames = frames_in(&r.client.peer.write);
    let last_data = frames
        .iter()
        .rposition(|f| f.0 == wire::DATA)
        .expect("DATA to the client");
    let trailers = frames
        .iter()
        .position(|f| f.0 == wire::HEADERS && f.1 & wire::END_STREAM != 0)
        .expect("the trailers");
    assert!(last_data < trailers);
    assert_eq!(frames[last_data].3, [0, 0, 0, 0, 1, 8]);
    r.client.peer.write.clear();
    r.ends().settle_written(None);
    assert_eq!(terminated(&metrics, Reason::drain), 1);
    assert_eq!(dropped(&metrics, Dropped::after_end), (0, 0));
}

/// A stream that just wrote, its messages each in one frame, is cancelled
/// in its pause, ahead of the barrier: a message it hands its transport
/// before it reads the cancel arrives whole, before the acks, and goes on.
#[tokio::test]
async fn a_stream_that_just_wrote_whole_messages_is_cancelled_in_its_pause() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = streams_open(&guard, 1, now);
    ask_all(&guard, &mut r, Reason::drain, now);
    assert!(
        frames_in(&r.app.peer.write).is_empty(),
        "nothing before the pause"
    );
    r.timers(now + BURST_GAP).expect("timers");
    let to_app: Vec<u8> = frames_in(&r.app.peer.write).iter().map(|f| f.0).collect();
    assert_eq!(
        to_app,
        [wire::RST_STREAM, wire::SETTINGS],
        "the cancel, then the barrier"
    );
    wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 9]);
    r.app_frames(now + BURST_GAP).expect("a message on its way");
    ack_barriers(&mut r, now + BURST_GAP);
    assert_eq!(ended_gracefully(&r), 1);
    let to_client: Vec<(u8, bool)> = frames_in(&r.client.peer.write)
        .iter()
        .map(|f| (f.0, f.1 & wire::END_STREAM != 0))
        .collect();
    assert_eq!(
        to_client.first(),
        Some(&(wire::DATA, false)),
        "the message on its way, before the trailers"
    );
    assert!(to_client.contains(&(wire::HEADERS, true)));
}

/// A producer that writes one message every 100 ms, asked to end 10 ms
/// after its last write: its next one is far off, so the cancel and the
/// barrier go at once, on the schedule, rather than after its next write.
#[tokio::test]
async fn a_steady_producer_asked_between_writes_is_cancelled_at_once() {
    let guard = test_guard();
    let start = Instant::now();
    let mut r = streams_open(&guard, 1, start);
    let every = std::time::Duration::from_millis(100);
    let mut last = start;
    for i in 1..=20u32 {
        last = start + every * i;
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 7]);
        r.app_frames(last).expect("a message");
    }
    r.app.peer.write.clear();
    let asked = last + std::time::Duration::from_millis(10);
    ask_all(&guard, &mut r, Reason::drain, asked);
    let to_app: Vec<u8> = frames_in(&r.app.peer.write).iter().map(|f| f.0).collect();
    assert_eq!(
        to_app,
        [wire::RST_STREAM, wire::SETTINGS],
        "the cancel, then the barrier, with no wait for the next write"
    );
    ack_barriers(&mut r, asked);
    assert_eq!(ended_gracefully(&r), 1);

    // Asked late in its pause, its next write due within the margin: it
    // waits for that write, as a stream without a cadence does.
    let mut r = streams_open(&guard, 1, start);
    for i in 1..=20u32 {
        wire::put(&mut r.app.peer.read, wire::DATA, 0, 1, &[0, 0, 0, 0, 1, 7]);
        r.app_frames(start + every * i).expect("a message");
    }
    r.app.peer.write.clear();
    ask_all(
        &guard,
        &mut r,
        Reason::drain,
        last + std::time::Duration::from_millis(90),
    );
    assert!(
        frames_in(&r.app.peer.write).is_empty(),
        "nothing while its next write is due"
    );
}

/// A stream the client sent before it read the max-age GOAWAY arrives
/// after that GOAWAY. With a grace no longer than the spread, the endings
/// began at the age itself, without it: it must still be ended by the max
/// age once no stream can arrive any more (the PING ack), never left to
/// the connection's closing deadline, which cuts it (the peer matrix saw
/// one such stream of 60 cut behind grpc-java).
#[tokio::test(start_paused = true)]
async fn a_stream_that_arrives_after_the_max_age_endings_began_is_ended_too() {
    let metrics =
        crate::metrics::Metrics::register(&mut prometheus_client::registry::Registry::default());
    let mut config = crate::guard::GuardConfig::new(([127, 0, 0, 1], 9).into());
    config.max_connection_age = Some(Duration::from_secs(3));
    config.max_connection_age_grace = Duration::from_secs(2);
    config.max_connection_age_spread = Duration::from_secs(2);
    let guard = crate::guard::Guard::new(config, metrics).handle();
    let mut r = streams_open(&guard, 2, Instant::now());
    // Past the jittered age (3 s ± 10%): the first GOAWAY and its PING; the
    // endings start at once (grace - spread = 0).
    tokio::time::advance(Duration::from_millis(3_400)).await;
    let now = Instant::now();
    r.timers(now).expect("the age");
    r.timers(now).expect("the grace");
    assert!(r.life.machine().awaits_ack());
    // The client's next stream, sent before it read the GOAWAY.
    let request = grpc_request();
    wire::put(
        &mut r.client.peer.read,
        wire::HEADERS,
        wire::END_HEADERS,
        5,
        &request,
    );
    r.client_frames(now).expect("a request in flight");
    assert!(
        r.streams.contains_key(&5),
        "admitted: below the final GOAWAY"
    );
    // Then the ack of the probe: the final GOAWAY names stream 5.
    let (probe, out) = r.life.probe();
    assert!(out, "the probe went out");
    wire::ping(&mut r.client.peer.read, true, probe);
    let acked = Instant::now() + Duration::from_millis(100);
    tokio::time::advance(Duration::from_millis(100)).await;
    r.client_frames(acked).expect("the ack");
    // Within the grace, by the connection's own timer, every stream of the
    // connection is asked to end (no task, no trip through the registry).
    tokio::time::advance(Duration::from_secs(2)).await;
    let due = r.next_deadline().expect("a timer is set");
    assert!(due <= Instant::now(), "the planned ends are due by now");
    r.timers(Instant::now()).expect("the planned ends");
    let mut asked: Vec<u32> = r
        .streams
        .iter()
        .filter(|(_, s)| s.end_reason() == Some(Reason::max_age) && s.ending().is_some())
        .map(|(id, _)| *id)
        .collect();
    asked.sort_unstable();
    assert_eq!(asked, vec![1, 3, 5], "every stream ended by the max age");
    assert!(r.endings.planned.is_empty());
}
