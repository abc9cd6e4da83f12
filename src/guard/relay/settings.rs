//! The SETTINGS the relay passes between the peers, as far as it must follow
//! them: each frame the application has not acked yet (the client's and the
//! guard's own barrier round trips, whose acks come in order), the client's
//! HPACK table size as acked, and the limits the client was told.

use std::collections::VecDeque;

use super::limits::DEFAULT_TABLE;

/// Most SETTINGS the application has not acked yet (the client's, and the
/// guard's barrier round trip): the client's next one waits (the client is
/// not read) until an ack comes, so every ack pairs with its own frame.
pub(super) const MAX_UNACKED_SETTINGS: usize = 64;
/// How soon a SETTINGS held back by `MAX_UNACKED_SETTINGS` is tried again.
pub(super) const UNACKED_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// A SETTINGS frame the relay sent the application, as its ack will say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unacked {
    /// The client's, passed on, with the HEADER_TABLE_SIZE it set (if any):
    /// the ack goes back to the client, and a lower table size then binds.
    Client(Option<u32>),
    /// The guard's own empty SETTINGS, barrier round trip `n`.
    Barrier(u64),
}

/// The SETTINGS state of one relayed connection.
#[derive(Debug)]
pub(super) struct PeerSettings {
    /// Each SETTINGS frame the application has not acked yet, oldest first.
    unacked: VecDeque<Unacked>,
    /// The client's table size the application acked last.
    table_acked: u32,
    /// The client lowered its table size and no block since told its
    /// decoder so: the next block to the client must start with a size
    /// update to this (RFC 7541 §4.2).
    update_due: Option<u32>,
    /// The application's SETTINGS have been seen.
    app_seen: bool,
    /// The SETTINGS_MAX_CONCURRENT_STREAMS the client acked last (the
    /// application's, lowered to the guard's limit; before any ack, the
    /// guard's): a stream past it is refused here (RFC 9113 §5.1.2), never
    /// passed on.
    streams_acked: u32,
    /// The SETTINGS frames the client was sent and has not acked yet, oldest
    /// first, as runs (see [`ToClient`]). Until the client acks a lower
    /// limit it may still use the higher one (§6.5.3).
    streams_unacked: VecDeque<ToClient>,
}

/// A run of SETTINGS frames sent to the client: how many, the highest
/// MAX_CONCURRENT_STREAMS any of them set, and the one the last of them
/// left in force. Each frame is acked one by one; the run's limit binds
/// once its last frame is acked.
#[derive(Debug, Clone, Copy)]
struct ToClient {
    frames: u32,
    highest: Option<u32>,
    last: Option<u32>,
}

/// Most runs of SETTINGS to the client followed unacked: past it a new
/// frame joins the newest run (so acks still pair with frames, and the
/// limit stays the highest the client may not have seen past).
const MAX_UNACKED_BY_CLIENT: usize = 64;

impl PeerSettings {
    /// Before any SETTINGS: the RFC's defaults, and the guard's stream limit.
    pub(super) fn new(max_concurrent_streams: u32) -> Self {
        Self {
            unacked: VecDeque::new(),
            table_acked: DEFAULT_TABLE,
            update_due: None,
            app_seen: false,
            streams_acked: max_concurrent_streams,
            streams_unacked: VecDeque::new(),
        }
    }

    /// Whether the client's next SETTINGS must wait for an ack.
    pub(super) fn full(&self) -> bool {
        self.unacked.len() >= MAX_UNACKED_SETTINGS
    }

    /// How many SETTINGS frames wait for the application's ack.
    pub(super) fn unacked(&self) -> usize {
        self.unacked.len()
    }

    /// A SETTINGS frame went to the application.
    pub(super) fn sent(&mut self, frame: Unacked) {
        self.unacked.push_back(frame);
    }

    /// The application acked the oldest SETTINGS it had: which one.
    pub(super) fn acked(&mut self) -> Option<Unacked> {
        self.unacked.pop_front()
    }

    /// The application acked the client's SETTINGS that set its table size
    /// to `table` (if it did): a lower size now binds, so the next block to
    /// the client must say so.
    pub(super) fn client_acked(&mut self, table: Option<u32>) {
        if let Some(v) = table {
            if v < self.table_acked {
                self.update_due = Some(self.update_due.map_or(v, |d| d.min(v)));
            }
            self.table_acked = v;
        }
    }

    /// The table size update the next block to the client must start with,
    /// if one is due; the caller puts it there.
    pub(super) fn take_update_due(&mut self) -> Option<u32> {
        self.update_due.take()
    }

    /// Whether these are the application's first SETTINGS.
    pub(super) fn first_from_app(&mut self) -> bool {
        !std::mem::replace(&mut self.app_seen, true)
    }

    /// A SETTINGS frame went to the client, setting
    /// SETTINGS_MAX_CONCURRENT_STREAMS to `v` if it is `Some`.
    pub(super) fn tell_streams(&mut self, v: Option<u32>) {
        if self.streams_unacked.len() >= MAX_UNACKED_BY_CLIENT {
            if let Some(run) = self.streams_unacked.back_mut() {
                run.frames += 1;
                run.highest = run.highest.max(v);
                run.last = v.or(run.last);
                return;
            }
        }
        self.streams_unacked.push_back(ToClient {
            frames: 1,
            highest: v,
            last: v,
        });
    }

    /// The client acked the oldest SETTINGS it was sent: once that ends a
    /// run, the stream limit the run left, if any, binds.
    pub(super) fn client_acked_streams(&mut self) {
        let Some(run) = self.streams_unacked.front_mut() else {
            return;
        };
        run.frames -= 1;
        if run.frames == 0 {
            if let Some(v) = self.streams_unacked.pop_front().and_then(|r| r.last) {
                self.streams_acked = v;
            }
        }
    }

    /// The most streams the client may have open: the limit it acked, or a
    /// higher one it was told and has not acked yet (it may not have seen
    /// the lower one).
    pub(super) fn streams_limit(&self) -> u32 {
        let told = self.streams_unacked.iter().filter_map(|r| r.highest).max();
        self.streams_acked.max(told.unwrap_or(0))
    }

    #[cfg(test)]
    pub(super) fn table_acked(&self) -> u32 {
        self.table_acked
    }

    #[cfg(test)]
    pub(super) fn update_due(&self) -> Option<u32> {
        self.update_due
    }

    #[cfg(test)]
    pub(super) fn set_update_due(&mut self, v: Option<u32>) {
        self.update_due = v;
    }
}
