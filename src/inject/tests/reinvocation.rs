//! The API server's reinvocation after later webhooks: drainshim's second
//! call changes only what is still as drainshim left it. A registry mirror
//! that rewrites images and a policy that adds a securityContext field (and
//! a CPU limit) keep their changes to drainshim's containers; uninject is
//! still exact.

use serde_json::{json, Value};

use super::super::manifest::{self, Direction};
use super::super::mesh::Namespace;
use super::super::*;
use super::{api_server, patched, webhook_answer};

fn pod() -> Value {
    json!({
        "metadata": {"generateName": "orders-", "namespace": "shop", "labels": {"app": "orders"}},
        "spec": {"containers": [{"name": "server", "image": "orders:1",
                                 "ports": [{"name": "grpc", "containerPort": 7070}]}]},
    })
}

fn drainshim(pod: &Value, mode: Mode) -> Value {
    let response = webhook_answer(pod, mode, Namespace::Unlabelled);
    assert!(response["warnings"].is_null(), "{response}");
    patched(pod, &response)
}

const MIRROR: &str = "mirror.example.com/";

/// A later webhook: a registry mirror (every image through it) and a
/// security policy (runAsUser, a CPU limit where none, on every container).
fn mirror_and_policy(pod: &Value) -> Value {
    let mut pod = pod.clone();
    for field in ["containers", "initContainers"] {
        let list = pod["spec"].get_mut(field).and_then(Value::as_array_mut);
        for c in list.into_iter().flatten() {
            if let Some(image) = c["image"].as_str().filter(|i| !i.starts_with(MIRROR)) {
                c["image"] = format!("{MIRROR}{image}").into();
            }
            if c["securityContext"]["runAsUser"].is_null() {
                c["securityContext"]["runAsUser"] = 10001.into();
            }
        }
    }
    pod
}

/// The API server's mutating admission: drainshim (IfNeeded), then the
/// mirror (Never), then drainshim again, since the mirror changed the pod.
fn admit(original: &Value, mode: Mode) -> Value {
    let first = drainshim(original, mode);
    let changed = mirror_and_policy(&first);
    assert_ne!(changed, first);
    drainshim(&changed, mode)
}

fn uninjected(pod: &Value) -> Value {
    let (patch, _) = manifest::pod_patch(pod, &InjectOptions::default(), Direction::Uninject)
        .expect("uninjected");
    let mut pod = pod.clone();
    json_patch::patch(&mut pod, &patch).expect("the patch applies");
    pod
}

fn ours(pod: &Value) -> Vec<&Value> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|f| pod["spec"][*f].as_array().into_iter().flatten())
        .filter(|c| {
            ["drainshim", "envoy", "drainshim-install"]
                .contains(&c["name"].as_str().unwrap_or_default())
        })
        .collect()
}

#[test]
fn a_later_webhooks_changes_to_drainshims_containers_survive_reinvocation() {
    for mode in [Mode::Sidecar, Mode::NativeSidecar] {
        let original = pod();
        let pod = admit(&original, mode);
        assert!(api_server::refusals(&pod).is_empty());
        let containers = ours(&pod);
        assert_eq!(containers.len(), 3, "{mode:?}");
        for c in containers {
            assert!(
                c["image"].as_str().is_some_and(|i| i.starts_with(MIRROR)),
                "{mode:?}: the mirror's image is gone: {c}"
            );
            assert_eq!(c["securityContext"]["runAsUser"], 10001, "{mode:?}: {c}");
            // drainshim's own fields of the same object are still there.
            assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{c}");
        }
        // Once more: nothing changes.
        assert_eq!(drainshim(&pod, mode), pod, "{mode:?}");
        // And uninject takes out exactly what drainshim added: the app as
        // the mirror left it.
        assert_eq!(uninjected(&pod), mirror_and_policy(&original), "{mode:?}");
    }
}

#[test]
fn what_nobody_else_changed_follows_the_pod_and_the_mode() {
    // Another webhook raises the grace period: drainshim's flag follows,
    // while the mirror's image stays.
    let first = drainshim(&pod(), Mode::Sidecar);
    let mut changed = mirror_and_policy(&first);
    changed["spec"]["terminationGracePeriodSeconds"] = 300.into();
    let second = drainshim(&changed, Mode::Sidecar);
    let shim = ours(&second)
        .into_iter()
        .find(|c| c["name"] == "drainshim")
        .cloned()
        .expect("drainshim");
    assert!(
        shim["args"]
            .as_array()
            .expect("args")
            .contains(&"--termination-grace-period=300s".into()),
        "{shim}"
    );
    assert!(shim["image"]
        .as_str()
        .is_some_and(|i| i.starts_with(MIRROR)));

    // The mode changes (native sidecars): drainshim and Envoy move to the
    // init containers with the native patch's fields, the mirror's image
    // and the policy's field with them.
    let native = drainshim(&changed, Mode::NativeSidecar);
    let init: Vec<&Value> = native["spec"]["initContainers"]
        .as_array()
        .expect("init")
        .iter()
        .collect();
    for name in ["drainshim", "envoy"] {
        let c = init.iter().find(|c| c["name"] == name).expect(name);
        assert_eq!(c["restartPolicy"], "Always", "{c}");
        assert!(
            c["image"].as_str().is_some_and(|i| i.starts_with(MIRROR)),
            "{c}"
        );
        assert_eq!(c["securityContext"]["runAsUser"], 10001, "{c}");
    }
}
