//! [`Api`]: the small client a controller acts through, with two implementations — the
//! server's resource service in process (the built-in controllers, `server::controller`) and
//! a cluster client over gRPC ([`crate::grpc`]: a program of its own).

#[cfg(feature = "conformance")]
pub mod conformance;

use futures::stream::BoxStream;
use proto::reason::Reason;
use proto::resource::v1::{Id, Resource, Status, Tenancy, Type, WatchEvent, WatchListRequest};

/// Why a call failed, as much as a controller decides on (typed, never read from the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    NotFound(String),
    /// A compare-and-swap lost, or a create met a resource created first: someone else's
    /// write won; read again.
    #[error("{0}")]
    Conflict(String),
    /// The server cannot serve this yet (no leader, catching up, unreachable): a wait, not a
    /// failure.
    #[error("{0}")]
    Unavailable(String),
    /// A watch cannot go on from where it was (the history moved on, a restore): list again.
    #[error("{0}")]
    Relist(String),
    /// A write sent under a lease this replica no longer holds (DESIGN §16, `FENCED`): nothing
    /// was stored; the replica stops reconciling until it holds a lease again.
    #[error("{0}")]
    Fenced(String),
    /// Anything else: a bad request, a token without the permission, a server error.
    #[error("{0}")]
    Failed(String),
}

impl ApiError {
    /// What a controller does about an answer with this reason (both implementations decide
    /// here, on the reason alone).
    pub fn of_reason(reason: Reason, message: String) -> ApiError {
        match reason {
            Reason::NotFound | Reason::TenancyNotFound => ApiError::NotFound(message),
            Reason::CasConflict | Reason::UidMismatch | Reason::AlreadyExists => {
                ApiError::Conflict(message)
            }
            Reason::ResumeUnavailable | Reason::WatchClosed => ApiError::Relist(message),
            Reason::Fenced => ApiError::Fenced(message),
            reason if reason.may_succeed_later() => ApiError::Unavailable(message),
            _ => ApiError::Failed(message),
        }
    }
}

/// The events of a watch: a snapshot of every match, `EndOfSnapshot`, then changes. An error
/// ends it.
pub type EventStream = BoxStream<'static, Result<WatchEvent, ApiError>>;

/// What a controller reads, writes and watches through. Writes without a version are
/// unconditional; with one, compare-and-swap (DESIGN §3).
///
/// # Errors
///
/// Every call answers an [`ApiError`] by what the caller should do, decided on the server's
/// reason ([`ApiError::of_reason`]) wherever it gave one: `Conflict` (re-read and try again: a
/// lost compare-and-swap, a create that met a resource created first, a uid that is not the
/// stored one), `Unavailable` (wait: no leader, a node catching up or shutting down, a server
/// out of reach), `NotFound` (the resource, or its partition or namespace), `Relist` (a watch
/// only) and `Failed` (anything else — a Type being deleted, a removed node, a refusal;
/// retried with backoff, said). Both implementations — the server's `InProcess` and
/// `proto::client::Client` — map their errors in one function each, and the runner's tests
/// (over a fake), the server's controller tests (in process) and the example's tests (over
/// gRPC) exercise them.
#[async_trait::async_trait]
pub trait Api: Clone + Send + Sync + 'static {
    /// The stored resource (any version of its type), or `None`.
    async fn read(&self, id: &Id) -> Result<Option<Resource>, ApiError>;
    async fn write(&self, resource: Resource) -> Result<Resource, ApiError>;
    /// Deletes at `version` (empty: whatever is stored).
    async fn delete(&self, id: &Id, version: &str) -> Result<(), ApiError>;
    async fn list(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
    ) -> Result<Vec<Resource>, ApiError>;
    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ApiError>;
    /// Writes the status under `key` (`version` empty: over whatever is stored).
    async fn write_status(
        &self,
        id: &Id,
        version: &str,
        key: &str,
        status: Status,
    ) -> Result<Resource, ApiError>;
    /// Opens a watch. Implementations may open lazily and report a refusal on the stream.
    async fn watch(&self, request: WatchListRequest) -> Result<EventStream, ApiError>;
    /// This Api with its writes, status writes and deletes fenced by the lease in `fence`
    /// (DESIGN §16): sent with it while the cell holds one, refused `Fenced` (nothing sent)
    /// while it is empty; a `FENCED` answer empties it.
    fn fenced(&self, fence: proto::fence::FenceCell) -> Self;
}
