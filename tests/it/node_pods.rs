//! Node mode against real Envoys in real network namespaces ("pods"), with
//! the agent on the host: discovery and inventory, a kubelet-order drain of
//! one pod that leaves the other alone, refused drains, and pods that come
//! and go without leaving tasks or namespace handles behind.
//!
//! Needs root; fails (never skips) without it or without the cached Envoys.

use crate::support;
use crate::support::node as node_support;

use std::net::SocketAddr;
use std::time::Duration;

use drainshim::drain::{Outcome, Report, Trigger};
use node_support::*;
use support::wait_for;

/// What the kubelet waits between SIGTERM and SIGKILL in these tests.
const GRACE: Duration = Duration::from_secs(10);

fn pod_addr(ip: std::net::Ipv4Addr) -> SocketAddr {
    SocketAddr::from((ip, POD_LISTEN_PORT))
}

async fn wait_metrics(agent: SocketAddr, what: &str, pred: impl Fn(&str) -> bool) -> String {
    crate::support::wait_for_ok(what, NODE_WAIT, || async {
        let last = match http_in(None, agent, "GET", "/metrics").await {
            Ok((200, body)) => body,
            Ok((code, body)) => format!("status {code}: {body}"),
            Err(e) => e,
        };
        if pred(&last) {
            Ok(last)
        } else {
            Err(format!("/metrics:\n{last}"))
        }
    })
    .await
}

/// Envoy `version` in `ns`, as pod batch/job-1.
async fn job_1_envoy(lab: &Lab, ns: &Ns, version: &str) -> PodEnvoy {
    lab.envoy(ns, version, |o| {
        o.metadata.insert("NAMESPACE".into(), "batch".into());
        o.metadata.insert("NAME".into(), "job-1".into());
    })
    .await
}

/// Waits until the agent at `api` exports batch/job-1 on `version`.
async fn wait_job_1_on(api: SocketAddr, what: &str, version: &str) {
    let info =
        format!(r#"drainshim_proxy_info{{namespace="batch",pod="job-1",version="{version}""#);
    wait_metrics(api, what, |m| m.contains(&info)).await;
}

async fn wait_listening(agent: SocketAddr, pods: &[&str]) {
    wait_for("every pod has its preStop listener", NODE_WAIT, || async {
        let status = agent_pods(agent).await;
        pods.iter().all(|p| {
            status
                .get(*p)
                .is_some_and(|s| s["listener"].get("listening").is_some())
        })
    })
    .await;
}

/// Two pods on 1.39.3 and 1.40.0. The kubelet drains web-a (preStop
/// httpGet to the pod IP, then SIGTERM, SIGKILL after the grace period);
/// web-b is untouched: its Envoy stays LIVE and no drain runs there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_drains_one_pod_and_leaves_the_other_alone() {
    let lab = Lab::new("k");
    let a_ns = lab.netns("a");
    let (_a_host, a_ip) = lab.link_host(&a_ns);
    let b_ns = lab.netns("b");
    let (_b_host, b_ip) = lab.link_host(&b_ns);
    let mut a = lab
        .envoy(&a_ns, "1.39.3", |o| {
            o.metadata.insert("NAMESPACE".into(), "shop".into());
            o.metadata.insert("NAME".into(), "web-a".into());
            o.metadata.insert("ISTIO_VERSION".into(), "1.24.1".into());
        })
        .await;
    // web-b is known only by its Istio node id: identity order step 3.
    let b = lab
        .envoy(&b_ns, "1.40.0", |o| {
            o.node_id = format!("sidecar~{b_ip}~web-b.shop~shop.svc.cluster.local");
        })
        .await;

    let agent = start_agent(&lab, "127.0.0.1:0", |_| {}).await;
    let api = agent.local_addr();
    let a_line = r#"drainshim_proxy_info{namespace="shop",pod="web-a",version="1.39.3",mesh_version="1.24.1"} 1"#;
    let b_line =
        r#"drainshim_proxy_info{namespace="shop",pod="web-b",version="1.40.0",mesh_version=""} 1"#;
    let m = wait_metrics(api, "both pods in the inventory", |m| {
        m.contains(a_line) && m.contains(b_line)
    })
    .await;
    assert!(
        m.contains(r#"drainshim_draining{namespace="shop",pod="web-b"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(
            r#"drainshim_tcp_resets_total{namespace="shop",pod="web-a",kind="EstabResets"}"#
        ),
        "kernel counters of the pod's netns: {m}"
    );
    wait_listening(api, &["web-a", "web-b"]).await;
    // The fleet tools read a node agent like a sidecar: one row per pod.
    let mut rows = drainshim::fleet::proxies(&drainshim::fleet::Source::Targets(vec![format!(
        "http://{api}"
    )]))
    .await
    .expect("inventory from the agent");
    rows.sort_by(|x, y| x.pod.cmp(&y.pod));
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|p| (p.pod.as_str(), p.version.as_str(), p.state.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![("web-a", "1.39.3", "LIVE"), ("web-b", "1.40.0", "LIVE")]
    );

    // The kubelet: preStop httpGet from the host to the pod IP.
    let (code, body) = http_in(None, pod_addr(a_ip), "GET", "/drain?wait=true")
        .await
        .expect("preStop reaches the pod listener");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("a drain report");
    assert_eq!(report.trigger, Trigger::Prestop);
    assert_eq!(report.outcome, Outcome::Quiesced, "{body}");
    assert_eq!(report.envoy.version, "1.39.3");
    assert!(report.envoy.reachable);
    assert_eq!(report.streams.cut, 0);
    // The drain really went to web-a's Envoy, inside its namespace.
    assert!(
        !a.admin.ready().await.expect("web-a admin"),
        "web-a health check still passing"
    );
    // Then SIGTERM, and SIGKILL after the grace period.
    a.sigterm();
    if a.wait_exit(GRACE).await.is_none() {
        a.kill().await;
    }

    // web-b: untouched.
    assert!(
        b.admin.ready().await.expect("web-b admin"),
        "web-b is not ready"
    );
    assert_eq!(b.admin.server_info().await.expect("web-b").state, "LIVE");
    let pods = agent_pods(api).await;
    assert_eq!(pods["web-b"]["drain"]["phase"], "serving", "{pods:?}");
    let m = agent_metrics(api).await;
    for outcome in ["quiesced", "deadline", "envoy_unreachable"] {
        assert!(
            m.contains(&format!(
                r#"drainshim_drains_total{{namespace="shop",pod="web-b",outcome="{outcome}"}} 0"#
            )),
            "{m}"
        );
    }

    // web-a's Envoy is gone: the pod leaves the inventory, its listener
    // closes, and its drain counters stay for the retention period.
    let m = wait_metrics(api, "web-a leaves the inventory", |m| {
        !m.contains(r#"drainshim_proxy_info{namespace="shop",pod="web-a""#)
    })
    .await;
    assert!(m.contains(b_line), "{m}");
    assert!(
        m.contains(r#"drainshim_drains_total{namespace="shop",pod="web-a",outcome="quiesced"} 1"#),
        "the last drain must still be scrapeable: {m}"
    );
    let refused = http_in(None, pod_addr(a_ip), "GET", "/healthz").await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("refused")),
        "web-a's listener is still open: {refused:?}"
    );
    drop(a);
    wait_for(
        "the agent releases web-a's namespace",
        NODE_WAIT,
        || async { !holds_netns(a_ns.inode) },
    )
    .await;
    lab.remove_netns(&a_ns);
    assert!(b.admin.ready().await.expect("web-b admin"));

    // The agent's own API drains from loopback, by namespace/pod.
    let (code, body) = http_in(None, api, "GET", "/pods/shop/web-b/drain?wait=true")
        .await
        .expect("agent API");
    assert_eq!(code, 200, "{body}");
    let report: Report = serde_json::from_str(&body).expect("a drain report");
    assert_eq!(
        (report.trigger, report.envoy.version.as_str()),
        (Trigger::Api, "1.40.0")
    );
    assert!(!b.admin.ready().await.expect("web-b admin"));
    agent.stop().await;
}

/// A drain from an address that is not the node's (a third namespace wired
/// straight into the pod) is refused, and so is one from another pod; the
/// pod listener serves nothing but /drain?wait=true and /healthz, and the
/// agent's own drain API refuses callers that are not loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_addresses_and_other_pods_cannot_drain() {
    let lab = Lab::new("f");
    let a_ns = lab.netns("a");
    let (a_host, a_ip) = lab.link_host(&a_ns);
    let b_ns = lab.netns("b");
    let _ = lab.link_host(&b_ns);
    let x_ns = lab.netns("x");
    let (x_ip, a_ip_from_x) = lab.link_pair(&x_ns, &a_ns);
    let (b_ip_to_a, a_ip_from_b) = lab.link_pair(&b_ns, &a_ns);
    let a = lab
        .envoy(&a_ns, "1.40.0", |o| {
            o.metadata.insert("NAMESPACE".into(), "shop".into());
            o.metadata.insert("NAME".into(), "web-a".into());
        })
        .await;
    let b = lab
        .envoy(&b_ns, "1.39.3", |o| {
            o.metadata.insert("NAMESPACE".into(), "shop".into());
            o.metadata.insert("NAME".into(), "web-b".into());
        })
        .await;
    // The agent API on the host side of web-a's veth, so web-a can try it.
    let agent = start_agent(&lab, &format!("{a_host}:0"), |_| {}).await;
    let api = agent.local_addr();
    wait_listening(api, &["web-a", "web-b"]).await;

    let x = x_ns.handle();
    let (code, body) = http_in(Some(&x), pod_addr(a_ip_from_x), "GET", "/drain?wait=true")
        .await
        .expect("the foreign namespace reaches web-a");
    assert_eq!(code, 403, "drain from {x_ip}: {body}");
    assert!(body.contains(&x_ip.to_string()), "{body}");

    let b_handle = b_ns.handle();
    let (code, body) = http_in(
        Some(&b_handle),
        pod_addr(a_ip_from_b),
        "GET",
        "/drain?wait=true",
    )
    .await
    .expect("web-b reaches web-a");
    assert_eq!(code, 403, "drain of web-a from web-b ({b_ip_to_a}): {body}");

    // Nothing else is exposed on the pod network.
    for (method, path) in [
        ("GET", "/metrics"),
        ("GET", "/status"),
        ("POST", "/drain"),
        ("POST", "/drain?wait=true"),
        ("GET", "/drain"),
        ("GET", "/readyz"),
        ("GET", "/pods/shop/web-b/drain?wait=true"),
    ] {
        let (code, body) = http_in(None, pod_addr(a_ip), method, path)
            .await
            .expect("host reaches web-a");
        assert_eq!(code, 404, "{method} {path}: {body}");
    }
    let (code, _) = http_in(None, pod_addr(a_ip), "GET", "/healthz")
        .await
        .expect("healthz");
    assert_eq!(code, 200);

    // A pod cannot use the agent's API to drain anything either.
    let a_handle = a_ns.handle();
    let (code, body) = http_in(Some(&a_handle), api, "POST", "/pods/shop/web-b/drain")
        .await
        .expect("web-a reaches the agent over its veth");
    assert_eq!(code, 403, "{body}");

    // Nobody drained.
    let pods = agent_pods(api).await;
    for p in ["web-a", "web-b"] {
        assert_eq!(pods[p]["drain"]["phase"], "serving", "{p}: {pods:?}");
    }
    assert!(a.admin.ready().await.expect("web-a admin"));
    assert!(b.admin.ready().await.expect("web-b admin"));
    agent.stop().await;
}

/// Pods that appear after the agent started are found; a pod whose Envoy
/// dies is retired (no task, no namespace handle left) and, after the
/// retention, disappears from /metrics entirely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_come_and_go_without_leaks() {
    let lab = Lab::new("c");
    let agent = start_agent(&lab, "127.0.0.1:0", |s| {
        s.retention = Duration::from_secs(1)
    })
    .await;
    let api = agent.local_addr();
    assert!(agent_pods(api).await.is_empty());
    assert_eq!(agent.pod_tasks(), 0);

    let ns = lab.netns("p");
    let (_, ip) = lab.link_host(&ns);
    let mut e = job_1_envoy(&lab, &ns, "1.40.0").await;
    wait_job_1_on(api, "job-1 appears", "1.40.0").await;
    wait_listening(api, &["job-1"]).await;
    assert!(agent.pod_tasks() > 0);
    let (code, _) = http_in(None, pod_addr(ip), "GET", "/healthz")
        .await
        .expect("listener");
    assert_eq!(code, 200);

    e.kill().await;
    drop(e);
    wait_for("job-1 is retired", NODE_WAIT, || async {
        agent_pods(api).await.is_empty()
    })
    .await;
    wait_for("no pod task is left", NODE_WAIT, || async {
        agent.pod_tasks() == 0
    })
    .await;
    wait_for("the namespace handle is released", NODE_WAIT, || async {
        !holds_netns(ns.inode)
    })
    .await;
    wait_metrics(api, "job-1's series expire after the retention", |m| {
        !m.contains(r#"pod="job-1""#)
    })
    .await;
    let refused = http_in(None, pod_addr(ip), "GET", "/healthz").await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("refused")),
        "listener still open: {refused:?}"
    );

    // A new Envoy in the same namespace (a container restart) is a pod again.
    let _e2 = job_1_envoy(&lab, &ns, "1.39.3").await;
    wait_job_1_on(api, "job-1 is back on 1.39.3", "1.39.3").await;

    // A second namespace claiming the same pod never exports one label set
    // twice: it is told apart by its namespace inode.
    let twin = lab.netns("t");
    let _e3 = job_1_envoy(&lab, &twin, "1.40.0").await;
    let twin_pod = format!("job-1@netns-{}", twin.inode);
    let m = wait_metrics(api, "both claimants are listed apart", |m| {
        m.contains(&format!(
            r#"drainshim_proxy_info{{namespace="batch",pod="{twin_pod}",version="1.40.0""#
        ))
    })
    .await;
    assert_eq!(
        m.matches(r#"drainshim_draining{namespace="batch",pod="job-1"}"#)
            .count(),
        1,
        "{m}"
    );
    agent.stop().await;
}

/// `verify --prometheus` on a node agent: one scrape target carries every
/// pod's series, so wave membership comes from each series' own
/// `namespace`/`pod` labels, not from the target. A real Prometheus scrapes
/// the agent; two namespaces share it; each wave is judged on its own pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_judges_each_namespace_of_a_node_agent_by_its_pods() {
    let lab = Lab::new("v");
    let mut envoys = Vec::new();
    for (tag, ns, pod, version) in [
        ("a", "shop", "web-a", "1.40.0"),
        ("b", "shop", "web-b", "1.39.3"),
        ("c", "pay", "api-c", "1.40.0"),
    ] {
        let netns = lab.netns(tag);
        envoys.push(
            lab.envoy(&netns, version, |o| {
                o.metadata.insert("NAMESPACE".into(), ns.into());
                o.metadata.insert("NAME".into(), pod.into());
            })
            .await,
        );
    }
    let agent = start_agent(&lab, "127.0.0.1:0", |_| {}).await;
    let api = agent.local_addr();
    wait_metrics(api, "every pod in the inventory", |m| {
        ["web-a", "web-b", "api-c"]
            .iter()
            .all(|p| m.contains(&format!(r#"pod="{p}",version="#)))
    })
    .await;

    let prom = support::prometheus(&[api]).await;
    let client = drainshim::fleet::prometheus::PromClient::new(&prom.url(), Duration::from_secs(5))
        .expect("client");
    let query = "count(drainshim_proxy_info == 1)";
    let what = "prometheus has scraped the agent";
    support::prom::wait_for_scalar(&client, what, NODE_WAIT, query, |n| n == 3.0).await;
    let url = prom.url();
    let verify = |ns: &'static str| {
        let url = url.clone();
        async move {
            support::run_bin(&[
                "verify",
                "--prometheus",
                &url,
                "--namespace",
                ns,
                "--expect-version",
                "1.40.0",
                "--window",
                "1m",
            ])
            .await
        }
    };
    // The pay wave is done: its one pod runs 1.40.0, whatever shop runs.
    let (code, out, err) = verify("pay").await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 of 1 proxies on 1.40.0"), "{out}");
    // The shop wave is not: web-b is named, api-c of the same target is not counted.
    let (code, out, err) = verify("shop").await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("1 of 2 not on 1.40.0"), "{out}");
    assert!(out.contains("shop/web-b on 1.39.3"), "{out}");
    prom.stop().await;
}
