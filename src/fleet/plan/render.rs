//! The plan as a table, and how times and durations are written.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use super::{Edge, Plan, State, Verdict};
use crate::fleet::table;

/// Formats Unix seconds as RFC 3339, to the second.
pub fn when(t: f64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

pub(super) fn span(secs: f64) -> String {
    human(Duration::from_secs(secs.max(0.0).round() as u64))
}

/// A duration as days, hours, minutes and seconds ("90d", "1d2h"), never
/// in months as humantime would.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let parts = [
        (s / 86_400, "d"),
        (s / 3600 % 24, "h"),
        (s / 60 % 60, "m"),
        (s % 60, "s"),
    ];
    let out: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    if out.is_empty() {
        "0s".into()
    } else {
        out.join("")
    }
}

pub(super) fn edge_text(e: Edge) -> String {
    match e {
        Edge::At(t) => when(t),
        Edge::BeforeHistory(t) => format!("before {} (the history's start)", when(t)),
    }
}

/// The plan as a table, the next action below it.
pub fn render(plan: &Plan, next_only: bool) -> String {
    let mut out = String::new();
    if !next_only {
        let rows: Vec<Vec<String>> = plan
            .rows
            .iter()
            .map(|r| {
                let state = match r.state {
                    State::NotStarted => "not started",
                    State::InProgress => "in progress",
                    State::Stalled => "STALLED",
                    State::Done => "done",
                    State::Verified => "done, verified",
                };
                let gate = match (&r.verify, r.gate.ok) {
                    (Some(v), _) if r.state != State::NotStarted => v.detail.clone(),
                    (_, Some(true)) if matches!(r.state, State::Done | State::Verified) => {
                        "-".into()
                    }
                    _ => r.gate.detail.clone(),
                };
                let rollback = match r.rollback.possible {
                    Some(true) => format!("possible: {}", r.rollback.how),
                    Some(false) => r.rollback.how.clone(),
                    None => "-".into(),
                };
                vec![
                    r.step.to_string(),
                    r.what.clone(),
                    r.tier.clone().unwrap_or_else(|| "-".into()),
                    format!("{state}: {}", r.detail),
                    gate,
                    rollback,
                ]
            })
            .collect();
        out.push_str(&table(
            &["STEP", "WHAT", "TIER", "STATE", "GATE", "ROLLBACK"],
            &rows,
        ));
        if !plan.untiered.is_empty() {
            let _ = writeln!(
                out,
                "\nnamespaces no tier names (they move without a gate): {}",
                plan.untiered.join(", ")
            );
        }
    }
    let _ = writeln!(out, "\nnext: {}", plan.next.action);
    if let Some(t) = plan.next.not_before {
        if t > plan.at + 1.0 {
            let _ = writeln!(out, "not before: {}", when(t));
        }
    }
    for c in &plan.next.commands {
        let _ = writeln!(out, "  {c}");
    }
    if let Some(e) = &plan.estimate {
        let _ = writeln!(
            out,
            "\nestimate: {} left ({} waves left at {} each, {} measured)",
            span(e.remaining_seconds),
            e.waves_left,
            span(e.wave_seconds),
            if e.waves_measured == 0 {
                "none yet: assumed".to_string()
            } else {
                e.waves_measured.to_string()
            }
        );
        for (what, secs) in &e.parts {
            let _ = writeln!(out, "  {what}: {}", span(*secs));
        }
        let _ = writeln!(
            out,
            "  (a migration planned by hand takes six to ten weeks)"
        );
    }
    let _ = writeln!(
        out,
        "plan: {}",
        match plan.verdict {
            Verdict::Go => "GO, the next step may start",
            Verdict::Done => "DONE",
            Verdict::Wait => "WAIT, nothing may start yet",
            Verdict::Stop => "STOP, a gate failed",
        }
    );
    out
}
