//! The Istio mode through Istio's own injector (`istio_injector`) and the
//! API server's mutating admission: classic or native sidecars, the app held
//! until the proxy starts or not, drainshim's webhook called first or
//! Istio's, on either of drainshim's paths. Each pod created must be one the
//! API server accepts, with drainshim's preStop on the app and on the proxy
//! wherever Istio put it, the guard forwarding to the app's port, and an
//! uninject that leaves what Istio alone makes of the pod.

use serde_json::Value;

use super::super::manifest::{self, Direction};
use super::super::*;
use super::istio_injector::{self, Mesh};
use super::{api_server, names, patched};

/// Where the API server sends drainshim's review: the webhook for namespaces
/// Istio injects, or the plain one (in the webhook's `--mode`), which takes
/// the Istio mode once it sees Istio's proxy.
#[derive(Clone, Copy, Debug)]
enum Path {
    Istio,
    Plain(Mode),
}

/// Which mutating webhook the API server calls first (configurations are
/// called in name order: `drainshim` sorts before Istio's).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    DrainshimFirst,
    IstioFirst,
}

/// One way a pod is admitted in an Istio namespace.
#[derive(Clone, Copy, Debug)]
struct Case {
    mesh: Mesh,
    /// The pod's ProxyConfig holds the app until the proxy is up.
    hold: bool,
    order: Order,
    path: Path,
}

/// The app's container, its port and the preStop drainshim gives it and the proxy.
const APP: &str = "server";
const APP_PORT_NUMBER: &str = "7070";
const PRESTOP: [&str; 2] = ["/drainshim/drainshim", "prestop"];

/// A pod of an Istio namespace as its controller creates it: the app, a
/// helper container, an init container of its own.
fn mesh_pod(hold: bool) -> Value {
    let mut pod = serde_json::json!({
        "metadata": {"generateName": "orders-", "namespace": "shop", "labels": {"app": "orders"}},
        "spec": {
            "containers": [
                {"name": APP, "image": "orders:1", "ports": [{"name": "grpc", "containerPort": 7070}]},
                {"name": "logs", "image": "shipper:2"},
            ],
            "initContainers": [{"name": "migrate", "image": "orders:1"}],
        },
    });
    if hold {
        pod["metadata"]["annotations"] =
            serde_json::json!({"proxy.istio.io/config": "holdApplicationUntilProxyStarts: true\n"});
    }
    pod
}

/// drainshim's webhook's answer to the review of `pod` on `path`.
fn review(pod: &Value, path: Path) -> Value {
    let mode = match path {
        Path::Plain(mode) => mode,
        Path::Istio => Mode::Sidecar,
    };
    let hook = webhook::Webhook::new(
        InjectOptions {
            mode,
            ..InjectOptions::default()
        },
        "default".into(),
    );
    let gvk = serde_json::json!({"group": "", "version": "v1", "kind": "Pod"});
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": gvk, "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {}, "object": pod, "dryRun": false,
        },
    });
    let ns = match path {
        Path::Istio => mesh::Namespace::Injected,
        Path::Plain(_) => mesh::Namespace::Unlabelled,
    };
    let (answer, _) = hook.review(review.to_string().as_bytes(), ns);
    answer["response"].clone()
}

/// drainshim's webhook: the pod with its answer applied (the real review
/// path, JSON Patch and all). Every call here must inject, never refuse.
fn drainshim_webhook(pod: &Value, path: Path) -> Value {
    let response = review(pod, path);
    assert!(
        response["allowed"] == true && response["warnings"].is_null(),
        "{response}"
    );
    patched(pod, &response)
}

/// A mutating webhook, as the API server calls it.
struct Hook<'a> {
    name: &'static str,
    /// `reinvocationPolicy: IfNeeded`.
    if_needed: bool,
    call: &'a dyn Fn(&Value) -> Value,
}

/// The API server's mutating admission of `pod`: each webhook in turn, then
/// again each one with `reinvocationPolicy: IfNeeded` (drainshim's) that a
/// later one changed the pod after; Istio's is `Never`, its chart's default.
/// The pod it creates, and whose call each was.
fn admit(pod: &Value, case: Case) -> (Value, Vec<&'static str>) {
    let drainshim = Hook {
        name: "drainshim",
        if_needed: true,
        call: &|p| drainshim_webhook(p, case.path),
    };
    let istio = Hook {
        name: "istio",
        if_needed: false,
        call: &|p| istio_injector::inject(p, case.mesh),
    };
    let hooks = match case.order {
        Order::DrainshimFirst => [drainshim, istio],
        Order::IstioFirst => [istio, drainshim],
    };
    let (mut pod, mut calls) = (pod.clone(), Vec::new());
    let (mut called, mut again) = (Vec::new(), Vec::new());
    for reinvocation in [false, true] {
        for (i, hook) in hooks.iter().enumerate() {
            if reinvocation && !again.contains(&i) {
                continue;
            }
            let out = (hook.call)(&pod);
            calls.push(hook.name);
            if out != pod {
                again.append(&mut called);
            }
            if hook.if_needed {
                called.push(i);
            }
            pod = out;
        }
    }
    (pod, calls)
}

fn containers<'a>(pod: &'a Value, field: &str) -> Vec<&'a Value> {
    pod["spec"][field]
        .as_array()
        .into_iter()
        .flatten()
        .collect()
}

fn container<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    containers(pod, "containers")
        .into_iter()
        .chain(containers(pod, "initContainers"))
        .find(|c| c["name"] == name)
}

fn uninjected(pod: &Value) -> Value {
    let (patch, _) = manifest::pod_patch(pod, &InjectOptions::default(), Direction::Uninject)
        .expect("uninjected");
    let mut pod = pod.clone();
    json_patch::patch(&mut pod, &patch).expect("the patch applies");
    pod
}

/// Everything the pod `admit` ends with must be, in one case.
fn check(case: Case, original: &Value, pod: &Value) {
    let refusals = api_server::refusals(pod);
    assert!(refusals.is_empty(), "{refusals:?}\n{pod:#}");
    let order: Vec<&Value> = containers(pod, "containers")
        .into_iter()
        .map(|c| &c["name"])
        .collect();
    // drainshim's preStop on the app, wherever the proxy went.
    let app = container(pod, APP).expect("the app");
    assert_eq!(
        app["lifecycle"]["preStop"]["exec"]["command"],
        serde_json::json!(PRESTOP)
    );
    assert!(container(pod, "logs").expect("logs")["lifecycle"].is_null());
    // And on Istio's proxy, where Istio put it.
    let proxy = container(pod, istio_injector::PROXY).expect("istio-proxy");
    assert_eq!(proxy["image"], istio_injector::IMAGE);
    assert_eq!(
        proxy["lifecycle"]["preStop"]["exec"]["command"],
        serde_json::json!(PRESTOP)
    );
    assert!(
        names(&proxy["volumeMounts"]).contains(&"drainshim-bin"),
        "{proxy}"
    );
    let native = case.mesh.native;
    assert_eq!(
        containers(pod, "initContainers").contains(&proxy),
        native,
        "{pod:#}"
    );
    if native {
        assert_eq!(proxy["restartPolicy"], "Always");
    } else {
        let at = if case.hold { 0 } else { order.len() - 2 };
        assert_eq!(order[at], istio_injector::PROXY, "{order:?}");
    }
    assert_eq!(order.last(), Some(&&Value::from("drainshim")), "{order:?}");
    // The guard forwards to the app's port ($(APP_PORT) is the annotation),
    // which the routing objects select by the label.
    let shim = container(pod, "drainshim").expect("drainshim");
    assert!(
        shim["args"]
            .as_array()
            .expect("args")
            .contains(&"--guard-upstream=127.0.0.1:$(APP_PORT)".into()),
        "{shim}"
    );
    let (labels, annotations) = (&pod["metadata"]["labels"], &pod["metadata"]["annotations"]);
    for port in [&annotations[APP_PORT], &labels[APP_PORT]] {
        assert_eq!(port, APP_PORT_NUMBER);
        assert!(!["15090", "15020", "15021"].contains(&port.as_str().unwrap_or_default()));
    }
    // Which drainshim runs, for the version spread.
    assert_eq!(annotations[REVISION], "default");
    assert_eq!(annotations[VERSION], RELEASE);
    // Injected once: another call changes nothing.
    assert_eq!(&drainshim_webhook(pod, case.path), pod);

    // Uninjected: what Istio alone makes of the pod. When drainshim went
    // first on Istio's path, its first call set only Istio's settings, and
    // Istio keeps one record of them: its iptables rules leave drainshim's
    // port alone.
    let mut want = istio_injector::inject(original, case.mesh);
    if case.order == Order::DrainshimFirst && matches!(case.path, Path::Istio) {
        let iptables = container(pod, istio_injector::INIT).expect("istio-init");
        assert!(
            iptables["args"]
                .as_array()
                .expect("args")
                .contains(&"15090,15021,15099,15020".into()),
            "{iptables}"
        );
        for c in want["spec"]["initContainers"].as_array_mut().expect("init") {
            if c["name"] == istio_injector::INIT {
                c["args"] = iptables["args"].clone();
            }
        }
    }
    assert_eq!(uninjected(pod), want, "uninject");
}

#[test]
fn webhook_under_istio_every_mode_and_order_gives_a_pod_the_api_server_accepts() {
    let mut cases = Vec::new();
    for native in [false, true] {
        for hold in [false, true] {
            for order in [Order::DrainshimFirst, Order::IstioFirst] {
                for path in [
                    Path::Istio,
                    Path::Plain(Mode::Sidecar),
                    Path::Plain(Mode::NativeSidecar),
                ] {
                    cases.push(Case {
                        mesh: Mesh { native },
                        hold,
                        order,
                        path,
                    });
                }
            }
        }
    }
    // Every case is run, and the ones that fail named together; the matrix
    // is printed (`cargo test --lib istio_modes -- --nocapture`).
    let total = cases.len();
    println!(
        "| proxy | app held | first | drainshim's path | calls | API server accepts | preStop on app and proxy | \
         guard to the app's port | re-inject: no change | uninject: Istio's pod exactly |\n|{}",
        "---|".repeat(10)
    );
    let failed: Vec<Case> = cases
        .into_iter()
        .filter(|case| {
            let result = std::panic::catch_unwind(|| {
                let original = mesh_pod(case.hold);
                let (pod, calls) = admit(&original, *case);
                let want: &[&str] = match case.order {
                    Order::DrainshimFirst => &["drainshim", "istio", "drainshim"],
                    Order::IstioFirst => &["istio", "drainshim"],
                };
                assert_eq!(calls, want);
                check(*case, &original, &pod);
                calls.join(", ")
            });
            let cell = if result.is_ok() { "yes" } else { "FAILED" };
            println!(
                "| {} | {} | {} | {} | {} |{}",
                if case.mesh.native {
                    "native sidecar"
                } else {
                    "classic"
                },
                if case.hold { "yes" } else { "no" },
                match case.order {
                    Order::DrainshimFirst => "drainshim",
                    Order::IstioFirst => "Istio",
                },
                match case.path {
                    Path::Istio => "/inject/istio".to_string(),
                    Path::Plain(m) => format!("/inject ({})", m.name()),
                },
                result.as_deref().unwrap_or("-"),
                format!(" {cell} |").repeat(5)
            );
            result.is_err()
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {total} cases fail: {failed:#?}",
        failed.len()
    );
}

#[test]
fn istio_mode_replaces_istios_own_drain_hook_and_puts_it_back() {
    let istio = istio_injector::inject(&mesh_pod(false), Mesh { native: true });
    let hook = container(&istio, istio_injector::PROXY).expect("proxy")["lifecycle"].clone();
    assert_eq!(hook["preStop"]["exec"]["command"][0], "pilot-agent");
    let injected = drainshim_webhook(&istio, Path::Istio);
    let proxy = container(&injected, istio_injector::PROXY).expect("proxy");
    assert_eq!(
        proxy["lifecycle"]["preStop"]["exec"]["command"],
        serde_json::json!(PRESTOP)
    );
    assert_eq!(uninjected(&injected), istio);
    // A preStop of the mesh's own configuration is not Istio's drain hook: refused.
    let mut own = istio.clone();
    own["spec"]["initContainers"][1]["lifecycle"]["preStop"]["exec"]["command"] =
        serde_json::json!(["sleep", "20"]);
    let answer = review(&own, Path::Istio);
    assert!(
        answer["patch"].is_null()
            && answer["warnings"][0]
                .as_str()
                .is_some_and(|w| w.contains("istio-proxy already has a preStop")),
        "{answer}"
    );
}
