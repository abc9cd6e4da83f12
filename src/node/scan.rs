//! The pod scan: every `--scan-interval`, what /proc shows (Envoy
//! processes grouped by network namespace) against the pods the agent
//! knows. The decisions (which pods are new, gone or kept, which names
//! clash, what a pod's timers say) are pure functions below; `Shared::scan`
//! does the I/O around them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures_util::StreamExt;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::guard::{self, GuardSpec, PodGuardSlot};
use super::handover::ListenerKind;
use super::metrics::PodLabels;
use super::netns::{self, Netns, NetnsDial};
use super::pod::{self, GuardState, ListenerState, Pod};
use super::proc;
use super::shared::{Departed, Shared, SCAN_CONCURRENCY};
use super::timers::{self, PodDrain, PodTimers};
use crate::control::listener_drains::{self, Tracker};
use crate::control::recovery::ENVOY_DEFAULT_DRAIN_TIME;
use crate::control::telemetry::Telemetry;
use crate::drain::{DrainSettings, Phase};
use crate::envoy::{AdminClient, AdminError, ServerInfo};
use crate::metrics::Metrics;

/// Pods asked `/server_info` at once in each scan's recurring identify step.
/// Each ask is a fresh thread entering a pod's namespace: with guards
/// serving traffic on the same cores, bursts of 32 every scan showed as the
/// guards' p99 (bench node-scale --guards); 4 spreads the same work out.
const IDENTIFY_CONCURRENCY: usize = 4;

/// One pod's part of a scan, taken under the pods' lock and done outside it.
struct Work {
    key: u64,
    admin: AdminClient,
    ns: Netns,
    needs_listener: bool,
    needs_guard: bool,
    needs_migrate: bool,
    /// The pod's listener-drain watch, given back after the look.
    tracker: Tracker,
    metrics: Metrics,
    /// `namespace/pod`, for the log events.
    pod: String,
    /// The pod's own drain runs: a push seen now is marked so.
    pod_draining: bool,
    /// The pod's guard, asked to end the streams a config push drains.
    guard: PodGuardSlot,
}

/// What one pod's identify step found, applied under the pods' lock.
struct Identified {
    key: u64,
    /// Its Envoy's `/server_info`: identity, state, node metadata (timers,
    /// the guard it asks for).
    info: Result<ServerInfo, AdminError>,
    /// A listener bound for a pod that had none; `None` when it had one.
    listener: Option<std::io::Result<TcpListener>>,
    /// The guard asked for, and its listener bound, or why not; `None`
    /// when the pod has one, drains, or asks for none.
    guard: Option<Result<(GuardSpec, std::io::Result<TcpListener>), String>>,
    /// `net.ipv4.tcp_migrate_req` set in the pod, once per pod.
    migrated: Option<Result<(), String>>,
    /// The listener-drain watch after the look; `None` when Envoy could
    /// not be asked (the pod keeps its own).
    tracker: Option<Tracker>,
}

/// A live pod as the scan's decisions see it.
#[derive(Clone, Debug)]
pub(super) struct Known {
    /// Its network namespace's inode: the pod's key.
    pub(super) netns: u64,
    /// The Envoy pids it was last seen with.
    pub(super) pids: Vec<i32>,
    /// Its drain is over (it has a report): nothing of the pod runs any more.
    pub(super) drained: bool,
}

/// What one scan does with the pods, from what /proc showed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Changes {
    /// Namespaces with an Envoy and no pod (any more): one pod set up for each.
    pub(super) add: Vec<proc::NetnsGroup>,
    /// Pods to retire, by netns: no Envoy is left in their namespace, or
    /// their drain is over and their Envoy was replaced (a container
    /// restart; the namespace is then set up again, in `add`).
    pub(super) retire: Vec<u64>,
    /// Pods kept, by netns, with the Envoy pids in their namespace now
    /// (a hot restart adds one, a restart mid-drain replaces them).
    pub(super) keep: BTreeMap<u64, Vec<i32>>,
}

/// The pods to add, retire and keep, given the Envoys found grouped by
/// network namespace (`groups`) and the pods `known`. Envoys in the node's
/// own namespace (`own_netns`) are hostNetwork, not pods.
pub(super) fn changes(
    mut groups: BTreeMap<u64, proc::NetnsGroup>,
    own_netns: u64,
    known: &[Known],
) -> Changes {
    groups.remove(&own_netns);
    let mut c = Changes::default();
    for k in known {
        let replaced =
            |g: &proc::NetnsGroup| k.drained && !g.pids.iter().any(|pid| k.pids.contains(pid));
        match groups.get(&k.netns) {
            Some(g) if !replaced(g) => {
                c.keep.insert(k.netns, g.pids.clone());
            }
            _ => c.retire.push(k.netns),
        }
    }
    c.add = groups
        .into_values()
        .filter(|g| !c.keep.contains_key(&g.netns))
        .collect();
    c
}

/// A live pod's name, as the disambiguation sees it.
#[derive(Clone, Debug)]
pub(super) struct Named {
    /// Discovery order: the pod found first keeps its name.
    pub(super) seq: u64,
    /// Its network namespace's inode: the pod's key, and the suffix.
    pub(super) netns: u64,
    /// The name its Envoy gave it.
    pub(super) labels: PodLabels,
}

/// Two namespaces claiming the same pod (a misconfigured metadata, or a
/// stale process) would export one label set twice: the pod found first
/// keeps the name, the other gets `@netns-<inode>`. Returns the pods to
/// rename, by netns, with their new labels.
pub(super) fn renames(pods: &[Named]) -> Vec<(u64, PodLabels)> {
    let mut order: Vec<&Named> = pods.iter().collect();
    order.sort_by_key(|p| p.seq);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in order {
        if !seen.insert(p.labels.clone()) {
            let labels = PodLabels {
                namespace: p.labels.namespace.clone(),
                pod: format!("{}@netns-{}", p.labels.pod, p.netns),
            };
            seen.insert(labels.clone());
            out.push((p.netns, labels));
        }
    }
    out
}

/// Renames the later of two pods claiming the same name (`renames`).
fn disambiguate(pods: &mut BTreeMap<u64, Pod>) {
    let named: Vec<Named> = pods
        .iter()
        .map(|(k, p)| Named {
            seq: p.seq,
            netns: *k,
            labels: p.labels.clone(),
        })
        .collect();
    for (netns, labels) in renames(&named) {
        let Some(p) = pods.get_mut(&netns) else {
            continue;
        };
        tracing::warn!(namespace = %p.labels.namespace, pod = %p.labels.pod, netns,
            "two network namespaces claim this pod; labelling the later one by its netns");
        p.labels = labels;
        if let Some(proxy) = &mut p.proxy {
            proxy.pod = p.labels.pod.clone();
        }
        if let Ok(mut name) = p.name.write() {
            *name = p.labels.clone();
        }
    }
}

/// What is said of a pod's drain timers when they change.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TimersNote {
    /// Its metadata's timers are refused: every rule broken and every
    /// message; the pod drains with the agent's.
    Refused {
        reasons: Vec<&'static str>,
        violations: String,
    },
    /// Its own timers, all valid, govern its drain.
    Own,
    /// It set none: the agent's apply, nothing to say.
    Agent,
}

/// The note for the timers a pod's metadata gave (`PodTimers::from_metadata`).
pub(super) fn timers_note(timers: &PodTimers) -> TimersNote {
    if !timers.problems.is_empty() {
        let violations: Vec<&str> = timers.problems.iter().map(|p| p.message.as_str()).collect();
        TimersNote::Refused {
            reasons: timers.reasons(),
            violations: violations.join("; "),
        }
    } else if timers.source == timers::Source::Pod {
        TimersNote::Own
    } else {
        TimersNote::Agent
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
    match timers_note(&timers) {
        TimersNote::Refused {
            reasons,
            violations,
        } => tracing::warn!(%namespace, pod = %name, ?reasons, %violations,
            "the pod's drain timers (node metadata) are invalid; it drains with the agent's"),
        TimersNote::Own => {
            let t = &timers.timers;
            tracing::info!(%namespace, pod = %name, deregistration_delay = ?t.deregistration_delay,
                min_drain_time = ?t.min_drain_time, drain_time = ?t.drain_time,
                parent_shutdown_time = ?t.parent_shutdown_time, poll_interval = ?t.poll_interval,
                termination_grace_period = ?timers.grace, "the pod's own drain timers (node metadata)");
        }
        TimersNote::Agent => {}
    }
}

pub(super) async fn scan_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
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
    pub(super) async fn scan(self: &Arc<Self>) {
        let _scanning = self.scanning.lock().await;
        self.refresh_host_addresses();
        let Some(groups) = self.envoys().await else {
            return;
        };
        let changes = self.retire_gone(groups);
        self.set_up_found(changes).await;
        let results: Vec<Identified> = futures_util::stream::iter(self.identify_work())
            .map(|w| self.identify(w))
            .buffer_unordered(IDENTIFY_CONCURRENCY)
            .collect()
            .await;
        self.apply_identified(results);
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The node's own addresses, which every pod listener's `/drain` rule
    /// reads (an interface may come or go).
    fn refresh_host_addresses(&self) {
        match netns::host_addresses() {
            Ok(addrs) => {
                if let Ok(mut h) = self.host.write() {
                    *h = addrs.into_iter().map(pod::host_net).collect();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the node's addresses"),
        }
    }

    /// The Envoy processes /proc shows, grouped by network namespace; `None`
    /// (logged) when /proc could not be read: the scan is skipped.
    async fn envoys(&self) -> Option<BTreeMap<u64, proc::NetnsGroup>> {
        let root = self.settings.proc_root.clone();
        let names = self.settings.process_names.clone();
        let scanned = tokio::task::spawn_blocking(move || proc::scan(&root, &names)).await;
        let procs = match scanned {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "scan failed");
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "scan task failed");
                return None;
            }
        };
        Some(proc::group(&procs))
    }

    /// Retires pods whose namespace has no Envoy left, and pods whose drain
    /// is over and whose Envoy was replaced (a container restart): their
    /// series stay for `--retention`. Returns what else the scan does.
    fn retire_gone(&self, groups: BTreeMap<u64, proc::NetnsGroup>) -> Changes {
        let (changes, gone) = {
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            let known: Vec<Known> = pods
                .iter()
                .map(|(k, p)| Known {
                    netns: *k,
                    pids: p.pids.clone(),
                    drained: p.drain.status().report.is_some(),
                })
                .collect();
            let changes = changes(groups, self.own_netns, &known);
            let gone: Vec<Pod> = changes
                .retire
                .iter()
                .filter_map(|k| pods.remove(k))
                .collect();
            (changes, gone)
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
        changes
    }

    /// Sets up the new pods concurrently (each setns is a short-lived
    /// thread) and gives the kept ones the Envoy pids seen now.
    async fn set_up_found(self: &Arc<Self>, changes: Changes) {
        let created: Vec<Pod> = futures_util::stream::iter(changes.add)
            .map(|g| self.new_pod(g))
            .buffer_unordered(SCAN_CONCURRENCY)
            .filter_map(|p| async move { p })
            .collect()
            .await;
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        // A new pod has the pids of its group (`new_pod`).
        for p in created {
            tracing::info!(namespace = %p.labels.namespace, pod = %p.labels.pod,
                netns = p.netns.inode(), pids = ?p.pids, listener = ?p.listener, "pod found");
            pods.insert(p.netns.inode(), p);
        }
        for (k, p) in pods.iter_mut() {
            if let Some(pids) = changes.keep.get(k) {
                p.pids = pids.clone();
            }
        }
        self.pods_gauge.set(pods.len() as i64);
    }

    /// Each pod's part of the identify step, taken under the pods' lock.
    fn identify_work(&self) -> Vec<Work> {
        let migrate = self.settings.guard.tcp_migrate_req;
        self.pods
            .lock()
            .map(|p| {
                p.iter()
                    .map(|(k, p)| Work {
                        key: *k,
                        admin: p.admin.clone(),
                        ns: p.netns.clone(),
                        needs_listener: !matches!(p.listener, ListenerState::Listening(_)),
                        // A guard starts on a pod that is not draining.
                        needs_guard: !matches!(p.guard_state, GuardState::Serving { .. })
                            && p.drain.status().phase == Phase::Serving,
                        // Once per pod, before its listeners are bound.
                        needs_migrate: migrate && p.tcp_migrate_req.is_none(),
                        tracker: p.listener_drains.clone(),
                        metrics: p.metrics.clone(),
                        pod: format!("{}/{}", p.labels.namespace, p.labels.pod),
                        pod_draining: p.drain.status().phase != Phase::Serving,
                        guard: p.guard.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One pod's identify step, outside the lock: its Envoy asked who it
    /// is, the listener drains a config push began looked at, and a
    /// missing listener or guard retried.
    async fn identify(self: &Arc<Self>, w: Work) -> Identified {
        let Work {
            key: k,
            admin,
            ns,
            needs_listener,
            needs_guard,
            needs_migrate,
            mut tracker,
            metrics,
            pod,
            pod_draining,
            guard: guard_slot,
        } = w;
        let port = self.settings.pod_listen_port;
        let migrated = match needs_migrate {
            true => Some(ns.enable_tcp_migrate_req().await),
            false => None,
        };
        let info = admin.server_info().await;
        // Listener drains a config push began (control::listener_drains).
        let tracker = match &info {
            Ok(i) => match admin.listener_manager().await {
                Ok(lm) => {
                    let drain_time = i.drain_time().unwrap_or(ENVOY_DEFAULT_DRAIN_TIME);
                    let drains = listener_drains::look(
                        &admin,
                        &mut tracker,
                        lm,
                        drain_time,
                        &metrics,
                        &pod,
                        pod_draining,
                    )
                    .await;
                    listener_drains::end_streams(
                        &guard_slot,
                        &drains,
                        drain_time,
                        self.settings.scan_interval,
                    );
                    Some(tracker)
                }
                Err(_) => None,
            },
            Err(_) => None,
        };
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
                    Ok(Some(spec)) => Some(Ok((spec, self.guard_listener(&ns, spec).await))),
                    Ok(None) => None,
                    Err(e) => Some(Err(format!("node metadata {}: {e}", guard::METADATA_KEY))),
                }
            }
            _ => None,
        };
        Identified {
            key: k,
            info,
            listener,
            guard,
            migrated,
            tracker,
        }
    }

    /// Applies what the identify step found to each pod still there, then
    /// the names (`disambiguate`), the gauge of pods without
    /// tcp_migrate_req, and the handed-over listeners of pods that are gone.
    fn apply_identified(&self, results: Vec<Identified>) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        for r in results {
            let Some(p) = pods.get_mut(&r.key) else {
                continue;
            };
            self.apply(p, r);
        }
        disambiguate(&mut pods);
        let without = pods
            .values()
            .filter(|p| matches!(p.tcp_migrate_req, Some(Err(_))))
            .count();
        self.migrate_gauge
            .set(i64::try_from(without).unwrap_or(i64::MAX));
        // Listeners handed over for pods that are gone are closed (the pod
        // is gone, nobody connects there any more).
        if let Ok(mut offers) = self.inherited.lock() {
            offers.retain(|o| o.kind == ListenerKind::Api || pods.contains_key(&o.netns));
        }
    }

    /// One pod's identify step applied: its listener-drain watch, the
    /// tcp_migrate_req outcome, its guard, its Envoy's identity and timers,
    /// its listener.
    fn apply(&self, p: &mut Pod, r: Identified) {
        let Identified {
            key: _,
            info,
            listener,
            guard,
            migrated,
            tracker,
        } = r;
        if let Some(t) = tracker {
            p.listener_drains = t;
        }
        if let Some(r) = migrated {
            if let Err(e) = &r {
                tracing::warn!(namespace = %p.labels.namespace, pod = %p.labels.pod, error = %e,
                    "net.ipv4.tcp_migrate_req is not set in this pod: an agent that stops beside \
                     another without --handover-socket resets the connections queued on its listeners");
            }
            p.tcp_migrate_req = Some(r);
        }
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
                let timers = PodTimers::from_metadata(&info.node.metadata, &self.settings.budget);
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
            tcp_migrate_req: None,
            listener_drains: Tracker::default(),
            cancel,
            name,
        };
        pod.resolve(None);
        Some(pod)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Budget;
    use serde_json::{Map, Value};

    /// The node's own namespace in these tests.
    const OWN: u64 = 1;

    fn groups(found: &[(u64, &[i32])]) -> BTreeMap<u64, proc::NetnsGroup> {
        found
            .iter()
            .map(|(netns, pids)| {
                let g = proc::NetnsGroup {
                    netns: *netns,
                    pids: pids.to_vec(),
                };
                (*netns, g)
            })
            .collect()
    }

    fn known(netns: u64, pids: &[i32], drained: bool) -> Known {
        Known {
            netns,
            pids: pids.to_vec(),
            drained,
        }
    }

    fn labels(namespace: &str, pod: &str) -> PodLabels {
        PodLabels {
            namespace: namespace.into(),
            pod: pod.into(),
        }
    }

    fn named(seq: u64, netns: u64, namespace: &str, pod: &str) -> Named {
        Named {
            seq,
            netns,
            labels: labels(namespace, pod),
        }
    }

    #[test]
    fn a_new_namespace_is_a_new_pod_and_the_nodes_own_is_not() {
        let c = changes(
            groups(&[(OWN, &[5]), (10, &[100]), (20, &[200, 201])]),
            OWN,
            &[known(10, &[100], false)],
        );
        assert_eq!(
            c.add,
            vec![proc::NetnsGroup {
                netns: 20,
                pids: vec![200, 201],
            }]
        );
        assert_eq!(c.retire, Vec::<u64>::new());
        assert_eq!(c.keep, BTreeMap::from([(10, vec![100])]));
    }

    #[test]
    fn a_pod_whose_namespace_has_no_envoy_left_is_retired() {
        let c = changes(
            groups(&[(10, &[100])]),
            OWN,
            &[known(10, &[100], false), known(20, &[200], false)],
        );
        assert_eq!(c.retire, vec![20]);
        assert_eq!(c.add, vec![]);
        assert_eq!(c.keep, BTreeMap::from([(10, vec![100])]));
    }

    #[test]
    fn a_pod_whose_envoy_restarted_mid_life_is_kept_with_the_new_pid() {
        // Same namespace, new pid, the drain not over: the same pod.
        let c = changes(groups(&[(10, &[150])]), OWN, &[known(10, &[100], false)]);
        assert_eq!(c.keep, BTreeMap::from([(10, vec![150])]));
        assert_eq!((c.add, c.retire), (vec![], vec![]));
        // A hot restart: the old pid and the new one, the drain over.
        let c = changes(
            groups(&[(10, &[100, 150])]),
            OWN,
            &[known(10, &[100], true)],
        );
        assert_eq!(c.keep, BTreeMap::from([(10, vec![100, 150])]));
        assert_eq!((c.add, c.retire), (vec![], vec![]));
    }

    #[test]
    fn a_drained_pod_whose_envoy_was_replaced_is_retired_and_set_up_again() {
        // Its drain is over and no pid it knew is left: a container restart,
        // a new pod in the same namespace.
        let c = changes(groups(&[(10, &[150])]), OWN, &[known(10, &[100], true)]);
        assert_eq!(c.retire, vec![10]);
        assert_eq!(
            c.add,
            vec![proc::NetnsGroup {
                netns: 10,
                pids: vec![150],
            }]
        );
        assert!(c.keep.is_empty(), "{c:?}");
    }

    #[test]
    fn two_pods_of_one_name_the_later_found_is_renamed_by_its_netns() {
        // Keyed by netns, found in another order: the first found (seq 0)
        // keeps the name, whatever its inode.
        let pods = [
            named(1, 10, "shop", "cart"),
            named(0, 30, "shop", "cart"),
            named(2, 20, "shop", "web"),
            named(3, 40, "other", "cart"),
        ];
        assert_eq!(renames(&pods), vec![(10, labels("shop", "cart@netns-10"))]);
        // Distinct names: nothing renamed.
        assert_eq!(renames(&pods[2..]), vec![]);
    }

    #[test]
    fn three_pods_of_one_name_each_later_one_gets_its_own_suffix() {
        let pods = [
            named(0, 10, "shop", "cart"),
            named(1, 20, "shop", "cart"),
            named(2, 30, "shop", "cart"),
        ];
        assert_eq!(
            renames(&pods),
            vec![
                (20, labels("shop", "cart@netns-20")),
                (30, labels("shop", "cart@netns-30")),
            ]
        );
    }

    fn meta(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect()
    }

    #[test]
    fn a_pod_whose_timers_are_invalid_is_named_and_drains_with_the_agents() {
        let budget = Budget::default();
        let timers = PodTimers::from_metadata(
            &meta(&[
                ("DRAINSHIM_DRAIN_TIME", "10s"),
                ("DRAINSHIM_PARENT_SHUTDOWN_TIME", "10s"),
            ]),
            &budget,
        );
        assert_eq!(timers.timers, budget.timers);
        let TimersNote::Refused {
            reasons,
            violations,
        } = timers_note(&timers)
        else {
            panic!("refused: {timers:?}");
        };
        assert_eq!(reasons, vec!["drain_time_not_below_parent_shutdown_time"]);
        assert!(
            violations.starts_with(
                "DRAINSHIM_DRAIN_TIME (10s) must be less than DRAINSHIM_PARENT_SHUTDOWN_TIME (10s)"
            ),
            "{violations}"
        );
    }

    #[test]
    fn a_pods_valid_timers_are_its_own_and_none_set_are_the_agents() {
        let budget = Budget::default();
        let own = PodTimers::from_metadata(
            &meta(&[
                ("DRAINSHIM_DRAIN_TIME", "20s"),
                ("DRAINSHIM_PARENT_SHUTDOWN_TIME", "30s"),
            ]),
            &budget,
        );
        assert_eq!(timers_note(&own), TimersNote::Own);
        let none = PodTimers::from_metadata(&Map::new(), &budget);
        assert_eq!(timers_note(&none), TimersNote::Agent);
    }
}
