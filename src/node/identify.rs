//! The scan's identify step (`scan`): every pod's Envoy asked who it is
//! (`/server_info`, from inside the pod), the listener drains a config push
//! began looked at, and a missing preStop listener, guard or
//! `tcp_migrate_req` retried: outside the pods' lock, a few pods at a time.
//! What it found is then applied to each pod still there, under the lock:
//! its identity and timers, its guard, its listener, and the names of pods
//! that clash (`scan::disambiguate`).

use std::sync::Arc;

use futures_util::StreamExt;
use tokio::net::TcpListener;

use super::guard::{self, GuardSpec, PodGuardSlot};
use super::handover::ListenerKind;
use super::netns::Netns;
use super::pod::{GuardState, ListenerState, Pod};
use super::scan::{disambiguate, timers_note, TimersNote};
use super::shared::Shared;
use super::timers::PodTimers;
use crate::control::listener_drains::{self, Tracker};
use crate::control::recovery::ENVOY_DEFAULT_DRAIN_TIME;
use crate::drain::Phase;
use crate::envoy::{AdminClient, AdminError, ServerInfo};
use crate::metrics::Metrics;

/// Pods asked `/server_info` at once in each scan's recurring identify step.
/// Each ask is a fresh thread entering a pod's namespace: with guards
/// serving traffic on the same cores, bursts of 32 every scan showed as the
/// guards' p99 (bench node-scale --guards); 4 spreads the same work out.
const IDENTIFY_CONCURRENCY: usize = 4;

/// One pod's part of the identify step, taken under the pods' lock and done
/// outside it.
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
pub(super) struct Identified {
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

impl Shared {
    /// Every pod's identify step, `IDENTIFY_CONCURRENCY` at a time.
    pub(super) async fn identify_pods(self: &Arc<Self>) -> Vec<Identified> {
        futures_util::stream::iter(self.identify_work())
            .map(|w| self.identify(w))
            .buffer_unordered(IDENTIFY_CONCURRENCY)
            .collect()
            .await
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
                        admin: p.envoy.admin.clone(),
                        ns: p.netns.clone(),
                        needs_listener: !matches!(p.listener.state, ListenerState::Listening(_)),
                        // A guard starts on a pod that is not draining.
                        needs_guard: !matches!(p.guard.state, GuardState::Serving { .. })
                            && p.drain.status().phase == Phase::Serving,
                        // Once per pod, before its listeners are bound.
                        needs_migrate: migrate && p.tcp_migrate_req.is_none(),
                        tracker: p.listener_drains.clone(),
                        metrics: p.metrics.clone(),
                        pod: format!("{}/{}", p.labels.namespace, p.labels.pod),
                        pod_draining: p.drain.status().phase != Phase::Serving,
                        guard: p.guard.slot.clone(),
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
    pub(super) fn apply_identified(&self, results: Vec<Identified>) {
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
        self.metrics
            .without_migrate_req
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
                if p.guard.state != GuardState::Failed(msg.clone()) {
                    tracing::warn!(namespace = %p.labels.namespace, pod = %p.labels.pod,
                        error = %msg, "no stream guard for this pod");
                }
                p.guard.state = GuardState::Failed(msg);
            }
            None => {}
        }
        match info {
            Ok(info) => {
                p.envoy.state = Ok(info.state.clone());
                p.resolve(Some(&info));
                let timers = PodTimers::from_metadata(&info.node.metadata, &self.settings.budget);
                apply_timers(p, timers);
            }
            Err(e) => {
                p.envoy.state = Err(e.to_string());
                p.resolve(None);
            }
        }
        if let Some(l) = listener {
            let state = self.serve_pod(p, l);
            p.listener.state = state;
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
