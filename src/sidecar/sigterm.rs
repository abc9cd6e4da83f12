//! SIGTERM and SIGINT as a channel: one message per signal.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::error::Error;

/// One message per SIGTERM or SIGINT. The handlers are installed before this
/// returns, so a signal sent right after is never the default (fatal) one.
/// A failure to install them is an error: taking it as a signal would start
/// a drain at start-up.
pub fn sigterms() -> Result<mpsc::UnboundedReceiver<()>, Error> {
    let os = |e: std::io::Error| Error::Os(format!("cannot install signal handlers: {e}"));
    let mut term = signal(SignalKind::terminate()).map_err(os)?;
    let mut int = signal(SignalKind::interrupt()).map_err(os)?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
