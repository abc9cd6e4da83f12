//! The one HTTP client of drainshim: every outgoing call (Envoy's admin API,
//! `drainshim prestop`, the fleet tools' scrapes and Prometheus queries) goes
//! through [`Endpoint`] and [`call`]. One request per connection, no
//! keep-alive, so nothing lingers on the peer; every call has a deadline, so
//! a hung peer never stalls the caller; errors say which step failed.
//!
//! To add a call to a new service: parse its `--flag` URL as an [`Endpoint`]
//! (clap does it, and a bad URL is a usage error), then
//! `endpoint.call(Method::GET, "/path", timeout)` and wrap [`CallError`] in
//! the caller's own error with what it was asking for.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// An `http://host:port[/prefix]` URL that passed the checks every caller
/// needs: the scheme is http (plain text on loopback or the pod network; TLS
/// is the mesh's job) and the port is explicit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    /// `host:port`, for connecting and for the `Host` header.
    authority: String,
    /// A path prefix without the trailing `/` (a Prometheus behind
    /// `/prometheus`), or empty.
    prefix: String,
}

/// A URL that is not `http://host:port[/prefix]`.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid URL {url:?}: {why} (expected e.g. http://127.0.0.1:15000)")]
pub struct UrlError {
    /// The text given.
    pub url: String,
    /// What is wrong with it.
    pub why: &'static str,
}

// === impl Endpoint ===

impl Endpoint {
    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The path prefix, empty when the URL has none.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Refuses a path prefix: for services whose paths are fixed (Envoy's
    /// admin API, a shim's control endpoint).
    pub fn without_prefix(self) -> Result<Self, UrlError> {
        if self.prefix.is_empty() {
            Ok(self)
        } else {
            Err(UrlError {
                url: self.to_string(),
                why: "a path is not allowed",
            })
        }
    }

    /// `method prefix+path` on a fresh TCP connection, within `timeout`
    /// (connect included).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), CallError> {
        let path = format!("{}{path}", self.prefix);
        call(
            TcpStream::connect(self.authority.clone()),
            &self.authority,
            method,
            &path,
            timeout,
        )
        .await
    }
}

// === impl Endpoint ===

impl std::str::FromStr for Endpoint {
    type Err = UrlError;

    fn from_str(url: &str) -> Result<Self, UrlError> {
        let err = |why| UrlError {
            url: url.to_string(),
            why,
        };
        let uri: http::Uri = url.parse().map_err(|_| err("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(err("the scheme must be http"));
        }
        let authority = uri.authority().ok_or_else(|| err("no host"))?;
        if authority.port_u16().is_none() {
            return Err(err("no port"));
        }
        if uri.query().is_some() {
            return Err(err("a query is not allowed"));
        }
        Ok(Self {
            authority: authority.to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

// === impl Endpoint ===

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

// === impl Endpoint ===

impl serde::Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a call failed, by step.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("no answer within {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("{0}")]
    Request(#[from] RequestError),
}

/// One request on the connection `connect` opens (plain TCP, or one made
/// inside a pod's network namespace), all within `timeout`.
pub async fn call(
    connect: impl Future<Output = std::io::Result<TcpStream>>,
    authority: &str,
    method: Method,
    path: &str,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), CallError> {
    let exchange = async {
        let stream = connect.await.map_err(CallError::Connect)?;
        Ok(request(stream, authority, method, path).await?)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CallError::Timeout(timeout))?
}

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
    request_with(
        stream,
        authority,
        method,
        path,
        &HeaderMap::new(),
        Bytes::new(),
    )
    .await
}

/// [`request`] on any connection (a TLS stream to a Prometheus), with
/// `headers` added (credentials, a tenant's header) and `body` sent (empty
/// for a GET). The caller bounds it in time.
pub async fn request_with<S>(
    stream: S,
    authority: &str,
    method: Method,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Bytes), RequestError>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection; aborted below so a dropped call leaves no task.
    let conn = tokio::spawn(conn);
    let result = async {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, authority)
            .header(http::header::CONNECTION, "close")
            .body(Full::new(body))
            .map_err(|_| RequestError::BadPath(path.to_string()))?;
        req.headers_mut()
            .extend(headers.iter().map(|(k, v)| (k.clone(), v.clone())));
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
    use super::Endpoint;

    #[test]
    fn endpoints() {
        let e: Endpoint = "http://127.0.0.1:15000".parse().unwrap();
        assert_eq!((e.authority(), e.prefix()), ("127.0.0.1:15000", ""));
        let e: Endpoint = "http://prom:9090/prometheus/".parse().unwrap();
        assert_eq!((e.authority(), e.prefix()), ("prom:9090", "/prometheus"));
        assert_eq!(e.to_string(), "http://prom:9090/prometheus");
        assert!(e.without_prefix().is_err());
        for bad in [
            "127.0.0.1:15000",
            "http://localhost",
            "https://a:1",
            "http://a:1/?x=1",
            "",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(super::encode_query(r"^a\.b|c$ x"), "%5Ea%5C.b%7Cc%24%20x");
    }
}
