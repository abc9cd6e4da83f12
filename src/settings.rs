//! The validated settings of each long-running command, and every rule they
//! must meet, in one place.
//!
//! The command line (`cli`) turns flags into these types and calls
//! `validate`; the library (`sidecar`, `node`, the one-shot drain, the
//! benchmarks, the tests) takes only these types, never flags. Each
//! `validate` reports every violation at once, as one [`Invalid`], naming the
//! flags involved. `effective()` is what `--check` prints: every value the
//! command would run with, durations in the text a user types.
//!
//! To add a setting: a field here (documented), its rule in `validate`, its
//! default in `config`, its flag in `cli`, and a line in `effective()`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde_json::{json, Value};

use crate::config::{self, Invalid, Timers};
use crate::guard::GuardConfig;
use crate::http::Endpoint;

/// Durations as `--check` and the messages print them: the text a flag takes.
fn human(d: Duration) -> String {
    config::Span::from(d).to_string()
}

/// The drain budget: its timers and what they must fit in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The phases of one drain.
    pub timers: Timers,
    /// The pod's terminationGracePeriodSeconds, when known: the deadline (and
    /// the sidecar's linger after it) must end before the kubelet's SIGKILL.
    pub termination_grace_period: Option<Duration>,
    /// Deadline of each Envoy admin call; a slower admin counts as unreachable.
    pub admin_timeout: Duration,
}

// === impl Budget ===

impl Default for Budget {
    fn default() -> Self {
        Self {
            timers: Timers::default(),
            termination_grace_period: None,
            admin_timeout: config::DEFAULT_ADMIN_TIMEOUT.get(),
        }
    }
}

// === impl Budget ===

impl Budget {
    /// The timers' order, the grace period, and `after`, time the process
    /// still needs past the deadline (the sidecar's linger).
    fn check(&self, after: Duration, errs: &mut Invalid) {
        errs.merge(self.timers.validate(self.termination_grace_period));
        errs.check(!self.admin_timeout.is_zero(), || {
            "--admin-timeout must be greater than zero".into()
        });
        let t = &self.timers;
        if let Some(grace) = self.termination_grace_period {
            // Checked: a sum past Duration::MAX is past any grace period too.
            let end = t.parent_shutdown_time.checked_add(after);
            // A deadline past the grace is reported by `Timers::validate`.
            errs.check(
                t.parent_shutdown_time >= grace || end.is_some_and(|end| end < grace),
                || {
                    format!(
                        "--parent-shutdown-time ({}) plus --linger ({}) must stay below --termination-grace-period ({})",
                        human(t.parent_shutdown_time),
                        human(after),
                        human(grace)
                    )
                },
            );
        }
    }

    fn effective(&self) -> Value {
        let t = &self.timers;
        json!({
            "deregistration_delay": human(t.deregistration_delay),
            "min_drain_time": human(t.min_drain_time),
            "drain_time": human(t.drain_time),
            "parent_shutdown_time": human(t.parent_shutdown_time),
            "poll_interval": human(t.poll_interval),
            "termination_grace_period": self.termination_grace_period.map(human),
            "admin_timeout": human(self.admin_timeout),
        })
    }
}

/// `drainshim drain`: one drain of one Envoy, no daemon, no guard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainOnceSettings {
    /// Envoy's admin API.
    pub envoy_admin: Endpoint,
    /// The drain's timers.
    pub budget: Budget,
}

// === impl DrainOnceSettings ===

impl DrainOnceSettings {
    pub fn validate(&self) -> Result<(), Invalid> {
        let mut errs = Invalid::default();
        self.budget.check(Duration::ZERO, &mut errs);
        errs.into_result()
    }
}

/// The stream guard of a sidecar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardSettings {
    /// Where Envoy's inbound cluster connects.
    pub listen: SocketAddr,
    /// What the guard forwards to, when it ends streams, and its limits
    /// (`config.upstream` is the application's port).
    pub config: GuardConfig,
    /// How often /readyz checks the data path (guard listener, then app).
    pub ready_interval: Duration,
    /// Consecutive failed checks before /readyz turns 503.
    pub ready_failures: u32,
}

// === impl GuardSettings ===

impl GuardSettings {
    /// A guard on `listen` in front of `upstream`, everything else default.
    pub fn new(listen: SocketAddr, upstream: SocketAddr) -> Self {
        Self {
            listen,
            config: GuardConfig::new(upstream),
            ready_interval: config::DEFAULT_READY_INTERVAL.get(),
            ready_failures: config::DEFAULT_READY_FAILURES,
        }
    }

    fn check(&self, errs: &mut Invalid) {
        let c = &self.config;
        errs.check(self.listen != c.upstream, || {
            format!(
                "--guard-listen and --guard-upstream are the same address ({})",
                self.listen
            )
        });
        check_guard_config(c, errs);
        errs.check(!self.ready_interval.is_zero(), || {
            "--ready-interval must be greater than zero".into()
        });
        errs.check(self.ready_failures > 0, || {
            "--ready-failures must be at least 1".into()
        });
    }

    fn effective(&self) -> Value {
        let c = &self.config;
        let mut shown = guard_config_json(c, "");
        shown.extend(
            json!({
                "listen": self.listen,
                "upstream": c.upstream,
                "request_metrics": c.signals.enabled,
                "request_metrics_methods": c.signals.methods,
                "request_metrics_max_services": c.signals.max_services,
                "ready_interval": human(self.ready_interval),
                "ready_failures": self.ready_failures,
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        );
        Value::Object(shown)
    }
}

/// `drainshim sidecar`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SidecarSettings {
    /// Envoy's admin API.
    pub envoy_admin: Endpoint,
    /// The control endpoints and /metrics.
    pub listen: SocketAddr,
    /// The runtime's worker threads, for `--check` to show: the runtime is
    /// built from the same flag before the settings exist (`Command::runtime`).
    pub worker_threads: usize,
    /// The drain's timers and the grace period they must fit in.
    pub budget: Budget,
    /// The stream guard, when the pod routes its inbound traffic through it.
    pub guard: Option<GuardSettings>,
    /// Networks besides loopback allowed to start a drain.
    pub allow_drain_from: Vec<IpNet>,
    /// After a SIGTERM drain, /metrics stays up this long for the final scrape.
    pub linger: Duration,
    /// The pod's namespace for the inventory, when given (else POD_NAMESPACE,
    /// then Envoy's node metadata).
    pub pod_namespace: Option<String>,
    /// The pod's name for the inventory, when given (else POD_NAME, then
    /// Envoy's node metadata).
    pub pod_name: Option<String>,
}

// === impl SidecarSettings ===

impl SidecarSettings {
    /// A sidecar of `envoy_admin` with every default: no guard.
    pub fn new(envoy_admin: Endpoint) -> Self {
        Self {
            envoy_admin,
            listen: config::DEFAULT_LISTEN,
            worker_threads: config::DEFAULT_WORKER_THREADS,
            budget: Budget::default(),
            guard: None,
            allow_drain_from: Vec::new(),
            linger: config::DEFAULT_LINGER.get(),
            pod_namespace: None,
            pod_name: None,
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let mut errs = Invalid::default();
        self.budget.check(self.linger, &mut errs);
        if let Some(g) = &self.guard {
            g.check(&mut errs);
        }
        errs.into_result()
    }

    /// What `drainshim sidecar --check` prints.
    pub fn effective(&self) -> Value {
        json!({
            "envoy_admin": self.envoy_admin,
            "listen": self.listen,
            "worker_threads": self.worker_threads,
            "budget": self.budget.effective(),
            "linger": human(self.linger),
            "guard": self.guard.as_ref().map(GuardSettings::effective),
            "allow_drain_from": self.allow_drain_from.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "pod_namespace": self.pod_namespace,
            "pod_name": self.pod_name,
        })
    }
}

/// `drainshim node`: the DaemonSet agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    /// The agent's own /metrics, /status and pod API, on the node.
    pub listen: SocketAddr,
    /// Where processes are listed (`/proc`, or a test's view of it).
    pub proc_root: PathBuf,
    /// `comm` or executable names that count as Envoy.
    pub process_names: Vec<String>,
    /// Time between scans.
    pub scan_interval: Duration,
    /// Envoy's admin port on 127.0.0.1 inside each pod.
    pub pod_admin_port: u16,
    /// The preStop listener's port inside each pod.
    pub pod_listen_port: u16,
    /// Each pod's drain budget (the sidecar's, per pod); its admin timeout
    /// also bounds each connect inside a pod.
    pub budget: Budget,
    /// How long a departed pod's counters stay on /metrics.
    pub retention: Duration,
    /// The per-pod stream guards and the agent's hand-over.
    pub guard: NodeGuardSettings,
}

/// Where a pod's guard listens and where it forwards, both inside the pod
/// (node metadata `DRAINSHIM_GUARD`, or `drainshim node --guard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardSpec {
    /// Envoy's inbound cluster connects here.
    pub listen: SocketAddr,
    /// The application.
    pub upstream: SocketAddr,
}

impl std::str::FromStr for GuardSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (listen, upstream) = s.split_once('=').ok_or_else(|| {
            format!("{s:?}: expected LISTEN=UPSTREAM, e.g. 127.0.0.1:15097=127.0.0.1:8080")
        })?;
        let addr = |what: &str, v: &str| {
            v.trim()
                .parse::<SocketAddr>()
                .map_err(|e| format!("{s:?}: {what} {v:?} is not an IP:port ({e})"))
        };
        let spec = GuardSpec {
            listen: addr("LISTEN", listen)?,
            upstream: addr("UPSTREAM", upstream)?,
        };
        if spec.listen.port() == 0 || spec.upstream.port() == 0 {
            return Err(format!("{s:?}: ports must not be 0"));
        }
        if spec.listen == spec.upstream {
            return Err(format!("{s:?}: LISTEN and UPSTREAM are the same address"));
        }
        Ok(spec)
    }
}

impl std::fmt::Display for GuardSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.listen, self.upstream)
    }
}

/// The node agent's stream guards (one per opted-in pod) and its hand-over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGuardSettings {
    /// For pods whose Envoy has no `DRAINSHIM_GUARD` node metadata.
    pub default: Option<GuardSpec>,
    /// Every pod's guard config but the upstream, which is the pod's own.
    pub template: GuardConfig,
    /// The unix socket successive agents hand their listeners over on.
    pub handover_socket: Option<PathBuf>,
    /// After a hand-over, the old agent ends its guarded streams over this.
    pub handover_window: Duration,
    /// Set `net.ipv4.tcp_migrate_req=1` in each pod's network namespace, so
    /// an agent closing its listeners beside another agent (no hand-over
    /// socket) passes its queued connections on instead of resetting them.
    pub tcp_migrate_req: bool,
}

// === impl NodeGuardSettings ===

impl Default for NodeGuardSettings {
    /// No default guard, the sidecar guard's defaults, no hand-over.
    fn default() -> Self {
        Self {
            default: None,
            // A placeholder: each pod's upstream comes from its spec.
            template: GuardConfig::new(SocketAddr::from(([127, 0, 0, 1], 0))),
            handover_socket: None,
            handover_window: config::DEFAULT_HANDOVER_WINDOW.get(),
            tcp_migrate_req: true,
        }
    }
}

impl NodeGuardSettings {
    fn check(&self, errs: &mut Invalid) {
        let c = &self.template;
        check_guard_config(c, errs);
        errs.check(
            self.handover_socket
                .as_ref()
                .is_none_or(|p| p.is_absolute() && p.file_name().is_some()),
            || "--handover-socket must be an absolute path to a socket file".into(),
        );
    }

    fn effective(&self) -> Value {
        let mut shown = guard_config_json(&self.template, "_per_pod");
        shown.extend(
            json!({
                "default": self.default.map(|g| g.to_string()),
                "handover_socket": self.handover_socket.as_deref().map(shown_path),
                "handover_window": human(self.handover_window),
                "tcp_migrate_req": self.tcp_migrate_req,
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        );
        Value::Object(shown)
    }
}

/// The rules every guard's configuration meets, the sidecar's and node
/// mode's (each pod's guard is made from one template).
fn check_guard_config(c: &GuardConfig, errs: &mut Invalid) {
    errs.check(!c.max_connection_age.is_some_and(|a| a.is_zero()), || {
        "--max-connection-age must be greater than zero (leave it out to turn it off)".into()
    });
    errs.check(!c.limits.write_stall_timeout.is_zero(), || {
        "--write-stall-timeout must be greater than zero".into()
    });
    errs.check(c.limits.max_connections > 0, || {
        "--guard-max-connections must be at least 1".into()
    });
    errs.check(c.limits.max_streams > 0, || {
        "--guard-max-streams must be at least 1".into()
    });
}

/// What `--check` shows of a guard's configuration; `caps` suffixes the
/// connection and stream caps (node mode's are per pod).
fn guard_config_json(c: &GuardConfig, caps: &str) -> serde_json::Map<String, Value> {
    let mut shown = json!({
        "max_connection_age": c.max_connection_age.map(human),
        "max_connection_age_grace": human(c.max_connection_age_grace),
        "max_connection_age_spread": human(c.max_connection_age_spread),
        "app_shutdown_spread": human(c.app_shutdown_spread),
        "long_stream_age": human(c.long_stream_age),
        "write_stall_timeout": human(c.limits.write_stall_timeout),
    })
    .as_object()
    .cloned()
    .unwrap_or_default();
    shown.insert(
        format!("max_connections{caps}"),
        c.limits.max_connections.into(),
    );
    shown.insert(format!("max_streams{caps}"), c.limits.max_streams.into());
    shown
}

/// A path as `--check` prints it. serde refuses paths that are not UTF-8
/// (`json!` would panic on one given as a flag), so they are shown lossily.
fn shown_path(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

// === impl NodeSettings ===

impl NodeSettings {
    /// An agent with every default, listing processes under `proc_root`.
    pub fn new(proc_root: PathBuf) -> Self {
        Self {
            listen: config::DEFAULT_NODE_LISTEN,
            proc_root,
            process_names: vec!["envoy".into()],
            scan_interval: config::DEFAULT_SCAN_INTERVAL.get(),
            pod_admin_port: config::DEFAULT_POD_ADMIN_PORT,
            pod_listen_port: config::DEFAULT_POD_LISTEN_PORT,
            budget: Budget::default(),
            retention: config::DEFAULT_POD_RETENTION.get(),
            guard: NodeGuardSettings::default(),
        }
    }

    pub fn validate(&self) -> Result<(), Invalid> {
        let mut errs = Invalid::default();
        self.budget.check(Duration::ZERO, &mut errs);
        errs.check(!self.scan_interval.is_zero(), || {
            "--scan-interval must be greater than zero".into()
        });
        errs.check(self.pod_admin_port != 0, || {
            "--pod-admin-port must not be 0".into()
        });
        errs.check(self.pod_listen_port != 0, || {
            "--pod-listen-port must not be 0".into()
        });
        errs.check(
            self.process_names.iter().any(|n| !n.trim().is_empty()),
            || "--envoy-process-name needs at least one name".into(),
        );
        self.guard.check(&mut errs);
        errs.into_result()
    }

    /// What `drainshim node --check` prints.
    pub fn effective(&self) -> Value {
        json!({
            "listen": self.listen,
            "proc_root": shown_path(&self.proc_root),
            "envoy_process_name": self.process_names,
            "scan_interval": human(self.scan_interval),
            "pod_admin_port": self.pod_admin_port,
            "pod_listen_port": self.pod_listen_port,
            "budget": self.budget.effective(),
            "pod_retention": human(self.retention),
            "guard": self.guard.effective(),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spec_is_listen_equals_upstream() {
        let spec: GuardSpec = "127.0.0.1:15097=127.0.0.1:8080".parse().unwrap();
        assert_eq!(spec.listen, "127.0.0.1:15097".parse().unwrap());
        assert_eq!(spec.upstream, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(spec.to_string(), "127.0.0.1:15097=127.0.0.1:8080");
        for bad in [
            "",
            "127.0.0.1:15097",
            "127.0.0.1:15097=localhost:8080",
            "127.0.0.1:0=127.0.0.1:8080",
            "127.0.0.1:8080=127.0.0.1:8080",
        ] {
            assert!(bad.parse::<GuardSpec>().is_err(), "{bad:?} parsed");
        }
    }

    use super::*;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn sidecar() -> SidecarSettings {
        SidecarSettings::new("http://127.0.0.1:15000".parse().unwrap())
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(sidecar().validate(), Ok(()));
        assert_eq!(NodeSettings::new("/proc".into()).validate(), Ok(()));
        let mut g = sidecar();
        g.guard = Some(GuardSettings::new(
            "127.0.0.1:15097".parse().unwrap(),
            "127.0.0.1:8080".parse().unwrap(),
        ));
        assert_eq!(g.validate(), Ok(()));
    }

    #[test]
    fn every_violation_at_once() {
        let mut bad = sidecar();
        bad.budget.termination_grace_period = Some(s(95));
        bad.budget.admin_timeout = Duration::ZERO;
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let mut g = GuardSettings::new(addr, addr);
        g.config.max_connection_age = Some(Duration::ZERO);
        g.ready_failures = 0;
        bad.guard = Some(g);
        let err = bad.validate().unwrap_err();
        let text = err.to_string();
        for flag in [
            "--linger",
            "--admin-timeout",
            "--guard-listen",
            "--max-connection-age",
            "--ready-failures",
        ] {
            assert!(text.contains(flag), "{flag} missing from: {text}");
        }
        assert_eq!(err.0.len(), 5, "{text}");
    }

    #[test]
    fn linger_counts_against_the_grace() {
        let mut st = sidecar();
        st.budget.termination_grace_period = Some(s(100));
        assert!(st
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--linger (10s)"));
        st.linger = s(9);
        assert_eq!(st.validate(), Ok(()));
        // The one-shot drain has no linger.
        let once = DrainOnceSettings {
            envoy_admin: st.envoy_admin.clone(),
            budget: Budget {
                termination_grace_period: Some(s(91)),
                ..Budget::default()
            },
        };
        assert_eq!(once.validate(), Ok(()));
    }

    /// Found by the fuzz/ target `cli`: --parent-shutdown-time plus --linger
    /// overflowed Duration and panicked instead of giving a usage error. Flags
    /// are capped at MAX_DURATION; validation must not panic even without it.
    #[test]
    fn huge_durations_are_violations_not_panics() {
        let mut st = sidecar();
        st.budget.timers.parent_shutdown_time = s(100);
        st.budget.termination_grace_period = Some(Duration::MAX);
        st.linger = Duration::MAX;
        let err = st.validate().unwrap_err().to_string();
        assert!(err.contains("plus --linger"), "{err}");
    }

    #[test]
    fn paths_that_are_not_utf8_are_printed_not_a_panic() {
        use std::os::unix::ffi::OsStrExt;
        let odd = std::path::Path::new(std::ffi::OsStr::from_bytes(b"/pr\xffoc"));
        let v = NodeSettings::new(odd.to_path_buf()).effective();
        assert_eq!(v["proc_root"], "/pr\u{fffd}oc");
    }

    #[test]
    fn effective_settings_are_human() {
        let v = sidecar().effective();
        assert_eq!(v["budget"]["drain_time"], "60s");
        assert_eq!(v["envoy_admin"], "http://127.0.0.1:15000");
        assert_eq!(v["linger"], "10s");
        assert!(v["guard"].is_null());
    }
}
