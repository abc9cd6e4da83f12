//! The drain report and status documents (DESIGN.md §3), and the accounting
//! that turns Envoy's live counters into exact outcomes.

use serde::{Deserialize, Serialize};

use super::machine::{Outcome, Phase, Trigger};
use crate::envoy::Counts;

/// The drain report: what a preStop caller receives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Always `done`.
    pub phase: Phase,
    pub outcome: Outcome,
    pub trigger: Trigger,
    pub duration_seconds: f64,
    pub connections: Connections,
    pub streams: Streams,
    pub envoy: EnvoyReport,
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
    /// Still active at the deadline. The mission is `cut == 0`.
    pub cut: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvoyReport {
    /// Envoy's release, e.g. `1.40.0`; empty if it never answered.
    pub version: String,
    /// Whether the last poll reached the admin API.
    pub reachable: bool,
}

/// Running totals across polls. Counters that go backwards mean Envoy
/// restarted; the new counters are then taken as opened since.
#[derive(Clone, Copy, Debug, Default)]
pub struct Accounting {
    first: Option<Counts>,
    last: Option<Counts>,
    opened_cx: u64,
    opened_rq: u64,
}

impl Accounting {
    pub fn observe(&mut self, c: Counts) {
        match self.last {
            None => self.first = Some(c),
            Some(prev) => {
                let grown = |now: u64, before: u64| now.checked_sub(before).unwrap_or(now);
                self.opened_cx += grown(c.cx_total, prev.cx_total);
                self.opened_rq += grown(c.rq_total, prev.rq_total);
            }
        }
        self.last = Some(c);
    }

    pub fn last(&self) -> Option<Counts> {
        self.last
    }

    /// Outcomes at the end. On `quiesced` nothing is cut by definition; on a
    /// deadline every stream Envoy last saw active is cut.
    pub fn outcomes(&self, outcome: Outcome, terminated: u64) -> (Connections, Streams) {
        let first = self.first.unwrap_or_default();
        let last = self.last.unwrap_or_default();
        let rq_end = if outcome == Outcome::quiesced {
            0
        } else {
            last.rq_active
        };
        let cx_cut = last.cx_active.min(rq_end);
        let connections = Connections {
            at_start: first.cx_active,
            closed: (first.cx_active + self.opened_cx).saturating_sub(last.cx_active),
            idle_at_exit: last.cx_active - cx_cut,
            cut: cx_cut,
        };
        let streams = Streams {
            at_start: first.rq_active,
            completed: (first.rq_active + self.opened_rq)
                .saturating_sub(rq_end)
                .saturating_sub(terminated),
            terminated,
            cut: rq_end,
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
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvoyStatus {
    pub version: String,
    pub reachable: bool,
    /// The last admin error, so an operator sees why it is unreachable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

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
        format!(
            "drain {} t={:.1}s {envoy} guard_streams={}",
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
        a.observe(counts(4, 10, 6, 50));
        a.observe(counts(5, 12, 5, 53)); // 2 new connections, 3 new streams
        let (c, s) = a.outcomes(Outcome::deadline, 1);
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
                cut: 5
            }
        );
    }

    #[test]
    fn quiesced_cuts_nothing_and_counts_idle_connections() {
        let mut a = Accounting::default();
        a.observe(counts(3, 3, 2, 2));
        a.observe(counts(1, 3, 0, 2));
        let (c, s) = a.outcomes(Outcome::quiesced, 0);
        assert_eq!((c.closed, c.idle_at_exit, c.cut), (2, 1, 0));
        assert_eq!((s.completed, s.cut), (2, 0));
    }

    #[test]
    fn an_envoy_restart_does_not_underflow() {
        let mut a = Accounting::default();
        a.observe(counts(2, 100, 2, 100));
        a.observe(counts(1, 1, 1, 1)); // counters reset
        let (c, s) = a.outcomes(Outcome::deadline, 0);
        assert_eq!((c.at_start, c.closed, c.cut), (2, 2, 1));
        assert_eq!((s.completed, s.cut), (2, 1));
    }

    #[test]
    fn never_reached_reports_zeros() {
        let (c, s) = Accounting::default().outcomes(Outcome::envoy_unreachable, 0);
        assert_eq!((c, s), (Connections::default(), Streams::default()));
    }
}
