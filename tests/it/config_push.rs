//! A config push never cuts a long stream (issue 59 item 2): real Envoy
//! 1.40 whose inbound listeners come from a file (LDS `path_config_source`,
//! updated by a move over the watched path, as a control plane's push
//! lands), with no retry policy, in front of servers users run: grpc-go,
//! grpcio (gRPC server streams, tonic clients) and Python `websockets`
//! (WebSockets, Python `websockets` clients).
//!
//! - **A listener-level push** (every listener's stat prefix changed):
//!   Envoy replaces each listener and drains the old one over its
//!   `--drain-time-s`, then closes what is left. Side by side, from one push:
//!   the baseline (Envoy straight to the apps) cuts every stream at the
//!   drain's end; behind the real `drainshim sidecar`'s guard every stream
//!   ends gracefully (gRPC UNAVAILABLE with the guard's config-push message,
//!   WebSocket Close 1012) before Envoy's close, gapless, nothing lost (the
//!   app's own count of what its transport took), counted as
//!   `reason="config_push"` and never as ungraceful, spread over the window
//!   (peak over mean, in one-second buckets).
//! - **A filter-chain-only push**: one listener, two chains told apart by
//!   the client's source address; only the changed chain drains, and only
//!   its streams end; the other chain's streams still flow after Envoy's
//!   close.
//! - **Two pushes inside one window**, with clients that open their stream
//!   again after each end, as a gRPC client does: no stream is ever cut.
//!
//! Fails (never skips) without the cached Envoy, Python venv or peers.

use crate::peer_matrix::clients::{classify, client, describe, End, Shape, Sub};
use crate::support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drainshim::guard::end_message;
use drainshim::metrics::Reason;
use drainshim_bench::envoy::{EnvoyOptions, EnvoyProcess};
use support::peers::{tail, PeerApp, Server};
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// Envoy's `--drain-time-s`: the guard spreads its endings over this less
/// its margin (7 s: the ending bound, the sweep's slack, a WebSocket's close).
const ENVOY_DRAIN_TIME: Duration = Duration::from_secs(16);
/// gRPC streams per gRPC server, over [`CHANNELS`] Envoy connections.
const GRPC_STREAMS: usize = 100;
const CHANNELS: usize = 4;
/// WebSockets.
const WS_STREAMS: usize = 200;
/// The apps' cadences: long streams that are not idle.
const GRPC_INTERVAL_MS: u32 = 1_000;
const WS_INTERVAL_MS: u32 = 500;
/// The guard's flags: every answered stream older than 1 s is long-lived;
/// the watcher looks every 100 ms.
const GUARD_FLAGS: &[&str] = &["--poll-interval", "100ms", "--long-stream-age", "1s"];
/// Longest a client runs; every client loop is bounded by it.
const CLIENT_LIMIT: Duration = Duration::from_secs(120);
/// The most peak over mean of endings per second the spread may show.
const STORM: f64 = 1.5;

/// One inbound listener of the LDS file.
#[derive(Clone, Debug)]
struct Inbound {
    name: &'static str,
    port: u16,
    cluster: &'static str,
    websocket: bool,
}

/// One filter chain: its name, the source address it takes (None: any),
/// and its connection manager's stat prefix (an in-place field).
type Chain = (&'static str, Option<IpAddr>, String);

/// The LDS file: each listener with the given stat prefix suffix `gen`
/// (a listener-level field: changing it replaces the listener), and its
/// chains. Each route adds the origin headers the guard reads.
fn lds(listeners: &[(Inbound, Vec<Chain>)], gen: &str) -> String {
    lds_with(listeners, gen, Headers::All)
}

/// Which of the origin headers the routes add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Headers {
    /// None (a user's own routes).
    None,
    /// The connection and the filter chain: what Envoy before 1.40 can.
    NoListener,
    /// All three (Envoy 1.40 and later).
    All,
}

/// [`lds`], with the origin headers `origin` says.
fn lds_with(listeners: &[(Inbound, Vec<Chain>)], gen: &str, origin: Headers) -> String {
    let mut out = String::from("resources:\n");
    for (l, chains) in listeners {
        out.push_str(&format!(
            r#"- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: {name}
  stat_prefix: {name}_{gen}
  traffic_direction: INBOUND
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
  filter_chains:
"#,
            name = l.name,
            port = l.port,
        ));
        for (chain, source, http_prefix) in chains {
            let matcher = source.map_or(String::new(), |ip| {
                format!(
                    "    filter_chain_match: {{ direct_source_prefix_ranges: [ {{ address_prefix: \"{ip}\", prefix_len: 32 }} ] }}\n"
                )
            });
            let two = r#"            request_headers_to_add:
            - header: { key: x-drainshim-downstream-connection, value: "%CONNECTION_ID%" }
              append_action: OVERWRITE_IF_EXISTS_OR_ADD
            - header: { key: x-drainshim-filter-chain, value: "%FILTER_CHAIN_NAME%" }
              append_action: OVERWRITE_IF_EXISTS_OR_ADD
"#;
            let third = r#"            - header: { key: x-drainshim-listener, value: "%LISTENER_NAME%" }
              append_action: OVERWRITE_IF_EXISTS_OR_ADD
"#;
            let headers = match origin {
                Headers::None => String::new(),
                Headers::NoListener => two.to_string(),
                Headers::All => format!("{two}{third}"),
            };
            let upgrade = if l.websocket {
                "        upgrade_configs: [ { upgrade_type: websocket } ]\n"
            } else {
                ""
            };
            out.push_str(&format!(
                r#"  - name: {chain}
{matcher}    filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: {http_prefix}
        codec_type: AUTO
        stream_idle_timeout: 0s
{upgrade}        route_config:
          virtual_hosts:
          - name: app
            domains: ["*"]
{headers}            routes: [ {{ match: {{ prefix: "/" }}, route: {{ cluster: {cluster}, timeout: 0s }} }} ]
        http_filters:
        - name: envoy.filters.http.router
          typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
"#,
                cluster = l.cluster,
            ));
        }
    }
    out
}

/// A bootstrap whose listeners come from `dir/lds.yaml`, with one STATIC
/// cluster per (name, address, HTTP/2?), no retry policy anywhere.
fn bootstrap(dir: &Path, admin_port: u16, clusters: &[(&str, SocketAddr, bool)]) -> String {
    let mut out = format!(
        r#"node: {{ id: push-test, cluster: drainshim }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
dynamic_resources:
  lds_config: {{ path_config_source: {{ path: {lds} }}, resource_api_version: V3 }}
static_resources:
  clusters:
"#,
        lds = serde_json::to_string(&dir.join("lds.yaml")).expect("path"),
    );
    for (name, addr, h2) in clusters {
        let protocol = if *h2 {
            r#"    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
"#
        } else {
            ""
        };
        out.push_str(&format!(
            r#"  - name: {name}
    type: STATIC
    connect_timeout: 1s
{protocol}    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: "{ip}", port_value: {port} }} }} }}
"#,
            ip = addr.ip(),
            port = addr.port(),
        ));
    }
    out
}

/// Lands `yaml` as a control plane's file delivery does: written beside,
/// then moved over the watched path.
fn push(dir: &Path, yaml: &str) {
    let tmp = dir.join("lds.tmp");
    std::fs::write(&tmp, yaml).expect("write lds");
    std::fs::rename(&tmp, dir.join("lds.yaml")).expect("move lds");
}

/// An Envoy on LDS from a file in `dir`, its `--drain-time-s` the test's.
async fn lds_envoy(
    dir: &Path,
    admin_port: u16,
    clusters: &[(&str, SocketAddr, bool)],
) -> EnvoyProcess {
    lds_envoy_of("1.40.0", dir, admin_port, clusters).await
}

/// [`lds_envoy`] of Envoy `release`.
async fn lds_envoy_of(
    release: &str,
    dir: &Path,
    admin_port: u16,
    clusters: &[(&str, SocketAddr, bool)],
) -> EnvoyProcess {
    let mut opts = EnvoyOptions::new(envoy_binary(release), clusters[0].1);
    opts.drain_time = ENVOY_DRAIN_TIME;
    opts.admin_port = admin_port;
    opts.custom_bootstrap = Some(bootstrap(dir, admin_port, clusters));
    EnvoyProcess::start(&opts)
        .await
        .expect("envoy with LDS from a file")
}

/// Waits until Envoy serves every listener of the file (they are warm).
async fn wait_listening(ports: &[u16]) {
    for port in ports {
        let addr = SocketAddr::from(([127, 0, 0, 1], *port));
        wait_for("envoy listens on the LDS listener", WAIT, || async move {
            tokio::net::TcpStream::connect(addr).await.is_ok()
        })
        .await;
    }
}

/// The Python `websockets` server (`tests/py/ws_app.py`): its address and
/// what it said of each connection that ended (id -> (sent, close code)).
struct WsServer {
    addr: SocketAddr,
    ended: Arc<Mutex<BTreeMap<String, u64>>>,
    _child: tokio::process::Child,
}

async fn ws_server() -> WsServer {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/ws_app.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python websockets server");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("the ws server listens in time")
        .expect("read")
        .expect("a line");
    let addr: SocketAddr = first
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("ws server said {first:?}"));
    let ended = Arc::new(Mutex::new(BTreeMap::new()));
    let sink = ended.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                let id = v["id"].as_str().unwrap_or_default().to_string();
                let sent = v["sent"].as_u64().unwrap_or(0);
                if let Ok(mut e) = sink.lock() {
                    e.insert(id, sent);
                }
            }
        }
    });
    WsServer {
        addr,
        ended,
        _child: child,
    }
}

#[derive(serde::Deserialize, Debug)]
struct PyConn {
    id: String,
    seqs: Vec<u64>,
    close_code: Option<u16>,
    error: Option<String>,
    /// CLOCK_MONOTONIC seconds when it ended.
    ended: f64,
}

#[derive(serde::Deserialize, Debug)]
struct PyRun {
    connections: Vec<PyConn>,
    unfinished: usize,
}

/// `n` Python `websockets` clients against `addr`; returns once every one
/// had its first tick, with a handle that yields their report.
async fn ws_clients(addr: SocketAddr, prefix: &str, n: usize) -> tokio::task::JoinHandle<PyRun> {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/ws_client.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .args(["--base", &format!("ws://{addr}"), "--n", &n.to_string()])
        .args([
            "--prefix",
            prefix,
            "--interval-ms",
            &WS_INTERVAL_MS.to_string(),
        ])
        .args(["--limit", &CLIENT_LIMIT.as_secs().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python websockets clients");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("every WebSocket ticks in time")
        .expect("read");
    assert_eq!(ready.as_deref(), Some("ready"));
    tokio::spawn(async move {
        let line = tokio::time::timeout(CLIENT_LIMIT + WAIT, lines.next_line())
            .await
            .expect("the Python clients finished in time")
            .expect("read")
            .expect("a report line");
        let _ = child.wait().await;
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad report {line:?}: {e}"))
    })
}

/// `n` tonic Subscribe clients through `addr` over [`CHANNELS`] connections
/// (from `source`, when given), each opening its stream again after an
/// UNAVAILABLE end up to `cycles` times; returns once every stream has two
/// messages.
async fn grpc_clients(
    addr: SocketAddr,
    source: Option<IpAddr>,
    prefix: &str,
    n: usize,
    cycles: usize,
    deadline: Instant,
) -> Vec<tokio::task::JoinHandle<Vec<Sub>>> {
    let mut channels: Vec<Channel> = Vec::new();
    for _ in 0..CHANNELS {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .local_address(source)
            .connect()
            .await
            .expect("connect to Envoy");
        channels.push(ch);
    }
    let counts: Vec<Arc<AtomicUsize>> = (0..n).map(|_| Arc::default()).collect();
    let shape = Shape {
        interval_ms: GRPC_INTERVAL_MS,
        payload_bytes: 64,
        hold: None,
    };
    let tasks = counts
        .iter()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(client(
                channels[i % CHANNELS].clone(),
                format!("{prefix}{i}"),
                shape.clone(),
                cycles,
                c.clone(),
                deadline,
            ))
        })
        .collect();
    wait_for("every gRPC stream flows", WAIT, || {
        let ok = counts.iter().all(|c| c.load(Ordering::Relaxed) >= 2);
        std::future::ready(ok)
    })
    .await;
    tasks
}

async fn join_all(tasks: Vec<tokio::task::JoinHandle<Vec<Sub>>>) -> Vec<Sub> {
    let mut subs = Vec::new();
    for t in tasks {
        subs.extend(t.await.expect("client task"));
    }
    subs
}

/// A call that failed before it was sent: no message, the app never saw
/// it, and hyper says the request was cancelled because its connection
/// closed (a call tonic dispatched to an HTTP/2 connection as Envoy's GOAWAY
/// arrived on it). gRPC's transparent retry (A6) retries exactly these;
/// tonic does not. Never a stream the guard carried.
fn never_sent(s: &Sub, told: &BTreeMap<String, support::peers::AppStream>) -> bool {
    s.seqs.is_empty()
        && !told.contains_key(&s.id)
        && s.status.as_ref().is_some_and(|st| {
            describe(&Some(st.clone())).contains("operation was canceled <- connection closed")
        })
}

/// Peak endings per second over the mean, from the first ending to the last.
fn storm(mut ends: Vec<f64>) -> f64 {
    ends.sort_by(f64::total_cmp);
    let (Some(first), Some(last)) = (ends.first().copied(), ends.last().copied()) else {
        return 0.0;
    };
    let buckets = (last - first).floor() as usize + 1;
    let mut counts = vec![0usize; buckets];
    for e in &ends {
        counts[((e - first).floor() as usize).min(buckets - 1)] += 1;
    }
    let peak = counts.iter().copied().max().unwrap_or(0) as f64;
    peak / (ends.len() as f64 / buckets as f64)
}

/// The sum of every series of `family` whose labels contain `label`.
async fn series(shim: SocketAddr, family: &str, label: &str) -> f64 {
    let (_, body) = http(shim, "GET", "/metrics").await;
    body.lines()
        .filter(|l| l.starts_with(family) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What one row of the table says.
#[derive(Debug, Default)]
struct Row {
    streams: usize,
    graceful: usize,
    cut: usize,
    other: usize,
    lost: u64,
    storm: f64,
    /// When each graceful ending came (seconds, the row's own clock).
    ends: Vec<f64>,
}

impl Row {
    fn line(&self, what: &str) -> String {
        // The storm of the graceful endings: none, none to judge.
        let storm = if self.graceful == 0 {
            "-".to_string()
        } else {
            format!("{:.2}", self.storm)
        };
        format!(
            "| {what} | {} | {} | {} | {} | {} | {storm} |",
            self.streams, self.graceful, self.cut, self.other, self.lost
        )
    }
}

/// Judges gRPC subs: graceful (the config push's message), cut, other;
/// lost: messages the app handed its transport that the client never got.
fn grpc_row(subs: &[Sub], app: &PeerApp, origin: Instant) -> (Row, Vec<String>) {
    let told = app.streams();
    let graceful = [end_message(Reason::config_push)];
    let mut row = Row {
        streams: subs.len(),
        ..Row::default()
    };
    let mut notes = Vec::new();
    let mut ends = Vec::new();
    for s in subs {
        match classify(s, &graceful) {
            End::Graceful => {
                row.graceful += 1;
                ends.push(s.ended_at.duration_since(origin).as_secs_f64());
            }
            End::Cut => {
                row.cut += 1;
                notes.push(format!("{} cut: {}", s.id, describe(&s.status)));
            }
            _ => {
                row.other += 1;
                notes.push(format!("{} ended: {}", s.id, describe(&s.status)));
            }
        }
        // Calls the test's own limit ended are not judged for loss.
        let judged = matches!(classify(s, &graceful), End::Graceful | End::Cut);
        let last = s.seqs.last().copied().unwrap_or(0);
        if let Some((sent, _)) = told.get(&s.id).and_then(|t| t.ended.clone()) {
            if judged {
                row.lost += sent.saturating_sub(last);
            }
        }
        if !s.gapless() {
            notes.push(format!("{} has gaps: {:?}", s.id, s.seqs));
        }
    }
    row.storm = storm(ends.clone());
    row.ends = ends;
    (row, notes)
}

/// Judges the WebSockets: graceful is a Close 1012; lost: ticks the server's
/// transport took that the client never got.
fn ws_row(run: &PyRun, server: &WsServer) -> (Row, Vec<String>) {
    let sent = server.ended.lock().map(|e| e.clone()).unwrap_or_default();
    let mut row = Row {
        streams: run.connections.len(),
        ..Row::default()
    };
    let mut notes = Vec::new();
    let mut ends = Vec::new();
    for c in &run.connections {
        match c.close_code {
            Some(1012) => {
                row.graceful += 1;
                ends.push(c.ended);
            }
            None => {
                row.cut += 1;
                notes.push(format!("{} cut: {:?}", c.id, c.error));
            }
            Some(code) => {
                row.other += 1;
                notes.push(format!("{} closed {code}", c.id));
            }
        }
        if let Some(n) = sent.get(&c.id) {
            row.lost += n.saturating_sub(c.seqs.len() as u64);
        }
        if !c.seqs.iter().zip(1u64..).all(|(s, want)| *s == want) {
            notes.push(format!("{} has gaps", c.id));
        }
    }
    row.storm = storm(ends);
    (row, notes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_push_cuts_every_stream_without_drainshim_and_none_behind_it() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let py = PeerApp::start(Server::Grpcio).await;
    let ws = ws_server().await;

    // Behind drainshim: one sidecar (guard) per app.
    let guard_addr = || SocketAddr::from(([127, 0, 0, 1], free_port()));
    let guarded_admin = free_port();
    let (g_go, g_py, g_ws) = (guard_addr(), guard_addr(), guard_addr());
    let mut shims = Vec::new();
    for (g, app) in [(g_go, go.addr), (g_py, py.addr), (g_ws, ws.addr)] {
        shims.push(guard_sidecar_bin(guarded_admin, g, app, GUARD_FLAGS).await);
    }
    let listeners = |base: &str| -> Vec<(Inbound, Vec<Chain>)> {
        let name = |n: &str| -> &'static str { Box::leak(format!("{base}-{n}").into_boxed_str()) };
        [
            ("go", true, false),
            ("py", true, false),
            ("ws", false, true),
        ]
        .into_iter()
        .map(|(n, _, websocket)| {
            let l = Inbound {
                // The harness waits for a listener named so.
                name: if n == "go" { "inbound" } else { name(n) },
                port: free_port(),
                cluster: name(n),
                websocket,
            };
            let chains = vec![(name("fc"), None, format!("{}_http", l.name))];
            (l, chains)
        })
        .collect()
    };
    let (dir_b, dir_g) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (lb, lg) = (listeners("base"), listeners("guarded"));
    push(dir_b.path(), &lds(&lb, "v1"));
    push(dir_g.path(), &lds(&lg, "v1"));
    let base_admin = free_port();
    let _base = lds_envoy(
        dir_b.path(),
        base_admin,
        &[
            (lb[0].0.cluster, go.addr, true),
            (lb[1].0.cluster, py.addr, true),
            (lb[2].0.cluster, ws.addr, false),
        ],
    )
    .await;
    let _guarded = lds_envoy(
        dir_g.path(),
        guarded_admin,
        &[
            (lg[0].0.cluster, g_go, true),
            (lg[1].0.cluster, g_py, true),
            (lg[2].0.cluster, g_ws, false),
        ],
    )
    .await;
    let ports: Vec<u16> = lb.iter().chain(&lg).map(|(l, _)| l.port).collect();
    wait_listening(&ports).await;
    let at = |l: &Inbound| SocketAddr::from(([127, 0, 0, 1], l.port));

    let deadline = Instant::now() + CLIENT_LIMIT;
    let mut grpc = Vec::new();
    for (mode, ls) in [("b", &lb), ("g", &lg)] {
        for (i, who) in ["go", "py"].into_iter().enumerate() {
            let prefix = format!("{mode}-{who}-");
            grpc.push(grpc_clients(at(&ls[i].0), None, &prefix, GRPC_STREAMS, 1, deadline).await);
        }
    }
    let ws_base = ws_clients(at(&lb[2].0), "b-ws-", WS_STREAMS).await;
    let ws_guarded = ws_clients(at(&lg[2].0), "g-ws-", WS_STREAMS).await;
    // The guard takes a stream as long-lived once answered 1 s ago.
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    // One push to both Envoys, as a control plane's new generation lands.
    let pushed = Instant::now();
    push(dir_b.path(), &lds(&lb, "v2"));
    push(dir_g.path(), &lds(&lg, "v2"));

    let mut subs = Vec::new();
    for tasks in grpc {
        subs.push(join_all(tasks).await);
    }
    let ws_b = ws_base.await.expect("ws clients");
    let ws_g = ws_guarded.await.expect("ws clients");
    let closed_at = ENVOY_DRAIN_TIME;

    let (b_go, n1) = grpc_row(&subs[0], &go, pushed);
    let (b_py, n2) = grpc_row(&subs[1], &py, pushed);
    let (g_go_row, n3) = grpc_row(&subs[2], &go, pushed);
    let (g_py_row, n4) = grpc_row(&subs[3], &py, pushed);
    // Wait for the ws server's account of every guarded connection.
    wait_for("the ws server accounts for every connection", WAIT, || {
        let n = ws
            .ended
            .lock()
            .map(|e| e.keys().filter(|k| k.starts_with("g-ws-")).count())
            .unwrap_or(0);
        std::future::ready(n == WS_STREAMS)
    })
    .await;
    let (b_ws, n5) = ws_row(&ws_b, &ws);
    let (g_ws_row, n6) = ws_row(&ws_g, &ws);
    let mut table = String::from(
        "## A config push (an LDS update of every inbound listener), Envoy 1.40, no retry policy\n\n\
         | a listener-level push | streams | graceful | cut | other | lost | storm (peak/mean, 1 s) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for (row, what) in [
        (&b_go, "baseline, grpc-go"),
        (&b_py, "baseline, grpcio"),
        (&b_ws, "baseline, websockets"),
        (&g_go_row, "drainshim, grpc-go"),
        (&g_py_row, "drainshim, grpcio"),
        (&g_ws_row, "drainshim, websockets"),
    ] {
        table.push_str(&row.line(what));
        table.push('\n');
    }
    eprintln!("{table}");
    // Kept for `make test`, which prints it at its end beside the peer
    // matrix's tables (cargo hides a passing test's output).
    let tables = Path::new(env!("CARGO_TARGET_TMPDIR")).join("peer-matrix");
    if let Err(e) = std::fs::create_dir_all(&tables)
        .and_then(|()| std::fs::write(tables.join("config-push.md"), &table))
    {
        eprintln!(
            "config push: could not keep the table in {}: {e}",
            tables.display()
        );
    }
    // The baseline: Envoy closed every connection at the drain's end.
    for (row, notes, what) in [
        (&b_go, &n1, "grpc-go"),
        (&b_py, &n2, "grpcio"),
        (&b_ws, &n5, "websockets"),
    ] {
        assert_eq!(
            row.cut, row.streams,
            "baseline {what}: every stream cut; {notes:?}"
        );
    }
    let earliest_cut = subs[0]
        .iter()
        .chain(&subs[1])
        .map(|s| s.ended_at.duration_since(pushed))
        .min()
        .unwrap_or_default();
    assert!(
        earliest_cut + Duration::from_secs(1) >= closed_at,
        "the baseline's cuts come at Envoy's drain end ({closed_at:?}), the first came {earliest_cut:?} after the push"
    );
    assert_eq!(ws_b.unfinished + ws_g.unfinished, 0);
    // Behind drainshim: every stream graceful, nothing lost, spread.
    for (row, notes, what, want) in [
        (&g_go_row, &n3, "grpc-go", GRPC_STREAMS),
        (&g_py_row, &n4, "grpcio", GRPC_STREAMS),
        (&g_ws_row, &n6, "websockets", WS_STREAMS),
    ] {
        assert_eq!(row.streams, want, "{what}");
        assert_eq!(
            row.graceful, want,
            "drainshim {what}: every stream graceful; {notes:?}"
        );
        assert_eq!(row.lost, 0, "drainshim {what}: nothing lost; {notes:?}");
        assert!(notes.is_empty(), "drainshim {what}: {notes:?}");
    }
    // The reconnects Envoy's callers see: the gRPC endings of both guards
    // (one clock, the test's), and the WebSockets' (the Python clients').
    let grpc_storm = storm([g_go_row.ends.clone(), g_py_row.ends.clone()].concat());
    eprintln!(
        "storm, every gRPC ending: {grpc_storm:.2}; every WebSocket's: {:.2}",
        g_ws_row.storm
    );
    assert!(grpc_storm <= STORM, "gRPC storm {grpc_storm:.2}");
    assert!(
        g_ws_row.storm <= STORM,
        "WebSocket storm {:.2}",
        g_ws_row.storm
    );
    for (shim, want, protocol) in [
        (&shims[0], GRPC_STREAMS, "grpc"),
        (&shims[1], GRPC_STREAMS, "grpc"),
        (&shims[2], WS_STREAMS, "websocket"),
    ] {
        // Counted once the goodbye is written, which the client may read first.
        let addr = shim.addr;
        let counted = || async move {
            series(
                addr,
                "drainshim_streams_terminated_total{",
                "reason=\"config_push\"",
            )
            .await
        };
        let what = format!("{protocol}: counted as config-push endings");
        let _ = tokio::time::timeout(WAIT, async {
            while counted().await < want as f64 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        let (_, text) = http(addr, "GET", "/metrics").await;
        let families: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("drainshim_streams_") && !l.ends_with(" 0"))
            .collect();
        assert_eq!(
            counted().await,
            want as f64,
            "{what}\n{families:#?}\n{}",
            tail(&shim.log(), 30)
        );
        let cut = series(shim.addr, "drainshim_streams_ungraceful_total{", "").await;
        assert_eq!(cut, 0.0, "{protocol}: none ungraceful");
        let drained = series(
            shim.addr,
            "drainshim_streams_terminated_total{",
            "reason=\"drain\"",
        )
        .await;
        assert_eq!(drained, 0.0, "{protocol}: the pod did not drain");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_chain_push_ends_only_that_chains_streams() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let admin = free_port();
    let g = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let shim = guard_sidecar_bin(admin, g, go.addr, GUARD_FLAGS).await;
    let (one, two): (IpAddr, IpAddr) = ([127, 0, 0, 2].into(), [127, 0, 0, 3].into());
    let l = Inbound {
        name: "inbound",
        port: free_port(),
        cluster: "guard",
        websocket: false,
    };
    let chains = |one_prefix: &str| -> Vec<(Inbound, Vec<Chain>)> {
        vec![(
            l.clone(),
            vec![
                ("one", Some(one), one_prefix.to_string()),
                ("two", Some(two), "two_http".to_string()),
            ],
        )]
    };
    let dir = tempfile::tempdir().expect("dir");
    push(dir.path(), &lds(&chains("one_http"), "v1"));
    let envoy = lds_envoy(dir.path(), admin, &[("guard", g, true)]).await;
    wait_listening(&[l.port]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], l.port));
    let deadline = Instant::now() + CLIENT_LIMIT;
    const N: usize = 20;
    let on_one = grpc_clients(addr, Some(one), "one-", N, 1, deadline).await;
    let (stop_two, stopped) = tokio::sync::watch::channel(false);
    let two_counts: Vec<Arc<AtomicUsize>> = (0..N).map(|_| Arc::default()).collect();
    let mut on_two = Vec::new();
    {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .local_address(Some(two))
            .connect()
            .await
            .expect("connect");
        for (i, c) in two_counts.iter().enumerate() {
            let (ch, c, mut stopped) = (ch.clone(), c.clone(), stopped.clone());
            on_two.push(tokio::spawn(async move {
                let shape = Shape {
                    interval_ms: GRPC_INTERVAL_MS,
                    payload_bytes: 64,
                    hold: None,
                };
                tokio::select! {
                    subs = client(ch, format!("two-{i}"), shape, 1, c, deadline) => Some(subs),
                    _ = stopped.wait_for(|s| *s) => None,
                }
            }));
        }
    }
    wait_for("chain two's streams flow", WAIT, || {
        std::future::ready(two_counts.iter().all(|c| c.load(Ordering::Relaxed) >= 2))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    push(dir.path(), &lds(&chains("one_http_v2"), "v1"));
    let admin_client = envoy.admin_client();
    wait_for("envoy updated the listener in place", WAIT, || async {
        admin_client
            .listener_manager()
            .await
            .is_ok_and(|m| m.in_place_updated == 1)
    })
    .await;
    let subs = join_all(on_one).await;
    let (row, notes) = grpc_row(&subs, &go, pushed);
    eprintln!(
        "| filter-chain push, chain one | {} graceful of {}, {} cut, {} lost |",
        row.graceful, row.streams, row.cut, row.lost
    );
    assert_eq!(row.graceful, N, "{notes:?}");
    assert_eq!(row.lost, 0, "{notes:?}");
    // Past Envoy's close of chain one's connections, chain two still flows.
    let before: Vec<usize> = two_counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    tokio::time::sleep_until(pushed + ENVOY_DRAIN_TIME + Duration::from_secs(1)).await;
    wait_for(
        "chain two's streams still flow after the drain's end",
        WAIT,
        || {
            let now: Vec<usize> = two_counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect();
            std::future::ready(now.iter().zip(&before).all(|(n, b)| n > b))
        },
    )
    .await;
    for t in &on_two {
        assert!(!t.is_finished(), "a stream of chain two ended");
    }
    // A push that only adds a chain drains nothing: nothing more ends.
    let three: IpAddr = [127, 0, 0, 4].into();
    let mut more = chains("one_http_v2");
    more[0]
        .1
        .push(("three", Some(three), "three_http".to_string()));
    push(dir.path(), &lds(&more, "v1"));
    let shim_addr = shim.addr;
    wait_for("the shim saw the chain added", WAIT, || async move {
        series(
            shim_addr,
            "drainshim_envoy_listener_drains_total{",
            "kind=\"filter_chains\"",
        )
        .await
            >= 2.0
    })
    .await;
    let before: Vec<usize> = two_counts
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    wait_for(
        "chain two's streams flow on after the chain was added",
        WAIT,
        || {
            let now: Vec<usize> = two_counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect();
            std::future::ready(now.iter().zip(&before).all(|(n, b)| n > b))
        },
    )
    .await;
    for t in &on_two {
        assert!(
            !t.is_finished(),
            "a stream of chain two ended after a chain was added"
        );
    }
    let _ = stop_two.send(true);
    for t in on_two {
        assert!(
            t.await.expect("task").is_none(),
            "chain two's streams were never ended"
        );
    }
    let addr = shim.addr;
    let counted = || async move {
        series(
            addr,
            "drainshim_streams_terminated_total{",
            "reason=\"config_push\"",
        )
        .await
    };
    wait_for("chain one's endings counted", WAIT, || async {
        counted().await >= N as f64
    })
    .await;
    assert_eq!(
        counted().await,
        N as f64,
        "only chain one's streams\n{}",
        tail(&shim.log(), 30)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pushes_in_one_window_cut_nothing_for_clients_that_come_back() {
    let py = PeerApp::start(Server::Grpcio).await;
    let admin = free_port();
    let g = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let shim = guard_sidecar_bin(admin, g, py.addr, GUARD_FLAGS).await;
    let l = Inbound {
        name: "inbound",
        port: free_port(),
        cluster: "guard",
        websocket: false,
    };
    let spec = vec![(l.clone(), vec![("fc", None, "http".to_string())])];
    let dir = tempfile::tempdir().expect("dir");
    push(dir.path(), &lds(&spec, "v1"));
    let envoy = lds_envoy(dir.path(), admin, &[("guard", g, true)]).await;
    wait_listening(&[l.port]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], l.port));
    const N: usize = 40;
    // Clients come back after each end; the test ends them after both windows.
    let until = Instant::now() + ENVOY_DRAIN_TIME * 2 + Duration::from_secs(6);
    let tasks = grpc_clients(addr, None, "c-", N, 8, until).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    push(dir.path(), &lds(&spec, "v2"));
    let admin_client = envoy.admin_client();
    wait_for("envoy took the first push", WAIT, || async {
        admin_client
            .listener_manager()
            .await
            .is_ok_and(|m| m.modified == 1)
    })
    .await;
    // The second inside the first's window, once some streams came back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    push(dir.path(), &lds(&spec, "v3"));
    wait_for("envoy took the second push", WAIT, || async {
        admin_client
            .listener_manager()
            .await
            .is_ok_and(|m| m.modified == 2)
    })
    .await;
    let subs = join_all(tasks).await;
    let graceful = [end_message(Reason::config_push)];
    let told = py.streams();
    let (mut cut, mut unsent) = (Vec::new(), Vec::new());
    let mut ended_gracefully = 0;
    for s in &subs {
        let line = || {
            format!(
                "{} at {:?} after the first push, {} messages: {}",
                s.id,
                s.ended_at.duration_since(pushed),
                s.seqs.len(),
                describe(&s.status)
            )
        };
        match classify(s, &graceful) {
            End::Graceful => ended_gracefully += 1,
            End::Cut if never_sent(s, &told) => unsent.push(line()),
            End::Cut => cut.push(line()),
            // The test's own limit ended the last call of each client.
            _ => {}
        }
        assert!(
            s.gapless() || s.seqs.is_empty(),
            "{} has gaps: {:?}",
            s.id,
            s.seqs
        );
    }
    let (row, _) = grpc_row(&subs, &py, pushed);
    eprintln!(
        "| two pushes in one window | {} calls, {ended_gracefully} ended by a push, {} cut, {} lost; {} calls opened again never sent (tonic, Envoy's GOAWAY) |",
        subs.len(),
        cut.len(),
        row.lost,
        unsent.len()
    );
    if !unsent.is_empty() {
        eprintln!("never sent: {unsent:#?}");
    }
    assert!(cut.is_empty(), "{cut:#?}\n{}", tail(&shim.log(), 60));
    assert!(
        ended_gracefully >= N,
        "every first call ended by the first push"
    );
    assert_eq!(row.lost, 0);
    let ungraceful = series(shim.addr, "drainshim_streams_ungraceful_total{", "").await;
    assert_eq!(ungraceful, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_during_the_pods_drain_cuts_nothing() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let admin = free_port();
    let g = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut flags = GUARD_FLAGS.to_vec();
    // The pod's drain: 2 s deregistration, then its endings over 4 s.
    flags.extend([
        "--deregistration-delay",
        "2s",
        "--min-drain-time",
        "500ms",
        "--drain-time",
        "6s",
        "--parent-shutdown-time",
        "20s",
    ]);
    let shim = guard_sidecar_bin(admin, g, go.addr, &flags).await;
    let l = Inbound {
        name: "inbound",
        port: free_port(),
        cluster: "guard",
        websocket: false,
    };
    let spec = vec![(l.clone(), vec![("fc", None, "http".to_string())])];
    let dir = tempfile::tempdir().expect("dir");
    push(dir.path(), &lds(&spec, "v1"));
    let envoy = lds_envoy(dir.path(), admin, &[("guard", g, true)]).await;
    wait_listening(&[l.port]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], l.port));
    const N: usize = 40;
    let tasks = grpc_clients(addr, None, "d-", N, 1, Instant::now() + CLIENT_LIMIT).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let drain = tokio::spawn(prestop(shim.addr));
    // The push lands in the drain's deregistration delay, before Envoy's
    // listeners are stopped: Envoy drains the replaced listener too.
    let admin_client = envoy.admin_client();
    wait_for(
        "the pod's drain failed envoy's health check",
        WAIT,
        || async { matches!(admin_client.ready().await, Ok(false)) },
    )
    .await;
    let pushed = Instant::now();
    push(dir.path(), &lds(&spec, "v2"));
    let subs = join_all(tasks).await;
    let run = drain.await.expect("prestop");
    let graceful = [end_message(Reason::drain), end_message(Reason::config_push)];
    let mut bad = Vec::new();
    for s in &subs {
        if classify(s, &graceful) != End::Graceful || !s.gapless() {
            bad.push(format!(
                "{}: {} ({} messages)",
                s.id,
                describe(&s.status),
                s.seqs.len()
            ));
        }
    }
    let (row, _) = grpc_row(&subs, &go, pushed);
    let m = admin_client
        .listener_manager()
        .await
        .expect("listener_manager");
    eprintln!(
        "| a push during the pod's drain | {} streams, {} graceful, {} lost; envoy counted {} listener update(s) |",
        subs.len(),
        subs.len() - bad.len(),
        row.lost,
        m.modified
    );
    assert!(bad.is_empty(), "{bad:#?}\n{}", tail(&shim.log(), 40));
    assert_eq!(row.lost, 0);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let ungraceful = series(shim.addr, "drainshim_streams_ungraceful_total{", "").await;
    assert_eq!(ungraceful, 0.0);
}

/// Without Envoy's origin headers (a user's own routes), the guard goes by
/// time: every stream open when the drain began ends gracefully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_origin_headers_the_streams_open_at_the_push_end_gracefully() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let admin = free_port();
    let g = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let shim = guard_sidecar_bin(admin, g, go.addr, GUARD_FLAGS).await;
    let l = Inbound {
        name: "inbound",
        port: free_port(),
        cluster: "guard",
        websocket: false,
    };
    let spec = vec![(l.clone(), vec![("fc", None, "http".to_string())])];
    let dir = tempfile::tempdir().expect("dir");
    push(dir.path(), &lds_with(&spec, "v1", Headers::None));
    let _envoy = lds_envoy(dir.path(), admin, &[("guard", g, true)]).await;
    wait_listening(&[l.port]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], l.port));
    const N: usize = 40;
    let tasks = grpc_clients(addr, None, "t-", N, 1, Instant::now() + CLIENT_LIMIT).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    push(dir.path(), &lds_with(&spec, "v2", Headers::None));
    let subs = join_all(tasks).await;
    let (row, notes) = grpc_row(&subs, &go, pushed);
    eprintln!(
        "| no origin headers (by time) | {} graceful of {}, {} cut, {} lost, storm {:.2} |",
        row.graceful, row.streams, row.cut, row.lost, row.storm
    );
    assert_eq!(row.graceful, N, "{notes:?}\n{}", tail(&shim.log(), 30));
    assert_eq!(row.lost, 0, "{notes:?}");
}

/// The oldest release tested (1.36.4) has the connection and filter-chain
/// formatters but not `%LISTENER_NAME%`: with the two headers it has, a
/// push's streams end gracefully as on 1.40.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_envoy_1_36_the_two_headers_it_has_are_enough() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let admin = free_port();
    let g = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let shim = guard_sidecar_bin(admin, g, go.addr, GUARD_FLAGS).await;
    let l = Inbound {
        name: "inbound",
        port: free_port(),
        cluster: "guard",
        websocket: false,
    };
    let spec = vec![(l.clone(), vec![("fc", None, "http".to_string())])];
    let dir = tempfile::tempdir().expect("dir");
    push(dir.path(), &lds_with(&spec, "v1", Headers::NoListener));
    let _envoy = lds_envoy_of("1.36.4", dir.path(), admin, &[("guard", g, true)]).await;
    wait_listening(&[l.port]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], l.port));
    const N: usize = 40;
    let tasks = grpc_clients(addr, None, "o-", N, 1, Instant::now() + CLIENT_LIMIT).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    push(dir.path(), &lds_with(&spec, "v2", Headers::NoListener));
    let subs = join_all(tasks).await;
    let (row, notes) = grpc_row(&subs, &go, pushed);
    eprintln!(
        "| Envoy 1.36.4, two headers | {} graceful of {}, {} cut, {} lost |",
        row.graceful, row.streams, row.cut, row.lost
    );
    assert_eq!(row.graceful, N, "{notes:?}\n{}", tail(&shim.log(), 30));
    assert_eq!(row.lost, 0, "{notes:?}");
}
