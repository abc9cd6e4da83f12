use super::manifest::{transform, Direction};
use super::*;
use serde_json::Value;

fn docs(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("yaml"))
        .filter(|v| !v.is_null())
        .collect()
}

fn deployment(pod: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: orders}}\nspec:\n  selector: {{matchLabels: {{app: orders}}}}\n  template:\n{pod}"
    )
}

const ONE_PORT: &str = "    metadata: {labels: {app: orders}}
    spec:
      containers:
      - name: server
        image: orders:1
        ports: [{name: grpc, containerPort: 7070}]
      - name: logs
        image: shipper:2
        lifecycle: {preStop: {exec: {command: [flush]}}}
      initContainers:
      - {name: migrate, image: orders:1}
";

fn inject(yaml: &str, mode: Mode) -> Result<String, Vec<String>> {
    let settings = InjectOptions {
        mode,
        ..InjectOptions::default()
    };
    transform(yaml, &settings, Direction::Inject).map(|(out, _)| out)
}

/// The answer of a webhook in `mode` to a CREATE of `pod` in namespace
/// `shop`, labelled as `ns` says.
fn webhook_answer(pod: &Value, mode: Mode, ns: mesh::Namespace) -> Value {
    let hook = webhook::Webhook::new(
        InjectOptions {
            mode,
            ..InjectOptions::default()
        },
        "default".into(),
    );
    let (answer, _) = hook.review(create_review(pod).to_string().as_bytes(), ns);
    answer["response"].clone()
}

/// An AdmissionReview of a CREATE of `pod` in namespace `shop`.
fn create_review(pod: &Value) -> Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {}, "object": pod, "dryRun": false,
        },
    })
}

/// `pod` with a webhook answer's JSON Patch (if any) applied.
fn patched(pod: &Value, response: &Value) -> Value {
    use base64::Engine;
    let mut pod = pod.clone();
    if let Some(patch) = response["patch"].as_str() {
        let patch = base64::engine::general_purpose::STANDARD
            .decode(patch)
            .expect("base64");
        let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("a JSON Patch");
        json_patch::patch(&mut pod, &patch).expect("the patch applies");
    }
    pod
}

fn pod_of(doc: &Value) -> &Value {
    doc.pointer("/spec/template/spec").expect("pod spec")
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

#[test]
fn the_embedded_patches_parse() {
    for mode in [Mode::Sidecar, Mode::NativeSidecar, Mode::Istio] {
        let p = patch::pod(mode).expect("patch");
        assert_eq!(p.grace, 120, "{mode:?}");
        let flag = p
            .spec
            .containers
            .iter()
            .chain(p.spec.init_containers.iter().flatten())
            .flat_map(|c| c.args.iter().flatten())
            .find(|a| a.starts_with(patch::GRACE_FLAG));
        assert_eq!(
            flag.map(String::as_str),
            Some("--termination-grace-period=120s"),
            "{mode:?}"
        );
    }
    let n = patch::owned_names().expect("names");
    assert_eq!(n.containers, ["envoy", "drainshim", "drainshim-install"]);
    assert_eq!(n.volumes, ["drainshim-bin"]);
    // The reserved ports are the patch's own.
    for port in RESERVED_PORTS {
        assert!(
            include_str!("../../deploy/components/sidecar/pod-patch.yaml")
                .contains(&port.to_string()),
            "{port}"
        );
    }
}

#[test]
fn classic_sidecars_follow_the_app_and_keep_every_container_of_the_pod() {
    let out = docs(&inject(&deployment(ONE_PORT), Mode::Sidecar).expect("injected"));
    let pod = pod_of(&out[0]);
    assert_eq!(
        names(&pod["containers"]),
        ["server", "logs", "envoy", "drainshim"]
    );
    assert_eq!(
        names(&pod["initContainers"]),
        ["drainshim-install", "migrate"]
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 120);
    let server = &pod["containers"][0];
    assert_eq!(
        server["lifecycle"]["preStop"]["exec"]["command"][1],
        "prestop"
    );
    assert_eq!(server["volumeMounts"][0]["name"], "drainshim-bin");
    // Another container's own preStop is not the app's: kept.
    assert_eq!(
        pod["containers"][1]["lifecycle"]["preStop"]["exec"]["command"][0],
        "flush"
    );
    let meta = out[0]
        .pointer("/spec/template/metadata/annotations")
        .expect("annotations");
    assert_eq!(meta[APP_PORT], "7070");
    assert_eq!(pod["containers"][3]["image"], DEFAULT_IMAGE);
}

#[test]
fn native_sidecars_start_before_the_pods_own_init_containers() {
    let out = docs(&inject(&deployment(ONE_PORT), Mode::NativeSidecar).expect("injected"));
    let pod = pod_of(&out[0]);
    assert_eq!(names(&pod["containers"]), ["server", "logs"]);
    assert_eq!(
        names(&pod["initContainers"]),
        ["drainshim-install", "drainshim", "envoy", "migrate"]
    );
    assert_eq!(pod["initContainers"][1]["restartPolicy"], "Always");
}

#[test]
fn injecting_twice_is_injecting_once_and_uninject_restores_the_original() {
    let original = deployment(ONE_PORT);
    for mode in [Mode::Sidecar, Mode::NativeSidecar] {
        let once = inject(&original, mode).expect("once");
        assert_eq!(inject(&once, mode).expect("twice"), once, "{mode:?}");
        // Switching modes re-injects from the original.
        let other = if mode == Mode::Sidecar {
            Mode::NativeSidecar
        } else {
            Mode::Sidecar
        };
        assert_eq!(
            inject(&inject(&once, other).expect("other"), mode).expect("back"),
            once
        );
        let (undone, _) =
            transform(&once, &InjectOptions::default(), Direction::Uninject).expect("uninject");
        assert_eq!(docs(&undone), docs(&original), "{mode:?}");
    }
}

#[test]
fn an_injected_pod_records_the_revision_and_release_and_uninject_takes_them_out() {
    let pod: Value = serde_json::from_str(
        r#"{"metadata": {"name": "orders-1", "annotations": {"team": "checkout"}},
            "spec": {"containers": [{"name": "server", "image": "orders:1",
                                     "ports": [{"name": "grpc", "containerPort": 7070}]}]}}"#,
    )
    .unwrap();
    for ns in [mesh::Namespace::Unlabelled, mesh::Namespace::Disabled] {
        let hook = webhook::Webhook::new(InjectOptions::default(), "canary".into());
        let (answer, _) = hook.review(create_review(&pod).to_string().as_bytes(), ns);
        let injected = patched(&pod, &answer["response"]);
        let annotations = &injected["metadata"]["annotations"];
        assert_eq!(annotations[REVISION], "canary", "{ns:?}: {annotations}");
        assert_eq!(annotations[VERSION], env!("CARGO_PKG_VERSION"), "{ns:?}");
        assert_eq!(annotations["team"], "checkout", "{ns:?}");
        // The webhook's second call (reinvocation) changes nothing.
        let (again, _) = hook.review(create_review(&injected).to_string().as_bytes(), ns);
        assert_eq!(patched(&injected, &again["response"]), injected, "{ns:?}");
    }
    // `drainshim inject` records the release, and no revision.
    let once = docs(&inject(&deployment(ONE_PORT), Mode::Sidecar).expect("inject"));
    let annotations = &once[0]["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations[VERSION], env!("CARGO_PKG_VERSION"));
    assert!(annotations.get(REVISION).is_none(), "{annotations}");
    // A pod that carried either annotation before gets its own value back.
    let own = ONE_PORT.replace(
        "metadata: {labels: {app: orders}}",
        "metadata: {labels: {app: orders}, annotations: {drainshim.io/version: mine}}",
    );
    let once = inject(&deployment(&own), Mode::Sidecar).expect("inject");
    let (undone, _) =
        transform(&once, &InjectOptions::default(), Direction::Uninject).expect("uninject");
    assert_eq!(docs(&undone), docs(&deployment(&own)));
}

#[test]
fn a_longer_grace_period_is_kept_and_the_shim_told() {
    let pod = ONE_PORT.replace(
        "    spec:\n",
        "    spec:\n      terminationGracePeriodSeconds: 300\n",
    );
    let out = docs(&inject(&deployment(&pod), Mode::Sidecar).expect("injected"));
    let spec = pod_of(&out[0]);
    assert_eq!(spec["terminationGracePeriodSeconds"], 300);
    let args = &spec["containers"][3]["args"];
    assert!(
        args.as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--termination-grace-period=300s"),
        "{args}"
    );
    let (undone, _) = transform(
        &serde_yaml_ng::to_string(&out[0]).expect("yaml"),
        &InjectOptions::default(),
        Direction::Uninject,
    )
    .expect("uninject");
    assert_eq!(
        docs(&undone)[0].pointer("/spec/template/spec/terminationGracePeriodSeconds"),
        Some(&Value::from(300))
    );
}

#[test]
fn what_cannot_be_injected_safely_is_refused_naming_the_object_and_nothing_is_written() {
    let cases = [
        (ONE_PORT.replace("ports: [{name: grpc, containerPort: 7070}]", "ports: [{containerPort: 80}, {containerPort: 9464}]"), "ambiguous"),
        (ONE_PORT.replace("        ports: [{name: grpc, containerPort: 7070}]\n", ""), "declares no TCP port"),
        (ONE_PORT.replace("image: orders:1\n        ports", "image: orders:1\n        lifecycle: {preStop: {exec: {command: [sleep, '5']}}}\n        ports"), "preStop hook of its own"),
        (ONE_PORT.replace("name: logs", "name: envoy"), "container named \"envoy\""),
        (ONE_PORT.replace("name: logs", "name: istio-proxy"), "Istio"),
        (ONE_PORT.replace("containerPort: 7070", "containerPort: 15000"), "drainshim's containers take"),
        (ONE_PORT.replace("    spec:\n", "    spec:\n      hostNetwork: true\n"), "node's network"),
        (ONE_PORT.replace("{labels: {app: orders}}", "{annotations: {drainshim.io/app-port: http}}"), "is not a port"),
        // drainshim's containers inherit a pod-wide root user and may not run as root.
        (ONE_PORT.replace("    spec:\n", "    spec:\n      securityContext: {runAsUser: 0}\n"), "runs as root"),
        (ONE_PORT.replace("    spec:\n", "    spec:\n      os: {name: windows}\n"), "not a Linux pod"),
        // Envoy's inbound listener and the guard speak HTTP.
        (ONE_PORT.replace("name: grpc, containerPort: 7070", "name: redis, containerPort: 6379"), "speaks redis"),
        (ONE_PORT.replace("name: grpc, containerPort: 7070", "name: https-web, containerPort: 8443"), "speaks https"),
        (ONE_PORT.replace("name: grpc, containerPort: 7070", "name: tcp-db, containerPort: 5432"), "speaks tcp"),
    ];
    for (pod, why) in cases {
        let input = format!(
            "{}\n---\n{}",
            deployment(ONE_PORT).replace("name: orders}", "name: fine}"),
            deployment(&pod)
        );
        let errors = inject(&input, Mode::Sidecar).expect_err(why);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("document 2: Deployment/orders: not injected: "),
            "{errors:?}"
        );
        assert!(errors[0].contains(why), "{why}: {errors:?}");
    }
    let bad = inject("kind: Deployment\nspec: [1, 2]\n", Mode::Sidecar).expect_err("no template");
    assert!(bad[0].contains("no pod template"), "{bad:?}");
    let bad = inject("a: [\n", Mode::Sidecar).expect_err("yaml");
    assert!(bad[0].starts_with("document 1: not YAML"), "{bad:?}");
}

#[test]
fn opted_out_batch_and_other_objects_pass_through() {
    let opted = deployment(ONE_PORT).replace(
        "{labels: {app: orders}}",
        "{labels: {app: orders, drainshim.io/inject: \"false\"}}",
    );
    let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: once}\nspec: {template: {spec: {containers: [{name: a, image: a}]}}}\n";
    let job_pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: job-x}\nspec: {restartPolicy: Never, containers: [{name: a, image: a, ports: [{containerPort: 80}]}]}\n";
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: 80}]}\n";
    // The namespace's opt-out values opt a pod out too, in any case.
    let disabled = deployment(ONE_PORT).replace(
        "{labels: {app: orders}}",
        "{labels: {app: orders}, annotations: {drainshim.io/inject: Disabled}}",
    );
    let (out, lines) =
        transform(&disabled, &InjectOptions::default(), Direction::Inject).expect("passes");
    assert_eq!(docs(&out), docs(&disabled));
    assert!(
        lines[0].what.starts_with("opted out"),
        "{:?}",
        lines[0].what
    );
    let input = format!("{opted}---\n{job}---\n{job_pod}---\n{svc}");
    let (out, lines) =
        transform(&input, &InjectOptions::default(), Direction::Inject).expect("passes");
    assert_eq!(docs(&out), docs(&input));
    let what: Vec<_> = lines
        .iter()
        .map(|l| format!("{}: {}", l.object, l.what))
        .collect();
    assert!(
        what[0].starts_with("Deployment/orders: opted out"),
        "{what:?}"
    );
    assert!(what[1].starts_with("Job/once: not injected"), "{what:?}");
    assert!(
        what[2].starts_with("Pod/job-x: not injected: its pods run to completion"),
        "{what:?}"
    );
    assert_eq!(what.len(), 3);
}

#[test]
fn lists_and_bare_pods_are_injected() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a, image: a, ports: [{containerPort: 8080}]}]}\n";
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}",
        serde_json::to_string(&docs(pod)[0]).expect("json")
    );
    for input in [pod.to_string(), list] {
        let out = docs(&inject(&input, Mode::Sidecar).expect("injected"));
        let pod = out[0].get("items").map_or(&out[0], |items| &items[0]);
        assert_eq!(
            names(&pod["spec"]["containers"]),
            ["a", "envoy", "drainshim"],
            "{input}"
        );
    }
}

#[test]
fn uninject_refuses_what_a_component_added() {
    let rendered = deployment(ONE_PORT).replace("name: logs", "name: drainshim");
    let errors =
        transform(&rendered, &InjectOptions::default(), Direction::Uninject).expect_err("refused");
    assert!(
        errors[0].contains("was not added by `drainshim inject`"),
        "{errors:?}"
    );
    let (out, lines) = transform(
        &deployment(ONE_PORT),
        &InjectOptions::default(),
        Direction::Uninject,
    )
    .expect("nothing to do");
    assert_eq!(docs(&out), docs(&deployment(ONE_PORT)));
    assert_eq!(lines[0].what, "nothing injected: unchanged");
}

#[test]
fn services_that_select_only_injected_pods_point_at_envoy_and_back() {
    let workload = deployment(ONE_PORT);
    let svc = |name: &str, selector: &str, target: &str| {
        format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  selector: {selector}\n  ports: [{{port: 80, targetPort: {target}}}, {{port: 9464, targetPort: 9464}}]\n")
    };
    let batch = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: batch}\nspec:\n  selector: {matchLabels: {role: batch}}\n  template:\n    metadata: {labels: {app: orders, role: batch, drainshim.io/inject: \"false\"}}\n    spec: {containers: [{name: b, image: b}]}\n";
    let input = format!(
        "{workload}---\n{}---\n{}---\n{}---\n{batch}",
        svc("by-name", "{app: orders}", "grpc"),
        svc("by-number", "{app: orders, role: web}", "7070"),
        svc("elsewhere", "{app: other}", "7070"),
    )
    .replace(
        "metadata: {labels: {app: orders}}",
        "metadata: {labels: {app: orders, role: web}}",
    );
    let settings = InjectOptions {
        services: true,
        ..InjectOptions::default()
    };
    let (out, lines) = transform(&input, &settings, Direction::Inject).expect("injected");
    let out = docs(&out);
    let target = |i: usize, p: usize| {
        out[i]
            .pointer(&format!("/spec/ports/{p}/targetPort"))
            .cloned()
    };
    // Also selects the batch pods, which have no Envoy: left alone.
    assert_eq!(target(1, 0), Some(Value::from("grpc")));
    assert!(
        lines
            .iter()
            .any(|l| l.object == "Service/by-name" && l.what.contains("Deployment/batch")),
        "{lines:?}"
    );
    // Only the app's port moves to Envoy, by the app's port name (now
    // Envoy's); the metrics port stays.
    assert_eq!(target(2, 0), Some(Value::from("grpc")));
    assert_eq!(target(2, 1), Some(Value::from(9464)));
    assert_eq!(target(3, 0), Some(Value::from(7070)));
    let injected: String = out
        .iter()
        .map(|d| serde_yaml_ng::to_string(d).expect("yaml") + "---\n")
        .collect();
    let (twice, _) = transform(&injected, &settings, Direction::Inject).expect("twice");
    assert_eq!(docs(&twice), out);
    let (undone, _) = transform(&injected, &settings, Direction::Uninject).expect("uninjected");
    assert_eq!(docs(&undone), docs(&input));
}

#[test]
fn a_service_of_an_app_port_without_a_name_is_never_pointed_where_old_pods_are_not() {
    let unnamed =
        deployment(&ONE_PORT.replace("name: grpc, containerPort: 7070", "containerPort: 7070"));
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: orders}\nspec: {selector: {app: orders}, ports: [{port: 80, targetPort: 7070}]}\n";
    let input = format!("{unnamed}---\n{svc}");
    let settings = InjectOptions {
        services: true,
        ..InjectOptions::default()
    };
    let (out, lines) = transform(&input, &settings, Direction::Inject).expect("injected");
    let out = docs(&out);
    // The pods are injected; the Service still reaches the app's port, which
    // pods created without drainshim have too.
    assert!(names(&pod_of(&out[0])["containers"]).contains(&"envoy"));
    assert_eq!(out[1], docs(svc)[0]);
    let said = lines
        .iter()
        .find(|l| l.object == "Service/orders")
        .expect("a line");
    assert!(
        said.what.contains("app's port has no name"),
        "{:?}",
        said.what
    );
}

const ISTIO_POD: &str = "    metadata:
      labels: {app: orders}
      annotations:
        traffic.sidecar.istio.io/excludeInboundPorts: \"9000\"
        proxy.istio.io/config: \"holdApplicationUntilProxyStarts: true\\n\"
    spec:
      containers:
      - name: server
        image: orders:1
        ports: [{name: grpc, containerPort: 7070}]
";

fn labels_and_annotations(doc: &Value) -> (&Value, &Value) {
    (
        doc.pointer("/spec/template/metadata/labels")
            .expect("labels"),
        doc.pointer("/spec/template/metadata/annotations")
            .expect("annotations"),
    )
}

#[test]
fn istio_mode_gives_istio_proxy_the_prestop_and_merges_istios_own_settings() {
    let original = deployment(ISTIO_POD);
    let once = inject(&original, Mode::Istio).expect("injected");
    let out = docs(&once);
    let pod = pod_of(&out[0]);
    // Istio's injector fills in the customization it finds by name.
    assert_eq!(
        names(&pod["containers"]),
        ["server", "drainshim", "istio-proxy"]
    );
    let proxy = &pod["containers"][2];
    assert_eq!(proxy["image"], "auto");
    assert_eq!(
        proxy["lifecycle"]["preStop"]["exec"]["command"][1],
        "prestop"
    );
    assert_eq!(names(&pod["initContainers"]), ["drainshim-install"]);
    let (labels, annotations) = labels_and_annotations(&out[0]);
    // Whether Istio injects is the mesh admin's and the pod's to say.
    assert!(labels.get("sidecar.istio.io/inject").is_none(), "{labels}");
    // The label the mesh's routing objects select.
    assert_eq!(labels[APP_PORT], "7070");
    assert_eq!(
        annotations["traffic.sidecar.istio.io/excludeInboundPorts"],
        "9000,15099"
    );
    let config = annotations["proxy.istio.io/config"]
        .as_str()
        .expect("config");
    for field in [
        "holdApplicationUntilProxyStarts: true",
        "drainDuration: 60s",
        "terminationDrainDuration: 5s",
    ] {
        assert!(config.contains(field), "{config}");
    }
    assert_eq!(inject(&once, Mode::Istio).expect("twice"), once);
    let (undone, _) =
        transform(&once, &InjectOptions::default(), Direction::Uninject).expect("uninject");
    assert_eq!(docs(&undone), docs(&original));
}

#[test]
fn istio_mode_on_a_pod_istio_already_injected_keeps_its_proxy() {
    // What Istio's injector has written by the time the webhook is called again.
    let injected_by_istio = ISTIO_POD.replace(
        "        ports: [{name: grpc, containerPort: 7070}]\n",
        "        ports: [{name: grpc, containerPort: 7070}]
      - name: istio-proxy
        image: docker.io/istio/proxyv2:1.28.0
        args: [proxy, sidecar]
        volumeMounts: [{name: istio-envoy, mountPath: /etc/istio/proxy}]
      initContainers:
      - {name: istio-init, image: docker.io/istio/proxyv2:1.28.0}
      volumes:
      - {name: istio-envoy, emptyDir: {}}
",
    );
    let original = deployment(&injected_by_istio);
    let once = inject(&original, Mode::Istio).expect("injected");
    let out = docs(&once);
    let pod = pod_of(&out[0]);
    assert_eq!(
        names(&pod["containers"]),
        ["server", "istio-proxy", "drainshim"]
    );
    let proxy = &pod["containers"][1];
    assert_eq!(proxy["image"], "docker.io/istio/proxyv2:1.28.0");
    assert_eq!(proxy["args"][0], "proxy");
    assert_eq!(
        proxy["lifecycle"]["preStop"]["exec"]["command"][1],
        "prestop"
    );
    assert_eq!(
        names(&proxy["volumeMounts"]),
        ["istio-envoy", "drainshim-bin"]
    );
    assert_eq!(
        names(&pod["initContainers"]),
        ["drainshim-install", "istio-init"]
    );
    assert_eq!(inject(&once, Mode::Istio).expect("twice"), once);
    let (undone, _) =
        transform(&once, &InjectOptions::default(), Direction::Uninject).expect("uninject");
    assert_eq!(docs(&undone), docs(&original));

    // The webhook's second call, after Istio merged its proxy over the
    // customization the first call added: the proxy is Istio's now, kept,
    // with drainshim's preStop, and uninject leaves it.
    let first = inject(&deployment(ISTIO_POD), Mode::Istio).expect("first");
    let merged = first.replace("image: auto", "image: docker.io/istio/proxyv2:1.28.0");
    let second = docs(&inject(&merged, Mode::Istio).expect("second"));
    let pod = pod_of(&second[0]);
    assert_eq!(
        names(&pod["containers"]),
        ["server", "istio-proxy", "drainshim"]
    );
    let proxy = &pod["containers"][1];
    assert_eq!(proxy["image"], "docker.io/istio/proxyv2:1.28.0");
    assert_eq!(
        proxy["lifecycle"]["preStop"]["exec"]["command"][1],
        "prestop"
    );
    let (undone, _) = transform(
        &serde_yaml_ng::to_string(&second[0]).expect("yaml"),
        &InjectOptions::default(),
        Direction::Uninject,
    )
    .expect("uninject");
    let undone = docs(&undone);
    let pod = pod_of(&undone[0]);
    assert_eq!(names(&pod["containers"]), ["server", "istio-proxy"]);
    assert!(pod["containers"][1].get("lifecycle").is_none(), "{pod}");
}

#[test]
fn istio_mode_refuses_what_it_cannot_do_safely() {
    let cases = [
        (
            ISTIO_POD.replace(
                "labels: {app: orders}",
                "labels: {app: orders, sidecar.istio.io/inject: \"false\"}",
            ),
            "opts out of Istio's injection",
        ),
        (
            ISTIO_POD.replace(
                "        ports: [{name: grpc, containerPort: 7070}]\n",
                "        ports: [{name: grpc, containerPort: 7070}]
      - name: istio-proxy
        image: proxyv2
        lifecycle: {preStop: {exec: {command: [sleep, '20']}}}
",
            ),
            "istio-proxy already has a preStop",
        ),
        (
            ISTIO_POD.replace(
                "        ports: [{name: grpc, containerPort: 7070}]\n",
                "        ports: [{name: grpc, containerPort: 7070}]
      initContainers:
      - {name: istio-proxy, image: proxyv2}
",
            ),
            "runs to completion",
        ),
        (
            ISTIO_POD.replace(
                "proxy.istio.io/config: \"holdApplicationUntilProxyStarts: true\\n\"",
                "proxy.istio.io/config: \"[not, a, map]\"",
            ),
            "not a YAML map",
        ),
    ];
    for (pod, why) in cases {
        let errors = inject(&deployment(&pod), Mode::Istio).expect_err(why);
        assert!(errors[0].contains(why), "{errors:?}");
    }
    // Outside the Istio mode, istio-proxy is refused, naming the mode to use.
    let with_proxy = ISTIO_POD.replace(
        "        ports: [{name: grpc, containerPort: 7070}]\n",
        "        ports: [{name: grpc, containerPort: 7070}]\n      - {name: istio-proxy, image: proxyv2}\n",
    );
    let errors = inject(&deployment(&with_proxy), Mode::Sidecar).expect_err("sidecar");
    assert!(errors[0].contains("--mode istio"), "{errors:?}");
}

#[test]
fn an_empty_proxy_config_is_no_fields() {
    let pod = ISTIO_POD.replace(
        "proxy.istio.io/config: \"holdApplicationUntilProxyStarts: true\\n\"",
        "proxy.istio.io/config: \"\"",
    );
    let original = deployment(&pod);
    let once = inject(&original, Mode::Istio).expect("injected");
    let out = docs(&once);
    let (_, annotations) = labels_and_annotations(&out[0]);
    let config = annotations["proxy.istio.io/config"]
        .as_str()
        .expect("config");
    assert!(config.contains("drainDuration: 60s"), "{config}");
    let (undone, _) =
        transform(&once, &InjectOptions::default(), Direction::Uninject).expect("uninject");
    assert_eq!(docs(&undone), docs(&original));
}

// The Istio modes, through an emulation of Istio's own injector.
mod api_server;
mod istio_injector;
mod istio_modes;

// Services, endpoints and the port name moved to Envoy.
mod endpoints;
// Istio's labels: where the Istio mode is taken.
mod istio_labels;
// A later webhook's changes to drainshim's containers.
mod reinvocation;
// The server's guards: certificate expiry, managedFields.
mod server;
// Per-pod resources and drain timers, by annotation.
mod resources;
