//! The pod scan: every `--scan-interval`, what /proc shows (Envoy
//! processes grouped by network namespace) against the pods the agent
//! knows. The decisions (which pods are new, gone or kept, which names
//! clash, what a pod's timers say) are pure functions below; `Shared::scan`
//! does the I/O around them, in steps, the identify step in `identify`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::guard::PodGuardSlot;
use super::metrics::PodLabels;
use super::netns::{self, Netns, NetnsDial};
use super::pod::{self, GuardBinding, GuardState, ListenerState, Pod, PodEnvoy, PreStopListener};
use super::proc;
use super::shared::{Departed, Shared, SCAN_CONCURRENCY};
use super::timers::{self, PodDrain, PodTimers};
use crate::control::listener_drains::Tracker;
use crate::control::telemetry::Telemetry;
use crate::drain::DrainSettings;
use crate::envoy::AdminClient;
use crate::metrics::Metrics;

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
pub(super) fn disambiguate(pods: &mut BTreeMap<u64, Pod>) {
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
    } else if timers.source == timers::TimerSource::Pod {
        TimersNote::Own
    } else {
        TimersNote::Agent
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
        let found = self.identify_pods().await;
        self.apply_identified(found);
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
                    pids: p.envoy.pids.clone(),
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
                netns = p.netns.inode(), pids = ?p.envoy.pids, listener = ?p.listener.state, "pod found");
            pods.insert(p.netns.inode(), p);
        }
        for (k, p) in pods.iter_mut() {
            if let Some(pids) = changes.keep.get(k) {
                p.envoy.pids = pids.clone();
            }
        }
        self.metrics.pods.set(pods.len() as i64);
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
            proc_identity,
            labels: PodLabels::default(),
            proxy: None,
            envoy: PodEnvoy {
                pids: g.pids.clone(),
                admin,
                state: Err("not asked yet".into()),
            },
            drain,
            metrics,
            telemetry,
            listener: PreStopListener {
                state: ListenerState::Failed("not bound yet".into()),
                fd: None,
                stop: cancel.child_token(),
            },
            guard: GuardBinding {
                slot: guard,
                state: GuardState::Off,
                fd: None,
            },
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
