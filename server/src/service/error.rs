//! The service's error type and its one mapping to `tonic::Status`.

use proto::reason::{Details, Reason};

use crate::acl::{AclError, Unauthenticated};
use crate::cluster::MembershipError;
use crate::storage::StorageError;

/// Everything a resource or cluster service call can fail with. Each variant is one gRPC code;
/// the message is what the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Bad input; the message names the field (`resource.id.name invalid: …`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A rule of the resource's type ran out of its cost budget (`RULE_COST`).
    #[error("{0}")]
    RuleCost(String),
    /// Bad input, field by field (every violation found), sent with a `google.rpc.BadRequest`.
    #[error("{0}")]
    BadRequest(BadRequest),
    #[error("{0}")]
    NotFound(String),
    /// A compare-and-swap lost: the resource changed since the client read it.
    #[error("CAS operation failed: {0}")]
    CasFailed(String),
    /// A compare-and-swap lost where both versions are known: sent with them (`expected`,
    /// `actual`), so a client can tell how far behind it is without reading again.
    #[error("CAS operation failed: {0}")]
    VersionConflict(VersionConflict),
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
    /// Unavailable for a reason no variant below names (a peer out of reach).
    #[error("{0}")]
    Unavailable(String),
    /// No leader, or no quorum to commit: wait, or bring a majority back.
    #[error("{0}")]
    NoQuorum(String),
    /// This node serves nothing yet: it is catching up after an unclean stop.
    #[error("{0}")]
    CatchingUp(crate::storage::CatchingUp),
    /// This node is shutting down: another member can answer.
    #[error("{0}")]
    ShuttingDown(String),
    /// This node was removed from the cluster (by whom, when known: `REMOVED`'s `by`).
    #[error("{0}")]
    Removed(crate::storage::Removal),
    /// This node found its stored state damaged.
    #[error("{0}")]
    Damaged(String),
    /// A change of membership gave up and undid itself.
    #[error("{0}")]
    MembershipUnchanged(String),
    /// A change of membership is proposed but not committed.
    #[error("{0}")]
    MembershipPending(String),
    /// A read in a partition or namespace that does not exist.
    #[error("{0}")]
    TenancyNotFound(String),
    /// A write into a partition or namespace that does not exist.
    #[error("{0}")]
    WriteToMissingTenancy(String),
    /// The resource's registered Type is being deleted.
    #[error("{0}")]
    TypeBeingDeleted(String),
    /// The request names a type this node does not know: invalid, once the node has caught
    /// up with the leader (`grpc` asks again after [`super::ResourceService::sync`]).
    #[error("{0}")]
    UnknownType(String),
    /// What the change was checked against (a Type, the ACL state) changed before it could
    /// be stored; nothing changed. The service checks it again, so a client sees this only
    /// when that kept failing.
    #[error("{0}; retry")]
    Fenced(crate::storage::Fenced),
    /// Only the leader can answer, and another node leads (`NOT_LEADER`, with its id and API
    /// address).
    #[error("{0}")]
    NotLeader(NotLeader),
    /// A watch cannot resume from the requested version; the client must list again.
    #[error("{0}")]
    OutOfRange(String),
    /// A stream ended by the server (a watch that fell behind, a snapshot restore).
    #[error("{0}")]
    Aborted(String),
    /// Over a size limit; the message names the limit.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Over a `tenancy.v1.Quota` (DESIGN §17).
    #[error("{0}")]
    QuotaExceeded(crate::storage::quota::QuotaExceeded),
    /// An admission policy refused the write (DESIGN §17).
    #[error("{0}")]
    AdmissionDenied(super::policy::AdmissionDenied),
    /// The request did not arrive in time (its body stalled).
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
}

/// The violations of a request, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub Vec<FieldViolation>);

/// One violation: the field's path in the request, and the words for people (which name it).
pub(super) use crate::resource::FieldViolation;

impl From<crate::resource::Invalid> for Error {
    fn from(invalid: crate::resource::Invalid) -> Self {
        Error::BadRequest(BadRequest(invalid.0))
    }
}

/// A call only the leader can answer, made on node `node` while `leader_id` leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLeader {
    pub node: u64,
    pub leader_id: u64,
    /// The leader's API address.
    pub leader_addr: String,
    /// Why this call cannot be passed on to the leader.
    pub why: &'static str,
}

impl std::fmt::Display for NotLeader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {} is not the leader ({}): ask the leader, node {} at {}",
            self.node, self.why, self.leader_id, self.leader_addr
        )
    }
}

/// A lost compare-and-swap with both versions: `{what} is at version {actual}, the {by}
/// expected version {expected}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionConflict {
    /// The resource, as people read it.
    pub what: String,
    /// What lost: "write", "delete", "status write".
    pub by: &'static str,
    pub expected: String,
    pub actual: String,
}

impl std::fmt::Display for VersionConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is at version {}, the {} expected version {}",
            self.what, self.actual, self.by, self.expected
        )
    }
}

impl std::fmt::Display for BadRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let messages: Vec<&str> = self.0.iter().map(|v| v.message.as_str()).collect();
        f.write_str(&messages.join("; "))
    }
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
            StorageError::Inconsistent(why) => Error::NoQuorum(format!(
                "no leader or quorum to serve this request: {why}; retry shortly"
            )),
            StorageError::WatchClosed(why) => Error::Aborted(format!("watch closed: {why}")),
            StorageError::ResumeUnavailable(why) => Error::OutOfRange(format!("cannot resume the watch: {why}")),
            StorageError::Rejected(why) => Error::InvalidArgument(why),
            StorageError::MissingTenancy(why) => Error::WriteToMissingTenancy(why),
            StorageError::NoSpace(why) => Error::ResourceExhausted(why),
            StorageError::QuotaExceeded(exceeded) => Error::QuotaExceeded(exceeded),
            // Said by the node that is catching up (here, or a peer the request went to).
            StorageError::CatchingUp(progress) => Error::CatchingUp(progress),
            StorageError::ShuttingDown(why) => Error::ShuttingDown(format!(
                "{why}; retry on another member"
            )),
            StorageError::Removed(why) => Error::Removed(why),
            StorageError::Damaged(why) => Error::Damaged(format!(
                "{why}; retry shortly or ask another member"
            )),
            StorageError::Fenced(fenced) => Error::Fenced(fenced),
            StorageError::Invalid(invalid) => invalid.into(),
            StorageError::HistoryGone(why) => Error::OutOfRange(why),
            StorageError::Internal(why) => Error::Internal(why),
        }
    }
}

impl From<StorageError> for Error {
    fn from(error: StorageError) -> Self {
        Error::from_storage(error)
    }
}

impl From<MembershipError> for Error {
    fn from(error: MembershipError) -> Self {
        match error {
            MembershipError::Unchanged(why) => Error::MembershipUnchanged(why),
            MembershipError::Pending(why) => Error::MembershipPending(why),
            MembershipError::NotMember(why) => Error::NotFound(why),
            MembershipError::Conflict(why) => Error::AlreadyExists(why),
            MembershipError::Refused(why) => Error::FailedPrecondition(why),
            MembershipError::Failed(why) => Error::Unavailable(why),
        }
    }
}

impl From<crate::registry::dynamic::RuleFailure> for Error {
    fn from(failure: crate::registry::dynamic::RuleFailure) -> Self {
        use crate::registry::dynamic::RuleFailure;
        match failure {
            RuleFailure::Violations(violations) => Error::BadRequest(BadRequest(
                violations
                    .into_iter()
                    .map(|violation| FieldViolation {
                        message: violation.to_string(),
                        field: violation.field,
                    })
                    .collect(),
            )),
            RuleFailure::Cost(why) => Error::RuleCost(why),
        }
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
            // Like a node catching up: another member, with its tokens loaded, can answer.
            Unauthenticated::Loading(why) => Error::CatchingUp(why.into()),
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

impl Error {
    /// The one table: each error's gRPC code and reason (DESIGN §3, "Errors"). Codes never
    /// change; reasons are what clients decide on.
    pub fn code_and_reason(&self) -> (tonic::Code, Reason) {
        use tonic::Code;
        match self {
            Error::InvalidArgument(_) | Error::BadRequest(_) | Error::UnknownType(_) => {
                (Code::InvalidArgument, Reason::Invalid)
            }
            Error::RuleCost(_) => (Code::InvalidArgument, Reason::RuleCost),
            Error::NotFound(_) => (Code::NotFound, Reason::NotFound),
            Error::TenancyNotFound(_) => (Code::NotFound, Reason::TenancyNotFound),
            Error::WriteToMissingTenancy(_) => (Code::InvalidArgument, Reason::TenancyNotFound),
            Error::CasFailed(_) | Error::VersionConflict(_) => (Code::Aborted, Reason::CasConflict),
            Error::UidMismatch(_) => (Code::FailedPrecondition, Reason::UidMismatch),
            Error::FailedPrecondition(_) => (Code::FailedPrecondition, Reason::FailedPrecondition),
            Error::TypeBeingDeleted(_) => (Code::FailedPrecondition, Reason::TypeBeingDeleted),
            Error::Fenced(fenced) => match fenced.kind {
                crate::storage::FenceKind::Schema => (Code::Aborted, Reason::SchemaChanged),
                crate::storage::FenceKind::Acl => (Code::Aborted, Reason::AclChanged),
                crate::storage::FenceKind::Lease => (Code::FailedPrecondition, Reason::Fenced),
            },
            Error::Removed(_) => (Code::FailedPrecondition, Reason::Removed),
            Error::NotLeader(_) => (Code::FailedPrecondition, Reason::NotLeader),
            Error::AlreadyExists(_) => (Code::AlreadyExists, Reason::AlreadyExists),
            Error::PermissionDenied(_) => (Code::PermissionDenied, Reason::PermissionDenied),
            Error::Unauthenticated(_) => (Code::Unauthenticated, Reason::Unauthenticated),
            Error::Unavailable(_) => (Code::Unavailable, Reason::Unavailable),
            Error::NoQuorum(_) => (Code::Unavailable, Reason::NoQuorum),
            Error::CatchingUp(_) => (Code::Unavailable, Reason::CatchingUp),
            Error::ShuttingDown(_) => (Code::Unavailable, Reason::ShuttingDown),
            Error::Damaged(_) => (Code::Unavailable, Reason::Damaged),
            Error::MembershipUnchanged(_) => (Code::Unavailable, Reason::MembershipUnchanged),
            Error::MembershipPending(_) => (Code::Unavailable, Reason::MembershipPending),
            Error::Aborted(_) => (Code::Aborted, Reason::WatchClosed),
            Error::OutOfRange(_) => (Code::OutOfRange, Reason::ResumeUnavailable),
            Error::ResourceExhausted(_) => (Code::ResourceExhausted, Reason::Quota),
            Error::QuotaExceeded(_) => (Code::ResourceExhausted, Reason::QuotaExceeded),
            Error::AdmissionDenied(_) => (Code::InvalidArgument, Reason::AdmissionDenied),
            Error::DeadlineExceeded(_) => (Code::DeadlineExceeded, Reason::DeadlineExceeded),
            Error::Internal(_) => (Code::Internal, Reason::Internal),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        let (code, reason) = error.code_and_reason();
        if reason == Reason::Internal {
            tracing::error!(error = %error, "internal error");
        }
        let mut details = Details::new(reason);
        match &error {
            Error::BadRequest(BadRequest(violations)) => {
                for violation in violations {
                    details = details.with_violation(&violation.field, &violation.message);
                }
            }
            Error::Removed(crate::storage::Removal { by: Some(by), .. }) => {
                details = details.with("by", by);
            }
            Error::NotLeader(not_leader) => {
                details = details
                    .with("leader_id", not_leader.leader_id)
                    .with("leader_addr", &not_leader.leader_addr);
            }
            Error::AdmissionDenied(denied) => {
                details = details.with("policy", &denied.policy);
            }
            Error::QuotaExceeded(exceeded) => {
                details = details
                    .with("quota", &exceeded.quota)
                    .with("key", &exceeded.key)
                    .with("limit", exceeded.limit)
                    .with("used", exceeded.used);
            }
            Error::VersionConflict(conflict) => {
                details = details
                    .with("expected", &conflict.expected)
                    .with("actual", &conflict.actual);
            }
            Error::CatchingUp(progress) => {
                if let Some(applied) = progress.applied {
                    details = details.with("applied", applied);
                }
                if let Some(target) = progress.target {
                    details = details.with("target", target);
                }
            }
            _ => {}
        }
        proto::reason::attach(code, error.to_string(), &details)
    }
}

/// A request that is not one whole, uncompressed message within the limit (`service::encoded`
/// reads those itself): the code tonic gives the same failure, with its reason. The one status
/// built here other than from an [`Error`].
pub(crate) fn framing(code: tonic::Code, reason: Reason, message: String) -> tonic::Status {
    proto::reason::attach(code, message, &Details::new(reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error reaches the client with its code and, in the status details, its reason.
    #[test]
    fn every_error_carries_its_reason_on_the_wire() {
        let errors = [
            Error::InvalidArgument("x".into()),
            Error::NotFound("x".into()),
            Error::TenancyNotFound("x".into()),
            Error::CasFailed("x".into()),
            Error::UidMismatch("x".into()),
            Error::AlreadyExists("x".into()),
            Error::FailedPrecondition("x".into()),
            Error::TypeBeingDeleted("x".into()),
            Error::Fenced(crate::storage::Fenced {
                kind: crate::storage::FenceKind::Schema,
                why: "x".into(),
                at: 1,
            }),
            Error::Fenced(crate::storage::Fenced {
                kind: crate::storage::FenceKind::Acl,
                why: "x".into(),
                at: 1,
            }),
            Error::Fenced(crate::storage::Fenced {
                kind: crate::storage::FenceKind::Lease,
                why: "x".into(),
                at: 1,
            }),
            Error::NotLeader(NotLeader {
                node: 2,
                leader_id: 1,
                leader_addr: "127.0.0.1:1".into(),
                why: "x",
            }),
            Error::Removed(String::from("x").into()),
            Error::PermissionDenied("x".into()),
            Error::Unauthenticated("x".into()),
            Error::Unavailable("x".into()),
            Error::NoQuorum("x".into()),
            Error::CatchingUp(String::from("x").into()),
            Error::ShuttingDown("x".into()),
            Error::Damaged("x".into()),
            Error::MembershipUnchanged("x".into()),
            Error::MembershipPending("x".into()),
            Error::Aborted("x".into()),
            Error::OutOfRange("x".into()),
            Error::ResourceExhausted("x".into()),
            Error::DeadlineExceeded("x".into()),
            Error::Internal("x".into()),
        ];
        let mut reasons = std::collections::BTreeSet::new();
        for error in errors {
            let (code, reason) = error.code_and_reason();
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), code);
            let details = proto::reason::of(&status).expect("details");
            assert_eq!(details.reason, reason);
            assert!(reasons.insert(reason.as_str()), "{reason:?} twice");
            assert!(reason.fits(code), "{reason:?} under {code:?}");
        }
        // A write into a missing tenancy has the reason of a read there, and its own code.
        let write = Error::WriteToMissingTenancy("x".into());
        assert_eq!(
            write.code_and_reason(),
            (tonic::Code::InvalidArgument, Reason::TenancyNotFound)
        );
        // Every reason the table gives fits its code (what clients check before trusting it).
        for error in [write, Error::BadRequest(BadRequest(Vec::new()))] {
            let (code, reason) = error.code_and_reason();
            assert!(reason.fits(code), "{reason:?} under {code:?}");
        }
    }

    /// A call only the leader answers names the leader as data: a joiner follows it without
    /// reading the message.
    #[test]
    fn not_leader_names_the_leader() {
        let status = tonic::Status::from(Error::NotLeader(NotLeader {
            node: 2,
            leader_id: 1,
            leader_addr: "127.0.0.1:7001".into(),
            why: "a join must reach the leader with the joiner's own certificate",
        }));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        let details = proto::reason::of(&status).expect("details");
        assert_eq!(details.reason, Reason::NotLeader);
        assert_eq!(details.metadata["leader_id"], "1");
        assert_eq!(details.metadata["leader_addr"], "127.0.0.1:7001");
        assert!(status.message().contains("node 1 at 127.0.0.1:7001"));
    }

    /// An invalid request names its fields as data (`google.rpc.BadRequest`), beside the words.
    #[test]
    fn a_bad_request_sends_its_field_violations() {
        let error = Error::BadRequest(BadRequest(vec![
            FieldViolation {
                field: "resource.id.name".into(),
                message: "resource.id.name invalid: empty".into(),
            },
            FieldViolation {
                field: "resource.id.tenancy.namespace".into(),
                message: "resource.id.tenancy.namespace cannot be the wildcard \"*\" here".into(),
            },
        ]));
        let status = tonic::Status::from(error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "resource.id.name invalid: empty; resource.id.tenancy.namespace cannot be the wildcard \"*\" here"
        );
        let details = proto::reason::of(&status).expect("details");
        assert_eq!(details.reason, Reason::Invalid);
        let fields: Vec<&str> = details
            .field_violations
            .iter()
            .map(|(field, _)| field.as_str())
            .collect();
        assert_eq!(
            fields,
            ["resource.id.name", "resource.id.tenancy.namespace"]
        );
    }

    /// A node catching up says how far it has come, as data: `applied`, and `target` once known.
    #[test]
    fn catching_up_says_how_far_as_metadata() {
        let status = tonic::Status::from(Error::from_storage(StorageError::CatchingUp(
            crate::storage::CatchingUp {
                why: "catching up after an unclean stop: applied 3 of 9".into(),
                applied: Some(3),
                target: Some(9),
            },
        )));
        let details = proto::reason::of(&status).expect("details");
        assert_eq!(details.reason, Reason::CatchingUp);
        assert_eq!(
            details.metadata.get("applied").map(String::as_str),
            Some("3")
        );
        assert_eq!(
            details.metadata.get("target").map(String::as_str),
            Some("9")
        );
        assert!(
            status.message().contains("applied 3 of 9"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn a_removed_node_says_who_removed_it_as_metadata() {
        use crate::storage::Removal;
        let removal = Removal {
            why: "node 3 was removed from cluster resd (by node 1)".into(),
            by: Some(1),
        };
        // As the data directory keeps it, and as an earlier build wrote it (words alone).
        assert_eq!(Removal::of_marker(&removal.to_marker()), removal);
        assert_eq!(
            Removal::of_marker("node 3 was removed from cluster resd (by node 1)\n"),
            Removal {
                by: None,
                ..removal.clone()
            }
        );
        let status = tonic::Status::from(Error::from_storage(StorageError::Removed(removal)));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        let details = proto::reason::of(&status).expect("details");
        assert_eq!(details.reason, Reason::Removed);
        assert_eq!(details.metadata.get("by").map(String::as_str), Some("1"));
        let unknown = tonic::Status::from(Error::Removed(String::from("removed").into()));
        let details = proto::reason::of(&unknown).expect("details");
        assert!(!details.metadata.contains_key("by"));
    }

    #[test]
    fn a_lost_compare_and_swap_sends_both_versions() {
        let status = tonic::Status::from(Error::VersionConflict(VersionConflict {
            what: "demo.v2.Artist/a".into(),
            by: "write",
            expected: "7".into(),
            actual: "9".into(),
        }));
        assert_eq!(status.code(), tonic::Code::Aborted);
        assert_eq!(
            status.message(),
            "CAS operation failed: demo.v2.Artist/a is at version 9, the write expected version 7"
        );
        let details = proto::reason::of(&status).expect("details");
        assert_eq!(details.reason, Reason::CasConflict);
        assert_eq!(
            details.metadata.get("expected").map(String::as_str),
            Some("7")
        );
        assert_eq!(
            details.metadata.get("actual").map(String::as_str),
            Some("9")
        );
    }

    /// What storage says a node is doing keeps its reason through the service.
    #[test]
    fn storage_states_keep_their_reason() {
        let reason = |error: StorageError| Error::from_storage(error).code_and_reason().1;
        assert_eq!(
            reason(StorageError::CatchingUp(String::from("x").into())),
            Reason::CatchingUp
        );
        assert_eq!(
            reason(StorageError::ShuttingDown("x".into())),
            Reason::ShuttingDown
        );
        assert_eq!(
            reason(StorageError::Removed(String::from("x").into())),
            Reason::Removed
        );
        assert_eq!(reason(StorageError::Damaged("x".into())), Reason::Damaged);
        assert_eq!(
            reason(StorageError::Inconsistent("x".into())),
            Reason::NoQuorum
        );
        assert_eq!(reason(StorageError::CasFailure), Reason::CasConflict);
        assert_eq!(reason(StorageError::WrongUid), Reason::UidMismatch);
    }
}
