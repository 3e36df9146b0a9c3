//! [`StateMachineStore`]: the applied state (resources, owner index, last applied, membership) in
//! LMDB, the watch events published after each commit, and snapshots.
//!
//! Apply takes a batch of committed entries and writes them in one LMDB transaction. It is
//! deterministic: the entry carries the complete resource; apply only checks uid and version and
//! stores it with `version = log index`. Watch events are published after the commit, under the
//! lock that new watchers take to read their snapshot and subscribe, so a watcher sees each change
//! exactly once. Snapshots are compacted copies of the LMDB file; installing one opens it as a new
//! environment generation and swaps it in.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use heed::CompactionOption;
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, RaftSnapshotBuilder, StorageIOError};
use prost::Message;
use proto::raft::v1 as pb;
use proto::resource::v1::{Id, Resource, Tenancy};

use super::schema::{self, LmdbEnv, SmDbs};
use super::types::{
    CommandResult, Entry, LogId, RaftStorageError, Snapshot, SnapshotFile, SnapshotMeta,
    StoredMembership, TypeConfig, Wire, decode, encode,
};
use crate::resource;
use crate::storage::events::{self, EventLog, Published, WatchFilter};
use crate::storage::{
    Operation, StorageError, StorageKey, UnversionedType, Version, Watch, WatchEvent,
};

/// An open state machine environment.
struct SmEnv {
    env: LmdbEnv,
    dbs: SmDbs,
    generation: u64,
}

/// State shared by the state machine store, its snapshot builder and the backend's local reads.
pub struct SmShared {
    data_dir: PathBuf,
    current: RwLock<Arc<SmEnv>>,
    /// Published watch events; also the lock that orders commits with new watches.
    events: Mutex<EventLog>,
    snapshot: Mutex<Option<(SnapshotMeta, PathBuf)>>,
    sequence: AtomicU64,
    /// Set by `close_cleanly`: nothing may be applied after the final sync.
    closed: std::sync::atomic::AtomicBool,
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

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl StateMachineStore {
    /// Opens the state machine under `data_dir`, with the generation recorded in `CURRENT`.
    pub fn open(data_dir: &Path) -> Result<StateMachineStore, std::io::Error> {
        let mut generation = match std::fs::read_to_string(data_dir.join(schema::SM_CURRENT)) {
            Ok(text) => text.trim().parse::<u64>().map_err(io)?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
            Err(error) => return Err(error),
        };
        let clean_marker = data_dir.join(schema::SM_CLEAN);
        let clean = clean_marker.exists();
        if clean {
            std::fs::remove_file(&clean_marker)?;
            schema::sync_dir(&data_dir.join(schema::SM_DIR))?;
        }
        let snapshot = load_latest_snapshot(data_dir);
        let existing = schema::sm_generation_dir(data_dir, generation).join("data.mdb");
        if !clean && existing.exists() {
            // Commits are not synced: after an unclean stop the file may be torn. Start again from
            // the latest snapshot; raft applies the log after it again.
            tracing::warn!(
                snapshot = snapshot.as_ref().map(|(meta, _)| meta.snapshot_id.clone()),
                "the state machine was not shut down cleanly; rebuilding it from the latest snapshot and the raft log"
            );
            generation += 1;
            let rebuilt = schema::sm_generation_dir(data_dir, generation);
            let _ = std::fs::remove_dir_all(&rebuilt);
            std::fs::create_dir_all(&rebuilt)?;
            if let Some((_, path)) = &snapshot {
                std::fs::copy(path, rebuilt.join("data.mdb"))?;
                schema::sync_file(&rebuilt.join("data.mdb"))?;
            }
            write_current(data_dir, generation)?;
        }
        let (env, dbs) =
            schema::open_sm(&schema::sm_generation_dir(data_dir, generation)).map_err(io)?;
        remove_other_generations(data_dir, generation);
        let applied = {
            let rtxn = env.read_txn().map_err(io)?;
            applied_index(&dbs, &rtxn).map_err(io)?
        };
        Ok(StateMachineStore {
            shared: Arc::new(SmShared {
                data_dir: data_dir.to_path_buf(),
                current: RwLock::new(Arc::new(SmEnv {
                    env,
                    dbs,
                    generation,
                })),
                events: Mutex::new(EventLog::new(
                    events::DEFAULT_HISTORY,
                    events::DEFAULT_WATCH_BUFFER,
                    Version::new(applied),
                )),
                snapshot: Mutex::new(snapshot),
                sequence: AtomicU64::new(0),
                closed: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }
}

/// Records the generation in use, durably (write, sync, rename, sync the directory).
fn write_current(data_dir: &Path, generation: u64) -> std::io::Result<()> {
    let current_file = data_dir.join(schema::SM_CURRENT);
    let temporary = current_file.with_extension("tmp");
    std::fs::write(&temporary, generation.to_string())?;
    schema::sync_file(&temporary)?;
    std::fs::rename(&temporary, &current_file)?;
    schema::sync_dir(&data_dir.join(schema::SM_DIR))
}

fn remove_other_generations(data_dir: &Path, keep: u64) {
    let Ok(entries) = std::fs::read_dir(data_dir.join(schema::SM_DIR)) else {
        return;
    };
    let keep_dir = schema::sm_generation_dir(data_dir, keep);
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && path != keep_dir {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The newest complete snapshot on disk; unfinished ones are removed.
fn load_latest_snapshot(data_dir: &Path) -> Option<(SnapshotMeta, PathBuf)> {
    let entries = std::fs::read_dir(data_dir.join(schema::SNAPSHOT_DIR)).ok()?;
    let mut best: Option<(SnapshotMeta, PathBuf)> = None;
    for entry in entries.flatten() {
        let dir = entry.path();
        let meta = std::fs::read(dir.join("meta"))
            .ok()
            .and_then(|bytes| decode::<SnapshotMeta>(&bytes).ok());
        match meta {
            Some(meta) if dir.join("data.mdb").exists() => {
                if best
                    .as_ref()
                    .is_none_or(|(b, _)| b.last_log_id < meta.last_log_id)
                {
                    best = Some((meta, dir.join("data.mdb")));
                }
            }
            _ => {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    best
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
        let (last_applied, membership) = read_applied(&sm.dbs, &rtxn).map_err(sm_read_error)?;
        Ok((last_applied, membership))
    }

    /// Syncs the state machine to disk and marks it clean, so the next start uses it as is.
    /// Call when nothing applies any more (after raft stopped).
    pub fn close_cleanly(&self) -> std::io::Result<()> {
        let _log = lock(&self.events);
        self.closed.store(true, Ordering::SeqCst);
        self.current().env.force_sync().map_err(io)?;
        let marker = self.data_dir.join(schema::SM_CLEAN);
        std::fs::write(&marker, b"clean")?;
        schema::sync_file(&marker)?;
        schema::sync_dir(&self.data_dir.join(schema::SM_DIR))
    }

    /// The last applied log index (0 before anything was applied).
    pub fn last_applied_index(&self) -> u64 {
        self.applied_state_blocking()
            .ok()
            .and_then(|(last, _)| last)
            .map(|log_id| log_id.index)
            .unwrap_or(0)
    }

    fn apply_blocking(&self, entries: Vec<Entry>) -> Result<Vec<CommandResult>, RaftStorageError> {
        let Some(last) = entries.last().map(|entry| entry.log_id) else {
            return Ok(Vec::new());
        };
        let sm = self.current();
        let mut log = lock(&self.events);
        if self.closed.load(Ordering::SeqCst) {
            return Err(sm_write_error("the state machine is closed"));
        }
        let mut wtxn = sm.env.write_txn().map_err(sm_write_error)?;
        let mut results = Vec::with_capacity(entries.len());
        let mut published = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            let result = match entry.payload {
                EntryPayload::Blank => done(),
                EntryPayload::Membership(membership) => {
                    let stored = StoredMembership::new(Some(entry.log_id), membership);
                    let bytes = encode(&stored).map_err(sm_write_error)?;
                    sm.dbs
                        .meta
                        .put(&mut wtxn, schema::META_MEMBERSHIP, &bytes)
                        .map_err(sm_write_error)?;
                    done()
                }
                EntryPayload::Normal(command) => apply_command(
                    &sm.dbs,
                    &mut wtxn,
                    Version::new(index),
                    command.into_inner(),
                    &mut published,
                )
                .map_err(sm_write_error)?,
            };
            results.push(Wire(result));
        }
        let bytes = encode(&Some(last)).map_err(sm_write_error)?;
        sm.dbs
            .meta
            .put(&mut wtxn, schema::META_LAST_APPLIED, &bytes)
            .map_err(sm_write_error)?;
        wtxn.commit().map_err(sm_write_error)?;
        for item in published {
            match item {
                Published::Change {
                    key,
                    event,
                    version,
                } => log.publish_change(key, event, version),
                Published::Reset { reason } => log.reset(reason, Version::new(last.index)),
            }
        }
        Ok(results)
    }

    /// Copies the state machine into a compacted LMDB file and records it as the current snapshot.
    fn build_snapshot_blocking(&self) -> Result<Snapshot, RaftStorageError> {
        let sm = self.current();
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let snapshots = self.data_dir.join(schema::SNAPSHOT_DIR);
        let building = snapshots.join(format!("building-{}-{sequence}", std::process::id()));
        std::fs::create_dir_all(&building).map_err(snapshot_error)?;
        sm.env
            .copy_to_path(building.join("data.mdb"), CompactionOption::Enabled)
            .map_err(snapshot_error)?;
        // The copy is consistent on its own: read what it holds, not what the live state holds now.
        let (last_applied, membership) = {
            let (env, dbs) = schema::open_sm(&building).map_err(snapshot_error)?;
            let rtxn = env.read_txn().map_err(snapshot_error)?;
            let (last_applied, membership) = read_applied(&dbs, &rtxn).map_err(snapshot_error)?;
            drop(rtxn);
            env.prepare_for_closing().wait();
            (last_applied, membership)
        };
        let snapshot_id = match last_applied {
            Some(log_id) => format!("{}-{}-{sequence}", log_id.leader_id.term, log_id.index),
            None => format!("0-0-{sequence}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: snapshot_id.clone(),
        };
        std::fs::write(
            building.join("meta"),
            encode(&meta).map_err(snapshot_error)?,
        )
        .map_err(snapshot_error)?;
        // The snapshot is what the state machine is rebuilt from after an unclean stop, and the
        // log is purged behind it: it must be on disk before openraft learns of it.
        schema::sync_file(&building.join("data.mdb")).map_err(snapshot_error)?;
        schema::sync_file(&building.join("meta")).map_err(snapshot_error)?;
        let final_dir = snapshots.join(&snapshot_id);
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(&building, &final_dir).map_err(snapshot_error)?;
        schema::sync_dir(&snapshots).map_err(snapshot_error)?;
        self.set_current_snapshot(meta.clone(), final_dir.join("data.mdb"));
        tracing::info!(snapshot_id, "built a raft snapshot");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(SnapshotFile {
                path: final_dir.join("data.mdb"),
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

    fn install_snapshot_blocking(
        &self,
        meta: SnapshotMeta,
        file: SnapshotFile,
    ) -> Result<(), RaftStorageError> {
        let old = self.current();
        let generation = old.generation + 1;
        let generation_dir = schema::sm_generation_dir(&self.data_dir, generation);
        let _ = std::fs::remove_dir_all(&generation_dir);
        std::fs::create_dir_all(&generation_dir).map_err(snapshot_error)?;
        std::fs::copy(&file.path, generation_dir.join("data.mdb")).map_err(snapshot_error)?;
        schema::sync_file(&generation_dir.join("data.mdb")).map_err(snapshot_error)?;
        let (env, dbs) = schema::open_sm(&generation_dir).map_err(snapshot_error)?;

        // Keep the received file as this node's current snapshot.
        let snapshot_dir = self
            .data_dir
            .join(schema::SNAPSHOT_DIR)
            .join(&meta.snapshot_id);
        if file.path.parent() != Some(snapshot_dir.as_path()) {
            let _ = std::fs::remove_dir_all(&snapshot_dir);
            std::fs::create_dir_all(&snapshot_dir).map_err(snapshot_error)?;
            std::fs::rename(&file.path, snapshot_dir.join("data.mdb")).map_err(snapshot_error)?;
            if let Some(incoming) = file.path.parent() {
                let _ = std::fs::remove_dir_all(incoming);
            }
        }
        std::fs::write(
            snapshot_dir.join("meta"),
            encode(&meta).map_err(snapshot_error)?,
        )
        .map_err(snapshot_error)?;
        schema::sync_file(&snapshot_dir.join("meta")).map_err(snapshot_error)?;
        if let Some(snapshots) = snapshot_dir.parent() {
            schema::sync_dir(snapshots).map_err(snapshot_error)?;
        }

        {
            let mut log = lock(&self.events);
            *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(SmEnv {
                env,
                dbs,
                generation,
            });
            log.reset(
                "this server installed a snapshot of the whole state; list again and start a new watch".into(),
                Version::new(meta.last_log_id.map(|l| l.index).unwrap_or(0)),
            );
        }
        write_current(&self.data_dir, generation).map_err(snapshot_error)?;
        let _ = std::fs::remove_dir_all(schema::sm_generation_dir(&self.data_dir, old.generation));
        self.set_current_snapshot(meta.clone(), snapshot_dir.join("data.mdb"));
        tracing::info!(
            snapshot_id = meta.snapshot_id,
            generation,
            "installed a raft snapshot"
        );
        Ok(())
    }

    /// Streams this node's state as an operator snapshot file into `chunks`: one read
    /// transaction, a first pass to count and hash, a second to send. Blocking; run it on a
    /// blocking thread.
    pub fn export_blocking(
        &self,
        node_id: u64,
        chunks: tokio::sync::mpsc::Sender<Result<Vec<u8>, StorageError>>,
    ) -> Result<(), StorageError> {
        const CHUNK_BYTES: usize = 1 << 20;
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let raft_index = applied_index(&sm.dbs, &rtxn).map_err(storage_internal)?;
        let mut body = proto::snapshot::BodyWriter::new();
        let mut scratch = Vec::new();
        for item in sm.dbs.resources.iter(&rtxn).map_err(storage_internal)? {
            let (_, bytes) = item.map_err(storage_internal)?;
            scratch.clear();
            body.record(&decode_resource(bytes)?, &mut scratch);
        }
        let header = body.header(
            raft_index,
            node_id,
            prost_types::Timestamp::from(std::time::SystemTime::now()),
        );
        let send = |chunk: Vec<u8>| {
            chunks
                .blocking_send(Ok(chunk))
                .map_err(|_| StorageError::Internal("the snapshot reader went away".into()))
        };
        send(proto::snapshot::preamble(&header))?;
        let mut discard = proto::snapshot::BodyWriter::new();
        let mut chunk = Vec::with_capacity(CHUNK_BYTES);
        for item in sm.dbs.resources.iter(&rtxn).map_err(storage_internal)? {
            let (_, bytes) = item.map_err(storage_internal)?;
            discard.record(&decode_resource(bytes)?, &mut chunk);
            if chunk.len() >= CHUNK_BYTES {
                send(std::mem::replace(
                    &mut chunk,
                    Vec::with_capacity(CHUNK_BYTES),
                ))?;
            }
        }
        if !chunk.is_empty() {
            send(chunk)?;
        }
        Ok(())
    }

    // Local (eventually consistent) reads.

    pub fn read(&self, id: &Id) -> Result<Resource, StorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let key = schema::resource_key(&StorageKey::of(id));
        let Some(bytes) = sm
            .dbs
            .resources
            .get(&rtxn, &key)
            .map_err(storage_internal)?
        else {
            return Err(StorageError::NotFound);
        };
        let stored = decode_resource(bytes)?;
        crate::storage::check_read(id, stored)
    }

    pub fn list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        scan(&sm, &rtxn, resource_type, tenancy, name_prefix)
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
            if let Some(bytes) = sm
                .dbs
                .resources
                .get(&rtxn, child_key)
                .map_err(storage_internal)?
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
    ) -> Result<Watch, StorageError> {
        let log = lock(&self.events);
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let current = applied_index(&sm.dbs, &rtxn).map_err(storage_internal)?;
        let snapshot = match since {
            None => scan(&sm, &rtxn, resource_type, tenancy, name_prefix)?,
            Some(_) => Vec::new(),
        };
        log.watch(
            WatchFilter::new(resource_type, tenancy, name_prefix),
            snapshot,
            Version::new(current),
            since,
        )
    }
}

/// The last applied log id and the membership a state machine environment records.
fn read_applied(
    dbs: &SmDbs,
    rtxn: &heed::RoTxn<'_, heed::WithoutTls>,
) -> Result<(Option<LogId>, StoredMembership), String> {
    let last_applied = match dbs
        .meta
        .get(rtxn, schema::META_LAST_APPLIED)
        .map_err(|e| e.to_string())?
    {
        Some(bytes) => decode(bytes).map_err(|e| e.to_string())?,
        None => None,
    };
    let membership = match dbs
        .meta
        .get(rtxn, schema::META_MEMBERSHIP)
        .map_err(|e| e.to_string())?
    {
        Some(bytes) => decode(bytes).map_err(|e| e.to_string())?,
        None => StoredMembership::default(),
    };
    Ok((last_applied, membership))
}

/// The index of the last applied entry (0 before any).
fn applied_index(dbs: &SmDbs, rtxn: &heed::RoTxn<'_, heed::WithoutTls>) -> Result<u64, String> {
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
) -> Result<Vec<Resource>, StorageError> {
    let prefix = schema::resource_scan_prefix(
        &resource_type.group,
        &resource_type.kind,
        &tenancy.partition,
        &tenancy.namespace,
    );
    let mut found = Vec::new();
    for item in sm
        .dbs
        .resources
        .prefix_iter(rtxn, &prefix)
        .map_err(storage_internal)?
    {
        let (key, bytes) = item.map_err(storage_internal)?;
        let Some(key) = schema::parse_resource_key(key) else {
            continue;
        };
        if key.matches(resource_type, tenancy, name_prefix) {
            found.push(decode_resource(bytes)?);
        }
    }
    Ok(found)
}

fn done() -> pb::CommandResult {
    pb::CommandResult {
        result: Some(pb::command_result::Result::Done(pb::Done {})),
    }
}

fn failure(code: pb::storage_failure::Code, message: &str) -> pb::CommandResult {
    pb::CommandResult {
        result: Some(pb::command_result::Result::Failure(pb::StorageFailure {
            code: code as i32,
            message: message.into(),
            stored: None,
        })),
    }
}

fn owner_uid(resource: &Resource) -> Option<&str> {
    resource
        .owner
        .as_ref()
        .map(|o| o.uid.as_str())
        .filter(|uid| !uid.is_empty())
}

/// Applies one command inside the batch's write transaction. CAS and uid conflicts are results,
/// not errors: they are part of the replicated outcome.
fn apply_command(
    dbs: &SmDbs,
    wtxn: &mut heed::RwTxn<'_>,
    version: Version,
    command: pb::Command,
    published: &mut Vec<Published>,
) -> Result<pb::CommandResult, heed::Error> {
    use pb::command::Command as C;
    use pb::storage_failure::Code;
    let encode_error = |error: std::io::Error| heed::Error::Io(error);
    match command.command {
        None => Ok(failure(Code::Internal, "empty command")),
        Some(C::WriteCas(pb::WriteCas { resource: None })) => {
            Ok(failure(Code::Internal, "write without a resource"))
        }
        Some(C::WriteCas(pb::WriteCas {
            resource: Some(mut resource),
        })) => {
            let id = resource.id.clone().unwrap_or_default();
            let storage_key = StorageKey::of(&id);
            let key = schema::resource_key(&storage_key);
            let existing = match dbs.resources.get(wtxn, &key)? {
                Some(bytes) => Some(Resource::decode(bytes).map_err(|e| encode_error(io(e)))?),
                None => None,
            };
            match &existing {
                Some(existing) => {
                    let existing_uid = existing
                        .id
                        .as_ref()
                        .map(|i| i.uid.as_str())
                        .unwrap_or_default();
                    if existing_uid != id.uid {
                        return Ok(failure(Code::WrongUid, "uid doesn't match"));
                    }
                    if existing.version != resource.version {
                        return Ok(failure(Code::CasFailure, "version doesn't match"));
                    }
                }
                None if !resource.version.is_empty() => {
                    return Ok(failure(Code::CasFailure, "resource does not exist"));
                }
                None => {}
            }
            resource.version = version.to_string();
            if let Some(previous_owner) = existing.as_ref().and_then(owner_uid)
                && owner_uid(&resource) != Some(previous_owner)
            {
                dbs.owners
                    .delete(wtxn, &schema::owner_key(previous_owner, &storage_key))?;
            }
            if let Some(owner) = owner_uid(&resource) {
                dbs.owners
                    .put(wtxn, &schema::owner_key(owner, &storage_key), &())?;
            }
            dbs.resources.put(wtxn, &key, &resource.encode_to_vec())?;
            published.push(Published::Change {
                key: storage_key,
                event: WatchEvent {
                    version: version.to_string(),
                    operation: Operation::Upsert(resource.clone()),
                },
                version,
            });
            Ok(pb::CommandResult {
                result: Some(pb::command_result::Result::Written(resource)),
            })
        }
        Some(C::DeleteCas(pb::DeleteCas {
            id,
            version: expected,
        })) => {
            let id = id.unwrap_or_default();
            let storage_key = StorageKey::of(&id);
            let key = schema::resource_key(&storage_key);
            let Some(bytes) = dbs.resources.get(wtxn, &key)? else {
                return Ok(done());
            };
            let existing = Resource::decode(bytes).map_err(|e| encode_error(io(e)))?;
            let existing_uid = existing
                .id
                .as_ref()
                .map(|i| i.uid.as_str())
                .unwrap_or_default();
            if !id.uid.is_empty() && existing_uid != id.uid {
                return Ok(done());
            }
            if existing.version != expected {
                return Ok(failure(Code::CasFailure, "version doesn't match"));
            }
            dbs.resources.delete(wtxn, &key)?;
            if let Some(owner) = owner_uid(&existing) {
                dbs.owners
                    .delete(wtxn, &schema::owner_key(owner, &storage_key))?;
            }
            published.push(Published::Change {
                key: storage_key,
                event: WatchEvent {
                    version: version.to_string(),
                    operation: Operation::Delete(existing),
                },
                version,
            });
            Ok(done())
        }
        Some(C::Batch(pb::Batch { operations })) => {
            let mut results = Vec::with_capacity(operations.len());
            for (position, operation) in operations.into_iter().enumerate() {
                let command = match operation.operation {
                    Some(pb::batch_operation::Operation::WriteCas(write)) => C::WriteCas(write),
                    Some(pb::batch_operation::Operation::DeleteCas(delete)) => C::DeleteCas(delete),
                    None => {
                        results.push(failure(Code::Internal, "empty batch operation"));
                        continue;
                    }
                };
                let position = u32::try_from(position).unwrap_or(u32::MAX);
                results.push(apply_command(
                    dbs,
                    wtxn,
                    Version::at(version.index, position),
                    pb::Command {
                        command: Some(command),
                    },
                    published,
                )?);
            }
            Ok(pb::CommandResult {
                result: Some(pb::command_result::Result::Batch(pb::BatchResults {
                    results,
                })),
            })
        }
        Some(C::RestoreBegin(pb::RestoreBegin { restore_id })) => {
            dbs.restore.clear(wtxn)?;
            dbs.meta
                .put(wtxn, schema::META_RESTORE_ID, restore_id.as_bytes())?;
            Ok(done())
        }
        Some(C::RestoreChunk(pb::RestoreChunk {
            restore_id,
            resources,
        })) => {
            if dbs.meta.get(wtxn, schema::META_RESTORE_ID)? != Some(restore_id.as_bytes()) {
                return Ok(failure(
                    Code::Internal,
                    "another restore started since this one began",
                ));
            }
            for resource in resources {
                let storage_key = StorageKey::of(&resource.id.clone().unwrap_or_default());
                dbs.restore.put(
                    wtxn,
                    &schema::resource_key(&storage_key),
                    &resource.encode_to_vec(),
                )?;
            }
            Ok(done())
        }
        Some(C::RestoreCommit(pb::RestoreCommit { restore_id })) => {
            if dbs.meta.get(wtxn, schema::META_RESTORE_ID)? != Some(restore_id.as_bytes()) {
                return Ok(failure(
                    Code::Internal,
                    "another restore started since this one began",
                ));
            }
            dbs.resources.clear(wtxn)?;
            dbs.owners.clear(wtxn)?;
            let staged: Vec<(Vec<u8>, Vec<u8>)> = dbs
                .restore
                .iter(wtxn)?
                .map(|item| item.map(|(key, value)| (key.to_vec(), value.to_vec())))
                .collect::<Result<_, _>>()?;
            for (key, bytes) in staged {
                let mut resource =
                    Resource::decode(bytes.as_slice()).map_err(|e| encode_error(io(e)))?;
                // Restored resources are new writes: versions keep increasing.
                resource.version = version.to_string();
                if let (Some(owner), Some(storage_key)) =
                    (owner_uid(&resource), schema::parse_resource_key(&key))
                {
                    dbs.owners
                        .put(wtxn, &schema::owner_key(owner, &storage_key), &())?;
                }
                dbs.resources.put(wtxn, &key, &resource.encode_to_vec())?;
            }
            dbs.restore.clear(wtxn)?;
            dbs.meta.delete(wtxn, schema::META_RESTORE_ID)?;
            published.push(Published::Reset {
                reason: "the cluster state was restored from a snapshot; list again and start a new watch".into(),
            });
            Ok(done())
        }
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
        let dir = self
            .shared
            .data_dir
            .join(schema::SNAPSHOT_DIR)
            .join(format!("incoming-{}-{sequence}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(snapshot_error)?;
        Ok(Box::new(SnapshotFile {
            path: dir.join("data.mdb"),
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
        Ok(lock(&self.shared.snapshot)
            .clone()
            .map(|(meta, path)| Snapshot {
                meta,
                snapshot: Box::new(SnapshotFile { path }),
            }))
    }
}
