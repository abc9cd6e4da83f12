//! Whether Istio's injector will inject a pod, as far as the webhook can
//! tell: the namespace's labels (which of drainshim's webhooks the API
//! server called, each selecting namespaces as Istio's own webhooks do) and
//! the pod's own labels and annotations. The Istio mode is taken only where
//! Istio injects; drainshim never asks Istio to inject a pod (a label
//! `sidecar.istio.io/inject: "true"` would override the mesh admin's
//! neverInjectSelector and `policy: disabled`).
//!
//! Istio's webhooks (its chart, default revision, namespaces not injected by
//! default) call the injector for:
//! - a namespace labelled `istio-injection=enabled`, or `istio.io/rev` without
//!   an `istio-injection` label: every pod but those labelled
//!   `sidecar.istio.io/inject: "false"`;
//! - a namespace with neither label: the pods labelled
//!   `sidecar.istio.io/inject: "true"`, or `istio.io/rev`;
//! - a namespace whose `istio-injection` is anything else (`disabled`): none.
//!
//! The injector then goes by the pod's `sidecar.istio.io/inject`, the label
//! over the annotation: "true" (y, yes, on) injects, any other value does
//! not, none leaves it to the mesh's selectors and policy, which the webhook
//! cannot see. A pod already holding istio-proxy is Istio's, whatever it says.

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus_client::encoding::EncodeLabelValue;

use super::patch::ISTIO_PROXY;
use super::{all_containers, ISTIO_INJECT};

/// Istio's revision label, on a namespace or (without one there) a pod.
pub const ISTIO_REV: &str = "istio.io/rev";
/// Istio's namespace label.
pub const ISTIO_INJECTION: &str = "istio-injection";

/// What the namespace says to Istio, as the webhook that was called says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// Neither `istio-injection` nor `istio.io/rev`: Istio injects the pods
    /// that ask for it by label.
    Unlabelled,
    /// `istio-injection=enabled`, or `istio.io/rev` alone: Istio injects
    /// every pod that does not opt out.
    Injected,
    /// `istio-injection` with another value (`disabled`): Istio injects none.
    Disabled,
}

/// Why a pod Istio was asked for gets the plain mode.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Declined {
    /// The namespace's `istio-injection` is not `enabled`: Istio injects none
    /// of its pods, whatever they ask.
    namespace_disabled,
    /// The pod's `sidecar.istio.io/inject` is not "true" in a namespace Istio
    /// injects, or beside its `istio.io/rev`.
    pod_opted_out,
    /// Only the annotation `sidecar.istio.io/inject: "true"`, in a namespace
    /// without Istio's labels, where Istio's webhook selects the label.
    annotation_only,
    /// The label `sidecar.istio.io/inject` says yes otherwise than "true"
    /// (y, yes, on, True), in a namespace without Istio's labels, where
    /// Istio's webhook selects the exact value "true".
    label_not_true,
}

impl Declined {
    pub const ALL: [Declined; 4] = [
        Declined::namespace_disabled,
        Declined::pod_opted_out,
        Declined::annotation_only,
        Declined::label_not_true,
    ];
}

/// Which mode a pod takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Istio injects it: drainshim beside Istio's proxy.
    Istio,
    /// The webhook's own mode (a plain Envoy).
    Plain,
    /// The plain mode, though Istio was asked for: why, said to the client.
    Declined(Declined, String),
}

/// The pod's `sidecar.istio.io/inject` as Istio reads it: the label over the
/// annotation; `Some(true)` for y, yes, true, on (any case).
fn inject_value(meta: &ObjectMeta) -> Option<(bool, &'static str, String)> {
    let label = meta.labels.as_ref().and_then(|l| l.get(ISTIO_INJECT));
    let annotation = meta.annotations.as_ref().and_then(|a| a.get(ISTIO_INJECT));
    let (kind, v) = match (label, annotation) {
        (Some(v), _) => ("label", v),
        (None, Some(v)) => ("annotation", v),
        (None, None) => return None,
    };
    let yes = matches!(v.to_lowercase().as_str(), "y" | "yes" | "true" | "on");
    Some((yes, kind, v.clone()))
}

/// The mode for a pod in `ns`.
pub fn choose(ns: Namespace, meta: &ObjectMeta, spec: &PodSpec) -> Choice {
    if all_containers(spec).any(|c| c.name == ISTIO_PROXY) {
        return Choice::Istio;
    }
    let value = inject_value(meta);
    let rev = meta.labels.as_ref().and_then(|l| l.get(ISTIO_REV));
    let asked = match (&value, rev) {
        (Some((true, kind, v)), _) => Some(format!("its {kind} {ISTIO_INJECT}: {v:?}")),
        (None, Some(r)) => Some(format!("its label {ISTIO_REV}: {r:?}")),
        _ => None,
    };
    let declined = |why: Declined, because: String| {
        Choice::Declined(
            why,
            format!(
                "drainshim gave it a plain Envoy, not the Istio mode: Istio's injector will not inject it ({because})"
            ),
        )
    };
    let opted_out = |kind: &str, v: &str| {
        declined(
            Declined::pod_opted_out,
            format!("its {kind} {ISTIO_INJECT}: {v:?} opts it out"),
        )
    };
    match ns {
        Namespace::Injected => match &value {
            Some((false, kind, v)) => opted_out(kind, v),
            _ => Choice::Istio,
        },
        Namespace::Disabled => match asked {
            Some(asked) => declined(
                Declined::namespace_disabled,
                format!(
                    "{asked} asks for it, but its namespace's label {ISTIO_INJECTION} is not \"enabled\", and \
                     Istio injects no pod there"
                ),
            ),
            None => Choice::Plain,
        },
        Namespace::Unlabelled => match (&value, rev) {
            (Some((false, kind, v)), Some(_)) => opted_out(kind, v),
            (Some((true, "label", v)), _) if v == "true" => Choice::Istio,
            (_, Some(_)) => Choice::Istio,
            (Some((true, "label", v)), None) => declined(
                Declined::label_not_true,
                format!(
                    "its label {ISTIO_INJECT}: {v:?} asks for it, but in a namespace without Istio's labels \
                     Istio's webhook is called only for the exact value \"true\""
                ),
            ),
            (Some((true, _, v)), None) => declined(
                Declined::annotation_only,
                format!(
                    "its annotation {ISTIO_INJECT}: {v:?} asks for it, but in a namespace without Istio's labels \
                     Istio's webhook is called only for pods with the label {ISTIO_INJECT}: \"true\" or {ISTIO_REV}"
                ),
            ),
            _ => Choice::Plain,
        },
    }
}
