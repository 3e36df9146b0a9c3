//! The typed client that `resctl` and the dashboard share: one [`Client`] over both services,
//! with the ACL token and read consistency sent as metadata on every call, retries while the
//! cluster elects a leader, one decode of `tonic::Status` into [`ClientError`], and a
//! resumable [`Watcher`] over `WatchList`.

#[cfg(feature = "cli")]
pub mod connect;
pub mod contexts;
pub mod describe;
pub mod edit;
pub mod history;
pub mod placement;
pub mod snapshot_file;
mod watcher;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::cluster::v1::cluster_service_client::ClusterServiceClient;
use crate::cluster::v1::{
    JoinRequest, JoinResponse, ListControllersRequest, ListControllersResponse, ListTypesRequest,
    ListTypesResponse, MembersRequest, MembersResponse, RemoveRequest, SnapshotData,
    SnapshotRestoreResponse, SnapshotSaveRequest, StatusRequest, StatusResponse,
};
use crate::reason::Reason;
use crate::resource::v1::resource_service_client::ResourceServiceClient;
use crate::resource::v1::{
    DeleteRequest, Id, ListByOwnerRequest, ListRequest, MutateAndValidateRequest, ReadRequest,
    Resource, Status, Tenancy, Type, WatchEvent, WatchListRequest, WriteRequest,
    WriteStatusRequest,
};

pub use watcher::{WatchUpdate, Watcher};

/// The address `resd dev` and `resd agent` serve on unless told otherwise.
pub const DEFAULT_SERVER: &str = "127.0.0.1:8502";

/// What a list asks for beyond its type and tenancy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    pub name_prefix: String,
    /// A selector over metadata (`proto::selector`); empty: every resource.
    pub selector: String,
    /// At most this many resources (0: all).
    pub limit: u32,
    /// Where to continue (a previous page's `next_page_token`).
    pub page_token: String,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    pub resources: Vec<Resource>,
    /// Empty on the last page.
    pub next_page_token: String,
}

/// TLS for a client (DESIGN §12.2): the CA the server's certificate must chain to and,
/// for servers that verify clients, the client's certificate and key. PEM files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    pub ca_cert: PathBuf,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl ClientTls {
    /// The settings from the three optional paths: TLS is on whenever a CA is given; a client
    /// certificate needs its key and a CA.
    pub fn from_paths(
        ca_cert: Option<PathBuf>,
        client_cert: Option<PathBuf>,
        client_key: Option<PathBuf>,
    ) -> Result<Option<ClientTls>, ClientError> {
        let tls_error = |message: &str| ClientError::Settings(message.to_owned());
        match (ca_cert, client_cert, client_key) {
            (None, None, None) => Ok(None),
            (None, _, _) => Err(tls_error(
                "a client certificate needs --ca-cert too (the cluster's resd-ca.pem)",
            )),
            (Some(_), Some(_), None) => Err(tls_error("--client-cert needs --client-key")),
            (Some(_), None, Some(_)) => Err(tls_error("--client-key needs --client-cert")),
            (Some(ca_cert), client_cert, client_key) => Ok(Some(ClientTls {
                ca_cert,
                client_cert,
                client_key,
            })),
        }
    }

    fn config(&self, server: &str) -> Result<ClientTlsConfig, ClientError> {
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|error| {
                ClientError::Settings(format!(
                    "cannot read the {what} {} for {server}: {error}",
                    path.display()
                ))
            })
        };
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(
                &self.ca_cert,
                "CA certificate",
            )?))
            .timeout(Duration::from_secs(10));
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            config = config.identity(Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        Ok(config)
    }
}

/// How a [`Client`] talks to the cluster.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port`, or an `http://` or `https://` URL.
    pub server: String,
    /// TLS settings; `None` speaks plaintext.
    pub tls: Option<ClientTls>,
    pub token: Option<String>,
    /// Ask for linearizable reads (`x-resd-consistency-mode: consistent`).
    pub consistent: bool,
    pub connect_timeout: Duration,
    /// Deadline sent with each unary call (`grpc-timeout`); the server stops waiting for a
    /// leader at that point.
    pub request_timeout: Duration,
    /// How long a call keeps retrying while the cluster has no leader.
    pub election_retry: Duration,
    /// How long a call keeps retrying while the server cannot be reached at all (a restart).
    pub unreachable_retry: Duration,
}

impl ClientConfig {
    pub fn new(server: impl Into<String>) -> Self {
        ClientConfig {
            server: server.into(),
            tls: None,
            token: None,
            consistent: false,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(30),
            election_retry: Duration::from_secs(15),
            unreachable_retry: Duration::from_secs(2),
        }
    }

    /// Bounds each call, its retries included (`--request-timeout`): the deadline sent with a
    /// call, and how long it keeps retrying without a leader or a reachable server.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self.election_retry = self.election_retry.min(timeout);
        self.unreachable_retry = self.unreachable_retry.min(timeout);
        self.connect_timeout = self.connect_timeout.min(timeout);
        self
    }

    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|token| !token.is_empty());
        self
    }

    pub fn with_tls(mut self, tls: Option<ClientTls>) -> Self {
        self.tls = tls;
        self
    }

    pub fn with_consistent(mut self, consistent: bool) -> Self {
        self.consistent = consistent;
        self
    }
}

/// A failed call, decoded once from the wire status so callers match on what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server address {server:?}: {message}")]
    InvalidServer { server: String, message: String },
    #[error(
        "server {server} unreachable: {message} (is `resd dev` or `resd agent` running there?)"
    )]
    Unreachable { server: String, message: String },
    /// The client's own settings cannot be used (a TLS file missing, a flag without its pair).
    #[error("{0}")]
    Settings(String),
    /// The connection's TLS failed (or the server wants TLS and got plaintext).
    #[error("TLS with server {server}: {message}")]
    Tls { server: String, message: String },
    /// The request is wrong; `reason` says how when the server said (a tenancy that does not
    /// exist yet…).
    #[error("{message}")]
    InvalidArgument {
        reason: Option<Reason>,
        message: String,
    },
    #[error("{message}")]
    NotFound {
        reason: Option<Reason>,
        message: String,
    },
    /// A compare-and-swap lost: the resource changed since it was read.
    #[error("{message}")]
    Conflict {
        reason: Option<Reason>,
        message: String,
    },
    /// The system is not in the state the call needs; `reason` says which (a node removed
    /// from the cluster, a Type being deleted, a uid that is not the stored one…).
    #[error("{message}")]
    FailedPrecondition {
        reason: Option<Reason>,
        message: String,
    },
    #[error("permission denied: {message}")]
    PermissionDenied {
        reason: Option<Reason>,
        message: String,
    },
    #[error("unauthenticated: {message} (pass a token with --token or RESD_TOKEN)")]
    Unauthenticated {
        reason: Option<Reason>,
        message: String,
    },
    /// The server cannot serve this now; `reason` says why (no quorum, catching up, shutting
    /// down, a membership change that gave up…). `None`: the server said no reason.
    #[error("cluster unavailable: {message}{hint}", hint = quorum_hint(*reason))]
    Unavailable {
        reason: Option<Reason>,
        message: String,
    },
    #[error("{message}")]
    OutOfRange {
        reason: Option<Reason>,
        message: String,
    },
    #[error("deadline exceeded: {message}")]
    DeadlineExceeded {
        reason: Option<Reason>,
        message: String,
    },
    #[error("server error ({code:?}): {message}")]
    Other { code: Code, message: String },
}

impl ClientError {
    /// The one decode of a wire status (the server's counterpart is `service::error`).
    pub fn from_status(server: &str, status: &tonic::Status) -> ClientError {
        let message = status.message().to_owned();
        // A reason counts only under the code the catalog gives it (a server cannot send a
        // client elsewhere with a reason its code does not carry).
        let reason = crate::reason::of(status)
            .map(|details| details.reason)
            .filter(|reason| reason.fits(status.code()));
        if let Some(problem) = tls_problem(status) {
            return ClientError::Tls {
                server: server.to_owned(),
                message: problem.advice(),
            };
        }
        match status.code() {
            // A status built by the transport (connect refused, reset) carries its cause; one
            // sent by a server does not.
            Code::Unavailable if is_transport_failure(status) => ClientError::Unreachable {
                server: server.to_owned(),
                message: transport_message(status),
            },
            Code::Unavailable => ClientError::Unavailable { reason, message },
            Code::InvalidArgument => ClientError::InvalidArgument { reason, message },
            Code::NotFound => ClientError::NotFound { reason, message },
            Code::Aborted => ClientError::Conflict { reason, message },
            Code::FailedPrecondition => ClientError::FailedPrecondition { reason, message },
            Code::PermissionDenied => ClientError::PermissionDenied { reason, message },
            Code::Unauthenticated => ClientError::Unauthenticated { reason, message },
            Code::OutOfRange => ClientError::OutOfRange { reason, message },
            Code::DeadlineExceeded => ClientError::DeadlineExceeded { reason, message },
            code => ClientError::Other { code, message },
        }
    }

    /// Whether trying again later may succeed (no leader yet, server restarting).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::Unavailable { .. } | ClientError::Unreachable { .. }
        )
    }

    /// Why the server refused, as it said (`None` for errors of the client or the transport,
    /// and for a server that said no reason).
    pub fn reason(&self) -> Option<Reason> {
        match self {
            ClientError::Unavailable { reason, .. }
            | ClientError::FailedPrecondition { reason, .. }
            | ClientError::InvalidArgument { reason, .. }
            | ClientError::NotFound { reason, .. }
            | ClientError::Conflict { reason, .. }
            | ClientError::PermissionDenied { reason, .. }
            | ClientError::Unauthenticated { reason, .. }
            | ClientError::OutOfRange { reason, .. }
            | ClientError::DeadlineExceeded { reason, .. } => *reason,
            _ => None,
        }
    }
}

/// The hint an unavailable cluster gets when the server says it has no quorum.
fn quorum_hint(reason: Option<Reason>) -> &'static str {
    if reason == Some(Reason::NoQuorum) {
        " (is a majority of servers up?)"
    } else {
        ""
    }
}

/// An unavailable answer that retrying cannot change: a change of membership that gave up (and
/// undid itself), or one proposed that waits for voters to come back.
fn is_final(error: &ClientError) -> bool {
    matches!(
        error.reason(),
        Some(Reason::MembershipUnchanged | Reason::MembershipPending)
    )
}

/// Whether another member may serve what this one could not: it cannot be reached, is shutting
/// down, is catching up after an unclean stop, found its state damaged, or was removed from
/// the cluster.
fn moves_on(error: &ClientError) -> bool {
    matches!(error, ClientError::Unreachable { .. })
        || error
            .reason()
            .is_some_and(Reason::another_member_may_answer)
}

fn tls_problem(status: &tonic::Status) -> Option<crate::tls::TlsProblem> {
    use std::error::Error as _;
    status.source().and_then(crate::tls::TlsProblem::find)
}

/// A plaintext client's view of a TLS-only server: the server drops the connection during the
/// HTTP/2 preface, which hyper reports as an HTTP/2 protocol error.
fn looks_like_tls_required(error: &ClientError) -> bool {
    match error {
        ClientError::Unreachable { message, .. } => message.contains("h2 protocol error"),
        // Depending on timing hyper reports the dropped preface as a protocol error, a
        // cancelled operation or a bare transport error.
        ClientError::Other {
            code: Code::Internal | Code::Unknown | Code::Cancelled,
            message,
        } => {
            message.contains("h2 protocol error")
                || message.contains("operation was canceled")
                || message == "transport error"
        }
        _ => false,
    }
}

/// A TLS client without a certificate talking to a server that requires one: TLS 1.3 finishes
/// the client's side of the handshake before the server refuses, so the client usually sees
/// the connection break (broken pipe, reset, cancelled) rather than the server's alert.
fn looks_like_dropped_after_handshake(error: &ClientError) -> bool {
    let message = match error {
        ClientError::Unreachable { message, .. } => message.as_str(),
        ClientError::Other {
            code: Code::Unknown | Code::Cancelled,
            message,
        } => message.as_str(),
        _ => return false,
    };
    [
        "broken pipe",
        "reset by peer",
        "operation was canceled",
        "transport error",
        "connection closed",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// Whether the transport, not a server, made this status: it has a cause, or it is tonic's
/// bare "transport error". A status with a reason was sent by a server, whatever its words.
fn is_transport_failure(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    status.source().is_some()
        || (crate::reason::of(status).is_none() && status.message().contains("transport error"))
}

/// The innermost cause of a transport failure ("Connection refused"), which says more than
/// tonic's "transport error".
fn transport_message(status: &tonic::Status) -> String {
    use std::error::Error as _;
    let mut cause: Option<&(dyn std::error::Error + 'static)> = status.source();
    let mut message = status.message().to_owned();
    while let Some(error) = cause {
        message = error.to_string();
        cause = error.source();
    }
    message
}

/// A connection to one server of a cluster (any member: followers forward what needs the
/// leader), or to the first that answers of several (`--server a,b,c`): a call that finds its
/// server unreachable, shutting down or catching up moves to the next one. Cheap to clone;
/// clones share the connections and which server is current.
#[derive(Debug, Clone)]
pub struct Client {
    servers: Arc<Vec<Connection>>,
    /// Index of the server calls go to now.
    current: Arc<AtomicUsize>,
    config: ClientConfig,
    /// Why the last read or list may be stale, as the server said ([`crate::STALE_HEADER`]).
    stale: Arc<std::sync::Mutex<Option<String>>>,
    /// Deprecation warnings servers sent ([`crate::WARNING_HEADER`]), each once.
    warnings: Arc<std::sync::Mutex<Warnings>>,
    /// The lease this client's writes are fenced by ([`Client::with_fence`]).
    fence: Option<crate::fence::FenceCell>,
}

/// Warnings seen, and those not taken yet.
#[derive(Debug, Default)]
struct Warnings {
    seen: std::collections::BTreeSet<String>,
    pending: Vec<String>,
}

/// An answer whose metadata may carry warnings.
trait Answer {
    fn metadata(&self) -> &tonic::metadata::MetadataMap;
}

impl<T> Answer for tonic::Response<T> {
    fn metadata(&self) -> &tonic::metadata::MetadataMap {
        tonic::Response::metadata(self)
    }
}

/// The clients of one server.
#[derive(Debug)]
struct Connection {
    server: String,
    resources: ResourceServiceClient<Channel>,
    cluster: ClusterServiceClient<Channel>,
}

/// The largest message a client accepts (a list of many resources).
const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

impl Client {
    /// Builds a client without connecting; the first call connects (and reports
    /// [`ClientError::Unreachable`] if it cannot). `config.server` may list several servers,
    /// separated by commas.
    pub fn new(config: ClientConfig) -> Result<Client, ClientError> {
        let servers: Vec<&str> = config
            .server
            .split(',')
            .map(str::trim)
            .filter(|server| !server.is_empty())
            .collect();
        if servers.is_empty() {
            return Err(ClientError::InvalidServer {
                server: config.server.clone(),
                message: format!("no server given; expected HOST:PORT such as {DEFAULT_SERVER}"),
            });
        }
        let connections = servers
            .iter()
            .map(|server| Self::connect(server, &config))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Client {
            servers: Arc::new(connections),
            current: Arc::new(AtomicUsize::new(0)),
            config,
            stale: Arc::default(),
            warnings: Arc::default(),
            fence: None,
        })
    }

    fn connect(server: &str, config: &ClientConfig) -> Result<Connection, ClientError> {
        let url = if server.contains("://") {
            server.to_owned()
        } else if config.tls.is_some() {
            format!("https://{server}")
        } else {
            format!("http://{server}")
        };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(|error| ClientError::InvalidServer {
                server: server.to_owned(),
                message: format!("{error}; expected HOST:PORT such as {DEFAULT_SERVER}"),
            })?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some(tls) = &config.tls {
            endpoint =
                endpoint
                    .tls_config(tls.config(server)?)
                    .map_err(|error| ClientError::Tls {
                        server: server.to_owned(),
                        message: error.to_string(),
                    })?;
        }
        let channel = endpoint.connect_lazy();
        Ok(Connection {
            server: server.to_owned(),
            resources: ResourceServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            cluster: ClusterServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        })
    }

    fn connection(&self) -> &Connection {
        &self.servers[self.current.load(Ordering::Relaxed) % self.servers.len()]
    }

    /// The resource service of the current server.
    fn resources(&self) -> ResourceServiceClient<Channel> {
        self.connection().resources.clone()
    }

    /// The cluster service of the current server.
    fn cluster(&self) -> ClusterServiceClient<Channel> {
        self.connection().cluster.clone()
    }

    /// A client of the same servers with the same settings over connections of its own (a
    /// connection carries at most the server's `MAX_CONCURRENT_STREAMS` streams at once, and a
    /// stream nobody reads holds its connection's flow-control window).
    pub fn with_own_connections(&self) -> Result<Client, ClientError> {
        Ok(Client {
            fence: self.fence.clone(),
            ..Client::new(self.config.clone())?
        })
    }

    /// This client (the same connections) with its writes, status writes and deletes fenced
    /// by the lease in `fence` (DESIGN §16, [`crate::FENCE_HEADER`]): while the cell is empty
    /// they are refused here (`FENCED`, nothing sent), and one the server refuses `FENCED`
    /// empties it.
    pub fn with_fence(&self, fence: crate::fence::FenceCell) -> Client {
        Client {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// The fence a write goes out with: `Err` when this client is fenced but holds no lease.
    fn write_fence(&self) -> Result<Option<crate::fence::LeaseFence>, ClientError> {
        let Some(cell) = &self.fence else {
            return Ok(None);
        };
        cell.get()
            .map(Some)
            .ok_or_else(|| ClientError::FailedPrecondition {
                reason: Some(Reason::Fenced),
                message: "fenced: this replica does not hold its lease now; the write was not sent"
                    .into(),
            })
    }

    /// Runs a fenced write: `call` gets the request carrying the fence; a `FENCED` answer
    /// empties the cell (the replica no longer holds that lease).
    async fn fenced<T: Clone, R, F, Fut>(&self, message: T, mut call: F) -> Result<R, ClientError>
    where
        R: Answer,
        F: FnMut(tonic::Request<T>) -> Fut,
        Fut: Future<Output = Result<R, tonic::Status>>,
    {
        let fence = self.write_fence()?;
        // A fence that cannot travel is refused here, never dropped (the write would go out
        // unfenced).
        let header = fence
            .as_ref()
            .map(|fence| {
                MetadataValue::try_from(fence.to_string()).map_err(|_| {
                    ClientError::Settings(format!(
                        "the fence {fence} cannot be sent as {}",
                        crate::FENCE_HEADER
                    ))
                })
            })
            .transpose()?;
        let outcome = self
            .retrying(|| {
                let mut request = self.request(message.clone(), true);
                if let Some(header) = &header {
                    request
                        .metadata_mut()
                        .insert(crate::FENCE_HEADER, header.clone());
                }
                call(request)
            })
            .await;
        if let (Err(error), Some(cell), Some(fence)) = (&outcome, &self.fence, &fence)
            && error.reason() == Some(Reason::Fenced)
        {
            cell.revoke(fence);
        }
        outcome
    }

    /// How many servers this client knows.
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// Moves to the next server (after `from`, the index the failed call used, so concurrent
    /// failures move once); returns whether there is another one to try.
    fn fail_over(&self, from: usize) -> bool {
        if self.servers.len() < 2 {
            return false;
        }
        let next = (from + 1) % self.servers.len();
        let _ = self
            .current
            .compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed);
        true
    }

    /// The index of the server calls go to now (see [`Client::fail_over_from`]).
    pub fn server_index(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.servers.len()
    }

    /// Moves on from server `from` (the one a broken watch streamed from): if another call
    /// already moved on, nothing changes, so many watches breaking at once move only once.
    /// Returns whether there is another server.
    pub fn fail_over_from(&self, from: usize) -> bool {
        self.fail_over(from)
    }

    /// Moves to the next server if the current one failed with `error` in a way another member
    /// may not (unreachable, shutting down, catching up); returns whether it moved.
    pub fn fail_over_after(&self, error: &ClientError) -> bool {
        let current = self.current.load(Ordering::Relaxed) % self.servers.len();
        moves_on(error) && self.fail_over(current)
    }

    /// A failed call's error.
    pub fn decode(&self, status: &tonic::Status) -> ClientError {
        ClientError::from_status(self.server(), status)
    }

    /// A call's final error, with the hint a plaintext client of a TLS-only server needs (it
    /// only sees the connection dropped during the HTTP/2 preface).
    pub fn explain(&self, error: ClientError) -> ClientError {
        match &error {
            ClientError::Unreachable { message, .. } | ClientError::Other { message, .. }
                if self.config.tls.is_none() && looks_like_tls_required(&error) =>
            {
                ClientError::Tls {
                    server: self.server().to_owned(),
                    message: format!(
                        "the server's answer is not plaintext HTTP/2 ({message}); if it speaks TLS only, pass --ca-cert with the cluster's resd-ca.pem (or set RESD_CA_CERT)"
                    ),
                }
            }
            ClientError::Unreachable { .. } | ClientError::Other { .. }
                if self
                    .config
                    .tls
                    .as_ref()
                    .is_some_and(|tls| tls.client_cert.is_none())
                    && looks_like_dropped_after_handshake(&error) =>
            {
                ClientError::Tls {
                    server: self.server().to_owned(),
                    message: format!(
                        "the server dropped the connection after the TLS handshake ({error}); it probably requires a client certificate: pass --client-cert and --client-key (make one with `resd tls cert create --client NAME`)"
                    ),
                }
            }
            _ => error,
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The server calls go to now (one of those given).
    pub fn server(&self) -> &str {
        &self.connection().server
    }

    /// A request carrying the token, the consistency mode and (for unary calls) the deadline.
    fn request<T>(&self, message: T, unary: bool) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.config.token
            && let Ok(value) = MetadataValue::try_from(token.as_str())
        {
            request.metadata_mut().insert(crate::TOKEN_HEADER, value);
        }
        if self.config.consistent {
            request.metadata_mut().insert(
                crate::CONSISTENCY_HEADER,
                MetadataValue::from_static("consistent"),
            );
        }
        if unary {
            request.set_timeout(self.config.request_timeout);
        }
        request
    }

    /// Runs `call` until it succeeds, fails for good, or the retry budget for its kind of
    /// unavailability is spent. Backoff doubles from 50 ms to 1 s.
    async fn retrying<R, F, Fut>(&self, mut call: F) -> Result<R, ClientError>
    where
        R: Answer,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<R, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        // Each server gets a try before the first pause.
        let mut fresh_servers = self.servers.len().saturating_sub(1);
        loop {
            let used = self.current.load(Ordering::Relaxed) % self.servers.len();
            let error = match call().await {
                Ok(response) => {
                    self.note_warnings(response.metadata());
                    return Ok(response);
                }
                Err(status) => self.decode(&status),
            };
            if moves_on(&error) && self.fail_over(used) && fresh_servers > 0 {
                fresh_servers -= 1;
                continue;
            }
            let budget = match &error {
                _ if is_final(&error) => return Err(error),
                ClientError::Unavailable { .. } => self.config.election_retry,
                ClientError::Unreachable { .. } => self.config.unreachable_retry,
                _ => return Err(self.explain(error)),
            };
            if started.elapsed() + backoff > budget {
                return Err(self.explain(error));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// Every type the server serves, asked a page at a time (a page is bounded in types and in
    /// descriptor bytes), as one answer: the types in order and every descriptor file once.
    pub async fn list_types(&self) -> Result<ListTypesResponse, ClientError> {
        let mut all = ListTypesResponse::default();
        let mut files = prost_types::FileDescriptorSet::default();
        let mut seen = std::collections::HashSet::new();
        let mut page_token = String::new();
        // Bounded: each page holds one type at least, and a registry holds far fewer.
        for _ in 0..100_000 {
            let token = page_token.clone();
            let page = self
                .retrying(|| {
                    let mut cluster = self.cluster();
                    let request = self.request(
                        ListTypesRequest {
                            page_size: 500,
                            page_token: token.clone(),
                        },
                        true,
                    );
                    async move { cluster.list_types(request).await }
                })
                .await?
                .into_inner();
            let set: prost_types::FileDescriptorSet = prost::Message::decode(
                page.file_descriptor_set.as_ref(),
            )
            .map_err(|error| ClientError::Other {
                code: Code::DataLoss,
                message: format!(
                    "the server's ListTypes page holds descriptors that do not decode: {error}"
                ),
            })?;
            for file in set.file {
                if seen.insert(file.name().to_owned()) {
                    files.file.push(file);
                }
            }
            all.types.extend(page.types);
            if page.next_page_token.is_empty() || page.next_page_token == page_token {
                break;
            }
            page_token = page.next_page_token;
        }
        all.file_descriptor_set = prost::Message::encode_to_vec(&files).into();
        Ok(all)
    }

    /// Reads one resource; `Ok(None)` when it does not exist.
    pub async fn read(&self, id: &Id) -> Result<Option<Resource>, ClientError> {
        let result = self
            .retrying(|| {
                let mut resources = self.resources();
                let request = self.request(
                    ReadRequest {
                        id: Some(id.clone()),
                        ..Default::default()
                    },
                    true,
                );
                async move { resources.read(request).await }
            })
            .await;
        match result {
            Ok(response) => {
                self.note_staleness(response.metadata());
                Ok(response.into_inner().resource)
            }
            Err(ClientError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Reads one resource as it was at `version`, from its history (DESIGN §18): the newest
    /// version at or before it. `uid` empty: the current object's. Errors say when the object
    /// did not exist then (NOT_FOUND) or the history no longer keeps it (OUT_OF_RANGE).
    pub async fn read_at(&self, id: &Id, version: &str) -> Result<Resource, ClientError> {
        let response = self
            .retrying(|| {
                let mut resources = self.resources();
                let request = self.request(
                    ReadRequest {
                        id: Some(id.clone()),
                        at_version: version.to_owned(),
                    },
                    true,
                );
                async move { resources.read(request).await }
            })
            .await?;
        response
            .into_inner()
            .resource
            .ok_or_else(|| ClientError::Other {
                code: Code::Internal,
                message: "a read answered without a resource".into(),
            })
    }

    /// A page of an object's history, newest first (DESIGN §18).
    pub async fn list_history(
        &self,
        id: &Id,
        limit: u32,
        page_token: &str,
    ) -> Result<crate::resource::v1::ListHistoryResponse, ClientError> {
        let response = self
            .retrying(|| {
                let mut resources = self.resources();
                let request = self.request(
                    crate::resource::v1::ListHistoryRequest {
                        id: Some(id.clone()),
                        limit,
                        page_token: page_token.to_owned(),
                    },
                    true,
                );
                async move { resources.list_history(request).await }
            })
            .await?;
        Ok(response.into_inner())
    }

    /// An object's whole history (every page), newest first, at most `max` entries.
    pub async fn history(
        &self,
        id: &Id,
        max: usize,
    ) -> Result<Vec<crate::resource::v1::HistoryEntry>, ClientError> {
        let mut entries = Vec::new();
        let mut token = String::new();
        loop {
            let page = self.list_history(id, 500, &token).await?;
            entries.extend(page.entries);
            if page.next_page_token.is_empty()
                || page.next_page_token == token
                || entries.len() >= max
            {
                break;
            }
            token = page.next_page_token;
        }
        entries.truncate(max);
        Ok(entries)
    }

    /// Keeps the deprecation warnings an answer carries, each once per client.
    fn note_warnings(&self, metadata: &tonic::metadata::MetadataMap) {
        let mut values = metadata.get_all(crate::WARNING_HEADER).iter().peekable();
        if values.peek().is_none() {
            return;
        }
        let mut warnings = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        for value in values {
            let Ok(text) = value.to_str() else { continue };
            if warnings.seen.insert(text.to_owned()) {
                warnings.pending.push(text.to_owned());
            }
        }
    }

    /// The deprecation warnings servers sent since the last call (each text once per client):
    /// for a command line to print on stderr.
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(
            &mut self
                .warnings
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pending,
        )
    }

    /// Remembers whether the server said its answer may be stale.
    fn note_staleness(&self, metadata: &tonic::metadata::MetadataMap) {
        let stale = metadata
            .get(crate::STALE_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        *self.stale.lock().unwrap_or_else(|p| p.into_inner()) = stale;
    }

    /// Why the last read or list may be stale (the answering node knew no leader), if it may.
    pub fn last_stale(&self) -> Option<String> {
        self.stale.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Writes a resource (create, blind update, or compare-and-swap when it carries a version)
    /// and returns it as stored.
    pub async fn write(&self, resource: &Resource) -> Result<Resource, ClientError> {
        let message = WriteRequest {
            resource: Some(resource.clone()),
        };
        self.fenced(message, |request| {
            let mut resources = self.resources();
            async move { resources.write(request).await }
        })
        .await
        .map(|response| response.into_inner().resource.unwrap_or_default())
    }

    pub async fn write_status(
        &self,
        id: &Id,
        version: &str,
        key: &str,
        status: &Status,
    ) -> Result<Resource, ClientError> {
        let message = WriteStatusRequest {
            id: Some(id.clone()),
            version: version.to_owned(),
            key: key.to_owned(),
            status: Some(status.clone()),
        };
        self.fenced(message, |request| {
            let mut resources = self.resources();
            async move { resources.write_status(request).await }
        })
        .await
        .map(|response| response.into_inner().resource.unwrap_or_default())
    }

    /// Checks a proposed `registry.v1.Type` against every stored object of its kind (DESIGN
    /// §15.1); nothing changes.
    pub async fn plan_type(
        &self,
        proposed: &Resource,
    ) -> Result<crate::cluster::v1::PlanTypeResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(
                crate::cluster::v1::PlanTypeRequest {
                    r#type: Some(proposed.clone()),
                },
                true,
            );
            async move { cluster.plan_type(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Runs the type's mutate and validate hooks without storing anything.
    pub async fn mutate_and_validate(&self, resource: &Resource) -> Result<Resource, ClientError> {
        self.retrying(|| {
            let mut resources = self.resources();
            let request = self.request(
                MutateAndValidateRequest {
                    resource: Some(resource.clone()),
                },
                true,
            );
            async move { resources.mutate_and_validate(request).await }
        })
        .await
        .map(|response| response.into_inner().resource.unwrap_or_default())
    }

    /// Lists resources of a type; tenancy fields may be `*`.
    pub async fn list(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, ClientError> {
        let options = ListOptions {
            name_prefix: name_prefix.to_owned(),
            ..ListOptions::default()
        };
        Ok(self
            .list_page(resource_type, tenancy, &options)
            .await?
            .resources)
    }

    /// One page of a listing (`options.limit` resources at most; all of them when 0), and the
    /// token of the next (empty on the last page).
    pub async fn list_page(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
        options: &ListOptions,
    ) -> Result<Page, ClientError> {
        self.retrying(|| {
            let mut resources = self.resources();
            let request = self.request(
                ListRequest {
                    r#type: Some(resource_type.clone()),
                    tenancy: Some(tenancy.clone()),
                    name_prefix: options.name_prefix.clone(),
                    selector: options.selector.clone(),
                    limit: options.limit,
                    page_token: options.page_token.clone(),
                },
                true,
            );
            async move { resources.list(request).await }
        })
        .await
        .map(|response| {
            self.note_staleness(response.metadata());
            let answer = response.into_inner();
            Page {
                resources: answer.resources,
                next_page_token: answer.next_page_token,
            }
        })
    }

    /// Every resource of a listing, asked for in pages of `page_size` (so the server holds one
    /// page at a time), handing each page to `each` as it arrives.
    pub async fn list_in_pages(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
        options: &ListOptions,
        page_size: u32,
        mut each: impl FnMut(Vec<Resource>),
    ) -> Result<(), ClientError> {
        let mut options = ListOptions {
            limit: page_size.max(1),
            ..options.clone()
        };
        loop {
            let page = self.list_page(resource_type, tenancy, &options).await?;
            each(page.resources);
            if page.next_page_token.is_empty() {
                return Ok(());
            }
            options.page_token = page.next_page_token;
        }
    }

    /// The resources whose owner is `owner` (which must carry its uid).
    pub async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ClientError> {
        self.list_by_owner_matching(owner, "").await
    }

    /// The children of `owner` whose metadata matches `selector` (empty: all of them).
    pub async fn list_by_owner_matching(
        &self,
        owner: &Id,
        selector: &str,
    ) -> Result<Vec<Resource>, ClientError> {
        self.retrying(|| {
            let mut resources = self.resources();
            let request = self.request(
                ListByOwnerRequest {
                    owner: Some(owner.clone()),
                    selector: selector.to_owned(),
                },
                true,
            );
            async move { resources.list_by_owner(request).await }
        })
        .await
        .map(|response| response.into_inner().resources)
    }

    /// Deletes a resource (compare-and-swap when `version` is not empty). Deleting what does
    /// not exist succeeds.
    pub async fn delete(&self, id: &Id, version: &str) -> Result<(), ClientError> {
        let message = DeleteRequest {
            id: Some(id.clone()),
            version: version.to_owned(),
        };
        self.fenced(message, |request| {
            let mut resources = self.resources();
            async move { resources.delete(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Opens one `WatchList` stream. Use [`Watcher`] for a stream that survives restarts.
    pub async fn watch_list(
        &self,
        request: WatchListRequest,
    ) -> Result<tonic::Streaming<WatchEvent>, ClientError> {
        self.retrying(|| {
            let mut resources = self.resources();
            let request = self.request(request.clone(), false);
            async move { resources.watch_list(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    pub async fn status(&self) -> Result<StatusResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(StatusRequest {}, true);
            async move { cluster.status(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Bootstraps ACLs: the management token's secret, once per cluster.
    pub async fn acl_bootstrap(
        &self,
    ) -> Result<crate::cluster::v1::AclBootstrapResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(crate::cluster::v1::AclBootstrapRequest {}, true);
            async move { cluster.acl_bootstrap(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// The identity of this client's token.
    /// Checks a proposed admission policy against the stored objects it matches (nothing
    /// changes).
    pub async fn plan_policy(
        &self,
        policy: Resource,
    ) -> Result<crate::cluster::v1::PlanPolicyResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(
                crate::cluster::v1::PlanPolicyRequest {
                    policy: Some(policy.clone()),
                },
                true,
            );
            async move { cluster.plan_policy(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Whether the caller's token (or, with `token_name`, another token: needs `acl` read) may
    /// do `verb` on `id`, and what decided it.
    pub async fn acl_check(
        &self,
        id: &Id,
        verb: &str,
        token_name: &str,
    ) -> Result<crate::cluster::v1::AclCheckResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(
                crate::cluster::v1::AclCheckRequest {
                    id: Some(id.clone()),
                    verb: verb.to_owned(),
                    token_name: token_name.to_owned(),
                },
                true,
            );
            async move { cluster.acl_check(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    pub async fn acl_who_am_i(&self) -> Result<crate::cluster::v1::AclWhoAmIResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(crate::cluster::v1::AclWhoAmIRequest {}, true);
            async move { cluster.acl_who_am_i(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    pub async fn members(&self) -> Result<MembersResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(MembersRequest {}, true);
            async move { cluster.members(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    pub async fn join(&self, join: JoinRequest) -> Result<JoinResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(join.clone(), true);
            async move { cluster.join(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Makes node `to` (0: the best caught-up voter) the leader; returns the new leader's id.
    pub async fn transfer_leader(&self, to: u64) -> Result<u64, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let mut request = self.request(
                crate::cluster::v1::TransferLeaderRequest {
                    to_node_id: to,
                    campaign: false,
                },
                true,
            );
            request.set_timeout(self.config.request_timeout.max(Duration::from_secs(30)));
            async move { cluster.transfer_leader(request).await }
        })
        .await
        .map(|response| response.into_inner().leader_id)
    }

    /// Removes a member; `force` allows leaving fewer reachable voters than a quorum.
    pub async fn remove(&self, node_id: u64, force: bool) -> Result<(), ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(RemoveRequest { node_id, force }, true);
            async move { cluster.remove(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Controllers per node; `all_nodes` asks the server to fan out to every member.
    pub async fn list_controllers(
        &self,
        all_nodes: bool,
    ) -> Result<ListControllersResponse, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(ListControllersRequest { all_nodes }, true);
            async move { cluster.list_controllers(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Streams an operator snapshot (the bytes of a snapshot file, see [`crate::snapshot`]).
    pub async fn snapshot_save(&self) -> Result<tonic::Streaming<SnapshotData>, ClientError> {
        self.retrying(|| {
            let mut cluster = self.cluster();
            let request = self.request(SnapshotSaveRequest {}, false);
            async move { cluster.snapshot_save(request).await }
        })
        .await
        .map(tonic::Response::into_inner)
    }

    /// Restores the cluster from a snapshot file's bytes, sent as a stream of chunks. Not
    /// retried: the stream is consumed by the first attempt.
    pub async fn snapshot_restore<S>(
        &self,
        chunks: S,
    ) -> Result<SnapshotRestoreResponse, ClientError>
    where
        S: tokio_stream::Stream<Item = SnapshotData> + Send + 'static,
    {
        let mut cluster = self.cluster();
        let request = self.request(chunks, false);
        cluster
            .snapshot_restore(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| self.explain(self.decode(&status)))
    }

    /// A watch that reconnects and resumes after restarts and leader changes.
    pub fn watcher(&self, request: WatchListRequest) -> Watcher {
        Watcher::new(self.clone(), request)
    }
}
