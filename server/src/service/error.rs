//! The service's error type and its one mapping to `tonic::Status`.

use crate::acl::{AclError, Unauthenticated};
use crate::storage::StorageError;

/// Everything a resource or cluster service call can fail with. Each variant is one gRPC code;
/// the message is what the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Bad input; the message names the field (`resource.id.name invalid: …`).
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    /// A compare-and-swap lost: the resource changed since the client read it.
    #[error("CAS operation failed: {0}")]
    CasFailed(String),
    #[error("uid doesn't match: {0}")]
    UidMismatch(String),
    /// What the call would create exists already (a member with other addresses).
    #[error("{0}")]
    AlreadyExists(String),
    /// The system is not in the state the call needs (ACLs off, already bootstrapped).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Unavailable(String),
    /// A watch cannot resume from the requested version; the client must list again.
    #[error("{0}")]
    OutOfRange(String),
    /// A stream ended by the server (a watch that fell behind, a snapshot restore).
    #[error("{0}")]
    Aborted(String),
    /// Over a size limit; the message names the limit.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The request did not arrive in time (its body stalled).
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// The context-free mapping of storage errors. Call sites with more context (a Read's
    /// group-version mismatch, a NotFound with a name) map those cases themselves.
    pub fn from_storage(error: StorageError) -> Self {
        match error {
            StorageError::NotFound => Error::NotFound("resource not found".into()),
            StorageError::CasFailure => Error::CasFailed(
                "the resource was changed since the given version was read; read it again and retry".into(),
            ),
            StorageError::WrongUid => Error::UidMismatch(
                "the stored resource has another uid (it was deleted and recreated)".into(),
            ),
            StorageError::GroupVersionMismatch { stored } => Error::InvalidArgument(format!(
                "resource is stored with group version {:?}",
                stored
                    .id
                    .and_then(|id| id.r#type)
                    .map(|t| t.group_version)
                    .unwrap_or_default()
            )),
            StorageError::Inconsistent(why) => Error::Unavailable(format!(
                "no leader or quorum to serve this request: {why}; retry shortly"
            )),
            StorageError::WatchClosed(why) => Error::Aborted(format!("watch closed: {why}")),
            StorageError::ResumeUnavailable(why) => Error::OutOfRange(format!("cannot resume the watch: {why}")),
            StorageError::Rejected(why) => Error::InvalidArgument(why),
            StorageError::NoSpace(why) => Error::ResourceExhausted(why),
            StorageError::CatchingUp(why) => Error::Unavailable(format!(
                "this node is {why}; retry shortly or ask another member"
            )),
            StorageError::Removed(why) => Error::FailedPrecondition(why),
            StorageError::Damaged(why) => Error::Unavailable(format!(
                "{why}; retry shortly or ask another member"
            )),
            StorageError::Internal(why) => Error::Internal(why),
        }
    }
}

impl From<StorageError> for Error {
    fn from(error: StorageError) -> Self {
        Error::from_storage(error)
    }
}

impl From<AclError> for Error {
    fn from(error: AclError) -> Self {
        match error {
            AclError::PermissionDenied(missing) => Error::PermissionDenied(missing),
            // A hook that still needs the resource after getting it is a bug in the hook.
            AclError::NeedResource => {
                Error::Internal("an ACL read hook asked for the resource it was given".into())
            }
        }
    }
}

impl From<Unauthenticated> for Error {
    fn from(error: Unauthenticated) -> Self {
        match error {
            Unauthenticated::Refused(why) => Error::Unauthenticated(why),
            Unauthenticated::NotReady(why) => Error::Unavailable(why),
        }
    }
}

impl From<crate::limits::LimitError> for Error {
    fn from(error: crate::limits::LimitError) -> Self {
        use crate::limits::LimitError;
        match error {
            LimitError::Unauthenticated(why) => Error::Unauthenticated(why),
            LimitError::BodyTimeout(_) => Error::DeadlineExceeded(error.to_string()),
            LimitError::Rate { .. }
            | LimitError::InFlight { .. }
            | LimitError::Watches { .. }
            | LimitError::CallerBytes { .. }
            | LimitError::NodeBytes { .. }
            | LimitError::AnonymousBody { .. }
            | LimitError::ListBytes { .. }
            | LimitError::Answers { .. } => Error::ResourceExhausted(error.to_string()),
        }
    }
}

impl Error {
    /// The status a client gets (the one mapping, [`From<Error> for tonic::Status`]).
    pub fn into_status(self) -> tonic::Status {
        tonic::Status::from(self)
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        use tonic::Code;
        let code = match &error {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::CasFailed(_) => Code::Aborted,
            Error::UidMismatch(_) | Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::PermissionDenied(_) => Code::PermissionDenied,
            Error::Unauthenticated(_) => Code::Unauthenticated,
            Error::Unavailable(_) => Code::Unavailable,
            Error::Aborted(_) => Code::Aborted,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Error::Internal(_) => {
                tracing::error!(error = %error, "internal error");
                Code::Internal
            }
        };
        tonic::Status::new(code, error.to_string())
    }
}
