//! Listener drains that are not the pod's: Envoy drains a listener it
//! replaces or removes through LDS (a config push), over `--drain-time-s`,
//! then closes every connection left on it. No GOAWAY goes out first
//! (envoyproxy/envoy #14350, #35085), so every long stream on it is cut.
//!
//! The Envoy watcher (`recovery`) reads, in the `/stats` call it already
//! makes, Envoy's `listener_manager` counters of updates
//! (`listener_modified`, `listener_in_place_updated`, `listener_removed`)
//! and its gauges of what drains now (`total_listeners_draining`,
//! `total_filter_chains_draining`). The counters never miss an update,
//! however short the drain; only when they move is
//! `/config_dump?resource=dynamic_listeners` read, to name the listeners
//! whose config changed since the last look (their `last_updated` moved) or
//! that are gone. The pod's own drain (`/drain_listeners?graceful`) moves
//! none of these (measured, Envoy 1.36 to 1.40), so it is never counted
//! here; a push during the pod's drain is, and says so.
//!
//! | what changed | Envoy | kind |
//! |---|---|---|
//! | listener-level fields (address options, stat prefix, ...) | the listener is replaced; the old one drains (`draining_state`) | `listener` |
//! | filter chains only | in-place update; the changed or removed chains drain | `filter_chains` |
//! | the listener removed | it drains, then closes | `listener` |
//!
//! The drain window runs from the listener's `last_updated` (when Envoy
//! took the new config) for `--drain-time-s` (from `/server_info`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;

use crate::envoy::{AdminClient, DynamicListenerState, ListenerManagerStats};
use crate::metrics::{ListenerDrainKind, ListenerDrainLabels, Metrics};

/// What drains after a config update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainKind {
    /// A whole listener, replaced or removed.
    Listener,
    /// Some filter chains of a listener updated in place.
    FilterChains,
}

// === impl DrainKind ===

impl DrainKind {
    /// The metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainKind::Listener => "listener",
            DrainKind::FilterChains => "filter_chains",
        }
    }
}

/// One listener drain a config update began, as the log event names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerDrain {
    pub listener: String,
    pub kind: DrainKind,
    pub direction: TrafficDirection,
    /// The new config's `version_info` (empty for file-based LDS).
    pub version: String,
    /// When the drain began, Envoy's `last_updated`; `None` for a removed
    /// listener (then: between the last two looks) or an unreadable time.
    pub started: Option<SystemTime>,
    /// The listener is gone from Envoy's config, not replaced.
    pub removed: bool,
    /// For an in-place update, the names of the filter chains that drain
    /// (changed or gone); None: every chain of the listener, or the chains
    /// could not be told (one unnamed, or no chain seen to change).
    pub chains: Option<Vec<String>>,
}

/// Drains begun since the last look, by kind, from Envoy's counters: exact
/// even when the drain ended between two looks or the listener cannot be
/// named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Begun {
    pub listeners: u64,
    pub filter_chains: u64,
}

/// The watcher's memory between two looks. Pure: no I/O, table-tested.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    /// The counters at the last look; `None` before the first.
    last: Option<ListenerManagerStats>,
    /// Each dynamic listener's `last_updated` and filter chains (name,
    /// config hash) at the last read of the config.
    listeners: BTreeMap<String, (String, Vec<(String, u64)>)>,
    /// The listeners have been read once (the baseline the next read is compared to).
    read: bool,
}

// === impl Tracker ===

impl Tracker {
    /// Whether this look needs the listeners' config: on the first look (the
    /// baseline), when an update happened since, or when the last read failed.
    pub fn needs_listeners(&self, now: &ListenerManagerStats) -> bool {
        match &self.last {
            None => true,
            Some(last) => !self.read || updates(last, now) != Begun::default(),
        }
    }

    /// Takes one look: Envoy's counters and, when [`Tracker::needs_listeners`]
    /// said so and the read worked, its listeners. Returns the drains begun
    /// since the last look (counted) and the listeners they are on (named).
    /// Without the listeners the counts wait for the next look.
    pub fn look(
        &mut self,
        now: ListenerManagerStats,
        listeners: Option<&[DynamicListenerState]>,
    ) -> (Begun, Vec<ListenerDrain>) {
        let Some(last) = self.last else {
            // The first look: what drains already began before it is not ours to count.
            self.last = Some(now);
            if let Some(ls) = listeners {
                self.remember(ls);
            }
            return (Begun::default(), Vec::new());
        };
        if counters_went_back(&last, &now) {
            // A new Envoy process: start over from what it has now.
            self.last = Some(now);
            self.read = false;
            self.listeners.clear();
            if let Some(ls) = listeners {
                self.remember(ls);
            }
            return (Begun::default(), Vec::new());
        }
        let begun = updates(&last, &now);
        if begun == Begun::default() {
            self.last = Some(now);
            return (begun, Vec::new());
        }
        let Some(ls) = listeners else {
            // Keep the old counters: the next look counts and names these.
            return (Begun::default(), Vec::new());
        };
        let mut drains = Vec::new();
        if self.read {
            for l in ls {
                let Some((before, chains_before)) = self.listeners.get(&l.name) else {
                    continue; // added: nothing drains
                };
                if *before == l.last_updated || l.last_updated.is_empty() {
                    continue;
                }
                let kind = if l.draining_version.is_some() || begun.filter_chains == 0 {
                    DrainKind::Listener
                } else {
                    DrainKind::FilterChains
                };
                let chains = match kind {
                    DrainKind::Listener => None,
                    DrainKind::FilterChains => drained_chains(chains_before, &l.chains),
                };
                drains.push(ListenerDrain {
                    listener: l.name.clone(),
                    kind,
                    direction: l.direction,
                    version: l.version.clone(),
                    started: humantime::parse_rfc3339(&l.last_updated).ok(),
                    removed: false,
                    chains,
                });
            }
            for gone in self
                .listeners
                .keys()
                .filter(|n| !ls.iter().any(|l| &l.name == *n))
            {
                drains.push(ListenerDrain {
                    listener: gone.clone(),
                    kind: DrainKind::Listener,
                    direction: TrafficDirection::Unspecified,
                    version: String::new(),
                    started: None,
                    removed: true,
                    chains: None,
                });
            }
        }
        self.last = Some(now);
        self.remember(ls);
        (begun, drains)
    }

    fn remember(&mut self, ls: &[DynamicListenerState]) {
        self.listeners = ls
            .iter()
            .map(|l| (l.name.clone(), (l.last_updated.clone(), l.chains.clone())))
            .collect();
        self.read = true;
    }
}

/// The filter chains an in-place update drains: those of `before` whose
/// config is not among `after`'s (changed or gone), by name. None when
/// that cannot be told: a drained chain has no name, or none changed.
fn drained_chains(before: &[(String, u64)], after: &[(String, u64)]) -> Option<Vec<String>> {
    let drained: Vec<&(String, u64)> = before.iter().filter(|c| !after.contains(c)).collect();
    if drained.is_empty() || drained.iter().any(|(name, _)| name.is_empty()) {
        return None;
    }
    Some(drained.into_iter().map(|(name, _)| name.clone()).collect())
}

/// Drains begun between two readings of the counters. `listener_modified`
/// counts in-place updates too; those drain filter chains, the rest drain
/// whole listeners, as removals do.
fn updates(last: &ListenerManagerStats, now: &ListenerManagerStats) -> Begun {
    let modified = now.modified.saturating_sub(last.modified);
    let in_place = now.in_place_updated.saturating_sub(last.in_place_updated);
    let removed = now.removed.saturating_sub(last.removed);
    Begun {
        listeners: modified.saturating_sub(in_place) + removed,
        filter_chains: in_place,
    }
}

/// Counters only grow within one Envoy process.
fn counters_went_back(last: &ListenerManagerStats, now: &ListenerManagerStats) -> bool {
    now.modified < last.modified
        || now.in_place_updated < last.in_place_updated
        || now.removed < last.removed
}

/// When a drain begun at `started` ends: Envoy closes what is left then.
pub fn drain_ends(started: SystemTime, drain_time: Duration) -> SystemTime {
    started + drain_time
}

/// One look for listener drains a config update began: counts them, logs each with its window, and mirrors
/// Envoy's gauges. `pod_draining` marks a push that came during the pod's
/// own drain. Reads the listeners' config only when an update happened.
pub async fn look(
    admin: &AdminClient,
    tracker: &mut Tracker,
    lm: ListenerManagerStats,
    drain_time: Duration,
    metrics: &Metrics,
    pod: &str,
    pod_draining: bool,
) -> Vec<ListenerDrain> {
    let gauge = |kind, value: u64| {
        metrics
            .envoy_listeners_draining
            .get_or_create(&ListenerDrainLabels { kind })
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    };
    gauge(ListenerDrainKind::listener, lm.listeners_draining);
    gauge(ListenerDrainKind::filter_chains, lm.filter_chains_draining);
    let listeners = if tracker.needs_listeners(&lm) {
        match admin.dynamic_listener_states().await {
            Ok(ls) => Some(ls),
            Err(e) => {
                tracing::warn!(%pod, error = %e,
                    "envoy updated its listeners but their config could not be read; looking again next interval");
                None
            }
        }
    } else {
        None
    };
    let (begun, drains) = tracker.look(lm, listeners.as_deref());
    for (kind, n) in [
        (ListenerDrainKind::listener, begun.listeners),
        (ListenerDrainKind::filter_chains, begun.filter_chains),
    ] {
        metrics
            .envoy_listener_drains
            .get_or_create(&ListenerDrainLabels { kind })
            .inc_by(n);
    }
    for d in &drains {
        let started = d
            .started
            .map(|t| humantime::format_rfc3339_millis(t).to_string())
            .unwrap_or_default();
        let ends = d
            .started
            .map(|t| humantime::format_rfc3339_millis(drain_ends(t, drain_time)).to_string())
            .unwrap_or_default();
        tracing::warn!(
            %pod,
            listener = %d.listener,
            kind = d.kind.as_str(),
            direction = d.direction.as_str_name(),
            version = %d.version,
            removed = d.removed,
            drain_started = %started,
            drain_ends = %ends,
            drain_time_seconds = drain_time.as_secs_f64(),
            during_pod_drain = pod_draining,
            chains = ?d.chains,
            "envoy drains a listener after a config update (not the pod's drain): \
             connections still on it are closed when the drain time ends"
        );
    }
    if begun != Begun::default() && drains.is_empty() {
        tracing::warn!(%pod, listeners = begun.listeners, filter_chains = begun.filter_chains,
            drain_time_seconds = drain_time.as_secs_f64(), during_pod_drain = pod_draining,
            "envoy drains listeners after a config update; which ones could not be told");
    }
    drains
}

/// Asks `guard` to end the streams each of `drains` reaches before Envoy
/// closes them: every drain of a listener that is not outbound (an
/// outbound listener's connections are the app's own calls out, which the
/// guard never carries). `seen_within` is how late a drain may be seen.
/// A removed listener's start is not known: now, less `seen_within`.
pub fn end_streams(
    guard: &dyn crate::drain::StreamGuard,
    drains: &[ListenerDrain],
    drain_time: Duration,
    seen_within: Duration,
) {
    for d in drains {
        if d.direction == TrafficDirection::Outbound {
            continue;
        }
        let started = d.started.unwrap_or_else(|| SystemTime::now() - seen_within);
        guard.end_config_push(&crate::drain::PushDrain {
            listener: d.listener.clone(),
            started,
            drain_time,
            chains: d.chains.clone(),
            seen_within,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(modified: u64, in_place: u64, removed: u64) -> ListenerManagerStats {
        ListenerManagerStats {
            modified,
            in_place_updated: in_place,
            removed,
            ..ListenerManagerStats::default()
        }
    }

    fn state(name: &str, updated: &str, draining: bool) -> DynamicListenerState {
        DynamicListenerState {
            name: name.into(),
            direction: TrafficDirection::Inbound,
            version: String::new(),
            last_updated: updated.into(),
            draining_version: draining.then(String::new),
            chains: vec![("fc".into(), 1)],
        }
    }

    const T0: &str = "2026-12-07T10:27:04.873Z";
    const T1: &str = "2026-12-07T10:27:07.629Z";

    #[test]
    fn the_first_look_is_a_baseline() {
        let mut t = Tracker::default();
        assert!(t.needs_listeners(&stats(3, 1, 0)));
        let (begun, drains) = t.look(stats(3, 1, 0), Some(&[state("in", T0, true)]));
        assert_eq!(begun, Begun::default());
        assert!(drains.is_empty());
        assert!(!t.needs_listeners(&stats(3, 1, 0)));
    }

    #[test]
    fn a_replaced_listener_is_a_listener_drain_with_its_start() {
        let mut t = Tracker::default();
        t.look(
            stats(0, 0, 0),
            Some(&[state("in", T0, false), state("out", T0, false)]),
        );
        assert!(t.needs_listeners(&stats(1, 0, 0)));
        let (begun, drains) = t.look(
            stats(1, 0, 0),
            Some(&[state("in", T1, true), state("out", T0, false)]),
        );
        assert_eq!(
            begun,
            Begun {
                listeners: 1,
                filter_chains: 0
            }
        );
        assert_eq!(drains.len(), 1);
        assert_eq!(drains[0].listener, "in");
        assert_eq!(drains[0].kind, DrainKind::Listener);
        let started = drains[0].started.expect("a start");
        assert_eq!(humantime::format_rfc3339_millis(started).to_string(), T1);
    }

    #[test]
    fn an_in_place_update_drains_filter_chains() {
        let mut t = Tracker::default();
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false)]));
        let (begun, drains) = t.look(stats(1, 1, 0), Some(&[state("in", T1, false)]));
        assert_eq!(
            begun,
            Begun {
                listeners: 0,
                filter_chains: 1
            }
        );
        assert_eq!(drains[0].kind, DrainKind::FilterChains);
    }

    #[test]
    fn an_in_place_update_names_the_chains_that_changed_or_went() {
        let chains = |cs: &[(&str, u64)]| -> Vec<(String, u64)> {
            cs.iter().map(|(n, h)| (n.to_string(), *h)).collect()
        };
        let before = chains(&[("a", 1), ("b", 2), ("c", 3)]);
        assert_eq!(
            drained_chains(&before, &chains(&[("a", 1), ("b", 9)])),
            Some(vec!["b".to_string(), "c".to_string()])
        );
        assert_eq!(
            drained_chains(&before, &before),
            None,
            "none changed: cannot tell"
        );
        let unnamed = chains(&[("", 1), ("b", 2)]);
        assert_eq!(
            drained_chains(&unnamed, &chains(&[("", 5), ("b", 2)])),
            None
        );
        let mut t = Tracker::default();
        let mut s0 = state("in", T0, false);
        s0.chains = chains(&[("one", 1), ("two", 2)]);
        t.look(stats(0, 0, 0), Some(&[s0]));
        let mut s1 = state("in", T1, false);
        s1.chains = chains(&[("one", 7), ("two", 2)]);
        let (_, drains) = t.look(stats(1, 1, 0), Some(&[s1]));
        assert_eq!(drains[0].chains, Some(vec!["one".to_string()]));
    }

    #[test]
    fn a_removed_listener_is_named_from_the_last_read() {
        let mut t = Tracker::default();
        t.look(
            stats(0, 0, 0),
            Some(&[state("in", T0, false), state("gone", T0, false)]),
        );
        let (begun, drains) = t.look(stats(0, 0, 1), Some(&[state("in", T0, false)]));
        assert_eq!(
            begun,
            Begun {
                listeners: 1,
                filter_chains: 0
            }
        );
        assert_eq!(drains.len(), 1);
        assert!(drains[0].removed);
        assert_eq!(drains[0].listener, "gone");
    }

    #[test]
    fn an_unread_config_waits_for_the_next_look() {
        let mut t = Tracker::default();
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false)]));
        assert_eq!(t.look(stats(1, 0, 0), None), (Begun::default(), Vec::new()));
        assert!(t.needs_listeners(&stats(1, 0, 0)));
        let (begun, drains) = t.look(stats(1, 0, 0), Some(&[state("in", T1, true)]));
        assert_eq!(begun.listeners, 1);
        assert_eq!(drains.len(), 1);
    }

    #[test]
    fn an_added_listener_and_a_new_envoy_count_nothing() {
        let mut t = Tracker::default();
        t.look(stats(2, 0, 0), Some(&[state("in", T0, false)]));
        // Added: no update counter moves, nothing read.
        assert!(!t.needs_listeners(&stats(2, 0, 0)));
        // Counters fell: another Envoy process; a new baseline.
        let (begun, drains) = t.look(stats(0, 0, 0), Some(&[state("in", T1, false)]));
        assert_eq!(begun, Begun::default());
        assert!(drains.is_empty());
        let (begun, _) = t.look(stats(1, 0, 0), Some(&[state("in", T1, false)]));
        assert_eq!(begun.listeners, 1);
    }
}
