//! What the Istio mode adds to a pod beside Istio's own injector: the
//! labels and annotations Istio's merge reads, and drainshim's preStop on
//! `istio-proxy` wherever Istio's injector put it (last in `containers`,
//! first with holdApplicationUntilProxyStarts, or a native sidecar in
//! `initContainers`).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::patch::ISTIO_PROXY;
use super::{patch, refuse, set, Marker, PodRefusal, APP_PORT};

/// Istio's per-pod proxy settings, a YAML map of ProxyConfig fields.
const ISTIO_PROXY_CONFIG: &str = "proxy.istio.io/config";
/// Istio's per-pod list of inbound ports its iptables rules leave alone.
const ISTIO_EXCLUDE_INBOUND: &str = "traffic.sidecar.istio.io/excludeInboundPorts";

/// The Istio patch's labels, and the label the routing objects select.
/// (Never `sidecar.istio.io/inject`: whether Istio injects is the mesh
/// admin's to say, and the pod's.)
pub(super) fn istio_labels(
    meta: &mut ObjectMeta,
    patch: &patch::PodPatch,
    port: u16,
    marker: &mut Marker,
) {
    for (k, v) in patch.meta.labels.iter().flatten() {
        set(&mut meta.labels, &mut marker.labels, k, v.clone());
    }
    set(
        &mut meta.labels,
        &mut marker.labels,
        APP_PORT,
        port.to_string(),
    );
}

/// The Istio patch's annotations, merged into the pod's own: the ports Istio
/// must not capture are added to the pod's list, the proxy settings to its
/// ProxyConfig. Istio's injector reads them when it injects (and
/// pilot-agent the ProxyConfig again at its start). `drain`: the drain time
/// of the pod's drain-timer annotations, which Envoy's own drain window
/// (`drainDuration`, pilot-agent's `--drain-time-s`) follows as it follows
/// the shim's in the plain modes: a shim that drains longer than Envoy's
/// listeners stay open would wait on connections Envoy already closed.
pub(super) fn istio_annotations(
    meta: &mut ObjectMeta,
    patch: &patch::PodPatch,
    drain: Option<Duration>,
    marker: &mut Marker,
) -> Result<(), PodRefusal> {
    for (k, v) in patch.meta.annotations.iter().flatten() {
        let v = &match (k.as_str(), drain) {
            (ISTIO_PROXY_CONFIG, Some(d)) => with_drain_duration(v, d)?,
            _ => v.clone(),
        };
        let own = meta.annotations.as_ref().and_then(|a| a.get(k)).cloned();
        let value = match (k.as_str(), own) {
            (ISTIO_EXCLUDE_INBOUND, Some(own)) => {
                let mut ports: Vec<&str> = own
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .collect();
                for p in v.split(',') {
                    if !ports.contains(&p) {
                        ports.push(p);
                    }
                }
                ports.join(",")
            }
            (ISTIO_PROXY_CONFIG, Some(own)) => merge_proxy_config(&own, v)?,
            _ => v.clone(),
        };
        set(&mut meta.annotations, &mut marker.annotations, k, value);
    }
    Ok(())
}

/// The patch's ProxyConfig with `drainDuration` the drain time, in whole
/// seconds up, as `--drain-time-s` is in the plain modes.
fn with_drain_duration(ours: &str, drain: Duration) -> Result<String, PodRefusal> {
    let mut config: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(ours).map_err(|e| {
        PodRefusal(format!(
            "the built-in Istio patch's {ISTIO_PROXY_CONFIG}: {e}"
        ))
    })?;
    config.insert(
        "drainDuration".into(),
        format!("{}s", super::timers::envoy_drain_secs(drain)).into(),
    );
    serde_yaml_ng::to_string(&config).map_err(|e| {
        PodRefusal(format!(
            "the built-in Istio patch's {ISTIO_PROXY_CONFIG}: {e}"
        ))
    })
}

/// The pod's ProxyConfig with the patch's fields set over it.
pub(super) fn merge_proxy_config(own: &str, ours: &str) -> Result<String, PodRefusal> {
    let bad = |e: &dyn std::fmt::Display| {
        PodRefusal(format!(
            "its annotation {ISTIO_PROXY_CONFIG} is not a YAML map of ProxyConfig fields ({e})"
        ))
    };
    // An empty annotation is no fields, not a broken map.
    let mut own: serde_yaml_ng::Mapping = if own.trim().is_empty() {
        serde_yaml_ng::Mapping::new()
    } else {
        serde_yaml_ng::from_str(own).map_err(|e| bad(&e))?
    };
    let ours: serde_yaml_ng::Mapping = serde_yaml_ng::from_str(ours).map_err(|e| {
        PodRefusal(format!(
            "the built-in Istio patch's {ISTIO_PROXY_CONFIG}: {e}"
        ))
    })?;
    own.extend(ours);
    serde_yaml_ng::to_string(&own).map_err(|e| bad(&e))
}

/// istio-proxy gets drainshim's preStop and the binary's mount: the proxy
/// Istio already injected, wherever it is, or else the patch's injection
/// customization, which Istio's injector merges over the proxy it adds (and
/// moves to the init containers when its sidecars are native). The marker
/// records which, and the hook drainshim's replaced.
pub(super) fn istio_proxy(
    spec: &mut PodSpec,
    patch: &patch::PodPatch,
    marker: &mut Marker,
) -> Result<(), PodRefusal> {
    let Some(ours) = patch.spec.containers.iter().find(|c| c.name == ISTIO_PROXY) else {
        return refuse("the built-in Istio patch has no istio-proxy container");
    };
    let runs_to_completion = |c: &Container| c.restart_policy.as_deref() != Some("Always");
    if spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == ISTIO_PROXY && runs_to_completion(c))
    {
        return refuse(
            "istio-proxy is an init container that runs to completion (no restartPolicy: Always), not \
             Istio's native sidecar: it can have no preStop hook",
        );
    }
    let Some(proxy) = istio_proxy_mut(spec) else {
        spec.containers.push(ours.clone());
        marker.proxy_added = true;
        return Ok(());
    };
    let hook = ours.lifecycle.as_ref().and_then(|l| l.pre_stop.clone());
    let lifecycle = proxy.lifecycle.get_or_insert_with(Default::default);
    if lifecycle.pre_stop.as_ref().is_some_and(istios_drain_hook) {
        marker.proxy_pre_stop = lifecycle.pre_stop.take();
    }
    if lifecycle.pre_stop.is_some() && lifecycle.pre_stop != hook {
        return refuse(
            "istio-proxy already has a preStop hook (Istio's global.proxy.lifecycle or the pod's own), which \
             drainshim's (wait for the drain) would replace; remove it, since drainshim's preStop does its job",
        );
    }
    lifecycle.pre_stop = hook;
    let mounts = proxy.volume_mounts.get_or_insert_with(Vec::new);
    for m in ours.volume_mounts.iter().flatten() {
        if !mounts.contains(m) {
            mounts.push(m.clone());
        }
    }
    Ok(())
}

/// Istio's proxy, where its injector put it: among the containers (last, or
/// first when the pod holds the app until the proxy starts), else among the
/// init containers (native sidecars), as Istio's own lookup goes.
pub(super) fn istio_proxy_mut(spec: &mut PodSpec) -> Option<&mut Container> {
    spec.containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
        .find(|c| c.name == ISTIO_PROXY)
}

/// The preStop Istio's template gives a native sidecar proxy: `pilot-agent
/// request --debug-port=<status port> POST drain`, which starts Envoy's drain.
/// drainshim's drives the same drain and waits for its streams, so it takes
/// this one's place (and uninject puts it back).
pub(super) fn istios_drain_hook(hook: &LifecycleHandler) -> bool {
    let command = hook
        .exec
        .as_ref()
        .and_then(|e| e.command.as_deref())
        .unwrap_or_default();
    matches!(command, [agent, request, .., post, drain]
        if agent == "pilot-agent" && request == "request" && post == "POST" && drain == "drain")
}
