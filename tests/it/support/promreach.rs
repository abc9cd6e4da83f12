//! What a Prometheus behind TLS, credentials or a tenant needs in a test: a
//! throwaway CA and a server certificate for 127.0.0.1 (rcgen), a
//! `--web.config.file` with TLS and a bcrypt basic-auth user for the real
//! Prometheus, and a gateway that wants a bearer token and a tenant header
//! in front of it (Prometheus checks neither itself; Mimir, Cortex and an
//! auth proxy do), answering 401 without them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A CA and a server certificate it signed for `127.0.0.1` and `localhost`,
/// as PEM files.
pub struct TestTls {
    /// The CA certificate: what `--prometheus-ca` names.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    _dir: tempfile::TempDir,
}

/// A fresh CA and a server certificate signed by it.
pub fn test_tls() -> TestTls {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "drainshim test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().expect("ca key");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
    let issuer = Issuer::new(ca_params, ca_key);

    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .expect("server params");
    params.use_authority_key_identifier_extension = true;
    params
        .extended_key_usages
        .push(rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server cert");

    let tls = TestTls {
        ca: dir.path().join("ca.pem"),
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server.key"),
        _dir: dir,
    };
    std::fs::write(&tls.ca, ca_cert.pem()).expect("write ca");
    std::fs::write(&tls.cert, cert.pem()).expect("write cert");
    std::fs::write(&tls.key, key.serialize_pem()).expect("write key");
    tls
}

/// A Prometheus `--web.config.file`: TLS with `tls`, and `user` with
/// `password` (bcrypt, the lowest cost: a test, not a vault).
pub fn web_config(tls: &TestTls, user: &str, password: &str) -> String {
    let hash = bcrypt::hash(password, 4).expect("bcrypt");
    format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  {user}: '{hash}'\n",
        tls.cert.display(),
        tls.key.display()
    )
}

/// What the gateway wants and what it saw.
#[derive(Default)]
struct GateState {
    /// The `Authorization` value let through.
    authorization: String,
    /// The `X-Scope-OrgID` value let through.
    tenant: String,
    /// Every header of every request, by name, as received.
    seen: Vec<(String, String)>,
    /// Requests answered 401.
    refused: u64,
    /// Requests passed on to Prometheus.
    passed: u64,
}

/// A gateway in front of a plain Prometheus that passes a request on only
/// with `Authorization: Bearer <token>` and `X-Scope-OrgID: <tenant>`, as a
/// multi-tenant Prometheus does; 401 otherwise. Stops on drop.
pub struct PromGate {
    pub addr: SocketAddr,
    state: Arc<Mutex<GateState>>,
    task: JoinHandle<()>,
}

impl PromGate {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// (passed on, refused) so far.
    pub fn counts(&self) -> (u64, u64) {
        let s = self.state.lock().expect("gate state");
        (s.passed, s.refused)
    }

    /// Every value of header `name` the gateway received.
    pub fn seen(&self, name: &str) -> Vec<String> {
        let s = self.state.lock().expect("gate state");
        s.seen
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .collect()
    }
}

impl Drop for PromGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn prom_gate(prometheus: SocketAddr, token: &str, tenant: &str) -> PromGate {
    let state = Arc::new(Mutex::new(GateState {
        authorization: format!("Bearer {token}"),
        tenant: tenant.to_string(),
        ..GateState::default()
    }));
    let shared = state.clone();
    // Ends when the gate is dropped (the task is aborted).
    let (addr, task) = super::h1::serve_h1(move |req: Request<Incoming>| {
        let state = shared.clone();
        async move { Ok::<_, Infallible>(gate(req, &state, prometheus).await) }
    })
    .await;
    PromGate { addr, state, task }
}

async fn gate(
    req: Request<Incoming>,
    state: &Mutex<GateState>,
    prometheus: SocketAddr,
) -> Response<Full<Bytes>> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let allowed = {
        let mut s = state.lock().expect("gate state");
        for (n, v) in req.headers() {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            s.seen.push((n.as_str().to_string(), v));
        }
        let ok = header("authorization") == s.authorization && header("x-scope-orgid") == s.tenant;
        if ok {
            s.passed += 1;
        } else {
            s.refused += 1;
        }
        ok
    };
    if !allowed {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"no org id or bad token\n")));
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        return resp;
    }
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    // Forwarded as asked: the method, the body's type, the body (a query
    // form).
    let method = req.method().clone();
    let mut headers = http::HeaderMap::new();
    if let Some(ct) = req.headers().get(http::header::CONTENT_TYPE) {
        headers.insert(http::header::CONTENT_TYPE, ct.clone());
    }
    let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
        let mut resp = Response::new(Full::new(Bytes::from_static(b"body not read\n")));
        *resp.status_mut() = StatusCode::BAD_REQUEST;
        return resp;
    };
    let authority = prometheus.to_string();
    let answer = match TcpStream::connect(prometheus).await {
        Ok(s) => drainshim::http::request_with(s, &authority, method, &path, &headers, body)
            .await
            .ok(),
        Err(_) => None,
    };
    match answer {
        Some((status, body)) => {
            let mut resp = Response::new(Full::new(body));
            *resp.status_mut() = status;
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                "application/json".parse().expect("ct"),
            );
            resp
        }
        None => {
            let mut resp = Response::new(Full::new(Bytes::from_static(b"prometheus down\n")));
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            resp
        }
    }
}
