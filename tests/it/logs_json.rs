//! `--log-format json` on the real binary: every stderr line is one JSON
//! object, and the drain report is logged as a nested object that matches
//! the report printed on stdout.

use crate::support;

use drainshim::drain::{Phase, Report, Trigger};
use nix::sys::signal::{kill, Signal};
use support::*;
use tokio::io::AsyncReadExt;

/// Parses one stderr line, failing the test with the line when it is not a
/// JSON object.
fn object(line: &str) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(o)) => o,
        other => panic!("a log line that is not a JSON object ({other:?}): {line:?}"),
    }
}

#[tokio::test]
async fn json_logs_carry_the_drain_report_as_an_object() {
    let backend = backend().await;
    let envoy = envoy("1.40.0", backend.addr).await;
    let admin = envoy.admin_url();
    let mut args = vec!["--log-format", "json", "sidecar", "--listen", "127.0.0.1:0"];
    args.extend(["--envoy-admin", &admin, "--linger", "0s"]);
    args.extend_from_slice(SHORT_TIMERS);
    let (mut child, pid, mut stderr) = support::proc::spawn_bin(&args);
    let mut lines = Vec::new();

    // Ready, said as JSON: the message and the address as fields.
    tokio::time::timeout(WAIT, async {
        while let Some(line) = stderr.next_line().await.expect("read stderr") {
            let o = object(&line);
            lines.push(line);
            if o.get("message").and_then(|m| m.as_str()) == Some("sidecar ready") {
                let listen = o.get("listen").and_then(|l| l.as_str()).unwrap_or_default();
                assert!(
                    listen.parse::<std::net::SocketAddr>().is_ok(),
                    "listen field: {o:?}"
                );
                return;
            }
        }
        panic!("the sidecar exited before it was ready: {lines:?}");
    })
    .await
    .expect("ready in time");

    // SIGTERM: it drains, prints the report on stdout and exits.
    kill(pid, Signal::SIGTERM).expect("SIGTERM");
    let mut stdout = String::new();
    let (rest, status) = tokio::time::timeout(WAIT, async {
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stdout)
            .await
            .expect("read stdout");
        let mut rest = Vec::new();
        while let Some(line) = stderr.next_line().await.expect("read stderr") {
            rest.push(line);
        }
        (rest, child.wait().await.expect("wait"))
    })
    .await
    .expect("the sidecar exits after its drain");
    lines.extend(rest);
    assert!(status.success(), "{status:?}: {lines:#?}");
    let printed: Report = serde_json::from_str(stdout.trim()).expect("report on stdout");

    // Every line is an object with the usual keys.
    let objects: Vec<_> = lines.iter().map(|l| object(l)).collect();
    for o in &objects {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(o.contains_key(key), "no {key}: {o:?}");
        }
    }
    // The report: a nested object, the same as the one printed.
    let logged: Vec<_> = objects
        .iter()
        .filter(|o| o.get("message").and_then(|m| m.as_str()) == Some("drain done"))
        .collect();
    assert_eq!(logged.len(), 1, "{lines:#?}");
    let report = logged[0].get("report").expect("report field");
    assert!(report.is_object(), "the report is not an object: {report}");
    for key in [
        "phase",
        "outcome",
        "trigger",
        "duration_seconds",
        "connections",
        "streams",
        "envoy",
    ] {
        assert!(report.get(key).is_some(), "report without {key}: {report}");
    }
    assert!(report["streams"]["cut"].is_u64(), "{report}");
    let report: Report = serde_json::from_value(report.clone()).expect("a drain report");
    assert_eq!(report.phase, Phase::Done);
    assert_eq!(report.trigger, Trigger::Sigterm);
    assert_eq!(report, printed);
}

/// A format that does not exist is a usage error naming the ones that do.
#[tokio::test]
async fn an_unknown_log_format_is_a_usage_error() {
    let (code, out, err) = run_bin(&["--log-format", "yaml", "sidecar", "--check"]).await;
    assert_eq!(code, Some(64), "{out}{err}");
    assert!(err.contains("text") && err.contains("json"), "{err}");
    let (code, help, err) = run_bin(&["sidecar", "--help"]).await;
    assert_eq!(code, Some(0), "{err}");
    assert!(
        help.contains("--log-format") && help.contains("DRAINSHIM_LOG_FORMAT"),
        "{help}"
    );
}
