//! `drainshim check`: a preflight over Kubernetes objects a user exported
//! (`kubectl get ... -o yaml`), before a namespace is opted in. It reads
//! multi-document YAML and `List`s, runs every check on the whole export at
//! once, and names each problem with its object and what to do.
//!
//! The checks, by id (each a function of the export, no cluster access):
//! - `webhook-ca` (`cluster`): drainshim's MutatingWebhookConfiguration has
//!   no caBundle and no cainjector annotation, or its Certificate's issuer is
//!   missing;
//! - `revision` (`cluster`): an opted-in namespace whose revision (or tag)
//!   no webhook Deployment and Service serve, or whose `drainshim.io/inject`
//!   is a value no webhook reads; a webhook whose `--image` is not the
//!   image it runs;
//! - `service-port` (`cluster`): a Service in an opted-in namespace that
//!   targets a port only injected pods have;
//! - `not-injected` (`cluster`): a pod of an opted-in namespace without
//!   drainshim;
//! - `limit-range` (`cluster`): a LimitRange of an opted-in namespace that
//!   refuses drainshim's containers as injected;
//! - `versions` (`cluster`, info): which drainshim release and revision each
//!   namespace's injected pods run;
//! - `istio-mode` (`istio`): the Istio proxy mode drainshim will meet, and
//!   the combination deploy/README.md does not support;
//! - `istio-routing` (`istio`): an app port of an Istio pod that no routing
//!   object of `drainshim istio-routing` covers.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

mod cluster;
mod istio;
#[cfg(test)]
mod tests;

/// One exported object, a List's items taken out.
#[derive(Debug)]
pub struct Object {
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    pub value: Value,
}

impl Object {
    /// `kind/namespace/name`, or `kind/name` when cluster-scoped.
    pub fn id(&self) -> String {
        if self.namespace.is_empty() {
            format!("{}/{}", self.kind, self.name)
        } else {
            format!("{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }

    /// The string map at `pointer` (labels, annotations, a selector).
    fn map(&self, pointer: &str) -> BTreeMap<String, String> {
        string_map(self.value.pointer(pointer))
    }

    fn labels(&self) -> BTreeMap<String, String> {
        self.map("/metadata/labels")
    }
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

/// Reads every object of one input (`source` names it in errors). Anything
/// that is not YAML holding Kubernetes objects is an error: the verdict of a
/// preflight that skipped half its input would be worthless.
pub fn load(input: &str, source: &str, into: &mut Vec<Object>) -> Result<(), String> {
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(input).enumerate() {
        let v = <Value as serde::Deserialize>::deserialize(doc)
            .map_err(|e| format!("{source}: document {}: not YAML: {e}", i + 1))?;
        if !v.is_null() {
            flatten(v, &format!("{source}: document {}", i + 1), into)?;
        }
    }
    Ok(())
}

fn flatten(v: Value, at: &str, into: &mut Vec<Object>) -> Result<(), String> {
    let Some(kind) = v.get("kind").and_then(Value::as_str).map(str::to_owned) else {
        return Err(format!(
            "{at}: not a Kubernetes object (no kind): export with `kubectl get ... -o yaml`"
        ));
    };
    if kind.ends_with("List") {
        let Some(items) = v.get("items").and_then(Value::as_array) else {
            return Err(format!("{at}: a {kind} without items"));
        };
        for (i, item) in items.iter().enumerate() {
            flatten(item.clone(), &format!("{at}, item {}", i + 1), into)?;
        }
        return Ok(());
    }
    let text = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let name = text("/metadata/name");
    if name.is_empty() {
        return Err(format!("{at}: a {kind} without metadata.name"));
    }
    into.push(Object {
        namespace: text("/metadata/namespace"),
        kind,
        name,
        value: v,
    });
    Ok(())
}

/// How much a finding weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Breaks drainshim for some pod, now or at the next restart: exit 1.
    Problem,
    /// What drainshim will meet, or what the export could not tell.
    Info,
}

/// One thing found, about one object.
#[derive(Debug, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// The check's id (`webhook-ca`, `revision`, ...).
    pub check: &'static str,
    /// `kind/namespace/name`.
    pub object: String,
    pub what: String,
    /// What to do; empty for info.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

impl Finding {
    fn problem(check: &'static str, o: &Object, what: String, fix: String) -> Self {
        Finding {
            severity: Severity::Problem,
            check,
            object: o.id(),
            what,
            fix,
        }
    }

    fn info(check: &'static str, object: String, what: String) -> Self {
        Finding {
            severity: Severity::Info,
            check,
            object,
            what,
            fix: String::new(),
        }
    }
}

/// Every finding, and the counts the summary gives.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub objects: usize,
    pub problems: usize,
    pub findings: Vec<Finding>,
}

impl CheckReport {
    pub fn healthy(&self) -> bool {
        self.problems == 0
    }

    /// One line per finding, then the summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let label = match f.severity {
                Severity::Problem => "PROBLEM",
                Severity::Info => "info",
            };
            out.push_str(&format!(
                "{label:<7} {:<13} {}: {}",
                f.check, f.object, f.what
            ));
            if !f.fix.is_empty() {
                out.push_str(&format!(" -> {}", f.fix));
            }
            out.push('\n');
        }
        let verdict = if self.healthy() {
            "healthy"
        } else {
            "fix the problems before opting a namespace in"
        };
        out.push_str(&format!(
            "{} problem(s), {} info, in {} object(s): {verdict}\n",
            self.problems,
            self.findings.len() - self.problems,
            self.objects
        ));
        out
    }
}

/// Runs every check on the export.
pub fn check(objects: &[Object]) -> CheckReport {
    let export = cluster::Export::new(objects);
    let mut findings = Vec::new();
    cluster::webhook_ca(&export, &mut findings);
    cluster::revisions(&export, &mut findings);
    cluster::webhook_images(&export, &mut findings);
    cluster::service_ports(&export, &mut findings);
    cluster::not_injected(&export, &mut findings);
    cluster::versions(&export, &mut findings);
    cluster::limit_ranges(&export, &mut findings);
    istio::mode(&export, &mut findings);
    istio::routing(&export, &mut findings);
    CheckReport {
        objects: objects.len(),
        problems: findings
            .iter()
            .filter(|f| f.severity == Severity::Problem)
            .count(),
        findings,
    }
}
