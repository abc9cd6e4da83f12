//! The checks under Istio: which proxy mode drainshim will meet and the
//! combinations deploy/README.md does not support (`istio-mode`), and the app
//! ports the routing objects of `drainshim istio-routing` do not cover
//! (`istio-routing`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::cluster::{pod_parts, runs_to_completion, Export, WEBHOOK_SUFFIX};
use super::{Finding, Object};
use crate::inject::mesh::{self, Choice, Namespace, ISTIO_INJECTION, ISTIO_REV};
use crate::inject::{self, APP_PORT};

/// Istio's namespace, where its injector's ConfigMap, its mesh config and
/// (by default) its root namespace are.
const ISTIO_SYSTEM: &str = "istio-system";
/// The suffix of Istio's injection webhooks' names (its chart's, every revision and tag).
const ISTIO_WEBHOOK_SUFFIX: &str = "sidecar-injector.istio.io";
/// Istio's switch for native sidecars, in istiod's environment.
const NATIVE: &str = "ENABLE_NATIVE_SIDECARS";
/// The proxy setting that starts istio-proxy before the app.
const HOLD: &str = "holdApplicationUntilProxyStarts";

/// A setting and where it was read.
struct Setting {
    on: bool,
    from: String,
}

/// `true`, `"true"` (any case), or a `"1"`.
fn truth(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => Some(matches!(s.to_lowercase().as_str(), "true" | "1")),
        _ => None,
    }
}

/// A ConfigMap's data key, parsed (JSON is YAML).
fn data(cm: Option<&Object>, key: &str) -> Option<Value> {
    let text = cm?.value.pointer(&format!("/data/{key}"))?.as_str()?;
    serde_yaml_ng::from_str(text).ok()
}

/// Istio's webhooks of one configuration that have `reinvocationPolicy: IfNeeded`.
fn reinvoked(mwc: &Object) -> Vec<String> {
    istio_webhooks(mwc)
        .filter(|w| w.get("reinvocationPolicy").and_then(Value::as_str) == Some("IfNeeded"))
        .filter_map(|w| w.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

fn istio_webhooks(mwc: &Object) -> impl Iterator<Item = &Value> {
    mwc.value
        .get("webhooks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|w| {
            w.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.ends_with(ISTIO_WEBHOOK_SUFFIX))
        })
}

fn has_webhook(mwc: &Object, suffix: &str) -> bool {
    mwc.value
        .get("webhooks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|w| {
            w.get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| n.ends_with(suffix))
        })
}

/// Check 5: The proxy mode drainshim meets, from Istio's injector values, its mesh
/// config and istiod's environment; and what deploy/README.md does not support.
pub fn mode(export: &Export, out: &mut Vec<Finding>) {
    let injector = export.find("ConfigMap", ISTIO_SYSTEM, "istio-sidecar-injector");
    let mesh_cm = export.find("ConfigMap", ISTIO_SYSTEM, "istio");
    let istiods: Vec<&Object> = export
        .of_kind("Deployment")
        .filter(|d| d.namespace == ISTIO_SYSTEM && d.name.starts_with("istiod"))
        .collect();
    let istio_hooks: Vec<&Object> = export
        .of_kind("MutatingWebhookConfiguration")
        .filter(|m| has_webhook(m, ISTIO_WEBHOOK_SUFFIX))
        .collect();
    if injector.is_none() && mesh_cm.is_none() && istiods.is_empty() && istio_hooks.is_empty() {
        return;
    }
    let values = data(injector, "values");
    let mesh = data(mesh_cm, "mesh");

    let mut native = None;
    for d in &istiods {
        let env = d
            .value
            .pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("env").and_then(Value::as_array))
            .flatten()
            .find(|e| e.get("name").and_then(Value::as_str) == Some(NATIVE));
        if let Some(on) = env.and_then(|e| e.get("value")).and_then(truth) {
            native = Some(Setting {
                on,
                from: format!("{NATIVE} in {}'s env", d.id()),
            });
        }
    }
    if native.is_none() {
        let v = values
            .as_ref()
            .and_then(|v| v.pointer(&format!("/pilot/env/{NATIVE}")));
        native = v.and_then(truth).map(|on| Setting {
            on,
            from: format!("values.pilot.env.{NATIVE} in istio-sidecar-injector"),
        });
    }
    let hold = [
        (
            values
                .as_ref()
                .and_then(|v| v.pointer(&format!("/global/proxy/{HOLD}"))),
            format!("values.global.proxy.{HOLD}"),
        ),
        (
            mesh.as_ref()
                .and_then(|m| m.pointer(&format!("/defaultConfig/{HOLD}"))),
            format!("meshConfig defaultConfig.{HOLD}"),
        ),
    ]
    .into_iter()
    .find_map(|(v, from)| {
        v.and_then(truth)
            .filter(|on| *on)
            .map(|on| Setting { on, from })
    });

    let what = match (&native, &hold) {
        (Some(n), _) if n.on => format!(
            "native sidecars ({}): istio-proxy is an init container with restartPolicy Always; drainshim's \
             preStop replaces Istio's drain hook",
            n.from
        ),
        (None, _) => format!(
            "{NATIVE} is not set: native sidecars on Istio 1.27 or later with Kubernetes 1.29 or later (Istio's \
             default), else classic sidecars{}",
            hold.as_ref()
                .map(|h| format!(", istio-proxy first ({})", h.from))
                .unwrap_or_default()
        ),
        (Some(n), Some(h)) => format!(
            "classic sidecars ({}) holding the app until the proxy starts ({}): istio-proxy is the first \
             container, the app the first after it",
            n.from, h.from
        ),
        (Some(n), None) => format!(
            "classic sidecars ({}): istio-proxy is the last container",
            n.from
        ),
    };
    let about = injector
        .or(mesh_cm)
        .or(istiods.first().copied())
        .or(istio_hooks.first().copied())
        .map(Object::id)
        .unwrap_or_default();
    out.push(Finding::info(
        "istio-mode",
        about,
        format!("drainshim meets {what}"),
    ));

    // deploy/README.md, "Istio's modes": not supported.
    let native_maybe = native.as_ref().is_none_or(|n| n.on);
    for mwc in &istio_hooks {
        let names = reinvoked(mwc);
        if native_maybe && !names.is_empty() {
            out.push(Finding::problem(
                "istio-mode",
                mwc,
                format!(
                    "Istio's webhook(s) {} have reinvocationPolicy IfNeeded with native sidecars{}: not \
                     supported, Istio's second pass puts its own preStop back over drainshim's",
                    names.join(", "),
                    if native.is_none() { " (Istio's default from 1.27)" } else { "" }
                ),
                format!(
                    "set reinvocationPolicy: Never on Istio's injector webhooks (Istio's default), or \
                     {NATIVE}=false in istiod's env"
                ),
            ));
        }
    }
    // The API server calls configurations by name: drainshim's must come first.
    for ours in export
        .of_kind("MutatingWebhookConfiguration")
        .filter(|m| has_webhook(m, WEBHOOK_SUFFIX))
    {
        if let Some(before) = istio_hooks.iter().find(|i| i.name < ours.name) {
            out.push(Finding::problem(
                "istio-mode",
                ours,
                format!(
                    "its name sorts after Istio's {}, so Istio's injector runs first and its iptables rules \
                     do not exclude drainshim's port 15099: the kubelet's probe of drainshim goes through \
                     Envoy, which STRICT mTLS refuses",
                    before.name
                ),
                format!(
                    "rename it so that it sorts before {:?} (the shipped name is \"drainshim\")",
                    before.name
                ),
            ));
        }
    }
}

/// Whether Istio injects pods of a namespace with these labels, as its
/// webhooks select namespaces (`mesh`).
fn istio_namespace(labels: &BTreeMap<String, String>) -> Namespace {
    match labels.get(ISTIO_INJECTION) {
        Some(v) if v == "enabled" => Namespace::Injected,
        Some(_) => Namespace::Disabled,
        None if labels.contains_key(ISTIO_REV) => Namespace::Injected,
        None => Namespace::Unlabelled,
    }
}

/// Check 6: Each Istio pod's app port has a routing object: an EnvoyFilter
/// selecting `drainshim.io/app-port: "<port>"` in Istio's root namespace or
/// the pod's own.
pub fn routing(export: &Export, out: &mut Vec<Finding>) {
    let root = data(export.find("ConfigMap", ISTIO_SYSTEM, "istio"), "mesh")
        .and_then(|m| {
            m.get("rootNamespace")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| ISTIO_SYSTEM.to_owned());
    // Namespace -> the ports its routing objects cover.
    let mut covered: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for f in export.of_kind("EnvoyFilter") {
        if let Some(port) = f.map("/spec/workloadSelector/labels").get(APP_PORT) {
            covered
                .entry(&f.namespace)
                .or_default()
                .insert(port.clone());
        }
    }
    let mut missing: Vec<(&Object, u16)> = Vec::new();
    for o in export.objects {
        let pod = match o.kind.as_str() {
            "Pod" => &o.value,
            "Deployment" | "StatefulSet" | "DaemonSet" => match o.value.pointer("/spec/template") {
                Some(t) => t,
                None => continue,
            },
            _ => continue,
        };
        if !export.opted_in.contains_key(o.namespace.as_str()) {
            continue;
        }
        let Some((meta, spec)) = pod_parts(pod) else {
            continue;
        };
        let ns = istio_namespace(&export.namespace_labels(&o.namespace));
        if mesh::choose(ns, &meta, &spec) != Choice::Istio
            || inject::opted_out(&meta)
            || runs_to_completion(&spec)
        {
            continue;
        }
        // A pod without one app port is refused by the webhook; not-injected names it.
        let Ok(port) = inject::pod_app_port(&meta, &spec) else {
            continue;
        };
        let is_covered = [root.as_str(), o.namespace.as_str()].iter().any(|ns| {
            covered
                .get(ns)
                .is_some_and(|p| p.contains(&port.to_string()))
        });
        if !is_covered {
            missing.push((o, port));
        }
    }
    let mut every: BTreeSet<u16> = missing.iter().map(|(_, p)| *p).collect();
    for ports in covered.values() {
        every.extend(ports.iter().filter_map(|p| p.parse::<u16>().ok()));
    }
    let list = every
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    for (o, port) in missing {
        out.push(Finding::problem(
            "istio-routing",
            o,
            format!(
                "its app port {port} has no routing object (an EnvoyFilter selecting {APP_PORT}: \"{port}\" in \
                 {root} or {}): Istio sends its traffic straight to the app, past the guard, so a restart \
                 cuts its streams",
                o.namespace
            ),
            format!("drainshim istio-routing --ports {list} --namespace {root} | kubectl apply -f -"),
        ));
    }
}
