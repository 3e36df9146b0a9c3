//! Who is on the other end of a TLS connection: the node a certificate names
//! (`node-<id>.<cluster>.resd`), or a client known by its certificate's common name. Read once
//! per connection, after rustls has checked the chain, the dates and the key usage.

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::parse_node_name;

/// The identity a verified peer certificate carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The node of this cluster the certificate names, if it names one.
    pub node_id: Option<u64>,
    /// The certificate's common name (or first DNS name): for logs and refusals.
    pub name: String,
}

impl PeerCert {
    /// Reads the identity of the end-entity certificate `certificate` for `cluster_name`.
    /// `None` when it cannot be parsed (rustls accepted it, so this does not happen in practice;
    /// such a peer is treated as having no identity).
    pub fn of(certificate: &CertificateDer<'_>, cluster_name: &str) -> Option<PeerCert> {
        let (_, parsed) = X509Certificate::from_der(certificate.as_ref()).ok()?;
        let dns_names: Vec<String> = parsed
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        GeneralName::DNSName(dns) => Some((*dns).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let node_id = dns_names
            .iter()
            .find_map(|name| parse_node_name(name, cluster_name));
        let common_name = parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let name = common_name
            .or_else(|| dns_names.first().cloned())
            .unwrap_or_else(|| "a certificate without a name".to_owned());
        Some(PeerCert { node_id, name })
    }

    /// How refusals describe this peer.
    pub fn describe(&self) -> String {
        match self.node_id {
            Some(id) => format!("node {id} ({})", self.name),
            None => format!("{:?} (names no node of this cluster)", self.name),
        }
    }
}
