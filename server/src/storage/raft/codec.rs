//! The one place the raft layer's typed values meet protobuf: log entry payloads ([`Op`] ↔
//! `resd.raft.v1.Command`), apply results ([`Outcome`] ↔ `CommandResult`), forwarded requests
//! and replies ([`Request`] ↔ `ForwardRequest`, [`ReplyResult`] ↔ `ForwardResponse`) and storage
//! errors on the wire. Changing the log format is a change in this file (and `schema`'s format
//! version).
//!
//! Decoding is total over what the wire can hold: a message that decodes but has the wrong shape
//! (an empty command, a write without a resource) is an error, never a panic or a default.

use prost::Message;
use proto::raft::v1::{
    self as pb, batch_operation::Operation as PbOperation, command::Command as PbCommand,
    forward_request::Request as PbRequest, forward_response::Response as PbResponse,
    storage_failure::Code,
};
use proto::resource::v1::Resource;

use super::op::{
    Applied, Change, ChangeResult, ListQuery, Op, Reply, ReplyResult, Request, RequestId, Tagged,
};
use crate::storage::history::{Keep, Retention};
use crate::storage::{
    Domain, Fence, FenceKind, Fenced, Guard, StorageError, StorageKey, UnversionedType,
    WriteCondition,
};

/// A message from the wire that decodes as protobuf but is not a valid raft value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("undecodable {what}: {source}")]
    Protobuf {
        what: &'static str,
        source: prost::DecodeError,
    },
    #[error("malformed {what}: {why}")]
    Shape {
        what: &'static str,
        why: &'static str,
    },
}

fn shape(what: &'static str, why: &'static str) -> CodecError {
    CodecError::Shape { what, why }
}

// Log entries.

/// The encoded payload of a log entry.
pub(crate) fn encode_op(op: &Op) -> Vec<u8> {
    match op {
        Op::Changes(changes) => crate::wire::changes::encode(changes),
        _ => command_of(op).encode_to_vec(),
    }
}

/// Decodes a log entry payload.
pub(crate) fn decode_op(bytes: &[u8]) -> Result<Op, CodecError> {
    let command = pb::Command::decode(bytes).map_err(|source| CodecError::Protobuf {
        what: "log entry",
        source,
    })?;
    op_of(command)
}

pub(crate) fn request_id_text(request_id: Option<RequestId>) -> String {
    request_id.map(|id| id.0.to_string()).unwrap_or_default()
}

fn request_id_of(text: &str) -> Result<Option<RequestId>, CodecError> {
    if text.is_empty() {
        return Ok(None);
    }
    ulid::Ulid::from_string(text)
        .map(|id| Some(RequestId(id)))
        .map_err(|_| shape("change", "a request id that is not a ULID"))
}

fn write_cas(resource: &Resource, condition: WriteCondition, tagged: &Tagged) -> pb::WriteCas {
    pb::WriteCas {
        resource: Some((*resource).clone()),
        request_id: request_id_text(tagged.request_id),
        actor: tagged.actor.clone(),
        merged: condition == WriteCondition::Merged,
        guards: guards_of(&tagged.fence),
        history: tagged.keep.map(history_of),
    }
}

/// How a change is kept in history, on the wire.
pub(crate) fn history_of(keep: Keep) -> pb::History {
    pb::History {
        time_ms: keep.time_ms,
        versions: keep.retention.versions,
        seconds: keep.retention.seconds,
        bytes: keep.retention.bytes,
        node_bytes: keep.node_bytes,
    }
}

fn keep_of(history: pb::History) -> Keep {
    Keep {
        time_ms: history.time_ms,
        retention: Retention {
            versions: history.versions,
            seconds: history.seconds,
            bytes: history.bytes,
        },
        node_bytes: history.node_bytes,
    }
}

/// A fence's guards on the wire.
pub(crate) fn guards_of(fence: &Fence) -> Vec<pb::Guard> {
    fence
        .guards
        .iter()
        .map(|guard| pb::Guard {
            guard: Some(match guard {
                Guard::Resource { key, version } => pb::guard::Guard::Resource(pb::ResourceGuard {
                    group: key.group.clone(),
                    kind: key.kind.clone(),
                    partition: key.partition.clone(),
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    version: version.clone(),
                }),
                Guard::Domain { domain, revision } => pb::guard::Guard::Domain(pb::DomainGuard {
                    domain: domain.name().to_owned(),
                    index: revision.index,
                    position: revision.position,
                }),
                Guard::Lease { key, transitions } => pb::guard::Guard::Lease(pb::LeaseGuard {
                    partition: key.partition.clone(),
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    transitions: *transitions,
                }),
            }),
        })
        .collect()
}

/// Most guards a change may carry (a Type's, a domain or two).
const MAX_GUARDS: usize = 8;

fn fence_of(guards: Vec<pb::Guard>) -> Result<Fence, CodecError> {
    if guards.len() > MAX_GUARDS {
        return Err(shape("change", "more than 8 guards"));
    }
    let guards = guards
        .into_iter()
        .map(|guard| match guard.guard {
            Some(pb::guard::Guard::Resource(resource)) => Ok(Guard::Resource {
                key: StorageKey {
                    group: resource.group,
                    kind: resource.kind,
                    partition: resource.partition,
                    namespace: resource.namespace,
                    name: resource.name,
                },
                version: resource.version,
            }),
            Some(pb::guard::Guard::Domain(domain)) => Ok(Guard::Domain {
                domain: Domain::from_name(&domain.domain)
                    .ok_or_else(|| shape("change", "a guard of an unknown domain"))?,
                revision: crate::storage::Version::at(domain.index, domain.position),
            }),
            Some(pb::guard::Guard::Lease(lease)) => Ok(Guard::Lease {
                key: StorageKey {
                    group: "coordination".into(),
                    kind: "Lease".into(),
                    partition: lease.partition,
                    namespace: lease.namespace,
                    name: lease.name,
                },
                transitions: lease.transitions,
            }),
            None => Err(shape("change", "an empty guard")),
        })
        .collect::<Result<_, _>>()?;
    Ok(Fence { guards })
}

pub(crate) fn delete_cas(
    id: &proto::resource::v1::Id,
    version: &str,
    tagged: &Tagged,
) -> pb::DeleteCas {
    pb::DeleteCas {
        id: Some(id.clone()),
        version: version.to_owned(),
        request_id: request_id_text(tagged.request_id),
        actor: tagged.actor.clone(),
        guards: guards_of(&tagged.fence),
        history: tagged.keep.map(history_of),
    }
}

/// Longest actor a change may carry (an accessor or `controller/<name>`).
const MAX_ACTOR_LEN: usize = 256;

fn actor_of(actor: String) -> Result<String, CodecError> {
    if actor.len() > MAX_ACTOR_LEN {
        return Err(shape("change", "an actor longer than 256 bytes"));
    }
    Ok(actor)
}

fn command_of(op: &Op) -> pb::Command {
    let command = match op {
        // One change travels as a plain command: the format older entries already use.
        Op::Changes(changes) if changes.len() == 1 => {
            let tagged = &changes[0];
            match &tagged.change {
                Change::Write(resource, condition) => {
                    PbCommand::WriteCas(write_cas(resource, *condition, tagged))
                }
                Change::Delete { id, version } => {
                    PbCommand::DeleteCas(delete_cas(id, version, tagged))
                }
            }
        }
        Op::Changes(changes) => PbCommand::Batch(pb::Batch {
            operations: changes
                .iter()
                .map(|tagged| pb::BatchOperation {
                    operation: Some(match &tagged.change {
                        Change::Write(resource, condition) => {
                            PbOperation::WriteCas(write_cas(resource, *condition, tagged))
                        }
                        Change::Delete { id, version } => {
                            PbOperation::DeleteCas(delete_cas(id, version, tagged))
                        }
                    }),
                })
                .collect(),
        }),
        Op::RestoreBegin { restore_id } => PbCommand::RestoreBegin(pb::RestoreBegin {
            restore_id: restore_id.clone(),
        }),
        Op::RestoreChunk {
            restore_id,
            resources,
            history,
        } => PbCommand::RestoreChunk(pb::RestoreChunk {
            restore_id: restore_id.clone(),
            resources: resources.clone(),
            history: history
                .iter()
                .map(|(entry, expires_ms)| pb::HistoryRecord {
                    entry: Some(entry.clone()),
                    expires_ms: *expires_ms,
                })
                .collect(),
        }),
        Op::RestoreCommit { restore_id } => PbCommand::RestoreCommit(pb::RestoreCommit {
            restore_id: restore_id.clone(),
        }),
    };
    pb::Command {
        command: Some(command),
    }
}

fn change_of_write(write: pb::WriteCas) -> Result<Tagged, CodecError> {
    let request_id = request_id_of(&write.request_id)?;
    let resource = write
        .resource
        .ok_or_else(|| shape("write", "no resource"))?;
    let condition = if write.merged {
        WriteCondition::Merged
    } else {
        WriteCondition::Version
    };
    Ok(Tagged {
        request_id,
        change: Change::Write(std::sync::Arc::new(resource), condition),
        actor: actor_of(write.actor)?,
        fence: fence_of(write.guards)?,
        keep: write.history.map(keep_of),
    })
}

fn change_of_delete(delete: pb::DeleteCas) -> Result<Tagged, CodecError> {
    let request_id = request_id_of(&delete.request_id)?;
    let id = delete.id.ok_or_else(|| shape("delete", "no id"))?;
    Ok(Tagged {
        request_id,
        change: Change::Delete {
            id,
            version: delete.version,
        },
        actor: actor_of(delete.actor)?,
        fence: fence_of(delete.guards)?,
        keep: delete.history.map(keep_of),
    })
}

fn op_of(command: pb::Command) -> Result<Op, CodecError> {
    const WHAT: &str = "log entry";
    Ok(
        match command
            .command
            .ok_or_else(|| shape(WHAT, "empty command"))?
        {
            PbCommand::WriteCas(write) => Op::Changes(vec![change_of_write(write)?]),
            PbCommand::DeleteCas(delete) => Op::Changes(vec![change_of_delete(delete)?]),
            PbCommand::Batch(batch) => {
                if batch.operations.is_empty() {
                    return Err(shape(WHAT, "empty batch"));
                }
                let changes = batch
                    .operations
                    .into_iter()
                    .map(|operation| match operation.operation {
                        Some(PbOperation::WriteCas(write)) => change_of_write(write),
                        Some(PbOperation::DeleteCas(delete)) => change_of_delete(delete),
                        None => Err(shape(WHAT, "empty batch operation")),
                    })
                    .collect::<Result<_, _>>()?;
                Op::Changes(changes)
            }
            PbCommand::RestoreBegin(begin) => Op::RestoreBegin {
                restore_id: begin.restore_id,
            },
            PbCommand::RestoreChunk(chunk) => Op::RestoreChunk {
                restore_id: chunk.restore_id,
                resources: chunk.resources,
                history: chunk
                    .history
                    .into_iter()
                    .map(|record| {
                        record
                            .entry
                            .map(|entry| (entry, record.expires_ms))
                            .ok_or_else(|| shape(WHAT, "a history record without its entry"))
                    })
                    .collect::<Result<_, _>>()?,
            },
            PbCommand::RestoreCommit(commit) => Op::RestoreCommit {
                restore_id: commit.restore_id,
            },
        },
    )
}

// The deduplication table.

/// What the state machine remembers of an applied change (small: a write's version, not its
/// resource).
pub(crate) fn encode_remembered(result: &ChangeResult) -> Vec<u8> {
    use pb::remembered::Outcome as Remembered;
    let outcome = match result {
        Ok(Applied::Written(resource)) => Remembered::WrittenVersion(resource.version.clone()),
        Ok(Applied::Done) => Remembered::Done(pb::Done {}),
        Err(error) => {
            let mut failure = failure_of(error);
            failure.stored = None;
            Remembered::Failure(failure)
        }
    };
    pb::Remembered {
        outcome: Some(outcome),
    }
    .encode_to_vec()
}

/// The outcome of the first application of `change`, from what was remembered of it: a write is
/// the resource the retry carries, at the version it was stored with.
pub(crate) fn remembered_result(bytes: &[u8], change: &Change) -> ChangeResult {
    use pb::remembered::Outcome as Remembered;
    let remembered = pb::Remembered::decode(bytes).map_err(|error| {
        StorageError::Internal(format!("a remembered outcome does not decode: {error}"))
    })?;
    match (remembered.outcome, change) {
        (Some(Remembered::WrittenVersion(version)), Change::Write(resource, _)) => {
            let mut stored = (**resource).clone();
            stored.version = version;
            Ok(Applied::Written(stored))
        }
        (Some(Remembered::Done(_)), _) => Ok(Applied::Done),
        (Some(Remembered::Failure(failure)), _) => Err(error_of(failure)),
        _ => Err(StorageError::Internal(
            "a request id was reused for another kind of change".into(),
        )),
    }
}

// Forwarding.

pub(crate) fn forward_request_of(request: &Request) -> pb::ForwardRequest {
    let request = match request {
        Request::Change(tagged) => match &tagged.change {
            Change::Write(resource, condition) => {
                PbRequest::WriteCas(write_cas(resource, *condition, tagged))
            }
            Change::Delete { id, version } => PbRequest::DeleteCas(delete_cas(id, version, tagged)),
        },
        Request::Read(id) => PbRequest::Read(id.clone()),
        Request::List(query) => PbRequest::List(pb::ListQuery {
            group: query.resource_type.group.clone(),
            kind: query.resource_type.kind.clone(),
            tenancy: Some(query.tenancy.clone()),
            name_prefix: query.name_prefix.clone(),
        }),
        Request::ReadIndex => PbRequest::ReadIndex(pb::ReadIndex {}),
    };
    pb::ForwardRequest {
        request: Some(request),
    }
}

pub(crate) fn request_of(request: pb::ForwardRequest) -> Result<Request, CodecError> {
    const WHAT: &str = "forwarded request";
    Ok(
        match request
            .request
            .ok_or_else(|| shape(WHAT, "empty request"))?
        {
            PbRequest::WriteCas(write) => Request::Change(change_of_write(write)?),
            PbRequest::DeleteCas(delete) => Request::Change(change_of_delete(delete)?),
            PbRequest::Read(id) => Request::Read(id),
            PbRequest::List(query) => Request::List(ListQuery {
                resource_type: UnversionedType {
                    group: query.group,
                    kind: query.kind,
                },
                tenancy: query
                    .tenancy
                    .ok_or_else(|| shape(WHAT, "list without a tenancy"))?,
                name_prefix: query.name_prefix,
            }),
            PbRequest::ReadIndex(_) => Request::ReadIndex,
        },
    )
}

pub(crate) fn forward_response_of(reply: &ReplyResult) -> pb::ForwardResponse {
    let response = match reply {
        Ok(Reply::Resource(resource)) => PbResponse::Resource(resource.clone()),
        Ok(Reply::Resources(resources)) => PbResponse::Resources(pb::Resources {
            resources: resources.clone(),
        }),
        Ok(Reply::Done) => PbResponse::Done(pb::Done {}),
        Ok(Reply::ReadIndex(index)) => PbResponse::ReadIndex(*index),
        Err(error) => PbResponse::Failure(failure_of(error)),
    };
    pb::ForwardResponse {
        response: Some(response),
    }
}

/// The reply carried by a `ForwardResponse`; a malformed one is an internal error.
pub(crate) fn reply_of(response: pb::ForwardResponse) -> ReplyResult {
    match response.response {
        Some(PbResponse::Resource(resource)) => Ok(Reply::Resource(resource)),
        Some(PbResponse::Resources(list)) => Ok(Reply::Resources(list.resources)),
        Some(PbResponse::Done(_)) => Ok(Reply::Done),
        Some(PbResponse::ReadIndex(index)) => Ok(Reply::ReadIndex(index)),
        Some(PbResponse::Failure(failure)) => Err(error_of(failure)),
        None => Err(StorageError::Internal(
            "the leader sent an empty forward response".into(),
        )),
    }
}

// Storage errors on the wire.

/// `StorageFailure.reason` of a change naming a partition or namespace that does not exist.
const TENANCY_NOT_FOUND: &str = proto::reason::Reason::TenancyNotFound.as_str();
/// `StorageFailure.reason` of a change fenced off by a token or policy change (else a Type's).
const ACL_CHANGED: &str = proto::reason::Reason::AclChanged.as_str();
const SCHEMA_CHANGED: &str = proto::reason::Reason::SchemaChanged.as_str();
/// `StorageFailure.reason` of a write whose lease changed hands (DESIGN §16).
const LEASE_FENCED: &str = proto::reason::Reason::Fenced.as_str();
/// `StorageFailure.reason` of a change refused field by field (`violations`).
const INVALID: &str = proto::reason::Reason::Invalid.as_str();
/// `StorageFailure.reason` of a change a quota refused (`quota_exceeded`).
const QUOTA_EXCEEDED: &str = proto::reason::Reason::QuotaExceeded.as_str();

pub(crate) fn failure_of(error: &StorageError) -> pb::StorageFailure {
    let (code, stored) = match error {
        StorageError::NotFound => (Code::NotFound, None),
        StorageError::CasFailure => (Code::CasFailure, None),
        StorageError::WrongUid => (Code::WrongUid, None),
        StorageError::GroupVersionMismatch { stored } => {
            (Code::GroupVersionMismatch, Some((**stored).clone()))
        }
        StorageError::Inconsistent(_) => (Code::Inconsistent, None),
        StorageError::WatchClosed(_) => (Code::WatchClosed, None),
        StorageError::ResumeUnavailable(_) => (Code::ResumeUnavailable, None),
        // REJECTED (what earlier builds read), refined by `reason`.
        StorageError::Rejected(_) | StorageError::MissingTenancy(_) | StorageError::Invalid(_) => {
            (Code::Rejected, None)
        }
        StorageError::NoSpace(_) | StorageError::QuotaExceeded(_) => (Code::NoSpace, None),
        StorageError::CatchingUp(_) => (Code::CatchingUp, None),
        StorageError::Removed(_) => (Code::Removed, None),
        // Sent as INCONSISTENT, which peers of every build retry on the next leader (one of
        // an earlier build reads SHUTTING_DOWN as a storage failure, final); read either way.
        StorageError::ShuttingDown(_) => (Code::Inconsistent, None),
        StorageError::Damaged(_) => (Code::Damaged, None),
        StorageError::Fenced(_) => (Code::Fenced, None),
        StorageError::HistoryGone(_) => (Code::HistoryGone, None),
        StorageError::Internal(_) => (Code::Internal, None),
    };
    let message = match error {
        StorageError::Inconsistent(why)
        | StorageError::WatchClosed(why)
        | StorageError::ResumeUnavailable(why)
        | StorageError::Rejected(why)
        | StorageError::MissingTenancy(why)
        | StorageError::NoSpace(why)
        | StorageError::ShuttingDown(why)
        | StorageError::Damaged(why)
        | StorageError::HistoryGone(why)
        | StorageError::Internal(why) => why.clone(),
        StorageError::CatchingUp(progress) => progress.why.clone(),
        StorageError::Removed(removal) => removal.why.clone(),
        StorageError::Fenced(fenced) => fenced.why.clone(),
        StorageError::Invalid(invalid) => invalid.to_string(),
        other => other.to_string(),
    };
    let (applied, target) = match error {
        StorageError::CatchingUp(progress) => (progress.applied, progress.target),
        StorageError::Fenced(fenced) => (Some(fenced.at), None),
        _ => (None, None),
    };
    let reason = match error {
        StorageError::MissingTenancy(_) => TENANCY_NOT_FOUND.to_owned(),
        StorageError::Fenced(Fenced {
            kind: FenceKind::Acl,
            ..
        }) => ACL_CHANGED.to_owned(),
        StorageError::Fenced(Fenced {
            kind: FenceKind::Lease,
            ..
        }) => LEASE_FENCED.to_owned(),
        StorageError::Fenced(_) => SCHEMA_CHANGED.to_owned(),
        StorageError::Invalid(_) => INVALID.to_owned(),
        StorageError::QuotaExceeded(_) => QUOTA_EXCEEDED.to_owned(),
        _ => String::new(),
    };
    let quota_exceeded = match error {
        StorageError::QuotaExceeded(q) => Some(pb::storage_failure::QuotaExceeded {
            quota: q.quota.clone(),
            key: q.key.clone(),
            limit: q.limit,
            used: q.used,
            wanted: q.wanted,
        }),
        _ => None,
    };
    let violations = match error {
        StorageError::Invalid(invalid) => invalid
            .0
            .iter()
            .map(|violation| pb::storage_failure::FieldViolation {
                field: violation.field.clone(),
                message: violation.message.clone(),
            })
            .collect(),
        _ => Vec::new(),
    };
    pb::StorageFailure {
        code: code as i32,
        message,
        stored,
        applied,
        target,
        reason,
        violations,
        quota_exceeded,
    }
}

pub(crate) fn error_of(failure: pb::StorageFailure) -> StorageError {
    match Code::try_from(failure.code).unwrap_or(Code::Internal) {
        Code::NotFound => StorageError::NotFound,
        Code::CasFailure => StorageError::CasFailure,
        Code::WrongUid => StorageError::WrongUid,
        Code::GroupVersionMismatch => StorageError::GroupVersionMismatch {
            stored: Box::new(failure.stored.unwrap_or_default()),
        },
        Code::Inconsistent => StorageError::Inconsistent(failure.message),
        Code::WatchClosed => StorageError::WatchClosed(failure.message),
        Code::ResumeUnavailable => StorageError::ResumeUnavailable(failure.message),
        Code::Rejected if failure.reason == TENANCY_NOT_FOUND => {
            StorageError::MissingTenancy(failure.message)
        }
        Code::Rejected if failure.reason == INVALID && !failure.violations.is_empty() => {
            StorageError::Invalid(crate::resource::Invalid(
                failure
                    .violations
                    .into_iter()
                    .map(|v| crate::resource::FieldViolation::new(v.field, v.message))
                    .collect(),
            ))
        }
        Code::Rejected => StorageError::Rejected(failure.message),
        Code::NoSpace => match failure.quota_exceeded {
            Some(q) if failure.reason == QUOTA_EXCEEDED => {
                StorageError::QuotaExceeded(crate::storage::quota::QuotaExceeded {
                    quota: q.quota,
                    key: q.key,
                    limit: q.limit,
                    used: q.used,
                    wanted: q.wanted,
                })
            }
            _ => StorageError::NoSpace(failure.message),
        },
        Code::CatchingUp => StorageError::CatchingUp(crate::storage::CatchingUp {
            why: failure.message,
            applied: failure.applied,
            target: failure.target,
        }),
        Code::Removed => StorageError::Removed(failure.message.into()),
        Code::ShuttingDown => StorageError::ShuttingDown(failure.message),
        Code::Damaged => StorageError::Damaged(failure.message),
        Code::Fenced => StorageError::Fenced(Fenced {
            kind: match failure.reason.as_str() {
                ACL_CHANGED => FenceKind::Acl,
                LEASE_FENCED => FenceKind::Lease,
                _ => FenceKind::Schema,
            },
            why: failure.message,
            at: failure.applied.unwrap_or_default(),
        }),
        Code::HistoryGone => StorageError::HistoryGone(failure.message),
        Code::Internal | Code::Unspecified => StorageError::Internal(failure.message),
    }
}

#[cfg(test)]
mod tests;
