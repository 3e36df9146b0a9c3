//! What `resd tls` writes: a CA, node certificates naming their node, client certificates, and
//! never an overwritten file.

use x509_parser::extensions::GeneralName;
use x509_parser::pem::parse_x509_pem;

use super::*;

/// What a certificate file says: whether it is a CA, its subject alternative names, issuer and
/// subject.
struct Parsed {
    is_ca: bool,
    names: Vec<String>,
    issuer: String,
    subject: String,
}

fn parse(path: &Path) -> Parsed {
    let bytes = std::fs::read(path).expect("read");
    let (_, pem) = parse_x509_pem(&bytes).expect("PEM");
    let cert = pem.parse_x509().expect("a certificate");
    let names = cert
        .subject_alternative_name()
        .expect("well-formed")
        .map(|san| {
            san.value
                .general_names
                .iter()
                .map(|name| match name {
                    GeneralName::DNSName(dns) => (*dns).to_owned(),
                    GeneralName::IPAddress(ip) if ip.len() == 4 => {
                        std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).to_string()
                    }
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default();
    Parsed {
        is_ca: cert.is_ca(),
        names,
        issuer: cert.issuer().to_string(),
        subject: cert.subject().to_string(),
    }
}

#[test]
fn a_ca_then_a_node_certificate_that_names_its_node() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = create_ca(dir.path()).expect("ca");
    let authority = parse(&ca.cert);
    assert!(authority.is_ca);
    let node = create_node_cert(
        dir.path(),
        2,
        "prod",
        &["10.0.0.2".parse().expect("ip")],
        &["db2.example.com".into()],
    )
    .expect("node cert");
    assert_eq!(node.cert, dir.path().join("node-2.pem"));
    assert_eq!(node.key, dir.path().join("node-2-key.pem"));
    let leaf = parse(&node.cert);
    assert_eq!(
        leaf.names,
        [
            "node-2.prod.resd",
            "localhost",
            "127.0.0.1",
            "db2.example.com",
            "10.0.0.2"
        ]
    );
    assert!(!leaf.is_ca);
    assert_eq!(leaf.issuer, authority.subject, "signed by the CA");
    assert!(
        leaf.subject.contains("node-2.prod.resd"),
        "{}",
        leaf.subject
    );
}

#[cfg(unix)]
#[test]
fn private_keys_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = create_ca(dir.path()).expect("ca");
    let client = create_client_cert(dir.path(), "alice").expect("client");
    for key in [ca.key, client.key] {
        let mode = std::fs::metadata(&key)
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", key.display());
    }
    assert_eq!(client.cert, dir.path().join("client-alice.pem"));
}

#[test]
fn nothing_is_ever_overwritten() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = create_ca(dir.path()).expect("ca");
    let before = std::fs::read(&ca.cert).expect("read");
    let error = create_ca(dir.path()).expect_err("a second CA");
    assert!(
        matches!(&error, TlsError::Exists(path) if path.ends_with(CA_CERT)),
        "{error}"
    );
    assert!(error.to_string().contains("never overwrites"), "{error}");
    assert_eq!(std::fs::read(&ca.cert).expect("read"), before);
    create_node_cert(dir.path(), 1, "resd", &[], &[]).expect("node 1");
    assert!(matches!(
        create_node_cert(dir.path(), 1, "resd", &[], &[]),
        Err(TlsError::Exists(_))
    ));
}

#[test]
fn certificates_need_a_ca_and_valid_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    let error = create_node_cert(dir.path(), 1, "resd", &[], &[]).expect_err("no CA");
    assert!(error.to_string().contains("resd tls ca create"), "{error}");
    create_ca(dir.path()).expect("ca");
    assert!(matches!(
        create_node_cert(dir.path(), 0, "resd", &[], &[]),
        Err(TlsError::Invalid { .. })
    ));
    assert!(matches!(
        create_node_cert(dir.path(), 1, "Bad Cluster", &[], &[]),
        Err(TlsError::Invalid { .. })
    ));
    assert!(matches!(
        create_client_cert(dir.path(), "../../etc/passwd"),
        Err(TlsError::Invalid { .. })
    ));
}
