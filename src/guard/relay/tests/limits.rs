//! The relay's own bounds on what a peer may make it keep.

use super::*;

/// Issue 55 review: the client's HPACK table is the guard's memory: an app
/// that allows a table of 2^31 bytes gets its clients told 64 KiB at most.
#[tokio::test]
async fn the_client_s_hpack_table_is_capped_whatever_the_app_allows() {
    let guard = test_guard();
    let mut r = test_relay(&guard);
    let mut huge = Vec::new();
    huge.extend_from_slice(&wire::HEADER_TABLE_SIZE.to_be_bytes());
    huge.extend_from_slice(&(1u32 << 31).to_be_bytes());
    wire::put(&mut r.app.peer.read, wire::SETTINGS, 0, 0, &huge);
    r.app_frames(Instant::now()).expect("the app's SETTINGS");
    let settings = frames_in(&r.client.peer.write)
        .into_iter()
        .find(|f| f.0 == wire::SETTINGS)
        .expect("SETTINGS to the client");
    let told: Vec<(u16, u32)> = settings
        .3
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    assert!(
        told.contains(&(wire::HEADER_TABLE_SIZE, MAX_CLIENT_TABLE)),
        "{told:?}"
    );
}

/// Issue 55 review (RFC 9113 §6.5.3): the app lowers its
/// MAX_CONCURRENT_STREAMS; until the client acks, it may still open streams
/// up to the old limit, and they reach the app. Once it acked, a stream past
/// the new limit is refused here.
#[tokio::test]
async fn a_lower_stream_limit_binds_once_the_client_acked_it() {
    let guard = test_guard();
    let now = Instant::now();
    let mut r = handshaken(&guard, now);
    request(&mut r, 1, now);
    let mut one = Vec::new();
    one.extend_from_slice(&wire::MAX_CONCURRENT_STREAMS.to_be_bytes());
    one.extend_from_slice(&1u32.to_be_bytes());
    wire::put(&mut r.app.peer.read, wire::SETTINGS, 0, 0, &one);
    r.app_frames(now).expect("the app's SETTINGS");
    r.client.peer.write.clear();
    r.app.peer.write.clear();
    // Not acked yet: stream 3 goes to the app.
    request(&mut r, 3, now);
    let to_app = frames_in(&r.app.peer.write);
    assert!(
        to_app.iter().any(|f| f.0 == wire::HEADERS && f.2 == 3),
        "{to_app:?}"
    );
    assert!(!frames_in(&r.client.peer.write)
        .iter()
        .any(|f| f.0 == wire::RST_STREAM && f.2 == 3));
    // The client acks both SETTINGS it was sent (the handshake's and the
    // lower limit): stream 5 is past the limit it agreed to.
    for _ in 0..2 {
        wire::put(&mut r.client.peer.read, wire::SETTINGS, wire::ACK, 0, &[]);
    }
    r.client_frames(now).expect("the client's acks");
    r.app.peer.write.clear();
    request(&mut r, 5, now);
    assert!(!frames_in(&r.app.peer.write)
        .iter()
        .any(|f| f.0 == wire::HEADERS && f.2 == 5));
    let refused = frames_in(&r.client.peer.write)
        .into_iter()
        .find(|f| f.0 == wire::RST_STREAM && f.2 == 5)
        .expect("stream 5 refused");
    assert_eq!(refused.3, wire::REFUSED_STREAM.to_be_bytes());
}
