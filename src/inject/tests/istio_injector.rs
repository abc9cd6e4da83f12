//! Istio's sidecar injector (istio/istio `pkg/kube/inject`), emulated for the
//! Istio mode's tests: the parts of its merge that decide where drainshim's
//! parts land and what the pod the API server gets looks like. Read from
//! `inject.go` (RunTemplate, stripPod), `webhook.go` (injectPod,
//! reapplyOverwrittenContainers, postProcessPod, reorderPod) and the sidecar
//! template (`injection-template.yaml`); written here, not copied.
//!
//! What it does, in Istio's order:
//! 1. Renders the template: `istio-init` (its iptables rules leave alone the
//!    ports of the pod's `excludeInboundPorts`, read now), and `istio-proxy`
//!    (port 15090, probes on 15021) in `containers`, or with native sidecars
//!    in `initContainers` with `restartPolicy: Always` and a preStop that
//!    starts Envoy's drain; with `holdApplicationUntilProxyStarts` (classic
//!    sidecars only) a postStart that waits for the proxy instead.
//! 2. With native sidecars, moves a customization the pod has in `containers`
//!    (drainshim's `istio-proxy`, image `auto`) to the end of
//!    `initContainers`, then merges the template over the pod (a strategic
//!    merge: containers and volumes by name, mounts by path, ports by number).
//! 3. Merges the customization over that again (`image: auto` keeps Istio's
//!    image) and records it in `sidecar.istio.io/proxyOverrides`.
//! 4. Writes `sidecar.istio.io/status` and the Prometheus annotations.
//! 5. Reorders: `istio-proxy` last, or first when the pod's ProxyConfig holds
//!    the app until the proxy starts; native: `istio-init`, `istio-proxy`,
//!    then the other init containers; classic: `istio-init` last.
//!
//! Left out, as nothing here depends on them: the proxy's environment, probe
//! rewriting, CNI, re-injection of a pod it injected before (its webhook's
//! `reinvocationPolicy` is `Never` by default, so it is not called again).

use serde_json::{json, Map, Value};

pub const PROXY: &str = "istio-proxy";
pub const INIT: &str = "istio-init";
pub const IMAGE: &str = "docker.io/istio/proxyv2:1.28.0";
/// pilot-agent's status port: Prometheus merge and the drain request.
pub const STATUS_PORT: u16 = 15020;

/// How the mesh injects.
#[derive(Clone, Copy, Debug)]
pub struct Mesh {
    /// Native sidecars: Istio's default from 1.27 on clusters that have them.
    pub native: bool,
}

/// Istio's injection of one pod (`{metadata, spec}`).
pub fn inject(pod: &Value, mesh: Mesh) -> Value {
    let template = template(pod, mesh);
    let mut merged = pod.clone();
    if mesh.native {
        if let Some(custom) = take(&mut merged["spec"]["containers"], PROXY) {
            list(&mut merged["spec"], "initContainers").push(custom);
        }
    }
    merge(&mut merged, &template);

    // The pod's own istio-proxy (a customization) over the rendered one.
    let mut overrides = Map::new();
    for field in ["containers", "initContainers"] {
        for c in template["spec"][field].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or_default();
            let Some(own) = find(&pod["spec"]["containers"], name)
                .or_else(|| find(&pod["spec"]["initContainers"], name))
            else {
                continue;
            };
            let mut overlay = own.clone();
            if let (Some(o), true) = (overlay.as_object_mut(), own["image"] == "auto") {
                o.remove("image");
            }
            merge(&mut merged["spec"], &json!({ (field): [overlay.clone()] }));
            if let Some(recorded) = overrides.entry(field).or_insert(json!([])).as_array_mut() {
                recorded.push(overlay);
            }
        }
    }
    let annotations = object(&mut merged["metadata"], "annotations");
    if !overrides.is_empty() {
        annotations.insert(
            "sidecar.istio.io/proxyOverrides".into(),
            Value::Object(overrides).to_string().into(),
        );
    }
    let names = |field: &str| {
        let n: Vec<&Value> = template["spec"][field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| &c["name"])
            .collect();
        if n.is_empty() {
            Value::Null
        } else {
            json!(n)
        }
    };
    let status = json!({
        "initContainers": names("initContainers"),
        "containers": names("containers"),
        "volumes": names("volumes"),
        "imagePullSecrets": null,
        "revision": "default",
    });
    annotations.insert("sidecar.istio.io/status".into(), status.to_string().into());
    for (k, v) in [
        ("prometheus.io/port", STATUS_PORT.to_string()),
        ("prometheus.io/path", "/stats/prometheus".into()),
        ("prometheus.io/scrape", "true".into()),
    ] {
        annotations.insert(k.into(), v.into());
    }

    // reorderPod: where the proxy goes is read from the pod as it came in.
    let spec = &mut merged["spec"];
    let proxy = take(&mut spec["containers"], PROXY);
    if let Some(proxy) = proxy {
        let containers = list(spec, "containers");
        if holds_app(pod) {
            containers.insert(0, proxy);
        } else {
            containers.push(proxy);
        }
    }
    let native_proxy = take(&mut spec["initContainers"], PROXY);
    let init = take(&mut spec["initContainers"], INIT);
    let containers = list(spec, "initContainers");
    if let Some(proxy) = native_proxy {
        containers.insert(0, proxy);
        containers.splice(0..0, init);
    } else {
        containers.extend(init);
    }
    merged
}

/// The sidecar template, rendered for `pod`.
fn template(pod: &Value, mesh: Mesh) -> Value {
    let meta = &pod["metadata"];
    let annotation = |k: &str| meta["annotations"][k].as_str();
    let app = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap_or_default())
        .find(|n| *n != PROXY)
        .unwrap_or_default();
    let mut proxy = json!({
        "name": PROXY,
        "image": IMAGE,
        "args": ["proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"],
        "ports": [{"containerPort": 15090, "protocol": "TCP", "name": "http-envoy-prom"}],
        "readinessProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 15},
        "startupProbe": {"httpGet": {"path": "/healthz/ready", "port": 15021}, "periodSeconds": 1},
        "volumeMounts": [
            {"name": "istio-envoy", "mountPath": "/etc/istio/proxy"},
            {"name": "istio-podinfo", "mountPath": "/etc/istio/pod"},
        ],
    });
    if mesh.native {
        proxy["restartPolicy"] = "Always".into();
        proxy["lifecycle"] = json!({"preStop": {"exec": {"command": [
            "pilot-agent", "request", format!("--debug-port={STATUS_PORT}"), "POST", "drain"
        ]}}});
    } else if holds_app(pod) {
        proxy["lifecycle"] = json!({"postStart": {"exec": {"command": ["pilot-agent", "wait"]}}});
    }
    let excluded = exclude_inbound_port(
        annotation("traffic.sidecar.istio.io/excludeInboundPorts").unwrap_or_default(),
    );
    let init = json!({
        "name": INIT,
        "image": IMAGE,
        "args": ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT",
                 "-i", "*", "-x", "", "-b", "*", "-d", format!("15090,15021,{excluded}")],
        "securityContext": {"capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}, "runAsUser": 0},
    });
    let mut annotations = json!({"istio.io/rev": "default"});
    for k in [
        "kubectl.kubernetes.io/default-logs-container",
        "kubectl.kubernetes.io/default-container",
    ] {
        if annotation(k).is_none() {
            annotations[k] = app.into();
        }
    }
    let (init_containers, containers) = if mesh.native {
        (json!([init, proxy]), json!([]))
    } else {
        (json!([init]), json!([proxy]))
    };
    json!({
        "metadata": {
            "labels": {
                "security.istio.io/tlsMode": "istio",
                "service.istio.io/canonical-name": meta["labels"]["app"].as_str().unwrap_or(app),
                "service.istio.io/canonical-revision": "latest",
            },
            "annotations": annotations,
        },
        "spec": {
            "initContainers": init_containers,
            "containers": containers,
            "volumes": [
                {"name": "istio-envoy", "emptyDir": {"medium": "Memory"}},
                {"name": "istio-podinfo", "downwardAPI": {"items": [
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                ]}},
            ],
        },
    })
}

/// The pod's ProxyConfig (`proxy.istio.io/config`) holds the app until the
/// proxy is up.
fn holds_app(pod: &Value) -> bool {
    pod["metadata"]["annotations"]["proxy.istio.io/config"]
        .as_str()
        .and_then(|c| serde_yaml_ng::from_str::<Value>(c).ok())
        .is_some_and(|c| c["holdApplicationUntilProxyStarts"] == true)
}

/// The template's `excludeInboundPort`: the status port added to the pod's list.
fn exclude_inbound_port(own: &str) -> String {
    let status = STATUS_PORT.to_string();
    let mut ports: Vec<&str> = own
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if !ports.contains(&status.as_str()) {
        ports.push(&status);
    }
    ports.join(",")
}

/// The key a strategic merge matches list items by, for the lists of a pod it merges.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers" | "initContainers" | "volumes" | "env" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "ports" => Some("containerPort"),
        _ => None,
    }
}

/// A strategic merge patch of `patch` over `into`: maps field by field, keyed
/// lists item by item (a new item goes last), anything else replaced.
pub fn merge(into: &mut Value, patch: &Value) {
    let (Value::Object(into), Value::Object(patch)) = (&mut *into, patch) else {
        *into = patch.clone();
        return;
    };
    for (k, v) in patch {
        match (into.get_mut(k), merge_key(k), v.as_array()) {
            (Some(Value::Array(items)), Some(key), Some(new)) => {
                for item in new {
                    match items.iter_mut().find(|i| i[key] == item[key]) {
                        Some(i) => merge(i, item),
                        None => items.push(item.clone()),
                    }
                }
            }
            (Some(slot), _, _) => merge(slot, v),
            (None, _, _) => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

fn find<'a>(containers: &'a Value, name: &str) -> Option<&'a Value> {
    containers.as_array()?.iter().find(|c| c["name"] == name)
}

/// Removes the container `name` from a list, if there.
fn take(containers: &mut Value, name: &str) -> Option<Value> {
    let list = containers.as_array_mut()?;
    let i = list.iter().position(|c| c["name"] == name)?;
    Some(list.remove(i))
}

fn list<'a>(parent: &'a mut Value, field: &str) -> &'a mut Vec<Value> {
    if !parent[field].is_array() {
        parent[field] = json!([]);
    }
    parent[field].as_array_mut().expect("an array")
}

fn object<'a>(parent: &'a mut Value, field: &str) -> &'a mut Map<String, Value> {
    if !parent[field].is_object() {
        parent[field] = json!({});
    }
    parent[field].as_object_mut().expect("an object")
}
