//! Every LMDB environment, database name and key encoding of the Raft backend.
//!
//! Layout under a node's data directory:
//!
//! ```text
//! raft/wal/            the raft log: segments of checksummed records (see `wal`)
//! raft/log/            the format marker: an LMDB environment whose meta records the format
//!                      (an older resd opens it first and refuses a newer format). Up to
//!                      format 1 it held the raft log, moved to raft/wal at the first open:
//!   entries            u64 big-endian index -> encoded Entry (empty from format 2)
//!   meta               "format" | "vote" | "last_purged" -> encoded value;
//!                      "wal" -> [1] once raft/wal holds the log (it must, from then on)
//! raft/sm/<generation>/  state machine environment (a new generation per installed snapshot,
//!                        rebase onto a built one, or rebuild after an unclean stop)
//!   resources          storage key -> sealed encoded Resource
//!   owners             owner uid 0x00 storage key -> ()
//!   meta               "format" -> u32; "last_applied" | "membership" | "restore_id" -> sealed
//!   restore            storage key -> sealed encoded Resource (staging area of a restore)
//!   requests           request id (16 bytes) -> sealed remembered outcome (exactly-once changes)
//!   request_order      applied index, position (big-endian) -> request id (oldest forgotten first)
//!   history, history_expiry, restore_history   objects' history (`state_machine::history`)
//! raft/sm/CURRENT      the generation in use
//! raft/sm/CLEAN        marker: the last shutdown synced the state machine
//! raft/sm/DAMAGED      marker: a record failed its checksum; rebuild at the next start
//! raft/restore-spool/  operator snapshots being uploaded and checked (temporary files)
//! raft/snapshots/<id>/ a raft snapshot: data.mdb (a compacted state machine) and meta
//! raft/snapshots/building-<pid>-<n>/, incoming-<pid>-<n>/   snapshots being built or received
//! ```
//!
//! Every environment records the on-disk format it was written in (`meta` key `format`, a u32
//! big-endian). A build opens formats up to [`crate::wire::FORMAT`] and refuses newer ones, naming
//! both. Environments written before the key existed are format 1.

use std::path::{Path, PathBuf};

use heed::types::{Bytes, Str, U64, Unit};
use heed::{CommitOrAbort, Database, Env, EnvOpenOptions, WithoutTls, byteorder::BigEndian};

use crate::storage::StorageKey;
use crate::wire::FORMAT;

/// Virtual size of the log's memory map (the format marker; up to format 1, the whole log).
/// Sparse: only written pages use disk.
const LOG_MAP_SIZE: usize = 64 << 30;

/// The raft log (segments of [`super::wal`]).
pub(crate) const WAL_DIR: &str = "raft/wal";
/// Where resd kept the raft log in LMDB before format 2 (moved to [`WAL_DIR`] at the first
/// open); from format 2, emptied, the marker of the directory's format.
pub(crate) const LOG_DIR: &str = "raft/log";
pub(crate) const SM_DIR: &str = "raft/sm";
pub(crate) const SM_CURRENT: &str = "raft/sm/CURRENT";
/// Present only while the state machine is known to be fully on disk (written at a clean
/// shutdown, removed at start).
pub(crate) const SM_CLEAN: &str = "raft/sm/CLEAN";
/// Marker: the state machine was found damaged while running (what and where); the next start
/// rebuilds it whatever else it finds.
pub(crate) const SM_DAMAGED: &str = "raft/sm/DAMAGED";
pub(crate) const SNAPSHOT_DIR: &str = "raft/snapshots";
/// Uploaded operator snapshots, while they are checked (temporary files).
pub(crate) const RESTORE_SPOOL_DIR: &str = "raft/restore-spool";
/// Which node of which cluster the data directory belongs to: `cluster=NAME` and `node=ID`
/// lines, written at the first start and checked at every later one.
pub(crate) const IDENTITY_FILE: &str = "raft/IDENTITY";
/// Present once the node was removed from its cluster; holds why, for people.
pub(crate) const REMOVED_FILE: &str = "raft/REMOVED";
/// Present while the node is repaired from the leader after its log was damaged; holds why.
pub(crate) const REPAIR_FILE: &str = "raft/REPAIRING";
/// The voters of the membership the node last followed, space-separated (who could repair it).
pub(crate) const MEMBERS_FILE: &str = "raft/MEMBERS";
/// A new directory to set damaged files aside in, for people: `raft/damaged-<unix seconds>`,
/// with `-2`, `-3`… when that one exists (a second set-aside in the same start, or a restart
/// within the second).
fn damaged_dir(data_dir: &Path) -> PathBuf {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let base = data_dir.join(format!("raft/damaged-{seconds}"));
    let mut dir = base.clone();
    let mut n = 1;
    while dir.exists() {
        n += 1;
        dir = PathBuf::from(format!("{}-{n}", base.display()));
    }
    dir
}

/// Moves `parts` (paths under `data_dir`; those that do not exist are skipped) into a new
/// `raft/damaged-*` directory, each under its own last name, durably; returns that directory.
/// Damaged files are kept for people, out of the way of the node.
pub(crate) fn set_aside(data_dir: &Path, parts: &[&Path]) -> std::io::Result<PathBuf> {
    let aside = damaged_dir(data_dir);
    std::fs::create_dir_all(&aside)?;
    for part in parts {
        let from = data_dir.join(part);
        if let (true, Some(name)) = (from.exists(), part.file_name()) {
            let parent = from.parent().unwrap_or(data_dir).to_path_buf();
            std::fs::rename(&from, aside.join(name))?;
            sync_dir(&parent)?;
        }
    }
    sync_dir(aside.parent().unwrap_or(data_dir))?;
    Ok(aside)
}

/// Writes `contents` to `path` so that a crash leaves the old file or the new one, whole: a
/// temporary file beside it, synced, renamed over it, the directory synced.
pub(crate) fn write_durably(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, contents)?;
    sync_file(&temporary)?;
    std::fs::rename(&temporary, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Marks the data directory as under repair, durably, saying why for people: before anything
/// is set aside, so a crash in between never leaves a node that votes with an empty log.
pub(crate) fn mark_repairing(data_dir: &Path, why: &str) -> std::io::Result<()> {
    write_durably(&data_dir.join(REPAIR_FILE), why)
}

/// Whether the data directory is under repair (see `backend::repair`).
pub(crate) fn is_repairing(data_dir: &Path) -> bool {
    data_dir.join(REPAIR_FILE).exists()
}

/// Holds the PID of the process that serves the data directory (for people). The lock itself
/// is `flock` (exclusive) on the directory: a second process on the same directory would write
/// the same log, and a lock on a file someone can delete would let it. This file is locked too:
/// builds before the directory lock held only it, and a node of such a build still running
/// during an upgrade must keep the new build out.
pub(crate) const LOCK_FILE: &str = "LOCK";

/// The exclusive hold of a data directory, released when dropped (or when the process ends,
/// however it ends: the kernel drops a dead process's locks).
#[derive(Debug)]
pub(crate) struct DirLock {
    _dir: std::fs::File,
    _file: std::fs::File,
}

/// Why a data directory cannot be held.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "the data directory {dir} is in use by another resd process{holder}: stop it first, or give this node another --data-dir"
    )]
    Held { dir: PathBuf, holder: String },
    #[error("cannot lock the data directory {dir} ({path}): {source}")]
    Io {
        dir: PathBuf,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DirLock {
    /// Takes the data directory `data_dir` (creating it if needed) for this process, or says
    /// which process holds it.
    pub(crate) fn acquire(data_dir: &Path) -> Result<DirLock, LockError> {
        use std::io::Write;
        let path = data_dir.join(LOCK_FILE);
        let failed = |source: std::io::Error| LockError::Io {
            dir: data_dir.to_path_buf(),
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(failed)?;
        // The data directory holds every resource and the token hashes: its owner's only.
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(data_dir)
                .map_err(failed)?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(failed)?;
                tracing::warn!(
                    dir = %data_dir.display(),
                    was = format!("{:o}", mode & 0o777),
                    "the data directory was readable by other users; it is 0700 now"
                );
            }
        }
        // The directory's inode cannot be deleted while it holds anything, or replaced under a
        // running node: the lock lives there.
        let directory = std::fs::File::open(data_dir).map_err(|source| LockError::Io {
            dir: data_dir.to_path_buf(),
            path: data_dir.to_path_buf(),
            source,
        })?;
        match rustix::fs::flock(
            &directory,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|text| text.trim().parse::<u32>().ok())
                    .map(|pid| format!(" (PID {pid})"))
                    .unwrap_or_default();
                return Err(LockError::Held {
                    dir: data_dir.to_path_buf(),
                    holder,
                });
            }
            Err(errno) => return Err(failed(errno.into())),
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|text| text.trim().parse::<u32>().ok())
                    .map(|pid| format!(" (PID {pid}, a build that locks only {LOCK_FILE})"))
                    .unwrap_or_default();
                return Err(LockError::Held {
                    dir: data_dir.to_path_buf(),
                    holder,
                });
            }
            Err(errno) => return Err(failed(errno.into())),
        }
        file.set_len(0).map_err(failed)?;
        writeln!(file, "{}", std::process::id()).map_err(failed)?;
        Ok(DirLock {
            _dir: directory,
            _file: file,
        })
    }
}

/// The identity a data directory records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub cluster: String,
    pub node_id: u64,
}

impl Identity {
    pub(crate) fn render(&self) -> String {
        format!("cluster={}\nnode={}\n", self.cluster, self.node_id)
    }

    pub(crate) fn parse(text: &str) -> Result<Identity, String> {
        let mut cluster = None;
        let mut node_id = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match line.split_once('=') {
                Some(("cluster", value)) => cluster = Some(value.to_owned()),
                Some(("node", value)) => {
                    node_id = Some(
                        value
                            .parse()
                            .map_err(|_| format!("node {value:?} is not a number"))?,
                    )
                }
                _ => return Err(format!("unexpected line {line:?}")),
            }
        }
        Ok(Identity {
            cluster: cluster.ok_or("no cluster line")?,
            node_id: node_id.ok_or("no node line")?,
        })
    }
}

/// Checks that `data_dir` belongs to `expected` (recording it on first use): a data directory
/// of another node or cluster would join this node's raft with someone else's log.
pub(crate) fn check_identity(data_dir: &Path, expected: &Identity) -> Result<(), String> {
    let path = data_dir.join(IDENTITY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found = Identity::parse(&text).map_err(|why| {
                format!(
                    "{} is damaged ({why}); it records which node the directory belongs to",
                    path.display()
                )
            })?;
            if &found != expected {
                return Err(format!(
                    "the data directory {} belongs to node {} of cluster {:?}, but this is node {} of cluster {:?}: give the right --data-dir, --node-id and --cluster-name (or an empty directory for a new node)",
                    data_dir.display(),
                    found.node_id,
                    found.cluster,
                    expected.node_id,
                    expected.cluster
                ));
            }
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let write = || -> std::io::Result<()> {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                write_durably(&path, expected.render())
            };
            write().map_err(|error| {
                format!(
                    "cannot record the data directory's owner in {}: {error}",
                    path.display()
                )
            })
        }
        Err(error) => Err(format!("cannot read {}: {error}", path.display())),
    }
}

pub(crate) const META_FORMAT: &str = "format";
pub(crate) const META_VOTE: &str = "vote";
pub(crate) const META_LAST_PURGED: &str = "last_purged";
/// In the log's format marker: the write-ahead log was made (so its directory must hold it).
pub(crate) const META_WAL: &str = "wal";
pub(crate) const META_LAST_APPLIED: &str = "last_applied";
pub(crate) const META_MEMBERSHIP: &str = "membership";
pub(crate) const META_RESTORE_ID: &str = "restore_id";
/// Each fenced domain's last change (`revision/types`, `revision/acl`): the index and position
/// of the version, big-endian (DESIGN §15's fence).
pub(crate) fn meta_revision(domain: crate::storage::Domain) -> String {
    format!("revision/{}", domain.name())
}

/// A domain's revision as the meta database holds it.
pub(crate) fn encode_revision(version: crate::storage::Version) -> [u8; 12] {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&version.index.to_be_bytes());
    bytes[8..].copy_from_slice(&version.position.to_be_bytes());
    bytes
}

/// [`encode_revision`] read back; `None` for bytes of another length.
pub(crate) fn decode_revision(bytes: &[u8]) -> Option<crate::storage::Version> {
    let index = u64::from_be_bytes(bytes.get(..8)?.try_into().ok()?);
    let position = u32::from_be_bytes(bytes.get(8..12)?.try_into().ok()?);
    (bytes.len() == 12).then_some(crate::storage::Version::at(index, position))
}

pub(crate) type LmdbEnv = Env<WithoutTls>;

/// How an environment commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Every commit is synced before it returns (the raft log).
    Synced,
    /// Commits are not synced (the state machine: derived from the log, rebuilt from the latest
    /// snapshot and the log after an unclean shutdown, synced at a clean one).
    Rebuildable,
}

/// LMDB's meta pages (pages 0 and 1 of `data.mdb`, the newer one in use): where their fields
/// are (LMDB 0.9's `MDB_meta` after a 16-byte page header, 64-bit build).
mod lmdb_meta {
    pub(super) const MAGIC: u32 = 0xBEEF_C0DE;
    pub(super) const MAGIC_AT: usize = 16;
    /// The free database's `md_pad` holds the page size.
    pub(super) const PAGE_SIZE_AT: usize = 40;
    pub(super) const LAST_PAGE_AT: usize = 136;
    pub(super) const TXNID_AT: usize = 144;
    pub(super) const LEN: usize = 152;
}

/// Why an LMDB data file cannot be mapped safely.
#[derive(Debug, thiserror::Error)]
#[error("{path} is damaged: {what}; it is not opened (mapping it could crash the process)")]
pub(crate) struct LmdbFileError {
    pub path: PathBuf,
    pub what: String,
}

/// Checks an LMDB data file against its own metadata before it is mapped: a file shorter than
/// the pages its newest meta page says are in use would crash the process (SIGBUS) at the first
/// read of a missing page. An absent or empty file is a new environment.
pub(crate) fn check_lmdb_file(path: &Path) -> Result<(), LmdbFileError> {
    use std::os::unix::fs::FileExt;
    let damaged = |what: String| LmdbFileError {
        path: path.to_path_buf(),
        what,
    };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(damaged(format!("cannot read it: {error}"))),
    };
    let len = file
        .metadata()
        .map_err(|error| damaged(format!("cannot read it: {error}")))?
        .len();
    if len == 0 {
        return Ok(());
    }
    let meta_at = |offset: u64| -> Result<Option<(u32, u64, u64)>, LmdbFileError> {
        let mut page = [0u8; lmdb_meta::LEN];
        if offset + lmdb_meta::LEN as u64 > len {
            return Ok(None);
        }
        file.read_exact_at(&mut page, offset)
            .map_err(|error| damaged(format!("cannot read it: {error}")))?;
        let u32_at = |at: usize| u32::from_le_bytes(page[at..at + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |at: usize| u64::from_le_bytes(page[at..at + 8].try_into().unwrap_or([0; 8]));
        if u32_at(lmdb_meta::MAGIC_AT) != lmdb_meta::MAGIC {
            return Ok(None);
        }
        Ok(Some((
            u32_at(lmdb_meta::PAGE_SIZE_AT),
            u64_at(lmdb_meta::LAST_PAGE_AT),
            u64_at(lmdb_meta::TXNID_AT),
        )))
    };
    let Some((page_size, ..)) = meta_at(0)? else {
        return Err(damaged(format!(
            "its first page is not an LMDB meta page ({len} bytes)"
        )));
    };
    if !page_size.is_power_of_two() || !(512..=65_536).contains(&page_size) {
        return Err(damaged(format!(
            "its meta page names a page size of {page_size}"
        )));
    }
    let metas = [meta_at(0)?, meta_at(u64::from(page_size))?];
    let Some((_, last_page, _)) = metas
        .into_iter()
        .flatten()
        .filter(|(size, ..)| *size == page_size)
        .max_by_key(|(_, _, txnid)| *txnid)
    else {
        return Err(damaged("it has no valid meta page".into()));
    };
    let needed = last_page
        .checked_add(1)
        .and_then(|pages| pages.checked_mul(u64::from(page_size)))
        .ok_or_else(|| damaged(format!("its meta page names page {last_page} as the last")))?;
    if len < needed {
        return Err(damaged(format!(
            "it is {len} bytes long, but its metadata says {needed} bytes ({} pages of {page_size}) are in use: it was cut short",
            last_page + 1
        )));
    }
    Ok(())
}

/// Opens (creating if needed) an environment in `dir`, once its data file passed
/// [`check_lmdb_file`].
pub(crate) fn open_env(
    dir: &Path,
    max_dbs: u32,
    durability: Durability,
    map_size: usize,
) -> heed::Result<LmdbEnv> {
    std::fs::create_dir_all(dir)?;
    check_lmdb_file(&dir.join(SNAPSHOT_DATA))
        .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
    let mut options = EnvOpenOptions::new().read_txn_without_tls();
    options.map_size(map_size).max_dbs(max_dbs);
    // SAFETY: each environment directory is opened by one resd process only (the data directory
    // belongs to one node) and nothing else writes its files. NO_SYNC (state machine only) can
    // leave the file torn after an OS crash; the state machine is then discarded and rebuilt
    // (see `state_machine::StateMachineStore::open`), never read.
    #[allow(unsafe_code)]
    let env = unsafe {
        if durability == Durability::Rebuildable {
            options.flags(heed::EnvFlags::NO_SYNC);
        }
        options.open(dir)?
    };
    Ok(env)
}

/// A data directory written by a newer build.
#[derive(Debug, thiserror::Error)]
#[error(
    "{dir} holds on-disk format version {found}, but this build of resd reads versions up to {supported}: run a newer resd on it (downgrades are not supported)"
)]
pub(crate) struct FormatError {
    pub dir: PathBuf,
    pub found: u32,
    pub supported: u32,
}

/// Checks (and on a new environment records) the format version of an environment. An
/// environment of an older format is brought up to this one by `upgrade` (given the format
/// found), in the transaction that records the new format.
fn check_format(
    env: &LmdbEnv,
    meta: Database<'static, Str, Bytes>,
    dir: &Path,
    upgrade: impl FnOnce(&mut heed::RwTxn<'_>, u32) -> heed::Result<()>,
) -> heed::Result<()> {
    let mut wtxn = env.write_txn()?;
    let found = match meta.get(&wtxn, META_FORMAT)? {
        Some(bytes) => match <[u8; 4]>::try_from(bytes) {
            Ok(raw) => u32::from_be_bytes(raw),
            Err(_) => u32::MAX,
        },
        None => {
            meta.put(&mut wtxn, META_FORMAT, &FORMAT.to_be_bytes())?;
            FORMAT
        }
    };
    if found > FORMAT {
        wtxn.abort();
        return Err(heed::Error::Io(std::io::Error::other(FormatError {
            dir: dir.to_path_buf(),
            found,
            supported: FORMAT,
        })));
    }
    if found < FORMAT {
        upgrade(&mut wtxn, found)?;
        meta.put(&mut wtxn, META_FORMAT, &FORMAT.to_be_bytes())?;
    }
    wtxn.commit()
}

#[cfg(test)]
/// The format version an environment's meta database records, if any.
pub(crate) fn format_of(
    env: &LmdbEnv,
    meta: Database<'static, Str, Bytes>,
) -> heed::Result<Option<u32>> {
    let rtxn = env.read_txn()?;
    Ok(meta
        .get(&rtxn, META_FORMAT)?
        .map(|bytes| <[u8; 4]>::try_from(bytes).map_or(u32::MAX, u32::from_be_bytes)))
}

/// Flushes a file (and so its contents) to disk.
pub(crate) fn sync_file(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Flushes a directory's entries (renames, creations) to disk.
pub(crate) fn sync_dir(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// Databases of the log environment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogDbs {
    pub entries: Database<'static, U64<BigEndian>, Bytes>,
    pub meta: Database<'static, Str, Bytes>,
}

pub(crate) fn open_log(data_dir: &Path) -> heed::Result<(LmdbEnv, LogDbs)> {
    let env = open_env(&data_dir.join(LOG_DIR), 4, Durability::Synced, LOG_MAP_SIZE)?;
    let wtxn = env.write_txn()?;
    let dbs = env
        .create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
            let entries = opener.create_database(wtxn, Some("entries"))?;
            let meta = opener.create_database(wtxn, Some("meta"))?;
            Ok(CommitOrAbort::<_, ()>::Commit((entries, meta)))
        })?
        .commit();
    let (entries, meta) = dbs
        .ok_or_else(|| heed::Error::Io(std::io::Error::other("log databases were not created")))?;
    // The log's environment is only a marker now: nothing in it is sealed.
    check_format(&env, meta, &data_dir.join(LOG_DIR), |_, _| Ok(()))?;
    Ok((env, LogDbs { entries, meta }))
}

/// Databases of a state machine environment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmDbs {
    pub resources: Database<'static, Bytes, Bytes>,
    pub restore: Database<'static, Bytes, Bytes>,
    pub owners: Database<'static, Bytes, Unit>,
    pub meta: Database<'static, Str, Bytes>,
    /// Request id (16 bytes) → what applying it came to (`codec::encode_remembered`).
    pub requests: Database<'static, Bytes, Bytes>,
    /// Applied position (`request_order_key`) → request id: the order requests are forgotten in.
    pub request_order: Database<'static, Bytes, Bytes>,
    /// Objects' history (`state_machine::history`).
    pub history: Database<'static, Bytes, Bytes>,
    /// History entries by expiry.
    pub history_expiry: Database<'static, Bytes, Bytes>,
    /// A restore's staged history.
    pub restore_history: Database<'static, Bytes, Bytes>,
}

/// Opens (creating if needed) the state machine environment in `dir`, mapping `map_size` bytes
/// ([`map_size_for`] the node's quota).
pub(crate) fn open_sm(dir: &Path, map_size: usize) -> heed::Result<(LmdbEnv, SmDbs)> {
    let env = open_env(dir, 16, Durability::Rebuildable, map_size)?;
    let wtxn = env.write_txn()?;
    let dbs = env
        .create_databases_and_commit(wtxn, |opener, wtxn| -> heed::Result<_> {
            let resources = opener.create_database(wtxn, Some("resources"))?;
            let restore = opener.create_database(wtxn, Some("restore"))?;
            let owners = opener.create_database(wtxn, Some("owners"))?;
            let meta = opener.create_database(wtxn, Some("meta"))?;
            let requests = opener.create_database(wtxn, Some("requests"))?;
            let request_order = opener.create_database(wtxn, Some("request_order"))?;
            let history = opener.create_database(wtxn, Some("history"))?;
            let history_expiry = opener.create_database(wtxn, Some("history_expiry"))?;
            let restore_history = opener.create_database(wtxn, Some("restore_history"))?;
            Ok(CommitOrAbort::<_, ()>::Commit((
                (resources, restore, owners, meta, requests, request_order),
                (history, history_expiry, restore_history),
            )))
        })?
        .commit();
    let (
        (resources, restore, owners, meta, requests, request_order),
        (history, history_expiry, restore_history),
    ) = dbs.ok_or_else(|| {
        heed::Error::Io(std::io::Error::other(
            "state machine databases were not created",
        ))
    })?;
    check_format(&env, meta, dir, |wtxn, found| {
        if found < 3 {
            let mut sealed = 0;
            for db in [resources, restore, requests] {
                sealed += super::sealed::seal_database(db, wtxn, &[])?;
            }
            sealed += super::sealed::seal_database(
                meta.remap_key_type::<Bytes>(),
                wtxn,
                &[META_FORMAT.as_bytes()],
            )?;
            tracing::info!(dir = %dir.display(), sealed, "sealed the state machine's records with checksums (format {found} -> 3)");
        }
        Ok(())
    })?;
    Ok((
        env,
        SmDbs {
            resources,
            restore,
            owners,
            meta,
            requests,
            request_order,
            history,
            history_expiry,
            restore_history,
        },
    ))
}

/// Bytes a state machine's databases hold in pages (their branch, leaf and overflow pages; the
/// free pages LMDB reuses do not count): what `--quota-bytes` bounds. Objects' history is not
/// counted: a delete must make room (it keeps the deleted version in history), and history
/// has its own bound (`--history-node-bytes`, at most half the quota; the map is four times
/// the quota).
pub(crate) fn state_bytes(
    env: &LmdbEnv,
    dbs: &SmDbs,
    txn: &heed::RoTxn<'_, WithoutTls>,
) -> heed::Result<u64> {
    let mut pages = 0u64;
    let mut page_size = 0u64;
    let main = env.unnamed_database_stat();
    for stat in [
        dbs.resources.stat(txn)?,
        dbs.restore.stat(txn)?,
        dbs.owners.stat(txn)?,
        dbs.meta.stat(txn)?,
        dbs.requests.stat(txn)?,
        dbs.request_order.stat(txn)?,
    ] {
        page_size = u64::from(stat.page_size);
        pages += (stat.branch_pages + stat.leaf_pages + stat.overflow_pages) as u64;
    }
    pages += (main.branch_pages + main.leaf_pages + main.overflow_pages) as u64;
    Ok(pages * page_size)
}

/// The largest `--quota-bytes` (its map, four times as large, is virtual address space only).
pub(crate) const MAX_QUOTA_BYTES: u64 = 1 << 40;
/// The default `--quota-bytes` (etcd's largest recommended quota).
pub(crate) const DEFAULT_QUOTA_BYTES: u64 = 8 << 30;

/// The memory map of a state machine whose state is bounded by `quota` bytes: four times the
/// quota (at least 1 GiB), so the file — the state, the free pages LMDB keeps for readers, and
/// a restore's staging of a whole state beside it — never outgrows the map, and apply never
/// meets `MDB_MAP_FULL`. Virtual: only written pages use memory or disk.
pub(crate) fn map_size_for(quota: u64) -> usize {
    let size = quota.min(MAX_QUOTA_BYTES).saturating_mul(4).max(1 << 30);
    usize::try_from(size).unwrap_or(usize::MAX)
}

/// Requests the state machine remembers at most; older ones are forgotten first. A retry comes
/// within a forward timeout, long after which this many changes have rarely been applied.
pub(crate) const REMEMBERED_REQUESTS: u64 = 1 << 17;

/// `index (u64 big-endian) position (u32 big-endian)`: request order keys sort as applied.
pub(crate) fn request_order_key(index: u64, position: u32) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&index.to_be_bytes());
    key[8..].copy_from_slice(&position.to_be_bytes());
    key
}

/// The file of a snapshot (or state machine generation) that holds the LMDB data.
pub(crate) const SNAPSHOT_DATA: &str = "data.mdb";
/// LMDB's lock file beside a data file.
pub(crate) const SNAPSHOT_LOCK: &str = "lock.mdb";
/// The file of a snapshot that holds its encoded `SnapshotMeta`.
pub(crate) const SNAPSHOT_META: &str = "meta";
/// The file of a snapshot that holds the length and checksum of its data file ([`FileSum`]).
pub(crate) const SNAPSHOT_SUM: &str = "sum";

/// A file's length and CRC-32: what a snapshot's `sum` file and the state machine's `CLEAN`
/// marker record, checked before the file is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileSum {
    pub len: u64,
    pub crc: u32,
}

impl FileSum {
    /// The sum of the file at `path` as it is now (read whole).
    pub(crate) fn of(path: &Path) -> std::io::Result<FileSum> {
        use std::io::Read;
        let mut file = std::fs::File::open(path)?;
        let mut hasher = crc32fast::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut len = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        Ok(FileSum {
            len,
            crc: hasher.finalize(),
        })
    }

    pub(crate) fn render(&self) -> String {
        format!("{} {:08x}\n", self.len, self.crc)
    }

    pub(crate) fn parse(text: &str) -> Option<FileSum> {
        let mut words = text.split_whitespace();
        let len = words.next()?.parse().ok()?;
        let crc = u32::from_str_radix(words.next()?, 16).ok()?;
        Some(FileSum { len, crc })
    }

    /// Whether the file at `path` still has this sum; if not, what differs (for people).
    pub(crate) fn check(&self, path: &Path) -> Result<(), String> {
        let now = FileSum::of(path).map_err(|error| format!("cannot read it: {error}"))?;
        if now.len != self.len {
            return Err(format!(
                "it is {} bytes long, but was {} bytes long when it was written",
                now.len, self.len
            ));
        }
        if now.crc != self.crc {
            return Err(format!(
                "its checksum is {:08x}, but was {:08x} when it was written",
                now.crc, self.crc
            ));
        }
        Ok(())
    }
}

/// Writes (and syncs) the `sum` file of the snapshot in `dir`.
pub(crate) fn write_snapshot_sum(dir: &Path) -> std::io::Result<()> {
    let sum = FileSum::of(&dir.join(SNAPSHOT_DATA))?;
    std::fs::write(dir.join(SNAPSHOT_SUM), sum.render())?;
    sync_file(&dir.join(SNAPSHOT_SUM))
}

/// Checks the snapshot in `dir` against its `sum` file (a snapshot written before sums were
/// kept has none and passes).
pub(crate) fn check_snapshot_sum(dir: &Path) -> Result<(), String> {
    match std::fs::read_to_string(dir.join(SNAPSHOT_SUM)) {
        Ok(text) => FileSum::parse(&text)
            .ok_or_else(|| format!("its sum file holds {text:?}"))?
            .check(&dir.join(SNAPSHOT_DATA)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(format!("cannot read its sum file: {error}")),
    }
}

/// The directory of a complete raft snapshot.
pub(crate) fn snapshot_dir(data_dir: &Path, snapshot_id: &str) -> PathBuf {
    data_dir.join(SNAPSHOT_DIR).join(snapshot_id)
}

/// Where this process builds its `sequence`th snapshot before renaming it into place.
pub(crate) fn building_snapshot_dir(data_dir: &Path, sequence: u64) -> PathBuf {
    data_dir
        .join(SNAPSHOT_DIR)
        .join(format!("building-{}-{sequence}", std::process::id()))
}

/// Where this process receives its `sequence`th snapshot from a leader.
pub(crate) fn incoming_snapshot_dir(data_dir: &Path, sequence: u64) -> PathBuf {
    data_dir
        .join(SNAPSHOT_DIR)
        .join(format!("incoming-{}-{sequence}", std::process::id()))
}

/// The id of a snapshot of the state at `last` (term, index), unique per `sequence`.
pub(crate) fn snapshot_id(last: Option<(u64, u64)>, sequence: u64) -> String {
    let (term, index) = last.unwrap_or((0, 0));
    format!("{term}-{index}-{sequence}")
}

/// Whether a snapshot id (which names a directory) is one this build makes: `term-index-n`.
pub(crate) fn check_snapshot_id(snapshot_id: &str) -> Result<(), String> {
    let parts: Vec<&str> = snapshot_id.split('-').collect();
    let valid = snapshot_id.len() <= 64
        && parts.len() == 3
        && parts
            .iter()
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "snapshot id {snapshot_id:?} is not of the form term-index-sequence"
        ))
    }
}

/// The directory of a state machine generation.
pub(crate) fn sm_generation_dir(data_dir: &Path, generation: u64) -> PathBuf {
    data_dir.join(SM_DIR).join(format!("{generation:020}"))
}

/// Makes `generation`'s directory anew, holding a synced copy of `snapshot` (the data file of
/// a raft snapshot) when there is one; returns the directory. How a state machine starts from
/// a snapshot: rebuilt after an unclean stop, installed from a leader, or rebased onto its own.
pub(crate) fn new_generation(
    data_dir: &Path,
    generation: u64,
    snapshot: Option<&Path>,
) -> std::io::Result<PathBuf> {
    let dir = sm_generation_dir(data_dir, generation);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    if let Some(snapshot) = snapshot {
        let data = dir.join(SNAPSHOT_DATA);
        std::fs::copy(snapshot, &data)?;
        sync_file(&data)?;
    }
    sync_dir(&dir)?;
    Ok(dir)
}

/// Separator inside composite keys; no name, group or kind contains it.
pub(crate) const SEP: u8 = 0;

/// `group 0 kind 0 partition 0 namespace 0 name`: resources sort by type, tenancy, name.
pub(crate) fn resource_key(key: &StorageKey) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(
        key.group.len()
            + key.kind.len()
            + key.partition.len()
            + key.namespace.len()
            + key.name.len()
            + 4,
    );
    for (index, part) in [
        &key.group,
        &key.kind,
        &key.partition,
        &key.namespace,
        &key.name,
    ]
    .into_iter()
    .enumerate()
    {
        if index > 0 {
            bytes.push(SEP);
        }
        bytes.extend_from_slice(part.as_bytes());
    }
    bytes
}

/// Decodes [`resource_key`].
pub(crate) fn parse_resource_key(bytes: &[u8]) -> Option<StorageKey> {
    let parts: Vec<&[u8]> = bytes.split(|b| *b == SEP).collect();
    let [group, kind, partition, namespace, name] = parts.as_slice() else {
        return None;
    };
    let text = |part: &[u8]| String::from_utf8(part.to_vec()).ok();
    Some(StorageKey {
        group: text(group)?,
        kind: text(kind)?,
        partition: text(partition)?,
        namespace: text(namespace)?,
        name: text(name)?,
    })
}

/// The longest key prefix shared by every resource a query can match: the type, then as much of
/// the tenancy as is not a wildcard, then (in one namespace) the name prefix, so listing a few
/// names of a large type seeks to them instead of scanning the type.
pub(crate) fn resource_scan_prefix(
    group: &str,
    kind: &str,
    partition: &str,
    namespace: &str,
    name_prefix: &str,
) -> Vec<u8> {
    let mut prefix = Vec::new();
    prefix.extend_from_slice(group.as_bytes());
    prefix.push(SEP);
    prefix.extend_from_slice(kind.as_bytes());
    prefix.push(SEP);
    if partition != crate::resource::WILDCARD {
        prefix.extend_from_slice(partition.as_bytes());
        prefix.push(SEP);
        if namespace != crate::resource::WILDCARD {
            prefix.extend_from_slice(namespace.as_bytes());
            prefix.push(SEP);
            // The name is the key's last part: a prefix of it is a prefix of the key.
            prefix.extend_from_slice(name_prefix.as_bytes());
        }
    }
    prefix
}

/// `owner uid 0 child resource key`.
pub(crate) fn owner_key(owner_uid: &str, child: &StorageKey) -> Vec<u8> {
    let mut bytes = owner_prefix(owner_uid);
    bytes.extend_from_slice(&resource_key(child));
    bytes
}

pub(crate) fn owner_prefix(owner_uid: &str) -> Vec<u8> {
    let mut bytes = owner_uid.as_bytes().to_vec();
    bytes.push(SEP);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(group: &str, kind: &str, partition: &str, namespace: &str, name: &str) -> StorageKey {
        StorageKey {
            group: group.into(),
            kind: kind.into(),
            partition: partition.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn an_lmdb_file_shorter_than_its_metadata_says_is_refused_before_it_is_mapped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (env, dbs) = open_sm(dir.path(), 1 << 30).expect("open");
        let mut wtxn = env.write_txn().expect("txn");
        for i in 0u32..2000 {
            dbs.resources
                .put(&mut wtxn, &i.to_be_bytes(), &[7u8; 200])
                .expect("put");
        }
        wtxn.commit().expect("commit");
        env.prepare_for_closing().wait();
        let data = dir.path().join(SNAPSHOT_DATA);
        check_lmdb_file(&data).expect("whole");
        let len = std::fs::metadata(&data).expect("metadata").len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&data)
            .expect("open");
        file.set_len(len / 2).expect("cut");
        let message = match open_sm(dir.path(), 1 << 30) {
            Ok(_) => panic!("a cut file was mapped"),
            Err(error) => error.to_string(),
        };
        assert!(
            message.contains("data.mdb is damaged") && message.contains("it was cut short"),
            "{message}"
        );
        // A first page that is not LMDB's is refused too.
        file.set_len(len).expect("grow");
        use std::os::unix::fs::FileExt;
        file.write_all_at(&[0xff; 64], 0).expect("scribble");
        let message = check_lmdb_file(&data).expect_err("scribbled").to_string();
        assert!(message.contains("not an LMDB meta page"), "{message}");
    }

    #[test]
    fn the_state_machine_map_is_sized_from_the_quota() {
        assert_eq!(map_size_for(DEFAULT_QUOTA_BYTES), 32 << 30);
        assert_eq!(map_size_for(1 << 20), 1 << 30, "at least 1 GiB");
        assert_eq!(map_size_for(u64::MAX), 4 << 40, "the quota is capped first");
        let dir = tempfile::tempdir().expect("dir");
        let (env, _) = open_sm(dir.path(), map_size_for(3 << 30)).expect("open");
        assert_eq!(env.info().map_size, 12 << 30);
    }

    #[test]
    fn a_data_directory_is_held_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().expect("temp dir");
        let held = DirLock::acquire(dir.path()).expect("first");
        let message = DirLock::acquire(dir.path())
            .expect_err("second")
            .to_string();
        assert!(
            message.contains("in use by another resd process")
                && message.contains(&format!("(PID {})", std::process::id())),
            "{message}"
        );
        drop(held);
        DirLock::acquire(dir.path()).expect("free again");
    }

    /// A node of a build that held only `LOCK` (flock on the file, not the directory) keeps
    /// this build out of its directory during an upgrade.
    #[test]
    fn a_build_that_locks_only_the_lock_file_keeps_this_one_out() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("temp dir");
        let mut old = std::fs::File::create(dir.path().join(LOCK_FILE)).expect("create");
        rustix::fs::flock(&old, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .expect("the old build's lock");
        writeln!(old, "4242").expect("pid");
        let message = DirLock::acquire(dir.path())
            .expect_err("held by the old build")
            .to_string();
        assert!(message.contains("(PID 4242"), "{message}");
        drop(old);
        DirLock::acquire(dir.path()).expect("free once it stops");
    }

    #[test]
    fn a_data_directory_is_claimed_once_and_then_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let me = Identity {
            cluster: "prod".into(),
            node_id: 1,
        };
        check_identity(dir.path(), &me).expect("claimed");
        check_identity(dir.path(), &me).expect("the same node again");
        let other = Identity {
            cluster: "prod".into(),
            node_id: 2,
        };
        let error = check_identity(dir.path(), &other).expect_err("another node");
        assert!(error.contains("belongs to node 1"), "{error}");
        assert_eq!(Identity::parse(&me.render()), Ok(me));
        assert!(Identity::parse("cluster=x\nnode=y\n").is_err());
    }

    #[test]
    fn resource_keys_round_trip_including_empty_tenancy() {
        for original in [
            key("demo", "Artist", "default", "default", "miles"),
            key("demo", "Executive", "", "", "boss"),
        ] {
            assert_eq!(parse_resource_key(&resource_key(&original)), Some(original));
        }
    }

    #[test]
    fn scan_prefixes_cover_exactly_their_tenancy() {
        let inside = resource_key(&key("demo", "Artist", "p1", "n1", "x"));
        let other_namespace = resource_key(&key("demo", "Artist", "p1", "n10", "x"));
        let exact = resource_scan_prefix("demo", "Artist", "p1", "n1", "");
        assert!(inside.starts_with(&exact));
        assert!(
            !other_namespace.starts_with(&exact),
            "n1 must not prefix-match n10"
        );
        assert!(
            other_namespace.starts_with(&resource_scan_prefix("demo", "Artist", "p1", "*", ""))
        );
        assert!(inside.starts_with(&resource_scan_prefix("demo", "Artist", "*", "*", "")));
        assert!(
            !resource_key(&key("demo", "ArtistX", "p1", "n1", "x"))
                .starts_with(&resource_scan_prefix("demo", "Artist", "*", "*", ""))
        );
        // In one namespace the name prefix narrows the seek.
        let named = resource_scan_prefix("demo", "Artist", "p1", "n1", "mi");
        assert!(resource_key(&key("demo", "Artist", "p1", "n1", "miles")).starts_with(&named));
        assert!(!resource_key(&key("demo", "Artist", "p1", "n1", "nina")).starts_with(&named));
    }
}
