//! [`LogStore`]: the Raft log in LMDB, with group commit.
//!
//! `append` makes entries readable at once (an in-memory tail) and queues them for a writer
//! thread. The writer takes everything queued, writes it in one LMDB transaction, commits (one
//! fsync for the whole batch), and only then reports the entries flushed. Votes are written the
//! same way and acknowledged after their commit, so both are durable before openraft relies on
//! them. Truncate and purge go through the same queue, so the disk sees operations in order.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogReader, StorageIOError};

use super::schema::{self, LmdbEnv, LogDbs};
use super::types::{Entry, LogId, RaftStorageError, TypeConfig, Vote, decode, encode};

/// How many queued operations one commit takes at most.
const MAX_BATCH_OPS: usize = 4096;
/// Flushed entries kept in memory for readers (replication to each follower and apply read
/// every entry right after its flush): at most this many, and at most [`RECENT_BYTES`] of
/// commands (each counted twice: its encoding and its decoded form); the oldest go first.
const RECENT_ENTRIES: usize = 4096;
const RECENT_BYTES: usize = 8 << 20;

/// The log store; clones share the same log.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<LogInner>,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

struct LogInner {
    env: LmdbEnv,
    dbs: LogDbs,
    tail: Arc<Mutex<Tail>>,
    writer: Mutex<Option<mpsc::Sender<WriteOp>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<LogStats>,
}

/// Counters for benchmarks and metrics.
#[derive(Debug, Default)]
pub struct LogStats {
    /// LMDB commits of the log (each one fsync).
    pub commits: AtomicU64,
    /// Entries written by those commits.
    pub entries: AtomicU64,
    /// Resource writes and deletes in those entries (a batch entry holds many).
    pub operations: AtomicU64,
    /// The last committed index openraft reported.
    pub committed: AtomicU64,
    /// Where commit durations go, once the node has its metrics.
    pub metrics: std::sync::OnceLock<crate::metrics::StorageMetrics>,
    /// Held (write-locked) by a test, keeps the writer from committing: a disk that stalls.
    #[cfg(test)]
    pub(crate) stall: tokio::sync::RwLock<()>,
}

/// What readers see beyond the disk: entries queued but not yet committed, the latest flushed
/// entries (the same as on disk, kept so readers need not decode them again), and the bounds of
/// the visible log.
#[derive(Default)]
struct Tail {
    pending: BTreeMap<u64, Entry>,
    recent: BTreeMap<u64, Entry>,
    recent_bytes: usize,
    last: Option<LogId>,
    purged: Option<LogId>,
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
    Append(Vec<Entry>, LogFlushed<TypeConfig>),
    Truncate(u64),
    Purge(LogId),
    Meta {
        key: &'static str,
        value: Vec<u8>,
        done: Option<tokio::sync::oneshot::Sender<io::Result<()>>>,
    },
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
    pub fn open(data_dir: &Path) -> Result<LogStore, heed::Error> {
        let (env, dbs) = schema::open_log(data_dir)?;
        let (last, purged) = {
            let rtxn = env.read_txn()?;
            let purged: Option<LogId> = match dbs.meta.get(&rtxn, schema::META_LAST_PURGED)? {
                Some(bytes) => decode(bytes).map_err(|e| heed::Error::Decoding(e))?,
                None => None,
            };
            let last = match dbs.entries.last(&rtxn)? {
                Some((_, bytes)) => Some(
                    decode::<Entry>(bytes)
                        .map_err(|e| heed::Error::Decoding(e))?
                        .log_id,
                ),
                None => None,
            };
            (last.or(purged), purged)
        };
        let stats = Arc::new(LogStats::default());
        let tail = Arc::new(Mutex::new(Tail {
            last,
            purged,
            ..Tail::default()
        }));
        let (sender, receiver) = mpsc::channel();
        let writer = Writer {
            env: env.clone(),
            dbs,
            tail: tail.clone(),
            stats: stats.clone(),
        };
        let writer_thread = std::thread::Builder::new()
            .name("resd-raft-log".into())
            .spawn(move || writer.run(receiver))?;
        Ok(LogStore {
            inner: Arc::new(LogInner {
                env,
                dbs,
                tail,
                writer: Mutex::new(Some(sender)),
                writer_thread: Mutex::new(Some(writer_thread)),
                stats,
            }),
        })
    }

    pub fn stats(&self) -> Arc<LogStats> {
        self.inner.stats.clone()
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

    fn read_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, RaftStorageError> {
        let rtxn = self.inner.env.read_txn().map_err(read_error)?;
        match self.inner.dbs.meta.get(&rtxn, key).map_err(read_error)? {
            Some(bytes) => Ok(Some(decode(bytes).map_err(read_error)?)),
            None => Ok(None),
        }
    }

    async fn write_meta_durably<T: serde::Serialize>(
        &self,
        key: &'static str,
        value: &T,
    ) -> Result<(), RaftStorageError> {
        let (done, flushed) = tokio::sync::oneshot::channel();
        self.send(WriteOp::Meta {
            key,
            value: encode(value).map_err(write_error)?,
            done: Some(done),
        })?;
        match flushed.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(write_error(error)),
            Err(_) => Err(write_error(
                "the log writer thread stopped before the write was durable",
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
    env: LmdbEnv,
    dbs: LogDbs,
    tail: Arc<Mutex<Tail>>,
    stats: Arc<LogStats>,
}

impl Writer {
    fn run(self, receiver: mpsc::Receiver<WriteOp>) {
        while let Ok(first) = receiver.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH_OPS {
                match receiver.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            #[cfg(test)]
            let stalled = self.stats.stall.blocking_read();
            let started = std::time::Instant::now();
            let result = write_batch(&self.env, &self.dbs, &batch);
            #[cfg(test)]
            drop(stalled);
            if let Some(metrics) = self.stats.metrics.get() {
                metrics.synced("log", started.elapsed().as_secs_f64());
            }
            if result.is_ok() {
                self.forget_flushed(&batch);
            }
            for op in batch {
                let outcome = result.as_ref().map(|_| ()).map_err(io_error);
                match op {
                    WriteOp::Append(_, callback) => callback.log_io_completed(outcome),
                    WriteOp::Meta {
                        done: Some(done), ..
                    } => {
                        let _ = done.send(outcome);
                    }
                    WriteOp::Meta { done: None, .. } | WriteOp::Truncate(_) | WriteOp::Purge(_) => {
                        if let Err(error) = outcome {
                            tracing::error!(%error, "raft log write failed");
                        }
                    }
                }
            }
        }
    }

    /// Entries now on disk leave the pending tail for the recent ones (unless a truncate
    /// replaced them meanwhile).
    fn forget_flushed(&self, batch: &[WriteOp]) {
        let mut entry_count = 0u64;
        let mut operation_count = 0u64;
        let mut tail = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        for op in batch {
            if let WriteOp::Append(entries, _) = op {
                entry_count += entries.len() as u64;
                operation_count += entries.iter().map(operations_in).sum::<u64>();
                for entry in entries {
                    tail.flushed(entry);
                }
            }
        }
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        self.stats.entries.fetch_add(entry_count, Ordering::Relaxed);
        self.stats
            .operations
            .fetch_add(operation_count, Ordering::Relaxed);
    }
}

/// Resource writes and deletes an entry carries.
fn operations_in(entry: &Entry) -> u64 {
    match &entry.payload {
        openraft::EntryPayload::Normal(command) => command.op().change_count() as u64,
        _ => 0,
    }
}

fn write_batch(env: &LmdbEnv, dbs: &LogDbs, batch: &[WriteOp]) -> Result<(), heed::Error> {
    let mut wtxn = env.write_txn()?;
    for op in batch {
        match op {
            WriteOp::Append(entries, _) => {
                for entry in entries {
                    let bytes = encode(entry).map_err(|e| heed::Error::Encoding(e))?;
                    dbs.entries.put(&mut wtxn, &entry.log_id.index, &bytes)?;
                }
            }
            WriteOp::Truncate(from) => {
                dbs.entries.delete_range(&mut wtxn, &(*from..))?;
            }
            WriteOp::Purge(upto) => {
                dbs.entries.delete_range(&mut wtxn, &(..=upto.index))?;
                let bytes = encode(&Some(*upto)).map_err(|e| heed::Error::Encoding(e))?;
                dbs.meta.put(&mut wtxn, schema::META_LAST_PURGED, &bytes)?;
            }
            WriteOp::Meta { key, value, .. } => dbs.meta.put(&mut wtxn, key, value)?,
        }
    }
    wtxn.commit()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
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
        if let Some(entries) = tail.cached(start, end) {
            return Ok(entries);
        }
        // Disk entries overlaid with the pending tail (which wins: it may hold re-appended
        // entries that replace truncated ones not yet deleted on disk).
        let rtxn = self.inner.env.read_txn().map_err(read_error)?;
        let mut merged: BTreeMap<u64, Entry> = BTreeMap::new();
        for item in self
            .inner
            .dbs
            .entries
            .range(&rtxn, &(start..end))
            .map_err(read_error)?
        {
            let (index, bytes) = item.map_err(read_error)?;
            if !tail.pending.contains_key(&index) {
                merged.insert(index, decode(bytes).map_err(read_error)?);
            }
        }
        for (index, entry) in tail.pending.range(start..end) {
            merged.insert(*index, entry.clone());
        }
        // Return the contiguous run from the first entry found; the log never has holes, so a
        // gap can only mean the caller asked past the end.
        let mut entries = Vec::with_capacity(merged.len());
        for (index, entry) in merged {
            if entries
                .last()
                .is_some_and(|previous: &Entry| previous.log_id.index + 1 != index)
            {
                break;
            }
            entries.push(entry);
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
        self.write_meta_durably(schema::META_VOTE, vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, RaftStorageError> {
        self.read_meta(schema::META_VOTE)
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
        let entries: Vec<Entry> = entries.into_iter().collect();
        {
            let mut tail = self.tail();
            for entry in &entries {
                tail.pending.insert(entry.log_id.index, entry.clone());
                tail.last = Some(entry.log_id);
            }
        }
        self.send(WriteOp::Append(entries, callback))
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
