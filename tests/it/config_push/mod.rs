//! A config push never cuts a long stream (issue 59 item 2): real Envoy
//! 1.40 whose inbound listeners come from a file (LDS `path_config_source`,
//! updated by a move over the watched path, as a control plane's push
//! lands), with no retry policy, in front of servers users run: grpc-go,
//! grpcio (gRPC server streams, tonic clients) and Python `websockets`
//! (WebSockets, Python `websockets` clients).
//!
//! - **A listener-level push** (every listener's stat prefix changed):
//!   Envoy replaces each listener and drains the old one over its
//!   `--drain-time-s`, then closes what is left. Side by side, from one push:
//!   the baseline (Envoy straight to the apps) cuts every stream at the
//!   drain's end; behind the real `drainshim sidecar`'s guard every stream
//!   ends gracefully (gRPC UNAVAILABLE with the guard's config-push message,
//!   WebSocket Close 1012) before Envoy's close, gapless, nothing lost (the
//!   app's own count of what its transport took), counted as
//!   `reason="config_push"` and never as ungraceful, spread over the window
//!   (peak over mean, in one-second buckets).
//! - **A filter-chain-only push**: one listener, two chains told apart by
//!   the client's source address; only the changed chain drains, and only
//!   its streams end; the other chain's streams still flow after Envoy's
//!   close.
//! - **Two pushes inside one window**, with clients that open their stream
//!   again after each end, as a gRPC client does: no stream is ever cut.
//!
//! Fails (never skips) without the cached Envoy, Python venv or peers.

mod rig;

use crate::peer_matrix::clients::{classify, client, describe, End, Shape};
use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drainshim::guard::end_message;
use drainshim::metrics::Reason;
use support::peers::{tail, PeerApp, Server};
use support::*;
use tokio::time::Instant;
use tonic::transport::Endpoint;

use rig::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_push_cuts_every_stream_without_drainshim_and_none_behind_it() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let py = PeerApp::start(Server::Grpcio).await;
    let ws = ws_server().await;

    // Behind drainshim: one sidecar (guard) per app.
    let guarded_admin = free_port();
    let mut shims = Vec::new();
    for app in [go.addr, py.addr, ws.addr] {
        shims.push(guard_sidecar_bin(guarded_admin, ANY_PORT, app, GUARD_FLAGS).await);
    }
    let (g_go, g_py, g_ws) = (shims[0].guard(), shims[1].guard(), shims[2].guard());
    let listeners = |base: &str| -> Vec<(Inbound, Vec<Chain>)> {
        let name = |n: &str| -> &'static str { Box::leak(format!("{base}-{n}").into_boxed_str()) };
        [
            ("go", true, false),
            ("py", true, false),
            ("ws", false, true),
        ]
        .into_iter()
        .map(|(n, _, websocket)| {
            let l = Inbound {
                // The harness waits for a listener named so.
                name: if n == "go" { "inbound" } else { name(n) },
                port: free_port(),
                cluster: name(n),
                websocket,
            };
            let chains = vec![(name("fc"), None, format!("{}_http", l.name))];
            (l, chains)
        })
        .collect()
    };
    let (dir_b, dir_g) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let (lb, lg) = (listeners("base"), listeners("guarded"));
    push(dir_b.path(), &lds(&lb, "v1"));
    push(dir_g.path(), &lds(&lg, "v1"));
    let base_admin = free_port();
    let _base = lds_envoy(
        dir_b.path(),
        base_admin,
        &[
            (lb[0].0.cluster, go.addr, true),
            (lb[1].0.cluster, py.addr, true),
            (lb[2].0.cluster, ws.addr, false),
        ],
    )
    .await;
    let _guarded = lds_envoy(
        dir_g.path(),
        guarded_admin,
        &[
            (lg[0].0.cluster, g_go, true),
            (lg[1].0.cluster, g_py, true),
            (lg[2].0.cluster, g_ws, false),
        ],
    )
    .await;
    let ports: Vec<u16> = lb.iter().chain(&lg).map(|(l, _)| l.port).collect();
    wait_listening(&ports).await;
    let at = |l: &Inbound| SocketAddr::from(([127, 0, 0, 1], l.port));

    let deadline = Instant::now() + CLIENT_LIMIT;
    let mut grpc = Vec::new();
    for (mode, ls) in [("b", &lb), ("g", &lg)] {
        for (i, who) in ["go", "py"].into_iter().enumerate() {
            let prefix = format!("{mode}-{who}-");
            grpc.push(grpc_clients(at(&ls[i].0), None, &prefix, GRPC_STREAMS, 1, deadline).await);
        }
    }
    let ws_base = ws_clients(at(&lb[2].0), "b-ws-", WS_STREAMS).await;
    let ws_guarded = ws_clients(at(&lg[2].0), "g-ws-", WS_STREAMS).await;
    // The guard takes a stream as long-lived once answered 1 s ago.
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    // One push to both Envoys, as a control plane's new generation lands.
    let pushed = Instant::now();
    push(dir_b.path(), &lds(&lb, "v2"));
    push(dir_g.path(), &lds(&lg, "v2"));

    let mut subs = Vec::new();
    for tasks in grpc {
        subs.push(join_all(tasks).await);
    }
    let ws_b = ws_base.await.expect("ws clients");
    let ws_g = ws_guarded.await.expect("ws clients");
    let closed_at = ENVOY_DRAIN_TIME;

    let (b_go, n1) = grpc_row(&subs[0], &go, pushed);
    let (b_py, n2) = grpc_row(&subs[1], &py, pushed);
    let (g_go_row, n3) = grpc_row(&subs[2], &go, pushed);
    let (g_py_row, n4) = grpc_row(&subs[3], &py, pushed);
    // Wait for the ws server's account of every guarded connection.
    wait_for("the ws server accounts for every connection", WAIT, || {
        let n = ws
            .ended
            .lock()
            .map(|e| e.keys().filter(|k| k.starts_with("g-ws-")).count())
            .unwrap_or(0);
        std::future::ready(n == WS_STREAMS)
    })
    .await;
    let (b_ws, n5) = ws_row(&ws_b, &ws);
    let (g_ws_row, n6) = ws_row(&ws_g, &ws);
    let mut table = String::from(
        "## A config push (an LDS update of every inbound listener), Envoy 1.40, no retry policy\n\n\
         | a listener-level push | streams | graceful | cut | other | lost | storm (peak/mean, 1 s) |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for (row, what) in [
        (&b_go, "baseline, grpc-go"),
        (&b_py, "baseline, grpcio"),
        (&b_ws, "baseline, websockets"),
        (&g_go_row, "drainshim, grpc-go"),
        (&g_py_row, "drainshim, grpcio"),
        (&g_ws_row, "drainshim, websockets"),
    ] {
        table.push_str(&row.line(what));
        table.push('\n');
    }
    eprintln!("{table}");
    // Kept for `make test`, which prints it at its end beside the peer
    // matrix's tables (cargo hides a passing test's output).
    let tables = Path::new(env!("CARGO_TARGET_TMPDIR")).join("peer-matrix");
    if let Err(e) = std::fs::create_dir_all(&tables)
        .and_then(|()| std::fs::write(tables.join("config-push.md"), &table))
    {
        eprintln!(
            "config push: could not keep the table in {}: {e}",
            tables.display()
        );
    }
    // The baseline: Envoy closed every connection at the drain's end.
    for (row, notes, what) in [
        (&b_go, &n1, "grpc-go"),
        (&b_py, &n2, "grpcio"),
        (&b_ws, &n5, "websockets"),
    ] {
        assert_eq!(
            row.cut, row.streams,
            "baseline {what}: every stream cut; {notes:?}"
        );
    }
    let earliest_cut = subs[0]
        .iter()
        .chain(&subs[1])
        .map(|s| s.ended_at.duration_since(pushed))
        .min()
        .unwrap_or_default();
    assert!(
        earliest_cut + Duration::from_secs(1) >= closed_at,
        "the baseline's cuts come at Envoy's drain end ({closed_at:?}), the first came {earliest_cut:?} after the push"
    );
    assert_eq!(ws_b.unfinished + ws_g.unfinished, 0);
    // Behind drainshim: every stream graceful, nothing lost, spread.
    for (row, notes, what, want) in [
        (&g_go_row, &n3, "grpc-go", GRPC_STREAMS),
        (&g_py_row, &n4, "grpcio", GRPC_STREAMS),
        (&g_ws_row, &n6, "websockets", WS_STREAMS),
    ] {
        assert_eq!(row.streams, want, "{what}");
        assert_eq!(
            row.graceful, want,
            "drainshim {what}: every stream graceful; {notes:?}"
        );
        assert_eq!(row.lost, 0, "drainshim {what}: nothing lost; {notes:?}");
        assert!(notes.is_empty(), "drainshim {what}: {notes:?}");
    }
    // The reconnects Envoy's callers see: the gRPC endings of both guards
    // (one clock, the test's), and the WebSockets' (the Python clients').
    let grpc_storm = storm([g_go_row.ends.clone(), g_py_row.ends.clone()].concat());
    eprintln!(
        "storm, every gRPC ending: {grpc_storm:.2}; every WebSocket's: {:.2}",
        g_ws_row.storm
    );
    assert!(grpc_storm <= STORM, "gRPC storm {grpc_storm:.2}");
    assert!(
        g_ws_row.storm <= STORM,
        "WebSocket storm {:.2}",
        g_ws_row.storm
    );
    for (shim, want, protocol) in [
        (&shims[0], GRPC_STREAMS, "grpc"),
        (&shims[1], GRPC_STREAMS, "grpc"),
        (&shims[2], WS_STREAMS, "websocket"),
    ] {
        // Counted once the goodbye is written, which the client may read first.
        let addr = shim.addr;
        let counted = || async move {
            series(
                addr,
                "drainshim_streams_terminated_total{",
                "reason=\"config_push\"",
            )
            .await
        };
        let what = format!("{protocol}: counted as config-push endings");
        let _ = tokio::time::timeout(WAIT, async {
            while counted().await < want as f64 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        let (_, text) = http(addr, "GET", "/metrics").await;
        let families: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("drainshim_streams_") && !l.ends_with(" 0"))
            .collect();
        assert_eq!(
            counted().await,
            want as f64,
            "{what}\n{families:#?}\n{}",
            tail(&shim.log(), 30)
        );
        let cut = series(shim.addr, "drainshim_streams_ungraceful_total{", "").await;
        assert_eq!(cut, 0.0, "{protocol}: none ungraceful");
        let drained = series(
            shim.addr,
            "drainshim_streams_terminated_total{",
            "reason=\"drain\"",
        )
        .await;
        assert_eq!(drained, 0.0, "{protocol}: the pod did not drain");
    }
}

/// Waits until every stream counted in `counts` received more messages.
async fn flows_on(counts: &[Arc<AtomicUsize>], what: &str) {
    let before: Vec<usize> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    wait_for(what, WAIT, || {
        let now = counts.iter().map(|c| c.load(Ordering::Relaxed));
        std::future::ready(now.zip(&before).all(|(n, b)| n > *b))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_chain_push_ends_only_that_chains_streams() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let admin = free_port();
    let shim = guard_sidecar_bin(admin, ANY_PORT, go.addr, GUARD_FLAGS).await;
    let g = shim.guard();
    let (one, two): (IpAddr, IpAddr) = ([127, 0, 0, 2].into(), [127, 0, 0, 3].into());
    let l = Inbound {
        name: "inbound",
        port: free_port(),
        cluster: "guard",
        websocket: false,
    };
    let chains = |one_prefix: &str| -> Vec<(Inbound, Vec<Chain>)> {
        vec![(
            l.clone(),
            vec![
                ("one", Some(one), one_prefix.to_string()),
                ("two", Some(two), "two_http".to_string()),
            ],
        )]
    };
    let dir = tempfile::tempdir().expect("dir");
    push(dir.path(), &lds(&chains("one_http"), "v1"));
    let envoy = lds_envoy(dir.path(), admin, &[("guard", g, true)]).await;
    wait_listening(&[l.port]).await;
    let addr = SocketAddr::from(([127, 0, 0, 1], l.port));
    let deadline = Instant::now() + CLIENT_LIMIT;
    const N: usize = 20;
    let on_one = grpc_clients(addr, Some(one), "one-", N, 1, deadline).await;
    let (stop_two, stopped) = tokio::sync::watch::channel(false);
    let two_counts: Vec<Arc<AtomicUsize>> = (0..N).map(|_| Arc::default()).collect();
    let mut on_two = Vec::new();
    {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .local_address(Some(two))
            .connect()
            .await
            .expect("connect");
        for (i, c) in two_counts.iter().enumerate() {
            let (ch, c, mut stopped) = (ch.clone(), c.clone(), stopped.clone());
            on_two.push(tokio::spawn(async move {
                let shape = Shape {
                    interval_ms: GRPC_INTERVAL_MS,
                    payload_bytes: 64,
                    hold: None,
                };
                tokio::select! {
                    subs = client(ch, format!("two-{i}"), shape, 1, c, deadline) => Some(subs),
                    _ = stopped.wait_for(|s| *s) => None,
                }
            }));
        }
    }
    wait_for("chain two's streams flow", WAIT, || {
        std::future::ready(two_counts.iter().all(|c| c.load(Ordering::Relaxed) >= 2))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    push(dir.path(), &lds(&chains("one_http_v2"), "v1"));
    let admin_client = envoy.admin_client();
    wait_for("envoy updated the listener in place", WAIT, || async {
        admin_client
            .listener_manager()
            .await
            .is_ok_and(|m| m.in_place_updated == 1)
    })
    .await;
    let subs = join_all(on_one).await;
    let (row, notes) = grpc_row(&subs, &go, pushed);
    eprintln!(
        "| filter-chain push, chain one | {} graceful of {}, {} cut, {} lost |",
        row.graceful, row.streams, row.cut, row.lost
    );
    assert_eq!(row.graceful, N, "{notes:?}");
    assert_eq!(row.lost, 0, "{notes:?}");
    // Past Envoy's close of chain one's connections (its draining chain
    // gone), chain two still flows.
    wait_for(
        "envoy closed chain one's drained connections",
        WAIT,
        || async {
            admin_client
                .listener_manager()
                .await
                .is_ok_and(|m| m.filter_chains_draining == 0)
        },
    )
    .await;
    flows_on(
        &two_counts,
        "chain two's streams still flow after the drain's end",
    )
    .await;
    for t in &on_two {
        assert!(!t.is_finished(), "a stream of chain two ended");
    }
    // A push that only adds a chain drains nothing: nothing more ends.
    let three: IpAddr = [127, 0, 0, 4].into();
    let mut more = chains("one_http_v2");
    more[0]
        .1
        .push(("three", Some(three), "three_http".to_string()));
    push(dir.path(), &lds(&more, "v1"));
    let shim_addr = shim.addr;
    wait_for("the shim saw the chain added", WAIT, || async move {
        series(
            shim_addr,
            "drainshim_envoy_listener_drains_total{",
            "kind=\"filter_chains\"",
        )
        .await
            >= 2.0
    })
    .await;
    flows_on(
        &two_counts,
        "chain two's streams flow on after the chain was added",
    )
    .await;
    for t in &on_two {
        assert!(
            !t.is_finished(),
            "a stream of chain two ended after a chain was added"
        );
    }
    let _ = stop_two.send(true);
    for t in on_two {
        assert!(
            t.await.expect("task").is_none(),
            "chain two's streams were never ended"
        );
    }
    let addr = shim.addr;
    let counted = || async move {
        series(
            addr,
            "drainshim_streams_terminated_total{",
            "reason=\"config_push\"",
        )
        .await
    };
    wait_for("chain one's endings counted", WAIT, || async {
        counted().await >= N as f64
    })
    .await;
    assert_eq!(
        counted().await,
        N as f64,
        "only chain one's streams\n{}",
        tail(&shim.log(), 30)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pushes_in_one_window_cut_nothing_for_clients_that_come_back() {
    let py = PeerApp::start(Server::Grpcio).await;
    let pod = OneListener::start(py.addr, "1.40.0", Headers::All, GUARD_FLAGS).await;
    let (shim, addr) = (&pod.shim, pod.addr);
    const N: usize = 40;
    // Clients come back after each end; the test ends them after both windows.
    let until = Instant::now() + ENVOY_DRAIN_TIME * 2 + Duration::from_secs(6);
    let tasks = grpc_clients(addr, None, "c-", N, 8, until).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    pod.push("v2");
    let admin_client = pod.envoy.admin_client();
    wait_for("envoy took the first push", WAIT, || async {
        admin_client
            .listener_manager()
            .await
            .is_ok_and(|m| m.modified == 1)
    })
    .await;
    // The second inside the first's window, once some streams came back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pod.push("v3");
    wait_for("envoy took the second push", WAIT, || async {
        admin_client
            .listener_manager()
            .await
            .is_ok_and(|m| m.modified == 2)
    })
    .await;
    let subs = join_all(tasks).await;
    let graceful = [end_message(Reason::config_push)];
    let told = py.streams();
    let (mut cut, mut unsent) = (Vec::new(), Vec::new());
    let mut ended_gracefully = 0;
    for s in &subs {
        let line = || {
            format!(
                "{} at {:?} after the first push, {} messages: {}",
                s.id,
                s.ended_at.duration_since(pushed),
                s.seqs.len(),
                describe(&s.status)
            )
        };
        match classify(s, &graceful) {
            End::Graceful => ended_gracefully += 1,
            End::Cut if never_sent(s, &told) => unsent.push(line()),
            End::Cut => cut.push(line()),
            // The test's own limit ended the last call of each client.
            _ => {}
        }
        assert!(
            s.gapless() || s.seqs.is_empty(),
            "{} has gaps: {:?}",
            s.id,
            s.seqs
        );
    }
    let (row, _) = grpc_row(&subs, &py, pushed);
    eprintln!(
        "| two pushes in one window | {} calls, {ended_gracefully} ended by a push, {} cut, {} lost; {} calls opened again never sent (tonic, Envoy's GOAWAY) |",
        subs.len(),
        cut.len(),
        row.lost,
        unsent.len()
    );
    if !unsent.is_empty() {
        eprintln!("never sent: {unsent:#?}");
    }
    assert!(cut.is_empty(), "{cut:#?}\n{}", tail(&shim.log(), 60));
    assert!(
        ended_gracefully >= N,
        "every first call ended by the first push"
    );
    assert_eq!(row.lost, 0);
    let ungraceful = series(shim.addr, "drainshim_streams_ungraceful_total{", "").await;
    assert_eq!(ungraceful, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_during_the_pods_drain_cuts_nothing() {
    let go = PeerApp::start(Server::GrpcGo).await;
    let mut flags = GUARD_FLAGS.to_vec();
    // The pod's drain: 2 s deregistration, then its endings over 4 s.
    flags.extend([
        "--deregistration-delay",
        "2s",
        "--min-drain-time",
        "500ms",
        "--drain-time",
        "6s",
        "--parent-shutdown-time",
        "20s",
    ]);
    let pod = OneListener::start(go.addr, "1.40.0", Headers::All, &flags).await;
    let (shim, addr) = (&pod.shim, pod.addr);
    const N: usize = 40;
    let tasks = grpc_clients(addr, None, "d-", N, 1, Instant::now() + CLIENT_LIMIT).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let drain = tokio::spawn(prestop(shim.addr));
    // The push lands in the drain's deregistration delay, before Envoy's
    // listeners are stopped: Envoy drains the replaced listener too.
    let admin_client = pod.envoy.admin_client();
    wait_for(
        "the pod's drain failed envoy's health check",
        WAIT,
        || async { matches!(admin_client.ready().await, Ok(false)) },
    )
    .await;
    let pushed = Instant::now();
    pod.push("v2");
    let subs = join_all(tasks).await;
    let run = drain.await.expect("prestop");
    let graceful = [end_message(Reason::drain), end_message(Reason::config_push)];
    let mut bad = Vec::new();
    for s in &subs {
        if classify(s, &graceful) != End::Graceful || !s.gapless() {
            bad.push(format!(
                "{}: {} ({} messages)",
                s.id,
                describe(&s.status),
                s.seqs.len()
            ));
        }
    }
    let (row, _) = grpc_row(&subs, &go, pushed);
    let m = admin_client
        .listener_manager()
        .await
        .expect("listener_manager");
    eprintln!(
        "| a push during the pod's drain | {} streams, {} graceful, {} lost; envoy counted {} listener update(s) |",
        subs.len(),
        subs.len() - bad.len(),
        row.lost,
        m.modified
    );
    assert!(bad.is_empty(), "{bad:#?}\n{}", tail(&shim.log(), 40));
    assert_eq!(row.lost, 0);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let ungraceful = series(shim.addr, "drainshim_streams_ungraceful_total{", "").await;
    assert_eq!(ungraceful, 0.0);
}

/// One listener-level push on Envoy `release` whose route adds `headers`,
/// with 40 grpc-go streams open: every one ends gracefully, nothing lost.
async fn one_push_ends_every_stream(release: &str, headers: Headers, what: &str) {
    let go = PeerApp::start(Server::GrpcGo).await;
    let pod = OneListener::start(go.addr, release, headers, GUARD_FLAGS).await;
    const N: usize = 40;
    let tasks = grpc_clients(pod.addr, None, "o-", N, 1, Instant::now() + CLIENT_LIMIT).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let pushed = Instant::now();
    pod.push("v2");
    let subs = join_all(tasks).await;
    let (row, notes) = grpc_row(&subs, &go, pushed);
    eprintln!(
        "| {what} | {} graceful of {}, {} cut, {} lost |",
        row.graceful, row.streams, row.cut, row.lost
    );
    assert_eq!(
        row.graceful,
        N,
        "{what}: {notes:?}\n{}",
        tail(&pod.shim.log(), 30)
    );
    assert_eq!(row.lost, 0, "{what}: {notes:?}");
}

/// Without Envoy's origin headers (a user's own routes), the guard goes by
/// time: every stream open when the drain began ends gracefully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_origin_headers_the_streams_open_at_the_push_end_gracefully() {
    one_push_ends_every_stream("1.40.0", Headers::None, "no origin headers (by time)").await;
}

/// The oldest release tested (1.36.4) has the connection and filter-chain
/// formatters but not `%LISTENER_NAME%`: with the two headers it has, a
/// push's streams end gracefully as on 1.40.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_envoy_1_36_the_two_headers_it_has_are_enough() {
    one_push_ends_every_stream("1.36.4", Headers::NoListener, "Envoy 1.36.4, two headers").await;
}
