//! [`StateMachineStore`]: the applied state (resources, owner index, last applied, membership) in
//! LMDB, the watch events published after each commit, and the local reads served from it.
//!
//! Rooms: [`apply`] turns one entry's [`Op`](super::op::Op) into LMDB changes (deterministic,
//! never failing on data); [`recovery`] opens the state machine and rebuilds it after an unclean
//! stop; [`snapshot`] builds and installs raft snapshots; [`export`] streams operator snapshots.
//! Apply takes a batch of committed entries and writes them in one LMDB transaction. Watch events
//! are published after the commit, under the lock that new watchers take to read their snapshot
//! and subscribe, so a watcher sees each change exactly once.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, StorageIOError};
use prost::Message;
use proto::resource::v1::{Id, Resource, Tenancy};

use super::op::{Op, Outcome};
use super::schema::{self, LmdbEnv, SmDbs};
use super::sealed::{self, RecordDamage};
use super::types::{
    CommandResult, Entry, LogId, RaftStorageError, Snapshot, SnapshotFile, SnapshotMeta,
    StoredMembership, TypeConfig,
};
use crate::resource;
use crate::storage::events::{EventLog, WatchFilter};
use crate::storage::{StorageError, StorageKey, UnversionedType, Version, Watch};
use crate::wire::raft::{decode, encode};

mod apply;
mod cadence;
mod counts;
mod export;
pub(crate) mod history;
mod rebase;
mod recovery;
mod snapshot;

pub use cadence::SnapshotCadence;
use counts::KindCounts;
pub use snapshot::check_received;

/// Most resource changes an apply runs on the async thread that asked for it (see
/// `SmShared::try_apply_now`); larger batches go to the blocking pool. 64 keeps an inline apply
/// to a few hundred microseconds and covers the batches 64 concurrent writers make: measured
/// with 64 writers on 3 nodes, 8,700 -> 9,260 writes/s against a limit of 16 (the hop to the
/// blocking pool and back costs two thread switches per batch on every node).
pub(super) const INLINE_APPLY_CHANGES: usize = 64;

/// An open state machine environment.
struct SmEnv {
    env: LmdbEnv,
    dbs: SmDbs,
    generation: u64,
    /// The environment's data file, for its room ahead (see [`SmShared::ensure_room`]).
    file: std::sync::OnceLock<std::fs::File>,
}

/// Room the state machine's file keeps allocated ahead of its last page, when the disk has it:
/// applying a batch then writes into blocks it already has, so a full disk never fails an apply.
const ROOM_AHEAD: u64 = 16 << 20;
/// Free space above which the state machine allocates nothing ahead (the disk is measured every
/// second; no node writes this much in one).
const ROOM_WATCH: u64 = 1 << 30;

/// State shared by the state machine store, its snapshot builder and the backend's local reads.
pub struct SmShared {
    data_dir: PathBuf,
    current: RwLock<Arc<SmEnv>>,
    /// Published watch events; also the lock that orders commits with new watches.
    events: Mutex<EventLog>,
    /// The event log's per-group stamps, read without its lock.
    stamps: Arc<crate::storage::events::GroupStamps>,
    snapshot: Mutex<Option<(SnapshotMeta, PathBuf)>>,
    sequence: AtomicU64,
    /// Set by `close_cleanly`: nothing may be applied after the final sync.
    closed: std::sync::atomic::AtomicBool,
    /// Whether the state at open is what this node last applied (a clean stop, or a new node);
    /// after an unclean stop it was rebuilt from an older snapshot.
    opened_cleanly: bool,
    /// Where apply durations and batch sizes go, once the node has its metrics.
    metrics: std::sync::OnceLock<crate::metrics::StorageMetrics>,
    /// The disk, once the node watches it: room for applies and snapshots is waited for.
    disk: std::sync::OnceLock<Arc<super::disk::DiskSpace>>,
    /// Bytes the databases hold ([`schema::state_bytes`]), as of the last apply.
    used_bytes: AtomicU64,
    /// What `used_bytes` may reach (`--quota-bytes`): new writes past it are refused.
    quota: AtomicU64,
    /// The first damage found in the state (a record that failed its seal): the node serves
    /// nothing more from it and restarts to rebuild it.
    damage: tokio::sync::watch::Sender<Option<String>>,
    /// The memory map of every environment this state machine opens ([`schema::map_size_for`]).
    map_size: usize,
    /// When the next raft snapshot is due (by writes, growing with the state).
    cadence: Arc<SnapshotCadence>,
    /// The raft log: a rebase writes the entries applied since its snapshot again from it
    /// ([`rebase`]).
    log: std::sync::OnceLock<super::log_store::LogHandle>,
    /// Held by a rebase and by an install: both make the next generation.
    rebasing: Mutex<()>,
    /// Resources per kind for the metrics, kept by apply once counted (under the apply lock):
    /// a scrape must not read every key.
    kind_counts: Mutex<KindCounts>,
    /// Held by the one ask that scans: a second one waits and finds the counts known.
    counting: Mutex<()>,
}

impl std::fmt::Debug for SmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmShared")
            .field("data_dir", &self.data_dir)
            .finish_non_exhaustive()
    }
}

/// The openraft state machine; clones share the same state.
#[derive(Clone, Debug)]
pub struct StateMachineStore {
    pub shared: Arc<SmShared>,
}

fn io(error: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(error.to_string())
}

fn sm_read_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::read_state_machine(&io(error)).into()
}

fn sm_write_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::write_state_machine(&io(error)).into()
}

fn snapshot_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::write_snapshot(None, &io(error)).into()
}

fn storage_internal(error: impl std::fmt::Display) -> StorageError {
    StorageError::Internal(error.to_string())
}

fn decode_resource(bytes: &[u8]) -> Result<Resource, StorageError> {
    Resource::decode(bytes).map_err(storage_internal)
}

/// The sealed value `key` holds in `db`, once its seal matches; what a damaged seal is, for the
/// caller to report (see [`SmShared::found_damage`]).
fn get_sealed<'t>(
    db: heed::Database<heed::types::Bytes, heed::types::Bytes>,
    txn: &'t heed::RoTxn<'_, heed::WithoutTls>,
    key: &[u8],
) -> heed::Result<Option<&'t [u8]>> {
    match db.get(txn, key)? {
        Some(stored) => sealed::open(key, stored)
            .map(Some)
            .map_err(|damage| heed::Error::Io(std::io::Error::other(damage))),
        None => Ok(None),
    }
}

/// The damage a storage error carries, if it is a record that failed its seal.
fn damage_of(error: &heed::Error) -> Option<&RecordDamage> {
    match error {
        heed::Error::Io(error) => error.get_ref()?.downcast_ref::<RecordDamage>(),
        _ => None,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SmShared {
    fn current(&self) -> Arc<SmEnv> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The last applied log id and membership.
    fn applied_state_blocking(
        &self,
    ) -> Result<(Option<LogId>, StoredMembership), RaftStorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(sm_read_error)?;
        let (last_applied, membership) = read_applied(&sm.dbs, &rtxn).map_err(|error| {
            // Damage here stops raft: recorded first, so the node restarts to rebuild.
            if let Some(damage) = damage_of(&error) {
                self.found_damage(damage);
            }
            sm_read_error(error)
        })?;
        Ok((last_applied, membership))
    }

    /// Syncs the state machine to disk and marks it clean, so the next start uses it as is.
    /// Call when nothing applies any more (after raft stopped).
    pub fn close_cleanly(&self) -> std::io::Result<()> {
        let _log = lock(&self.events);
        self.closed.store(true, Ordering::SeqCst);
        if self.damage.borrow().is_some() {
            // Not clean: the next start rebuilds it (the DAMAGED marker says so too).
            return Ok(());
        }
        let current = self.current();
        current.env.force_sync().map_err(io)?;
        // The generation's directory entries, and CURRENT naming it (a rebase that could not
        // write it left the previous one named): the next start finds what CLEAN describes.
        let generation_dir = schema::sm_generation_dir(&self.data_dir, current.generation);
        schema::sync_dir(&generation_dir)?;
        recovery::write_current(&self.data_dir, current.generation)?;
        // What the file is now: the next start uses it only if it still is.
        let sum = schema::FileSum::of(&generation_dir.join(schema::SNAPSHOT_DATA))?;
        let marker = self.data_dir.join(schema::SM_CLEAN);
        std::fs::write(&marker, format!("clean {}", sum.render()))?;
        schema::sync_file(&marker)?;
        schema::sync_dir(&self.data_dir.join(schema::SM_DIR))
    }

    /// Whether the state at open was what this node had applied before it stopped.
    pub fn opened_cleanly(&self) -> bool {
        self.opened_cleanly
    }

    /// Records that the state is damaged (the first time: logged, and the `DAMAGED` marker
    /// written so the next start rebuilds it whatever happens before), and the error a client
    /// gets instead of an answer from it.
    fn found_damage(&self, damage: &RecordDamage) -> StorageError {
        let sm = self.current();
        let file =
            schema::sm_generation_dir(&self.data_dir, sm.generation).join(schema::SNAPSHOT_DATA);
        self.found_damage_saying(format!("{damage}, in {}", file.display()))
    }

    /// [`Self::found_damage`], with what was found in words.
    fn found_damage_saying(&self, why: String) -> StorageError {
        let first = self.damage.send_if_modified(|found| {
            found
                .is_none()
                .then(|| *found = Some(why.clone()))
                .is_some()
        });
        if first {
            tracing::error!(
                %why,
                "the state machine is damaged: this node stops serving and restarts to rebuild it from the latest snapshot and the raft log"
            );
            if let Err(error) = schema::write_durably(&self.data_dir.join(schema::SM_DAMAGED), &why)
            {
                tracing::error!(%error, "cannot record the damage (the next start rebuilds the state anyway: it was not stopped cleanly)");
            }
        }
        StorageError::Damaged(
            "this node found its stored state damaged and restarts to rebuild it".into(),
        )
    }

    /// `heed`'s error as a client's: damage as [`StorageError::Damaged`], else internal.
    fn read_failed(&self, error: heed::Error) -> StorageError {
        match damage_of(&error) {
            Some(damage) => self.found_damage(damage),
            None => storage_internal(error),
        }
    }

    /// The damage found in the state, once there is some (see [`Self::found_damage`]).
    pub fn damage(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.damage.subscribe()
    }

    /// The last applied log index (0 before anything was applied).
    pub fn last_applied_index(&self) -> u64 {
        self.applied_state_blocking()
            .ok()
            .and_then(|(last, _)| last)
            .map(|log_id| log_id.index)
            .unwrap_or(0)
    }

    /// The voters of the membership the state machine applied last.
    pub fn voters(&self) -> Vec<super::types::NodeId> {
        self.applied_state_blocking()
            .map(|(_, membership)| membership.membership().voter_ids().collect())
            .unwrap_or_default()
    }

    /// Resources stored per `group.Kind`: counted from the keys at the first ask after the
    /// state was opened or replaced, then kept by apply ([`counts`]).
    pub fn count_by_kind(&self) -> Result<std::collections::BTreeMap<String, u64>, StorageError> {
        // Known: answered without the apply lock (a scrape runs on an async thread, and the
        // lock may be held for a watcher's whole snapshot).
        if let KindCounts::Known(known) = &*lock(&self.kind_counts) {
            return Ok(counts::labelled(known));
        }
        // One scan at a time: a second ask waits for the first and finds the counts known.
        let _counting = lock(&self.counting);
        let log = lock(&self.events);
        if let KindCounts::Known(known) = &*lock(&self.kind_counts) {
            return Ok(counts::labelled(known));
        }
        // The transaction is taken under the apply lock: what is applied after it is kept
        // aside for the scan to add.
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        *lock(&self.kind_counts) = KindCounts::Counting(counts::Counts::new());
        drop(log);
        let scanned = scan_kinds(&sm, &rtxn).map_err(storage_internal)?;
        drop(rtxn);
        let _log = lock(&self.events);
        Ok(counts::labelled(&lock(&self.kind_counts).counted(scanned)))
    }

    /// Bytes on disk of the current state machine environment.
    pub fn disk_bytes(&self) -> u64 {
        self.current().env.real_disk_size().unwrap_or(0)
    }

    /// When raft snapshots are due: the node sets `--snapshot-every` and waits on it.
    pub fn cadence(&self) -> Arc<SnapshotCadence> {
        self.cadence.clone()
    }

    /// Records apply durations and batch sizes into `metrics` from now on.
    pub fn use_metrics(&self, metrics: crate::metrics::StorageMetrics) {
        let _ = self.metrics.set(metrics);
    }

    /// The memory map its environments are opened with (a received snapshot is checked in one
    /// of the same size).
    pub fn map_size(&self) -> usize {
        self.map_size
    }

    /// Bounds the state to `quota` bytes from now on (see [`Self::check_quota`]).
    pub fn set_quota(&self, quota: u64) {
        self.quota.store(quota, Ordering::Relaxed);
    }

    /// The state's quota.
    pub fn quota(&self) -> u64 {
        self.quota.load(Ordering::Relaxed)
    }

    /// Bytes the state holds, as of the last apply.
    pub fn state_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Measures what the current environment holds again (after it was opened or replaced).
    pub fn measure_state(&self) {
        let sm = self.current();
        let measured = sm
            .env
            .read_txn()
            .and_then(|rtxn| schema::state_bytes(&sm.env, &sm.dbs, &rtxn));
        match measured {
            Ok(bytes) => self.used_bytes.store(bytes, Ordering::Relaxed),
            Err(error) => tracing::warn!(%error, "cannot measure the state machine"),
        }
    }

    /// `Ok` when `adding` more bytes keep the state within its quota; else why not, naming the
    /// quota and the usage.
    pub fn check_quota(&self, adding: usize) -> Result<(), StorageError> {
        let quota = self.quota.load(Ordering::Relaxed);
        let used = self.state_bytes();
        if used.saturating_add(adding as u64) <= quota {
            return Ok(());
        }
        Err(StorageError::NoSpace(format!(
            "the state is at its quota: {} of {} used, and this write adds {}; delete resources to make room, or raise --quota-bytes",
            proto::bytes_label(used),
            proto::bytes_label(quota),
            proto::bytes_label(adding as u64)
        )))
    }

    /// Watches `disk` from now on: applies and snapshots wait out a full disk.
    pub fn use_disk(&self, disk: Arc<super::disk::DiskSpace>) {
        let _ = self.disk.set(disk);
    }

    fn apply_blocking(&self, entries: Vec<Entry>) -> Result<Vec<CommandResult>, RaftStorageError> {
        let need = room_needed(&entries);
        let sm = self.current();
        super::disk::wait_out(
            self.disk.get().map(|disk| &**disk),
            "applying committed entries (the state machine needs room)",
            super::disk::is_no_space,
            || self.ensure_room(&sm, need),
        )
        .map_err(sm_write_error)?;
        drop(sm);
        self.apply_locked(entries, lock(&self.events))
    }

    /// Makes sure the current environment's file has `need` bytes allocated past its last page
    /// (and [`ROOM_AHEAD`] when the disk has it), so a commit writes into blocks it has.
    fn ensure_room(&self, sm: &SmEnv, need: u64) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        // With space to spare nothing is allocated ahead: a write into preallocated (unwritten)
        // blocks costs the filesystem more than one that allocates as it goes (measured: +12 %
        // server CPU per single-client put on ext4), and a full disk is seconds away at least.
        if let Some(disk) = self.disk.get()
            && disk.free() > ROOM_WATCH.saturating_add(need)
        {
            return Ok(());
        }
        let file = match sm.file.get() {
            Some(file) => file,
            None => {
                let file = sm.env.try_clone_inner_file().map_err(io)?;
                sm.file.get_or_init(|| file)
            }
        };
        let page = rustix::param::page_size() as u64;
        let used = (sm.env.info().last_page_number as u64 + 1) * page;
        let allocated = file.metadata()?.blocks() * 512;
        if allocated >= used + need {
            return Ok(());
        }
        let keep_size = rustix::fs::FallocateFlags::KEEP_SIZE;
        let allocate = |len: u64| -> std::io::Result<()> {
            match rustix::fs::fallocate(file, keep_size, 0, len) {
                Ok(()) => Ok(()),
                Err(errno) => {
                    let error = std::io::Error::from(errno);
                    // A filesystem that cannot allocate ahead: go on without it.
                    if super::disk::is_no_space(&error) {
                        Err(error)
                    } else {
                        Ok(())
                    }
                }
            }
        };
        // A nearly full disk: what this batch needs is enough.
        allocate(used + need.max(ROOM_AHEAD)).or_else(|_| allocate(used + need))
    }

    /// Applies `entries` on the calling (async) thread if that is cheap and nothing waits: a few
    /// changes, and the event log not held by anyone (a watcher taking its snapshot holds it).
    /// Otherwise hands the entries back for the blocking pool. The hop there and back cost about
    /// 100 µs of every write's latency on a loaded 2-core machine, more than the apply itself.
    pub(super) fn try_apply_now(
        &self,
        entries: Vec<Entry>,
    ) -> Result<Result<Vec<CommandResult>, RaftStorageError>, Vec<Entry>> {
        let mut changes = 0;
        for entry in &entries {
            if let EntryPayload::Normal(command) = &entry.payload {
                match command.op() {
                    Op::Changes(batch) => changes += batch.len(),
                    // Restores move whole states: never on an async thread.
                    _ => return Err(entries),
                }
            }
        }
        if changes > INLINE_APPLY_CHANGES {
            return Err(entries);
        }
        // No room now: the blocking pool waits for it.
        if self
            .ensure_room(&self.current(), room_needed(&entries))
            .is_err()
        {
            return Err(entries);
        }
        let log = match self.events.try_lock() {
            Ok(log) => log,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(entries),
        };
        // A change a projection follows may cost (a Type to compile): never on an async thread.
        let projected = entries.iter().any(|entry| match &entry.payload {
            EntryPayload::Normal(command) => match command.op() {
                Op::Changes(batch) => batch.iter().any(|tagged| {
                    tagged
                        .change
                        .id()
                        .and_then(|id| id.r#type.as_ref())
                        .is_some_and(|t| log.projected(&t.group, &t.kind))
                }),
                _ => true,
            },
            _ => false,
        });
        if projected {
            return Err(entries);
        }
        Ok(self.apply_locked(entries, log))
    }

    /// Holds the event log as a watcher taking its snapshot does (tests).
    #[cfg(test)]
    pub(super) fn hold_events(&self) -> MutexGuard<'_, EventLog> {
        lock(&self.events)
    }

    fn apply_locked(
        &self,
        entries: Vec<Entry>,
        mut log: MutexGuard<'_, EventLog>,
    ) -> Result<Vec<CommandResult>, RaftStorageError> {
        let Some(last) = entries.last().map(|entry| entry.log_id) else {
            return Ok(Vec::new());
        };
        let started = std::time::Instant::now();
        let sm = self.current();
        if self.closed.load(Ordering::SeqCst) {
            return Err(sm_write_error("the state machine is closed"));
        }
        let mut wtxn = sm.env.write_txn().map_err(sm_write_error)?;
        let mut tally = Tally::default();
        let mut published = Vec::new();
        let results = write_entries(
            &sm.dbs,
            &mut wtxn,
            entries,
            Some(&mut tally),
            self.metrics.get(),
            &mut published,
        )
        .map_err(|error| {
            // Apply must not decide anything from damaged bytes (the other nodes would decide
            // otherwise): raft stops here, and the node restarts to rebuild its state.
            if let Some(damage) = damage_of(&error) {
                self.found_damage(damage);
            }
            sm_write_error(error)
        })?;
        let Tally {
            writes,
            mut written,
            restored,
        } = tally;
        let used = schema::state_bytes(&sm.env, &sm.dbs, &wtxn).map_err(sm_write_error)?;
        let resources = sm.dbs.resources.len(&wtxn).map_err(sm_write_error)?;
        wtxn.commit().map_err(sm_write_error)?;
        self.used_bytes.store(used, Ordering::Relaxed);
        if restored {
            written += resources;
        }
        self.cadence.applied(written, resources);
        lock(&self.kind_counts).applied(&published);
        if let Err(error) = log.publish_all(published, Version::new(last.index), &Source(&sm)) {
            // The projections could not be read back from what was just committed: what the
            // node decides from would be wrong, so it serves nothing more and rebuilds.
            self.found_damage_saying(format!(
                "the state just applied could not be read back for the registry and the ACLs: {error}"
            ));
        }
        if let Some(metrics) = self.metrics.get() {
            metrics
                .apply
                .record(started.elapsed().as_secs_f64(), writes);
        }
        Ok(results)
    }

    /// Follows `projection` from now on ([`crate::storage::Backend::project`]).
    pub fn project(
        &self,
        projection: Arc<dyn crate::storage::Projection>,
    ) -> Result<(), StorageError> {
        let mut log = lock(&self.events);
        let sm = self.current();
        log.project(projection, &Source(&sm))
    }

    // Local (eventually consistent) reads.

    /// The stamp of a resource group ([`crate::storage::events::GroupStamps`]).
    pub fn group_stamp(&self, group: &str) -> u64 {
        self.stamps.get(group)
    }

    pub fn read(&self, id: &Id) -> Result<Resource, StorageError> {
        self.with_stored(id, |bytes| {
            crate::storage::check_read(id, decode_resource(bytes)?)
        })
    }

    /// A page of the history of the object `uid` (see [`crate::storage::Backend::history`]).
    pub fn history(
        &self,
        uid: &str,
        before: Option<Version>,
        limit: usize,
    ) -> Result<crate::storage::history::Page, StorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        history::page(&sm.dbs, &rtxn, uid, before, limit)
    }

    /// [`Self::read`] as stored (see [`crate::storage::Backend::read_encoded`]).
    pub fn read_encoded(&self, id: &Id) -> Result<Vec<u8>, StorageError> {
        self.with_stored(id, |bytes| {
            crate::storage::check_read_encoded(id, bytes.to_vec())
        })
    }

    /// Runs `found` on what is stored under `id`'s name, inside one read transaction;
    /// `NotFound` when nothing is.
    fn with_stored<T>(
        &self,
        id: &Id,
        found: impl FnOnce(&[u8]) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let key = schema::resource_key(&StorageKey::of(id));
        match get_sealed(sm.dbs.resources, &rtxn, &key).map_err(|e| self.read_failed(e))? {
            Some(bytes) => found(bytes),
            None => Err(StorageError::NotFound),
        }
    }

    pub fn list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        scan(&sm, &rtxn, resource_type, tenancy, name_prefix).map_err(|e| self.read_failed(e))
    }

    /// [`Self::list`] as stored: each resource's encoding, not decoded, handed to `sink`
    /// straight from the read transaction.
    pub fn list_encoded(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        after: Option<&StorageKey>,
        sink: &mut dyn crate::storage::EncodedSink,
    ) -> Result<(), StorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let query = Scan {
            resource_type,
            tenancy,
            name_prefix,
            after,
        };
        scan_with(&sm, &rtxn, &query, |bytes| Ok(sink.take(bytes))).map_err(|e| self.read_failed(e))
    }

    pub fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError> {
        if owner.uid.is_empty() {
            return Ok(Vec::new());
        }
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let prefix = schema::owner_prefix(&owner.uid);
        let mut children = Vec::new();
        for item in sm
            .dbs
            .owners
            .prefix_iter(&rtxn, &prefix)
            .map_err(storage_internal)?
        {
            let (key, ()) = item.map_err(storage_internal)?;
            let child_key = &key[prefix.len()..];
            if let Some(bytes) =
                get_sealed(sm.dbs.resources, &rtxn, child_key).map_err(|e| self.read_failed(e))?
            {
                let child = decode_resource(bytes)?;
                if child
                    .owner
                    .as_ref()
                    .is_some_and(|o| resource::owner_matches(owner, o))
                {
                    children.push(child);
                }
            }
        }
        Ok(children)
    }

    pub fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<Version>,
        options: crate::storage::WatchOptions,
    ) -> Result<Watch, StorageError> {
        let log = lock(&self.events);
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let current = applied_index(&sm.dbs, &rtxn).map_err(|e| self.read_failed(e))?;
        // Each resource is decoded only when no other watcher holds its version already.
        let mut snapshot = Vec::new();
        if since.is_none() {
            let query = Scan {
                resource_type,
                tenancy,
                name_prefix,
                after: None,
            };
            scan_with(&sm, &rtxn, &query, |bytes| {
                let undecodable = |error| heed::Error::Io(std::io::Error::other(error));
                let head = crate::wire::proto::IdAndVersion::decode(bytes).map_err(undecodable)?;
                let held = head
                    .id
                    .as_ref()
                    .and_then(|id| log.held_snapshot_event(&StorageKey::of(id), &head.version));
                snapshot.push(match held {
                    Some(event) => event,
                    None => log.snapshot_event(Resource::decode(bytes).map_err(undecodable)?),
                });
                Ok(ControlFlow::Continue(()))
            })
            .map_err(|e| self.read_failed(e))?;
        }
        log.watch_events(
            WatchFilter::new(resource_type, tenancy, name_prefix),
            options,
            snapshot,
            Version::new(current),
            since,
        )
    }
}

/// The committed state of an environment, read by a projection's reset.
struct Source<'a>(&'a SmEnv);

impl crate::storage::ProjectionSource for Source<'_> {
    fn stored(&self, resource_type: &UnversionedType) -> Result<Vec<Resource>, StorageError> {
        let rtxn = self.0.env.read_txn().map_err(storage_internal)?;
        let all = Tenancy {
            partition: resource::WILDCARD.into(),
            namespace: resource::WILDCARD.into(),
        };
        scan(self.0, &rtxn, resource_type, &all, "").map_err(storage_internal)
    }

    fn revision(&self, domain: crate::storage::Domain) -> Result<Version, StorageError> {
        let rtxn = self.0.env.read_txn().map_err(storage_internal)?;
        apply::revision(&self.0.dbs, &rtxn, domain).map_err(storage_internal)
    }
}

/// Resources per group and kind in `rtxn`, from the keys alone (nothing is decoded).
fn scan_kinds(
    sm: &SmEnv,
    rtxn: &heed::RoTxn<'_, heed::WithoutTls>,
) -> heed::Result<counts::Counts> {
    let mut tally = counts::KeyTally::default();
    for item in sm.dbs.resources.lazily_decode_data().iter(rtxn)? {
        tally.key(item?.0);
    }
    Ok(tally.finish())
}

/// What applying a run of entries wrote, for the snapshot cadence and the metrics.
#[derive(Debug, Default)]
struct Tally {
    /// Resource changes the entries carried.
    writes: u64,
    /// Records they wrote (a restore's staged chunks count too).
    written: u64,
    /// Whether one of them committed a restore.
    restored: bool,
}

/// Writes `entries` into `wtxn`, then the last one's id as the last applied: the outcome of
/// each, and in `published` the watch events to publish after the commit. Apply and a rebase's
/// catch-up (which counts and publishes nothing) share it: the same entries on the same state
/// write the same records.
fn write_entries(
    dbs: &SmDbs,
    wtxn: &mut heed::RwTxn<'_>,
    entries: Vec<Entry>,
    mut tally: Option<&mut Tally>,
    metrics: Option<&crate::metrics::StorageMetrics>,
    published: &mut Vec<crate::storage::events::Published>,
) -> Result<Vec<Outcome>, heed::Error> {
    let Some(last) = entries.last().map(|entry| entry.log_id) else {
        return Ok(Vec::new());
    };
    let mut results = Vec::with_capacity(entries.len());
    for entry in entries {
        let index = entry.log_id.index;
        let result = match entry.payload {
            EntryPayload::Blank => Outcome::default(),
            EntryPayload::Membership(membership) => {
                let stored = StoredMembership::new(Some(entry.log_id), membership);
                put_meta(dbs, wtxn, schema::META_MEMBERSHIP, &encode(&stored))?;
                Outcome::default()
            }
            EntryPayload::Normal(command) => {
                let changes = command.op().change_count() as u64;
                if let Some(tally) = tally.as_deref_mut() {
                    tally.writes += changes;
                    // Staged restore records count too: an abandoned restore's chunks stay in
                    // the log until a snapshot purges them.
                    tally.written += match command.op() {
                        Op::RestoreChunk { resources, .. } => resources.len() as u64,
                        _ => changes,
                    };
                    // A committed restore counts as writing every resource it left: the log
                    // holds the whole restored state, and a snapshot of it is due at the commit.
                    tally.restored |= matches!(command.op(), Op::RestoreCommit { .. });
                }
                if let Some(metrics) = metrics {
                    metrics.batch_entries.observe(changes as f64);
                }
                apply::apply_op(dbs, wtxn, index, command.into_op(), published)?
            }
        };
        results.push(result);
    }
    put_meta(dbs, wtxn, schema::META_LAST_APPLIED, &encode(&Some(last)))?;
    Ok(results)
}

/// Bytes a batch may add to the state machine's file: twice what its entries carry (records,
/// remembered requests, page splits), and a megabyte.
fn room_needed(entries: &[Entry]) -> u64 {
    let carried: usize = entries
        .iter()
        .map(|entry| match &entry.payload {
            EntryPayload::Normal(command) => command.encoded().len(),
            _ => 64,
        })
        .sum();
    2 * carried as u64 + (1 << 20)
}

/// Stores a sealed value in the state machine's meta database.
fn put_meta(dbs: &SmDbs, wtxn: &mut heed::RwTxn<'_>, key: &str, value: &[u8]) -> heed::Result<()> {
    dbs.meta
        .put(wtxn, key, &sealed::seal(key.as_bytes(), value))
}

/// A sealed value of the state machine's meta database.
fn get_meta<'t>(
    dbs: &SmDbs,
    txn: &'t heed::RoTxn<'_, heed::WithoutTls>,
    key: &str,
) -> heed::Result<Option<&'t [u8]>> {
    get_sealed(
        dbs.meta.remap_key_type::<heed::types::Bytes>(),
        txn,
        key.as_bytes(),
    )
}

/// The last applied log id and the membership a state machine environment records.
fn read_applied(
    dbs: &SmDbs,
    rtxn: &heed::RoTxn<'_, heed::WithoutTls>,
) -> heed::Result<(Option<LogId>, StoredMembership)> {
    let undecodable = |error| heed::Error::Io(std::io::Error::other(error));
    let last_applied = match get_meta(dbs, rtxn, schema::META_LAST_APPLIED)? {
        Some(bytes) => decode(bytes).map_err(undecodable)?,
        None => None,
    };
    let membership = match get_meta(dbs, rtxn, schema::META_MEMBERSHIP)? {
        Some(bytes) => decode(bytes).map_err(undecodable)?,
        None => StoredMembership::default(),
    };
    Ok((last_applied, membership))
}

/// The index of the last applied entry (0 before any).
fn applied_index(dbs: &SmDbs, rtxn: &heed::RoTxn<'_, heed::WithoutTls>) -> heed::Result<u64> {
    Ok(read_applied(dbs, rtxn)?
        .0
        .map(|log_id| log_id.index)
        .unwrap_or(0))
}

fn scan(
    sm: &SmEnv,
    rtxn: &heed::RoTxn<'_, heed::WithoutTls>,
    resource_type: &UnversionedType,
    tenancy: &Tenancy,
    name_prefix: &str,
) -> heed::Result<Vec<Resource>> {
    let mut found = Vec::new();
    let query = Scan {
        resource_type,
        tenancy,
        name_prefix,
        after: None,
    };
    scan_with(sm, rtxn, &query, |bytes| {
        let resource = Resource::decode(bytes)
            .map_err(|error| heed::Error::Io(std::io::Error::other(error)))?;
        found.push(resource);
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(found)
}

/// Hands `each` the stored encoding of every resource a list or watch query matches, in key
/// order, until it says `Break`.
/// A stored resource's key and sealed bytes, borrowed from a read transaction.
type Stored<'t> = (&'t [u8], &'t [u8]);

/// What a scan of the resources covers: a type, a tenancy (fields may be `*`), a name prefix,
/// and where it resumes (strictly after that key), if it does.
struct Scan<'a> {
    resource_type: &'a UnversionedType,
    tenancy: &'a Tenancy,
    name_prefix: &'a str,
    after: Option<&'a StorageKey>,
}

fn scan_with(
    sm: &SmEnv,
    rtxn: &heed::RoTxn<'_, heed::WithoutTls>,
    query: &Scan<'_>,
    mut each: impl FnMut(&[u8]) -> heed::Result<ControlFlow<()>>,
) -> heed::Result<()> {
    let Scan {
        resource_type,
        tenancy,
        name_prefix,
        after,
    } = *query;
    let prefix = schema::resource_scan_prefix(
        &resource_type.group,
        &resource_type.kind,
        &tenancy.partition,
        &tenancy.namespace,
        name_prefix,
    );
    // When the prefix says it all (one namespace, or no name prefix below a wildcard
    // namespace), every key under it matches: no key is parsed.
    let wildcard = resource::WILDCARD;
    let covered = (tenancy.partition != wildcard && tenancy.namespace != wildcard)
        || (name_prefix.is_empty() && tenancy.namespace == wildcard);
    let after = after.map(schema::resource_key);
    let items: Box<dyn Iterator<Item = heed::Result<Stored<'_>>>> = match &after {
        // Resume after the key; the prefix still bounds the scan.
        Some(after) if after.as_slice() >= prefix.as_slice() => {
            let range = (
                std::ops::Bound::Excluded(after.as_slice()),
                std::ops::Bound::Unbounded,
            );
            Box::new(sm.dbs.resources.range(rtxn, &range)?.take_while(|item| {
                item.as_ref()
                    .map_or(true, |(key, _)| key.starts_with(&prefix))
            }))
        }
        _ => Box::new(sm.dbs.resources.prefix_iter(rtxn, &prefix)?),
    };
    for item in items {
        let (key, stored) = item?;
        if !covered
            && !schema::parse_resource_key(key)
                .is_some_and(|key| key.matches(resource_type, tenancy, name_prefix))
        {
            continue;
        }
        let bytes = sealed::open(key, stored)
            .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
        if each(bytes)?.is_break() {
            break;
        }
    }
    Ok(())
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership), RaftStorageError> {
        self.shared.applied_state_blocking()
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandResult>, RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let entries = match self.shared.try_apply_now(entries) {
            Ok(applied) => return applied,
            Err(entries) => entries,
        };
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.apply_blocking(entries))
            .await
            .map_err(sm_write_error)?
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, RaftStorageError> {
        let sequence = self.shared.sequence.fetch_add(1, Ordering::Relaxed);
        let dir = schema::incoming_snapshot_dir(&self.shared.data_dir, sequence);
        std::fs::create_dir_all(&dir).map_err(snapshot_error)?;
        Ok(Box::new(SnapshotFile {
            path: dir.join(schema::SNAPSHOT_DATA),
        }))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotFile>,
    ) -> Result<(), RaftStorageError> {
        let shared = self.shared.clone();
        let meta = meta.clone();
        tokio::task::spawn_blocking(move || shared.install_snapshot_blocking(meta, *snapshot))
            .await
            .map_err(snapshot_error)?
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        let current = lock(&self.shared.snapshot).clone();
        match current {
            // Set aside since (found damaged as it was sent): a new one, of the state now.
            Some((_, path)) if !path.exists() => {
                let shared = self.shared.clone();
                tokio::task::spawn_blocking(move || shared.build_snapshot_blocking())
                    .await
                    .map_err(snapshot_error)?
                    .map(Some)
            }
            current => Ok(current.map(|(meta, path)| Snapshot {
                meta,
                snapshot: Box::new(SnapshotFile { path }),
            })),
        }
    }
}
