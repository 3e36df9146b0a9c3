//! Quotas (DESIGN §17) as storage enforces them: in apply (raft) or under the state lock
//! (in memory), from the state itself, so writes racing on several nodes can never pass a limit
//! together.
//!
//! A `tenancy.v1.Quota` written in a namespace counts that namespace; one written at a partition
//! (no namespace) counts every namespace of it. Its `hard` limits are keyed `bytes` (the stored
//! bytes of every object) and `count/<group.Kind glob>`; its `used` is kept here: recounted from
//! the state when the quota is written (a client's value is ignored), then charged with every
//! change of what it counts, in the same transaction. A change that raises a use past its limit
//! is refused ([`StorageError::QuotaExceeded`]); one that lowers or keeps every use never is, so
//! deletes always pass, and a quota lowered below its use keeps what is stored.
//!
//! Quotas do not count quotas, nor the server's own records (`internal.*`: tombstones), nor
//! anything cluster-scoped.

use proto::resource::v1::Resource;
use proto::tenancy::v1::Quota;

use super::{StorageError, StorageKey};

pub(crate) const GROUP: &str = "tenancy";
pub(crate) const KIND: &str = "Quota";
pub(crate) use crate::resource::{QUOTA_BYTES as BYTES, QUOTA_COUNT as COUNT};

/// A quota's refusal: which quota, which key, its limit and what is in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// `partition/namespace/name` (`partition/name` for a partition's quota).
    pub quota: String,
    pub key: String,
    pub limit: u64,
    pub used: u64,
    /// What the change would have made it.
    pub wanted: u64,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "quota {} is exceeded: {} would be {}, over its limit of {} ({} in use); delete something it counts or raise the quota",
            self.quota, self.key, self.wanted, self.limit, self.used
        )
    }
}

/// Whether `key` is a quota.
pub(crate) fn is_quota(key: &StorageKey) -> bool {
    key.group == GROUP && key.kind == KIND
}

/// Whether quotas count what is stored under `key`.
pub(crate) fn counted(key: &StorageKey) -> bool {
    !key.partition.is_empty() && !is_quota(key) && key.group != "internal"
}

/// The tenancies whose quotas count `key`: its namespace's (when it has one) and its
/// partition's, as `(partition, namespace)`.
pub(crate) fn scopes(key: &StorageKey) -> Vec<(String, String)> {
    if !counted(key) {
        return Vec::new();
    }
    let mut scopes = Vec::with_capacity(2);
    if !key.namespace.is_empty() {
        scopes.push((key.partition.clone(), key.namespace.clone()));
    }
    scopes.push((key.partition.clone(), String::new()));
    scopes
}

/// Whether a quota at `quota` (its tenancy) counts what is stored under `key`.
pub(crate) fn covers(quota: &StorageKey, key: &StorageKey) -> bool {
    counted(key)
        && quota.partition == key.partition
        && (quota.namespace.is_empty() || quota.namespace == key.namespace)
}

/// Whether the limit `hard_key` counts objects stored under `key` (`None`: it counts bytes).
fn counts_objects(hard_key: &str, key: &StorageKey) -> Option<bool> {
    if hard_key == BYTES {
        return None;
    }
    let glob = hard_key.strip_prefix(COUNT)?;
    Some(crate::acl::rules::glob_matches(
        glob,
        &format!("{}.{}", key.group, key.kind),
    ))
}

fn decode(quota: &Resource) -> Result<Quota, StorageError> {
    let data = quota
        .data
        .as_ref()
        .map(|d| d.value.as_slice())
        .unwrap_or_default();
    prost::Message::decode(data)
        .map_err(|error| StorageError::Internal(format!("a stored quota does not decode: {error}")))
}

fn encode(quota: &mut Resource, data: &Quota) {
    quota.data = Some(proto::to_any(data));
}

fn label(key: &StorageKey) -> String {
    if key.namespace.is_empty() {
        format!("{}/{}", key.partition, key.name)
    } else {
        format!("{}/{}/{}", key.partition, key.namespace, key.name)
    }
}

/// What a change of one object does to the uses that count it: `count` objects (+1 created, -1
/// deleted) and `bytes` stored; `forgiven` when it is charged but never refused (a deletion
/// under way, the server's own writes: they must complete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Delta {
    pub count: i64,
    pub bytes: i64,
    pub forgiven: bool,
}

impl Delta {
    /// What writing `after` over `before_bytes` stored bytes (`None`: a create) by `actor`
    /// does: a write marking an object for deletion (or within one under way) and the server's
    /// own writes (its controllers, migrations) are never refused.
    pub(crate) fn of_write(after: &Resource, before_bytes: Option<usize>, actor: &str) -> Delta {
        let count = i64::from(before_bytes.is_none());
        let marked = after
            .metadata
            .contains_key(proto::meta::DELETION_TIMESTAMP_KEY);
        Delta {
            count,
            bytes: prost::Message::encoded_len(after) as i64 - before_bytes.unwrap_or(0) as i64,
            forgiven: (marked && count <= 0) || is_server_actor(actor),
        }
    }

    /// What deleting an object of `bytes` stored bytes does (never refused).
    pub(crate) fn of_delete(bytes: usize) -> Delta {
        Delta {
            count: -1,
            bytes: -(bytes as i64),
            forgiven: true,
        }
    }
}

/// Whether `actor` is the server itself (its steps and controllers), whose writes a quota
/// counts but never refuses.
fn is_server_actor(actor: &str) -> bool {
    actor == crate::acl::SERVER_IDENTITY
        || actor.starts_with(crate::acl::CONTROLLER_IDENTITY_PREFIX)
}

/// Charges `delta`, a change of `key`, to the quota `quota` (stored under `quota_key`): its
/// `used` moved, or a refusal when a use the change raises would pass its limit. `None` when
/// nothing it counts moved.
pub(crate) fn charge(
    quota: &Resource,
    quota_key: &StorageKey,
    key: &StorageKey,
    delta: Delta,
) -> Result<Option<Resource>, StorageError> {
    if !covers(quota_key, key) || (delta.count == 0 && delta.bytes == 0) {
        return Ok(None);
    }
    let mut data = decode(quota)?;
    let mut moved = false;
    for (hard_key, limit) in &data.hard {
        let change = match counts_objects(hard_key, key) {
            None => delta.bytes,
            Some(true) => delta.count,
            Some(false) => continue,
        };
        if change == 0 {
            continue;
        }
        let used = data.used.get(hard_key).copied().unwrap_or(0);
        let wanted = used.saturating_add_signed(change);
        if change > 0 && wanted > *limit && !delta.forgiven {
            return Err(StorageError::QuotaExceeded(QuotaExceeded {
                quota: label(quota_key),
                key: hard_key.clone(),
                limit: *limit,
                used,
                wanted,
            }));
        }
        moved = true;
    }
    if !moved {
        return Ok(None);
    }
    let hard = data.hard.clone();
    for hard_key in hard.keys() {
        let change = match counts_objects(hard_key, key) {
            None => delta.bytes,
            Some(true) => delta.count,
            Some(false) => continue,
        };
        let used = data.used.entry(hard_key.clone()).or_insert(0);
        *used = used.saturating_add_signed(change);
    }
    let mut charged = quota.clone();
    encode(&mut charged, &data);
    Ok(Some(charged))
}

/// When `written` keeps the limits of `stored` (a status write, a description changed), takes
/// the stored `used` and says so: nothing to count again.
pub(crate) fn keep_used(written: &mut Resource, stored: &Resource) -> bool {
    let (Ok(mut new), Ok(old)) = (decode(written), decode(stored)) else {
        return false;
    };
    if new.hard != old.hard {
        return false;
    }
    new.used = old.used;
    encode(written, &new);
    true
}

/// Sets `quota`'s `used` from what its tenancy holds now: `held` yields the key and stored
/// bytes of every object (the caller may pass more; what the quota does not cover is skipped).
/// What the client wrote as `used` is replaced; uses of keys no longer in `hard` are dropped.
pub(crate) fn recount(
    quota: &mut Resource,
    quota_key: &StorageKey,
    held: impl Iterator<Item = (StorageKey, u64)>,
) -> Result<(), StorageError> {
    let mut count = Recount::of(quota, quota_key)?;
    for (key, bytes) in held {
        count.add(&key, bytes);
    }
    count.finish(quota);
    Ok(())
}

/// A quota's `used` counted one object at a time (nothing kept but the sums).
pub(crate) struct Recount {
    quota_key: StorageKey,
    data: Quota,
}

impl Recount {
    pub(crate) fn of(quota: &Resource, quota_key: &StorageKey) -> Result<Recount, StorageError> {
        let mut data = decode(quota)?;
        data.used = data.hard.keys().map(|k| (k.clone(), 0)).collect();
        Ok(Recount {
            quota_key: quota_key.clone(),
            data,
        })
    }

    /// One object stored under `key`, of `bytes` stored bytes (skipped unless covered).
    pub(crate) fn add(&mut self, key: &StorageKey, bytes: u64) {
        if !covers(&self.quota_key, key) {
            return;
        }
        for (hard_key, used) in self.data.used.iter_mut() {
            match counts_objects(hard_key, key) {
                None => *used = used.saturating_add(bytes),
                Some(true) => *used = used.saturating_add(1),
                Some(false) => {}
            }
        }
    }

    pub(crate) fn finish(self, quota: &mut Resource) {
        encode(quota, &self.data);
    }
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

    fn quota(hard: &[(&str, u64)], used: &[(&str, u64)]) -> Resource {
        let mut resource = Resource::default();
        encode(
            &mut resource,
            &Quota {
                hard: hard.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                used: used.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            },
        );
        resource
    }

    #[test]
    fn a_raise_past_a_limit_is_refused_and_a_fall_never_is() {
        let at = key(GROUP, KIND, "default", "jazz", "limits");
        let album = key("demo", "Album", "default", "jazz", "a");
        let full = quota(
            &[("count/demo.*", 2), ("bytes", 1000)],
            &[("count/demo.*", 2), ("bytes", 10)],
        );
        let refused = charge(
            &full,
            &at,
            &album,
            Delta {
                count: 1,
                bytes: 5,
                forgiven: false,
            },
        )
        .expect_err("over");
        assert!(
            matches!(
                &refused,
                StorageError::QuotaExceeded(q) if q.key == "count/demo.*" && q.limit == 2 && q.used == 2 && q.quota == "default/jazz/limits"
            ),
            "{refused:?}"
        );
        // An update that grows no count and stays within bytes passes.
        let grown = charge(
            &full,
            &at,
            &album,
            Delta {
                count: 0,
                bytes: 5,
                forgiven: false,
            },
        )
        .expect("within bytes")
        .expect("charged");
        assert_eq!(decode(&grown).expect("decodes").used["bytes"], 15);
        // A delete passes even over the limit (a quota lowered below its use).
        let over = quota(&[("count/demo.*", 1)], &[("count/demo.*", 5)]);
        let freed = charge(&over, &at, &album, Delta::of_delete(10))
            .expect("a delete")
            .expect("charged");
        assert_eq!(decode(&freed).expect("decodes").used["count/demo.*"], 4);
        // A write marking an object for deletion grows it, and is never refused; nor is the
        // server's own.
        let mut marked = Resource::default();
        marked.metadata.insert(
            proto::meta::DELETION_TIMESTAMP_KEY.into(),
            "2026-11-28T00:00:00Z".into(),
        );
        let full_bytes = quota(&[("bytes", 10)], &[("bytes", 10)]);
        assert!(
            charge(
                &full_bytes,
                &at,
                &album,
                Delta::of_write(&marked, Some(0), "team")
            )
            .is_ok()
        );
        assert!(
            charge(
                &full_bytes,
                &at,
                &album,
                Delta::of_write(&Resource::default(), Some(0), "controller/type-migration")
            )
            .is_ok()
        );
        assert!(
            charge(
                &full_bytes,
                &at,
                &album,
                Delta::of_write(&marked, None, "team")
            )
            .is_err(),
            "a create is never forgiven"
        );
        // Another namespace, another partition, a quota itself: not counted.
        for other in [
            key("demo", "Album", "default", "rock", "a"),
            key("demo", "Album", "other", "jazz", "a"),
            key(GROUP, KIND, "default", "jazz", "more"),
            key("internal", "Tombstone", "default", "jazz", "t"),
        ] {
            assert!(matches!(
                charge(
                    &full,
                    &at,
                    &other,
                    Delta {
                        count: 1,
                        bytes: 5,
                        forgiven: false
                    }
                ),
                Ok(None)
            ));
        }
        // A partition's quota counts every namespace of it.
        let partition = key(GROUP, KIND, "default", "", "all");
        assert!(
            charge(
                &full,
                &partition,
                &album,
                Delta {
                    count: 1,
                    bytes: 0,
                    forgiven: false
                }
            )
            .is_err()
        );
    }

    #[test]
    fn a_recount_replaces_what_the_client_wrote() {
        let at = key(GROUP, KIND, "default", "jazz", "limits");
        let mut written = quota(
            &[("count/demo.Album", 10), ("bytes", 1 << 20)],
            &[("count/demo.Album", 999), ("stale", 3)],
        );
        recount(
            &mut written,
            &at,
            [
                (key("demo", "Album", "default", "jazz", "a"), 100),
                (key("demo", "Album", "default", "jazz", "b"), 50),
                (key("demo", "Artist", "default", "jazz", "c"), 7),
                (key("demo", "Album", "default", "rock", "d"), 1000),
            ]
            .into_iter(),
        )
        .expect("recounted");
        let data = decode(&written).expect("decodes");
        assert_eq!(data.used.len(), 2);
        assert_eq!(data.used["count/demo.Album"], 2);
        assert_eq!(data.used["bytes"], 157);
    }
}
