//! The clock jumping (fault matrix, issue 8 item 1), on tokio's paused
//! clock: the real drain driver against a real, unreachable admin address
//! (a loopback port nobody listens on), with nothing faked. The dialer only
//! counts connection attempts, so a busy loop would show as a burst.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim::config::Timers;
use drainshim::drain::{self, DrainSettings, Outcome, Phase, Trigger};
use drainshim::envoy::{AdminClient, Dial, TcpDial};
use drainshim::metrics::Metrics;
use tokio::net::TcpStream;

/// Plain TCP, counted.
#[derive(Default)]
struct CountingDial {
    attempts: AtomicUsize,
}

impl Dial for CountingDial {
    fn dial(
        &self,
        authority: &str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<TcpStream>> + Send + 'static>> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        TcpDial.dial(authority)
    }
}

/// A loopback address that refuses connections.
fn refused() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::support::free_port()))
}

fn start(
    timers: Timers,
) -> (
    drain::DrainHandle,
    tokio::task::JoinHandle<()>,
    Arc<CountingDial>,
) {
    let dial = Arc::new(CountingDial::default());
    let admin = AdminClient::with_dial(
        &format!("http://{}", refused()),
        Duration::from_secs(2),
        dial.clone(),
    )
    .expect("admin URL");
    let (handle, task) = drain::spawn(
        DrainSettings {
            timers,
            admin,
            guard: None,
        },
        Metrics::new(),
    );
    (handle, task, dial)
}

/// Yields to the runtime until `cond` holds; no sleeping, so the paused
/// clock only moves when every task waits on a timer.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened: {what}");
}

/// The clock jumps an hour forward in the middle of a drain: the drain ends
/// at once with its deadline outcome, and the Envoy poller makes one round
/// for the jump, not 3,600 catch-up rounds.
#[tokio::test(start_paused = true)]
async fn a_clock_jump_past_the_deadline_ends_the_drain_without_a_burst() {
    let timers = Timers::default(); // 1 s polls, 90 s deadline
    let (handle, task, dial) = start(timers);
    let status = handle.trigger(Trigger::Api).await;
    assert_eq!(status.phase, Phase::Deregistering);
    until("the first admin attempt", || {
        dial.attempts.load(Ordering::SeqCst) >= 1
    })
    .await;
    until("the first failure is seen", || {
        handle.status().envoy.error.is_some()
    })
    .await;
    assert!(handle.status().report.is_none());
    let before = dial.attempts.load(Ordering::SeqCst);

    tokio::time::advance(Duration::from_secs(3600)).await;
    let report = handle
        .report()
        .await
        .expect("the driver publishes a report");
    let after = dial.attempts.load(Ordering::SeqCst);
    assert_eq!(report.outcome, Outcome::EnvoyUnreachable, "{report:?}");
    assert!(
        report.duration_seconds >= timers.parent_shutdown_time.as_secs_f64(),
        "{report:?}"
    );
    assert!(
        after - before <= 2,
        "the jump made {} admin attempts: a burst",
        after - before
    );
    task.await.expect("the driver ends after its report");
}

/// Left to run on the paused clock (it advances whenever every task waits),
/// a drain against an unreachable admin ends exactly at its deadline, and
/// the poller tried once per poll interval: no busy loop, and no giving up
/// (an Envoy that came back would still be drained).
#[tokio::test(start_paused = true)]
async fn an_unreachable_admin_is_polled_once_per_interval_until_the_deadline() {
    let timers = Timers::default();
    let (handle, task, dial) = start(timers);
    let t0 = tokio::time::Instant::now();
    handle.trigger(Trigger::Prestop).await;
    let report = handle.report().await.expect("report");
    let elapsed = t0.elapsed();
    assert_eq!(report.outcome, Outcome::EnvoyUnreachable, "{report:?}");
    // Virtual time: the deadline is honoured to the poll, neither early nor late.
    assert!(elapsed >= timers.parent_shutdown_time, "{elapsed:?}");
    assert!(
        elapsed <= timers.parent_shutdown_time + timers.poll_interval,
        "{elapsed:?}"
    );
    let rounds = timers.parent_shutdown_time.as_secs() / timers.poll_interval.as_secs();
    let attempts = dial.attempts.load(Ordering::SeqCst) as u64;
    assert!(
        attempts >= rounds / 2 && attempts <= rounds + 2,
        "{attempts} admin attempts in {rounds} poll intervals"
    );
    assert!(report.envoy.error.is_some(), "{report:?}");
    task.await.expect("the driver ends");
}
