//! `bench fleet`: the fleet tools against a simulated fleet's ten weeks of
//! history, on Prometheus and on VictoriaMetrics.
//!
//! It writes the history ([`sim`]), loads it into each store ([`store`]),
//! then runs `inventory`, `skew`, `verify` and `plan` (the `drainshim`
//! binary's subcommands) against each, and reports per command and store the wall
//! time, the peak RSS, the queries asked and the bytes the store answered.
//! It also judges: every command's JSON must be the same on both stores,
//! and `plan` must name the stalled wave, the point of no return and the
//! failed verify at the moments the timeline put them.

pub mod sim;
pub mod store;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use sim::{Fleet, Shape, HOUR, TIMELINE};
use store::{Store, StoreKind};

#[derive(Clone, Debug)]
pub struct FleetBenchOptions {
    pub pods: usize,
    pub services: usize,
    pub namespaces: usize,
    /// Seconds between the history's samples.
    pub interval: Duration,
    pub stores: Vec<StoreKind>,
    /// The `drainshim` binary: the commands are run as its subcommands.
    pub binary: PathBuf,
    /// Keep the history, blocks and logs here instead of a temporary
    /// directory removed at the end.
    pub keep: Option<PathBuf>,
    /// Another `drainshim` binary whose `plan`s run too, each right after
    /// this one's on the same store ("[compared]"): a before and after.
    pub compare: Option<PathBuf>,
}

/// One command on one store.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub command: String,
    pub store: StoreKind,
    pub exit_code: i32,
    pub seconds: f64,
    pub peak_rss_mib: f64,
    pub queries: u64,
    pub bytes: u64,
    #[serde(skip)]
    pub output: Value,
}

/// A judgement: the same answers, or the plan at a moment.
#[derive(Clone, Debug, Serialize)]
pub struct Judgement {
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    pub shape: Shape,
    pub samples: u64,
    pub history_bytes: u64,
    pub generate_seconds: f64,
    /// Per store, the seconds its load took.
    pub loads: Vec<(StoreKind, f64)>,
    /// Per store, the baseline: one range query of the whole history
    /// (`count(drainshim_proxy_info)` at the plan's step), asked in-process,
    /// the median of three, seconds.
    pub baselines: Vec<(StoreKind, f64)>,
    pub runs: Vec<Run>,
    pub judgements: Vec<Judgement>,
}

impl FleetReport {
    fn baseline(&self, kind: StoreKind) -> f64 {
        self.baselines
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0.0, |(_, s)| *s)
    }

    pub fn ok(&self) -> bool {
        self.judgements.iter().all(|j| j.ok)
    }

    pub fn render(&self) -> String {
        let s = &self.shape;
        let mut out = format!(
            "Fleet: {} pods, {} services, {} namespaces; {} days of history sampled every {} s: \
             {} samples ({:.0} MiB of OpenMetrics), written in {:.1} s\n",
            s.pods,
            s.services,
            s.namespaces,
            TIMELINE.history_days,
            s.interval,
            self.samples,
            self.history_bytes as f64 / 1048576.0,
            self.generate_seconds
        );
        for (kind, secs) in &self.loads {
            let base = self.baseline(*kind);
            let _ = writeln!(
                out,
                "Loaded into {} in {secs:.1} s; baseline (one range query of the whole history): {base:.3} s",
                kind.name()
            );
        }
        out.push('\n');
        let rows: Vec<Vec<String>> = self
            .runs
            .iter()
            .map(|r| {
                vec![
                    r.command.clone(),
                    r.store.name().to_string(),
                    r.exit_code.to_string(),
                    format!("{:.2}", r.seconds),
                    format!("{:.1}", r.seconds / self.baseline(r.store).max(1e-3)),
                    format!("{:.1}", r.peak_rss_mib),
                    r.queries.to_string(),
                    format!("{:.1}", r.bytes as f64 / 1024.0),
                ]
            })
            .collect();
        out.push_str(&drainshim::fleet::table(
            &[
                "COMMAND",
                "STORE",
                "EXIT",
                "SECONDS",
                "X_BASELINE",
                "PEAK_RSS_MIB",
                "QUERIES",
                "KIB_ANSWERED",
            ],
            &rows,
        ));
        out.push('\n');
        for j in &self.judgements {
            let _ = writeln!(
                out,
                "{} {}: {}",
                if j.ok { "ok  " } else { "FAIL" },
                j.what,
                j.detail
            );
        }
        out
    }
}

/// One command to run on every store.
#[derive(Clone)]
struct Command {
    label: String,
    args: Vec<String>,
}

/// The commands, as an operator would run them at these moments.
fn commands(fleet: &Fleet, tiers_file: &Path) -> Vec<Command> {
    let shape = &fleet.shape;
    let t = &TIMELINE;
    let late = fleet
        .waves
        .iter()
        .find(|w| w.step == 5 && w.tier == t.tiers[t.cuts].0);
    let mut out = vec![
        Command {
            label: "inventory".into(),
            args: vec!["inventory".into()],
        },
        Command {
            label: "skew --control-plane 1.40".into(),
            args: vec!["skew".into(), "--control-plane".into(), "1.40".into()],
        },
    ];
    if let Some(w) = late {
        let mut args = vec!["verify".to_string()];
        for ns in &w.namespaces {
            args.extend(["--namespace".to_string(), ns.clone()]);
        }
        args.extend([
            "--expect-version".into(),
            "1.40".into(),
            "--at".into(),
            (w.end + HOUR).to_string(),
            "--window".into(),
            format!("{}s", w.end - w.start + HOUR),
        ]);
        out.push(Command {
            label: format!("verify {} ({} namespaces)", w.tier, w.namespaces.len()),
            args,
        });
    }
    for (label, cp, at) in plan_moments(shape) {
        out.push(Command {
            label: label.to_string(),
            args: vec![
                "plan".into(),
                "--tiers".into(),
                tiers_file.display().to_string(),
                "--control-plane".into(),
                cp.into(),
                "--target".into(),
                "1.40".into(),
                "--history".into(),
                format!("{}d", t.history_days),
                "--lifetime-soak".into(),
                "7d".into(),
                "--soak".into(),
                "2d".into(),
                "--stall-after".into(),
                "12h".into(),
                "--at".into(),
                at.to_string(),
            ],
        });
    }
    out
}

/// The moments `plan` is judged at: during the stall, before the control
/// plane moves, and at the end.
pub(crate) fn plan_moments(shape: &Shape) -> [(&'static str, &'static str, i64); 3] {
    let t = &TIMELINE;
    [
        (
            "plan (day 26: a wave stalled)",
            "1.39",
            shape.at(t.stalled.1 - 1, 0),
        ),
        (
            "plan (day 36: control plane next)",
            "1.39",
            shape.at(t.control_plane - 2, 0),
        ),
        ("plan (day 70: now)", "1.40", shape.end),
    ]
}

/// What one run of the drainshim binary said about itself in its debug lines.
fn stats(stderr: &str) -> (u64, u64, f64) {
    let (mut queries, mut bytes, mut rss) = (0, 0, 0.0);
    for line in stderr.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match v.get("message").and_then(Value::as_str) {
            Some("prometheus: answered") => {
                queries += 1;
                bytes += v.get("bytes").and_then(Value::as_u64).unwrap_or(0);
            }
            Some("exit") => {
                rss = v.get("peak_rss_kib").and_then(Value::as_f64).unwrap_or(0.0) / 1024.0;
            }
            _ => {}
        }
    }
    (queries, bytes, rss)
}

async fn run_one(binary: &Path, store: &Store, c: &Command) -> Result<Run, String> {
    let mut args = c.args.clone();
    args.extend([
        "--prometheus".into(),
        store.url.clone(),
        "-o".into(),
        "json".into(),
    ]);
    let started = Instant::now();
    let out = tokio::process::Command::new(binary)
        .args(&args)
        .env(
            "DRAINSHIM_LOG",
            "warn,drainshim::fleet::prometheus=debug,drainshim::exit=debug",
        )
        .env("DRAINSHIM_LOG_FORMAT", "json")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(600), out)
        .await
        .map_err(|_| format!("{}: no exit in 10 minutes", c.label))?
        .map_err(|e| format!("{}: {e}", c.label))?;
    let seconds = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().unwrap_or(-1);
    // The store's address is the one thing that differs by design.
    let stdout = String::from_utf8_lossy(&out.stdout).replace(&store.url, "$PROMETHEUS");
    let output: Value = serde_json::from_str(&stdout).map_err(|e| {
        format!(
            "{} on {}: exit {code}, no JSON on stdout ({e}): {}",
            c.label,
            store.kind.name(),
            stderr.chars().take(2000).collect::<String>()
        )
    })?;
    let (queries, bytes, peak_rss_mib) = stats(&stderr);
    Ok(Run {
        command: c.label.clone(),
        store: store.kind,
        exit_code: code,
        seconds,
        peak_rss_mib,
        queries,
        bytes,
        output,
    })
}

/// The first place two JSON documents differ, if any: numbers are equal up
/// to float rounding.
fn difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if let Some(d) = difference(va, vb, &format!("{path}.{k}")) {
                    return Some(d);
                }
            }
            None
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (va, vb))| difference(va, vb, &format!("{path}[{i}]"))),
        // The stores sum in different orders: equal up to float rounding.
        (Value::Number(x), Value::Number(y))
            if x.as_f64()
                .zip(y.as_f64())
                .is_some_and(|(x, y)| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)) =>
        {
            None
        }
        _ if a == b => None,
        _ => {
            let short = |v: &Value| v.to_string().chars().take(300).collect::<String>();
            Some(format!("{path}: {} vs {}", short(a), short(b)))
        }
    }
}

/// The plan's next row, and the plan.
fn next_row(plan: &Value) -> (&Value, &str) {
    let row = plan["next"]["row"].as_u64().unwrap_or(u64::MAX) as usize;
    (
        plan["rows"].get(row).unwrap_or(&Value::Null),
        plan["verdict"].as_str().unwrap_or(""),
    )
}

/// Whether `plan` at each moment says what the timeline put there.
pub fn judge_plans(runs: &[Run]) -> Vec<Judgement> {
    let t = &TIMELINE;
    let mut out = Vec::new();
    for r in runs.iter().filter(|r| r.command.starts_with("plan")) {
        let p = &r.output;
        let (row, verdict) = next_row(p);
        let said = format!(
            "{verdict}: {} (row: step {}, tier {}, {})",
            p["next"]["action"].as_str().unwrap_or(""),
            row["step"],
            row["tier"],
            row["state"]
        );
        let ok = if r.command.contains("stalled") {
            verdict == "stop"
                && row["step"] == 3
                && row["tier"] == t.tiers[t.stalled.0].0
                && row["state"] == "stalled"
        } else if r.command.contains("control plane next") {
            verdict == "go"
                && row["kind"] == "control_plane"
                && row["state"] == "not_started"
                && p["next"]["action"]
                    .as_str()
                    .is_some_and(|a| a.contains("point of no return"))
        } else {
            let cp = p["rows"]
                .as_array()
                .and_then(|rows| rows.iter().find(|x| x["kind"] == "control_plane"));
            verdict == "stop"
                && row["step"] == 5
                && row["tier"] == t.tiers[t.cuts].0
                && row["verify"]["failed"] == true
                && row["verify"]["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("no stream cut by a drain"))
                && cp.is_some_and(|c| c["state"] == "done" && c["rollback"]["possible"] == false)
        };
        out.push(Judgement {
            what: format!("{} on {}", r.command, r.store.name()),
            ok,
            detail: said,
        });
    }
    out
}

/// Every command's JSON the same on every store.
pub fn judge_agreement(runs: &[Run]) -> Vec<Judgement> {
    let mut out = Vec::new();
    let Some(first) = runs.first().map(|r| r.store) else {
        return out;
    };
    for a in runs.iter().filter(|r| r.store == first) {
        for b in runs
            .iter()
            .filter(|r| r.store != first && r.command == a.command)
        {
            let diff = difference(&a.output, &b.output, "")
                .or_else(|| (a.exit_code != b.exit_code).then(|| "exit codes differ".into()));
            out.push(Judgement {
                what: format!(
                    "{}: the same JSON on {} and {}",
                    a.command,
                    a.store.name(),
                    b.store.name()
                ),
                ok: diff.is_none(),
                detail: diff.unwrap_or_else(|| format!("exit {} on both", a.exit_code)),
            });
        }
    }
    out
}

fn progress(what: impl std::fmt::Display) {
    eprintln!("bench fleet: {what}");
}

/// Writes the history, loads every store, runs every command on each.
pub async fn run(opts: FleetBenchOptions) -> Result<FleetReport, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs() as i64;
    let shape = Shape::new(
        opts.pods,
        opts.services,
        opts.namespaces,
        opts.interval,
        now,
    )?;
    let temp;
    let work: PathBuf = match &opts.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            dir.clone()
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("drainshim-fleet-")
                .tempdir()
                .map_err(|e| e.to_string())?;
            temp.path().to_path_buf()
        }
    };
    let fleet = Fleet::new(shape);
    let tiers_file = work.join("tiers.toml");
    std::fs::write(&tiers_file, fleet.tiers_toml()).map_err(|e| e.to_string())?;

    progress(format_args!(
        "writing {} days of history for {} pods into {}",
        TIMELINE.history_days,
        shape.pods,
        work.display()
    ));
    let started = Instant::now();
    let om_path = work.join("history.om");
    let json_path = work.join("history.jsonl");
    let samples = write_history(&fleet, &om_path, &json_path, &opts.stores)?;
    let generate_seconds = started.elapsed().as_secs_f64();
    let history_bytes = std::fs::metadata(&om_path).map(|m| m.len()).unwrap_or(0);
    progress(format_args!("{samples} samples in {generate_seconds:.1} s"));

    let lookback = Duration::from_secs((shape.interval * 3 / 2) as u64);
    let mut loads = Vec::new();
    let mut baselines = Vec::new();
    let mut runs = Vec::new();
    let cmds = commands(&fleet, &tiers_file);
    for kind in &opts.stores {
        let started = Instant::now();
        progress(format_args!("loading {}", kind.name()));
        let store = match kind {
            StoreKind::Prometheus => {
                let data = fresh(&work.join("prometheus-data"))?;
                store::backfill(&om_path, &data).await?;
                Store::prometheus(&data, &work, lookback).await?
            }
            StoreKind::VictoriaMetrics => {
                fresh(&work.join("vm-data"))?;
                let s = Store::victoria_metrics(&work, lookback).await?;
                s.import(&json_path).await?;
                s
            }
        };
        loads.push((*kind, started.elapsed().as_secs_f64()));
        progress(format_args!(
            "{} loaded in {:.1} s",
            kind.name(),
            started.elapsed().as_secs_f64()
        ));
        match baseline(&store, &shape).await {
            Ok(secs) => baselines.push((*kind, secs)),
            Err(e) => {
                store.stop().await;
                return Err(e);
            }
        }
        // Each command with this build, then (a plan) with the compared one.
        let compared = |c: &Command| {
            let binary = opts
                .compare
                .as_ref()
                .filter(|_| c.label.starts_with("plan"))?;
            let label = format!("{} [compared]", c.label);
            Some((binary.as_path(), Command { label, ..c.clone() }))
        };
        let each = cmds
            .iter()
            .flat_map(|c| std::iter::once((opts.binary.as_path(), c.clone())).chain(compared(c)));
        for (binary, c) in each {
            let r = run_one(binary, &store, &c).await;
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    let tail = store.log_tail();
                    store.stop().await;
                    return Err(format!("{e}\n{} log:\n{tail}", kind.name()));
                }
            };
            progress(format_args!(
                "{} on {}: exit {} in {:.2} s",
                r.command,
                kind.name(),
                r.exit_code,
                r.seconds
            ));
            runs.push(r);
        }
        store.stop().await;
    }
    let mut judgements = judge_plans(&runs);
    judgements.extend(judge_agreement(&runs));
    Ok(FleetReport {
        shape,
        samples,
        history_bytes,
        generate_seconds,
        loads,
        baselines,
        runs,
        judgements,
    })
}

/// The baseline: the store reading every proxy's series over the whole
/// history once, at the step the plan reads versions at (the median of
/// three).
async fn baseline(store: &Store, shape: &Shape) -> Result<f64, String> {
    use drainshim::fleet::plan::step_for;
    use drainshim::fleet::prometheus::PromClient;
    let prom = PromClient::new(&store.url, Duration::from_secs(300)).map_err(|e| e.to_string())?;
    let history = Duration::from_secs((TIMELINE.history_days * sim::DAY) as u64);
    let step = step_for(history, &[Duration::from_secs(12 * 3600)]);
    let s = step.as_secs() as i64;
    let end = shape.end - shape.end % s;
    let at = |t: i64| std::time::UNIX_EPOCH + Duration::from_secs(t as u64);
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        prom.query_range(
            "count(drainshim_proxy_info == 1)",
            at(end - history.as_secs() as i64 / s * s),
            at(end),
            step,
        )
        .await
        .map_err(|e| format!("baseline on {}: {e}", store.kind.name()))?;
        times.push(started.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[1])
}

/// `dir`, emptied: a kept directory's earlier run must not add its data.
fn fresh(dir: &Path) -> Result<PathBuf, String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(dir.to_path_buf())
}

/// Writes the history in each store's format; the samples written.
fn write_history(
    fleet: &Fleet,
    om: &Path,
    json: &Path,
    stores: &[StoreKind],
) -> Result<u64, String> {
    let create = |p: &Path| {
        std::fs::File::create(p)
            .map(|f| std::io::BufWriter::with_capacity(1 << 20, f))
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    let mut samples = fleet
        .write(&mut sim::OpenMetrics::new(create(om)?))
        .map_err(|e| format!("{}: {e}", om.display()))?;
    if stores.contains(&StoreKind::VictoriaMetrics) {
        let n = fleet
            .write(&mut sim::JsonLines::new(create(json)?))
            .map_err(|e| format!("{}: {e}", json.display()))?;
        samples = samples.max(n);
    }
    Ok(samples)
}
