//! The agent's lifecycle: `NodeAgent::start` (privileges, the API
//! listener, listeners inherited from the old agent, the first scan),
//! `run` and `stop`, and the hand-over to the next agent (`handover::Donor`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::binding::{adopt, bind_api};
use super::handover::{self, ListenerKind, Offer};
use super::metrics::{PodCollector, PodSeries, PodSource, TimersCollector, TimersSource};
use super::netns::Netns;
use super::pod::{HostAddrs, Pod};
use super::scan::scan_loop;
use super::shared::{AgentMetrics, Departed, Shared};
use super::{api, proc, NodeAgent, NodeError, NodeSettings, NodeStatus};
use crate::drain::Phase;

/// How long a new agent scans again for pods whose guard listener it was
/// handed but could not serve yet (their Envoy did not answer), before it
/// answers `adopted`: well within the old agent's wait for that answer.
const ADOPT_RETRY: Duration = Duration::from_secs(20);
/// Pause between those scans (the scan interval if shorter).
const ADOPT_RETRY_PAUSE: Duration = Duration::from_millis(250);

impl handover::Donor for Arc<Shared> {
    async fn offer(&self) -> Vec<Offer> {
        // No scan runs from now on (until `resume`): the list stays true.
        let held = self.scanning.clone().lock_owned().await;
        if let Ok(mut p) = self.paused.lock() {
            *p = Some(held);
        }
        let dup = |kind, netns, fd: Option<&OwnedFd>| -> Option<Offer> {
            let fd = fd?.try_clone().ok()?;
            let addr = socket2::SockRef::from(&fd).local_addr().ok()?.as_socket()?;
            Some(Offer {
                kind,
                netns,
                addr,
                fd,
            })
        };
        let mut offers: Vec<Offer> = dup(ListenerKind::Api, self.own_netns, self.api_fd.as_ref())
            .into_iter()
            .collect();
        if let Ok(pods) = self.pods.lock() {
            for (k, p) in pods.iter() {
                offers.extend(dup(ListenerKind::Prestop, *k, p.listener.fd.as_ref()));
                offers.extend(dup(ListenerKind::Guard, *k, p.guard.fd.as_ref()));
            }
        }
        // Not claimed yet here (a pod not identified since): passed on too.
        if let Ok(inherited) = self.inherited.lock() {
            for o in inherited.iter() {
                offers.extend(dup(o.kind, o.netns, Some(&o.fd)));
            }
        }
        offers
    }

    fn resume(&self) {
        if let Ok(mut p) = self.paused.lock() {
            p.take();
        }
    }
}

/// Checks that this process may enter network namespaces, by entering its own.
async fn check_privileges(own: &Netns) -> Result<(), NodeError> {
    own.run(|| Ok(()))
        .await
        .map_err(|e| NodeError::NoPrivilege(e.to_string()))
}

impl NodeAgent {
    /// Checks privileges, binds `listen`, runs the first scan, and starts
    /// scanning every interval.
    pub async fn start(settings: NodeSettings) -> Result<Self, NodeError> {
        let listen = settings.listen;
        let self_ns = PathBuf::from("/proc/self/ns/net");
        let own_netns = proc::netns_inode(&self_ns).map_err(NodeError::OwnNetns)?;
        let own =
            Netns::open(&self_ns, own_netns).map_err(|e| NodeError::NoPrivilege(e.to_string()))?;
        check_privileges(&own).await?;
        // Fail now, not at the first scan, on a --proc-root that cannot be read.
        proc::scan(&settings.proc_root, &settings.process_names)?;
        let handover::Inherited {
            adoption,
            mut offers,
        } = match &settings.guard.handover_socket {
            Some(path) => handover::take(path).await,
            None => handover::Inherited::default(),
        };
        let listener = match handover::claim(&mut offers, ListenerKind::Api, own_netns)
            .filter(|o| o.addr == listen || listen.port() == 0)
            .and_then(|o| adopt(o.fd).ok())
        {
            Some(l) => l,
            None => bind_api(listen).map_err(|source| NodeError::Bind {
                addr: listen,
                source,
            })?,
        };
        let local = listener.local_addr().unwrap_or(listen);
        let api_fd = listener.as_fd().try_clone_to_owned().ok();

        let pods: Arc<Mutex<BTreeMap<u64, Pod>>> = Arc::default();
        let departed: Arc<Mutex<Vec<Departed>>> = Arc::default();
        let source: PodSource = {
            let pods = pods.clone();
            let departed = departed.clone();
            Arc::new(move || {
                let mut all: Vec<PodSeries> = pods
                    .lock()
                    .map(|p| p.values().map(Pod::series).collect())
                    .unwrap_or_default();
                // A pod that came back (same labels) replaces its departed
                // self: one label set must never be exported twice.
                if let Ok(d) = departed.lock() {
                    let fresh: Vec<_> = d
                        .iter()
                        .filter(|d| !all.iter().any(|p| p.labels == d.series.labels))
                        .map(|d| d.series.clone())
                        .collect();
                    all.extend(fresh);
                }
                all
            })
        };
        let refused: TimersSource = {
            let pods = pods.clone();
            Arc::new(move || {
                pods.lock()
                    .map(|p| {
                        p.values()
                            .map(|p| (p.labels.clone(), p.drain.timers().reasons()))
                            .filter(|(_, reasons)| !reasons.is_empty())
                            .collect()
                    })
                    .unwrap_or_default()
            })
        };
        let mut registry = Registry::default();
        let pods_gauge = prometheus_client::metrics::gauge::Gauge::default();
        let migrate_gauge = prometheus_client::metrics::gauge::Gauge::default();
        {
            let r = registry.sub_registry_with_prefix("drainshim");
            r.register_collector(Box::new(PodCollector { source }));
            r.register_collector(Box::new(TimersCollector { source: refused }));
            r.register(
                "node_pods",
                "Pods (network namespaces with an Envoy) the node agent manages",
                pods_gauge.clone(),
            );
            r.register(
                "node_pods_without_tcp_migrate_req",
                "Pods whose network namespace could not be given net.ipv4.tcp_migrate_req=1 (a kernel before 5.14, or the write refused): there, an agent that stops beside another without --handover-socket resets the connections queued on its listeners",
                migrate_gauge.clone(),
            );
        }
        let shared = Arc::new(Shared {
            settings,
            own_netns,
            pods,
            departed,
            host: HostAddrs::default(),
            tasks: TaskTracker::new(),
            metrics: AgentMetrics {
                registry,
                pods: pods_gauge,
                without_migrate_req: migrate_gauge,
            },
            scans: Default::default(),
            next_seq: Default::default(),
            scanning: Arc::default(),
            paused: Mutex::default(),
            inherited: Mutex::new(offers),
            api_fd,
            api_stop: CancellationToken::new(),
        });
        let shutdown = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(api::serve(
            listener,
            shared.clone(),
            shared.api_stop.clone(),
            shutdown.clone(),
        ));
        shared.scan().await;
        // A guard listener whose pod could not be identified yet is served
        // by nobody here: the scan is tried again (bounded, well within the
        // old agent's wait for `adopted`) before the old agent is told to
        // stop accepting, else new connections would wait in the backlog.
        if adoption.from_old_agent() {
            let until = Instant::now() + ADOPT_RETRY;
            let pause = shared.settings.scan_interval.min(ADOPT_RETRY_PAUSE);
            while shared.unserved_guard_listeners() > 0 && Instant::now() < until {
                tokio::time::sleep(pause).await;
                shared.scan().await;
            }
            let left = shared.unserved_guard_listeners();
            if left > 0 {
                tracing::warn!(listeners = left, "hand-over: guard listeners whose pod's Envoy did not answer yet; they queue connections until it does");
            }
        }
        // Every listener received is served now (or waits for its pod's
        // next scan, queueing connections): the old agent may stop accepting.
        adoption.adopted().await;
        let handed_over = CancellationToken::new();
        if let Some(path) = shared.settings.guard.handover_socket.clone() {
            match handover::bind(&path) {
                Ok(sock) => {
                    let shared = shared.clone();
                    let stop = shutdown.clone();
                    let done = handed_over.clone();
                    tasks.spawn(async move {
                        if handover::serve(sock, &shared, stop).await {
                            shared.retire_after_handover();
                            done.cancel();
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e,
                    "cannot serve the hand-over socket: the next agent will bind for itself"),
            }
        }
        tasks.spawn(scan_loop(shared.clone(), shutdown.clone()));
        tracing::info!(listen = %local, proc_root = %shared.settings.proc_root.display(),
            pods = shared.pods.lock().map(|p| p.len()).unwrap_or(0), "node agent ready");
        Ok(Self {
            shared,
            local,
            shutdown,
            tasks,
            handed_over,
        })
    }

    /// Cancelled once this agent handed its listeners to a new one.
    pub fn handed_over(&self) -> CancellationToken {
        self.handed_over.clone()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn status(&self) -> NodeStatus {
        self.shared.status()
    }

    /// Pod tasks still running (listeners, report watchers): 0 with no pods.
    pub fn pod_tasks(&self) -> usize {
        self.shared.tasks.len()
    }

    /// Runs until SIGTERM (one message on `signals`). Drains in progress are
    /// waited for, up to their own deadline, so a pod's preStop is answered;
    /// a second SIGTERM stops at once.
    pub async fn run(self, mut signals: mpsc::UnboundedReceiver<()>) {
        if signals.recv().await.is_some() {
            let running: Vec<_> = self
                .shared
                .pods
                .lock()
                .map(|p| {
                    p.values()
                        .filter_map(|p| p.drain.running())
                        .filter(|d| {
                            let s = d.status();
                            s.phase != Phase::Serving && s.report.is_none()
                        })
                        .collect()
                })
                .unwrap_or_default();
            if !running.is_empty() {
                tracing::info!(
                    drains = running.len(),
                    "SIGTERM: waiting for drains in progress (again to stop now)"
                );
                let all = futures_util::future::join_all(running.iter().map(|d| d.report()));
                tokio::select! {
                    _ = all => {}
                    _ = signals.recv() => tracing::warn!("second SIGTERM: stopping now"),
                }
            }
            // A hand-over under way ends first (the rollout's SIGTERM can
            // come while the next agent is still being given the listeners):
            // stopping accepting before it serves them would leave new
            // connections in a backlog nobody accepts from.
            tokio::select! {
                _ = self.handover_settled() => {}
                _ = signals.recv() => tracing::warn!("second SIGTERM: stopping now"),
            }
        }
        self.stop().await;
    }

    /// Returns once no hand-over is under way: none began, the new agent
    /// adopted the listeners (this agent has retired them), or it went
    /// away (this agent resumed). Bounded by the conversation's own steps.
    async fn handover_settled(&self) {
        let under_way = || {
            !self.handed_over.is_cancelled()
                && self
                    .shared
                    .paused
                    .lock()
                    .map(|p| p.is_some())
                    .unwrap_or(false)
        };
        if !under_way() {
            return;
        }
        tracing::info!(
            "SIGTERM during a hand-over: waiting for the new agent to take the listeners"
        );
        // `take` and `done` steps, then the wait for `adopted` (handover.rs).
        let bound = handover::STEP_TIMEOUT * 14;
        let settled = async {
            while under_way() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(bound, settled).await.is_err() {
            tracing::warn!(?bound, "hand-over still under way; stopping anyway");
        }
    }

    /// Stops scanning and serving, and retires every pod.
    pub async fn stop(self) {
        // The preStop listeners stop accepting first and close (a preStop in
        // flight is still answered): with another agent bound beside this
        // one and tcp_migrate_req, what is queued on them moves there; the
        // requests accepted here are answered during the guards' window,
        // before the pods are retired.
        self.shared.stop_prestop_listeners();
        // Guarded streams end gracefully over the window (at once when a
        // hand-over already ended them), then everything stops.
        self.shared.end_guards(true).await;
        self.shutdown.cancel();
        self.shared.api_stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let pods = std::mem::take(&mut *self.shared.pods.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, pod) in pods {
            pod.retire();
        }
        self.shared.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.shared.tasks.wait()).await;
        tracing::info!("node agent stopped");
    }
}
