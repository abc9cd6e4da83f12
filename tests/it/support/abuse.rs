//! Harness for the guard abuse test: the real `drainshim` binary as the
//! guard (so its memory can be read from `/proc`), a legitimate tonic client
//! that must keep working, raw HTTP/2 attackers, and the summary table.
//! It builds on `support::guard`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drainshim_bench::proto::bench::stream_client::StreamClient;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::support::guard::{
    connect_client, echo, encode_frame, parse_frame, subscribe, Frame, Sub, ACK, DATA, GOAWAY,
    HEADERS, PING, PREFACE, RST_STREAM, SETTINGS,
};

pub const WINDOW_UPDATE: u8 = 0x8;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;
/// SETTINGS_INITIAL_WINDOW_SIZE.
pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
/// The largest flow-control window HTTP/2 allows.
pub const MAX_WINDOW: u32 = (1 << 31) - 1;
pub const MIB: f64 = 1024.0 * 1024.0;

/// How long a probe of the legitimate client may take before it counts as a
/// failure: generous, so a loaded machine is slow rather than flaky.
pub const PROBE_PATIENCE: Duration = Duration::from_secs(20);

// ===== The guard as a process =====

/// `drainshim sidecar` with the guard on, as a child process.
pub struct GuardProcess {
    /// Killed when the test ends.
    child: Child,
    /// For `/proc/<pid>/...`.
    pub pid: u32,
    /// Where the guard listens.
    pub addr: SocketAddr,
    /// Keeps draining stderr so the child never blocks on a full pipe.
    _log: JoinHandle<()>,
}

/// Memory of a process, from `/proc/<pid>/status`, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mem {
    /// Resident now.
    pub rss: u64,
    /// Resident at the peak (since start or the last [`GuardProcess::reset_peak`]).
    pub hwm: u64,
}

impl GuardProcess {
    /// Starts the binary with the guard in front of `upstream` and waits for
    /// its `guard_listen=Some(ADDR)` log line. The guard runs on one CPU
    /// (`taskset`), like a pod with a one-CPU limit: its runtime then has one
    /// worker thread, the case where h2's own rapid-reset counter never
    /// fires (it once let a rapid-reset attack through unanswered).
    pub async fn spawn(upstream: SocketAddr) -> GuardProcess {
        let cpu = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .ok()
            .and_then(|set| {
                (0..nix::sched::CpuSet::count()).find(|&c| set.is_set(c).unwrap_or(false))
            })
            .expect("this process may run on some CPU");
        let mut child = Command::new("taskset")
            .args(["--cpu-list", &cpu.to_string()])
            .arg(super::drainshim_bin())
            .args(["sidecar", "--listen", "127.0.0.1:0"])
            // Nothing listens on port 9 (discard): the drain is never asked
            // for here, and the guard does not need Envoy.
            .args(["--envoy-admin", "http://127.0.0.1:9"])
            .args(["--guard-listen", "127.0.0.1:0"])
            .args(["--guard-upstream", &upstream.to_string()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn drainshim sidecar under taskset (util-linux)");
        let pid = child.id().expect("pid");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let addr = tokio::time::timeout(PROBE_PATIENCE, async {
            while let Some(line) = lines.next_line().await.expect("read stderr") {
                if let Some(rest) = line.split("guard_listen=Some(").nth(1) {
                    let addr = rest.split(')').next().expect("addr");
                    return addr.parse::<SocketAddr>().expect("guard address");
                }
            }
            panic!("the sidecar exited before its guard was ready");
        })
        .await
        .expect("the guard is ready in time");
        let log = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        GuardProcess {
            child,
            pid,
            addr,
            _log: log,
        }
    }

    /// VmRSS and VmHWM now.
    pub fn mem(&self) -> Mem {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).expect("proc status");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kib| kib.parse::<u64>().ok())
                .map(|kib| kib * 1024)
                .unwrap_or_else(|| panic!("{name} in /proc/{}/status", self.pid))
        };
        Mem {
            rss: field("VmRSS:"),
            hwm: field("VmHWM:"),
        }
    }

    /// Resets VmHWM to the current RSS (`clear_refs` 5, Linux 4.0+), so the
    /// next peak is this attack's own.
    pub fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5").expect("reset the peak RSS");
    }

    /// CPU time (user + system) the guard used so far.
    pub fn cpu(&self) -> Duration {
        drainshim_bench::measure::cpu_time(self.pid)
            .unwrap_or_else(|e| panic!("CPU time of the guard ({}): {e}", self.pid))
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

// ===== The legitimate client =====

/// A long stream ticking every 10 ms, plus fresh unary calls on demand.
pub struct Legit {
    /// Where the guard listens.
    addr: SocketAddr,
    /// Keeps the stream's connection open.
    _client: StreamClient<Channel>,
    /// The long stream.
    pub sub: Sub,
    /// Unary Echo calls answered so far: they reach the application too, so
    /// attacks subtract them when counting what reached it.
    pub echoes: AtomicU64,
}

impl Legit {
    pub async fn start(addr: SocketAddr) -> Legit {
        let client = connect_client(addr).await;
        let sub = subscribe(&client, "legit", 10, 0);
        let legit = Legit {
            addr,
            _client: client,
            sub,
            echoes: AtomicU64::new(0),
        };
        legit.ticking().await.expect("the legitimate stream flows");
        legit
    }

    /// The long stream delivers a new message.
    async fn ticking(&self) -> Result<(), String> {
        let before = self.sub.received();
        let deadline = Instant::now() + PROBE_PATIENCE;
        while self.sub.received() <= before {
            if self.sub.done.is_finished() {
                return Err("the long stream ended".into());
            }
            if Instant::now() > deadline {
                return Err(format!("the long stream stalled for {PROBE_PATIENCE:?}"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// The long stream keeps ticking (without gaps) and a unary Echo on a
    /// fresh connection succeeds; returns how long the Echo took, connection
    /// included.
    pub async fn probe(&self) -> Result<Duration, String> {
        self.ticking().await?;
        let start = Instant::now();
        let answer = tokio::time::timeout(PROBE_PATIENCE, async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
                .map_err(|e| e.to_string())?
                .connect()
                .await
                .map_err(|e| format!("connect: {e}"))?;
            echo(&mut StreamClient::new(channel), "legit")
                .await
                .map_err(|s| format!("echo: {s}"))
        })
        .await
        .map_err(|_| format!("echo took over {PROBE_PATIENCE:?}"))??;
        self.echoes.fetch_add(1, Ordering::Relaxed);
        if answer != "legit" {
            return Err(format!("echo answered {answer:?}"));
        }
        let took = start.elapsed();
        let seqs = self.sub.seqs.lock().expect("seqs").clone();
        if seqs.iter().enumerate().any(|(i, s)| *s != i as u64 + 1) {
            return Err("the long stream has gaps".into());
        }
        Ok(took)
    }
}

// ===== Raw HTTP/2 attackers =====

/// What an attacker's reader saw from the guard.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every frame.
    pub frames: AtomicU64,
    /// RST_STREAM(REFUSED_STREAM).
    pub refused: AtomicU64,
    /// RST_STREAM with any other code.
    pub other_resets: AtomicU64,
    /// PING acks.
    pub pongs: AtomicU64,
    /// SETTINGS acks.
    pub settings_acks: AtomicU64,
    /// HEADERS frames (responses and trailers).
    pub headers: AtomicU64,
    /// DATA payload bytes.
    pub data_bytes: AtomicU64,
    /// The first GOAWAY: (last stream id, error code).
    pub goaway: Mutex<Option<(u32, u32)>>,
    /// The first frame on a stream (HEADERS or RST_STREAM): how a request was answered.
    pub first_answer: Mutex<Option<Frame>>,
    /// Every GOAWAY error code, in order.
    pub goaway_codes: Mutex<Vec<u32>>,
    /// The guard closed the connection (EOF or reset).
    pub closed: AtomicBool,
    /// Woken on GOAWAY and on close.
    pub changed: Notify,
}

impl Seen {
    fn record(&self, f: &Frame) {
        self.frames.fetch_add(1, Ordering::Relaxed);
        if f.stream != 0 && matches!(f.ty, HEADERS | RST_STREAM) {
            self.first_answer
                .lock()
                .expect("first answer")
                .get_or_insert_with(|| f.clone());
            self.changed.notify_waiters();
        }
        match f.ty {
            RST_STREAM if f.rst == Some(crate::support::guard::REFUSED_STREAM) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            RST_STREAM => {
                self.other_resets.fetch_add(1, Ordering::Relaxed);
            }
            PING if f.flags & ACK != 0 => {
                self.pongs.fetch_add(1, Ordering::Relaxed);
            }
            SETTINGS if f.flags & ACK != 0 => {
                self.settings_acks.fetch_add(1, Ordering::Relaxed);
            }
            HEADERS => {
                self.headers.fetch_add(1, Ordering::Relaxed);
            }
            DATA => {
                self.data_bytes
                    .fetch_add(u64::from(f.len), Ordering::Relaxed);
            }
            GOAWAY => {
                let g = f.goaway.unwrap_or_default();
                self.goaway.lock().expect("goaway").get_or_insert(g);
                self.goaway_codes.lock().expect("codes").push(g.1);
                self.changed.notify_waiters();
            }
            _ => {}
        }
    }

    pub fn goaway_code(&self) -> Option<u32> {
        self.goaway.lock().expect("goaway").map(|g| g.1)
    }

    pub fn get(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Waits until the guard sent GOAWAY or closed, up to `limit`.
    pub async fn wait_goaway_or_close(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let woken = self.changed.notified();
            if self.goaway_code().is_some() || self.closed.load(Ordering::Relaxed) {
                return true;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                return false;
            }
        }
    }
}

/// Why an attacker's write did not go through.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteStop {
    /// The guard closed or reset the connection.
    Closed,
    /// The guard stopped reading: the write did not finish in time.
    Blocked,
}

/// A raw HTTP/2 client that does as it is told.
pub struct Attacker {
    /// Where frames go.
    write: OwnedWriteHalf,
    /// What the reader saw; empty while nobody reads.
    pub seen: Arc<Seen>,
    /// The reader, when this attacker reads at all.
    reader: Option<JoinHandle<()>>,
}

impl Drop for Attacker {
    fn drop(&mut self) {
        if let Some(r) = &self.reader {
            r.abort();
        }
    }
}

/// A SETTINGS payload: (identifier, value) pairs.
pub fn settings_payload(pairs: &[(u16, u32)]) -> Vec<u8> {
    pairs
        .iter()
        .flat_map(|(id, v)| {
            let mut p = id.to_be_bytes().to_vec();
            p.extend_from_slice(&v.to_be_bytes());
            p
        })
        .collect()
}

pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
    encode_frame(RST_STREAM, 0, stream, &code.to_be_bytes())
}

pub fn window_update(stream: u32, increment: u32) -> Vec<u8> {
    encode_frame(WINDOW_UPDATE, 0, stream, &increment.to_be_bytes())
}

pub fn ping(n: u64) -> Vec<u8> {
    encode_frame(PING, 0, 0, &n.to_be_bytes())
}

/// A gRPC length-prefixed message (uncompressed).
pub fn grpc_message(msg: &impl prost::Message) -> Vec<u8> {
    let body = msg.encode_to_vec();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

impl Attacker {
    /// Connects, sends the preface and SETTINGS(`settings`), and acks the
    /// guard's SETTINGS. With `read`, a reader keeps consuming and counting
    /// what the guard sends; without, nothing is ever read again.
    pub async fn connect(addr: SocketAddr, settings: &[(u16, u32)], read: bool) -> Attacker {
        let mut tcp = TcpStream::connect(addr).await.expect("connect attacker");
        let _ = tcp.set_nodelay(true);
        let mut hello = PREFACE.to_vec();
        hello.extend(encode_frame(SETTINGS, 0, 0, &settings_payload(settings)));
        tcp.write_all(&hello).await.expect("preface");
        // The guard's SETTINGS (h2 sends it at once); anything read after it
        // in the same chunk is counted below.
        let seen = Arc::new(Seen::default());
        let mut buf = Vec::new();
        tokio::time::timeout(PROBE_PATIENCE, async {
            loop {
                while let Some((f, n)) = parse_frame(&buf) {
                    buf.drain(..n);
                    if f.ty == SETTINGS && f.flags & ACK == 0 {
                        return;
                    }
                    seen.record(&f);
                }
                let mut chunk = [0u8; 4096];
                match tcp.read(&mut chunk).await {
                    Ok(0) | Err(_) => panic!("the guard closed before its SETTINGS"),
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await
        .expect("the guard's SETTINGS");
        tcp.write_all(&encode_frame(SETTINGS, ACK, 0, &[]))
            .await
            .expect("SETTINGS ack");
        let (mut rd, write) = tcp.into_split();
        let reader = read.then(|| {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    while let Some((f, n)) = parse_frame(&buf) {
                        buf.drain(..n);
                        seen.record(&f);
                    }
                    match rd.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.closed.store(true, Ordering::Relaxed);
                seen.changed.notify_waiters();
            })
        });
        // Without a reader the read half is dropped, which does not shut the
        // socket down: the guard's bytes pile up in our receive buffer.
        Attacker {
            write,
            seen,
            reader,
        }
    }

    /// Writes `bytes`, giving up after `limit` (the guard stopped reading).
    pub async fn send(&mut self, bytes: &[u8], limit: Duration) -> Result<(), WriteStop> {
        match tokio::time::timeout(limit, self.write.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(WriteStop::Closed),
            Err(_) => Err(WriteStop::Blocked),
        }
    }
}

// ===== The summary =====

/// One attack's line in the summary.
#[derive(Clone, Debug)]
pub struct Row {
    pub attack: String,
    /// Frames the attacker got onto the wire (accepted by the kernel).
    pub frames: u64,
    /// What happened to the attacker.
    pub outcome: String,
    /// The legitimate client during and after, or what failed.
    pub legit: String,
    /// The guard's peak RSS during the attack.
    pub peak: u64,
    /// The guard's RSS once the attack is over.
    pub after: u64,
    /// Guard CPU time spent during the attack.
    pub cpu: Duration,
}

pub fn print_table(baseline: Mem, rows: &[Row]) {
    let mut out = String::new();
    out.push_str(&format!(
        "\nguard abuse (drainshim sidecar process, default limits); baseline RSS {:.1} MiB\n",
        baseline.rss as f64 / MIB
    ));
    out.push_str(&format!(
        "| {:<36} | {:>9} | {:<88} | {:<32} | {:>8} | {:>9} | {:>7} |\n",
        "attack",
        "frames",
        "outcome for the attacker",
        "legit client",
        "peak MiB",
        "after MiB",
        "cpu s"
    ));
    out.push_str(&format!(
        "|{}|{}|{}|{}|{}|{}|{}|\n",
        "-".repeat(38),
        "-".repeat(11),
        "-".repeat(90),
        "-".repeat(34),
        "-".repeat(10),
        "-".repeat(11),
        "-".repeat(9)
    ));
    for r in rows {
        out.push_str(&format!(
            "| {:<36} | {:>9} | {:<88} | {:<32} | {:>8.1} | {:>9.1} | {:>7.2} |\n",
            r.attack,
            r.frames,
            r.outcome,
            r.legit,
            r.peak as f64 / MIB,
            r.after as f64 / MIB,
            r.cpu.as_secs_f64()
        ));
    }
    eprintln!("{out}");
}

// ===== The memory limit the manifests give the shim =====

/// The smallest memory limit of the drainshim sidecar container in the
/// shipped manifests (the overlays' pod patches and the sidecar
/// Components'), in bytes: what the shim's peak RSS under attack must stay
/// below, or the kubelet OOM-kills it.
pub fn manifest_memory_limit() -> u64 {
    let patches = [
        "native-sidecar/pod.yaml",
        "istio/pod.yaml",
        "components/sidecar/pod-patch.yaml",
        "components/sidecar-istio/pod-patch.yaml",
    ];
    let re = regex::Regex::new(r"limits:\s*\{[^}]*\bmemory:\s*(\d+)Mi").expect("regex");
    patches
        .iter()
        .map(|o| {
            let path = format!("{}/deploy/{o}", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            let mut lines = text.lines().skip_while(|l| l.trim() != "- name: drainshim");
            assert!(
                lines.next().is_some(),
                "{path}: no container named drainshim"
            );
            let mib: u64 = lines
                .find_map(|l| re.captures(l).map(|c| c[1].to_string()))
                .unwrap_or_else(|| panic!("{path}: no memory limit on the drainshim container"))
                .parse()
                .expect("MiB");
            mib * 1024 * 1024
        })
        .min()
        .expect("overlays")
}
