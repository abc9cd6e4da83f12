//! The checks of drainshim's own objects: the webhook's TLS (`webhook-ca`),
//! which revision serves each opted-in namespace, directly or through a tag
//! (`revision`), Services that would drop pods without drainshim
//! (`service-port`), pods without it (`not-injected`), and which drainshim
//! each namespace's pods run (`versions`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{string_map, Finding, Object};
use crate::inject::{
    self, DEFAULT_REVISION, ENABLED, INJECT, INJECTED, NEVER_SERVED, OPTED_OUT, REV, REVISION,
    VERSION,
};

/// cert-manager's cainjector annotation: the Certificate (namespace/name)
/// whose CA it copies into every webhook's caBundle.
pub const CA_FROM: &str = "cert-manager.io/inject-ca-from";
/// The suffix of every drainshim webhook's name (inject.drainshim.io,
/// canary.istio.inject.drainshim.io, ...).
pub const WEBHOOK_SUFFIX: &str = ".drainshim.io";
/// The name of every revision tag's MutatingWebhookConfiguration begins so
/// (deploy/webhook/tags: drainshim-tag-stable, ...).
pub const TAG_PREFIX: &str = "drainshim-tag-";

/// The export, indexed for the checks.
pub struct Export<'a> {
    pub objects: &'a [Object],
    /// Opted-in namespaces, by name: the revision that must serve each.
    pub opted_in: BTreeMap<&'a str, String>,
    /// Whether any Namespace was exported at all.
    pub has_namespaces: bool,
}

impl<'a> Export<'a> {
    pub fn new(objects: &'a [Object]) -> Self {
        let mut opted_in = BTreeMap::new();
        let mut has_namespaces = false;
        for ns in objects.iter().filter(|o| o.kind == "Namespace") {
            has_namespaces = true;
            if let Some(rev) = revision_of(&ns.labels(), &ns.name) {
                opted_in.insert(ns.name.as_str(), rev);
            }
        }
        Export {
            objects,
            opted_in,
            has_namespaces,
        }
    }

    pub fn of_kind(&self, kind: &'a str) -> impl Iterator<Item = &'a Object> + 'a {
        self.objects.iter().filter(move |o| o.kind == kind)
    }

    pub fn find(&self, kind: &str, namespace: &str, name: &str) -> Option<&'a Object> {
        self.objects
            .iter()
            .find(|o| o.kind == kind && o.namespace == namespace && o.name == name)
    }

    /// The namespace's labels, when it was exported.
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        self.find("Namespace", "", name)
            .map(Object::labels)
            .unwrap_or_default()
    }
}

/// The revision (or tag) that serves a namespace with these labels, as the
/// shipped namespaceSelectors decide: none when `drainshim.io/inject` opts it
/// out (`disabled`, `false`), whatever `drainshim.io/rev` says; else
/// `drainshim.io/rev`; else the default revision for
/// `drainshim.io/inject=enabled`.
fn revision_of(labels: &BTreeMap<String, String>, name: &str) -> Option<String> {
    if NEVER_SERVED.contains(&name)
        || labels
            .get(INJECT)
            .is_some_and(|v| OPTED_OUT.contains(&v.as_str()))
    {
        return None;
    }
    match labels.get(REV) {
        Some(rev) => Some(rev.clone()),
        None if labels.get(INJECT).map(String::as_str) == Some(ENABLED) => {
            Some(DEFAULT_REVISION.to_owned())
        }
        None => None,
    }
}

/// A pod's (or pod template's) metadata and spec, in the API's own types.
pub fn pod_parts(pod: &Value) -> Option<(ObjectMeta, PodSpec)> {
    let meta = serde_json::from_value(pod.get("metadata")?.clone()).ok()?;
    let spec = serde_json::from_value(pod.get("spec")?.clone()).ok()?;
    Some((meta, spec))
}

/// A pod that runs to completion (a Job's), which the injection leaves alone.
pub fn runs_to_completion(spec: &PodSpec) -> bool {
    matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure"))
}

/// Check 1: The API server must trust the webhook's certificate: a caBundle, or
/// cainjector filling it from a Certificate whose issuer exists.
pub fn webhook_ca(export: &Export, out: &mut Vec<Finding>) {
    for mwc in export.of_kind("MutatingWebhookConfiguration") {
        let hooks: Vec<&Value> = mwc
            .value
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|w| {
                w.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.ends_with(WEBHOOK_SUFFIX))
            })
            .collect();
        if hooks.is_empty() {
            continue;
        }
        let empty: Vec<&str> = hooks
            .iter()
            .filter(|w| {
                w.pointer("/clientConfig/caBundle")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            })
            .filter_map(|w| w.get("name").and_then(Value::as_str))
            .collect();
        let annotations = mwc.map("/metadata/annotations");
        let Some(from) = annotations.get(CA_FROM) else {
            if !empty.is_empty() {
                out.push(Finding::problem(
                    "webhook-ca",
                    mwc,
                    format!(
                        "webhook(s) {} have an empty caBundle and there is no {CA_FROM} annotation: the API \
                         server cannot verify the webhook's certificate, every call fails, and pods are \
                         created without drainshim (failurePolicy Ignore)",
                        empty.join(", ")
                    ),
                    format!(
                        "annotate it {CA_FROM}: drainshim-system/drainshim-webhook (the revision's serving \
                         Certificate, deploy/webhook/revision) with cert-manager's cainjector running"
                    ),
                ));
            }
            continue;
        };
        let Some((ns, name)) = from.split_once('/') else {
            out.push(Finding::problem(
                "webhook-ca",
                mwc,
                format!("its {CA_FROM} is {from:?}, not <namespace>/<certificate>: cainjector ignores it"),
                "set it to <namespace>/<certificate>, e.g. drainshim-system/drainshim-webhook".into(),
            ));
            continue;
        };
        let Some(cert) = export.find("Certificate", ns, name) else {
            if !empty.is_empty() {
                out.push(Finding::problem(
                    "webhook-ca",
                    mwc,
                    format!(
                        "its {CA_FROM} names Certificate {from}, which is not in the export, and its caBundle \
                         is empty: cainjector has no CA to copy, and every call to the webhook fails"
                    ),
                    "apply the revision's Certificate (deploy/webhook/revision/certificate.yaml), or export \
                     it too (kubectl get certificates -A -o yaml)"
                        .into(),
                ));
            }
            continue;
        };
        issuer(export, mwc, cert, out);
    }
}

/// The Certificate's issuer must exist, or cert-manager never writes its
/// Secret: the webhook has no certificate to serve and cainjector no CA.
fn issuer(export: &Export, mwc: &Object, cert: &Object, out: &mut Vec<Finding>) {
    let at = |p: &str| cert.value.pointer(p).and_then(Value::as_str);
    let Some(name) = at("/spec/issuerRef/name") else {
        return out.push(Finding::problem(
            "webhook-ca",
            cert,
            format!("it has no issuerRef, and {} takes its CA from it", mwc.id()),
            "give it the issuerRef of deploy/webhook/revision/certificate.yaml".into(),
        ));
    };
    // Another group is an external issuer, whose objects this cannot know.
    if at("/spec/issuerRef/group").is_some_and(|g| g != "cert-manager.io") {
        return;
    }
    let kind = at("/spec/issuerRef/kind").unwrap_or("Issuer");
    let ns = if kind == "ClusterIssuer" {
        ""
    } else {
        cert.namespace.as_str()
    };
    if export.find(kind, ns, name).is_none() {
        let whose = if ns.is_empty() {
            format!("ClusterIssuer {name}")
        } else {
            format!("{kind} {ns}/{name}")
        };
        out.push(Finding::problem(
            "webhook-ca",
            cert,
            format!(
                "its issuer, {whose}, is not among the exported objects: cert-manager never issues it, so \
                 the webhook has no certificate and {} no caBundle",
                mwc.id()
            ),
            format!(
                "apply deploy/webhook/ca.yaml (the webhook's CA and its Issuer), or export the {kind} if it \
                 exists (kubectl get issuers,clusterissuers -A -o yaml)"
            ),
        ));
    }
}

/// The revision a `drainshim webhook` container serves, if it is one.
fn webhook_revision(container: &Value) -> Option<String> {
    webhook_flag(container, "--revision", "DRAINSHIM_REVISION")
        .map(|v| v.unwrap_or_else(|| DEFAULT_REVISION.to_owned()))
}

/// A `drainshim webhook` container's flag (`--name=v`, `--name v`) or its
/// environment variable: None when it is no webhook, Some(None) when unset.
fn webhook_flag(container: &Value, name: &str, env: &str) -> Option<Option<String>> {
    let strings = |k: &str| -> Vec<&str> {
        container
            .get(k)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let args: Vec<&str> = strings("command")
        .into_iter()
        .chain(strings("args"))
        .collect();
    if !args.contains(&"webhook") {
        return None;
    }
    let flag = args
        .iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix(name) {
            Some(v) if v.starts_with('=') => Some(v[1..].to_owned()),
            Some("") => args.get(i + 1).map(|v| v.to_string()),
            _ => None,
        });
    let env = container
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(env))
        .and_then(|e| e.get("value").and_then(Value::as_str))
        .map(str::to_owned);
    Some(flag.or(env))
}

/// Check 2b: A webhook injects the image it runs: `--image` equal to its
/// container's image. A registry mirror or tag set by kustomize's `images:`
/// reaches the container's image, never the flag, and every injected pod
/// would pull the other one (its drainshim-install init container: the app
/// never starts where that image cannot be pulled).
pub fn webhook_images(export: &Export, out: &mut Vec<Finding>) {
    for d in export.of_kind("Deployment") {
        let containers = d.value.pointer("/spec/template/spec/containers");
        for c in containers.and_then(Value::as_array).into_iter().flatten() {
            let Some(flag) = webhook_flag(c, "--image", "DRAINSHIM_IMAGE") else {
                continue;
            };
            let injects = flag.unwrap_or_else(|| inject::DEFAULT_IMAGE.to_owned());
            let runs = c.get("image").and_then(Value::as_str).unwrap_or_default();
            if injects != runs {
                out.push(Finding::problem(
                    "revision",
                    d,
                    format!(
                        "runs {runs:?} but injects --image {injects:?}: every pod it injects pulls the \
                         other image (kustomize's images: changes the container's image, not the flag)"
                    ),
                    format!("set --image={runs} in its args (or DRAINSHIM_IMAGE)"),
                ));
            }
        }
    }
}

/// Whether a Service's selector picks pods with these labels.
fn selects(svc: &Object, labels: &BTreeMap<String, String>) -> bool {
    let selector = svc.map("/spec/selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Check 2: Every opted-in namespace's revision has a webhook Deployment and a
/// Service that reaches it; otherwise its pods get no drainshim, silently.
pub fn revisions(export: &Export, out: &mut Vec<Finding>) {
    if !export.has_namespaces {
        out.push(Finding::info(
            "revision",
            "Namespace/*".into(),
            "no Namespace in the export: the checks of opted-in namespaces (revision, service-port, \
             not-injected, istio-routing) had nothing to go on; add `kubectl get namespaces -o yaml`"
                .into(),
        ));
        return;
    }
    // Revision -> its Deployments, each with the Services that select its pods.
    let mut served: BTreeMap<String, Vec<(String, Vec<ServiceRef>)>> = BTreeMap::new();
    for d in export.of_kind("Deployment") {
        let labels = d.map("/spec/template/metadata/labels");
        let containers = d.value.pointer("/spec/template/spec/containers");
        for rev in containers
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(webhook_revision)
        {
            let reached = export
                .of_kind("Service")
                .filter(|s| s.namespace == d.namespace && selects(s, &labels))
                .map(|s| (s.namespace.clone(), s.name.clone()))
                .collect();
            served.entry(rev).or_default().push((d.id(), reached));
        }
    }
    // Tag -> the Services its webhooks call (a drainshim webhook selecting
    // namespaces by drainshim.io/rev In [tag]).
    let tags = tag_services(export);
    for ns in export.of_kind("Namespace") {
        let labels = ns.labels();
        match labels.get(INJECT).map(String::as_str) {
            Some(v) if v != ENABLED && !OPTED_OUT.contains(&v) => out.push(Finding::problem(
                "revision",
                ns,
                format!(
                    "labelled {INJECT}={v}, a value no webhook reads: the namespace is neither opted in \
                     (enabled) nor out (disabled)"
                ),
                format!(
                    "kubectl label namespace {} --overwrite {INJECT}=enabled (or =disabled)",
                    ns.name
                ),
            )),
            _ => {}
        }
    }
    for (name, rev) in &export.opted_in {
        let Some(ns) = export.find("Namespace", "", name) else {
            continue;
        };
        let label = if rev == DEFAULT_REVISION && !ns.labels().contains_key(REV) {
            format!("{INJECT}={ENABLED} (the default revision)")
        } else {
            format!("{REV}={rev}")
        };
        match (served.get(rev), tags.get(rev.as_str())) {
            (None, Some(services)) => {
                // A tag: some Service it calls must reach a webhook Deployment.
                let reached: Vec<String> = services
                    .iter()
                    .flat_map(|(svc_ns, svc)| {
                        served
                            .values()
                            .flatten()
                            .filter(move |(_, svcs)| {
                                svcs.iter().any(|(n, s)| n == svc_ns && s == svc)
                            })
                            .map(|(dep, _)| dep.clone())
                    })
                    .collect();
                if reached.is_empty() {
                    out.push(Finding::problem(
                        "revision",
                        ns,
                        format!(
                            "labelled {label}, a tag whose webhooks call {}, which selects no webhook \
                             Deployment in the export: its pods are created without drainshim, and nothing warns",
                            services
                                .iter()
                                .map(|(n, s)| format!("Service/{n}/{s}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        format!(
                            "point the tag at a running revision (deploy/webhook/tags/{rev}: the Service and \
                             CA annotation), or export that revision's Deployment and Service too"
                        ),
                    ))
                }
            }
            (None, None) => out.push(Finding::problem(
                "revision",
                ns,
                format!(
                    "labelled {label}, but no webhook Deployment in the export runs `drainshim webhook \
                     --revision={rev}` and no tag {rev} points at one: its pods are created without \
                     drainshim, and nothing warns"
                ),
                format!(
                    "apply that revision (deploy/webhook, or a copy of deploy/webhook/canary for a named one) \
                     or a tag of that name (deploy/webhook/tags), or relabel the namespace (kubectl label \
                     namespace {name} {REV}-); if it runs, export its Deployment, Service and \
                     MutatingWebhookConfiguration too"
                ),
            )),
            (Some(deployments), _) if !deployments.iter().any(|(_, svcs)| !svcs.is_empty()) => {
                out.push(Finding::problem(
                    "revision",
                    ns,
                    format!(
                        "labelled {label}; {} runs that revision but no Service in its namespace selects its \
                         pods, so the API server cannot reach it",
                        deployments[0].0
                    ),
                    "apply the revision's Service (deploy/webhook/revision/service.yaml)".into(),
                ))
            }
            (Some(_), _) => {}
        }
    }
}

/// A Service, by namespace and name.
type ServiceRef = (String, String);

/// Tags: for each value `v` of a drainshim webhook's namespaceSelector
/// `drainshim.io/rev In [v]` in a configuration named `drainshim-tag-...`,
/// the Services (namespace, name) its webhooks call.
fn tag_services<'a>(export: &Export<'a>) -> BTreeMap<&'a str, Vec<ServiceRef>> {
    let mut tags: BTreeMap<&str, Vec<ServiceRef>> = BTreeMap::new();
    for mwc in export
        .of_kind("MutatingWebhookConfiguration")
        .filter(|m| m.name.starts_with(TAG_PREFIX))
    {
        for hook in mwc
            .value
            .get("webhooks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let service = hook.pointer("/clientConfig/service");
            let svc = (
                service
                    .and_then(|s| s.get("namespace"))
                    .and_then(Value::as_str),
                service.and_then(|s| s.get("name")).and_then(Value::as_str),
            );
            let (Some(svc_ns), Some(svc)) = svc else {
                continue;
            };
            let exprs = hook.pointer("/namespaceSelector/matchExpressions");
            for e in exprs.and_then(Value::as_array).into_iter().flatten() {
                if e.get("key").and_then(Value::as_str) != Some(REV)
                    || e.get("operator").and_then(Value::as_str) != Some("In")
                {
                    continue;
                }
                for tag in e
                    .get("values")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(tag) = tag.as_str() {
                        let list = tags.entry(tag).or_default();
                        let one = (svc_ns.to_owned(), svc.to_owned());
                        if !list.contains(&one) {
                            list.push(one);
                        }
                    }
                }
            }
        }
    }
    tags
}

/// Check 3: A Service in an opted-in namespace must not target a port only
/// injected pods have: the endpoints would leave out every pod created
/// without drainshim (during a webhook outage, or refused).
pub fn service_ports(export: &Export, out: &mut Vec<Finding>) {
    let injected = match inject::injected_ports() {
        Ok(p) => p,
        Err(e) => {
            return out.push(Finding::info(
                "service-port",
                "Service/*".into(),
                format!("not checked: {e}"),
            ))
        }
    };
    for svc in export.of_kind("Service") {
        if !export.opted_in.contains_key(svc.namespace.as_str())
            || svc.map("/spec/selector").is_empty()
        {
            continue;
        }
        for port in svc
            .value
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(target) = port.get("targetPort").or_else(|| port.get("port")) else {
                continue;
            };
            let only_injected = injected.iter().any(|(name, number)| match target {
                Value::String(s) => name.as_deref() == Some(s.as_str()),
                Value::Number(n) => n.as_i64() == Some(i64::from(*number)),
                _ => false,
            });
            if only_injected {
                let which = port
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .or_else(|| port.get("port").map(Value::to_string))
                    .unwrap_or_default();
                out.push(Finding::problem(
                    "service-port",
                    svc,
                    format!(
                        "port {which} targets {target}, a port only pods with drainshim have: its endpoints \
                         leave out (or break) every pod created without drainshim, while the webhook is down \
                         or refuses one, and a rollout then may leave it none"
                    ),
                    "target the app's own port by its name: the webhook gives that name to Envoy's port on \
                     injected pods (deploy/README.md, \"Services keep the app's port\"); name the app's port \
                     if it has none"
                        .into(),
                ));
            }
        }
    }
}

/// Check 4: Every long-running pod of an opted-in namespace has drainshim.
pub fn not_injected(export: &Export, out: &mut Vec<Finding>) {
    for pod in export.of_kind("Pod") {
        let Some(rev) = export.opted_in.get(pod.namespace.as_str()) else {
            continue;
        };
        let Some((meta, spec)) = pod_parts(&pod.value) else {
            continue;
        };
        let finished = matches!(
            pod.value.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        if finished
            || runs_to_completion(&spec)
            || inject::opted_out(&meta)
            || meta.deletion_timestamp.is_some()
        {
            continue;
        }
        let annotations = string_map(pod.value.pointer("/metadata/annotations"));
        // The Istio mode's first call, before Istio's injector, writes only
        // Istio's settings and its record (awaitingProxy); if Istio never
        // injected, that is all the pod has of drainshim.
        let awaiting = awaiting_istio(&annotations);
        if annotations.contains_key(INJECTED) && !awaiting {
            continue;
        }
        let owner = meta
            .owner_references
            .iter()
            .flatten()
            .next()
            .map(|o| format!("its {} {}", o.kind, o.name))
            .unwrap_or_else(|| "the pod".into());
        out.push(Finding::problem(
            "not-injected",
            pod,
            format!(
                "{} in a namespace of revision {rev}: created before the label, while the webhook was \
                 down, or refused; its streams are cut at its next restart",
                if awaiting {
                    format!(
                        "no drainshim (its {INJECTED} record says it waited for Istio's injection, which \
                         never came)"
                    )
                } else {
                    format!("no drainshim (no {INJECTED} annotation)")
                }
            ),
            format!(
                "once the webhook serves, restart {owner} (kubectl -n {} rollout restart ...); if it comes \
                 back without drainshim, `drainshim inject -f` on its manifest names why, or opt it out with \
                 {INJECT}: \"false\"",
                pod.namespace
            ),
        ));
    }
}

/// Whether a pod's record says it waits for Istio's injection: the Istio
/// mode's first call wrote only Istio's settings; if Istio never injected,
/// that is all the pod has of drainshim.
fn awaiting_istio(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(INJECTED).is_some_and(|m| {
        serde_json::from_str::<Value>(m)
            .is_ok_and(|m| m.get("awaitingProxy") == Some(&Value::Bool(true)))
    })
}

/// Check 5 (info): which drainshim each namespace's injected pods run, by
/// release and revision (the annotations the injection writes): the version
/// spread a rollout of a new revision moves.
pub fn versions(export: &Export, out: &mut Vec<Finding>) {
    // Namespace -> (release, revision) -> pods.
    let mut spread: BTreeMap<&str, BTreeMap<(String, String), usize>> = BTreeMap::new();
    for pod in export.of_kind("Pod") {
        let annotations = pod.map("/metadata/annotations");
        if !annotations.contains_key(INJECTED) || awaiting_istio(&annotations) {
            continue;
        }
        let field = |key: &str| {
            annotations
                .get(key)
                .cloned()
                .unwrap_or_else(|| "unrecorded".into())
        };
        *spread
            .entry(pod.namespace.as_str())
            .or_default()
            .entry((field(VERSION), field(REVISION)))
            .or_default() += 1;
    }
    for (ns, runs) in spread {
        let total: usize = runs.values().sum();
        let list: Vec<String> = runs
            .iter()
            .map(|((version, revision), n)| format!("{n} on {version} (revision {revision})"))
            .collect();
        let mixed = if runs.len() > 1 { ", mixed" } else { "" };
        out.push(Finding::info(
            "versions",
            format!("Namespace/{ns}"),
            format!(
                "{total} injected pod(s){mixed}: {} ({VERSION}, {REVISION}; \"unrecorded\": injected \
                 by drainshim `inject` or a release before they were written)",
                list.join(", ")
            ),
        ));
    }
}

/// Check 6: a LimitRange of an opted-in namespace must admit drainshim's
/// containers as the injection adds them (their default requests and
/// limits): the admission plugin runs after the webhook and refuses the
/// whole pod, which `failurePolicy: Ignore` does not cover (the webhook did
/// answer), so the workload's pods are never created.
pub fn limit_ranges(export: &Export, out: &mut Vec<Finding>) {
    let injected = match inject::resources::injected() {
        Ok(i) => i,
        Err(e) => {
            return out.push(Finding::info(
                "limit-range",
                "LimitRange/*".into(),
                format!("not checked: {e}"),
            ))
        }
    };
    let number = |v: &Value| match v {
        Value::String(s) => inject::resources::parse(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    };
    for lr in export.of_kind("LimitRange") {
        if !export.opted_in.contains_key(lr.namespace.as_str()) {
            continue;
        }
        let items = lr.value.pointer("/spec/limits").and_then(Value::as_array);
        let mut why = Vec::new();
        for item in items.into_iter().flatten() {
            if item.get("type").and_then(Value::as_str) != Some("Container") {
                continue;
            }
            let bound = |field: &str, resource: &str| {
                item.get(field)
                    .and_then(|m| m.get(resource))
                    .and_then(number)
            };
            for c in &injected {
                for (resource, (request, limit)) in &c.resources {
                    let (request, limit) = (request.or(*limit), limit.or(*request));
                    if let (Some(max), Some(l)) = (bound("max", resource), limit) {
                        if l > max {
                            why.push(format!(
                                "{}'s {resource} limit is above its max",
                                c.container
                            ));
                        }
                    }
                    if let (Some(min), Some(r)) = (bound("min", resource), request) {
                        if r < min {
                            why.push(format!(
                                "{}'s {resource} request is below its min",
                                c.container
                            ));
                        }
                    }
                    if let (Some(ratio), Some(r), Some(l)) =
                        (bound("maxLimitRequestRatio", resource), request, limit)
                    {
                        if r > 0.0 && l / r > ratio {
                            why.push(format!(
                                "{}'s {resource} limit/request {:.1} is above its maxLimitRequestRatio {ratio}",
                                c.container,
                                l / r
                            ));
                        }
                    }
                }
            }
        }
        if !why.is_empty() {
            out.push(Finding::problem(
                "limit-range",
                lr,
                format!(
                    "refuses every injected pod of the namespace (after the webhook, which cannot help it): {}",
                    why.join("; ")
                ),
                format!(
                    "set drainshim's limits per pod within it (annotations {}, {}, {}, {}), or widen the \
                     LimitRange",
                    inject::resources::PROXY_CPU_LIMIT,
                    inject::resources::PROXY_MEMORY_LIMIT,
                    inject::resources::CPU_LIMIT,
                    inject::resources::MEMORY_LIMIT
                ),
            ));
        }
    }
}
