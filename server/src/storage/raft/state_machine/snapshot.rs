//! Raft snapshots: compacted copies of the state machine's LMDB file, built off the async
//! threads, and installed (after their contents are checked) by opening the received file as a
//! new environment generation and swapping it in.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use heed::CompactionOption;
use openraft::RaftSnapshotBuilder;

use super::super::schema;
use super::super::types::{RaftStorageError, Snapshot, SnapshotFile, SnapshotMeta, TypeConfig};
use super::recovery::write_current;
use super::{SmEnv, SmShared, StateMachineStore, lock, read_applied, snapshot_error};
use crate::storage::Version;
use crate::wire::raft::encode;

impl SmShared {
    /// Copies the state machine into a compacted LMDB file and records it as the current snapshot.
    pub(super) fn build_snapshot_blocking(&self) -> Result<Snapshot, RaftStorageError> {
        let sm = self.current();
        // Taken before the copy reads the state: writes applied while it copies count toward
        // the next snapshot.
        let mark = self.cadence.mark();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let snapshots = self.data_dir.join(schema::SNAPSHOT_DIR);
        let building = schema::building_snapshot_dir(&self.data_dir, sequence);
        std::fs::create_dir_all(&building).map_err(snapshot_error)?;
        let target = building.join(schema::SNAPSHOT_DATA);
        let copy = || {
            let _ = std::fs::remove_file(&target);
            sm.env
                .copy_to_path(&target, CompactionOption::Enabled)
                .map(drop)
        };
        super::super::disk::wait_out(
            self.disk.get().map(|disk| &**disk),
            "building a raft snapshot",
            super::super::disk::is_lmdb_no_space,
            copy,
        )
        .map_err(snapshot_error)?;
        // Every record of the copy passes its seal (as a follower receiving it will check): a
        // record damaged in the live state, and never read since, must not become the snapshot
        // the log is purged behind.
        if let Err(why) = check_received(&building, self.map_size) {
            let _ = std::fs::remove_dir_all(&building);
            self.found_damage_saying(format!(
                "building a raft snapshot found the state machine damaged: {why}"
            ));
            return Err(snapshot_error(why));
        }
        // The copy is consistent on its own: read what it holds, not what the live state holds now.
        let (last_applied, membership) = {
            let (env, dbs) = schema::open_sm(&building, self.map_size).map_err(snapshot_error)?;
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
        schema::write_snapshot_sum(&building).map_err(snapshot_error)?;
        let final_dir = schema::snapshot_dir(&self.data_dir, &snapshot_id);
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(&building, &final_dir).map_err(snapshot_error)?;
        schema::sync_dir(&snapshots).map_err(snapshot_error)?;
        self.set_current_snapshot(meta.clone(), final_dir.join(schema::SNAPSHOT_DATA));
        self.cadence.snapshot_taken(mark);
        tracing::info!(snapshot_id, "built a raft snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(SnapshotFile {
                path: final_dir.join(schema::SNAPSHOT_DATA),
            }),
        })
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
        let old = self.current();
        let generation = old.generation + 1;
        let generation_dir = schema::sm_generation_dir(&self.data_dir, generation);
        let _ = std::fs::remove_dir_all(&generation_dir);
        std::fs::create_dir_all(&generation_dir).map_err(snapshot_error)?;
        std::fs::copy(&file.path, generation_dir.join(schema::SNAPSHOT_DATA))
            .map_err(snapshot_error)?;
        schema::sync_file(&generation_dir.join(schema::SNAPSHOT_DATA)).map_err(snapshot_error)?;
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
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(SmEnv {
                env,
                dbs,
                generation,
                file: std::sync::OnceLock::new(),
            });
            log.reset(
                "this server installed a snapshot of the whole state; list again and start a new watch".into(),
                Version::new(meta.last_log_id.map(|l| l.index).unwrap_or(0)),
            );
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
    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.build_snapshot_blocking())
            .await
            .map_err(snapshot_error)?
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
