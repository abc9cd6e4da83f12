//! `drainshim prestop`: the preStop exec hook. Starts the drain on the local
//! shim, prints progress to stderr while it waits, and returns the report.

use std::time::Duration;

use http::{Method, StatusCode};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::drain::{Report, Status};

/// How long to keep retrying a shim that refuses connections (it may be starting).
const CONNECT_RETRY_FOR: Duration = Duration::from_secs(5);
/// How often progress is read from `/status`.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum PrestopError {
    #[error("invalid --shim URL {0:?} (expected e.g. http://127.0.0.1:15099)")]
    Url(String),
    #[error("shim {authority}: {what}")]
    Unreachable { authority: String, what: String },
    #[error("shim {authority}: no report within --timeout {}", humantime::format_duration(*timeout))]
    Timeout {
        authority: String,
        timeout: Duration,
    },
}

/// Parses `http://host:port` into its authority.
fn authority(url: &str) -> Result<String, PrestopError> {
    let uri: http::Uri = url.parse().map_err(|_| PrestopError::Url(url.into()))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(a)) if a.port_u16().is_some() => Ok(a.to_string()),
        _ => Err(PrestopError::Url(url.into())),
    }
}

/// One request on a fresh connection; connection refusals are retried for a while.
async fn call(
    authority: &str,
    method: Method,
    path: &str,
) -> Result<(StatusCode, bytes::Bytes), String> {
    let start = Instant::now();
    let stream = loop {
        match TcpStream::connect(authority).await {
            Ok(s) => break s,
            Err(e) if start.elapsed() < CONNECT_RETRY_FOR => {
                tracing::debug!(error = %e, "shim not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    };
    crate::http::request(stream, authority, method, path)
        .await
        .map_err(|e| e.to_string())
}

/// Starts the drain and waits for its report, printing progress to stderr.
pub async fn run(shim: &str, timeout: Duration) -> Result<Report, PrestopError> {
    let authority = authority(shim)?;
    let unreachable = |what: String| PrestopError::Unreachable {
        authority: authority.clone(),
        what,
    };
    let wait = async {
        let (status, body) = call(&authority, Method::GET, "/drain?wait=true")
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
            let Ok((StatusCode::OK, body)) = call(&authority, Method::GET, "/status").await else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_urls() {
        assert_eq!(
            authority("http://127.0.0.1:15099").unwrap(),
            "127.0.0.1:15099"
        );
        assert!(authority("127.0.0.1:15099").is_err());
        assert!(authority("http://localhost").is_err());
    }
}
