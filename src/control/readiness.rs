//! Whether the pod's data path works, for `/readyz`: the stream guard accepts
//! connections and the app behind it answers.
//!
//! Each check, every `interval`: a TCP connect to the guard's listener (it
//! fails once the accept loop has stopped and dropped its listener), then a
//! TCP connect to the app (`--guard-upstream`), each within `timeout`.
//! The rule ([`Hysteresis`]): not ready after `failures` consecutive failed
//! checks, so one slow probe on a loaded node does not flap the pod; ready
//! again after one passing check. At start the pod is not ready until a check
//! passes: the first one runs before the control endpoints serve.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Longest wait for one connect: both ends are on the pod's loopback, where a
/// listening port answers in microseconds and a closed one refuses at once.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The consecutive-failure rule, free of I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hysteresis {
    /// Consecutive failed checks that make the data path not ready.
    limit: u32,
    /// Failed checks in a row so far.
    failed: u32,
    /// What `/readyz` answers now.
    ready: bool,
    /// The last failure, for the 503 body.
    reason: Option<String>,
}

// === impl Hysteresis ===

impl Hysteresis {
    /// Not ready until the first check passes.
    pub fn new(limit: u32) -> Self {
        Self {
            limit: limit.max(1),
            failed: 0,
            ready: false,
            reason: Some("no check of the data path has passed yet".into()),
        }
    }

    /// Takes one check's result.
    pub fn observe(&mut self, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.failed = 0;
                self.ready = true;
                self.reason = None;
            }
            Err(why) => {
                self.failed = self.failed.saturating_add(1);
                if self.failed >= self.limit {
                    self.ready = false;
                }
                self.reason = Some(why);
            }
        }
    }

    /// `None` when ready, else why not.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.ready {
            return None;
        }
        Some(
            self.reason
                .clone()
                .unwrap_or_else(|| "the data path is not ready".into()),
        )
    }
}

/// What to check and how often.
#[derive(Clone, Copy, Debug)]
pub struct ReadinessProbe {
    /// The guard's bound listen address.
    pub guard: SocketAddr,
    /// The app (`--guard-upstream`).
    pub app: SocketAddr,
    pub interval: Duration,
    pub failures: u32,
}

/// The data path's readiness, kept fresh by a background task.
#[derive(Clone, Debug)]
pub struct DataPath {
    state: Arc<Mutex<Hysteresis>>,
}

// === impl DataPath ===

impl DataPath {
    /// Runs the first check now, then one every `interval` until `shutdown`.
    pub async fn spawn(s: ReadinessProbe, shutdown: CancellationToken) -> Self {
        let mut h = Hysteresis::new(s.failures);
        h.observe(check(&s).await);
        let state = Arc::new(Mutex::new(h));
        let shared = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(s.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let result = check(&s).await;
                if let Ok(mut h) = shared.lock() {
                    let was = h.not_ready_reason().is_none();
                    h.observe(result);
                    let now = h.not_ready_reason();
                    match (&now, was) {
                        (Some(why), true) => tracing::warn!(reason = %why, "data path not ready"),
                        (None, false) => tracing::info!("data path ready"),
                        _ => {}
                    }
                }
            }
        });
        Self { state }
    }

    /// `None` when ready, else why not (for the 503 body).
    pub fn not_ready_reason(&self) -> Option<String> {
        match self.state.lock() {
            Ok(h) => h.not_ready_reason(),
            Err(_) => Some("the readiness state is poisoned".into()),
        }
    }
}

/// Where to connect to reach a listener bound to `addr` (an unspecified
/// address is reached on loopback).
fn dialable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()))
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port()))
        }
        _ => addr,
    }
}

async fn connects(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, TcpStream::connect(dialable(addr))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// One check: the guard accepts, then the app answers.
async fn check(s: &ReadinessProbe) -> Result<(), String> {
    let timeout = s.interval.min(MAX_CONNECT_TIMEOUT);
    connects(s.guard, timeout).await.map_err(|e| {
        format!(
            "the stream guard on {} does not accept connections: {e}",
            s.guard
        )
    })?;
    connects(s.app, timeout)
        .await
        .map_err(|e| format!("the app on {} does not answer: {e}", s.app))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_until_the_first_pass() {
        let mut h = Hysteresis::new(3);
        assert!(h.not_ready_reason().is_some());
        h.observe(Err("refused".into()));
        assert!(h.not_ready_reason().is_some());
        h.observe(Ok(()));
        assert_eq!(h.not_ready_reason(), None);
    }

    #[test]
    fn n_consecutive_failures_before_unready_one_success_to_recover() {
        let mut h = Hysteresis::new(3);
        h.observe(Ok(()));
        for (result, ready) in [
            (Err("slow"), true),
            (Err("slow"), true),
            (Ok(()), true),
            (Err("down"), true),
            (Err("down"), true),
            (Err("down"), false),
            (Err("down"), false),
            (Ok(()), true),
        ] {
            h.observe(result.map_err(String::from));
            assert_eq!(h.not_ready_reason().is_none(), ready, "{h:?}");
        }
    }

    #[test]
    fn the_reason_is_the_last_failure() {
        let mut h = Hysteresis::new(1);
        h.observe(Err("the app on 127.0.0.1:8080 does not answer".into()));
        assert_eq!(
            h.not_ready_reason().as_deref(),
            Some("the app on 127.0.0.1:8080 does not answer")
        );
    }
}
