//! Timers every task loop shares. A leaf: it imports nothing of the crate.

use tokio::time::Instant;

/// Sleeps until `at`, or forever when there is no deadline: the branch of a
/// `select!` for a timer that may be unset.
pub async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
