//! `drainshim prestop`: the preStop exec hook. Starts the drain on the local
//! shim, prints progress to stderr while it waits, and returns the report.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::drain::{Report, Status};
use crate::http::{CallError, Endpoint};

/// How long to keep retrying a shim that refuses connections (it may be starting).
const CONNECT_RETRY_FOR: Duration = Duration::from_secs(5);
/// How often progress is read from `/status`.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// One call's own bound; `--timeout` bounds the whole wait and is the one
/// that fires (a drain never takes a day).
const MAX_CALL: Duration = Duration::from_secs(86_400);
/// A progress read that takes longer is skipped; the next one comes anyway.
const PROGRESS_CALL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum PrestopError {
    #[error("shim {authority}: {what}")]
    Unreachable { authority: String, what: String },
    #[error("shim {authority}: no report within --timeout {}", humantime::format_duration(*timeout))]
    Timeout {
        authority: String,
        timeout: Duration,
    },
}

/// One request on a fresh connection; connection refusals are retried for a
/// while. The caller bounds the whole wait.
async fn call(
    shim: &Endpoint,
    method: Method,
    path: &str,
    limit: Duration,
) -> Result<(StatusCode, Bytes), String> {
    let start = Instant::now();
    loop {
        match shim.call(method.clone(), path, limit).await {
            Err(CallError::Connect(e)) if start.elapsed() < CONNECT_RETRY_FOR => {
                tracing::debug!(error = %e, "shim not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            r => return r.map_err(|e| e.to_string()),
        }
    }
}

/// Starts the drain and waits for its report, printing progress to stderr.
pub async fn run(shim: &Endpoint, timeout: Duration) -> Result<Report, PrestopError> {
    let authority = shim.authority().to_string();
    let unreachable = |what: String| PrestopError::Unreachable {
        authority: authority.clone(),
        what,
    };
    let wait = async {
        let (status, body) = call(shim, Method::GET, "/drain?wait=true", MAX_CALL)
            .await
            .map_err(unreachable)?;
        if status != StatusCode::OK {
            let text = String::from_utf8_lossy(&body).trim().to_string();
            return Err(unreachable(format!(
                "GET /drain?wait=true: status {status}: {text}"
            )));
        }
        serde_json::from_slice::<Report>(&body)
            .map_err(|e| unreachable(format!("GET /drain?wait=true: bad report JSON: {e}")))
    };
    let progress = async {
        let mut progress = crate::drain::Progress::new(Duration::from_secs(5));
        loop {
            tokio::time::sleep(PROGRESS_EVERY).await;
            let Ok((StatusCode::OK, body)) =
                call(shim, Method::GET, "/status", PROGRESS_CALL).await
            else {
                continue;
            };
            if let Some(line) = serde_json::from_slice::<Status>(&body)
                .ok()
                .and_then(|s| progress.line(&s))
            {
                eprintln!("drainshim prestop: {line}");
            }
        }
    };
    tokio::select! {
        r = wait => r,
        _ = progress => unreachable!("progress loops forever"),
        _ = tokio::time::sleep(timeout) => Err(PrestopError::Timeout { authority: authority.clone(), timeout }),
    }
}

impl From<crate::sidecar::prestop::PrestopError> for crate::error::Error {
    fn from(e: crate::sidecar::prestop::PrestopError) -> Self {
        use crate::error::Error;
        Error::Unavailable(e.to_string())
    }
}
