//! The drain-timers table (`plan --explain timers`), and the step's words.

use std::fmt::Write as _;

use super::{flag, ServiceTimers, TimerFit, TimersReport};
use crate::fleet::table;

fn opt(v: Option<f64>, none: &str) -> String {
    v.map_or_else(|| none.to_string(), flag)
}

/// The p99, or past the largest bucket (at least that).
fn p99(s: &ServiceTimers) -> String {
    match (s.calls.p99, s.calls.p99_over) {
        (Some(p), _) => flag(p),
        (None, Some(o)) => format!(">{}", flag(o)),
        _ => "-".into(),
    }
}

/// One service as the table's cells.
fn cells(s: &ServiceTimers) -> Vec<String> {
    let calls = match (s.calls.max, s.calls.over) {
        (Some(m), _) => format!("{} / {}", p99(s), flag(m)),
        (None, Some(o)) => format!("{} / >{}", p99(s), flag(o)),
        _ => "-".into(),
    };
    let streams = if s.streams == 0 {
        "-".into()
    } else {
        format!("{} <= {}", s.streams, opt(s.longest_stream, "unbounded"))
    };
    let current = s.current.as_ref().map_or("-".into(), |c| {
        format!(
            "{}/{}/{}{}",
            flag(c.deregistration_delay),
            flag(c.drain_time),
            flag(c.parent_shutdown_time),
            c.termination_grace_period
                .map_or(String::new(), |g| format!("/{}", flag(g)))
        )
    });
    let rec = s.recommended.as_ref().map_or("-".into(), |r| {
        format!(
            "{}/{} (grace >{})",
            flag(r.drain_time),
            flag(r.parent_shutdown_time),
            flag(r.termination_grace_period_above)
        )
    });
    let verdict = match s.verdict {
        TimerFit::Ok => "ok",
        TimerFit::Short => "SHORT",
        TimerFit::NoTraffic => "no traffic",
        TimerFit::Unknown => "unknown",
        TimerFit::Gone => "gone",
    };
    vec![
        s.namespace.clone(),
        s.service.clone(),
        s.pods.to_string(),
        calls,
        streams,
        opt(s.max_age.filter(|a| *a > 0.0), "none"),
        current,
        rec,
        verdict.into(),
    ]
}

/// The table, then each short service's fix.
pub fn render(report: &TimersReport) -> String {
    let rows: Vec<Vec<String>> = report.services.iter().map(cells).collect();
    let mut out = format!(
        "drain timers over the {} before {}\n",
        flag(report.window_seconds),
        crate::fleet::plan::when(report.at)
    );
    out.push_str(&table(
        &[
            "NAMESPACE",
            "SERVICE",
            "PODS",
            "CALLS P99/MAX",
            "STREAMS <= LONGEST",
            "MAX AGE",
            "NOW DEREG/DRAIN/PARENT[/GRACE]",
            "RECOMMENDED DRAIN/PARENT",
            "VERDICT",
        ],
        &rows,
    ));
    for s in &report.services {
        match s.verdict {
            TimerFit::Ok => {}
            _ => {
                let _ = writeln!(out, "\n{}/{}: {}", s.namespace, s.service, s.detail);
                if let Some(fix) = &s.fix {
                    let _ = writeln!(out, "  {fix}");
                }
            }
        }
    }
    out
}

/// A short service in one line, for the plan's gate.
pub fn short_detail(s: &ServiceTimers) -> String {
    let calls = match (s.calls.max, s.calls.over) {
        (Some(m), _) => format!("calls p99 {} max {}", p99(s), flag(m)),
        (None, Some(o)) => format!("calls p99 {} max >{}", p99(s), flag(o)),
        _ => "no calls".into(),
    };
    let streams = match (s.streams, s.longest_stream) {
        (0, _) => String::new(),
        (n, Some(l)) => format!(", {n} streams up to {}", flag(l)),
        (n, None) => format!(", {n} streams, unbounded"),
    };
    format!(
        "{}/{} ({} pods; {calls}{streams}): {}",
        s.namespace, s.service, s.pods, s.detail
    )
}
