//! TLS for a cluster (DESIGN §12.2): making certificates (`resd tls`, [`make`]), loading a
//! node's CA, certificate and key into the rustls configurations of its two ports and its
//! outgoing connections ([`node`]), accepting connections with handshakes that cannot stall the
//! listener and refusals logged once per peer ([`accept`]), and telling which node or client a
//! peer certificate belongs to ([`peer`]).
//!
//! A node certificate names its node with the DNS name `node-<id>.<cluster>.resd`; that name is
//! the node's identity on the raft port and when it joins. Everything here is rustls with the
//! ring provider; there is no OpenSSL.

use std::path::PathBuf;

pub mod accept;
pub mod coalesce;
mod make;
pub mod node;
pub mod peer;

pub use accept::{Conn, ConnInfo, Refusals};
pub use coalesce::Coalesced;
pub use make::{CA_CERT, CA_KEY, Written, create_ca, create_client_cert, create_node_cert};
pub use node::{Dialer, NodeTls, TlsSettings};
pub use peer::PeerCert;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{} already exists; resd tls never overwrites a file (remove it or choose another --dir)", .0.display())]
    Exists(PathBuf),
    #[error(
        "no CA in {dir}: {file} is missing (create one with `resd tls ca create --dir {dir}`)",
        dir = .dir.display()
    )]
    NoCa { dir: PathBuf, file: &'static str },
    #[error("cannot {what} {}: {source}", .path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Certificate { what: String, source: rcgen::Error },
    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: String },
    /// A file given to the agent that it cannot use.
    #[error("{}: {why}", .path.display())]
    Unusable { path: PathBuf, why: String },
    /// The TLS settings do not fit together.
    #[error("TLS settings: {0}")]
    Settings(String),
}

/// A failed connection in words: the TLS problem and what to do, or the innermost cause
/// ("Connection refused") rather than tonic's "transport error".
pub fn describe_connect_error(error: &(dyn std::error::Error + 'static)) -> String {
    if let Some(problem) = proto::tls::TlsProblem::find(error) {
        return problem.advice();
    }
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        message = error.to_string();
        cause = error.source();
    }
    message
}

/// The DNS name a node's certificate carries, which peers check (DESIGN §12.2).
pub fn node_name(node_id: u64, cluster_name: &str) -> String {
    format!("node-{node_id}.{cluster_name}.resd")
}

/// The node a DNS name names in `cluster_name`: `node-7.prod.resd` → 7 in cluster `prod`.
pub fn parse_node_name(name: &str, cluster_name: &str) -> Option<u64> {
    let rest = name.strip_prefix("node-")?;
    let (id, cluster) = rest.split_once('.')?;
    if cluster.strip_suffix(".resd")? != cluster_name {
        return None;
    }
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || id.starts_with('0') {
        return None;
    }
    id.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_round_trip_within_their_cluster_only() {
        assert_eq!(parse_node_name(&node_name(7, "prod"), "prod"), Some(7));
        assert_eq!(parse_node_name("node-7.prod.resd", "dev"), None);
        assert_eq!(parse_node_name("node-07.prod.resd", "prod"), None);
        assert_eq!(parse_node_name("node-.prod.resd", "prod"), None);
        assert_eq!(parse_node_name("node-7.prod.example", "prod"), None);
        assert_eq!(parse_node_name("node-7x.prod.resd", "prod"), None);
        assert_eq!(parse_node_name("nodes-7.prod.resd", "prod"), None);
        assert_eq!(
            parse_node_name("node-99999999999999999999.prod.resd", "prod"),
            None
        );
    }
}
