//! What the sidecar Components (`deploy/components/sidecar`, `native-sidecar`)
//! add to a pod, as a transform of one pod: for `drainshim inject`, which
//! rewrites manifests offline (`manifest`), and for `drainshim webhook`, which
//! answers the API server's admission reviews with the same change as a JSON
//! Patch (`webhook`).
//!
//! The pod patch is the Component's own file, embedded at build time
//! (`patch`), so an injected pod and a pod the Component rendered differ only
//! where this module says why: the app keeps its place (the first container,
//! Istio's proxy aside), a longer grace period is kept, and the pod carries an
//! annotation that records what was there before, which `--uninject` restores.
//!
//! Under Istio the proxy is where Istio's injector put it: last among the
//! containers, first when the pod holds the app until the proxy starts, or an
//! init container that keeps running (`restartPolicy: Always`: native
//! sidecars, Istio's default from 1.27 where the cluster has them).
//!
//! A pod is refused, never half-injected, when the change would not be safe:
//! no app port to be sure of, a preStop of the app's own that drainshim's would
//! replace, a container, volume or port that drainshim's would collide with.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, PodSpec, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

mod certificate;
mod istio;
pub mod manifest;
pub mod mesh;
mod owned;
mod patch;
pub mod ports;
pub mod resources;
pub mod routing;
pub mod services;
pub mod timers;
pub mod webhook;

/// Label or annotation on a workload or its pods: `"false"` opts out.
pub const INJECT: &str = "drainshim.io/inject";
/// Pod annotation: the port the app serves on (the Components read it too).
/// Under Istio also a pod label, which the routing objects select on.
pub const APP_PORT: &str = "drainshim.io/app-port";
/// Pod annotation written by the injection: what it changed, for `--uninject`.
pub const INJECTED: &str = "drainshim.io/injected";
/// Namespace label: which revision of the webhook serves it, by its name
/// (deploy/webhook/canary) or a tag that points at one (deploy/webhook/tags).
pub const REV: &str = "drainshim.io/rev";
/// Values of `INJECT` on a namespace that opt it out, whatever its `REV`.
pub const OPTED_OUT: [&str; 2] = ["disabled", "false"];
/// Pod annotation written by the webhook: the revision that injected it.
pub const REVISION: &str = "drainshim.io/revision";
/// Pod annotation written by every injection: the release of drainshim that
/// injected it, which is the release it runs (a revision injects its own).
pub const VERSION: &str = "drainshim.io/version";
/// This release, as `VERSION` records it.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");
/// The value of `INJECT` on a namespace that the default revision serves.
pub const ENABLED: &str = "enabled";
/// The revision that serves namespaces labelled `INJECT=enabled` without `REV`.
pub const DEFAULT_REVISION: &str = "default";
/// Namespaces no webhook of deploy/webhook ever serves (its namespaceSelector).
pub const NEVER_SERVED: [&str; 2] = ["kube-system", "drainshim-system"];

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
    /// drainshim beside Istio's injected proxy (`deploy/components/sidecar-istio`):
    /// istio-proxy gets the preStop, the pod the label and annotations Istio's
    /// injector reads; the routing through the guard comes from the mesh-wide
    /// objects of `drainshim istio-routing`, selected by the pod label
    /// `drainshim.io/app-port`.
    Istio,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sidecar => "sidecar",
            Mode::NativeSidecar => "native-sidecar",
            Mode::Istio => "istio",
        }
    }
}

/// What an injection puts into a pod besides the Component's patch.
#[derive(Clone, Debug)]
pub struct InjectOptions {
    pub mode: Mode,
    /// The drainshim image (the Component's `drainshim`, tagged).
    pub image: String,
    /// Envoy's image; `None` keeps the Component's.
    pub envoy_image: Option<String>,
    /// `inject --services`: point the manifests' Services at Envoy too.
    pub services: bool,
    /// The webhook's Istio mode: a pod Istio's injector has not reached yet
    /// gets only what that injector reads (its annotations), and the rest on
    /// the API server's call after Istio's (reinvocation). A pod Istio does
    /// not inject (the mesh's neverInjectSelector, `policy: disabled`) is
    /// then left whole, never given a proxy customization no one merges.
    pub await_istio: bool,
    /// The webhook's revision (`--revision`), recorded on each pod it injects
    /// (`REVISION`); `None` for `drainshim inject`.
    pub revision: Option<String>,
}

impl Default for InjectOptions {
    fn default() -> Self {
        InjectOptions {
            mode: Mode::Sidecar,
            image: DEFAULT_IMAGE.into(),
            envoy_image: None,
            services: false,
            await_istio: false,
            revision: None,
        }
    }
}

/// What happened to one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodChange {
    /// drainshim added (or re-added: an injected pod is uninjected first),
    /// with what the adopter should know (an app port without a name).
    Injected {
        app: String,
        port: u16,
        warnings: Vec<String>,
    },
    /// The Istio mode on a pod without Istio's proxy yet (`await_istio`):
    /// Istio's settings only, the rest once Istio has injected.
    AwaitingIstio { app: String, port: u16 },
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
pub struct PodRefusal(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, PodRefusal> {
    Err(PodRefusal(why.into()))
}

/// Ports drainshim's containers take in the pod's network namespace (the
/// Component's pod patch): Envoy's inbound listener and admin API, the guard,
/// the shim's control port. The app may not serve on them.
pub(crate) const RESERVED_PORTS: [u16; 4] = [10000, 15000, 15097, 15099];

use istio::{istio_annotations, istio_labels, istio_proxy, istio_proxy_mut};
use patch::ISTIO_PROXY;

/// Istio's per-pod switch for its injector (label or annotation).
pub(crate) const ISTIO_INJECT: &str = "sidecar.istio.io/inject";

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
    /// Labels and annotations the injection set, each with its value before
    /// (none: absent): Istio's in the Istio mode, and drainshim's revision
    /// and version in every mode.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, Option<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, Option<String>>,
    /// The injection added istio-proxy as an injection customization (Istio
    /// not yet run on the pod), rather than changing the injected proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    proxy_added: bool,
    /// istio-proxy's preStop that drainshim's replaced: Istio's own drain
    /// hook, which its native sidecars get.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    proxy_pre_stop: Option<LifecycleHandler>,
    /// The app's port name, given to Envoy's inbound port (the plain modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    port_name: Option<ports::Moved>,
    /// The Istio mode before Istio's injection: only Istio's annotations
    /// were set (`InjectOptions::await_istio`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    awaiting_proxy: bool,
    /// What drainshim wrote in its containers, field by field (`owned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrote: Option<owned::Record>,
}

/// Adds drainshim to the pod: the Component's patch for `settings.mode`, the
/// app's port from its annotation or its only TCP port. A pod injected before
/// is first put back as it was, so injecting twice gives what injecting once
/// gives, in either mode.
pub fn inject(
    meta: &mut ObjectMeta,
    spec: &mut PodSpec,
    settings: &InjectOptions,
) -> Result<PodChange, PodRefusal> {
    if opted_out(meta) {
        return Ok(PodChange::OptedOut);
    }
    if matches!(spec.restart_policy.as_deref(), Some("Never" | "OnFailure")) {
        return Ok(PodChange::RunsToCompletion);
    }
    if spec.host_network == Some(true) {
        return refuse(
            "it uses the node's network (hostNetwork): Envoy and drainshim would take ports 10000, 15000, \
             15097 and 15099 on the node itself",
        );
    }
    // drainshim's containers as they are: a later webhook's changes to them
    // stay, and so does a grace period other than the one drainshim set.
    let old = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(INJECTED))
        .and_then(|raw| serde_json::from_str::<Marker>(raw).ok());
    let names = patch::owned_names().map_err(PodRefusal)?;
    let before = owned::Before::new(
        all_containers(spec).filter(|c| names.containers.contains(&c.name.as_str())),
        old.as_ref().and_then(|m| m.wrote.clone()),
    );
    let grace_changed = old.as_ref().is_some_and(|m| {
        let set = match patch::pod(m.mode) {
            Ok(p) if !m.awaiting_proxy => Some(m.grace.unwrap_or(0).max(p.grace)),
            _ => m.grace,
        };
        spec.termination_grace_period_seconds != set
    });
    let (mut meta2, mut spec2) = (meta.clone(), spec.clone());
    uninject(&mut meta2, &mut spec2)?;
    if grace_changed {
        spec2.termination_grace_period_seconds = spec.termination_grace_period_seconds;
    }
    let patch = patch::pod(settings.mode).map_err(PodRefusal)?;
    let app = check_fits(&meta2, &spec2, patch, settings.mode)?;
    let port = app_port(&meta2, &spec2.containers[app])?;
    let limits = resources::ResourceLimits::read(&meta2, patch)?;
    // Checked against the grace period the pod gets below.
    let drain_timers = timers::AnnotatedTimers::read(
        &meta2,
        spec2
            .termination_grace_period_seconds
            .unwrap_or(0)
            .max(patch.grace),
    )?;
    let app_name = spec2.containers[app].name.clone();
    let mut marker = Marker {
        mode: settings.mode,
        app: app_name.clone(),
        port_added: false,
        grace: spec2.termination_grace_period_seconds,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        proxy_added: false,
        proxy_pre_stop: None,
        port_name: None,
        awaiting_proxy: false,
        wrote: None,
    };
    if settings.mode == Mode::Istio && settings.await_istio && istio_proxy_mut(&mut spec2).is_none()
    {
        // Only what Istio's injector reads when it injects; the rest on the
        // call after it. If it does not inject, nothing calls again, and
        // these annotations are all the pod has of drainshim's.
        marker.awaiting_proxy = true;
        istio_annotations(&mut meta2, patch, drain_timers.drain_time(), &mut marker)?;
        write_marker(&mut meta2, &marker)?;
        (*meta, *spec) = (meta2, spec2);
        return Ok(PodChange::AwaitingIstio {
            app: app_name,
            port,
        });
    }
    let mut warnings = Vec::new();
    if settings.mode != Mode::Istio {
        marker.port_name = ports::take_app_name(&mut spec2, app, port)?;
        if marker.port_name.is_none() {
            warnings.push(ports::unnamed_warning(&app_name, port));
        }
    }
    marker.port_added = meta2
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(APP_PORT.into(), port.to_string())
        .is_none();
    if settings.mode == Mode::Istio {
        istio_labels(&mut meta2, patch, port, &mut marker);
        istio_annotations(&mut meta2, patch, drain_timers.drain_time(), &mut marker)?;
    }
    // Which drainshim the pod runs, for a platform team's version spread
    // (`drainshim check`, versions).
    set(
        &mut meta2.annotations,
        &mut marker.annotations,
        VERSION,
        RELEASE.into(),
    );
    if let Some(revision) = &settings.revision {
        set(
            &mut meta2.annotations,
            &mut marker.annotations,
            REVISION,
            revision.clone(),
        );
    }

    // The patch's grace period covers its drain; a longer one of the pod's own
    // is kept, and the shim is told (it checks its budget against it).
    let grace = marker.grace.unwrap_or(0).max(patch.grace);
    spec2.termination_grace_period_seconds = Some(grace);
    let mut record = owned::Record::new();
    let mut ours = |c: &Container| {
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
        if c.name == patch::ENVOY {
            ports::name_envoy_port(&mut c, marker.port_name.as_ref());
        }
        limits.apply(&mut c);
        drain_timers.apply(&mut c);
        before.merge(c, &mut record)
    };
    // Init containers in the patch's order, before the pod's own: drainshim
    // and Envoy (native sidecars) are up before the workload's init runs.
    let own_init = spec2.init_containers.take().unwrap_or_default();
    let init: Vec<Container> = patch
        .spec
        .init_containers
        .iter()
        .flatten()
        .map(&mut ours)
        .chain(own_init)
        .collect();
    spec2.init_containers = Some(init);
    // Containers after the pod's own: the app keeps its place, the first
    // (Istio's proxy aside), the one `kubectl logs` and `exec` pick, and the
    // one a later injection finds.
    spec2.containers.extend(
        patch
            .spec
            .containers
            .iter()
            .filter(|c| c.name != ISTIO_PROXY)
            .map(&mut ours),
    );
    marker.wrote = Some(record);
    spec2
        .volumes
        .get_or_insert_with(Vec::new)
        .extend(patch.spec.volumes.iter().flatten().cloned());
    let app = &mut spec2.containers[app];
    app.lifecycle.get_or_insert_with(Default::default).pre_stop = Some(patch.app_pre_stop.clone());
    app.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(patch.app_mount.clone());
    if settings.mode == Mode::Istio {
        istio_proxy(&mut spec2, patch, &mut marker)?;
    }
    write_marker(&mut meta2, &marker)?;

    (*meta, *spec) = (meta2, spec2);
    Ok(PodChange::Injected {
        app: app_name,
        port,
        warnings,
    })
}

fn write_marker(meta: &mut ObjectMeta, marker: &Marker) -> Result<(), PodRefusal> {
    let marker = serde_json::to_string(marker)
        .map_err(|e| PodRefusal(format!("encoding the {INJECTED} annotation: {e}")))?;
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(INJECTED.into(), marker);
    Ok(())
}

/// Removes what `inject` added and restores what it replaced. A pod with
/// drainshim's containers but no record of the injection (the Component put
/// them there) is refused: what it had before is not known.
pub fn uninject(meta: &mut ObjectMeta, spec: &mut PodSpec) -> Result<PodChange, PodRefusal> {
    let names = patch::owned_names().map_err(PodRefusal)?;
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
        return Ok(PodChange::NotInjected);
    };
    let marker: Marker = serde_json::from_str(raw).map_err(|e| {
        PodRefusal(format!(
            "its {INJECTED} annotation is not one drainshim wrote ({e}): {raw:?}"
        ))
    })?;
    let patch = patch::pod(marker.mode).map_err(PodRefusal)?;
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
    if !marker.awaiting_proxy {
        spec.termination_grace_period_seconds = marker.grace;
    }
    if let Some(app) = spec.containers.iter_mut().find(|c| c.name == marker.app) {
        take_hook(app, &patch.app_pre_stop, &patch.app_mount);
        if let Some(moved) = &marker.port_name {
            ports::give_back(app, moved);
        }
    }
    if let (Mode::Istio, Some(ours)) = (
        marker.mode,
        patch.spec.containers.iter().find(|c| c.name == ISTIO_PROXY),
    ) {
        let customization = spec
            .containers
            .iter()
            .position(|c| c.name == ISTIO_PROXY && c.image == ours.image)
            .filter(|_| marker.proxy_added);
        if let Some(i) = customization {
            // The customization it added, not yet merged by Istio's injector, goes.
            spec.containers.remove(i);
        } else if let (Some(proxy), Some(hook), Some(mount)) = (
            istio_proxy_mut(spec),
            ours.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()),
            ours.volume_mounts.iter().flatten().next(),
        ) {
            // A proxy Istio injected stays, without drainshim's parts, with
            // the hook they replaced.
            take_hook(proxy, hook, mount);
            if let Some(before) = marker.proxy_pre_stop {
                proxy
                    .lifecycle
                    .get_or_insert_with(Default::default)
                    .pre_stop = Some(before);
            }
        }
    }
    restore(&mut meta.labels, &marker.labels);
    restore(&mut meta.annotations, &marker.annotations);
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(INJECTED);
        if marker.port_added {
            annotations.remove(APP_PORT);
        }
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    Ok(PodChange::Uninjected)
}

/// Removes a preStop and a mount drainshim gave a container (if still its own).
fn take_hook(c: &mut Container, hook: &LifecycleHandler, mount: &VolumeMount) {
    if let Some(lifecycle) = &mut c.lifecycle {
        if lifecycle.pre_stop.as_ref() == Some(hook) {
            lifecycle.pre_stop = None;
        }
        if *lifecycle == Default::default() {
            c.lifecycle = None;
        }
    }
    if let Some(mounts) = &mut c.volume_mounts {
        mounts.retain(|m| m != mount);
        if mounts.is_empty() {
            c.volume_mounts = None;
        }
    }
}

/// Puts back the values the marker recorded (removing what was absent).
fn restore(map: &mut Option<BTreeMap<String, String>>, before: &BTreeMap<String, Option<String>>) {
    if before.is_empty() {
        return;
    }
    let m = map.get_or_insert_with(BTreeMap::new);
    for (k, v) in before {
        match v {
            Some(v) => m.insert(k.clone(), v.clone()),
            None => m.remove(k),
        };
    }
    if m.is_empty() {
        *map = None;
    }
}

/// Sets one label or annotation, recording its value before (the first time).
fn set(
    map: &mut Option<BTreeMap<String, String>>,
    record: &mut BTreeMap<String, Option<String>>,
    key: &str,
    value: String,
) {
    let m = map.get_or_insert_with(BTreeMap::new);
    let before = m.insert(key.to_owned(), value);
    record.entry(key.to_owned()).or_insert(before);
}

/// `drainshim.io/inject: "false"` (or `disabled`, any case) as a label or an
/// annotation: the values that opt a namespace out opt a pod out too.
pub fn opted_out(meta: &ObjectMeta) -> bool {
    [&meta.labels, &meta.annotations]
        .into_iter()
        .flatten()
        .filter_map(|m| m.get(INJECT))
        .any(|v| OPTED_OUT.contains(&v.to_ascii_lowercase().as_str()))
}

/// A label or an annotation `key` with the value `value`.
fn says(meta: &ObjectMeta, key: &str, value: &str) -> bool {
    [&meta.labels, &meta.annotations]
        .into_iter()
        .flatten()
        .any(|m| m.get(key).is_some_and(|v| v == value))
}

pub(crate) fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// The app's container (the first but Istio's proxy), once nothing of the pod
/// collides with what the patch adds.
fn check_fits(
    meta: &ObjectMeta,
    spec: &PodSpec,
    patch: &patch::PodPatch,
    mode: Mode,
) -> Result<usize, PodRefusal> {
    let names = patch::owned_names().map_err(PodRefusal)?;
    // drainshim's containers are Linux containers that must not run as root
    // (runAsNonRoot, without a runAsUser of their own): on a Windows pod the
    // API server refuses their Linux security fields, and under a pod-wide
    // runAsUser 0 the kubelet refuses to start them, the app with them.
    if spec.os.as_ref().is_some_and(|os| os.name != "linux") {
        return refuse(
            "it is not a Linux pod (spec.os.name), and drainshim's containers are Linux containers",
        );
    }
    if spec.security_context.as_ref().and_then(|s| s.run_as_user) == Some(0) {
        return refuse(
            "it runs as root (spec.securityContext.runAsUser: 0), which drainshim's containers would \
             inherit, and they must not run as root (runAsNonRoot): the kubelet would not start them, nor \
             the app after them; set runAsUser on the app's container instead of the pod",
        );
    }
    if mode == Mode::Istio && says(meta, ISTIO_INJECT, "false") {
        return refuse(format!(
            "it opts out of Istio's injection ({ISTIO_INJECT}: \"false\"), and the Istio mode adds \
             drainshim beside Istio's proxy"
        ));
    }
    for c in all_containers(spec) {
        if c.name == ISTIO_PROXY && mode != Mode::Istio {
            return refuse(
                "Istio's proxy (istio-proxy) is in the pod: this mode adds a plain Envoy, whose admin port is \
                 istio-proxy's; inject it with --mode istio",
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
    // Istio's proxy is first when the pod holds the app until it starts.
    let Some(i) = spec.containers.iter().position(|c| c.name != ISTIO_PROXY) else {
        return refuse("it has no containers besides Istio's proxy");
    };
    let app = &spec.containers[i];
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
    Ok(i)
}

/// The port a pod's app serves on, as the injection finds it: the app is the
/// first container but Istio's proxy (see `app_port`).
pub fn pod_app_port(meta: &ObjectMeta, spec: &PodSpec) -> Result<u16, PodRefusal> {
    match spec.containers.iter().find(|c| c.name != ISTIO_PROXY) {
        Some(app) => app_port(meta, app),
        None => refuse("it has no containers besides Istio's proxy"),
    }
}

/// The ports only an injected pod declares in the plain modes (Envoy's and
/// drainshim's containers), by name and number: a Service that targets one
/// has no endpoint, or a dead one, on a pod created without drainshim.
pub fn injected_ports() -> Result<Vec<(Option<String>, i32)>, String> {
    let mut out = Vec::new();
    for mode in [Mode::Sidecar, Mode::NativeSidecar] {
        let pod = patch::pod(mode)?;
        for c in all_containers(&pod.spec)
            .filter(|c| c.name == patch::ENVOY || c.name == patch::DRAINSHIM)
        {
            out.extend(
                c.ports
                    .iter()
                    .flatten()
                    .map(|p| (p.name.clone(), p.container_port)),
            );
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The port the app serves on: the pod's `drainshim.io/app-port` annotation,
/// else the app container's one TCP port. Refused when that is not one port.
fn app_port(meta: &ObjectMeta, app: &Container) -> Result<u16, PodRefusal> {
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
    if let Some(p) = app
        .ports
        .iter()
        .flatten()
        .find(|p| p.container_port == i32::from(port))
    {
        if let Some(protocol) = not_http(p) {
            return refuse(format!(
                "the app's port {port} speaks {protocol} (its name, as Istio reads it), \
                 not plain HTTP/1.1 or HTTP/2: Envoy's inbound listener and the guard here speak HTTP, so \
                 every connection to it would fail; opt the workload out with {INJECT}: \"false\""
            ));
        }
    }
    Ok(port)
}

/// The protocol a port's name declares that is not plain HTTP, by Istio's
/// convention: the name's prefix before `-` (`tcp-db`, `redis`,
/// `https-web`). None for HTTP, gRPC, HTTP/2 and WebSocket, and for a port
/// without a name. (A container port has no appProtocol; a Service's has.)
fn not_http(port: &k8s_openapi::api::core::v1::ContainerPort) -> Option<String> {
    const OTHERS: [&str; 6] = ["tcp", "tls", "https", "mongo", "mysql", "redis"];
    let name = port.name.as_deref()?;
    let said = name.split('-').next().unwrap_or(name).to_ascii_lowercase();
    OTHERS.contains(&said.as_str()).then_some(said)
}

#[cfg(test)]
mod tests;
