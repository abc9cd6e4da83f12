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

impl Failure {
    /// A failure met while handling the application's frames is the
    /// application's, whichever check found it (a frame size, a protocol
    /// rule): its streams then end retryably, and the client is never told
    /// that it broke the protocol.
    pub(super) fn of_the_app(self) -> Self {
        match self {
            Self::NotHttp2 | Self::AppProtocol => self,
            _ => Self::AppProtocol,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::Failure;

    #[test]
    fn a_failure_on_the_app_side_is_the_apps() {
        for f in [
            Failure::FrameSize("DATA"),
            Failure::Protocol("x"),
            Failure::Compression,
            Failure::Calm,
            Failure::FlowControl,
            Failure::StreamClosed("x"),
        ] {
            assert!(matches!(f.of_the_app(), Failure::AppProtocol));
        }
        assert!(matches!(Failure::NotHttp2.of_the_app(), Failure::NotHttp2));
    }
}
