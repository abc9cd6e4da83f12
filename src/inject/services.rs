//! `inject --services`: the Services of the same manifests that select an
//! injected workload's pods are pointed at Envoy's inbound port by its name
//! instead of at the app's port by number; `--uninject --services` points
//! them back.
//!
//! Envoy's inbound port takes the app's port name (`ports`): a Service that
//! targets the app's port by that name reaches Envoy already, and is left
//! alone. One that targets it by number is given the name. Where the app's
//! port has no name, Envoy's is `envoy-inbound`, which a pod without Envoy
//! lacks (a named target port a pod lacks takes it out of the endpoints).
//! A Service changes only when every workload of the manifests it selects
//! is injected, and only the ports that target the app's port. What each
//! port targeted before is recorded in the annotation `TARGETS`.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::ports::ENVOY_INBOUND_PORT;
use super::{Line, APP_PORT, INJECTED};

/// Service annotation: each changed port's index and its target before.
pub const TARGETS: &str = "drainshim.io/injected-target-ports";

/// A workload of the manifests, as a Service's selector sees it.
struct Workload {
    id: String,
    namespace: Option<String>,
    labels: Map<String, Value>,
    /// Injected: its app's port number, and the name of Envoy's inbound port.
    app: Option<(i64, String)>,
}

/// Calls `f` on every object, a List's items included.
fn each(v: &mut Value, f: &mut dyn FnMut(&mut Value)) {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind.ends_with("List") {
        for item in v
            .get_mut("items")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            each(item, f);
        }
    } else {
        f(v);
    }
}

fn id(v: &Value) -> String {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    format!("{kind}/{name}")
}

fn namespace(v: &Value) -> Option<String> {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

fn workloads(docs: &mut [Value]) -> Vec<Workload> {
    let mut out = Vec::new();
    for doc in docs.iter_mut() {
        each(doc, &mut |v| {
            let pod = match v.get("kind").and_then(Value::as_str) {
                Some("Pod") => Some(&*v),
                Some(_) => v.pointer("/spec/template"),
                None => None,
            };
            let Some(pod) = pod.filter(|p| p.pointer("/spec/containers").is_some()) else {
                return;
            };
            let annotations = pod.pointer("/metadata/annotations");
            let injected = annotations.and_then(|a| a.get(INJECTED)).is_some();
            let port = annotations
                .and_then(|a| a.get(APP_PORT))
                .and_then(Value::as_str)
                .and_then(|p| p.parse().ok());
            let envoy = ["/spec/containers", "/spec/initContainers"]
                .iter()
                .filter_map(|at| pod.pointer(at).and_then(Value::as_array))
                .flatten()
                .filter(|c| c.get("name").and_then(Value::as_str) == Some(super::patch::ENVOY))
                .filter_map(|c| c.get("ports").and_then(Value::as_array))
                .flatten()
                .find(|p| {
                    p.get("containerPort").and_then(Value::as_i64)
                        == Some(i64::from(ENVOY_INBOUND_PORT))
                })
                .and_then(|p| p.get("name").and_then(Value::as_str))
                .map(str::to_owned);
            let app = match (injected, port, envoy) {
                (true, Some(port), Some(envoy)) => Some((port, envoy)),
                _ => None,
            };
            out.push(Workload {
                id: id(v),
                namespace: namespace(v),
                labels: pod
                    .pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default(),
                app,
            });
        });
    }
    out
}

/// Points the Services that select only injected pods at Envoy.
pub fn retarget(docs: &mut [Value], lines: &mut Vec<Line>) {
    let workloads = workloads(docs);
    for doc in docs.iter_mut() {
        each(doc, &mut |svc| {
            if svc.get("kind").and_then(Value::as_str) != Some("Service") {
                return;
            }
            let Some(selector) = svc
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .filter(|s| !s.is_empty())
            else {
                return;
            };
            let ns = namespace(svc);
            let selected: Vec<&Workload> = workloads
                .iter()
                .filter(|w| {
                    w.namespace == ns && selector.iter().all(|(k, v)| w.labels.get(k) == Some(v))
                })
                .collect();
            if selected.is_empty() {
                return;
            }
            let object = id(svc);
            if let Some(w) = selected.iter().find(|w| w.app.is_none()) {
                lines.push(Line {
                    object,
                    what: format!(
                        "left as is: it also selects {}, which has no drainshim",
                        w.id
                    ),
                });
                return;
            }
            let apps: Vec<&(i64, String)> =
                selected.iter().filter_map(|w| w.app.as_ref()).collect();
            // One name reaches Envoy in every pod the Service selects.
            let envoy = apps[0].1.clone();
            // Only a name the app's port had reaches the app on pods created
            // without drainshim (the old ReplicaSet's, any the webhook did
            // not inject) as well as Envoy on injected ones; envoy-inbound
            // exists on injected pods alone, and would empty the Service
            // until they replace the others.
            if envoy == super::ports::ENVOY_INBOUND {
                lines.push(Line {
                    object,
                    what: format!(
                        "left as is: the app's port has no name, so no name reaches both the app on pods \
                         without drainshim and Envoy on injected ones ({envoy:?} is only on injected pods: \
                         pointing the Service at it would empty it until every pod is replaced); name the \
                         app's port (e.g. grpc) and run again"
                    ),
                });
                return;
            }
            let one_name = apps.iter().all(|(_, name)| *name == envoy);
            let (mut changed, mut already) = (BTreeMap::new(), false);
            for (i, port) in svc
                .pointer_mut("/spec/ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let target = port.get("targetPort").cloned();
                let effective = target
                    .clone()
                    .or_else(|| port.get("port").cloned())
                    .unwrap_or(Value::Null);
                if apps
                    .iter()
                    .all(|(_, name)| effective.as_str() == Some(name))
                {
                    already = true;
                    continue;
                }
                let to_app = apps.iter().all(|(num, _)| {
                    effective.as_i64() == Some(*num)
                        || effective.as_str().and_then(|s| s.parse::<i64>().ok()) == Some(*num)
                });
                if to_app && one_name {
                    changed.insert(i.to_string(), target.unwrap_or(Value::Null));
                    port["targetPort"] = json!(envoy);
                }
            }
            let what = if changed.is_empty() && already {
                format!("already targets {envoy:?}, Envoy's port in the pods it selects: unchanged")
            } else if changed.is_empty() {
                "no port targets the app's port: unchanged".to_string()
            } else {
                format!(
                    "{} port(s) now target {envoy:?}, Envoy's port in the pods it selects",
                    changed.len()
                )
            };
            if !changed.is_empty() {
                let record = serde_json::to_string(&changed).unwrap_or_default();
                if let Some(meta) = svc.get_mut("metadata").and_then(Value::as_object_mut) {
                    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
                    if let Some(a) = annotations.as_object_mut() {
                        // A second injection keeps the first record: the target before drainshim.
                        a.entry(TARGETS).or_insert(json!(record));
                    }
                }
            }
            lines.push(Line { object, what });
        });
    }
}

/// Points the Services `retarget` changed back at what they targeted.
pub fn restore(docs: &mut [Value], lines: &mut Vec<Line>) {
    for doc in docs.iter_mut() {
        each(doc, &mut |svc| {
            if svc.get("kind").and_then(Value::as_str) != Some("Service") {
                return;
            }
            let Some(record) = svc.pointer(&format!(
                "/metadata/annotations/{}",
                TARGETS.replace('/', "~1")
            )) else {
                return;
            };
            let record: BTreeMap<String, Value> = record
                .as_str()
                .and_then(|r| serde_json::from_str(r).ok())
                .unwrap_or_default();
            let ports = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut);
            for (i, port) in ports.into_iter().flatten().enumerate() {
                match record.get(&i.to_string()) {
                    Some(Value::Null) => {
                        if let Some(p) = port.as_object_mut() {
                            p.remove("targetPort");
                        }
                    }
                    Some(before) => port["targetPort"] = before.clone(),
                    None => {}
                }
            }
            if let Some(meta) = svc.get_mut("metadata").and_then(Value::as_object_mut) {
                if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                    a.remove(TARGETS);
                    if a.is_empty() {
                        meta.remove("annotations");
                    }
                }
            }
            lines.push(Line {
                object: id(svc),
                what: "points at the app's port again".into(),
            });
        });
    }
}
