//! The app's port name, moved to Envoy (the plain modes): a Service keeps
//! targeting the app's own named port (`targetPort: grpc`), and the name
//! resolves per pod, as the endpoints controller resolves it (the first
//! container port of that name, the containers' then the native sidecars'):
//! to Envoy's inbound port on a pod drainshim injected, to the app's port on
//! a pod it did not (created while the webhook was down, or refused). So no
//! pod is ever left out of its Service's endpoints for want of drainshim.
//!
//! Envoy's inbound port takes the app's port name; the app's port takes
//! `app-<number>` (a pod's port names must stay unique, and the first one
//! found wins), and so do the app container's own probes and hooks that
//! named it. An app port without a name keeps Envoy's `envoy-inbound`: a
//! Service can then reach Envoy only by that name, which pods without
//! drainshim lack, and the injection says so.

use k8s_openapi::api::core::v1::{Container, ContainerPort, LifecycleHandler, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

use super::{all_containers, refuse, PodRefusal};

/// Envoy's inbound listener, as the pod patches declare it.
pub const ENVOY_INBOUND_PORT: i32 = 10000;
/// Its name in the pod patches, kept where the app's port has none.
pub const ENVOY_INBOUND: &str = "envoy-inbound";

/// A name moved from the app's port to Envoy's, for `uninject`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    /// The app's port name, now Envoy's inbound port's.
    pub name: String,
    /// The name the app's port took meanwhile.
    pub to: String,
}

/// The name the app's port `port` takes while Envoy has its own: at most 15
/// characters, lowercase letters, digits and single hyphens, a letter in it
/// (IANA_SVC_NAME).
fn derived(port: u16) -> String {
    format!("app-{port}")
}

/// The app's TCP port `port` in its container, if it declares it.
fn app_port_mut(app: &mut Container, port: u16) -> Option<&mut ContainerPort> {
    app.ports.iter_mut().flatten().find(|p| {
        p.container_port == i32::from(port) && p.protocol.as_deref().is_none_or(|p| p == "TCP")
    })
}

/// Renames the app's port `port` (in the pod's container `app`), and the
/// probes and hooks of that container that name it. `None` when the port
/// has no name: nothing moves. A derived name the pod already uses is
/// refused (the pod would not come back exactly).
pub fn take_app_name(
    spec: &mut PodSpec,
    app: usize,
    port: u16,
) -> Result<Option<Moved>, PodRefusal> {
    let to = derived(port);
    let Some(name) = app_port_mut(&mut spec.containers[app], port).and_then(|p| p.name.clone())
    else {
        return Ok(None);
    };
    let taken = all_containers(spec)
        .flat_map(|c| c.ports.iter().flatten())
        .any(|p| p.name.as_deref() == Some(to.as_str()))
        || handlers(&spec.containers[app]).any(|at| *at == IntOrString::String(to.clone()));
    if taken {
        return refuse(format!(
            "its port name {to:?} is taken: the app's port {name:?} takes that name while Envoy's inbound \
             port serves as {name:?}; rename that port"
        ));
    }
    rename(&mut spec.containers[app], &name, &to);
    Ok(Some(Moved { name, to }))
}

/// Envoy's inbound port gets the app's port name (or keeps `envoy-inbound`).
pub fn name_envoy_port(envoy: &mut Container, moved: Option<&Moved>) {
    if let Some(p) = envoy
        .ports
        .iter_mut()
        .flatten()
        .find(|p| p.container_port == ENVOY_INBOUND_PORT)
    {
        p.name = Some(moved.map_or(ENVOY_INBOUND, |m| m.name.as_str()).to_owned());
    }
}

/// Gives the app's port its name back (`uninject`).
pub fn give_back(app: &mut Container, moved: &Moved) {
    rename(app, &moved.to, &moved.name);
}

/// Renames the container's port `from` to `to`, and every probe or hook of
/// the container that names it.
fn rename(c: &mut Container, from: &str, to: &str) {
    for p in c.ports.iter_mut().flatten() {
        if p.name.as_deref() == Some(from) {
            p.name = Some(to.to_owned());
        }
    }
    for at in handlers_mut(c) {
        if *at == IntOrString::String(from.to_owned()) {
            *at = IntOrString::String(to.to_owned());
        }
    }
}

/// Every port a probe or lifecycle hook of the container names (httpGet,
/// tcpSocket; gRPC probes take a number only).
fn handlers(c: &Container) -> impl Iterator<Item = &IntOrString> {
    let probes = [&c.liveness_probe, &c.readiness_probe, &c.startup_probe]
        .into_iter()
        .flatten()
        .flat_map(|p: &Probe| {
            [
                p.http_get.as_ref().map(|h| &h.port),
                p.tcp_socket.as_ref().map(|t| &t.port),
            ]
        });
    let hooks = c
        .lifecycle
        .iter()
        .flat_map(|l| [&l.post_start, &l.pre_stop])
        .flatten()
        .flat_map(|h: &LifecycleHandler| {
            [
                h.http_get.as_ref().map(|h| &h.port),
                h.tcp_socket.as_ref().map(|t| &t.port),
            ]
        });
    probes.chain(hooks).flatten()
}

fn handlers_mut(c: &mut Container) -> Vec<&mut IntOrString> {
    let mut out = Vec::new();
    for p in [
        &mut c.liveness_probe,
        &mut c.readiness_probe,
        &mut c.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        out.extend(p.http_get.as_mut().map(|h| &mut h.port));
        out.extend(p.tcp_socket.as_mut().map(|t| &mut t.port));
    }
    if let Some(l) = &mut c.lifecycle {
        for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
            out.extend(h.http_get.as_mut().map(|h| &mut h.port));
            out.extend(h.tcp_socket.as_mut().map(|t| &mut t.port));
        }
    }
    out
}

/// What the injection tells the adopter when the app's port has no name.
pub fn unnamed_warning(app: &str, port: u16) -> String {
    format!(
        "the app's port {port} (container {app:?}) has no name, so Envoy's inbound port keeps the name \
         {ENVOY_INBOUND:?}, which pods created without drainshim lack: a Service that targets it leaves \
         them out of its endpoints. Name the app's port (e.g. grpc) and point the Service's targetPort \
         at that name: drainshim then gives it to Envoy on the pods it injects"
    )
}
