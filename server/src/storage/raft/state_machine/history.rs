//! Objects' history in the state machine (DESIGN §18; the rules are `storage::history`'s):
//! kept by apply in the same transaction as the change, compacted there.
//!
//! ```text
//! history          uid 0 -> sealed Summary (count, bytes, dropped)
//!                  uid 0 version (12 bytes) -> sealed [expires_ms: 8][time_ms: 8][HistoryEntry]
//! history_expiry   expires_ms (8, sign-flipped) version (12) uid -> () (soonest to expire first)
//! restore_history  a restore's staged entries, keyed as in `history` (no summaries)
//! meta             "history/bytes" -> u64: the bytes every kept entry holds
//! ```

use std::ops::Bound;

use prost::Message;
use proto::resource::v1::HistoryEntry;

use super::super::schema::{self, SmDbs};
use super::super::sealed;
use super::{get_meta, get_sealed, put_meta};
use crate::storage::history::{self, Keep, Page, Summary};
use crate::storage::{StorageError, Version};

type Txn<'t> = heed::RwTxn<'t>;
type RoTxn<'t> = heed::RoTxn<'t, heed::WithoutTls>;

const META_BYTES: &str = "history/bytes";
const VERSION_LEN: usize = 12;
const EXPIRES_LEN: usize = 8;
/// An entry's value starts with its expiry and its time (read without decoding the entry).
const HEADER_LEN: usize = 16;

fn summary_key(uid: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(uid.len() + 1 + VERSION_LEN);
    key.extend_from_slice(uid.as_bytes());
    key.push(schema::SEP);
    key
}

fn entry_key(uid: &str, version: Version) -> Vec<u8> {
    let mut key = summary_key(uid);
    key.extend_from_slice(&schema::encode_revision(version));
    key
}

/// Milliseconds ordered as unsigned bytes (the sign bit flipped).
fn order_ms(ms: i64) -> [u8; EXPIRES_LEN] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

fn ms_of(bytes: &[u8]) -> i64 {
    let raw: [u8; EXPIRES_LEN] = bytes.try_into().unwrap_or_default();
    (u64::from_be_bytes(raw) ^ (1 << 63)) as i64
}

fn expiry_key(expires_ms: i64, version: Version, uid: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(EXPIRES_LEN + VERSION_LEN + uid.len());
    key.extend_from_slice(&order_ms(expires_ms));
    key.extend_from_slice(&schema::encode_revision(version));
    key.extend_from_slice(uid.as_bytes());
    key
}

/// A uid history can be kept under: one that cannot run into the key's separator.
fn keepable(uid: &str) -> bool {
    !uid.is_empty() && !uid.as_bytes().contains(&schema::SEP)
}

fn damaged(why: impl std::fmt::Display) -> heed::Error {
    heed::Error::Io(std::io::Error::other(why.to_string()))
}

fn total(dbs: &SmDbs, txn: &RoTxn<'_>) -> heed::Result<u64> {
    Ok(get_meta(dbs, txn, META_BYTES)?
        .and_then(|bytes| bytes.try_into().ok().map(u64::from_be_bytes))
        .unwrap_or(0))
}

fn summary(dbs: &SmDbs, txn: &RoTxn<'_>, uid: &str) -> heed::Result<Summary> {
    let key = summary_key(uid);
    Ok(get_sealed(dbs.history, txn, &key)?
        .and_then(Summary::decode)
        .unwrap_or_default())
}

fn put_summary(dbs: &SmDbs, wtxn: &mut Txn<'_>, uid: &str, summary: Summary) -> heed::Result<()> {
    let key = summary_key(uid);
    if summary.count == 0 {
        dbs.history.delete(wtxn, &key)?;
        return Ok(());
    }
    dbs.history
        .put(wtxn, &key, &sealed::seal(&key, &summary.encode()))
}

/// The stored value of an entry: its expiry and time, then the entry (encoded by `body`).
fn encode_value(
    key: &[u8],
    expires_ms: i64,
    time_ms: i64,
    capacity: usize,
    body: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let mut value = Vec::with_capacity(HEADER_LEN + capacity + sealed::SEAL_LEN);
    value.extend_from_slice(&order_ms(expires_ms));
    value.extend_from_slice(&time_ms.to_be_bytes());
    body(&mut value);
    sealed::seal_vec(key, value)
}

/// The expiry and time of a stored value's header.
fn header_of(value: &[u8]) -> Option<(i64, i64)> {
    let header = value.get(..HEADER_LEN)?;
    let time: [u8; 8] = header[EXPIRES_LEN..].try_into().ok()?;
    Some((ms_of(&header[..EXPIRES_LEN]), i64::from_be_bytes(time)))
}

/// An object's oldest entry kept: its key, stored size, expiry and time.
type Oldest = (Vec<u8>, u64, i64, i64);

/// The oldest entry kept of the object whose keys start with `prefix`.
fn oldest_of(dbs: &SmDbs, txn: &RoTxn<'_>, prefix: &[u8]) -> heed::Result<Option<Oldest>> {
    let range = (Bound::Excluded(prefix), Bound::Unbounded);
    let mut iter = dbs.history.range(txn, &range)?;
    match iter.next().transpose()? {
        Some((found, stored)) if found.starts_with(prefix) => {
            let value = sealed::open(found, stored).map_err(damaged)?;
            let (expires, time) = header_of(value)
                .ok_or_else(|| damaged("a history entry shorter than its header"))?;
            Ok(Some((found.to_vec(), stored.len() as u64, expires, time)))
        }
        _ => Ok(None),
    }
}

/// Keeps the change at `version` of the object `uid` (`resource` as stored then, or for a
/// deletion as it last was) as `keep` says, then compacts: the object's history to its
/// retention, the node's to its bytes and what expired (a bounded number per change).
#[allow(clippy::too_many_arguments)]
pub(super) fn record(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    uid: &str,
    version: Version,
    resource: &proto::resource::v1::Resource,
    actor: &str,
    operation: proto::resource::v1::history_entry::Operation,
    keep: Keep,
) -> heed::Result<()> {
    let mut total = total(dbs, wtxn)?;
    let before = total;
    if !keep.retention.is_off() && keepable(uid) {
        let key = entry_key(uid, version);
        let expires_ms = keep.expires_ms();
        let value = encode_value(
            &key,
            expires_ms,
            keep.time_ms,
            resource.encoded_len() + actor.len() + 48,
            |buf| {
                history::encode_entry(
                    buf,
                    resource,
                    actor,
                    keep.time_ms,
                    operation,
                    &version.to_string(),
                );
            },
        );
        let size = value.len() as u64;
        dbs.history.put(wtxn, &key, &value)?;
        dbs.history_expiry
            .put(wtxn, &expiry_key(expires_ms, version, uid), &[])?;
        let mut summary = summary(dbs, wtxn, uid)?;
        if summary.count == 0 {
            summary.oldest_ms = keep.time_ms;
        }
        summary.count += 1;
        summary.bytes += size;
        total += size;
        // The object's own retention: its oldest versions go first.
        let prefix = summary_key(uid);
        while history::drop_oldest(summary, keep.retention, keep.time_ms, summary.oldest_ms) {
            let Some((oldest_key, oldest_size, oldest_expires, _)) = oldest_of(dbs, wtxn, &prefix)?
            else {
                break;
            };
            dbs.history.delete(wtxn, &oldest_key)?;
            let oldest_version =
                schema::decode_revision(&oldest_key[prefix.len()..]).unwrap_or_default();
            dbs.history_expiry
                .delete(wtxn, &expiry_key(oldest_expires, oldest_version, uid))?;
            summary.count -= 1;
            summary.bytes = summary.bytes.saturating_sub(oldest_size);
            summary.dropped = true;
            total = total.saturating_sub(oldest_size);
            summary.oldest_ms = oldest_of(dbs, wtxn, &prefix)?.map_or(keep.time_ms, |o| o.3);
        }
        put_summary(dbs, wtxn, uid, summary)?;
    }
    total = sweep(dbs, wtxn, keep.time_ms, keep.node_bytes, total)?;
    if total != before {
        put_meta(dbs, wtxn, META_BYTES, &total.to_be_bytes())?;
    }
    Ok(())
}

/// Drops what expired by `now_ms`, and the soonest to expire while the node keeps more than
/// `node_bytes`: at most [`history::MAX_EXPIRED_PER_CHANGE`] entries. `total`: the node's
/// history bytes; returns them after.
fn sweep(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    now_ms: i64,
    node_bytes: u64,
    mut total: u64,
) -> heed::Result<u64> {
    for _ in 0..history::MAX_EXPIRED_PER_CHANGE {
        let head = match dbs.history_expiry.first(wtxn)? {
            Some((key, _)) => key.to_vec(),
            None => break,
        };
        if head.len() < EXPIRES_LEN + VERSION_LEN {
            dbs.history_expiry.delete(wtxn, &head)?;
            continue;
        }
        let expires_ms = ms_of(&head[..EXPIRES_LEN]);
        if expires_ms > now_ms && total <= node_bytes {
            break;
        }
        let version = schema::decode_revision(&head[EXPIRES_LEN..EXPIRES_LEN + VERSION_LEN])
            .unwrap_or_default();
        let uid = String::from_utf8_lossy(&head[EXPIRES_LEN + VERSION_LEN..]).into_owned();
        dbs.history_expiry.delete(wtxn, &head)?;
        let key = entry_key(&uid, version);
        let size = dbs
            .history
            .get(wtxn, &key)?
            .map(|stored| stored.len() as u64);
        if let Some(size) = size {
            dbs.history.delete(wtxn, &key)?;
            let mut summary = summary(dbs, wtxn, &uid)?;
            summary.count = summary.count.saturating_sub(1);
            summary.bytes = summary.bytes.saturating_sub(size);
            summary.dropped = true;
            if let Some((_, _, _, oldest)) = oldest_of(dbs, wtxn, &summary_key(&uid))? {
                summary.oldest_ms = oldest;
            }
            put_summary(dbs, wtxn, &uid, summary)?;
            total = total.saturating_sub(size);
        }
    }
    Ok(total)
}

/// At most `limit` entries of `uid`'s history older than `before` (none: from the newest).
pub(super) fn page(
    dbs: &SmDbs,
    txn: &RoTxn<'_>,
    uid: &str,
    before: Option<Version>,
    limit: usize,
) -> Result<Page, StorageError> {
    let internal = |error: heed::Error| StorageError::Internal(format!("reading history: {error}"));
    if !keepable(uid) {
        return Ok(Page::default());
    }
    let prefix = summary_key(uid);
    let upper = match before {
        Some(before) => Bound::Excluded(entry_key(uid, before)),
        None => {
            let mut last = prefix.clone();
            last.extend_from_slice(&[0xff; VERSION_LEN]);
            Bound::Included(last)
        }
    };
    let summary = summary(dbs, txn, uid).map_err(internal)?;
    let mut entries = Vec::new();
    let upper: Bound<&[u8]> = match &upper {
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    };
    let range = (Bound::Excluded(prefix.as_slice()), upper);
    for item in dbs.history.rev_range(txn, &range).map_err(internal)? {
        if entries.len() >= limit {
            break;
        }
        let (key, stored) = item.map_err(internal)?;
        let value = sealed::open(key, stored)
            .map_err(|damage| StorageError::Damaged(damage.to_string()))?;
        let entry =
            HistoryEntry::decode(value.get(HEADER_LEN..).unwrap_or_default()).map_err(|error| {
                StorageError::Internal(format!("a history entry does not decode: {error}"))
            })?;
        entries.push(entry);
    }
    let oldest = {
        let range = (Bound::Excluded(prefix.as_slice()), Bound::Unbounded);
        let mut iter = dbs.history.range(txn, &range).map_err(internal)?;
        match iter.next().transpose().map_err(internal)? {
            Some((key, _)) if key.starts_with(&prefix) => {
                schema::decode_revision(&key[prefix.len()..]).map(|v| v.to_string())
            }
            _ => None,
        }
    };
    Ok(Page {
        entries,
        oldest,
        dropped: summary.dropped,
    })
}

/// Stages a restore's history entries (keyed by the snapshot's versions until the commit).
pub(super) fn stage(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    records: &[(HistoryEntry, i64)],
) -> heed::Result<()> {
    for (entry, expires_ms) in records {
        let Some(uid) = entry
            .resource
            .as_ref()
            .and_then(|r| r.id.as_ref())
            .map(|id| id.uid.as_str())
        else {
            continue;
        };
        let Ok(version) = entry.version.parse::<Version>() else {
            continue;
        };
        if !keepable(uid) {
            continue;
        }
        let key = entry_key(uid, version);
        let value = encode_value(
            &key,
            *expires_ms,
            history::time_ms(entry),
            entry.encoded_len(),
            |buf| {
                let _ = entry.encode(buf);
            },
        );
        dbs.restore_history.put(wtxn, &key, &value)?;
    }
    Ok(())
}

/// Replaces every history with a restore's staged one: the entries, their expiry, each
/// object's summary and the node's total. The restored objects are stamped with the commit's
/// version, so their history is numbered again just below it, in its order (`commit.index - 1`,
/// positions counting up): a restore into a cluster whose log is shorter than the snapshot's
/// keeps every restored version older than every version written after it.
pub(super) fn commit_restore(dbs: &SmDbs, wtxn: &mut Txn<'_>, commit: Version) -> heed::Result<()> {
    dbs.history.clear(wtxn)?;
    dbs.history_expiry.clear(wtxn)?;
    let below = commit.index.saturating_sub(1);
    let mut position: u32 = 0;
    let mut total = 0u64;
    let mut after: Option<Vec<u8>> = None;
    let mut current: Option<(String, Summary)> = None;
    loop {
        let mut chunk = Vec::new();
        let range = (
            after.as_deref().map_or(Bound::Unbounded, Bound::Excluded),
            Bound::Unbounded,
        );
        for item in dbs.restore_history.range(wtxn, &range)?.take(512) {
            let (key, stored) = item?;
            chunk.push((key.to_vec(), stored.to_vec()));
        }
        let Some((last, _)) = chunk.last() else {
            break;
        };
        after = Some(last.clone());
        for (key, stored) in chunk {
            let value = sealed::open(&key, &stored).map_err(damaged)?;
            let (Some((expires_ms, time_ms)), true) =
                (header_of(value), key.len() > VERSION_LEN + 1)
            else {
                continue;
            };
            let Ok(mut entry) = HistoryEntry::decode(&value[HEADER_LEN..]) else {
                continue;
            };
            let uid = String::from_utf8_lossy(&key[..key.len() - VERSION_LEN - 1]).into_owned();
            let version = Version::at(below, position);
            position = position.saturating_add(1);
            entry.version = version.to_string();
            if let Some(resource) = entry.resource.as_mut() {
                resource.version = version.to_string();
            }
            let new_key = entry_key(&uid, version);
            let renumbered =
                encode_value(&new_key, expires_ms, time_ms, entry.encoded_len(), |buf| {
                    let _ = entry.encode(buf);
                });
            dbs.history.put(wtxn, &new_key, &renumbered)?;
            dbs.history_expiry
                .put(wtxn, &expiry_key(expires_ms, version, &uid), &[])?;
            let size = renumbered.len() as u64;
            total += size;
            match &mut current {
                Some((at, summary)) if *at == uid => {
                    summary.count += 1;
                    summary.bytes += size;
                }
                _ => {
                    if let Some((done, summary)) = current.take() {
                        put_summary(dbs, wtxn, &done, summary)?;
                    }
                    current = Some((
                        uid,
                        Summary {
                            count: 1,
                            bytes: size,
                            // The snapshot's history may have been compacted: never assumed whole.
                            dropped: true,
                            oldest_ms: time_ms,
                        },
                    ));
                }
            }
        }
    }
    if let Some((done, summary)) = current.take() {
        put_summary(dbs, wtxn, &done, summary)?;
    }
    dbs.restore_history.clear(wtxn)?;
    put_meta(dbs, wtxn, META_BYTES, &total.to_be_bytes())
}

/// Every kept entry with its expiry, in key order (an operator snapshot's history).
pub(super) fn each(
    dbs: &SmDbs,
    txn: &RoTxn<'_>,
    mut visit: impl FnMut(HistoryEntry, i64) -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    let internal = |error: heed::Error| StorageError::Internal(format!("reading history: {error}"));
    for item in dbs.history.iter(txn).map_err(internal)? {
        let (key, stored) = item.map_err(internal)?;
        // A summary's key ends at the separator after the uid (uids hold none).
        if key.iter().position(|b| *b == schema::SEP) == Some(key.len() - 1) {
            continue;
        }
        let value = sealed::open(key, stored)
            .map_err(|damage| StorageError::Damaged(damage.to_string()))?;
        if value.len() < HEADER_LEN {
            continue;
        }
        let entry = HistoryEntry::decode(&value[HEADER_LEN..]).map_err(|error| {
            StorageError::Internal(format!("a history entry does not decode: {error}"))
        })?;
        visit(entry, ms_of(&value[..EXPIRES_LEN]))?;
    }
    Ok(())
}
