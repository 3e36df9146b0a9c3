//! `resd dev`: a 3-node cluster on this machine for trying resd out. Secure by default — a
//! throwaway CA with node and client certificates, client certificates required, ACLs
//! bootstrapped by the cluster itself from a secret in a file, and a resctl context `resd-dev`
//! made current while it runs — or plaintext without ACLs when `insecure`. What it prints for
//! people (addresses, files, commands to try) goes to the writer the binary gives it.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Agent, AgentError, dev_cluster};

/// The resctl context `resd dev` writes for its secure cluster.
pub const DEV_CONTEXT: &str = "resd-dev";

/// How to run the dev cluster.
#[derive(Debug, Clone)]
pub struct DevSettings {
    /// Ports of node 1; nodes 2 and 3 use the next ones (0 picks free ports).
    pub api_port: u16,
    pub raft_port: u16,
    pub http_port: u16,
    /// Keep the data directories (and the context) instead of deleting them on exit.
    pub keep: bool,
    /// Plaintext without ACLs.
    pub insecure: bool,
}

/// Why the dev cluster could not run.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("cannot create a temporary data directory: {0}")]
    DataDirectory(std::io::Error),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot write {path}: {source}")]
    Secret {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make the management secret: {0}")]
    Random(String),
    #[error("cannot start node {node}: {source}")]
    Start { node: u64, source: AgentError },
    #[error("cannot read the bound API address: {0}")]
    Address(std::io::Error),
    #[error(transparent)]
    Node(#[from] AgentError),
    #[error("a node task failed: {0}")]
    Task(String),
    #[error("cannot write to the terminal: {0}")]
    Output(std::io::Error),
}

/// Runs the dev cluster until `shutdown` (the binary cancels it on SIGINT or SIGTERM), then
/// removes its data (unless kept) and its resctl context, putting the previous one back.
pub async fn run(
    settings: &DevSettings,
    shutdown: CancellationToken,
    out: &mut (dyn Write + Send),
) -> Result<(), DevError> {
    let say = |out: &mut (dyn Write + Send), line: String| {
        writeln!(out, "{line}").map_err(DevError::Output)
    };
    let base = tempfile::Builder::new()
        .prefix("resd-dev-")
        .tempdir()
        .map_err(DevError::DataDirectory)?;
    let mut configs = dev_cluster(
        base.path(),
        3,
        settings.api_port,
        settings.raft_port,
        Some(settings.http_port),
    );
    let mut flags = Flags::plaintext();
    let secure = !settings.insecure;
    if settings.insecure {
        for config in configs.iter_mut() {
            config.insecure = true;
        }
    } else {
        let dir = base.path().join("tls");
        let ca = crate::tls::create_ca(&dir)?;
        for config in configs.iter_mut() {
            let node =
                crate::tls::create_node_cert(&dir, config.node_id, &config.cluster_name, &[], &[])?;
            config.tls_ca = Some(ca.cert.clone());
            config.tls_cert = Some(node.cert);
            config.tls_key = Some(node.key);
            config.tls_verify_clients = true;
        }
        let client = crate::tls::create_client_cert(&dir, "dev")?;
        flags = Flags::tls(&ca.cert, &client.cert, &client.key);
        say(
            out,
            format!(
                "resd: TLS on both ports; a throwaway CA and certificates are in {}",
                dir.display()
            ),
        )?;
    }
    // With TLS, ACLs: bootstrapped by the cluster itself from a secret in a file (0600).
    let management_token = if secure {
        let secret = proto::tls::new_secret().map_err(|why| DevError::Random(why.to_string()))?;
        let file = base.path().join("initial-management");
        write_private(&file, &secret)?;
        for config in configs.iter_mut() {
            config.acl_enabled = true;
            config.acl_initial_management_file = Some(file.clone());
        }
        Some(secret)
    } else {
        None
    };
    let client_tls = configs[0].tls_ca.as_ref().map(|ca| {
        let dir = ca.parent().map(Path::to_path_buf).unwrap_or_default();
        (
            ca.clone(),
            dir.join("client-dev.pem"),
            dir.join("client-dev-key.pem"),
        )
    });
    let mut running = Vec::new();
    let mut first_api: Option<String> = None;
    for config in &configs {
        let mut config = config.clone();
        config.join = first_api.clone();
        let agent = Agent::start(config.clone(), shutdown.clone())
            .await
            .map_err(|source| DevError::Start {
                node: config.node_id,
                source,
            })?;
        let api_addr = agent.api_addr().map_err(DevError::Address)?;
        say(
            out,
            format!(
                "node {}  api {}  raft {}  http {}  data {}",
                config.node_id,
                api_addr,
                agent.raft_addr().map(|a| a.to_string()).unwrap_or_default(),
                agent.http_addr().map(|a| a.to_string()).unwrap_or_default(),
                config
                    .data_dir
                    .as_deref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default()
            ),
        )?;
        running.push(tokio::spawn(
            agent
                .run()
                .instrument(tracing::info_span!("node", id = config.node_id)),
        ));
        if first_api.is_none() {
            first_api = Some(api_addr.to_string());
        }
    }
    let first_api = first_api.unwrap_or_default();
    let mut context = None;
    if let Some(secret) = &management_token {
        flags.token(secret);
        say(
            out,
            format!(
                "resd: ACLs on; the management token (initial-management) is in {}",
                base.path().join("initial-management").display()
            ),
        )?;
        // resctl and the dashboard find the cluster, its certificates and the token in a
        // context: the README's commands work with no flag.
        if let Some((ca, cert, key)) = &client_tls {
            match DevContext::write(&first_api, secret, ca, cert, key) {
                Ok(written) => {
                    say(
                        out,
                        format!(
                            "resd: resctl context {DEV_CONTEXT} (current while this runs) in {}",
                            written.path.display()
                        ),
                    )?;
                    flags.connect.clear();
                    context = Some(written);
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot write the resctl context; pass the flags printed below");
                    flags.connect.push_str(&format!(" --token {secret}"));
                }
            }
        }
    }
    let http = match configs.first().and_then(|c| c.http_addr) {
        Some(addr) if addr.port() != 0 => {
            let scheme = if secure { "https" } else { "http" };
            let curl = &flags.curl;
            format!(
                "\n  curl{curl} '{scheme}://{addr}/v1/resources/demo/v2/Artist?namespace=*'\n  curl{curl} {scheme}://{addr}/metrics"
            )
        }
        _ => String::new(),
    };
    let Flags {
        connect, grpcurl, ..
    } = &flags;
    say(
        out,
        format!(
            "resd: 3-node dev cluster running; connect to any API address, e.g.\n  resctl --server {first_api}{connect} apply -f fixtures/demo\n  resctl --server {first_api}{connect} get demo.v2.Artist -A\n  grpcurl {grpcurl} {first_api} list{http}\nCtrl-C stops it."
        ),
    )?;

    let mut failure = None;
    for task in running {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => failure = Some(DevError::Node(error)),
            Err(error) => failure = Some(DevError::Task(error.to_string())),
        }
    }
    if let Some(context) = context
        && !settings.keep
    {
        context.remove();
    }
    if settings.keep {
        let kept = base.keep();
        say(out, format!("resd: data kept in {}", kept.display()))?;
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// The flags the printed commands need: resctl's, grpcurl's and curl's.
struct Flags {
    connect: String,
    grpcurl: String,
    curl: String,
}

impl Flags {
    fn plaintext() -> Flags {
        Flags {
            connect: String::new(),
            grpcurl: "-plaintext".to_owned(),
            curl: String::new(),
        }
    }

    fn tls(ca: &Path, cert: &Path, key: &Path) -> Flags {
        let (ca, cert, key) = (ca.display(), cert.display(), key.display());
        Flags {
            connect: format!(" --ca-cert {ca} --client-cert {cert} --client-key {key}"),
            grpcurl: format!("-cacert {ca} -cert {cert} -key {key}"),
            curl: format!(" --cacert {ca} --cert {cert} --key {key}"),
        }
    }

    /// The management token, for grpcurl and curl (resctl finds it in its context).
    fn token(&mut self, secret: &str) {
        self.grpcurl
            .push_str(&format!(" -H 'x-resd-token: {secret}'"));
        self.curl.push_str(&format!(" -H 'X-Resd-Token: {secret}'"));
    }
}

/// Writes `contents` to a new file only its owner may read.
fn write_private(path: &Path, contents: &str) -> Result<(), DevError> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |source| DevError::Secret {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(failed)?;
    file.write_all(contents.as_bytes()).map_err(failed)
}

/// The `resd-dev` entry of resctl's contexts file (`proto::client::contexts`, the file
/// `resctl context` uses), made current while the dev cluster runs.
struct DevContext {
    path: PathBuf,
    /// The context that was current before, restored when the cluster stops.
    previous: Option<String>,
}

/// Why the context could not be written.
#[derive(Debug, thiserror::Error)]
enum ContextError {
    #[error("neither RESCTL_CONFIG nor HOME is set")]
    NoHome,
    #[error(transparent)]
    File(#[from] proto::client::contexts::ContextsError),
}

impl DevContext {
    fn write(
        server: &str,
        token: &str,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<DevContext, ContextError> {
        use proto::client::contexts::{self, ContextEntry, ContextsFile};
        let path = contexts::path().ok_or(ContextError::NoHome)?;
        let mut file = ContextsFile::load(&path)?;
        let previous = file.current.take().filter(|current| current != DEV_CONTEXT);
        file.contexts.insert(
            DEV_CONTEXT.to_owned(),
            ContextEntry {
                server: Some(server.to_owned()),
                token: Some(token.to_owned()),
                ca_cert: Some(ca.display().to_string()),
                client_cert: Some(cert.display().to_string()),
                client_key: Some(key.display().to_string()),
                ..Default::default()
            },
        );
        file.current = Some(DEV_CONTEXT.to_owned());
        file.save(&path)?;
        Ok(DevContext { path, previous })
    }

    /// Removes the entry (its certificates are gone with the cluster) and makes the previous
    /// context current again.
    fn remove(self) {
        use proto::client::contexts::ContextsFile;
        let restored = ContextsFile::load(&self.path).and_then(|mut file| {
            file.contexts.remove(DEV_CONTEXT);
            if file.current.as_deref() == Some(DEV_CONTEXT) {
                file.current = self.previous.clone();
            }
            file.save(&self.path)
        });
        if let Err(error) = restored {
            tracing::warn!(%error, "cannot remove the resctl context {DEV_CONTEXT}");
        }
    }
}
