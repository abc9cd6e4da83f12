//! `bench soak --node`: the node agent under the soak's load, with pods
//! coming and going as a rollout makes them.
//!
//! Each pod is a network namespace linked to the host by a veth, with the
//! soak's app inside (WebSockets, every message in the shared ledger) and
//! the admin stand-in for Envoy (`bench admin-stub`, run as `envoy`, so
//! the agent finds the pod through the /proc view). One `drainshim node`
//! agent serves every pod's guard on 0.0.0.0:15097 with the max connection
//! age, and the clients reach the guards at the pods' addresses.
//!
//! Every `drain_every`, one pod in turn is taken out of the clients'
//! rotation, drained through the agent's API (`POST /pods/<ns>/<pod>/drain
//! ?wait=true`, the report read for cut and bypassed streams), removed
//! (its stand-in killed, its namespace deleted) and replaced by a new pod
//! at the same address, which goes back into rotation once the agent
//! serves its guard. What a pod leaves behind in the agent (listener,
//! tasks, guard state) shows as growth across the run.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::node_guard::slash30;
use super::node_scale::{io, ip, wait_stub, Fixture, NodeScaleError, ADMIN_PORT, WAIT};
use super::population::Endpoints;
use super::server::Ledger;
use super::soak::{log_tail, soak, SoakOptions, SoakReport, Subject};
use drainshim::node::netns::Netns;

/// The app inside each pod.
const APP_PORT: u16 = 8080;
/// The agent's guard inside each pod.
const GUARD_PORT: u16 = 15097;
/// The Kubernetes namespace the stand-ins report.
const NAMESPACE: &str = "bench";

fn err(e: NodeScaleError) -> String {
    e.to_string()
}

/// One pod: its network namespace, address, app and Envoy stand-in.
struct Pod {
    name: String,
    netns: String,
    addr: Ipv4Addr,
    stub: Child,
    /// The stand-in's entry in the agent's /proc view.
    link: PathBuf,
    app_stop: CancellationToken,
}

/// The agent and its pods.
struct Node {
    agent: Child,
    pid: u32,
    log: PathBuf,
    api: SocketAddr,
    farm: PathBuf,
    envoy: PathBuf,
    pods: Vec<Pod>,
    endpoints: Endpoints,
    ledger: Ledger,
    drain_every: Duration,
    next_drain: Duration,
    generation: usize,
    drains: u64,
    drains_cut: u64,
    progress: bool,
}

pub async fn run(opts: &SoakOptions, pods: usize) -> Result<SoakReport, String> {
    let (fx, farm, envoy) = Fixture::new("drainshim-node-soak-", &opts.stub).map_err(err)?;
    let ledger = Ledger::default();
    let taken: Vec<Ipv4Addr> = drainshim::node::netns::host_addresses()
        .map_err(|e| format!("list host addresses: {e}"))?
        .into_iter()
        .filter_map(|a| match a {
            std::net::IpAddr::V4(v4) => Some(v4),
            _ => None,
        })
        .collect();
    let mut addrs = Vec::new();
    let mut all_taken = taken.clone();
    for i in 0..pods {
        let (h, p) = slash30(i, &all_taken).ok_or("no free /30 in 198.18.0.0/15")?;
        all_taken.push(h);
        addrs.push((h, p));
    }
    let api = SocketAddr::from(([127, 0, 0, 1], super::reconnect::free_port()?));
    let log = farm.with_file_name("agent.log");
    let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let age = opts.max_connection_age;
    let agent = Command::new(&opts.binary)
        .args(["--log", "warn", "node", "--listen", &api.to_string()])
        .arg("--proc-root")
        .arg(&farm)
        .args(["--scan-interval", "1s", "--pod-retention", "10s"])
        .args([
            "--guard",
            &format!("0.0.0.0:{GUARD_PORT}=127.0.0.1:{APP_PORT}"),
        ])
        .arg(format!("--max-connection-age={}ms", age.as_millis()))
        .args([
            "--max-connection-age-grace=0s",
            "--max-connection-age-spread=0s",
        ])
        .arg(format!(
            "--guard-max-connections={}",
            (opts.streams * 3 / 2).max(2048)
        ))
        // A drain a minute: the window short, the deregistration delay as
        // the clients' rotation already took the pod out.
        .args([
            "--deregistration-delay",
            "1s",
            "--drain-time",
            "20s",
            "--parent-shutdown-time",
            "30s",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start the agent: {e}"))?;
    let pid = agent.id().ok_or("the agent exited at once")?;
    let endpoints = Endpoints::new(
        addrs
            .iter()
            .map(|(_, p)| SocketAddr::from((*p, GUARD_PORT)))
            .collect(),
    );
    let mut node = Node {
        agent,
        pid,
        log,
        api,
        farm,
        envoy,
        pods: Vec::new(),
        endpoints: endpoints.clone(),
        ledger: ledger.clone(),
        drain_every: opts.drain_every,
        next_drain: opts.drain_every,
        generation: 0,
        drains: 0,
        drains_cut: 0,
        progress: opts.progress,
    };
    for (i, (h, p)) in addrs.iter().enumerate() {
        let pod = node.create(i, *h, *p).await?;
        node.pods.push(pod);
    }
    let addrs: Vec<Ipv4Addr> = node.pods.iter().map(|p| p.addr).collect();
    for addr in addrs {
        node.wait_guard(addr).await?;
    }
    node.say(format!("agent (pid {pid}) serves {pods} pods' guards"));
    let report = soak(opts, &mut node, endpoints, &ledger).await;
    drop(node);
    drop(fx);
    report
}

/// The pods' namespaces go with the node, however the run ended (the
/// stand-ins and the agent are killed on drop).
impl Drop for Node {
    fn drop(&mut self) {
        for pod in &self.pods {
            pod.app_stop.cancel();
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &pod.netns])
                .status();
        }
    }
}

impl Node {
    fn say(&self, m: String) {
        if self.progress {
            eprintln!("bench soak --node: {m}");
        }
    }

    /// A pod at `p` (the host's end of its veth at `h`): namespace, link,
    /// app, Envoy stand-in, linked into the agent's /proc view.
    async fn create(&mut self, i: usize, h: Ipv4Addr, p: Ipv4Addr) -> Result<Pod, String> {
        let tag = std::process::id();
        let g = self.generation;
        self.generation += 1;
        let netns = format!("dss{tag}-{g}");
        let name = format!("pod-{i}-{g}");
        ip(&["netns", "add", &netns]).await.map_err(err)?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])
            .await
            .map_err(err)?;
        let (hif, pif) = (format!("dss{tag}h{g}"), format!("dss{tag}p{g}"));
        ip(&[
            "link", "add", &hif, "type", "veth", "peer", "name", &pif, "netns", &netns,
        ])
        .await
        .map_err(err)?;
        ip(&["addr", "add", &format!("{h}/30"), "dev", &hif])
            .await
            .map_err(err)?;
        ip(&["link", "set", &hif, "up"]).await.map_err(err)?;
        ip(&["-n", &netns, "addr", "add", &format!("{p}/30"), "dev", &pif])
            .await
            .map_err(err)?;
        ip(&["-n", &netns, "link", "set", &pif, "up"])
            .await
            .map_err(err)?;
        let path = Path::new("/run/netns").join(&netns);
        let inode = std::fs::metadata(&path)
            .map_err(|e| format!("stat {}: {e}", path.display()))?
            .ino();
        let ns = Netns::open(&path, inode).map_err(|e| e.to_string())?;
        let app_stop = CancellationToken::new();
        self.app_in(&ns, app_stop.clone()).await?;
        let stub = Command::new("ip")
            .args(["netns", "exec", &netns])
            .arg(&self.envoy)
            .args(["--log", "warn", "admin-stub"])
            .args(["--listen", &format!("127.0.0.1:{ADMIN_PORT}")])
            .args(["--namespace", NAMESPACE, "--pod", &name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn an admin stub: {e}"))?;
        let pid = stub.id().unwrap_or(0);
        wait_stub(&ns).await.map_err(err)?;
        let link = self.farm.join(pid.to_string());
        std::os::unix::fs::symlink(format!("/proc/{pid}"), &link)
            .map_err(|e| format!("link into the /proc view: {e}"))?;
        Ok(Pod {
            name,
            netns,
            addr: p,
            stub,
            link,
            app_stop,
        })
    }

    /// The soak's app on 0.0.0.0:8080 inside `ns`, in this process, with
    /// the backlog a Go or Java server has.
    async fn app_in(&self, ns: &Netns, stop: CancellationToken) -> Result<(), String> {
        let std = ns
            .run(|| {
                let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
                s.set_reuse_address(true)?;
                s.bind(&SocketAddr::from(([0, 0, 0, 0], APP_PORT)).into())?;
                s.listen(4096)?;
                s.set_nonblocking(true)?;
                Ok(std::net::TcpListener::from(s))
            })
            .await
            .map_err(io("bind the app inside a pod"))
            .map_err(err)?;
        let listener =
            tokio::net::TcpListener::from_std(std).map_err(|e| format!("app listener: {e}"))?;
        tokio::spawn(super::ws::serve_mixed(
            listener,
            self.ledger.clone(),
            stop.cancelled_owned(),
        ));
        Ok(())
    }

    /// Until the agent's guard accepts at the pod's address.
    async fn wait_guard(&mut self, addr: Ipv4Addr) -> Result<(), String> {
        let target = SocketAddr::from((addr, GUARD_PORT));
        let deadline = Instant::now() + WAIT;
        loop {
            self.alive()?;
            let c = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(target),
            )
            .await;
            if matches!(c, Ok(Ok(_))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the agent's guard at {target} did not accept within {WAIT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Pod `i` out of rotation, drained through the agent, removed, and
    /// replaced by a new pod at its address.
    async fn drain_and_replace(&mut self, i: usize) -> Result<(), String> {
        self.endpoints.remove(i);
        let name = self.pods[i].name.clone();
        let path = format!("/pods/{NAMESPACE}/{name}/drain?wait=true");
        let tcp = tokio::net::TcpStream::connect(self.api)
            .await
            .map_err(|e| format!("the agent's API: {e}"))?;
        let authority = self.api.to_string();
        let asked = drainshim::http::request(tcp, &authority, http::Method::POST, &path);
        let (status, body) = tokio::time::timeout(WAIT, asked)
            .await
            .map_err(|_| format!("drain of {name}: no report within {WAIT:?}"))?
            .map_err(|e| format!("drain of {name}: {e}"))?;
        let body = String::from_utf8_lossy(&body).into_owned();
        if !status.is_success() {
            return Err(format!("drain of {name}: {status}: {body}"));
        }
        let report: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| format!("drain of {name}: the report: {e}: {body}"))?;
        let count = |k: &str| {
            report
                .pointer(&format!("/streams/{k}"))
                .and_then(|v| v.as_u64())
                .unwrap_or(0)
        };
        self.drains += 1;
        if count("cut") + count("bypassed") > 0 {
            self.drains_cut += 1;
        }
        self.say(format!(
            "drained {name} through the agent ({}, {} streams terminated, {} cut); replacing it",
            report["outcome"].as_str().unwrap_or("?"),
            count("terminated"),
            count("cut")
        ));
        let old = self.pods.remove(i);
        old.app_stop.cancel();
        let mut stub = old.stub;
        let _ = stub.start_kill();
        let _ = tokio::time::timeout(WAIT, stub.wait()).await;
        let _ = std::fs::remove_file(&old.link);
        ip(&["netns", "del", &old.netns]).await.map_err(err)?;
        let h = Ipv4Addr::from(u32::from(old.addr) - 1);
        let pod = self.create(i, h, old.addr).await?;
        self.wait_guard(pod.addr).await?;
        self.pods.insert(i, pod);
        self.endpoints.restore(i);
        Ok(())
    }
}

impl Subject for Node {
    fn name(&self) -> &'static str {
        "node agent"
    }
    fn pid(&self) -> u32 {
        self.pid
    }
    fn alive(&mut self) -> Result<(), String> {
        match self.agent.try_wait() {
            Ok(Some(status)) => Err(format!(
                "the agent exited ({status}):\n{}",
                log_tail(&self.log)
            )),
            _ => Ok(()),
        }
    }
    async fn between(&mut self, elapsed: Duration) -> Result<(), String> {
        if elapsed < self.next_drain || self.pods.is_empty() {
            return Ok(());
        }
        self.next_drain += self.drain_every;
        let i = self.drains as usize % self.pods.len();
        self.drain_and_replace(i).await
    }
    fn drains(&self) -> (u64, u64) {
        (self.drains, self.drains_cut)
    }
    fn status(&self) -> SocketAddr {
        self.api
    }
}
