//! The relay's two sides, each the owner of its [`Peer`] and of what is
//! only that side's: the client's stream ids, preface and defences; the
//! application's handshake (whether it answered HTTP/2 yet, the client's
//! bytes kept meanwhile), or its absence. What both sides share (the
//! streams, the window, the SETTINGS, the endings) is the relay's.

use bytes::BytesMut;

use super::defences::Defences;
use super::ids::StreamIds;
use super::peer::Peer;

/// The client's side of the connection.
pub(super) struct ClientSide {
    /// What the relay reads from the client and writes to it, and what it
    /// knows of the client's HPACK table.
    pub(super) peer: Peer,
    /// The stream ids the client used (RFC 9113 §5.1).
    pub(super) ids: StreamIds,
    /// The client's preface is still to come.
    pub(super) preface: bool,
    /// The client's preface still lacks its SETTINGS frame, which must be
    /// its first frame (RFC 9113 §3.4).
    pub(super) settings_due: bool,
    /// The client's control-frame rates and rapid reset.
    pub(super) defences: Defences,
}

impl ClientSide {
    /// A client whose preface is still to come, held by `defences`.
    pub(super) fn new(defences: Defences) -> Self {
        Self {
            peer: Peer::new(),
            ids: StreamIds::default(),
            preface: true,
            settings_due: true,
            defences,
        }
    }
}

/// The application's side of the connection, or its absence.
pub(super) struct AppSide {
    /// What the relay reads from the application and writes to it, and
    /// what it knows of the application's HPACK table.
    pub(super) peer: Peer,
    /// Whether it answered HTTP/2 yet, or is there at all.
    pub(super) handshake: AppHandshake,
    /// A write to it failed (how): it closed or reset the connection.
    /// Nothing more is written; what it wrote before is still read.
    pub(super) write_failed: Option<std::io::ErrorKind>,
}

/// Where the application's preface is, and whether there is an
/// application connection at all.
pub(super) struct AppHandshake {
    /// The application's first frame (its SETTINGS) has not come yet:
    /// only the client's preface went on, and every client byte is kept
    /// in `replay` (up to `REPLAY_MAX`), in case it does not speak HTTP/2.
    pub(super) pending: bool,
    pub(super) replay: Option<BytesMut>,
    /// A GOAWAY asked while `pending`, sent after the SETTINGS.
    pub(super) goaway_held: bool,
    /// No application connection: the guard is the client's server (see
    /// [`super::Relay::serve_alone`]); what would go to the application is
    /// dropped.
    pub(super) alone: bool,
}

impl AppSide {
    /// An application whose SETTINGS are still to come.
    pub(super) fn new() -> Self {
        Self {
            peer: Peer::new(),
            handshake: AppHandshake {
                pending: true,
                replay: Some(BytesMut::new()),
                goaway_held: false,
                alone: false,
            },
            write_failed: None,
        }
    }

    /// Whether its end of file, read now, is a clean end: everything it
    /// wrote arrived. Not after a write failed on a reset (its kernel drops
    /// what it had not sent yet, and the reset took the read's error with
    /// it); after a broken pipe, yes: its FIN came first, behind all it
    /// wrote, and only the guard's later write met the reset.
    pub(super) fn end_is_clean(&self) -> bool {
        matches!(
            self.write_failed,
            None | Some(std::io::ErrorKind::BrokenPipe)
        )
    }

    /// No application connection: nothing is pending, nothing kept.
    pub(super) fn go_alone(&mut self) {
        let h = &mut self.handshake;
        h.alone = true;
        h.pending = false;
        h.replay = None;
    }
}
