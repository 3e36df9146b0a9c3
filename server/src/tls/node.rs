//! A node's TLS material, loaded and checked once at start: the CA every peer and client
//! certificate must chain to, the node's certificate (which must name this node of this
//! cluster) and key. From it come the rustls configurations of the raft port (always mutual),
//! the API port (client certificates optional or required), and the [`Dialer`] every outgoing
//! connection of the node goes through.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use serde::Deserialize;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{TlsError, node_name};

/// Where a node's TLS files are, and whether its API requires client certificates.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TlsSettings {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub verify_clients: bool,
}

/// Certificates closer to their end than this are warned about at start.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);

/// A node's loaded TLS material.
pub struct NodeTls {
    cluster_name: String,
    node_id: u64,
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    raft_server: Arc<rustls::ServerConfig>,
    api_server: Arc<rustls::ServerConfig>,
    verify_clients: bool,
    /// Seconds since the epoch at which the node's certificate expires.
    not_after: i64,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTls")
            .field("cluster_name", &self.cluster_name)
            .field("node_id", &self.node_id)
            .field("verify_clients", &self.verify_clients)
            .finish_non_exhaustive()
    }
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Unusable {
        path: path.to_path_buf(),
        why: format!("cannot read the {what}: {error}"),
    })
}

fn certificates(
    pem: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| TlsError::Unusable {
            path: path.to_path_buf(),
            why: format!("not a PEM {what}: {error}"),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::Unusable {
            path: path.to_path_buf(),
            why: format!("holds no {what} (expected a PEM \"BEGIN CERTIFICATE\" block)"),
        });
    }
    Ok(certificates)
}

/// What a failed certificate check means for the operator.
fn explain_certificate_error(error: &rustls::Error, expected_name: &str) -> String {
    use rustls::CertificateError;
    match error {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)
        | rustls::Error::InvalidCertificate(CertificateError::BadSignature) => {
            "it is not signed by the CA given with --tls-ca".to_owned()
        }
        rustls::Error::InvalidCertificate(CertificateError::Expired)
        | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
            "it has expired (make a new one with `resd tls cert create`)".to_owned()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidYet)
        | rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext { .. }) => {
            "it is not valid yet (is this machine's clock right?)".to_owned()
        }
        rustls::Error::InvalidCertificate(CertificateError::NotValidForName)
        | rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
            format!("it does not name {expected_name}, so peers would refuse it")
        }
        other => other.to_string(),
    }
}

impl NodeTls {
    /// Loads and checks the files of `settings` for node `node_id` of `cluster_name`: the
    /// certificate must chain to the CA, be valid now, name `node-<id>.<cluster>.resd` and match
    /// the key. Every failure names the file and says why.
    pub fn load(
        settings: &TlsSettings,
        cluster_name: &str,
        node_id: u64,
    ) -> Result<NodeTls, TlsError> {
        let ca_pem = read(&settings.ca, "CA certificate")?;
        let cert_pem = read(&settings.cert, "node certificate")?;
        let key_pem = read(&settings.key, "private key")?;
        let ca = certificates(&ca_pem, &settings.ca, "CA certificate")?;
        let chain = certificates(&cert_pem, &settings.cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| TlsError::Unusable {
            path: settings.key.clone(),
            why: format!("not a PEM private key: {error}"),
        })?;

        let mut roots = RootCertStore::empty();
        for certificate in ca {
            roots.add(certificate).map_err(|error| TlsError::Unusable {
                path: settings.ca.clone(),
                why: format!("not a usable CA certificate: {error}"),
            })?;
        }
        let roots = Arc::new(roots);
        let provider = provider();

        // The node's own certificate, checked as a peer will check it.
        let name = node_name(node_id, cluster_name);
        let server_name = ServerName::try_from(name.clone()).map_err(|error| {
            TlsError::Settings(format!("{name} is not a valid DNS name: {error}"))
        })?;
        let verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|error| TlsError::Unusable {
                path: settings.ca.clone(),
                why: format!("cannot verify against this CA: {error}"),
            })?;
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &server_name, &[], UnixTime::now())
            .map_err(|error| TlsError::Unusable {
                path: settings.cert.clone(),
                why: format!(
                    "not a certificate for node {node_id} of cluster {cluster_name:?}: {} (make one with `resd tls cert create --node-id {node_id} --cluster-name {cluster_name}`)",
                    explain_certificate_error(&error, &name)
                ),
            })?;
        let not_after = X509Certificate::from_der(chain[0].as_ref())
            .map(|(_, parsed)| parsed.validity().not_after.timestamp())
            .unwrap_or(i64::MAX);

        let server_config = |verifier| -> Result<Arc<rustls::ServerConfig>, TlsError> {
            let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|error| TlsError::Settings(error.to_string()))?
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain.clone(), key.clone_key())
                .map_err(|error| TlsError::Unusable {
                    path: settings.key.clone(),
                    why: format!(
                        "does not fit the certificate {}: {error}",
                        settings.cert.display()
                    ),
                })?;
            config.alpn_protocols = vec![b"h2".to_vec()];
            Ok(Arc::new(config))
        };
        let client_verifier = |optional: bool| {
            let builder =
                WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
            let builder = if optional {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder.build().map_err(|error| TlsError::Unusable {
                path: settings.ca.clone(),
                why: format!("cannot verify clients against this CA: {error}"),
            })
        };
        let raft_server = server_config(client_verifier(false)?)?;
        let api_server = server_config(client_verifier(!settings.verify_clients)?)?;
        Ok(NodeTls {
            cluster_name: cluster_name.to_owned(),
            node_id,
            ca_pem,
            cert_pem,
            key_pem,
            raft_server,
            api_server,
            verify_clients: settings.verify_clients,
            not_after,
        })
    }

    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Whether the API port requires client certificates.
    pub fn verify_clients(&self) -> bool {
        self.verify_clients
    }

    /// The raft port's configuration: a peer must present a certificate from the CA.
    pub fn raft_server_config(&self) -> Arc<rustls::ServerConfig> {
        self.raft_server.clone()
    }

    /// The API port's configuration: client certificates from the CA are checked when
    /// presented, and required with `--tls-verify-clients`.
    pub fn api_server_config(&self) -> Arc<rustls::ServerConfig> {
        self.api_server.clone()
    }

    /// The API's settings for the HTTP server: the same certificates and client checks, and
    /// HTTP/1.1 besides HTTP/2 (curl, browsers, Prometheus).
    pub fn http_server_config(&self) -> Arc<rustls::ServerConfig> {
        let mut config = (*self.api_server).clone();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// How long until the node's certificate expires (zero once it has).
    pub fn expires_in(&self) -> Duration {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_secs() as i64)
            .unwrap_or(0);
        Duration::from_secs(self.not_after.saturating_sub(now).max(0) as u64)
    }

    /// Whether the certificate expires soon enough to warn about at start.
    pub fn expires_soon(&self) -> bool {
        self.expires_in() < EXPIRY_WARNING
    }

    fn client_config(&self, domain: Option<String>) -> ClientTlsConfig {
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(Duration::from_secs(5));
        match domain {
            Some(domain) => config.domain_name(domain),
            None => config,
        }
    }
}

/// Opens the node's outgoing connections: to peers' raft ports, to the leader's API, to the
/// member a joining node joins through. With TLS, every connection presents the node's
/// certificate and checks the server's: a connection to a known node expects the certificate
/// of exactly that node (`node-<id>.<cluster>.resd`), one to a plain address a certificate
/// naming that address.
#[derive(Debug, Clone, Default)]
pub struct Dialer {
    tls: Option<Arc<NodeTls>>,
}

impl Dialer {
    pub fn new(tls: Option<Arc<NodeTls>>) -> Self {
        Dialer { tls }
    }

    pub fn tls(&self) -> Option<&Arc<NodeTls>> {
        self.tls.as_ref()
    }

    /// An endpoint for `addr` (`host:port`), expecting node `node` when given.
    pub fn endpoint(&self, addr: &str, node: Option<u64>) -> Result<Endpoint, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|error| format!("invalid address {addr:?}: {error}"))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        match &self.tls {
            None => Ok(endpoint),
            Some(tls) => endpoint
                .tls_config(tls.client_config(node.map(|id| node_name(id, &tls.cluster_name))))
                .map_err(|error| format!("cannot configure TLS for {addr}: {error}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{create_ca, create_node_cert};

    fn settings(dir: &Path, node_id: u64) -> TlsSettings {
        TlsSettings {
            ca: dir.join("resd-ca.pem"),
            cert: dir.join(format!("node-{node_id}.pem")),
            key: dir.join(format!("node-{node_id}-key.pem")),
            verify_clients: false,
        }
    }

    #[test]
    fn a_node_loads_its_own_certificate_and_refuses_anothers() {
        let dir = tempfile::tempdir().expect("temp dir");
        create_ca(dir.path()).expect("CA");
        create_node_cert(dir.path(), 1, "prod", &[], &[]).expect("node 1");
        create_node_cert(dir.path(), 2, "prod", &[], &[]).expect("node 2");

        let tls = NodeTls::load(&settings(dir.path(), 1), "prod", 1).expect("node 1 loads");
        assert_eq!(tls.node_id(), 1);
        assert!(
            !tls.expires_soon(),
            "a fresh certificate is good for two years"
        );

        let error = NodeTls::load(&settings(dir.path(), 2), "prod", 1)
            .expect_err("node 2's certificate is not node 1's")
            .to_string();
        assert!(error.contains("does not name node-1.prod.resd"), "{error}");
        let error = NodeTls::load(&settings(dir.path(), 1), "staging", 1)
            .expect_err("another cluster")
            .to_string();
        assert!(error.contains("node-1.staging.resd"), "{error}");

        let mut mismatched = settings(dir.path(), 1);
        mismatched.key = dir.path().join("node-2-key.pem");
        let error = NodeTls::load(&mismatched, "prod", 1)
            .expect_err("a key that is not the certificate's")
            .to_string();
        assert!(error.contains("node-2-key.pem"), "{error}");
    }

    #[test]
    fn files_that_are_missing_or_not_pem_are_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        create_ca(dir.path()).expect("CA");
        create_node_cert(dir.path(), 1, "resd", &[], &[]).expect("node 1");
        let mut missing = settings(dir.path(), 1);
        missing.cert = dir.path().join("absent.pem");
        let error = NodeTls::load(&missing, "resd", 1)
            .expect_err("missing")
            .to_string();
        assert!(
            error.contains("absent.pem") && error.contains("cannot read"),
            "{error}"
        );

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").expect("write");
        let mut not_pem = settings(dir.path(), 1);
        not_pem.ca = garbage;
        let error = NodeTls::load(&not_pem, "resd", 1)
            .expect_err("not PEM")
            .to_string();
        assert!(
            error.contains("garbage.pem") && error.contains("holds no"),
            "{error}"
        );
    }

    #[test]
    fn a_certificate_from_another_ca_is_refused() {
        let ours = tempfile::tempdir().expect("temp dir");
        let theirs = tempfile::tempdir().expect("temp dir");
        create_ca(ours.path()).expect("CA");
        create_ca(theirs.path()).expect("CA");
        create_node_cert(theirs.path(), 1, "resd", &[], &[]).expect("node 1");
        let mut foreign = settings(theirs.path(), 1);
        foreign.ca = ours.path().join("resd-ca.pem");
        let error = NodeTls::load(&foreign, "resd", 1)
            .expect_err("another CA")
            .to_string();
        assert!(error.contains("not signed by the CA"), "{error}");
    }
}
