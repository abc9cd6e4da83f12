//! `drainshim node`: the DaemonSet agent. One process per node reaches every
//! pod's Envoy by entering the pod's network namespace. It is a different way
//! of reaching Envoy, not a second implementation: each pod gets the same
//! drain driver, report, telemetry and metrics as a sidecar.
//!
//! Every `--scan-interval` the agent:
//! - lists Envoy processes in `--proc-root` and groups them by network
//!   namespace (one namespace = one pod; the node's own is skipped);
//! - for a new pod: pins its namespace fd, plants the preStop listener
//!   inside it (`--pod-listen-port`), starts its drain driver;
//! - asks each pod's Envoy `/server_info` (from inside the pod, on
//!   `127.0.0.1:--pod-admin-port`) for version and identity;
//! - retires pods whose namespace has no Envoy any more: listener closed,
//!   tasks cancelled, namespace fd released; their drain counters stay on
//!   `/metrics` for `--pod-retention` so the last drain is scraped.
//!
//! - reads the pod's own drain timers from the same node metadata
//!   (`DRAINSHIM_DRAIN_TIME`, ...; `timers`): valid ones govern its drain,
//!   invalid ones are named (log, `/status`, metric) and the agent's apply;
//! - for a pod that opts in (Envoy node metadata `DRAINSHIM_GUARD`, or
//!   `--guard`): binds its stream guard inside the pod and serves it; the
//!   pod's drain ends the guarded streams gracefully (`guard`).
//!
//! With `--handover-socket`, the agent takes every listener from the agent
//! it replaces and hands them to the one replacing it (`handover`).
//!
//! The agent's own endpoints are in `api`; a pod's listener in `pod`.

pub mod api;
pub mod guard;
pub mod handover;
pub mod metrics;
pub mod netns;
pub mod pod;
pub mod proc;
pub mod timers;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::guard::{GuardSpec, NetnsConnect, PodGuard, PodGuardSlot};
use self::handover::{Kind, Offer};
use self::metrics::{PodCollector, PodLabels, PodSeries, PodSource, TimersCollector, TimersSource};
use self::netns::{Netns, NetnsDial};
use self::pod::{GuardState, HostAddrs, ListenerState, Pod, PodEndpoint, PodStatus};
use self::timers::{PodDrain, PodTimers};
use crate::drain::{DrainSettings, Phase, StreamGuard};
use crate::envoy::AdminClient;
use crate::metrics::Metrics;
pub use crate::settings::NodeSettings;
use crate::telemetry::Telemetry;
use std::os::fd::{AsFd, OwnedFd};

/// New pods set up and identified at once per scan; bounds threads in flight.
const SCAN_CONCURRENCY: usize = 32;
/// Pods asked `/server_info` at once in each scan's recurring identify step.
/// Each ask is a fresh thread entering a pod's namespace: with guards
/// serving traffic on the same cores, bursts of 32 every scan showed as the
/// guards' p99 (bench node-scale --guards); 4 spreads the same work out.
const IDENTIFY_CONCURRENCY: usize = 4;
/// After the guards' window: time for the last endings to flush and the
/// connections to close before what is left is ended at once.
const GUARD_STOP_SLACK: Duration = Duration::from_secs(5);
/// How long a new agent scans again for pods whose guard listener it was
/// handed but could not serve yet (their Envoy did not answer), before it
/// answers `adopted`: well within the old agent's wait for that answer.
const ADOPT_RETRY: Duration = Duration::from_secs(20);
/// Pause between those scans (the scan interval if shorter).
const ADOPT_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// A listening socket received from the old agent, served here.
fn adopt(fd: OwnedFd) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::from(fd);
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

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
        let mut offers: Vec<Offer> = dup(Kind::Api, self.own_netns, self.api_fd.as_ref())
            .into_iter()
            .collect();
        if let Ok(pods) = self.pods.lock() {
            for (k, p) in pods.iter() {
                offers.extend(dup(Kind::Prestop, *k, p.listener_fd.as_ref()));
                offers.extend(dup(Kind::Guard, *k, p.guard_fd.as_ref()));
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

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot read this process's network namespace ({0}): is /proc mounted?")]
    OwnNetns(proc::ProcError),
    #[error("cannot enter network namespaces: {0}. drainshim node needs CAP_SYS_ADMIN (setns); see --help")]
    NoPrivilege(String),
    #[error("{0}")]
    Proc(#[from] proc::ProcError),
}

/// A departed pod whose counters are still shown.
struct Departed {
    /// Its last series, with `live` false.
    series: PodSeries,
    /// When they stop being exported.
    until: Instant,
}

/// State shared by the scanner, the API and the pod listeners.
struct Shared {
    /// Validated flags.
    settings: NodeSettings,
    /// The node's own namespace: Envoys in it are hostNetwork, not pods.
    own_netns: u64,
    /// Live pods by namespace inode. A std mutex, never held across an await.
    pods: Arc<Mutex<BTreeMap<u64, Pod>>>,
    /// Pods gone, kept for the retention period.
    departed: Arc<Mutex<Vec<Departed>>>,
    /// The node's addresses, for the pod listeners' access check.
    host: HostAddrs,
    /// Every pod task (listeners, report watchers): none outlives its pod.
    tasks: TaskTracker,
    /// The agent's metrics: per-pod series plus a few of its own.
    registry: Registry,
    /// Pods managed (`drainshim_node_pods`).
    pods_gauge: prometheus_client::metrics::gauge::Gauge,
    /// Scans done, for /readyz and /status.
    scans: std::sync::atomic::AtomicU64,
    /// Numbers pods in discovery order.
    next_seq: std::sync::atomic::AtomicU64,
    /// Held by each scan, and for good by a hand-over: the old agent takes
    /// on no pod once it has listed its listeners.
    scanning: Arc<tokio::sync::Mutex<()>>,
    /// The scan lock while a hand-over is under way.
    paused: Mutex<Option<tokio::sync::OwnedMutexGuard<()>>>,
    /// Listeners from the old agent not claimed yet by a pod.
    inherited: Mutex<Vec<Offer>>,
    /// The agent's own listener, kept to hand over.
    api_fd: Option<OwnedFd>,
    /// Stops the agent's API listener alone.
    api_stop: CancellationToken,
}

/// The running agent.
pub struct NodeAgent {
    /// What the scanner, the API and the pod listeners share.
    shared: Arc<Shared>,
    /// The bound `--listen` address.
    local: SocketAddr,
    /// Stops the scanner, the API and every pod.
    shutdown: CancellationToken,
    /// The scanner and the API server.
    tasks: TaskTracker,
    /// Cancelled once the listeners went to a new agent.
    handed_over: CancellationToken,
}

/// `GET /status` on the agent.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    /// Live pods, each with its listener, Envoy and drain status.
    pub pods: Vec<PodStatus>,
    /// Departed pods whose counters are still exported.
    pub departed: Vec<PodLabels>,
    /// Allowed to drain, besides loopback.
    pub host_addresses: Vec<String>,
    /// Scans done since start: a stuck scanner shows here.
    pub scans: u64,
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
        let listener = match handover::claim(&mut offers, Kind::Api, own_netns)
            .filter(|o| o.addr == listen || listen.port() == 0)
            .and_then(|o| adopt(o.fd).ok())
        {
            Some(l) => l,
            None => TcpListener::bind(listen)
                .await
                .map_err(|source| NodeError::Bind {
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
        {
            let r = registry.sub_registry_with_prefix("drainshim");
            r.register_collector(Box::new(PodCollector { source }));
            r.register_collector(Box::new(TimersCollector { source: refused }));
            r.register(
                "node_pods",
                "Pods (network namespaces with an Envoy) the node agent manages",
                pods_gauge.clone(),
            );
        }
        let shared = Arc::new(Shared {
            settings,
            own_netns,
            pods,
            departed,
            host: HostAddrs::default(),
            tasks: TaskTracker::new(),
            registry,
            pods_gauge,
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

/// Two namespaces claiming the same pod (a misconfigured metadata, or a
/// stale process) would export one label set twice: the pod found first
/// keeps the name, the other gets `@netns-<inode>`.
fn disambiguate(pods: &mut BTreeMap<u64, Pod>) {
    let mut order: Vec<&mut Pod> = pods.values_mut().collect();
    order.sort_by_key(|p| p.seq);
    let mut seen = std::collections::BTreeSet::new();
    for p in order {
        if !seen.insert(p.labels.clone()) {
            let inode = p.netns.inode();
            tracing::warn!(namespace = %p.labels.namespace, pod = %p.labels.pod, netns = inode,
                "two network namespaces claim this pod; labelling the later one by its netns");
            p.labels.pod = format!("{}@netns-{inode}", p.labels.pod);
            if let Some(proxy) = &mut p.proxy {
                proxy.pod = p.labels.pod.clone();
            }
            if let Ok(mut name) = p.name.write() {
                *name = p.labels.clone();
            }
            seen.insert(p.labels.clone());
        }
    }
}

/// Gives `pod`'s drain the timers its metadata asks for, unless it has
/// started. Said once per change (each scan reads the same metadata): one
/// warn line naming every violation when they are refused, one info line
/// when the pod's own apply.
fn apply_timers(pod: &Pod, timers: PodTimers) {
    let (namespace, name) = (&pod.labels.namespace, &pod.labels.pod);
    // A drain that started keeps the timers it started with.
    if !pod.drain.set_timers(timers.clone()) {
        return;
    }
    if !timers.problems.is_empty() {
        let violations: Vec<&str> = timers.problems.iter().map(|p| p.message.as_str()).collect();
        let reasons: Vec<&str> = timers.problems.iter().map(|p| p.reason).collect();
        tracing::warn!(%namespace, pod = %name, ?reasons,
            violations = %violations.join("; "),
            "the pod's drain timers (node metadata) are invalid; it drains with the agent's");
    } else if timers.source == timers::Source::Pod {
        let t = &timers.timers;
        tracing::info!(%namespace, pod = %name, deregistration_delay = ?t.deregistration_delay,
            min_drain_time = ?t.min_drain_time, drain_time = ?t.drain_time,
            parent_shutdown_time = ?t.parent_shutdown_time, poll_interval = ?t.poll_interval,
            termination_grace_period = ?timers.grace, "the pod's own drain timers (node metadata)");
    }
}

async fn scan_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(shared.settings.scan_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first scan ran in start()
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // A scan waits for good once a hand-over holds the scan lock:
            // raced, so shutdown still ends the loop.
            _ = tick.tick() => tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = shared.scan() => {}
            },
        }
    }
}

impl Shared {
    /// One scan: host addresses, processes, pods in and out, identities,
    /// listeners still missing, retention.
    async fn scan(self: &Arc<Self>) {
        let _scanning = self.scanning.lock().await;
        match netns::host_addresses() {
            Ok(addrs) => {
                if let Ok(mut h) = self.host.write() {
                    *h = addrs.into_iter().map(pod::host_net).collect();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the node's addresses"),
        }
        let root = self.settings.proc_root.clone();
        let names = self.settings.process_names.clone();
        let scanned = tokio::task::spawn_blocking(move || proc::scan(&root, &names)).await;
        let procs = match scanned {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "scan failed");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "scan task failed");
                return;
            }
        };
        let mut groups = proc::group(&procs);
        groups.remove(&self.own_netns);

        // Retire pods whose namespace has no Envoy left, and pods whose drain
        // is over and whose Envoy was replaced (a container restart).
        let gone: Vec<Pod> = {
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<u64> = pods
                .iter()
                .filter(|(k, p)| match groups.get(k) {
                    None => true,
                    Some(g) => {
                        p.drain.status().report.is_some()
                            && !g.pids.iter().any(|pid| p.pids.contains(pid))
                    }
                })
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter().filter_map(|k| pods.remove(&k)).collect()
        };
        let now = Instant::now();
        for pod in gone {
            tracing::info!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
                netns = pod.netns.inode(), "pod gone: listener closed, tasks cancelled");
            let series = pod.retire();
            if let Ok(mut d) = self.departed.lock() {
                d.push(Departed {
                    series,
                    until: now + self.settings.retention,
                });
            }
        }
        if let Ok(mut d) = self.departed.lock() {
            d.retain(|d| d.until > now);
        }

        // New pods, set up concurrently (each setns is a short-lived thread).
        let known: Vec<u64> = self
            .pods
            .lock()
            .map(|p| p.keys().copied().collect())
            .unwrap_or_default();
        let fresh: Vec<proc::NetnsGroup> = groups
            .values()
            .filter(|g| !known.contains(&g.netns))
            .cloned()
            .collect();
        let created: Vec<Pod> = futures_util::stream::iter(fresh)
            .map(|g| self.new_pod(g))
            .buffer_unordered(SCAN_CONCURRENCY)
            .filter_map(|p| async move { p })
            .collect()
            .await;
        {
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            for mut p in created {
                if let Some(g) = groups.get(&p.netns.inode()) {
                    p.pids = g.pids.clone();
                }
                tracing::info!(namespace = %p.labels.namespace, pod = %p.labels.pod,
                    netns = p.netns.inode(), pids = ?p.pids, listener = ?p.listener, "pod found");
                pods.insert(p.netns.inode(), p);
            }
            for (k, p) in pods.iter_mut() {
                if let Some(g) = groups.get(k) {
                    p.pids = g.pids.clone();
                }
            }
            self.pods_gauge.set(pods.len() as i64);
        }

        // Identify every pod and retry missing listeners and guards, concurrently.
        let work: Vec<(u64, AdminClient, Netns, bool, bool)> = self
            .pods
            .lock()
            .map(|p| {
                p.iter()
                    .map(|(k, p)| {
                        let needs_listener = !matches!(p.listener, ListenerState::Listening(_));
                        // A guard starts on a pod that is not draining.
                        let needs_guard = !matches!(p.guard_state, GuardState::Serving { .. })
                            && p.drain.status().phase == Phase::Serving;
                        (
                            *k,
                            p.admin.clone(),
                            p.netns.clone(),
                            needs_listener,
                            needs_guard,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let port = self.settings.pod_listen_port;
        let results: Vec<_> = futures_util::stream::iter(work)
            .map(|(k, admin, ns, needs_listener, needs_guard)| async move {
                let info = admin.server_info().await;
                let listener = match needs_listener {
                    true => Some(self.pod_listener(&ns, port).await),
                    false => None,
                };
                let guard = match (&info, needs_guard) {
                    (Ok(info), true) => {
                        let asked = guard::spec_for(
                            info.metadata_str(guard::METADATA_KEY),
                            self.settings.guard.default,
                        );
                        match asked {
                            Ok(Some(spec)) => {
                                Some(Ok((spec, self.guard_listener(&ns, spec).await)))
                            }
                            Ok(None) => None,
                            Err(e) => {
                                Some(Err(format!("node metadata {}: {e}", guard::METADATA_KEY)))
                            }
                        }
                    }
                    _ => None,
                };
                (k, info, listener, guard)
            })
            .buffer_unordered(IDENTIFY_CONCURRENCY)
            .collect()
            .await;
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        for (k, info, listener, guard) in results {
            let Some(p) = pods.get_mut(&k) else { continue };
            match guard {
                Some(Ok((spec, bound))) => self.start_guard(p, spec, bound),
                Some(Err(msg)) => {
                    if p.guard_state != GuardState::Failed(msg.clone()) {
                        tracing::warn!(namespace = %p.labels.namespace, pod = %p.labels.pod,
                            error = %msg, "no stream guard for this pod");
                    }
                    p.guard_state = GuardState::Failed(msg);
                }
                None => {}
            }
            match info {
                Ok(info) => {
                    p.envoy_state = Ok(info.state.clone());
                    p.resolve(Some(&info));
                    let timers =
                        PodTimers::from_metadata(&info.node.metadata, &self.settings.budget);
                    apply_timers(p, timers);
                }
                Err(e) => {
                    p.envoy_state = Err(e.to_string());
                    p.resolve(None);
                }
            }
            if let Some(l) = listener {
                let state = self.serve_pod(p, l);
                p.listener = state;
            }
        }
        disambiguate(&mut pods);
        // Listeners handed over for pods that are gone are closed (the pod
        // is gone, nobody connects there any more).
        if let Ok(mut offers) = self.inherited.lock() {
            offers.retain(|o| o.kind == Kind::Api || pods.contains_key(&o.netns));
        }
        drop(pods);
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Pins the namespace, builds the admin client, telemetry and drain
    /// driver. The listener is planted by the caller's identify step.
    async fn new_pod(self: &Arc<Self>, g: proc::NetnsGroup) -> Option<Pod> {
        let s = &self.settings;
        // Any pid of the group will do; try them in order, they may exit meanwhile.
        let mut opened = None;
        for pid in &g.pids {
            let path = s.proc_root.join(pid.to_string()).join("ns/net");
            match Netns::open(&path, g.netns) {
                Ok(ns) => {
                    opened = Some((*pid, ns));
                    break;
                }
                Err(e) => tracing::debug!(error = %e, "cannot pin a pod's netns"),
            }
        }
        let Some((pid, netns)) = opened else {
            tracing::warn!(netns = g.netns, pids = ?g.pids,
                "cannot open the network namespace of an Envoy: is CAP_SYS_PTRACE granted?");
            return None;
        };
        let proc_identity = {
            let root = s.proc_root.clone();
            tokio::task::spawn_blocking(move || proc::identity(&root, pid))
                .await
                .unwrap_or_default()
        };
        let dial = Arc::new(NetnsDial {
            netns: netns.clone(),
            connect_timeout: s.budget.admin_timeout,
        });
        let admin = match AdminClient::with_dial(
            &format!("http://127.0.0.1:{}", s.pod_admin_port),
            s.budget.admin_timeout,
            dial,
        ) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "building the pod admin client");
                return None;
            }
        };
        let metrics = Metrics::new();
        let guard = PodGuardSlot::default();
        // The agent's timers until the pod's Envoy says otherwise.
        let drain = PodDrain::new(
            DrainSettings {
                timers: s.budget.timers,
                admin: admin.clone(),
                guard: Some(Arc::new(guard.clone())),
            },
            PodTimers::agent(&s.budget),
            metrics.clone(),
        );
        let telemetry = Arc::new(Telemetry::new(
            admin.clone(),
            (proc_identity.namespace.clone(), proc_identity.name.clone()),
            s.proc_root.join(pid.to_string()).join("net"),
            metrics.clone(),
        ));
        let cancel = CancellationToken::new();
        let name = Arc::new(RwLock::new(PodLabels::default()));
        pod::watch_report(&self.tasks, drain.clone(), name.clone(), cancel.clone());
        let mut pod = Pod {
            seq: self
                .next_seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            netns,
            pids: g.pids.clone(),
            proc_identity,
            labels: PodLabels::default(),
            proxy: None,
            envoy_state: Err("not asked yet".into()),
            admin,
            drain,
            metrics,
            telemetry,
            listener: ListenerState::Failed("not bound yet".into()),
            listener_fd: None,
            listener_stop: cancel.child_token(),
            guard,
            guard_state: GuardState::Off,
            guard_fd: None,
            cancel,
            name,
        };
        pod.resolve(None);
        Some(pod)
    }

    /// Serves a freshly bound listener for `pod`, or records why binding failed.
    fn serve_pod(&self, pod: &mut Pod, bound: std::io::Result<TcpListener>) -> ListenerState {
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                let msg = format!(
                    "bind port {} inside the pod: {e}",
                    self.settings.pod_listen_port
                );
                if pod.listener != ListenerState::Failed(msg.clone()) {
                    tracing::warn!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
                        error = %msg, "no preStop listener for this pod (retrying each scan)");
                }
                return ListenerState::Failed(msg);
            }
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => return ListenerState::Failed(format!("listener address: {e}")),
        };
        pod.listener_fd = listener.as_fd().try_clone_to_owned().ok();
        let endpoint = Arc::new(PodEndpoint {
            drain: pod.drain.clone(),
            host: self.host.clone(),
            name: pod.name.clone(),
        });
        self.tasks.spawn(crate::control::serve_fn_until(
            listener,
            pod.listener_stop.clone(),
            pod.cancel.clone(),
            move |peer, req| {
                let endpoint = endpoint.clone();
                async move { endpoint.handle(peer, req).await }
            },
        ));
        ListenerState::Listening(addr)
    }

    /// The pod's preStop listener: the one handed over, else a new one.
    async fn pod_listener(&self, ns: &Netns, port: u16) -> std::io::Result<TcpListener> {
        let offered = self
            .inherited
            .lock()
            .ok()
            .and_then(|mut o| handover::claim(&mut o, Kind::Prestop, ns.inode()));
        match offered.filter(|o| o.addr.port() == port) {
            Some(o) => adopt(o.fd),
            None => ns.listen(port).await,
        }
    }

    /// The pod's guard listener: the one handed over, else a new one.
    async fn guard_listener(&self, ns: &Netns, spec: GuardSpec) -> std::io::Result<TcpListener> {
        let offered = self
            .inherited
            .lock()
            .ok()
            .and_then(|mut o| handover::claim(&mut o, Kind::Guard, ns.inode()));
        match offered.filter(|o| o.addr == spec.listen) {
            Some(o) => adopt(o.fd),
            None => guard::bind_in(ns, spec.listen).await,
        }
    }

    /// Serves `pod`'s guard on a freshly bound (or inherited) listener, or
    /// records why it could not be bound.
    fn start_guard(&self, pod: &mut Pod, spec: GuardSpec, bound: std::io::Result<TcpListener>) {
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("bind {} inside the pod: {e}", spec.listen);
                if pod.guard_state != GuardState::Failed(msg.clone()) {
                    tracing::warn!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
                        error = %msg, "no stream guard for this pod (retrying each scan)");
                }
                pod.guard_state = GuardState::Failed(msg);
                return;
            }
        };
        let mut config = self.settings.guard.template.clone();
        config.upstream = spec.upstream;
        let connector = NetnsConnect {
            netns: pod.netns.clone(),
            timeout: config.limits.upstream_connect_timeout,
        };
        let g = crate::guard::Guard::with_connector(
            config,
            pod.metrics.clone(),
            Some(Arc::new(connector)),
        );
        let accepting = pod.cancel.child_token();
        let shutdown = pod.cancel.child_token();
        pod.guard_fd = listener.as_fd().try_clone_to_owned().ok();
        let serving = g.clone();
        let (a, sd) = (accepting.clone(), shutdown.clone());
        self.tasks
            .spawn(async move { serving.serve_until(listener, a, sd).await });
        pod.guard.set(PodGuard {
            spec,
            guard: g,
            accepting,
            shutdown,
        });
        tracing::info!(namespace = %pod.labels.namespace, pod = %pod.labels.pod,
            guard = %spec, "stream guard serving inside the pod");
        pod.guard_state = GuardState::Serving {
            listen: spec.listen,
            upstream: spec.upstream,
        };
    }

    /// After a hand-over: stop accepting everywhere (the new agent does),
    /// and end the guarded streams still carried here over the window.
    fn retire_after_handover(self: &Arc<Self>) {
        self.api_stop.cancel();
        let guards: Vec<PodGuard> = self
            .pods
            .lock()
            .map(|p| {
                p.values()
                    .inspect(|p| {
                        // A preStop in flight here is answered here.
                        if p.drain.status().phase == Phase::Serving {
                            p.listener_stop.cancel();
                        }
                    })
                    .filter_map(|p| p.guard.get())
                    .collect()
            })
            .unwrap_or_default();
        let streams: u64 = guards.iter().map(|g| g.guard.active_streams()).sum();
        tracing::info!(guards = guards.len(), streams,
            window = ?self.settings.guard.handover_window,
            "handed over: accepting nothing more; ending the streams still here gracefully over the window");
        let window = self.settings.guard.handover_window;
        for g in &guards {
            g.accepting.cancel();
            g.guard.goaway_all();
            g.guard.hand_off(window);
        }
        // The new agent holds the listening sockets now.
        self.close_guard_listeners();
    }

    /// Ends every pod's guarded streams gracefully over the hand-over window
    /// (already begun after a hand-over) and waits, bounded, until no
    /// connection is left; then stops the guards.
    async fn end_guards(&self, stop_accepting: bool) {
        let guards: Vec<PodGuard> = self
            .pods
            .lock()
            .map(|p| p.values().filter_map(|p| p.guard.get()).collect())
            .unwrap_or_default();
        if guards.is_empty() {
            return;
        }
        let window = self.settings.guard.handover_window;
        let mut stopped = false;
        for g in &guards {
            if stop_accepting && !g.accepting.is_cancelled() {
                g.accepting.cancel();
                g.guard.goaway_all();
                g.guard.hand_off(window);
                stopped = true;
            }
        }
        if stopped {
            // Nobody took the listeners: close them, so new connections are
            // refused (the shipped bootstrap then sends the calls to the app)
            // instead of queueing where nobody accepts them.
            self.close_guard_listeners();
        }
        // The window, plus what one ending and the close may take.
        let bound = window + GUARD_STOP_SLACK;
        let all_closed = async {
            loop {
                if guards.iter().all(|g| g.guard.active_connections() == 0) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(bound, all_closed).await.is_err() {
            tracing::warn!(
                ?bound,
                "guard connections still open after the window; ending what is left now"
            );
        }
        for g in &guards {
            g.shutdown.cancel();
        }
    }

    /// Guard listeners handed over for a live pod that is not identified
    /// yet: nobody here accepts on them until a scan identifies the pod.
    fn unserved_guard_listeners(&self) -> usize {
        let pods = match self.pods.lock() {
            Ok(p) => p,
            Err(_) => return 0,
        };
        self.inherited
            .lock()
            .map(|offers| {
                offers
                    .iter()
                    .filter(|o| o.kind == Kind::Guard)
                    .filter(|o| pods.get(&o.netns).is_some_and(|p| p.envoy_state.is_err()))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Drops this process's last descriptors of the guard listeners (the
    /// accept loops drop theirs once they stop accepting). Kept for a
    /// hand-over until then; afterwards the listening socket lives on in the
    /// next agent, or, with no next agent, closes, and new connections are
    /// refused instead of left in a backlog nobody accepts from.
    fn close_guard_listeners(&self) {
        if let Ok(mut pods) = self.pods.lock() {
            for p in pods.values_mut() {
                p.guard_fd = None;
            }
        }
        if let Ok(mut offers) = self.inherited.lock() {
            offers.retain(|o| o.kind != Kind::Guard);
        }
    }

    fn status(&self) -> NodeStatus {
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
        }
    }

    /// The pod with these labels, for the agent API.
    fn find(&self, namespace: &str, name: &str) -> Option<(PodDrain, PodStatus)> {
        let pods = self.pods.lock().ok()?;
        pods.values()
            .find(|p| p.labels.namespace == namespace && p.labels.pod == name)
            .map(|p| (p.drain.clone(), p.status()))
    }

    /// Telemetry of every live pod, refreshed concurrently.
    async fn refresh_telemetry(&self) {
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

impl From<crate::node::NodeError> for crate::error::Error {
    fn from(e: crate::node::NodeError) -> Self {
        use crate::error::Error;
        match e {
            crate::node::NodeError::NoPrivilege(_) => Error::NoPermission(e.to_string()),
            e => Error::Unavailable(e.to_string()),
        }
    }
}
