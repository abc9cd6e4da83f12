//! Manifests in and out: multi-document YAML or a `List`, every pod template
//! in them injected (or uninjected), everything else passed through.
//!
//! A pod is read into the Kubernetes API's own types, changed there, and the
//! difference applied to the document as it was read, as a JSON Patch: the
//! same patch the webhook answers with, and fields these types do not know
//! are kept.

use json_patch::Patch;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{InjectOptions, Line, PodChange, PodRefusal};

/// Inject or undo.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Inject,
    Uninject,
}

/// The manifests with every pod template changed, and one line per workload;
/// or every refusal, each naming its object (nothing is written then: a
/// pipeline must not apply half of a change).
pub fn transform(
    input: &str,
    settings: &InjectOptions,
    action: Direction,
) -> Result<(String, Vec<Line>), Vec<String>> {
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(input).enumerate() {
        match Value::deserialize(doc) {
            Ok(Value::Null) => {}
            Ok(v) => docs.push(v),
            Err(e) => {
                return Err(vec![format!(
                    "document {}: not YAML a manifest can be: {e}",
                    i + 1
                )])
            }
        }
    }
    let (mut lines, mut errors) = (Vec::new(), Vec::new());
    for (i, doc) in docs.iter_mut().enumerate() {
        object(doc, settings, action, &mut lines, &mut |e| {
            errors.push(format!("document {}: {e}", i + 1))
        });
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    if settings.services {
        match action {
            Direction::Inject => super::services::retarget(&mut docs, &mut lines),
            Direction::Uninject => super::services::restore(&mut docs, &mut lines),
        }
    }
    let mut out = String::new();
    for doc in &docs {
        if !out.is_empty() {
            out.push_str("---\n");
        }
        out.push_str(
            &serde_yaml_ng::to_string(doc).map_err(|e| vec![format!("writing YAML: {e}")])?,
        );
    }
    Ok((out, lines))
}

/// Where a kind keeps its pod: the pod template, the object itself (a Pod),
/// or nowhere drainshim goes.
enum Holds {
    Template(&'static str),
    Pod,
    Batch,
    Nothing,
}

fn holds(kind: &str) -> Holds {
    match kind {
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "ReplicationController" => {
            Holds::Template("/spec/template")
        }
        "Pod" => Holds::Pod,
        "Job" | "CronJob" => Holds::Batch,
        _ => Holds::Nothing,
    }
}

fn object(
    doc: &mut Value,
    settings: &InjectOptions,
    action: Direction,
    lines: &mut Vec<Line>,
    error: &mut dyn FnMut(String),
) {
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    let id = format!("{kind}/{name}");
    if kind.ends_with("List") {
        for item in doc
            .get_mut("items")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            object(item, settings, action, lines, error);
        }
        return;
    }
    let pointer = match holds(&kind) {
        Holds::Template(p) => p,
        Holds::Pod => "",
        Holds::Batch => {
            lines.push(Line {
                object: id,
                what: "not injected: a Job's pods run to completion, not long-lived streams".into(),
            });
            return;
        }
        Holds::Nothing => return,
    };
    let opted_out = |meta: Option<&Value>| {
        meta.and_then(|m| serde_json::from_value(m.clone()).ok())
            .is_some_and(|m| super::opted_out(&m))
    };
    if action == Direction::Inject && opted_out(doc.get("metadata")) {
        lines.push(Line {
            object: id,
            what: format!("opted out ({}: \"false\"): not touched", super::INJECT),
        });
        return;
    }
    let Some(pod) = doc.pointer_mut(pointer).filter(|p| p.is_object()) else {
        return error(format!("{id}: it has no pod template at {pointer}"));
    };
    // The patch may add annotations: it needs a metadata object to add to.
    if pod.get("metadata").is_none() {
        pod["metadata"] = json!({});
    }
    match pod_patch(pod, settings, action) {
        Ok((patch, outcome)) => match json_patch::patch(pod, &patch) {
            Ok(()) => lines.push(Line {
                object: id,
                what: describe(&outcome, settings, patch.0.is_empty()),
            }),
            Err(e) => error(format!(
                "{id}: the change does not apply to the document as written: {e}"
            )),
        },
        Err(PodRefusal(why)) => error(format!("{id}: not {}: {why}", verb(action))),
    }
}

fn verb(action: Direction) -> &'static str {
    match action {
        Direction::Inject => "injected",
        Direction::Uninject => "uninjected",
    }
}

fn describe(outcome: &PodChange, settings: &InjectOptions, unchanged: bool) -> String {
    match outcome {
        PodChange::Injected { app, port, .. } if unchanged => {
            format!(
                "already injected ({}, app {app:?} on :{port}): unchanged",
                settings.mode.name()
            )
        }
        PodChange::Injected {
            app,
            port,
            warnings,
        } => {
            let mut what = format!(
                "injected ({}, app {app:?} on :{port})",
                settings.mode.name()
            );
            for w in warnings {
                what.push_str("; but ");
                what.push_str(w);
            }
            what
        }
        PodChange::AwaitingIstio { app, port } => {
            format!("Istio's settings set (app {app:?} on :{port}); drainshim follows Istio's injection")
        }
        PodChange::OptedOut => format!("opted out ({}: \"false\"): not touched", super::INJECT),
        PodChange::RunsToCompletion => {
            "not injected: its pods run to completion (restartPolicy), not long-lived streams"
                .into()
        }
        PodChange::Uninjected => "uninjected".into(),
        PodChange::NotInjected => "nothing injected: unchanged".into(),
    }
}

/// The JSON Patch that injects (or uninjects) one pod, relative to the object
/// holding `metadata` and `spec` (a Pod, or a workload's pod template).
pub fn pod_patch(
    pod: &Value,
    settings: &InjectOptions,
    action: Direction,
) -> Result<(Patch, PodChange), PodRefusal> {
    let parts = json!({
        "metadata": pod.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "spec": pod.get("spec").cloned().unwrap_or(Value::Null),
    });
    let template: PodTemplateSpec = serde_json::from_value(parts)
        .map_err(|e| PodRefusal(format!("its pod is not a valid Kubernetes pod: {e}")))?;
    let mut meta = template.metadata.unwrap_or_default();
    let Some(mut spec) = template.spec else {
        return Err(PodRefusal("it has no pod spec".into()));
    };
    let before = encode(&meta, &spec)?;
    let outcome = match action {
        Direction::Inject => super::inject(&mut meta, &mut spec, settings)?,
        Direction::Uninject => super::uninject(&mut meta, &mut spec)?,
    };
    let after = encode(&meta, &spec)?;
    Ok((json_patch::diff(&before, &after), outcome))
}

fn encode(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Result<Value, PodRefusal> {
    Ok(json!({
        "metadata": serde_json::to_value(meta).map_err(|e| PodRefusal(format!("encoding the pod's metadata: {e}")))?,
        "spec": serde_json::to_value(spec).map_err(|e| PodRefusal(format!("encoding the pod's spec: {e}")))?,
    }))
}
