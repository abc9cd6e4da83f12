//! What the sidecar Components (`deploy/components/sidecar`, `native-sidecar`)
//! add to a pod, as a transform of one pod: for `drainshim inject`, which
//! rewrites manifests offline (`manifest`), and for `drainshim webhook`, which
//! answers the API server's admission reviews with the same change as a JSON
//! Patch (`webhook`).
//!
//! The pod patch is the Component's own file, embedded at build time
//! (`patch`), so an injected pod and a pod the Component rendered differ only
//! where this module says why: the app keeps its place as the first container,
//! a longer grace period is kept, and the pod carries an annotation that
//! records what was there before, which `--uninject` restores.
//!
//! A pod is refused, never half-injected, when the change would not be safe:
//! no app port to be sure of, a preStop of the app's own that drainshim's would
//! replace, a container, volume or port that drainshim's would collide with.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

pub mod manifest;
mod patch;
pub mod services;
pub mod webhook;

/// Label or annotation on a workload or its pods: `"false"` opts out.
pub const INJECT: &str = "drainshim.io/inject";
/// Pod annotation: the port the app serves on (the Components read it too).
pub const APP_PORT: &str = "drainshim.io/app-port";
/// Pod annotation written by the injection: what it changed, for `--uninject`.
pub const INJECTED: &str = "drainshim.io/injected";

/// The image injected pods run drainshim from, by default: this release.
pub const DEFAULT_IMAGE: &str = concat!("drainshim:", env!("CARGO_PKG_VERSION"));

/// Which Component's pod patch is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// drainshim and a plain Envoy as containers (`deploy/components/sidecar`):
    /// any Kubernetes version.
    Sidecar,
    /// drainshim and Envoy as native sidecars, init containers that keep
    /// running (`deploy/components/native-sidecar`): Kubernetes 1.29 and later.
    NativeSidecar,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::NativeSidecar => "native-sidecar",
        }
    }
}

/// What an injection puts into a pod besides the Component's patch.
#[derive(Clone, Debug)]
pub struct Settings {
    pub mode: Mode,
    /// The drainshim image (the Component's `drainshim`, tagged).
    pub image: String,
    /// Envoy's image; `None` keeps the Component's.
    pub envoy_image: Option<String>,
    /// `inject --services`: point the manifests' Services at Envoy too.
    pub services: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::Sidecar,
            image: DEFAULT_IMAGE.into(),
            envoy_image: None,
            services: false,
        }
    }
}

/// What happened to one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// drainshim added (or re-added: an injected pod is uninjected first).
    Injected { app: String, port: u16 },
    /// Opted out with `drainshim.io/inject: "false"`: not touched.
    OptedOut,
    /// A pod that runs to completion (restartPolicy Never or OnFailure: a
    /// Job's): no long-lived streams, and a classic sidecar would keep it
    /// from ever completing. Not touched.
    RunsToCompletion,
    /// `--uninject`: drainshim's parts removed, what they replaced restored.
    Uninjected,
    /// `--uninject` on a pod with nothing injected: not touched.
    NotInjected,
}

/// What was done to one object, for the summary on stderr.
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    /// `Deployment/orders`.
    pub object: String,
    pub what: String,
}

/// Why a pod cannot be injected (or uninjected) safely; the pod is left as it was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal(why.into()))
}

/// Ports drainshim's containers take in the pod's network namespace (the
/// Component's pod patch): Envoy's inbound listener and admin API, the guard,
/// the shim's control port. The app may not serve on them.
const RESERVED_PORTS: [u16; 4] = [10000, 15000, 15097, 15099];

/// Istio's injected proxy: a pod with it needs the Istio variant.
const ISTIO_PROXY: &str = "istio-proxy";

/// What `--uninject` needs to put the pod back as it was.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Marker {
    mode: Mode,
    /// The app's container, which got the preStop and the binary's mount.
    app: String,
    /// The injection added the app-port annotation (it found the port itself).
    port_added: bool,
    /// The pod's own terminationGracePeriodSeconds (none: the default).
    grace: Option<i64>,
}

/// Adds drainshim to the pod: the Component's patch for `settings.mode`, the
/// app's port from its annotation or its only TCP port. A pod injected before
/// is first put back as it was, so injecting twice gives what injecting once
/// gives, in either mode.
pub fn inject(
    meta: &mut ObjectMeta,
    spec: &mut PodSpec,
    settings: &Settings,
) -> Result<Outcome, Refusal> {
    if opted_out(meta) {
        return Ok(Outcome::OptedOut);
    }
    if matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure")) {
        return Ok(Outcome::RunsToCompletion);
    }
    if spec.host_network == Some(true) {
        return refuse(
            "it uses the node's network (hostNetwork): Envoy and drainshim would take ports 10000, 15000, \
             15097 and 15099 on the node itself",
        );
    }
    let (mut meta2, mut spec2) = (meta.clone(), spec.clone());
    uninject(&mut meta2, &mut spec2)?;
    let patch = patch::pod(settings.mode).map_err(Refusal)?;
    let app = check_fits(&spec2, patch)?;
    let port = app_port(&meta2, &spec2.containers[app])?;
    let grace = spec2.termination_grace_period_seconds;
    let annotations = meta2.annotations.get_or_insert_with(BTreeMap::new);
    let port_added = !annotations.contains_key(APP_PORT);
    annotations.insert(APP_PORT.into(), port.to_string());
    let app_name = spec2.containers[app].name.clone();
    let marker = Marker {
        mode: settings.mode,
        app: app_name.clone(),
        port_added,
        grace,
    };
    let marker = serde_json::to_string(&marker)
        .map_err(|e| Refusal(format!("encoding the {INJECTED} annotation: {e}")))?;
    annotations.insert(INJECTED.into(), marker);

    // The patch's grace period covers its drain; a longer one of the pod's own
    // is kept, and the shim is told (it checks its budget against it).
    let grace = grace.unwrap_or(0).max(patch.grace);
    spec2.termination_grace_period_seconds = Some(grace);
    let ours = |c: &Container| {
        let mut c = c.clone();
        if c.image.as_deref() == Some(patch::DRAINSHIM_IMAGE) {
            c.image = Some(settings.image.clone());
        }
        if let (Some(image), true) = (&settings.envoy_image, c.name == patch::ENVOY) {
            c.image = Some(image.clone());
        }
        for arg in c.args.iter_mut().flatten() {
            if arg.starts_with(patch::GRACE_FLAG) {
                *arg = format!("{}{grace}s", patch::GRACE_FLAG);
            }
        }
        c
    };
    // Init containers in the patch's order, before the pod's own: drainshim
    // and Envoy (native sidecars) are up before the workload's init runs.
    let own_init = spec2.init_containers.take().unwrap_or_default();
    let init: Vec<Container> = patch
        .spec
        .init_containers
        .iter()
        .flatten()
        .map(ours)
        .chain(own_init)
        .collect();
    spec2.init_containers = Some(init);
    // Containers after the pod's own: the app stays first, the one `kubectl
    // logs` and `exec` pick, and the one a later injection finds.
    spec2
        .containers
        .extend(patch.spec.containers.iter().map(ours));
    spec2
        .volumes
        .get_or_insert_with(Vec::new)
        .extend(patch.spec.volumes.iter().flatten().cloned());
    let app = &mut spec2.containers[app];
    app.lifecycle.get_or_insert_with(Default::default).pre_stop = Some(patch.app_pre_stop.clone());
    app.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(patch.app_mount.clone());

    (*meta, *spec) = (meta2, spec2);
    Ok(Outcome::Injected {
        app: app_name,
        port,
    })
}

/// Removes what `inject` added and restores what it replaced. A pod with
/// drainshim's containers but no record of the injection (the Component put
/// them there) is refused: what it had before is not known.
pub fn uninject(meta: &mut ObjectMeta, spec: &mut PodSpec) -> Result<Outcome, Refusal> {
    let names = patch::owned_names().map_err(Refusal)?;
    let Some(raw) = meta.annotations.as_ref().and_then(|a| a.get(INJECTED)) else {
        if let Some(name) = all_containers(spec)
            .map(|c| c.name.as_str())
            .find(|n| names.containers.contains(n))
        {
            return refuse(format!(
                "it has a container named {name:?} but no {INJECTED} annotation: drainshim was not added by \
                 `drainshim inject` (a Component?), so what the pod had before is not known; remove the \
                 Component from its kustomization instead"
            ));
        }
        return Ok(Outcome::NotInjected);
    };
    let marker: Marker = serde_json::from_str(raw).map_err(|e| {
        Refusal(format!(
            "its {INJECTED} annotation is not one drainshim wrote ({e}): {raw:?}"
        ))
    })?;
    let patch = patch::pod(marker.mode).map_err(Refusal)?;
    if !spec.containers.iter().any(|c| c.name == marker.app) {
        return refuse(format!(
            "{INJECTED} names the app container {:?}, which the pod no longer has",
            marker.app
        ));
    }
    spec.containers
        .retain(|c| !names.containers.contains(&c.name.as_str()));
    if let Some(init) = &mut spec.init_containers {
        init.retain(|c| !names.containers.contains(&c.name.as_str()));
        if init.is_empty() {
            spec.init_containers = None;
        }
    }
    if let Some(volumes) = &mut spec.volumes {
        volumes.retain(|v| !names.volumes.contains(&v.name.as_str()));
        if volumes.is_empty() {
            spec.volumes = None;
        }
    }
    spec.termination_grace_period_seconds = marker.grace;
    let app = spec.containers.iter_mut().find(|c| c.name == marker.app);
    if let Some(app) = app {
        if let Some(lifecycle) = &mut app.lifecycle {
            if lifecycle.pre_stop.as_ref() == Some(&patch.app_pre_stop) {
                lifecycle.pre_stop = None;
            }
            if *lifecycle == Default::default() {
                app.lifecycle = None;
            }
        }
        if let Some(mounts) = &mut app.volume_mounts {
            mounts.retain(|m| m != &patch.app_mount);
            if mounts.is_empty() {
                app.volume_mounts = None;
            }
        }
    }
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(INJECTED);
        if marker.port_added {
            annotations.remove(APP_PORT);
        }
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    Ok(Outcome::Uninjected)
}

/// `drainshim.io/inject: "false"` as a label or an annotation.
pub fn opted_out(meta: &ObjectMeta) -> bool {
    let no = |m: &Option<BTreeMap<String, String>>| {
        m.as_ref()
            .and_then(|m| m.get(INJECT))
            .is_some_and(|v| v == "false")
    };
    no(&meta.labels) || no(&meta.annotations)
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// The app's container (the first), once nothing of the pod collides with
/// what the patch adds.
fn check_fits(spec: &PodSpec, patch: &patch::Pod) -> Result<usize, Refusal> {
    let names = patch::owned_names().map_err(Refusal)?;
    for c in all_containers(spec) {
        if c.name == ISTIO_PROXY {
            return refuse(
                "Istio's proxy (istio-proxy) is in the pod: inject and the webhook add a plain Envoy; \
                 beside Istio use deploy/components/sidecar-istio",
            );
        }
        if names.containers.contains(&c.name.as_str()) {
            return refuse(format!(
                "it already has a container named {:?}, the name drainshim's own takes (added by a Component?)",
                c.name
            ));
        }
        for p in c.ports.iter().flatten() {
            if u16::try_from(p.container_port).is_ok_and(|p| RESERVED_PORTS.contains(&p)) {
                return refuse(format!(
                    "container {:?} declares port {}, which drainshim's containers take ({RESERVED_PORTS:?})",
                    c.name, p.container_port
                ));
            }
        }
    }
    if let Some(v) = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| names.volumes.contains(&v.name.as_str()))
    {
        return refuse(format!(
            "it already has a volume named {:?}, the name drainshim's takes",
            v.name
        ));
    }
    let Some(app) = spec.containers.first() else {
        return refuse("it has no containers");
    };
    if let Some(hook) = app.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        if hook != &patch.app_pre_stop {
            return refuse(format!(
                "the app's container {:?} (the first) has a preStop hook of its own, which drainshim's \
                 (hold the app up until the drain ends) would replace; move that hook's work into the app's \
                 SIGTERM handling, or opt the workload out with {INJECT}: \"false\"",
                app.name
            ));
        }
    }
    Ok(0)
}

/// The port the app serves on: the pod's `drainshim.io/app-port` annotation,
/// else the app container's one TCP port. Refused when that is not one port.
fn app_port(meta: &ObjectMeta, app: &Container) -> Result<u16, Refusal> {
    let port = if let Some(v) = meta.annotations.as_ref().and_then(|a| a.get(APP_PORT)) {
        match v.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return refuse(format!(
                    "its annotation {APP_PORT}: {v:?} is not a port (1-65535)"
                ))
            }
        }
    } else {
        let tcp: Vec<_> = app
            .ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().is_none_or(|p| p == "TCP"))
            .collect();
        let named = |ps: &[&k8s_openapi::api::core::v1::ContainerPort]| {
            ps.iter()
                .map(|p| match &p.name {
                    Some(n) => format!("{n} {}", p.container_port),
                    None => p.container_port.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match tcp.as_slice() {
            [one] => match u16::try_from(one.container_port) {
                Ok(p) if p > 0 => p,
                _ => return refuse(format!("container {:?} declares port {}, not a port", app.name, one.container_port)),
            },
            [] => {
                return refuse(format!(
                    "the app's container {:?} (the first) declares no TCP port: say which port the app \
                     serves on with the pod annotation {APP_PORT}",
                    app.name
                ))
            }
            many => {
                return refuse(format!(
                    "the app's container {:?} (the first) declares {} TCP ports ({}): which one the guard \
                     should forward to is ambiguous; set the pod annotation {APP_PORT}",
                    app.name,
                    many.len(),
                    named(many)
                ))
            }
        }
    };
    if RESERVED_PORTS.contains(&port) {
        return refuse(format!(
            "the app's port {port} is one drainshim's containers take ({RESERVED_PORTS:?})"
        ));
    }
    Ok(port)
}

#[cfg(test)]
mod tests;
