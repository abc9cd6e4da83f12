//! Per-pod series on the agent's `/metrics`.
//!
//! Each pod has its own `Metrics` (the same struct, drain driver and
//! telemetry as the sidecar). This collector encodes them all under the
//! contract names with two extra labels first, `namespace` and `pod`:
//!
//! ```text
//! drainshim_drains_total{namespace="shop",pod="web-a",outcome="quiesced"} 1
//! ```
//!
//! `drainshim_proxy_info` already carries `namespace` and `pod`, so it is
//! emitted as is. Each metric family is written once, with every pod's
//! series under it: one const-label sub-registry per pod would repeat each
//! family's HELP/TYPE per pod, which OpenMetrics forbids. So this collector
//! walks the families of `metrics::families::FAMILIES`, the table
//! `Metrics::register` registers from, and writes each pod's series of each.
//! prometheus-client cannot list a Family's label sets, so the table
//! enumerates the known ones: the contract's closed label values, the
//! kernel counter kinds, and the Envoy versions and guard services that
//! `Metrics` records as seen. A departed pod keeps its counters and
//! histograms but not its gauges.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;

use crate::metrics::families::{Labels, NodeExport, FAMILIES};
use crate::metrics::{Metrics, ProxyLabels};

/// The two labels node mode adds to every per-pod series.
#[derive(
    Clone, Debug, Default, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet, serde::Serialize,
)]
pub struct PodLabels {
    /// The pod's Kubernetes namespace ("" when only its UID is known).
    pub namespace: String,
    /// The pod's name (or UID, or `netns-<inode>`, in that order of preference).
    pub pod: String,
}

/// One pod's metrics, as rendered.
#[derive(Clone, Debug)]
pub struct PodSeries {
    /// The labels its series get.
    pub labels: PodLabels,
    /// Its metrics, written by its drain driver and telemetry.
    pub metrics: Metrics,
    /// Its inventory entry; None once departed or before Envoy ever answered.
    pub proxy: Option<ProxyLabels>,
    /// False once the pod has departed: its live gauges are then meaningless
    /// and left out, while its drain counters stay for the retention period.
    pub live: bool,
}

/// Where the collector reads the current pods from at each scrape.
pub type PodSource = Arc<dyn Fn() -> Vec<PodSeries> + Send + Sync>;

/// The collector; register it under the `drainshim` prefix.
#[derive(Clone)]
pub struct PodCollector {
    /// Called at each scrape.
    pub source: PodSource,
}

impl std::fmt::Debug for PodCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodCollector").finish_non_exhaustive()
    }
}

/// One series of a pod: the pod labels, then the metric's own.
fn series<S: EncodeLabelSet, M: EncodeMetric + ?Sized>(
    me: &mut MetricEncoder,
    pod: &PodLabels,
    labels: S,
    metric: &M,
) -> std::fmt::Result {
    let all = (Labels(pod), labels);
    metric.encode(me.encode_family(&all)?)
}

impl Collector for PodCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let mut pods = (self.source)();
        pods.sort_by(|a, b| a.labels.cmp(&b.labels));
        let one = Gauge::<i64>::default();
        one.set(1);
        for def in &FAMILIES {
            let ty = def.access.metric_type();
            // The registry ends every help text with a period; so do we.
            let (name, help) = def.desc;
            let help = format!("{help}.");
            let mut me = enc.encode_descriptor(name, &help, None, ty)?;
            // A departed pod's gauges are live values no longer measured.
            for p in pods.iter().filter(|p| p.live || ty != MetricType::Gauge) {
                match (def.node, &p.proxy) {
                    (NodeExport::Inventory, Some(proxy)) => one.encode(me.encode_family(proxy)?)?,
                    (NodeExport::Inventory, None) => {}
                    (NodeExport::PerPod, _) => {
                        def.access.series(&p.metrics, &mut |labels, metric| {
                            series(&mut me, &p.labels, Labels(labels), metric)
                        })?
                    }
                }
            }
        }
        Ok(())
    }
}

/// `drainshim_node_pod_timers_invalid{namespace,pod,reason}`: node mode's
/// own family, not a sidecar metric (`node::timers`).
pub const TIMERS_INVALID: (&str, &str) = (
    "node_pod_timers_invalid",
    "1 for each violation of a live pod's own drain timers (Envoy node metadata); \
     the pod drains with the agent's timers",
);

/// The `reason` label of [`TIMERS_INVALID`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimerReason {
    /// A closed set: `node::timers::reasons()`.
    reason: String,
}

/// Each live pod whose timers were refused, with the reasons.
pub type TimersSource = Arc<dyn Fn() -> Vec<(PodLabels, Vec<&'static str>)> + Send + Sync>;

/// The collector of [`TIMERS_INVALID`]; register it under the `drainshim` prefix.
#[derive(Clone)]
pub struct TimersCollector {
    /// Called at each scrape.
    pub source: TimersSource,
}

impl std::fmt::Debug for TimersCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimersCollector").finish_non_exhaustive()
    }
}

impl Collector for TimersCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let mut pods = (self.source)();
        pods.sort();
        let (name, help) = TIMERS_INVALID;
        let help = format!("{help}.");
        let mut me = enc.encode_descriptor(name, &help, None, MetricType::Gauge)?;
        let one = Gauge::<i64>::default();
        one.set(1);
        for (pod, reasons) in &pods {
            for reason in reasons {
                let l = TimerReason {
                    reason: reason.to_string(),
                };
                series(&mut me, pod, l, &one)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::report::{Connections, EnvoyReport, Streams};
    use crate::drain::{Outcome, Phase, Report, Trigger};
    use crate::metrics::{
        ConfigLabels, GuardRequestLabels, GuardStreamLabels, KindLabels, ProtocolLabels,
        ServiceKey, VersionLabels, TCP_RESET_KINDS,
    };
    use prometheus_client::registry::Registry;
    use std::collections::BTreeSet;

    /// A Metrics with every family holding at least one series.
    fn busy_metrics(registry: &mut Registry) -> Metrics {
        let m = Metrics::register(registry);
        // As a guard at a limit counts it (node mode once left it out).
        m.guard_limited(crate::metrics::Limit::rst_stream).inc();
        // As a guard whose app stopped (GOAWAY NO_ERROR) counts it.
        m.guard_app_goaway(0).inc();
        // As a guard with a max connection age sets it.
        m.guard_max_connection_age
            .get_or_create(&Vec::new())
            .set(1800);
        m.guard_request_metrics.get_or_create(&Vec::new()).set(1);
        // As a shim that knows its drain timers sets them.
        m.drain
            .timers
            .get_or_create(&crate::metrics::DrainTimerLabels {
                timer: crate::metrics::DrainTimer::drain_time,
            })
            .set(60.0);
        m.record_drain(
            &Report {
                phase: Phase::Done,
                outcome: Outcome::Deadline,
                trigger: Trigger::Prestop,
                duration_seconds: 3.0,
                connections: Connections {
                    at_start: 2,
                    closed: 1,
                    idle_at_exit: 0,
                    cut: 1,
                },
                streams: Streams {
                    at_start: 3,
                    completed: 1,
                    terminated: 1,
                    failed: 0,
                    cut: 1,
                    bypassed: 1,
                },
                envoy: EnvoyReport {
                    version: "1.40.0".into(),
                    reachable: true,
                    ..EnvoyReport::default()
                },
            }
            .counts(),
        );
        m.set_proxy(ProxyLabels {
            namespace: "shop".into(),
            pod: "web-a".into(),
            version: "1.40.0".into(),
            mesh_version: "1.24.1".into(),
        });
        m.envoy.active_streams.set(4);
        m.set_failopen(2, 1, 1);
        m.drain.draining.set(1);
        for (_, _, kind) in TCP_RESET_KINDS {
            m.envoy
                .tcp_resets
                .get_or_create(&KindLabels {
                    kind: kind.to_string(),
                })
                .inc_by(2);
        }
        m.envoy
            .config_updates
            .get_or_create(&ConfigLabels {
                resource: "lds".into(),
                result: "rejected".into(),
                version: "1.40.0".into(),
            })
            .inc();
        m.envoy
            .upstream_retries
            .get_or_create(&VersionLabels {
                version: "1.40.0".into(),
            })
            .inc_by(7);
        m.envoy
            .downstream_requests
            .get_or_create(&VersionLabels {
                version: "1.40.0".into(),
            })
            .inc_by(40);
        // The guard's signals, as its per-request recorder writes them.
        let key = ServiceKey {
            service: "shop.Cart".into(),
            method: None,
        };
        m.signals
            .services_seen
            .lock()
            .expect("lock")
            .insert(key.clone());
        for code in [crate::metrics::Code::OK, crate::metrics::Code::UNAVAILABLE] {
            m.signals
                .requests
                .get_or_create(&GuardRequestLabels {
                    key: key.clone(),
                    code,
                    protocol: crate::metrics::StreamProtocol::grpc,
                })
                .inc_by(3);
        }
        m.signals
            .request_duration
            .get_or_create(&key)
            .observe(0.004);
        m.signals
            .streams_opened
            .get_or_create(&GuardStreamLabels {
                key,
                protocol: crate::metrics::StreamProtocol::grpc,
            })
            .inc();
        m.signals
            .stream_lifetime
            .get_or_create(&ProtocolLabels {
                protocol: crate::metrics::StreamProtocol::grpc,
            })
            .observe(42.0);
        m
    }

    type Sample = (String, Vec<(String, String)>, String);

    /// (name, sorted labels, value) of every sample, plus the HELP/TYPE lines.
    fn parse(text: &str) -> (BTreeSet<Sample>, BTreeSet<String>) {
        let mut samples = BTreeSet::new();
        let mut meta = BTreeSet::new();
        let doc = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("valid exposition");
        for s in doc.samples {
            let mut labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            samples.insert((s.metric, labels, format!("{:?}", s.value)));
        }
        for l in text.lines().filter(|l| l.starts_with("# ")) {
            meta.insert(l.to_string());
        }
        (samples, meta)
    }

    /// Node mode renders exactly the sidecar's series, each with the pod's
    /// labels added (proxy_info as is), and every family once. This catches
    /// a metric added to `Metrics` but not to the node encoder.
    #[test]
    fn node_series_are_the_sidecar_series_with_pod_labels() {
        let mut sidecar = Registry::default();
        let m = busy_metrics(&mut sidecar);
        let (side, side_meta) = parse(&crate::metrics::render(&sidecar));

        let pod = PodLabels {
            namespace: "shop".into(),
            pod: "web-a".into(),
        };
        let series = PodSeries {
            labels: pod.clone(),
            metrics: m.clone(),
            proxy: Some(ProxyLabels {
                namespace: "shop".into(),
                pod: "web-a".into(),
                version: "1.40.0".into(),
                mesh_version: "1.24.1".into(),
            }),
            live: true,
        };
        let other = PodSeries {
            labels: PodLabels {
                namespace: "shop".into(),
                pod: "web-b".into(),
            },
            metrics: Metrics::new(),
            proxy: None,
            live: true,
        };
        let mut node = Registry::default();
        let source: PodSource = Arc::new(move || vec![other.clone(), series.clone()]);
        node.sub_registry_with_prefix("drainshim")
            .register_collector(Box::new(PodCollector { source }));
        let text = crate::metrics::render(&node);
        let (node_samples, node_meta) = parse(&text);
        assert_eq!(side_meta, node_meta, "{text}");
        for meta in text.lines().filter(|l| l.starts_with("# TYPE")) {
            assert_eq!(text.matches(&format!("{meta}\n")).count(), 1, "{meta}");
        }

        let web_a: BTreeSet<Sample> = node_samples
            .iter()
            .filter(|(_, l, _)| l.contains(&("pod".to_string(), "web-a".to_string())))
            .map(|(n, l, v)| {
                let l = if n == "drainshim_proxy_info" {
                    l.clone()
                } else {
                    l.iter()
                        .filter(|(k, _)| k != "namespace" && k != "pod")
                        .cloned()
                        .collect()
                };
                (n.clone(), l, v.clone())
            })
            .collect();
        assert_eq!(side, web_a, "{text}");
        // The idle pod has its zeroed drain series but no inventory entry.
        assert!(text.contains(
            "drainshim_drains_total{namespace=\"shop\",pod=\"web-b\",outcome=\"quiesced\"} 0"
        ));
        assert!(!text.contains("drainshim_proxy_info{namespace=\"shop\",pod=\"web-b\""));
    }

    #[test]
    fn departed_pods_keep_counters_but_lose_gauges_and_inventory() {
        let mut r = Registry::default();
        let m = busy_metrics(&mut r);
        let gone = PodSeries {
            labels: PodLabels {
                namespace: "shop".into(),
                pod: "web-a".into(),
            },
            metrics: m,
            proxy: None,
            live: false,
        };
        let mut node = Registry::default();
        let source: PodSource = Arc::new(move || vec![gone.clone()]);
        node.sub_registry_with_prefix("drainshim")
            .register_collector(Box::new(PodCollector { source }));
        let text = crate::metrics::render(&node);
        assert!(text.contains(
            "drainshim_drained_streams_total{namespace=\"shop\",pod=\"web-a\",outcome=\"cut\"} 1"
        ));
        assert!(!text.contains("drainshim_draining{"), "{text}");
        assert!(!text.contains("drainshim_proxy_info{"), "{text}");
    }

    #[test]
    fn invalid_timers_are_one_gauge_per_pod_and_reason() {
        let pod = |p: &str| PodLabels {
            namespace: "shop".into(),
            pod: p.into(),
        };
        let source: TimersSource = Arc::new(move || {
            vec![
                (
                    pod("web-c"),
                    vec![
                        "min_drain_time_above_drain_time",
                        "unparsable_poll_interval",
                    ],
                ),
                (pod("web-a"), vec![]),
            ]
        });
        let mut node = Registry::default();
        node.sub_registry_with_prefix("drainshim")
            .register_collector(Box::new(TimersCollector { source }));
        let text = crate::metrics::render(&node);
        let (samples, _) = parse(&text);
        let names: Vec<String> = samples
            .iter()
            .map(|(n, l, v)| format!("{n} {l:?} {v}"))
            .collect();
        assert_eq!(
            names,
            vec![
                r#"drainshim_node_pod_timers_invalid [("namespace", "shop"), ("pod", "web-c"), ("reason", "min_drain_time_above_drain_time")] Gauge(1.0)"#,
                r#"drainshim_node_pod_timers_invalid [("namespace", "shop"), ("pod", "web-c"), ("reason", "unparsable_poll_interval")] Gauge(1.0)"#,
            ],
            "{text}"
        );
        assert!(
            text.contains("# TYPE drainshim_node_pod_timers_invalid gauge"),
            "{text}"
        );
    }
}
