//! [`LogStore`]: the Raft log in a write-ahead file ([`super::wal`]), with group commit.
//!
//! `append` makes entries readable at once (an in-memory tail) and queues them for a writer
//! thread. The writer takes everything queued, writes it as one run of records, syncs (one
//! `fdatasync` for the whole batch), and only then reports the entries flushed. Votes are written
//! the same way and acknowledged after their sync, so both are durable before openraft relies on
//! them. Truncate and purge go through the same queue, so the disk sees operations in order.
//! Entries no longer in memory are read back from their segment by position.
//!
//! A data directory from before the write-ahead log holds the log in LMDB (`raft/log`); the
//! first open moves it over ([`migrate_lmdb_log`]).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, StorageIOError};

use super::schema;
use super::types::{Entry, LogId, RaftStorageError, TypeConfig, Vote};
use super::wal::{self, Location, Wal, WalError};
use crate::wire::raft::{decode, encode};

/// How many queued operations one commit takes at most.
const MAX_BATCH_OPS: usize = 4096;
/// Flushed entries kept in memory for readers (replication to each follower and apply read
/// every entry right after its flush): at most this many, and at most [`RECENT_BYTES`] of
/// commands (each counted twice: its encoding and its decoded form); the oldest go first.
const RECENT_ENTRIES: usize = 4096;
const RECENT_BYTES: usize = 8 << 20;

/// The log store; clones share the same log.
#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<LogInner>,
}

/// A handle on the log that does not keep it open (the log closes when raft drops its
/// stores): the state machine reads committed entries through it to rebase its live state
/// (see `state_machine::rebase`).
#[derive(Clone)]
pub(crate) struct LogHandle {
    inner: std::sync::Weak<LogInner>,
}

impl LogHandle {
    /// The entries of `range` the log holds (from the first it has), up to `budget` bytes of
    /// commands (at least one entry); an error once the log has closed.
    pub(crate) fn entries(
        &self,
        range: std::ops::Range<u64>,
        budget: usize,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        let inner = self
            .inner
            .upgrade()
            .ok_or_else(|| read_error("the raft log is closed"))?;
        LogStore { inner }.entries(range, Some(budget))
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

struct LogInner {
    /// Kept open while the log is: see [`LogStore::open`].
    _format_marker: schema::LmdbEnv,
    tail: Arc<Mutex<Tail>>,
    writer: Mutex<Option<mpsc::Sender<WriteOp>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<LogStats>,
}

/// Counters for benchmarks and metrics.
#[derive(Debug, Default)]
pub(crate) struct LogStats {
    /// Syncs of the log (each one `fdatasync`).
    pub commits: AtomicU64,
    /// Entries written by those commits.
    pub entries: AtomicU64,
    /// Resource writes and deletes in those entries (a batch entry holds many).
    pub operations: AtomicU64,
    /// The last committed index openraft reported.
    pub committed: AtomicU64,
    /// Where commit durations go, once the node has its metrics.
    pub metrics: std::sync::OnceLock<crate::metrics::StorageMetrics>,
    /// The disk the log is on, once the node watches it: a full disk is waited out.
    pub disk: std::sync::OnceLock<Arc<super::disk::DiskSpace>>,
    /// Held (write-locked) by a test, keeps the writer from committing: a disk that stalls.
    #[cfg(test)]
    pub(crate) stall: tokio::sync::RwLock<()>,
}

/// What readers see: entries queued but not yet synced, the latest flushed entries (the same as
/// on disk, kept so readers need not read and decode them again), where every entry on disk is,
/// the bounds of the visible log and the vote.
#[derive(Default)]
struct Tail {
    pending: BTreeMap<u64, Entry>,
    recent: BTreeMap<u64, Entry>,
    recent_bytes: usize,
    last: Option<LogId>,
    purged: Option<LogId>,
    vote: Option<Vote>,
    /// Entry index → its record, for every synced entry.
    locations: BTreeMap<u64, Location>,
    /// Live segments by sequence number.
    segments: BTreeMap<u64, Arc<File>>,
}

impl Tail {
    /// An entry now on disk moves from `pending` to `recent` (unless a truncate replaced it
    /// meanwhile); the oldest recent entries leave past the bounds.
    fn flushed(&mut self, entry: &Entry) {
        let index = entry.log_id.index;
        if self
            .pending
            .get(&index)
            .is_none_or(|p| p.log_id != entry.log_id)
        {
            return;
        }
        if let Some(entry) = self.pending.remove(&index) {
            self.recent_bytes += entry_bytes(&entry);
            if let Some(replaced) = self.recent.insert(index, entry) {
                self.recent_bytes -= entry_bytes(&replaced);
            }
        }
        while self.recent.len() > RECENT_ENTRIES || self.recent_bytes > RECENT_BYTES {
            match self.recent.pop_first() {
                Some((_, oldest)) => self.recent_bytes -= entry_bytes(&oldest),
                None => break,
            }
        }
    }

    /// Keeps the recent entries `keep` says to keep.
    fn retain_recent(&mut self, keep: impl Fn(u64) -> bool) {
        let mut bytes = self.recent_bytes;
        self.recent.retain(|index, entry| {
            let kept = keep(*index);
            if !kept {
                bytes -= entry_bytes(entry);
            }
            kept
        });
        self.recent_bytes = bytes;
    }

    /// `start..end` from memory (pending wins over recent), if memory holds all of it.
    fn cached(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let mut entries = Vec::with_capacity((end - start).min(1024) as usize);
        for index in start..end {
            let entry = self
                .pending
                .get(&index)
                .or_else(|| self.recent.get(&index))?;
            entries.push(entry.clone());
        }
        Some(entries)
    }
}

/// What a kept entry counts against [`RECENT_BYTES`]: its command twice (the encoding made for
/// the disk, and the decoded op of about the same size), or a little for membership and blank
/// entries.
fn entry_bytes(entry: &Entry) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(command) => 2 * command.encoded().len() + 64,
        _ => 64,
    }
}

enum WriteOp {
    Append(Vec<Entry>, Flushed),
    Truncate(u64),
    Purge(LogId),
    Vote(Vote, tokio::sync::oneshot::Sender<io::Result<()>>),
}

/// Who hears that an append is on disk: openraft, or a test of the store alone (openraft's
/// callback cannot be made outside openraft).
enum Flushed {
    Raft(LogFlushed<TypeConfig>),
    #[cfg(test)]
    Test(tokio::sync::oneshot::Sender<io::Result<()>>),
}

impl Flushed {
    fn completed(self, outcome: io::Result<()>) {
        match self {
            Flushed::Raft(callback) => callback.log_io_completed(outcome),
            #[cfg(test)]
            Flushed::Test(done) => {
                let _ = done.send(outcome);
            }
        }
    }
}

/// A damaged log that was set aside: what was wrong, and the `raft/damaged-*` directory that
/// holds it now (its segments under `wal`).
#[derive(Debug)]
pub(crate) struct SetAside {
    pub damage: WalError,
    pub dir: PathBuf,
}

/// Why the log cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum LogOpenError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("cannot read the LMDB raft log of an earlier resd to move it over: {0}")]
    Lmdb(#[from] heed::Error),
    #[error("the raft log in {dir} is unreadable: {what}")]
    Unreadable { dir: PathBuf, what: String },
    #[error("cannot start the raft log writer: {0}")]
    Thread(io::Error),
}

impl LogOpenError {
    /// Whether the log lost what it had synced (see [`WalError::is_damage`]).
    pub fn is_damage(&self) -> bool {
        matches!(self, LogOpenError::Wal(error) if error.is_damage())
    }
}

fn io_error(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(error.to_string())
}

fn read_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::read_logs(&io_error(error)).into()
}

fn write_error(error: impl std::fmt::Display) -> RaftStorageError {
    StorageIOError::write_logs(&io_error(error)).into()
}

impl LogStore {
    /// Opens the log of `data_dir`; a damaged log is refused.
    pub(crate) fn open(data_dir: &Path) -> Result<LogStore, LogOpenError> {
        Self::open_with(data_dir, false, true).map(|(log, _)| log)
    }

    /// Opens a new, empty log in `data_dir`, whose log was set aside for a repair.
    pub(crate) fn open_anew(data_dir: &Path) -> Result<LogStore, LogOpenError> {
        Self::open_with(data_dir, false, false).map(|(log, _)| log)
    }

    /// Opens the log of `data_dir`; a damaged one is set aside under `raft/damaged-*` and a
    /// new, empty log started in its place. Returns what was damaged and where it went, if
    /// anything was.
    pub(crate) fn open_setting_damage_aside(
        data_dir: &Path,
    ) -> Result<(LogStore, Option<SetAside>), LogOpenError> {
        Self::open_with(data_dir, true, true)
    }

    /// `had_a_log`: whether a missing log is damage when the format marker says there was one.
    fn open_with(
        data_dir: &Path,
        set_damage_aside: bool,
        had_a_log: bool,
    ) -> Result<(LogStore, Option<SetAside>), LogOpenError> {
        let dir = data_dir.join(schema::WAL_DIR);
        // The LMDB log environment stays, emptied, as the marker of the directory's format: an
        // older resd opens it first and refuses a format it does not know, naming both.
        let (format_marker, lmdb) = schema::open_log(data_dir)?;
        if holds_a_log(&format_marker, &lmdb)? {
            if !dir.exists() {
                migrate_lmdb_log(data_dir, &format_marker, &lmdb)?;
            }
            // Moved now, or before by a move that stopped short of this step: only the marker
            // stays.
            let mut wtxn = format_marker.write_txn()?;
            lmdb.entries.clear(&mut wtxn)?;
            lmdb.meta.delete(&mut wtxn, schema::META_VOTE)?;
            lmdb.meta.delete(&mut wtxn, schema::META_LAST_PURGED)?;
            wtxn.commit()?;
        }
        // Whether this directory had a log: recorded in the marker's environment (synced, and
        // outside the log's directory) once the log exists, so a log that lost every segment,
        // or its directory, is damage and not a new node's empty log.
        let existing = {
            let rtxn = format_marker.read_txn()?;
            had_a_log && lmdb.meta.get(&rtxn, schema::META_WAL)?.is_some()
        };
        let (wal, replayed, damage) = match Wal::open(&dir, existing) {
            Ok((wal, replayed)) => (wal, replayed, None),
            Err(damage) if set_damage_aside && damage.is_damage() => {
                schema::mark_repairing(
                    data_dir,
                    &format!("this node's raft log was damaged and is set aside: {damage}\n"),
                )
                .map_err(|source| WalError::Io {
                    path: data_dir.join(schema::REPAIR_FILE),
                    source,
                })?;
                let aside = schema::set_aside(data_dir, &[Path::new(schema::WAL_DIR)]).map_err(
                    |source| WalError::Io {
                        path: dir.clone(),
                        source,
                    },
                )?;
                tracing::warn!(
                    %damage,
                    set_aside = %aside.display(),
                    "the raft log is damaged: it was set aside (delete it once it is no longer needed) and a new one started, to be repaired from the leader"
                );
                let (wal, replayed) = Wal::open(&dir, false)?;
                (wal, replayed, Some(SetAside { damage, dir: aside }))
            }
            Err(error) => return Err(error.into()),
        };
        if !existing {
            let mut wtxn = format_marker.write_txn()?;
            lmdb.meta.put(&mut wtxn, schema::META_WAL, &[1])?;
            wtxn.commit()?;
        }
        let unreadable = |what: String| LogOpenError::Unreadable {
            dir: dir.clone(),
            what,
        };
        let last = match replayed.locations.last_key_value() {
            Some((_, location)) => {
                let file = replayed
                    .segments
                    .get(&location.segment)
                    .ok_or_else(|| unreadable("the last entry's segment is gone".into()))?;
                let bytes = wal::read_entry(file, *location)
                    .map_err(|e| unreadable(format!("the last entry: {e}")))?;
                let entry: Entry =
                    decode(&bytes).map_err(|e| unreadable(format!("the last entry: {e}")))?;
                Some(entry.log_id)
            }
            None => None,
        };
        let stats = Arc::new(LogStats::default());
        let tail = Arc::new(Mutex::new(Tail {
            last: last.or(replayed.purged),
            purged: replayed.purged,
            vote: replayed.vote,
            locations: replayed.locations,
            segments: replayed.segments,
            ..Tail::default()
        }));
        let (sender, receiver) = mpsc::channel();
        let writer = Writer {
            wal,
            tail: tail.clone(),
            stats: stats.clone(),
        };
        let writer_thread = std::thread::Builder::new()
            .name("resd-raft-log".into())
            .spawn(move || writer.run(receiver))
            .map_err(LogOpenError::Thread)?;
        let log = LogStore {
            inner: Arc::new(LogInner {
                _format_marker: format_marker,
                tail,
                writer: Mutex::new(Some(sender)),
                writer_thread: Mutex::new(Some(writer_thread)),
                stats,
            }),
        };
        Ok((log, damage))
    }

    /// The index the log was purged up to (inclusive), if anything was purged.
    pub(crate) fn purged_index(&self) -> Option<u64> {
        self.tail().purged.map(|log_id| log_id.index)
    }

    pub(crate) fn stats(&self) -> Arc<LogStats> {
        self.inner.stats.clone()
    }

    /// A handle that reads the log without keeping it open.
    pub(crate) fn handle(&self) -> LogHandle {
        LogHandle {
            inner: Arc::downgrade(&self.inner),
        }
    }

    fn tail(&self) -> MutexGuard<'_, Tail> {
        self.inner
            .tail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn send(&self, op: WriteOp) -> Result<(), RaftStorageError> {
        let writer = self.inner.writer.lock().unwrap_or_else(|p| p.into_inner());
        match writer.as_ref() {
            Some(sender) => sender
                .send(op)
                .map_err(|_| write_error("the log writer thread has stopped")),
            None => Err(write_error("the log store is closed")),
        }
    }

    /// Makes `entries` readable at once and queues them for the writer.
    fn queue_append(&self, entries: Vec<Entry>, flushed: Flushed) -> Result<(), RaftStorageError> {
        {
            let mut tail = self.tail();
            for entry in &entries {
                tail.pending.insert(entry.log_id.index, entry.clone());
                tail.last = Some(entry.log_id);
            }
        }
        self.send(WriteOp::Append(entries, flushed))
    }

    async fn write_vote_durably(&self, vote: &Vote) -> Result<(), RaftStorageError> {
        let (done, flushed) = tokio::sync::oneshot::channel();
        self.send(WriteOp::Vote(*vote, done))?;
        match flushed.await {
            Ok(Ok(())) => {
                self.tail().vote = Some(*vote);
                Ok(())
            }
            Ok(Err(error)) => Err(write_error(error)),
            Err(_) => Err(write_error(
                "the log writer thread stopped before the vote was durable",
            )),
        }
    }
}

impl Drop for LogInner {
    fn drop(&mut self) {
        // Closing the channel ends the writer after it has flushed what was queued.
        if let Ok(mut writer) = self.writer.lock() {
            writer.take();
        }
        if let Some(handle) = self.writer_thread.lock().ok().and_then(|mut h| h.take()) {
            let _ = handle.join();
        }
    }
}

/// The writer thread's state.
struct Writer {
    wal: Wal,
    tail: Arc<Mutex<Tail>>,
    stats: Arc<LogStats>,
}

impl Writer {
    fn run(mut self, receiver: mpsc::Receiver<WriteOp>) {
        while let Ok(first) = receiver.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH_OPS {
                match receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            #[cfg(test)]
            let stats = self.stats.clone();
            #[cfg(test)]
            let stalled = stats.stall.blocking_read();
            let started = std::time::Instant::now();
            // Only a new segment needs new blocks (segments are preallocated): a full disk
            // holds the batch, unacknowledged, until space returns.
            let disk = self.stats.disk.get().cloned();
            let result = super::disk::wait_out(
                disk.as_deref(),
                "writing the raft log (a new segment)",
                |error: &WalError| matches!(error, WalError::Io { source, .. } if super::disk::is_no_space(source)),
                || self.write_batch(&batch),
            );
            #[cfg(test)]
            drop(stalled);
            if let Some(metrics) = self.stats.metrics.get() {
                metrics.synced("log", started.elapsed().as_secs_f64());
            }
            let result = result.map(|written| self.flushed(&batch, written));
            for op in batch {
                let outcome = result.as_ref().map(|_| ()).map_err(io_error);
                match op {
                    WriteOp::Append(_, flushed) => flushed.completed(outcome),
                    WriteOp::Vote(_, done) => {
                        let _ = done.send(outcome);
                    }
                    WriteOp::Truncate(_) | WriteOp::Purge(_) => {
                        if let Err(error) = outcome {
                            tracing::error!(%error, "raft log write failed");
                        }
                    }
                }
            }
        }
    }

    /// Writes the batch's records and syncs them.
    fn write_batch(&mut self, batch: &[WriteOp]) -> Result<wal::Written, WalError> {
        let mut records = wal::Batch::default();
        for op in batch {
            match op {
                WriteOp::Append(entries, _) => {
                    for entry in entries {
                        records.entry(entry.log_id.index, &encode(entry));
                    }
                }
                WriteOp::Truncate(from) => records.truncate(*from),
                WriteOp::Purge(upto) => self.wal.purge(&mut records, upto.index, &encode(upto)),
                WriteOp::Vote(vote, _) => self.wal.vote(&mut records, &encode(vote)),
            }
        }
        self.wal.write(records)
    }

    /// After a sync: entries leave the pending tail for the recent ones (unless a truncate
    /// replaced them meanwhile), every operation's effect on where entries are is replayed in
    /// order, and segments left with no live entry after a purge are deleted.
    fn flushed(&self, batch: &[WriteOp], wal::Written { locations, opened }: wal::Written) {
        let mut entry_count = 0u64;
        let mut operation_count = 0u64;
        let mut purged = false;
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(segment) = opened {
            tail.segments.insert(segment.seq, segment.file);
        }
        let mut written = locations.into_iter();
        for op in batch {
            match op {
                WriteOp::Append(entries, _) => {
                    entry_count += entries.len() as u64;
                    operation_count += entries.iter().map(operations_in).sum::<u64>();
                    for entry in entries {
                        tail.flushed(entry);
                        if let Some((index, location)) = written.next() {
                            wal::place(&mut tail.locations, index, location);
                        }
                    }
                }
                WriteOp::Truncate(from) => {
                    tail.locations.split_off(from);
                }
                WriteOp::Purge(upto) => {
                    tail.locations = tail.locations.split_off(&(upto.index + 1));
                    purged = true;
                }
                WriteOp::Vote(..) => {}
            }
        }
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats.entries.fetch_add(entry_count, Ordering::Relaxed);
        self.stats
            .operations
            .fetch_add(operation_count, Ordering::Relaxed);
        if purged {
            let first_live = tail
                .locations
                .first_key_value()
                .map_or(self.wal.current_segment(), |(_, l)| l.segment);
            drop(tail);
            // The purge is on disk whatever happens here: a segment that stays is only space.
            match self.wal.delete_before(first_live) {
                Ok(deleted) => {
                    let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
                    for seq in deleted {
                        tail.segments.remove(&seq);
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot delete purged raft log segments"),
            }
        }
    }
}

/// Whether the LMDB log environment still holds a log (an earlier resd kept it there).
fn holds_a_log(env: &schema::LmdbEnv, dbs: &schema::LogDbs) -> Result<bool, heed::Error> {
    let rtxn = env.read_txn()?;
    Ok(!dbs.entries.is_empty(&rtxn)? || dbs.meta.get(&rtxn, schema::META_VOTE)?.is_some())
}

/// Moves a log kept in LMDB by an earlier resd (`raft/log`) into a new write-ahead log: the
/// vote, the purge point and every entry, written to `raft/wal.tmp`, synced and renamed into
/// place; only then is the LMDB log emptied (by the caller). Stopped anywhere, the next open
/// starts the move again or finds it done.
fn migrate_lmdb_log(
    data_dir: &Path,
    env: &schema::LmdbEnv,
    dbs: &schema::LogDbs,
) -> Result<(), LogOpenError> {
    let target = data_dir.join(schema::WAL_DIR);
    let staging = data_dir.join(format!("{}.tmp", schema::WAL_DIR));
    let gone = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WalError::Io { path, source }
    };
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(gone(&staging))?;
    }
    let mut moved = 0u64;
    {
        let (mut wal, _) = Wal::open(&staging, false)?;
        let rtxn = env.read_txn()?;
        let mut records = wal::Batch::default();
        if let Some(vote) = dbs.meta.get(&rtxn, schema::META_VOTE)? {
            wal.vote(&mut records, vote);
        }
        if let Some(bytes) = dbs.meta.get(&rtxn, schema::META_LAST_PURGED)? {
            let purged: Option<LogId> =
                decode(bytes).map_err(|e| heed::Error::Decoding(Box::new(e)))?;
            if let Some(upto) = purged {
                wal.purge(&mut records, upto.index, &encode(&upto));
            }
        }
        for item in dbs.entries.iter(&rtxn)? {
            let (index, bytes) = item?;
            records.entry(index, bytes);
            moved += 1;
        }
        if !records.is_empty() {
            wal.write(records)?;
        }
    }
    std::fs::rename(&staging, &target).map_err(gone(&target))?;
    if let Some(parent) = target.parent() {
        schema::sync_dir(parent).map_err(gone(parent))?;
    }
    tracing::info!(
        entries = moved,
        from = %data_dir.join(schema::LOG_DIR).display(),
        to = %target.display(),
        "moved the raft log from LMDB to the write-ahead log"
    );
    Ok(())
}

/// Resource writes and deletes an entry carries.
fn operations_in(entry: &Entry) -> u64 {
    match &entry.payload {
        openraft::EntryPayload::Normal(command) => command.op().change_count() as u64,
        _ => 0,
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        self.entries(range, None)
    }

    /// What replication sends: from `start`, at most what one AppendEntries carries (one
    /// entry at least). Without the limit the leader read and decoded up to 300 entries per
    /// round, and a restore's 4 MiB entries made that 1.2 GB to send 32 MB of it: followers
    /// heard no heartbeat in time and elections churned.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        self.entries(start..end, Some(super::network::MAX_APPEND_BYTES))
    }
}

impl LogStore {
    /// The entries in `range` the log holds (from the first it has), up to `budget` bytes of
    /// commands when given (at least one entry).
    fn entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
        budget: Option<usize>,
    ) -> Result<Vec<Entry>, RaftStorageError> {
        let tail = self.tail();
        let first_visible = tail.purged.map(|p| p.index + 1).unwrap_or(0);
        let Some(last) = tail.last else {
            return Ok(Vec::new());
        };
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        }
        .max(first_visible);
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        }
        .min(last.index + 1);
        if start >= end {
            return Ok(Vec::new());
        }
        if let Some(entries) = tail.cached(start, end)
            && budget.is_none_or(|budget| {
                entries.len() == 1
                    || entries.iter().map(|e| entry_bytes(e) / 2).sum::<usize>() <= budget
            })
        {
            return Ok(entries);
        }
        // Memory first (pending wins: it may hold re-appended entries that replace truncated
        // ones still on disk), then the disk. The run starts at the first index found (a caller
        // may ask from before the log's start); the log has no holes, so a gap after that can
        // only be the end.
        enum Source {
            Memory(Entry),
            Disk(Arc<File>, Location),
        }
        let mut sources = Vec::with_capacity((end - start).min(1024) as usize);
        let mut bytes = 0usize;
        for index in start..end {
            let source = match tail.pending.get(&index).or_else(|| tail.recent.get(&index)) {
                Some(entry) => Some(Source::Memory(entry.clone())),
                None => tail.locations.get(&index).and_then(|location| {
                    let file = tail.segments.get(&location.segment)?;
                    Some(Source::Disk(file.clone(), *location))
                }),
            };
            let Some(source) = source else {
                if sources.is_empty() {
                    continue;
                }
                break;
            };
            bytes += match &source {
                Source::Memory(entry) => entry_bytes(entry) / 2,
                Source::Disk(_, location) => location.len as usize,
            };
            if budget.is_some_and(|budget| bytes > budget) && !sources.is_empty() {
                break;
            }
            sources.push(source);
        }
        drop(tail);
        let mut entries = Vec::with_capacity(sources.len());
        for source in sources {
            entries.push(match source {
                Source::Memory(entry) => entry,
                Source::Disk(file, location) => {
                    let bytes = wal::read_entry(&file, location).map_err(read_error)?;
                    decode(&bytes).map_err(read_error)?
                }
            });
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, RaftStorageError> {
        let tail = self.tail();
        Ok(LogState {
            last_purged_log_id: tail.purged,
            last_log_id: tail.last.or(tail.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), RaftStorageError> {
        self.write_vote_durably(vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        Ok(self.tail().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), RaftStorageError> {
        // Kept in memory only: persisting it would cost an fsync per commit, and openraft does
        // not need it for safety (a restarted node learns the commit index from the leader).
        if let Some(log_id) = committed {
            self.inner
                .stats
                .committed
                .fetch_max(log_id.index, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, RaftStorageError> {
        Ok(None)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        self.queue_append(entries.into_iter().collect(), Flushed::Raft(callback))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        let previous = if log_id.index == 0 {
            None
        } else {
            self.try_get_log_entries(log_id.index - 1..log_id.index)
                .await?
                .pop()
                .map(|entry| entry.log_id)
        };
        {
            let mut tail = self.tail();
            tail.pending.retain(|index, _| *index < log_id.index);
            tail.retain_recent(|index| index < log_id.index);
            tail.last = previous.or(tail.purged);
        }
        self.send(WriteOp::Truncate(log_id.index))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), RaftStorageError> {
        {
            let mut tail = self.tail();
            tail.pending.retain(|index, _| *index > log_id.index);
            tail.retain_recent(|index| index > log_id.index);
            tail.purged = Some(log_id);
            if tail.last.is_none_or(|last| last.index < log_id.index) {
                tail.last = Some(log_id);
            }
        }
        self.send(WriteOp::Purge(log_id))
    }
}

#[cfg(test)]
mod tests {
    use super::super::op::Op;
    use super::super::types::Command;
    use super::*;

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(term, 1), index),
            payload: openraft::EntryPayload::Normal(Command::new(Op::Changes(Vec::new()))),
        }
    }

    fn same_command(a: &Entry, b: &Entry) -> bool {
        match (&a.payload, &b.payload) {
            (openraft::EntryPayload::Normal(a), openraft::EntryPayload::Normal(b)) => {
                std::ptr::eq(a.op(), b.op())
            }
            _ => false,
        }
    }

    #[test]
    fn flushed_entries_stay_readable_from_memory_until_truncated_or_purged() {
        let mut tail = Tail::default();
        let appended: Vec<Entry> = (1..=5).map(|i| entry(1, i)).collect();
        for e in &appended {
            tail.pending.insert(e.log_id.index, e.clone());
        }
        for e in &appended[..3] {
            tail.flushed(e);
        }
        assert_eq!(tail.pending.len(), 2);
        assert_eq!(tail.recent.len(), 3);
        let read = tail.cached(1, 6).expect("all in memory");
        assert!(read.iter().zip(&appended).all(|(r, a)| same_command(r, a)));
        assert!(tail.cached(0, 6).is_none(), "index 0 is only on disk");

        // A truncate drops the recent suffix; a flush of a replaced entry is not kept.
        tail.pending.retain(|index, _| *index < 3);
        tail.retain_recent(|index| index < 3);
        let replacement = entry(2, 3);
        tail.pending.insert(3, replacement.clone());
        tail.flushed(&appended[3]);
        assert!(
            tail.cached(3, 4)
                .is_some_and(|e| e[0].log_id == replacement.log_id)
        );
        assert!(tail.cached(4, 5).is_none());
        tail.flushed(&replacement);
        assert_eq!(
            tail.recent.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3]
        );

        // A purge drops the recent prefix, and the byte count follows.
        tail.retain_recent(|index| index > 2);
        assert_eq!(tail.recent.keys().copied().collect::<Vec<_>>(), vec![3]);
        assert_eq!(tail.recent_bytes, entry_bytes(&replacement));
    }

    /// An entry of about `size` bytes (one write whose data is that large).
    fn big_entry(term: u64, index: u64, size: usize) -> Entry {
        use proto::resource::v1::Resource;

        use super::super::op::{Change, Tagged};
        let resource = Resource {
            data: Some(prost_types::Any {
                type_url: "t".into(),
                value: vec![(index % 251) as u8; size],
            }),
            ..Resource::default()
        };
        let change = Change::Write(
            Arc::new(resource),
            crate::storage::WriteCondition::default(),
        );
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(term, 1), index),
            payload: openraft::EntryPayload::Normal(Command::new(Op::Changes(vec![Tagged::new(
                change, "test",
            )]))),
        }
    }

    async fn append_all(log: &mut LogStore, entries: Vec<Entry>) {
        let (flushed, done) = tokio::sync::oneshot::channel();
        log.queue_append(entries, Flushed::Test(flushed))
            .expect("append");
        done.await.expect("flushed").expect("flushed without error");
    }

    fn terms(entries: &[Entry]) -> Vec<(u64, u64)> {
        entries
            .iter()
            .map(|e| (e.log_id.index, e.log_id.leader_id.term))
            .collect()
    }

    /// Replication reads at most what one AppendEntries carries (at least one entry), from
    /// memory and from disk alike; an unlimited read still returns the whole range. Before,
    /// a leader decoded up to 300 restore entries of 4 MiB per round to send 32 MB of them.
    #[tokio::test]
    async fn replication_reads_at_most_one_message_of_entries() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut log = LogStore::open(dir.path()).expect("open");
        let size = 4 << 20;
        for index in 1..=12 {
            append_all(&mut log, vec![big_entry(1, index, size)]).await;
        }
        let limited = log.limited_get_log_entries(1, 13).await.expect("read");
        let per_message = super::super::network::MAX_APPEND_BYTES / size;
        assert!(
            (1..=per_message).contains(&limited.len()),
            "{} entries of 4 MiB in one read",
            limited.len()
        );
        assert_eq!(terms(&limited)[0], (1, 1));
        // A larger entry than the budget still goes alone.
        append_all(&mut log, vec![big_entry(1, 13, 40 << 20)]).await;
        let alone = log.limited_get_log_entries(13, 14).await.expect("read");
        assert_eq!(alone.len(), 1);
        let all = log.try_get_log_entries(1..14).await.expect("read");
        assert_eq!(all.len(), 13);
        // From disk: reopened, nothing in memory.
        drop(log);
        let mut log = LogStore::open(dir.path()).expect("reopen");
        let limited = log.limited_get_log_entries(1, 13).await.expect("read");
        assert!(
            (1..=per_message).contains(&limited.len()),
            "{}",
            limited.len()
        );
    }

    /// Across several segments: a truncate back into an older segment, entries of a new term
    /// appended over it, a purge, and a restart read back exactly the log openraft left, from
    /// disk (the entries no longer in memory) and with the purged segments gone.
    #[tokio::test]
    async fn truncates_and_purges_across_segments_survive_a_restart() {
        let dir = tempfile::tempdir().expect("temp dir");
        let wal_dir = dir.path().join(schema::WAL_DIR);
        let size = 20_000;
        {
            let mut log = LogStore::open(dir.path()).expect("open");
            log.save_vote(&Vote::new_committed(2, 1))
                .await
                .expect("vote");
            for index in 1..=40 {
                append_all(&mut log, vec![big_entry(1, index, size)]).await;
            }
            let segments_before = wal::disk_bytes(&wal_dir) / wal::SEGMENT_BYTES;
            assert!(segments_before >= 3, "{segments_before} segments");
            log.truncate(LogId::new(openraft::CommittedLeaderId::new(1, 1), 15))
                .await
                .expect("truncate");
            append_all(
                &mut log,
                (15..=30).map(|index| big_entry(2, index, size)).collect(),
            )
            .await;
            log.purge(LogId::new(openraft::CommittedLeaderId::new(2, 1), 20))
                .await
                .expect("purge");
            // The purge is written with the next batch's sync; one more append waits for it.
            append_all(&mut log, vec![big_entry(2, 31, size)]).await;
            let segments_after = wal::disk_bytes(&wal_dir) / wal::SEGMENT_BYTES;
            assert!(
                segments_after < segments_before,
                "purged segments are deleted: {segments_before} -> {segments_after}"
            );
        }
        let mut log = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(Vote::new_committed(2, 1))
        );
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(20));
        assert_eq!(
            state.last_log_id.map(|l| (l.index, l.leader_id.term)),
            Some((31, 2))
        );
        let entries = log.try_get_log_entries(0..100).await.expect("read");
        assert_eq!(
            terms(&entries),
            (21..=31).map(|index| (index, 2)).collect::<Vec<_>>()
        );
        // Entry 25 read back whole (its data, from its segment or memory).
        let found = entries.iter().find(|e| e.log_id.index == 25).expect("25");
        let data = match &found.payload {
            openraft::EntryPayload::Normal(command) => match command.op() {
                Op::Changes(changes) => match changes.first().map(|t| &t.change) {
                    Some(super::super::op::Change::Write(resource, _)) => {
                        resource.data.as_ref().map(|any| any.value.clone())
                    }
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        assert!(
            data.is_some_and(|value| value == vec![25u8; size]),
            "entry 25 is not the write it was"
        );
    }

    #[test]
    fn recent_entries_are_bounded_oldest_first() {
        let mut tail = Tail::default();
        let total = RECENT_ENTRIES as u64 + 10;
        for index in 1..=total {
            let e = entry(1, index);
            tail.pending.insert(index, e.clone());
            tail.flushed(&e);
        }
        assert_eq!(tail.recent.len(), RECENT_ENTRIES);
        assert_eq!(tail.recent.first_key_value().map(|(i, _)| *i), Some(11));
        assert!(
            tail.cached(10, 12).is_none(),
            "evicted entries come from disk"
        );
        assert!(tail.recent_bytes <= RECENT_BYTES);
    }
}
