//! The webhook server's own guards: the certificate's expiry (readiness and
//! the gauge) and managedFields kept out of every review.

use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, KeyPair};
use serde_json::{json, Value};

use super::super::mesh::Namespace;
use super::super::webhook::{self, Certificate, ReviewOutcome, Webhook};
use super::super::InjectOptions;

/// A self-signed pair whose notAfter is `not_after`, written to a temp dir.
fn pair(not_after: (i32, u8, u8)) -> (tempfile::TempDir, Certificate) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("cert");
    let (crt, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&crt, cert.pem()).expect("write cert");
    std::fs::write(&k, key.serialize_pem()).expect("write key");
    let loaded = Certificate::load(&crt, &k).expect("the pair loads");
    (dir, loaded)
}

fn unix(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// 2030-01-01T00:00:00Z.
const Y2030: u64 = 1_893_456_000;

#[test]
fn seconds_left_counts_to_the_leafs_not_after() {
    let (_dir, cert) = pair((2030, 1, 1));
    assert_eq!(cert.seconds_left(unix(Y2030 - 3600)), 3600);
    assert_eq!(cert.seconds_left(unix(Y2030 + 60)), -60);
}

#[test]
fn readyz_reflects_a_loaded_unexpired_certificate() {
    let hook = Webhook::new(InjectOptions::default(), "default".into());
    let why = hook
        .unready(unix(Y2030 - 1))
        .expect("no certificate: not ready");
    assert!(why.contains("no serving certificate"), "{why}");

    let (_dir, cert) = pair((2030, 1, 1));
    hook.set_certificate(std::sync::Arc::new(cert));
    assert_eq!(hook.unready(unix(Y2030 - 1)), None);
    let why = hook.unready(unix(Y2030 + 5)).expect("expired: not ready");
    assert!(why.contains("expired 5s ago"), "{why}");

    hook.set_draining();
    let why = hook.unready(unix(Y2030 - 1)).expect("draining: not ready");
    assert!(why.contains("shutting down"), "{why}");
}

#[test]
fn the_expiry_gauge_is_in_the_scrape() {
    let hook = Webhook::new(InjectOptions::default(), "default".into());
    let (_dir, cert) = pair((2030, 1, 1));
    hook.set_certificate(std::sync::Arc::new(cert));
    // What GET /metrics does before rendering.
    let now = SystemTime::now();
    let want = Y2030 as i64
        - now
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
    hook.observe_expiry_for_test(now);
    let text = hook.metrics.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("drainshim_webhook_certificate_expiry_seconds "))
        .unwrap_or_else(|| panic!("no expiry gauge in\n{text}"));
    let got: i64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number");
    assert_eq!(got, want, "{line}");
}

fn review_of(pod: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop", "operation": "CREATE", "userInfo": {}, "object": pod, "dryRun": false,
        },
    })
    .to_string()
    .into_bytes()
}

#[test]
fn managed_fields_never_reach_the_transform_or_the_patch() {
    // An entry the API types cannot read (a time that is no RFC 3339 time):
    // read, it would make the review malformed and the pod go uninjected.
    let pod = json!({
        "metadata": {
            "generateName": "orders-",
            "annotations": {"drainshim.io/app-port": "8080"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                               "time": "yesterday", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}],
        },
        "spec": {"containers": [{"name": "a", "image": "a", "ports": [{"containerPort": 8080}]}]},
    });
    let hook = Webhook::new(InjectOptions::default(), "default".into());
    let (answer, outcome) = hook.review(&review_of(pod), Namespace::Unlabelled);
    assert_eq!(outcome, ReviewOutcome::injected, "{answer}");
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(answer["response"]["patch"].as_str().expect("a patch"))
        .expect("base64");
    let patch = String::from_utf8(patch).expect("utf-8");
    assert!(!patch.contains("managedFields"), "{patch}");
}

#[test]
fn limits_default_to_what_fits_128_mi() {
    let l = webhook::WebhookLimits::default();
    assert_eq!(l.body_timeout, Duration::from_secs(10));
    // Reviews in flight, each up to the 3 MiB body cap and a few times that
    // parsed (say 4): under half of the container's 128 Mi.
    assert!(l.max_in_flight * 3 * 4 <= 64, "{l:?}");
    assert!(l.max_connections >= l.max_in_flight, "{l:?}");
}
