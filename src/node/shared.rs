//! What the agent's parts share: the pods, the departed, the settings and
//! the metrics registry. The scan (`scan`), the listeners and guards
//! (`binding`), the API (`api`) and the lifecycle (`agent`) all work on it;
//! it depends on none of them.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::handover::Offer;
use super::metrics::PodSeries;
use super::pod::{HostAddrs, Pod, PodStatus};
use super::timers::PodDrain;
use super::{NodeSettings, NodeStatus};
use crate::control::telemetry::Telemetry;
use crate::drain::Phase;

/// New pods set up and identified at once per scan; bounds threads in flight.
pub(super) const SCAN_CONCURRENCY: usize = 32;

/// A departed pod whose counters are still shown.
pub(super) struct Departed {
    /// Its last series, with `live` false.
    pub(super) series: PodSeries,
    /// When they stop being exported.
    pub(super) until: Instant,
}

/// The agent's registry and the two gauges of its own it writes.
pub(super) struct AgentMetrics {
    /// Per-pod series (collected at scrape time) plus the gauges below.
    pub(super) registry: Registry,
    /// Pods managed (`drainshim_node_pods`).
    pub(super) pods: Gauge,
    /// Pods whose namespace could not be given `net.ipv4.tcp_migrate_req`
    /// (`drainshim_node_pods_without_tcp_migrate_req`).
    pub(super) without_migrate_req: Gauge,
}

/// State shared by the scanner, the API and the pod listeners.
pub(super) struct Shared {
    /// Validated flags.
    pub(super) settings: NodeSettings,
    /// The node's own namespace: Envoys in it are hostNetwork, not pods.
    pub(super) own_netns: u64,
    /// Live pods by namespace inode. A std mutex, never held across an await.
    pub(super) pods: Arc<Mutex<BTreeMap<u64, Pod>>>,
    /// Pods gone, kept for the retention period.
    pub(super) departed: Arc<Mutex<Vec<Departed>>>,
    /// The node's addresses, for the pod listeners' access check.
    pub(super) host: HostAddrs,
    /// Every pod task (listeners, report watchers): none outlives its pod.
    pub(super) tasks: TaskTracker,
    /// The agent's metrics: per-pod series plus a few of its own.
    pub(super) metrics: AgentMetrics,
    /// Scans done, for /readyz and /status.
    pub(super) scans: std::sync::atomic::AtomicU64,
    /// Numbers pods in discovery order.
    pub(super) next_seq: std::sync::atomic::AtomicU64,
    /// Held by each scan, and for good by a hand-over: the old agent takes
    /// on no pod once it has listed its listeners.
    pub(super) scanning: Arc<tokio::sync::Mutex<()>>,
    /// The scan lock while a hand-over is under way.
    pub(super) paused: Mutex<Option<tokio::sync::OwnedMutexGuard<()>>>,
    /// Listeners from the old agent not claimed yet by a pod.
    pub(super) inherited: Mutex<Vec<Offer>>,
    /// The agent's own listener, kept to hand over.
    pub(super) api_fd: Option<OwnedFd>,
    /// Stops the agent's API listener alone.
    pub(super) api_stop: CancellationToken,
}

impl Shared {
    pub(super) fn status(&self) -> NodeStatus {
        let pods = self
            .pods
            .lock()
            .map(|p| p.values().map(Pod::status).collect())
            .unwrap_or_default();
        let departed = self
            .departed
            .lock()
            .map(|d| d.iter().map(|d| d.series.labels.clone()).collect())
            .unwrap_or_default();
        let host_addresses = self
            .host
            .read()
            .map(|h| h.iter().map(|n| n.addr().to_string()).collect())
            .unwrap_or_default();
        NodeStatus {
            pods,
            departed,
            host_addresses,
            scans: self.scans.load(std::sync::atomic::Ordering::Relaxed),
            tasks: crate::control::alive_tasks(),
        }
    }

    /// The pod with these labels, for the agent API.
    pub(super) fn find(&self, namespace: &str, name: &str) -> Option<(PodDrain, PodStatus)> {
        let pods = self.pods.lock().ok()?;
        pods.values()
            .find(|p| p.labels.namespace == namespace && p.labels.pod == name)
            .map(|p| (p.drain.clone(), p.status()))
    }

    /// Telemetry of every live pod, refreshed concurrently.
    pub(super) async fn refresh_telemetry(&self) {
        let all: Vec<(Arc<Telemetry>, bool)> = self
            .pods
            .lock()
            .map(|p| {
                p.values()
                    .map(|p| {
                        (
                            p.telemetry.clone(),
                            p.drain.status().phase != Phase::Serving,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        futures_util::stream::iter(all)
            .for_each_concurrent(SCAN_CONCURRENCY, |(t, draining)| async move {
                t.refresh(draining).await
            })
            .await;
    }
}
