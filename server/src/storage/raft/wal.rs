//! The raft log on disk: a write-ahead file of checksummed records, in segments.
//!
//! A log commit is one `pwrite` of the batch's records at the end of the current segment and one
//! `fdatasync`. Segments are zero-filled when they are made (ahead of need, on a helper thread),
//! so that sync writes no file metadata, and a zero length marks where the records end. An LMDB
//! commit, which the log used before, syncs twice (its pages, then its meta page) and writes
//! five or six scattered pages per append; this is what keeps a single-client write at one disk
//! flush per node.
//!
//! ```text
//! raft/wal/<seq, 20 digits>.wal   segments, replayed in order; numbered without gaps
//! raft/wal/prepared.tmp           the next segment, zero-filled (and given its header when
//!                                 it is needed), not in use yet
//!
//! record = len u32 LE | crc32 of body u32 LE | body          (len 0: no more records)
//! body   = 1 | format u32 | seq u64 | size u64               header, first in every segment
//!                                                              (size: the file's length; no
//!                                                              size before format 3)
//!        | 2 | index u64 | encoded Entry                     an entry (drops any at >= index)
//!        | 3 | from u64                                      truncate: drop entries >= from
//!        | 4 | upto u64 | encoded LogId                      purge: drop entries <= upto
//!        | 5 | encoded Vote                                  the vote
//!        | 6 | offset u64                                    batch: first record of every
//!                                                              write after the header, at offset
//!        | 7 | next u64                                      seal: the log goes on in segment
//!                                                              next (the last record of every
//!                                                              segment but the newest)
//! ```
//!
//! A new segment starts with its header, then the vote and the purge point as they stand, so
//! segments older than the first live entry can be deleted without losing either.
//!
//! **The log knows where it ends.** A segment is given its header (and size) while it is still
//! `prepared.tmp`, and only then renamed into place, so every segment file has a whole header
//! and its full length; the segment before it is sealed, naming it, before anything is written
//! to it. So a segment without a header, one shorter than its header says, a gap in the
//! numbering, a sealed newest segment (its successor is gone), an unsealed older one, a gap in
//! the entries, and an empty directory where the log had been (the caller knows; see
//! [`Wal::open`]) are all damage, never an empty tail.
//!
//! **A torn tail is not damage.** At open, the first record of the newest segment that is cut
//! short or fails its checksum ends the log if the write it belongs to never finished: a write
//! that was never synced, so never acknowledged. What follows it is zeroed so a later write can
//! never run into a stale record. A write that was cut short leaves zeros where it stops (the
//! segment was zero-filled before it was written, and a write lands in whole sectors): a bad
//! record with no unwritten (all-zero) sector between it and the end of the written bytes, whose
//! body is all there (its length, or a length that matches its checksum, ends inside them), was
//! written whole, so it was synced and has been damaged since. So was a bad record, or an early
//! end of the records, with a whole batch marker behind it: a write begins only after the one
//! before it was synced. Both are damage, as is a bad record in any segment but the newest: the
//! log refuses to open, naming the file and offset. (An entry whose payload holds 512 aligned
//! zero bytes cannot be told from a cut write this way: damage to the last write of such an
//! entry passes as a torn tail.) (Segments of the formats before 3 carry no
//! size or seal, and those of format 1 no markers; such a segment is never appended to again —
//! the next write starts a new segment.)

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::types::{LogId, Vote};
use crate::wire::FORMAT;
use crate::wire::raft::decode;

/// Size of a segment (a larger batch gets a segment of its own size). Tests use small segments,
/// so that every raft test also crosses segment boundaries and deletes purged segments.
#[cfg(not(test))]
pub(crate) const SEGMENT_BYTES: u64 = 16 << 20;
#[cfg(test)]
pub(crate) const SEGMENT_BYTES: u64 = 256 << 10;
const PREPARED: &str = "prepared.tmp";
const FRAME: usize = 8;

const KIND_HEADER: u8 = 1;
const KIND_ENTRY: u8 = 2;
const KIND_TRUNCATE: u8 = 3;
const KIND_PURGE: u8 = 4;
const KIND_VOTE: u8 = 5;
const KIND_BATCH: u8 = 6;
const KIND_SEAL: u8 = 7;
/// A batch marker: frame, kind, offset.
const MARKER: usize = FRAME + 1 + 8;
/// A seal: frame, kind, next segment. Every segment keeps room for one.
const SEAL: usize = FRAME + 1 + 8;
/// The unit a disk writes whole: a write cut short by a crash leaves whole sectors unwritten.
const SECTOR: usize = 512;

/// Why the log cannot be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path} is damaged{}: {what}; this is not an interrupted write, so entries this node had synced (and may have acknowledged) are lost",
        offset.map(|offset| format!(" at byte {offset}")).unwrap_or_default()
    )]
    Damaged {
        path: PathBuf,
        /// Where in the file, when the damage is inside one.
        offset: Option<u64>,
        what: String,
    },
    /// A segment the log needs is gone.
    #[error(
        "{path} is missing: {what}; this is not an interrupted write, so entries this node had synced (and may have acknowledged) are lost"
    )]
    Missing { path: PathBuf, what: String },
    #[error(
        "{path} holds raft log format version {found}, but this build of resd reads versions up to {supported}: run a newer resd on it (downgrades are not supported)"
    )]
    Format {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
}

impl WalError {
    /// Whether the log lost what it had synced (rather than being unreadable, or of a newer
    /// format).
    pub fn is_damage(&self) -> bool {
        matches!(self, WalError::Damaged { .. } | WalError::Missing { .. })
    }
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where an entry's record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    pub segment: u64,
    /// Offset of the record's frame in the segment.
    pub offset: u64,
    /// Length of the record's body.
    pub len: u32,
}

/// A segment file, shared between the writer and readers (reads and writes are positioned).
#[derive(Debug)]
pub(crate) struct Segment {
    pub seq: u64,
    pub file: Arc<File>,
}

/// What a write did: where its entries landed, and the segment it opened (if it started one).
#[derive(Debug)]
pub(crate) struct Written {
    pub locations: Vec<(u64, Location)>,
    pub opened: Option<Segment>,
}

/// What replaying the segments found.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    pub vote: Option<Vote>,
    pub purged: Option<LogId>,
    pub locations: BTreeMap<u64, Location>,
    /// Live segments, oldest first.
    pub segments: BTreeMap<u64, Arc<File>>,
}

/// The vote and purge point as they stand on disk, re-stated at the start of every segment.
#[derive(Clone, Debug, Default)]
struct Stated {
    vote: Option<Vec<u8>>,
    purge: Option<(u64, Vec<u8>)>,
}

/// Appends records to a body buffer.
#[derive(Default)]
pub(crate) struct Batch {
    body: Vec<u8>,
    /// (index, offset within `body`, body length) of each entry record.
    entries: Vec<(u64, usize, u32)>,
    stated: Option<Stated>,
}

impl Batch {
    fn record(&mut self, kind: u8, parts: &[&[u8]]) -> usize {
        let start = self.body.len();
        let len: usize = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
        self.body.extend_from_slice(&(len as u32).to_le_bytes());
        self.body.extend_from_slice(&[0; 4]);
        self.body.push(kind);
        for part in parts {
            self.body.extend_from_slice(part);
        }
        let crc = crc32fast::hash(&self.body[start + FRAME..]);
        self.body[start + 4..start + FRAME].copy_from_slice(&crc.to_le_bytes());
        start
    }

    pub(crate) fn entry(&mut self, index: u64, encoded: &[u8]) {
        let offset = self.record(KIND_ENTRY, &[&index.to_le_bytes(), encoded]);
        let len = (self.body.len() - offset - FRAME) as u32;
        self.entries.push((index, offset, len));
    }

    pub(crate) fn truncate(&mut self, from: u64) {
        self.record(KIND_TRUNCATE, &[&from.to_le_bytes()]);
    }

    fn stated(&mut self, base: &Stated) -> &mut Stated {
        self.stated.get_or_insert_with(|| base.clone())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// A segment as replay found it.
struct Kept {
    seq: u64,
    path: PathBuf,
    /// Where its records end.
    end: u64,
    capacity: u64,
    format: u32,
    /// Where its seal is, if it has one.
    sealed: Option<usize>,
}

/// The writing end: the current segment and where its records end.
#[derive(Debug)]
pub(crate) struct Wal {
    dir: PathBuf,
    current: Segment,
    end: u64,
    capacity: u64,
    /// Whether the current segment gets a seal when the next one starts (not one of a format
    /// before seals: such a segment is full as it is).
    sealable: bool,
    stated: Stated,
    prepared: Option<JoinHandle<io::Result<()>>>,
}

/// The segments of `dir`, by sequence number (a prepared file is not one).
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, WalError> {
    let mut segments = Vec::new();
    for item in std::fs::read_dir(dir).map_err(at(dir))? {
        let item = item.map_err(at(dir))?;
        let name = item.file_name();
        if let Some(seq) = name
            .to_str()
            .and_then(|name| name.strip_suffix(".wal"))
            .and_then(|seq| seq.parse::<u64>().ok())
        {
            segments.push((seq, item.path()));
        }
    }
    segments.sort();
    Ok(segments)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.wal"))
}

fn open_rw(path: &Path) -> Result<File, WalError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(at(path))
}

fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

/// The unit the page cache is filled in where records are written.
const PAGE: usize = 4096;

/// Writes `size` zero bytes to a new file at `path` and syncs it.
///
/// A page at a time, on purpose: the kernel caches a file in folios as large as the writes
/// (or reads) that brought it in, and writeback writes a dirty folio whole. Filled with one
/// large write, a segment would be cached in 2 MiB folios, and every sync of a 1 KiB record
/// would write 2 MiB (measured on this machine's 6.18 kernel: 2,097,152 bytes written per
/// sync against 5,489, and 140 µs against 99 µs).
fn zero_filled(path: &Path, size: u64) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let page = [0u8; PAGE];
    let mut left = size;
    while left > 0 {
        let n = left.min(PAGE as u64) as usize;
        file.write_all(&page[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

/// Opens a segment for positioned reads and writes, without readahead: a read must not bring
/// the unwritten part of the segment into the cache in large folios (see [`zero_filled`]).
fn open_segment(path: &Path) -> Result<File, WalError> {
    let file = open_rw(path)?;
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random)
        .map_err(|errno| at(path)(errno.into()))?;
    Ok(file)
}

/// The header and restated vote and purge point segment `seq`, of `size` bytes, starts with.
fn header_bytes(seq: u64, size: u64, stated: &Stated) -> Vec<u8> {
    let mut batch = Batch::default();
    let mut header = FORMAT.to_le_bytes().to_vec();
    header.extend_from_slice(&seq.to_le_bytes());
    header.extend_from_slice(&size.to_le_bytes());
    batch.record(KIND_HEADER, &[&header]);
    if let Some(vote) = &stated.vote {
        batch.record(KIND_VOTE, &[vote]);
    }
    if let Some((upto, log_id)) = &stated.purge {
        batch.record(KIND_PURGE, &[&upto.to_le_bytes(), log_id]);
    }
    batch.body
}

/// Puts segment `seq` of `size` bytes in place with `header` at its start: the zero-filled
/// file (`prepared` — already made by the helper thread — or made now) is given its header and
/// synced as `prepared.tmp`, and only then renamed to its name. So a segment file always has its
/// header and its whole length.
fn make_segment(
    dir: &Path,
    seq: u64,
    size: u64,
    header: &[u8],
    prepared: bool,
) -> Result<(), WalError> {
    let staging = dir.join(PREPARED);
    if !prepared {
        zero_filled(&staging, size).map_err(at(&staging))?;
    }
    let file = open_rw(&staging)?;
    file.write_all_at(header, 0)
        .and_then(|()| file.sync_data())
        .map_err(at(&staging))?;
    drop(file);
    let path = segment_path(dir, seq);
    std::fs::rename(&staging, &path).map_err(at(&path))?;
    sync_dir(dir)
}

/// Whether the segment at `path` holds nothing written after its header records (its header,
/// and the vote and purge point restated with it): the state a roll leaves until its first write.
fn holds_no_write(path: &Path) -> Result<bool, WalError> {
    let buf = std::fs::read(path).map_err(at(path))?;
    let mut offset = 0;
    loop {
        match parse(&buf, offset) {
            Parsed::Record { kind, next, .. }
                if kind == KIND_HEADER || kind == KIND_VOTE || kind == KIND_PURGE =>
            {
                if offset == 0 && kind != KIND_HEADER {
                    return Ok(false);
                }
                offset = next;
            }
            Parsed::End => return Ok(offset > 0 && buf[offset..].iter().all(|&byte| byte == 0)),
            _ => return Ok(false),
        }
    }
}

/// A seal: the log goes on in segment `next`.
fn seal_bytes(next: u64) -> Vec<u8> {
    let mut batch = Batch::default();
    batch.record(KIND_SEAL, &[&next.to_le_bytes()]);
    batch.body
}

/// Whether the bad record at `at`, the first of the newest segment's, belongs to a write that
/// finished (so was synced: damage) rather than one a crash cut short (a torn tail). A write
/// lands in whole sectors over a zero-filled file, so one cut short leaves a sector of zeros, or
/// ends (at its last non-zero byte) before the record it was writing does. A bad record with
/// neither, whose body is there, was written whole. Its length may be what was damaged: then a
/// shorter or longer body that matches its checksum shows it whole.
fn written_whole(buf: &[u8], at: usize) -> bool {
    let Some(last) = buf[at..].iter().rposition(|&byte| byte != 0) else {
        return false;
    };
    let end = at + last + 1;
    let mut sector = at.next_multiple_of(SECTOR);
    while sector + SECTOR <= end {
        if buf[sector..sector + SECTOR].iter().all(|&byte| byte == 0) {
            return false;
        }
        sector += SECTOR;
    }
    let written = end.next_multiple_of(SECTOR).min(buf.len());
    // Nothing after the frame was written: a stray frame, not a record.
    if at + FRAME >= end {
        return false;
    }
    let len = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap_or([0; 4])) as usize;
    if at + FRAME + len <= written {
        return true;
    }
    let crc = u32::from_le_bytes(buf[at + 4..at + FRAME].try_into().unwrap_or([0; 4]));
    let mut hasher = crc32fast::Hasher::new();
    buf[at + FRAME..written].iter().any(|&byte| {
        hasher.update(&[byte]);
        hasher.clone().finalize() == crc
    })
}

/// One record read back from a buffer.
enum Parsed<'a> {
    End,
    Record {
        kind: u8,
        body: &'a [u8],
        next: usize,
    },
    Bad(String),
}

fn parse(buf: &[u8], offset: usize) -> Parsed<'_> {
    if offset + FRAME > buf.len() {
        return Parsed::End;
    }
    let len = u32::from_le_bytes(buf[offset..offset + 4].try_into().unwrap_or([0; 4])) as usize;
    let crc = u32::from_le_bytes(buf[offset + 4..offset + 8].try_into().unwrap_or([0; 4]));
    if len == 0 {
        return if crc == 0 {
            Parsed::End
        } else {
            Parsed::Bad("a record of length 0".into())
        };
    }
    let start = offset + FRAME;
    let Some(body) = buf.get(start..start + len) else {
        return Parsed::Bad(format!(
            "a record of {len} bytes runs past the end of the file"
        ));
    };
    if crc32fast::hash(body) != crc {
        return Parsed::Bad("a record fails its checksum".into());
    }
    Parsed::Record {
        kind: body[0],
        body: &body[1..],
        next: start + len,
    }
}

/// The batch marker a write at `offset` starts with.
fn marker_at(offset: u64) -> [u8; MARKER] {
    let mut marker = [0; MARKER];
    marker[..4].copy_from_slice(&(1 + 8u32).to_le_bytes());
    marker[FRAME] = KIND_BATCH;
    marker[FRAME + 1..].copy_from_slice(&offset.to_le_bytes());
    let crc = crc32fast::hash(&marker[FRAME..]);
    marker[4..FRAME].copy_from_slice(&crc.to_le_bytes());
    marker
}

/// The first whole batch marker after `bad` (a marker that names its own offset), if any.
fn later_marker(buf: &[u8], bad: usize) -> Option<usize> {
    let last = buf.len().checked_sub(MARKER)?;
    (bad + 1..=last).find(|&at| {
        buf[at..at + 4] == [9, 0, 0, 0]
            && buf[at + FRAME] == KIND_BATCH
            && buf[at..at + MARKER] == marker_at(at as u64)
    })
}

fn u64_at(body: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(body.get(..8)?.try_into().ok()?))
}

impl Wal {
    /// Opens the log in `dir` (creating it if needed) and replays it. `existing`: the node has
    /// written a log there before (the caller keeps that fact outside the directory), so a
    /// directory without segments lost them.
    pub(crate) fn open(dir: &Path, existing: bool) -> Result<(Wal, Replayed), WalError> {
        std::fs::create_dir_all(dir).map_err(at(dir))?;
        // A segment being prepared when the node stopped: made again when needed.
        let prepared = dir.join(PREPARED);
        if prepared.exists() {
            std::fs::remove_file(&prepared).map_err(at(&prepared))?;
        }
        let segments = list_segments(dir)?;
        let lost = |what: String| WalError::Damaged {
            path: dir.to_path_buf(),
            offset: None,
            what,
        };
        if segments.is_empty() && existing {
            return Err(lost(
                "it holds no log segment, but this node had written its raft log there (the segments, or the directory, were deleted)".into(),
            ));
        }
        for pair in segments.windows(2) {
            let (before, after) = (pair[0].0, pair[1].0);
            if after != before + 1 {
                return Err(WalError::Missing {
                    path: segment_path(dir, before + 1),
                    what: format!("the log goes on from segment {before} to segment {after}"),
                });
            }
        }
        let mut replayed = Replayed::default();
        let mut stated = Stated::default();
        let count = segments.len();
        // A roll puts the next segment in place and then seals the one before it; a crash in
        // between leaves a newest segment with nothing written after its header and the one
        // before it unsealed (or its seal cut short): the log ends in that one, which is sealed
        // now. Nothing was written to the new segment, so nothing is lost.
        let rolling = match segments.last() {
            Some((_, newest)) if count >= 2 => holds_no_write(newest)?,
            _ => false,
        };
        let mut keep: Vec<Kept> = Vec::with_capacity(count);
        for (position, (seq, path)) in segments.into_iter().enumerate() {
            let is_last = position + 1 == count;
            // The segment the log's records end in: the newest, or the one before an
            // interrupted roll's.
            let ends_here = is_last || (rolling && position + 2 == count);
            let mut buf = std::fs::read(&path).map_err(at(&path))?;
            let damaged = |offset: usize, what: String| WalError::Damaged {
                path: path.clone(),
                offset: Some(offset as u64),
                what,
            };
            let (format, mut offset) = match parse(&buf, 0) {
                Parsed::Record {
                    kind: KIND_HEADER,
                    body,
                    next,
                } => {
                    let format = body
                        .get(..4)
                        .and_then(|b| b.try_into().ok())
                        .map(u32::from_le_bytes)
                        .ok_or_else(|| damaged(0, "a header without a format".into()))?;
                    if format > FORMAT {
                        return Err(WalError::Format {
                            path,
                            found: format,
                            supported: FORMAT,
                        });
                    }
                    if u64_at(&body[4..]) != Some(seq) {
                        return Err(damaged(0, "the header names another segment".into()));
                    }
                    if format >= 3 {
                        let size = body
                            .get(12..)
                            .and_then(u64_at)
                            .ok_or_else(|| damaged(0, "a header without a size".into()))?;
                        if (buf.len() as u64) < size {
                            return Err(damaged(
                                buf.len(),
                                format!(
                                    "the segment was made {size} bytes long and is {} bytes long: it was cut short",
                                    buf.len()
                                ),
                            ));
                        }
                    }
                    (format, next)
                }
                // Made by a build before format 3 (which named a segment before it wrote its
                // header) and never written: nothing is lost with it.
                _ if is_last
                    && keep.last().is_none_or(|kept| kept.format < 3)
                    && buf.iter().all(|&byte| byte == 0) =>
                {
                    std::fs::remove_file(&path).map_err(at(&path))?;
                    continue;
                }
                Parsed::Bad(what) => return Err(damaged(0, format!("the segment header: {what}"))),
                _ => return Err(damaged(0, "no segment header".into())),
            };
            let mut sealed = None;
            loop {
                match parse(&buf, offset) {
                    Parsed::End => {
                        if ends_here && let Some(later) = later_marker(&buf, offset) {
                            return Err(damaged(
                                offset,
                                format!(
                                    "the records end here, but a later write (at byte {later}) is whole, so what lay between was synced"
                                ),
                            ));
                        }
                        break;
                    }
                    Parsed::Bad(what) if !ends_here => return Err(damaged(offset, what)),
                    Parsed::Bad(what) => {
                        if let Some(later) = later_marker(&buf, offset) {
                            return Err(damaged(
                                offset,
                                format!(
                                    "{what}, and a later write (at byte {later}) is whole, so it was synced before"
                                ),
                            ));
                        }
                        if written_whole(&buf, offset) {
                            return Err(damaged(
                                offset,
                                format!(
                                    "{what}, and the write it belongs to was written whole, so it was synced"
                                ),
                            ));
                        }
                        break;
                    }
                    Parsed::Record { kind, body, next } => {
                        let bad = |what: &str| damaged(offset, what.to_owned());
                        if sealed.is_some() {
                            return Err(bad("a record after the segment's seal"));
                        }
                        match kind {
                            KIND_ENTRY => {
                                let index = u64_at(body).ok_or_else(|| bad("a short entry"))?;
                                place(
                                    &mut replayed.locations,
                                    index,
                                    Location {
                                        segment: seq,
                                        offset: offset as u64,
                                        len: (next - offset - FRAME) as u32,
                                    },
                                );
                            }
                            KIND_TRUNCATE => {
                                let from = u64_at(body).ok_or_else(|| bad("a short truncate"))?;
                                replayed.locations.split_off(&from);
                            }
                            KIND_PURGE => {
                                let upto = u64_at(body).ok_or_else(|| bad("a short purge"))?;
                                let log_id: LogId = decode(&body[8..])
                                    .map_err(|e| bad(&format!("a purge point: {e}")))?;
                                replayed.locations = replayed.locations.split_off(&(upto + 1));
                                replayed.purged = Some(log_id);
                                stated.purge = Some((upto, body[8..].to_vec()));
                            }
                            KIND_VOTE => {
                                let vote: Vote =
                                    decode(body).map_err(|e| bad(&format!("a vote: {e}")))?;
                                replayed.vote = Some(vote);
                                stated.vote = Some(body.to_vec());
                            }
                            KIND_BATCH if u64_at(body) == Some(offset as u64) => {}
                            KIND_BATCH => return Err(bad("a batch marker names another place")),
                            KIND_SEAL if u64_at(body) == Some(seq + 1) => sealed = Some(offset),
                            KIND_SEAL => {
                                return Err(bad("a seal names another segment than the next"));
                            }
                            other => return Err(bad(&format!("unknown record kind {other}"))),
                        }
                        offset = next;
                    }
                }
            }
            if ends_here {
                // Whatever follows the end was never acknowledged: zero it, so no later write
                // can end where a stale record begins. Reading the segment cached it in large
                // folios; drop them and write the unwritten part back a page at a time, so
                // appends dirty small ones (see `zero_filled`).
                buf[offset..].fill(0);
                let file = open_rw(&path)?;
                rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
                    .map_err(|errno| at(&path)(errno.into()))?;
                let mut page_start = offset - offset % PAGE;
                while page_start < buf.len() {
                    let page_end = (page_start + PAGE).min(buf.len());
                    file.write_all_at(&buf[page_start..page_end], page_start as u64)
                        .map_err(at(&path))?;
                    page_start = page_end;
                }
                file.sync_data().map_err(at(&path))?;
            }
            // A segment of an older format is not appended to: its capacity ends where its
            // records do, so the next write starts a new segment.
            let capacity = if format < FORMAT {
                offset as u64
            } else {
                buf.len() as u64
            };
            keep.push(Kept {
                seq,
                path,
                end: offset as u64,
                capacity,
                format,
                sealed,
            });
        }
        // An interrupted roll's seal, written now (the segment keeps room for it).
        if rolling
            && keep.len() >= 2
            && let Some(before) = keep.get_mut(count.saturating_sub(2))
            && before.format >= 3
            && before.sealed.is_none()
        {
            let file = open_rw(&before.path)?;
            file.write_all_at(&seal_bytes(before.seq + 1), before.end)
                .and_then(|()| file.sync_data())
                .map_err(at(&before.path))?;
            before.sealed = Some(before.end as usize);
            tracing::info!(
                segment = %before.path.display(),
                "the raft log was rolling to a new segment when the node stopped; sealed it now"
            );
        }
        // Every segment but the newest names the one after it; the newest names none.
        for (position, kept) in keep.iter().enumerate() {
            let is_last = position + 1 == keep.len();
            match (kept.format >= 3, is_last, kept.sealed) {
                (true, false, None) => {
                    return Err(WalError::Damaged {
                        path: kept.path.clone(),
                        offset: Some(kept.end),
                        what: format!(
                            "the segment ends without naming the one after it (segment {}): it was cut short or overwritten",
                            kept.seq + 1
                        ),
                    });
                }
                (true, true, Some(seal)) => {
                    return Err(WalError::Missing {
                        path: segment_path(dir, kept.seq + 1),
                        what: format!(
                            "{} (at byte {seal}) names it as the segment the log goes on in",
                            kept.path.display()
                        ),
                    });
                }
                _ => {}
            }
        }
        if keep.is_empty() && existing {
            return Err(lost(
                "its only segment holds nothing, but this node had written its raft log there"
                    .into(),
            ));
        }
        // Segments are deleted only behind a purge point: without one the log starts in the
        // first segment.
        if replayed.purged.is_none()
            && let Some(first) = keep.first()
            && first.seq != 1
        {
            return Err(WalError::Missing {
                path: segment_path(dir, 1),
                what: format!(
                    "nothing was purged from the log, yet it starts in segment {}",
                    first.seq
                ),
            });
        }
        // The entries run without a gap (from just after the purge point, if there is one).
        let first = replayed
            .purged
            .map(|purged| purged.index + 1)
            .or_else(|| replayed.locations.keys().next().copied())
            .unwrap_or(0);
        for (expected, &index) in (first..).zip(replayed.locations.keys()) {
            if index != expected {
                return Err(lost(format!(
                    "entries {expected} to {} are missing (the log goes on at entry {index})",
                    index - 1
                )));
            }
        }
        for kept in &keep {
            replayed
                .segments
                .insert(kept.seq, Arc::new(open_segment(&kept.path)?));
        }
        let (current, end, capacity, sealable) = match keep.last() {
            Some(kept) => {
                let file = replayed.segments[&kept.seq].clone();
                (
                    Segment {
                        seq: kept.seq,
                        file,
                    },
                    kept.end,
                    kept.capacity,
                    kept.format >= 3,
                )
            }
            None => {
                let seq = 1;
                let header = header_bytes(seq, SEGMENT_BYTES, &stated);
                make_segment(dir, seq, SEGMENT_BYTES, &header, false)?;
                let file = Arc::new(open_segment(&segment_path(dir, seq))?);
                replayed.segments.insert(seq, file.clone());
                (
                    Segment { seq, file },
                    header.len() as u64,
                    SEGMENT_BYTES,
                    true,
                )
            }
        };
        Ok((
            Wal {
                dir: dir.to_path_buf(),
                current,
                end,
                capacity,
                sealable,
                stated,
                prepared: None,
            },
            replayed,
        ))
    }

    fn write_at_end(&mut self, bytes: &[u8]) -> Result<(), WalError> {
        self.write_parts_at_end(&[], bytes)
    }

    /// Writes `first` then `second` at the end of the current segment (one `pwritev`, no copy
    /// of the batch) and syncs them.
    fn write_parts_at_end(&mut self, first: &[u8], second: &[u8]) -> Result<(), WalError> {
        let path = segment_path(&self.dir, self.current.seq);
        let file = &self.current.file;
        let end = self.end;
        let written = (|| {
            let slices = [io::IoSlice::new(first), io::IoSlice::new(second)];
            let mut done = match rustix::io::pwritev(&**file, &slices, end) {
                Ok(done) => done,
                Err(rustix::io::Errno::INTR) => 0,
                Err(errno) => return Err(io::Error::from(errno)),
            };
            // Whatever a short write left, written the plain way.
            let mut offset = end;
            for part in [first, second] {
                let skip = done.min(part.len());
                done -= skip;
                if skip < part.len() {
                    file.write_all_at(&part[skip..], offset + skip as u64)?;
                }
                offset += part.len() as u64;
            }
            file.sync_data()
        })();
        written.map_err(at(&path))?;
        self.end += (first.len() + second.len()) as u64;
        Ok(())
    }

    pub(crate) fn vote(&self, batch: &mut Batch, encoded: &[u8]) {
        batch.record(KIND_VOTE, &[encoded]);
        batch.stated(&self.stated).vote = Some(encoded.to_vec());
    }

    pub(crate) fn purge(&self, batch: &mut Batch, upto: u64, encoded: &[u8]) {
        batch.record(KIND_PURGE, &[&upto.to_le_bytes(), encoded]);
        batch.stated(&self.stated).purge = Some((upto, encoded.to_vec()));
    }

    /// Writes a batch and syncs it; returns where its entries landed, and the segment it was
    /// written to (opened now if the batch started a new one).
    pub(crate) fn write(&mut self, batch: Batch) -> Result<Written, WalError> {
        let need = (MARKER + batch.body.len()) as u64;
        let mut opened = None;
        if self.end + need + SEAL as u64 > self.capacity {
            opened = Some(self.roll(need)?);
        }
        let marker = marker_at(self.end);
        self.write_parts_at_end(&marker, &batch.body)?;
        let start = self.end - batch.body.len() as u64;
        if let Some(stated) = batch.stated {
            self.stated = stated;
        }
        let seq = self.current.seq;
        let locations = batch
            .entries
            .iter()
            .map(|&(index, offset, len)| {
                (
                    index,
                    Location {
                        segment: seq,
                        offset: start + offset as u64,
                        len,
                    },
                )
            })
            .collect();
        if self.prepared.is_none() && self.end > self.capacity / 2 {
            let path = self.dir.join(PREPARED);
            self.prepared = Some(
                std::thread::Builder::new()
                    .name("resd-raft-log-prepare".into())
                    .spawn(move || zero_filled(&path, SEGMENT_BYTES))
                    .map_err(at(&self.dir))?,
            );
        }
        Ok(Written { locations, opened })
    }

    /// Starts the next segment, big enough for `need` bytes (and a seal) after its header: put
    /// in place whole (see [`make_segment`]), then named by a seal at the end of the current
    /// one, before anything is written to it.
    fn roll(&mut self, need: u64) -> Result<Segment, WalError> {
        let seq = self.current.seq + 1;
        let path = segment_path(&self.dir, seq);
        let header_len = header_bytes(seq, 0, &self.stated).len() as u64;
        let size = SEGMENT_BYTES.max(header_len + need + SEAL as u64);
        let header = header_bytes(seq, size, &self.stated);
        let prepared = match self.prepared.take() {
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the segment preparer panicked")))
                .is_ok(),
            None => false,
        };
        make_segment(
            &self.dir,
            seq,
            size,
            &header,
            prepared && size == SEGMENT_BYTES,
        )?;
        if self.sealable {
            self.write_at_end(&seal_bytes(seq))?;
        }
        let file = Arc::new(open_segment(&path)?);
        self.current = Segment {
            seq,
            file: file.clone(),
        };
        self.end = header.len() as u64;
        self.capacity = size;
        self.sealable = true;
        Ok(Segment { seq, file })
    }

    /// Deletes the segments before `first_live` (never the current one), oldest first.
    pub(crate) fn delete_before(&self, first_live: u64) -> Result<Vec<u64>, WalError> {
        let mut deleted = Vec::new();
        for (seq, path) in list_segments(&self.dir)? {
            if seq >= first_live || seq >= self.current.seq {
                break;
            }
            std::fs::remove_file(&path).map_err(at(&path))?;
            deleted.push(seq);
        }
        if !deleted.is_empty() {
            sync_dir(&self.dir)?;
        }
        Ok(deleted)
    }

    pub(crate) fn current_segment(&self) -> u64 {
        self.current.seq
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        if let Some(handle) = self.prepared.take() {
            let _ = handle.join();
        }
    }
}

/// Records where entry `index` is: it replaces the entry at `index` and every later one (an
/// append at an index the log already has follows a truncate there).
pub(crate) fn place(locations: &mut BTreeMap<u64, Location>, index: u64, location: Location) {
    if locations
        .last_key_value()
        .is_some_and(|(last, _)| *last >= index)
    {
        locations.split_off(&index);
    }
    locations.insert(index, location);
}

/// Reads an entry's encoded form back from its segment.
pub(crate) fn read_entry(file: &File, location: Location) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; FRAME + location.len as usize];
    file.read_exact_at(&mut buf, location.offset)?;
    match parse(&buf, 0) {
        Parsed::Record {
            kind: KIND_ENTRY,
            body,
            ..
        } if body.len() >= 8 => Ok(body[8..].to_vec()),
        _ => Err(io::Error::other(format!(
            "the raft log record at byte {} of segment {} is not the entry it should be",
            location.offset, location.segment
        ))),
    }
}

/// The last vote a damaged log set aside in `dir` still holds readable: its segments are read
/// in order, each up to its first bad record (every segment restates the vote after its
/// header). A repaired node starts from it, so it never grants a vote in a term it may already
/// have voted in.
pub(crate) fn salvage_vote(dir: &Path) -> Option<Vote> {
    let mut vote = None;
    for (_, path) in list_segments(dir).ok()? {
        let Ok(buf) = std::fs::read(&path) else {
            continue;
        };
        let mut offset = 0;
        while let Parsed::Record { kind, body, next } = parse(&buf, offset) {
            if kind == KIND_VOTE
                && let Ok(found) = decode::<Vote>(body)
            {
                vote = Some(found);
            }
            offset = next;
        }
    }
    vote
}

/// Bytes the log's segments take on disk.
pub(crate) fn disk_bytes(dir: &Path) -> u64 {
    list_segments(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|(_, path)| std::fs::metadata(path).ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    fn entries(wal: &mut Wal, range: std::ops::Range<u64>, size: usize) -> Vec<(u64, Location)> {
        let mut batch = Batch::default();
        for index in range {
            batch.entry(index, &vec![index as u8; size]);
        }
        wal.write(batch).expect("write").locations
    }

    fn segments(dir: &Path) -> Vec<u64> {
        list_segments(dir)
            .expect("list segments")
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    fn read(replayed: &Replayed, index: u64) -> Vec<u8> {
        let location = replayed.locations[&index];
        read_entry(&replayed.segments[&location.segment], location).expect("read")
    }

    #[test]
    fn what_was_written_is_replayed_truncates_and_purges_included() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (mut wal, replayed) = Wal::open(dir.path(), false).expect("open");
            assert!(replayed.locations.is_empty() && replayed.vote.is_none());
            entries(&mut wal, 1..11, 100);
            let mut batch = Batch::default();
            wal.vote(&mut batch, &crate::wire::raft::encode(&Vote::new(3, 2)));
            batch.truncate(8);
            batch.entry(8, b"replaced");
            wal.purge(&mut batch, 2, &crate::wire::raft::encode(&log_id(1, 2)));
            wal.write(batch).expect("write");
        }
        let (_, replayed) = Wal::open(dir.path(), false).expect("reopen");
        assert_eq!(replayed.vote, Some(Vote::new(3, 2)));
        assert_eq!(replayed.purged, Some(log_id(1, 2)));
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            (3..=8).collect::<Vec<_>>()
        );
        assert_eq!(read(&replayed, 8), b"replaced");
        assert_eq!(read(&replayed, 3), vec![3u8; 100]);
    }

    #[test]
    fn a_torn_last_write_ends_the_log_and_never_comes_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (torn_at, next_at) = {
            let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
            entries(&mut wal, 1..4, 50);
            let written = entries(&mut wal, 4..7, 1500);
            (written[0].1.offset, written[1].1.offset)
        };
        // The crash cut the last write: one sector inside entry 4 never reached the disk (a
        // zero-filled segment keeps zeros there); 5 and 6 landed whole behind it, in the same
        // unsynced write.
        let sector = (torn_at as usize + FRAME + 100).next_multiple_of(SECTOR) as u64;
        let path = segment_path(dir.path(), 1);
        let file = open_rw(&path).expect("open segment");
        file.write_all_at(&[0; SECTOR], sector).expect("tear");
        drop(file);
        {
            let (mut wal, replayed) = Wal::open(dir.path(), true).expect("reopen");
            assert_eq!(
                replayed.locations.keys().copied().collect::<Vec<_>>(),
                vec![1, 2, 3]
            );
            assert_eq!(wal.end, torn_at);
            // A write (marker and record) of the torn record's size, written where it began,
            // ends where 5 began: 5 and 6 were never acknowledged and must not come back behind
            // it.
            let size = (next_at - torn_at) as usize - MARKER - FRAME - 1 - 8;
            let written = entries(&mut wal, 4..5, size);
            assert_eq!(wal.end, next_at, "{written:?}");
        }
        let (_, replayed) = Wal::open(dir.path(), true).expect("reopen again");
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert_eq!(
            read(&replayed, 4),
            vec![4u8; (next_at - torn_at) as usize - MARKER - 17]
        );
    }

    #[test]
    fn a_write_cut_short_ends_the_log_where_it_began() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cut_at, end) = {
            let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
            entries(&mut wal, 1..4, 50);
            let start = wal.end;
            entries(&mut wal, 4..7, 3000);
            (start, wal.end)
        };
        // Only a prefix of the last write landed: the rest of it is still zeros, mid-record.
        let keep = (cut_at as usize + MARKER + 2000).next_multiple_of(SECTOR) as u64;
        let file = open_rw(&segment_path(dir.path(), 1)).expect("open segment");
        file.write_all_at(&vec![0; (end - keep) as usize], keep)
            .expect("cut");
        drop(file);
        let (wal, replayed) = Wal::open(dir.path(), true).expect("reopen");
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        // The write's marker landed; the log goes on after it.
        assert_eq!(wal.end, cut_at + MARKER as u64);
    }

    #[test]
    fn a_damaged_record_with_a_later_write_behind_it_refuses_to_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let damaged_at = {
            let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
            let first = entries(&mut wal, 1..4, 50);
            entries(&mut wal, 4..7, 50);
            first[1].1.offset
        };
        // Entry 2 rots after it was synced: the write of 4 to 6 came after its sync.
        let path = segment_path(dir.path(), 1);
        let file = open_rw(&path).expect("open segment");
        file.write_all_at(&[0xff], damaged_at + FRAME as u64 + 3)
            .expect("damage");
        drop(file);
        let error = Wal::open(dir.path(), false)
            .expect_err("damaged")
            .to_string();
        assert!(
            error.contains(&format!("damaged at byte {damaged_at}"))
                && error.contains("a later write")
                && error.contains("are lost"),
            "{error}"
        );
    }

    /// A segment as format 1 wrote it: a header without a size, entries without markers.
    fn format_one_segment(dir: &Path, seq: u64, range: std::ops::Range<u64>) {
        let mut records = Batch::default();
        let mut header = 1u32.to_le_bytes().to_vec();
        header.extend_from_slice(&seq.to_le_bytes());
        records.record(KIND_HEADER, &[&header]);
        for index in range {
            records.entry(index, &[index as u8; 50]);
        }
        let mut bytes = records.body;
        bytes.resize(SEGMENT_BYTES as usize, 0);
        std::fs::write(segment_path(dir, seq), bytes).expect("write");
    }

    #[test]
    fn a_segment_of_an_earlier_format_is_read_and_never_appended_to() {
        let dir = tempfile::tempdir().expect("temp dir");
        format_one_segment(dir.path(), 1, 0..4);
        {
            let (mut wal, replayed) = Wal::open(dir.path(), true).expect("open");
            assert_eq!(replayed.locations.len(), 4);
            let mut batch = Batch::default();
            batch.entry(4, b"four");
            let written = wal.write(batch).expect("write");
            assert_eq!(written.opened.map(|segment| segment.seq), Some(2));
        }
        let (_, replayed) = Wal::open(dir.path(), true).expect("reopen");
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(read(&replayed, 4), b"four");
        assert_eq!(read(&replayed, 2), vec![2u8; 50]);
        assert_eq!(segments(dir.path()), vec![1, 2]);
    }

    #[test]
    fn damage_before_the_last_segment_refuses_to_open_naming_the_place() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
            for i in 0..4 {
                entries(&mut wal, i * 10 + 1..i * 10 + 11, 10_000);
            }
            assert!(
                wal.current_segment() > 1,
                "the writes crossed into a second segment"
            );
        }
        let path = segment_path(dir.path(), 1);
        let file = open_rw(&path).expect("open segment");
        file.write_all_at(&[0xff, 0xff], 200).expect("damage");
        let error = Wal::open(dir.path(), false).expect_err("damaged");
        let message = error.to_string();
        assert!(
            message.contains("00000000000000000001.wal") && message.contains("damaged at byte"),
            "{message}"
        );
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(Wal::open(dir.path(), false).expect("open"));
        let mut header = Batch::default();
        let mut body = 9u32.to_le_bytes().to_vec();
        body.extend_from_slice(&1u64.to_le_bytes());
        body.extend_from_slice(&SEGMENT_BYTES.to_le_bytes());
        header.record(KIND_HEADER, &[&body]);
        let file = open_rw(&segment_path(dir.path(), 1)).expect("open segment");
        file.write_all_at(&header.body, 0).expect("write");
        let message = Wal::open(dir.path(), false).expect_err("newer").to_string();
        assert!(
            message.contains("format version 9") && message.contains(&format!("up to {FORMAT}")),
            "{message}"
        );
    }

    #[test]
    fn purged_segments_are_deleted_and_the_vote_and_purge_point_survive_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let encoded_vote = crate::wire::raft::encode(&Vote::new(7, 1));
        {
            let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
            let mut batch = Batch::default();
            wal.vote(&mut batch, &encoded_vote);
            wal.write(batch).expect("vote");
            let mut written = Vec::new();
            for i in 0..8 {
                written.extend(entries(&mut wal, i * 10 + 1..i * 10 + 11, 10_000));
            }
            let last = wal.current_segment();
            assert!(last >= 3, "{last}");
            let mut batch = Batch::default();
            wal.purge(&mut batch, 75, &crate::wire::raft::encode(&log_id(2, 75)));
            wal.write(batch).expect("purge");
            let first_live = written
                .iter()
                .find(|(index, _)| *index == 76)
                .map(|(_, l)| l.segment)
                .expect("76 was written");
            let deleted = wal.delete_before(first_live).expect("delete");
            assert!(!deleted.is_empty());
            assert_eq!(segments(dir.path())[0], first_live);
        }
        let (_, replayed) = Wal::open(dir.path(), false).expect("reopen");
        assert_eq!(replayed.vote, Some(Vote::new(7, 1)));
        assert_eq!(replayed.purged, Some(log_id(2, 75)));
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            (76..=80).collect::<Vec<_>>()
        );
        assert_eq!(read(&replayed, 80), vec![80u8; 10_000]);
    }

    #[test]
    fn a_batch_larger_than_a_segment_gets_a_segment_of_its_own() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
            entries(&mut wal, 1..3, SEGMENT_BYTES as usize);
            entries(&mut wal, 3..4, 10);
        }
        let (_, replayed) = Wal::open(dir.path(), false).expect("reopen");
        assert_eq!(replayed.locations.len(), 3);
        assert_eq!(read(&replayed, 2).len(), SEGMENT_BYTES as usize);
        assert_eq!(read(&replayed, 3), vec![3u8; 10]);
    }

    /// A log of three segments, every write synced (so any of it may have been acknowledged):
    /// returns the entries' locations.
    fn synced_log(dir: &Path) -> Vec<(u64, Location)> {
        let (mut wal, _) = Wal::open(dir, false).expect("open");
        let mut batch = Batch::default();
        wal.vote(&mut batch, &crate::wire::raft::encode(&Vote::new(2, 1)));
        wal.write(batch).expect("vote");
        let mut written = Vec::new();
        let mut next = 0;
        while wal.current_segment() < 3 || written.len() < 30 {
            written.extend(entries(&mut wal, next..next + 4, 20_000));
            next += 4;
        }
        written
    }

    fn all_entries(written: &[(u64, Location)]) -> Vec<u64> {
        written.iter().map(|(index, _)| *index).collect()
    }

    /// The places worth a flipped byte in `segment`: its header and restated records, every
    /// record's frame, kind and index and a few bytes of its body, every marker, the seal, and
    /// the whole frame and the last bytes of the last record.
    fn probes(dir: &Path, seq: u64) -> Vec<u64> {
        let buf = std::fs::read(segment_path(dir, seq)).expect("read");
        let mut places = Vec::new();
        let mut offset = 0;
        while let Parsed::Record { next, .. } = parse(&buf, offset) {
            let len = next - offset;
            places.extend((offset..offset + (FRAME + 9).min(len)).map(|p| p as u64));
            for part in [len / 3, len / 2, len - 2, len - 1] {
                places.push((offset + part) as u64);
            }
            offset = next;
        }
        places.sort();
        places.dedup();
        places
    }

    fn flip(path: &Path, at: u64) {
        let file = open_rw(path).expect("open segment");
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at).expect("read");
        file.write_all_at(&[byte[0] ^ 0x5a], at).expect("flip");
    }

    #[test]
    fn a_flipped_byte_anywhere_in_a_synced_log_is_damage_never_a_shorter_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let written = synced_log(dir.path());
        let newest = written.last().map(|(_, l)| l.segment).expect("written");
        for seq in [newest, newest - 1] {
            let path = segment_path(dir.path(), seq);
            for at in probes(dir.path(), seq) {
                flip(&path, at);
                match Wal::open(dir.path(), true) {
                    Err(error) if error.is_damage() => {}
                    other => panic!(
                        "a flipped byte at {at} of segment {seq} was not refused as damage: {other:?}"
                    ),
                }
                flip(&path, at);
            }
        }
        let (_, replayed) = Wal::open(dir.path(), true).expect("whole again");
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            all_entries(&written)
        );
    }

    #[test]
    fn a_flipped_byte_past_the_end_of_the_log_loses_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let written = synced_log(dir.path());
        let end = {
            let (wal, _) = Wal::open(dir.path(), true).expect("open");
            wal.end
        };
        let path = segment_path(dir.path(), written.last().expect("written").1.segment);
        for at in [end + 20, end + 700, end + 5000] {
            flip(&path, at);
            let (_, replayed) = Wal::open(dir.path(), true).expect("a stray byte is not damage");
            assert_eq!(
                replayed.locations.keys().copied().collect::<Vec<_>>(),
                all_entries(&written),
                "a stray byte at {at}"
            );
        }
    }

    /// Opening the log in `dir` is refused as damage naming `naming`.
    fn refused(dir: &Path, naming: &str) -> String {
        match Wal::open(dir, true) {
            Err(error) if error.is_damage() => {
                let message = error.to_string();
                assert!(
                    message.contains(naming) && message.contains("are lost"),
                    "{message}"
                );
                message
            }
            other => panic!("not refused as damage: {other:?}"),
        }
    }

    #[test]
    fn missing_cut_or_zeroed_segments_are_damage_never_a_shorter_log() {
        let name = |seq: u64| format!("{seq:020}.wal");
        // The newest segment deleted: the one before it names it.
        let dir = tempfile::tempdir().expect("temp dir");
        let newest = synced_log(dir.path()).last().expect("written").1.segment;
        std::fs::remove_file(segment_path(dir.path(), newest)).expect("delete");
        refused(dir.path(), &format!("{} is missing", name(newest)));

        // Cut in half, or cut where its records end.
        for keep in [SEGMENT_BYTES / 2, 4096] {
            let dir = tempfile::tempdir().expect("temp dir");
            let newest = synced_log(dir.path()).last().expect("written").1.segment;
            let file = open_rw(&segment_path(dir.path(), newest)).expect("open");
            file.set_len(keep).expect("cut");
            refused(dir.path(), "it was cut short");
        }

        // Its header zeroed: not an unwritten segment, since the one before names it.
        let dir = tempfile::tempdir().expect("temp dir");
        let newest = synced_log(dir.path()).last().expect("written").1.segment;
        let file = open_rw(&segment_path(dir.path(), newest)).expect("open");
        file.write_all_at(&[0; 64], 0).expect("zero");
        refused(dir.path(), &name(newest));

        // A middle segment deleted: a gap in the numbering.
        let dir = tempfile::tempdir().expect("temp dir");
        synced_log(dir.path());
        std::fs::remove_file(segment_path(dir.path(), 2)).expect("delete");
        refused(dir.path(), &format!("{} is missing", name(2)));

        // The oldest deleted, though nothing was purged.
        let dir = tempfile::tempdir().expect("temp dir");
        synced_log(dir.path());
        std::fs::remove_file(segment_path(dir.path(), 1)).expect("delete");
        refused(dir.path(), "nothing was purged");

        // An older segment's seal lost.
        let dir = tempfile::tempdir().expect("temp dir");
        synced_log(dir.path());
        let (end, _) = {
            let buf = std::fs::read(segment_path(dir.path(), 1)).expect("read");
            let mut offset = 0;
            let mut last = 0;
            while let Parsed::Record { next, .. } = parse(&buf, offset) {
                last = offset;
                offset = next;
            }
            (last, offset)
        };
        let file = open_rw(&segment_path(dir.path(), 1)).expect("open");
        file.write_all_at(&[0; SEAL], end as u64)
            .expect("zero the seal");
        refused(dir.path(), "without naming the one after it");

        // A sector of synced records zeroed, a whole write behind it.
        let dir = tempfile::tempdir().expect("temp dir");
        let written = synced_log(dir.path());
        let newest = written.last().expect("written").1.segment;
        let first = written
            .iter()
            .find(|(_, l)| l.segment == newest)
            .expect("an entry in the newest segment")
            .1;
        let file = open_rw(&segment_path(dir.path(), newest)).expect("open");
        file.write_all_at(&[0; SECTOR], first.offset.next_multiple_of(SECTOR as u64))
            .expect("zero");
        refused(dir.path(), "a later write");

        // Every segment gone, or the directory: a node that had a log is told, a new one
        // starts empty.
        let dir = tempfile::tempdir().expect("temp dir");
        synced_log(dir.path());
        for seq in segments(dir.path()) {
            std::fs::remove_file(segment_path(dir.path(), seq)).expect("delete");
        }
        refused(dir.path(), "holds no log segment");
        std::fs::remove_dir_all(dir.path()).expect("delete the directory");
        refused(dir.path(), "holds no log segment");
        let (_, replayed) = Wal::open(dir.path(), false).expect("a new log");
        assert!(replayed.locations.is_empty());
    }

    #[test]
    fn a_roll_cut_short_by_a_crash_is_finished_at_open_and_loses_nothing() {
        for torn_seal in [false, true] {
            let dir = tempfile::tempdir().expect("temp dir");
            let (written, end) = {
                let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
                let mut written = Vec::new();
                let mut next = 0;
                while wal.current_segment() < 2 || written.len() < 20 {
                    written.extend(entries(&mut wal, next..next + 4, 20_000));
                    next += 4;
                }
                (written, wal.end)
            };
            // The crash came after segment 3 was put in place (header synced, renamed), before
            // segment 2's seal landed (or with only part of it written).
            let mut segment = header_bytes(3, SEGMENT_BYTES, &Stated::default());
            segment.resize(SEGMENT_BYTES as usize, 0);
            std::fs::write(segment_path(dir.path(), 3), segment).expect("segment 3");
            if torn_seal {
                let file = open_rw(&segment_path(dir.path(), 2)).expect("open");
                file.write_all_at(&seal_bytes(3)[..6], end)
                    .expect("part of a seal");
            }
            {
                let (mut wal, replayed) = Wal::open(dir.path(), true).expect("a finished roll");
                assert_eq!(
                    replayed.locations.keys().copied().collect::<Vec<_>>(),
                    all_entries(&written),
                    "torn seal: {torn_seal}"
                );
                assert_eq!(wal.current_segment(), 3);
                let mut batch = Batch::default();
                batch.entry(written.len() as u64, b"after the roll");
                wal.write(batch).expect("write");
            }
            let (_, replayed) = Wal::open(dir.path(), true).expect("reopen");
            assert_eq!(replayed.locations.len(), written.len() + 1);
            assert_eq!(read(&replayed, written.len() as u64), b"after the roll");
        }
    }

    mod model {
        //! Random workloads (batches of entries of random sizes across segment rolls, truncates,
        //! purges, reopens) replay exactly what a model of the log holds.

        use proptest::prelude::*;

        use super::*;

        #[derive(Debug, Clone)]
        enum Step {
            Write { count: u64, size: usize },
            Truncate { back: u64 },
            Purge { ahead: u64 },
            Reopen,
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                4 => (1u64..6, 0usize..20_000).prop_map(|(count, size)| Step::Write { count, size }),
                1 => (0u64..6).prop_map(|back| Step::Truncate { back }),
                1 => (0u64..6).prop_map(|ahead| Step::Purge { ahead }),
                1 => Just(Step::Reopen),
            ]
        }

        fn check(replayed: &Replayed, model: &BTreeMap<u64, Vec<u8>>) {
            assert_eq!(
                replayed.locations.keys().copied().collect::<Vec<_>>(),
                model.keys().copied().collect::<Vec<_>>()
            );
            for (index, bytes) in model {
                assert_eq!(&read(replayed, *index), bytes, "entry {index}");
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

            #[test]
            fn a_random_workload_replays_as_written(steps in prop::collection::vec(step(), 1..24)) {
                let dir = tempfile::tempdir().expect("temp dir");
                let (mut wal, _) = Wal::open(dir.path(), false).expect("open");
                let mut model = BTreeMap::new();
                let (mut next, mut purged) = (1u64, 0u64);
                for step in steps {
                    match step {
                        Step::Write { count, size } => {
                            let mut batch = Batch::default();
                            for index in next..next + count {
                                let bytes = vec![(index % 251) as u8; size];
                                batch.entry(index, &bytes);
                                model.insert(index, bytes);
                            }
                            wal.write(batch).expect("write");
                            next += count;
                        }
                        Step::Truncate { back } => {
                            let from = next.saturating_sub(back).max(purged + 1);
                            if from < next {
                                let mut batch = Batch::default();
                                batch.truncate(from);
                                wal.write(batch).expect("truncate");
                                model.retain(|index, _| *index < from);
                                next = from;
                            }
                        }
                        Step::Purge { ahead } => {
                            let upto = (purged + ahead).min(next - 1);
                            if upto > purged {
                                let mut batch = Batch::default();
                                wal.purge(&mut batch, upto, &crate::wire::raft::encode(&log_id(1, upto)));
                                wal.write(batch).expect("purge");
                                model.retain(|index, _| *index > upto);
                                purged = upto;
                            }
                        }
                        Step::Reopen => {
                            drop(wal);
                            let (reopened, replayed) = Wal::open(dir.path(), true).expect("reopen");
                            check(&replayed, &model);
                            wal = reopened;
                        }
                    }
                }
                drop(wal);
                let (_, replayed) = Wal::open(dir.path(), true).expect("reopen at the end");
                check(&replayed, &model);
                prop_assert_eq!(replayed.purged.map(|id| id.index), (purged > 0).then_some(purged));
            }
        }
    }

    #[test]
    fn the_vote_of_a_damaged_log_is_salvaged_from_what_is_still_readable() {
        let dir = tempfile::tempdir().expect("temp dir");
        let written = synced_log(dir.path());
        let newest = written.last().expect("written").1.segment;
        flip(&segment_path(dir.path(), newest), 10);
        assert!(Wal::open(dir.path(), true).is_err(), "damaged");
        assert_eq!(salvage_vote(dir.path()), Some(Vote::new(2, 1)));
        let empty = tempfile::tempdir().expect("temp dir");
        assert_eq!(salvage_vote(empty.path()), None);
    }
}
