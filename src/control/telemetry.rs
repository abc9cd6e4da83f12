//! What the mesh's own telemetry cannot be trusted with during an upgrade,
//! read at scrape time from outside the proxy's code path:
//!
//! - the version inventory (`drainshim_proxy_info`) from `/server_info`;
//! - config acceptance per version (`drainshim_envoy_config_updates_total`)
//!   from Envoy's lds/cds/rds/eds `update_{success,rejected,failure}`;
//! - retry volume per version (`drainshim_envoy_upstream_retries_total`)
//!   from `cluster.*.upstream_rq_retry`;
//! - the callers' load per version
//!   (`drainshim_envoy_downstream_requests_total`) from the inbound
//!   listeners' `http.*.downstream_rq_total`: what callers sent, which a
//!   retry policy does not change (`verify` divides the guard's request
//!   count by it);
//! - what bypasses the stream guard (`drainshim_failopen_active{kind}`)
//!   from `/clusters`: the fail-open hosts' live requests and connections;
//!   and how many clusters send to the guard first (`drainshim_guard_paths`);
//! - kernel TCP resets (`drainshim_tcp_resets_total`) from the network
//!   namespace's `/proc/net/snmp` and `/proc/net/netstat`.
//!
//! Envoy's and the kernel's counters are mirrored into the shim's own
//! counters by their increase since the last read; a counter that went
//! backwards (Envoy restarted) counts from zero again, so the shim's series
//! never reset while it lives.

use std::collections::HashMap;
use std::path::PathBuf;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::Mutex;

use crate::envoy::{AdminClient, InboundScope, Stat};
use crate::metrics::{ConfigLabels, KindLabels, Metrics, VersionLabels, TCP_RESET_KINDS};

/// One RE2 filter for every Envoy counter mirrored here.
const ENVOY_FILTER: &str = r"^(listener_manager\.lds|cluster_manager\.cds|http\..+\.rds\..+|cluster\..+)\.update_(success|rejected|failure)$|^cluster\..+\.upstream_rq_retry$";

/// Reads and mirrors; one per proxy.
pub struct Telemetry {
    admin: AdminClient,
    /// (namespace, pod) from flags or env; Envoy's metadata fills the gaps.
    identity: (Option<String>, Option<String>),
    /// `/proc/self/net` in a sidecar; `/proc/<pid>/net` for a pod in node mode.
    net_dir: PathBuf,
    metrics: Metrics,
    /// Last raw values seen, so only increases are added.
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    values: HashMap<String, u64>,
    scope: Option<InboundScope>,
}

// === impl Seen ===

impl Seen {
    /// Adds the increase of a mirrored counter since its last value.
    fn mirror(&mut self, key: String, value: u64, counter: &Counter) {
        let last = self.values.insert(key, value);
        let delta = match last {
            Some(last) if value >= last => value - last,
            // First sight, or the source restarted: all of it is new.
            _ => value,
        };
        counter.inc_by(delta);
    }
}

// === impl Telemetry ===

impl Telemetry {
    pub fn new(
        admin: AdminClient,
        identity: (Option<String>, Option<String>),
        net_dir: PathBuf,
        metrics: Metrics,
    ) -> Self {
        Self {
            admin,
            identity,
            net_dir,
            metrics,
            seen: Mutex::new(Seen::default()),
        }
    }

    /// Refreshes everything. While a drain runs, its driver owns the live
    /// connection and stream gauges, so they are left alone then.
    pub async fn refresh(&self, draining: bool) {
        let mut seen = self.seen.lock().await;
        self.refresh_kernel(&mut seen);
        if let Err(e) = self.refresh_envoy(&mut seen, draining).await {
            tracing::debug!(error = %e, "telemetry: envoy admin unreachable");
            // Listeners may differ when Envoy comes back.
            seen.scope = None;
        }
    }

    async fn refresh_envoy(
        &self,
        seen: &mut Seen,
        draining: bool,
    ) -> Result<(), crate::envoy::AdminError> {
        let info = self.admin.server_info().await?;
        let labels = crate::inventory::proxy_labels(
            self.identity.0.as_deref(),
            self.identity.1.as_deref(),
            &info,
        );
        let version = labels.version.clone();
        self.metrics.set_proxy(labels);
        let stats = self.admin.stats(ENVOY_FILTER).await?;
        self.mirror_envoy(seen, &stats, &version);
        if !draining {
            let scope = match &seen.scope {
                Some(s) => s.clone(),
                None => seen.scope.insert(self.admin.inbound_scope().await?).clone(),
            };
            let c = self.admin.counts(&scope).await?;
            self.metrics
                .envoy
                .active_connections
                .set(c.cx_active as i64);
            self.metrics.envoy.active_streams.set(c.rq_active as i64);
            let callers =
                self.metrics
                    .envoy
                    .downstream_requests
                    .get_or_create_owned(&VersionLabels {
                        version: version.clone(),
                    });
            seen.mirror(format!("downstream/{version}"), c.rq_total, &callers);
            let f = self.admin.failopen().await?;
            self.metrics
                .set_failopen(f.requests, f.connections, f.paths);
        }
        Ok(())
    }

    fn mirror_envoy(&self, seen: &mut Seen, stats: &[Stat], version: &str) {
        // Sum per label set first: many clusters feed one series.
        let mut config: HashMap<(&'static str, &str), u64> = HashMap::new();
        let mut retries = 0u64;
        for s in stats {
            if let Some((resource, result)) = classify_update(&s.name) {
                *config.entry((resource, result)).or_default() += s.value;
            } else if s.name.starts_with("cluster.") && s.name.ends_with(".upstream_rq_retry") {
                retries += s.value;
            }
        }
        for ((resource, result), value) in config {
            let labels = ConfigLabels {
                resource: resource.to_string(),
                result: result.to_string(),
                version: version.to_string(),
            };
            let counter = self
                .metrics
                .envoy
                .config_updates
                .get_or_create_owned(&labels);
            seen.mirror(
                format!("config/{resource}/{result}/{version}"),
                value,
                &counter,
            );
        }
        let counter = self
            .metrics
            .envoy
            .upstream_retries
            .get_or_create_owned(&VersionLabels {
                version: version.to_string(),
            });
        seen.mirror(format!("retries/{version}"), retries, &counter);
    }

    fn refresh_kernel(&self, seen: &mut Seen) {
        for file in ["snmp", "netstat"] {
            let path = self.net_dir.join(file);
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "telemetry: cannot read kernel counters");
                    continue;
                }
            };
            let values = parse_proc_net(&text);
            for (f, section, kind) in TCP_RESET_KINDS {
                if *f != file {
                    continue;
                }
                if let Some(v) = values.get(&(section.to_string(), kind.to_string())) {
                    let counter = self
                        .metrics
                        .envoy
                        .tcp_resets
                        .get_or_create_owned(&KindLabels {
                            kind: kind.to_string(),
                        });
                    seen.mirror(format!("tcp/{kind}"), *v, &counter);
                }
            }
        }
    }
}

/// Maps an Envoy stat name to (resource, result) when it is an xDS update counter.
pub fn classify_update(name: &str) -> Option<(&'static str, &'static str)> {
    let (prefix, result) = name.rsplit_once(".update_")?;
    let result = match result {
        "success" => "success",
        "rejected" => "rejected",
        "failure" => "failure",
        _ => return None,
    };
    let resource = if prefix == "listener_manager.lds" {
        "lds"
    } else if prefix == "cluster_manager.cds" {
        "cds"
    } else if prefix.starts_with("http.") && prefix.contains(".rds.") {
        "rds"
    } else if prefix.starts_with("cluster.") {
        // Per-cluster membership updates come from endpoint discovery.
        "eds"
    } else {
        return None;
    };
    Some((resource, result))
}

/// Parses `/proc/net/snmp` or `/proc/net/netstat`: pairs of lines, a header
/// of names and a line of values, both starting with `Section:`.
pub fn parse_proc_net(text: &str) -> HashMap<(String, String), u64> {
    let mut out = HashMap::new();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((sec_a, names)), Some((sec_b, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        if sec_a != sec_b {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            // Some fields (MaxConn) are signed; resets never are.
            if let Ok(v) = v.parse::<u64>() {
                out.insert((sec_a.to_string(), n.to_string()), v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_counters_are_classified() {
        assert_eq!(
            classify_update("listener_manager.lds.update_rejected"),
            Some(("lds", "rejected"))
        );
        assert_eq!(
            classify_update("cluster_manager.cds.update_success"),
            Some(("cds", "success"))
        );
        assert_eq!(
            classify_update("http.inbound_0.0.0.0_80.rds.route.a.b.update_failure"),
            Some(("rds", "failure"))
        );
        assert_eq!(
            classify_update("cluster.outbound|80||a.ns.svc.cluster.local.update_success"),
            Some(("eds", "success"))
        );
        assert_eq!(classify_update("cluster_manager.cds.update_attempt"), None);
        assert_eq!(classify_update("server.update_success"), None);
        let re = regex::Regex::new(ENVOY_FILTER).unwrap();
        assert!(re.is_match("cluster.a.b.upstream_rq_retry"));
        assert!(!re.is_match("cluster.a.upstream_rq_retry_success"));
        assert!(!re.is_match("cluster_manager.cds.update_attempt"));
    }

    #[test]
    fn proc_net_pairs() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm MaxConn EstabResets OutRsts\nTcp: 1 -1 7 12\n";
        let v = parse_proc_net(text);
        assert_eq!(v[&("Tcp".to_string(), "EstabResets".to_string())], 7);
        assert_eq!(v[&("Tcp".to_string(), "OutRsts".to_string())], 12);
        assert!(!v.contains_key(&("Tcp".to_string(), "MaxConn".to_string())));
    }

    #[test]
    fn mirroring_survives_a_source_restart() {
        let mut seen = Seen::default();
        let c = Counter::<u64>::default();
        seen.mirror("k".into(), 10, &c);
        seen.mirror("k".into(), 15, &c);
        seen.mirror("k".into(), 3, &c); // restarted
        assert_eq!(c.get(), 18);
    }

    #[test]
    fn this_machine_has_reset_counters() {
        let text = std::fs::read_to_string("/proc/self/net/snmp").unwrap();
        let v = parse_proc_net(&text);
        assert!(v.contains_key(&("Tcp".to_string(), "EstabResets".to_string())));
        let text = std::fs::read_to_string("/proc/self/net/netstat").unwrap();
        assert!(parse_proc_net(&text)
            .contains_key(&("TcpExt".to_string(), "TCPAbortOnData".to_string())));
    }
}
