//! The one error type of the commands, and the exit code each failure maps
//! to (sysexits.h). `main` prints the error and exits with `exit_code()`;
//! the help texts list the same codes. Each module that can fail turns its
//! own error into this one (`impl From<...> for Error` next to it), so this
//! module depends on nothing but `config`.

use crate::config::Invalid;

/// Exit codes (sysexits.h).
pub const EX_USAGE: u8 = 64;
pub const EX_DATAERR: u8 = 65;
pub const EX_UNAVAILABLE: u8 = 69;
pub const EX_SOFTWARE: u8 = 70;
pub const EX_OSERR: u8 = 71;
pub const EX_NOPERM: u8 = 77;

/// Why a command failed; the variant decides the exit code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad flag or an inconsistent combination of flags (64).
    #[error("{0}")]
    Usage(String),
    /// Settings that break a rule, every violation listed (64).
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// Input that cannot be read as what it must be: `check`'s exported
    /// objects (65).
    #[error("{0}")]
    Data(String),
    /// A service it needs is unavailable: a port to bind, the shim, Envoy,
    /// Prometheus (69).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an impossible state (70).
    #[error("{0}")]
    Internal(String),
    /// The operating system refused something every run needs, e.g. the
    /// signal handlers (71).
    #[error("{0}")]
    Os(String),
    /// Missing privileges, e.g. CAP_SYS_ADMIN for node mode (77).
    #[error("{0}")]
    NoPermission(String),
}

impl Error {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::Invalid(_) => EX_USAGE,
            Error::Data(_) => EX_DATAERR,
            Error::Unavailable(_) => EX_UNAVAILABLE,
            Error::Internal(_) => EX_SOFTWARE,
            Error::Os(_) => EX_OSERR,
            Error::NoPermission(_) => EX_NOPERM,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        assert_eq!(Error::Invalid(Invalid(vec!["x".into()])).exit_code(), 64);
        assert_eq!(Error::Data("not YAML".into()).exit_code(), 65);
        assert_eq!(Error::Os("signals".into()).exit_code(), 71);
        assert_eq!(Error::NoPermission("EPERM".into()).exit_code(), 77);
    }
}
