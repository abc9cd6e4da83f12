//! What a pod tunes by annotation: drainshim's CPU and memory limits (a
//! namespace whose ResourceQuota covers limits admits the pod) and its drain
//! timers, each checked before anything is written.

use super::*;

/// A namespace whose ResourceQuota covers limits.cpu and limits.memory: the
/// API server refuses a pod with a container (init containers too) that
/// sets either limit not.
fn quota_refusals(pod: &Value) -> Vec<String> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|f| pod[*f].as_array().into_iter().flatten())
        .flat_map(|c| {
            ["cpu", "memory"]
                .into_iter()
                .filter(|r| c["resources"]["limits"][*r].is_null())
                .map(move |r| format!("{}: no limits.{r}", c["name"]))
        })
        .collect()
}

#[test]
fn every_injected_container_has_cpu_and_memory_limits_a_pod_may_tune() {
    let limited = ONE_PORT
        .replace(
            "        image: orders:1\n        ports",
            "        image: orders:1\n        resources: {limits: {cpu: '1', memory: 1Gi}}\n        ports",
        )
        .replace(
            "        image: shipper:2\n",
            "        image: shipper:2\n        resources: {limits: {cpu: 100m, memory: 64Mi}}\n",
        )
        .replace(
            "{name: migrate, image: orders:1}",
            "{name: migrate, image: orders:1, resources: {limits: {cpu: '1', memory: 1Gi}}}",
        );
    // The pod's own containers pass: what fails is drainshim's.
    assert!(quota_refusals(pod_of(&docs(&deployment(&limited))[0])).is_empty());
    for mode in [Mode::Sidecar, Mode::NativeSidecar, Mode::Istio] {
        let out = docs(&inject(&deployment(&limited), mode).expect("injected"));
        let pod = pod_of(&out[0]);
        // istio-proxy's are Istio's (its own annotations tune them).
        let mut pod = pod.clone();
        if let Some(cs) = pod["containers"].as_array_mut() {
            cs.retain(|c| c["name"] != "istio-proxy");
        }
        assert_eq!(quota_refusals(&pod), Vec::<String>::new(), "{mode:?}");
    }

    // The pod's own: Envoy's and drainshim's limits.
    let tuned = limited.replace(
        "{labels: {app: orders}}",
        "{labels: {app: orders}, annotations: {drainshim.io/proxy-cpu-limit: '4', \
         drainshim.io/proxy-memory-limit: 1Gi, drainshim.io/cpu-limit: 1500m, drainshim.io/memory-limit: 512Mi}}",
    );
    let out = docs(&inject(&deployment(&tuned), Mode::Sidecar).expect("injected"));
    let pod = pod_of(&out[0]);
    let limits = |name: &str| {
        pod["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .find(|c| c["name"] == name)
            .expect(name)["resources"]["limits"]
            .clone()
    };
    assert_eq!(
        limits("envoy"),
        serde_json::json!({"cpu": "4", "memory": "1Gi"})
    );
    assert_eq!(
        limits("drainshim"),
        serde_json::json!({"cpu": "1500m", "memory": "512Mi"})
    );
    let (undone, _) = transform(
        &serde_yaml_ng::to_string(&out[0]).expect("yaml"),
        &InjectOptions::default(),
        Direction::Uninject,
    )
    .expect("uninject");
    assert_eq!(docs(&undone), docs(&deployment(&tuned)));

    // Bad values: refused, every one named, nothing written.
    let bad = limited.replace(
        "{labels: {app: orders}}",
        "{labels: {app: orders}, annotations: {drainshim.io/proxy-cpu-limit: lots, \
         drainshim.io/memory-limit: '0', drainshim.io/cpu-limit: 5m}}",
    );
    let errors = inject(&deployment(&bad), Mode::Sidecar).expect_err("refused");
    assert_eq!(errors.len(), 1, "{errors:?}");
    for why in [
        "drainshim.io/proxy-cpu-limit: \"lots\" is not a Kubernetes quantity",
        "drainshim.io/memory-limit: \"0\" is not above zero",
        "drainshim.io/cpu-limit: \"5m\" is below the container's request 20m",
    ] {
        assert!(errors[0].contains(why), "{why}: {errors:?}");
    }
}

#[test]
fn the_webhook_answers_a_bad_limit_with_a_warning_and_no_patch() {
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"drainshim.io/proxy-memory-limit": "\u{1F600}Gi"}},
        "spec": {"containers": [{"name": "a", "image": "a", "ports": [{"containerPort": 8080}]}]},
    });
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {}, "object": pod, "dryRun": false,
        },
    });
    let hook = webhook::Webhook::new(InjectOptions::default(), "default".into());
    let (answer, outcome) = hook.review(review.to_string().as_bytes(), mesh::Namespace::Unlabelled);
    assert_eq!(outcome, webhook::ReviewOutcome::refused);
    let r = &answer["response"];
    assert!(r["allowed"] == true && r["patch"].is_null(), "{r}");
    assert!(
        r["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("is not a Kubernetes quantity")),
        "{r}"
    );
}

#[test]
fn a_pods_drain_timers_by_annotation_are_checked_against_its_grace_and_set() {
    let container = |pod: &Value, name: &str| {
        pod["containers"]
            .as_array()
            .into_iter()
            .chain(pod["initContainers"].as_array())
            .flatten()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no container {name}: {pod}"))
    };
    // What plan's drain-timers step recommends for a slow service.
    let tuned = ONE_PORT.replace(
        "{labels: {app: orders}}",
        "{labels: {app: orders}, annotations: {drainshim.io/drain-time: 75s, \
         drainshim.io/parent-shutdown-time: 100s}}",
    );
    let out = docs(&inject(&deployment(&tuned), Mode::Sidecar).expect("injected"));
    let pod = pod_of(&out[0]);
    let env = container(pod, "drainshim")["env"].clone();
    for (name, value) in [
        ("DRAINSHIM_DRAIN_TIME", "1m 15s"),
        ("DRAINSHIM_PARENT_SHUTDOWN_TIME", "1m 40s"),
    ] {
        let set = env
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not set: {env}"));
        assert_eq!(
            set["value"]
                .as_str()
                .and_then(|v| v.parse::<crate::config::Span>().ok())
                .map(|s| s.get()),
            value.parse::<crate::config::Span>().ok().map(|s| s.get()),
            "{name}: {set}"
        );
    }
    // Envoy's own drain window follows the drain time.
    let args = container(pod, "envoy")["args"].clone();
    let args: Vec<&str> = args
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--drain-time-s")
        .expect("flag");
    assert_eq!(args[at + 1], "75");
    // Uninjected, the pod is as it was.
    let (undone, _) = transform(
        &serde_yaml_ng::to_string(&out[0]).expect("yaml"),
        &InjectOptions::default(),
        Direction::Uninject,
    )
    .expect("uninject");
    assert_eq!(docs(&undone), docs(&deployment(&tuned)));

    // Past the patch's 120 s grace with the shim's linger: refused, as
    // `sidecar --check` refuses the flags, every rule named.
    let past = ONE_PORT.replace(
        "{labels: {app: orders}}",
        "{labels: {app: orders}, annotations: {drainshim.io/drain-time: 2m, \
         drainshim.io/parent-shutdown-time: 115s, drainshim.io/min-drain-time: often}}",
    );
    let errors = inject(&deployment(&past), Mode::Sidecar).expect_err("refused");
    assert!(
        errors[0].contains("drainshim.io/min-drain-time: \"often\" is not a duration"),
        "{errors:?}"
    );
    let past = past.replace(", drainshim.io/min-drain-time: often", "");
    let errors = inject(&deployment(&past), Mode::Sidecar).expect_err("refused");
    for why in [
        "drainshim.io/drain-time (120s) must be less than drainshim.io/parent-shutdown-time (115s)",
        "plus the shim's linger (10s) must stay below terminationGracePeriodSeconds (120s)",
    ] {
        assert!(errors[0].contains(why), "{why}: {errors:?}");
    }
    // The pod's own longer grace makes room for them.
    let room = past
        .replace(
            "drainshim.io/drain-time: 2m",
            "drainshim.io/drain-time: 100s",
        )
        .replace(
            "    spec:\n",
            "    spec:\n      terminationGracePeriodSeconds: 200\n",
        );
    let out = docs(&inject(&deployment(&room), Mode::Sidecar).expect("injected"));
    assert_eq!(pod_of(&out[0])["terminationGracePeriodSeconds"], 200);
    // A parent shutdown past the preStop hooks' own timeout (120 s) is
    // refused, whatever the grace period: the hook would give up mid-drain.
    let long = room
        .replace(
            "drainshim.io/drain-time: 100s",
            "drainshim.io/drain-time: 200s",
        )
        .replace(
            "drainshim.io/parent-shutdown-time: 115s",
            "drainshim.io/parent-shutdown-time: 250s",
        )
        .replace(
            "terminationGracePeriodSeconds: 200",
            "terminationGracePeriodSeconds: 300",
        );
    let errors = inject(&deployment(&long), Mode::Sidecar).expect_err("refused");
    assert!(
        errors[0].contains("must stay below the preStop hooks' timeout (120s)"),
        "{errors:?}"
    );
    // Envoy's whole-second drain window rounds up, never below the drain time.
    let ms = room.replace(
        "drainshim.io/drain-time: 100s",
        "drainshim.io/drain-time: 5500ms, drainshim.io/min-drain-time: 1s, drainshim.io/deregistration-delay: 1s",
    );
    let out = docs(&inject(&deployment(&ms), Mode::Sidecar).expect("injected"));
    let envoy = pod_of(&out[0])["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "envoy")
        .expect("envoy")
        .clone();
    let args: Vec<&str> = envoy["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--drain-time-s")
        .expect("--drain-time-s");
    assert_eq!(args[at + 1], "6", "{args:?}");

    // The webhook: a warning and no patch.
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {"drainshim.io/parent-shutdown-time": "-5s"}},
        "spec": {"containers": [{"name": "a", "image": "a", "ports": [{"containerPort": 8080}]}]},
    });
    let r = webhook_answer(&pod, Mode::Sidecar, mesh::Namespace::Unlabelled);
    assert!(r["allowed"] == true && r["patch"].is_null(), "{r}");
    assert!(
        r["warnings"][0].as_str().is_some_and(
            |w| w.contains("drainshim.io/parent-shutdown-time: \"-5s\" is not a duration")
        ),
        "{r}"
    );
}

/// Under Istio, Envoy's drain window is the ProxyConfig's `drainDuration`
/// (pilot-agent's `--drain-time-s`): the drain-time annotation sets it, as
/// it sets `--drain-time-s` in the plain modes, offline and on the
/// webhook's first call (before Istio's injector reads it); the pod's own
/// ProxyConfig fields stay, and uninjecting gives them back.
#[test]
fn under_istio_the_drain_time_annotation_sets_envoys_drain_duration_too() {
    let config = |doc: &Value| -> String {
        let (_, annotations) = labels_and_annotations(doc);
        annotations["proxy.istio.io/config"]
            .as_str()
            .expect("a ProxyConfig")
            .to_string()
    };
    let tuned = ISTIO_POD.replace(
        "        proxy.istio.io/config:",
        "        drainshim.io/drain-time: 75s\n        drainshim.io/parent-shutdown-time: 100s\n        proxy.istio.io/config:",
    );
    let original = deployment(&tuned);
    let once = inject(&original, Mode::Istio).expect("injected");
    let out = docs(&once);
    let c = config(&out[0]);
    for field in [
        "drainDuration: 75s",
        "terminationDrainDuration: 5s",
        "holdApplicationUntilProxyStarts: true",
    ] {
        assert!(c.contains(field), "{field}: {c}");
    }
    let shim = pod_of(&out[0])["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "drainshim")
        .expect("drainshim")
        .clone();
    assert!(
        shim["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "DRAINSHIM_DRAIN_TIME"),
        "{shim}"
    );
    assert_eq!(inject(&once, Mode::Istio).expect("twice"), once);
    let (undone, _) =
        transform(&once, &InjectOptions::default(), Direction::Uninject).expect("uninject");
    assert_eq!(docs(&undone), docs(&original));
    // Without the annotation, the patch's own 60 s.
    let plain = docs(&inject(&deployment(ISTIO_POD), Mode::Istio).expect("injected"));
    assert!(config(&plain[0]).contains("drainDuration: 60s"));

    // The webhook's first call, before Istio's injector: only what that
    // reads, the drain window among it (a sub-second drain time rounds up).
    let pod = serde_json::json!({
        "metadata": {"name": "p", "annotations": {
            "drainshim.io/drain-time": "5500ms",
            "drainshim.io/min-drain-time": "1s",
            "drainshim.io/deregistration-delay": "1s",
        }},
        "spec": {"containers": [{"name": "a", "image": "a", "ports": [{"containerPort": 8080}]}]},
    });
    let r = webhook_answer(&pod, Mode::Istio, mesh::Namespace::Injected);
    let after = patched(&pod, &r);
    assert!(
        after["spec"]["containers"]
            .as_array()
            .is_some_and(|c| c.len() == 1),
        "Istio's proxy is not there yet: only annotations: {after}"
    );
    let c = after["metadata"]["annotations"]["proxy.istio.io/config"]
        .as_str()
        .unwrap_or_default();
    assert!(c.contains("drainDuration: 6s"), "{r} {after}");
}
