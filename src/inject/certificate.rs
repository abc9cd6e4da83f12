//! The webhook's serving certificate: the pair as last loaded, read again
//! whenever the files change (cert-manager rotates the Secret; the kubelet
//! swaps the mounted files), a pair that does not load keeping the previous
//! one, and its notAfter for the expiry gauge and readiness.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The certificate and key as last loaded, read again when the files change.
#[derive(Debug)]
pub struct Certificate {
    pub(super) cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Vec<u8>, Arc<CertifiedKey>)>,
    /// The leaf's notAfter, Unix seconds, of the pair now served.
    not_after: std::sync::atomic::AtomicI64,
}

impl Certificate {
    /// Loads the pair; an error names the file and what is wrong with it.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let (bytes, loaded, not_after) = read_pair(cert, key)?;
        Ok(Certificate {
            cert: cert.into(),
            key: key.into(),
            current: RwLock::new((bytes, Arc::new(loaded))),
            not_after: not_after.into(),
        })
    }

    /// Seconds from `now` to the served leaf's notAfter; negative after it.
    pub fn seconds_left(&self, now: SystemTime) -> i64 {
        let now = match now.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        self.not_after.load(std::sync::atomic::Ordering::Relaxed) - now
    }

    /// Reads the files again; when they changed and load, serves them from
    /// the next handshake on. `Ok(true)` when the pair was replaced.
    pub fn reload(&self) -> Result<bool, String> {
        let bytes = raw_pair(&self.cert, &self.key)?;
        if self.current.read().map(|c| c.0 == bytes).unwrap_or(false) {
            return Ok(false);
        }
        let (bytes, loaded, not_after) = read_pair(&self.cert, &self.key)?;
        if let Ok(mut c) = self.current.write() {
            *c = (bytes, Arc::new(loaded));
            self.not_after
                .store(not_after, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(true)
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.1.clone())
    }
}

fn raw_pair(cert: &Path, key: &Path) -> Result<Vec<u8>, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut bytes = read(cert)?;
    bytes.extend(read(key)?);
    Ok(bytes)
}

/// The pair's bytes (to see a change), the key rustls serves, and the
/// leaf's notAfter in Unix seconds.
fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, CertifiedKey, i64), String> {
    let bytes = raw_pair(cert, key)?;
    let pem = std::fs::read(cert).map_err(|e| format!("{}: {e}", cert.display()))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM: {e}", cert.display()))?;
    let Some(leaf) = chain.first() else {
        return Err(format!("{}: no CERTIFICATE in the file", cert.display()));
    };
    let not_after = not_after(leaf).map_err(|e| format!("{}: {e}", cert.display()))?;
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{}: no private key: {e}", key.display()))?;
    let provider = rustls::crypto::ring::default_provider();
    let loaded = CertifiedKey::from_der(chain, private, &provider).map_err(|e| {
        format!(
            "{} and {}: not a usable pair: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok((bytes, loaded, not_after))
}

/// A certificate's notAfter, Unix seconds.
pub fn not_after(der: &[u8]) -> Result<i64, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("the first certificate does not parse: {e}"))?;
    Ok(parsed.validity().not_after.timestamp())
}

/// The TLS settings: the reloading certificate, HTTP/1.1 (what the API
/// server speaks to webhooks without HTTP/2 negotiated).
pub fn tls_config(cert: Arc<Certificate>) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
