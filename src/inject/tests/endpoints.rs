//! A Service never loses a pod for want of drainshim: a Deployment rolled
//! while the webhook is down (failurePolicy Ignore: pods created without
//! it), then with it refusing the pod, then up again, its Service's
//! endpoints computed at every step as Kubernetes computes them.

use serde_json::{json, Value};

use super::super::manifest::{self, Direction};
use super::super::mesh::Namespace;
use super::super::*;
use super::{api_server, patched, webhook_answer};

/// The endpoints controller's port for a pod (Kubernetes
/// `pkg/api/v1/pod.FindPort`): a number is itself; a name is the first
/// container port of that name and protocol, the containers' then the
/// native sidecars' (init containers with restartPolicy Always); none, and
/// the pod is left out of that Service port's endpoints.
fn find_port(pod: &Value, svc_port: &Value) -> Option<i64> {
    let protocol = svc_port["protocol"].as_str().unwrap_or("TCP");
    let target = svc_port
        .get("targetPort")
        .unwrap_or(&svc_port["port"])
        .clone();
    if let Some(n) = target.as_i64() {
        return Some(n);
    }
    let name = target.as_str()?;
    let containers = pod["spec"]["containers"].as_array().into_iter().flatten();
    let sidecars = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["restartPolicy"] == "Always");
    containers
        .chain(sidecars)
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"] == name && p["protocol"].as_str().unwrap_or("TCP") == protocol)
        .and_then(|p| p["containerPort"].as_i64())
}

/// The Service's endpoints: (pod, port) for each ready pod it selects.
fn endpoints(service: &Value, pods: &[(String, Value)]) -> Vec<(String, i64)> {
    let selector = service["spec"]["selector"].as_object().expect("selector");
    let mut out = Vec::new();
    for (name, pod) in pods {
        if !selector
            .iter()
            .all(|(k, v)| &pod["metadata"]["labels"][k] == v)
        {
            continue;
        }
        for p in service["spec"]["ports"].as_array().expect("ports") {
            if let Some(port) = find_port(pod, p) {
                out.push((name.clone(), port));
            }
        }
    }
    out
}

/// The Deployment's pod template, version `v`: the app serves gRPC on its
/// port named `grpc`, which its own probe names too.
fn template(v: u32, own_pre_stop: bool) -> Value {
    let mut pod = json!({
        "metadata": {"labels": {"app": "orders"}, "annotations": {"version": v.to_string()}},
        "spec": {"containers": [{
            "name": "server", "image": format!("orders:{v}"),
            "ports": [{"name": "grpc", "containerPort": 7070}, {"name": "metrics", "containerPort": 9464}],
            "readinessProbe": {"tcpSocket": {"port": "grpc"}},
        }]},
    });
    // The annotation names the port: two are declared.
    pod["metadata"]["annotations"][APP_PORT] = "7070".into();
    if own_pre_stop {
        pod["spec"]["containers"][0]["lifecycle"] =
            json!({"preStop": {"exec": {"command": ["sleep", "5"]}}});
    }
    pod
}

/// The Service as deploy/README.md says to write it: the app's named port.
fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "orders"},
        "spec": {"selector": {"app": "orders"}, "ports": [{"name": "grpc", "port": 80, "targetPort": "grpc"}]},
    })
}

/// The API server's admission of a pod, with drainshim's webhook up or not.
fn create(pod: &Value, mode: Mode, webhook_up: bool) -> Value {
    if !webhook_up {
        return pod.clone();
    }
    let response = webhook_answer(pod, mode, Namespace::Unlabelled);
    assert_eq!(response["allowed"], true, "{response}");
    patched(pod, &response)
}

fn injected(pod: &Value) -> bool {
    pod["metadata"]["annotations"][INJECTED].is_string()
}

/// Every endpoint is the right port of its pod: Envoy's inbound listener
/// on a pod drainshim injected, the app's own port on one it did not; and
/// the app's probe still reaches the app.
fn check(service: &Value, pods: &[(String, Value)], step: &str) {
    let eps = endpoints(service, pods);
    assert!(
        !eps.is_empty(),
        "{step}: the Service has no endpoints; pods: {:?}",
        pods.iter()
            .map(|(n, p)| (n, injected(p)))
            .collect::<Vec<_>>()
    );
    assert_eq!(eps.len(), pods.len(), "{step}: a pod is left out: {eps:?}");
    for (name, port) in &eps {
        let pod = &pods.iter().find(|(n, _)| n == name).expect("the pod").1;
        let want = if injected(pod) { 10000 } else { 7070 };
        assert_eq!(*port, want, "{step}: {name} (injected: {})", injected(pod));
        let app = &pod["spec"]["containers"][0];
        let probe = &app["readinessProbe"]["tcpSocket"]["port"];
        let probed = app["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| &p["name"] == probe)
            .map(|p| p["containerPort"].clone());
        assert_eq!(probed, Some(7070.into()), "{step}: {name}: {app}");
        // Port names unique in the pod: the API server warns of a duplicate,
        // and a Service or probe by name takes the first.
        let mut names: Vec<&str> = ["containers", "initContainers"]
            .iter()
            .flat_map(|f| pod["spec"][*f].as_array().into_iter().flatten())
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .filter_map(|p| p["name"].as_str())
            .collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count, "{step}: {name}: {names:?}");
        let refusals = api_server::refusals(pod);
        assert!(refusals.is_empty(), "{step}: {name}: {refusals:?}");
    }
}

#[test]
fn a_rollout_while_the_webhook_is_down_or_refusing_never_empties_the_service() {
    for mode in [Mode::Sidecar, Mode::NativeSidecar] {
        let svc = service();
        let mut pods: Vec<(String, Value)> = Vec::new();
        let mut serial = 0;
        // Each rollout: maxSurge 1, maxUnavailable 0, over three replicas,
        // starting from none; the endpoints checked after every step.
        let rollouts = [
            (1, true, false, "v1, webhook up"),
            (2, false, false, "v2, webhook down"),
            (3, true, true, "v3, refused: the app's own preStop"),
            (4, true, false, "v4, webhook up"),
        ];
        for (v, up, own_pre_stop, what) in rollouts {
            let old: Vec<String> = pods.iter().map(|(n, _)| n.clone()).collect();
            for i in 0..3 {
                serial += 1;
                let pod = create(&template(v, own_pre_stop), mode, up);
                assert_eq!(
                    injected(&pod),
                    up && !own_pre_stop,
                    "{mode:?} {what}: {pod}"
                );
                pods.push((format!("orders-{serial}"), pod));
                check(&svc, &pods, &format!("{mode:?} {what}: pod {i} created"));
                if let Some(gone) = old.get(i) {
                    pods.retain(|(n, _)| n != gone);
                    check(&svc, &pods, &format!("{mode:?} {what}: {gone} deleted"));
                }
            }
        }
    }
}

#[test]
fn the_app_ports_name_goes_to_envoy_and_comes_back_exactly() {
    let original = template(1, false);
    let pod = create(&original, Mode::Sidecar, true);
    let ports = |c: &Value| -> Vec<(String, i64)> {
        c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                (
                    p["name"].as_str().unwrap_or_default().to_owned(),
                    p["containerPort"].as_i64().unwrap_or_default(),
                )
            })
            .collect()
    };
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    assert_eq!(
        ports(&containers[0]),
        [("app-7070".to_owned(), 7070), ("metrics".to_owned(), 9464)]
    );
    assert_eq!(
        containers[0]["readinessProbe"]["tcpSocket"]["port"],
        "app-7070"
    );
    let envoy = containers
        .iter()
        .find(|c| c["name"] == "envoy")
        .expect("envoy");
    assert_eq!(ports(envoy), [("grpc".to_owned(), 10000)]);
    let (patch, _) = manifest::pod_patch(&pod, &InjectOptions::default(), Direction::Uninject)
        .expect("uninjected");
    let mut back = pod.clone();
    json_patch::patch(&mut back, &patch).expect("applies");
    assert_eq!(back, original);

    // A port without a name: Envoy keeps envoy-inbound, and the webhook says why.
    let mut unnamed = original.clone();
    unnamed["spec"]["containers"][0]["ports"][0]
        .as_object_mut()
        .expect("port")
        .remove("name");
    unnamed["spec"]["containers"][0]["readinessProbe"]["tcpSocket"]["port"] = 7070.into();
    let (out, lines) = manifest::transform(
        &serde_yaml_ng::to_string(
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": unnamed["metadata"], "spec": unnamed["spec"]}),
        )
        .expect("yaml"),
        &InjectOptions::default(),
        Direction::Inject,
    )
    .expect("injected");
    assert!(
        lines[0].what.contains("has no name") && lines[0].what.contains("envoy-inbound"),
        "{lines:?}"
    );
    assert!(out.contains("name: envoy-inbound"), "{out}");

    // A pod that already uses the derived name is refused, naming it.
    let mut taken = original.clone();
    taken["spec"]["containers"][0]["ports"][1]["name"] = "app-7070".into();
    let errors = manifest::transform(
        &serde_yaml_ng::to_string(
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": taken["metadata"], "spec": taken["spec"]}),
        )
        .expect("yaml"),
        &InjectOptions::default(),
        Direction::Inject,
    )
    .expect_err("refused");
    assert!(errors[0].contains("\"app-7070\" is taken"), "{errors:?}");
}
