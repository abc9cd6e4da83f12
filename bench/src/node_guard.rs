//! `drainshim bench node-scale --guards`: N pods, each with a stream guard,
//! served once by the node agent (one process, N guards) and once by one
//! sidecar guard per pod, under the same offered unary load.
//!
//! Each pod is a network namespace linked to the host by a veth, with the
//! bench app (this process's tonic backend, bound inside the pod on
//! 0.0.0.0:8080) and the admin stand-in for Envoy (`bench admin-stub`, run
//! as `envoy`, so the agent finds the pod). The guard listens on
//! 0.0.0.0:15097 inside each pod (the agent's `--guard`, or
//! `sidecar --guard-listen`), so the client reaches it at the pod's address.
//!
//! Measured, in one run, each against a baseline of the same run:
//! - the agent's RSS with N guards serving, and its idle CPU; the sum of the
//!   N sidecars' RSS and idle CPU;
//! - unary Echo at a fixed offered rate spread over the pods: straight to
//!   the app (the baseline), through the agent's guards, through the
//!   sidecars' guards: completed calls per second, p50 and p99, failures,
//!   and CPU seconds the guards spent per 1000 calls;
//! - fairness: pod 0 flooded (closed loop, many workers) while the others
//!   keep their share of the offered load: their p99 through the agent
//!   against the same through sidecars (on one machine both share its CPU).
//!
//! Nothing is asserted about speed.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::node_scale::{
    cpu_seconds, get, io, ip, rss_mib, wait_stub, Fixture, NodeScaleError, ADMIN_PORT, WAIT,
};
use crate::proto::bench::stream_client::StreamClient;
use crate::proto::bench::EchoRequest;
use drainshim::node::netns::Netns;

/// The app inside each pod (all addresses: the baseline calls it directly).
const APP_PORT: u16 = 8080;
/// The guard inside each pod.
const GUARD_PORT: u16 = 15097;
/// Calls in flight per pod beyond which the open-loop client sheds a tick
/// (counted): a stalled path shows as shed calls, not as unbounded tasks.
const MAX_IN_FLIGHT: u64 = 64;
/// A call slower than this counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Workers hammering pod 0 in the fairness run, each back to back.
const FLOOD_WORKERS: usize = 32;

/// What to run.
#[derive(Clone, Debug)]
pub struct NodeGuardOptions {
    pub pods: usize,
    pub idle_window: Duration,
    /// The drainshim binary, run as the agent and the per-pod sidecars.
    pub binary: PathBuf,
    /// The drainshim-bench binary, run as the admin stand-ins (`admin-stub`).
    pub stub: PathBuf,
    /// Offered unary calls per second, over all pods.
    pub rate: f64,
    /// How long each load phase runs.
    pub load_duration: Duration,
}

/// One load phase, as the client saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadFigures {
    pub offered_per_second: f64,
    pub completed_per_second: f64,
    pub failed: u64,
    pub shed: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU seconds the guard processes spent per 1000 completed calls
    /// (0 for the baseline, which has none).
    pub guard_cpu_ms_per_call: f64,
}

/// The figures.
#[derive(Clone, Debug, Serialize)]
pub struct NodeGuardReport {
    pub pods: usize,
    /// Pods whose guard the agent served when measured (must equal `pods`).
    pub agent_guards: usize,
    pub agent_rss_mib: f64,
    pub agent_idle_cpu_percent: f64,
    pub sidecars_rss_mib_total: f64,
    pub sidecars_idle_cpu_percent_total: f64,
    pub direct: LoadFigures,
    pub agent: LoadFigures,
    pub sidecars: LoadFigures,
    /// Other pods' p99 through the agent while pod 0 is flooded.
    pub fairness_others_p99_ms: f64,
    /// Calls per second pod 0's flood got through.
    pub fairness_flood_per_second: f64,
    /// The same with one sidecar guard per pod: the baseline of fairness.
    pub fairness_sidecars_others_p99_ms: f64,
    /// Calls per second pod 0's flood got through its sidecar.
    pub fairness_sidecars_flood_per_second: f64,
    pub idle_window_seconds: f64,
}

impl NodeGuardReport {
    pub fn render(&self) -> String {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let added = |x: &LoadFigures| x.p99_ms - self.direct.p99_ms;
        let row = |name: &str, x: &LoadFigures| {
            format!(
                "  {name:<22} {:>8.0}/s {:>8.0}/s {:>7.2} ms {:>7.2} ms {:>6} {:>6} {:>9.3}\n",
                x.offered_per_second,
                x.completed_per_second,
                x.p50_ms,
                x.p99_ms,
                x.failed,
                x.shed,
                x.guard_cpu_ms_per_call
            )
        };
        let mut out = format!(
            "node-scale --guards: {} pods, each with a stream guard ({} served by the agent)\n\
             agent RSS               {:>8.1} MiB   ({:.2} MiB per pod; goal <= 64 MiB)\n\
             {} sidecar guards RSS   {:>8.1} MiB   ({:.2} MiB per pod)\n\
             RSS agent / sidecars    {:>8.3}\n\
             idle CPU agent          {:>8.2} %   of one core, over {:.0} s\n\
             idle CPU sidecars (sum) {:>8.2} %\n\
             unary Echo, same offered load  offered  completed     p50       p99   failed  shed  guard CPU ms/call\n",
            self.pods,
            self.agent_guards,
            self.agent_rss_mib,
            self.agent_rss_mib / self.pods.max(1) as f64,
            self.pods,
            self.sidecars_rss_mib_total,
            self.sidecars_rss_mib_total / self.pods.max(1) as f64,
            ratio(self.agent_rss_mib, self.sidecars_rss_mib_total),
            self.agent_idle_cpu_percent,
            self.idle_window_seconds,
            self.sidecars_idle_cpu_percent_total,
        );
        out.push_str(&row("direct to the app", &self.direct));
        out.push_str(&row("through the agent", &self.agent));
        out.push_str(&row("through sidecar guards", &self.sidecars));
        out.push_str(&format!(
            "throughput agent / sidecars   {:>8.3}\n\
             p99 added: agent {:.2} ms, sidecars {:.2} ms (agent / sidecars {:.3})\n\
             guard CPU per call agent / sidecars {:>8.3}\n\
             fairness, pod 0 flooded: the other pods' p99 through the agent {:.2} ms ({:.0} flood calls/s), \
             through sidecars {:.2} ms ({:.0} flood calls/s): agent / sidecars {:.3}\n",
            ratio(
                self.agent.completed_per_second,
                self.sidecars.completed_per_second
            ),
            added(&self.agent),
            added(&self.sidecars),
            ratio(added(&self.agent), added(&self.sidecars)),
            ratio(
                self.agent.guard_cpu_ms_per_call,
                self.sidecars.guard_cpu_ms_per_call
            ),
            self.fairness_others_p99_ms,
            self.fairness_flood_per_second,
            self.fairness_sidecars_others_p99_ms,
            self.fairness_sidecars_flood_per_second,
            ratio(
                self.fairness_others_p99_ms,
                self.fairness_sidecars_others_p99_ms
            ),
        ));
        out
    }
}

fn failed(what: impl Into<String>) -> NodeScaleError {
    NodeScaleError::Failed(what.into())
}

/// A free /30 in 198.18.0.0/15 not on any host interface: (host, pod).
pub(super) fn slash30(i: usize, taken: &[Ipv4Addr]) -> Option<(Ipv4Addr, Ipv4Addr)> {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    let start = (std::process::id() as usize * 131) % 32768;
    (0..32768)
        .map(|k| (start + i * 4 + k * 997) % 32768)
        .find_map(|slot| {
            let net = base + slot as u32 * 4;
            (!taken.iter().any(|t| u32::from(*t) & !3 == net))
                .then(|| (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2)))
        })
}

/// The bench app on 0.0.0.0:8080 inside `ns`, in this process.
async fn app_in(ns: &Netns, stop: CancellationToken) -> Result<(), NodeScaleError> {
    let std = ns
        .run(|| {
            let l = std::net::TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], APP_PORT)))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .await
        .map_err(io("bind the app inside a pod"))?;
    let listener = tokio::net::TcpListener::from_std(std).map_err(io("app listener"))?;
    tokio::spawn(async move {
        let _ = super::server::serve(
            listener,
            super::server::BenchService::default(),
            stop.cancelled_owned(),
        )
        .await;
    });
    Ok(())
}

/// Waits until `addr` accepts a TCP connection.
async fn wait_port(addr: SocketAddr) -> Result<(), NodeScaleError> {
    let deadline = Instant::now() + WAIT;
    loop {
        let c = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await;
        if matches!(c, Ok(Ok(_))) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(failed(format!("{addr} did not accept within {WAIT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Pods whose guard the agent serves, from its /status.
async fn guards_serving(api: SocketAddr) -> usize {
    let Ok((200, body)) = get(api, "/status").await else {
        return 0;
    };
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v["pods"].as_array().map(|pods| {
                pods.iter()
                    .filter(|p| p["guard"].get("serving").is_some())
                    .count()
            })
        })
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Open-loop unary load: `rate` calls per second spread evenly over
/// `targets`, for `duration`, each target on its own HTTP/2 connection
/// (warmed with one call first).
async fn offered_load(targets: &[SocketAddr], rate: f64, duration: Duration) -> LoadFigures {
    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let failed = Arc::new(AtomicU64::new(0));
    let shed = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for t in targets {
        let Ok(ep) = tonic::transport::Endpoint::from_shared(format!("http://{t}")) else {
            continue;
        };
        let mut c = StreamClient::new(ep.connect_lazy());
        // Warm: the connection is made before the clock starts.
        let _ = tokio::time::timeout(CALL_TIMEOUT, c.echo(EchoRequest::default())).await;
        clients.push(c);
    }
    let per_target = rate / clients.len().max(1) as f64;
    let period = Duration::from_secs_f64(1.0 / per_target.max(0.001));
    let start = Instant::now();
    let end = start + duration;
    let mut tasks = Vec::new();
    for (k, client) in clients.into_iter().enumerate() {
        let (latencies, failed, shed) = (latencies.clone(), failed.clone(), shed.clone());
        // Targets start staggered over one period, so ticks do not align.
        let first = start + period.mul_f64(k as f64 / targets.len().max(1) as f64);
        tasks.push(tokio::spawn(async move {
            let in_flight = Arc::new(AtomicU64::new(0));
            let calls = tokio_util::task::TaskTracker::new();
            let mut tick = tokio::time::interval_at(first, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            loop {
                let at = tick.tick().await;
                if at >= end {
                    break;
                }
                if in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
                    shed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                in_flight.fetch_add(1, Ordering::Relaxed);
                let mut c = client.clone();
                let (lat, f, n) = (latencies.clone(), failed.clone(), in_flight.clone());
                calls.spawn(async move {
                    let t0 = Instant::now();
                    let r =
                        tokio::time::timeout(CALL_TIMEOUT, c.echo(EchoRequest::default())).await;
                    match r {
                        Ok(Ok(_)) => {
                            if let Ok(mut l) = lat.lock() {
                                l.push(t0.elapsed().as_secs_f64() * 1000.0);
                            }
                        }
                        _ => {
                            f.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    n.fetch_sub(1, Ordering::Relaxed);
                });
            }
            calls.close();
            calls.wait().await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let seconds = duration.as_secs_f64();
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort_by(|a, b| a.total_cmp(b));
    LoadFigures {
        offered_per_second: rate,
        completed_per_second: l.len() as f64 / seconds,
        failed: failed.load(Ordering::Relaxed),
        shed: shed.load(Ordering::Relaxed),
        p50_ms: percentile(&l, 0.50),
        p99_ms: percentile(&l, 0.99),
        guard_cpu_ms_per_call: 0.0,
    }
}

/// Closed-loop flood of `target` until `stop`: calls completed.
async fn flood(target: SocketAddr, stop: CancellationToken) -> u64 {
    let Ok(ep) = tonic::transport::Endpoint::from_shared(format!("http://{target}")) else {
        return 0;
    };
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..FLOOD_WORKERS)
        .map(|_| {
            let mut c = StreamClient::new(ep.connect_lazy());
            let (stop, done) = (stop.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let call = tokio::time::timeout(CALL_TIMEOUT, c.echo(EchoRequest::default()));
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        r = call => if matches!(r, Ok(Ok(_))) {
                            done.fetch_add(1, Ordering::Relaxed);
                        },
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    done.load(Ordering::Relaxed)
}

/// Pod 0 flooded while the others get their share of the offered load:
/// (the others' p99 in ms, the flood's calls per second).
async fn fairness(guarded: &[SocketAddr], rate: f64, duration: Duration) -> (f64, f64) {
    if guarded.len() < 2 {
        return (0.0, 0.0);
    }
    let stop = CancellationToken::new();
    let flooding = tokio::spawn(flood(guarded[0], stop.clone()));
    let share = rate * (guarded.len() - 1) as f64 / guarded.len() as f64;
    let others = offered_load(&guarded[1..], share, duration).await;
    stop.cancel();
    let flooded = flooding.await.unwrap_or(0);
    (others.p99_ms, flooded as f64 / duration.as_secs_f64())
}

fn cpu_of(pids: &[u32]) -> Result<f64, NodeScaleError> {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// Runs `load` (of `duration`) while measuring the CPU `pids` spend on it.
async fn measured(
    pids: &[u32],
    duration: Duration,
    load: impl std::future::Future<Output = LoadFigures>,
) -> Result<LoadFigures, NodeScaleError> {
    let c0 = cpu_of(pids)?;
    let mut f = load.await;
    let cpu = cpu_of(pids)? - c0;
    let calls = f.completed_per_second * duration.as_secs_f64();
    f.guard_cpu_ms_per_call = if calls > 0.0 {
        cpu * 1000.0 / calls
    } else {
        0.0
    };
    Ok(f)
}

pub async fn run(opts: NodeGuardOptions) -> Result<NodeGuardReport, NodeScaleError> {
    let (mut fx, farm, envoy) = Fixture::new("drainshim-node-guard-", &opts.stub)?;
    let apps = CancellationToken::new();
    let _apps_stop = apps.clone().drop_guard();

    eprintln!(
        "node-scale --guards: creating {} pods (namespace, veth, app, admin stand-in)",
        opts.pods
    );
    let mut taken: Vec<Ipv4Addr> = drainshim::node::netns::host_addresses()
        .map_err(io("list host addresses"))?
        .into_iter()
        .filter_map(|a| match a {
            std::net::IpAddr::V4(v4) => Some(v4),
            _ => None,
        })
        .collect();
    let tag = std::process::id();
    let mut pods: Vec<(String, Ipv4Addr, Netns)> = Vec::new();
    for i in 0..opts.pods {
        let name = format!("dsg{tag}-{i}");
        ip(&["netns", "add", &name]).await?;
        fx.namespaces.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"]).await?;
        let (h, p) = slash30(i, &taken).ok_or_else(|| failed("no free /30 in 198.18.0.0/15"))?;
        taken.push(h);
        let (hif, pif) = (format!("dsg{tag}h{i}"), format!("dsg{tag}p{i}"));
        ip(&[
            "link", "add", &hif, "type", "veth", "peer", "name", &pif, "netns", &name,
        ])
        .await?;
        ip(&["addr", "add", &format!("{h}/30"), "dev", &hif]).await?;
        ip(&["link", "set", &hif, "up"]).await?;
        ip(&["-n", &name, "addr", "add", &format!("{p}/30"), "dev", &pif]).await?;
        ip(&["-n", &name, "link", "set", &pif, "up"]).await?;
        let path = PathBuf::from("/run/netns").join(&name);
        let inode = std::fs::metadata(&path).map_err(io("stat netns"))?.ino();
        let ns = Netns::open(&path, inode).map_err(|e| failed(e.to_string()))?;
        app_in(&ns, apps.clone()).await?;
        let stub = Command::new("ip")
            .args(["netns", "exec", &name])
            .arg(&envoy)
            .args(["--log", "warn", "admin-stub"])
            .args(["--listen", &format!("127.0.0.1:{ADMIN_PORT}")])
            .args(["--namespace", "bench", "--pod", &format!("pod-{i}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("spawn an admin stub"))?;
        let pid = stub.id().unwrap_or(0);
        fx.children.push(stub);
        wait_stub(&ns).await?;
        std::os::unix::fs::symlink(format!("/proc/{pid}"), farm.join(pid.to_string()))
            .map_err(io("link into the /proc view"))?;
        pods.push((name, p, ns));
    }
    let direct: Vec<SocketAddr> = pods
        .iter()
        .map(|(_, p, _)| SocketAddr::from((*p, APP_PORT)))
        .collect();
    let guarded: Vec<SocketAddr> = pods
        .iter()
        .map(|(_, p, _)| SocketAddr::from((*p, GUARD_PORT)))
        .collect();
    for a in &direct {
        wait_port(*a).await?;
    }

    // The baseline: straight to the apps.
    eprintln!("node-scale --guards: baseline, straight to the apps");
    let direct_fig = offered_load(&direct, opts.rate, opts.load_duration).await;

    // The agent, serving every pod's guard.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(io("pick a port"))?
        .port();
    let api = SocketAddr::from(([127, 0, 0, 1], port));
    let mut agent: Child = Command::new(&opts.binary)
        .args(["--log", "warn", "node", "--listen", &api.to_string()])
        .arg("--proc-root")
        .arg(&farm)
        .args([
            "--guard",
            &format!("0.0.0.0:{GUARD_PORT}=127.0.0.1:{APP_PORT}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(io("spawn the agent"))?;
    let agent_pid = agent.id().unwrap_or(0);
    let t0 = Instant::now();
    let agent_guards = loop {
        let n = guards_serving(api).await;
        if n >= opts.pods {
            break n;
        }
        if t0.elapsed() > WAIT {
            return Err(failed(format!(
                "the agent serves {n} of {} guards after {WAIT:?}",
                opts.pods
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for a in &guarded {
        wait_port(*a).await?;
    }
    eprintln!(
        "node-scale --guards: the agent serves {agent_guards} guards; idle for {}",
        humantime::format_duration(opts.idle_window)
    );
    let c0 = cpu_seconds(agent_pid)?;
    let w0 = Instant::now();
    tokio::time::sleep(opts.idle_window).await;
    let agent_idle = 100.0 * (cpu_seconds(agent_pid)? - c0) / w0.elapsed().as_secs_f64();
    eprintln!("node-scale --guards: load through the agent");
    let agent_fig = measured(
        &[agent_pid],
        opts.load_duration,
        offered_load(&guarded, opts.rate, opts.load_duration),
    )
    .await?;
    let agent_rss = rss_mib(agent_pid)?;

    eprintln!("node-scale --guards: fairness, pod 0 flooded (agent)");
    let (fair_p99, flood_rate) = fairness(&guarded, opts.rate, opts.load_duration).await;
    let _ = agent.start_kill();
    let _ = tokio::time::timeout(WAIT, agent.wait()).await;

    // One sidecar guard per pod.
    eprintln!(
        "node-scale --guards: {} sidecar guards, one per pod",
        opts.pods
    );
    let mut sidecar_pids = Vec::new();
    for (name, _, _) in &pods {
        let child = Command::new("ip")
            .args(["netns", "exec", name])
            .arg(&opts.binary)
            .args(["--log", "warn", "sidecar", "--listen", "127.0.0.1:15096"])
            .args(["--envoy-admin", &format!("http://127.0.0.1:{ADMIN_PORT}")])
            .args(["--guard-listen", &format!("0.0.0.0:{GUARD_PORT}")])
            .args(["--guard-upstream", &format!("127.0.0.1:{APP_PORT}")])
            .args(["--linger", "0s"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("spawn a sidecar"))?;
        sidecar_pids.push(child.id().unwrap_or(0));
        fx.children.push(child);
    }
    for a in &guarded {
        wait_port(*a).await?;
    }
    let c0 = cpu_of(&sidecar_pids)?;
    let w0 = Instant::now();
    tokio::time::sleep(opts.idle_window).await;
    let idle_window = w0.elapsed().as_secs_f64();
    let sidecars_idle = 100.0 * (cpu_of(&sidecar_pids)? - c0) / idle_window;
    eprintln!("node-scale --guards: load through the sidecars");
    let sidecar_fig = measured(
        &sidecar_pids,
        opts.load_duration,
        offered_load(&guarded, opts.rate, opts.load_duration),
    )
    .await?;
    eprintln!("node-scale --guards: fairness, pod 0 flooded (sidecars)");
    let (fair_sidecars_p99, flood_sidecars_rate) =
        fairness(&guarded, opts.rate, opts.load_duration).await;
    let sidecars_rss = sidecar_pids
        .iter()
        .map(|p| rss_mib(*p))
        .sum::<Result<f64, _>>()?;

    drop(fx);
    Ok(NodeGuardReport {
        pods: opts.pods,
        agent_guards,
        agent_rss_mib: agent_rss,
        agent_idle_cpu_percent: agent_idle,
        sidecars_rss_mib_total: sidecars_rss,
        sidecars_idle_cpu_percent_total: sidecars_idle,
        direct: direct_fig,
        agent: agent_fig,
        sidecars: sidecar_fig,
        fairness_others_p99_ms: fair_p99,
        fairness_flood_per_second: flood_rate,
        fairness_sidecars_others_p99_ms: fair_sidecars_p99,
        fairness_sidecars_flood_per_second: flood_sidecars_rate,
        idle_window_seconds: idle_window,
    })
}
