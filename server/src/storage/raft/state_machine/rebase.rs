//! Rebasing the live state onto the snapshot just built: a copy of the snapshot's file becomes
//! a new environment generation, the raft log's entries applied since the snapshot are written
//! into it again, and it replaces the live one — what recovery does after an unclean stop,
//! done online.
//!
//! Why: the live B-tree is written in commit order, and a page LMDB splits in the middle stays
//! half full; a snapshot is repacked with every page full (at a million resources of 1 KiB,
//! about 2.0 GB live against 1.3 GB repacked). And every page the live file's readers touch
//! stays mapped in this process (the kernel maps up to 16 cached neighbours of each page read),
//! so a long-lived map counts the whole file in the node's RSS; a new map starts empty.
//!
//! The catch-up runs outside the apply lock while many entries remain, then under it (apply
//! waits) for the last few, and the swap happens there: a reader holding the old environment
//! reads on from it (its map stays valid until the last one drops it), and the next reader
//! gets the new one. Watchers notice nothing: the state is the same, entry for entry. A
//! rebase that fails anywhere (the disk, the log no longer holding an entry, the node
//! closing) is abandoned: its copy is removed and the live state stays as it was.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::log_store::LogHandle;
use super::super::schema;
use super::super::schema::SmDbs;
use super::counts::{Counts, KindCounts};
use super::recovery::write_current;
use super::{SmEnv, SmShared, lock, read_applied, write_entries};

/// Entries a catch-up reads and writes in one transaction, and the bytes of commands it reads
/// at most (one entry at least: a restore's chunk is up to 8 MiB).
const CATCH_UP_CHUNK: u64 = 256;
const CATCH_UP_BYTES: usize = 16 << 20;
/// At most this many entries are written under the apply lock (apply waits meanwhile); while
/// more remain, the catch-up goes on without it.
const FINAL_CATCH_UP: u64 = 512;
/// Catch-ups without the lock before the last one. Each round usually leaves fewer (apply
/// does what the catch-up does, plus raft's work), but a disk or a load can outrun it: when
/// more than twice [`FINAL_CATCH_UP`] remain after these, the rebase is abandoned rather than
/// holding apply for them.
const CATCH_UP_ROUNDS: usize = 16;

/// Why a rebase was abandoned.
#[derive(Debug, thiserror::Error)]
pub(super) enum RebaseError {
    #[error("copying the snapshot: {0}")]
    Copy(std::io::Error),
    #[error("the copy: {0}")]
    Copied(heed::Error),
    #[error("reading the live state's last applied entry: {0}")]
    Live(heed::Error),
    #[error("reading the raft log: {0}")]
    Log(String),
    #[error("the raft log no longer holds entry {0}")]
    Gap(u64),
    #[error("the state machine closed")]
    Closed,
    #[error("the disk has {free} free, and a copy of the state with room to spare needs {needed}")]
    NoRoom { free: String, needed: String },
    #[error(
        "apply outran the catch-up ({left} entries still to write after {CATCH_UP_ROUNDS} rounds)"
    )]
    Outrun { left: u64 },
}

/// What a rebase did, for the log.
#[derive(Debug)]
pub(super) struct Rebased {
    pub generation: u64,
    /// Entries written again after the copy.
    pub caught_up: u64,
    /// The live file before and after, in bytes.
    pub before: u64,
    pub after: u64,
}

impl SmShared {
    /// Reads committed entries through `log` from now on (rebases need it; without it there
    /// is none).
    pub(crate) fn use_log(&self, log: LogHandle) {
        let _ = self.log.set(log);
    }

    /// Rebases the live state onto `snapshot`, the data file of the snapshot just built, which
    /// holds `counts` resources per kind (see the module's doc); logs what it did, or why it
    /// was abandoned.
    pub(super) fn rebase_onto(&self, snapshot: &Path, counts: Counts) {
        let Some(log) = self.log.get() else {
            return;
        };
        // One at a time, and never with an install (both make the next generation, and the
        // generation copied from stays the live one until the swap).
        let _rebasing = lock(&self.rebasing);
        let started = std::time::Instant::now();
        let rebased = self.try_rebase(snapshot, log, counts);
        if let Some(metrics) = self.metrics.get() {
            let outcome = if rebased.is_ok() { "done" } else { "abandoned" };
            metrics
                .state_rebases
                .get_or_create(&vec![("outcome", outcome.to_owned())])
                .inc();
            if let Ok(rebased) = &rebased {
                metrics.state_rebase_entries.inc_by(rebased.caught_up);
            }
        }
        match rebased {
            Ok(rebased) => tracing::info!(
                generation = rebased.generation,
                caught_up = rebased.caught_up,
                before = %proto::bytes_label(rebased.before),
                after = %proto::bytes_label(rebased.after),
                took_ms = started.elapsed().as_millis() as u64,
                "rebased the live state onto the new snapshot"
            ),
            Err(error) => tracing::warn!(
                %error,
                "rebasing the live state onto the new snapshot was abandoned; it stays as it was"
            ),
        }
    }

    fn try_rebase(
        &self,
        snapshot: &Path,
        log: &LogHandle,
        counts: Counts,
    ) -> Result<Rebased, RebaseError> {
        // Kept through the catch-up as apply keeps the live ones: the copy's counts at the swap.
        let mut counts = KindCounts::Known(counts);
        let old = self.current();
        let generation = old.generation + 1;
        let dir = schema::sm_generation_dir(&self.data_dir, generation);
        let rebased = (|| {
            if self.closed.load(Ordering::SeqCst) {
                return Err(RebaseError::Closed);
            }
            self.room_for_copy(snapshot)?;
            schema::new_generation(&self.data_dir, generation, Some(snapshot))
                .map_err(RebaseError::Copy)?;
            let (env, dbs) = schema::open_sm(&dir, self.map_size).map_err(RebaseError::Copied)?;
            let new = Arc::new(SmEnv {
                env,
                dbs,
                generation,
                file: std::sync::OnceLock::new(),
            });
            // The index of the first entry the copy lacks.
            let mut next = {
                let rtxn = new.env.read_txn().map_err(RebaseError::Copied)?;
                next_index(&new.dbs, &rtxn).map_err(RebaseError::Copied)?
            };
            let mut caught_up = 0;
            for _ in 0..CATCH_UP_ROUNDS {
                let live = self.live_next()?;
                if live.saturating_sub(next) <= FINAL_CATCH_UP {
                    break;
                }
                caught_up += self.catch_up(&new, log, next, live, &mut counts)?;
                next = live;
            }
            // Apply writes into room it has (see `ensure_room`) from the swap on.
            self.ensure_room(&new, super::ROOM_AHEAD)
                .map_err(RebaseError::Copy)?;
            let events = lock(&self.events);
            if self.closed.load(Ordering::SeqCst) {
                return Err(RebaseError::Closed);
            }
            let live = self.live_next()?;
            let left = live.saturating_sub(next);
            if left > 2 * FINAL_CATCH_UP {
                return Err(RebaseError::Outrun { left });
            }
            caught_up += self.catch_up(&new, log, next, live, &mut counts)?;
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = new.clone();
            *lock(&self.kind_counts) = counts;
            // CURRENT names the new generation before a clean stop (which takes this lock)
            // can sync it and mark it clean.
            let named = write_current(&self.data_dir, generation);
            drop(events);
            Ok((new, caught_up, named))
        })();
        let (new, caught_up, named) = match rebased {
            Ok(rebased) => rebased,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(error);
            }
        };
        match named {
            // The old generation is named nowhere: its files go (a reader still holding it
            // reads on from its map).
            Ok(()) => {
                let _ = std::fs::remove_dir_all(schema::sm_generation_dir(
                    &self.data_dir,
                    old.generation,
                ));
            }
            // Both generations stay: whichever CURRENT names at the next start, a clean stop's
            // marker (the sum of the new one's file) says whether it can be used as it is, and
            // it is rebuilt from the snapshot otherwise, as after a crash.
            Err(error) => tracing::warn!(
                %error,
                "cannot record the rebased generation; the previous one is kept for the next start"
            ),
        }
        let before = old.env.real_disk_size().unwrap_or(0);
        drop(old);
        self.measure_state();
        Ok(Rebased {
            generation,
            caught_up,
            before,
            after: new.env.real_disk_size().unwrap_or(0),
        })
    }

    /// Whether the disk has room for a copy of `snapshot` and then some: a rebase must never
    /// be what fills it (apply would wait for space).
    fn room_for_copy(&self, snapshot: &Path) -> Result<(), RebaseError> {
        let Some(disk) = self.disk.get() else {
            return Ok(());
        };
        let size = std::fs::metadata(snapshot)
            .map_err(RebaseError::Copy)?
            .len();
        let needed = size
            .saturating_add(disk.reserve())
            .saturating_add(super::ROOM_WATCH);
        let free = disk.refresh().map_err(RebaseError::Copy)?;
        if free < needed {
            return Err(RebaseError::NoRoom {
                free: proto::bytes_label(free),
                needed: proto::bytes_label(needed),
            });
        }
        Ok(())
    }

    /// The index of the first entry the live state has not applied.
    fn live_next(&self) -> Result<u64, RebaseError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(RebaseError::Live)?;
        next_index(&sm.dbs, &rtxn).map_err(RebaseError::Live)
    }

    /// Writes the entries from `next` up to `end` (excluded) into `new`, a chunk per
    /// transaction, and what they create and delete into `counts`; how many.
    fn catch_up(
        &self,
        new: &SmEnv,
        log: &LogHandle,
        mut next: u64,
        end: u64,
        counts: &mut KindCounts,
    ) -> Result<u64, RebaseError> {
        let from = next;
        while next < end {
            if self.closed.load(Ordering::SeqCst) {
                return Err(RebaseError::Closed);
            }
            let chunk_end = (next + CATCH_UP_CHUNK).min(end);
            let entries = log
                .entries(next..chunk_end, CATCH_UP_BYTES)
                .map_err(|error| RebaseError::Log(error.to_string()))?;
            // The log has no holes: a run that does not start at `next` means it was purged
            // (or truncated) there. A shorter run is the byte budget: the rest comes next.
            let Some(last) = entries.last().map(|entry| entry.log_id.index) else {
                return Err(RebaseError::Gap(next));
            };
            if entries.first().map(|entry| entry.log_id.index) != Some(next) {
                return Err(RebaseError::Gap(next));
            }
            let mut wtxn = new.env.write_txn().map_err(RebaseError::Copied)?;
            let mut published = Vec::new();
            write_entries(&new.dbs, &mut wtxn, entries, None, None, &mut published)
                .map_err(RebaseError::Copied)?;
            wtxn.commit().map_err(RebaseError::Copied)?;
            counts.applied(&published);
            next = last + 1;
        }
        Ok(end.saturating_sub(from))
    }
}

/// The index of the first entry a state has not applied (0 when it has applied none).
fn next_index(dbs: &SmDbs, rtxn: &heed::RoTxn<'_, heed::WithoutTls>) -> heed::Result<u64> {
    Ok(read_applied(dbs, rtxn)?
        .0
        .map_or(0, |log_id| log_id.index + 1))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::storage::conformance::Fixture;
    use crate::storage::raft::tests::Member;
    use crate::storage::{Backend, Consistency, Operation, WatchOptions};
    use futures::StreamExt;

    /// Writes under load while snapshots are built every 300 writes, so rebases catch up with
    /// applies running beside them: every acknowledged write is in the rebased state at the
    /// version it was acknowledged with, the old generation is gone, and a watcher sees each
    /// write exactly once, in order, without a reset.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rebase_swaps_in_a_dense_copy_holding_every_write_and_watchers_notice_nothing() {
        let member = Member::single_configured(|options| options.snapshot_every = 300).await;
        let backend = member.backend();
        let fixture = Arc::new(Fixture::new());
        let mut watch = backend
            .watch_list(
                &fixture.artist_type(),
                &fixture.wildcard(),
                "",
                None,
                WatchOptions::default(),
            )
            .await
            .expect("watch");
        const WRITERS: usize = 16;
        const EACH: usize = 100;
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let backend = backend.clone();
            let fixture = fixture.clone();
            writers.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for index in 0..EACH {
                    // Names interleave across writers: pages split in the middle of the tree.
                    let mut artist = fixture.artist(&format!("a-{index:04}-{writer:02}"));
                    artist.data = Some(prost_types::Any {
                        type_url: "demo".into(),
                        value: vec![writer as u8; 1024],
                    });
                    let written = backend.write_cas(artist).await.expect("write");
                    let id = written.id.clone().expect("id");
                    acked.push((id.name, written.version));
                }
                acked
            }));
        }
        let mut acked = BTreeMap::new();
        for writer in writers {
            acked.extend(writer.await.expect("writer"));
        }
        let sm = member.state_machine();
        let deadline = Instant::now() + Duration::from_secs(30);
        while sm.current().generation == 0 {
            assert!(Instant::now() < deadline, "no rebase within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let metrics = sm.metrics.get().expect("metrics");
        let abandoned = metrics
            .state_rebases
            .get_or_create(&vec![("outcome", "abandoned".to_owned())])
            .get();
        assert_eq!(abandoned, 0, "no rebase was abandoned");
        assert!(
            metrics.state_rebase_entries.get() > 0,
            "rebases caught up with writes applied while they copied"
        );
        // The counts per kind came with the rebase (nobody asked for them), and are the
        // state's: the snapshot's, and what the catch-up and apply created since.
        {
            let _applying = lock(&sm.events);
            let KindCounts::Known(known) = &*lock(&sm.kind_counts) else {
                panic!("a rebase leaves the counts known");
            };
            let live = sm.current();
            let rtxn = live.env.read_txn().expect("txn");
            let scanned = super::super::scan_kinds(&live, &rtxn).expect("scan");
            assert_eq!(
                super::super::counts::labelled(known),
                super::super::counts::labelled(&scanned)
            );
            assert_eq!(
                super::super::counts::labelled(known).values().sum::<u64>(),
                (WRITERS * EACH) as u64
            );
        }
        let listed: BTreeMap<String, String> = backend
            .list(
                Consistency::Strong,
                &fixture.artist_type(),
                &fixture.wildcard(),
                "",
            )
            .await
            .expect("list")
            .into_iter()
            .map(|resource| (resource.id.unwrap_or_default().name, resource.version))
            .collect();
        assert_eq!(listed, acked, "every write, at its acknowledged version");

        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while seen.len() < WRITERS * EACH {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = tokio::time::timeout(left, watch.next())
                .await
                .expect("every event within 30 s")
                .expect("the watch goes on")
                .expect("no reset")
                .into_event();
            match event.operation {
                Operation::Upsert(resource) => seen.push((
                    event.version.parse::<crate::storage::Version>().expect("v"),
                    resource.id.unwrap_or_default().name,
                )),
                Operation::EndOfSnapshot => {}
                other => panic!("unexpected event {other:?}"),
            }
        }
        assert!(seen.is_sorted(), "events in version order");
        let names: std::collections::BTreeSet<&String> = seen.iter().map(|(_, n)| n).collect();
        assert_eq!(names.len(), WRITERS * EACH, "each write once");

        let generation = sm.current().generation;
        let current =
            std::fs::read_to_string(member.data_dir().join(schema::SM_CURRENT)).expect("CURRENT");
        assert!(
            current.trim().parse::<u64>().expect("number") <= generation,
            "CURRENT names a generation that exists"
        );
        let generations = std::fs::read_dir(member.data_dir().join(schema::SM_DIR))
            .expect("sm dir")
            .flatten()
            .filter(|entry| entry.path().is_dir())
            .count();
        assert!(
            generations <= 2,
            "old generations are removed ({generations} left)"
        );
    }
}

#[cfg(test)]
mod abandoned {
    use openraft::RaftSnapshotBuilder;
    use openraft::storage::RaftStateMachine;

    use super::super::super::log_store::LogStore;
    use super::super::super::tests::{names, write_entry};
    use super::super::StateMachineStore;
    use super::*;

    /// A rebase that cannot catch up (the log no longer holds the entries after the snapshot,
    /// or has closed) or finds no room on the disk changes nothing: the live generation stays,
    /// its copy is removed, and apply goes on in the live state.
    #[tokio::test]
    async fn a_rebase_the_log_cannot_feed_leaves_the_live_state_as_it_was() {
        let dir = tempfile::tempdir().expect("dir");
        let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
        sm.apply(vec![write_entry(1, "in-snapshot")])
            .await
            .expect("apply");
        let snapshot = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("snapshot");
        sm.apply(vec![write_entry(2, "after-snapshot")])
            .await
            .expect("apply");
        let path = snapshot.snapshot.path.clone();

        // An empty log (as one purged past the snapshot): entry 2 is not there.
        let log_dir = tempfile::tempdir().expect("dir");
        let log = LogStore::open(log_dir.path()).expect("log");
        let error = sm
            .shared
            .try_rebase(&path, &log.handle(), Counts::new())
            .expect_err("nothing to catch up from");
        assert!(matches!(error, RebaseError::Gap(2)), "{error}");
        // A closed log.
        let handle = log.handle();
        drop(log);
        let error = sm
            .shared
            .try_rebase(&path, &handle, Counts::new())
            .expect_err("the log closed");
        assert!(matches!(error, RebaseError::Log(_)), "{error}");

        // A disk without room for a copy and then some: nothing is copied at all.
        let log = LogStore::open(log_dir.path()).expect("log");
        sm.shared
            .use_disk(Arc::new(super::super::super::disk::DiskSpace::new(
                dir.path(),
                u64::MAX / 4,
            )));
        let error = sm
            .shared
            .try_rebase(&path, &log.handle(), Counts::new())
            .expect_err("no room");
        assert!(matches!(error, RebaseError::NoRoom { .. }), "{error}");
        assert_eq!(
            sm.shared.current().generation,
            0,
            "the live generation stays"
        );
        assert!(
            !schema::sm_generation_dir(dir.path(), 1).exists(),
            "the copy is removed"
        );
        sm.apply(vec![write_entry(3, "later")])
            .await
            .expect("apply");
        assert_eq!(names(&sm), ["after-snapshot", "in-snapshot", "later"]);
    }
}
