//! Clients that do not read: the guard's buffers bound what it holds for
//! them (the application is backpressured through the windows), and a
//! client that never reads is closed when idle or at its max age.

use std::time::Duration;

use drainshim::guard::{GuardConfig, Limits};

use crate::support::abuse::*;
use crate::support::guard::*;

use super::{open_subscribe, unary_echo, Ctx, Report, Swing, ATTACK_LIMIT, WRITE_LIMIT};

/// The client's stream windows are zero and it never opens them, while the
/// application produces as fast as it may.
pub(super) async fn zero_window(ctx: &Ctx, swing: Swing) -> Report {
    const STREAMS: usize = 200;
    const PAYLOAD: u32 = 64 * 1024;
    let mut a = Attacker::connect(ctx.guard.addr, &[(INITIAL_WINDOW_SIZE, 0)], true).await;
    let mut bytes = Vec::new();
    for i in 0..STREAMS {
        bytes.extend(open_subscribe(
            2 * i as u32 + 1,
            &format!("zw-{i}"),
            0,
            PAYLOAD,
        ));
    }
    let mut failures = Vec::new();
    if a.send(&bytes, WRITE_LIMIT).await.is_err() {
        failures.push("zero window: the streams were not taken".into());
    }
    let produced = ctx.plateau("zw", STREAMS).await;
    swing.in_full_swing();
    swing.hold().await;
    let most = (0..STREAMS)
        .filter_map(|i| ctx.backend.service.ledger.last_written(&format!("zw-{i}")))
        .max()
        .unwrap_or(0);
    let data = a.seen.get(&a.seen.data_bytes);
    if data > 0 {
        failures.push(format!(
            "zero window: the guard sent {data} DATA bytes into a zero window"
        ));
    }
    // The guard's 256 KiB stream window holds 4 messages, the application's
    // own h2 send buffer and its 4-message channel a few more.
    if most > 16 {
        failures.push(format!(
            "zero window: the application produced {most} messages on one stream"
        ));
    }
    Report {
        frames: 1 + 2 * STREAMS as u64,
        outcome: format!(
            "{STREAMS} streams held; app backpressured at {produced} msgs ({:.0} MiB), ≤{most}/stream; {data} B sent",
            (produced * u64::from(PAYLOAD)) as f64 / MIB
        ),
        failures,
    }
}

/// What the guard may hold for one connection whose client never reads:
/// the response data in flight from the application (the guard's receive
/// window towards it) and, towards the client, at most the send buffer of
/// every stream.
fn never_read_bound(l: &Limits) -> u64 {
    u64::from(l.buffers.connection_window)
        + u64::from(l.max_concurrent_streams) * l.buffers.max_send_buffer_size as u64
}

/// Requests, then the client never reads the socket again, after opening
/// every window as wide as HTTP/2 allows: only the guard's own buffer
/// limits stand between the application and the guard's memory.
pub(super) async fn never_reads(ctx: &Ctx, swing: Swing, connections: usize) -> Report {
    const PAYLOAD: u32 = 16 * 1024;
    const UNARY: u32 = 100;
    let limits = Limits::default();
    let streams = limits.max_concurrent_streams as usize - UNARY as usize;
    let base = ctx.guard.mem().rss;
    let mut attackers = Vec::new();
    let mut frames = 0;
    let mut failures = Vec::new();
    for c in 0..connections {
        let mut a =
            Attacker::connect(ctx.guard.addr, &[(INITIAL_WINDOW_SIZE, MAX_WINDOW)], false).await;
        let mut bytes = window_update(0, MAX_WINDOW - 65_535);
        for i in 0..streams {
            let id = format!("nr-{}", c * streams + i);
            bytes.extend(open_subscribe(2 * i as u32 + 1, &id, 0, PAYLOAD));
        }
        for u in 0..UNARY {
            bytes.extend(unary_echo(2 * (streams as u32 + u) + 1));
        }
        if a.send(&bytes, ATTACK_LIMIT).await.is_err() {
            failures.push(format!(
                "never reads: connection {c} did not take the requests"
            ));
        }
        frames += 1 + 2 * (streams as u64 + u64::from(UNARY));
        attackers.push(a);
    }
    let produced = ctx.plateau("nr", connections * streams).await;
    swing.in_full_swing();
    swing.hold().await;
    let grew = ctx.guard.mem().hwm.saturating_sub(base);
    // Twice the buffered bytes: allocator and bookkeeping overhead.
    let bound = connections as u64 * never_read_bound(&limits) * 2;
    if grew > bound {
        failures.push(format!(
            "never reads: the guard grew by {:.1} MiB, over {:.1} MiB ({connections} x (connection window + streams x send buffer), doubled)",
            grew as f64 / MIB,
            bound as f64 / MIB
        ));
    }
    drop(attackers);
    Report {
        frames,
        outcome: format!(
            "{connections}x({streams} streams + {UNARY} unary); app stalled at {:.0} MiB; guard +{:.0} MiB (bound {:.0})",
            (produced * u64::from(PAYLOAD)) as f64 / MIB,
            grew as f64 / MIB,
            bound as f64 / MIB
        ),
        failures,
    }
}

/// A client that sends requests with its windows wide open and then never
/// reads: the answers it does not take stay within the send buffers, and the
/// connection is closed once it has been idle for `idle_timeout` (unary
/// calls), or at max connection age once its streams could not be ended
/// within `end_timeout` (streams). Other clients are served meanwhile.
/// The guard's GOAWAY ack and shutdown waits are 300 ms; `configure` sets
/// the rest.
async fn never_reading_client_is_closed(
    streams: u32,
    unary: u32,
    configure: impl FnOnce(&mut GuardConfig),
) {
    let (backend, g) = guarded(|config| {
        config.limits.goaway_ack_timeout = Duration::from_millis(300);
        config.limits.shutdown_timeout = Duration::from_millis(300);
        configure(config);
    })
    .await;
    let mut a = Attacker::connect(g.addr, &[(INITIAL_WINDOW_SIZE, MAX_WINDOW)], false).await;
    let mut bytes = window_update(0, MAX_WINDOW - 65_535);
    for i in 0..streams {
        bytes.extend(open_subscribe(
            2 * i + 1,
            &format!("closed-{i}"),
            0,
            16 * 1024,
        ));
    }
    for u in 0..unary {
        bytes.extend(unary_echo(2 * (streams + u) + 1));
    }
    a.send(&bytes, PATIENCE).await.expect("requests sent");
    if streams > 0 {
        wait_until("the application to produce", || {
            backend.service.ledger.last_written("closed-0").is_some()
        })
        .await;
    }
    wait_until("the guard to close the connection that never reads", || {
        g.guard.active_connections() == 0
    })
    .await;
    let mut c = connect_client(g.addr).await;
    assert_eq!(
        within("echo", echo(&mut c, "after")).await.expect("echo"),
        "after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answers_is_closed_when_idle() {
    never_reading_client_is_closed(0, 100, |c| {
        c.limits.idle_timeout = Duration::from_millis(300)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_streams_is_closed_at_max_age() {
    never_reading_client_is_closed(50, 10, |c| {
        c.max_connection_age = Some(Duration::from_secs(1));
        c.max_connection_age_grace = Duration::from_millis(300);
        c.limits.end_timeout = Duration::from_millis(300);
    })
    .await;
}
