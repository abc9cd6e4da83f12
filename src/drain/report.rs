//! The drain report and status documents (docs/design.md), and the accounting
//! that turns Envoy's live counters into exact outcomes.

use serde::{Deserialize, Serialize};

use super::machine::{Outcome, Phase, Trigger};
use crate::envoy::{Counts, FailOpen};
use crate::metrics::{DrainCounts, DrainOutcome};

/// The drain report: what a preStop caller receives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `done`.
    pub phase: Phase,
    pub outcome: Outcome,
    /// What started it.
    pub trigger: Trigger,
    /// From the trigger to the report.
    pub duration_seconds: f64,
    /// Inbound connections by how they ended.
    pub connections: Connections,
    /// Inbound streams by how they ended.
    pub streams: Streams,
    /// Envoy's own side: stopped listeners, health check, errors.
    pub envoy: EnvoyReport,
}

// === impl Report ===

impl Report {
    /// What the metrics count of this drain.
    pub fn counts(&self) -> DrainCounts {
        DrainCounts {
            outcome: Some(match self.outcome {
                Outcome::Quiesced => DrainOutcome::quiesced,
                Outcome::Deadline => DrainOutcome::deadline,
                Outcome::EnvoyUnreachable => DrainOutcome::envoy_unreachable,
            }),
            connections_closed: self.connections.closed,
            connections_idle_at_exit: self.connections.idle_at_exit,
            connections_cut: self.connections.cut,
            streams_completed: self.streams.completed,
            streams_terminated: self.streams.terminated,
            streams_failed: self.streams.failed,
            streams_cut: self.streams.cut,
            streams_bypassed: self.streams.bypassed,
            duration_seconds: self.duration_seconds,
        }
    }
}

/// Inbound connections seen by the drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connections {
    /// Open when the drain started.
    pub at_start: u64,
    /// Closed during the drain (including ones opened meanwhile).
    pub closed: u64,
    /// Still open at the end, carrying no stream: closing them loses nothing.
    pub idle_at_exit: u64,
    /// Still open at the deadline with streams on them. Envoy's counters do
    /// not say which connection carries which stream, so this is the upper
    /// bound min(open connections, open streams): never an undercount.
    pub cut: u64,
}

/// Inbound streams (HTTP requests, gRPC calls) seen by the drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Streams {
    pub at_start: u64,
    /// Finished on their own.
    pub completed: u64,
    /// Ended gracefully by the guard (grpc-status 14 trailers).
    pub terminated: u64,
    /// Ended by the guard during the drain without its graceful end: the
    /// connection to the application was lost (the client got UNAVAILABLE,
    /// or a reset mid-message), or no message boundary came in time
    /// (RST_STREAM(REFUSED_STREAM)). Retryable for gRPC, but not graceful:
    /// like `cut`, it should be 0. Envoy's counters see these end, so
    /// without the guard's count they would look completed.
    #[serde(default)]
    pub failed: u64,
    /// Still active at the deadline. The mission is `cut == 0`.
    pub cut: u64,
    /// Still active at the deadline on the fail-open path (the app reached
    /// directly while the guard was down): the guard never saw them, so
    /// nothing could end them gracefully, and the restart cuts them. Not
    /// in `cut`.
    #[serde(default)]
    pub bypassed: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvoyReport {
    /// Envoy's release, e.g. `1.40.0`; empty if it never answered.
    pub version: String,
    /// Whether the last poll reached the admin API.
    pub reachable: bool,
    /// The last admin error when the drain ended unreachable, so the report
    /// itself says what went wrong (refused, no answer, bad JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds from the trigger to the last poll that read Envoy's counters;
    /// absent when none did. The counts above are as of that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_seconds: Option<f64>,
    /// Envoy processes that replaced the one being drained during the drain
    /// (each one's streams were lost with it, and are counted as cut).
    #[serde(default)]
    pub restarts: u32,
}

/// Running totals across polls.
///
/// Envoy restarting under the drain (a new process on the same admin
/// address) is seen as counters going backwards, or is told by the caller
/// (`restarted`, from Envoy's uptime). The new counters are then taken as
/// opened since, and whatever the old process last had active is counted as
/// cut: a process that exits closes its connections without a goodbye.
#[derive(Clone, Copy, Debug, Default)]
pub struct Accounting {
    /// The baseline: the first poll of the drain.
    first: Option<Counts>,
    /// The latest poll.
    last: Option<Counts>,
    /// Connections opened since the baseline, summed across restarts.
    opened_cx: u64,
    /// Streams opened since the baseline, summed across restarts.
    opened_rq: u64,
    /// Streams active at the last poll before a restart: lost with the old process.
    lost_rq: u64,
    /// Connections carrying those streams (the same upper bound as `cut`).
    lost_cx: u64,
    /// Restarts seen.
    restarts: u32,
    /// The fail-open path at the latest poll that could read it.
    failopen: FailOpen,
}

// === impl Accounting ===

impl Accounting {
    /// Takes one poll. `restarted` says the caller knows Envoy is a new
    /// process since the last poll.
    pub fn observe(&mut self, c: Counts, restarted: bool) {
        match self.last {
            None => self.first = Some(c),
            Some(prev) => {
                let reset = restarted || c.cx_total < prev.cx_total || c.rq_total < prev.rq_total;
                if reset {
                    self.restarts += 1;
                    self.lost_rq += prev.rq_active;
                    self.lost_cx += prev.cx_active.min(prev.rq_active);
                    self.opened_cx += c.cx_total;
                    self.opened_rq += c.rq_total;
                } else {
                    self.opened_cx += c.cx_total - prev.cx_total;
                    self.opened_rq += c.rq_total - prev.rq_total;
                }
            }
        }
        self.last = Some(c);
    }

    /// Takes one poll of the fail-open path.
    pub fn observe_failopen(&mut self, f: FailOpen) {
        self.failopen = f;
    }

    /// Restarts seen so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    pub fn last(&self) -> Option<Counts> {
        self.last
    }

    /// The fail-open path at the latest poll that read it.
    pub fn failopen(&self) -> FailOpen {
        self.failopen
    }

    /// Outcomes at the end. On `quiesced` nothing still open is cut by
    /// definition; on a deadline (or unreachable at the end) every stream
    /// Envoy last saw active is cut, or `bypassed` when it was on the
    /// fail-open path. Streams lost in a restart are cut either way.
    /// `terminated` and `failed` are the guard's own counts of the streams
    /// it ended during the drain (see [`Streams`]).
    pub fn outcomes(
        &self,
        outcome: Outcome,
        terminated: u64,
        failed: u64,
    ) -> (Connections, Streams) {
        let first = self.first.unwrap_or_default();
        let last = self.last.unwrap_or_default();
        let rq_end = if outcome == Outcome::Quiesced {
            0
        } else {
            last.rq_active
        };
        let bypassed = self.failopen.requests.min(rq_end);
        let cx_cut = last.cx_active.min(rq_end);
        let connections = Connections {
            at_start: first.cx_active,
            closed: (first.cx_active + self.opened_cx)
                .saturating_sub(last.cx_active)
                .saturating_sub(self.lost_cx),
            idle_at_exit: last.cx_active - cx_cut,
            cut: cx_cut + self.lost_cx,
        };
        let streams = Streams {
            at_start: first.rq_active,
            completed: (first.rq_active + self.opened_rq)
                .saturating_sub(rq_end)
                .saturating_sub(terminated)
                .saturating_sub(failed)
                .saturating_sub(self.lost_rq),
            terminated,
            failed,
            cut: rq_end - bypassed + self.lost_rq,
            bypassed,
        };
        (connections, streams)
    }
}

/// `GET /status`, and the body of `POST /drain`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub phase: Phase,
    pub trigger: Option<Trigger>,
    /// Seconds since the trigger; 0 while serving.
    pub elapsed_seconds: f64,
    pub active: Active,
    pub envoy: EnvoyStatus,
    /// Present once the drain is done.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<Report>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Active {
    /// Envoy inbound connections, at the last poll.
    pub connections: u64,
    /// Envoy inbound streams, at the last poll.
    pub streams: u64,
    /// Streams open through the guard.
    pub guard_streams: u64,
    /// Envoy's streams on the fail-open path, at the last poll: no drain
    /// ends them; at the deadline they are `bypassed`.
    #[serde(default)]
    pub failopen_streams: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvoyStatus {
    pub version: String,
    pub reachable: bool,
    /// The last admin error, so an operator sees why it is unreachable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Seconds from the trigger to the last poll that read the counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_seconds: Option<f64>,
    /// Envoy restarts seen during this drain.
    #[serde(default)]
    pub restarts: u32,
}

// === impl Status ===

impl Status {
    pub fn serving() -> Self {
        Self {
            phase: Phase::Serving,
            trigger: None,
            elapsed_seconds: 0.0,
            active: Active::default(),
            envoy: EnvoyStatus::default(),
            report: None,
        }
    }

    /// One human line for progress output on stderr.
    pub fn progress_line(&self) -> String {
        let a = &self.active;
        let envoy = match (&self.envoy.error, self.envoy.reachable) {
            (_, true) => format!("envoy streams={} connections={}", a.streams, a.connections),
            (Some(e), false) => format!("envoy unreachable ({e})"),
            (None, false) => "envoy first poll pending".to_string(),
        };
        // Only when there are some: most pods never fail open.
        let failopen = match a.failopen_streams {
            0 => String::new(),
            n => format!(" failopen_streams={n}"),
        };
        format!(
            "drain {} t={:.1}s {envoy} guard_streams={}{failopen}",
            self.phase.as_str(),
            self.elapsed_seconds,
            a.guard_streams
        )
    }
}

/// Prints progress lines without flooding: a line goes out when something
/// other than the clock changed, or every `every` otherwise.
#[derive(Debug)]
pub struct Progress {
    every: std::time::Duration,
    last_key: String,
    last_at: Option<std::time::Instant>,
}

// === impl Progress ===

impl Progress {
    pub fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            last_key: String::new(),
            last_at: None,
        }
    }

    /// The line to print for `status`, if one is due.
    pub fn line(&mut self, status: &Status) -> Option<String> {
        let line = status.progress_line();
        // Everything but the elapsed time decides whether the news is new.
        let key = line
            .split_whitespace()
            .filter(|w| !w.starts_with("t="))
            .collect::<Vec<_>>()
            .join(" ");
        let due = self.last_at.is_none_or(|t| t.elapsed() >= self.every);
        if key != self.last_key || due || status.report.is_some() {
            self.last_key = key;
            self.last_at = Some(std::time::Instant::now());
            Some(line)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(cx_active: u64, cx_total: u64, rq_active: u64, rq_total: u64) -> Counts {
        Counts {
            cx_active,
            cx_total,
            rq_active,
            rq_total,
        }
    }

    #[test]
    fn deadline_cuts_what_is_left() {
        let mut a = Accounting::default();
        a.observe(counts(4, 10, 6, 50), false);
        a.observe(counts(5, 12, 5, 53), false); // 2 new connections, 3 new streams
        let (c, s) = a.outcomes(Outcome::Deadline, 1, 0);
        assert_eq!(
            c,
            Connections {
                at_start: 4,
                closed: 1,
                idle_at_exit: 0,
                cut: 5
            }
        );
        assert_eq!(
            s,
            Streams {
                at_start: 6,
                completed: 3,
                terminated: 1,
                failed: 0,
                cut: 5,
                bypassed: 0
            }
        );
    }

    #[test]
    fn streams_on_the_fail_open_path_at_the_deadline_are_bypassed_not_cut() {
        let mut a = Accounting::default();
        a.observe(counts(3, 3, 7, 7), false);
        a.observe_failopen(FailOpen {
            requests: 4,
            connections: 1,
            paths: 1,
        });
        a.observe(counts(3, 3, 6, 7), false);
        let (_, s) = a.outcomes(Outcome::Deadline, 0, 0);
        assert_eq!((s.completed, s.cut, s.bypassed), (1, 2, 4));
        // Never more bypassed than Envoy has open.
        a.observe_failopen(FailOpen {
            requests: 9,
            connections: 1,
            paths: 1,
        });
        let (_, s) = a.outcomes(Outcome::Deadline, 0, 0);
        assert_eq!((s.cut, s.bypassed), (0, 6));
        // A drain that quiesced left nothing behind.
        let (_, s) = a.outcomes(Outcome::Quiesced, 0, 0);
        assert_eq!((s.cut, s.bypassed), (0, 0));
    }

    #[test]
    fn quiesced_cuts_nothing_and_counts_idle_connections() {
        let mut a = Accounting::default();
        a.observe(counts(3, 3, 2, 2), false);
        a.observe(counts(1, 3, 0, 2), false);
        let (c, s) = a.outcomes(Outcome::Quiesced, 0, 0);
        assert_eq!((c.closed, c.idle_at_exit, c.cut), (2, 1, 0));
        assert_eq!((s.completed, s.cut), (2, 0));
    }

    #[test]
    fn streams_the_guard_failed_are_not_completed() {
        // 5 streams; the app's connection was lost under 2 of them, the
        // guard ended 3 gracefully: Envoy saw all 5 end.
        let mut a = Accounting::default();
        a.observe(counts(1, 1, 5, 5), false);
        a.observe(counts(0, 1, 0, 5), false);
        let (_, s) = a.outcomes(Outcome::Quiesced, 3, 2);
        assert_eq!((s.completed, s.terminated, s.failed, s.cut), (0, 3, 2, 0));
        let json = serde_json::to_string(&s).expect("serialize");
        assert!(json.contains("\"failed\":2"), "{json}");
        // A report from before the field reads as none failed.
        let old: Streams =
            serde_json::from_str(r#"{"at_start":1,"completed":1,"terminated":0,"cut":0}"#)
                .expect("an older report");
        assert_eq!(old.failed, 0);
    }

    #[test]
    fn an_envoy_restart_cuts_what_the_old_process_held() {
        let mut a = Accounting::default();
        a.observe(counts(2, 100, 2, 100), false);
        a.observe(counts(1, 1, 1, 1), false); // counters reset: a new process
        assert_eq!(a.restarts(), 1);
        let (c, s) = a.outcomes(Outcome::Deadline, 0, 0);
        // The 2 old streams (on 2 connections) were lost; 1 new one is still open.
        assert_eq!((c.at_start, c.closed, c.idle_at_exit, c.cut), (2, 0, 0, 3));
        assert_eq!((s.at_start, s.completed, s.cut), (2, 0, 3));
    }

    #[test]
    fn a_restart_told_by_uptime_counts_even_when_counters_grew() {
        // The new process already took more traffic than the old one had seen.
        let mut a = Accounting::default();
        a.observe(counts(3, 3, 3, 3), false);
        a.observe(counts(0, 5, 0, 5), true);
        assert_eq!(a.restarts(), 1);
        let (c, s) = a.outcomes(Outcome::Quiesced, 0, 0);
        assert_eq!((c.closed, c.cut), (5, 3));
        assert_eq!((s.completed, s.cut), (5, 3));
    }

    #[test]
    fn a_restart_with_nothing_open_cuts_nothing() {
        let mut a = Accounting::default();
        a.observe(counts(1, 9, 0, 9), false);
        a.observe(counts(0, 0, 0, 0), true);
        let (c, s) = a.outcomes(Outcome::Quiesced, 0, 0);
        assert_eq!((c.closed, c.idle_at_exit, c.cut), (1, 0, 0));
        assert_eq!((s.completed, s.cut), (0, 0));
    }

    #[test]
    fn progress_names_failopen_streams_only_when_there_are_some() {
        let mut s = Status::serving();
        s.envoy.reachable = true;
        s.active.streams = 5;
        assert!(!s.progress_line().contains("failopen"));
        s.active.failopen_streams = 3;
        assert!(s
            .progress_line()
            .ends_with("guard_streams=0 failopen_streams=3"));
    }

    #[test]
    fn never_reached_reports_zeros() {
        let (c, s) = Accounting::default().outcomes(Outcome::EnvoyUnreachable, 0, 0);
        assert_eq!((c, s), (Connections::default(), Streams::default()));
    }
}
