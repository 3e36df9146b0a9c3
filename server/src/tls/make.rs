//! Making certificates (`resd tls`): a certificate authority, node certificates that name
//! their node (`node-<id>.<cluster>.resd`) and client certificates for resctl.
//!
//! Files are PEM and live in one directory: `resd-ca.pem`/`resd-ca-key.pem`,
//! `node-<id>.pem`/`node-<id>-key.pem`, `client-<name>.pem`/`client-<name>-key.pem`. Nothing
//! is ever overwritten: an existing file is an error naming it. Private keys are written
//! readable by their owner only.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::{TlsError, node_name};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The CA certificate's file name.
pub const CA_CERT: &str = "resd-ca.pem";
/// The CA key's file name.
pub const CA_KEY: &str = "resd-ca-key.pem";

/// How long certificates are valid.
const CA_DAYS: i64 = 5 * 365;
const LEAF_DAYS: i64 = 2 * 365;

/// The files one command wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn certificate_error(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> TlsError {
    let what = what.into();
    move |source| TlsError::Certificate { what, source }
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // A little slack for clocks that lag behind the one that made the certificate.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

/// Refuses to go on if any of `paths` exists.
fn refuse_existing(paths: &[&Path]) -> Result<(), TlsError> {
    match paths.iter().find(|path| path.exists()) {
        Some(path) => Err(TlsError::Exists(path.to_path_buf())),
        None => Ok(()),
    }
}

/// Writes a new file (never replacing one); `private` makes it owner-only.
fn write_new(path: &Path, contents: &str, private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let io = |what| {
        move |source| TlsError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).map_err(io("create"))?;
    file.write_all(contents.as_bytes()).map_err(io("write"))?;
    file.sync_all().map_err(io("sync"))
}

fn ensure_dir(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Io {
        what: "create the directory",
        path: dir.to_path_buf(),
        source,
    })
}

/// Creates a certificate authority in `dir`.
pub fn create_ca(dir: &Path) -> Result<Written, TlsError> {
    ensure_dir(dir)?;
    let written = Written {
        cert: dir.join(CA_CERT),
        key: dir.join(CA_KEY),
    };
    refuse_existing(&[&written.cert, &written.key])?;
    let key = KeyPair::generate().map_err(certificate_error("cannot generate the CA key"))?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "resd cluster CA");
    name.push(DnType::OrganizationName, "resd");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, CA_DAYS);
    let cert = params
        .self_signed(&key)
        .map_err(certificate_error("cannot sign the CA certificate"))?;
    write_new(&written.key, &key.serialize_pem(), true)?;
    write_new(&written.cert, &cert.pem(), false)?;
    Ok(written)
}

/// The CA of `dir`, to sign with.
fn load_ca(dir: &Path) -> Result<Issuer<'static, KeyPair>, TlsError> {
    let read = |file: &'static str| {
        let path = dir.join(file);
        std::fs::read_to_string(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => TlsError::NoCa {
                dir: dir.to_path_buf(),
                file,
            },
            _ => TlsError::Io {
                what: "read",
                path,
                source,
            },
        })
    };
    let cert = read(CA_CERT)?;
    let key = KeyPair::from_pem(&read(CA_KEY)?)
        .map_err(certificate_error(format!("{CA_KEY} is not a private key")))?;
    Issuer::from_ca_cert_pem(&cert, key).map_err(certificate_error(format!(
        "{CA_CERT} is not a CA certificate"
    )))
}

/// What a leaf certificate is for.
enum Leaf<'a> {
    Node {
        node_id: u64,
        cluster_name: &'a str,
        ips: &'a [IpAddr],
        dns: &'a [String],
    },
    Client {
        name: &'a str,
    },
}

fn create_leaf(dir: &Path, leaf: Leaf<'_>) -> Result<Written, TlsError> {
    let issuer = load_ca(dir)?;
    let (stem, common_name, mut sans, purposes) = match &leaf {
        Leaf::Node {
            node_id,
            cluster_name,
            ips,
            dns,
        } => {
            let mut sans = vec![
                SanType::DnsName(dns_name(&node_name(*node_id, cluster_name))?),
                SanType::DnsName(dns_name("localhost")?),
                SanType::IpAddress(IpAddr::from([127, 0, 0, 1])),
            ];
            for name in dns.iter() {
                sans.push(SanType::DnsName(dns_name(name)?));
            }
            sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
            (
                format!("node-{node_id}"),
                node_name(*node_id, cluster_name),
                sans,
                // Nodes are servers to clients and peers, and clients of their peers.
                vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            )
        }
        Leaf::Client { name } => (
            format!("client-{name}"),
            (*name).to_owned(),
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        ),
    };
    sans.dedup();
    let written = Written {
        cert: dir.join(format!("{stem}.pem")),
        key: dir.join(format!("{stem}-key.pem")),
    };
    refuse_existing(&[&written.cert, &written.key])?;
    let key = KeyPair::generate().map_err(certificate_error("cannot generate a key"))?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, "resd");
    params.distinguished_name = name;
    params.subject_alt_names = sans;
    params.extended_key_usages = purposes;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, LEAF_DAYS);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(certificate_error(format!("cannot sign {stem}.pem")))?;
    write_new(&written.key, &key.serialize_pem(), true)?;
    write_new(&written.cert, &cert.pem(), false)?;
    Ok(written)
}

fn dns_name(name: &str) -> Result<rcgen::string::Ia5String, TlsError> {
    name.try_into()
        .map_err(|error: rcgen::Error| TlsError::Invalid {
            what: "DNS name",
            why: format!("{name:?}: {error}"),
        })
}

/// Creates the certificate of node `node_id` of `cluster_name`, signed by the CA in `dir`. It
/// names `node-<id>.<cluster>.resd`, `localhost`, `127.0.0.1` and the given addresses.
pub fn create_node_cert(
    dir: &Path,
    node_id: u64,
    cluster_name: &str,
    ips: &[IpAddr],
    dns: &[String],
) -> Result<Written, TlsError> {
    if node_id == 0 {
        return Err(TlsError::Invalid {
            what: "node id",
            why: "node ids start at 1".into(),
        });
    }
    if let Err(why) = crate::resource::check_name(cluster_name, crate::resource::MAX_NAME_LEN) {
        return Err(TlsError::Invalid {
            what: "cluster name",
            why,
        });
    }
    create_leaf(
        dir,
        Leaf::Node {
            node_id,
            cluster_name,
            ips,
            dns,
        },
    )
}

/// Creates a client certificate (for resctl or the dashboard) named `name`.
pub fn create_client_cert(dir: &Path, name: &str) -> Result<Written, TlsError> {
    if let Err(why) = crate::resource::check_name(name, crate::resource::MAX_NAME_LEN) {
        return Err(TlsError::Invalid {
            what: "client name",
            why,
        });
    }
    create_leaf(dir, Leaf::Client { name })
}

#[cfg(test)]
mod tests;
