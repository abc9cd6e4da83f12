//! A one-request HTTP/1.1 client over an already connected stream, shared by
//! the admin client and `drainshim prestop`. No keep-alive: every call closes
//! its connection, so nothing lingers on the peer.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The largest response body read. An Istio sidecar's listener config dump
/// runs to a few MiB; a peer that sends more (or never stops) is broken, and
/// reading it all would only eat memory until the caller's deadline.
pub const MAX_BODY: usize = 64 * 1024 * 1024;

/// Sends `method path` with `Connection: close` and reads the whole body, up
/// to `MAX_BODY`. The caller bounds it in time.
pub async fn request(
    stream: TcpStream,
    authority: &str,
    method: Method,
    path: &str,
) -> Result<(StatusCode, Bytes), RequestError> {
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection; aborted below so a dropped call leaves no task.
    let conn = tokio::spawn(conn);
    let result = async {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, authority)
            .header(http::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|_| RequestError::BadPath(path.to_string()))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| match e.downcast::<hyper::Error>() {
                Ok(e) => RequestError::Http(*e),
                Err(_) => RequestError::TooLarge(MAX_BODY),
            })?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    conn.abort();
    result
}

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    #[error("invalid request path {0:?}")]
    BadPath(String),
    #[error("response body larger than {0} bytes")]
    TooLarge(usize),
}

/// Percent-encodes a query parameter value (RFC 3986 unreserved characters
/// pass through).
pub fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_values_are_encoded() {
        assert_eq!(super::encode_query(r"^a\.b|c$ x"), "%5Ea%5C.b%7Cc%24%20x");
    }
}
