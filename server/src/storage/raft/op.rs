//! The raft layer's vocabulary: what a log entry asks the state machine to do ([`Op`]), what
//! applying it produced ([`Outcome`]), and what a follower asks the leader over `Forward`
//! ([`Request`], [`Reply`]). Typed values only; [`super::codec`] is the one place that turns them
//! into protobuf and back.

// A resource is a few hundred bytes inline; these values are moved a handful of times per
// request, so boxing the large variants would only add allocations.
#![allow(clippy::large_enum_variant)]

use std::sync::Arc;

use proto::resource::v1::{Id, Resource, Tenancy};

use crate::storage::history::Keep;
use crate::storage::{Fence, StorageError, UnversionedType, WriteCondition};

/// One resource change, checked against the stored resource when it is applied.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Store `resource` if its `version` is the stored one (empty: it must not exist yet), or
    /// under the looser [`WriteCondition::Merged`]. Shared: the request is kept for a retry
    /// while its proposal, the log's cache and apply each hold it, and none of them copies it.
    Write(Arc<Resource>, WriteCondition),
    /// Delete the resource stored under `id` if its version is `version` (another uid, or
    /// nothing stored: a no-op).
    Delete { id: Id, version: String },
}

impl Change {
    /// The resource or id the change is about.
    pub fn id(&self) -> Option<&Id> {
        match self {
            Change::Write(resource, _) => resource.id.as_ref(),
            Change::Delete { id, .. } => Some(id),
        }
    }

    /// Encoded bytes of what the change carries, for batch budgets.
    pub fn size(&self) -> usize {
        match self {
            Change::Write(resource, _) => prost::Message::encoded_len(&**resource),
            Change::Delete { id, version } => prost::Message::encoded_len(id) + version.len(),
        }
    }
}

/// Identifies a change across retries: chosen once where the request arrives at storage, sent
/// with every forward and proposal of it, remembered by the state machine after it is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(pub ulid::Ulid);

impl RequestId {
    pub fn new() -> Self {
        RequestId(ulid::Ulid::new())
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_bytes()
    }
}

impl Default for RequestId {
    fn default() -> Self {
        Self::new()
    }
}

/// A change, the request it belongs to (none for entries written before request ids), who
/// made it (empty for entries written before actors) and what it was checked against (empty
/// for entries written before fences).
#[derive(Clone, Debug, PartialEq)]
pub struct Tagged {
    pub request_id: Option<RequestId>,
    pub change: Change,
    pub actor: String,
    pub fence: Fence,
    /// How the change is kept in its object's history (none: not kept; entries of earlier
    /// builds).
    pub keep: Option<Keep>,
}

impl Tagged {
    /// A change of a new request, made by `actor`.
    pub fn new(change: Change, actor: &str) -> Self {
        Tagged {
            request_id: Some(RequestId::new()),
            change,
            actor: actor.to_owned(),
            fence: Fence::default(),
            keep: None,
        }
    }

    /// The same change, kept in history with `keep`.
    pub fn kept(mut self, keep: Option<Keep>) -> Self {
        self.keep = keep;
        self
    }

    /// The same change, checked against `fence`.
    pub fn fenced(mut self, fence: &Fence) -> Self {
        self.fence = fence.clone();
        self
    }

    /// A change of a new request, made by a test.
    #[cfg(test)]
    pub fn by_test(change: Change) -> Self {
        Self::new(change, "test")
    }
}

/// The payload of a normal log entry.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Changes applied in order; the `n`th (0-based) is stamped with version `index.n` (`index`
    /// for the first), so one unbatched change's version is exactly its log index.
    Changes(Vec<Tagged>),
    /// An operator restore, in several entries so none is large: begin clears a staging area,
    /// chunks fill it, commit replaces the whole state with it in one transaction.
    RestoreBegin {
        restore_id: String,
    },
    RestoreChunk {
        restore_id: String,
        resources: Vec<Resource>,
        /// The restored objects' history entries, each with its expiry (ms since the epoch).
        history: Vec<(proto::resource::v1::HistoryEntry, i64)>,
    },
    RestoreCommit {
        restore_id: String,
    },
}

impl Op {
    /// Resource writes and deletes the entry carries (for log statistics).
    pub fn change_count(&self) -> usize {
        match self {
            Op::Changes(changes) => changes.len(),
            _ => 0,
        }
    }
}

/// What applying one change (or one restore step) came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// The stored copy, with its new version.
    Written(Resource),
    /// Deleted, nothing to delete, or a restore step done.
    Done,
}

/// The result of one change: applied, or refused (CAS and uid conflicts, changes that cannot be
/// stored). A refusal is part of the replicated outcome, never a failure of the state machine.
pub type ChangeResult = Result<Applied, StorageError>;

/// What applying an entry produced: one result per change of [`Op::Changes`], one for a restore
/// step, none for blank and membership entries.
#[derive(Clone, Debug, Default)]
pub struct Outcome(pub Vec<ChangeResult>);

impl Outcome {
    pub fn one(result: ChangeResult) -> Self {
        Outcome(vec![result])
    }

    /// The only result of an entry that carried one change or restore step.
    pub fn single(self) -> ChangeResult {
        let mut results = self.0;
        match (results.pop(), results.is_empty()) {
            (Some(result), true) => result,
            (found, _) => Err(StorageError::Internal(format!(
                "expected one result from the state machine, got {}",
                results.len() + usize::from(found.is_some())
            ))),
        }
    }
}

/// A list query served on the leader.
#[derive(Clone, Debug, PartialEq)]
pub struct ListQuery {
    pub resource_type: UnversionedType,
    pub tenancy: Tenancy,
    pub name_prefix: String,
}

/// What a follower asks the leader to do for it.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Change(Tagged),
    /// A linearizable read. This build reads at a read index instead and never sends it; it
    /// is served for peers of earlier builds during a rolling upgrade.
    Read(Id),
    /// A linearizable list (as [`Request::Read`]: served, never sent).
    List(ListQuery),
    /// Confirm leadership and return the index every linearizable read must wait for.
    ReadIndex,
}

/// The leader's answer to a [`Request`].
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Resource(Resource),
    Resources(Vec<Resource>),
    Done,
    ReadIndex(u64),
}

/// What a forwarded request came to.
pub type ReplyResult = Result<Reply, StorageError>;

impl From<Applied> for Reply {
    fn from(applied: Applied) -> Self {
        match applied {
            Applied::Written(resource) => Reply::Resource(resource),
            Applied::Done => Reply::Done,
        }
    }
}

/// Reads the reply a request for one resource expects.
pub fn expect_resource(reply: ReplyResult) -> Result<Resource, StorageError> {
    match reply? {
        Reply::Resource(resource) => Ok(resource),
        other => Err(unexpected(&other)),
    }
}

/// Reads the reply a delete expects.
pub fn expect_done(reply: ReplyResult) -> Result<(), StorageError> {
    match reply? {
        Reply::Done => Ok(()),
        other => Err(unexpected(&other)),
    }
}

/// Reads the reply a read-index request expects.
pub fn expect_read_index(reply: ReplyResult) -> Result<u64, StorageError> {
    match reply? {
        Reply::ReadIndex(index) => Ok(index),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(reply: &Reply) -> StorageError {
    let what = match reply {
        Reply::Resource(_) => "a resource",
        Reply::Resources(_) => "a list",
        Reply::Done => "done",
        Reply::ReadIndex(_) => "a read index",
    };
    StorageError::Internal(format!(
        "the leader answered with {what}, which the request did not ask for"
    ))
}
