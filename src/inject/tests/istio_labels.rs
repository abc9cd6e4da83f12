//! Every combination of the namespace and pod labels drainshim and Istio
//! read (deploy/README.md, "Istio's labels"): the shipped
//! MutatingWebhookConfiguration picks drainshim's webhook (its path) by the
//! namespace's labels, the webhook picks the mode by the pod's, and the
//! Istio mode is taken exactly where Istio's own webhooks and injector
//! (its chart's selectors, `injectRequired`, the mesh's default policy)
//! inject. Where Istio was asked for and will not inject, the pod gets the
//! plain mode, a warning that says why, and a count.

use serde_json::{json, Map, Value};

use super::super::mesh::{Declined, Namespace};
use super::super::*;
use super::{api_server, patched};

const CONFIG: &str =
    include_str!("../../../deploy/webhook/webhooks/mutatingwebhookconfiguration.yaml");

/// A label selector (matchLabels, matchExpressions) on `labels`.
fn selects(selector: &Value, labels: &Map<String, Value>) -> bool {
    let exact = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    exact
        && selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| {
                let value = labels.get(e["key"].as_str().unwrap_or_default());
                let among = e["values"]
                    .as_array()
                    .is_some_and(|vs| value.is_some_and(|v| vs.contains(v)));
                match e["operator"].as_str() {
                    Some("In") => among,
                    Some("NotIn") => !among,
                    Some("Exists") => value.is_some(),
                    Some("DoesNotExist") => value.is_none(),
                    op => panic!("operator {op:?}"),
                }
            })
}

/// The path of the one drainshim webhook that serves the namespace (and
/// sends the pod: its objectSelector), as the API server picks it.
fn path(ns: &Map<String, Value>, pod: &Map<String, Value>) -> Option<String> {
    let config: Value = serde_yaml_ng::from_str(CONFIG).expect("the configuration");
    let paths: Vec<String> = config["webhooks"]
        .as_array()
        .expect("webhooks")
        .iter()
        .filter(|w| selects(&w["namespaceSelector"], ns) && selects(&w["objectSelector"], pod))
        .map(|w| {
            w["clientConfig"]["service"]["path"]
                .as_str()
                .expect("path")
                .to_owned()
        })
        .collect();
    assert!(paths.len() <= 1, "{ns:?}: served by {paths:?}");
    paths.into_iter().next()
}

/// Istio's chart's webhooks for the default revision (and `canary`), with
/// the namespaces not injected by default: is its injector called?
fn istio_called(ns: &Map<String, Value>, pod: &Map<String, Value>) -> bool {
    let get = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_str).map(str::to_owned);
    let (injection, ns_rev) = (get(ns, "istio-injection"), get(ns, "istio.io/rev"));
    let (pod_inject, pod_rev) = (
        get(pod, "sidecar.istio.io/inject"),
        get(pod, "istio.io/rev"),
    );
    let not_false = pod_inject.as_deref() != Some("false");
    let revisions = ["default", "canary"];
    // namespace.sidecar-injector.istio.io
    let by_namespace = injection.as_deref() == Some("enabled") && not_false;
    // rev.namespace.sidecar-injector.istio.io
    let by_ns_rev = injection.is_none()
        && ns_rev.as_deref().is_some_and(|r| revisions.contains(&r))
        && not_false;
    // rev.object.sidecar-injector.istio.io
    let by_pod_rev = injection.is_none()
        && ns_rev.is_none()
        && pod_rev.as_deref().is_some_and(|r| revisions.contains(&r))
        && not_false;
    // object.sidecar-injector.istio.io
    let by_pod = injection.is_none()
        && ns_rev.is_none()
        && pod_rev.is_none()
        && pod_inject.as_deref() == Some("true");
    by_namespace || by_ns_rev || by_pod_rev || by_pod
}

/// Istio's `injectRequired`, mesh policy `enabled`, no selectors: the
/// pod's `sidecar.istio.io/inject`, the label over the annotation.
fn istio_injects(ns: &Map<String, Value>, meta: &Value) -> bool {
    let labels = meta["labels"].as_object().cloned().unwrap_or_default();
    if !istio_called(ns, &labels) {
        return false;
    }
    let key = "sidecar.istio.io/inject";
    let value = meta["labels"][key]
        .as_str()
        .or(meta["annotations"][key].as_str());
    match value.map(str::to_lowercase).as_deref() {
        None | Some("") => true,
        Some(v) => ["y", "yes", "true", "on"].contains(&v),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect()
}

/// The namespaces of the table, by their labels (all opted in to drainshim).
pub fn namespaces() -> Vec<(&'static str, Map<String, Value>)> {
    let optin = [
        ("drainshim.io/inject", "enabled"),
        ("kubernetes.io/metadata.name", "shop"),
    ];
    let with = |extra: &[(&str, &str)]| labels(&[&optin[..], extra].concat());
    vec![
        ("no Istio label", with(&[])),
        (
            "istio-injection=enabled",
            with(&[("istio-injection", "enabled")]),
        ),
        ("istio.io/rev=canary", with(&[("istio.io/rev", "canary")])),
        (
            "istio-injection=enabled, istio.io/rev=canary",
            with(&[("istio-injection", "enabled"), ("istio.io/rev", "canary")]),
        ),
        (
            "istio-injection=disabled",
            with(&[("istio-injection", "disabled")]),
        ),
        (
            "istio-injection=disabled, istio.io/rev=canary",
            with(&[("istio-injection", "disabled"), ("istio.io/rev", "canary")]),
        ),
    ]
}

/// The pods of the table: their labels and annotations.
pub fn pods() -> Vec<(&'static str, Value)> {
    let key = "sidecar.istio.io/inject";
    vec![
        ("nothing of Istio's", json!({})),
        ("label inject=true", json!({"labels": {key: "true"}})),
        ("label inject=false", json!({"labels": {key: "false"}})),
        ("label inject=yes", json!({"labels": {key: "yes"}})),
        (
            "annotation inject=true",
            json!({"annotations": {key: "true"}}),
        ),
        (
            "annotation inject=false",
            json!({"annotations": {key: "false"}}),
        ),
        (
            "label istio.io/rev=canary",
            json!({"labels": {"istio.io/rev": "canary"}}),
        ),
        (
            "label istio.io/rev=canary, label inject=false",
            json!({"labels": {"istio.io/rev": "canary", key: "false"}}),
        ),
    ]
}

/// What drainshim does with one row, and whether Istio injects it.
#[derive(Debug, PartialEq)]
pub enum Want {
    /// The Istio mode (Istio's settings now, drainshim after its injection).
    Istio,
    /// The plain mode, nothing to say.
    Plain,
    /// The plain mode, with a warning and a count.
    Declined(Declined),
}

/// The table of deploy/README.md: (namespace row, pod row) -> what drainshim does.
pub fn want(ns: &str, pod: &str) -> Want {
    use Declined::*;
    let enabled = ns.starts_with("istio-injection=enabled") || ns == "istio.io/rev=canary";
    let disabled = ns.starts_with("istio-injection=disabled");
    let opts_out = pod.contains("inject=false");
    let asks =
        pod.contains("inject=true") || pod.contains("inject=yes") || pod.contains("istio.io/rev");
    match () {
        _ if enabled && opts_out => Want::Declined(pod_opted_out),
        _ if enabled => Want::Istio,
        _ if disabled && asks && !opts_out => Want::Declined(namespace_disabled),
        _ if disabled => Want::Plain,
        _ if pod == "annotation inject=true" => Want::Declined(annotation_only),
        _ if pod == "label inject=yes" => Want::Declined(label_not_true),
        _ if pod.contains("istio.io/rev") && opts_out => Want::Declined(pod_opted_out),
        _ if pod == "label inject=true" || pod == "label istio.io/rev=canary" => Want::Istio,
        _ => Want::Plain,
    }
}

fn pod(meta: &Value) -> Value {
    let mut m =
        json!({"generateName": "orders-", "namespace": "shop", "labels": {"app": "orders"}});
    for field in ["labels", "annotations"] {
        for (k, v) in meta[field].as_object().into_iter().flatten() {
            m[field][k] = v.clone();
        }
    }
    json!({
        "metadata": m,
        "spec": {"containers": [{"name": "server", "image": "orders:1",
                                 "ports": [{"name": "grpc", "containerPort": 7070}]}]},
    })
}

fn review(hook: &webhook::Webhook, pod: &Value, ns: Namespace) -> Value {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {}, "object": pod, "dryRun": false,
        },
    });
    hook.review(review.to_string().as_bytes(), ns).0["response"].clone()
}

fn namespace_of(path: &str) -> Namespace {
    match path {
        webhook::PATH => Namespace::Unlabelled,
        webhook::PATH_ISTIO => Namespace::Injected,
        webhook::PATH_NO_ISTIO => Namespace::Disabled,
        p => panic!("path {p}"),
    }
}

#[test]
fn every_label_combination_takes_the_istio_mode_exactly_where_istio_injects() {
    let mut failures = Vec::new();
    let mut rows = 0;
    for (ns_name, ns) in namespaces() {
        for (pod_name, meta) in pods() {
            rows += 1;
            let pod = pod(&meta);
            let pod_labels = pod["metadata"]["labels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let Some(path) = path(&ns, &pod_labels) else {
                failures.push(format!(
                    "{ns_name} / {pod_name}: no drainshim webhook serves it"
                ));
                continue;
            };
            let want = want(ns_name, pod_name);
            let injects = istio_injects(&ns, &pod["metadata"]);
            if injects != (want == Want::Istio) {
                failures.push(format!(
                    "{ns_name} / {pod_name}: the table says {want:?}, Istio {} inject",
                    if injects { "does" } else { "does not" }
                ));
            }
            let hook = webhook::Webhook::new(InjectOptions::default(), "default".into());
            let response = review(&hook, &pod, namespace_of(&path));
            let got = patched(&pod, &response);
            let warnings = response["warnings"].as_array().cloned().unwrap_or_default();
            let containers: Vec<&str> = got["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            let annotations = &got["metadata"]["annotations"];
            let istio_settings = annotations["traffic.sidecar.istio.io/excludeInboundPorts"]
                .as_str()
                .is_some_and(|p| p.contains("15099"));
            let metrics = hook.metrics.render();
            let counted = |reason: &str| {
                metrics.contains(&format!(
                    "drainshim_webhook_istio_declined_total{{revision=\"default\",reason=\"{reason}\"}} 1"
                ))
            };
            let ok = match &want {
                Want::Istio => {
                    istio_settings
                        && containers == ["server"]
                        && warnings.is_empty()
                        && got["metadata"]["labels"]["sidecar.istio.io/inject"]
                            == pod["metadata"]["labels"]["sidecar.istio.io/inject"]
                }
                Want::Plain => {
                    containers == ["server", "envoy", "drainshim"]
                        && warnings.is_empty()
                        && !istio_settings
                }
                Want::Declined(reason) => {
                    containers == ["server", "envoy", "drainshim"]
                        && !istio_settings
                        && warnings.len() == 1
                        && warnings[0]
                            .as_str()
                            .is_some_and(|w| w.contains("not the Istio mode"))
                        && counted(&format!("{reason:?}"))
                }
            };
            if !ok {
                failures.push(format!(
                    "{ns_name} / {pod_name} (path {path}): want {want:?}, got containers {containers:?}, \
                     Istio's settings {istio_settings}, warnings {warnings:?}"
                ));
            }
            assert!(api_server::refusals(&got).is_empty(), "{got:#}");
        }
    }
    assert_eq!(rows, 48);
    assert!(
        failures.is_empty(),
        "{} of {rows} rows:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_pod_istio_does_not_inject_after_all_is_left_whole() {
    // The mesh's policy `disabled` or a neverInjectSelector: Istio's injector
    // is called and leaves the pod as it is, so the API server does not call
    // drainshim again. What drainshim's one call made must run as it is: no
    // proxy customization for an injector that never merges it, and no
    // label that would override the mesh admin.
    let original = pod(&json!({}));
    let hook = webhook::Webhook::new(InjectOptions::default(), "default".into());
    let response = review(&hook, &original, Namespace::Injected);
    assert!(response["warnings"].is_null(), "{response}");
    let got = patched(&original, &response);
    assert!(api_server::refusals(&got).is_empty());
    assert_eq!(got["spec"], original["spec"], "{got:#}");
    assert_eq!(got["metadata"]["labels"], original["metadata"]["labels"]);
    assert!(hook.metrics.render().contains(
        "drainshim_webhook_reviews_total{revision=\"default\",outcome=\"awaiting_istio\"} 1"
    ));
    // Called again before Istio (another webhook changed the pod): the same.
    let again = review(&hook, &got, Namespace::Injected);
    assert!(again["patch"].is_null(), "{again}");
    // And uninjected: the pod as it came.
    let (patch, _) = manifest::pod_patch(
        &got,
        &InjectOptions::default(),
        manifest::Direction::Uninject,
    )
    .expect("uninjected");
    let mut back = got.clone();
    json_patch::patch(&mut back, &patch).expect("applies");
    assert_eq!(back, original);
}
