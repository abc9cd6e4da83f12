//! The version matrix: the core drain semantics on every Envoy release
//! `make envoy` fetches ([`ENVOY_RELEASES`]). The other tests name one
//! release each (mostly 1.40.0); these two run on all of them, side by
//! side, so a release that reads the bootstrap, the admin API or the drain
//! differently fails here with its version named.
//!
//! - Envoy alone: `/healthcheck/fail` and a graceful inbound-only
//!   `/drain_listeners` through the admin API; Envoy stops the inbound
//!   listener at its drain time, keeps the outbound one, and never ends the
//!   long streams it already carries: the drain reaches its deadline and
//!   counts them cut.
//! - The guard: the same drain ends every long stream gracefully through
//!   that release (UNAVAILABLE, gapless, nothing lost), with the shipped
//!   fail-open cluster in the bootstrap.
//!
//! A third test holds the release list, the fetch script's default list and
//! the README's compatibility row to one another.

use crate::support;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use drainshim::drain::{Outcome, Trigger};
use support::*;

/// Envoy's `--drain-time-s` in the Envoy-alone test: shorter than the
/// shim's deadline, so the inbound listener stops while streams still run.
const ENVOY_DRAIN_TIME: Duration = Duration::from_secs(1);

/// Long streams through Envoy without a guard, drained through the admin API.
async fn envoy_alone_keeps_long_streams(version: &str) {
    const N: usize = 2;
    let backend = backend().await;
    let mut envoy = envoy_with(version, backend.addr, |o| o.drain_time = ENVOY_DRAIN_TIME).await;
    let admin = envoy.admin_client();
    assert_eq!(admin.ready().await.ok(), Some(true), "{version}: not ready");
    let streams = open_streams(envoy.inbound, N, &format!("alone-{version}")).await;
    wait_for(
        &format!("envoy {version} counts every stream"),
        WAIT,
        || async { envoy_streams(&envoy).await == N as u64 },
    )
    .await;

    let (shim, _drain, _sig, _task) = start_sidecar(&envoy.admin_url(), short_timers).await;
    let run = prestop(shim).await;
    assert_eq!(run.code, Some(0), "{version}: {}", run.stderr);
    let r = run.report();
    assert_eq!(r.outcome, Outcome::Deadline, "{version}: {r:?}");
    assert_eq!(r.trigger, Trigger::Prestop, "{version}");
    assert_eq!(r.envoy.version, version, "{version}: /server_info");
    assert!(r.envoy.reachable, "{version}: {r:?}");
    assert_eq!(
        (r.streams.at_start, r.streams.cut, r.streams.terminated),
        (N as u64, N as u64, 0),
        "{version}: {r:?}"
    );

    // The health check failed at once, and stays failed.
    assert_eq!(admin.ready().await.ok(), Some(false), "{version}: /ready");
    // Inbound only: the inbound listener stops at Envoy's drain time, the
    // outbound one keeps accepting.
    wait_for(
        &format!("envoy {version} stops its inbound listener"),
        WAIT,
        || async { admin.listeners_stopped().await.unwrap_or(0) >= 1 },
    )
    .await;
    assert!(
        tokio::net::TcpStream::connect(envoy.inbound).await.is_err(),
        "{version}: the inbound listener still accepts"
    );
    assert!(
        tokio::net::TcpStream::connect(envoy.outbound).await.is_ok(),
        "{version}: the outbound listener was drained too"
    );
    // And the streams it carried are still open: Envoy ends none of them.
    assert_eq!(envoy_streams(&envoy).await, N as u64, "{version}");

    envoy.kill().await;
    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("stream ends")
            .expect("join");
        assert!(
            end.gapless(),
            "{version} {}: gaps in {:?}",
            end.id,
            end.seqs
        );
    }
}

/// Long streams through Envoy and the guard: the drain ends each one gracefully.
async fn the_guard_ends_long_streams(version: &str) {
    const N: usize = 4;
    let mut pod = guarded_pod(version, |s| {
        s.budget.timers = timers(ms(300), ms(1500), secs(6), ms(100))
    })
    .await;
    let streams = open_streams(pod.envoy.inbound, N, &format!("guarded-{version}")).await;
    wait_for(
        &format!("envoy {version} counts every stream"),
        WAIT,
        || async { envoy_streams(&pod.envoy).await == N as u64 },
    )
    .await;

    let run = prestop(pod.shim).await;
    assert_eq!(run.code, Some(0), "{version}: {}", run.stderr);
    let r = run.report();
    assert_eq!(r.outcome, Outcome::Quiesced, "{version}: {r:?}");
    assert_eq!(r.envoy.version, version, "{version}: /server_info");
    assert_eq!(
        (r.streams.cut, r.streams.terminated, r.connections.cut),
        (0, N as u64, 0),
        "{version}: {r:?}"
    );
    assert_eq!(
        pod.envoy.admin_client().ready().await.ok(),
        Some(false),
        "{version}: /ready"
    );

    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("stream ends")
            .expect("join");
        let at = format!("{version} ");
        support::ends::assert_drained_gracefully(&end, &pod.backend.ledger, &at);
    }
    pod.envoy.kill().await;
}

/// Runs `check` on every release side by side: each waits on drain timers,
/// not on the CPU, so five take about as long as one. A failure names its
/// release (every assertion above does).
async fn on_every_release<F, Fut>(check: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut runs = tokio::task::JoinSet::new();
    for version in ENVOY_RELEASES {
        runs.spawn(check(version));
    }
    while let Some(done) = runs.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

#[tokio::test]
async fn envoy_alone_keeps_long_streams_on_every_release() {
    on_every_release(envoy_alone_keeps_long_streams).await;
}

#[tokio::test]
async fn the_guard_ends_long_streams_on_every_release() {
    on_every_release(the_guard_ends_long_streams).await;
}

/// `scripts/fetch-envoy.sh` fetches exactly the releases tested here, and
/// the README's compatibility table names them.
#[test]
fn the_fetched_releases_are_the_tested_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/fetch-envoy.sh")).expect("script");
    let fetched: Vec<&str> = script
        .lines()
        .find_map(|l| l.strip_prefix("versions=${ENVOY_VERSIONS:-"))
        .and_then(|l| l.strip_suffix('}'))
        .expect("a default version list in fetch-envoy.sh")
        .split_whitespace()
        .collect();
    assert_eq!(fetched, ENVOY_RELEASES, "fetch-envoy.sh's default list");

    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| Envoy |"))
        .expect("an Envoy row in the README's compatibility table");
    for version in ENVOY_RELEASES {
        assert!(
            row.contains(version),
            "the README's Envoy row lacks {version}: {row}"
        );
    }
}
