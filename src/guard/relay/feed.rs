//! The relay without sockets, for the `frame_relay` fuzz target: reads
//! from either peer, a drain's ask to end every stream, and the clock
//! moved on, fed to one connection's state; what it writes is dropped.

use tokio::time::Instant;

use super::failure::Failure;
use super::limits::{MAX_FRAME, READ_BUF};
use super::settings::MAX_UNACKED_SETTINGS;
use super::Relay;
use crate::guard::conn::ConnInfo;
use crate::guard::handle::Handle;

/// One step of [`feed`].
#[doc(hidden)]
pub enum FeedStep<'a> {
    /// Bytes read from the client (true) or the application (false).
    Read(bool, &'a [u8]),
    /// A drain asks every stream of the connection to end.
    EndAll,
    /// The clock moves on this long, and the relay's timers run.
    Wait(std::time::Duration),
}

/// The GOAWAY probe's data in [`feed`]: fixed, so a fuzzer can ack it.
const FEED_PROBE: [u8; 8] = *b"dsgoaway";

/// Feeds one connection's steps to a relay with no sockets: reads from the
/// client or the application, a drain's ask to end every stream, the clock
/// moved on; what the relay writes is dropped. For the fuzz target:
/// whatever the peers send, the relay must neither panic nor hold more
/// than its bounds. Runs inside a tokio runtime (a WebSocket over HTTP/2
/// starts a task). `alone`: the relay has no application, and the
/// application's reads are dropped.
pub fn feed(guard: &Handle, steps: &[FeedStep<'_>], alone: bool) {
    let info = ConnInfo {
        id: u64::MAX,
        peer: std::net::SocketAddr::from(([127, 0, 0, 1], 1)),
        accepted_at: Instant::now(),
    };
    let mut relay = Relay::new(guard, info, alone);
    relay.life.set_probe(FEED_PROBE);
    let mut now = Instant::now();
    for step in steps {
        let mut read = 0;
        let result = match *step {
            FeedStep::Read(false, _) if alone => continue,
            FeedStep::Read(true, bytes) if relay.life.closing() => {
                if relay.client.peer.read.len() > READ_BUF + MAX_FRAME as usize {
                    continue;
                }
                relay.client.peer.read.extend_from_slice(bytes);
                relay
                    .window
                    .credit_while_closing(&mut relay.client.peer.read);
                Ok(())
            }
            FeedStep::Read(true, bytes) => {
                if relay.client.peer.read.len() > READ_BUF + MAX_FRAME as usize {
                    continue;
                }
                relay.client.peer.read.extend_from_slice(bytes);
                if let Some(r) = relay.app.handshake.replay.as_mut() {
                    r.extend_from_slice(bytes);
                }
                relay.client_frames(now)
            }
            FeedStep::Read(false, bytes) => {
                read = bytes.len();
                relay.app.peer.read.extend_from_slice(bytes);
                relay.app_frames(now)
            }
            FeedStep::EndAll => {
                let long_after = guard.config().long_stream_age;
                for ctl in guard.connection_streams(info.id, now, long_after) {
                    ctl.end(crate::metrics::Reason::drain);
                }
                Ok(())
            }
            FeedStep::Wait(d) => {
                now += d;
                Ok(())
            }
        };
        match result {
            Err(Failure::NotHttp2) if relay.app.handshake.pending => return,
            Err(e) => relay.conn().fail(e),
            Ok(()) => {}
        }
        // Endings asked meanwhile (a drain, the app's GOAWAY), as `run` takes them.
        for id in relay.endings.queue.take() {
            relay.ends().begin_end(id, now);
        }
        let _ = relay.timers(now);
        relay.count_changed(now);
        relay.clear_gate();
        relay.app.peer.write.clear();
        relay.client.peer.write.clear();
        relay.window.buffer_dropped();
        relay.ends().settle_written(None);
        assert!(relay.app.peer.read.len() <= READ_BUF + MAX_FRAME as usize + read);
        assert!(relay.settings.unacked() <= MAX_UNACKED_SETTINGS + 1);
    }
}
