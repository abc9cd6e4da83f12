//! What the benchmarks share: the `drainshim-bench` binary started as the
//! bench backend or app, the production binary as a guard-only sidecar,
//! free ports, and RSS. Each bench includes it with `mod common;` and uses
//! what it needs.
#![allow(dead_code)]

pub mod load;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The drainshim-bench binary built for this bench run (its profile): the
/// helpers (`server`, `app`, `relay`), never the process being measured.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_drainshim-bench"))
}

/// The `drainshim` the bench runs as a whole sidecar (failopen): the one
/// `DRAINSHIM_BIN` names (`make bench`: the production build), else the one
/// beside [`bin`] (`cargo build --workspace` with the bench's profile).
pub fn drainshim() -> PathBuf {
    let path = std::env::var_os(drainshim_bench::DRAINSHIM_BIN)
        .map(PathBuf::from)
        .unwrap_or_else(|| bin().with_file_name("drainshim"));
    assert!(
        path.is_file(),
        "{}: missing; build it (scripts/build-shipped.sh, or `cargo build --workspace` \
         with this bench's profile), or name it in DRAINSHIM_BIN (make bench does)",
        path.display()
    );
    path
}

/// Where scripts/build-shipped.sh puts the production binary.
const SHIPPED: &str = "target/shipped/drainshim";

/// The production binary, the one the image ships (scripts/build-shipped.sh:
/// release, static, the shipped allocator; `make
/// bench` builds it first): the guard and the shim are measured as it.
/// `DRAINSHIM_SHIPPED_BIN` names another build of it, e.g.
/// `target/shipped-mimalloc/drainshim` to compare allocators.
pub fn shipped() -> PathBuf {
    let path = std::env::var_os("DRAINSHIM_SHIPPED_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| drainshim_bench::source_root().join(SHIPPED));
    assert!(
        path.is_file(),
        "{}: no production binary; build it with scripts/build-shipped.sh (make bench does)",
        path.display()
    );
    path
}

/// `--version` of `binary`, one line.
pub fn version(binary: &Path) -> String {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{} --version: {e}", binary.display()));
    assert!(
        out.status.success(),
        "{} --version failed",
        binary.display()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Says which binary a bench measures (path and `--version`), and warns when
/// it was built from another commit than the bench itself: a production
/// binary left over from an earlier build.
pub fn announce_measured() -> PathBuf {
    let measured = shipped();
    let (theirs, ours) = (version(&measured), version(&bin()));
    println!("measured binary: {} ({theirs})", measured.display());
    let commit = |v: &str| {
        v.split("commit ")
            .nth(1)?
            .split(',')
            .next()
            .map(str::to_string)
    };
    if commit(&theirs) != commit(&ours) {
        println!(
            "warning: the measured binary is not of this bench's commit ({ours}); rebuild it with scripts/build-shipped.sh"
        );
    }
    measured
}

/// A free loopback address (bound and released).
pub fn free_addr() -> SocketAddr {
    let port = drainshim_bench::free_port().expect("a free loopback port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits (10 s at most) until something accepts connections on `addr`.
pub async fn wait_listening(addr: SocketAddr) {
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing listens on {addr}");
}

/// `drainshim-bench <what> --listen ADDR`: `server` (the tonic backend) or
/// `app` (gRPC and WebSocket on one port), once it listens.
pub async fn bench_process(what: &str) -> (Child, SocketAddr) {
    bench_process_with(what, &[]).await
}

/// [`bench_process`] with more flags (e.g. the relay's `--upstream`).
pub async fn bench_process_with(what: &str, extra: &[&str]) -> (Child, SocketAddr) {
    let addr = free_addr();
    let child = Command::new(bin())
        .args([what, "--listen", &addr.to_string(), "--log", "warn"])
        .args(extra)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("drainshim-bench {what}: {e}"));
    wait_listening(addr).await;
    (child, addr)
}

/// The guard alone, as the production binary ([`shipped`]): a sidecar whose Envoy admin is absent (only the guard
/// is measured), on an ephemeral port learned from its ready line. Its
/// process caps are raised above what the benchmarks hold (10,000 streams,
/// 9,000 WebSockets): they measure cost, and the default caps (512
/// connections, 5,000 streams) would refuse part of the load.
pub async fn guard(upstream: SocketAddr) -> (Child, SocketAddr) {
    guard_with(upstream, &[]).await
}

/// [`guard`] with more sidecar flags (e.g. `--guard-request-metrics false`).
pub async fn guard_with(upstream: SocketAddr, extra: &[&str]) -> (Child, SocketAddr) {
    guard_from(&shipped(), upstream, extra).await
}

/// [`guard_with`] run as `binary` (another build of the production binary).
pub async fn guard_from(
    binary: &Path,
    upstream: SocketAddr,
    extra: &[&str],
) -> (Child, SocketAddr) {
    let mut child = Command::new(binary)
        .args(["sidecar", "--listen", "127.0.0.1:0"])
        .args(["--envoy-admin", "http://127.0.0.1:9"])
        .args(["--guard-listen", "127.0.0.1:0"])
        .args(["--guard-upstream", &upstream.to_string()])
        .args([
            "--guard-max-connections",
            "20000",
            "--guard-max-streams",
            "20000",
        ])
        .args(extra)
        .args(["--log", "warn,drainshim::sidecar=info"])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("guard");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr: SocketAddr = loop {
        let line = lines
            .next_line()
            .await
            .expect("read")
            .expect("guard exited early");
        if let Some(rest) = line.split("guard_listen=Some(").nth(1) {
            break rest.split(')').next().expect("addr").parse().expect("addr");
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// A process's resident memory, MiB (0 if it is gone).
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}
