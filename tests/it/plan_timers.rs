//! `plan`'s drain-timers step and `plan --explain timers` (the real binary)
//! against a real Prometheus scraping real shims beside real Envoy 1.38,
//! with real traffic through each guard: a tier whose unary calls take 3 s
//! on pods that drain long enough; a tier of long streams under a 4 s max
//! age, one of whose shims (the real binary) restarts in its pod inside the
//! window; a tier whose calls take 3 s on pods that drain for 2 s; a tier
//! with no traffic; and a tier two of whose pods run but export no timers
//! (the scrape drops the family), one of them without a call. The step
//! stops on exactly the third, with its figures, and on the last, naming
//! both pods; it passes once the pods run the recommendation and the
//! timer-less pods are replaced.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use drainshim::config::Timers;
use drainshim::fleet::prometheus::PromClient;
use drainshim::settings::GuardSettings;
use drainshim_bench::envoy::EnvoyProcess;
use drainshim_bench::proto::bench::stream_client::StreamClient;
use drainshim_bench::proto::bench::EchoRequest;
use serde_json::Value;
use support::proc::sigkill;
use support::prom::wait_for_scalar;
use support::*;

const N2: &str = "1.38.3";

/// One pod: Envoy with its namespace and name in the node metadata, a shim
/// beside it running `timers`, and its guard with a max connection age.
struct Pod {
    shim: SocketAddr,
    envoy: EnvoyProcess,
    _sigterm: tokio::sync::mpsc::UnboundedSender<()>,
    _task: tokio::task::JoinHandle<drainshim::drain::Report>,
}

async fn pod(backend: SocketAddr, ns: &str, name: &str, t: Timers, max_age: Duration) -> Pod {
    pod_with(backend, ns, name, t, max_age, true).await
}

/// [`pod`], its guard's request metrics on or off (`signals`).
async fn pod_with(
    backend: SocketAddr,
    ns: &str,
    name: &str,
    t: Timers,
    max_age: Duration,
    signals: bool,
) -> Pod {
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let settings = sidecar_settings(&admin, |s| {
        s.budget.timers = t;
        s.budget.termination_grace_period = Some(GRACE);
        s.budget.admin_timeout = ms(500);
        let mut g = GuardSettings::new("127.0.0.1:0".parse().expect("address"), backend);
        g.config.max_connection_age = Some(max_age);
        g.config.max_connection_age_grace = secs(1);
        g.config.signals.enabled = signals;
        s.guard = Some(g);
    });
    let s = drainshim::sidecar::start(settings)
        .await
        .expect("start sidecar");
    let shim = s.local_addr();
    let upstream = s.guard_addr().expect("a guard");
    let (sigterm, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(s.run(rx));
    let envoy = envoy_with(N2, upstream, |o| {
        o.admin_port = admin_port;
        o.metadata = BTreeMap::from([
            ("NAMESPACE".into(), ns.into()),
            ("NAME".into(), name.into()),
        ]);
        o.fallback = Some(backend);
    })
    .await;
    Pod {
        shim,
        envoy,
        _sigterm: sigterm,
        _task: task,
    }
}

/// Every pod's grace period, which its shim is told.
const GRACE: Duration = Duration::from_secs(120);

/// A pod whose shim is the real binary, so it can restart in its pod: a
/// SIGKILL, then the same command on the same ports, its counters from 0
/// (as a container restart does). Its timers are the long ones.
struct Restarting {
    args: Vec<String>,
    bin: SidecarBin,
    shim: SocketAddr,
    envoy: EnvoyProcess,
}

impl Restarting {
    async fn start(backend: SocketAddr, ns: &str, name: &str, max_age: &str) -> Self {
        let admin_port = free_port();
        let listen = format!("127.0.0.1:{}", free_port());
        let guard: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let args: Vec<String> = [
            "sidecar",
            "--listen",
            &listen,
            "--linger",
            "0s",
            "--envoy-admin",
            &format!("http://127.0.0.1:{admin_port}"),
            "--guard-listen",
            &guard.to_string(),
            "--guard-upstream",
            &backend.to_string(),
            "--max-connection-age",
            max_age,
            "--max-connection-age-grace",
            "1s",
            "--deregistration-delay",
            "1s",
            "--min-drain-time",
            "1s",
            "--drain-time",
            "20s",
            "--parent-shutdown-time",
            "30s",
            "--poll-interval",
            "100ms",
            "--admin-timeout",
            "500ms",
            "--termination-grace-period",
            "120s",
        ]
        .map(String::from)
        .into();
        let bin = Self::spawn(&args).await;
        let shim = bin.addr;
        let envoy = envoy_with(N2, guard, |o| {
            o.admin_port = admin_port;
            o.metadata = BTreeMap::from([
                ("NAMESPACE".into(), ns.into()),
                ("NAME".into(), name.into()),
            ]);
        })
        .await;
        Self {
            args,
            bin,
            shim,
            envoy,
        }
    }

    async fn spawn(args: &[String]) -> SidecarBin {
        let mut cmd = tokio::process::Command::new(drainshim_bin());
        cmd.args(args);
        sidecar_bin_cmd(cmd).await
    }

    /// SIGKILL and the same command again, on the same address.
    async fn restart(&mut self) {
        sigkill(&mut self.bin.child, "the shim", WAIT).await;
        self.bin = Self::spawn(&self.args).await;
        assert_eq!(self.bin.addr, self.shim, "the same address");
    }
}

/// Timers with the deregistration delay as the min drain time, polled
/// every 100 ms.
fn timers_of(dereg: Duration, drain: Duration, parent: Duration) -> Timers {
    timers(dereg, drain, parent, ms(100))
}

/// `n` unary calls at once to `addr`, each taking `delay_ms` in the app;
/// every one must succeed.
async fn calls(addr: SocketAddr, n: usize, delay_ms: u32) {
    let mut all = Vec::new();
    for i in 0..n {
        all.push(tokio::spawn(async move {
            let mut c = StreamClient::connect(format!("http://{addr}"))
                .await
                .expect("connect");
            c.echo(EchoRequest {
                body: format!("slow-{i}"),
                delay_ms,
            })
            .await
            .map(|_| ())
        }));
    }
    for c in all {
        let done = tokio::time::timeout(WAIT, c).await;
        assert!(
            matches!(done, Ok(Ok(Ok(())))),
            "a call through {addr} failed: {done:?}"
        );
    }
}

/// `n` streams to `addr`, each ended by the guard's max age; waits for
/// every end.
async fn streams_ended_by_max_age(addr: SocketAddr, n: usize, prefix: String) {
    for h in open_streams(addr, n, &prefix).await {
        let end = tokio::time::timeout(WAIT, h).await;
        assert!(matches!(end, Ok(Ok(_))), "a stream never ended: {end:?}");
    }
}

/// Waits until Prometheus holds at least `n` of `metric`'s count on the
/// shims at `shims`.
async fn wait_counted(client: &PromClient, metric: &str, shims: &[SocketAddr], n: f64) {
    let re: Vec<String> = shims.iter().map(|s| s.to_string()).collect();
    let q = format!(
        "sum({metric}_count{{instance=~\"{}\"}})",
        re.join("|").replace('.', "\\\\.")
    );
    wait_for_scalar(client, &format!("{q} >= {n}"), WAIT, &q, |v| v >= n).await;
}

/// The drain timers `drainshim inject` gives a workload carrying the
/// annotations of `fix` (the step's `kubectl patch`): `base` with the
/// shim's environment applied.
async fn inject_timers(dir: &std::path::Path, fix: &str, base: Timers) -> Timers {
    let patch = fix
        .split_once("-p '")
        .and_then(|(_, p)| p.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no patch in {fix}"));
    let patch: Value = serde_json::from_str(patch).expect("the patch is JSON");
    let annotations = &patch["spec"]["template"]["metadata"]["annotations"];
    assert!(annotations.is_object(), "{patch}");
    let manifest = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: short, namespace: t-short}}\n\
         spec:\n  selector: {{matchLabels: {{app: short}}}}\n  template:\n    metadata:\n      \
         labels: {{app: short}}\n      annotations: {annotations}\n    spec:\n      containers:\n      \
         - {{name: app, image: app:1, ports: [{{containerPort: 7070}}]}}\n"
    );
    let path = dir.join("short.yaml");
    std::fs::write(&path, manifest).expect("manifest");
    let (code, out, err) = run_bin(&["inject", "-f", &path.display().to_string()]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let injected: Value = serde_yaml_ng::from_str(&out).expect("injected YAML");
    let spec = &injected["spec"]["template"]["spec"];
    let shim = spec["containers"]
        .as_array()
        .into_iter()
        .chain(spec["initContainers"].as_array())
        .flatten()
        .find(|c| c["name"] == "drainshim")
        .unwrap_or_else(|| panic!("no drainshim container: {out}"));
    let env = |name: &str| -> Option<Duration> {
        shim["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"]
            .as_str()?
            .parse::<drainshim::config::Span>()
            .ok()
            .map(|s| s.get())
    };
    Timers {
        drain_time: env("DRAINSHIM_DRAIN_TIME").expect("the drain time set"),
        parent_shutdown_time: env("DRAINSHIM_PARENT_SHUTDOWN_TIME").expect("the deadline set"),
        ..base
    }
}

const TIERS: &str = "[[tier]]\nname = \"slow\"\nnamespaces = [\"t-slow\"]\n\n\
                     [[tier]]\nname = \"streams\"\nnamespaces = [\"t-streams\"]\n\n\
                     [[tier]]\nname = \"short\"\nnamespaces = [\"t-short\"]\n\n\
                     [[tier]]\nname = \"idle\"\nnamespaces = [\"t-idle\"]\n\n\
                     [[tier]]\nname = \"old\"\nnamespaces = [\"t-old\"]\n";

fn tiers_file(dir: &std::path::Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).expect("tiers file");
    path.display().to_string()
}

/// `plan` with the flags every run here shares, then `flags`.
async fn run_plan(url: &str, tiers: &str, flags: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec![
        "plan",
        "--prometheus",
        url,
        "--tiers",
        tiers,
        "--control-plane",
        "1.39",
        "--target",
        "1.40",
        "--history",
        "15m",
        "--lifetime-soak",
        "1s",
        "--rate-floor",
        "1000",
    ];
    // The window and the margin every run uses, unless `flags` sets them.
    for (flag, value) in [("--timers-window", "10m"), ("--timer-margin", "6s")] {
        if !flags.contains(&flag) {
            args.extend([flag, value]);
        }
    }
    args.extend_from_slice(flags);
    run_bin(&args).await
}

/// `plan --explain timers -o json` until `done` holds; the last answer.
async fn explain_until(
    url: &str,
    tiers: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> (Option<i32>, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out, err) = run_plan(url, tiers, &["--explain", "timers", "-o", "json"]).await;
        let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        if done(&v) {
            return (code, v);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never seen: {code:?} {out}{err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every row of `--explain timers -o json`.
fn services(v: &Value) -> impl Iterator<Item = &Value> {
    v["services"].as_array().into_iter().flatten()
}

/// The app service's row of a namespace (the guard names it by its gRPC
/// service).
fn row<'a>(v: &'a Value, ns: &str) -> &'a Value {
    v["services"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| {
            s["namespace"] == ns && s["service"].as_str().is_some_and(|s| s.contains("bench"))
        })
        .or_else(|| {
            v["services"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|s| s["namespace"] == ns)
        })
        .unwrap_or(&Value::Null)
}

#[tokio::test]
async fn plan_sets_drain_timers_from_the_fleets_own_calls_and_streams() {
    let backend = backend().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tiers = tiers_file(dir.path(), "tiers.toml", TIERS);
    let hour = secs(3600);
    let long = timers_of(secs(1), secs(20), secs(30));
    let short = timers_of(ms(200), secs(2), secs(3));
    let mut pods: BTreeMap<&str, Pod> = BTreeMap::new();
    for (ns, name, t, age) in [
        ("t-slow", "slow-a", long, hour),
        ("t-slow", "slow-b", long, hour),
        ("t-streams", "streams-a", long, secs(4)),
        ("t-streams", "streams-b", long, secs(4)),
        ("t-short", "short-a", short, hour),
        ("t-short", "short-b", short, hour),
        ("t-idle", "idle-a", long, hour),
        ("t-old", "old-a", long, hour),
        ("t-old", "old-b", long, hour),
        ("t-old", "old-c", long, hour),
    ] {
        pods.insert(name, pod(backend.addr, ns, name, t, age).await);
    }
    // old-d takes calls with its guard's request metrics off: Envoy counts
    // them, the histogram does not.
    pods.insert(
        "old-d",
        pod_with(backend.addr, "t-old", "old-d", long, hour, false).await,
    );
    let old_d = pods["old-d"].shim;
    let mut restarting = Restarting::start(backend.addr, "t-streams", "streams-r", "4s").await;
    let mut shims: Vec<SocketAddr> = pods.values().map(|p| p.shim).collect();
    shims.push(restarting.shim);
    // old-a (which takes calls) and old-c (which takes none) run, but the
    // scrape drops their timers: as an old shim, or a scrape config that
    // keeps some families only.
    let (old_a, old_c) = (pods["old-a"].shim, pods["old-c"].shim);
    let prom = prometheus_dropping(&shims, "drainshim_drain_timer_seconds", &[old_a, old_c]).await;
    let client = PromClient::new(&prom.url(), Duration::from_secs(5)).expect("client");
    let url = prom.url();
    wait_for_scalar(
        &client,
        "every shim's drain timers are scraped, but two",
        WAIT,
        "count(drainshim_drain_timer_seconds{timer=\"drain_time\"})",
        |n| n == 10.0,
    )
    .await;
    wait_for_scalar(
        &client,
        "every shim runs",
        WAIT,
        "count(drainshim_draining)",
        |n| n == 12.0,
    )
    .await;

    // Bad input: a negative or zero margin, a zero window (64); a window with no
    // calls (69).
    for (flag, value, says) in [
        ("--timer-margin", "-5s", "a margin cannot be negative"),
        ("--timer-margin", "5s", "--timer-margin 5s is under 6s"),
        ("--stream-spread", "0s", "--stream-spread 0s is under 1s"),
        ("--stream-spread", "1ms", "--stream-spread 1ms is under 1s"),
        ("--timer-margin", "0s", "--timer-margin 0s is under 6s"),
        (
            "--timers-window",
            "0s",
            "--timers-window must be more than 0",
        ),
    ] {
        let (code, out, err) = run_plan(&url, &tiers, &["--explain", "timers", flag, value]).await;
        assert_eq!(code, Some(64), "{flag} {value}: {out}{err}");
        assert!(err.contains(says), "{says}: {err}");
    }
    let idle_only = tiers_file(
        dir.path(),
        "idle.toml",
        "[[tier]]\nname = \"idle\"\nnamespaces = [\"t-idle\"]\n",
    );
    let (code, out, err) = run_plan(&url, &idle_only, &["--explain", "timers"]).await;
    assert_eq!(code, Some(69), "{out}{err}");
    assert!(
        err.contains("a window with no data cannot be judged"),
        "{err}"
    );

    // Traffic in two rounds, each scraped: a series' first sample already
    // holds its first calls, which a window's growth cannot see.
    let inbound = |name: &str| match name {
        "streams-r" => restarting.envoy.inbound,
        name => pods[name].envoy.inbound,
    };
    let callers = ["slow-a", "slow-b", "short-a", "short-b", "old-a", "old-b"];
    let called: Vec<SocketAddr> = callers.iter().map(|n| pods[n].shim).collect();
    let blind = pods["old-d"].envoy.inbound;
    let streamers = ["streams-a", "streams-b", "streams-r"];
    let streamed = [
        pods["streams-a"].shim,
        pods["streams-b"].shim,
        restarting.shim,
    ];
    for (round, n) in [(1usize, 1usize), (2, 2)] {
        calls(blind, n, 0).await;
        let c = callers.map(|name| calls(inbound(name), n, 3000));
        let s = streamers
            .map(|name| streams_ended_by_max_age(inbound(name), n, format!("{name}-{round}")));
        futures_util::future::join(
            futures_util::future::join_all(c),
            futures_util::future::join_all(s),
        )
        .await;
        let total = (1..=round).sum::<usize>() as f64;
        wait_counted(
            &client,
            "drainshim_guard_request_duration_seconds",
            &called,
            6.0 * total,
        )
        .await;
        wait_counted(
            &client,
            "drainshim_guard_stream_lifetime_seconds",
            &streamed,
            3.0 * total,
        )
        .await;
    }

    let envoy_took =
        format!("sum(drainshim_envoy_downstream_requests_total{{instance=\"{old_d}\"}})");
    wait_for_scalar(
        &client,
        "old-d's calls counted by its Envoy",
        WAIT,
        &envoy_took,
        |n| n >= 3.0,
    )
    .await;

    // streams-r's shim restarts in its pod (its counters from 0), then
    // ends one more stream, scraped: a reset inside the window.
    restarting.restart().await;
    streams_ended_by_max_age(restarting.envoy.inbound, 1, "streams-r-3".into()).await;
    let after_restart = format!(
        "sum(drainshim_guard_stream_lifetime_seconds_count{{instance=\"{}\"}})",
        restarting.shim
    );
    wait_for_scalar(
        &client,
        "the restarted shim's stream scraped",
        WAIT,
        &after_restart,
        |n| n == 1.0,
    )
    .await;

    // Before: the short tier's pods drain for 2 s, their calls take 3 s.
    let (code, before) = explain_until(&url, &tiers, "the short tier judged short", |v| {
        row(v, "t-short")["verdict"] == "short"
            && row(v, "t-streams")["streams"].as_u64() >= Some(9)
            && services(v).any(|s| {
                s["namespace"] == "t-old"
                    && s["service"] == "-"
                    && s["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains("request metrics are off"))
            })
    })
    .await;
    let (_, table_before, _) = run_plan(&url, &tiers, &["--explain", "timers"]).await;
    println!("before:\n{table_before}");
    assert_eq!(code, Some(1), "{before}");
    let s = row(&before, "t-short");
    assert_eq!(s["pods"], 2, "{s}");
    assert_eq!(s["calls_max"], 5.0, "3 s calls are in the 5 s bucket: {s}");
    assert!(
        s["calls_p99"].as_f64().is_some_and(|p| p > 2.5 && p <= 5.0),
        "{s}"
    );
    assert_eq!(s["current"]["drain_time"], 2.0);
    assert_eq!(s["current"]["parent_shutdown_time"], 3.0);
    assert_eq!(s["current"]["termination_grace_period"], 120.0);
    // 200 ms of deregistration and the 5 s of the calls, up to the second;
    // then the 6 s margin.
    assert_eq!(s["recommended"]["drain_time"], 6.0, "{s}");
    assert_eq!(s["recommended"]["parent_shutdown_time"], 12.0, "{s}");
    let fix = s["fix"].as_str().unwrap_or_default().to_string();
    assert!(
        fix.contains(r#""drainshim.io/drain-time":"6s","drainshim.io/parent-shutdown-time":"12s""#),
        "{s}"
    );
    let slow = row(&before, "t-slow");
    assert_eq!(slow["verdict"], "ok", "{slow}");
    assert_eq!(slow["calls_max"], 5.0, "{slow}");
    let st = row(&before, "t-streams");
    assert_eq!(st["verdict"], "ok", "{st}");
    assert_eq!(
        st["longest_stream"], 4.0,
        "streams end at the 4 s max age: {st}"
    );
    assert_eq!(st["max_age"], 4.0, "{st}");
    // Every stream of the window (the series are there from 0 before the
    // first): 3 on streams-a and streams-b; on streams-r 3 before its
    // restart and 1 after, read with increase() (the highest sample less
    // the lowest says 3 in all).
    assert_eq!(st["streams"], 10, "{st}");
    let idle = row(&before, "t-idle");
    assert_eq!(idle["verdict"], "no_traffic", "{idle}");
    assert!(table_before.contains("t-idle/-: no traffic in the window: cannot recommend"));
    // t-old: old-b runs enough, but old-a serves the same calls without
    // timers, and old-c runs without timers or a call: each named.
    let old = row(&before, "t-old");
    assert_eq!(old["verdict"], "unknown", "{old}");
    assert_eq!(old["pods"], 2, "{old}");
    assert_eq!(
        old["without_timers"],
        serde_json::json!([old_a.to_string()])
    );
    let quiet = services(&before)
        .find(|s| s["namespace"] == "t-old" && s["service"] == "-")
        .unwrap_or_else(|| panic!("old-c named: {before}"));
    assert_eq!(quiet["verdict"], "unknown", "{quiet}");
    assert_eq!(
        quiet["without_timers"],
        serde_json::json!([old_c.to_string()])
    );
    assert!(
        table_before.contains(&format!(
            "no timers exported by 1 of its pods running now ({old_a})"
        )),
        "{table_before}"
    );
    // old-d's calls, which its request metrics do not record, are named:
    // its row cannot pass as "no traffic"; its Envoy's count is said.
    assert_eq!(quiet["pods"], 2, "{quiet}");
    let d = quiet["detail"].as_str().unwrap_or_default();
    assert!(
        d.contains(&format!(
            "the guard's request metrics are off on 1 of its pods ({old_d})"
        )) && d.contains(&format!(
            "Envoy counted requests in the window that the guard recorded none of on 1 of them ({old_d})"
        )),
        "{quiet}"
    );
    let mut failing: Vec<(&str, &str)> = services(&before)
        .filter(|s| s["verdict"] != "ok" && s["verdict"] != "no_traffic")
        .map(|s| {
            (
                s["namespace"].as_str().unwrap_or_default(),
                s["verdict"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    failing.sort();
    assert_eq!(
        failing,
        [
            ("t-old", "unknown"),
            ("t-old", "unknown"),
            ("t-short", "short")
        ],
        "exactly the short tier's service and the timer-less pods"
    );

    // The plan stops at the first failing tier's step and names it, its
    // figures and fix.
    let (code, out, err) = run_plan(&url, &tiers, &["-o", "json"]).await;
    let plan: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(code, Some(1), "{plan}");
    assert_eq!(plan["verdict"], "stop");
    let k = plan["next"]["row"].as_u64().expect("a next row") as usize;
    let next = &plan["rows"][k];
    assert_eq!(
        (next["kind"].as_str(), next["tier"].as_str()),
        (Some("drain_timers"), Some("short"))
    );
    let action = plan["next"]["action"].as_str().unwrap_or_default();
    assert!(action.contains("t-short/"), "{action}");
    assert!(action.contains("drain time 2s < 6s"), "{action}");
    assert!(action.contains("parent shutdown 3s < 12s"), "{action}");
    assert_eq!(
        plan["next"]["commands"][0].as_str(),
        Some(fix.as_str()),
        "{plan}"
    );
    let idle_row = plan["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["kind"] == "drain_timers" && r["tier"] == "idle")
        .expect("the idle tier's row");
    assert!(
        idle_row["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no traffic") && d.contains("cannot recommend")),
        "{idle_row}"
    );

    // The fix: the annotations the step names, on the workload's pod
    // template, through `drainshim inject` (what the webhook does at the
    // rollout); the short tier's pods replaced by pods whose shims run the
    // timers it set, which then take calls too.
    let fixed = inject_timers(dir.path(), &fix, short).await;
    assert_eq!(
        (fixed.drain_time, fixed.parent_shutdown_time),
        (secs(6), secs(12))
    );
    for name in ["short-c", "short-d"] {
        pods.insert(name, pod(backend.addr, "t-short", name, fixed, hour).await);
    }
    pods.remove("short-a");
    pods.remove("short-b");
    let mut shims: Vec<SocketAddr> = pods.values().map(|p| p.shim).collect();
    shims.push(restarting.shim);
    prom.set_targets(&shims);
    let new = [pods["short-c"].shim, pods["short-d"].shim];
    for round in 1..=2 {
        let addrs = ["short-c", "short-d"].map(|n| pods[n].envoy.inbound);
        futures_util::future::join_all(addrs.map(|a| calls(a, 1, 3000))).await;
        wait_counted(
            &client,
            "drainshim_guard_request_duration_seconds",
            &new,
            2.0 * round as f64,
        )
        .await;
    }
    let (code, after) = explain_until(&url, &tiers, "the short tier passes", |v| {
        row(v, "t-short")["verdict"] == "ok"
    })
    .await;
    let (_, table_after, _) = run_plan(&url, &tiers, &["--explain", "timers"]).await;
    println!("after:\n{table_after}");
    assert_eq!(
        code,
        Some(1),
        "t-old's pods still export no timers: {after}"
    );
    let s = row(&after, "t-short");
    assert_eq!(s["pods"], 2, "only the pods running now: {s}");
    assert_eq!(s["current"]["drain_time"], 6.0, "{s}");
    assert_eq!(s["current"]["parent_shutdown_time"], 12.0, "{s}");

    // The plan now stops at t-old's, naming both pods without timers.
    let (code, out, err) = run_plan(&url, &tiers, &["-o", "json"]).await;
    let plan: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(code, Some(1), "{plan}");
    let k = plan["next"]["row"].as_u64().expect("a next row") as usize;
    assert_eq!(plan["rows"][k]["tier"], "old", "{plan}");
    let action = plan["next"]["action"].as_str().unwrap_or_default();
    for pod in [old_a, old_c] {
        assert!(
            action.contains("no timers exported") && action.contains(&pod.to_string()),
            "{pod}: {action}"
        );
    }
    assert!(
        action.contains(&format!(
            "request metrics are off on 1 of its pods ({old_d})"
        )),
        "{old_d}: {action}"
    );

    // old-a, old-c and old-d replaced (by shims whose timers are scraped; here
    // simply gone): every service passes.
    pods.remove("old-a");
    pods.remove("old-c");
    pods.remove("old-d");
    let mut shims: Vec<SocketAddr> = pods.values().map(|p| p.shim).collect();
    shims.push(restarting.shim);
    prom.set_targets(&shims);
    // The removed pods' series go stale at Prometheus's next scrape: until
    // then their rows may still stand.
    let (code, after) = explain_until(&url, &tiers, "t-old passes, old-c gone", |v| {
        row(v, "t-old")["verdict"] == "ok"
            && !services(v).any(|s| s["namespace"] == "t-old" && s["service"] == "-")
            && services(v).all(|s| {
                ["ok", "no_traffic", "gone"]
                    .iter()
                    .any(|w| s["verdict"] == *w)
            })
    })
    .await;
    assert_eq!(code, Some(0), "{after}");

    // The plan moves on: the first tier's restart may start.
    let (code, out, err) = run_plan(&url, &tiers, &["-o", "json"]).await;
    let plan: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(code, Some(0), "{plan}");
    assert_eq!(plan["verdict"], "go");
    let k = plan["next"]["row"].as_u64().expect("a next row") as usize;
    let next = &plan["rows"][k];
    assert_eq!(
        (next["step"].as_u64(), next["tier"].as_str()),
        (Some(3), Some("slow")),
        "{plan}"
    );
    let (_, table, _) = run_plan(&url, &tiers, &[]).await;
    println!("{table}");
}
