//! The Components' pod patches, embedded at build time and parsed once: what
//! `inject` adds is what `deploy/components/` adds, from the same files.

use std::sync::LazyLock;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{LifecycleHandler, PodSpec, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::Mode;

const SIDECAR: &str = include_str!("../../deploy/components/sidecar/pod-patch.yaml");
const NATIVE_SIDECAR: &str = include_str!("../../deploy/components/native-sidecar/pod-patch.yaml");
const ISTIO: &str = include_str!("../../deploy/components/sidecar-istio/pod-patch.yaml");
/// What the app's container gets (both Components include it).
const APP_CONTAINER: &str = include_str!("../../deploy/components/sidecar/app/app-container.yaml");

/// The image name the patches give drainshim's containers, which kustomize's
/// `images:` (and `inject --image`) replace.
pub const DRAINSHIM_IMAGE: &str = "drainshim";
/// Envoy's container, whose image `inject --envoy-image` replaces.
pub const ENVOY: &str = "envoy";
/// The drainshim container (the shim and its guard).
pub const DRAINSHIM: &str = "drainshim";
/// Istio's injected proxy. The Istio patch carries it as an injection
/// customization (merged by Istio's injector over the proxy it adds), so it is
/// never one of drainshim's own containers.
pub const ISTIO_PROXY: &str = "istio-proxy";
/// The shim's flag that must equal the pod's grace period.
pub const GRACE_FLAG: &str = "--termination-grace-period=";

/// One mode's patch.
pub struct PodPatch {
    /// The pod template's labels and annotations (the Istio patch's only).
    pub meta: ObjectMeta,
    pub spec: PodSpec,
    /// The patch's terminationGracePeriodSeconds.
    pub grace: i64,
    pub app_pre_stop: LifecycleHandler,
    pub app_mount: VolumeMount,
}

/// The names drainshim's parts take in a pod, in either mode.
pub struct Names {
    pub containers: Vec<&'static str>,
    pub volumes: Vec<&'static str>,
}

#[derive(Deserialize)]
struct AppContainer {
    spec: AppContainerSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AppContainerSpec {
    lifecycle: AppLifecycle,
    volume_mount: VolumeMount,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AppLifecycle {
    pre_stop: LifecycleHandler,
}

fn parse(file: &str, yaml: &str) -> Result<PodPatch, String> {
    let bad =
        |e: &dyn std::fmt::Display| format!("the built-in pod patch {file} does not parse: {e}");
    let deployment: Deployment = serde_yaml_ng::from_str(yaml).map_err(|e| bad(&e))?;
    let template = deployment.spec.template;
    let meta = template.metadata.unwrap_or_default();
    let spec = template.spec.ok_or_else(|| bad(&"no spec.template.spec"))?;
    let grace = spec
        .termination_grace_period_seconds
        .ok_or_else(|| bad(&"no terminationGracePeriodSeconds"))?;
    let app: AppContainer = serde_yaml_ng::from_str(APP_CONTAINER).map_err(|e| bad(&e))?;
    Ok(PodPatch {
        meta,
        spec,
        grace,
        app_pre_stop: app.spec.lifecycle.pre_stop,
        app_mount: app.spec.volume_mount,
    })
}

static PODS: LazyLock<[Result<PodPatch, String>; 3]> = LazyLock::new(|| {
    [
        parse("sidecar", SIDECAR),
        parse("native-sidecar", NATIVE_SIDECAR),
        parse("sidecar-istio", ISTIO),
    ]
});

/// The patch for `mode`; an error only if the build embedded a broken file
/// (the unit tests parse both).
pub fn pod(mode: Mode) -> Result<&'static PodPatch, String> {
    let i = match mode {
        Mode::Sidecar => 0,
        Mode::NativeSidecar => 1,
        Mode::Istio => 2,
    };
    PODS[i].as_ref().map_err(Clone::clone)
}

static NAMES: LazyLock<Result<Names, String>> = LazyLock::new(|| {
    let mut names = Names {
        containers: Vec::new(),
        volumes: Vec::new(),
    };
    for mode in [Mode::Sidecar, Mode::NativeSidecar, Mode::Istio] {
        let spec = &pod(mode)?.spec;
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            if c.name != ISTIO_PROXY && !names.containers.contains(&c.name.as_str()) {
                names.containers.push(c.name.as_str());
            }
        }
        for v in spec.volumes.iter().flatten() {
            if !names.volumes.contains(&v.name.as_str()) {
                names.volumes.push(v.name.as_str());
            }
        }
    }
    Ok(names)
});

/// Every container and volume name a patch adds of its own (not istio-proxy).
pub fn owned_names() -> Result<&'static Names, String> {
    NAMES.as_ref().map_err(Clone::clone)
}
