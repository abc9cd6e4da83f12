//! The fleet tools reach a Prometheus as platform teams run it, with the
//! real binary: a real Prometheus serving https (a throwaway CA) with basic
//! auth from its `--web.config.file`, and a real Prometheus behind a gateway
//! that wants a bearer token and a tenant's `X-Scope-OrgID`. Wrong or
//! missing credentials exit 77, TLS it cannot trust 69, bad flags 64, and
//! no secret shows in any output, even at `--log trace`.

use crate::support;

use std::collections::BTreeMap;
use std::net::SocketAddr;

use base64::Engine as _;
use drainshim::fleet::prometheus::PromClient;
use drainshim::fleet::reach::{Access, Credentials, Header, Reach};
use drainshim_bench::envoy::EnvoyProcess;
use support::prom::wait_for_scalar;
use support::promreach::{prom_gate, test_tls, web_config};
use support::*;

/// A real Envoy in namespace `reach`, pod `p-0`, with a shim beside it:
/// the one proxy every Prometheus here scrapes.
struct Pod {
    _backend: Backend,
    _envoy: EnvoyProcess,
    shim: SocketAddr,
    _keep: Box<dyn std::any::Any + Send>,
}

async fn pod() -> Pod {
    let backend = backend().await;
    let envoy = envoy_with("1.40.0", backend.addr, |o| {
        o.metadata = BTreeMap::from([
            ("NAMESPACE".into(), "reach".into()),
            ("NAME".into(), "p-0".into()),
        ]);
    })
    .await;
    let (shim, drain, sig, task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    Pod {
        _backend: backend,
        _envoy: envoy,
        shim,
        _keep: Box::new((drain, sig, task)),
    }
}

/// Waits until Prometheus, reached as `reach` says, has scraped the shim.
async fn scraped(reach: Reach) {
    let client = PromClient::from_reach(reach, WAIT);
    wait_for_scalar(
        &client,
        "prometheus has scraped the shim",
        WAIT,
        "count(drainshim_proxy_info{namespace=\"reach\"} == 1)",
        |n| n == 1.0,
    )
    .await;
}

/// The inventory lists the one proxy.
fn lists_the_pod(code: Option<i32>, out: &str, err: &str) {
    assert_eq!(code, Some(0), "{out}{err}");
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(
        (rows[0]["namespace"].as_str(), rows[0]["pod"].as_str()),
        (Some("reach"), Some("p-0")),
        "{out}"
    );
}

fn args(base: &[&str], more: &[&str]) -> Vec<String> {
    base.iter().chain(more).map(|s| s.to_string()).collect()
}

/// TLS with a CA file, the system roots (SSL_CERT_FILE), basic auth; every
/// tool; the environment variables; wrong trust, a wrong password and none.
#[tokio::test]
async fn https_prometheus_with_a_ca_file_and_basic_auth() {
    let pod = pod().await;
    let tls = test_tls();
    let other = test_tls();
    let password = "pw-7f3c9e1d-never-shown";
    let prom = prometheus_with(&[pod.shim], Some(&web_config(&tls, "ops", password))).await;
    let url = prom.url();
    assert!(url.starts_with("https://"), "{url}");

    let dir = tempfile::tempdir().expect("tempdir");
    let auth = dir.path().join("basic");
    std::fs::write(&auth, format!("ops:{password}\n")).expect("auth file");
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "ops:not-the-password-4b1e\n").expect("wrong file");
    let (ca, auth, wrong) = (
        tls.ca.to_str().expect("utf-8"),
        auth.to_str().expect("utf-8"),
        wrong.to_str().expect("utf-8"),
    );
    scraped(
        Reach::new(
            url.parse().expect("url"),
            &Access {
                ca_file: Some(tls.ca.clone()),
                credentials: Credentials::BasicAuthFile(auth.into()),
                headers: Vec::new(),
            },
        )
        .expect("reach"),
    )
    .await;

    // TLS + CA file + basic auth: every tool reads it.
    let reach = [
        "--prometheus",
        url.as_str(),
        "--prometheus-ca",
        ca,
        "--prometheus-basic-auth-file",
        auth,
    ];
    let (code, out, err) = run_bin(&args(&["inventory", "--format", "json"], &reach)).await;
    lists_the_pod(code, &out, &err);
    let (code, out, err) = run_bin(&args(&["skew", "--control-plane", "1.40"], &reach)).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 of 1 proxies within skew"), "{out}");
    let verify = [
        "verify",
        "--namespace",
        "reach",
        "--expect-version",
        "1.40.0",
        "--window",
        "1m",
    ];
    let (code, out, err) = run_bin(&args(&verify, &reach)).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 of 1 proxies on 1.40.0"), "{out}");

    // The same from the environment.
    let (code, out, err) = run_bin_env(
        &["inventory", "--format", "json"],
        &[
            ("DRAINSHIM_PROMETHEUS", &url),
            ("DRAINSHIM_PROMETHEUS_CA", ca),
            ("DRAINSHIM_PROMETHEUS_BASIC_AUTH_FILE", auth),
        ],
    )
    .await;
    lists_the_pod(code, &out, &err);

    // The system roots: SSL_CERT_FILE holds the CA.
    let inventory = [
        "inventory",
        "--format",
        "json",
        "--prometheus",
        url.as_str(),
    ];
    let with_auth = args(&inventory, &["--prometheus-basic-auth-file", auth]);
    let (code, out, err) = run_bin_env(&with_auth, &[("SSL_CERT_FILE", ca)]).await;
    lists_the_pod(code, &out, &err);

    // A server it cannot trust: 69, and the fix named.
    let other_ca = other.ca.to_str().expect("utf-8");
    let (code, _, err) = run_bin_env(&with_auth, &[("SSL_CERT_FILE", other_ca)]).await;
    assert_eq!(code, Some(69), "{err}");
    assert!(
        err.contains("invalid peer certificate") && err.contains("--prometheus-ca"),
        "{err}"
    );
    let (code, _, err) = run_bin(&args(
        &inventory,
        &[
            "--prometheus-basic-auth-file",
            auth,
            "--prometheus-ca",
            other_ca,
        ],
    ))
    .await;
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("TLS"), "{err}");

    // A wrong password and none: refused, 77, with what to check.
    let (code, _, err) = run_bin(&args(
        &inventory,
        &["--prometheus-ca", ca, "--prometheus-basic-auth-file", wrong],
    ))
    .await;
    assert_eq!(code, Some(77), "{err}");
    assert!(
        err.contains("refused (401 Unauthorized)") && err.contains("credentials"),
        "{err}"
    );
    let (code, _, err) = run_bin(&args(&inventory, &["--prometheus-ca", ca])).await;
    assert_eq!(code, Some(77), "{err}");
    assert!(err.contains("--prometheus-basic-auth-file"), "{err}");
    let (code, _, err) = run_bin(&args(
        &verify,
        &["--prometheus", &url, "--prometheus-ca", ca],
    ))
    .await;
    assert_eq!(code, Some(77), "{err}");

    // No secret in any output, at the most verbose log level, whether the
    // password is right or wrong.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    for file in [auth, wrong] {
        let secret = std::fs::read_to_string(file).expect("read");
        let secret = secret.trim();
        let (_, out, err) = run_bin(&args(
            &[
                "--log",
                "trace",
                "verify",
                "--namespace",
                "reach",
                "--expect-version",
                "1.40.0",
            ],
            &[
                "--prometheus",
                &url,
                "--prometheus-ca",
                ca,
                "--prometheus-basic-auth-file",
                file,
            ],
        ))
        .await;
        assert!(
            err.contains("TRACE") || err.contains("DEBUG"),
            "trace logs: {err}"
        );
        let pass = secret.split_once(':').expect("user:password").1;
        for leak in [pass.to_string(), b64(secret)] {
            assert!(
                !out.contains(&leak) && !err.contains(&leak),
                "{leak} shown:\n{out}\n{err}"
            );
        }
    }
}

/// A bearer token read again on every run, and the tenant's header, through
/// a gateway that wants both, in front of a real Prometheus.
#[tokio::test]
async fn bearer_token_and_tenant_header_through_a_gateway() {
    let pod = pod().await;
    let prom = prometheus(&[pod.shim]).await;
    let gate = prom_gate(prom.addr, "tok-b-0c5d1e7a", "tenant-a").await;
    let url = gate.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "tok-a-93b2f4c8\n").expect("token");
    let token_path = token.to_str().expect("utf-8");
    // The harness's own way in, with the token the gateway takes.
    let good = dir.path().join("good");
    std::fs::write(&good, "tok-b-0c5d1e7a").expect("good token");
    scraped(
        Reach::new(
            url.parse().expect("url"),
            &Access {
                ca_file: None,
                credentials: Credentials::BearerTokenFile(good),
                headers: vec![Header::parse("X-Scope-OrgID: tenant-a").expect("header")],
            },
        )
        .expect("reach"),
    )
    .await;

    let reach = [
        "--prometheus",
        url.as_str(),
        "--prometheus-bearer-token-file",
        token_path,
        "--prometheus-header",
        "X-Scope-OrgID: tenant-a",
    ];
    let inventory = ["inventory", "--format", "json"];

    // The file holds a token the gateway does not take: refused, 77.
    let (code, out, err) = run_bin(&args(&inventory, &reach)).await;
    assert_eq!(code, Some(77), "{out}{err}");
    assert!(err.contains("refused (401 Unauthorized)"), "{err}");
    assert!(!err.contains("tok-a-93b2f4c8"), "{err}");

    // The token rotated in the file: the next run uses it.
    std::fs::write(&token, "tok-b-0c5d1e7a\n").expect("rotate");
    let (code, out, err) = run_bin(&args(&inventory, &reach)).await;
    lists_the_pod(code, &out, &err);
    assert!(gate.seen("x-scope-orgid").contains(&"tenant-a".to_string()));
    let (code, out, err) = run_bin(&args(&["skew", "--control-plane", "1.41"], &reach)).await;
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = run_bin(&args(
        &[
            "verify",
            "--namespace",
            "reach",
            "--expect-version",
            "1.40.0",
            "--window",
            "1m",
        ],
        &reach,
    ))
    .await;
    assert_eq!(code, Some(0), "{out}{err}");

    // Without the tenant's header: refused, and the header is named.
    let (code, _, err) = run_bin(&args(
        &inventory,
        &[
            "--prometheus",
            &url,
            "--prometheus-bearer-token-file",
            token_path,
        ],
    ))
    .await;
    assert_eq!(code, Some(77), "{err}");
    assert!(err.contains("tenant header"), "{err}");
    // Another tenant: refused too.
    let (code, _, err) = run_bin(&args(
        &inventory,
        &[
            "--prometheus",
            &url,
            "--prometheus-bearer-token-file",
            token_path,
            "--prometheus-header",
            "X-Scope-OrgID: tenant-b",
        ],
    ))
    .await;
    assert_eq!(code, Some(77), "{err}");

    // From the environment: two headers, one per line, reach the gateway;
    // neither their values nor the token show at --log trace.
    let (passed_before, _) = gate.counts();
    let (code, out, err) = run_bin_env(
        &["--log", "trace", "inventory", "--format", "json"],
        &[
            ("DRAINSHIM_PROMETHEUS", &url),
            ("DRAINSHIM_PROMETHEUS_BEARER_TOKEN_FILE", token_path),
            (
                "DRAINSHIM_PROMETHEUS_HEADER",
                "X-Scope-OrgID: tenant-a\nX-Api-Key: key-5e8a2d41",
            ),
        ],
    )
    .await;
    lists_the_pod(code, &out, &err);
    assert!(gate.counts().0 > passed_before);
    assert!(gate.seen("x-api-key").contains(&"key-5e8a2d41".to_string()));
    assert!(
        err.contains("TRACE") || err.contains("DEBUG"),
        "trace logs: {err}"
    );
    for leak in ["tok-b-0c5d1e7a", "key-5e8a2d41"] {
        assert!(
            !out.contains(leak) && !err.contains(leak),
            "{leak} shown:\n{err}"
        );
    }
    // Nor does --help show an environment value.
    let (code, out, _) = run_bin_env(
        &["inventory", "--help"],
        &[("DRAINSHIM_PROMETHEUS_HEADER", "X-Api-Key: key-5e8a2d41")],
    )
    .await;
    assert_eq!(code, Some(0));
    assert!(
        out.contains("--prometheus-header") && !out.contains("key-5e8a2d41"),
        "{out}"
    );
}

/// Bad flags are usage errors (64) naming every problem at once and
/// echoing no secret; no Prometheus is contacted.
#[tokio::test]
async fn bad_reach_flags_are_usage_errors_that_show_no_secret() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing");
    let missing = missing.to_str().expect("utf-8");
    let not_pem = dir.path().join("ca.pem");
    std::fs::write(&not_pem, "s3cret-9f1a\n").expect("write");
    let not_pem = not_pem.to_str().expect("utf-8");
    let two_lines = dir.path().join("token");
    std::fs::write(&two_lines, "s3cret-9f1a\ns3cret-9f1a\n").expect("write");
    let two_lines = two_lines.to_str().expect("utf-8");
    let prom = "https://127.0.0.1:9";
    for (argv, says) in [
        (
            vec![
                "--prometheus",
                prom,
                "--prometheus-header",
                "X-Api-Key s3cret-9f1a",
            ],
            vec!["expected 'Name: value'"],
        ),
        (
            vec![
                "--prometheus",
                prom,
                "--prometheus-header",
                "X-Api-Key: s3cret-9f1a\u{7}",
            ],
            vec!["x-api-key: the value holds characters not allowed"],
        ),
        (
            vec!["--prometheus", "https://ops:s3cret-9f1a@127.0.0.1:9"],
            vec!["credentials in the URL are not accepted"],
        ),
        (
            vec![
                "--prometheus",
                "http://127.0.0.1:9",
                "--prometheus-ca",
                not_pem,
            ],
            vec!["--prometheus-ca needs an https://"],
        ),
        (
            vec!["--prometheus", prom, "--prometheus-ca", not_pem],
            vec!["no CERTIFICATE"],
        ),
        (
            vec![
                "--prometheus",
                prom,
                "--prometheus-bearer-token-file",
                missing,
            ],
            vec!["--prometheus-bearer-token-file", "No such file"],
        ),
        (
            vec![
                "--prometheus",
                prom,
                "--prometheus-basic-auth-file",
                two_lines,
            ],
            vec!["expected one line"],
        ),
        // Every problem at once.
        (
            vec![
                "--prometheus",
                prom,
                "--prometheus-header",
                "X-Api-Key s3cret-9f1a",
                "--prometheus-header",
                "Host: s3cret-9f1a",
                "--prometheus-ca",
                missing,
            ],
            vec![
                "expected 'Name: value'",
                "host: drainshim sets this header",
                "--prometheus-ca",
            ],
        ),
        (
            vec![
                "--prometheus",
                prom,
                "--prometheus-bearer-token-file",
                missing,
                "--prometheus-basic-auth-file",
                missing,
            ],
            vec!["cannot be used with"],
        ),
        (
            vec![
                "--targets",
                "http://127.0.0.1:9",
                "--prometheus-ca",
                not_pem,
            ],
            vec!["--prometheus-ca applies to --prometheus only"],
        ),
    ] {
        for tool in [
            vec!["inventory"],
            vec!["skew", "--control-plane", "1.40"],
            vec!["verify", "--namespace", "a", "--expect-version", "1.40.0"],
        ] {
            let all: Vec<&str> = tool.iter().chain(&argv).copied().collect();
            let (code, out, err) = run_bin(&all).await;
            assert_eq!(code, Some(64), "{all:?}: {out}{err}");
            for s in &says {
                assert!(err.contains(s), "{all:?}: wanted {s:?} in {err}");
            }
            assert!(
                !err.contains("s3cret") && !out.contains("s3cret"),
                "{all:?}: {err}"
            );
        }
    }
}
