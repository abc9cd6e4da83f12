//! The stream and connection caps: streams past a connection's
//! SETTINGS_MAX_CONCURRENT_STREAMS are refused, and the process-wide caps
//! (`max_streams`, `max_connections`, src/guard/limits.rs) refuse
//! retryably, within the manifests' memory limit.

use std::time::Duration;

use drainshim::guard::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::support::abuse::*;
use crate::support::guard::*;

use super::{open_subscribe, Ctx, Report, Swing, ATTACK_LIMIT, WRITE_LIMIT};

/// More streams than SETTINGS_MAX_CONCURRENT_STREAMS on several connections.
pub(super) async fn many_streams(ctx: &Ctx, swing: Swing) -> Report {
    const CONNECTIONS: usize = 4;
    // The binary runs with the default limits.
    let max_streams = u64::from(Limits::default().max_concurrent_streams);
    let per_conn = max_streams + max_streams / 2;
    let app_before = ctx.app_requests();
    let mut attackers = Vec::new();
    let mut frames = 0;
    let mut failures = Vec::new();
    for c in 0..CONNECTIONS {
        let mut a =
            Attacker::connect(ctx.guard.addr, &[(INITIAL_WINDOW_SIZE, 1 << 20)], true).await;
        let mut bytes = window_update(0, MAX_WINDOW - 65_535);
        for i in 0..per_conn {
            let id = format!("many-{c}-{i}");
            bytes.extend(open_subscribe(2 * i as u32 + 1, &id, 1000, 0));
        }
        if a.send(&bytes, ATTACK_LIMIT).await.is_err() {
            failures.push(format!(
                "many streams: connection {c} did not take the requests"
            ));
        }
        frames += 1 + 2 * per_conn;
        attackers.push(a);
    }
    // Every stream is either served (first tick) or refused.
    let deadline = Instant::now() + ATTACK_LIMIT;
    let settled = |a: &Attacker| {
        a.seen.get(&a.seen.refused) + a.seen.get(&a.seen.headers) >= per_conn
            || a.seen.goaway_code().is_some()
    };
    while !attackers.iter().all(settled) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    swing.in_full_swing();
    swing.hold().await;
    let refused: u64 = attackers.iter().map(|a| a.seen.get(&a.seen.refused)).sum();
    let goaways: Vec<_> = attackers
        .iter()
        .filter_map(|a| a.seen.goaway_code())
        .collect();
    let app = ctx.attacker_requests(app_before);
    let expected_refused = CONNECTIONS as u64 * (per_conn - max_streams);
    if refused < expected_refused && goaways.is_empty() {
        failures.push(format!(
            "many streams: {refused} refused, expected {expected_refused} (or a GOAWAY)"
        ));
    }
    if app > CONNECTIONS as u64 * max_streams {
        failures.push(format!(
            "many streams: {app} streams reached the application, over {CONNECTIONS} connections x {max_streams}"
        ));
    }
    drop(attackers);
    Report {
        frames,
        outcome: format!(
            "{CONNECTIONS}x{per_conn} opened: {app} served, {refused} REFUSED_STREAM, GOAWAYs {goaways:?}"
        ),
        failures,
    }
}

/// The process-wide caps, exhausted at their defaults by the worst clients
/// they allow: every stream slot taken by connections whose clients opened
/// their windows wide and never read (the most memory the guard can be made
/// to hold), then every connection slot. Streams past the cap are refused
/// with REFUSED_STREAM (retryable: Envoy retries them, on the app when it
/// fails open), connections past it are closed, the long stream already open
/// keeps ticking, the shim's peak RSS stays below the manifests' memory
/// limit, and once the attacker leaves a fresh call is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausting_the_caps_is_refused_retryably_within_the_memory_limit() {
    const PAYLOAD: u32 = 16 * 1024;
    let limits = Limits::default();
    let per_conn = limits.max_concurrent_streams as usize;
    let hog_conns = limits.max_streams.div_ceil(per_conn);
    let ceiling = manifest_memory_limit();
    let backend = start_backend().await;
    let guard = GuardProcess::spawn(backend.addr).await;
    let legit = Legit::start(guard.addr).await;
    guard.reset_peak();
    let mut failures = Vec::new();

    // 1. Every stream slot, held by clients that never read.
    let mut hogs = Vec::new();
    for c in 0..hog_conns {
        let mut a =
            Attacker::connect(guard.addr, &[(INITIAL_WINDOW_SIZE, MAX_WINDOW)], false).await;
        let mut bytes = window_update(0, MAX_WINDOW - 65_535);
        for i in 0..per_conn {
            let id = format!("hog-{}", c * per_conn + i);
            bytes.extend(open_subscribe(2 * i as u32 + 1, &id, 0, PAYLOAD));
        }
        if a.send(&bytes, ATTACK_LIMIT).await.is_err() {
            failures.push(format!(
                "caps: hog connection {c} did not take its requests"
            ));
        }
        hogs.push(a);
    }
    // How many of them reached the app (a guard whose writes block may
    // still be reading the last requests): settled when the count holds.
    let hog_total = hog_conns * per_conn;
    let admitted = || {
        (0..hog_total)
            .filter(|i| {
                backend
                    .service
                    .ledger
                    .last_written(&format!("hog-{i}"))
                    .is_some()
            })
            .count()
    };
    let deadline = Instant::now() + ATTACK_LIMIT;
    let (mut last, mut since) = (admitted(), Instant::now());
    while Instant::now() < deadline && since.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = admitted();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    // A reading client now: its streams past the free slots find the cap full.
    let free = limits.max_streams.saturating_sub(last + 1);
    let late_n = (free + 100).min(per_conn) as u32;
    let mut late = Attacker::connect(guard.addr, &[], true).await;
    let mut bytes = Vec::new();
    for i in 0..late_n {
        bytes.extend(open_subscribe(2 * i + 1, &format!("late-{i}"), 60_000, 0));
    }
    late.send(&bytes, WRITE_LIMIT)
        .await
        .expect("late streams sent");
    let deadline = Instant::now() + ATTACK_LIMIT;
    while late.seen.get(&late.seen.refused) + late.seen.get(&late.seen.headers) < u64::from(late_n)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = late.seen.get(&late.seen.refused);
    let want = u64::from(late_n).saturating_sub(free as u64) * 9 / 10;
    if refused < want {
        failures.push(format!(
            "caps: {refused} of {late_n} late streams refused with REFUSED_STREAM ({last} hog streams admitted, {free} slots free), want at least {want}"
        ));
    }
    let before = legit.sub.received();
    let ticking = Instant::now() + PROBE_PATIENCE;
    while legit.sub.received() <= before && Instant::now() < ticking {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if legit.sub.received() <= before {
        failures.push("caps: the long stream stalled while the stream cap was full".into());
    }
    let streams_peak = guard.mem().hwm;
    drop(late);
    drop(hogs);
    guard.reset_peak();

    // 2. Every connection slot (each with one stream, or the header read
    // timeout would close it): the ones past the cap are closed at once.
    let extra = 100;
    let mut conns = Vec::new();
    let mut closed = 0;
    for i in 0..limits.max_connections + extra {
        let Ok(mut tcp) = tokio::net::TcpStream::connect(guard.addr).await else {
            closed += 1;
            continue;
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(encode_frame(SETTINGS, 0, 0, &[]));
        hello.extend(open_subscribe(1, &format!("conn-{i}"), 60_000, 0));
        if tcp.write_all(&hello).await.is_err() {
            closed += 1;
            continue;
        }
        conns.push(tcp);
    }
    // Open ones answer (SETTINGS); closed ones read EOF or a reset.
    for tcp in &mut conns {
        let mut b = [0u8; 64];
        match tokio::time::timeout(WRITE_LIMIT, tcp.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
            _ => {}
        }
    }
    if closed < extra {
        failures.push(format!(
            "caps: {closed} of {} connections closed, want at least {extra} past the cap of {}",
            limits.max_connections + extra,
            limits.max_connections
        ));
    }
    let mem = guard.mem();
    drop(conns);

    // 3. The attacker is gone: a fresh call is served again.
    let deadline = Instant::now() + ATTACK_LIMIT;
    let mut after = legit.probe().await;
    while after.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = legit.probe().await;
    }
    if let Err(e) = after {
        failures.push(format!("caps: the legitimate client after the attack: {e}"));
    }
    eprintln!(
        "caps: {hog_conns}x{per_conn} never-reading streams ({last} admitted), {refused} of {late_n} late refused: peak {:.1} MiB; \
         {} connections ({closed} closed): peak {:.1} MiB; manifests' limit {:.0} MiB",
        streams_peak as f64 / MIB,
        limits.max_connections + extra,
        mem.hwm as f64 / MIB,
        ceiling as f64 / MIB
    );
    for (phase, peak) in [("streams", streams_peak), ("connections", mem.hwm)] {
        if peak > ceiling {
            failures.push(format!(
                "caps: the shim's peak RSS at the {phase} cap, {:.1} MiB, is over the manifests' limit {:.0} MiB",
                peak as f64 / MIB,
                ceiling as f64 / MIB
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
