//! TLS between workers (mutual): every worker presents its certificate
//! and key, and accepts only peers whose certificate the job's CA signed,
//! in both directions. A connecting worker checks the peer's certificate
//! against the host of its `--peers` entry (a DNS name, or an IP address
//! in the certificate's subject alternative names).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The TLS side of every link of a worker.
#[derive(Clone)]
pub struct LinkTls {
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkTls")
    }
}

impl LinkTls {
    /// Loads the worker's certificate chain and key and the CA (PEM
    /// files). Errors name the file and what is wrong with it.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<LinkTls, String> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| format!("{}: {e}", cert.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        if certs.is_empty() {
            return Err(format!("{}: no certificate in it", cert.display()));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
        let mut roots = rustls::RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .map_err(|e| format!("{}: {e}", ca.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        if cas.is_empty() {
            return Err(format!("{}: no certificate in it", ca.display()));
        }
        for c in cas {
            roots.add(c).map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| format!("{} / its key: {e}", cert.display()))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("{} / its key: {e}", cert.display()))?;
        Ok(LinkTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// The name a peer's certificate must carry: the host of `addr`.
    pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>, String> {
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => addr,
        };
        ServerName::try_from(host.to_string()).map_err(|e| format!("'{host}' is not a host name for TLS: {e}"))
    }
}

/// Makes ring rustls's process-wide crypto provider. The build has two
/// (ring, which Weir's TLS uses, and aws-lc-rs, which delta-rs's HTTP
/// client brings), and with two rustls cannot choose one by itself: a
/// TLS server or client built without naming one (tonic's) fails. Called
/// before any TLS is set up; a later call changes nothing.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
