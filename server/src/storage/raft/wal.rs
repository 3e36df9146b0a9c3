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
//! raft/wal/<seq, 20 digits>.wal   segments, replayed in order
//! raft/wal/prepared.tmp           the next segment, zero-filled, not in use yet
//!
//! record = len u32 LE | crc32 of body u32 LE | body          (len 0: no more records)
//! body   = 1 | format u32 | seq u64                          header, first in every segment
//!        | 2 | index u64 | encoded Entry                     an entry (drops any at >= index)
//!        | 3 | from u64                                      truncate: drop entries >= from
//!        | 4 | upto u64 | encoded LogId                      purge: drop entries <= upto
//!        | 5 | encoded Vote                                  the vote
//!        | 6 | offset u64                                    batch: first record of every
//!                                                              write after the header, at offset
//! ```
//!
//! A new segment starts with its header, then the vote and the purge point as they stand, so
//! segments older than the first live entry can be deleted without losing either. At open, the
//! first record of the last segment that is cut short or fails its checksum ends the log (a
//! write that was never synced, so never acknowledged); what follows it is zeroed so a later
//! write can never run into a stale record. Unless a whole batch marker lies beyond it: every
//! write starts with one, and a write begins only after the one before it was synced, so a bad
//! record with a later write behind it was synced and has been damaged since. That, and a bad
//! record in any segment but the last, is damage: the log refuses to open, naming the file and
//! offset. (Segments of format 1 carry no markers; one is never appended to again — the next
//! write starts a new segment.)

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::types::{LogId, Vote, decode};

/// Size of a segment (a larger batch gets a segment of its own size). Tests use small segments,
/// so that every raft test also crosses segment boundaries and deletes purged segments.
#[cfg(not(test))]
pub const SEGMENT_BYTES: u64 = 16 << 20;
#[cfg(test)]
pub const SEGMENT_BYTES: u64 = 256 << 10;
/// The format this build writes into segment headers, and the newest it reads.
pub const WAL_FORMAT: u32 = 2;
const PREPARED: &str = "prepared.tmp";
const FRAME: usize = 8;

const KIND_HEADER: u8 = 1;
const KIND_ENTRY: u8 = 2;
const KIND_TRUNCATE: u8 = 3;
const KIND_PURGE: u8 = 4;
const KIND_VOTE: u8 = 5;
const KIND_BATCH: u8 = 6;
/// A batch marker: frame, kind, offset.
const MARKER: usize = FRAME + 1 + 8;

/// Why the log cannot be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "{path} is damaged at byte {offset}: {what}; it is not the end of the log, so this is not an interrupted write: remove the node from the cluster (`resctl cluster remove N` on a healthy member), move its data directory aside and join it again with an empty one"
    )]
    Damaged {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    #[error("cannot encode a raft log record: {0}")]
    Encode(String),
    #[error(
        "{path} holds raft log format version {found}, but this build of resd reads versions up to {supported}: run a newer resd on it (downgrades are not supported)"
    )]
    Format {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
}

fn at(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where an entry's record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub segment: u64,
    /// Offset of the record's frame in the segment.
    pub offset: u64,
    /// Length of the record's body.
    pub len: u32,
}

/// A segment file, shared between the writer and readers (reads and writes are positioned).
#[derive(Debug)]
pub struct Segment {
    pub seq: u64,
    pub file: Arc<File>,
}

/// What a write did: where its entries landed, and the segment it opened (if it started one).
#[derive(Debug)]
pub struct Written {
    pub locations: Vec<(u64, Location)>,
    pub opened: Option<Segment>,
}

/// What replaying the segments found.
#[derive(Debug, Default)]
pub struct Replayed {
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
pub struct Batch {
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

    pub fn entry(&mut self, index: u64, encoded: &[u8]) {
        let offset = self.record(KIND_ENTRY, &[&index.to_le_bytes(), encoded]);
        let len = (self.body.len() - offset - FRAME) as u32;
        self.entries.push((index, offset, len));
    }

    pub fn truncate(&mut self, from: u64) {
        self.record(KIND_TRUNCATE, &[&from.to_le_bytes()]);
    }

    fn stated(&mut self, base: &Stated) -> &mut Stated {
        self.stated.get_or_insert_with(|| base.clone())
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// The writing end: the current segment and where its records end.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    current: Segment,
    end: u64,
    capacity: u64,
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
    /// Opens the log in `dir` (creating it if needed) and replays it.
    pub fn open(dir: &Path) -> Result<(Wal, Replayed), WalError> {
        std::fs::create_dir_all(dir).map_err(at(dir))?;
        // A segment being prepared when the node stopped: made again when needed.
        let prepared = dir.join(PREPARED);
        if prepared.exists() {
            std::fs::remove_file(&prepared).map_err(at(&prepared))?;
        }
        let mut segments = list_segments(dir)?;
        let mut replayed = Replayed::default();
        let mut stated = Stated::default();
        let count = segments.len();
        // A last segment without a valid header was made but never written: drop it.
        let mut keep = Vec::with_capacity(count);
        for (position, (seq, path)) in segments.drain(..).enumerate() {
            let is_last = position + 1 == count;
            let mut buf = std::fs::read(&path).map_err(at(&path))?;
            let damaged = |offset: usize, what: String| WalError::Damaged {
                path: path.clone(),
                offset: offset as u64,
                what,
            };
            let segment_format;
            let mut offset = match parse(&buf, 0) {
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
                    if format > WAL_FORMAT {
                        return Err(WalError::Format {
                            path,
                            found: format,
                            supported: WAL_FORMAT,
                        });
                    }
                    if u64_at(&body[4..]) != Some(seq) {
                        return Err(damaged(0, "the header names another segment".into()));
                    }
                    segment_format = format;
                    next
                }
                _ if is_last => {
                    std::fs::remove_file(&path).map_err(at(&path))?;
                    continue;
                }
                Parsed::Bad(what) => return Err(damaged(0, what)),
                _ => return Err(damaged(0, "no segment header".into())),
            };
            loop {
                match parse(&buf, offset) {
                    Parsed::End => break,
                    Parsed::Bad(what) if !is_last => return Err(damaged(offset, what)),
                    Parsed::Bad(what) => match later_marker(&buf, offset) {
                        Some(later) => {
                            return Err(damaged(
                                offset,
                                format!(
                                    "{what}, and a later write (at byte {later}) is whole, so it was synced before"
                                ),
                            ));
                        }
                        None => break,
                    },
                    Parsed::Record { kind, body, next } => {
                        let bad = |what: &str| damaged(offset, what.to_owned());
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
                            other => return Err(bad(&format!("unknown record kind {other}"))),
                        }
                        offset = next;
                    }
                }
            }
            if is_last {
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
            let capacity = if segment_format < WAL_FORMAT {
                offset as u64
            } else {
                buf.len() as u64
            };
            keep.push((seq, path, offset as u64, capacity));
        }
        for (seq, path, _, _) in &keep {
            replayed
                .segments
                .insert(*seq, Arc::new(open_segment(path)?));
        }
        let (current, end, capacity) = match keep.last() {
            Some((seq, _, end, capacity)) => {
                let file = replayed.segments[seq].clone();
                (Segment { seq: *seq, file }, *end, *capacity)
            }
            None => {
                let seq = 1;
                let path = segment_path(dir, seq);
                zero_filled(&path, SEGMENT_BYTES).map_err(at(&path))?;
                sync_dir(dir)?;
                let file = Arc::new(open_segment(&path)?);
                replayed.segments.insert(seq, file.clone());
                (Segment { seq, file }, 0, SEGMENT_BYTES)
            }
        };
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            current,
            end,
            capacity,
            stated,
            prepared: None,
        };
        if keep.is_empty() {
            let header = wal.header(wal.current.seq);
            wal.write_at_end(&header)?;
        }
        Ok((wal, replayed))
    }

    /// The header and restated vote and purge point segment `seq` starts with.
    fn header(&self, seq: u64) -> Vec<u8> {
        let mut batch = Batch::default();
        let mut header = WAL_FORMAT.to_le_bytes().to_vec();
        header.extend_from_slice(&seq.to_le_bytes());
        batch.record(KIND_HEADER, &[&header]);
        if let Some(vote) = &self.stated.vote {
            batch.record(KIND_VOTE, &[vote]);
        }
        if let Some((upto, log_id)) = &self.stated.purge {
            batch.record(KIND_PURGE, &[&upto.to_le_bytes(), log_id]);
        }
        batch.body
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

    pub fn vote(&self, batch: &mut Batch, encoded: &[u8]) {
        batch.record(KIND_VOTE, &[encoded]);
        batch.stated(&self.stated).vote = Some(encoded.to_vec());
    }

    pub fn purge(&self, batch: &mut Batch, upto: u64, encoded: &[u8]) {
        batch.record(KIND_PURGE, &[&upto.to_le_bytes(), encoded]);
        batch.stated(&self.stated).purge = Some((upto, encoded.to_vec()));
    }

    /// Writes a batch and syncs it; returns where its entries landed, and the segment it was
    /// written to (opened now if the batch started a new one).
    pub fn write(&mut self, batch: Batch) -> Result<Written, WalError> {
        let need = (MARKER + batch.body.len()) as u64;
        let mut opened = None;
        if self.end + need > self.capacity {
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

    /// Starts the next segment, big enough for `need` bytes after its header.
    fn roll(&mut self, need: u64) -> Result<Segment, WalError> {
        let seq = self.current.seq + 1;
        let path = segment_path(&self.dir, seq);
        let prepared_path = self.dir.join(PREPARED);
        let header = self.header(seq);
        let size = SEGMENT_BYTES.max(header.len() as u64 + need);
        let prepared = match self.prepared.take() {
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the segment preparer panicked")))
                .is_ok(),
            None => false,
        };
        if prepared && size == SEGMENT_BYTES {
            std::fs::rename(&prepared_path, &path).map_err(at(&path))?;
        } else {
            zero_filled(&path, size).map_err(at(&path))?;
        }
        sync_dir(&self.dir)?;
        let file = Arc::new(open_segment(&path)?);
        self.current = Segment {
            seq,
            file: file.clone(),
        };
        self.end = 0;
        self.capacity = size;
        self.write_at_end(&header)?;
        Ok(Segment { seq, file })
    }

    /// Deletes the segments before `first_live` (never the current one), oldest first.
    pub fn delete_before(&self, first_live: u64) -> Result<Vec<u64>, WalError> {
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

    pub fn current_segment(&self) -> u64 {
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
pub fn place(locations: &mut BTreeMap<u64, Location>, index: u64, location: Location) {
    if locations
        .last_key_value()
        .is_some_and(|(last, _)| *last >= index)
    {
        locations.split_off(&index);
    }
    locations.insert(index, location);
}

/// Reads an entry's encoded form back from its segment.
pub fn read_entry(file: &File, location: Location) -> io::Result<Vec<u8>> {
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

/// Bytes the log's segments take on disk.
pub fn disk_bytes(dir: &Path) -> u64 {
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
            let (mut wal, replayed) = Wal::open(dir.path()).expect("open");
            assert!(replayed.locations.is_empty() && replayed.vote.is_none());
            entries(&mut wal, 1..11, 100);
            let mut batch = Batch::default();
            wal.vote(
                &mut batch,
                &crate::storage::raft::types::encode(&Vote::new(3, 2)).expect("encode"),
            );
            batch.truncate(8);
            batch.entry(8, b"replaced");
            wal.purge(
                &mut batch,
                2,
                &crate::storage::raft::types::encode(&log_id(1, 2)).expect("encode"),
            );
            wal.write(batch).expect("write");
        }
        let (_, replayed) = Wal::open(dir.path()).expect("reopen");
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
    fn a_torn_last_record_ends_the_log_and_never_comes_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (torn_at, next_at) = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            entries(&mut wal, 1..4, 50);
            let written = entries(&mut wal, 4..7, 50);
            (written[0].1.offset, written[1].1.offset)
        };
        // Damage entry 4 (the first record of the last write); 5 and 6 stay intact behind it,
        // in the same write, so they were never synced apart from it.
        let path = segment_path(dir.path(), 1);
        let file = open_rw(&path).expect("open segment");
        file.write_all_at(&[0xff], torn_at + FRAME as u64 + 3)
            .expect("damage");
        drop(file);
        {
            let (mut wal, replayed) = Wal::open(dir.path()).expect("reopen");
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
        let (_, replayed) = Wal::open(dir.path()).expect("reopen again");
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
    fn a_damaged_record_with_a_later_write_behind_it_refuses_to_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let damaged_at = {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
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
        let error = Wal::open(dir.path()).expect_err("damaged").to_string();
        assert!(
            error.contains(&format!("damaged at byte {damaged_at}"))
                && error.contains("a later write")
                && error.contains("join it again"),
            "{error}"
        );
    }

    #[test]
    fn a_segment_of_the_previous_format_is_read_and_never_appended_to() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            entries(&mut wal, 1..4, 50);
        }
        // The same segment as format 1 wrote it (its markers are ignored by the reader).
        let mut header = Batch::default();
        let mut body = 1u32.to_le_bytes().to_vec();
        body.extend_from_slice(&1u64.to_le_bytes());
        header.record(KIND_HEADER, &[&body]);
        let file = open_rw(&segment_path(dir.path(), 1)).expect("open segment");
        file.write_all_at(&header.body, 0).expect("write");
        drop(file);
        {
            let (mut wal, replayed) = Wal::open(dir.path()).expect("reopen");
            assert_eq!(replayed.locations.len(), 3);
            let mut batch = Batch::default();
            batch.entry(4, b"four");
            let written = wal.write(batch).expect("write");
            assert_eq!(written.opened.map(|segment| segment.seq), Some(2));
        }
        let (_, replayed) = Wal::open(dir.path()).expect("reopen again");
        assert_eq!(
            replayed.locations.keys().copied().collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert_eq!(read(&replayed, 4), b"four");
        assert_eq!(segments(dir.path()), vec![1, 2]);
    }

    #[test]
    fn damage_before_the_last_segment_refuses_to_open_naming_the_place() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
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
        let error = Wal::open(dir.path()).expect_err("damaged");
        let message = error.to_string();
        assert!(
            message.contains("00000000000000000001.wal") && message.contains("damaged at byte"),
            "{message}"
        );
    }

    #[test]
    fn a_newer_format_is_refused_naming_both_versions() {
        let dir = tempfile::tempdir().expect("temp dir");
        drop(Wal::open(dir.path()).expect("open"));
        let mut header = Batch::default();
        let mut body = 9u32.to_le_bytes().to_vec();
        body.extend_from_slice(&1u64.to_le_bytes());
        header.record(KIND_HEADER, &[&body]);
        let file = open_rw(&segment_path(dir.path(), 1)).expect("open segment");
        file.write_all_at(&header.body, 0).expect("write");
        let message = Wal::open(dir.path()).expect_err("newer").to_string();
        assert!(
            message.contains("format version 9")
                && message.contains(&format!("up to {WAL_FORMAT}")),
            "{message}"
        );
    }

    #[test]
    fn purged_segments_are_deleted_and_the_vote_and_purge_point_survive_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let encoded_vote = crate::storage::raft::types::encode(&Vote::new(7, 1)).expect("encode");
        {
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
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
            wal.purge(
                &mut batch,
                75,
                &crate::storage::raft::types::encode(&log_id(2, 75)).expect("encode"),
            );
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
        let (_, replayed) = Wal::open(dir.path()).expect("reopen");
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
            let (mut wal, _) = Wal::open(dir.path()).expect("open");
            entries(&mut wal, 1..3, SEGMENT_BYTES as usize);
            entries(&mut wal, 3..4, 10);
        }
        let (_, replayed) = Wal::open(dir.path()).expect("reopen");
        assert_eq!(replayed.locations.len(), 3);
        assert_eq!(read(&replayed, 2).len(), SEGMENT_BYTES as usize);
        assert_eq!(read(&replayed, 3), vec![3u8; 10]);
    }
}
