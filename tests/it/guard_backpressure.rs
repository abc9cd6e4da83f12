//! Flow control end to end: a client that stops reading stops the
//! application (bounded buffers in between), and nothing is lost when it
//! reads again. Idle connections are closed.

use crate::support::guard as guard_support;

use std::time::Duration;

use drainshim::guard::Limits;
use drainshim_bench::proto::bench::SubscribeRequest;
use guard_support::*;

const PAYLOAD: u32 = 64 * 1024;
/// What may sit between a stalled client and the application, in messages:
/// the client's stream window (hyper's default, 2 MiB), the guard's windows
/// (256 KiB) and send buffer (16 KiB) by default, the application's h2 send
/// buffer and its 4-message channel. Far below what an unbounded pipe would
/// accumulate at full speed in the time observed.
const BOUND: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_stalls_the_application_without_loss() {
    let (backend, g) = guarded(|_| {}).await;
    let mut stream = stalled_stream(&g, "stalled").await;

    // The client reads nothing now. The application fills the windows and
    // buffers in between and then waits; watch it for a while.
    let ledger = backend.service.ledger.clone();
    wait_until("the application to produce", || {
        ledger.last_written("stalled").is_some_and(|n| n > 1)
    })
    .await;
    let mut highest = 0;
    for _ in 0..100 {
        highest = ledger.last_written("stalled").unwrap_or(0);
        assert!(
            highest <= BOUND,
            "{highest} messages produced for a stalled client"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    eprintln!("messages produced for a stalled client: {highest}");
    // Reading again: everything arrives, in order, and production resumes.
    let mut expected = 2;
    while expected <= highest + 10 {
        let tick = within("message", stream.message())
            .await
            .expect("message")
            .expect("not ended");
        assert_eq!(tick.seq, expected, "no message lost or reordered");
        assert_eq!(tick.payload.len(), PAYLOAD as usize);
        expected += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed() {
    let (_backend, g) = guarded(|config| {
        config.limits = Limits {
            idle_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
    })
    .await;
    let mut c = connect_client(g.addr).await;
    let answer = within("echo", echo(&mut c, "once")).await;
    assert_eq!(answer.expect("echo"), "once");
    assert_eq!(g.guard.active_connections(), 1);
    wait_until("the idle connection to close", || {
        g.guard.active_connections() == 0
    })
    .await;
    // An open stream is not idle.
    let mut c = connect_client(g.addr).await;
    let sub = subscribe(&c, "busy", 100, 0);
    wait_until("the stream to flow", || sub.received() >= 6).await;
    assert_eq!(g.guard.active_connections(), 1);
    let answer = within("echo", echo(&mut c, "twice")).await;
    assert_eq!(answer.expect("echo"), "twice");
    sub.assert_no_gaps();
}

async fn stalled_stream(
    g: &RunningGuard,
    id: &str,
) -> tonic::Streaming<drainshim_bench::proto::bench::Tick> {
    let mut client = connect_client(g.addr).await;
    let req = SubscribeRequest {
        stream_id: id.to_string(),
        count: 0,
        interval_ms: 0,
        payload_bytes: PAYLOAD,
        ..Default::default()
    };
    let mut stream = within("subscribe", client.subscribe(req))
        .await
        .expect("subscribe")
        .into_inner();
    let first = within("first message", stream.message())
        .await
        .expect("message")
        .expect("not ended");
    assert_eq!(first.seq, 1);
    stream
}

/// Reads the rest of a stream: the sequence numbers must continue from 2
/// without gaps. Returns the final status and the last sequence number.
async fn read_to_end(
    stream: &mut tonic::Streaming<drainshim_bench::proto::bench::Tick>,
) -> (tonic::Status, u64) {
    let mut last = 1;
    loop {
        match within("message", stream.message()).await {
            Ok(Some(t)) => {
                assert_eq!(t.seq, last + 1, "no message lost or reordered");
                last = t.seq;
            }
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => return (status, last),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_stalled_stream_waits_for_the_client_to_read() {
    let (backend, g) = guarded(|_| {}).await;
    let mut stream = stalled_stream(&g, "stalled").await;
    let ledger = backend.service.ledger.clone();
    wait_until("the application to fill the windows", || {
        ledger.last_written("stalled").is_some_and(|n| n > 20)
    })
    .await;
    drainshim::drain::StreamGuard::terminate_all(&g.guard, Duration::ZERO);
    // The guard holds the ending until the client has room for what the
    // application already produced; reading now gets all of it, then the status.
    let (status, last) = read_to_end(&mut stream).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        status.message(),
        drainshim::guard::end_message(drainshim::metrics::Reason::drain)
    );
    eprintln!(
        "received {last}; the application had written {:?}",
        ledger.last_written("stalled")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_reset_after_the_end_timeout() {
    let (backend, g) = guarded(|config| {
        config.limits = Limits {
            end_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
    })
    .await;
    let mut stream = stalled_stream(&g, "stuck").await;
    let ledger = backend.service.ledger.clone();
    // Every window and buffer is full once the application stops producing.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let before = ledger.last_written("stuck");
        tokio::time::sleep(Duration::from_millis(300)).await;
        if before.is_some() && ledger.last_written("stuck") == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the application never stalled"
        );
    }
    drainshim::drain::StreamGuard::terminate_all(&g.guard, Duration::ZERO);
    // Bounded: the stream cannot reach a safe end point (its window stays
    // shut), so it is reset after `end_timeout` instead of waiting forever.
    wait_until("the stuck stream to be reset", || {
        drainshim::drain::StreamGuard::active_streams(&g.guard) == 0
    })
    .await;
    assert_eq!(
        drainshim::drain::StreamGuard::terminated_by_drain(&g.guard),
        0
    );
    let (status, _) = read_to_end(&mut stream).await;
    // REFUSED_STREAM: the client reads a retryable UNAVAILABLE, not a
    // CANCELLED that would stop its subscription loop.
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}
