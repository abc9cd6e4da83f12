//! Fleet visibility against real Envoys: inventory, skew, proxy_info, config
//! acceptance per version.

use crate::support;

use std::collections::BTreeMap;

use drainshim_bench::envoy::EnvoyProcess;
use support::*;

fn istio_node(
    opts: &mut drainshim_bench::envoy::EnvoyOptions,
    ns: &str,
    pod: &str,
    metadata: bool,
) {
    opts.node_id = format!("sidecar~10.0.0.1~{pod}.{ns}~{ns}.svc.cluster.local");
    if metadata {
        opts.metadata = BTreeMap::from([
            ("NAMESPACE".to_string(), ns.to_string()),
            ("NAME".to_string(), pod.to_string()),
            ("ISTIO_VERSION".to_string(), "1.24.2".to_string()),
        ]);
    }
}

fn admin_args(cmd: &[&str], envoys: &[&EnvoyProcess]) -> Vec<String> {
    let mut v: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    for e in envoys {
        v.push("--envoy-admin".into());
        v.push(e.admin_url());
    }
    v
}

/// Three real Envoys, 1.38.3, 1.39.3 and 1.40.0, with Istio-style identity.
#[tokio::test]
async fn inventory_and_skew_across_three_envoy_versions() {
    let backend = backend().await;
    // Identity from metadata, from the node id alone, and from both.
    let old = envoy_with("1.38.3", backend.addr, |o| {
        istio_node(o, "shop", "web-0", true)
    })
    .await;
    let mid = envoy_with("1.39.3", backend.addr, |o| {
        istio_node(o, "shop", "web-1", false)
    })
    .await;
    let new = envoy_with("1.40.0", backend.addr, |o| {
        istio_node(o, "pay", "api-0", true)
    })
    .await;

    let (code, out, err) = run_bin(&admin_args(
        &["inventory", "--format", "json"],
        &[&old, &mid, &new],
    ))
    .await;
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("inventory JSON");
    let seen: Vec<(String, String, String, String, String)> = rows
        .iter()
        .map(|r| {
            let f = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (
                f("namespace"),
                f("pod"),
                f("version"),
                f("mesh_version"),
                f("state"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                "pay".into(),
                "api-0".into(),
                "1.40.0".into(),
                "1.24.2".into(),
                "LIVE".into()
            ),
            (
                "shop".into(),
                "web-0".into(),
                "1.38.3".into(),
                "1.24.2".into(),
                "LIVE".into()
            ),
            (
                "shop".into(),
                "web-1".into(),
                "1.39.3".into(),
                "".into(),
                "LIVE".into()
            ),
        ]
    );
    let (code, table, _) = run_bin(&admin_args(&["inventory"], &[&old, &mid, &new])).await;
    assert_eq!(code, Some(0));
    assert!(table.contains("Version spread:"), "{table}");
    assert!(table.contains("shop       1.38.3   1"), "{table}");

    let (code, out, err) = run_bin(&admin_args(
        &["skew", "--control-plane", "1.40"],
        &[&old, &mid, &new],
    ))
    .await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("web-0") && out.contains("1.38.3"), "{out}");
    assert!(
        !out.contains("web-1"),
        "1.39 is within one minor version: {out}"
    );
    assert!(
        out.contains("NOT safe") && out.contains("Point of no return"),
        "{out}"
    );

    let (code, out, err) = run_bin(&admin_args(
        &["skew", "--control-plane", "1.40"],
        &[&mid, &new],
    ))
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("is safe"), "{out}");

    // An unreachable proxy is never silently dropped.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone_url = format!("http://{}", gone.local_addr().expect("addr"));
    drop(gone);
    let mut args = admin_args(&["skew", "--control-plane", "1.40"], &[&new]);
    args.extend(["--envoy-admin".to_string(), gone_url]);
    let (code, out, _) = run_bin(&args).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("admin unreachable"), "{out}");
}

/// The shim beside a 1.38.3 Envoy publishes it in the inventory, plus the
/// kernel's reset counters of its network namespace.
#[tokio::test]
async fn shim_beside_envoy_1_38_serves_proxy_info() {
    let backend = backend().await;
    let envoy = envoy_with("1.38.3", backend.addr, |o| {
        istio_node(o, "shop", "web-0", true)
    })
    .await;
    let (shim, _drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    let (code, metrics) = http(shim, "GET", "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains(r#"drainshim_proxy_info{namespace="shop",pod="web-0",version="1.38.3",mesh_version="1.24.2"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"drainshim_tcp_resets_total{kind="EstabResets"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"drainshim_envoy_upstream_retries_total{version="1.38.3"} 0"#),
        "{metrics}"
    );
    // Flags win over what Envoy says.
    let (shim2, _d, _s, _t) = start_sidecar(&envoy.admin_url(), |s| {
        s.pod_name = Some("p".into());
        s.pod_namespace = Some("n".into());
    })
    .await;
    let (_, metrics) = http(shim2, "GET", "/metrics").await;
    assert!(
        metrics.contains(r#"drainshim_proxy_info{namespace="n",pod="p",version="1.38.3""#),
        "{metrics}"
    );
}

/// Envoy restarted under the shim on a new version: the inventory follows,
/// and the old version's entry is gone.
#[tokio::test]
async fn proxy_info_follows_an_envoy_restart_onto_a_new_version() {
    let backend = backend().await;
    let port = free_port();
    let mut old = envoy_with("1.38.3", backend.addr, |o| o.admin_port = port).await;
    let (shim, _drain, _sig, _task) = start_sidecar(&old.admin_url(), short_timers).await;
    let (_, metrics) = http(shim, "GET", "/metrics").await;
    assert!(metrics.contains(r#"version="1.38.3""#), "{metrics}");
    old.kill().await;
    let _new = envoy_with("1.40.0", backend.addr, |o| o.admin_port = port).await;
    wait_for("the inventory shows 1.40.0", WAIT, || async {
        let (_, m) = http(shim, "GET", "/metrics").await;
        m.contains(
            r#"drainshim_proxy_info{namespace="",pod="",version="1.40.0",mesh_version=""} 1"#,
        )
    })
    .await;
    let (_, metrics) = http(shim, "GET", "/metrics").await;
    assert!(
        !metrics.contains(r#"drainshim_proxy_info{namespace="",pod="",version="1.38.3""#),
        "{metrics}"
    );
}

/// A rejected xDS update on real Envoy (file-based LDS, port 99999) is
/// counted as rejected, on that Envoy's version.
#[tokio::test]
async fn rejected_xds_update_is_counted_per_version() {
    let backend = backend().await;
    let xds = tempfile::tempdir().expect("tempdir");
    std::fs::write(xds.path().join("lds.yaml"), "resources: []\n").expect("lds");
    std::fs::write(xds.path().join("cds.yaml"), "resources: []\n").expect("cds");
    let envoy = envoy_with("1.40.0", backend.addr, |o| {
        o.xds_dir = Some(xds.path().to_path_buf())
    })
    .await;
    let (shim, _drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    let rejected = r#"drainshim_envoy_config_updates_total{resource="lds",result="rejected",version="1.40.0"}"#;
    let (_, metrics) = http(shim, "GET", "/metrics").await;
    assert!(metrics.contains(&format!("{rejected} 0")), "{metrics}");
    assert!(
        metrics.contains(r#"drainshim_envoy_config_updates_total{resource="lds",result="success",version="1.40.0"} 1"#),
        "{metrics}"
    );

    // Envoy watches for a file moved into place.
    let bad = "resources:\n- \"@type\": type.googleapis.com/envoy.config.listener.v3.Listener\n  name: bad\n  address: { socket_address: { address: 127.0.0.1, port_value: 99999 } }\n";
    std::fs::write(xds.path().join("lds.tmp"), bad).expect("write");
    std::fs::rename(xds.path().join("lds.tmp"), xds.path().join("lds.yaml")).expect("rename");
    wait_for("the rejection is counted", WAIT, || async {
        let (_, m) = http(shim, "GET", "/metrics").await;
        m.contains(&format!("{rejected} 1"))
    })
    .await;
}

/// An admin API that does not answer: the inventory still lists every
/// proxy, the unreachable one as UNREACHABLE, then exits 69 naming it.
#[tokio::test]
async fn inventory_with_an_unreachable_admin_lists_it_and_exits_69() {
    let backend = backend().await;
    let envoy = envoy_with("1.40.0", backend.addr, |o| {
        istio_node(o, "shop", "web-0", true)
    })
    .await;
    let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let gone_url = format!("http://{}", gone.local_addr().expect("addr"));
    drop(gone);
    let mut table = admin_args(&["inventory"], &[&envoy]);
    table.extend(["--envoy-admin".to_string(), gone_url.clone()]);
    let (code, out, err) = run_bin(&table).await;
    assert_eq!(code, Some(69), "{out}{err}");
    assert!(
        out.contains("web-0") && out.contains("UNREACHABLE"),
        "{out}"
    );
    assert!(
        err.contains("1 of 2 admin APIs could not be read") && err.contains(&gone_url),
        "{err}"
    );
    let mut json = admin_args(&["inventory", "--format", "json"], &[&envoy]);
    json.extend(["--envoy-admin".to_string(), gone_url.clone()]);
    let (code, out, err) = run_bin(&json).await;
    assert_eq!(code, Some(69), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).expect("inventory JSON");
    assert!(
        rows.iter()
            .any(|r| r["source"] == gone_url.as_str() && r["state"] == "UNREACHABLE"),
        "{out}"
    );
    // Every admin answering: 0, as before.
    let (code, _, err) = run_bin(&admin_args(&["inventory"], &[&envoy])).await;
    assert_eq!(code, Some(0), "{err}");
}
