//! Objects' history (DESIGN §18): every stored version of an object — writes, status writes,
//! deletion marks and the deletion — with its actor and time, kept by the backend as each change
//! is stored and compacted there, by rules every backend applies the same way.
//!
//! What a change is kept with ([`Keep`]: its time and its type's [`Retention`]) is chosen
//! before the change is proposed and carried with it, so every node keeps the same history
//! (apply reads no clock and no configuration). A history is per uid: a deleted object's stays
//! readable by its uid until its retention ends.
//!
//! Retention, per object: at most `versions` versions, none older than `seconds` (measured from
//! the time of the change being stored, so a history shrinks as the cluster writes), and at most
//! `bytes` (the newest version always stays, whatever its size). Per node: at most
//! `node_bytes` in all, the versions expiring soonest dropped first. Expiry is fixed when a
//! version is stored (its time plus the retention it was kept with).

use proto::resource::v1::{HistoryEntry, Resource, history_entry};

use crate::storage::Version;

pub use crate::resource::{
    DEFAULT_HISTORY_BYTES as DEFAULT_BYTES, DEFAULT_HISTORY_SECONDS as DEFAULT_SECONDS,
    DEFAULT_HISTORY_VERSIONS as DEFAULT_VERSIONS, Retention,
};

/// Default bytes of history a node keeps in all (1 GiB).
pub const DEFAULT_NODE_BYTES: u64 = 1 << 30;
/// Most expired versions one change drops (the rest go with the next changes): a change's cost
/// stays bounded however much expired at once.
pub const MAX_EXPIRED_PER_CHANGE: usize = 64;
/// Most entries one page of [`crate::storage::Backend::history`] holds.
pub const MAX_PAGE: usize = 1000;

/// What a change is kept in history with, chosen before it is proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// When the change was made (milliseconds since the Unix epoch, the proposer's clock).
    pub time_ms: i64,
    pub retention: Retention,
    /// Bytes of history a node keeps in all (the proposer's setting).
    pub node_bytes: u64,
}

impl Keep {
    /// The time the version kept expires at.
    pub fn expires_ms(&self) -> i64 {
        if self.retention.seconds == 0 {
            i64::MAX
        } else {
            self.time_ms.saturating_add(
                i64::try_from(self.retention.seconds.saturating_mul(1000)).unwrap_or(i64::MAX),
            )
        }
    }
}

/// Which retention each type has, as the node knows it now (the registry's Types, the agent's
/// flags for built-in types); consulted when a change is made, never when it is applied.
pub trait HistoryPolicy: Send + Sync + 'static {
    fn retention(&self, group: &str, kind: &str) -> Retention;
    /// Bytes of history a node keeps in all.
    fn node_bytes(&self) -> u64 {
        DEFAULT_NODE_BYTES
    }
}

/// The defaults for every type.
#[derive(Debug, Default)]
pub struct Defaults;

impl HistoryPolicy for Defaults {
    fn retention(&self, _group: &str, _kind: &str) -> Retention {
        Retention::default()
    }
}

/// What a change did, for its history entry: a status write keeps the generation (DESIGN §2),
/// any other write makes a new one.
pub fn operation_of(
    before_generation: Option<&str>,
    written: &Resource,
) -> history_entry::Operation {
    match before_generation {
        Some(generation) if generation == written.generation => history_entry::Operation::Status,
        _ => history_entry::Operation::Write,
    }
}

/// [`entry`] encoded straight into `buf` from a borrowed resource (what apply stores: no copy
/// of the resource first), byte for byte as prost encodes the same `HistoryEntry`.
pub fn encode_entry(
    buf: &mut Vec<u8>,
    resource: &Resource,
    actor: &str,
    time_ms: i64,
    operation: history_entry::Operation,
    version: &str,
) {
    crate::wire::proto::history_entry(
        buf,
        resource,
        actor,
        &timestamp(time_ms),
        operation as i32,
        version,
    );
}

/// The entry kept for a change stored at `version`.
pub fn entry(
    resource: Resource,
    actor: &str,
    time_ms: i64,
    operation: history_entry::Operation,
    version: Version,
) -> HistoryEntry {
    HistoryEntry {
        resource: Some(resource),
        actor: actor.to_owned(),
        time: Some(timestamp(time_ms)),
        operation: operation as i32,
        version: version.to_string(),
    }
}

pub fn timestamp(time_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: time_ms.div_euclid(1000),
        nanos: (time_ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

pub fn time_ms(entry: &HistoryEntry) -> i64 {
    entry.time.as_ref().map_or(0, |t| {
        t.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(t.nanos / 1_000_000))
    })
}

/// One page of an object's history, newest first.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Page {
    pub entries: Vec<HistoryEntry>,
    /// The oldest version kept (none: nothing is).
    pub oldest: Option<String>,
    /// Versions older than the oldest kept were dropped (otherwise the oldest kept is the
    /// object's first).
    pub dropped: bool,
}

/// An object's kept versions, summed: what its retention is checked against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub count: u32,
    pub bytes: u64,
    /// Some version was dropped: the oldest kept is not the object's first.
    pub dropped: bool,
    /// When the oldest version kept was made (what its age is checked against).
    pub oldest_ms: i64,
}

impl Summary {
    pub fn encode(&self) -> [u8; 21] {
        let mut out = [0; 21];
        out[..4].copy_from_slice(&self.count.to_be_bytes());
        out[4..12].copy_from_slice(&self.bytes.to_be_bytes());
        out[12] = u8::from(self.dropped);
        out[13..].copy_from_slice(&self.oldest_ms.to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Summary> {
        let bytes: &[u8; 21] = bytes.try_into().ok()?;
        Some(Summary {
            count: u32::from_be_bytes(bytes[..4].try_into().ok()?),
            bytes: u64::from_be_bytes(bytes[4..12].try_into().ok()?),
            dropped: bytes[12] != 0,
            oldest_ms: i64::from_be_bytes(bytes[13..].try_into().ok()?),
        })
    }
}

/// Whether the oldest kept version (`oldest_time_ms`, `oldest_bytes`) goes, once a change made
/// at `now_ms` brought the object's history to `summary`, under `retention`.
pub fn drop_oldest(
    summary: Summary,
    retention: Retention,
    now_ms: i64,
    oldest_time_ms: i64,
) -> bool {
    if summary.count <= 1 {
        // The newest version always stays (until it expires with the node's sweep).
        return false;
    }
    summary.count > retention.versions
        || (retention.bytes > 0 && summary.bytes > retention.bytes)
        || (retention.seconds > 0
            && now_ms.saturating_sub(oldest_time_ms)
                > i64::try_from(retention.seconds.saturating_mul(1000)).unwrap_or(i64::MAX))
}

/// The history a backend without a disk keeps (the in-memory backend): the same rules as the
/// state machine's, over maps.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    objects: std::collections::HashMap<String, Object>,
    /// (expires, version, uid): soonest to expire first.
    expiry: std::collections::BTreeSet<(i64, Version, String)>,
    total: u64,
}

#[derive(Debug, Default)]
struct Object {
    /// Oldest first.
    kept: std::collections::VecDeque<Kept>,
    summary: Summary,
}

#[derive(Debug)]
struct Kept {
    entry: HistoryEntry,
    version: Version,
    expires_ms: i64,
    size: u64,
}

impl Memory {
    /// Keeps `entry`, the change at `version` of the object `uid`, and compacts (as
    /// `state_machine::history::record`).
    pub(crate) fn record(&mut self, uid: &str, version: Version, entry: HistoryEntry, keep: Keep) {
        use prost::Message;
        if !keep.retention.is_off() && !uid.is_empty() {
            // What the state machine stores: the expiry, the entry and its seal.
            let size = (8 + entry.encoded_len() + 4) as u64;
            let expires_ms = keep.expires_ms();
            let object = self.objects.entry(uid.to_owned()).or_default();
            object.kept.push_back(Kept {
                entry,
                version,
                expires_ms,
                size,
            });
            object.summary.count += 1;
            object.summary.bytes += size;
            self.total += size;
            self.expiry.insert((expires_ms, version, uid.to_owned()));
            while let Some(oldest) = object.kept.front() {
                if !drop_oldest(
                    object.summary,
                    keep.retention,
                    keep.time_ms,
                    time_ms(&oldest.entry),
                ) {
                    break;
                }
                let Some(oldest) = object.kept.pop_front() else {
                    break;
                };
                self.expiry
                    .remove(&(oldest.expires_ms, oldest.version, uid.to_owned()));
                object.summary.count -= 1;
                object.summary.bytes = object.summary.bytes.saturating_sub(oldest.size);
                object.summary.dropped = true;
                self.total = self.total.saturating_sub(oldest.size);
            }
        }
        self.sweep(keep.time_ms, keep.node_bytes);
    }

    fn sweep(&mut self, now_ms: i64, node_bytes: u64) {
        for _ in 0..MAX_EXPIRED_PER_CHANGE {
            let Some((expires_ms, version, uid)) = self.expiry.first().cloned() else {
                break;
            };
            if expires_ms > now_ms && self.total <= node_bytes {
                break;
            }
            self.expiry.remove(&(expires_ms, version, uid.clone()));
            let Some(object) = self.objects.get_mut(&uid) else {
                continue;
            };
            if let Some(at) = object.kept.iter().position(|kept| kept.version == version)
                && let Some(gone) = object.kept.remove(at)
            {
                object.summary.count -= 1;
                object.summary.bytes = object.summary.bytes.saturating_sub(gone.size);
                object.summary.dropped = true;
                self.total = self.total.saturating_sub(gone.size);
            }
            if object.kept.is_empty() {
                self.objects.remove(&uid);
            }
        }
    }

    /// At most `limit` entries of `uid`'s history older than `before`, newest first.
    pub(crate) fn page(&self, uid: &str, before: Option<Version>, limit: usize) -> Page {
        let Some(object) = self.objects.get(uid) else {
            return Page::default();
        };
        Page {
            entries: object
                .kept
                .iter()
                .rev()
                .filter(|kept| before.is_none_or(|before| kept.version < before))
                .take(limit)
                .map(|kept| kept.entry.clone())
                .collect(),
            oldest: object.kept.front().map(|kept| kept.version.to_string()),
            dropped: object.summary.dropped,
        }
    }
}

/// Now, in milliseconds since the Unix epoch: the time a change is kept with, read where it is
/// made.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// What a change of `group`/`kind` made now is kept with, under `policy`.
pub fn keep_for(policy: &dyn HistoryPolicy, group: &str, kind: &str) -> Keep {
    Keep {
        time_ms: now_ms(),
        retention: policy.retention(group, kind),
        node_bytes: policy.node_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_encoded_in_place_is_the_entry_prost_encodes() {
        use prost::Message;
        let mut resource = Resource {
            version: "12".into(),
            generation: "01J0000000000000000000000G".into(),
            ..Default::default()
        };
        resource.metadata.insert("team".into(), "jazz".into());
        for (actor, operation) in [
            ("alice", history_entry::Operation::Write),
            ("", history_entry::Operation::Status),
            ("controller/reaper", history_entry::Operation::Delete),
        ] {
            let mut buf = Vec::new();
            encode_entry(&mut buf, &resource, actor, -1_234, operation, "12.3");
            let built = entry(
                resource.clone(),
                actor,
                -1_234,
                operation,
                Version::at(12, 3),
            );
            assert_eq!(buf, built.encode_to_vec());
            assert_eq!(time_ms(&built), -1_234);
        }
    }

    #[test]
    fn expiry_never_overflows() {
        let keep = Keep {
            time_ms: i64::MAX - 5,
            retention: Retention {
                versions: 1,
                seconds: u64::MAX,
                bytes: 0,
            },
            node_bytes: 0,
        };
        assert_eq!(keep.expires_ms(), i64::MAX);
        let entry = HistoryEntry {
            time: Some(prost_types::Timestamp {
                seconds: i64::MAX / 1000,
                nanos: 999_999_999,
            }),
            ..Default::default()
        };
        assert!(time_ms(&entry) > 0);
    }
}
