//! The metric names are part of the contract (docs/design.md, "### Metrics"):
//! what the sidecar registers and what the document lists must be the same
//! set. Dashboards, alerts and `verify` rely on the document.

use std::collections::BTreeSet;

use drainshim::metrics::{self, Metrics, SidecarMetrics};
use prometheus_client::registry::Registry;

/// `drainshim_*` names in the first column of the design's metrics table,
/// without their labels; `(node only)` rows are the node agent's own.
fn contract() -> (BTreeSet<String>, BTreeSet<String>) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md");
    let text = std::fs::read_to_string(path).expect("docs/design.md");
    let section = text
        .split("\n### Metrics")
        .nth(1)
        .expect("a '### Metrics' section in docs/design.md");
    let section = section.split("\n## ").next().unwrap_or(section);
    let (mut all, mut node_only) = (BTreeSet::new(), BTreeSet::new());
    for line in section.lines().filter(|l| l.starts_with("| `drainshim_")) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        let name: String = cell
            .trim()
            .trim_start_matches('`')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if line.contains("(node only)") {
            node_only.insert(name.clone());
        }
        all.insert(name);
    }
    assert!(
        all.len() > 10,
        "too few metrics parsed from {path}: {all:?}"
    );
    (all, node_only)
}

/// Names as a scrape shows them: counters with `_total`.
fn registered() -> BTreeSet<String> {
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry);
    let _s = SidecarMetrics::register(&mut registry);
    // Families show in a scrape once they hold a series: one each.
    m.set_proxy(metrics::ProxyLabels::default());
    let _ = m
        .envoy
        .config_updates
        .get_or_create(&metrics::ConfigLabels {
            resource: "lds".into(),
            result: "success".into(),
            version: "1.40.0".into(),
        });
    let _ = m
        .envoy
        .upstream_retries
        .get_or_create(&metrics::VersionLabels {
            version: "1.40.0".into(),
        });
    m.guard_limited(metrics::Limit::streams);
    m.guard_app_goaway(0);
    let key = metrics::ServiceKey {
        service: "shop.Cart".into(),
        method: None,
    };
    let protocol = metrics::STREAM_PROTOCOLS[0];
    let _ = m
        .signals
        .requests
        .get_or_create(&metrics::GuardRequestLabels {
            key: key.clone(),
            code: metrics::CODES[0],
            protocol,
        });
    let _ = m.signals.request_duration.get_or_create(&key);
    let _ = m
        .signals
        .streams_opened
        .get_or_create(&metrics::GuardStreamLabels { key, protocol });
    let _ = m
        .signals
        .stream_lifetime
        .get_or_create(&metrics::ProtocolLabels { protocol });
    let _ = m
        .envoy
        .downstream_requests
        .get_or_create(&metrics::VersionLabels {
            version: "1.40.0".into(),
        });
    let _ = m.envoy.tcp_resets.get_or_create(&metrics::KindLabels {
        kind: "EstabResets".into(),
    });
    let _ = m.guard_max_connection_age.get_or_create(&Vec::new());
    let _ = m.guard_request_metrics.get_or_create(&Vec::new());
    m.set_drain_timers(&Default::default(), None);
    // The admission webhook's own registry, a series of each family made.
    let hook = drainshim::inject::webhook::Webhook::new(Default::default(), "default".into());
    let _ = hook.review(b"{}", drainshim::inject::mesh::Namespace::Unlabelled);
    let text = metrics::render(&registry) + &hook.metrics.render();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let mut parts = l.split(' ');
            let (name, kind) = (parts.next().unwrap_or_default(), parts.next());
            match kind {
                Some("counter") => format!("{name}_total"),
                _ => name.to_string(),
            }
        })
        .collect()
}

#[test]
fn registered_metrics_are_the_contract() {
    let (contract, node_only) = contract();
    let registered = registered();
    let undocumented: Vec<_> = registered.difference(&contract).collect();
    assert!(
        undocumented.is_empty(),
        "registered but missing from docs/design.md's metrics table: {undocumented:?}"
    );
    let missing: Vec<_> = contract
        .difference(&registered)
        .filter(|n| !node_only.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "in docs/design.md's metrics table but not registered: {missing:?}"
    );
}
