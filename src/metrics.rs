//! The one `Metrics` struct, registered once; the names are the contract in
//! DESIGN.md §3 and must not change.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::drain::{Outcome, Report};

/// How a drain ended (`drainshim_drains_total{outcome}`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: Outcome,
}

/// How a connection or stream ended during a drain.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Ending {
    closed,
    idle_at_exit,
    completed,
    terminated,
    cut,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndingLabels {
    pub outcome: Ending,
}

/// Why the guard sent a GOAWAY or ended a stream.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reason {
    max_age,
    drain,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: Reason,
}

/// One proxy in the version inventory (`drainshim_proxy_info`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    pub namespace: String,
    pub pod: String,
    pub version: String,
    pub mesh_version: String,
}

/// Config acceptance per proxy version (`drainshim_envoy_config_updates_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigLabels {
    /// lds | cds | rds | eds
    pub resource: String,
    /// success | rejected | failure
    pub result: String,
    pub version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

/// A kernel TCP counter name, e.g. `EstabResets` or `TCPAbortOnData`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// Every metric the shim exports. Cheap to clone: each field is an `Arc` inside.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub drains: Family<OutcomeLabels, Counter>,
    pub drained_connections: Family<EndingLabels, Counter>,
    pub drained_streams: Family<EndingLabels, Counter>,
    pub drain_duration: Histogram,
    pub draining: Gauge,
    pub envoy_active_connections: Gauge,
    pub envoy_active_streams: Gauge,
    pub proxy_info: Family<ProxyLabels, Gauge>,
    pub goaways: Family<ReasonLabels, Counter>,
    pub streams_terminated: Family<ReasonLabels, Counter>,
    pub envoy_config_updates: Family<ConfigLabels, Counter>,
    pub envoy_upstream_retries: Family<VersionLabels, Counter>,
    pub tcp_resets: Family<KindLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them under the `drainshim_` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            drains: Family::default(),
            drained_connections: Family::default(),
            drained_streams: Family::default(),
            // 0.5 s .. ~256 s: covers a quick quiesce up to a long parent-shutdown budget.
            drain_duration: Histogram::new(exponential_buckets(0.5, 2.0, 10)),
            draining: Gauge::default(),
            envoy_active_connections: Gauge::default(),
            envoy_active_streams: Gauge::default(),
            proxy_info: Family::default(),
            goaways: Family::default(),
            streams_terminated: Family::default(),
            envoy_config_updates: Family::default(),
            envoy_upstream_retries: Family::default(),
            tcp_resets: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("drainshim");
        m.zero_known_series();
        r.register("drains", "Drains finished, by outcome", m.drains.clone());
        r.register(
            "drained_connections",
            "Inbound connections seen by drains, by how they ended",
            m.drained_connections.clone(),
        );
        r.register(
            "drained_streams",
            "Inbound streams seen by drains, by how they ended",
            m.drained_streams.clone(),
        );
        r.register(
            "drain_duration_seconds",
            "How long drains took, trigger to report",
            m.drain_duration.clone(),
        );
        r.register("draining", "1 while a drain is running", m.draining.clone());
        r.register(
            "envoy_active_connections",
            "Active downstream connections on Envoy's inbound listeners",
            m.envoy_active_connections.clone(),
        );
        r.register(
            "envoy_active_streams",
            "Active downstream requests (streams) on Envoy's inbound HTTP connection managers",
            m.envoy_active_streams.clone(),
        );
        r.register(
            "proxy_info",
            "The proxy's identity and version; always 1",
            m.proxy_info.clone(),
        );
        r.register(
            "goaways",
            "GOAWAY sequences the stream guard started, by reason",
            m.goaways.clone(),
        );
        r.register(
            "streams_terminated",
            "Streams the stream guard ended gracefully, by reason",
            m.streams_terminated.clone(),
        );
        r.register(
            "envoy_config_updates",
            "xDS updates by resource and result, per Envoy version (mirrored from Envoy)",
            m.envoy_config_updates.clone(),
        );
        r.register(
            "envoy_upstream_retries",
            "Upstream request retries, per Envoy version (mirrored from Envoy)",
            m.envoy_upstream_retries.clone(),
        );
        r.register(
            "tcp_resets",
            "TCP resets and aborts counted by the kernel in the pod's network namespace",
            m.tcp_resets.clone(),
        );
        m
    }

    /// Creates every known label set at 0, so the series exist before the
    /// first drain: `increase()` and alerts then see the first cut too.
    fn zero_known_series(&self) {
        use crate::drain::Outcome;
        for outcome in [
            Outcome::quiesced,
            Outcome::deadline,
            Outcome::envoy_unreachable,
        ] {
            let _ = self.drains.get_or_create(&OutcomeLabels { outcome });
        }
        for outcome in [Ending::closed, Ending::idle_at_exit, Ending::cut] {
            let _ = self
                .drained_connections
                .get_or_create(&EndingLabels { outcome });
        }
        for outcome in [Ending::completed, Ending::terminated, Ending::cut] {
            let _ = self
                .drained_streams
                .get_or_create(&EndingLabels { outcome });
        }
        for reason in [Reason::max_age, Reason::drain] {
            let _ = self.goaways.get_or_create(&ReasonLabels { reason });
            let _ = self
                .streams_terminated
                .get_or_create(&ReasonLabels { reason });
        }
    }

    /// Counts one finished drain.
    pub fn record_report(&self, report: &Report) {
        self.drains
            .get_or_create(&OutcomeLabels {
                outcome: report.outcome,
            })
            .inc();
        let c = &report.connections;
        for (outcome, n) in [
            (Ending::closed, c.closed),
            (Ending::idle_at_exit, c.idle_at_exit),
            (Ending::cut, c.cut),
        ] {
            self.drained_connections
                .get_or_create(&EndingLabels { outcome })
                .inc_by(n);
        }
        let s = &report.streams;
        for (outcome, n) in [
            (Ending::completed, s.completed),
            (Ending::terminated, s.terminated),
            (Ending::cut, s.cut),
        ] {
            self.drained_streams
                .get_or_create(&EndingLabels { outcome })
                .inc_by(n);
        }
        self.drain_duration.observe(report.duration_seconds);
    }

    /// Replaces the inventory entry: a restarted Envoy may report a new version.
    pub fn set_proxy(&self, labels: ProxyLabels) {
        if self.proxy_info.get_or_create(&labels).get() == 1 {
            return;
        }
        self.proxy_info.clear();
        self.proxy_info.get_or_create(&labels).set(1);
    }
}

/// Renders the registry in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}
