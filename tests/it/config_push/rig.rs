//! The config-push tests' rig: Envoy on LDS from a file, the apps (grpc-go
//! and grpcio as peers, a Python `websockets` server), their clients, and
//! how a run is judged and tabled.

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
use support::peers::PeerApp;
use support::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// Envoy's `--drain-time-s`: the guard spreads its endings over this less
/// its margin (7 s: the ending bound, the sweep's slack, a WebSocket's close).
pub(super) const ENVOY_DRAIN_TIME: Duration = Duration::from_secs(16);
/// gRPC streams per gRPC server, over [`CHANNELS`] Envoy connections.
pub(super) const GRPC_STREAMS: usize = 100;
pub(super) const CHANNELS: usize = 4;
/// WebSockets.
pub(super) const WS_STREAMS: usize = 200;
/// The apps' cadences: long streams that are not idle.
pub(super) const GRPC_INTERVAL_MS: u32 = 1_000;
pub(super) const WS_INTERVAL_MS: u32 = 500;
/// The guard's flags: every answered stream older than 1 s is long-lived;
/// the watcher looks every 100 ms.
pub(super) const GUARD_FLAGS: &[&str] = &["--poll-interval", "100ms", "--long-stream-age", "1s"];
/// Longest a client runs; every client loop is bounded by it.
pub(super) const CLIENT_LIMIT: Duration = Duration::from_secs(120);
/// The most peak over mean of endings per second the spread may show.
pub(super) const STORM: f64 = 1.5;

/// One inbound listener of the LDS file.
#[derive(Clone, Debug)]
pub(super) struct Inbound {
    pub(super) name: &'static str,
    pub(super) port: u16,
    pub(super) cluster: &'static str,
    pub(super) websocket: bool,
}

/// One filter chain: its name, the source address it takes (None: any),
/// and its connection manager's stat prefix (an in-place field).
pub(super) type Chain = (&'static str, Option<IpAddr>, String);

/// The LDS file: each listener with the given stat prefix suffix `gen`
/// (a listener-level field: changing it replaces the listener), and its
/// chains. Each route adds the origin headers the guard reads.
pub(super) fn lds(listeners: &[(Inbound, Vec<Chain>)], gen: &str) -> String {
    lds_with(listeners, gen, Headers::All)
}

/// Which of the origin headers the routes add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Headers {
    /// None (a user's own routes).
    None,
    /// The connection and the filter chain: what Envoy before 1.40 can.
    NoListener,
    /// All three (Envoy 1.40 and later).
    All,
}

/// [`lds`], with the origin headers `origin` says.
pub(super) fn lds_with(listeners: &[(Inbound, Vec<Chain>)], gen: &str, origin: Headers) -> String {
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
pub(super) fn bootstrap(
    dir: &Path,
    admin_port: u16,
    clusters: &[(&str, SocketAddr, bool)],
) -> String {
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
pub(super) fn push(dir: &Path, yaml: &str) {
    let tmp = dir.join("lds.tmp");
    std::fs::write(&tmp, yaml).expect("write lds");
    std::fs::rename(&tmp, dir.join("lds.yaml")).expect("move lds");
}

/// An Envoy on LDS from a file in `dir`, its `--drain-time-s` the test's.
pub(super) async fn lds_envoy(
    dir: &Path,
    admin_port: u16,
    clusters: &[(&str, SocketAddr, bool)],
) -> EnvoyProcess {
    lds_envoy_of("1.40.0", dir, admin_port, clusters).await
}

/// [`lds_envoy`] of Envoy `release`.
pub(super) async fn lds_envoy_of(
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
pub(super) async fn wait_listening(ports: &[u16]) {
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
pub(super) struct WsServer {
    pub(super) addr: SocketAddr,
    pub(super) ended: Arc<Mutex<BTreeMap<String, u64>>>,
    pub(super) _child: tokio::process::Child,
}

pub(super) async fn ws_server() -> WsServer {
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
pub(super) struct PyConn {
    pub(super) id: String,
    pub(super) seqs: Vec<u64>,
    pub(super) close_code: Option<u16>,
    pub(super) error: Option<String>,
    /// CLOCK_MONOTONIC seconds when it ended.
    pub(super) ended: f64,
}

#[derive(serde::Deserialize, Debug)]
pub(super) struct PyRun {
    pub(super) connections: Vec<PyConn>,
    pub(super) unfinished: usize,
}

/// `n` Python `websockets` clients against `addr`; returns once every one
/// had its first tick, with a handle that yields their report.
pub(super) async fn ws_clients(
    addr: SocketAddr,
    prefix: &str,
    n: usize,
) -> tokio::task::JoinHandle<PyRun> {
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
pub(super) async fn grpc_clients(
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

pub(super) async fn join_all(tasks: Vec<tokio::task::JoinHandle<Vec<Sub>>>) -> Vec<Sub> {
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
pub(super) fn never_sent(s: &Sub, told: &BTreeMap<String, support::peers::AppStream>) -> bool {
    s.seqs.is_empty()
        && !told.contains_key(&s.id)
        && s.status.as_ref().is_some_and(|st| {
            describe(&Some(st.clone())).contains("operation was canceled <- connection closed")
        })
}

/// Peak endings per second over the mean, from the first ending to the last.
pub(super) fn storm(mut ends: Vec<f64>) -> f64 {
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
pub(super) async fn series(shim: SocketAddr, family: &str, label: &str) -> f64 {
    let (_, body) = http(shim, "GET", "/metrics").await;
    body.lines()
        .filter(|l| l.starts_with(family) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What one row of the table says.
#[derive(Debug, Default)]
pub(super) struct Row {
    pub(super) streams: usize,
    pub(super) graceful: usize,
    pub(super) cut: usize,
    pub(super) other: usize,
    pub(super) lost: u64,
    pub(super) storm: f64,
    /// When each graceful ending came (seconds, the row's own clock).
    pub(super) ends: Vec<f64>,
}

impl Row {
    pub(super) fn line(&self, what: &str) -> String {
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
pub(super) fn grpc_row(subs: &[Sub], app: &PeerApp, origin: Instant) -> (Row, Vec<String>) {
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
pub(super) fn ws_row(run: &PyRun, server: &WsServer) -> (Row, Vec<String>) {
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

/// A pod of one inbound listener from a file (its route adding `headers`)
/// on Envoy `release`, routing to the real sidecar's guard (`flags`) in
/// front of `app`.
pub(super) struct OneListener {
    pub(super) shim: SidecarBin,
    pub(super) envoy: EnvoyProcess,
    /// Where Envoy's callers connect.
    pub(super) addr: SocketAddr,
    pub(super) spec: Vec<(Inbound, Vec<Chain>)>,
    pub(super) headers: Headers,
    pub(super) dir: tempfile::TempDir,
}

impl OneListener {
    pub(super) async fn start(
        app: SocketAddr,
        release: &str,
        headers: Headers,
        flags: &[&str],
    ) -> Self {
        let admin = free_port();
        let shim = guard_sidecar_bin(admin, ANY_PORT, app, flags).await;
        let g = shim.guard();
        let l = Inbound {
            name: "inbound",
            port: free_port(),
            cluster: "guard",
            websocket: false,
        };
        let spec = vec![(l.clone(), vec![("fc", None, "http".to_string())])];
        let dir = tempfile::tempdir().expect("dir");
        push(dir.path(), &lds_with(&spec, "v1", headers));
        let envoy = lds_envoy_of(release, dir.path(), admin, &[("guard", g, true)]).await;
        wait_listening(&[l.port]).await;
        OneListener {
            shim,
            envoy,
            addr: SocketAddr::from(([127, 0, 0, 1], l.port)),
            spec,
            headers,
            dir,
        }
    }

    /// Lands generation `gen` of the listener (a new stat prefix: Envoy
    /// replaces it and drains the old one).
    pub(super) fn push(&self, gen: &str) {
        push(self.dir.path(), &lds_with(&self.spec, gen, self.headers));
    }
}
