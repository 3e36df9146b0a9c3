//! TLS for everything that dials a resd port (resctl, the dashboard, servers reaching their
//! peers): one reading of the rustls error inside a transport failure, turned into what went
//! wrong and what to do about it; and new token secrets from the same crypto provider.

use std::error::Error;

/// A new random token secret: 32 bytes of the system's random source, hex (64 characters).
pub fn new_secret() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| "the system random source failed".to_owned())?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Why a TLS connection to a server failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsProblem {
    /// The server's certificate is not signed by the CA the client trusts.
    UnknownCa,
    /// The server's certificate does not name the address or node dialled.
    NameMismatch,
    Expired,
    NotValidYet,
    /// The server wants a client certificate and got none.
    ClientCertificateRequired,
    /// The server refused the client's certificate.
    ClientCertificateRefused,
    /// The other end does not speak TLS.
    NotTls,
    Other(String),
}

impl TlsProblem {
    /// The rustls error somewhere in `error`'s chain (also inside `std::io::Error`s, whose
    /// `source` skips the error they wrap), if any.
    pub fn find(error: &(dyn Error + 'static)) -> Option<TlsProblem> {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if let Some(tls) = error.downcast_ref::<rustls::Error>() {
                return Some(TlsProblem::of(tls));
            }
            if let Some(tls) = error
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return Some(TlsProblem::of(tls));
            }
            cause = error.source();
        }
        None
    }

    pub fn of(error: &rustls::Error) -> TlsProblem {
        use rustls::{AlertDescription, CertificateError, Error};
        match error {
            Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature,
            ) => TlsProblem::UnknownCa,
            Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => TlsProblem::NameMismatch,
            Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => TlsProblem::Expired,
            Error::InvalidCertificate(
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
            ) => TlsProblem::NotValidYet,
            Error::AlertReceived(AlertDescription::CertificateRequired) => {
                TlsProblem::ClientCertificateRequired
            }
            Error::AlertReceived(
                AlertDescription::UnknownCA
                | AlertDescription::BadCertificate
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown,
            ) => TlsProblem::ClientCertificateRefused,
            Error::InvalidMessage(_) | Error::InappropriateMessage { .. } => TlsProblem::NotTls,
            other => TlsProblem::Other(other.to_string()),
        }
    }

    /// What went wrong and what to try, for someone who passed `--ca-cert` and friends.
    pub fn advice(&self) -> String {
        match self {
            TlsProblem::UnknownCa => "the server's certificate is not signed by the CA given with --ca-cert (pass the cluster's resd-ca.pem)".into(),
            TlsProblem::NameMismatch => "the server's certificate does not name the address dialled (connect with an address or name it lists: node certificates name localhost and 127.0.0.1, and what `resd tls cert create` got with --ip and --dns)".into(),
            TlsProblem::Expired => "the server's certificate has expired (make a new one with `resd tls cert create` and restart the node)".into(),
            TlsProblem::NotValidYet => "the server's certificate is not valid yet (are the clocks of this machine and the server right?)".into(),
            TlsProblem::ClientCertificateRequired => "the server requires a client certificate: pass --client-cert and --client-key (make one with `resd tls cert create --client NAME`)".into(),
            TlsProblem::ClientCertificateRefused => "the server refused the client certificate (is it signed by the cluster's CA and still valid?)".into(),
            TlsProblem::NotTls => "the server does not speak TLS on this port (drop --ca-cert, or check the address)".into(),
            TlsProblem::Other(message) => format!("TLS failed: {message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_are_found_through_io_errors_and_read_as_advice() {
        let expired = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let wrapped = std::io::Error::new(std::io::ErrorKind::InvalidData, expired);
        assert_eq!(TlsProblem::find(&wrapped), Some(TlsProblem::Expired));
        assert!(TlsProblem::Expired.advice().contains("expired"));

        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert_eq!(TlsProblem::of(&unknown), TlsProblem::UnknownCa);
        assert!(TlsProblem::UnknownCa.advice().contains("--ca-cert"));
        let required = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert_eq!(
            TlsProblem::of(&required),
            TlsProblem::ClientCertificateRequired
        );
        assert!(
            TlsProblem::ClientCertificateRequired
                .advice()
                .contains("--client-cert")
        );
        let name = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert_eq!(TlsProblem::of(&name), TlsProblem::NameMismatch);

        let plain = std::io::Error::other("connection refused");
        assert_eq!(TlsProblem::find(&plain), None);
    }
}
