//! The WebSockets the guard serves itself (local streams): what they hold,
//! and the windows both ways.

use super::*;

/// A local stream `id` as the relay holds it once answered: its task's end
/// of the stream is a duplex of 16 bytes (kept, so writes do not fail),
/// and the client's DATA not yet taken is `held` bytes.
fn local(r: &mut Relay<'_>, id: u32, held: usize) -> tokio::io::DuplexStream {
    let (task_io, io) = tokio::io::duplex(16);
    r.client.ids.set_last(r.client.ids.last().max(id));
    r.locals.insert(
        id,
        Local {
            io,
            answer: None,
            answered: true,
            window: r.window.initial(),
            recv_window: r.window.told() - held as i64,
            to_task: BytesMut::from(&vec![7u8; held][..]),
            client_eof: false,
            shut: false,
            task_eof: false,
        },
    );
    task_io
}

/// Polls the local streams once, with a waker that does nothing.
fn poll_locals_once(r: &mut Relay<'_>) {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let _ = r
        .locals
        .poll(&mut cx, &mut r.client.peer, &mut r.window, &mut r.settings);
}

#[tokio::test]
async fn a_local_stream_gives_back_what_it_held_however_it_ends() {
    // Every byte of the client's DATA is given back to its connection
    // window exactly once: as the task takes it (16 bytes fit the duplex),
    // or when the stream goes with the rest still held.
    type Finish = fn(&mut Relay<'_>);
    let endings: [(&str, Finish); 5] = [
        ("the client's RST_STREAM", |r| {
            from_client(r, &frame(wire::RST_STREAM, 0, 1, &[0, 0, 0, 8])).expect("reset");
        }),
        ("a refused upgrade", |r| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let l = r.locals.get_mut(&1).unwrap();
            (l.answer, l.answered) = (Some(rx), false);
            let mut no = http::Response::new(());
            *no.status_mut() = StatusCode::UNAUTHORIZED;
            tx.send((no, true)).ok();
        }),
        ("its task gone before it answered", |r| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let l = r.locals.get_mut(&1).unwrap();
            (l.answer, l.answered) = (Some(rx), false);
            drop(tx);
        }),
        ("both sides over", |r| {
            let l = r.locals.get_mut(&1).unwrap();
            (l.task_eof, l.client_eof) = (true, true);
        }),
        ("a stream error", |r| {
            let update = frame(wire::WINDOW_UPDATE, 0, 1, &0u32.to_be_bytes());
            from_client(r, &update).expect("a stream error, not the connection's");
        }),
    ];
    for (what, end) in endings {
        let guard = test_guard();
        let mut r = open_relay(&guard);
        let _task = local(&mut r, 1, 1_000);
        end(&mut r);
        poll_locals_once(&mut r);
        poll_locals_once(&mut r);
        assert!(r.locals.is_empty(), "{what}: the stream is gone");
        assert_eq!(credit_in(&r.client.peer.write, 0), 1_000, "{what}");
    }
}

#[tokio::test]
async fn client_data_for_a_local_stream_stays_within_the_window_granted() {
    let guard = test_guard();
    let mut r = open_relay(&guard);
    let _task = local(&mut r, 1, 0);
    // 65,535 bytes (the default window the client was told) are taken; the
    // task takes 16 of them, and the window grows by those.
    for _ in 0..3 {
        from_client(&mut r, &frame(wire::DATA, 0, 1, &[1u8; 16_384])).expect("within");
    }
    from_client(&mut r, &frame(wire::DATA, 0, 1, &[1u8; 16_383])).expect("within");
    poll_locals_once(&mut r);
    assert_eq!(r.locals.get(&1).map(|l| l.to_task.len()), Some(65_535 - 16));
    from_client(&mut r, &frame(wire::DATA, 0, 1, &[1u8; 16])).expect("topped up");
    // One byte more than the window is FLOW_CONTROL_ERROR on the stream,
    // and everything held is given back.
    from_client(&mut r, &frame(wire::DATA, 0, 1, &[1u8; 1])).expect("a stream error");
    assert!(r.locals.is_empty());
    let resets: Vec<_> = frames_in(&r.client.peer.write)
        .into_iter()
        .filter(|f| f.0 == wire::RST_STREAM)
        .collect();
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0].3, wire::FLOW_CONTROL_ERROR.to_be_bytes());
    assert_eq!(credit_in(&r.client.peer.write, 0), 65_535 + 16 + 1);
}

#[tokio::test]
async fn a_local_window_update_of_zero_or_past_the_maximum_is_a_stream_error() {
    for (increment, code) in [
        (0, wire::PROTOCOL_ERROR),
        (wire::MAX_STREAM_ID, wire::FLOW_CONTROL_ERROR),
    ] {
        let guard = test_guard();
        let mut r = open_relay(&guard);
        let _task = local(&mut r, 1, 0);
        let update = frame(wire::WINDOW_UPDATE, 0, 1, &increment.to_be_bytes());
        from_client(&mut r, &update).expect("a stream error, not the connection's");
        assert!(r.locals.is_empty(), "increment {increment}");
        let reset = frames_in(&r.client.peer.write)
            .into_iter()
            .find(|f| f.0 == wire::RST_STREAM)
            .expect("RST_STREAM");
        assert_eq!((reset.2, reset.3), (1, code.to_be_bytes().to_vec()));
    }
}
