//! The table of `Metrics`' families: [`FAMILIES`]. `Metrics::register`
//! registers each entry, and node mode's per-pod collector
//! (`node::metrics`) writes each entry's series with pod labels, so a new
//! family is one entry here, beside its field in `Metrics` and its name and
//! help in `help`.
//!
//! prometheus-client cannot list a Family's label sets, so each entry says
//! which ones it can hold: closed label values, the kernel counter kinds,
//! and what `Metrics` records as seen (Envoy versions, guard services).

use std::fmt;
use std::hash::Hash;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, LabelSetEncoder};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

use super::{
    help, CodeLabels, ConfigLabels, DrainTimer, DrainTimerLabels, Dropped, DroppedLabels,
    EndingLabels, EndingOutcome, FailopenKind, FailopenLabels, GuardRequestLabels,
    GuardStreamLabels, H2Code, KindLabels, Limit, LimitLabels, ListenerDrainLabels, Metrics,
    OutcomeLabels, ProtocolLabels, Reason, ReasonLabels, TerminatedLabels, VersionLabels, CODES,
    DRAIN_OUTCOMES, LISTENER_DRAIN_KINDS, STREAM_PROTOCOLS, TCP_RESET_KINDS,
};

/// One metric family of [`Metrics`].
pub struct Def {
    /// Its name (after the `drainshim_` prefix) and help: a [`help`] constant.
    pub desc: (&'static str, &'static str),
    /// What node mode writes for it.
    pub node: NodeExport,
    /// Where it is in a `Metrics`, and its label sets.
    pub access: &'static dyn FamilyAccess,
}

/// What node mode writes for a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeExport {
    /// Each pod's series, with `namespace` and `pod` labels first.
    PerPod,
    /// Each live pod's inventory entry as is (`proxy_info`: its labels
    /// already name the pod).
    Inventory,
}

/// A family's place in a [`Metrics`], for registering it and for reading
/// its series without naming its types.
pub trait FamilyAccess: Sync {
    /// Counter, gauge or histogram.
    fn metric_type(&self) -> MetricType;
    /// Creates its known series at 0 when the entry says so, so they exist
    /// before the first drain: `increase()` and alerts then see the first
    /// cut too.
    fn zero(&self, m: &Metrics);
    /// Registers the family of `m` (a clone shares its series).
    fn register(&self, m: &Metrics, registry: &mut Registry, desc: (&str, &str));
    /// Calls `each` with every series of `m` it knows: the series' own
    /// labels (none for a metric without labels) and its metric.
    fn series(&self, m: &Metrics, each: &mut SeriesFn<'_>) -> fmt::Result;
}

/// What [`FamilyAccess::series`] calls.
pub type SeriesFn<'a> = dyn FnMut(&dyn EncodeLabelSet, &dyn EncodeMetric) -> fmt::Result + 'a;

/// A label set behind `&dyn`: prometheus-client encodes none by reference,
/// so node mode wraps the ones [`FamilyAccess::series`] hands it.
pub struct Labels<'a>(pub &'a dyn EncodeLabelSet);

impl EncodeLabelSet for Labels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        self.0.encode(encoder)
    }
}

/// A metric without labels of its own (a `Gauge` or `Histogram` field).
pub struct One<M> {
    pub metric: fn(&Metrics) -> &M,
}

/// A `Family` field and the label sets it can hold.
pub struct Labeled<L, M, C> {
    pub family: fn(&Metrics) -> &Family<L, M, C>,
    /// Every label set it can hold, in the order node mode writes them.
    pub known: fn(&Metrics) -> Vec<L>,
    /// Whether `Metrics::register` creates the known series at 0.
    pub zeroed: bool,
}

const NO_LABELS: [(&str, &str); 0] = [];

impl<M: Metric + TypedMetric + Clone> FamilyAccess for One<M> {
    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn zero(&self, _: &Metrics) {}

    fn register(&self, m: &Metrics, registry: &mut Registry, (name, help): (&str, &str)) {
        registry.register(name, help, (self.metric)(m).clone());
    }

    fn series(&self, m: &Metrics, each: &mut SeriesFn<'_>) -> fmt::Result {
        each(&NO_LABELS, (self.metric)(m))
    }
}

impl<L, M, C> FamilyAccess for Labeled<L, M, C>
where
    L: EncodeLabelSet + Clone + Hash + Eq + Send + Sync + fmt::Debug + 'static,
    M: EncodeMetric + TypedMetric + Send + Sync + fmt::Debug + 'static,
    C: MetricConstructor<M> + Clone + Send + Sync + fmt::Debug + 'static,
{
    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn zero(&self, m: &Metrics) {
        if self.zeroed {
            let family = (self.family)(m);
            for l in (self.known)(m) {
                let _ = family.get_or_create(&l);
            }
        }
    }

    fn register(&self, m: &Metrics, registry: &mut Registry, (name, help): (&str, &str)) {
        registry.register(name, help, (self.family)(m).clone());
    }

    fn series(&self, m: &Metrics, each: &mut SeriesFn<'_>) -> fmt::Result {
        let family = (self.family)(m);
        for l in (self.known)(m) {
            if let Some(metric) = family.get(&l) {
                each(&l, &*metric)?;
            }
        }
        Ok(())
    }
}

const RESOURCES: [&str; 4] = ["lds", "cds", "rds", "eds"];
const RESULTS: [&str; 3] = ["success", "rejected", "failure"];

fn terminated_labels(_: &Metrics) -> Vec<TerminatedLabels> {
    let mut all = Vec::new();
    for reason in Reason::ALL {
        for protocol in STREAM_PROTOCOLS {
            all.push(TerminatedLabels { reason, protocol });
        }
    }
    all
}

fn dropped_labels(_: &Metrics) -> Vec<DroppedLabels> {
    Dropped::ALL.map(|reason| DroppedLabels { reason }).to_vec()
}

fn version_labels(m: &Metrics) -> Vec<VersionLabels> {
    let versions = m.versions().into_iter();
    versions.map(|version| VersionLabels { version }).collect()
}

/// Every family of `Metrics`, in the exposition's order.
pub static FAMILIES: [Def; 31] = [
    Def {
        desc: help::DRAINS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.drain.drains,
            known: |_| {
                DRAIN_OUTCOMES
                    .map(|outcome| OutcomeLabels { outcome })
                    .to_vec()
            },
            zeroed: true,
        },
    },
    Def {
        desc: help::DRAINED_CONNECTIONS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.drain.drained_connections,
            known: |_| {
                [
                    EndingOutcome::closed,
                    EndingOutcome::idle_at_exit,
                    EndingOutcome::cut,
                ]
                .map(|outcome| EndingLabels { outcome })
                .to_vec()
            },
            zeroed: true,
        },
    },
    Def {
        desc: help::DRAINED_STREAMS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.drain.drained_streams,
            known: |_| {
                [
                    EndingOutcome::completed,
                    EndingOutcome::terminated,
                    EndingOutcome::failed,
                    EndingOutcome::cut,
                    EndingOutcome::bypassed,
                ]
                .map(|outcome| EndingLabels { outcome })
                .to_vec()
            },
            zeroed: true,
        },
    },
    Def {
        desc: help::DRAIN_DURATION,
        node: NodeExport::PerPod,
        access: &One {
            metric: |m: &Metrics| &m.drain.duration,
        },
    },
    Def {
        desc: help::DRAINING,
        node: NodeExport::PerPod,
        access: &One {
            metric: |m: &Metrics| &m.drain.draining,
        },
    },
    Def {
        desc: help::ENVOY_ACTIVE_CONNECTIONS,
        node: NodeExport::PerPod,
        access: &One {
            metric: |m: &Metrics| &m.envoy.active_connections,
        },
    },
    Def {
        desc: help::ENVOY_ACTIVE_STREAMS,
        node: NodeExport::PerPod,
        access: &One {
            metric: |m: &Metrics| &m.envoy.active_streams,
        },
    },
    Def {
        desc: help::FAILOPEN_ACTIVE,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.failopen_active,
            known: |_| {
                FailopenKind::ALL
                    .map(|kind| FailopenLabels { kind })
                    .to_vec()
            },
            zeroed: true,
        },
    },
    Def {
        desc: help::GUARD_PATHS,
        node: NodeExport::PerPod,
        access: &One {
            metric: |m: &Metrics| &m.envoy.guard_paths,
        },
    },
    Def {
        desc: help::PROXY_INFO,
        node: NodeExport::Inventory,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.proxy_info,
            // One entry at a time, set by `Metrics::set_proxy`.
            known: |_| Vec::new(),
            zeroed: false,
        },
    },
    Def {
        desc: help::GOAWAYS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.goaways,
            known: |_| Reason::ALL.map(|reason| ReasonLabels { reason }).to_vec(),
            zeroed: true,
        },
    },
    Def {
        desc: help::STREAMS_TERMINATED,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.streams_terminated,
            known: terminated_labels,
            zeroed: true,
        },
    },
    Def {
        desc: help::STREAMS_UNGRACEFUL,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.streams_ungraceful,
            known: terminated_labels,
            zeroed: true,
        },
    },
    Def {
        desc: help::STREAMS_BLIND_ENDED,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.streams_blind_ended,
            known: terminated_labels,
            zeroed: true,
        },
    },
    Def {
        desc: help::STREAM_DATA_DROPPED,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.stream_data_dropped,
            known: dropped_labels,
            zeroed: true,
        },
    },
    Def {
        desc: help::STREAM_DATA_DROPPED_BYTES,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.stream_data_dropped_bytes,
            known: dropped_labels,
            zeroed: true,
        },
    },
    Def {
        desc: help::ENVOY_CONFIG_UPDATES,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.config_updates,
            known: |m| {
                let mut all = Vec::new();
                for version in m.versions() {
                    for resource in RESOURCES {
                        for result in RESULTS {
                            all.push(ConfigLabels {
                                resource: resource.to_string(),
                                result: result.to_string(),
                                version: version.clone(),
                            });
                        }
                    }
                }
                all
            },
            zeroed: false,
        },
    },
    Def {
        desc: help::ENVOY_UPSTREAM_RETRIES,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.upstream_retries,
            known: version_labels,
            zeroed: false,
        },
    },
    Def {
        desc: help::ENVOY_DOWNSTREAM_REQUESTS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.downstream_requests,
            known: version_labels,
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_REQUESTS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.signals.requests,
            known: |m| {
                let mut all = Vec::new();
                for key in m.guard_services() {
                    for protocol in STREAM_PROTOCOLS {
                        for code in CODES {
                            let key = key.clone();
                            all.push(GuardRequestLabels {
                                key,
                                code,
                                protocol,
                            });
                        }
                    }
                }
                all
            },
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_REQUEST_DURATION,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.signals.request_duration,
            known: Metrics::guard_services,
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_STREAMS_OPENED,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.signals.streams_opened,
            known: |m| {
                let mut all = Vec::new();
                for key in m.guard_services() {
                    for protocol in STREAM_PROTOCOLS {
                        let key = key.clone();
                        all.push(GuardStreamLabels { key, protocol });
                    }
                }
                all
            },
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_STREAM_LIFETIME,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.signals.stream_lifetime,
            known: |_| {
                STREAM_PROTOCOLS
                    .map(|protocol| ProtocolLabels { protocol })
                    .to_vec()
            },
            zeroed: false,
        },
    },
    Def {
        desc: help::TCP_RESETS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.tcp_resets,
            known: |_| {
                let kinds = TCP_RESET_KINDS.iter().map(|(_, _, kind)| KindLabels {
                    kind: kind.to_string(),
                });
                kinds.collect()
            },
            zeroed: false,
        },
    },
    Def {
        desc: help::ENVOY_LISTENER_DRAINS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.listener_drains,
            known: |_| {
                LISTENER_DRAIN_KINDS
                    .map(|kind| ListenerDrainLabels { kind })
                    .to_vec()
            },
            zeroed: true,
        },
    },
    Def {
        desc: help::ENVOY_LISTENERS_DRAINING,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.envoy.listeners_draining,
            known: |_| {
                LISTENER_DRAIN_KINDS
                    .map(|kind| ListenerDrainLabels { kind })
                    .to_vec()
            },
            zeroed: true,
        },
    },
    Def {
        desc: help::GUARD_MAX_CONNECTION_AGE,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.guard_max_connection_age,
            // The empty label set: a sample only once a guard sets it.
            known: |_| vec![Vec::new()],
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_REQUEST_METRICS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.guard_request_metrics,
            // The empty label set: a sample only once a guard sets it.
            known: |_| vec![Vec::new()],
            zeroed: false,
        },
    },
    Def {
        desc: help::DRAIN_TIMER,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.drain.timers,
            known: |_| {
                DrainTimer::ALL
                    .map(|timer| DrainTimerLabels { timer })
                    .to_vec()
            },
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_LIMITED,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.guard_limited,
            known: |_| Limit::ALL.map(|limit| LimitLabels { limit }).to_vec(),
            zeroed: false,
        },
    },
    Def {
        desc: help::GUARD_APP_GOAWAYS,
        node: NodeExport::PerPod,
        access: &Labeled {
            family: |m: &Metrics| &m.guard_app_goaways,
            known: |_| H2Code::ALL.map(|code| CodeLabels { code }).to_vec(),
            // A series appears with its first GOAWAY: alert on `> 0`.
            zeroed: false,
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A name twice would register a family twice and write it twice in node mode.
    #[test]
    fn every_family_once() {
        let mut names: Vec<&str> = FAMILIES.iter().map(|d| d.desc.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAMILIES.len());
    }
}
