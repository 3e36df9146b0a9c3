//! Objects' history in the state machine (DESIGN §18; the rules are `storage::history`'s):
//! kept by apply in the same transaction as the change, compacted there.
//!
//! ```text
//! history          uid 0 -> sealed Summary (count, bytes, dropped)
//!                  uid 0 version (12 bytes) -> sealed [expires_ms: 8][HistoryEntry]
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

/// The stored value of an entry: its expiry, then the entry.
fn encode_value(key: &[u8], expires_ms: i64, entry: &HistoryEntry) -> Vec<u8> {
    let mut value = Vec::with_capacity(EXPIRES_LEN + entry.encoded_len());
    value.extend_from_slice(&order_ms(expires_ms));
    entry
        .encode(&mut value)
        .unwrap_or_else(|_| unreachable!("a Vec grows to hold any message"));
    sealed::seal(key, &value)
}

/// Keeps `entry` (the change at `version` of the object `uid`) as `keep` says, then compacts:
/// the object's history to its retention, the node's to its bytes and what expired (a bounded
/// number per change).
pub(super) fn record(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    uid: &str,
    version: Version,
    entry: &HistoryEntry,
    keep: Keep,
) -> heed::Result<()> {
    if keep.retention.is_off() || !keepable(uid) {
        return sweep(dbs, wtxn, keep.time_ms, keep.node_bytes);
    }
    let key = entry_key(uid, version);
    let expires_ms = keep.expires_ms();
    let value = encode_value(&key, expires_ms, entry);
    let size = value.len() as u64;
    dbs.history.put(wtxn, &key, &value)?;
    dbs.history_expiry
        .put(wtxn, &expiry_key(expires_ms, version, uid), &[])?;
    let mut summary = summary(dbs, wtxn, uid)?;
    summary.count += 1;
    summary.bytes += size;
    let mut total = total(dbs, wtxn)? + size;
    // The object's own retention: its oldest versions go first.
    let prefix = summary_key(uid);
    loop {
        let oldest = {
            let range = (Bound::Excluded(prefix.as_slice()), Bound::Unbounded);
            let mut iter = dbs.history.range(wtxn, &range)?;
            match iter.next().transpose()? {
                Some((found, stored)) if found.starts_with(&prefix) => {
                    let value = sealed::open(found, stored).map_err(damaged)?;
                    let entry = HistoryEntry::decode(value.get(EXPIRES_LEN..).unwrap_or_default())
                        .map_err(damaged)?;
                    Some((
                        found.to_vec(),
                        history::time_ms(&entry),
                        stored.len() as u64,
                        ms_of(&value[..EXPIRES_LEN.min(value.len())]),
                    ))
                }
                _ => None,
            }
        };
        let Some((oldest_key, oldest_time, oldest_size, oldest_expires)) = oldest else {
            break;
        };
        if !history::drop_oldest(summary, keep.retention, keep.time_ms, oldest_time) {
            break;
        }
        dbs.history.delete(wtxn, &oldest_key)?;
        let oldest_version =
            schema::decode_revision(&oldest_key[prefix.len()..]).unwrap_or_default();
        dbs.history_expiry
            .delete(wtxn, &expiry_key(oldest_expires, oldest_version, uid))?;
        summary.count -= 1;
        summary.bytes = summary.bytes.saturating_sub(oldest_size);
        summary.dropped = true;
        total = total.saturating_sub(oldest_size);
    }
    put_summary(dbs, wtxn, uid, summary)?;
    put_meta(dbs, wtxn, META_BYTES, &total.to_be_bytes())?;
    sweep(dbs, wtxn, keep.time_ms, keep.node_bytes)
}

/// Drops what expired by `now_ms`, and the soonest to expire while the node keeps more than
/// `node_bytes`: at most [`history::MAX_EXPIRED_PER_CHANGE`] entries.
fn sweep(dbs: &SmDbs, wtxn: &mut Txn<'_>, now_ms: i64, node_bytes: u64) -> heed::Result<()> {
    let mut total = total(dbs, wtxn)?;
    let before = total;
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
            put_summary(dbs, wtxn, &uid, summary)?;
            total = total.saturating_sub(size);
        }
    }
    if total != before {
        put_meta(dbs, wtxn, META_BYTES, &total.to_be_bytes())?;
    }
    Ok(())
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
        let entry = HistoryEntry::decode(value.get(EXPIRES_LEN..).unwrap_or_default()).map_err(
            |error| StorageError::Internal(format!("a history entry does not decode: {error}")),
        )?;
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

/// Stages a restore's history entries.
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
        dbs.restore_history
            .put(wtxn, &key, &encode_value(&key, *expires_ms, entry))?;
    }
    Ok(())
}

/// Replaces every history with a restore's staged one: the entries, their expiry, each
/// object's summary and the node's total.
pub(super) fn commit_restore(dbs: &SmDbs, wtxn: &mut Txn<'_>) -> heed::Result<()> {
    dbs.history.clear(wtxn)?;
    dbs.history_expiry.clear(wtxn)?;
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
            if key.len() < VERSION_LEN + 1 || value.len() < EXPIRES_LEN {
                continue;
            }
            let uid = String::from_utf8_lossy(&key[..key.len() - VERSION_LEN - 1]).into_owned();
            let version =
                schema::decode_revision(&key[key.len() - VERSION_LEN..]).unwrap_or_default();
            let expires_ms = ms_of(&value[..EXPIRES_LEN]);
            dbs.history.put(wtxn, &key, &stored)?;
            dbs.history_expiry
                .put(wtxn, &expiry_key(expires_ms, version, &uid), &[])?;
            let size = stored.len() as u64;
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
        if value.len() < EXPIRES_LEN {
            continue;
        }
        let entry = HistoryEntry::decode(&value[EXPIRES_LEN..]).map_err(|error| {
            StorageError::Internal(format!("a history entry does not decode: {error}"))
        })?;
        visit(entry, ms_of(&value[..EXPIRES_LEN]))?;
    }
    Ok(())
}
