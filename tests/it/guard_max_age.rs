//! Max connection age through the guard, observed on the wire by a
//! frame-recording tap between a tonic client and the guard.

use crate::support::guard as guard_support;

use std::time::Duration;

use drainshim::guard::{end_message, AGE_JITTER};
use drainshim::metrics::Reason;
use guard_support::*;
use tonic::Code;

/// 2^31-1: "no new streams, but I have not decided the last one yet".
const MAX_STREAM_ID: u32 = (1 << 31) - 1;
/// Timer slack on the early side: tokio may fire a timer up to a millisecond
/// early relative to our clock reading, and the tap stamps after reading.
const EARLY: Duration = Duration::from_millis(20);
/// Allowance for the close itself (the ending at a message boundary, the
/// flush) and for timers firing late on a loaded 2-core machine.
const CLOSE_SLACK: Duration = Duration::from_secs(2);

fn min_age(age: Duration) -> Duration {
    age.mul_f64(1.0 - AGE_JITTER).saturating_sub(EARLY)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_age_goaway_ping_goaway_grace_trailers_close() {
    let age = Duration::from_secs(2);
    let grace = Duration::from_secs(1);
    let (_backend, g) = guarded(|config| {
        config.max_connection_age = Some(age);
        config.max_connection_age_grace = grace;
    })
    .await;
    let tap = Tap::start(g.addr).await;
    let client = connect_client(tap.addr).await;
    let mut sub = subscribe(&client, "aged", 20, 32);

    let (result, _) = sub.finish().await;
    let status = result.expect_err("the guard ends the stream at max age");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), end_message(Reason::max_age));
    assert!(sub.received() > 0);
    sub.assert_no_gaps();

    // The connection closes once the stream is done.
    tap.wait_for("the guard to close the connection", |e| {
        eof_at(e, 0, Dir::Down)
    })
    .await;
    let events = tap.events();
    let t0 = accepted_at(&events, 0).expect("accepted");
    let down = frames(&events, 0, Dir::Down);

    let (first_at, first) = down
        .iter()
        .find(|(_, f)| f.ty == GOAWAY)
        .cloned()
        .expect("a GOAWAY");
    assert_eq!(
        first.goaway,
        Some((MAX_STREAM_ID, 0)),
        "first GOAWAY: 2^31-1, NO_ERROR"
    );
    assert!(
        first_at - t0 >= min_age(age),
        "GOAWAY after {:?}, before the jittered age could pass",
        first_at - t0
    );
    let (ping_at, _) = down
        .iter()
        .find(|(at, f)| *at >= first_at && f.ty == PING && f.flags & ACK == 0)
        .cloned()
        .expect("a PING after the first GOAWAY");
    let (final_at, last) = down
        .iter()
        .find(|(at, f)| *at >= ping_at && f.ty == GOAWAY && f.goaway != Some((MAX_STREAM_ID, 0)))
        .cloned()
        .expect("a final GOAWAY after the PING");
    assert_eq!(
        last.goaway,
        Some((1, 0)),
        "final GOAWAY names the last stream (1), NO_ERROR"
    );
    // The client acked the PING before the final GOAWAY went out.
    let up = frames(&events, 0, Dir::Up);
    assert!(up
        .iter()
        .any(|(at, f)| f.ty == PING && f.flags & ACK != 0 && *at <= final_at));

    let (trailers_at, _) = down
        .iter()
        .find(|(_, f)| f.ty == HEADERS && f.stream == 1 && f.flags & END_STREAM != 0)
        .cloned()
        .expect("trailers (HEADERS + END_STREAM) on stream 1");
    assert!(
        trailers_at >= first_at,
        "trailers only after the max-age GOAWAY"
    );
    let closed_at = eof_at(&events, 0, Dir::Down).expect("closed");
    assert!(closed_at >= trailers_at);
    // gRPC A9: age x (1 + 10%) + grace bounds the connection's life; the
    // spread of the endings lies inside the grace. CLOSE_SLACK covers the
    // close itself and timers firing late on a loaded machine.
    let bound = age.mul_f64(1.0 + AGE_JITTER) + grace + CLOSE_SLACK;
    assert!(
        closed_at - t0 <= bound,
        "connection lived {:?}, over age x 1.1 + grace + slack = {bound:?}",
        closed_at - t0
    );
    let resets: Vec<_> = down
        .iter()
        .filter(|(_, f)| f.ty == RST_STREAM && f.rst != Some(0))
        .collect();
    assert!(resets.is_empty(), "resets toward the client: {resets:?}");
    assert!(
        !down
            .iter()
            .any(|(_, f)| f.ty == GOAWAY && f.goaway.is_some_and(|(_, code)| code != 0)),
        "every GOAWAY is NO_ERROR"
    );

    assert_eq!(g.goaways(Reason::max_age), 1);
    wait_until("the termination to be counted", || {
        g.streams_terminated(Reason::max_age) == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_of_the_same_age_go_away_at_different_times() {
    const CONNECTIONS: usize = 10;
    let age = Duration::from_secs(3);
    let (_backend, g) = guarded(|config| {
        config.max_connection_age = Some(age);
    })
    .await;
    let tap = Tap::start(g.addr).await;

    let mut clients = Vec::new();
    for i in 0..CONNECTIONS {
        let mut c = connect_client(tap.addr).await;
        let answer = within("echo", echo(&mut c, &format!("c{i}"))).await;
        assert!(answer.is_ok(), "{answer:?}");
        clients.push(c);
    }
    let offsets: Vec<Duration> = tap
        .wait_for("a GOAWAY on every connection", |events| {
            (0..CONNECTIONS)
                .map(|conn| {
                    let t0 = accepted_at(events, conn)?;
                    let (at, _) = frames(events, conn, Dir::Down)
                        .into_iter()
                        .find(|(_, f)| f.ty == GOAWAY)?;
                    Some(at - t0)
                })
                .collect()
        })
        .await;
    for o in &offsets {
        assert!(
            *o >= min_age(age),
            "GOAWAY after {o:?}: earlier than the jitter allows"
        );
    }
    let min = offsets.iter().min().copied().unwrap_or_default();
    let max = offsets.iter().max().copied().unwrap_or_default();
    // Uniform over ±300 ms: ten draws within 100 ms of each other happen
    // about once in a million runs.
    assert!(
        max - min >= Duration::from_millis(100),
        "GOAWAYs are not spread: {offsets:?}"
    );
    assert_eq!(g.goaways(Reason::max_age), CONNECTIONS as u64);
    // Idle connections close after the final GOAWAY: nothing holds them open.
    wait_until("every connection to close", || {
        g.guard.active_connections() == 0
    })
    .await;
}

/// A client that never acks the PING after GOAWAY(2^31-1): the guard stops
/// waiting after `goaway_ack_timeout`, refuses new streams with
/// REFUSED_STREAM (safe to retry), still runs the grace, ends the open
/// stream with trailers, and sends the final GOAWAY before closing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_acks_the_ping_is_bounded() {
    use drainshim::guard::Limits;
    use prost::Message;

    let (_backend, g) = guarded(|config| {
        config.max_connection_age = Some(Duration::from_millis(500));
        // Long enough that the stream (ended mid-spread, at age + 1 s) outlives
        // the ack timeout and the refusal can be seen.
        config.max_connection_age_grace = Duration::from_secs(2);
        config.limits = Limits {
            goaway_ack_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
    })
    .await;
    let mut raw = RawH2::connect(g.addr).await;
    let path = "/drainshim.bench.v1.Stream/Subscribe";
    let request = drainshim_bench::proto::bench::SubscribeRequest {
        stream_id: "no-ack".to_string(),
        count: 0,
        interval_ms: 50,
        payload_bytes: 0,
        ..Default::default()
    }
    .encode_to_vec();
    let mut message = vec![0u8];
    message.extend_from_slice(&(request.len() as u32).to_be_bytes());
    message.extend_from_slice(&request);
    let block = grpc_request_block(path, &[]);
    raw.send(&encode_frame(HEADERS, END_HEADERS, 1, &block))
        .await
        .expect("headers");
    raw.send(&encode_frame(DATA, END_STREAM, 1, &message))
        .await
        .expect("data");

    let first = within("GOAWAY(2^31-1)", raw.until(|f| f.ty == GOAWAY))
        .await
        .expect("a GOAWAY");
    assert_eq!(first.goaway, Some((MAX_STREAM_ID, 0)));
    within(
        "the PING",
        raw.until(|f| f.ty == PING && f.flags & ACK == 0),
    )
    .await
    .expect("a PING");
    // Not acked. Streams opened meanwhile are still served (they may have
    // been in flight); once the guard stops waiting, new ones are refused.
    let refused = within("REFUSED_STREAM for a late stream", async {
        let mut id = 3;
        loop {
            raw.send(&encode_frame(HEADERS, END_HEADERS | END_STREAM, id, &block))
                .await
                .expect("late headers");
            let f = raw
                .until(|f| f.stream == id && (f.ty == RST_STREAM || f.flags & END_STREAM != 0))
                .await
                .expect("an answer");
            if f.ty == RST_STREAM {
                return f;
            }
            id += 2;
        }
    })
    .await;
    assert_eq!(refused.rst, Some(REFUSED_STREAM));
    // The grace ends with trailers on stream 1, then the final GOAWAY, then EOF.
    let mut frames = Vec::new();
    while let Some(f) = within("the end of the connection", raw.next_frame()).await {
        frames.push(f);
    }
    let trailers = frames
        .iter()
        .position(|f| f.ty == HEADERS && f.stream == 1 && f.flags & END_STREAM != 0)
        .expect("trailers on stream 1");
    let last = frames
        .iter()
        .position(|f| f.ty == GOAWAY)
        .expect("a final GOAWAY");
    assert!(
        trailers < last,
        "trailers before the final GOAWAY: {frames:?}"
    );
    assert_eq!(
        frames[last].goaway,
        Some((refused.stream, 0)),
        "last processed stream, NO_ERROR"
    );
    assert!(
        !frames.iter().any(|f| f.ty == RST_STREAM && f.stream == 1),
        "the open stream is ended, not reset"
    );
    wait_until("the termination to be counted", || {
        g.streams_terminated(Reason::max_age) == 1
    })
    .await;
}
