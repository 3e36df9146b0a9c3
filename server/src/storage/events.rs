//! [`EventLog`]: the watch events a backend publishes after each commit, a bounded history of
//! them for resuming watches, and the streams watchers read.
//!
//! A backend owns one `EventLog` under the same lock it commits with: it publishes after each
//! commit, and a new watcher takes its snapshot (or replay) and its place in the history under
//! that lock, so it sees every later change exactly once. The history is one ring, bounded by
//! count and by bytes; each watcher is a cursor into it, woken when something is published. A
//! watcher whose next change has left the ring (it fell behind) gets an error, never a gap, and
//! nothing is held per watcher: memory is the ring's, whatever the number of watchers.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{Stream, StreamExt};
use proto::resource::v1::{Resource, Tenancy};
use tokio::sync::watch;

use super::{
    Operation, SharedEvent, StorageError, StorageKey, UnversionedType, Version, Watch, WatchEvent,
    WatchOptions, WeakEvent,
};

/// Changes kept for resuming watches (and for watchers that fall behind).
pub(crate) const DEFAULT_HISTORY: usize = 16 * 1024;
/// Bytes of changes kept at most, whatever their count.
pub(crate) const DEFAULT_HISTORY_BYTES: usize = 64 << 20;
/// Changes a watcher takes from the ring at a time.
const READ_BATCH: usize = 256;
/// What an item costs beyond its resource's encoded size.
const ITEM_OVERHEAD: usize = 192;

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
    fn push(&mut self, key: StorageKey, event: WatchEvent, version: Version) {
        self.latest = self.latest.max(version);
        let bytes = event_bytes(&key, &event);
        let event = SharedEvent::in_history(event, self.wire_bytes.clone());
        self.items.push_back(Arc::new(Item {
            seq: self.next_seq,
            key,
            event,
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
    /// The ring's `next_seq`, sent after each publish: wakes waiting watchers.
    published: watch::Sender<u64>,
    stamps: Arc<GroupStamps>,
    snapshots: Mutex<SharedSnapshots>,
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
        let (published, _) = watch::channel(0);
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
            })),
            published,
            stamps: Arc::default(),
            snapshots: Mutex::default(),
        }
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

    /// Publishes what one commit collected, in order, and wakes the watchers once for all of it
    /// (not once per change: a batch of writes is one commit); a reset is at `applied`.
    pub(crate) fn publish_all(&mut self, items: Vec<Published>, applied: Version) {
        if items.is_empty() {
            return;
        }
        let next_seq = {
            let mut ring = lock(&self.ring);
            for item in items {
                match item {
                    Published::Change {
                        key,
                        event,
                        version,
                    } => {
                        self.stamps.changed(&key.group);
                        ring.push(key, event, version);
                    }
                    Published::Reset { reason } => {
                        self.stamps.all_changed();
                        ring.reset(reason, applied);
                    }
                }
            }
            ring.next_seq
        };
        self.published.send_replace(next_seq);
    }

    /// Publishes one change (a backend that commits changes one at a time).
    pub(crate) fn publish_change(&mut self, key: StorageKey, event: WatchEvent, version: Version) {
        self.publish_all(
            vec![Published::Change {
                key,
                event,
                version,
            }],
            version,
        );
    }

    /// Ends every watch; resumes from before `version` are no longer possible.
    pub(crate) fn reset(&mut self, reason: String, version: Version) {
        self.publish_all(vec![Published::Reset { reason }], version);
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
        let ring = lock(&self.ring);
        let current = ring.latest.max(applied);
        let initial: Vec<SharedEvent> = match since {
            None => snapshot,
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
                .map(|item| item.event.clone())
                .collect(),
        };
        let mut selection = options.selector.map(|selector| Selection {
            selector,
            matched: HashSet::new(),
            complete: since.is_none(),
        });
        let initial: Vec<SharedEvent> = match selection.as_mut() {
            None => initial,
            Some(selection) => initial
                .into_iter()
                .filter_map(|event| {
                    let key = event_key(&event)?;
                    selection.view(&key, &event)
                })
                .collect(),
        };
        let cursor = Cursor {
            ring: self.ring.clone(),
            published: self.published.subscribe(),
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

/// The key of the resource an event carries.
fn event_key(event: &SharedEvent) -> Option<StorageKey> {
    match &event.event().operation {
        Operation::Upsert(resource) | Operation::Delete(resource) => {
            resource.id.as_ref().map(StorageKey::of)
        }
        Operation::EndOfSnapshot | Operation::Bookmark => None,
    }
}

/// A watch's selector, applied where the changes are (under the ring's lock, before anything
/// is queued for the watcher): the watcher sees a resource that starts matching as an Upsert,
/// one that stops matching as a Delete, and nothing of the others.
struct Selection {
    selector: proto::selector::Selector,
    /// The resources last sent to this watcher as matching.
    matched: HashSet<StorageKey>,
    /// Whether the watch began with a snapshot. A resumed watch may hold resources it was sent
    /// before it resumed: a change that does not match reaches it as a Delete.
    complete: bool,
}

impl Selection {
    /// The event at `key` as the watcher sees it: as it is, a Delete made of it, or nothing.
    fn view(&mut self, key: &StorageKey, event: &SharedEvent) -> Option<SharedEvent> {
        match &event.event().operation {
            Operation::Upsert(resource) => {
                if self.selector.matches(&resource.metadata) {
                    if !self.matched.contains(key) {
                        self.matched.insert(key.clone());
                    }
                    return Some(event.clone());
                }
                let held = !self.matched.is_empty() && self.matched.remove(key);
                // The snapshot part of a watch reports state (no actor): what does not match
                // there was never sent.
                if held || (!self.complete && !event.event().actor.is_empty()) {
                    return Some(SharedEvent::new(WatchEvent {
                        version: event.event().version.clone(),
                        operation: Operation::Delete(resource.clone()),
                        actor: event.event().actor.clone(),
                    }));
                }
                None
            }
            Operation::Delete(resource) => {
                let held = !self.matched.is_empty() && self.matched.remove(key);
                (held || (!self.complete && self.selector.matches(&resource.metadata)))
                    .then(|| event.clone())
            }
            Operation::EndOfSnapshot | Operation::Bookmark => Some(event.clone()),
        }
    }
}

/// A watcher's place in the ring.
struct Cursor {
    ring: Arc<Mutex<Ring>>,
    published: watch::Receiver<u64>,
    /// The sequence number of the next change this watcher has not seen.
    next_seq: u64,
    filter: WatchFilter,
    selection: Option<Selection>,
    /// Whether to say which version the watch went past ([`WatchOptions::progress`]).
    progress: bool,
}

/// What one look at the ring found.
enum Step {
    Events(Vec<SharedEvent>),
    Wait,
    End(StorageError),
}

impl Cursor {
    /// Takes the next matching changes, or says why the watch ends, or that there is nothing yet
    /// (having marked the wake-up signal seen under the ring's lock, so no publish is missed).
    fn step(&mut self) -> Step {
        let ring = lock(&self.ring);
        if let Some((reset_seq, reason)) = &ring.reset
            && *reset_seq >= self.next_seq
        {
            return Step::End(StorageError::WatchClosed(reason.clone()));
        }
        let first_seq = ring.first_seq();
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
        // The version of the last change looked at, when it was not for this watcher.
        let mut went_past = None;
        for item in ring.items.range(start..).take(READ_BATCH) {
            self.next_seq = item.seq + 1;
            let seen = if !self.filter.matches(&item.key) {
                None
            } else if let Some(selection) = self.selection.as_mut() {
                selection.view(&item.key, &item.event)
            } else {
                Some(item.event.clone())
            };
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
        if events.is_empty() && self.next_seq >= ring.next_seq {
            self.published.borrow_and_update();
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
                Step::Wait => {
                    if cursor.published.changed().await.is_err() {
                        // The log is gone: its backend shut down.
                        return None;
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests;
