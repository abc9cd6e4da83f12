//! Validated settings: the drain budget and its defaults.
//!
//! Everything is checked before anything runs, and every bad value is
//! reported at once, naming the flags involved.

use std::time::Duration;

/// Envoy's admin API inside the pod (Istio's default).
pub const DEFAULT_ENVOY_ADMIN: &str = "http://127.0.0.1:15000";
/// Control and metrics endpoint; loopback so nothing is exposed on the pod network.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:15099";
/// How long streams may take to finish before they are ended or cut.
pub const DEFAULT_DRAIN_TIME: Duration = Duration::from_secs(60);
/// The hard deadline; must stay below the pod's terminationGracePeriodSeconds.
pub const DEFAULT_PARENT_SHUTDOWN_TIME: Duration = Duration::from_secs(90);
/// Never quiesce before this, so a momentary lull does not end the drain.
pub const DEFAULT_MIN_DRAIN_TIME: Duration = Duration::from_secs(5);
/// Time for endpoint removal to reach callers; short requests keep landing meanwhile.
pub const DEFAULT_DEREGISTRATION_DELAY: Duration = Duration::from_secs(5);
/// Envoy stats are read live (not at the 5 s stats flush), so 1 s is cheap and timely.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// One admin call on loopback answers in milliseconds; longer means it is hung.
pub const DEFAULT_ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// gRPC A9's default grace after max connection age.
pub const DEFAULT_MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(30);
/// After the grace, one connection's remaining streams are ended over this
/// long, so a pooled connection does not reconnect all its streams at once.
pub const DEFAULT_MAX_CONNECTION_AGE_SPREAD: Duration = Duration::from_secs(10);
/// Default for `--long-stream-age`: an answered stream open this long is
/// long-lived (a drain may end it early); far above any unary call's time
/// between its response head and its trailers.
pub const DEFAULT_LONG_STREAM_AGE: Duration = Duration::from_secs(10);

/// The longest duration any flag takes: far beyond any real drain, age or
/// retention, and far below where adding it to a clock reading (or scaling
/// it by the ±10% age jitter) overflows and panics.
/// (100 years of 365.25 days, humantime's year, so it reads back as `100years`.)
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// Parses a duration flag: humantime (`250ms`, `5s`, `1m30s`), at most
/// [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d > MAX_DURATION {
        return Err(format!(
            "{} is too long (at most {})",
            humantime::format_duration(d),
            humantime::format_duration(MAX_DURATION)
        ));
    }
    Ok(d)
}

/// The timers of one drain (docs/design.md, "Drain timeline").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// Endpoints are being removed from callers; only short requests are expected.
    pub deregistration_delay: Duration,
    /// The earliest a drain may end, even with nothing active.
    pub min_drain_time: Duration,
    /// Streams still open are ended (by the guard) before this.
    pub drain_time: Duration,
    /// Hard deadline: whatever is still open is counted as cut.
    pub parent_shutdown_time: Duration,
    /// How often Envoy's live counters are read.
    pub poll_interval: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            deregistration_delay: DEFAULT_DEREGISTRATION_DELAY,
            min_drain_time: DEFAULT_MIN_DRAIN_TIME,
            drain_time: DEFAULT_DRAIN_TIME,
            parent_shutdown_time: DEFAULT_PARENT_SHUTDOWN_TIME,
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

/// Every inconsistency in the budget, gathered so the user fixes them in one go.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid drain budget:\n  - {}", .0.join("\n  - "))]
pub struct BudgetError(pub Vec<String>);

impl Timers {
    /// Checks `min-drain-time <= drain-time < parent-shutdown-time < termination grace`.
    pub fn validate(&self, termination_grace: Option<Duration>) -> Result<(), BudgetError> {
        let h = |d: Duration| humantime::format_duration(d).to_string();
        let mut errs = Vec::new();
        if self.min_drain_time > self.drain_time {
            errs.push(format!(
                "--min-drain-time ({}) must not exceed --drain-time ({})",
                h(self.min_drain_time),
                h(self.drain_time)
            ));
        }
        if self.drain_time >= self.parent_shutdown_time {
            errs.push(format!(
                "--drain-time ({}) must be less than --parent-shutdown-time ({}): the deadline must leave room for the drain",
                h(self.drain_time),
                h(self.parent_shutdown_time)
            ));
        }
        if self.deregistration_delay > self.drain_time {
            errs.push(format!(
                "--deregistration-delay ({}) must not exceed --drain-time ({})",
                h(self.deregistration_delay),
                h(self.drain_time)
            ));
        }
        if self.poll_interval.is_zero() {
            errs.push("--poll-interval must be greater than zero".to_string());
        }
        if let Some(grace) = termination_grace {
            if grace <= self.parent_shutdown_time {
                errs.push(format!(
                    "--termination-grace-period ({}) must exceed --parent-shutdown-time ({}): otherwise the kubelet sends SIGKILL before the drain deadline",
                    h(grace),
                    h(self.parent_shutdown_time)
                ));
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(BudgetError(errs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn defaults_are_consistent_with_a_two_minute_grace() {
        assert_eq!(Timers::default().validate(Some(s(120))), Ok(()));
    }

    #[test]
    fn every_violation_is_reported_at_once() {
        let t = Timers {
            min_drain_time: s(70),
            drain_time: s(60),
            parent_shutdown_time: s(50),
            deregistration_delay: s(61),
            poll_interval: Duration::ZERO,
        };
        let err = t.validate(Some(s(30))).unwrap_err();
        assert_eq!(err.0.len(), 5, "{err}");
        let text = err.to_string();
        for flag in [
            "--min-drain-time",
            "--parent-shutdown-time",
            "--deregistration-delay",
            "--poll-interval",
            "--termination-grace-period",
        ] {
            assert!(text.contains(flag), "{flag} missing from: {text}");
        }
    }

    #[test]
    fn durations_are_bounded() {
        assert_eq!(parse_duration("1m30s"), Ok(s(90)));
        assert_eq!(parse_duration("100y"), Ok(MAX_DURATION));
        assert!(parse_duration("101y")
            .unwrap_err()
            .contains("at most 100years"));
        assert_eq!(
            parse_duration(&format!("{}s", MAX_DURATION.as_secs())),
            Ok(MAX_DURATION)
        );
        let err = parse_duration(&format!("{}s", u64::MAX)).unwrap_err();
        assert!(err.contains("too long"), "{err}");
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn grace_equal_to_deadline_is_refused() {
        let err = Timers::default().validate(Some(s(90))).unwrap_err();
        assert!(err
            .to_string()
            .contains("--termination-grace-period (1m 30s)"));
    }
}
