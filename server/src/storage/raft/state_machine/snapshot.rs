//! Raft snapshots: repacked copies of the state machine's LMDB file, built off the async
//! threads, and installed (after their contents are checked) by opening the received file as a
//! new environment generation and swapping it in.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use heed::types::Bytes;
use heed::{Database, PutFlags};
use openraft::RaftSnapshotBuilder;

use super::super::schema;
use super::super::types::{RaftStorageError, Snapshot, SnapshotFile, SnapshotMeta, TypeConfig};
use super::counts::{Counts, KeyTally};
use super::recovery::write_current;
use super::{SmEnv, SmShared, StateMachineStore, lock, read_applied, snapshot_error};
use crate::storage::Version;
use crate::wire::raft::encode;

/// Records a repacking copies per transaction of the copy.
const REPACK_BATCH: usize = 8_192;

/// Why a repacking failed: reading the live state (damage: raft must not go on from it) or
/// writing the copy (the disk: raft can go on with the snapshot it has).
#[derive(Debug, thiserror::Error)]
enum RepackError {
    #[error("reading the state: {0}")]
    Reading(heed::Error),
    #[error("writing the copy: {0}")]
    Writing(heed::Error),
}

/// Copies every database of `from` into a new state machine environment in `dir`, as of one
/// read transaction, in key order and appended, so every page of the copy is full. LMDB's own
/// compacting copy keeps each page as it is, and a B-tree written out of order keeps its leaves
/// half to two thirds full: at a million resources of 1 KiB, 1.96 GB copied that way against
/// about 1.3 GB repacked (less disk, less to send a joining node, and a node that installs the
/// snapshot or rebuilds from it starts with a dense state).
fn repack(from: &SmEnv, dir: &Path, map_size: usize) -> Result<Counts, RepackError> {
    let (env, dbs) = schema::open_sm(dir, map_size).map_err(RepackError::Writing)?;
    let copied = (|| {
        let rtxn = from.env.read_txn().map_err(RepackError::Reading)?;
        // The resources per kind, counted as they are copied: what a rebase onto this copy
        // starts from (see `counts`).
        let mut tally = KeyTally::default();
        copy_appending(
            from.dbs.resources,
            dbs.resources,
            &rtxn,
            &env,
            PutFlags::APPEND,
            Some(&mut tally),
        )?;
        for (source, target) in [
            (from.dbs.restore, dbs.restore),
            (from.dbs.requests, dbs.requests),
            (from.dbs.request_order, dbs.request_order),
            (from.dbs.history, dbs.history),
            (from.dbs.history_expiry, dbs.history_expiry),
            (from.dbs.restore_history, dbs.restore_history),
            (
                from.dbs.owners.remap_data_type::<Bytes>(),
                dbs.owners.remap_data_type::<Bytes>(),
            ),
        ] {
            copy_appending(source, target, &rtxn, &env, PutFlags::APPEND, None)?;
        }
        // The new environment already holds its format marker: meta (a few keys) is put.
        copy_appending(
            from.dbs.meta.remap_key_type::<Bytes>(),
            dbs.meta.remap_key_type::<Bytes>(),
            &rtxn,
            &env,
            PutFlags::empty(),
            None,
        )?;
        Ok(tally.finish())
    })();
    env.prepare_for_closing().wait();
    copied
}

fn copy_appending(
    source: Database<Bytes, Bytes>,
    target: Database<Bytes, Bytes>,
    rtxn: &heed::RoTxn<'_, heed::WithoutTls>,
    env: &schema::LmdbEnv,
    flags: PutFlags,
    mut tally: Option<&mut KeyTally>,
) -> Result<(), RepackError> {
    let mut records = source.iter(rtxn).map_err(RepackError::Reading)?;
    loop {
        let mut wtxn = env.write_txn().map_err(RepackError::Writing)?;
        let mut copied = 0;
        for item in records.by_ref().take(REPACK_BATCH) {
            let (key, value) = item.map_err(RepackError::Reading)?;
            if let Some(tally) = tally.as_deref_mut() {
                tally.key(key);
            }
            target
                .put_with_flags(&mut wtxn, flags, key, value)
                .map_err(RepackError::Writing)?;
            copied += 1;
        }
        wtxn.commit().map_err(RepackError::Writing)?;
        if copied < REPACK_BATCH {
            return Ok(());
        }
    }
}

impl SmShared {
    /// Copies the state machine into a repacked LMDB file and records it as the current snapshot.
    pub(super) fn build_snapshot_blocking(&self) -> Result<Snapshot, RaftStorageError> {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let building = schema::building_snapshot_dir(&self.data_dir, sequence);
        let built = self.build_snapshot_in(&building, sequence);
        match built {
            Ok((snapshot, counts)) => {
                self.rebase_onto(&snapshot.snapshot.path, counts);
                Ok(snapshot)
            }
            // A copy that failed is no snapshot: its gigabytes go now, not at the next start.
            Err(error) => {
                if building.is_dir() {
                    let _ = std::fs::remove_dir_all(&building);
                }
                Err(error)
            }
        }
    }

    /// Builds the snapshot in `building`: it, and the resources per kind it holds.
    fn build_snapshot_in(
        &self,
        building: &Path,
        sequence: u64,
    ) -> Result<(Snapshot, Counts), RaftStorageError> {
        let sm = self.current();
        // Taken before the copy reads the state: writes applied while it copies count toward
        // the next snapshot.
        let mark = self.cadence.mark();
        let snapshots = self.data_dir.join(schema::SNAPSHOT_DIR);
        std::fs::create_dir_all(building).map_err(snapshot_error)?;
        let target = building.join(schema::SNAPSHOT_DATA);
        let copy = || {
            let _ = std::fs::remove_file(&target);
            let _ = std::fs::remove_file(building.join(schema::SNAPSHOT_LOCK));
            repack(&sm, building, self.map_size)
        };
        let counts = super::super::disk::wait_out(
            self.disk.get().map(|disk| &**disk),
            "building a raft snapshot",
            |error: &RepackError| matches!(error, RepackError::Writing(error) if super::super::disk::is_lmdb_no_space(error)),
            copy,
        );
        let counts = match counts {
            Ok(counts) => counts,
            Err(error) => {
                if let RepackError::Reading(_) = error {
                    self.found_damage_saying(format!(
                        "building a raft snapshot could not read the state machine: {error}"
                    ));
                }
                return Err(snapshot_error(error));
            }
        };
        // Every record of the copy passes its seal (as a follower receiving it will check): a
        // record damaged in the live state, and never read since, must not become the snapshot
        // the log is purged behind.
        if let Err(why) = check_received(building, self.map_size) {
            let _ = std::fs::remove_dir_all(building);
            self.found_damage_saying(format!(
                "building a raft snapshot found the state machine damaged: {why}"
            ));
            return Err(snapshot_error(why));
        }
        // The copy is consistent on its own: read what it holds, not what the live state holds now.
        let (last_applied, membership) = {
            let (env, dbs) = schema::open_sm(building, self.map_size).map_err(snapshot_error)?;
            let rtxn = env.read_txn().map_err(snapshot_error)?;
            let (last_applied, membership) = read_applied(&dbs, &rtxn).map_err(snapshot_error)?;
            drop(rtxn);
            env.prepare_for_closing().wait();
            (last_applied, membership)
        };
        let snapshot_id = schema::snapshot_id(
            last_applied.map(|log_id| (log_id.leader_id.term, log_id.index)),
            sequence,
        );
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: snapshot_id.clone(),
        };
        std::fs::write(building.join(schema::SNAPSHOT_META), encode(&meta))
            .map_err(snapshot_error)?;
        // The snapshot is what the state machine is rebuilt from after an unclean stop, and the
        // log is purged behind it: it must be on disk before openraft learns of it.
        schema::sync_file(&building.join(schema::SNAPSHOT_DATA)).map_err(snapshot_error)?;
        schema::sync_file(&building.join(schema::SNAPSHOT_META)).map_err(snapshot_error)?;
        schema::write_snapshot_sum(building).map_err(snapshot_error)?;
        let final_dir = schema::snapshot_dir(&self.data_dir, &snapshot_id);
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(building, &final_dir).map_err(snapshot_error)?;
        schema::sync_dir(&snapshots).map_err(snapshot_error)?;
        self.set_current_snapshot(meta.clone(), final_dir.join(schema::SNAPSHOT_DATA));
        self.cadence.snapshot_taken(mark);
        tracing::info!(snapshot_id, "built a raft snapshot");
        let snapshot = Snapshot {
            meta,
            snapshot: Box::new(SnapshotFile {
                path: final_dir.join(schema::SNAPSHOT_DATA),
            }),
        };
        Ok((snapshot, counts))
    }

    /// Records the current snapshot and removes older ones.
    fn set_current_snapshot(&self, meta: SnapshotMeta, path: PathBuf) {
        let keep = path.parent().map(Path::to_path_buf);
        let previous = lock(&self.snapshot).replace((meta, path));
        if let Some((_, old)) = previous
            && let Some(old_dir) = old.parent()
            && Some(old_dir.to_path_buf()) != keep
        {
            let _ = std::fs::remove_dir_all(old_dir);
        }
    }

    pub(super) fn install_snapshot_blocking(
        &self,
        meta: SnapshotMeta,
        file: SnapshotFile,
    ) -> Result<(), RaftStorageError> {
        let _rebasing = lock(&self.rebasing);
        let old = self.current();
        let generation = old.generation + 1;
        let generation_dir = schema::new_generation(&self.data_dir, generation, Some(&file.path))
            .map_err(snapshot_error)?;
        let (env, dbs) = schema::open_sm(&generation_dir, self.map_size).map_err(snapshot_error)?;

        // Keep the received file as this node's current snapshot.
        let snapshot_dir = schema::snapshot_dir(&self.data_dir, &meta.snapshot_id);
        if file.path.parent() != Some(snapshot_dir.as_path()) {
            let _ = std::fs::remove_dir_all(&snapshot_dir);
            std::fs::create_dir_all(&snapshot_dir).map_err(snapshot_error)?;
            std::fs::rename(&file.path, snapshot_dir.join(schema::SNAPSHOT_DATA))
                .map_err(snapshot_error)?;
            if let Some(incoming) = file.path.parent() {
                let _ = std::fs::remove_dir_all(incoming);
            }
        }
        schema::sync_file(&snapshot_dir.join(schema::SNAPSHOT_DATA)).map_err(snapshot_error)?;
        schema::write_snapshot_sum(&snapshot_dir).map_err(snapshot_error)?;
        std::fs::write(snapshot_dir.join(schema::SNAPSHOT_META), encode(&meta))
            .map_err(snapshot_error)?;
        schema::sync_file(&snapshot_dir.join(schema::SNAPSHOT_META)).map_err(snapshot_error)?;
        if let Some(snapshots) = snapshot_dir.parent() {
            schema::sync_dir(snapshots).map_err(snapshot_error)?;
        }

        {
            let mut log = lock(&self.events);
            let installed = Arc::new(SmEnv {
                env,
                dbs,
                generation,
                file: std::sync::OnceLock::new(),
            });
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = installed.clone();
            lock(&self.kind_counts).forget();
            // The projections follow the installed state in the same step: no request is
            // checked against the state this node had before.
            if let Err(error) = log.reset(
                "this server installed a snapshot of the whole state; list again and start a new watch".into(),
                Version::new(meta.last_log_id.map(|l| l.index).unwrap_or(0)),
                &super::Source(&installed),
            ) {
                self.found_damage_saying(format!(
                    "the snapshot just installed could not be read for the registry and the ACLs: {error}"
                ));
            }
        }
        write_current(&self.data_dir, generation).map_err(snapshot_error)?;
        let _ = std::fs::remove_dir_all(schema::sm_generation_dir(&self.data_dir, old.generation));
        self.set_current_snapshot(meta.clone(), snapshot_dir.join(schema::SNAPSHOT_DATA));
        self.cadence.snapshot_taken(self.cadence.mark());
        self.measure_state();
        tracing::info!(
            snapshot_id = meta.snapshot_id,
            generation,
            "installed a raft snapshot"
        );
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    /// A build that fails writing its copy (the disk: the copy is new and nothing relies on it
    /// yet) answers with the snapshot there is, which raft ignores: raft goes on, the log stays
    /// unpurged, and the next try comes after more writes. Damage found in the state (a record
    /// that fails its seal, or the state unreadable), or a failure with no snapshot to fall
    /// back on, is raft's error, as before.
    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        // An ask queued while the last snapshot was being built: nothing is due, no new copy.
        if self.shared.cadence.nothing_due()
            && let Some((meta, path)) = lock(&self.shared.snapshot).clone()
            && path.exists()
        {
            return Ok(Snapshot {
                meta,
                snapshot: Box::new(SnapshotFile { path }),
            });
        }
        let shared = self.shared.clone();
        let built = tokio::task::spawn_blocking(move || shared.build_snapshot_blocking())
            .await
            .map_err(snapshot_error)?;
        let error = match built {
            Ok(snapshot) => return Ok(snapshot),
            Err(error) => error,
        };
        let previous = lock(&self.shared.snapshot).clone();
        match previous {
            Some((meta, path)) if self.shared.damage().borrow().is_none() && path.exists() => {
                tracing::error!(
                    %error,
                    kept = meta.snapshot_id,
                    "building a raft snapshot failed: raft goes on with the snapshot it has, the log behind it is kept, and a new one is tried after more writes"
                );
                self.shared.cadence.postpone();
                Ok(Snapshot {
                    meta,
                    snapshot: Box::new(SnapshotFile { path }),
                })
            }
            _ => Err(error),
        }
    }
}

/// Checks a snapshot received from a leader before it is handed to raft: it must open as a state
/// machine environment of a format this build reads, and every record must decode, sit under
/// the key its id gives, and be storable. A snapshot that fails is refused; nothing changes.
pub fn check_received(dir: &Path, map_size: usize) -> Result<u64, String> {
    let (env, dbs) =
        schema::open_sm(dir, map_size).map_err(|error| format!("not a state machine: {error}"))?;
    let checked = (|| -> Result<u64, String> {
        let rtxn = env.read_txn().map_err(|error| error.to_string())?;
        let mut records = 0u64;
        for item in dbs
            .resources
            .iter(&rtxn)
            .map_err(|error| error.to_string())?
        {
            let (key, stored) = item.map_err(|error| error.to_string())?;
            let bytes = super::sealed::open(key, stored).map_err(|damage| damage.to_string())?;
            let resource = <proto::resource::v1::Resource as prost::Message>::decode(bytes)
                .map_err(|error| format!("record {records} does not decode: {error}"))?;
            let id = resource.id.clone().unwrap_or_default();
            if schema::resource_key(&crate::storage::StorageKey::of(&id)) != key {
                return Err(format!(
                    "record {records} ({}) is stored under another key",
                    crate::resource::DisplayId(&id)
                ));
            }
            crate::storage::check::check_storable(&resource, usize::MAX)
                .map_err(|error| format!("record {records}: {error}"))?;
            records += 1;
        }
        for item in dbs
            .requests
            .iter(&rtxn)
            .map_err(|error| error.to_string())?
        {
            let (key, stored) = item.map_err(|error| error.to_string())?;
            super::sealed::open(key, stored).map_err(|damage| damage.to_string())?;
        }
        read_applied(&dbs, &rtxn).map_err(|error| error.to_string())?;
        Ok(records)
    })();
    env.prepare_for_closing().wait();
    checked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repacked_copy_holds_every_record_on_full_pages() {
        let live = tempfile::tempdir().expect("temp dir");
        let (env, dbs) = schema::open_sm(live.path(), 1 << 30).expect("open");
        let value = |index: usize| vec![(index % 251) as u8; 1200];
        // Written out of order, 50 to a transaction, as apply does with concurrent writers.
        let order: Vec<usize> = (0..3_000).map(|index| (index * 7_919) % 3_000).collect();
        for chunk in order.chunks(50) {
            let mut wtxn = env.write_txn().expect("txn");
            for index in chunk {
                let key = format!("demo/Artist/default/default/a-{index:06}");
                dbs.resources
                    .put(&mut wtxn, key.as_bytes(), &value(*index))
                    .expect("put");
                dbs.owners
                    .put(&mut wtxn, format!("owner/{index:06}").as_bytes(), &())
                    .expect("owner");
            }
            wtxn.commit().expect("commit");
        }
        let mut wtxn = env.write_txn().expect("txn");
        dbs.meta
            .put(&mut wtxn, schema::META_LAST_APPLIED, b"applied")
            .expect("meta");
        wtxn.commit().expect("commit");
        let live_env = SmEnv {
            env,
            dbs,
            generation: 0,
            file: std::sync::OnceLock::new(),
        };

        let copy = tempfile::tempdir().expect("temp dir");
        repack(&live_env, copy.path(), 1 << 30).expect("repack");
        let (copied, copied_dbs) = schema::open_sm(copy.path(), 1 << 30).expect("open copy");
        let rtxn = copied.read_txn().expect("txn");
        let live_rtxn = live_env.env.read_txn().expect("txn");
        let records: Vec<_> = copied_dbs
            .resources
            .iter(&rtxn)
            .expect("iter")
            .map(|item| item.expect("record"))
            .collect();
        let originals: Vec<_> = live_env
            .dbs
            .resources
            .iter(&live_rtxn)
            .expect("iter")
            .map(|item| item.expect("record"))
            .collect();
        assert_eq!(records, originals, "every record, in order, byte for byte");
        assert_eq!(copied_dbs.owners.len(&rtxn).expect("owners"), 3_000);
        assert_eq!(
            copied_dbs
                .meta
                .get(&rtxn, schema::META_LAST_APPLIED)
                .expect("meta"),
            Some(&b"applied"[..])
        );
        let live_pages = live_env
            .dbs
            .resources
            .stat(&live_rtxn)
            .expect("stat")
            .leaf_pages;
        let copied_pages = copied_dbs.resources.stat(&rtxn).expect("stat").leaf_pages;
        assert!(
            copied_pages <= 1_010 && live_pages >= 1_400,
            "three records of 1.2 KB to a page: {copied_pages} leaf pages repacked, {live_pages} live"
        );
    }
}
