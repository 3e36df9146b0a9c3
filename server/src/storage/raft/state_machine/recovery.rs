//! Opening the state machine: the generation in use, and the rebuild after an unclean stop.
//!
//! Commits are not synced, so a state machine that was not closed cleanly may be torn: it is
//! discarded and rebuilt from the latest (synced) snapshot, and raft applies the log after it
//! again. A clean stop syncs it and leaves the `CLEAN` marker, which the next start consumes.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use super::super::schema;
use super::super::types::SnapshotMeta;
use super::{SmEnv, SmShared, StateMachineStore, applied_index, io};
use crate::storage::Version;
use crate::storage::events::{EventLog, HistoryLimits};
use crate::wire::raft::decode;

impl StateMachineStore {
    /// Opens the state machine under `data_dir`, with the generation recorded in `CURRENT`,
    /// sized for the default quota.
    pub fn open(
        data_dir: &Path,
        history: HistoryLimits,
    ) -> Result<StateMachineStore, std::io::Error> {
        Self::open_sized(
            data_dir,
            history,
            schema::map_size_for(schema::DEFAULT_QUOTA_BYTES),
        )
    }

    /// [`Self::open`] with a memory map of `map_size` bytes ([`schema::map_size_for`]).
    pub fn open_sized(
        data_dir: &Path,
        history: HistoryLimits,
        map_size: usize,
    ) -> Result<StateMachineStore, std::io::Error> {
        let (mut generation, current_lost) = current_generation(data_dir)?;
        let clean_marker = data_dir.join(schema::SM_CLEAN);
        let existing = schema::sm_generation_dir(data_dir, generation).join(schema::SNAPSHOT_DATA);
        let clean = match std::fs::read_to_string(&clean_marker) {
            Ok(text) => {
                std::fs::remove_file(&clean_marker)?;
                schema::sync_dir(&data_dir.join(schema::SM_DIR))?;
                // The marker records what the file was at the clean stop (a marker of a build
                // before that says only "clean").
                match text.strip_prefix("clean").and_then(schema::FileSum::parse) {
                    Some(sum) => match sum.check(&existing) {
                        Ok(()) => true,
                        Err(what) => {
                            tracing::error!(
                                path = %existing.display(),
                                "the state machine changed since the clean stop ({what}): it is damaged; rebuilding it from the latest snapshot and the raft log"
                            );
                            false
                        }
                    },
                    None => true,
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
            Err(error) => return Err(error),
        };
        // Found damaged while it ran (a record failed its checksum): rebuilt, whatever else.
        let damaged_marker = data_dir.join(schema::SM_DAMAGED);
        let found_damaged = std::fs::read_to_string(&damaged_marker);
        let clean = match &found_damaged {
            Ok(why) => {
                tracing::error!(
                    why = why.trim(),
                    "the state machine was found damaged while this node ran; rebuilding it from the latest snapshot and the raft log"
                );
                false
            }
            Err(_) => clean,
        };
        let found_damaged = found_damaged.is_ok();
        // Which generation is live is not known for sure: rebuilt, like after an unclean stop.
        let clean = clean && !current_lost;
        let mut snapshot = load_latest_snapshot(data_dir);
        // A new node has served nothing; a clean stop left exactly what it had applied.
        // (A node whose file naming its live generation was lost is not new: it may have
        // served and acknowledged; it serves nothing until it has caught up again.)
        let opened_cleanly = !current_lost && (clean || !existing.exists());
        if !clean && existing.exists() {
            // Rebuilt only from a snapshot that is what it was when it was written (checked
            // here, where it is used, not at every start: it is read whole).
            if let Some((_, path)) = &snapshot
                && let Some(dir) = path.parent()
                && let Err(what) = schema::check_snapshot_sum(dir)
            {
                let aside = schema::set_aside(data_dir, &[dir]);
                tracing::error!(
                    snapshot = %dir.display(),
                    set_aside = ?aside,
                    "a raft snapshot is damaged ({what}); it is not used"
                );
                snapshot = None;
            }
            // Commits are not synced: after an unclean stop the file may be torn. Start again from
            // the latest snapshot; raft applies the log after it again.
            if !found_damaged {
                tracing::warn!(
                    snapshot = snapshot.as_ref().map(|(meta, _)| meta.snapshot_id.clone()),
                    "the state machine was not shut down cleanly; rebuilding it from the latest snapshot and the raft log"
                );
            }
            generation += 1;
            schema::new_generation(
                data_dir,
                generation,
                snapshot.as_ref().map(|(_, path)| path.as_path()),
            )?;
            write_current(data_dir, generation)?;
        }
        let (env, dbs) =
            schema::open_sm(&schema::sm_generation_dir(data_dir, generation), map_size)
                .map_err(io)?;
        let applied = {
            let rtxn = env.read_txn().map_err(io)?;
            applied_index(&dbs, &rtxn)
        };
        let applied = match applied {
            Ok(applied) => applied,
            Err(error) if super::damage_of(&error).is_some() && clean => {
                // Damaged since its clean stop in a way its file's sum did not show (a sum of
                // an older build): once more, as after an unclean stop.
                tracing::error!(%error, "the state machine is damaged; rebuilding it");
                env.prepare_for_closing().wait();
                schema::write_durably(&damaged_marker, error.to_string())?;
                return StateMachineStore::open_sized(data_dir, history, map_size);
            }
            Err(error) => return Err(io(error)),
        };
        if current_lost {
            // Not proven superseded (CURRENT did not say which was live): kept, for people.
            set_aside_other_generations(data_dir, generation);
        } else {
            remove_other_generations(data_dir, generation);
        }
        if damaged_marker.exists() {
            std::fs::remove_file(&damaged_marker)?;
            schema::sync_dir(&data_dir.join(schema::SM_DIR))?;
        }
        let events = EventLog::new(history, Version::new(applied));
        Ok(StateMachineStore {
            shared: Arc::new(SmShared {
                stamps: events.stamps(),
                data_dir: data_dir.to_path_buf(),
                current: RwLock::new(Arc::new(SmEnv {
                    env,
                    dbs,
                    generation,
                    file: std::sync::OnceLock::new(),
                })),
                events: Mutex::new(events),
                snapshot: Mutex::new(snapshot),
                sequence: AtomicU64::new(0),
                closed: std::sync::atomic::AtomicBool::new(false),
                opened_cleanly,
                metrics: std::sync::OnceLock::new(),
                disk: std::sync::OnceLock::new(),
                used_bytes: AtomicU64::new(0),
                quota: AtomicU64::new(u64::MAX),
                damage: tokio::sync::watch::Sender::new(None),
                map_size,
                cadence: Arc::default(),
                log: std::sync::OnceLock::new(),
                rebasing: Mutex::new(()),
                kind_counts: Mutex::default(),
                counting: Mutex::new(()),
            }),
        })
    }
}

/// The generation `CURRENT` names, and whether it was lost: missing, unreadable, or naming a
/// generation that is not on disk while others are. Then the newest generation on disk is
/// taken, to be rebuilt from (never trusted as it is, never deleted); with none, the node is
/// new (generation 0).
fn current_generation(data_dir: &Path) -> std::io::Result<(u64, bool)> {
    let path = data_dir.join(schema::SM_CURRENT);
    let recorded = match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(generation) => Some(generation),
            Err(_) => {
                tracing::error!(path = %path.display(), content = %text.trim().escape_default(), "the file naming the live state machine generation is unreadable");
                None
            }
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    let on_disk = generations_on_disk(data_dir);
    let exists = |generation: u64| {
        schema::sm_generation_dir(data_dir, generation)
            .join(schema::SNAPSHOT_DATA)
            .exists()
    };
    match recorded {
        Some(generation) if exists(generation) || on_disk.is_empty() => Ok((generation, false)),
        _ => match on_disk.last() {
            None => Ok((0, false)),
            Some(&newest) => {
                tracing::error!(
                    path = %path.display(),
                    recorded = ?recorded,
                    found = ?on_disk,
                    "the file naming the live state machine generation is missing or wrong; rebuilding the state from the latest snapshot and the raft log, and setting the generations found aside"
                );
                Ok((newest, true))
            }
        },
    }
}

/// The generations under `raft/sm` that hold a data file, oldest first.
fn generations_on_disk(data_dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(data_dir.join(schema::SM_DIR)) else {
        return Vec::new();
    };
    let mut found: Vec<u64> = entries
        .flatten()
        .filter(|entry| entry.path().join(schema::SNAPSHOT_DATA).exists())
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u64>().ok())
        .collect();
    found.sort_unstable();
    found
}

/// Moves every generation but `keep` to a `raft/damaged-…` directory.
fn set_aside_other_generations(data_dir: &Path, keep: u64) {
    let keep_dir = schema::sm_generation_dir(data_dir, keep);
    let others: Vec<PathBuf> = std::fs::read_dir(data_dir.join(schema::SM_DIR))
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.is_dir() && *path != keep_dir)
                .collect()
        })
        .unwrap_or_default();
    if others.is_empty() {
        return;
    }
    let parts: Vec<&Path> = others.iter().map(PathBuf::as_path).collect();
    match schema::set_aside(data_dir, &parts) {
        Ok(aside) => tracing::warn!(
            aside = %aside.display(),
            "state machine generations set aside (not deleted): remove them once the node serves what it should"
        ),
        Err(error) => {
            tracing::error!(%error, "could not set the old generations aside; they stay where they are")
        }
    }
}

/// Records the generation in use, durably (write, sync, rename, sync the directory).
pub(super) fn write_current(data_dir: &Path, generation: u64) -> std::io::Result<()> {
    schema::write_durably(&data_dir.join(schema::SM_CURRENT), generation.to_string())
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
        // Being built or received when the process stopped: never a snapshot to rebuild from.
        let unfinished = entry
            .file_name()
            .to_str()
            .is_none_or(|name| name.starts_with("building-") || name.starts_with("incoming-"));
        if unfinished {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        let meta = std::fs::read(dir.join(schema::SNAPSHOT_META))
            .ok()
            .and_then(|bytes| decode::<SnapshotMeta>(&bytes).ok());
        match meta {
            Some(meta) if dir.join(schema::SNAPSHOT_DATA).exists() => {
                if best
                    .as_ref()
                    .is_none_or(|(b, _)| b.last_log_id < meta.last_log_id)
                {
                    best = Some((meta, dir.join(schema::SNAPSHOT_DATA)));
                }
            }
            _ => {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
    best
}
