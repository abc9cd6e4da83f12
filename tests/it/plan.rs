//! `drainshim plan` (the real binary) against a real Prometheus scraping
//! real shims beside real Envoy 1.38, 1.39 and 1.40 (n-2, n-1 and n), in
//! three namespaces that form three tiers. The test moves pods between
//! versions as a rollout does (a new pod up, then the old one gone) and
//! checks what the plan says at each point. Every state comes from
//! Prometheus; nothing is handed to the plan but flags.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use drainshim::fleet::prometheus::PromClient;
use drainshim::settings::GuardSettings;
use drainshim_bench::envoy::EnvoyProcess;
use serde_json::Value;
use support::prom::wait_for_scalar;
use support::*;

const N2: &str = "1.38.3";
const N1: &str = "1.39.3";
const N: &str = "1.40.0";

/// One pod: Envoy of a version with its namespace and name in the node
/// metadata, and a shim beside it; with a guard whose max connection age
/// is an hour, or without a guard (its drains cut streams).
struct Pod {
    shim: SocketAddr,
    envoy: EnvoyProcess,
    _sigterm: tokio::sync::mpsc::UnboundedSender<()>,
    _task: tokio::task::JoinHandle<drainshim::drain::Report>,
}

async fn pod(backend: SocketAddr, ns: &str, name: &str, version: &str, guarded: bool) -> Pod {
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let settings = sidecar_settings(&admin, |s| {
        short_timers(s);
        if guarded {
            let mut g = GuardSettings::new("127.0.0.1:0".parse().expect("address"), backend);
            g.config.max_connection_age = Some(Duration::from_secs(3600));
            s.guard = Some(g);
        }
    });
    let s = drainshim::sidecar::start(settings)
        .await
        .expect("start sidecar");
    let shim = s.local_addr();
    let upstream = s.guard_addr().unwrap_or(backend);
    let (sigterm, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(s.run(rx));
    let envoy = envoy_with(version, upstream, |o| {
        o.admin_port = admin_port;
        o.metadata = BTreeMap::from([
            ("NAMESPACE".into(), ns.into()),
            ("NAME".into(), name.into()),
        ]);
        if guarded {
            o.fallback = Some(backend);
        }
    })
    .await;
    Pod {
        shim,
        envoy,
        _sigterm: sigterm,
        _task: task,
    }
}

/// Waits until Prometheus sees exactly these proxies per version in `ns`.
async fn wait_versions(client: &PromClient, ns: &str, want: &[(&str, f64)]) {
    let want: BTreeMap<String, f64> = want.iter().map(|(v, n)| (v.to_string(), *n)).collect();
    wait_for(
        &format!("Prometheus sees {ns} at {want:?}"),
        WAIT,
        || async {
            client
                .query(&format!(
                    "count by (version) (drainshim_proxy_info{{namespace=\"{ns}\"}} == 1)"
                ))
                .await
                .is_ok_and(|samples| {
                    let got: BTreeMap<String, f64> = samples
                        .iter()
                        .map(|s| (s.label("version").to_string(), s.value))
                        .collect();
                    got == want
                })
        },
    )
    .await;
}

/// The fleet under test: pods by name, and Prometheus scraping the ones
/// that are up.
struct Fleet {
    backend: SocketAddr,
    pods: BTreeMap<String, Pod>,
    prom: Prometheus,
}

impl Fleet {
    fn publish(&self) {
        let targets: Vec<SocketAddr> = self.pods.values().map(|p| p.shim).collect();
        self.prom.set_targets(&targets);
    }

    /// A rollout's step: the new pod up and scraped, then the old one gone.
    async fn replace(&mut self, old: &str, ns: &str, new: &str, version: &str, guarded: bool) {
        let p = pod(self.backend, ns, new, version, guarded).await;
        self.pods.insert(new.to_string(), p);
        self.publish();
        self.remove(old);
    }

    fn remove(&mut self, name: &str) {
        self.pods.remove(name).expect("a pod of the fleet");
        self.publish();
    }
}

struct Run {
    code: Option<i32>,
    plan: Value,
    err: String,
}

impl Run {
    fn row(&self, step: u64, tier: &str) -> &Value {
        self.plan["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["step"] == step && (tier.is_empty() || r["tier"] == tier))
            .unwrap_or_else(|| panic!("no row {step} {tier}: {}", self.plan))
    }

    fn next_row(&self) -> &Value {
        let k = self.plan["next"]["row"].as_u64().expect("a next row") as usize;
        &self.plan["rows"][k]
    }
}

fn tiers_file(dir: &std::path::Path, body: &str) -> String {
    let path = dir.join(format!("tiers-{}.toml", fastrand::u32(..)));
    std::fs::write(&path, body).expect("tiers file");
    path.display().to_string()
}

const TIERS: &str = "[[tier]]\nname = \"test-services\"\nnamespaces = [\"t1\"]\n\n\
                     [[tier]]\nname = \"internal\"\npattern = \"t2\"\n\n\
                     [[tier]]\nname = \"stream-holders\"\nnamespaces = [\"t3\"]\n";

/// The flags every run here shares, then `flags`.
fn plan_args<'a>(url: &'a str, tiers: &'a str, cp: &'a str, flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "plan",
        "--prometheus",
        url,
        "--tiers",
        tiers,
        "--control-plane",
        cp,
        "--target",
        "1.40",
        "--history",
        "15m",
        // The shims here share the host's network namespace with every
        // other test, and count its TCP resets and retries; the wave's own
        // failures (a cut stream) still fail it below.
        "--rate-floor",
        "1000",
    ];
    args.extend_from_slice(flags);
    args
}

async fn plan(url: &str, tiers: &str, cp: &str, flags: &[&str]) -> Run {
    let args = plan_args(url, tiers, cp, &[flags, &["-o", "json"]].concat());
    let (code, out, err) = run_bin(&args).await;
    let plan = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    Run { code, plan, err }
}

/// Runs `plan` until `done` holds (the fleet's history must grow first).
async fn plan_until(
    what: &str,
    url: &str,
    tiers: &str,
    cp: &str,
    flags: &[&str],
    done: impl Fn(&Run) -> bool,
) -> Run {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let run = plan(url, tiers, cp, flags).await;
        if done(&run) {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the plan never got there: {}",
            run.plan
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The plan as the table a person reads, for the test's output.
async fn table(url: &str, tiers: &str, cp: &str, flags: &[&str]) -> String {
    let (_, out, err) = run_bin(&plan_args(url, tiers, cp, flags)).await;
    format!("{out}{err}")
}

/// What each step of the migration works on: Prometheus (its URL for the
/// plan, a client to wait on what it scraped), the tiers file and the fleet.
struct Migration {
    url: String,
    tiers: String,
    client: PromClient,
    fleet: Fleet,
}

/// The flags once the lifetime soaked, with no stall in sight.
const FLAGS_SOAKED: &[&str] = &["--lifetime-soak", "2s", "--stall-after", "1h"];
/// The flags once every soak is short, from the control plane's step on.
const CP_FLAGS: &[&str] = &["--lifetime-soak", "2s", "--soak", "2s"];

/// Six pods on n-2, two per tier, every guard with a max connection age,
/// and Prometheus scraping them all.
async fn six_pods_on_n2(backend: SocketAddr, tiers: String) -> Migration {
    let mut pods = BTreeMap::new();
    for (ns, name) in [
        ("t1", "t1-a"),
        ("t1", "t1-b"),
        ("t2", "t2-a"),
        ("t2", "t2-b"),
        ("t3", "t3-a"),
        ("t3", "t3-b"),
    ] {
        pods.insert(name.to_string(), pod(backend, ns, name, N2, true).await);
    }
    let shims: Vec<SocketAddr> = pods.values().map(|p| p.shim).collect();
    let prom = prometheus(&shims).await;
    let client = PromClient::new(&prom.url(), Duration::from_secs(5)).expect("client");
    let url = prom.url();
    let fleet = Fleet {
        backend,
        pods,
        prom,
    };
    for ns in ["t1", "t2", "t3"] {
        wait_versions(&client, ns, &[(N2, 2.0)]).await;
    }
    wait_for_scalar(
        &client,
        "every guard's max age is scraped",
        WAIT,
        "count(drainshim_guard_max_connection_age_seconds == 3600)",
        |n| n == 6.0,
    )
    .await;
    Migration {
        url,
        tiers,
        client,
        fleet,
    }
}

#[tokio::test]
async fn plan_follows_a_migration_from_the_fleet_alone() {
    let backend = backend().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let tiers = tiers_file(dir.path(), TIERS);
    let mut m = six_pods_on_n2(backend.addr, tiers).await;
    bad_input_is_a_usage_error(&m, dir.path()).await;
    a_fresh_fleet_may_not_restart_yet(&m).await;
    once_soaked_tier_1_may_start(&m).await;
    tier_1_moves_then_stalls(&mut m).await;
    tier_1_verified_then_tier_2_after_the_soak(&mut m).await;
    the_control_plane_may_move(&mut m).await;
    the_control_plane_moved(&m).await;
    a_wave_that_cuts_streams_fails_verify(&mut m).await;
}

/// Bad input: a clear error, exit 64, and no plan.
async fn bad_input_is_a_usage_error(m: &Migration, dir: &std::path::Path) {
    let Migration { url, tiers, .. } = m;
    let unknown = tiers_file(
        dir,
        "[[tier]]\nname = \"x\"\nnamespaces = [\"t1\", \"nope\"]\n",
    );
    for (cp, target, skew, file, says) in [
        (
            "1.39",
            "1.40",
            "1",
            unknown.as_str(),
            "namespace \"nope\" is unknown",
        ),
        (
            "1.40",
            "1.39",
            "1",
            tiers.as_str(),
            "is behind the control plane",
        ),
        (
            "1.39",
            "1.40",
            "0",
            tiers.as_str(),
            "no plan keeps every proxy supported",
        ),
        (
            "1.38",
            "1.40",
            "1",
            tiers.as_str(),
            "no plan keeps every proxy supported",
        ),
    ] {
        let (code, out, err) = run_bin(&[
            "plan",
            "--prometheus",
            url,
            "--tiers",
            file,
            "--control-plane",
            cp,
            "--target",
            target,
            "--max-skew",
            skew,
        ])
        .await;
        assert_eq!(code, Some(64), "{cp} {target} {skew}: {out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains(says), "{says}: {err}");
    }
    let bad = tiers_file(dir, "[[tier]]\nname = \"x\"\n");
    let (code, _, err) = run_bin(&[
        "plan",
        "--prometheus",
        url,
        "--tiers",
        &bad,
        "--control-plane",
        "1.39",
        "--target",
        "1.40",
    ])
    .await;
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("names no namespaces"), "{err}");
}

/// A fresh fleet: the inventory is published, the lifetime soaks, nothing
/// may restart yet.
async fn a_fresh_fleet_may_not_restart_yet(m: &Migration) {
    let Migration { url, tiers, .. } = m;
    let fresh = plan(url, tiers, "1.39", &["--lifetime-soak", "1h"]).await;
    assert_eq!(fresh.code, Some(75), "{}{}", fresh.plan, fresh.err);
    assert_eq!(fresh.plan["verdict"], "wait");
    assert_eq!(fresh.row(1, "")["state"], "done");
    assert!(fresh.row(1, "")["detail"]
        .as_str()
        .is_some_and(|d| d.contains("6 on 1.38")));
    for tier in ["test-services", "internal", "stream-holders"] {
        assert_eq!(fresh.row(2, tier)["state"], "in_progress", "{}", fresh.plan);
        assert_eq!(fresh.row(3, tier)["state"], "not_started");
        assert_eq!(fresh.row(3, tier)["gate"]["ok"], false);
    }
    assert_eq!(fresh.row(4, "")["state"], "not_started");
    println!(
        "{}",
        table(url, tiers, "1.39", &["--lifetime-soak", "1h"]).await
    );
}

/// Soaked: tier 1 may start, with Istio's commands; `--next-only` gives
/// the same action.
async fn once_soaked_tier_1_may_start(m: &Migration) {
    let Migration { url, tiers, .. } = m;
    let soaked = plan_until(
        "the lifetime soaked",
        url,
        tiers,
        "1.39",
        &["--lifetime-soak", "2s"],
        |r| r.code == Some(0),
    )
    .await;
    assert_eq!(soaked.plan["verdict"], "go");
    let next = soaked.next_row();
    assert_eq!(
        (next["step"].as_u64(), next["tier"].as_str()),
        (Some(3), Some("test-services"))
    );
    let commands = soaked.plan["next"]["commands"].to_string();
    assert!(
        commands.contains("kubectl label namespace t1 istio.io/rev=1-39 --overwrite")
            && commands.contains("kubectl -n t1 rollout restart"),
        "{commands}"
    );
    // The next action alone, for a pipeline: the same action and verdict.
    let only = plan(
        url,
        tiers,
        "1.39",
        &[FLAGS_SOAKED, &["--next-only"]].concat(),
    )
    .await;
    assert_eq!(only.code, Some(0), "{}", only.plan);
    assert_eq!(only.plan["verdict"], "go");
    assert_eq!(only.plan["next"]["row"], soaked.plan["next"]["row"]);
    assert!(only.plan.get("rows").is_none(), "{}", only.plan);
}

/// Tier 1 in progress (one pod of two on n-1), then stalled: no change
/// for `--stall-after`.
async fn tier_1_moves_then_stalls(m: &mut Migration) {
    let Migration {
        url,
        tiers,
        client,
        fleet,
    } = m;
    fleet.replace("t1-a", "t1", "t1-a2", N1, true).await;
    wait_versions(client, "t1", &[(N1, 1.0), (N2, 1.0)]).await;
    let moving = plan(url, tiers, "1.39", FLAGS_SOAKED).await;
    assert_eq!(moving.code, Some(0), "{}", moving.plan);
    let r = moving.row(3, "test-services");
    assert_eq!(
        (r["state"].as_str(), r["moved"].as_u64(), r["pods"].as_u64()),
        (Some("in_progress"), Some(1), Some(2)),
        "{r}"
    );
    assert_eq!(moving.next_row()["tier"], "test-services");
    assert!(moving.plan["next"]["action"]
        .as_str()
        .is_some_and(|a| a.contains("go on with")));

    // Stalled: no change for --stall-after.
    let stalled = plan_until(
        "tier 1 stalls",
        url,
        tiers,
        "1.39",
        &["--lifetime-soak", "2s", "--stall-after", "3s"],
        |r| r.code == Some(1),
    )
    .await;
    assert_eq!(stalled.plan["verdict"], "stop");
    assert_eq!(stalled.row(3, "test-services")["state"], "stalled");
    assert!(stalled.plan["next"]["action"]
        .as_str()
        .is_some_and(|a| a.contains("stalled")));
    println!(
        "{}",
        table(
            url,
            tiers,
            "1.39",
            &["--lifetime-soak", "2s", "--stall-after", "3s"]
        )
        .await
    );
}

/// Tier 1 done (its second pod has no guard: its drains will cut) and
/// verified; tier 2 waits for the soak, then may start.
async fn tier_1_verified_then_tier_2_after_the_soak(m: &mut Migration) {
    let Migration {
        url,
        tiers,
        client,
        fleet,
    } = m;
    fleet.replace("t1-b", "t1", "t1-b2", N1, false).await;
    wait_versions(client, "t1", &[(N1, 2.0)]).await;
    let soaking = plan_until(
        "tier 1 finished",
        url,
        tiers,
        "1.39",
        &["--lifetime-soak", "2s", "--soak", "1h"],
        |r| r.row(3, "test-services")["state"] == "verified",
    )
    .await;
    assert_eq!(soaking.code, Some(75), "{}", soaking.plan);
    let t2 = soaking.row(3, "internal");
    assert_eq!(t2["gate"]["ok"], false, "{t2}");
    assert!(t2["gate"]["opens_at"].as_f64().is_some(), "{t2}");
    assert!(soaking.row(3, "test-services")["verify"]["detail"]
        .as_str()
        .is_some_and(|d| d.contains("verify PASS")));

    // The soak over, tier 2 may start.
    let allowed = plan_until(
        "tier 2 allowed",
        url,
        tiers,
        "1.39",
        &["--lifetime-soak", "2s", "--soak", "2s"],
        |r| r.code == Some(0),
    )
    .await;
    assert_eq!(allowed.next_row()["tier"], "internal", "{}", allowed.plan);
    assert_eq!(allowed.next_row()["step"], 3);
}

/// Tiers 2 and 3 on n-1: the control plane may move, rollback by restart
/// is still possible, `skew` agrees, and the estimate counts the waves.
async fn the_control_plane_may_move(m: &mut Migration) {
    let Migration {
        url,
        tiers,
        client,
        fleet,
    } = m;
    for (ns, pods) in [("t2", ["t2-a", "t2-b"]), ("t3", ["t3-a", "t3-b"])] {
        for old in pods {
            fleet.replace(old, ns, &format!("{old}2"), N1, true).await;
        }
        wait_versions(client, ns, &[(N1, 2.0)]).await;
    }
    let cp_ready = plan_until(
        "the control plane may move",
        url,
        tiers,
        "1.39",
        CP_FLAGS,
        |r| r.code == Some(0) && r.next_row()["kind"] == "control_plane",
    )
    .await;
    let cp = cp_ready.row(4, "");
    assert_eq!(cp["gate"]["ok"], true, "{cp}");
    assert!(
        cp["gate"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("all within 1 of 1.40")),
        "{cp}"
    );
    for tier in ["test-services", "internal", "stream-holders"] {
        let r = cp_ready.row(3, tier);
        assert_eq!(r["state"], "verified", "{r}");
        assert_eq!(r["rollback"]["possible"], true, "{r}");
    }
    assert!(cp_ready.plan["next"]["commands"]
        .to_string()
        .contains("istioctl install --set revision=1-40"));
    let (code, out, _) = run_bin(&["skew", "--prometheus", url, "--control-plane", "1.40"]).await;
    assert_eq!(code, Some(0), "{out}");
    println!(
        "{}",
        table(url, tiers, "1.39", &[CP_FLAGS, &["--estimate"]].concat()).await
    );

    let estimated = plan(url, tiers, "1.39", &[CP_FLAGS, &["--estimate"]].concat()).await;
    let e = &estimated.plan["estimate"];
    assert!(
        e["remaining_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{e}"
    );
    assert_eq!(e["waves_left"], 3, "{e}");
    assert!(e["waves_measured"].as_u64().is_some_and(|n| n >= 3), "{e}");
}

/// The control plane moved: rollback by restart is gone, and the second
/// restart may start.
async fn the_control_plane_moved(m: &Migration) {
    let Migration { url, tiers, .. } = m;
    let moved = plan(url, tiers, "1.40", CP_FLAGS).await;
    assert_eq!(moved.code, Some(0), "{}", moved.plan);
    assert_eq!(moved.row(4, "")["state"], "done");
    assert_eq!(moved.row(4, "")["rollback"]["possible"], false);
    // Step 4's gate judges the config pushes over the history, from the
    // store: none cut a stream here (no listener came from xDS).
    let gate = moved.row(4, "")["gate"]["detail"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        gate.contains(
            "config pushes cut no stream (0 listener drains, 0 streams ended gracefully)"
        ),
        "{gate}"
    );
    for tier in ["test-services", "internal", "stream-holders"] {
        assert_eq!(moved.row(3, tier)["rollback"]["possible"], false);
    }
    let next = moved.next_row();
    assert_eq!(
        (next["step"].as_u64(), next["tier"].as_str()),
        (Some(5), Some("test-services")),
        "{}",
        moved.plan
    );
    let (code, out, _) = run_bin(&["skew", "--prometheus", url, "--control-plane", "1.40"]).await;
    assert_eq!(code, Some(0), "{out}");
}

/// Tier 1 to n, with a drain that cuts two streams: the wave fails
/// verify, and the plan stops.
async fn a_wave_that_cuts_streams_fails_verify(m: &mut Migration) {
    let Migration {
        url,
        tiers,
        client,
        fleet,
    } = m;
    let p = pod(fleet.backend, "t1", "t1-c", N, true).await;
    fleet.pods.insert("t1-c".into(), p);
    fleet.publish();
    wait_versions(client, "t1", &[(N, 1.0), (N1, 2.0)]).await;
    let inbound = fleet.pods["t1-b2"].envoy.inbound;
    let _cut = open_streams(inbound, 2, "cut").await;
    let drained = prestop(fleet.pods["t1-b2"].shim).await;
    assert_eq!(drained.report().streams.cut, 2);
    let shim = fleet.pods["t1-b2"].shim;
    wait_for_scalar(
        client,
        "Prometheus has the cut streams",
        WAIT,
        &format!("drainshim_drained_streams_total{{instance=\"{shim}\",outcome=\"cut\"}}"),
        |n| n == 2.0,
    )
    .await;
    fleet.remove("t1-b2");
    fleet.replace("t1-a2", "t1", "t1-d", N, true).await;
    wait_versions(client, "t1", &[(N, 2.0)]).await;
    let failed = plan_until(
        "tier 1's second wave judged",
        url,
        tiers,
        "1.40",
        CP_FLAGS,
        |r| r.row(5, "test-services")["state"] == "done",
    )
    .await;
    assert_eq!(failed.code, Some(1), "{}", failed.plan);
    assert_eq!(failed.plan["verdict"], "stop");
    let r = failed.row(5, "test-services");
    assert!(
        r["verify"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no stream cut by a drain") && d.contains("2 streams cut")),
        "{r}"
    );
    assert!(
        failed.plan["next"]["action"]
            .as_str()
            .is_some_and(|a| a.contains("failed verify")),
        "{}",
        failed.plan
    );
    assert!(failed.plan["next"]["commands"]
        .to_string()
        .contains("drainshim verify"));
    assert_eq!(failed.row(5, "internal")["gate"]["ok"], false);
    println!("{}", table(url, tiers, "1.40", CP_FLAGS).await);
}
