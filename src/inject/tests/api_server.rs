//! The API server's validation of a pod's spec (Kubernetes
//! `pkg/apis/core/validation`, ValidatePodSpec), in the rules a chain of
//! mutating webhooks can break: what it answers 422 to, so a pod the test
//! ends with is one that would be created.

use std::collections::BTreeSet;

use serde_json::Value;

/// Why the API server would refuse the pod (`{metadata, spec}`); empty when it accepts it.
pub fn refusals(pod: &Value) -> Vec<String> {
    let spec = &pod["spec"];
    let mut out = Vec::new();
    let volumes: Vec<&str> = items(&spec["volumes"])
        .filter_map(|v| v["name"].as_str())
        .collect();
    if volumes.iter().collect::<BTreeSet<_>>().len() != volumes.len() {
        out.push(format!("spec.volumes: Duplicate value: {volumes:?}"));
    }
    let mut names = BTreeSet::new();
    let init = items(&spec["initContainers"]).map(|c| (c, true));
    for (c, is_init) in init.chain(items(&spec["containers"]).map(|c| (c, false))) {
        let name = c["name"].as_str().unwrap_or_default();
        let at = format!(
            "spec.{}[{name}]",
            if is_init {
                "initContainers"
            } else {
                "containers"
            }
        );
        // Names are unique across containers and init containers.
        if !names.insert(name) {
            out.push(format!("{at}.name: Duplicate value: {name:?}"));
        }
        if c["image"].as_str().is_none_or(str::is_empty) {
            out.push(format!("{at}.image: Required value"));
        }
        let restartable = is_init && c["restartPolicy"] == "Always";
        if !c["restartPolicy"].is_null() && !restartable {
            out.push(format!(
                "{at}.restartPolicy: Forbidden: only Always, on init containers"
            ));
        }
        for field in [
            "lifecycle",
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
        ] {
            if is_init && !restartable && !c[field].is_null() {
                out.push(format!(
                    "{at}.{field}: Forbidden: may not be set for init containers without restartPolicy=Always"
                ));
            }
        }
        for hook in ["preStop", "postStart"] {
            let handler = &c["lifecycle"][hook];
            let kinds = ["exec", "httpGet", "tcpSocket", "sleep"]
                .iter()
                .filter(|k| !handler[**k].is_null())
                .count();
            if !handler.is_null() && kinds != 1 {
                out.push(format!(
                    "{at}.lifecycle.{hook}: must specify exactly one handler type"
                ));
            }
        }
        let mut paths = BTreeSet::new();
        for m in items(&c["volumeMounts"]) {
            let (volume, path) = (
                m["name"].as_str().unwrap_or_default(),
                m["mountPath"].as_str().unwrap_or_default(),
            );
            if !volumes.contains(&volume) {
                out.push(format!("{at}.volumeMounts.name: Not found: {volume:?}"));
            }
            if !paths.insert(path) {
                out.push(format!(
                    "{at}.volumeMounts.mountPath: Invalid value: {path:?}: must be unique"
                ));
            }
        }
        let mut ports = BTreeSet::new();
        for p in items(&c["ports"]) {
            if let Some(n) = p["name"].as_str() {
                if !ports.insert(n) {
                    out.push(format!("{at}.ports.name: Duplicate value: {n:?}"));
                }
            }
        }
    }
    out
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list.as_array().into_iter().flatten()
}
