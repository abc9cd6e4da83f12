//! The gRPC servers of the peer matrix (tests/it/peer_matrix.rs), each a
//! separate process serving the bench protocol
//! (proto/drainshim/bench/v1/stream.proto) with its own HTTP/2 stack and
//! that stack's default keepalive enforcement:
//!
//! | server | what runs | built by |
//! |---|---|---|
//! | grpc-go | `tests/peers/go/` (Debian's grpc-go 1.33) | `scripts/fetch-peers.sh` |
//! | grpc-java | `tests/peers/java/StreamApp.java` (Debian's grpc-java 1.41, Netty) | `scripts/fetch-peers.sh` |
//! | grpcio | `tests/py/grpc_app.py` (PyPI's grpcio, gRPC C-core) | `scripts/fetch-pytools.sh` |
//! | tonic | the real `drainshim bench server` (h2) | this build |
//!
//! Each says what it did, one line per event: where it listens, each
//! Subscribe call it started (with the client's address: which connection
//! carries it), and each call's end with the last sequence number it handed
//! to its transport. The first three print `listening ADDR`, `subscribe ID
//! PEER`, `ended ID LAST HOW`, `stopping`, `report {json}`; tonic says the
//! same in its JSON log lines. [`PeerApp::said`] reads both into [`Said`].
//!
//! A missing peer fails the test, never skips it (`make peers pytools`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;

use super::{drainshim_bin, python, wait_for_ok, WAIT};

/// A gRPC server implementation of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    GrpcGo,
    GrpcJava,
    Grpcio,
    Tonic,
    /// A raw HTTP/2 app (python-h2, `tests/py/slow_app.py`) that reads its
    /// socket only every 100 ms: writes, reads, then works without reading.
    Slow100,
    /// The same, reading every 500 ms.
    Slow500,
}

impl Server {
    pub fn name(self) -> &'static str {
        match self {
            Server::GrpcGo => "grpc-go",
            Server::GrpcJava => "grpc-java",
            Server::Grpcio => "grpcio",
            Server::Tonic => "tonic",
            Server::Slow100 => "slow app (100 ms)",
            Server::Slow500 => "slow app (500 ms)",
        }
    }

    fn command(self) -> Command {
        let built = |name: &str| {
            let p = drainshim_bench::envoy::cache_dir()
                .join("peers")
                .join(name)
                .join("app");
            assert!(
                p.is_file(),
                "{} is missing: run `make peers` (scripts/fetch-peers.sh). Tests never skip a peer.",
                p.display()
            );
            p
        };
        match self {
            Server::GrpcGo => Command::new(built("grpc-go")),
            Server::GrpcJava => Command::new(built("grpc-java")),
            Server::Grpcio => {
                let mut c = Command::new(python());
                c.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/grpc_app.py"));
                c
            }
            Server::Slow100 | Server::Slow500 => {
                let pause = if self == Server::Slow100 {
                    "100"
                } else {
                    "500"
                };
                let mut c = Command::new(python());
                c.arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/slow_app.py"))
                    .args(["--pause-ms", pause]);
                c
            }
            Server::Tonic => {
                let mut c = Command::new(drainshim_bin());
                c.args(["bench", "server", "--listen", "127.0.0.1:0"])
                    .args(["--log", "info,drainshim_bench::server=debug"])
                    .args(["--log-format", "json"]);
                c
            }
        }
    }
}

/// One thing the app said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Said {
    Listening(SocketAddr),
    /// A Subscribe call started; `peer` is the client's address: one per
    /// connection to the app.
    Subscribe {
        id: String,
        peer: String,
    },
    /// A Subscribe call is over; `last` is the last sequence number the app
    /// handed to its transport.
    Ended {
        id: String,
        last: u64,
        how: String,
    },
    Stopping,
}

impl Said {
    /// Reads one line of `server`'s output.
    fn parse(server: Server, line: &str) -> Option<Said> {
        match server {
            Server::Tonic => Self::parse_json(line),
            _ => Self::parse_text(line),
        }
    }

    fn parse_text(line: &str) -> Option<Said> {
        let mut words = line.splitn(4, ' ');
        match words.next()? {
            "listening" => words.next()?.parse().ok().map(Said::Listening),
            "subscribe" => Some(Said::Subscribe {
                id: words.next()?.to_string(),
                peer: words.next()?.to_string(),
            }),
            "ended" => Some(Said::Ended {
                id: words.next()?.to_string(),
                last: words.next()?.parse().ok()?,
                how: words.next().unwrap_or_default().to_string(),
            }),
            "stopping" => Some(Said::Stopping),
            _ => None,
        }
    }

    /// The bench server's JSON log lines (`--log-format json`).
    fn parse_json(line: &str) -> Option<Said> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |k: &str| v[k].as_str().map(str::to_string);
        match v["message"].as_str()? {
            "bench server listening" => text("addr")?.parse().ok().map(Said::Listening),
            "bench server: subscribe" => Some(Said::Subscribe {
                id: text("stream_id")?,
                peer: text("peer")?,
            }),
            "bench server: stream ended" => Some(Said::Ended {
                id: text("stream_id")?,
                last: v["last_written"].as_u64()?,
                how: "dropped".into(),
            }),
            "bench server: shutting down gracefully" => Some(Said::Stopping),
            _ => None,
        }
    }
}

/// What the app said about one Subscribe call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppStream {
    /// The client's address: the guard's connection to the app.
    pub peer: Option<String>,
    /// (last sequence number handed to the transport, how it ended).
    pub ended: Option<(u64, String)>,
}

/// One running peer server; killed when dropped.
pub struct PeerApp {
    pub server: Server,
    pub child: Child,
    pub addr: SocketAddr,
    /// Everything it wrote, stdout and stderr, line by line.
    log: Arc<Mutex<String>>,
    /// Held open: the app stops when its stdin closes.
    stdin: Option<ChildStdin>,
    /// The readers of stdout and stderr; they end at the pipes' EOF.
    readers: Vec<JoinHandle<()>>,
}

/// Collects a child's output, line by line, into `log` until its EOF.
pub fn collect(
    from: impl AsyncRead + Unpin + Send + 'static,
    log: Arc<Mutex<String>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(from).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(mut l) = log.lock() {
                l.push_str(&line);
                l.push('\n');
            }
        }
    })
}

impl PeerApp {
    /// Starts `server` and waits until it listens.
    pub async fn start(server: Server) -> PeerApp {
        let mut child = server
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start the {} app: {e}", server.name()));
        let log = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().expect("stdout"), log.clone()),
            collect(child.stderr.take().expect("stderr"), log.clone()),
        ];
        let stdin = child.stdin.take();
        let mut app = PeerApp {
            server,
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            stdin,
            readers,
        };
        app.addr = wait_for_ok(&format!("the {} app listens", server.name()), WAIT, || {
            let said = app.said();
            let log = app.log();
            async move {
                said.into_iter()
                    .find_map(|s| match s {
                        Said::Listening(a) => Some(a),
                        _ => None,
                    })
                    .ok_or(log)
            }
        })
        .await;
        app
    }

    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Everything the app said so far, in order.
    pub fn said(&self) -> Vec<Said> {
        self.log()
            .lines()
            .filter_map(|l| Said::parse(self.server, l))
            .collect()
    }

    /// Per stream id, what the app said about it.
    pub fn streams(&self) -> BTreeMap<String, AppStream> {
        let mut out = BTreeMap::<String, AppStream>::new();
        for s in self.said() {
            match s {
                Said::Subscribe { id, peer } => out.entry(id).or_default().peer = Some(peer),
                Said::Ended { id, last, how } => {
                    out.entry(id).or_default().ended = Some((last, how))
                }
                _ => {}
            }
        }
        out
    }

    /// SIGTERM: the app's graceful stop.
    pub fn sigterm(&self) {
        let pid = self.child.id().expect("the app is running");
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM the app");
    }

    /// Throttles the app as a CPU quota does: stopped (SIGSTOP) for
    /// `stopped` of every `period`, until [`Throttle::stop`] or `limit`.
    pub fn throttle(&self, stopped: Duration, period: Duration, limit: Duration) -> Throttle {
        let pid = Pid::from_raw(self.child.id().expect("the app is running") as i32);
        let run = Arc::new(AtomicBool::new(true));
        let on = run.clone();
        let thread = std::thread::spawn(move || {
            let until = std::time::Instant::now() + limit;
            let mut cycles = 0;
            while on.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                if kill(pid, Signal::SIGSTOP).is_err() {
                    break;
                }
                std::thread::sleep(stopped);
                let _ = kill(pid, Signal::SIGCONT);
                cycles += 1;
                std::thread::sleep(period.saturating_sub(stopped));
            }
            let _ = kill(pid, Signal::SIGCONT);
            cycles
        });
        Throttle {
            run,
            thread: Some(thread),
        }
    }

    /// Waits up to `limit` for the app to exit by itself, then for its
    /// output to be read to the end. None if it is still running.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .ok()?
            .ok()?;
        for r in self.readers.drain(..) {
            let _ = tokio::time::timeout(WAIT, r).await;
        }
        Some(status)
    }

    /// Kills the app and waits until it is gone.
    pub async fn kill(&mut self) {
        self.stdin.take();
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(WAIT, self.child.wait()).await;
    }
}

/// A throttled app ([`PeerApp::throttle`]); it runs freely again once
/// stopped or dropped.
pub struct Throttle {
    run: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Throttle {
    /// Lets the app run freely again; how many times it was frozen.
    pub fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.run.store(false, Ordering::Relaxed);
        self.thread
            .take()
            .map_or(0, |t| t.join().unwrap_or_default())
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_server_the_same_way() {
        let text = [
            "listening 127.0.0.1:4000",
            "subscribe q-1 127.0.0.1:5000",
            "ended q-1 7 send failed: rpc error: code = Canceled",
            "stopping",
            "report {}",
        ];
        let said: Vec<Said> = text
            .iter()
            .filter_map(|l| Said::parse(Server::GrpcGo, l))
            .collect();
        assert_eq!(
            said,
            [
                Said::Listening("127.0.0.1:4000".parse().expect("addr")),
                Said::Subscribe {
                    id: "q-1".into(),
                    peer: "127.0.0.1:5000".into()
                },
                Said::Ended {
                    id: "q-1".into(),
                    last: 7,
                    how: "send failed: rpc error: code = Canceled".into()
                },
                Said::Stopping,
            ]
        );
        let json = [
            r#"{"timestamp":"t","level":"INFO","message":"bench server listening","addr":"127.0.0.1:4000","target":"drainshim_bench::server"}"#,
            r#"{"level":"DEBUG","message":"bench server: subscribe","stream_id":"q-1","peer":"127.0.0.1:5000"}"#,
            r#"{"level":"DEBUG","message":"bench server: stream ended","stream_id":"q-1","last_written":7}"#,
        ];
        let said: Vec<Said> = json
            .iter()
            .filter_map(|l| Said::parse(Server::Tonic, l))
            .collect();
        assert_eq!(said.len(), 3, "{said:?}");
        assert_eq!(
            said[2],
            Said::Ended {
                id: "q-1".into(),
                last: 7,
                how: "dropped".into()
            }
        );
    }
}
