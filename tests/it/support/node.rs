//! Node-mode harness: network namespaces stand in for pods.
//!
//! A `Lab` creates namespaces, veth pairs and addresses from the benchmark
//! range 198.18.0.0/15 (checked against the host's addresses first), runs
//! real Envoys inside namespaces, and keeps a private view of `/proc` (a
//! folder of `<pid> -> /proc/<pid>` links) so an agent under test sees only
//! this test's Envoys. Dropping the Lab deletes everything it made, even when
//! the test failed. Names are unique per process and per Lab, so tests run
//! in parallel.
//!
//! Needs root (namespaces, veths): a non-root run fails with a clear
//! message, it never skips.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use drainshim::envoy::AdminClient;
use drainshim::node::netns::{Netns, NetnsDial};
use drainshim_bench::envoy::{cache_dir, cached, EnvoyOptions};
use tokio::process::{Child, Command};

/// Every Lab, link and namespace of this process gets the next number.
static COUNTER: AtomicUsize = AtomicUsize::new(0);
/// Envoy's admin port inside each pod, as in a real mesh.
pub const POD_ADMIN_PORT: u16 = 15000;
/// The preStop listener the agent plants in each pod.
pub const POD_LISTEN_PORT: u16 = 15099;
/// Upper bound of one wait in these tests (Envoy start, a scan, a drain).
pub const NODE_WAIT: Duration = Duration::from_secs(30);

fn next() -> usize {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Runs a command to completion; panics with its stderr on failure.
pub fn run(args: &[&str]) {
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Best effort, for clean-up: errors are printed, never raised.
fn run_quiet(args: &[&str]) {
    match std::process::Command::new(args[0])
        .args(&args[1..])
        .stderr(Stdio::piped())
        .output()
    {
        Ok(out) if !out.status.success() => {
            eprintln!(
                "cleanup {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        }
        Err(e) => eprintln!("cleanup {args:?}: {e}"),
        Ok(_) => {}
    }
}

/// A network namespace made by a Lab (`/run/netns/<name>`).
#[derive(Clone, Debug)]
pub struct Ns {
    /// Its name for `ip netns`.
    pub name: String,
    /// Its inode: the agent's key for the pod.
    pub inode: u64,
}

impl Ns {
    /// A pinned handle, for dialling from inside.
    pub fn handle(&self) -> Netns {
        let path = PathBuf::from("/run/netns").join(&self.name);
        Netns::open(&path, self.inode).unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    }
}

/// Everything one test created; removed on drop.
pub struct Lab {
    /// Unique prefix of this Lab's names.
    id: String,
    /// Namespaces to delete.
    namespaces: Mutex<Vec<String>>,
    /// Host-side veths to delete (pairs inside namespaces go with them).
    links: Mutex<Vec<String>>,
    /// The private `/proc` view handed to the agent as --proc-root.
    pub farm: tempfile::TempDir,
}

impl Lab {
    pub fn new(tag: &str) -> Self {
        assert!(
            nix::unistd::geteuid().is_root(),
            "node-mode tests need root (they create network namespaces and veths); \
             run them as root. They never skip."
        );
        assert!(
            std::process::Command::new("ip")
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success()),
            "node-mode tests need iproute2's `ip` on PATH (apt-get install iproute2)"
        );
        let id = format!("ds{}{}{tag}", std::process::id(), next());
        Self {
            id,
            namespaces: Mutex::default(),
            links: Mutex::default(),
            farm: tempfile::Builder::new()
                .prefix("drainshim-proc-")
                .tempdir()
                .expect("tempdir"),
        }
    }

    /// A new namespace with loopback up.
    pub fn netns(&self, tag: &str) -> Ns {
        let name = format!("{}-{}{tag}", self.id, next());
        run(&["ip", "netns", "add", &name]);
        self.namespaces.lock().unwrap().push(name.clone());
        run(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        let inode = std::fs::metadata(PathBuf::from("/run/netns").join(&name))
            .expect("stat netns")
            .ino();
        Ns { name, inode }
    }

    /// Deletes a namespace now (its veths go with it).
    pub fn remove_netns(&self, ns: &Ns) {
        run(&["ip", "netns", "del", &ns.name]);
        self.namespaces.lock().unwrap().retain(|n| n != &ns.name);
    }

    /// Links `ns` to the host with a veth pair in a fresh /30: returns
    /// (host side, pod side). The pod's default route goes to the host.
    pub fn link_host(&self, ns: &Ns) -> (Ipv4Addr, Ipv4Addr) {
        let (h, p) = free_slash30();
        let n = next();
        let host_if = format!("dsv{:x}h{n}", std::process::id());
        let pod_if = format!("dsv{:x}p{n}", std::process::id());
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &pod_if, "netns",
            &ns.name,
        ]);
        self.links.lock().unwrap().push(host_if.clone());
        run(&["ip", "addr", "add", &format!("{h}/30"), "dev", &host_if]);
        run(&["ip", "link", "set", &host_if, "up"]);
        run(&[
            "ip",
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{p}/30"),
            "dev",
            &pod_if,
        ]);
        run(&["ip", "-n", &ns.name, "link", "set", &pod_if, "up"]);
        run(&[
            "ip",
            "-n",
            &ns.name,
            "route",
            "add",
            "default",
            "via",
            &h.to_string(),
        ]);
        (h, p)
    }

    /// A direct veth between two namespaces (no host involved): returns
    /// (a's address, b's address).
    pub fn link_pair(&self, a: &Ns, b: &Ns) -> (Ipv4Addr, Ipv4Addr) {
        let (x, y) = free_slash30();
        let n = next();
        let a_if = format!("dsv{:x}a{n}", std::process::id());
        let b_if = format!("dsv{:x}b{n}", std::process::id());
        run(&[
            "ip", "link", "add", &a_if, "netns", &a.name, "type", "veth", "peer", "name", &b_if,
            "netns", &b.name,
        ]);
        run(&[
            "ip",
            "-n",
            &a.name,
            "addr",
            "add",
            &format!("{x}/30"),
            "dev",
            &a_if,
        ]);
        run(&["ip", "-n", &a.name, "link", "set", &a_if, "up"]);
        run(&[
            "ip",
            "-n",
            &b.name,
            "addr",
            "add",
            &format!("{y}/30"),
            "dev",
            &b_if,
        ]);
        run(&["ip", "-n", &b.name, "link", "set", &b_if, "up"]);
        (x, y)
    }

    /// Shows a process to the agent through the private /proc view.
    pub fn expose(&self, pid: u32) -> PathBuf {
        let link = self.farm.path().join(pid.to_string());
        std::os::unix::fs::symlink(format!("/proc/{pid}"), &link).expect("symlink into the farm");
        link
    }

    /// A real Envoy of `version` inside `ns`, admin on 127.0.0.1:15000 there.
    pub async fn envoy(
        &self,
        ns: &Ns,
        version: &str,
        tweak: impl FnOnce(&mut EnvoyOptions),
    ) -> PodEnvoy {
        let binary = cached(version).unwrap_or_else(|| {
            panic!(
                "Envoy {version} is missing from {}: run `make envoy`. Tests never skip for it.",
                cache_dir().display()
            )
        });
        let mut opts = EnvoyOptions::new(binary, SocketAddr::from(([127, 0, 0, 1], 9)));
        opts.admin_port = POD_ADMIN_PORT;
        opts.drain_time = Duration::from_secs(1);
        opts.parent_shutdown_time = Duration::from_secs(2);
        tweak(&mut opts);
        PodEnvoy::start(self, ns, &opts).await
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for link in self
            .links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // Gone already when its namespace was deleted: stay quiet then.
            if Path::new("/sys/class/net").join(&link).exists() {
                run_quiet(&["ip", "link", "del", &link]);
            }
        }
        for ns in self
            .namespaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            run_quiet(&["ip", "netns", "del", &ns]);
        }
    }
}

/// A free /30 in 198.18.0.0/15: (first host, second host). Candidates start
/// at a place derived from the pid and counter, and any /30 that already has
/// an address on this host is skipped.
fn free_slash30() -> (Ipv4Addr, Ipv4Addr) {
    let taken: Vec<Ipv4Addr> = drainshim::node::netns::host_addresses()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|a| match a {
            std::net::IpAddr::V4(v4) => Some(v4),
            _ => None,
        })
        .collect();
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    let start = (std::process::id() as usize * 97 + next() * 7) % 32768;
    for i in 0..512 {
        let slot = ((start + i) % 32768) as u32;
        let net = base + slot * 4;
        if taken.iter().any(|t| u32::from(*t) & !3 == net) {
            continue;
        }
        return (Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2));
    }
    panic!("no free /30 in 198.18.0.0/15 after 512 tries");
}

/// A real Envoy running inside a namespace; killed on drop.
pub struct PodEnvoy {
    /// `ip netns exec` exec'd into Envoy: this is Envoy itself.
    child: Child,
    /// Envoy's pid (what the agent finds in /proc).
    pub pid: u32,
    /// Admin client that dials from inside the pod.
    pub admin: AdminClient,
    /// Bootstrap and log.
    dir: tempfile::TempDir,
    /// Its entry in the Lab's /proc view, removed once it is dead.
    farm_link: Option<PathBuf>,
}

impl PodEnvoy {
    async fn start(lab: &Lab, ns: &Ns, opts: &EnvoyOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("drainshim-podenvoy-")
            .tempdir()
            .expect("tempdir");
        let boot = dir.path().join("bootstrap.yaml");
        std::fs::write(&boot, opts.bootstrap()).expect("write bootstrap");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("log");
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name])
            .arg(&opts.binary)
            .args(opts.args(&boot, dir.path()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ip netns exec envoy");
        let pid = child.id().expect("envoy pid");
        let admin = AdminClient::with_dial(
            &format!("http://127.0.0.1:{}", opts.admin_port),
            Duration::from_secs(2),
            std::sync::Arc::new(NetnsDial {
                netns: ns.handle(),
                connect_timeout: Duration::from_secs(2),
            }),
        )
        .expect("admin url");
        let mut e = Self {
            child,
            pid,
            admin,
            dir,
            farm_link: None,
        };
        let deadline = tokio::time::Instant::now() + NODE_WAIT;
        loop {
            if let Ok(Some(status)) = e.child.try_wait() {
                panic!("envoy in {} exited: {status}\n{}", ns.name, e.log_tail());
            }
            if e.admin.ready().await.unwrap_or(false) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "envoy in {} not ready within {NODE_WAIT:?}\n{}",
                ns.name,
                e.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        e.farm_link = Some(lab.expose(pid));
        e
    }

    pub fn sigterm(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
        self.forget();
    }

    /// Waits up to `limit` for the process to exit (and reaps it).
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()?
            .ok();
        if status.is_some() {
            self.forget();
        }
        status
    }

    /// Removes the /proc view entry: the pid may be reused from now on.
    fn forget(&mut self) {
        if let Some(link) = self.farm_link.take() {
            let _ = std::fs::remove_file(link);
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for PodEnvoy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        self.forget();
    }
}

/// One HTTP/1.1 request from inside `ns` (or from the host with None).
/// Err when the connection cannot be made (refused, unreachable).
pub async fn http_in(
    ns: Option<&Netns>,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Result<(u16, String), String> {
    let connect = async {
        match ns {
            Some(ns) => ns.connect(addr, Duration::from_secs(2)).await,
            None => tokio::net::TcpStream::connect(addr).await,
        }
    };
    let stream = tokio::time::timeout(Duration::from_secs(5), connect)
        .await
        .map_err(|_| format!("connect {addr}: timed out"))?
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let method: http::Method = method.parse().map_err(|e| format!("method: {e}"))?;
    let (status, body) = tokio::time::timeout(
        NODE_WAIT,
        drainshim::http::request(stream, &addr.to_string(), method, path),
    )
    .await
    .map_err(|_| format!("{addr}{path}: no answer"))?
    .map_err(|e| format!("{addr}{path}: {e}"))?;
    Ok((status.as_u16(), String::from_utf8_lossy(&body).into_owned()))
}

/// The agent in-process, on the Lab's /proc view, with short drain timers
/// (a drain with nothing open quiesces in ~200 ms) and 200 ms scans, then
/// `tweak`.
pub async fn start_agent(
    lab: &Lab,
    listen: &str,
    tweak: impl FnOnce(&mut drainshim::settings::NodeSettings),
) -> drainshim::node::NodeAgent {
    let mut settings = drainshim::settings::NodeSettings::new(lab.farm.path().to_path_buf());
    settings.listen = listen.parse().expect("listen address");
    settings.budget.timers = drainshim::config::Timers {
        deregistration_delay: Duration::from_millis(200),
        min_drain_time: Duration::from_millis(200),
        drain_time: Duration::from_secs(1),
        parent_shutdown_time: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
    };
    settings.budget.admin_timeout = Duration::from_secs(1);
    settings.scan_interval = Duration::from_millis(200);
    tweak(&mut settings);
    settings.validate().expect("valid node settings");
    drainshim::node::NodeAgent::start(settings)
        .await
        .expect("start the node agent")
}

/// The agent's /metrics text.
pub async fn agent_metrics(agent: SocketAddr) -> String {
    let (code, body) = http_in(None, agent, "GET", "/metrics")
        .await
        .expect("scrape the agent");
    assert_eq!(code, 200, "{body}");
    body
}

/// Pods in the agent's /status, by pod name.
pub async fn agent_pods(agent: SocketAddr) -> BTreeMap<String, serde_json::Value> {
    let (code, body) = http_in(None, agent, "GET", "/status")
        .await
        .expect("agent status");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("status JSON");
    v["pods"]
        .as_array()
        .expect("pods array")
        .iter()
        .map(|p| (p["pod"].as_str().unwrap_or_default().to_string(), p.clone()))
        .collect()
}

/// Whether any fd of this process refers to network namespace `inode`.
pub fn holds_netns(inode: u64) -> bool {
    let want = format!("net:[{inode}]");
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == want))
        })
        .unwrap_or(false)
}
