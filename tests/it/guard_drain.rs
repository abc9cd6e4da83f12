//! The drain through the stream guard, end to end with tonic on both sides:
//! GOAWAY keeps short requests landing, then every long stream ends with a
//! clean, retryable UNAVAILABLE, spread over the window, and new streams are
//! refused retryably.

use crate::support::guard as guard_support;

use std::time::Duration;

use drainshim::drain::StreamGuard;
use drainshim::guard::{end_message, REFUSED_MESSAGE};
use drainshim::metrics::Reason;
use guard_support::*;
use tonic::Code;

const N: usize = 20;

/// Every stream of `subs` ended by the guard's drain (`ended`: the failure
/// if one was not), gracefully and without a gap.
async fn all_ended_by_the_drain(subs: &mut [Sub], ended: &str) {
    for s in subs {
        let (result, _) = s.finish().await;
        let status = result.expect_err(ended);
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), end_message(Reason::drain), "{status:?}");
        s.assert_no_gaps();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_all_ends_every_stream_gracefully_and_refuses_new_ones() {
    let (_backend, g) = guarded(|_| {}).await;
    let client = connect_client(g.addr).await;

    let mut subs: Vec<Sub> = (0..N)
        .map(|i| subscribe(&client, &format!("s{i}"), 10, 64))
        .collect();
    wait_until("every stream to flow", || {
        subs.iter().all(|s| s.received() >= 3)
    })
    .await;
    assert_eq!(g.guard.active_streams(), N as u64);

    // GOAWAY: long streams keep flowing and short requests still land, on
    // new connections too.
    g.guard.goaway_all();
    let mut fresh = connect_client(g.addr).await;
    let answer = within("echo", echo(&mut fresh, "still here")).await;
    assert_eq!(answer.expect("echo after GOAWAY"), "still here");
    let before: Vec<usize> = subs.iter().map(Sub::received).collect();
    wait_until("streams to keep flowing after GOAWAY", || {
        subs.iter().zip(&before).all(|(s, b)| s.received() > *b)
    })
    .await;
    assert_eq!(
        g.goaways(Reason::drain),
        1,
        "one GOAWAY sequence: the connection open at the time"
    );

    g.guard.terminate_all(Duration::from_millis(500));
    all_ended_by_the_drain(&mut subs, "the guard ends the stream").await;
    // The guard counts a termination right after the trailers are handed
    // to h2, so the client may see the end first.
    wait_until("every termination to be counted", || {
        g.guard.terminated_by_drain() == N as u64
    })
    .await;
    assert_eq!(g.streams_terminated(Reason::drain), N as u64);
    wait_until("no stream left", || g.guard.active_streams() == 0).await;

    // New streams are refused retryably with the guard's message. Each call
    // gets a new connection: a tonic channel whose connection received
    // GOAWAY may fail its next call locally, before anything reaches the guard.
    let (result, _) = subscribe(&connect_client(g.addr).await, "late", 10, 0)
        .finish()
        .await;
    let status = result.expect_err("refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), REFUSED_MESSAGE);
    let mut c = connect_client(g.addr).await;
    let status = within("echo refusal", echo(&mut c, "late"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), REFUSED_MESSAGE);
    assert_eq!(
        g.guard.terminated_by_drain(),
        N as u64,
        "refusals are not terminations"
    );
}

/// Big messages at full speed span many DATA frames and flow-control
/// windows; the ending must still fall between two messages, or tonic would
/// fail the stream with a decode error instead of the guard's status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_messages_at_full_speed_end_on_a_message_boundary() {
    let (_backend, g) = guarded(|_| {}).await;
    let client = connect_client(g.addr).await;
    let mut subs: Vec<Sub> = (0..3)
        .map(|i| subscribe(&client, &format!("big{i}"), 0, 300_000))
        .collect();
    wait_until("big messages to flow", || {
        subs.iter().all(|s| s.received() >= 5)
    })
    .await;
    g.guard.terminate_all(Duration::ZERO);
    all_ended_by_the_drain(&mut subs, "ended by the guard").await;
    wait_until("every termination to be counted", || {
        g.guard.terminated_by_drain() == 3
    })
    .await;
}

/// Cancelling `serve`'s shutdown token ends open streams gracefully, and
/// `serve` returns once the connections are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_streams_gracefully_and_serve_returns() {
    let (_backend, mut g) = guarded(|_| {}).await;
    let client = connect_client(g.addr).await;
    let mut sub = subscribe(&client, "s", 10, 0);
    wait_until("the stream to flow", || sub.received() > 0).await;
    g.shutdown.cancel();
    let (result, _) = sub.finish().await;
    let status = result.expect_err("ended by the guard");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    sub.assert_no_gaps();
    within("serve to return", &mut g.task)
        .await
        .expect("serve task");
    assert_eq!(g.guard.active_connections(), 0);
    assert!(
        tokio::net::TcpStream::connect(g.addr).await.is_err(),
        "no longer listening"
    );
}
