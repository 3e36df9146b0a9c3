//! The agent: one running resd node. Builds the registry, the storage backend (Raft on LMDB, or
//! in memory) and the services, binds the listeners, joins or bootstraps the cluster, and serves
//! until shutdown. `main.rs` turns flags and the config file into an [`AgentConfig`] and signals
//! into the shutdown token.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub mod dev;
mod reflection;
mod serve;

pub use serve::ServeError;

use crate::tls::accept::Listening;

use crate::acl::{AclsDisabled, TokenResolver, TokenStore};
use crate::cluster::{Cluster, RaftCluster};
use crate::controller::builtin;
use crate::controller::manager::Manager;
use crate::metrics::{ControllerSample, Metrics, RaftSample, Sample};
use crate::registry::{Registry, RegistryError};
use crate::service::cluster::{ClusterGrpc, ControllerReport};
use crate::service::grpc::ResourceGrpc;
use crate::service::{self, ResourceService};
use crate::storage::Backend;
use crate::storage::events::HistoryLimits;
use crate::storage::inmem::InMemBackend;
use crate::storage::raft::backend::RaftBackend;
use crate::storage::raft::network::RaftGrpc;
use crate::storage::raft::node::{RaftNode, RaftOptions, RaftStartError};
use crate::storage::raft::schema::{DirLock, LockError};
use crate::storage::raft::types::NodeAddr;
use crate::tls::{Dialer, NodeTls, Refusals, TlsError, TlsSettings};

/// Where a node keeps its resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum StorageKind {
    /// Raft-replicated, durable in LMDB under the data directory.
    #[default]
    Raft,
    /// One process, nothing survives a restart: for experiments and tests.
    Memory,
}

/// Everything a node needs to start. Also the shape of the YAML config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The name operators know the cluster by (shown by `resctl cluster status` and the
    /// dashboard); every member should use the same.
    pub cluster_name: String,
    pub node_id: u64,
    pub data_dir: Option<PathBuf>,
    /// Address of the public gRPC API; port 0 picks a free port.
    pub api_addr: SocketAddr,
    /// Address of the internal raft service; port 0 picks a free port.
    pub raft_addr: SocketAddr,
    /// Address of the HTTP server (`/metrics`, `/healthz`, `/readyz`, the HTTP+JSON API); off
    /// unless set.
    pub http_addr: Option<SocketAddr>,
    /// Initialize a new cluster with this node as its first voter (ignored once initialized).
    pub bootstrap: bool,
    /// API address of a member to join through.
    pub join: Option<String>,
    pub storage: StorageKind,
    /// Build a raft snapshot once this many writes were applied since the last one.
    pub snapshot_every: u64,
    /// Largest encoded resource a client may write.
    pub max_resource_bytes: usize,
    /// Largest raft snapshot accepted from a leader, and largest operator snapshot restored.
    pub max_snapshot_bytes: u64,
    /// Free space on the data directory's disk below which new writes are refused.
    pub disk_reserve_bytes: u64,
    /// Bytes the state may hold; writes past it are refused.
    pub quota_bytes: u64,
    /// Entries behind the leader past which a follower is not ready.
    pub max_lag_entries: u64,
    /// Bytes of recent changes kept for resuming watches.
    pub watch_history_bytes: usize,
    /// How long a request waits for a leader during an election, in milliseconds.
    pub forward_timeout_ms: u64,
    /// Delay of the reaper's second pass over a tombstone (catches late children), in ms.
    pub reaper_second_pass_ms: u64,
    /// The CA certificate peers and clients must chain to; with `tls_cert` and `tls_key`, both
    /// ports speak TLS only (DESIGN §12.2).
    pub tls_ca: Option<PathBuf>,
    /// This node's certificate (naming `node-<id>.<cluster>.resd`).
    pub tls_cert: Option<PathBuf>,
    /// This node's private key.
    pub tls_key: Option<PathBuf>,
    /// Require API clients to present a certificate from the CA.
    pub tls_verify_clients: bool,
    /// Enforce ACLs: every request needs a valid token (DESIGN §12.3).
    pub acl_enabled: bool,
    /// What rules grant where none speaks.
    pub acl_default_policy: DefaultPolicy,
    /// Token a joining node presents without TLS (needs the join right).
    pub join_token: Option<String>,
    /// A file holding the join token (kept out of the command line and the environment).
    pub join_token_file: Option<PathBuf>,
    /// A file holding the secret of the first management token: the cluster bootstraps its
    /// ACLs with it by itself (Consul's `initial_management`), once.
    pub acl_initial_management_file: Option<PathBuf>,
    /// Watches one token (one address with ACLs off) may hold open at once.
    pub max_watches_per_token: usize,
    /// Types registered at runtime (`registry.v1.Type`), at most.
    pub max_types: usize,
    /// Bytes of compiled descriptors all registered types may hold together.
    pub max_schema_bytes: usize,
    /// The history built-in types' objects keep (registered types: their Type's `history`):
    /// versions, seconds and bytes per object.
    pub history_versions: u32,
    pub history_seconds: u64,
    pub history_bytes: u64,
    /// Bytes of history this node keeps in all (at most half of `quota_bytes`; 0: a quarter of
    /// it, at most 1 GiB).
    pub history_node_bytes: u64,
    /// Where to log every request (DESIGN §18), if anywhere.
    pub audit_log: Option<PathBuf>,
    pub audit_level: crate::audit::AuditLevel,
    /// Size an audit log file grows to before it is rotated, and rotated files kept.
    pub audit_log_max_bytes: u64,
    pub audit_log_files: u32,
    /// Requests per second one token may send, twice that in a burst; 0: no limit. With ACLs
    /// off there are no tokens to tell apart and no rate applies.
    pub max_requests_per_second_per_token: u32,
    /// Bytes of request bodies being received, and of lists being answered, each, at most on
    /// this node; one caller may hold a quarter of it.
    pub max_inflight_bytes: usize,
    /// Seconds a watch may wait for its client to read what it was sent before it is ended
    /// (with the version to resume from).
    pub watch_stall_seconds: u64,
    /// Serve without TLS. Refused with ACLs (an unauthenticated raft port makes them
    /// decoration); without it, a node without certificates refuses to start.
    pub insecure: bool,
}

/// What ACL rules grant where no rule speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DefaultPolicy {
    #[default]
    Deny,
    Allow,
}

impl AgentConfig {
    /// The TLS settings, when all three files are given; an error naming what is missing when
    /// only some are.
    pub fn tls_settings(&self) -> Result<Option<TlsSettings>, AgentError> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) if self.tls_verify_clients => Err(AgentError::Config(
                "--tls-verify-clients needs TLS: give --tls-ca, --tls-cert and --tls-key".into(),
            )),
            (None, None, None) => Ok(None),
            (Some(ca), Some(cert), Some(key)) => Ok(Some(TlsSettings {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
                verify_clients: self.tls_verify_clients,
            })),
            (ca, cert, key) => {
                let missing: Vec<&str> =
                    [("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)]
                        .into_iter()
                        .filter(|(_, path)| path.is_none())
                        .map(|(flag, _)| flag)
                        .collect();
                Err(AgentError::Config(format!(
                    "TLS needs --tls-ca, --tls-cert and --tls-key together; missing {}",
                    missing.join(" and ")
                )))
            }
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            cluster_name: "resd".into(),
            node_id: 1,
            data_dir: None,
            api_addr: SocketAddr::from(([127, 0, 0, 1], 8502)),
            raft_addr: SocketAddr::from(([127, 0, 0, 1], 8302)),
            http_addr: None,
            bootstrap: false,
            join: None,
            storage: StorageKind::Raft,
            snapshot_every: 10_000,
            max_resource_bytes: service::DEFAULT_MAX_RESOURCE_BYTES,
            max_snapshot_bytes: crate::storage::raft::node::DEFAULT_MAX_SNAPSHOT_BYTES,
            disk_reserve_bytes: crate::storage::raft::node::DEFAULT_DISK_RESERVE,
            quota_bytes: crate::storage::raft::schema::DEFAULT_QUOTA_BYTES,
            max_lag_entries: crate::storage::raft::node::DEFAULT_MAX_LAG_ENTRIES,
            watch_history_bytes: crate::storage::events::DEFAULT_HISTORY_BYTES,
            forward_timeout_ms: 10_000,
            reaper_second_pass_ms: 1_000,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_verify_clients: false,
            acl_enabled: false,
            acl_default_policy: DefaultPolicy::Deny,
            join_token: None,
            join_token_file: None,
            acl_initial_management_file: None,
            max_watches_per_token: crate::limits::DEFAULT_MAX_WATCHES_PER_TOKEN,
            max_types: crate::registry::DEFAULT_MAX_TYPES,
            max_schema_bytes: crate::registry::DEFAULT_MAX_SCHEMA_BYTES,
            history_versions: crate::resource::DEFAULT_HISTORY_VERSIONS,
            history_seconds: crate::resource::DEFAULT_HISTORY_SECONDS,
            history_bytes: crate::resource::DEFAULT_HISTORY_BYTES,
            history_node_bytes: 0,
            audit_log: None,
            audit_level: crate::audit::AuditLevel::Metadata,
            audit_log_max_bytes: crate::audit::DEFAULT_MAX_BYTES,
            audit_log_files: crate::audit::DEFAULT_FILES,
            max_requests_per_second_per_token:
                crate::limits::DEFAULT_MAX_REQUESTS_PER_SECOND_PER_TOKEN,
            max_inflight_bytes: crate::limits::DEFAULT_MAX_INFLIGHT_BYTES,
            watch_stall_seconds: service::stalls::STALLED_AFTER.as_secs(),
            insecure: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid type registry: {0}")]
    Registry(#[from] RegistryError),
    #[error(
        "cannot listen on {addr} for the {what}: {source} (is another program using the port? choose another address)"
    )]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Raft(#[from] RaftStartError),
    #[error("cannot create the default partition and namespace: {0}")]
    Bootstrap(#[source] service::Error),
    /// What the node decides from (tokens, reports) cannot be read from its stored state.
    #[error("cannot read the stored {what}: {source}")]
    Projection {
        what: &'static str,
        #[source]
        source: crate::storage::StorageError,
    },
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot use TLS: {0}")]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Locked(#[from] LockError),
    /// The node stopped itself: its state machine was found damaged. A restart rebuilds it
    /// from the latest snapshot and the raft log (or from the leader).
    #[error("stopped: the state machine was found damaged ({0})")]
    Damaged(String),
    /// The node stopped itself: raft stopped on an error it cannot go on from.
    #[error("stopped: raft stopped on this node ({0}); start resd again")]
    Halted(String),
}

impl AgentError {
    /// Whether the node could not start because of how it was configured (flags, config file,
    /// certificate files), rather than something that happened while running.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            AgentError::Config(_)
                | AgentError::Tls(_)
                | AgentError::Registry(_)
                | AgentError::Locked(LockError::Held { .. })
                | AgentError::Raft(RaftStartError::Identity(_))
        )
    }
}

/// A node that has bound its listeners and is ready to serve.
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    /// The data directory, held for as long as the node runs.
    data_dir_lock: Option<DirLock>,
    api_listener: TcpListener,
    raft: Option<(Arc<RaftNode>, TcpListener)>,
    service: Arc<ResourceService>,
    tokens: Arc<dyn TokenResolver>,
    /// With ACLs on, the token cache the agent keeps current.
    acl_store: Option<Arc<TokenStore>>,
    tls: Option<Arc<NodeTls>>,
    http_listener: Option<TcpListener>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    /// The secret of `--acl-initial-management-file`.
    initial_management: Option<String>,
}

/// Reads a secret kept in a file (trimmed): 16 to 512 printable characters. Warns when other
/// users may read the file.
fn read_secret_file(path: &std::path::Path, flag: &str) -> Result<String, AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path).map_err(|error| {
        AgentError::Config(format!(
            "{flag} {}: cannot read it: {error}",
            path.display()
        ))
    })?;
    let secret = text.trim().to_owned();
    let len = secret.len();
    if !(crate::acl::rules::MIN_SECRET_LEN..=crate::acl::rules::MAX_SECRET_LEN).contains(&len)
        || !secret.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(AgentError::Config(format!(
            "{flag} {}: a secret is {} to {} printable characters without spaces (this file holds {len})",
            path.display(),
            crate::acl::rules::MIN_SECRET_LEN,
            crate::acl::rules::MAX_SECRET_LEN
        )));
    }
    if let Ok(metadata) = std::fs::metadata(path)
        && metadata.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            path = %path.display(),
            "{flag}: other users may read this secret; chmod 600 it"
        );
    }
    Ok(secret)
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AgentError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AgentError::Bind { what, addr, source })
}

impl Agent {
    /// Builds the node and binds its listeners. Nothing is served until [`Agent::run`].
    pub async fn start(
        config: AgentConfig,
        shutdown: CancellationToken,
    ) -> Result<Agent, AgentError> {
        let registry = Arc::new(Registry::builtin()?);
        registry.dynamic().set_max_types(config.max_types);
        registry
            .dynamic()
            .set_max_schema_bytes(config.max_schema_bytes);
        let tls = match config.tls_settings()? {
            Some(settings) => {
                let tls = NodeTls::load(&settings, &config.cluster_name, config.node_id)?;
                if tls.expires_soon() {
                    tracing::warn!(
                        certificate = %settings.cert.display(),
                        days_left = tls.expires_in().as_secs() / 86_400,
                        "this node's certificate expires soon; make a new one with `resd tls cert create` and restart the node"
                    );
                }
                Some(Arc::new(tls))
            }
            None => None,
        };
        // Secure by default (DESIGN §12.2): plaintext only when asked for, and never with ACLs.
        match (&tls, config.insecure) {
            (None, false) => {
                return Err(AgentError::Config(
                    "this node has no TLS certificates: give --tls-ca, --tls-cert and --tls-key (make them with `resd tls ca create` and `resd tls cert create --node-id N`), or --insecure to serve in plaintext, where anyone who reaches a port can read and change everything".into(),
                ));
            }
            (Some(_), true) => {
                return Err(AgentError::Config(
                    "--insecure and TLS certificates exclude each other: drop --insecure to serve TLS".into(),
                ));
            }
            (None, true) if config.acl_enabled => {
                return Err(AgentError::Config(
                    "--acl-enabled with --insecure is refused: without TLS the raft port is unauthenticated, and anyone who reaches it can write tokens; give the node TLS certificates".into(),
                ));
            }
            (None, true) => tracing::warn!(
                "serving in plaintext (--insecure): anyone who reaches the API or raft port can read and change everything"
            ),
            (Some(_), false) => {}
        }
        let initial_management = match &config.acl_initial_management_file {
            Some(path) if config.acl_enabled => {
                Some(read_secret_file(path, "--acl-initial-management-file")?)
            }
            Some(_) => {
                return Err(AgentError::Config(
                    "--acl-initial-management-file needs --acl-enabled".into(),
                ));
            }
            None => None,
        };
        let mut config = config;
        if let Some(path) = config.join_token_file.clone() {
            if config.join_token.is_some() {
                return Err(AgentError::Config(
                    "--join-token and --join-token-file exclude each other".into(),
                ));
            }
            config.join_token = Some(read_secret_file(&path, "--join-token-file")?);
        }
        let dialer = Dialer::new(tls.clone());
        let metrics = Arc::new(Metrics::new());
        // Before anything listens: a second process on the same directory is told so, not
        // that a port is taken.
        let data_dir_lock = match (&config.storage, &config.data_dir) {
            (StorageKind::Raft, Some(dir)) => Some(DirLock::acquire(dir)?),
            _ => None,
        };
        let api_listener = bind("API", config.api_addr).await?;
        let http_listener = match config.http_addr {
            Some(addr) => Some(bind("HTTP API", addr).await?),
            None => None,
        };
        let api_addr = api_listener
            .local_addr()
            .map_err(|source| AgentError::Bind {
                what: "API",
                addr: config.api_addr,
                source,
            })?;

        let history = HistoryLimits {
            bytes: config.watch_history_bytes,
            ..HistoryLimits::default()
        };
        let (backend, raft): (Arc<dyn Backend>, _) = match config.storage {
            StorageKind::Memory => (Arc::new(InMemBackend::with_history(history)), None),
            StorageKind::Raft => {
                let Some(data_dir) = config.data_dir.clone() else {
                    return Err(AgentError::Config(
                        "--data-dir is required with raft storage (or run with --storage memory)"
                            .into(),
                    ));
                };
                if config.node_id == 0 {
                    return Err(AgentError::Config("--node-id must be 1 or more".into()));
                }
                if config.bootstrap && config.join.is_some() {
                    return Err(AgentError::Config(
                        "--bootstrap and --join exclude each other: bootstrap the first node, join the others".into(),
                    ));
                }
                let raft_listener = bind("raft service", config.raft_addr).await?;
                let raft_addr = raft_listener
                    .local_addr()
                    .map_err(|source| AgentError::Bind {
                        what: "raft service",
                        addr: config.raft_addr,
                        source,
                    })?;
                let node = NodeAddr {
                    api_addr: api_addr.to_string(),
                    raft_addr: raft_addr.to_string(),
                };
                let mut options = RaftOptions::new(config.node_id, data_dir, node);
                options.snapshot_every = config.snapshot_every.max(1);
                options.max_snapshot_bytes = config.max_snapshot_bytes;
                options.disk_reserve = config.disk_reserve_bytes;
                if config.quota_bytes > crate::storage::raft::schema::MAX_QUOTA_BYTES {
                    return Err(AgentError::Config(format!(
                        "--quota-bytes {} is more than this build allows ({})",
                        config.quota_bytes,
                        crate::storage::raft::schema::MAX_QUOTA_BYTES
                    )));
                }
                options.quota_bytes = config.quota_bytes;
                options.max_lag_entries = config.max_lag_entries;
                options.history = history;
                options.forward_timeout = Duration::from_millis(config.forward_timeout_ms.max(100));
                options.dialer = dialer.clone();
                options.cluster_name = config.cluster_name.clone();
                options.metrics = metrics.storage.clone();
                let node = RaftNode::open(options).await?;
                (
                    Arc::new(RaftBackend::new(node.clone())) as Arc<dyn Backend>,
                    Some((node, raft_listener)),
                )
            }
        };
        let history_node_bytes = match config.history_node_bytes {
            0 => (config.quota_bytes / 4).min(crate::storage::history::DEFAULT_NODE_BYTES),
            set => set,
        };
        if history_node_bytes > config.quota_bytes / 2 {
            return Err(AgentError::Config(format!(
                "--history-node-bytes {} is more than half of --quota-bytes ({}): history shares the state's files; lower it or raise the quota",
                history_node_bytes, config.quota_bytes
            )));
        }
        let builtin_history = crate::resource::Retention {
            versions: config.history_versions,
            seconds: config.history_seconds,
            bytes: config.history_bytes,
        };
        if builtin_history.versions > crate::registry::versions::MAX_HISTORY_VERSIONS
            || builtin_history.seconds > crate::registry::versions::MAX_HISTORY_SECONDS
            || builtin_history.bytes > crate::registry::versions::MAX_HISTORY_BYTES
        {
            return Err(AgentError::Config(format!(
                "--history-versions, --history-seconds and --history-bytes may be at most {}, {} and {}",
                crate::registry::versions::MAX_HISTORY_VERSIONS,
                crate::registry::versions::MAX_HISTORY_SECONDS,
                crate::registry::versions::MAX_HISTORY_BYTES
            )));
        }
        backend.keep_history(Arc::new(service::TypeHistory::new(
            registry.clone(),
            builtin_history,
            history_node_bytes,
        )));
        let service = ResourceService::new(backend, registry)
            .with_max_resource_bytes(config.max_resource_bytes)
            .with_list_budget(config.max_inflight_bytes)
            .with_shutdown(shutdown.clone());
        if raft.is_none() {
            service
                .ensure_default_tenancy()
                .await
                .map_err(AgentError::Bootstrap)?;
        }
        let exposed: Vec<String> = std::iter::once(("API", api_addr))
            .chain(
                raft.as_ref()
                    .and_then(|(_, listener)| listener.local_addr().ok())
                    .map(|addr| ("raft service", addr)),
            )
            .chain(
                http_listener
                    .as_ref()
                    .and_then(|listener| listener.local_addr().ok())
                    .map(|addr| ("HTTP API", addr)),
            )
            .filter(|(_, addr)| !addr.ip().is_loopback())
            .map(|(what, addr)| format!("the {what} on {addr}"))
            .collect();
        let acl_store = config.acl_enabled.then(|| {
            Arc::new(TokenStore::new(match config.acl_default_policy {
                DefaultPolicy::Deny => crate::acl::Access::Deny,
                DefaultPolicy::Allow => crate::acl::Access::Write,
            }))
        });
        let tokens: Arc<dyn TokenResolver> = match &acl_store {
            Some(store) => store.clone(),
            None => Arc::new(AclsDisabled),
        };
        if tls.is_none() && !exposed.is_empty() {
            let (is, it) = if exposed.len() == 1 {
                ("is not on a loopback address and speaks", "it")
            } else {
                ("are not on loopback addresses and speak", "them")
            };
            tracing::warn!(
                "{} {is} plaintext: anyone who can reach {it} can read and change everything; bind {it} to a trusted network only",
                exposed.join(" and ")
            );
        }
        Ok(Agent {
            config,
            data_dir_lock,
            api_listener,
            raft,
            service: Arc::new(service),
            tokens,
            acl_store,
            tls,
            http_listener,
            metrics,
            shutdown,
            initial_management,
        })
    }

    /// The address the HTTP server listens on, when one was asked for.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    }

    /// The address the API listens on (the real port when the config asked for port 0).
    pub fn api_addr(&self) -> std::io::Result<SocketAddr> {
        self.api_listener.local_addr()
    }

    /// The address the raft service listens on, with raft storage.
    pub fn raft_addr(&self) -> Option<SocketAddr> {
        self.raft
            .as_ref()
            .and_then(|(_, listener)| listener.local_addr().ok())
    }

    /// The built-in controllers, ready to run.
    fn controllers(&self) -> Result<Manager, AgentError> {
        let mut manager = Manager::new(self.service.clone());
        builtin::register(
            &mut manager,
            self.service.registry().clone(),
            Duration::from_millis(self.config.reaper_second_pass_ms),
        )
        .map_err(|error| AgentError::Config(format!("invalid controller: {error}")))?;
        Ok(manager)
    }

    /// Serves until the shutdown token is cancelled and every request has finished.
    pub async fn run(self) -> Result<(), AgentError> {
        let api_addr = self.api_addr().map(|a| a.to_string()).unwrap_or_default();
        let manager = self.controllers()?;
        let controllers = manager.controllers().clone();
        let Agent {
            config,
            // Held until the node has stopped (the end of this function).
            data_dir_lock: _data_dir_lock,
            api_listener,
            raft,
            service,
            tokens,
            acl_store,
            tls,
            http_listener,
            metrics,
            shutdown,
            initial_management,
        } = self;
        let net = Network {
            dialer: Dialer::new(tls.clone()),
            refusals: Arc::new(Refusals::default()),
            cluster_name: config.cluster_name.clone(),
            metrics: metrics.clone(),
        };

        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        // A node without raft always leads; the sender lives as long as this function.
        let (_always_leader, standalone) = tokio::sync::watch::channel(true);
        let (raft, cluster, leadership) = match raft {
            Some((raft, listener)) => {
                let cluster = Arc::new(RaftCluster::new(
                    raft.clone(),
                    Arc::new(crate::cluster::Peers::new(raft.clone())),
                    config.cluster_name.clone(),
                ));
                start_raft(
                    &config, &net, &cluster, &raft, listener, &service, &shutdown, &mut tasks,
                )
                .await;
                let leadership = raft.leadership();
                (Some(raft), Some(cluster), leadership)
            }
            None => (None, None, standalone),
        };
        metrics.sample_with(sampler(raft.clone(), controllers.clone()));
        let stopped_by = Arc::new(std::sync::Mutex::new(None));
        if let Some(raft) = &raft {
            tasks.push(tokio::spawn(
                stop_when_raft_cannot_go_on(raft.clone(), stopped_by.clone(), shutdown.clone())
                    .in_current_span(),
            ));
            tasks.push(tokio::spawn(
                log_cluster_changes(raft.clone(), metrics.clone(), shutdown.clone())
                    .in_current_span(),
            ));
        }
        tasks.push(tokio::spawn(
            manager.run(leadership, shutdown.clone()).in_current_span(),
        ));
        if let Some(store) = acl_store {
            // The tokens and policies follow what this node applies (DESIGN §15).
            service
                .project(Arc::new(service::projections::Acl(store)))
                .map_err(|source| AgentError::Projection {
                    what: "ACL tokens and policies",
                    source,
                })?;
            if let Some(secret) = initial_management {
                tasks.push(tokio::spawn(
                    bootstrap_acls_with(service.clone(), secret, shutdown.clone())
                        .in_current_span(),
                ));
            }
        }

        let cluster = ClusterGrpc::new(
            service.registry().clone(),
            cluster.map(|cluster| cluster as Arc<dyn Cluster>),
            api_addr,
        )
        .with_controllers(ControllerReport(Arc::new(move || {
            crate::controller::manager::report(&controllers)
        })))
        .with_cluster_name(config.cluster_name.clone())
        .with_limits(config.max_resource_bytes, config.max_snapshot_bytes)
        .with_dialer(net.dialer.clone())
        .with_acls(tokens.clone(), service.clone());
        service
            .project(Arc::new(service::projections::Reports(
                cluster.report_clock(),
            )))
            .map_err(|source| AgentError::Projection {
                what: "replica reports",
                source,
            })?;
        let resources = ResourceGrpc::new(service.clone(), tokens.clone())
            .with_watch_metrics(metrics.watch.clone())
            .with_watch_stall_timeout(Duration::from_secs(config.watch_stall_seconds.max(1)));
        let audit = match &config.audit_log {
            Some(path) if config.audit_level != crate::audit::AuditLevel::None => {
                let log = crate::audit::AuditLog::open(
                    crate::audit::AuditConfig {
                        path: path.clone(),
                        level: config.audit_level,
                        max_bytes: config.audit_log_max_bytes.max(4096),
                        files: config.audit_log_files,
                    },
                    metrics.audit_lines_lost.clone(),
                )
                .map_err(|error| {
                    AgentError::Config(format!(
                        "--audit-log {}: cannot open it for appending: {error}",
                        path.display()
                    ))
                })?;
                tracing::info!(path = %path.display(), level = ?config.audit_level, "audit log open");
                Some(log)
            }
            _ => None,
        };
        let limits = crate::limits::Limits::new(
            crate::limits::LimitSettings {
                max_watches_per_token: config.max_watches_per_token,
                max_requests_per_second_per_token: config.max_requests_per_second_per_token,
                max_inflight_bytes: config.max_inflight_bytes,
                max_body_bytes: config.max_resource_bytes + serve::REQUEST_ENVELOPE_SLACK,
            },
            tokens.clone(),
        );
        if let Some(listener) = http_listener {
            let router = crate::http::router(crate::http::HttpState {
                resources: resources.clone(),
                cluster: cluster.clone(),
                raft: raft.clone(),
                registry: service.registry().clone(),
                tokens,
                metrics: metrics.clone(),
                max_body_bytes: config.max_resource_bytes + serve::REQUEST_ENVELOPE_SLACK,
                limits: limits.clone(),
                audit: audit.clone(),
            });
            let listening = net.listening(tls.as_ref().map(|tls| tls.http_server_config()));
            tasks.push(tokio::spawn(
                crate::http::serve(listener, listening, router, shutdown.clone()).in_current_span(),
            ));
        }
        let served = serve::serve_api(
            api_listener,
            net.listening(tls.as_ref().map(|tls| tls.api_server_config())),
            serve::Api {
                service,
                resources,
                cluster,
                metrics: metrics.clone(),
                limits,
                audit,
            },
            raft.clone(),
            shutdown.clone(),
        )
        .await;
        shutdown.cancel();
        // The node's tasks stop at the token; one that cannot (a controller's write waiting for
        // a quorum that left first) must not keep the process up past the grace period.
        let stopped =
            tokio::time::timeout(SHUTDOWN_GRACE, futures::future::join_all(tasks.iter_mut())).await;
        if stopped.is_err() {
            let running = tasks.iter().filter(|task| !task.is_finished()).count();
            tracing::warn!(
                running,
                grace = ?SHUTDOWN_GRACE,
                "tasks still running after the grace period (waiting for a quorum that is gone?); stopping them"
            );
            for task in &tasks {
                task.abort();
            }
        }
        if let Some(raft) = raft
            && tokio::time::timeout(SHUTDOWN_GRACE, raft.shutdown())
                .await
                .is_err()
        {
            tracing::error!(
                grace = ?SHUTDOWN_GRACE,
                "raft did not stop within the grace period (a stalled disk?); exiting without a clean stop: the next start rebuilds the state from the snapshot and the log, and nothing acknowledged is lost"
            );
        }
        served?;
        let stopped = stopped_by.lock().unwrap_or_else(|p| p.into_inner()).take();
        match stopped {
            Some(stopped) => Err(stopped),
            None => Ok(()),
        }
    }
}

/// Stops the node when it can serve nothing more until it restarts: its state machine was found
/// damaged (a restart rebuilds it), or raft stopped on a fatal error. Serving on would answer
/// every client UNAVAILABLE for good, and a process that stays up is never restarted by its
/// supervisor.
async fn stop_when_raft_cannot_go_on(
    raft: Arc<RaftNode>,
    stopped_by: Arc<std::sync::Mutex<Option<AgentError>>>,
    shutdown: CancellationToken,
) {
    let error = tokio::select! {
        () = shutdown.cancelled() => return,
        why = raft.damaged() => AgentError::Damaged(why),
        halted = raft.halted() => match halted {
            // Damage found by apply stops raft too: say what it was.
            Some(why) => match raft.damage_found() {
                Some(damage) => AgentError::Damaged(damage),
                None => AgentError::Halted(why),
            },
            None => return,
        },
    };
    tracing::error!(%error, "stopping this node");
    *stopped_by.lock().unwrap_or_else(|p| p.into_inner()) = Some(error);
    shutdown.cancel();
}

/// How long stopping raft (the last log writes, syncing the state machine) may take at
/// shutdown, whatever the disk does.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How a node connects and accepts connections.
struct Network {
    dialer: Dialer,
    /// Refused handshakes, peers and joins, logged once per peer.
    refusals: Arc<Refusals>,
    cluster_name: String,
    metrics: Arc<Metrics>,
}

impl Network {
    fn listening(&self, tls: Option<Arc<rustls::ServerConfig>>) -> Listening {
        Listening {
            tls,
            cluster_name: self.cluster_name.clone(),
            refusals: self.refusals.clone(),
        }
    }
}

/// What `/metrics` reads at each scrape: raft's indexes, the controllers' counters and queues,
/// resource counts and LMDB sizes.
fn sampler(
    raft: Option<Arc<RaftNode>>,
    controllers: std::collections::BTreeMap<String, crate::controller::manager::Registered>,
) -> crate::metrics::Sampler {
    Arc::new(move || {
        let controllers = controllers
            .values()
            .map(|registered| ControllerSample {
                name: registered.controller.name.clone(),
                reconciles_ok: registered.stats.reconciles_ok(),
                reconciles_failed: registered.stats.reconciles_failed(),
                queue_depth: registered.stats.queue_depth(),
            })
            .collect();
        let Some(raft) = &raft else {
            return Sample {
                controllers,
                ..Sample::default()
            };
        };
        let status = raft.status();
        let storage = raft.storage_sample();
        Sample {
            raft: Some(RaftSample {
                term: status.term,
                is_leader: status.role == crate::storage::raft::node::Role::Leader,
                commit_index: status.commit_index,
                applied_index: status.applied_index,
            }),
            controllers,
            resources: storage.resources,
            lmdb_bytes: storage.lmdb_bytes,
        }
    })
}

/// One info line per leadership and membership change this node sees (snapshots and restores
/// log where they happen), and the leader-change counter.
async fn log_cluster_changes(
    raft: Arc<RaftNode>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut watch = raft.raft().metrics();
    let mut leader: Option<u64> = None;
    let mut membership: Option<(Vec<u64>, Vec<u64>)> = None;
    let mut first = true;
    loop {
        {
            let now = watch.borrow_and_update();
            if now.current_leader != leader {
                if let Some(new) = now.current_leader {
                    metrics.leader_changes.inc();
                    tracing::info!(leader = new, term = now.current_term, "leader changed");
                } else if leader.is_some() {
                    tracing::info!(
                        term = now.current_term,
                        "no leader: an election is under way"
                    );
                }
                leader = now.current_leader;
            }
            // The sets, not the configuration's log id: a joint change passes through several
            // configurations of the same members.
            let voters: Vec<u64> = now.membership_config.membership().voter_ids().collect();
            let learners: Vec<u64> = now.membership_config.membership().learner_ids().collect();
            let sets = Some((voters, learners));
            if sets != membership {
                if !first && let Some((voters, learners)) = &sets {
                    tracing::info!(?voters, ?learners, "membership changed");
                }
                membership = sets;
            }
            first = false;
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = watch.changed() => if changed.is_err() { return },
        }
    }
}

/// Starts this node's part in the raft group: the raft service, bootstrap or join, and the
/// default tenancy (before serving on the bootstrap node, so no early write misses it).
#[allow(clippy::too_many_arguments)]
async fn start_raft(
    config: &AgentConfig,
    net: &Network,
    cluster: &Arc<RaftCluster>,
    raft: &Arc<RaftNode>,
    listener: TcpListener,
    service: &Arc<ResourceService>,
    shutdown: &CancellationToken,
    tasks: &mut Vec<JoinHandle<()>>,
) {
    {
        let token = shutdown.clone();
        let admission = Arc::new(service::ForwardAdmission::new(service.clone()));
        let mut grpc = RaftGrpc::new(raft.clone(), admission)
            .with_append_metrics(net.metrics.storage.append_duration.clone());
        let tls = net.dialer.tls().map(|tls| tls.raft_server_config());
        if tls.is_some() {
            grpc = grpc.with_verified_peers(cluster.peers().clone(), net.refusals.clone());
        }
        let listening = net.listening(tls);
        let metrics = net.metrics.clone();
        tasks.push(tokio::spawn(
            async move {
                if let Err(error) =
                    serve::serve_raft(listener, listening, grpc, metrics, token.clone()).await
                {
                    tracing::error!(%error, "the raft service stopped; shutting down");
                    token.cancel();
                }
            }
            .in_current_span(),
        ));
    }
    if config.bootstrap {
        match raft.bootstrap().await {
            Ok(true) => tracing::info!(node_id = raft.id(), "initialized a new cluster"),
            Ok(false) => {
                tracing::info!("the cluster is already initialized; --bootstrap has nothing to do")
            }
            Err(error) => tracing::error!(%error, "cannot initialize the cluster"),
        }
        default_tenancy_when_ready(service.clone(), shutdown.clone()).await;
    } else {
        tasks.push(tokio::spawn(
            default_tenancy_when_ready(service.clone(), shutdown.clone()).in_current_span(),
        ));
    }
    if let Some(target) = config.join.clone() {
        tasks.push(tokio::spawn(
            join_until_member(
                raft.clone(),
                cluster.peers().clone(),
                net.dialer.clone(),
                config.join_token.clone(),
                target,
                shutdown.clone(),
            )
            .in_current_span(),
        ));
    }
}

/// Runs `attempt` until it succeeds or the node shuts down, pausing with doubling backoff (up
/// to 5 s) between failures, which are logged with `what` (as warnings when `loud`).
async fn retry_until_done<F, Fut>(
    what: &str,
    loud: bool,
    shutdown: CancellationToken,
    mut attempt: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut pause = Duration::from_millis(200);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            result = attempt() => match result {
                Ok(()) => return,
                Err(why) if loud => tracing::warn!(retry_in = ?pause, "{what}: {why}"),
                Err(why) => tracing::debug!(retry_in = ?pause, "{what}: {why}"),
            },
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

/// Asks `target` to add this node until it is a voter or the node shuts down (see
/// [`crate::cluster::join`]).
async fn join_until_member(
    node: Arc<RaftNode>,
    peers: Arc<crate::cluster::Peers>,
    dialer: Dialer,
    token: Option<String>,
    target: String,
    shutdown: CancellationToken,
) {
    retry_until_done("joining the cluster", true, shutdown, || {
        crate::cluster::join::ask(&node, &peers, &dialer, token.as_deref(), &target)
    })
    .await;
}

/// Bootstraps the cluster's ACLs with the secret of `--acl-initial-management-file` once the
/// cluster takes writes; nothing when they were bootstrapped already (by this node, another, or
/// `resctl acl bootstrap`).
async fn bootstrap_acls_with(
    service: Arc<ResourceService>,
    secret: String,
    shutdown: CancellationToken,
) {
    retry_until_done(
        "ACLs not bootstrapped from the initial management file yet",
        false,
        shutdown,
        || {
            let service = service.clone();
            let secret = secret.clone();
            async move {
                match service
                    .bootstrap_acls(service::cluster::BOOTSTRAP_TOKEN, &secret, None)
                    .await
                {
                    Ok(()) => {
                        tracing::warn!(
                            accessor = service::cluster::BOOTSTRAP_TOKEN,
                            "ACLs bootstrapped with the secret of --acl-initial-management-file"
                        );
                        Ok(())
                    }
                    Err(service::Error::FailedPrecondition(_)) => Ok(()),
                    Err(error) => Err(error.to_string()),
                }
            }
        },
    )
    .await;
}

/// Creates the default tenancy once the cluster can take writes (a no-op when it exists).
async fn default_tenancy_when_ready(service: Arc<ResourceService>, shutdown: CancellationToken) {
    retry_until_done("default tenancy not ensured yet", false, shutdown, || {
        let service = service.clone();
        async move {
            service
                .ensure_default_tenancy()
                .await
                .map_err(|error| error.to_string())
        }
    })
    .await;
}

/// Configs of a local cluster of `size` nodes under `base_dir`: node 1 bootstraps, the others
/// join it. Ports count up from the bases (0 picks free ports; no HTTP port, no HTTP server).
pub fn dev_cluster(
    base_dir: &std::path::Path,
    size: u64,
    api_port: u16,
    raft_port: u16,
    http_port: Option<u16>,
) -> Vec<AgentConfig> {
    (1..=size)
        .map(|node_id| {
            let offset = (node_id - 1) as u16;
            let port = |base: u16| if base == 0 { 0 } else { base + offset };
            AgentConfig {
                cluster_name: "dev".into(),
                node_id,
                data_dir: Some(base_dir.join(format!("node{node_id}"))),
                api_addr: SocketAddr::from(([127, 0, 0, 1], port(api_port))),
                raft_addr: SocketAddr::from(([127, 0, 0, 1], port(raft_port))),
                http_addr: http_port.map(|base| SocketAddr::from(([127, 0, 0, 1], port(base)))),
                bootstrap: node_id == 1,
                join: None,
                ..AgentConfig::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_file_takes_the_tls_keys_and_all_three_files_go_together() {
        let config: AgentConfig = serde_yaml_ng::from_str(
            "node_id: 2\ntls_ca: /etc/resd/ca.pem\ntls_cert: /etc/resd/node-2.pem\ntls_key: /etc/resd/node-2-key.pem\ntls_verify_clients: true\n",
        )
        .expect("a config with TLS keys");
        let settings = config.tls_settings().expect("complete").expect("TLS is on");
        assert_eq!(settings.cert, PathBuf::from("/etc/resd/node-2.pem"));
        assert!(settings.verify_clients);

        let partial = AgentConfig {
            tls_ca: Some("/etc/resd/ca.pem".into()),
            ..AgentConfig::default()
        };
        let error = partial.tls_settings().expect_err("partial").to_string();
        assert!(
            error.contains("missing --tls-cert and --tls-key"),
            "{error}"
        );
        assert!(matches!(
            partial.tls_settings(),
            Err(ref error) if error.is_configuration()
        ));

        let verify_alone = AgentConfig {
            tls_verify_clients: true,
            ..AgentConfig::default()
        };
        assert!(verify_alone.tls_settings().is_err());
        assert!(
            AgentConfig::default()
                .tls_settings()
                .expect("plain")
                .is_none()
        );
    }

    #[test]
    fn the_config_file_takes_the_acl_keys() {
        let config: AgentConfig = serde_yaml_ng::from_str(
            "acl_enabled: true\nacl_default_policy: allow\njoin_token: s3cret\n",
        )
        .expect("a config with ACL keys");
        assert!(config.acl_enabled);
        assert_eq!(config.acl_default_policy, DefaultPolicy::Allow);
        assert_eq!(config.join_token.as_deref(), Some("s3cret"));
        let error = serde_yaml_ng::from_str::<AgentConfig>("acl_default_policy: maybe\n")
            .expect_err("unknown policy")
            .to_string();
        assert!(error.contains("deny") && error.contains("allow"), "{error}");
    }
}
