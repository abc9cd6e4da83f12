//! The drain budget (its timers and the rules between them) and every
//! default value a flag starts from.
//!
//! Everything is checked before anything runs, and every bad value is
//! reported at once, naming the flags involved.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

/// Envoy's admin API inside the pod (Istio's default).
pub const DEFAULT_ENVOY_ADMIN: &str = "http://127.0.0.1:15000";
/// Control and metrics endpoint; loopback so nothing is exposed on the pod network.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 15099));
/// The node agent's own endpoint, on the node: one below the pod port, so a
/// hostNetwork agent never collides with a pod's listener number.
pub const DEFAULT_NODE_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 15098));
/// Envoy's admin port inside a pod (Istio's default), for the node agent.
pub const DEFAULT_POD_ADMIN_PORT: u16 = 15000;
/// The preStop listener the node agent plants inside each pod; the pod
/// spec's `httpGet` targets it.
pub const DEFAULT_POD_LISTEN_PORT: u16 = 15099;

/// How long streams may take to finish before they are ended or cut.
pub const DEFAULT_DRAIN_TIME: Span = Span::secs(60);
/// The hard deadline; must stay below the pod's terminationGracePeriodSeconds.
pub const DEFAULT_PARENT_SHUTDOWN_TIME: Span = Span::secs(90);
/// Never quiesce before this, so a momentary lull does not end the drain.
pub const DEFAULT_MIN_DRAIN_TIME: Span = Span::secs(5);
/// Time for endpoint removal to reach callers; short requests keep landing meanwhile.
pub const DEFAULT_DEREGISTRATION_DELAY: Span = Span::secs(5);
/// Envoy stats are read live (not at the 5 s stats flush), so 1 s is cheap and timely.
pub const DEFAULT_POLL_INTERVAL: Span = Span::secs(1);
/// One admin call on loopback answers in milliseconds; longer means it is hung.
pub const DEFAULT_ADMIN_TIMEOUT: Span = Span::secs(2);
/// After a SIGTERM drain, /metrics stays up this long so two 5 s scrapes see
/// the final counts.
pub const DEFAULT_LINGER: Span = Span::secs(10);
/// gRPC A9's default grace after max connection age.
pub const DEFAULT_MAX_CONNECTION_AGE_GRACE: Span = Span::secs(30);
/// After the grace, one connection's remaining streams are ended over this
/// long, so a pooled connection does not reconnect all its streams at once.
pub const DEFAULT_MAX_CONNECTION_AGE_SPREAD: Span = Span::secs(10);
/// When the application itself sends GOAWAY (its own graceful stop), the
/// long-lived streams of that connection are ended over this window: well
/// inside the grace gRPC servers give themselves (grpc-go and tonic wait
/// for their calls; Kubernetes gives 30 s), so the app's grace never cuts them.
pub const DEFAULT_APP_SHUTDOWN_SPREAD: Span = Span::secs(5);
/// An answered stream open this long is long-lived (a drain may end it
/// early); far above any unary call's time between its response head and
/// its trailers.
pub const DEFAULT_LONG_STREAM_AGE: Span = Span::secs(10);
/// A client that takes no response data this long has stopped reading.
pub const DEFAULT_WRITE_STALL_TIMEOUT: Span = Span::secs(60);
/// The data-path check behind /readyz: often enough for the kubelet's 5 s
/// probes to see a dead guard within one period.
pub const DEFAULT_READY_INTERVAL: Span = Span::secs(1);
/// /readyz turns 503 after this many failed data-path checks in a row: one
/// slow probe never flips it, a dead guard shows within three intervals.
pub const DEFAULT_READY_FAILURES: u32 = 3;

/// Runtime worker threads of `drainshim sidecar`. One: the guard's hops
/// then wake each other on one thread, with no cross-thread wake-ups or
/// work stealing, which measured cheaper per request and faster at
/// saturation on a 2-core machine (`benches/guard.rs`; docs/design.md §3
/// "Cost"); it is also what Envoy `--concurrency 1` gets. Raise it for a
/// guard that needs more than one core.
pub const DEFAULT_WORKER_THREADS: usize = 1;
/// Pods come and go on the order of seconds; 5 s keeps /proc reads negligible.
pub const DEFAULT_SCAN_INTERVAL: Span = Span::secs(5);
/// Long enough for two 30 s scrapes to see a departed pod's last drain.
pub const DEFAULT_POD_RETENTION: Span = Span::secs(60);
/// After a hand-over the old agent ends its guarded streams over this
/// window: Envoy's GOAWAY handling and a spread of endings, well inside the
/// DaemonSet's grace period.
pub const DEFAULT_HANDOVER_WINDOW: Span = Span::secs(10);
/// `drainshim prestop` waits this long: above the default deadline (90 s)
/// with room for the report, below a 2-minute grace period.
pub const DEFAULT_PRESTOP_TIMEOUT: Span = Span::secs(120);
/// `drainshim verify` looks back this far: one wave's usual length.
pub const DEFAULT_VERIFY_WINDOW: Span = Span::mins(15);

/// The longest duration any flag takes: far beyond any real drain, age or
/// retention, and far below where adding it to a clock reading (or scaling
/// it by the ±10% age jitter) overflows and panics.
/// (100 years of 365.25 days, humantime's year, so it reads back as `100years`.)
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// A duration flag: humantime text (`250ms`, `5s`, `1m30s`) that is at most
/// [`MAX_DURATION`], so every duration is capped wherever it is parsed. It is
/// its own clap default (`default_value_t`), so each default is written once,
/// above, and shown in `--help` in the same text a user would type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Span(Duration);

// === impl Span ===

impl Span {
    pub const fn secs(s: u64) -> Self {
        Self(Duration::from_secs(s))
    }

    pub const fn mins(m: u64) -> Self {
        Self(Duration::from_secs(m * 60))
    }

    pub const fn millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// The duration itself.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
        if d > MAX_DURATION {
            return Err(format!(
                "{} is too long (at most {})",
                humantime::format_duration(d),
                humantime::format_duration(MAX_DURATION)
            ));
        }
        Ok(Self(d))
    }
}

/// One unit, the one a person would write: `250ms`, `60s`, `90s`, `15m`,
/// `2h`. (humantime's own format splits units: `1m 30s`.)
impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = self.0;
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            return humantime::format_duration(d).fmt(f);
        }
        let (secs, ms) = (d.as_secs(), d.subsec_millis());
        match secs {
            _ if ms != 0 => write!(f, "{}ms", d.as_millis()),
            s if s >= 3_600 && s.is_multiple_of(3_600) => write!(f, "{}h", s / 3_600),
            s if s >= 600 && s.is_multiple_of(60) => write!(f, "{}m", s / 60),
            s => write!(f, "{s}s"),
        }
    }
}

impl From<Duration> for Span {
    /// For display; a parsed flag is capped, this is not.
    fn from(d: Duration) -> Span {
        Span(d)
    }
}

impl From<Span> for Duration {
    fn from(s: Span) -> Duration {
        s.0
    }
}

/// Every violation found in a command's settings, gathered so the user fixes
/// them in one go. The one error type of validation: each message names the
/// flags involved.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Default)]
#[error("invalid settings:\n  - {}", .0.join("\n  - "))]
pub struct Invalid(pub Vec<String>);

// === impl Invalid ===

impl Invalid {
    /// Records `why` unless `ok` holds.
    pub fn check(&mut self, ok: bool, why: impl FnOnce() -> String) {
        if !ok {
            self.0.push(why());
        }
    }

    /// Adds another check's violations.
    pub fn merge(&mut self, other: Result<(), Invalid>) {
        if let Err(e) = other {
            self.0.extend(e.0);
        }
    }

    /// `Ok` when nothing was found.
    pub fn into_result(self) -> Result<(), Invalid> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
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
            deregistration_delay: DEFAULT_DEREGISTRATION_DELAY.get(),
            min_drain_time: DEFAULT_MIN_DRAIN_TIME.get(),
            drain_time: DEFAULT_DRAIN_TIME.get(),
            parent_shutdown_time: DEFAULT_PARENT_SHUTDOWN_TIME.get(),
            poll_interval: DEFAULT_POLL_INTERVAL.get(),
        }
    }
}

// === impl Timers ===

impl Timers {
    /// Checks `min-drain-time <= drain-time < parent-shutdown-time < termination grace`.
    pub fn validate(&self, termination_grace: Option<Duration>) -> Result<(), Invalid> {
        let found = self.violations(termination_grace, |t| t.flag().to_string());
        Invalid(found.into_iter().map(|v| v.message).collect()).into_result()
    }

    /// Every rule of the drain timeline these timers break, each message
    /// naming its values by `name` (the flags for a command line; node mode
    /// names a pod's own metadata keys).
    pub fn violations(
        &self,
        termination_grace: Option<Duration>,
        name: impl Fn(Timer) -> String,
    ) -> Vec<Violation> {
        let h = |d: Duration| Span::from(d).to_string();
        let mut found = Vec::new();
        let mut check = |ok: bool, rule: Rule, message: &dyn Fn() -> String| {
            if !ok {
                found.push(Violation {
                    rule,
                    message: message(),
                });
            }
        };
        check(
            self.min_drain_time <= self.drain_time,
            Rule::MinDrainTimeAboveDrainTime,
            &|| {
                format!(
                    "{} ({}) must not exceed {} ({})",
                    name(Timer::MinDrainTime),
                    h(self.min_drain_time),
                    name(Timer::DrainTime),
                    h(self.drain_time)
                )
            },
        );
        check(
            self.drain_time < self.parent_shutdown_time,
            Rule::DrainTimeNotBelowDeadline,
            &|| {
                format!(
                    "{} ({}) must be less than {} ({}): the deadline must leave room for the drain",
                    name(Timer::DrainTime),
                    h(self.drain_time),
                    name(Timer::ParentShutdownTime),
                    h(self.parent_shutdown_time)
                )
            },
        );
        check(
            self.deregistration_delay <= self.drain_time,
            Rule::DeregistrationDelayAboveDrainTime,
            &|| {
                format!(
                    "{} ({}) must not exceed {} ({})",
                    name(Timer::DeregistrationDelay),
                    h(self.deregistration_delay),
                    name(Timer::DrainTime),
                    h(self.drain_time)
                )
            },
        );
        check(
            !self.poll_interval.is_zero(),
            Rule::PollIntervalZero,
            &|| format!("{} must be greater than zero", name(Timer::PollInterval)),
        );
        if let Some(grace) = termination_grace {
            check(
                grace > self.parent_shutdown_time,
                Rule::GraceNotAboveDeadline,
                &|| {
                    format!(
                        "{} ({}) must exceed {} ({}): otherwise the kubelet sends SIGKILL before the drain deadline",
                        name(Timer::TerminationGracePeriod),
                        h(grace),
                        name(Timer::ParentShutdownTime),
                        h(self.parent_shutdown_time)
                    )
                },
            );
        }
        found
    }
}

/// One value of the drain budget, as a rule names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    DeregistrationDelay,
    MinDrainTime,
    DrainTime,
    ParentShutdownTime,
    PollInterval,
    /// The pod's terminationGracePeriodSeconds: what the timers must fit in.
    TerminationGracePeriod,
}

// === impl Timer ===

impl Timer {
    pub const ALL: [Timer; 6] = [
        Timer::DeregistrationDelay,
        Timer::MinDrainTime,
        Timer::DrainTime,
        Timer::ParentShutdownTime,
        Timer::PollInterval,
        Timer::TerminationGracePeriod,
    ];

    /// Its command-line flag.
    pub const fn flag(self) -> &'static str {
        match self {
            Timer::DeregistrationDelay => "--deregistration-delay",
            Timer::MinDrainTime => "--min-drain-time",
            Timer::DrainTime => "--drain-time",
            Timer::ParentShutdownTime => "--parent-shutdown-time",
            Timer::PollInterval => "--poll-interval",
            Timer::TerminationGracePeriod => "--termination-grace-period",
        }
    }

    /// Its flag's environment variable, which node mode also reads as a
    /// pod's Envoy node metadata key.
    pub const fn env(self) -> &'static str {
        match self {
            Timer::DeregistrationDelay => "DRAINSHIM_DEREGISTRATION_DELAY",
            Timer::MinDrainTime => "DRAINSHIM_MIN_DRAIN_TIME",
            Timer::DrainTime => "DRAINSHIM_DRAIN_TIME",
            Timer::ParentShutdownTime => "DRAINSHIM_PARENT_SHUTDOWN_TIME",
            Timer::PollInterval => "DRAINSHIM_POLL_INTERVAL",
            Timer::TerminationGracePeriod => "DRAINSHIM_TERMINATION_GRACE_PERIOD",
        }
    }
}

/// A rule of the drain timeline (docs/design.md, "Drain timeline").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// min-drain-time > drain-time.
    MinDrainTimeAboveDrainTime,
    /// drain-time >= parent-shutdown-time.
    DrainTimeNotBelowDeadline,
    /// deregistration-delay > drain-time.
    DeregistrationDelayAboveDrainTime,
    /// poll-interval = 0.
    PollIntervalZero,
    /// termination grace <= parent-shutdown-time.
    GraceNotAboveDeadline,
}

// === impl Rule ===

impl Rule {
    pub const ALL: [Rule; 5] = [
        Rule::MinDrainTimeAboveDrainTime,
        Rule::DrainTimeNotBelowDeadline,
        Rule::DeregistrationDelayAboveDrainTime,
        Rule::PollIntervalZero,
        Rule::GraceNotAboveDeadline,
    ];

    /// A short name for it, as a metric label value.
    pub const fn reason(self) -> &'static str {
        match self {
            Rule::MinDrainTimeAboveDrainTime => "min_drain_time_above_drain_time",
            Rule::DrainTimeNotBelowDeadline => "drain_time_not_below_parent_shutdown_time",
            Rule::DeregistrationDelayAboveDrainTime => "deregistration_delay_above_drain_time",
            Rule::PollIntervalZero => "poll_interval_zero",
            Rule::GraceNotAboveDeadline => "grace_not_above_parent_shutdown_time",
        }
    }
}

/// A broken rule and the message that says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which rule.
    pub rule: Rule,
    /// The values involved, by name, and why it matters.
    pub message: String,
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

    /// The same rules name other names (node mode: a pod's metadata keys),
    /// each with its reason.
    #[test]
    fn violations_name_their_values_and_carry_their_rule() {
        let t = Timers {
            drain_time: s(100),
            ..Timers::default()
        };
        let found = t.violations(Some(s(120)), |t| t.env().to_string());
        let rules: Vec<Rule> = found.iter().map(|v| v.rule).collect();
        assert_eq!(rules, vec![Rule::DrainTimeNotBelowDeadline]);
        assert!(found[0].message.starts_with(
            "DRAINSHIM_DRAIN_TIME (100s) must be less than DRAINSHIM_PARENT_SHUTDOWN_TIME (90s)"
        ));
        let all = Timers {
            min_drain_time: s(70),
            drain_time: s(60),
            parent_shutdown_time: s(50),
            deregistration_delay: s(61),
            poll_interval: Duration::ZERO,
        }
        .violations(Some(s(30)), |t| t.flag().to_string());
        assert_eq!(
            all.iter().map(|v| v.rule).collect::<Vec<_>>(),
            Rule::ALL.to_vec()
        );
        for t in Timer::ALL {
            assert_eq!(
                t.env(),
                format!(
                    "DRAINSHIM_{}",
                    t.flag()[2..].replace('-', "_").to_uppercase()
                )
            );
        }
    }

    fn span(text: &str) -> Result<Duration, String> {
        text.parse::<Span>().map(Span::get)
    }

    #[test]
    fn durations_are_bounded() {
        assert_eq!(span("1m30s"), Ok(s(90)));
        assert_eq!(span("100y"), Ok(MAX_DURATION));
        assert!(span("101y").unwrap_err().contains("at most 100years"));
        assert_eq!(
            span(&format!("{}s", MAX_DURATION.as_secs())),
            Ok(MAX_DURATION)
        );
        let err = span(&format!("{}s", u64::MAX)).unwrap_err();
        assert!(err.contains("too long"), "{err}");
        assert!(span("soon").is_err());
    }

    #[test]
    fn defaults_read_back_as_typed() {
        for (d, text) in [
            (DEFAULT_DRAIN_TIME, "60s"),
            (DEFAULT_PARENT_SHUTDOWN_TIME, "90s"),
            (DEFAULT_VERIFY_WINDOW, "15m"),
            (Span::millis(250), "250ms"),
            (Span::millis(1_500), "1500ms"),
            (Span::secs(7_200), "2h"),
            (Span::secs(0), "0s"),
        ] {
            assert_eq!(d.to_string(), text);
            assert_eq!(d.to_string().parse::<Span>(), Ok(d));
        }
        let odd = Span::from(Duration::from_nanos(1_500));
        assert_eq!(odd.to_string().parse::<Span>(), Ok(odd));
    }

    #[test]
    fn grace_equal_to_deadline_is_refused() {
        let err = Timers::default().validate(Some(s(90))).unwrap_err();
        assert!(err.to_string().contains("--termination-grace-period (90s)"));
    }
}
