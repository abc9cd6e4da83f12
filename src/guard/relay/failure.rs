//! Why a relayed connection is closed: the errors of the client's (each a
//! GOAWAY with the code the RFC names) and the application's.

use super::wire;

/// Why the connection is closed.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failure {
    #[error("{0}")]
    Protocol(&'static str),
    #[error("HPACK: the client's header block cannot be decoded")]
    Compression,
    #[error("the client's header blocks are too large (an HPACK bomb or CONTINUATION flood)")]
    Calm,
    #[error("the application broke the protocol")]
    AppProtocol,
    #[error("the application does not speak HTTP/2")]
    NotHttp2,
    #[error("{0}: wrong frame size")]
    FrameSize(&'static str),
    #[error("the client's WINDOW_UPDATEs overflowed the connection window")]
    FlowControl,
    #[error("{0}")]
    StreamClosed(&'static str),
}

impl From<wire::Malformed> for Failure {
    fn from(m: wire::Malformed) -> Self {
        Self::Protocol(if m.0 == "DATA" {
            "malformed DATA frame"
        } else {
            "malformed HEADERS frame"
        })
    }
}
