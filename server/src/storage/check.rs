//! The rules every backend applies to a change, written once: what can be stored at all
//! ([`check_storable`], also run on every path into the raft log and on restored and installed
//! snapshots) and the compare-and-swap checks ([`check_write`] with [`merge_still_holds`], [`check_delete`]).
//!
//! These are storage rules, not API rules: they know names, keys and sizes, not registered types
//! or hooks. The resource service checks much more before it writes; these make sure that
//! whatever still arrives (from a peer, a snapshot file, a bug) is refused with a clear error
//! instead of failing inside the store.

use proto::meta::{DELETION_TIMESTAMP_KEY, FINALIZERS_KEY};
use proto::resource::v1::{Id, Resource};

use super::{StorageError, StorageKey, WriteCondition};
use crate::resource;

/// The longest key any backend must store: LMDB's default maximum key size.
pub(crate) const MAX_KEY_BYTES: usize = 511;

/// Longest stored name: tombstones carry the name and uid of what they replace.
pub(crate) const MAX_STORED_NAME_LEN: usize = 10 + resource::MAX_NAME_LEN + 1 + 26;

/// Longest group or kind a stored type may have.
pub(crate) const MAX_TYPE_PART_LEN: usize = 63;

/// Bytes of a resource key: `group 0 kind 0 partition 0 namespace 0 name`.
pub(crate) fn resource_key_len(key: &StorageKey) -> usize {
    key.group.len()
        + key.kind.len()
        + key.partition.len()
        + key.namespace.len()
        + key.name.len()
        + 4
}

/// Bytes of an owner index key: `owner uid 0` and the child's resource key.
pub(crate) fn owner_key_len(owner_uid: &str, child: &StorageKey) -> usize {
    owner_uid.len() + 1 + resource_key_len(child)
}

fn rejected(id: Option<&Id>, why: impl std::fmt::Display) -> StorageError {
    match id {
        Some(id) => StorageError::Rejected(format!(
            "{} cannot be stored: {why}",
            resource::DisplayId(id)
        )),
        None => StorageError::Rejected(format!("the resource cannot be stored: {why}")),
    }
}

fn check_tenancy_part(part: &str, value: &str, problems: &mut Vec<String>) {
    if !value.is_empty()
        && let Err(why) = resource::check_name(value, resource::MAX_NAME_LEN)
    {
        problems.push(format!("{part} {why}"));
    }
}

/// Checks an id's type, name and tenancy as storage needs them: parts that form the key are
/// valid names (no separators, no wildcards) and the key fits every backend.
pub(crate) fn check_id(id: &Id, problems: &mut Vec<String>) {
    match &id.r#type {
        None => problems.push("id.type is required".into()),
        Some(resource_type) => {
            for violation in resource::type_violations(resource_type) {
                problems.push(format!("id.type.{violation}"));
            }
            for (part, value) in [
                ("group", &resource_type.group),
                ("kind", &resource_type.kind),
            ] {
                if value.len() > MAX_TYPE_PART_LEN {
                    problems.push(format!(
                        "id.type.{part} is {} characters long, the limit is {MAX_TYPE_PART_LEN}",
                        value.len()
                    ));
                }
            }
        }
    }
    if let Err(why) = resource::check_name(&id.name, MAX_STORED_NAME_LEN) {
        problems.push(format!("id.name {why}"));
    }
    let tenancy = id.tenancy.clone().unwrap_or_default();
    check_tenancy_part("id.tenancy.partition", &tenancy.partition, problems);
    check_tenancy_part("id.tenancy.namespace", &tenancy.namespace, problems);
    let key_len = resource_key_len(&StorageKey::of(id));
    if key_len > MAX_KEY_BYTES {
        problems.push(format!(
            "its storage key is {key_len} bytes, the limit is {MAX_KEY_BYTES}"
        ));
    }
}

fn check_uid(field: &str, uid: &str, problems: &mut Vec<String>) {
    if ulid::Ulid::from_string(uid).is_err() {
        problems.push(format!("{field} {uid:?} is not a ULID"));
    }
}

/// Whether `resource` can be stored by every backend: a complete id (type, valid names, a ULID
/// uid), an owner that is a valid id with a ULID uid if it has one, keys within
/// [`MAX_KEY_BYTES`], and at most `max_resource_bytes` encoded. Reports every problem at once.
pub(crate) fn check_storable(
    resource: &Resource,
    max_resource_bytes: usize,
) -> Result<(), StorageError> {
    let Some(id) = resource.id.as_ref() else {
        return Err(rejected(None, "it has no id"));
    };
    let mut problems = Vec::new();
    check_id(id, &mut problems);
    check_uid("id.uid", &id.uid, &mut problems);
    if let Some(owner) = &resource.owner {
        let mut owner_problems = Vec::new();
        check_id(owner, &mut owner_problems);
        if !owner.uid.is_empty() {
            check_uid("uid", &owner.uid, &mut owner_problems);
            let key_len = owner_key_len(&owner.uid, &StorageKey::of(id));
            if key_len > MAX_KEY_BYTES {
                owner_problems.push(format!(
                    "the owner index key is {key_len} bytes, the limit is {MAX_KEY_BYTES}"
                ));
            }
        }
        problems.extend(
            owner_problems.into_iter().map(|problem| {
                format!("owner.{}", problem.strip_prefix("id.").unwrap_or(&problem))
            }),
        );
    }
    let size = prost::Message::encoded_len(resource);
    if size > max_resource_bytes {
        problems.push(format!(
            "it is {size} bytes encoded, the limit is {max_resource_bytes}"
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(rejected(Some(id), problems.join("; ")))
    }
}

/// Whether an id can name a stored resource at all (for deletes and reads that come from
/// outside): a key that is too long or malformed names nothing.
pub(crate) fn check_key(id: &Id) -> Result<(), StorageError> {
    let mut problems = Vec::new();
    check_id(id, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(rejected(Some(id), problems.join("; ")))
    }
}

/// The uid of a stored resource.
fn uid_of(resource: &Resource) -> &str {
    resource
        .id
        .as_ref()
        .map(|id| id.uid.as_str())
        .unwrap_or_default()
}

/// The compare-and-swap check of a write: `incoming.version` must be the stored version (empty:
/// nothing may be stored), and the uid is compared first. A [`WriteCondition::Merged`] write is
/// also accepted over another version when [`merge_still_holds`].
pub(crate) fn check_write(
    existing: Option<&Resource>,
    incoming: &Resource,
    condition: WriteCondition,
) -> Result<(), StorageError> {
    let incoming_uid = incoming
        .id
        .as_ref()
        .map(|id| id.uid.as_str())
        .unwrap_or_default();
    match existing {
        Some(existing) if uid_of(existing) != incoming_uid => Err(StorageError::WrongUid),
        Some(existing)
            if existing.version != incoming.version
                && !(condition == WriteCondition::Merged
                    && merge_still_holds(existing, incoming)) =>
        {
            Err(StorageError::CasFailure)
        }
        None if !incoming.version.is_empty() => Err(StorageError::CasFailure),
        _ => Ok(()),
    }
}

/// Whether `stored` still has everything a blind write's merge took from the resource it read
/// (its owner, statuses and finalizers; the uid is checked before), and neither is marked for
/// deletion (the service checks such writes against the stored resource field by field).
fn merge_still_holds(stored: &Resource, incoming: &Resource) -> bool {
    let marked = |r: &Resource| r.metadata.contains_key(DELETION_TIMESTAMP_KEY);
    !marked(stored)
        && !marked(incoming)
        && stored.owner == incoming.owner
        && stored.status == incoming.status
        && stored.metadata.get(FINALIZERS_KEY) == incoming.metadata.get(FINALIZERS_KEY)
}

/// The uid of the resource's owner, if it names one (the owner index's key).
pub(crate) fn owner_uid(resource: &Resource) -> Option<&str> {
    resource
        .owner
        .as_ref()
        .map(|owner| owner.uid.as_str())
        .filter(|uid| !uid.is_empty())
}

/// What a delete does to what is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteCheck {
    /// Nothing is stored under the name, or another incarnation (uid) is: nothing to do.
    Nothing,
    /// Remove the stored resource.
    Remove,
}

/// The compare-and-swap check of a delete: a missing resource or another uid is a no-op; the
/// stored version must be `version`.
pub(crate) fn check_delete(
    existing: Option<&Resource>,
    id: &Id,
    version: &str,
) -> Result<DeleteCheck, StorageError> {
    match existing {
        None => Ok(DeleteCheck::Nothing),
        Some(existing) if !id.uid.is_empty() && uid_of(existing) != id.uid => {
            Ok(DeleteCheck::Nothing)
        }
        Some(existing) if existing.version != version => Err(StorageError::CasFailure),
        Some(_) => Ok(DeleteCheck::Remove),
    }
}

#[cfg(test)]
mod tests;
