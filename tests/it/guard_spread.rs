//! `terminate_all` spreads the endings evenly over its window, so the
//! reconnects do not arrive as a storm.

use crate::support::guard as guard_support;

use std::time::Duration;

use drainshim::drain::StreamGuard;
use drainshim::guard::end_message;
use drainshim::metrics::Reason;
use guard_support::*;
use tokio::time::Instant;
use tonic::Code;

/// 100 streams ticking every 50 ms: 2,000 messages/s, which a debug build of
/// the guard, the backend and the clients carries on 2 loaded cores (200
/// streams at 20 ms saturated them, and the endings then came late).
const STREAMS: usize = 100;
const CONNECTIONS: usize = 4;
const BUCKET: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endings_are_spread_evenly_over_the_window() {
    let window = Duration::from_secs(2);
    let (_backend, g) = guarded(|_| {}).await;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(connect_client(g.addr).await);
    }
    let mut subs: Vec<Sub> = (0..STREAMS)
        // Ticks inside one 100 ms bucket: the guard ends a stream right
        // after its next write, so slower tickers started in step would end
        // in step too, whatever the schedule.
        .map(|i| subscribe(&clients[i % CONNECTIONS], &format!("s{i}"), 50, 0))
        .collect();
    // Two messages each: every stream is long-lived (a drain schedules
    // those from its start; others join the schedule later).
    wait_until("every stream to flow", || {
        subs.iter().all(|s| s.received() >= 2)
    })
    .await;

    let stalls = StallWatch::start();
    let start = Instant::now();
    g.guard.terminate_all(window);
    let mut ends = Vec::new();
    for s in &mut subs {
        let (result, at) = s.finish().await;
        let status = result.expect_err("ended by the guard");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), end_message(Reason::drain));
        s.assert_no_gaps();
        ends.push(at - start);
    }
    wait_until("every termination to be counted", || {
        g.guard.terminated_by_drain() == STREAMS as u64
    })
    .await;

    let buckets_in_window = (window.as_millis() / BUCKET.as_millis()) as usize;
    let mut buckets = vec![0usize; buckets_in_window];
    for e in &ends {
        let i = (e.as_millis() / BUCKET.as_millis()) as usize;
        if i >= buckets.len() {
            buckets.resize(i + 1, 0);
        }
        buckets[i] += 1;
    }
    let stall = stalls.longest();
    eprintln!("endings per 100 ms: {buckets:?}; longest stall of this process {stall:?}");
    let mean = STREAMS as f64 / buckets_in_window as f64;
    let peak = buckets.iter().copied().max().unwrap_or(0) as f64;
    if stall < STALL {
        // Each ending lands right after the stream's next write (and a PING
        // round trip to the app), so endings are quantised to the 50 ms
        // ticks and start a little late. Ending all at once would be 20
        // (every stream in one bucket).
        assert!(
            peak / mean <= 3.0,
            "endings per 100 ms: {buckets:?}; peak/mean {:.2}",
            peak / mean
        );
    } else {
        // The runtime could not run what was due for longer than a bucket
        // (the machine busy elsewhere): whatever was due meanwhile lands
        // together when it runs again, in any proxy. A storm still shows: every
        // ending within a moment, instead of across the window.
        let first = ends.iter().min().copied().unwrap_or_default();
        let last = ends.iter().max().copied().unwrap_or_default();
        assert!(
            last - first >= window / 2 && peak < STREAMS as f64 * 0.6,
            "endings per 100 ms: {buckets:?} (stalled {stall:?}): first {first:?}, last {last:?}"
        );
    }
}

/// A stall this long means the runtime did not run for longer than one
/// bucket: the timing of that window says nothing about the guard.
const STALL: Duration = Duration::from_millis(150);

/// Measures how late a 10 ms timer fires in this test's runtime, which the
/// guard shares: the longest time the runtime could not run what was due
/// (the machine busy elsewhere, or the runtime saturated).
struct StallWatch {
    stop: tokio_util::sync::CancellationToken,
    worst: std::sync::Arc<std::sync::Mutex<Duration>>,
}

impl StallWatch {
    fn start() -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let worst = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
        let (s, w) = (stop.clone(), worst.clone());
        tokio::spawn(async move {
            let tick = Duration::from_millis(10);
            // Bounded: 20 s of ticks at most, far past any window here.
            for _ in 0..2_000 {
                let before = Instant::now();
                tokio::select! {
                    _ = s.cancelled() => return,
                    _ = tokio::time::sleep(tick) => {}
                }
                let late = before.elapsed().saturating_sub(tick);
                if let Ok(mut worst) = w.lock() {
                    *worst = (*worst).max(late);
                }
            }
        });
        Self { stop, worst }
    }

    fn longest(&self) -> Duration {
        self.stop.cancel();
        self.worst.lock().map(|w| *w).unwrap_or_default()
    }
}
