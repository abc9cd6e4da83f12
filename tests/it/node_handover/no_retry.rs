//! The rolling update again, through a user's own Envoy bootstrap with NO
//! retry policy and no fallback (`no_retry_pod`): nothing hides what the
//! guard does. Unary calls run at full speed all along (back to back, a 2 s
//! deadline each) beside long streams; not one call may fail or hang, no
//! stream may be cut, and the new agent's drain afterwards cuts nothing.

use super::*;

/// One run: the old agent's window, and how long one worker's calls
/// take in the app.
struct Case {
    window: &'static str,
    slow_ms: u32,
    /// The old agent gets SIGTERM while it gives the new one the
    /// listeners (the rollout's readiness probe on the shared node port
    /// may be answered by the old agent), not once the new one is ready.
    early_sigterm: bool,
    /// One more call, sent to the old agent before the new one starts,
    /// that the app answers after this long: still in flight when the
    /// old agent's window ends (the slow worker's calls may or may not
    /// be, by chance).
    outlasting_call: Option<Duration>,
}

async fn run(case: Case) {
    let lab = Lab::new("n");
    let pod = no_retry_pod(&lab, "solo", "1.40.0").await;
    let name = pod.name.clone();
    let (_dir, socket_s, listen) = handover_setup();
    let flags = [
        "--handover-socket",
        &socket_s,
        "--handover-window",
        case.window,
    ];

    let mut old = agent_bin(&lab, listen, &flags).await;
    wait_guards(listen, &[&name]).await;
    // Envoy sends to the guard now (no fallback: it has nothing else).
    let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
    let outlasting = case.outlasting_call.map(|delay| {
        let call = tokio::spawn(one_call(pod.inbound(), delay));
        (call, before)
    });
    if let Some((_, before)) = outlasting {
        // The only call yet: through the old agent's guard, before a new
        // agent exists.
        wait_pod_host(&pod, GUARD_LISTEN, before).await;
    }
    let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
    let load = Unary::start(pod.inbound(), case.slow_ms);
    wait_pod_host(&pod, GUARD_LISTEN, before).await;
    let streams = open_streams(pod.inbound(), LONG, &name, Duration::from_secs(120))
        .await
        .expect("streams open");
    load.wait_more(CALLS_PER_STEP, "before the hand-over").await;

    // The rolling update: the new agent starts beside the old one, takes
    // the listeners; calls go on through both for a while...
    let new = agent_bin_started(&lab, listen, &flags);
    let (adopted, sigterm) = if case.early_sigterm {
        // ...the old one gets SIGTERM as the new one asks for them...
        old.wait_log("a new agent asks for the listeners").await;
        let sigterm = Instant::now();
        nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        // ...and hands them over all the same.
        old.wait_log("the new agent serves every listener now")
            .await;
        (Instant::now(), sigterm)
    } else {
        old.wait_log("the new agent serves every listener now")
            .await;
        let adopted = Instant::now();
        load.wait_more(CALLS_PER_STEP, "while both agents run")
            .await;
        // ...then the old one gets SIGTERM and exits.
        let sigterm = Instant::now();
        nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        (adopted, sigterm)
    };
    new.wait_log("node agent ready").await;
    if case.early_sigterm {
        // Whether the SIGTERM was seen before `adopted` (a race: either
        // way nothing may fail).
        eprintln!(
            "early SIGTERM: the old agent waited for the hand-over: {}",
            old.log().contains("SIGTERM during a hand-over")
        );
    }
    reap(&mut old, "the old agent").await;
    let exited = Instant::now();
    load.wait_more(CALLS_PER_STEP, "after the old agent exited")
        .await;
    let mut calls = load.finish().await;
    let outlasted = outlasting.is_some();
    if let Some((call, _)) = outlasting {
        calls.push(call.await.expect("outlasting call"));
    }

    let (graceful, cut) = stream_ends(streams).await;
    let (failed, hung) = outcomes(&calls, sigterm, "SIGTERM");
    eprintln!(
        "hand-over without retries (window {}, slow calls {} ms): {} unary calls, {} failed, {} hung; \
         {graceful} of {LONG} long streams ended gracefully, {} cut; \
         old agent exited {} after SIGTERM ({} after adoption)",
        case.window,
        case.slow_ms,
        calls.len(),
        failed.len(),
        hung.len(),
        cut.len(),
        at(exited, sigterm),
        at(exited, adopted),
    );
    let logs = format!("old agent:\n{}", old.log());
    assert_no_failed_or_hung(calls.len(), (&failed, &hung), &logs);
    assert!(
        cut.is_empty(),
        "cut streams: {cut:?}\nold agent:\n{}",
        old.log()
    );
    // The outlasting call finished (above), and was open at the old
    // agent's window's end.
    assert!(
        !outlasted
            || old
                .log()
                .contains("window over; the calls still open are left to finish"),
        "the outlasting call was not open at the window's end:\n{}",
        old.log()
    );
    assert_eq!(graceful, LONG);

    // The new agent carries the pod's guarded traffic, and drains with it.
    new_agent_drains(listen, &[&name], &pod, &new, "hand-over without retries").await;
}

/// The setup: long streams over a 5 s window, calls of
/// 1 ms and 200 ms.
fn steady() -> Case {
    Case {
        window: "5s",
        slow_ms: 200,
        early_sigterm: false,
        outlasting_call: None,
    }
}

/// A call that outlasts the window: in flight when the old agent hands
/// over, still running when its window ends. A short call finishes.
fn outlasting() -> Case {
    Case {
        window: "1s",
        slow_ms: 1_500,
        early_sigterm: false,
        // Sent before the streams open and the calls flow: well past
        // that, the new agent's start and the window, on a loaded machine.
        outlasting_call: Some(Duration::from_secs(15)),
    }
}

/// SIGTERM in the middle of the hand-over: the old agent finishes it
/// before it stops accepting.
fn early() -> Case {
    Case {
        early_sigterm: true,
        ..steady()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_hands_over_without_a_failed_or_hung_call() {
    run(steady()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_during_the_hand_over_fails_nothing() {
    run(early()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_outlasts_the_window_finishes() {
    run(outlasting()).await;
}

/// Hand-overs in a row, each agent handing to the next.
const ROUNDS: usize = 5;
/// Workers of the heavy load, back to back: as many calls as the
/// machine carries through Envoy and the guard.
const HEAVY_WORKERS: usize = 16;
/// Calls between two steps of a hand-over under the heavy load: about
/// 10 s of calls over the five at the 1,000 calls/s and more.
const HEAVY_STEP: u64 = 2_500;

/// When an old agent gets its SIGTERM, round by round.
#[derive(Clone, Copy, Debug)]
enum Sigterm {
    /// While the new agent asks for the listeners.
    Asking,
    /// The moment it handed them over.
    Adopted,
    /// After `HEAVY_STEP` more calls.
    Later,
}
const SIGTERMS: [Sigterm; ROUNDS] = [
    Sigterm::Later,
    Sigterm::Adopted,
    Sigterm::Asking,
    Sigterm::Later,
    Sigterm::Adopted,
];

/// Five hand-overs in a row under the heaviest load the test makes:
/// every agent takes the listeners from the one before, which gets
/// SIGTERM (while it hands them over, the moment it did, or later) and
/// exits, while calls go on at full speed: not one fails or hangs. The
/// rate is printed (never asserted: `bench` holds speed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hand_overs_in_a_row_at_load_fail_nothing() {
    let lab = Lab::new("f");
    let pod = no_retry_pod(&lab, "solo", "1.40.0").await;
    let name = pod.name.clone();
    let (_dir, socket_s, listen) = handover_setup();
    let flags = ["--handover-socket", &socket_s, "--handover-window", "2s"];

    let mut old = agent_bin(&lab, listen, &flags).await;
    wait_guards(listen, &[&name]).await;
    let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
    let load = Unary::with_workers(pod.inbound(), HEAVY_WORKERS, 200);
    wait_pod_host(&pod, GUARD_LISTEN, before).await;
    let streams = open_streams(pod.inbound(), LONG, &name, Duration::from_secs(120))
        .await
        .expect("streams open");
    load.wait_more(CALLS_PER_STEP, "before the hand-overs")
        .await;

    let (start, made) = (Instant::now(), load.made());
    let mut sigterms = Vec::new();
    let mut logs = Vec::new();
    for (round, when) in (1..=ROUNDS).zip(SIGTERMS) {
        let new = agent_bin_started(&lab, listen, &flags);
        let sigterm = |old: &AgentBin| {
            nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
            Instant::now()
        };
        if let Sigterm::Asking = when {
            old.wait_log("a new agent asks for the listeners").await;
            sigterms.push(sigterm(&old));
        }
        old.wait_log("the new agent serves every listener now")
            .await;
        match when {
            Sigterm::Asking => {}
            Sigterm::Adopted => sigterms.push(sigterm(&old)),
            Sigterm::Later => {
                load.wait_more(HEAVY_STEP, &format!("hand-over {round}: both agents run"))
                    .await;
                sigterms.push(sigterm(&old));
            }
        }
        reap(&mut old, &format!("hand-over {round}: the old agent")).await;
        new.wait_log("node agent ready").await;
        load.wait_more(
            HEAVY_STEP,
            &format!("hand-over {round}: after the old agent exited"),
        )
        .await;
        logs.push(old.log());
        old = new;
    }
    let (took, n) = (start.elapsed(), load.made() - made);
    let calls = load.finish().await;

    let (_, cut) = stream_ends(streams).await;
    let (failed, hung) = by_nearest_sigterm(&calls, &sigterms);
    eprintln!(
        "{ROUNDS} hand-overs in a row without retries ({HEAVY_WORKERS} workers): {} unary calls, \
         {n} in {:.1} s of hand-overs ({:.0} calls/s), {} failed, {} hung; {} of {LONG} long streams cut",
        calls.len(),
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(0.001),
        failed.len(),
        hung.len(),
        cut.len(),
    );
    let logs = format!("the old agents' logs:\n{}", logs.join("\n-----\n"));
    assert_no_failed_or_hung(calls.len(), (&failed, &hung), &logs);
    assert!(cut.is_empty(), "cut streams: {cut:?}");
}

/// The failed and hung calls, each call judged against the SIGTERM nearest
/// to it.
fn by_nearest_sigterm(calls: &[Call], sigterms: &[Instant]) -> (Vec<String>, Vec<String>) {
    let mut failed = Vec::new();
    let mut hung = Vec::new();
    for (i, t) in sigterms.iter().enumerate() {
        let mine: Vec<&Call> = calls
            .iter()
            .filter(|c| {
                let nearest = sigterms
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, s)| {
                        if c.start >= **s {
                            c.start - **s
                        } else {
                            **s - c.start
                        }
                    })
                    .map(|(j, _)| j);
                nearest == Some(i)
            })
            .collect();
        let (f, h) = outcomes_of(&mine, *t, &format!("SIGTERM {}", i + 1));
        failed.extend(f);
        hung.extend(h);
    }
    (failed, hung)
}

/// What one run of hand-overs without the socket saw.
struct SideBySide {
    calls: Vec<Call>,
    /// Calls made during the hand-overs, and over how long.
    during: (u64, Duration),
    failed: Vec<String>,
    hung: Vec<String>,
    cut: Vec<String>,
    /// New connections to the pod's guard and preStop listeners: made,
    /// failed, and the failures.
    probes: (u64, u64, Vec<String>),
    /// `net.ipv4.tcp_migrate_req` in the pod's namespace at the end.
    migrate_req: String,
    logs: String,
}

/// `net.ipv4.tcp_migrate_req` as a namespace's own threads read it.
async fn migrate_req_in(ns: &Netns) -> String {
    ns.run(|| std::fs::read_to_string(drainshim::node::netns::TCP_MIGRATE_REQ))
        .await
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// Five rolling updates with no hand-over socket: each new agent binds
/// every listener beside the old one (SO_REUSEPORT), then the old one gets
/// SIGTERM, ends its streams over its window and closes its listeners,
/// while unary calls run at full speed through an Envoy with no retry
/// policy. `migrate` is `--tcp-migrate-req`.
async fn side_by_side(tag: &str, migrate: bool) -> SideBySide {
    let lab = Lab::new(tag);
    let pod = no_retry_pod(&lab, "solo", "1.40.0").await;
    let name = pod.name.clone();
    let (_dir, _no_socket, listen) = handover_setup();
    let flags = [
        "--handover-window",
        "2s",
        "--tcp-migrate-req",
        if migrate { "true" } else { "false" },
    ];

    let mut old = agent_bin(&lab, listen, &flags).await;
    wait_guards(listen, &[&name]).await;
    let before = pod_host_requests(&pod, GUARD_LISTEN).await.unwrap_or(0);
    let load = Unary::with_workers(pod.inbound(), HEAVY_WORKERS, 200);
    wait_pod_host(&pod, GUARD_LISTEN, before).await;
    let streams = open_streams(pod.inbound(), LONG, &name, Duration::from_secs(120))
        .await
        .expect("streams open");
    load.wait_more(CALLS_PER_STEP, "before the hand-overs")
        .await;
    // New connections all along, straight to the listeners the agents
    // share: a connection left in a closing listener's queue fails here.
    let stop = CancellationToken::new();
    let mut probes = Vec::new();
    for i in 0..GUARD_PROBERS {
        let ns = pod.ns.handle();
        probes.push(probe(
            stop.clone(),
            format!("guard prober {i}"),
            move || {
                let ns = ns.clone();
                async move { guard_exchange(&ns).await }
            },
        ));
    }
    let prestop = pod.prestop();
    probes.push(probe(stop.clone(), "preStop".into(), move || async move {
        match http_in(None, prestop, "GET", "/healthz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    }));
    wait_probes(&probes, 20, "before the hand-overs").await;

    let (start, made) = (Instant::now(), load.made());
    let mut sigterms = Vec::new();
    let mut logs = Vec::new();
    for round in 1..=ROUNDS {
        // The new agent binds beside the old one: no socket to ask.
        let new = agent_bin(&lab, listen, &flags).await;
        new.wait_log("stream guard serving inside the pod").await;
        assert!(
            !new.log().contains("no stream guard for this pod"),
            "round {round}: the new agent could not bind beside the old one:\n{}",
            new.log()
        );
        load.wait_more(
            HEAVY_STEP,
            &format!("side by side {round}: both agents run"),
        )
        .await;
        nix::sys::signal::kill(old.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        sigterms.push(Instant::now());
        reap(&mut old, &format!("side by side {round}: the old agent")).await;
        load.wait_more(
            HEAVY_STEP,
            &format!("side by side {round}: after the old agent exited"),
        )
        .await;
        logs.push(old.log());
        old = new;
    }
    let during = (load.made() - made, start.elapsed());
    stop.cancel();
    let calls = load.finish().await;
    let probed = probes.iter().map(|p| p.made.load(Ordering::Relaxed)).sum();
    let refused = probes
        .iter()
        .map(|p| p.failed.load(Ordering::Relaxed))
        .sum();
    let errors = probes
        .iter()
        .flat_map(|p| p.errors.lock().map(|e| e.clone()).unwrap_or_default())
        .collect();
    let (_, cut) = stream_ends(streams).await;
    let (failed, hung) = by_nearest_sigterm(&calls, &sigterms);
    let migrate_req = migrate_req_in(&pod.ns.handle()).await;
    SideBySide {
        calls,
        during,
        failed,
        hung,
        cut,
        probes: (probed, refused, errors),
        migrate_req,
        logs: logs.join("\n-----\n"),
    }
}

/// Issue 59 item 4: five rolling updates in a row with NO hand-over socket
/// (an operator who left it out, a predecessor that crashed), at the
/// heaviest load, no retry policy: not one call fails or hangs, no stream
/// is cut. The agents set `net.ipv4.tcp_migrate_req=1` in the pod's
/// namespace (and never in the node's), so the connections queued on the
/// old agent's closing listeners move to the new agent's. The same run
/// without it (`--tcp-migrate-req false`, a fresh pod) is printed beside as
/// the baseline: the failures it may show are what the setting removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hand_overs_without_the_socket_fail_nothing() {
    let host_before = std::fs::read_to_string(drainshim::node::netns::TCP_MIGRATE_REQ);
    let summary = |what: &str, r: &SideBySide| {
        let (n, took) = r.during;
        eprintln!(
            "{what}: {ROUNDS} hand-overs without the socket ({HEAVY_WORKERS} workers, no retries): \
             {} unary calls, {n} in {:.1} s of hand-overs ({:.0} calls/s), {} failed, {} hung; \
             {} of {LONG} long streams cut; {} new connections to the shared listeners, {} failed; \
             pod tcp_migrate_req {}",
            r.calls.len(),
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64().max(0.001),
            r.failed.len(),
            r.hung.len(),
            r.cut.len(),
            r.probes.0,
            r.probes.1,
            r.migrate_req,
        );
        for f in r
            .failed
            .iter()
            .chain(r.hung.iter())
            .chain(r.probes.2.iter())
            .take(10)
        {
            eprintln!("  {f}");
        }
    };
    let baseline = side_by_side("b", false).await;
    summary("baseline (--tcp-migrate-req false)", &baseline);
    assert_eq!(
        baseline.migrate_req, "0",
        "the baseline's pod kept the kernel's default"
    );
    let fixed = side_by_side("m", true).await;
    summary("with tcp_migrate_req", &fixed);
    assert_eq!(
        fixed.migrate_req, "1",
        "the agent set it in the pod's namespace"
    );
    assert_eq!(
        std::fs::read_to_string(drainshim::node::netns::TCP_MIGRATE_REQ).ok(),
        host_before.ok(),
        "the node's own namespace is left alone"
    );
    let logs = format!("the old agents' logs:\n{}", fixed.logs);
    assert_no_failed_or_hung(fixed.calls.len(), (&fixed.failed, &fixed.hung), &logs);
    assert!(fixed.cut.is_empty(), "cut streams: {:?}", fixed.cut);
    assert_eq!(
        fixed.probes.1, 0,
        "new connections failed: {:?}\n{logs}",
        fixed.probes.2
    );
}

/// Connection probers to each pod's guard, besides the preStop one.
const GUARD_PROBERS: usize = 4;
