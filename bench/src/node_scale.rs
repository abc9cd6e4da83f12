//! `drainshim bench node-scale`: the node agent with N pods.
//!
//! It creates N network namespaces (loopback only), runs in each one a light
//! admin stand-in (`drainshim-bench admin-stub`, started through a link named
//! `envoy` so its process name is the one the agent looks for) on
//! 127.0.0.1:15000, then starts the real `drainshim node` binary on a private
//! view of `/proc` holding just those processes, and measures:
//!
//! - the time from starting the agent until every pod is inventoried (its
//!   version read from inside its namespace and its preStop listener bound);
//! - the agent's RSS then, and after one full `/metrics` scrape (which reads
//!   every pod's admin API and kernel counters);
//! - the time of that scrape;
//! - the agent's CPU while idle (scanning every 5 s, nobody asking).
//!
//! Needs root. Everything it creates is removed on exit, failure included.

use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use drainshim::node::netns::Netns;

/// Envoy's admin port inside a pod, as the agent expects by default.
pub(crate) const ADMIN_PORT: u16 = 15000;
/// Upper bound on every wait of the benchmark.
pub(crate) const WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, thiserror::Error)]
pub enum NodeScaleError {
    #[error("node-scale needs root (it creates network namespaces)")]
    NotRoot,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Failed(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NodeScaleError {
    let what = what.into();
    move |source| NodeScaleError::Io { what, source }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct NodeScaleOptions {
    /// Pod namespaces to create.
    pub pods: usize,
    /// How long to watch the idle agent's CPU.
    pub idle_window: Duration,
    /// The drainshim binary to run as the agent.
    pub binary: PathBuf,
    /// The drainshim-bench binary, run as the admin stand-ins (`admin-stub`).
    pub stub: PathBuf,
}

/// The figures.
#[derive(Clone, Debug, Serialize)]
pub struct NodeScaleReport {
    /// Pod namespaces created.
    pub pods: usize,
    /// Pods the agent had inventoried when measured (must equal `pods`).
    pub discovered: usize,
    /// Agent start until every pod is inventoried with a listener.
    pub discovery_seconds: f64,
    /// The agent's resident memory once every pod is inventoried.
    pub rss_mib_after_discovery: f64,
    /// One GET /metrics, which reads every pod's admin API and counters.
    pub scrape_seconds: f64,
    /// The same after one full scrape.
    pub rss_mib_after_scrape: f64,
    /// CPU of the idle agent, in percent of one core.
    pub idle_cpu_percent: f64,
    /// How long the idle CPU was measured.
    pub idle_window_seconds: f64,
    /// What stood in for Envoy in each namespace.
    pub admin_endpoint: String,
}

// === impl NodeScaleReport ===

impl NodeScaleReport {
    pub fn render(&self) -> String {
        format!(
            "node-scale: {} pods ({} discovered), admin endpoint: {}\n\
             discovery + inventory   {:>8.3} s   (goal <= 1 s)\n\
             RSS after discovery     {:>8.1} MiB (goal <= 32 MiB)\n\
             one /metrics scrape     {:>8.3} s\n\
             RSS after the scrape    {:>8.1} MiB\n\
             idle CPU                {:>8.2} %   of one core, over {:.0} s\n",
            self.pods,
            self.discovered,
            self.admin_endpoint,
            self.discovery_seconds,
            self.rss_mib_after_discovery,
            self.scrape_seconds,
            self.rss_mib_after_scrape,
            self.idle_cpu_percent,
            self.idle_window_seconds,
        )
    }
}

/// Everything created, removed on drop.
pub(crate) struct Fixture {
    /// Namespace names under /run/netns.
    pub(crate) namespaces: Vec<String>,
    /// Stubs and the agent; killed on drop.
    pub(crate) children: Vec<Child>,
    /// The `envoy` link and the /proc view, removed with the fixture.
    pub(crate) _dir: tempfile::TempDir,
}

// === impl Fixture ===

impl Fixture {
    /// Checks for root, then makes the temporary directory with an empty
    /// /proc view (`farm`, returned first) and `envoy`, a link to `stub`
    /// (drainshim-bench, run as `admin-stub`) under the process name the
    /// agent looks for (returned second).
    pub(crate) fn new(
        prefix: &str,
        stub: &std::path::Path,
    ) -> Result<(Self, PathBuf, PathBuf), NodeScaleError> {
        if !nix::unistd::geteuid().is_root() {
            return Err(NodeScaleError::NotRoot);
        }
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(io("tempdir"))?;
        let farm = dir.path().join("proc");
        std::fs::create_dir(&farm).map_err(io("create the /proc view"))?;
        let envoy = dir.path().join("envoy");
        std::os::unix::fs::symlink(stub, &envoy).map_err(io("link the stub as envoy"))?;
        let fx = Fixture {
            namespaces: Vec::new(),
            children: Vec::new(),
            _dir: dir,
        };
        Ok((fx, farm, envoy))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.start_kill();
        }
        for ns in &self.namespaces {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

pub(crate) async fn ip(args: &[&str]) -> Result<(), NodeScaleError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .await
        .map_err(io("run ip (is iproute2 installed?)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NodeScaleError::Failed(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

pub async fn run(opts: NodeScaleOptions) -> Result<NodeScaleReport, NodeScaleError> {
    let (mut fx, farm, envoy) = Fixture::new("drainshim-node-scale-", &opts.stub)?;

    eprintln!("node-scale: creating {} pod namespaces", opts.pods);
    let tag = std::process::id();
    let mut handles = Vec::new();
    for i in 0..opts.pods {
        let name = format!("dsb{tag}-{i}");
        ip(&["netns", "add", &name]).await?;
        fx.namespaces.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"]).await?;
        let child = Command::new("ip")
            .args(["netns", "exec", &name])
            .arg(&envoy)
            .args(["--log", "warn", "admin-stub"])
            .args(["--listen", &format!("127.0.0.1:{ADMIN_PORT}")])
            .args(["--namespace", "bench", "--pod", &format!("pod-{i}")])
            .args(["--version", "1.40.0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("spawn an admin stub"))?;
        let pid = child.id().unwrap_or(0);
        fx.children.push(child);
        let path = PathBuf::from("/run/netns").join(&name);
        let inode = std::fs::metadata(&path).map_err(io("stat netns"))?.ino();
        let ns = Netns::open(&path, inode).map_err(|e| NodeScaleError::Failed(e.to_string()))?;
        handles.push((pid, ns));
    }
    // Every stub answers before the agent starts, so only the agent is timed.
    for (pid, ns) in &handles {
        wait_stub(ns).await?;
        std::os::unix::fs::symlink(format!("/proc/{pid}"), farm.join(pid.to_string()))
            .map_err(io("link into the /proc view"))?;
    }
    drop(handles);

    let port = super::free_port().map_err(io("pick a port"))?;
    let api = SocketAddr::from(([127, 0, 0, 1], port));
    eprintln!("node-scale: starting the agent");
    let t0 = Instant::now();
    let agent = Command::new(&opts.binary)
        .args(["--log", "warn", "node", "--listen", &api.to_string()])
        .arg("--proc-root")
        .arg(&farm)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(io("spawn the agent"))?;
    let agent_pid = agent.id().unwrap_or(0);
    fx.children.push(agent);

    let discovered = loop {
        let n = inventoried(api).await;
        if n >= opts.pods {
            break n;
        }
        if t0.elapsed() > WAIT {
            return Err(NodeScaleError::Failed(format!(
                "only {n} of {} pods inventoried after {WAIT:?}",
                opts.pods
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let discovery = t0.elapsed();
    let rss_discovery = rss_mib(agent_pid)?;

    let t1 = Instant::now();
    let (code, _) = get(api, "/metrics")
        .await
        .map_err(|e| NodeScaleError::Failed(format!("scrape: {e}")))?;
    if code != 200 {
        return Err(NodeScaleError::Failed(format!("scrape: status {code}")));
    }
    let scrape = t1.elapsed();
    let rss_scrape = rss_mib(agent_pid)?;

    eprintln!(
        "node-scale: watching the idle agent for {}",
        humantime::format_duration(opts.idle_window)
    );
    let cpu0 = cpu_seconds(agent_pid)?;
    let w0 = Instant::now();
    tokio::time::sleep(opts.idle_window).await;
    let cpu1 = cpu_seconds(agent_pid)?;
    let window = w0.elapsed().as_secs_f64();

    drop(fx);
    Ok(NodeScaleReport {
        pods: opts.pods,
        discovered,
        discovery_seconds: discovery.as_secs_f64(),
        rss_mib_after_discovery: rss_discovery,
        scrape_seconds: scrape.as_secs_f64(),
        rss_mib_after_scrape: rss_scrape,
        idle_cpu_percent: 100.0 * (cpu1 - cpu0) / window,
        idle_window_seconds: window,
        admin_endpoint: "drainshim bench admin-stub (hyper, one process per namespace)".into(),
    })
}

pub(crate) async fn wait_stub(ns: &Netns) -> Result<(), NodeScaleError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT));
    let deadline = Instant::now() + WAIT;
    loop {
        if ns.connect(addr, Duration::from_secs(1)).await.is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(NodeScaleError::Failed(format!(
                "the admin stub in {} did not start",
                ns.path().display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (status, body) = tokio::time::timeout(
        WAIT,
        drainshim::http::request(s, &addr.to_string(), http::Method::GET, path),
    )
    .await
    .map_err(|_| "no answer".to_string())?
    .map_err(|e| e.to_string())?;
    Ok((status.as_u16(), String::from_utf8_lossy(&body).into_owned()))
}

/// Pods with a version and a bound listener in the agent's /status.
async fn inventoried(api: SocketAddr) -> usize {
    let Ok((200, body)) = get(api, "/status").await else {
        return 0;
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
        return 0;
    };
    v["pods"].as_array().map_or(0, |pods| {
        pods.iter()
            .filter(|p| p["envoy"]["version"].is_string() && p["listener"]["listening"].is_string())
            .count()
    })
}

pub(crate) fn rss_mib(pid: u32) -> Result<f64, NodeScaleError> {
    let path = Path::new("/proc").join(pid.to_string()).join("status");
    let text = std::fs::read_to_string(&path).map_err(io(format!("read {}", path.display())))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .ok_or_else(|| NodeScaleError::Failed(format!("no VmRSS in {}", path.display())))
}

/// User plus system CPU seconds of a process, from `/proc/<pid>/stat`.
pub(crate) fn cpu_seconds(pid: u32) -> Result<f64, NodeScaleError> {
    super::measure::cpu_time(pid)
        .map(|t| t.as_secs_f64())
        .map_err(io(format!("read /proc/{pid}/stat")))
}
