//! Listener drains that are not the pod's (issue 59 item 1): a real Envoy
//! 1.40 whose inbound listener comes from a file (LDS
//! `path_config_source`), updated by a `mv` over the watched path as a
//! control plane's push would, beside the real `drainshim sidecar` with
//! `--log-format json`.
//!
//! - a listener-level change (its stat prefix): one `listener` drain counted,
//!   and a JSON log event naming the listener and its drain window;
//! - a filter-chain-only change: one `filter_chains` drain;
//! - the pod's own drain afterwards (`POST /drain`, which drains Envoy's
//!   listeners through `/drain_listeners`): nothing more counted or logged.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drainshim_bench::envoy::{EnvoyOptions, EnvoyProcess};
use support::*;

/// Envoy's `--drain-time-s` here: the window each event must report.
const ENVOY_DRAIN_TIME: Duration = Duration::from_secs(3);

/// The inbound listener as LDS serves it: `prefix` is the listener's stat
/// prefix (a listener-level field: changing it replaces the listener),
/// `http_prefix` its connection manager's (a filter-chain field: changing
/// it updates the listener in place).
fn lds(port: u16, prefix: &str, http_prefix: &str) -> String {
    format!(
        r#"resources:
- "@type": type.googleapis.com/envoy.config.listener.v3.Listener
  name: inbound
  stat_prefix: {prefix}
  traffic_direction: INBOUND
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
  filter_chains:
  - filters:
    - name: envoy.filters.network.http_connection_manager
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
        stat_prefix: {http_prefix}
        codec_type: AUTO
        route_config:
          virtual_hosts:
          - name: app
            domains: ["*"]
            routes: [ {{ match: {{ prefix: "/" }}, route: {{ cluster: app, timeout: 0s }} }} ]
        http_filters:
        - name: envoy.filters.http.router
          typed_config: {{ "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router }}
"#
    )
}

/// A bootstrap whose only listener comes from `dir/lds.yaml`, its admin
/// API on `admin_port` (0: any).
fn bootstrap(dir: &Path, app: SocketAddr, admin_port: u16) -> String {
    format!(
        r#"node: {{ id: lds-test, cluster: drainshim, metadata: {{ NAMESPACE: shop, NAME: lds }} }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
dynamic_resources:
  lds_config: {{ path_config_source: {{ path: {lds} }}, resource_api_version: V3 }}
static_resources:
  clusters:
  - name: app
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: app
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: "{ip}", port_value: {port} }} }} }}
"#,
        lds = serde_json::to_string(&dir.join("lds.yaml")).expect("path"),
        ip = app.ip(),
        port = app.port(),
    )
}

/// Pushes `yaml` as a control plane's file delivery does: written beside,
/// then moved over the watched path (Envoy watches the move).
fn push(dir: &Path, yaml: &str) {
    let tmp = dir.join("lds.tmp");
    std::fs::write(&tmp, yaml).expect("write lds");
    std::fs::rename(&tmp, dir.join("lds.yaml")).expect("move lds");
}

async fn metric(shim: SocketAddr, series: &str) -> Option<f64> {
    let (_, body) = http(shim, "GET", "/metrics").await;
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sidecar's JSON log events about listener drains, parsed.
fn drain_events(lines: &Mutex<Vec<String>>) -> Vec<serde_json::Map<String, serde_json::Value>> {
    lines
        .lock()
        .map(|l| l.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|l| match serde_json::from_str(l) {
            Ok(serde_json::Value::Object(o)) => Some(o),
            _ => None,
        })
        .filter(|o| {
            o.get("message")
                .and_then(|m| m.as_str())
                .is_some_and(|m| m.starts_with("envoy drains a listener after a config update"))
        })
        .collect()
}

fn field<'a>(
    o: &'a serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> &'a serde_json::Value {
    o.get(key).unwrap_or(&serde_json::Value::Null)
}

#[tokio::test]
async fn config_push_drains_are_counted_and_logged_and_the_pods_own_drain_is_not() {
    let backend = backend().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    push(dir.path(), &lds(port, "inbound", "inbound_http"));
    let mut opts = EnvoyOptions::new(envoy_binary("1.40.0"), backend.addr);
    opts.drain_time = ENVOY_DRAIN_TIME;
    opts.custom_bootstrap = Some(bootstrap(dir.path(), backend.addr, 0));
    let envoy = EnvoyProcess::start(&opts)
        .await
        .expect("envoy with LDS from a file");
    let admin = envoy.admin_client();

    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let (listen_s, admin_url) = (listen.to_string(), envoy.admin_url());
    let mut args = vec!["--log-format", "json", "sidecar", "--listen", &listen_s];
    args.extend(["--envoy-admin", &admin_url, "--linger", "0s"]);
    args.extend_from_slice(SHORT_TIMERS);
    let (mut child, _pid, mut stderr) = support::proc::spawn_bin(&args);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            if let Ok(mut l) = sink.lock() {
                l.push(line);
            }
        }
    });
    let drains =
        |kind: &'static str| format!("drainshim_envoy_listener_drains_total{{kind=\"{kind}\"}}");
    wait_for("the sidecar is ready", WAIT, || async {
        lines
            .lock()
            .map(|l| l.iter().any(|l| l.contains("sidecar ready")))
            .unwrap_or(false)
    })
    .await;
    assert_eq!(metric(listen, &drains("listener")).await, Some(0.0));
    // A whole look of the shim's (3 admin requests at most) is over once a
    // 4th request of its own came.
    let admin_requests = || async {
        admin
            .stats(r"^http\.admin\.downstream_rq_total$")
            .await
            .ok()
            .and_then(|s| s.first().map(|s| s.value))
            .unwrap_or(0)
    };
    let shims_looks = |what: &'static str| async move {
        let first = admin_requests().await;
        let mut mine = 0;
        wait_for(what, WAIT, || {
            mine += 1;
            let mine = mine;
            async move { admin_requests().await.saturating_sub(first + mine) >= 4 }
        })
        .await;
    };
    shims_looks("the shim took its first look at envoy").await;

    // 1. A listener-level change: Envoy replaces the listener and drains the old one.
    let pushed = std::time::SystemTime::now();
    push(dir.path(), &lds(port, "inbound_v2", "inbound_http"));
    wait_for("envoy drains the replaced listener", WAIT, || async {
        admin
            .listener_manager()
            .await
            .is_ok_and(|m| m.modified == 1)
    })
    .await;
    wait_for("the shim counts the listener drain", WAIT, || async {
        metric(listen, &drains("listener")).await == Some(1.0)
    })
    .await;
    wait_for("the shim logs it", WAIT, || async {
        drain_events(&lines).len() == 1
    })
    .await;
    let event = drain_events(&lines).remove(0);
    eprintln!("the listener drain's event: {event:?}");
    assert_eq!(field(&event, "listener"), "inbound", "{event:?}");
    assert_eq!(field(&event, "kind"), "listener", "{event:?}");
    assert_eq!(field(&event, "direction"), "INBOUND", "{event:?}");
    assert_eq!(field(&event, "during_pod_drain"), false, "{event:?}");
    assert_eq!(
        field(&event, "drain_time_seconds").as_f64(),
        Some(ENVOY_DRAIN_TIME.as_secs_f64()),
        "{event:?}"
    );
    let time = |key: &str| {
        let text = field(&event, key).as_str().unwrap_or_default();
        humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{key} {text:?}: {e}; {event:?}"))
    };
    let (started, ends) = (time("drain_started"), time("drain_ends"));
    assert_eq!(
        ends.duration_since(started).ok(),
        Some(ENVOY_DRAIN_TIME),
        "{event:?}"
    );
    // Envoy's timestamp of the update, at or after the push (millisecond
    // precision), within the wait above.
    assert!(
        started + Duration::from_millis(1) >= pushed && started <= std::time::SystemTime::now(),
        "drain start {started:?} against the push at {pushed:?}"
    );
    assert_eq!(metric(listen, &drains("filter_chains")).await, Some(0.0));

    // 2. A filter-chain-only change: updated in place, its old chain drains.
    push(dir.path(), &lds(port, "inbound_v2", "inbound_http_v2"));
    wait_for("the shim counts the filter chain drain", WAIT, || async {
        metric(listen, &drains("filter_chains")).await == Some(1.0)
    })
    .await;
    wait_for("the shim logs it", WAIT, || async {
        drain_events(&lines).len() == 2
    })
    .await;
    let event = drain_events(&lines).remove(1);
    assert_eq!(field(&event, "listener"), "inbound", "{event:?}");
    assert_eq!(field(&event, "kind"), "filter_chains", "{event:?}");
    assert_eq!(metric(listen, &drains("listener")).await, Some(1.0));
    let m = admin
        .listener_manager()
        .await
        .expect("listener_manager stats");
    assert_eq!((m.modified, m.in_place_updated), (2, 1), "{m:?}");

    // 3. The pod's own drain drains Envoy's listeners too, through
    // /drain_listeners: not a config push.
    wait_for("envoy's config-push drains are over", WAIT, || async {
        admin
            .listener_manager()
            .await
            .is_ok_and(|m| m.listeners_draining + m.filter_chains_draining == 0)
    })
    .await;
    let (code, body) = http(listen, "POST", "/drain?wait=true").await;
    assert_eq!(code, 200, "{body}");
    wait_for("envoy stopped its listeners", WAIT, || async {
        admin.listeners_stopped().await.is_ok_and(|n| n > 0)
    })
    .await;
    // The watcher keeps looking during and after the drain: more looks of
    // the shim's (admin requests beyond the test's own) after the stop.
    shims_looks("the shim looked at envoy after the stop").await;
    assert_eq!(metric(listen, &drains("listener")).await, Some(1.0));
    assert_eq!(metric(listen, &drains("filter_chains")).await, Some(1.0));
    assert_eq!(
        drain_events(&lines).len(),
        2,
        "{:#?}",
        lines.lock().map(|l| l.clone())
    );

    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Node mode: the agent watches each pod's Envoy the same way, and the
/// pod's series carry the drain, under the pod's labels; its log names the
/// listener and the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_agent_counts_a_pods_config_push_drains() {
    use crate::support::node::{http_in, Lab, POD_ADMIN_PORT};
    use crate::support::podapp::agent_bin;

    let lab = Lab::new("l");
    let ns = lab.netns("lds");
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    push(dir.path(), &lds(port, "inbound", "inbound_http"));
    let app = SocketAddr::from(([127, 0, 0, 1], 9));
    let boot = bootstrap(dir.path(), app, POD_ADMIN_PORT);
    let _envoy = lab
        .envoy(&ns, "1.40.0", |o| {
            o.drain_time = ENVOY_DRAIN_TIME;
            o.custom_bootstrap = Some(boot);
        })
        .await;
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let agent = agent_bin(&lab, listen, &[]).await;
    let series = |kind: &str| {
        format!(
            "drainshim_envoy_listener_drains_total{{namespace=\"shop\",pod=\"lds\",kind=\"{kind}\"}}"
        )
    };
    let value = |body: &str, name: &str| -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let scrape = || async {
        match http_in(None, listen, "GET", "/metrics").await {
            Ok((200, body)) => body,
            other => panic!("agent /metrics: {other:?}"),
        }
    };
    wait_for("the pod's series, at 0", WAIT, || async {
        value(&scrape().await, &series("listener")) == Some(0.0)
    })
    .await;
    // The agent's first scan, done before it said it was ready, looked at
    // the pod's Envoy: that look is the baseline.
    assert!(agent.log().contains("pod found"), "{}", agent.log());

    push(dir.path(), &lds(port, "inbound_v2", "inbound_http"));
    wait_for(
        "the agent counts the pod's listener drain",
        WAIT,
        || async { value(&scrape().await, &series("listener")) == Some(1.0) },
    )
    .await;
    agent
        .wait_log("envoy drains a listener after a config update")
        .await;
    let line = agent
        .log()
        .lines()
        .find(|l| l.contains("envoy drains a listener after a config update"))
        .unwrap_or_default()
        .to_string();
    for field in [
        "listener=inbound",
        "kind=\"listener\"",
        "pod=shop/lds",
        "drain_time_seconds=3",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert_eq!(value(&scrape().await, &series("filter_chains")), Some(0.0));
}
