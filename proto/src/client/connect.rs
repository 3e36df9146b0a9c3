//! How a program finds its cluster (DESIGN §9, §16): the connection flags resctl takes — and
//! every controller program built on the runtime takes the same — over the environment
//! (`RESD_*`), over the selected context of the contexts file, over the defaults. A program
//! started next to `resd dev` (which writes a `dev` context and makes it current) needs no
//! flag.

use std::path::PathBuf;
use std::time::Duration;

use super::contexts::{ContextEntry, ContextsError, ContextsFile, expand_home};
use super::{ClientConfig, ClientError, ClientTls, DEFAULT_SERVER};

/// The connection flags (flatten into a program's own clap arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectArgs {
    /// Server to talk to, HOST:PORT (any member; followers forward), or several separated by
    /// commas: the first that answers is used, and calls and watches move on when it fails
    /// [default: 127.0.0.1:8502]
    #[arg(
        long,
        global = true,
        env = "RESD_SERVER",
        hide_env_values = true,
        value_name = "HOST:PORT[,…]"
    )]
    pub server: Option<String>,
    /// ACL token sent with every request
    #[arg(long, global = true, env = "RESD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the ACL token (its first line)
    #[arg(
        long,
        global = true,
        env = "RESD_TOKEN_FILE",
        hide_env_values = true,
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) the server's certificate must chain to; turns TLS on
    #[arg(
        long,
        global = true,
        env = "RESD_CA_CERT",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub ca_cert: Option<PathBuf>,
    /// Client certificate (PEM) for servers that verify clients (`resd tls cert create --client NAME`)
    #[arg(
        long,
        global = true,
        env = "RESD_CLIENT_CERT",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub client_cert: Option<PathBuf>,
    /// Private key (PEM) of the client certificate
    #[arg(
        long,
        global = true,
        env = "RESD_CLIENT_KEY",
        hide_env_values = true,
        value_name = "FILE"
    )]
    pub client_key: Option<PathBuf>,
    /// Named server and token from the contexts file (see `resctl context`)
    #[arg(long, global = true, env = "RESD_CONTEXT", hide_env_values = true)]
    pub context: Option<String>,
    /// How long each call to the cluster may take, retries included (`10s`, `2m`); past it the
    /// command fails saying what it waited for [default: the context's, else 30s]
    #[arg(
        long,
        global = true,
        env = "RESD_REQUEST_TIMEOUT",
        value_name = "DURATION",
        value_parser = parse_duration
    )]
    pub request_timeout: Option<Duration>,
}

/// Where the flags, the environment and the context lead.
#[derive(Debug, Clone)]
pub struct Connection {
    pub config: ClientConfig,
    /// The context's default tenancy, if it has one.
    pub partition: Option<String>,
    pub namespace: Option<String>,
    /// The context used, if any.
    pub context: Option<String>,
}

/// Why the connection settings cannot be used (each names the file or setting).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Contexts(#[from] ContextsError),
    #[error("--context needs a contexts file, but neither RESCTL_CONFIG nor HOME is set")]
    NoContextsFile,
    #[error("cannot read --token-file {path}: {error}")]
    TokenFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] ClientError),
    /// A setting that does not parse (a usage error).
    #[error("{0}")]
    Usage(String),
}

impl ConnectArgs {
    /// The flags over the selected context (from the contexts file) over the defaults.
    pub fn resolve(&self) -> Result<Connection, ConnectError> {
        self.resolve_from(super::contexts::path())
    }

    /// [`ConnectArgs::resolve`] with the contexts file at `contexts` (none: no file).
    pub fn resolve_from(&self, contexts: Option<PathBuf>) -> Result<Connection, ConnectError> {
        let context = match contexts {
            Some(path) => ContextsFile::load(&path)?.select(self.context.as_deref())?,
            None if self.context.is_some() => return Err(ConnectError::NoContextsFile),
            None => None,
        };
        let (name, entry) = context
            .map(|(name, entry)| (Some(name), entry))
            .unwrap_or((None, ContextEntry::default()));
        let server = self
            .server
            .clone()
            .or(entry.server)
            .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
        let path = |flag: &Option<PathBuf>, stored: Option<String>| {
            flag.clone()
                .or_else(|| stored.map(|stored| expand_home(&stored)))
        };
        let tls = ClientTls::from_paths(
            path(&self.ca_cert, entry.ca_cert),
            path(&self.client_cert, entry.client_cert),
            path(&self.client_key, entry.client_key),
        )?;
        let from_file = match &self.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|error| ConnectError::TokenFile {
                        path: path.clone(),
                        error,
                    })?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            ),
            None => None,
        };
        let request_timeout = match (self.request_timeout, &entry.request_timeout) {
            (Some(timeout), _) => Some(timeout),
            (None, Some(text)) => Some(parse_duration(text).map_err(|why| {
                ConnectError::Usage(format!("the context's request_timeout {text:?}: {why}"))
            })?),
            (None, None) => None,
        };
        let mut config = ClientConfig::new(server)
            .with_tls(tls)
            .with_token(self.token.clone().or(from_file).or(entry.token));
        if let Some(timeout) = request_timeout {
            config = config.with_request_timeout(timeout);
        }
        Ok(Connection {
            config,
            partition: entry.partition,
            namespace: entry.namespace,
            context: name,
        })
    }
}

/// A duration such as `500ms`, `30s` (or `30`), `5m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration; use e.g. 500ms, 30s, 5m"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}; use ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|error| format!("{text:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEV: &str = "current: dev\ncontexts:\n  dev: {server: 127.0.0.1:9502, token: dev-token, namespace: billing, ca_cert: /tmp/dev/resd-ca.pem, client_cert: /tmp/dev/dev-client.pem, client_key: /tmp/dev/dev-client-key.pem, request_timeout: 5s}\n  other: {server: 10.0.0.1:8502}\n";

    fn contexts(yaml: &str) -> (tempfile::TempDir, PathBuf) {
        let directory = tempfile::tempdir().expect("temp dir");
        let path = directory.path().join("contexts.yaml");
        std::fs::write(&path, yaml).expect("contexts");
        (directory, path)
    }

    #[test]
    fn with_no_flag_a_program_takes_the_current_context() {
        let (_directory, path) = contexts(DEV);
        let connection = ConnectArgs::default()
            .resolve_from(Some(path))
            .expect("resolves");
        assert_eq!(connection.context.as_deref(), Some("dev"));
        assert_eq!(connection.config.server, "127.0.0.1:9502");
        assert_eq!(connection.config.token.as_deref(), Some("dev-token"));
        assert_eq!(connection.namespace.as_deref(), Some("billing"));
        assert_eq!(connection.config.request_timeout, Duration::from_secs(5));
        let tls = connection.config.tls.expect("TLS from the context");
        assert_eq!(tls.ca_cert, PathBuf::from("/tmp/dev/resd-ca.pem"));
        assert_eq!(
            tls.client_cert,
            Some(PathBuf::from("/tmp/dev/dev-client.pem"))
        );
    }

    #[test]
    fn flags_win_over_the_context_and_name_another() {
        let (_directory, path) = contexts(DEV);
        let token = path.with_file_name("token");
        std::fs::write(&token, "from-file\nignored\n").expect("token file");
        let connection = ConnectArgs {
            server: Some("127.0.0.1:1".into()),
            token_file: Some(token),
            ..ConnectArgs::default()
        }
        .resolve_from(Some(path.clone()))
        .expect("resolves");
        assert_eq!(connection.config.server, "127.0.0.1:1");
        assert_eq!(connection.config.token.as_deref(), Some("from-file"));
        let other = ConnectArgs {
            context: Some("other".into()),
            ..ConnectArgs::default()
        }
        .resolve_from(Some(path.clone()))
        .expect("resolves");
        assert_eq!(other.config.server, "10.0.0.1:8502");
        assert!(other.config.tls.is_none() && other.config.token.is_none());
        let unknown = ConnectArgs {
            context: Some("prod".into()),
            ..ConnectArgs::default()
        }
        .resolve_from(Some(path))
        .unwrap_err()
        .to_string();
        assert!(unknown.contains("known contexts: dev, other"), "{unknown}");
    }

    #[test]
    fn without_a_contexts_file_the_defaults_hold_and_a_context_cannot_be_named() {
        let connection = ConnectArgs::default().resolve_from(None).expect("defaults");
        assert_eq!(connection.config.server, DEFAULT_SERVER);
        assert!(connection.context.is_none());
        let error = ConnectArgs {
            context: Some("dev".into()),
            ..ConnectArgs::default()
        }
        .resolve_from(None)
        .unwrap_err();
        assert!(matches!(error, ConnectError::NoContextsFile), "{error}");
        let (_directory, path) =
            contexts("contexts:\n  dev: {request_timeout: soon}\ncurrent: dev\n");
        let error = ConnectArgs::default()
            .resolve_from(Some(path))
            .unwrap_err()
            .to_string();
        assert!(error.contains("request_timeout \"soon\""), "{error}");
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
    }
}
