//! Unary load through Envoy: back-to-back gRPC Echo calls by a few workers,
//! each on a channel of its own, every call's start, end and outcome kept;
//! and what those calls saw across a fault (the `FAULT` lines of the fault
//! table in docs/benchmarks.md).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::EchoRequest;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::WAIT;

/// Workers of back-to-back unary calls, each on its own channel: modest,
/// so a loaded 2-core machine carries them beside Envoy and the test.
pub const WORKERS: usize = 4;
/// Each call's deadline: no answer by then is a hung call. Far above what
/// any call takes (1 or 20 ms in the app): a slow answer on a loaded
/// machine is not judged (tests assert no speed), a call that never ends is.
/// (At 2 s, a call sent into Envoy's own drain on a loaded 2-core machine
/// was once counted hung, in a test where the shim was not in its path.)
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Most calls one worker makes (bounds its loop in count).
pub const MAX_CALLS: u64 = 200_000;
/// Calls that must end between two steps of a fault test (before the
/// fault, after it): a count, so the calls are seen flowing.
pub const CALLS_PER_STEP: u64 = 200;
/// The same in a drain that must still be running at the fault.
pub const CALLS_IN_A_DRAIN: u64 = 40;
/// How long worker 0's calls take in the app in a fault test (the others'
/// 1 ms): a call is in flight more often than not when the fault comes.
pub const SLOW_MS: u32 = 20;

/// How one unary call ended.
pub enum Outcome {
    Ok,
    Failed(String),
    /// Failed by the client's own connection handling as the server shut
    /// the connection down gracefully (Envoy's drain sends GOAWAY, then
    /// closes each HTTP/2 connection), with no answer from the server:
    /// hyper had queued the call on the closed connection (canceled), or
    /// was handing it to h2 as the GOAWAY(NO_ERROR) landed and failed it
    /// then (hyper's ClientTask looks at the connection once more after
    /// `send_request`). tonic does not send either again; a client that
    /// retries what was never answered for this reason (gRPC's transparent
    /// retry, hyper-util's `retry_canceled_requests`) would. A failure all
    /// the same.
    Unsent(String),
    Hung(String),
}

/// One unary call: when it was sent, when it ended, and how.
pub struct Call {
    pub start: Instant,
    pub end: Instant,
    pub outcome: Outcome,
}

/// Back-to-back unary calls through Envoy.
pub struct Unary {
    stop: CancellationToken,
    done: Arc<AtomicU64>,
    workers: Vec<tokio::task::JoinHandle<Vec<Call>>>,
}

impl Unary {
    /// [`WORKERS`] workers; worker 0's calls take `slow_ms` in the app,
    /// the others' 1 ms.
    pub fn start(addr: SocketAddr, slow_ms: u32) -> Self {
        Self::with_workers(addr, WORKERS, slow_ms)
    }

    /// [`Unary::start`] with `workers` workers.
    pub fn with_workers(addr: SocketAddr, workers: usize, slow_ms: u32) -> Self {
        let stop = CancellationToken::new();
        let done = Arc::new(AtomicU64::new(0));
        let workers = (0..workers)
            .map(|w| {
                let (stop, done) = (stop.clone(), done.clone());
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    let endpoint =
                        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                            .expect("endpoint");
                    let mut client = StreamClient::new(endpoint.connect_lazy());
                    for i in 0..MAX_CALLS {
                        if stop.is_cancelled() {
                            break;
                        }
                        let mut req = tonic::Request::new(EchoRequest {
                            body: format!("w{w}-{i}"),
                            // One worker's calls take a while: one is
                            // always in flight when a GOAWAY goes out.
                            delay_ms: if w == 0 { slow_ms } else { 1 },
                        });
                        req.set_timeout(DEADLINE);
                        let start = Instant::now();
                        let outcome = match tokio::time::timeout(DEADLINE, client.echo(req)).await {
                            Ok(Ok(_)) => Outcome::Ok,
                            // The deadline passed: the server's DEADLINE_EXCEEDED,
                            // or tonic's own timer (CANCELLED "Timeout expired").
                            Ok(Err(s))
                                if s.code() == tonic::Code::DeadlineExceeded
                                    || (s.code() == tonic::Code::Cancelled
                                        && s.message().contains("Timeout expired")) =>
                            {
                                Outcome::Hung(format!("{:?} {:?}", s.code(), s.message()))
                            }
                            Ok(Err(s)) => {
                                let e =
                                    format!("{:?} {:?} ({})", s.code(), s.message(), causes(&s));
                                if never_sent(&s) {
                                    Outcome::Unsent(e)
                                } else {
                                    Outcome::Failed(e)
                                }
                            }
                            Err(_) => Outcome::Hung("no answer by the deadline".into()),
                        };
                        calls.push(Call {
                            start,
                            end: Instant::now(),
                            outcome,
                        });
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    calls
                })
            })
            .collect();
        Self {
            stop,
            done,
            workers,
        }
    }

    /// How many workers call.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Calls ended so far, whatever their outcome.
    pub fn made(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits (bounded) until `n` more calls ended, whatever their outcome.
    pub async fn wait_more(&self, n: u64, what: &str) {
        let want = self.made() + n;
        let deadline = Instant::now() + WAIT;
        while self.made() < want {
            assert!(
                Instant::now() < deadline,
                "unary calls stalled ({} of {want}): {what}",
                self.made()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the workers and returns every call, in order of start.
    pub async fn finish(self) -> Vec<Call> {
        self.stop.cancel();
        let mut all = Vec::new();
        for w in self.workers {
            all.extend(w.await.expect("unary worker"));
        }
        all.sort_by_key(|c| c.start);
        all
    }
}

/// An error's chain of causes, outermost first: "transport error: ...".
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut all = Vec::new();
    let mut cause = e.source();
    while let Some(c) = cause {
        all.push(c.to_string());
        cause = c.source();
    }
    all.join(": ")
}

/// Whether the client failed the call itself as its connection was shut
/// down gracefully (see [`Outcome::Unsent`]): hyper canceled it before
/// writing it, or it failed with the server's GOAWAY(NO_ERROR).
fn never_sent(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = e.source();
    while let Some(c) = cause {
        if c.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        if c.downcast_ref::<h2::Error>().is_some_and(|h| {
            h.is_go_away() && h.is_remote() && h.reason() == Some(h2::Reason::NO_ERROR)
        }) {
            return true;
        }
        cause = c.source();
    }
    false
}

/// `t` from `since`, signed, in seconds: "+1.25 s".
pub fn at(t: Instant, since: Instant) -> String {
    let (a, b) = (t.max(since), t.min(since));
    let sign = if t >= since { "+" } else { "-" };
    format!("{sign}{:.2} s", (a - b).as_secs_f64())
}

/// Failed and hung calls, each with when it was sent (from `t0`).
pub fn outcomes(calls: &[Call], t0: Instant, what: &str) -> (Vec<String>, Vec<String>) {
    outcomes_of(&calls.iter().collect::<Vec<_>>(), t0, what)
}

/// [`outcomes`] of some of the calls.
pub fn outcomes_of(calls: &[&Call], t0: Instant, what: &str) -> (Vec<String>, Vec<String>) {
    let mut failed = Vec::new();
    let mut hung = Vec::new();
    for c in calls {
        let when = format!("sent {} from {what}", at(c.start, t0));
        match &c.outcome {
            Outcome::Ok => {}
            Outcome::Failed(e) | Outcome::Unsent(e) => failed.push(format!("{when}: {e}")),
            Outcome::Hung(e) => hung.push(format!("{when}: {e}")),
        }
    }
    (failed, hung)
}

/// No call failed or hung: the first 30 of them printed, 10 of each in the
/// failure with `logs`.
pub fn assert_no_failed_or_hung(calls: usize, (failed, hung): (&[String], &[String]), logs: &str) {
    for f in failed.iter().chain(hung.iter()).take(30) {
        eprintln!("  {f}");
    }
    assert!(
        failed.is_empty() && hung.is_empty(),
        "{} failed, {} hung of {calls} calls: {:?}\n{:?}\n{logs}",
        failed.len(),
        hung.len(),
        failed.iter().take(10).collect::<Vec<_>>(),
        hung.iter().take(10).collect::<Vec<_>>(),
    );
}

/// How some calls ended: answered, failed, failed unsent, hung; the
/// failures and hangs described (with when they were sent).
#[derive(Default)]
pub struct Tally {
    pub ok: usize,
    pub failed: Vec<String>,
    pub unsent: Vec<String>,
    pub hung: Vec<String>,
}

impl Tally {
    fn of(calls: &[&Call], t0: Instant, what: &str) -> Self {
        let mut t = Tally::default();
        for c in calls {
            let when = format!("sent {} from {what}", at(c.start, t0));
            match &c.outcome {
                Outcome::Ok => t.ok += 1,
                Outcome::Failed(e) => t.failed.push(format!("{when}: {e}")),
                Outcome::Unsent(e) => t.unsent.push(format!("{when}: {e}")),
                Outcome::Hung(e) => t.hung.push(format!("{when}: {e}")),
            }
        }
        t
    }

    pub fn calls(&self) -> usize {
        self.ok + self.failed.len() + self.unsent.len() + self.hung.len()
    }

    /// "1 failed, 2 unsent, 0 hung of 300".
    pub fn line(&self) -> String {
        format!(
            "{} failed, {} unsent, {} hung of {}",
            self.failed.len(),
            self.unsent.len(),
            self.hung.len(),
            self.calls()
        )
    }
}

/// What the calls saw across a fault made at `fault` (the instant just
/// before the test made it): a call that ended before it is "before",
/// every other one "after".
pub struct Seen {
    /// The workers that called.
    pub workers: usize,
    pub before: Tally,
    pub after: Tally,
    /// From the fault to the end of the first call after it that did not
    /// succeed.
    pub first_failure: Option<Duration>,
}

impl Seen {
    pub fn of(calls: &[Call], workers: usize, fault: Instant) -> Self {
        let (before, after): (Vec<&Call>, Vec<&Call>) = calls.iter().partition(|c| c.end < fault);
        let first_failure = after
            .iter()
            .filter(|c| !matches!(c.outcome, Outcome::Ok))
            .map(|c| c.end.saturating_duration_since(fault))
            .min();
        Self {
            workers,
            before: Tally::of(&before, fault, "the fault"),
            after: Tally::of(&after, fault, "the fault"),
            first_failure,
        }
    }

    pub fn calls(&self) -> usize {
        self.before.calls() + self.after.calls()
    }

    /// No call failed, unsent or otherwise, or hung, before the fault or
    /// after it.
    pub fn assert_none_failed(&self, logs: &str) {
        let all = |f: fn(&Tally) -> &Vec<String>| {
            f(&self.before)
                .iter()
                .chain(f(&self.after))
                .cloned()
                .collect::<Vec<_>>()
        };
        let mut failed = all(|t| &t.failed);
        failed.extend(all(|t| &t.unsent));
        assert_no_failed_or_hung(self.calls(), (&failed, &all(|t| &t.hung)), logs);
    }

    /// No call that ended before the fault failed or hung, but for calls
    /// that never left the client (see [`Outcome::Unsent`]): counted, not
    /// failed here, since the drain that closes their connections is not
    /// the fault.
    pub fn assert_none_failed_before(&self, logs: &str) {
        assert_no_failed_or_hung(
            self.before.calls(),
            (&self.before.failed, &self.before.hung),
            &format!("before the fault\n{logs}"),
        );
    }

    /// One line of the fault table: the load held, what the calls saw
    /// before the fault and after it, the streams `cut`, how long until
    /// back to normal (`recover`, as measured: printed, never asserted),
    /// and `more` of the test's own figures.
    pub fn table_line(&self, fault: &str, cut: &str, recover: &str, more: &str) {
        let first = self
            .first_failure
            .map(|d| format!(", the first {:.2} s after it", d.as_secs_f64()))
            .unwrap_or_default();
        eprintln!(
            "FAULT | {fault} | load: {} calls by {} workers | before the fault: {} | after: {}{first} | \
             streams cut: {cut} | back to normal: {recover} | {more}",
            self.calls(),
            self.workers,
            self.before.line(),
            self.after.line(),
        );
        let (b, a) = (&self.before, &self.after);
        for e in [&b.failed, &b.unsent, &b.hung, &a.failed, &a.unsent, &a.hung]
            .into_iter()
            .flat_map(|v| v.iter().take(2))
        {
            eprintln!("  {e}");
        }
    }
}
