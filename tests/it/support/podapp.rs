//! Guarded pods for node mode: the bench app on the pod's loopback, a real
//! Envoy running the shipped bootstrap (`deploy/components/envoy/envoy.yaml`:
//! inbound 0.0.0.0:10000, guard 127.0.0.1:15097 at priority 0, the app
//! 127.0.0.1:8080 at priority 1), and the real `drainshim node` binary.
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drainshim_bench::envoy::EnvoyOptions;
use drainshim_bench::envoy::SHIPPED_BOOTSTRAP;
use drainshim_bench::server::BenchService;
use tokio_util::sync::CancellationToken;

use super::node::*;

/// The guard contract every test pod opts in with (node metadata).
pub const GUARD_SPEC: &str = "127.0.0.1:15097=127.0.0.1:8080";
/// Where the shipped bootstrap's inbound listener is, inside the pod.
pub const INBOUND_PORT: u16 = 10000;
/// The guard's listen address inside each pod.
pub const GUARD_LISTEN: &str = "127.0.0.1:15097";
/// The app's address inside each pod.
pub const APP: &str = "127.0.0.1:8080";

/// One guarded pod: namespace, address, app and Envoy.
pub struct GuardedNodePod {
    pub name: String,
    pub ns: Ns,
    pub ip: Ipv4Addr,
    pub envoy: PodEnvoy,
    /// Stops the app.
    pub app: CancellationToken,
}

impl GuardedNodePod {
    /// Envoy's inbound listener, from the host.
    pub fn inbound(&self) -> SocketAddr {
        SocketAddr::from((self.ip, INBOUND_PORT))
    }

    /// The preStop listener, from the host.
    pub fn prestop(&self) -> SocketAddr {
        SocketAddr::from((self.ip, POD_LISTEN_PORT))
    }
}

impl Drop for GuardedNodePod {
    fn drop(&mut self) {
        self.app.cancel();
    }
}

/// The bench app on 127.0.0.1:8080 inside `ns`, served by this process.
pub async fn app_in(ns: &Ns) -> CancellationToken {
    let addr: SocketAddr = APP.parse().expect("app address");
    let std = ns
        .handle()
        .run(move || {
            let l = std::net::TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .await
        .expect("bind the app inside the pod");
    let listener = tokio::net::TcpListener::from_std(std).expect("tokio listener");
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let _ =
            drainshim_bench::server::serve(listener, BenchService::default(), s.cancelled_owned())
                .await;
    });
    stop
}

/// A pod named `name`: its namespace linked to the host, the app in it,
/// and Envoy `version` as `tweak` sets it.
async fn node_pod(
    lab: &Lab,
    name: &str,
    version: &str,
    tweak: impl FnOnce(&mut EnvoyOptions),
) -> GuardedNodePod {
    let ns = lab.netns(name);
    let (_host, ip) = lab.link_host(&ns);
    let app = app_in(&ns).await;
    let envoy = lab.envoy(&ns, version, tweak).await;
    GuardedNodePod {
        name: name.to_string(),
        ns,
        ip,
        envoy,
        app,
    }
}

/// A pod named `name` with Envoy `version`; `guard` is its DRAINSHIM_GUARD
/// metadata (None: no key).
pub async fn guarded_pod(
    lab: &Lab,
    name: &str,
    version: &str,
    guard: Option<&str>,
) -> GuardedNodePod {
    let mut metadata = serde_json::Map::new();
    metadata.insert("NAMESPACE".into(), "shop".into());
    metadata.insert("NAME".into(), name.into());
    if let Some(g) = guard {
        metadata.insert("DRAINSHIM_GUARD".into(), g.into());
    }
    // The shipped file has no node section (the pod spec passes one with
    // --config-yaml); the same metadata goes first here.
    let node = serde_json::json!({ "id": name, "cluster": "drainshim", "metadata": metadata });
    let bootstrap = format!("node: {node}\n{SHIPPED_BOOTSTRAP}");
    node_pod(lab, name, version, |o| o.custom_bootstrap = Some(bootstrap)).await
}

/// Requests Envoy inside `pod` sent to `host` of cluster `app` (`/clusters`).
pub async fn pod_host_requests(pod: &GuardedNodePod, host: &str) -> Option<u64> {
    let admin = SocketAddr::from(([127, 0, 0, 1], POD_ADMIN_PORT));
    let (code, body) = http_in(Some(&pod.ns.handle()), admin, "GET", "/clusters")
        .await
        .ok()?;
    if code != 200 {
        return None;
    }
    let want = format!("app::{host}::rq_total::");
    body.lines()
        .find_map(|l| l.strip_prefix(&want)?.trim().parse().ok())
}

/// Waits until Envoy in `pod` sent more than `before` requests to `host`.
pub async fn wait_pod_host(pod: &GuardedNodePod, host: &str, before: u64) {
    let deadline = tokio::time::Instant::now() + NODE_WAIT;
    loop {
        let n = pod_host_requests(pod, host).await;
        if n.is_some_and(|n| n > before) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: Envoy sent no more than {before} requests to {host} within {NODE_WAIT:?} (last {n:?})",
            pod.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent binary's flags in these tests: short drain timers (a drain
/// with nothing open quiesces in ~200 ms) and a scan every 200 ms.
pub const AGENT_FLAGS: &[(&str, &str)] = &[
    ("--deregistration-delay", "200ms"),
    ("--min-drain-time", "200ms"),
    ("--drain-time", "1s"),
    ("--parent-shutdown-time", "2s"),
    ("--poll-interval", "100ms"),
    ("--admin-timeout", "1s"),
    ("--scan-interval", "200ms"),
];

/// The real `drainshim node` binary, with its stderr collected.
pub struct AgentBin {
    pub child: tokio::process::Child,
    pub log: Arc<Mutex<String>>,
}

impl AgentBin {
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id().expect("agent pid") as i32)
    }

    /// Waits until the log has a line containing `needle`.
    pub async fn wait_log(&self, needle: &str) {
        let deadline = tokio::time::Instant::now() + NODE_WAIT;
        while !self.log().contains(needle) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line {needle:?} within {NODE_WAIT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `drainshim node --listen <listen> --proc-root <lab> AGENT_FLAGS <extra>`,
/// returned once it logged "node agent ready".
pub async fn agent_bin(lab: &Lab, listen: SocketAddr, extra: &[&str]) -> AgentBin {
    let agent = agent_bin_started(lab, listen, extra);
    agent.wait_log("node agent ready").await;
    agent
}

/// [`agent_bin`], returned at once, while it starts.
pub fn agent_bin_started(lab: &Lab, listen: SocketAddr, extra: &[&str]) -> AgentBin {
    let farm = lab.farm.path().to_string_lossy().into_owned();
    let mut cmd = tokio::process::Command::new(super::drainshim_bin());
    cmd.args([
        "node",
        "--listen",
        &listen.to_string(),
        "--proc-root",
        &farm,
    ])
    .args(AGENT_FLAGS.iter().flat_map(|&(flag, value)| [flag, value]))
    .args(extra)
    .env("RUST_LOG", "info")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn drainshim node");
    let log = Arc::new(Mutex::new(String::new()));
    super::peers::collect(child.stderr.take().expect("stderr"), log.clone());
    AgentBin { child, log }
}

/// Waits until the agent at `api` serves a guard in every pod named.
pub async fn wait_guards(api: SocketAddr, pods: &[&str]) {
    let deadline = tokio::time::Instant::now() + NODE_WAIT;
    loop {
        let status = match http_in(None, api, "GET", "/status").await {
            Ok((200, body)) => serde_json::from_str::<serde_json::Value>(&body).ok(),
            _ => None,
        };
        let serving = |p: &str| {
            status.as_ref().is_some_and(|s| {
                s["pods"].as_array().is_some_and(|all| {
                    all.iter()
                        .any(|x| x["pod"] == p && x["guard"].get("serving").is_some())
                })
            })
        };
        if pods.iter().all(|p| serving(p)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "guards not all serving within {NODE_WAIT:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A pod like [`guarded_pod`] (the guard opted in by node metadata), but
/// its Envoy runs a user's own minimal inbound bootstrap: the guard is the
/// app cluster's only endpoint, with no retry policy, no fallback priority
/// and no health check (the harness's generated bootstrap with
/// `fallback`/`route_retry` None, its inbound listener on 0.0.0.0:10000).
/// Nothing is retried, so whatever the guard fails, a caller sees.
pub async fn no_retry_pod(lab: &Lab, name: &str, version: &str) -> GuardedNodePod {
    node_pod(lab, name, version, |o| {
        o.upstream = GUARD_LISTEN.parse().expect("guard address");
        o.fallback = None;
        o.route_retry = None;
        o.node_id = name.to_string();
        o.metadata.insert("NAMESPACE".into(), "shop".into());
        o.metadata.insert("NAME".into(), name.into());
        o.metadata
            .insert("DRAINSHIM_GUARD".into(), GUARD_SPEC.into());
        let generated = o.bootstrap();
        assert!(
            !generated.contains("retry_policy") && !generated.contains("priority: 1"),
            "{generated}"
        );
        // The inbound listener is the first 127.0.0.1:0 (the outbound one follows).
        let ephemeral = "socket_address: { address: 127.0.0.1, port_value: 0 }";
        assert!(generated.contains(ephemeral), "{generated}");
        o.custom_bootstrap = Some(generated.replacen(
            ephemeral,
            &format!("socket_address: {{ address: 0.0.0.0, port_value: {INBOUND_PORT} }}"),
            1,
        ));
    })
    .await
}
