//! One h2load run of unary gRPC Echo calls against a path (direct, a guard,
//! Envoy, a relay) with the proxy's CPU time over it, and the min / median /
//! max spreads the benches report. Shared by the guard and allocator benches.

use std::net::SocketAddr;

use drainshim_bench::measure;
use tokio::process::Command;

/// One h2load run.
pub struct Load {
    pub rps: f64,
    pub p99_ms: f64,
    /// Proxy CPU µs per request over the run (None for the direct path).
    pub cpu_us: Option<f64>,
}

/// A path under test: where h2load sends, and whose CPU is counted.
pub struct Path {
    pub name: &'static str,
    pub addr: SocketAddr,
    /// The proxy's pid (None: direct, no proxy).
    pub pid: Option<u32>,
}

/// utime + stime of `pid` (all its threads), in seconds.
pub fn cpu_seconds(pid: u32) -> f64 {
    measure::cpu_time(pid)
        .unwrap_or_else(|e| panic!("CPU time of {pid}: {e}"))
        .as_secs_f64()
}

/// h2load against `path` with gRPC unary Echo calls for `seconds`; `rps`:
/// per-client rate (None: as fast as it goes). Returns req/s, p99 and the
/// proxy's CPU time per request (the run alone: connection setup included,
/// warm-up excluded).
pub async fn h2load(
    path: &Path,
    dir: &std::path::Path,
    tag: &str,
    rps: Option<u32>,
    seconds: u32,
) -> Load {
    // A gRPC frame: uncompressed, length 3, EchoRequest { body: "x", ..Default::default() }.
    let body = dir.join("echo.bin");
    std::fs::write(&body, [0u8, 0, 0, 0, 3, 0x0a, 0x01, b'x']).expect("body");
    let log = dir.join(format!("{}-{tag}.log", path.name));
    let mut cmd = Command::new("h2load");
    cmd.args(["-c", "10", "-m", "10", "-t", "1"])
        .args(["-D", &seconds.to_string()])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("-d")
        .arg(&body)
        .arg("--log-file")
        .arg(&log);
    if let Some(r) = rps {
        cmd.args(["--rps", &r.to_string()]);
    }
    cmd.arg(format!(
        "http://{}/drainshim.bench.v1.Stream/Echo",
        path.addr
    ));
    let cpu_before = path.pid.map(cpu_seconds);
    let out = cmd
        .output()
        .await
        .expect("h2load: install it with `make tools` (Debian nghttp2-client)");
    let cpu = path.pid.zip(cpu_before).map(|(p, b)| cpu_seconds(p) - b);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h2load failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no req/s in h2load output: {text}"));
    // "requests: N total, N started, N done, N succeeded, ..."
    let succeeded = text
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .and_then(|l| l.split(", ").find(|f| f.ends_with(" succeeded")))
        .and_then(|f| f.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no request count in h2load output: {text}"));
    assert!(text.contains(" 0 failed"), "h2load saw failures: {text}");
    // Each log line: start time, status, duration in microseconds.
    let mut lat: Vec<f64> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split('\t').nth(2)?.parse::<f64>().ok())
        .map(|us| us / 1000.0)
        .collect();
    lat.sort_by(f64::total_cmp);
    let p99 = drainshim_bench::measure::percentile(&lat, 0.99);
    let cpu_us = cpu.map(|s| s * 1e6 / succeeded.max(1.0));
    eprintln!(
        "  {} {tag}: {rps:.0} req/s, p99 {p99:.2} ms{}",
        path.name,
        cpu_us.map_or(String::new(), |c| format!(", proxy CPU {c:.1} µs/req"))
    );
    Load {
        rps,
        p99_ms: p99,
        cpu_us,
    }
}

/// Min, median and max.
pub fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

/// "median [min..max]" with `digits` decimals.
pub fn fmt_spread(v: Vec<f64>, digits: usize) -> String {
    let (lo, mid, hi) = spread(v);
    format!("{mid:.digits$} [{lo:.digits$}..{hi:.digits$}]")
}
