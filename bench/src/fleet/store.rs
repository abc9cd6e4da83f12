//! The two stores `bench fleet` loads the simulated history into, both real
//! servers from Debian's packages (fetched into the cache by
//! `scripts/fetch-prometheus.sh`):
//!
//! - Prometheus, from TSDB blocks that `promtool tsdb create-blocks-from
//!   openmetrics` built (Prometheus' own backfill);
//! - VictoriaMetrics single-node, through its Prometheus-compatible JSON
//!   lines import (`/api/v1/import`).
//!
//! The history is sampled every `interval`, more coarsely than a scrape, so
//! both run with a lookback of one and a half intervals (Prometheus'
//! `--query.lookback-delta`, VictoriaMetrics' `-search.maxStalenessInterval`):
//! a pod's series is seen from its first sample to 1.5 intervals after its
//! last, in both.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde::Serialize;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// How long a store may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest import request: whole lines up to this many bytes.
const IMPORT_CHUNK: usize = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    Prometheus,
    VictoriaMetrics,
}

impl StoreKind {
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Prometheus => "prometheus",
            StoreKind::VictoriaMetrics => "victoria-metrics",
        }
    }

    /// The server binary in the cache.
    fn binary(self) -> PathBuf {
        let bin = match self {
            StoreKind::Prometheus => "prometheus/usr/bin/prometheus",
            StoreKind::VictoriaMetrics => "victoria-metrics/usr/bin/victoria-metrics",
        };
        crate::envoy::cache_dir().join(bin)
    }
}

/// A running store holding the history.
pub struct Store {
    pub kind: StoreKind,
    pub url: String,
    child: Child,
    log: PathBuf,
}

fn missing(bin: &Path) -> String {
    format!(
        "{} is missing: run `make tools` (scripts/fetch-prometheus.sh)",
        bin.display()
    )
}

/// Builds Prometheus TSDB blocks from `openmetrics` in `dir` with promtool.
pub async fn backfill(openmetrics: &Path, dir: &Path) -> Result<(), String> {
    let promtool = crate::envoy::cache_dir().join("prometheus/usr/bin/promtool");
    if !promtool.exists() {
        return Err(missing(&promtool));
    }
    // promtool reads its whole input once per block it writes. It rounds
    // the duration down to its block ranges (1700h gives 1458h, 744h gave
    // 486h) and aligns blocks to multiples of it: the 70 days of history are
    // two or three blocks, not four or five, and the load took a quarter
    // less time. Prometheus reads non-overlapping blocks of any span.
    let out = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "--max-block-duration=1700h"])
        .arg("--quiet")
        .arg("openmetrics")
        .arg(openmetrics)
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("promtool: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "promtool tsdb create-blocks-from openmetrics failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

impl Store {
    /// Prometheus over the blocks in `data` (see [`backfill`]).
    pub async fn prometheus(data: &Path, work: &Path, lookback: Duration) -> Result<Self, String> {
        let config = work.join("prometheus.yml");
        std::fs::write(&config, "global: {}\nscrape_configs: []\n")
            .map_err(|e| format!("write {}: {e}", config.display()))?;
        let port = crate::free_port().map_err(|e| e.to_string())?;
        let args = vec![
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", data.display()),
            "--storage.tsdb.retention.time=3650d".into(),
            format!("--query.lookback-delta={}s", lookback.as_secs()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ];
        Self::start(StoreKind::Prometheus, port, &args, work, "/-/ready").await
    }

    /// VictoriaMetrics, empty; [`Store::import`] loads it.
    pub async fn victoria_metrics(work: &Path, lookback: Duration) -> Result<Self, String> {
        let port = crate::free_port().map_err(|e| e.to_string())?;
        let args = vec![
            format!("-storageDataPath={}", work.join("vm-data").display()),
            "-retentionPeriod=10y".into(),
            format!("-httpListenAddr=127.0.0.1:{port}"),
            // Data written a moment ago is answered at once.
            "-search.latencyOffset=0s".into(),
            format!("-search.maxStalenessInterval={}s", lookback.as_secs()),
        ];
        Self::start(StoreKind::VictoriaMetrics, port, &args, work, "/health").await
    }

    async fn start(
        kind: StoreKind,
        port: u16,
        args: &[String],
        work: &Path,
        ready: &str,
    ) -> Result<Self, String> {
        let bin = kind.binary();
        if !bin.exists() {
            return Err(missing(&bin));
        }
        let log = work.join(format!("{}.log", kind.name()));
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let file2 = file.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .args(args)
            .current_dir(work)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(file2)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let mut store = Self {
            kind,
            url: format!("http://127.0.0.1:{port}"),
            child,
            log,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = store.child.try_wait() {
                return Err(format!(
                    "{} exited: {status}\n{}",
                    kind.name(),
                    store.log_tail()
                ));
            }
            if let Ok((StatusCode::OK, _)) = store.call(Method::GET, ready, Bytes::new()).await {
                return Ok(store);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} not ready after {START_TIMEOUT:?}\n{}",
                    kind.name(),
                    store.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Loads JSON lines (see `sim::JsonLines`) into VictoriaMetrics and
    /// makes them searchable.
    pub async fn import(&self, json_lines: &Path) -> Result<(), String> {
        let file = tokio::fs::File::open(json_lines)
            .await
            .map_err(|e| format!("{}: {e}", json_lines.display()))?;
        let mut lines = tokio::io::BufReader::new(file).lines();
        let mut chunk = Vec::with_capacity(IMPORT_CHUNK + 4096);
        loop {
            let line = lines.next_line().await.map_err(|e| e.to_string())?;
            if let Some(l) = &line {
                chunk.extend_from_slice(l.as_bytes());
                chunk.push(b'\n');
            }
            if chunk.len() >= IMPORT_CHUNK || (line.is_none() && !chunk.is_empty()) {
                let body = Bytes::from(std::mem::take(&mut chunk));
                let (status, answer) = self.call(Method::POST, "/api/v1/import", body).await?;
                if !status.is_success() {
                    return Err(format!(
                        "import: {status}: {}",
                        String::from_utf8_lossy(&answer)
                    ));
                }
            }
            if line.is_none() {
                break;
            }
        }
        let (status, answer) = self
            .call(Method::GET, "/internal/force_flush", Bytes::new())
            .await?;
        if !status.is_success() {
            return Err(format!(
                "force_flush: {status}: {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        Ok(())
    }

    /// One request with a body; a minute at most.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), String> {
        let authority = self.url.trim_start_matches("http://").to_string();
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(&authority)
                .await
                .map_err(|e| e.to_string())?;
            drainshim::http::request_with(stream, &authority, method, path, &HeaderMap::new(), body)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(Duration::from_secs(60), exchange)
            .await
            .map_err(|_| format!("{} {path}: no answer in 60 s", self.kind.name()))?
    }

    /// The last lines of the store's log, for errors.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops the store (SIGTERM, so a kept directory holds its data) and
    /// waits until it has exited; SIGKILL after 30 s.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        let waited = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        if waited.is_err() {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}
