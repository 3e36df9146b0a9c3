//! [`EventLog`]: the watch events a backend publishes after each commit, a bounded history of
//! them for resuming watches, and the streams watchers read.
//!
//! A backend owns one `EventLog` under the same lock it commits with: it publishes after each
//! commit, and a new watcher takes its snapshot (or replay) and its place in the history under
//! that lock, so it sees every later change exactly once. The history is one ring, bounded by
//! count and by bytes; each watcher is a cursor into it. A publish wakes only the watchers the
//! change may concern ([`Interests`]: by type, or by a label their selector requires, in the
//! resource's labels before or after the change), so many watchers of other things cost a
//! commit nothing. A watcher whose next change for it has left the ring (it fell behind) gets an
//! error, never a gap, and nothing is held per watcher, not even what its selector matched (each
//! change carries the labels it replaced, as Kubernetes' watch cache keeps the previous object):
//! memory is the ring's, whatever the number of watchers and whatever they match.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use proto::resource::v1::{Resource, Tenancy};
use proto::selector::{Operator, Selector};
use tokio::sync::Notify;

use super::{
    Operation, SharedEvent, StorageError, StorageKey, UnversionedType, Version, Watch, WatchEvent,
    WatchOptions, WeakEvent,
};

/// A resource's labels (its metadata).
pub(crate) type Labels = BTreeMap<String, String>;

/// Changes kept for resuming watches (and for watchers that fall behind).
pub(crate) const DEFAULT_HISTORY: usize = 16 * 1024;
/// Bytes of changes kept at most, whatever their count.
pub(crate) const DEFAULT_HISTORY_BYTES: usize = 64 << 20;
/// Changes a watcher takes from the ring at a time.
const READ_BATCH: usize = 256;
/// What an item costs beyond its resource's encoded size.
const ITEM_OVERHEAD: usize = 192;
/// What one label an item keeps of what a change replaced costs beyond its text (a tree node).
const LABEL_OVERHEAD: usize = 64;

/// How much history an [`EventLog`] keeps: whichever bound is reached first evicts the oldest
/// change. The newest change is always kept, however large.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimits {
    pub changes: usize,
    pub bytes: usize,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            changes: DEFAULT_HISTORY,
            bytes: DEFAULT_HISTORY_BYTES,
        }
    }
}

/// One published change.
#[derive(Debug)]
struct Item {
    /// Position in the ring's sequence (contiguous, unlike versions).
    seq: u64,
    key: StorageKey,
    event: SharedEvent,
    /// An Upsert's labels before it, when it changed them (`None`: it created the resource or
    /// kept its labels; either way the labels before match as the labels after do).
    before: Option<Labels>,
    version: Version,
    bytes: usize,
}

/// The shared history every watcher reads.
#[derive(Debug)]
struct Ring {
    items: VecDeque<Arc<Item>>,
    /// The sequence number the next item gets.
    next_seq: u64,
    /// What the items cost, without their wire encodings.
    bytes: usize,
    /// The wire encodings watchers made of items still in the ring (see
    /// [`SharedEvent::in_history`]).
    wire_bytes: Arc<AtomicUsize>,
    limits: HistoryLimits,
    /// Every change after this version is in `items`.
    floor: Version,
    /// The newest change published (or the floor).
    latest: Version,
    /// The last reset: watchers that started before this sequence number end with the reason.
    reset: Option<(u64, String)>,
    /// Who to wake for what.
    interests: Interests,
    /// The log is gone (its backend shut down): every watch ends.
    closed: bool,
}

/// Which watchers a change may concern, so that a publish wakes those and not every watcher (a
/// node with 10,000 watches would otherwise poll 10,000 tasks per commit). Kept in the ring,
/// under its lock: a watcher registers when it starts and leaves when dropped.
#[derive(Debug, Default)]
struct Interests {
    next_id: u64,
    watchers: HashMap<u64, Interest>,
    /// Woken by every change of a type: group, then kind.
    by_type: PairIndex,
    /// Woken by a change whose resource carries a label, before or after the change: key,
    /// then value. A selected watch whose selector requires a key to have one of some values
    /// is indexed under those.
    by_label: PairIndex,
}

/// Watchers by a pair of strings, looked up without building a key.
#[derive(Debug, Default)]
struct PairIndex(HashMap<String, HashMap<String, HashSet<u64>>>);

impl PairIndex {
    fn insert(&mut self, first: &str, second: &str, id: u64) {
        self.0
            .entry(first.to_owned())
            .or_default()
            .entry(second.to_owned())
            .or_default()
            .insert(id);
    }

    fn remove(&mut self, first: &str, second: &str, id: u64) {
        let Some(seconds) = self.0.get_mut(first) else {
            return;
        };
        if let Some(ids) = seconds.get_mut(second) {
            ids.remove(&id);
            if ids.is_empty() {
                seconds.remove(second);
            }
        }
        if seconds.is_empty() {
            self.0.remove(first);
        }
    }

    fn get(&self, first: &str, second: &str) -> Option<&HashSet<u64>> {
        self.0.get(first)?.get(second)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug)]
struct Interest {
    wake: Arc<Notify>,
    /// The sequence number of the first change published for this watcher since it last
    /// looked (none: nothing was; it may skip whatever the ring holds).
    pending: Option<u64>,
    index: Index,
}

/// Where a watcher is indexed.
#[derive(Debug, Clone)]
enum Index {
    Type { group: String, kind: String },
    Labels { key: String, values: Vec<String> },
}

impl Index {
    /// The narrowest index that still sees every change a watch may need: a label its
    /// selector requires (a change that takes a resource out of the match carries the label in
    /// what it replaced), else its type. A watch that reports progress is indexed the same: it
    /// marks what it went past on a timer ([`PROGRESS_EVERY`]), not by being woken for every
    /// change.
    fn of(filter: &WatchFilter, selection: Option<&Selection>) -> Index {
        let required = selection.and_then(|selection| {
            selection
                .selector
                .requirements()
                .iter()
                .find_map(|requirement| {
                    let values = match &requirement.operator {
                        Operator::Equals(value) => vec![value.clone()],
                        Operator::In(values) => values.iter().cloned().collect(),
                        _ => return None,
                    };
                    Some(Index::Labels {
                        key: requirement.key.clone(),
                        values,
                    })
                })
        });
        required.unwrap_or_else(|| Index::Type {
            group: filter.resource_type.group.clone(),
            kind: filter.resource_type.kind.clone(),
        })
    }
}

impl Interests {
    fn register(&mut self, index: Index) -> (u64, Arc<Notify>) {
        let id = self.next_id;
        self.next_id += 1;
        match &index {
            Index::Type { group, kind } => self.by_type.insert(group, kind, id),
            Index::Labels { key, values } => {
                for value in values {
                    self.by_label.insert(key, value, id);
                }
            }
        }
        let wake = Arc::new(Notify::new());
        self.watchers.insert(
            id,
            Interest {
                wake: wake.clone(),
                pending: None,
                index,
            },
        );
        (id, wake)
    }

    /// Watcher `id` is gone.
    fn leave(&mut self, id: u64) {
        let Some(interest) = self.watchers.remove(&id) else {
            return;
        };
        match interest.index {
            Index::Type { group, kind } => self.by_type.remove(&group, &kind, id),
            Index::Labels { key, values } => {
                for value in values {
                    self.by_label.remove(&key, &value, id);
                }
            }
        }
    }

    /// Wakes the watchers change `seq` (of the resource at `key`, whose labels were `before`)
    /// may concern.
    fn published(
        &mut self,
        seq: u64,
        key: &StorageKey,
        event: &WatchEvent,
        before: Option<&Labels>,
    ) {
        let Interests {
            watchers,
            by_type,
            by_label,
            ..
        } = self;
        let mut wake = |ids: &HashSet<u64>| {
            for id in ids {
                if let Some(interest) = watchers.get_mut(id)
                    && interest.pending.is_none()
                {
                    interest.pending = Some(seq);
                    interest.wake.notify_one();
                }
            }
        };
        if let Some(ids) = by_type.get(&key.group, &key.kind) {
            wake(ids);
        }
        if !by_label.is_empty()
            && let Operation::Upsert(resource) | Operation::Delete(resource) = &event.operation
        {
            for (label, value) in resource.metadata.iter().chain(before.into_iter().flatten()) {
                if let Some(ids) = by_label.get(label, value) {
                    wake(ids);
                }
            }
        }
    }

    /// Wakes every watcher (a reset, or the log closing).
    fn wake_all(&mut self, seq: u64) {
        for interest in self.watchers.values_mut() {
            interest.pending.get_or_insert(seq);
            interest.wake.notify_one();
        }
    }
}

impl Ring {
    fn first_seq(&self) -> u64 {
        self.items.front().map_or(self.next_seq, |item| item.seq)
    }

    /// Bytes the history holds: the items and the encodings made of them.
    fn total_bytes(&self) -> usize {
        self.bytes + self.wire_bytes.load(Ordering::Relaxed)
    }

    /// Appends a published change and evicts what the limits no longer hold.
    fn push(
        &mut self,
        key: StorageKey,
        event: WatchEvent,
        before: Option<Labels>,
        version: Version,
    ) {
        self.latest = self.latest.max(version);
        // Labels an Upsert left as they were say nothing its own labels do not (most writes
        // change data or a status, not labels): the history keeps only labels that changed.
        let before = before.filter(|labels| {
            !matches!(&event.operation, Operation::Upsert(resource) if &resource.metadata == labels)
        });
        let bytes = event_bytes(&key, &event)
            + before
                .iter()
                .flatten()
                .map(|(label, value)| label.len() + value.len() + LABEL_OVERHEAD)
                .sum::<usize>();
        let event = SharedEvent::in_history(event, self.wire_bytes.clone());
        self.interests
            .published(self.next_seq, &key, event.event(), before.as_ref());
        self.items.push_back(Arc::new(Item {
            seq: self.next_seq,
            key,
            event,
            before,
            version,
            bytes,
        }));
        self.bytes += bytes;
        self.next_seq += 1;
        self.evict_to_limits();
    }

    /// Drops the whole history: watchers that started before now end with `reason`.
    fn reset(&mut self, reason: String, version: Version) {
        for item in std::mem::take(&mut self.items) {
            item.event.leave_history();
        }
        self.bytes = 0;
        self.floor = version;
        self.latest = version;
        self.reset = Some((self.next_seq, reason));
        self.interests.wake_all(self.next_seq);
        self.next_seq += 1;
    }

    fn evict_to_limits(&mut self) {
        while self.items.len() > 1
            && (self.items.len() > self.limits.changes || self.total_bytes() > self.limits.bytes)
        {
            let Some(evicted) = self.items.pop_front() else {
                break;
            };
            self.bytes -= evicted.bytes;
            evicted.event.leave_history();
            self.floor = evicted.version;
        }
    }
}

/// A change (or a reset) a backend collected while applying, to publish after its commit.
// Short-lived, one per change; the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Published {
    Change {
        key: StorageKey,
        event: WatchEvent,
        /// An Upsert's labels before it (`None`: it created the resource; a Delete carries the
        /// last labels in its resource).
        before: Option<Labels>,
        version: Version,
    },
    /// The whole state was replaced: every watch ends and must list again.
    Reset { reason: String },
}

/// What a watch selects.
#[derive(Debug, Clone)]
pub(crate) struct WatchFilter {
    pub resource_type: UnversionedType,
    pub tenancy: Tenancy,
    pub name_prefix: String,
}

impl WatchFilter {
    pub(crate) fn new(
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Self {
        WatchFilter {
            resource_type: resource_type.clone(),
            tenancy: tenancy.clone(),
            name_prefix: name_prefix.to_owned(),
        }
    }

    pub(crate) fn matches(&self, key: &StorageKey) -> bool {
        key.matches(&self.resource_type, &self.tenancy, &self.name_prefix)
    }
}

/// Slots of [`GroupStamps`]: groups share one only by hash collision, which costs a reader an
/// extra miss, never a stale answer.
const STAMP_SLOTS: usize = 256;

/// A number per resource group that grows whenever a change to a resource of the group is
/// published (after its commit: the change is readable) and whenever the whole state is
/// replaced. A reader that loads a group's stamp before it reads, and finds the same stamp
/// later, knows that nothing of that group changed since: what it read is still current. The
/// service keeps what it learnt about partitions and namespaces this way.
#[derive(Debug)]
pub(crate) struct GroupStamps {
    slots: Box<[AtomicU64]>,
}

impl Default for GroupStamps {
    fn default() -> Self {
        GroupStamps {
            slots: (0..STAMP_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl GroupStamps {
    fn slot(&self, group: &str) -> &AtomicU64 {
        // FNV-1a: stable, cheap for short names.
        let hash = group.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        &self.slots[(hash % STAMP_SLOTS as u64) as usize]
    }

    /// The stamp of `group` now; load it before reading what it guards.
    pub(crate) fn get(&self, group: &str) -> u64 {
        self.slot(group).load(Ordering::Acquire)
    }

    fn changed(&self, group: &str) {
        self.slot(group).fetch_add(1, Ordering::Release);
    }

    fn all_changed(&self) {
        for slot in self.slots.iter() {
            slot.fetch_add(1, Ordering::Release);
        }
    }
}

/// The published changes of one backend, their bounded history and the watches that follow them.
#[derive(Debug)]
pub(crate) struct EventLog {
    ring: Arc<Mutex<Ring>>,
    stamps: Arc<GroupStamps>,
    snapshots: Mutex<SharedSnapshots>,
    /// What the node decides from, told of each change before watchers are
    /// ([`super::projection`]).
    projections: super::projection::Projections,
}

/// The snapshot events watchers hold, shared: a watcher whose snapshot holds a resource at the
/// version another watcher's does gets the same event (and its encoding, made once). However
/// many watchers start and however slowly they read, their snapshots together hold each
/// resource version once. Only weak references are kept here.
#[derive(Debug, Default)]
struct SharedSnapshots {
    events: HashMap<StorageKey, WeakEvent>,
    /// Entries after the last sweep of dead ones; the next sweep is due at twice as many.
    swept_to: usize,
}

/// Entries [`SharedSnapshots`] holds before it first sweeps out dead ones.
const SNAPSHOTS_FIRST_SWEEP: usize = 1024;

impl SharedSnapshots {
    /// The event another watcher holds for `key` at `version`.
    fn held(&self, key: &StorageKey, version: &str) -> Option<SharedEvent> {
        self.events
            .get(key)
            .and_then(WeakEvent::upgrade)
            .filter(|held| held.event().version == version)
    }

    /// The snapshot event of `resource`: another watcher's if it holds this version.
    fn event(&mut self, resource: Resource) -> SharedEvent {
        let Some(key) = resource.id.as_ref().map(StorageKey::of) else {
            return snapshot_event(resource);
        };
        if let Some(held) = self.held(&key, &resource.version) {
            return held;
        }
        let event = snapshot_event(resource);
        self.events.insert(key, event.downgrade());
        if self.events.len() >= (2 * self.swept_to).max(SNAPSHOTS_FIRST_SWEEP) {
            self.events.retain(|_, weak| weak.upgrade().is_some());
            self.swept_to = self.events.len();
        }
        event
    }
}

fn snapshot_event(resource: Resource) -> SharedEvent {
    SharedEvent::new(WatchEvent {
        version: resource.version.clone(),
        operation: Operation::Upsert(resource),
        actor: String::new(),
    })
}

fn lock(ring: &Mutex<Ring>) -> MutexGuard<'_, Ring> {
    // Updates below cannot leave the ring half-changed on a panic; a poisoned lock is consistent.
    ring.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a change costs the history (its wire encoding, once a watcher made it, is counted
/// apart: `Ring::wire_bytes`).
fn event_bytes(key: &StorageKey, event: &WatchEvent) -> usize {
    let resource = match &event.operation {
        Operation::Upsert(resource) | Operation::Delete(resource) => {
            prost::Message::encoded_len(resource)
        }
        Operation::EndOfSnapshot | Operation::Bookmark => 0,
    };
    resource
        + ITEM_OVERHEAD
        + event.actor.len()
        + key.group.len()
        + key.kind.len()
        + key.partition.len()
        + key.namespace.len()
        + key.name.len()
}

impl EventLog {
    /// A log whose history starts at version `floor` (what was applied when it was created).
    pub(crate) fn new(limits: HistoryLimits, floor: Version) -> Self {
        EventLog {
            ring: Arc::new(Mutex::new(Ring {
                items: VecDeque::new(),
                next_seq: 0,
                bytes: 0,
                wire_bytes: Arc::new(AtomicUsize::new(0)),
                limits: HistoryLimits {
                    changes: limits.changes.max(1),
                    bytes: limits.bytes,
                },
                floor,
                latest: floor,
                reset: None,
                interests: Interests::default(),
                closed: false,
            })),
            stamps: Arc::default(),
            snapshots: Mutex::default(),
            projections: Default::default(),
        }
    }

    /// Follows `projection` from now on, reset from `source` (the committed state, read under
    /// the same lock as this log).
    pub(crate) fn project(
        &mut self,
        projection: Arc<dyn super::Projection>,
        source: &dyn super::ProjectionSource,
    ) -> Result<(), StorageError> {
        self.projections.add(projection, source)
    }

    /// Whether a change under `key` concerns a projection (applying it may cost: a Type to
    /// compile).
    pub(crate) fn projected(&self, group: &str, kind: &str) -> bool {
        self.projections.concern(group, kind)
    }

    /// The per-group stamps publishing moves (readers keep a clone and need no lock).
    pub(crate) fn stamps(&self) -> Arc<GroupStamps> {
        self.stamps.clone()
    }

    #[cfg(test)]
    /// Bytes and changes the history holds now.
    pub(crate) fn history_size(&self) -> (usize, usize) {
        let ring = lock(&self.ring);
        (ring.total_bytes(), ring.items.len())
    }

    /// Publishes what one commit collected, in order, waking the watchers it concerns (each at
    /// most once: a batch of writes is one commit); a reset is at `applied`. The projections
    /// are told first (a watcher that acts on a change finds them current), and a reset resets
    /// them from `source`, the state just committed.
    pub(crate) fn publish_all(
        &mut self,
        items: Vec<Published>,
        applied: Version,
        source: &dyn super::ProjectionSource,
    ) -> Result<(), StorageError> {
        if items.is_empty() {
            return Ok(());
        }
        let mut reset = false;
        for item in &items {
            match item {
                Published::Change {
                    key,
                    event,
                    version,
                    ..
                } => self.projections.changed(key, event, *version),
                Published::Reset { .. } => reset = true,
            }
        }
        let projected = if reset {
            self.projections.reset(source)
        } else {
            Ok(())
        };
        {
            let mut ring = lock(&self.ring);
            for item in items {
                match item {
                    Published::Change {
                        key,
                        event,
                        before,
                        version,
                    } => {
                        self.stamps.changed(&key.group);
                        ring.push(key, event, before, version);
                    }
                    Published::Reset { reason } => {
                        self.stamps.all_changed();
                        ring.reset(reason, applied);
                    }
                }
            }
        }
        projected
    }

    /// Publishes one change (a backend that commits changes one at a time).
    pub(crate) fn publish_change(
        &mut self,
        key: StorageKey,
        event: WatchEvent,
        before: Option<Labels>,
        version: Version,
    ) {
        // A change resets nothing: the source is never read.
        let _ = self.publish_all(
            vec![Published::Change {
                key,
                event,
                before,
                version,
            }],
            version,
            &(),
        );
    }

    /// Ends every watch; resumes from before `version` are no longer possible. The projections
    /// are reset from `source`.
    pub(crate) fn reset(
        &mut self,
        reason: String,
        version: Version,
        source: &dyn super::ProjectionSource,
    ) -> Result<(), StorageError> {
        self.publish_all(vec![Published::Reset { reason }], version, source)
    }

    /// Starts a watch. `snapshot` is what matches now (ignored when resuming); `applied` is the
    /// version the state is at (changes within that entry may be newer). Call under the lock
    /// that publishing happens under.
    pub(crate) fn watch(
        &self,
        filter: WatchFilter,
        options: WatchOptions,
        snapshot: Vec<Resource>,
        applied: Version,
        since: Option<Version>,
    ) -> Result<Watch, StorageError> {
        let snapshot = match since {
            None => snapshot
                .into_iter()
                .map(|resource| self.snapshot_event(resource))
                .collect(),
            Some(_) => Vec::new(),
        };
        self.watch_events(filter, options, snapshot, applied, since)
    }

    /// The snapshot event of `resource`: the one another watcher holds for this version, or a
    /// new one others will share.
    pub(crate) fn snapshot_event(&self, resource: Resource) -> SharedEvent {
        self.snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .event(resource)
    }

    /// The snapshot event another watcher holds for the resource at `key` and `version`, if
    /// any: a backend asks before it decodes a stored resource for a snapshot.
    pub(crate) fn held_snapshot_event(
        &self,
        key: &StorageKey,
        version: &str,
    ) -> Option<SharedEvent> {
        self.snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .held(key, version)
    }

    /// [`EventLog::watch`] with the snapshot's events made already ([`EventLog::snapshot_event`],
    /// [`EventLog::held_snapshot_event`]).
    pub(crate) fn watch_events(
        &self,
        filter: WatchFilter,
        options: WatchOptions,
        snapshot: Vec<SharedEvent>,
        applied: Version,
        since: Option<Version>,
    ) -> Result<Watch, StorageError> {
        let mut ring = lock(&self.ring);
        let current = ring.latest.max(applied);
        let initial: Vec<(SharedEvent, Option<Labels>)> = match since {
            None => snapshot.into_iter().map(|event| (event, None)).collect(),
            Some(since) if since > current => {
                return Err(StorageError::ResumeUnavailable(format!(
                    "version {since} is ahead of this server, which has applied up to {current} (it may lag behind the leader); retry shortly or list again"
                )));
            }
            Some(since) if since < ring.floor => {
                return Err(StorageError::ResumeUnavailable(format!(
                    "version {since} is older than the history this server keeps (it can resume from {} on); list again and watch from scratch",
                    ring.floor
                )));
            }
            Some(since) => ring
                .items
                .iter()
                .filter(|item| item.version > since && filter.matches(&item.key))
                .map(|item| (item.event.clone(), item.before.clone()))
                .collect(),
        };
        let selection = options.selector.map(|selector| Selection { selector });
        let (id, wake) = ring
            .interests
            .register(Index::of(&filter, selection.as_ref()));
        let initial: Vec<SharedEvent> = initial
            .into_iter()
            .filter_map(|(event, before)| match &selection {
                None => Some(event),
                Some(selection) => selection.view(&event, before.as_ref()),
            })
            .collect();
        let cursor = Cursor {
            ring: self.ring.clone(),
            id,
            wake,
            next_seq: ring.next_seq,
            filter,
            selection,
            progress: options.progress,
        };
        drop(ring);
        let caught_up = SharedEvent::new(WatchEvent {
            version: current.to_string(),
            operation: Operation::EndOfSnapshot,
            actor: String::new(),
        });
        let initial = initial
            .into_iter()
            .chain(std::iter::once(caught_up))
            .map(Ok);
        Ok(futures::stream::iter(initial).chain(follow(cursor)).boxed())
    }
}

/// A watch's selector, applied where the changes are (under the ring's lock, before anything
/// is queued for the watcher): the watcher sees a resource that starts matching as an Upsert,
/// one that stops matching as a Delete, and nothing of the others.
struct Selection {
    selector: Selector,
}

impl Selection {
    /// The event as the watcher sees it: as it is, a Delete made of it (an Upsert that takes
    /// the resource out of the match: its labels `before` matched), or nothing.
    fn view(&self, event: &SharedEvent, before: Option<&Labels>) -> Option<SharedEvent> {
        match &event.event().operation {
            Operation::Upsert(resource) => {
                if self.selector.matches(&resource.metadata) {
                    return Some(event.clone());
                }
                before
                    .is_some_and(|labels| self.selector.matches(labels))
                    .then(|| {
                        SharedEvent::new(WatchEvent {
                            version: event.event().version.clone(),
                            operation: Operation::Delete(resource.clone()),
                            actor: event.event().actor.clone(),
                        })
                    })
            }
            // A Delete carries the resource as it last was: the watcher had it if it matched.
            Operation::Delete(resource) => self
                .selector
                .matches(&resource.metadata)
                .then(|| event.clone()),
            Operation::EndOfSnapshot | Operation::Bookmark => Some(event.clone()),
        }
    }
}

/// A watcher's place in the ring.
struct Cursor {
    ring: Arc<Mutex<Ring>>,
    /// Its registration in the ring's [`Interests`], and what a publish for it wakes.
    id: u64,
    wake: Arc<Notify>,
    /// The sequence number of the next change this watcher has not seen.
    next_seq: u64,
    filter: WatchFilter,
    selection: Option<Selection>,
    /// Whether to say which version the watch went past ([`WatchOptions::progress`]).
    progress: bool,
}

/// How often a watch reporting progress looks at the history while nothing for it changes, to
/// mark the version it went past (the service's bookmarks are sent every few seconds from
/// these).
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What one look at the ring found.
enum Step {
    Events(Vec<SharedEvent>),
    Wait,
    End(StorageError),
    /// The log is gone: its backend shut down.
    Closed,
}

impl Drop for Cursor {
    fn drop(&mut self) {
        lock(&self.ring).interests.leave(self.id);
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        let mut ring = lock(&self.ring);
        ring.closed = true;
        let seq = ring.next_seq;
        ring.interests.wake_all(seq);
    }
}

impl Cursor {
    /// Takes the next matching changes, or says why the watch ends, or that there is nothing yet
    /// (a publish for it after this look wakes it: [`Interests`] keeps a permit).
    fn step(&mut self) -> Step {
        let mut ring = lock(&self.ring);
        if ring.closed {
            return Step::Closed;
        }
        if let Some((reset_seq, reason)) = &ring.reset
            && *reset_seq >= self.next_seq
        {
            return Step::End(StorageError::WatchClosed(reason.clone()));
        }
        let first_seq = ring.first_seq();
        let next_seq = ring.next_seq;
        let pending = ring
            .interests
            .watchers
            .get_mut(&self.id)
            .and_then(|interest| interest.pending.take());
        // A watch reporting progress marks the last change it skips unwoken (looking on its
        // timer, it went past them).
        let mut went_past = None;
        match pending {
            // Nothing for this watcher since its last look: whatever it did not look at is not
            // for it.
            None => {
                if self.progress && self.next_seq < next_seq {
                    went_past = ring.items.back().map(|item| item.version);
                }
                self.next_seq = self.next_seq.max(next_seq);
            }
            // What lies before the first change for it is not for it either.
            Some(first_for_it) if first_for_it >= first_seq => {
                self.next_seq = self.next_seq.max(first_for_it);
            }
            Some(_) => {}
        }
        if self.next_seq < first_seq {
            return Step::End(StorageError::WatchClosed(format!(
                "the watcher fell {} events behind (the server keeps the last {} changes, at most {} bytes); resume from its last version or list again",
                first_seq - self.next_seq,
                ring.limits.changes,
                ring.limits.bytes
            )));
        }
        let start = usize::try_from(self.next_seq - first_seq)
            .unwrap_or(usize::MAX)
            .min(ring.items.len());
        let mut events = Vec::new();
        for item in ring.items.range(start..).take(READ_BATCH) {
            self.next_seq = item.seq + 1;
            let seen = if !self.filter.matches(&item.key) {
                None
            } else if let Some(selection) = &self.selection {
                selection.view(&item.event, item.before.as_ref())
            } else {
                Some(item.event.clone())
            };
            // The version of the last change looked at, when it was not for this watcher.
            went_past = match seen {
                Some(event) => {
                    events.push(event);
                    None
                }
                None => Some(item.version),
            };
        }
        if let Some(version) = went_past.filter(|_| self.progress) {
            events.push(SharedEvent::new(WatchEvent {
                version: version.to_string(),
                operation: Operation::Bookmark,
                actor: String::new(),
            }));
        }
        if self.next_seq < ring.next_seq {
            // The batch ended before the ring did: the rest may hold changes for it.
            if let Some(interest) = ring.interests.watchers.get_mut(&self.id) {
                interest.pending.get_or_insert(self.next_seq);
            }
        } else if events.is_empty() {
            return Step::Wait;
        }
        Step::Events(events)
    }
}

/// The changes after the start of a watch, filtered; a reset or falling behind ends it with an
/// error.
fn follow(cursor: Cursor) -> impl Stream<Item = Result<SharedEvent, StorageError>> + Send {
    let state = Some((cursor, VecDeque::<SharedEvent>::new()));
    futures::stream::unfold(state, |state| async move {
        let (mut cursor, mut pending) = state?;
        loop {
            if let Some(event) = pending.pop_front() {
                return Some((Ok(event), Some((cursor, pending))));
            }
            match cursor.step() {
                Step::Events(events) => pending.extend(events),
                Step::End(error) => return Some((Err(error), None)),
                Step::Closed => return None,
                Step::Wait if cursor.progress => {
                    // Woken by its own changes, or on the timer to mark what it went past.
                    let _ =
                        tokio::time::timeout(PROGRESS_EVERY, cursor.wake.clone().notified()).await;
                }
                Step::Wait => cursor.wake.clone().notified().await,
            }
        }
    })
}

#[cfg(test)]
mod tests;
