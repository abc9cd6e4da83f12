//! The drain through the stream guard, end to end with tonic on both sides:
//! GOAWAY keeps short requests landing, then every long stream ends with a
//! clean, retryable UNAVAILABLE, spread over the window, and new streams are
//! refused retryably.

#[path = "support/guard.rs"]
mod guard_support;

use std::time::Duration;

use drainshim::drain::StreamGuard;
use drainshim::guard::{end_message, GuardConfig, REFUSED_MESSAGE};
use drainshim::metrics::Reason;
use guard_support::*;
use tonic::Code;

const N: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_all_ends_every_stream_gracefully_and_refuses_new_ones() {
    let backend = start_backend().await;
    let g = start_guard(GuardConfig::new(backend.addr)).await;
    let client = connect_client(g.addr).await;

    let mut subs: Vec<Sub> = (0..N)
        .map(|i| subscribe(&client, &format!("s{i}"), 10, 64))
        .collect();
    wait_until("every stream to flow", || subs.iter().all(|s| s.received() >= 3)).await;
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
    assert_eq!(g.goaways(Reason::drain), 1, "one GOAWAY sequence: the connection open at the time");

    g.guard.terminate_all(Duration::from_millis(500));
    for s in &mut subs {
        let (result, _) = s.finish().await;
        let status = result.expect_err("the guard ends the stream");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), end_message(Reason::drain), "{status:?}");
        s.assert_no_gaps();
    }
    assert_eq!(g.guard.terminated_by_drain(), N as u64);
    assert_eq!(g.streams_terminated(Reason::drain), N as u64);
    wait_until("no stream left", || g.guard.active_streams() == 0).await;

    // New streams, on a new connection and on the old channel, are refused
    // retryably with the guard's message.
    for mut c in [client.clone(), connect_client(g.addr).await] {
        let (result, _) = subscribe(&c, "late", 10, 0).finish().await;
        let status = result.expect_err("refused");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), REFUSED_MESSAGE);
        let status = within("echo refusal", echo(&mut c, "late")).await.expect_err("refused");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }
    assert_eq!(g.guard.terminated_by_drain(), N as u64, "refusals are not terminations");
}
