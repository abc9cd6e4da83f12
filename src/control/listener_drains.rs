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
    /// (changed or gone; empty: none, the update only added chains); None:
    /// every chain of the listener, or the chains could not be told (one
    /// unnamed).
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

/// What the watcher remembers of one listener from its last read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Known {
    /// Its active `last_updated`.
    updated: String,
    /// Its filter chains (name, config hash).
    chains: Vec<(String, u64)>,
    /// Its direction (a removed listener's is known only from here).
    direction: TrafficDirection,
}

/// The watcher's memory between two looks. Pure: no I/O, table-tested.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    /// The counters at the last look; `None` before the first.
    last: Option<ListenerManagerStats>,
    /// Each dynamic listener at the last read of the config.
    listeners: BTreeMap<String, Known>,
    /// The listeners have been read once (the baseline the next read is compared to).
    read: bool,
    /// The last look at which no counter had moved since the one before: a
    /// listener found removed later was removed (and began to drain) after it.
    quiet_at: Option<SystemTime>,
}

// === impl Tracker ===

impl Tracker {
    /// Whether this look needs the listeners' config: on the first look (the
    /// baseline), until a read worked, when an update, a removal or an
    /// addition happened since, and while a listener warms (its drain
    /// begins when it is in force, which moves no counter).
    pub fn needs_listeners(&self, now: &ListenerManagerStats) -> bool {
        match &self.last {
            None => true,
            Some(last) => {
                !self.read
                    || updates(last, now) != Begun::default()
                    || now.added != last.added
                    || now.warming > 0
                    || last.warming > 0
            }
        }
    }

    /// Takes one look at `at`: Envoy's counters and, when
    /// [`Tracker::needs_listeners`] said so and the read worked, its
    /// listeners. Returns the drains begun since the last look (counted, from
    /// the counters) and the listeners they are on (named, from the config).
    /// Without the listeners the counts wait for the next look. On the first
    /// look (or a new Envoy process) nothing is counted, but a listener
    /// still draining then is named: a shim that started during a push's
    /// drain still ends its streams.
    pub fn look(
        &mut self,
        now: ListenerManagerStats,
        listeners: Option<&[DynamicListenerState]>,
        at: SystemTime,
    ) -> (Begun, Vec<ListenerDrain>) {
        let fresh = match self.last {
            None => true,
            Some(last) => counters_went_back(&last, &now),
        };
        if fresh {
            self.last = Some(now);
            self.read = false;
            self.listeners.clear();
            self.quiet_at = Some(at);
            let Some(ls) = listeners else {
                return (Begun::default(), Vec::new());
            };
            let draining = ls
                .iter()
                .filter(|l| l.draining_version.is_some() && !l.last_updated.is_empty())
                .map(|l| drain_of(l, DrainKind::Listener, None))
                .collect();
            self.remember(ls);
            return (Begun::default(), draining);
        }
        let last = self.last.unwrap_or_default();
        let begun = updates(&last, &now);
        let quiet_before = self.quiet_at;
        if begun == Begun::default() {
            self.quiet_at = Some(at);
        }
        let Some(ls) = listeners else {
            if begun == Begun::default() {
                self.last = Some(now);
            }
            // Otherwise the old counters are kept: the next look counts and names these.
            return (Begun::default(), Vec::new());
        };
        let mut drains = Vec::new();
        if self.read {
            for l in ls {
                if l.last_updated.is_empty() {
                    continue; // only warming: nothing in force changed yet
                }
                let kind = if l.draining_version.is_some()
                    || (begun.filter_chains == 0 && begun.listeners > 0)
                {
                    DrainKind::Listener
                } else {
                    DrainKind::FilterChains
                };
                match self.listeners.get(&l.name) {
                    // Added since the last read, and already replaced.
                    None if l.draining_version.is_some() => {
                        drains.push(drain_of(l, DrainKind::Listener, None))
                    }
                    None => {}
                    Some(before) if before.updated == l.last_updated => {}
                    Some(before) => {
                        let chains = match kind {
                            DrainKind::Listener => None,
                            DrainKind::FilterChains => drained_chains(&before.chains, &l.chains),
                        };
                        drains.push(drain_of(l, kind, chains));
                    }
                }
            }
            for (gone, known) in self
                .listeners
                .iter()
                .filter(|(n, _)| !ls.iter().any(|l| &l.name == *n))
            {
                drains.push(ListenerDrain {
                    listener: gone.clone(),
                    kind: DrainKind::Listener,
                    direction: known.direction,
                    version: String::new(),
                    // Removed after the last quiet look: the earliest it can have begun.
                    started: quiet_before,
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
            .map(|l| {
                let known = Known {
                    updated: l.last_updated.clone(),
                    chains: l.chains.clone(),
                    direction: l.direction,
                };
                (l.name.clone(), known)
            })
            .collect();
        self.read = true;
    }
}

/// The drain of `l`, begun at its `last_updated`.
fn drain_of(
    l: &DynamicListenerState,
    kind: DrainKind,
    chains: Option<Vec<String>>,
) -> ListenerDrain {
    ListenerDrain {
        listener: l.name.clone(),
        kind,
        direction: l.direction,
        version: l.version.clone(),
        started: humantime::parse_rfc3339(&l.last_updated).ok(),
        removed: false,
        chains,
    }
}

/// The filter chains an in-place update drains: those of `before` whose
/// config is not among `after`'s (changed or gone), by name; empty when
/// none did (chains only added or reordered: Envoy drains nothing). None
/// when that cannot be told: a drained chain has no name.
fn drained_chains(before: &[(String, u64)], after: &[(String, u64)]) -> Option<Vec<String>> {
    let drained: Vec<&(String, u64)> = before.iter().filter(|c| !after.contains(c)).collect();
    if drained.iter().any(|(name, _)| name.is_empty()) {
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
            .envoy
            .listeners_draining
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
    let (begun, drains) = tracker.look(lm, listeners.as_deref(), SystemTime::now());
    for (kind, n) in [
        (ListenerDrainKind::listener, begun.listeners),
        (ListenerDrainKind::filter_chains, begun.filter_chains),
    ] {
        metrics
            .envoy
            .listener_drains
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
    let now = SystemTime::now();
    for d in drains {
        // An outbound listener carries the app's own calls out; an update
        // that only added chains drains nothing.
        if d.direction == TrafficDirection::Outbound || d.chains.as_ref().is_some_and(Vec::is_empty)
        {
            continue;
        }
        // Never in the future (a clock stepped back since Envoy's stamp).
        let started = d.started.unwrap_or(now - seen_within).min(now);
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

    /// The asks a guard got.
    #[derive(Default)]
    struct Asked(std::sync::Mutex<Vec<crate::drain::PushDrain>>);

    impl crate::drain::StreamGuard for Asked {
        fn goaway_all(&self) {}
        fn terminate_all(&self, _: Duration) {}
        fn end_config_push(&self, push: &crate::drain::PushDrain) {
            self.0.lock().unwrap().push(push.clone());
        }
        fn active_streams(&self) -> u64 {
            0
        }
        fn terminated_by_drain(&self) -> u64 {
            0
        }
        fn failed_total(&self) -> u64 {
            0
        }
    }

    #[test]
    fn the_guard_is_asked_for_inbound_drains_that_drain_something() {
        let drain = |direction, chains: Option<Vec<String>>| ListenerDrain {
            listener: "l".into(),
            kind: DrainKind::Listener,
            direction,
            version: String::new(),
            started: Some(SystemTime::now() + Duration::from_secs(3600)),
            removed: false,
            chains,
        };
        let asked = Asked::default();
        end_streams(
            &asked,
            &[
                drain(TrafficDirection::Outbound, None),
                drain(TrafficDirection::Inbound, Some(vec![])),
                drain(TrafficDirection::Inbound, Some(vec!["one".into()])),
                drain(TrafficDirection::Unspecified, None),
            ],
            Duration::from_secs(10),
            Duration::from_secs(1),
        );
        let asked = asked.0.into_inner().unwrap();
        assert_eq!(
            asked.len(),
            2,
            "not the outbound one, not the one draining no chain"
        );
        assert_eq!(asked[0].chains, Some(vec!["one".to_string()]));
        assert!(
            asked.iter().all(|a| a.started <= SystemTime::now()),
            "a start in the future is clamped to now"
        );
    }

    const AT: SystemTime = SystemTime::UNIX_EPOCH;
    const T0: &str = "2026-12-07T10:27:04.873Z";
    const T1: &str = "2026-12-07T10:27:07.629Z";

    #[test]
    fn the_first_look_is_a_baseline_that_still_names_a_drain_in_progress() {
        let mut t = Tracker::default();
        assert!(t.needs_listeners(&stats(3, 1, 0)));
        let (begun, drains) = t.look(
            stats(3, 1, 0),
            Some(&[state("in", T0, true), state("other", T0, false)]),
            AT,
        );
        assert_eq!(begun, Begun::default(), "nothing counted");
        // A shim that starts during a push's drain still ends its streams.
        assert_eq!(drains.len(), 1);
        assert_eq!(
            (drains[0].listener.as_str(), drains[0].kind),
            ("in", DrainKind::Listener)
        );
        assert!(!t.needs_listeners(&stats(3, 1, 0)));
    }

    #[test]
    fn a_failed_first_read_is_read_again_and_then_settles() {
        let mut t = Tracker::default();
        t.look(stats(0, 0, 0), None, AT);
        assert!(t.needs_listeners(&stats(0, 0, 0)), "until a read worked");
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false)]), AT);
        assert!(!t.needs_listeners(&stats(0, 0, 0)), "no read at every look");
        let (_, drains) = t.look(stats(1, 0, 0), Some(&[state("in", T1, true)]), AT);
        assert_eq!(drains.len(), 1);
    }

    #[test]
    fn a_listener_added_later_is_read_so_its_first_update_is_seen() {
        let mut t = Tracker::default();
        t.look(stats(0, 0, 0), Some(&[]), AT);
        let added = ListenerManagerStats {
            added: 1,
            ..stats(0, 0, 0)
        };
        assert!(t.needs_listeners(&added));
        t.look(added, Some(&[state("in", T0, false)]), AT);
        let pushed = ListenerManagerStats {
            added: 1,
            ..stats(1, 0, 0)
        };
        let (_, drains) = t.look(pushed, Some(&[state("in", T1, true)]), AT);
        assert_eq!(drains.len(), 1, "{drains:?}");
        // Added and replaced between two reads: named too.
        let mut u = Tracker::default();
        u.look(stats(0, 0, 0), Some(&[]), AT);
        let (_, drains) = u.look(pushed, Some(&[state("in", T1, true)]), AT);
        assert_eq!(drains.len(), 1, "{drains:?}");
    }

    #[test]
    fn a_warming_update_is_named_once_in_force() {
        let mut t = Tracker::default();
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false)]), AT);
        let warming = ListenerManagerStats {
            warming: 1,
            ..stats(1, 0, 0)
        };
        // Accepted, still warming: the active config has not changed.
        let (begun, drains) = t.look(warming, Some(&[state("in", T0, false)]), AT);
        assert_eq!(begun.listeners, 1);
        assert!(drains.is_empty());
        // Warm now: no counter moves, but the config is read again.
        let warm = stats(1, 0, 0);
        assert!(t.needs_listeners(&warm), "read once more after warming");
        let (begun, drains) = t.look(warm, Some(&[state("in", T1, true)]), AT);
        assert_eq!(begun, Begun::default());
        assert_eq!(drains.len(), 1, "named when in force");
        assert!(!t.needs_listeners(&warm));
    }

    #[test]
    fn a_removed_listener_keeps_its_direction_and_began_after_the_last_quiet_look() {
        let mut t = Tracker::default();
        let mut out = state("out", T0, false);
        out.direction = TrafficDirection::Outbound;
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false), out]), t0);
        let t1 = t0 + Duration::from_secs(5);
        t.look(stats(0, 0, 0), None, t1);
        let t2 = t1 + Duration::from_secs(5);
        let (_, drains) = t.look(stats(0, 0, 1), Some(&[state("in", T0, false)]), t2);
        assert_eq!(drains.len(), 1);
        assert_eq!(drains[0].direction, TrafficDirection::Outbound);
        assert_eq!(drains[0].started, Some(t1));
    }

    #[test]
    fn a_replaced_listener_is_a_listener_drain_with_its_start() {
        let mut t = Tracker::default();
        t.look(
            stats(0, 0, 0),
            Some(&[state("in", T0, false), state("out", T0, false)]),
            AT,
        );
        assert!(t.needs_listeners(&stats(1, 0, 0)));
        let (begun, drains) = t.look(
            stats(1, 0, 0),
            Some(&[state("in", T1, true), state("out", T0, false)]),
            AT,
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
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false)]), AT);
        let (begun, drains) = t.look(stats(1, 1, 0), Some(&[state("in", T1, false)]), AT);
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
            drained_chains(&before, &chains(&[("c", 3), ("a", 1), ("b", 2), ("d", 4)])),
            Some(vec![]),
            "only added and reordered: nothing drains"
        );
        let unnamed = chains(&[("", 1), ("b", 2)]);
        assert_eq!(
            drained_chains(&unnamed, &chains(&[("", 5), ("b", 2)])),
            None
        );
        let mut t = Tracker::default();
        let mut s0 = state("in", T0, false);
        s0.chains = chains(&[("one", 1), ("two", 2)]);
        t.look(stats(0, 0, 0), Some(&[s0]), AT);
        let mut s1 = state("in", T1, false);
        s1.chains = chains(&[("one", 7), ("two", 2)]);
        let (_, drains) = t.look(stats(1, 1, 0), Some(&[s1]), AT);
        assert_eq!(drains[0].chains, Some(vec!["one".to_string()]));
    }

    #[test]
    fn a_removed_listener_is_named_from_the_last_read() {
        let mut t = Tracker::default();
        t.look(
            stats(0, 0, 0),
            Some(&[state("in", T0, false), state("gone", T0, false)]),
            AT,
        );
        let (begun, drains) = t.look(stats(0, 0, 1), Some(&[state("in", T0, false)]), AT);
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
        t.look(stats(0, 0, 0), Some(&[state("in", T0, false)]), AT);
        assert_eq!(
            t.look(stats(1, 0, 0), None, AT),
            (Begun::default(), Vec::new())
        );
        assert!(t.needs_listeners(&stats(1, 0, 0)));
        let (begun, drains) = t.look(stats(1, 0, 0), Some(&[state("in", T1, true)]), AT);
        assert_eq!(begun.listeners, 1);
        assert_eq!(drains.len(), 1);
    }

    #[test]
    fn an_added_listener_and_a_new_envoy_count_nothing() {
        let mut t = Tracker::default();
        t.look(stats(2, 0, 0), Some(&[state("in", T0, false)]), AT);
        // Added: no update counter moves, nothing read.
        assert!(!t.needs_listeners(&stats(2, 0, 0)));
        // Counters fell: another Envoy process; a new baseline.
        let (begun, drains) = t.look(stats(0, 0, 0), Some(&[state("in", T1, false)]), AT);
        assert_eq!(begun, Begun::default());
        assert!(drains.is_empty());
        let (begun, _) = t.look(stats(1, 0, 0), Some(&[state("in", T1, false)]), AT);
        assert_eq!(begun.listeners, 1);
    }
}
