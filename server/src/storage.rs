//! The storage contract ([`Backend`]) the resource service is written against, and its
//! implementations: [`inmem::InMemBackend`] (tests, single process) and, later, the Raft backend.
//!
//! Storage is deliberately dumb: it knows ids, versions and owners, not types, hooks, ACLs or
//! tenancy rules. Resources are keyed without their group version: one stored object per
//! (group, kind, partition, namespace, name), whatever version last wrote it.

use std::ops::ControlFlow;
use std::pin::Pin;

use async_trait::async_trait;
use futures::Stream;
use proto::resource::v1::{Id, Resource, Tenancy};

pub(crate) mod check;
#[cfg(test)]
pub(crate) mod conformance;
pub(crate) mod deadline;
pub(crate) mod events;
pub mod history;
pub(crate) mod inmem;
pub mod projection;
pub(crate) mod quota;
pub mod raft;

pub use projection::{Projection, ProjectionSource};

/// What a write requires of the stored resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteCondition {
    /// Compare-and-swap: the stored version is the write's `version` (empty: nothing is stored).
    #[default]
    Version,
    /// A blind write merged from the stored resource at the write's `version`: also accepted
    /// over a later version of the same resource (same uid) whose owner, statuses and
    /// finalizers are still the ones the write carries and that neither is marked for deletion —
    /// everything the service's merge took from the stored resource, so storing it is what a
    /// retry of the blind write would store.
    Merged,
}

/// How fresh a read must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Consistency {
    /// Whatever this node has applied; may lag the leader.
    #[default]
    Eventual,
    /// Linearizable: reflects every write acknowledged before the read began.
    Strong,
}

/// A type without its group version: the unit storage lists and watches.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnversionedType {
    pub group: String,
    pub kind: String,
}

impl UnversionedType {
    pub fn of(resource_type: &proto::resource::v1::Type) -> Self {
        UnversionedType {
            group: resource_type.group.clone(),
            kind: resource_type.kind.clone(),
        }
    }
}

pub use crate::resource::Version;

/// What a change was checked against (DESIGN §15, "the fence"): the state each of its guards
/// names must still be as it was when the service checked the change, or apply refuses it with
/// [`StorageError::Fenced`] and the service checks it again. Empty: nothing to hold (a server's
/// own write, a tool's, a test's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fence {
    pub guards: Vec<Guard>,
}

impl Fence {
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }
}

/// One thing a change was checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guard {
    /// The resource under `key` is still stored at `version` (the registration of a registered
    /// type: its Type resource).
    Resource { key: StorageKey, version: String },
    /// No resource of the domain changed after `revision` (every Type, for a change to a Type;
    /// every token and policy, for a change a token authorized).
    Domain { domain: Domain, revision: Version },
    /// The `coordination.v1.Lease` under `key` exists and has changed hands exactly
    /// `transitions` times: the writer still holds it (DESIGN §16's fenced writes).
    Lease { key: StorageKey, transitions: u64 },
}

/// A set of resources whose last change the state machine records ([`Guard::Domain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Domain {
    /// `registry.v1.Type`: what the registry is made of.
    Types,
    /// `acl.v1.Token` and `acl.v1.Policy`: what a token's grants are made of.
    Acl,
    /// `policy.v1.AdmissionPolicy`: what a write of any other type is admitted by.
    Policies,
}

impl Domain {
    pub const ALL: [Domain; 3] = [Domain::Types, Domain::Acl, Domain::Policies];

    /// The domain a resource of `group`/`kind` belongs to.
    pub fn of(group: &str, kind: &str) -> Option<Domain> {
        match (group, kind) {
            ("registry", "Type") => Some(Domain::Types),
            ("acl", "Token" | "Policy") => Some(Domain::Acl),
            ("policy", "AdmissionPolicy") => Some(Domain::Policies),
            _ => None,
        }
    }

    /// Its name on the wire and in the state machine's records.
    pub fn name(self) -> &'static str {
        match self {
            Domain::Types => "types",
            Domain::Acl => "acl",
            Domain::Policies => "policies",
        }
    }

    pub fn from_name(name: &str) -> Option<Domain> {
        Domain::ALL.into_iter().find(|domain| domain.name() == name)
    }

    /// What a refusal on it is about.
    pub fn fenced(self) -> FenceKind {
        match self {
            Domain::Types | Domain::Policies => FenceKind::Schema,
            Domain::Acl => FenceKind::Acl,
        }
    }
}

/// What moved under a fenced change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceKind {
    /// A Type (its schema, rules or deletion): reason `SCHEMA_CHANGED`.
    Schema,
    /// A token or policy: reason `ACL_CHANGED`.
    Acl,
    /// The lease the writer sent (`x-resd-fence`) changed hands or is gone: reason `FENCED`,
    /// final (the writer no longer holds it; the server never retries it).
    Lease,
}

/// A change refused because what it was checked against moved ([`Guard`]); nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fenced {
    pub kind: FenceKind,
    pub why: String,
    /// The log index (the version) at which it was refused: a node that has applied it has the
    /// state to check the change again.
    pub at: u64,
}

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The first guard of `fence` that the state no longer meets: `stored` is the version stored
/// under a key ("" when nothing is), `revision` a domain's last change, `lease` the
/// `transitions` of the lease stored under a key (`None`: no lease there, or one whose data
/// does not decode). Every backend decides with it, the same way.
pub fn check_fence(
    fence: &Fence,
    at: Version,
    mut stored: impl FnMut(&StorageKey) -> Result<String, StorageError>,
    revision: impl Fn(Domain) -> Version,
    mut lease: impl FnMut(&StorageKey) -> Result<Option<u64>, StorageError>,
) -> Result<(), StorageError> {
    for guard in &fence.guards {
        let refused = match guard {
            Guard::Resource { key, version } => {
                let now = stored(key)?;
                (now != *version).then(|| Fenced {
                    kind: FenceKind::Schema,
                    why: format!(
                        "{}/{} {:?} changed (from version {:?} to {:?}) after this change was checked against it",
                        key.group, key.kind, key.name, version, now
                    ),
                    at: at.index,
                })
            }
            Guard::Domain {
                domain,
                revision: checked,
            } => {
                let now = revision(*domain);
                (now > *checked).then(|| Fenced {
                    kind: domain.fenced(),
                    why: format!(
                        "the {} changed at version {now}, after this change was checked (at {checked})",
                        match domain {
                            Domain::Types => "registered types",
                            Domain::Acl => "ACL tokens and policies",
                            Domain::Policies => "admission policies",
                        }
                    ),
                    at: at.index,
                })
            }
            Guard::Lease { key, transitions } => {
                let now = lease(key)?;
                (now != Some(*transitions)).then(|| Fenced {
                    kind: FenceKind::Lease,
                    why: match now {
                        None => format!(
                            "fenced: the lease {}/{}/{} this write was sent under no longer exists (or cannot be read); its writer does not hold it",
                            key.partition, key.namespace, key.name
                        ),
                        Some(now) => format!(
                            "fenced: the lease {}/{}/{} changed hands since this writer took it (transitions {now}, the fence says {transitions}); another replica holds it now",
                            key.partition, key.namespace, key.name
                        ),
                    },
                    at: at.index,
                })
            }
        };
        if let Some(fenced) = refused {
            return Err(StorageError::Fenced(fenced));
        }
    }
    Ok(())
}

/// How many times the lease `resource` has changed hands, as [`Guard::Lease`] compares it;
/// `None` when it is not a `coordination.v1.Lease` or its data does not decode.
pub fn lease_transitions(resource: &Resource) -> Option<u64> {
    let is_lease = resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .is_some_and(|t| t.group == "coordination" && t.kind == "Lease");
    let data = resource.data.as_ref().filter(|_| is_lease)?;
    <proto::coordination::v1::Lease as prost::Message>::decode(data.value.as_slice())
        .ok()
        .map(|lease| lease.transitions)
}

/// The storage identity of a resource. Orders by type, then tenancy, then name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageKey {
    pub group: String,
    pub kind: String,
    pub partition: String,
    pub namespace: String,
    pub name: String,
}

impl StorageKey {
    pub fn of(id: &Id) -> Self {
        // Field by field: the type's group version and the tenancy's peer are not part of it.
        let (group, kind) = id
            .r#type
            .as_ref()
            .map(|t| (t.group.clone(), t.kind.clone()))
            .unwrap_or_default();
        let (partition, namespace) = id
            .tenancy
            .as_ref()
            .map(|t| (t.partition.clone(), t.namespace.clone()))
            .unwrap_or_default();
        StorageKey {
            group,
            kind,
            partition,
            namespace,
            name: id.name.clone(),
        }
    }

    /// Whether this key falls under a list or watch query.
    pub fn matches(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> bool {
        self.group == resource_type.group
            && self.kind == resource_type.kind
            && crate::resource::tenancy_matches(
                tenancy,
                &Tenancy {
                    partition: self.partition.clone(),
                    namespace: self.namespace.clone(),
                },
            )
            && self.name.starts_with(name_prefix)
    }
}

/// Storage errors. The resource service maps each to a gRPC code in one place.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    #[error("resource not found")]
    NotFound,
    #[error("CAS operation failed: the resource's version does not match the expected version")]
    CasFailure,
    #[error("uid doesn't match")]
    WrongUid,
    /// The resource exists, stored under another group version.
    #[error("resource is stored with group version {:?}", stored_version(.stored))]
    GroupVersionMismatch { stored: Box<Resource> },
    /// No quorum, no leader, or the leader cannot be reached.
    #[error("storage is inconsistent: {0}")]
    Inconsistent(String),
    /// The watch ended and cannot continue; the client must list again.
    #[error("watch closed: {0}")]
    WatchClosed(String),
    /// A watch cannot resume from the requested version (too old for the event history, or
    /// ahead of this node); the client must list again.
    #[error("cannot resume the watch: {0}")]
    ResumeUnavailable(String),
    /// This node serves no reads yet: it is catching up after an unclean stop (or lagging, or
    /// repairing).
    #[error("{0}")]
    CatchingUp(CatchingUp),
    /// This node was removed from the cluster and serves nothing.
    #[error("{0}")]
    Removed(Removal),
    /// This node is shutting down: another member can answer.
    #[error("{0}")]
    ShuttingDown(String),
    /// No room for the change now: the disk is under its reserve, or the state is at its
    /// quota (what and where, for people); nothing changed. Deletes free room.
    #[error("{0}")]
    NoSpace(String),
    /// The change cannot be stored (an invalid name or tenancy, a key longer than the store
    /// allows, a resource over the size limit); nothing changed.
    #[error("{0}")]
    Rejected(String),
    /// The change names a partition or namespace that does not exist (the leader's check of a
    /// forwarded change); nothing changed.
    #[error("{0}")]
    MissingTenancy(String),
    /// This node found its stored state damaged (a record failed its checksum): it serves
    /// nothing more from it and restarts to rebuild it. Another member can answer.
    #[error("{0}")]
    Damaged(String),
    /// What is wrong with the change, field by field (a peer's checks of a forwarded change);
    /// nothing changed.
    #[error("{0}")]
    Invalid(#[from] crate::resource::Invalid),
    /// What the change was checked against changed before it could apply ([`Fence`]);
    /// nothing changed. The service checks it again.
    #[error("{0}")]
    Fenced(Fenced),
    /// The change would take a namespace or partition past a quota (DESIGN §17); nothing
    /// changed. Deletes are never refused.
    #[error("{0}")]
    QuotaExceeded(quota::QuotaExceeded),
    /// A version older than the object's history keeps (what the oldest kept is).
    #[error("{0}")]
    HistoryGone(String),
    #[error("storage failure: {0}")]
    Internal(String),
}

/// Why a node serves no reads yet, and how far it has come (sent to clients as the metadata
/// of `CATCHING_UP`: `applied`, and `target` when it is known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchingUp {
    pub why: String,
    pub applied: Option<u64>,
    pub target: Option<u64>,
}

impl std::fmt::Display for CatchingUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl From<String> for CatchingUp {
    fn from(why: String) -> Self {
        CatchingUp {
            why,
            applied: None,
            target: None,
        }
    }
}

/// Why a node serves nothing any more: it was removed from its cluster (sent to clients as the
/// metadata of `REMOVED`: `by`, the node that removed it, when known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub why: String,
    pub by: Option<u64>,
}

impl Removal {
    /// The removal as a data directory records it (`raft/REMOVED`): the words, then `by=N`.
    pub(crate) fn to_marker(&self) -> String {
        match self.by {
            Some(by) => format!("{}\nby={by}\n", self.why),
            None => format!("{}\n", self.why),
        }
    }

    /// The removal a marker records (one written by an earlier build is the words alone).
    pub(crate) fn of_marker(text: &str) -> Removal {
        let mut lines = text.lines();
        let why = lines.next().unwrap_or_default().trim().to_owned();
        let by = lines
            .filter_map(|line| line.trim().strip_prefix("by="))
            .find_map(|by| by.parse().ok());
        Removal { why, by }
    }
}

impl std::fmt::Display for Removal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl From<String> for Removal {
    fn from(why: String) -> Self {
        Removal { why, by: None }
    }
}

fn stored_version(resource: &Resource) -> String {
    resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .map(|t| t.group_version.clone())
        .unwrap_or_default()
}

/// One event of a watch.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchEvent {
    /// The storage version at which the event happened.
    pub version: String,
    pub operation: Operation,
    /// Who made the change (empty for a watch's snapshot, and for changes before actors).
    pub actor: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Operation {
    Upsert(Resource),
    /// Carries the last stored resource.
    Delete(Resource),
    /// The snapshot of matching resources is complete.
    EndOfSnapshot,
    /// Nothing the watcher asked for changed up to the event's version. Storage makes one only
    /// for a watch that asked for progress ([`WatchOptions::progress`]) and publishes none; the
    /// service makes the bookmarks a watcher receives from them.
    Bookmark,
}

/// What a watch asks for beyond its type, tenancy, name prefix and resume point.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    /// Only resources whose metadata the selector selects, as the watcher sees them (evaluated
    /// where the changes are, before anything is queued for the watcher): a resource that
    /// starts matching arrives as an Upsert, one that stops matching as a Delete.
    pub selector: Option<proto::selector::Selector>,
    /// When the watch goes past changes that are not for it, an [`Operation::Bookmark`] with
    /// the version it went past (at most one per look at the history).
    pub progress: bool,
}

/// A watch event as watchers receive it: one copy shared by every watcher of the change (the
/// history holds it too), with a slot for its wire encoding, so that a server with many watchers
/// encodes each change once.
#[derive(Clone, Debug)]
pub struct SharedEvent(std::sync::Arc<SharedInner>);

#[derive(Debug)]
struct SharedInner {
    event: WatchEvent,
    wire: std::sync::OnceLock<bytes::Bytes>,
    /// Its line in an NDJSON watch (the HTTP API), made once like `wire`.
    json_line: std::sync::OnceLock<bytes::Bytes>,
    /// While the event is in a history: where its encoding's size is counted, and how much was.
    counted: std::sync::Mutex<Counted>,
}

#[derive(Debug, Default)]
struct Counted {
    into: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
    bytes: usize,
}

/// A [`SharedEvent`] that does not keep it alive.
#[derive(Debug, Clone)]
pub struct WeakEvent(std::sync::Weak<SharedInner>);

impl WeakEvent {
    pub fn upgrade(&self) -> Option<SharedEvent> {
        self.0.upgrade().map(SharedEvent)
    }
}

impl SharedEvent {
    /// Whether both are the same shared event (not merely equal ones).
    pub fn same(&self, other: &SharedEvent) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    pub fn downgrade(&self) -> WeakEvent {
        WeakEvent(std::sync::Arc::downgrade(&self.0))
    }

    pub fn new(event: WatchEvent) -> SharedEvent {
        SharedEvent(std::sync::Arc::new(SharedInner {
            event,
            wire: std::sync::OnceLock::new(),
            json_line: std::sync::OnceLock::new(),
            counted: std::sync::Mutex::default(),
        }))
    }

    /// An event kept in a history whose byte count is `into`: the encoding, once made, is
    /// added to it, until [`SharedEvent::leave_history`].
    pub fn in_history(
        event: WatchEvent,
        into: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ) -> SharedEvent {
        let shared = SharedEvent::new(event);
        shared.counted().into = Some(into);
        shared
    }

    /// The history dropped the event: takes its encoding's size back out of the count.
    pub fn leave_history(&self) {
        let mut counted = self.counted();
        if let Some(into) = counted.into.take() {
            into.fetch_sub(counted.bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn counted(&self) -> std::sync::MutexGuard<'_, Counted> {
        self.0.counted.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn event(&self) -> &WatchEvent {
        &self.0.event
    }

    /// The event, copied only if someone else holds it too.
    pub fn into_event(self) -> WatchEvent {
        match std::sync::Arc::try_unwrap(self.0) {
            Ok(inner) => inner.event,
            Err(shared) => shared.event.clone(),
        }
    }

    /// The event's wire encoding: made by `encode` for the first watcher that asks, then shared.
    /// The encoding depends only on the event (never on who watches), so every caller must pass
    /// the same `encode`.
    pub fn wire(&self, encode: impl FnOnce(&WatchEvent) -> bytes::Bytes) -> bytes::Bytes {
        self.0
            .wire
            .get_or_init(|| self.counted_encoding(encode))
            .clone()
    }

    /// The event's line in an NDJSON watch, shared like [`SharedEvent::wire`].
    pub fn json_line(&self, encode: impl FnOnce(&WatchEvent) -> bytes::Bytes) -> bytes::Bytes {
        self.0
            .json_line
            .get_or_init(|| self.counted_encoding(encode))
            .clone()
    }

    /// An encoding of the event, its size counted in the history that holds the event.
    fn counted_encoding(&self, encode: impl FnOnce(&WatchEvent) -> bytes::Bytes) -> bytes::Bytes {
        let bytes = encode(&self.0.event);
        let mut counted = self.counted();
        if let Some(into) = &counted.into {
            into.fetch_add(bytes.len(), std::sync::atomic::Ordering::Relaxed);
            counted.bytes += bytes.len();
        }
        bytes
    }

    /// `bytes` (one of this event's encodings) holding the event alive while they live: a
    /// connection that queues them keeps the event shareable with other watchers of its version
    /// instead of leaving them to make their own.
    pub fn holding(&self, bytes: bytes::Bytes) -> bytes::Bytes {
        struct Held {
            bytes: bytes::Bytes,
            _event: SharedEvent,
        }
        impl AsRef<[u8]> for Held {
            fn as_ref(&self) -> &[u8] {
                &self.bytes
            }
        }
        bytes::Bytes::from_owner(Held {
            bytes,
            _event: self.clone(),
        })
    }
}

impl std::ops::Deref for SharedEvent {
    type Target = WatchEvent;

    fn deref(&self) -> &WatchEvent {
        &self.0.event
    }
}

impl PartialEq for SharedEvent {
    fn eq(&self, other: &Self) -> bool {
        self.event() == other.event()
    }
}

/// A stream of watch events: a snapshot, one `EndOfSnapshot`, then changes in commit order. An
/// error ends it.
pub type Watch = Pin<Box<dyn Stream<Item = Result<SharedEvent, StorageError>> + Send>>;

/// A store of resources with compare-and-swap writes and watches.
///
/// # Consistency
/// `read` and `list` take a [`Consistency`]. After a watch delivered an event, a read on the same
/// node returns that version or a newer one: events are published after the write commits.
///
/// # CAS
/// Every write is a compare-and-swap on `version`; an empty expected version means "create".
/// The uid is compared before the version: writing over a resource with another uid is
/// [`StorageError::WrongUid`] whatever the version.
///
/// # Identity
/// Objects are keyed without their group version. `read` with another group version returns
/// [`StorageError::GroupVersionMismatch`] carrying the stored resource; `list` and `watch_list`
/// return every version and leave filtering to the caller.
///
/// # Errors
/// [`StorageError::NotFound`], [`StorageError::CasFailure`], [`StorageError::WrongUid`],
/// [`StorageError::GroupVersionMismatch`], [`StorageError::Inconsistent`],
/// [`StorageError::WatchClosed`].
///
/// Every implementation passes the suite in [`conformance`].
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Reads one resource. An empty uid in `id` matches whatever is stored; another uid is
    /// `NotFound`.
    async fn read(&self, consistency: Consistency, id: &Id) -> Result<Resource, StorageError>;

    /// [`Backend::read`] as stored: the resource's encoding, not decoded (only its id is, to
    /// apply the read rules). No default: a wrapper that forgot to forward it would decode and
    /// encode again.
    async fn read_encoded(
        &self,
        consistency: Consistency,
        id: &Id,
    ) -> Result<Vec<u8>, StorageError>;

    /// Writes `resource` if its `version` equals the stored version (empty: must not exist)
    /// and every guard of `fence` holds. The uid must be set. Returns the stored copy with its
    /// new version. `actor` (who made the change) is recorded with it and reported by watches.
    async fn write_cas_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError>;

    /// A blind write the service merged from the stored resource at `resource.version`: as
    /// [`Backend::write_cas_as`], and also stored over a later version of the same resource when
    /// nothing the merge took from the stored one has changed since
    /// ([`WriteCondition::Merged`]). Concurrent blind writes to one resource then all land
    /// (in log order) instead of retrying each lost race.
    async fn write_merged_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError>;

    /// Deletes the resource if `version` matches and `fence` holds. Missing resource or other
    /// uid: `Ok`, nothing deleted. `actor` as for [`Backend::write_cas_as`].
    async fn delete_cas_as(
        &self,
        id: &Id,
        version: &str,
        actor: &str,
        fence: &Fence,
    ) -> Result<(), StorageError>;

    /// [`Backend::write_cas_as`] by nobody in particular (tests, tools).
    async fn write_cas(&self, resource: Resource) -> Result<Resource, StorageError> {
        self.write_cas_as(resource, "", &Fence::default()).await
    }

    /// [`Backend::delete_cas_as`] by nobody in particular (tests, tools).
    async fn delete_cas(&self, id: &Id, version: &str) -> Result<(), StorageError> {
        self.delete_cas_as(id, version, "", &Fence::default()).await
    }

    /// Returns once this node has applied every change acknowledged before the call (a read
    /// index): its projections are then at least as new as any a client has seen.
    async fn sync(&self) -> Result<(), StorageError>;

    /// Keeps `projection` on this node's state from now on: reset from what is stored, then
    /// told every committed change it follows, in commit order, under the lock that publishes
    /// watch events; reset again when the whole state is replaced (DESIGN §15).
    fn project(&self, projection: std::sync::Arc<dyn Projection>) -> Result<(), StorageError>;

    /// Every resource of the type (all group versions) whose tenancy matches (fields may be
    /// `*`) and whose name starts with `name_prefix`, ordered by tenancy and name.
    async fn list(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError>;

    /// What [`Backend::list`] returns, each resource in its protobuf encoding, handed to `sink`
    /// in the same order: a backend that stores encoded resources hands them over as they are,
    /// while it holds its read (a List answers without decoding and encoding every one, and
    /// without a copy per resource). With `after`, only what comes after that key (a paged
    /// listing continuing). No default: a wrapper that forgot to forward it would quietly
    /// decode and encode again.
    async fn list_encoded(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        after: Option<&StorageKey>,
        sink: &mut dyn EncodedSink,
    ) -> Result<(), StorageError>;

    /// The resources whose owner is `owner`, uid included (tenancy fields of `owner` may be `*`). Children outlive their owner here;
    /// cascading deletion is the reaper's job.
    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError>;

    /// Watches the resources `list` would return: a snapshot of them, `EndOfSnapshot`, then
    /// every change in commit order. With `since`, no snapshot: the changes after version
    /// `since` that this node still remembers, `EndOfSnapshot`, then new changes; if it no longer
    /// remembers all of them, [`StorageError::ResumeUnavailable`].
    async fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<Version>,
        options: WatchOptions,
    ) -> Result<Watch, StorageError>;

    /// The stamp of resource group `group` on this node ([`events::GroupStamps`]): it moves
    /// after every change to a resource of the group becomes readable here, and when the whole
    /// state is replaced. `None`: this backend keeps no stamps (nothing may be cached). No
    /// default: a wrapper that forgot to forward it would turn caching off.
    fn group_stamp(&self, group: &str) -> Option<u64>;

    /// From now on, keeps every change in its object's history as `policy` says (DESIGN §18):
    /// the retention of the change's type and the time, chosen as the change is made and
    /// carried with it. Until called, every type keeps the defaults.
    fn keep_history(&self, policy: std::sync::Arc<dyn history::HistoryPolicy>);

    /// A page of the history of the object `uid`, newest first: at most `limit` entries of
    /// versions older than `before` (none: from the newest).
    async fn history(
        &self,
        consistency: Consistency,
        uid: &str,
        before: Option<Version>,
        limit: usize,
    ) -> Result<history::Page, StorageError>;

    /// Why a default (eventual) read answered now may be stale: this node knows no leader.
    /// `None` when it follows one (or has no leader to follow).
    fn stale_reads(&self) -> Option<String> {
        None
    }
}

/// Checks a finished resource that reaches storage without passing through the node's own
/// resource service — a change a peer forwarded — as that service checks its writes: a
/// registered type and data, the scope's tenancy rules, the type's validation, a tenancy that
/// exists, and [`check::check_storable`]. Implemented by the resource service; the raft network
/// calls it before it proposes anything.
#[async_trait]
pub trait Admission: Send + Sync + 'static {
    /// `Err(StorageError::Rejected)` with what is wrong; `Inconsistent` when it cannot tell now.
    async fn admit(&self, resource: &Resource) -> Result<(), StorageError>;
}

/// The read rules every backend applies to what it found under an id's name: another uid is
/// `NotFound`, another group version is `GroupVersionMismatch` carrying the stored resource.
pub fn check_read(id: &Id, stored: Resource) -> Result<Resource, StorageError> {
    let stored_id = stored.id.clone().unwrap_or_default();
    match read_rule(id, &stored_id) {
        ReadRule::Found => Ok(stored),
        ReadRule::OtherUid => Err(StorageError::NotFound),
        ReadRule::OtherVersion => Err(StorageError::GroupVersionMismatch {
            stored: Box::new(stored),
        }),
    }
}

/// Where [`Backend::list_encoded`] hands the listed resources, one encoding at a time.
pub trait EncodedSink: Send {
    /// Takes the next resource's encoding (borrowed from the backend's read: copy what is
    /// kept). `Break` ends the listing early; the sink keeps its own reason.
    fn take(&mut self, encoded: &[u8]) -> ControlFlow<()>;
}

/// Collects every encoding (tests and small callers).
impl EncodedSink for Vec<Vec<u8>> {
    fn take(&mut self, encoded: &[u8]) -> ControlFlow<()> {
        self.push(encoded.to_vec());
        ControlFlow::Continue(())
    }
}

/// A stored encoding that does not decode: the store is damaged there.
pub fn undecodable(error: prost::DecodeError) -> StorageError {
    StorageError::Internal(format!("a stored resource does not decode: {error}"))
}

/// [`check_read`] on a stored encoding: only the id is decoded (the whole resource only to
/// carry it in `GroupVersionMismatch`).
pub fn check_read_encoded(id: &Id, stored: Vec<u8>) -> Result<Vec<u8>, StorageError> {
    let stored_id = <crate::wire::proto::IdOnly as prost::Message>::decode(stored.as_slice())
        .map_err(undecodable)?
        .id
        .unwrap_or_default();
    match read_rule(id, &stored_id) {
        ReadRule::Found => Ok(stored),
        ReadRule::OtherUid => Err(StorageError::NotFound),
        ReadRule::OtherVersion => Err(StorageError::GroupVersionMismatch {
            stored: Box::new(
                <Resource as prost::Message>::decode(stored.as_slice()).map_err(undecodable)?,
            ),
        }),
    }
}

enum ReadRule {
    Found,
    OtherUid,
    OtherVersion,
}

fn read_rule(id: &Id, stored_id: &Id) -> ReadRule {
    if !id.uid.is_empty() && id.uid != stored_id.uid {
        return ReadRule::OtherUid;
    }
    let requested = id.r#type.as_ref().map(|t| t.group_version.as_str());
    let have = stored_id.r#type.as_ref().map(|t| t.group_version.as_str());
    if requested != have {
        return ReadRule::OtherVersion;
    }
    ReadRule::Found
}

/// A shared backend is a backend.
#[async_trait]
impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    async fn read(&self, consistency: Consistency, id: &Id) -> Result<Resource, StorageError> {
        (**self).read(consistency, id).await
    }
    async fn read_encoded(
        &self,
        consistency: Consistency,
        id: &Id,
    ) -> Result<Vec<u8>, StorageError> {
        (**self).read_encoded(consistency, id).await
    }
    async fn write_cas_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        (**self).write_cas_as(resource, actor, fence).await
    }
    async fn write_merged_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        (**self).write_merged_as(resource, actor, fence).await
    }
    async fn delete_cas_as(
        &self,
        id: &Id,
        version: &str,
        actor: &str,
        fence: &Fence,
    ) -> Result<(), StorageError> {
        (**self).delete_cas_as(id, version, actor, fence).await
    }
    async fn sync(&self) -> Result<(), StorageError> {
        (**self).sync().await
    }
    fn project(&self, projection: std::sync::Arc<dyn Projection>) -> Result<(), StorageError> {
        (**self).project(projection)
    }
    async fn list(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        (**self)
            .list(consistency, resource_type, tenancy, name_prefix)
            .await
    }
    async fn list_encoded(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        after: Option<&StorageKey>,
        sink: &mut dyn EncodedSink,
    ) -> Result<(), StorageError> {
        (**self)
            .list_encoded(
                consistency,
                resource_type,
                tenancy,
                name_prefix,
                after,
                sink,
            )
            .await
    }
    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError> {
        (**self).list_by_owner(owner).await
    }
    async fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<Version>,
        options: WatchOptions,
    ) -> Result<Watch, StorageError> {
        (**self)
            .watch_list(resource_type, tenancy, name_prefix, since, options)
            .await
    }
    fn group_stamp(&self, group: &str) -> Option<u64> {
        (**self).group_stamp(group)
    }
    fn keep_history(&self, policy: std::sync::Arc<dyn history::HistoryPolicy>) {
        (**self).keep_history(policy)
    }
    async fn history(
        &self,
        consistency: Consistency,
        uid: &str,
        before: Option<Version>,
        limit: usize,
    ) -> Result<history::Page, StorageError> {
        (**self).history(consistency, uid, before, limit).await
    }
    fn stale_reads(&self) -> Option<String> {
        (**self).stale_reads()
    }
}
