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
    wire::put(&mut r.app.read, wire::SETTINGS, 0, 0, &huge);
    r.app_frames(Instant::now()).expect("the app's SETTINGS");
    let settings = frames_in(&r.client.write)
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
