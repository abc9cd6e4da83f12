//! How the fleet tools reach a Prometheus as a platform team runs it: plain
//! http, or https trusted through the system's roots or `--prometheus-ca`;
//! a bearer token or basic auth read from a file on every request (a rotated
//! secret is picked up without a restart); extra headers such as the tenant's
//! `X-Scope-OrgID` of Mimir, Cortex and Thanos.
//!
//! Secrets stay in this module and on the wire: errors and logs name the
//! file or the header, never a value (header values are marked sensitive and
//! [`Header`]'s `Debug` hides them).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Span;
use crate::http::request_with;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, Method, StatusCode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A Prometheus URL: `http[s]://host[:port][/prefix]`. Without a port, the
/// scheme's own (80, 443): a managed Prometheus is usually plain 443.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromUrl {
    /// https: the connection is TLS, the host is the name checked.
    tls: bool,
    /// The host as written, without brackets for IPv6: the TLS server name.
    host: String,
    /// `host:port`, for connecting and for the `Host` header.
    authority: String,
    /// A path prefix without the trailing `/` (a Prometheus behind
    /// `/prometheus`, Mimir's `/prometheus`), or empty.
    prefix: String,
}

// === impl PromUrl ===

impl PromUrl {
    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The path prefix, empty when the URL has none.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        self.tls
    }
}

impl std::str::FromStr for PromUrl {
    type Err = String;

    /// The error names what is wrong without echoing the text: a URL may
    /// carry a password (`https://user:secret@host`).
    fn from_str(url: &str) -> Result<Self, String> {
        let expected =
            "expected e.g. http://prometheus:9090 or https://thanos.example.com/prometheus";
        let uri: http::Uri = url
            .parse()
            .map_err(|_| format!("invalid Prometheus URL: not a URL ({expected})"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(format!(
                    "invalid Prometheus URL: the scheme must be http or https ({expected})"
                ))
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("invalid Prometheus URL: no host ({expected})"))?;
        if authority.as_str().contains('@') {
            return Err(
                "invalid Prometheus URL: credentials in the URL are not accepted \
                 (they would show in process lists and errors): use --prometheus-basic-auth-file"
                    .into(),
            );
        }
        if uri.query().is_some() {
            return Err(format!(
                "invalid Prometheus URL: a query is not allowed ({expected})"
            ));
        }
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Self {
            tls,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            authority: format!("{host}:{port}"),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

impl fmt::Display for PromUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.prefix)
    }
}

/// One extra request header, checked. Its value is never shown.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    pub name: HeaderName,
    pub value: HeaderValue,
}

/// Headers drainshim writes itself: one given again would be sent twice
/// or contradict the request.
const OWN_HEADERS: &[&str] = &["host", "connection", "content-length", "transfer-encoding"];

// === impl Header ===

impl Header {
    /// Parses `Name: value`. The error never contains the value (it may be
    /// an API key), only the name when there is one.
    pub fn parse(text: &str) -> Result<Self, String> {
        let Some((name, value)) = text.split_once(':') else {
            return Err("--prometheus-header: expected 'Name: value' (no ':' found)".into());
        };
        let name = name.trim();
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            "--prometheus-header: the name before ':' is not a valid header name \
             (letters, digits and -, e.g. X-Scope-OrgID)"
                .to_string()
        })?;
        if OWN_HEADERS.contains(&name.as_str()) {
            return Err(format!(
                "--prometheus-header {name}: drainshim sets this header itself"
            ));
        }
        let value = value.trim();
        if value.is_empty() {
            return Err(format!("--prometheus-header {name}: the value is empty"));
        }
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            format!(
                "--prometheus-header {name}: the value holds characters not allowed in a header"
            )
        })?;
        value.set_sensitive(true);
        Ok(Self { name, value })
    }
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: <hidden>", self.name)
    }
}

/// Credentials, as files read on every request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Credentials {
    #[default]
    None,
    /// A file holding the bearer token (`Authorization: Bearer <token>`).
    BearerTokenFile(PathBuf),
    /// A file holding `user:password` (`Authorization: Basic ...`).
    BasicAuthFile(PathBuf),
}

/// How to reach a Prometheus besides its URL: what the flags gave.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// PEM CA certificate(s) to trust instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    pub credentials: Credentials,
    /// Extra headers, in order.
    pub headers: Vec<Header>,
}

/// A failure to reach Prometheus, by kind: the kind decides the exit code.
#[derive(Debug, thiserror::Error)]
pub enum ReachError {
    /// A file or a setting that cannot work (64).
    #[error("{0}")]
    Setup(String),
    /// Prometheus did not answer, or TLS failed (69).
    #[error("{0}")]
    Unreachable(String),
}

/// A ready way to Prometheus: the URL, the TLS trust built once, and what
/// every request carries.
#[derive(Clone)]
pub struct Reach {
    url: PromUrl,
    /// With https: the connector (its roots loaded once) and the name checked.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    credentials: Credentials,
    /// The extra headers, already checked.
    headers: HeaderMap,
    /// Bound of each query.
    timeout: Duration,
}

/// Bound of each query unless `--prometheus-timeout` says otherwise.
pub const DEFAULT_QUERY_TIMEOUT: Span = Span::secs(30);

impl fmt::Debug for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reach")
            .field("url", &self.url.to_string())
            .field("tls", &self.tls.is_some())
            .field("credentials", &self.credentials)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

// === impl Reach ===

impl Reach {
    /// Loads the TLS roots for an https URL (`--prometheus-ca`, else the
    /// system's) and checks the credential file can be read now, so a bad
    /// setting fails before any query.
    pub fn new(url: PromUrl, access: &Access) -> Result<Self, ReachError> {
        let tls = if url.tls {
            let roots = match &access.ca_file {
                Some(path) => roots_from_file(path)?,
                None => system_roots()?,
            };
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| ReachError::Setup(format!("TLS: {e}")))?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(url.host.clone()).map_err(|_| {
                ReachError::Setup(format!(
                    "Prometheus {url}: {:?} is not a name TLS can check",
                    url.host
                ))
            })?;
            Some((TlsConnector::from(Arc::new(config)), name))
        } else {
            if access.ca_file.is_some() {
                return Err(ReachError::Setup(format!(
                    "--prometheus-ca needs an https:// Prometheus URL (got {url})"
                )));
            }
            if access.credentials != Credentials::None {
                tracing::warn!(prometheus = %url, "credentials go to Prometheus over plain http");
            }
            None
        };
        let mut headers = HeaderMap::new();
        for h in &access.headers {
            headers.append(h.name.clone(), h.value.clone());
        }
        let reach = Self {
            url,
            tls,
            credentials: access.credentials.clone(),
            headers,
            timeout: DEFAULT_QUERY_TIMEOUT.get(),
        };
        reach.authorization()?;
        Ok(reach)
    }

    /// The same reach, each query bounded by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Bound of each query.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn url(&self) -> &PromUrl {
        &self.url
    }

    /// `POST prefix+path` with `form` as its url-encoded body, on a fresh
    /// connection, within `timeout` (connect and TLS handshake included),
    /// with the credentials as the files hold them now. A form, not a URL:
    /// a wave's query names every namespace of its tier, longer than the
    /// URL a proxy in front of a store may accept.
    pub async fn post_form(
        &self,
        path: &str,
        form: String,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), ReachError> {
        let mut headers = self.headers.clone();
        if let Some(auth) = self.authorization()? {
            headers.insert(AUTHORIZATION, auth);
        }
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let path = format!("{}{path}", self.url.prefix);
        let authority = self.url.authority.as_str();
        // Names only: the values may be secrets.
        tracing::debug!(
            prometheus = %self.url,
            path,
            form_bytes = form.len(),
            headers = ?headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            "prometheus request"
        );
        let body = Bytes::from(form);
        let exchange = async {
            let tcp = TcpStream::connect(authority)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let answer = match &self.tls {
                Some((connector, name)) => {
                    let stream = connector
                        .connect(name.clone(), tcp)
                        .await
                        .map_err(|e| tls_failure(&e))?;
                    request_with(stream, authority, Method::POST, &path, &headers, body).await
                }
                None => request_with(tcp, authority, Method::POST, &path, &headers, body).await,
            };
            answer.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(what)) => Err(ReachError::Unreachable(what)),
            Err(_) => Err(ReachError::Unreachable(format!(
                "no answer within {}",
                humantime::format_duration(timeout)
            ))),
        }
    }

    /// The `Authorization` value the credential file gives now, if any.
    fn authorization(&self) -> Result<Option<HeaderValue>, ReachError> {
        let value = match &self.credentials {
            Credentials::None => return Ok(None),
            Credentials::BearerTokenFile(path) => {
                let token = read_secret(path, "--prometheus-bearer-token-file")?;
                format!("Bearer {token}")
            }
            Credentials::BasicAuthFile(path) => {
                let text = read_secret(path, "--prometheus-basic-auth-file")?;
                if !text.contains(':') {
                    return Err(ReachError::Setup(format!(
                        "--prometheus-basic-auth-file {}: expected one line 'user:password' (no ':' found)",
                        path.display()
                    )));
                }
                let b64 = base64::engine::general_purpose::STANDARD.encode(text.as_bytes());
                format!("Basic {b64}")
            }
        };
        let mut value = HeaderValue::from_str(&value).map_err(|_| {
            ReachError::Setup(format!(
                "{}: holds characters not allowed in a header",
                self.credentials_file().unwrap_or_default()
            ))
        })?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    fn credentials_file(&self) -> Option<String> {
        match &self.credentials {
            Credentials::None => None,
            Credentials::BearerTokenFile(p) => {
                Some(format!("--prometheus-bearer-token-file {}", p.display()))
            }
            Credentials::BasicAuthFile(p) => {
                Some(format!("--prometheus-basic-auth-file {}", p.display()))
            }
        }
    }

    /// What to say when Prometheus refuses the request (401, 403).
    pub fn refused_hint(&self) -> &'static str {
        match (&self.credentials, self.headers.is_empty()) {
            (Credentials::None, true) => {
                "it wants credentials: give --prometheus-bearer-token-file or --prometheus-basic-auth-file"
            }
            (Credentials::None, false) => {
                "check --prometheus-header (a tenant's X-Scope-OrgID), or give credentials"
            }
            _ => "the credentials (or the tenant header) were not accepted: check the file's content",
        }
    }
}

/// A secret file's content without the surrounding whitespace (a trailing
/// newline); its errors name the file, never the content.
fn read_secret(path: &Path, flag: &str) -> Result<String, ReachError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ReachError::Setup(format!("{flag} {}: {e}", path.display())))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(ReachError::Setup(format!(
            "{flag} {}: the file is empty",
            path.display()
        )));
    }
    if text.lines().nth(1).is_some() {
        return Err(ReachError::Setup(format!(
            "{flag} {}: expected one line, found several",
            path.display()
        )));
    }
    Ok(text.to_string())
}

/// The CA certificates of a PEM file (a bundle may hold several).
fn roots_from_file(path: &Path) -> Result<rustls::RootCertStore, ReachError> {
    let bad =
        |what: String| ReachError::Setup(format!("--prometheus-ca {}: {what}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no CERTIFICATE in the file".into()));
    }
    Ok(roots)
}

/// The system's roots (SSL_CERT_FILE / SSL_CERT_DIR when set, else the
/// distribution's bundle). The drainshim image is scratch and has none: it
/// needs --prometheus-ca, or a bundle mounted and SSL_CERT_FILE.
fn system_roots() -> Result<rustls::RootCertStore, ReachError> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "system CA certificates: skipped");
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(ReachError::Setup(
            "https Prometheus: no CA certificates in the system store (SSL_CERT_FILE, SSL_CERT_DIR, \
             /etc/ssl/certs): give --prometheus-ca FILE"
                .into(),
        ));
    }
    Ok(roots)
}

/// A TLS failure with the fix when it is about trust.
fn tls_failure(e: &std::io::Error) -> String {
    let text = e.to_string();
    if text.contains("invalid peer certificate") {
        format!("TLS: {text} (is the server's CA in --prometheus-ca, or in the system roots?)")
    } else {
        format!("TLS: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_http_and_https_with_the_scheme_port() {
        let u: PromUrl = "https://thanos.example.com/prometheus/".parse().unwrap();
        assert_eq!(
            (u.authority(), u.prefix(), u.is_tls()),
            ("thanos.example.com:443", "/prometheus", true)
        );
        assert_eq!(u.to_string(), "https://thanos.example.com:443/prometheus");
        let u: PromUrl = "http://127.0.0.1:9090".parse().unwrap();
        assert_eq!((u.authority(), u.is_tls()), ("127.0.0.1:9090", false));
        let u: PromUrl = "http://prometheus".parse().unwrap();
        assert_eq!(u.authority(), "prometheus:80");
        let u: PromUrl = "https://[::1]:9443".parse().unwrap();
        assert_eq!((u.host.as_str(), u.authority()), ("::1", "[::1]:9443"));
        for bad in ["127.0.0.1:9090", "ftp://a:1", "http://a:1/?x=1", ""] {
            assert!(bad.parse::<PromUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_password_in_the_url_is_refused_and_not_echoed() {
        let err = "https://ops:hunter2@prom.example.com"
            .parse::<PromUrl>()
            .unwrap_err();
        assert!(err.contains("--prometheus-basic-auth-file"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn headers_are_checked_and_their_values_never_shown() {
        let h = Header::parse("X-Scope-OrgID: tenant-a").unwrap();
        assert_eq!(
            (h.name.as_str(), h.value.to_str().unwrap()),
            ("x-scope-orgid", "tenant-a")
        );
        assert!(h.value.is_sensitive());
        assert_eq!(format!("{h:?}"), "x-scope-orgid: <hidden>");
        for (bad, why) in [
            ("X-Api-Key s3cret", "no ':'"),
            ("X Api: s3cret", "not a valid header name"),
            ("X-Api-Key: s3cret\u{7}", "not allowed"),
            ("X-Api-Key:   ", "empty"),
            ("Host: s3cret", "sets this header itself"),
        ] {
            let err = Header::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
            assert!(!err.contains("s3cret"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn credentials_are_read_from_their_file_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first\n").unwrap();
        let access = Access {
            credentials: Credentials::BearerTokenFile(token.clone()),
            ..Access::default()
        };
        let reach = Reach::new("http://127.0.0.1:9".parse().unwrap(), &access).unwrap();
        assert_eq!(reach.authorization().unwrap().unwrap(), "Bearer first");
        std::fs::write(&token, "second").unwrap();
        assert_eq!(reach.authorization().unwrap().unwrap(), "Bearer second");
        std::fs::write(&token, "two\nlines").unwrap();
        let err = reach.authorization().unwrap_err().to_string();
        assert!(err.contains("one line") && !err.contains("two"), "{err}");

        let basic = dir.path().join("basic");
        std::fs::write(&basic, "ops:hunter2\n").unwrap();
        let access = Access {
            credentials: Credentials::BasicAuthFile(basic.clone()),
            ..Access::default()
        };
        let reach = Reach::new("http://127.0.0.1:9".parse().unwrap(), &access).unwrap();
        assert_eq!(
            reach.authorization().unwrap().unwrap(),
            "Basic b3BzOmh1bnRlcjI="
        );
        std::fs::write(&basic, "hunter2").unwrap();
        let err = reach.authorization().unwrap_err().to_string();
        assert!(
            err.contains("user:password") && !err.contains("hunter2"),
            "{err}"
        );
        std::fs::remove_file(&basic).unwrap();
        assert!(matches!(reach.authorization(), Err(ReachError::Setup(_))));
    }

    #[test]
    fn a_ca_file_must_hold_a_certificate_and_needs_https() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let access = Access {
            ca_file: Some(ca.clone()),
            ..Access::default()
        };
        let err = Reach::new("https://prom:9090".parse().unwrap(), &access).unwrap_err();
        assert!(err.to_string().contains("no CERTIFICATE"), "{err}");
        let err = Reach::new("http://prom:9090".parse().unwrap(), &access).unwrap_err();
        assert!(err.to_string().contains("needs an https://"), "{err}");
        let access = Access {
            ca_file: Some(dir.path().join("missing.pem")),
            ..Access::default()
        };
        let err = Reach::new("https://prom:9090".parse().unwrap(), &access).unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");
    }
}
