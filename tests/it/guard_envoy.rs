//! The stream guard behind real Envoy 1.40: a preStop drain ends every
//! long-lived stream gracefully, with nothing cut and nothing lost.

use crate::support;

use drainshim::drain::Outcome;
use support::*;

/// Drain timers with a real window: streams are ended over 0.5 s .. 2.3 s.

#[tokio::test]
async fn prestop_ends_every_stream_gracefully_through_envoy() {
    const N: usize = 12;
    let pod = guarded_pod("1.40.0", |s| {
        s.budget.timers = timers(ms(500), ms(2500), secs(6), ms(100))
    })
    .await;
    let streams = open_streams(pod.envoy.inbound, N, "guarded").await;
    wait_for("envoy sees every stream", WAIT, || async {
        envoy_streams(&pod.envoy).await == N as u64
    })
    .await;

    let run = prestop(pod.shim).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let r = run.report();
    assert_eq!(r.outcome, Outcome::Quiesced, "{r:?}");
    assert_eq!(
        (r.streams.cut, r.streams.terminated),
        (0, N as u64),
        "{r:?}"
    );
    assert_eq!(r.connections.cut, 0, "{r:?}");
    // Returned before the deadline (6 s): the drain ended once streams were gone.
    assert!(r.duration_seconds < 6.0, "{r:?}");

    for s in streams {
        let end = tokio::time::timeout(WAIT, s)
            .await
            .expect("stream ends")
            .expect("join");
        support::ends::assert_drained_gracefully(&end, &pod.backend.ledger, "");
    }
    let (_, metrics) = http(pod.shim, "GET", "/metrics").await;
    assert!(
        metrics.contains(&format!(
            "drainshim_streams_terminated_total{{reason=\"drain\",protocol=\"grpc\"}} {N}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "drainshim_drained_streams_total{{outcome=\"terminated\"}} {N}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("drainshim_drained_streams_total{outcome=\"cut\"} 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("drainshim_goaways_total{reason=\"drain\"}"),
        "{metrics}"
    );
}
