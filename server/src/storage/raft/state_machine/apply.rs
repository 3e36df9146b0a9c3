//! Applying one [`Op`] inside the batch's LMDB write transaction.
//!
//! Apply is deterministic and cannot fail on data: every change is checked first (what can be
//! stored, then compare-and-swap), and whatever cannot be applied becomes a refused
//! [`ChangeResult`] for that change's proposer. Only the environment itself failing (I/O, a full
//! disk) is an error, and that stops the state machine as it must.
//!
//! Every value is sealed (`sealed`) as it is stored and opened as it is read. A value that fails
//! its seal is an error that stops apply (this node's state is damaged; the others decide from
//! their own), never a decision made from damaged bytes.
//!
//! Changes are applied exactly once: a change whose request id the state machine remembers (a
//! retry of a forward whose first attempt committed) is answered with the first outcome and not
//! applied again. The table of remembered requests is bounded and forgets the oldest first, in
//! apply order, so every replica remembers the same ones.

use prost::Message;
use proto::resource::v1::Resource;
use proto::resource::v1::history_entry::Operation as HistoryOperation;

use super::super::codec;
use super::super::op::{Applied, Change, ChangeResult, Op, Outcome, RequestId, Tagged};
use super::super::schema::{self, SmDbs};
use super::super::sealed;
use super::{get_meta, get_sealed, put_meta};
use crate::storage::check::{self, DeleteCheck};
use crate::storage::events::Published;
use crate::storage::history::{self, Keep};
use crate::storage::quota;
use crate::storage::{
    Domain, Fence, Operation, StorageError, StorageKey, Version, WatchEvent, WriteCondition,
};

type Txn<'t> = heed::RwTxn<'t>;

/// Applies `op`, the payload of the entry at `index`, collecting the events to publish after
/// the commit.
pub(super) fn apply_op(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    index: u64,
    op: Op,
    published: &mut Vec<Published>,
) -> Result<Outcome, heed::Error> {
    match op {
        Op::Changes(changes) => {
            let mut results = Vec::with_capacity(changes.len());
            for (position, tagged) in changes.into_iter().enumerate() {
                let position = u32::try_from(position).unwrap_or(u32::MAX);
                let version = Version::at(index, position);
                results.push(apply_once(dbs, wtxn, version, tagged, published)?);
            }
            Ok(Outcome(results))
        }
        Op::RestoreBegin { restore_id } => {
            dbs.restore.clear(wtxn)?;
            dbs.restore_history.clear(wtxn)?;
            put_meta(dbs, wtxn, schema::META_RESTORE_ID, restore_id.as_bytes())?;
            Ok(Outcome::one(Ok(Applied::Done)))
        }
        Op::RestoreChunk {
            restore_id,
            resources,
            history,
        } => Ok(Outcome::one(stage_restore_chunk(
            dbs,
            wtxn,
            &restore_id,
            &resources,
            &history,
        )?)),
        Op::RestoreCommit { restore_id } => Ok(Outcome::one(commit_restore(
            dbs,
            wtxn,
            Version::new(index),
            &restore_id,
            published,
        )?)),
    }
}

/// Applies a change unless its request was applied before, and remembers it.
fn apply_once(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    version: Version,
    tagged: Tagged,
    published: &mut Vec<Published>,
) -> Result<ChangeResult, heed::Error> {
    let Tagged {
        request_id,
        change,
        actor,
        fence,
        keep,
    } = tagged;
    let Some(request_id) = request_id else {
        return apply_change(dbs, wtxn, version, change, &actor, &fence, keep, published);
    };
    let key = request_id.to_bytes();
    if let Some(remembered) = get_sealed(dbs.requests, wtxn, &key)? {
        return Ok(codec::remembered_result(remembered, &change));
    }
    let result = apply_change(dbs, wtxn, version, change, &actor, &fence, keep, published)?;
    remember(dbs, wtxn, version, request_id, &result)?;
    Ok(result)
}

/// Stores `resource` under `key`, and its owner's index entry when it has an owner (and its
/// storage key is known).
fn store(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    key: &[u8],
    storage_key: Option<&StorageKey>,
    resource: &Resource,
) -> Result<(), heed::Error> {
    if let (Some(owner), Some(storage_key)) = (check::owner_uid(resource), storage_key) {
        dbs.owners
            .put(wtxn, &schema::owner_key(owner, storage_key), &())?;
    }
    put_in_order(
        dbs.resources,
        wtxn,
        key,
        &sealed::seal_message(key, resource),
    )
}

/// Stores `value` under `key`, appending when the key sorts after every key of `db`. LMDB splits
/// a full page in half, except on an append, where the new key starts the next page and the full
/// one stays full: keys written in order (names counting up, a restore, the request log) leave
/// pages full instead of half empty. A smaller file is less disk, and fewer pages for the
/// kernel's fault-around (which maps up to 16 cached neighbours of every page read) to keep
/// resident in this process.
fn put_in_order(
    db: heed::Database<heed::types::Bytes, heed::types::Bytes>,
    wtxn: &mut Txn<'_>,
    key: &[u8],
    value: &[u8],
) -> Result<(), heed::Error> {
    let after_all = match db.last(wtxn)? {
        Some((last, _)) => key > last,
        None => true,
    };
    let flags = if after_all {
        heed::PutFlags::APPEND
    } else {
        heed::PutFlags::empty()
    };
    db.put_with_flags(wtxn, flags, key, value)
}

/// Records a request's outcome and forgets the oldest beyond [`schema::REMEMBERED_REQUESTS`].
fn remember(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    version: Version,
    request_id: RequestId,
    result: &ChangeResult,
) -> Result<(), heed::Error> {
    let key = request_id.to_bytes();
    dbs.requests.put(
        wtxn,
        &key,
        &sealed::seal(&key, &codec::encode_remembered(result)),
    )?;
    put_in_order(
        dbs.request_order,
        wtxn,
        &schema::request_order_key(version.index, version.position),
        &key,
    )?;
    if dbs.request_order.len(wtxn)? > schema::REMEMBERED_REQUESTS
        && let Some((oldest, forgotten)) = dbs
            .request_order
            .first(wtxn)?
            .map(|(order, id)| (order.to_vec(), id.to_vec()))
    {
        dbs.requests.delete(wtxn, &forgotten)?;
        dbs.request_order.delete(wtxn, &oldest)?;
    }
    Ok(())
}

/// Reads what is stored under `key`. A record that fails its seal stops apply; one that passes
/// it but does not decode (written so by a bug) is refused for this change.
fn stored(
    dbs: &SmDbs,
    wtxn: &Txn<'_>,
    key: &[u8],
    what: &StorageKey,
) -> Result<Result<Option<Resource>, StorageError>, heed::Error> {
    read_stored(dbs, wtxn, key, what, |bytes| Resource::decode(bytes))
}

/// [`stored`] without the data: what a write's check and the owner index need. Apply reads no
/// stored data but a lease's (a fenced write's guard), and skipping it saves copying it on every
/// node.
fn stored_head(
    dbs: &SmDbs,
    wtxn: &Txn<'_>,
    key: &[u8],
    what: &StorageKey,
) -> Result<Result<Option<Resource>, StorageError>, heed::Error> {
    read_stored(dbs, wtxn, key, what, |bytes| {
        crate::wire::proto::ResourceHead::decode(bytes)
            .map(crate::wire::proto::ResourceHead::into_resource)
    })
}

fn read_stored(
    dbs: &SmDbs,
    wtxn: &Txn<'_>,
    key: &[u8],
    what: &StorageKey,
    decode: fn(&[u8]) -> Result<Resource, prost::DecodeError>,
) -> Result<Result<Option<Resource>, StorageError>, heed::Error> {
    Ok(match get_sealed(dbs.resources, wtxn, key)? {
        None => Ok(None),
        Some(bytes) => decode(bytes).map(Some).map_err(|error| {
            StorageError::Internal(format!(
                "the stored record of {}/{} {:?} does not decode: {error}",
                what.group, what.kind, what.name
            ))
        }),
    })
}

/// The version stored under `key` ("" when nothing is), read for a fence's guard.
fn stored_version(
    dbs: &SmDbs,
    wtxn: &Txn<'_>,
    key: &StorageKey,
) -> Result<Result<String, StorageError>, heed::Error> {
    let Some(bytes) = get_sealed(dbs.resources, wtxn, &schema::resource_key(key))? else {
        return Ok(Ok(String::new()));
    };
    Ok(crate::wire::proto::IdAndVersion::decode(bytes)
        .map(|head| head.version)
        .map_err(|error| {
            StorageError::Internal(format!(
                "the stored record of {}/{} {:?} does not decode: {error}",
                key.group, key.kind, key.name
            ))
        }))
}

/// A domain's last change as the state records it (none yet: version 0).
pub(super) fn revision(
    dbs: &SmDbs,
    txn: &heed::RoTxn<'_, heed::WithoutTls>,
    domain: Domain,
) -> Result<Version, heed::Error> {
    Ok(get_meta(dbs, txn, &schema::meta_revision(domain))?
        .and_then(schema::decode_revision)
        .unwrap_or_default())
}

/// Refuses a change whose fence no longer holds ([`crate::storage::check_fence`]).
fn check_fence(
    dbs: &SmDbs,
    wtxn: &Txn<'_>,
    fence: &Fence,
    at: Version,
) -> Result<Result<(), StorageError>, heed::Error> {
    if fence.is_empty() {
        return Ok(Ok(()));
    }
    // Reads that fail on the environment (not on data) stop apply, as everywhere here.
    let failed = std::cell::Cell::new(None);
    // Only the domains the fence names are read (a registered type's write names none, or
    // the ACLs alone).
    let mut revisions = std::collections::BTreeMap::new();
    for guard in &fence.guards {
        if let crate::storage::Guard::Domain { domain, .. } = guard
            && !revisions.contains_key(domain)
        {
            revisions.insert(*domain, revision(dbs, wtxn, *domain)?);
        }
    }
    let checked = crate::storage::check_fence(
        fence,
        at,
        |key| match stored_version(dbs, wtxn, key) {
            Ok(found) => found,
            Err(error) => {
                failed.set(Some(error));
                Ok(String::new())
            }
        },
        |domain| revisions.get(&domain).copied().unwrap_or_default(),
        |key| match stored(dbs, wtxn, &schema::resource_key(key), key) {
            Ok(found) => {
                found.map(|lease| lease.as_ref().and_then(crate::storage::lease_transitions))
            }
            Err(error) => {
                failed.set(Some(error));
                Ok(None)
            }
        },
    );
    match failed.into_inner() {
        Some(error) => Err(error),
        None => Ok(checked),
    }
}

/// Records a change of `key` at `version` as its domain's last, if it has one.
fn record_revision(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    key: &StorageKey,
    version: Version,
) -> Result<(), heed::Error> {
    match Domain::of(&key.group, &key.kind) {
        Some(domain) => put_meta(
            dbs,
            wtxn,
            &schema::meta_revision(domain),
            &schema::encode_revision(version),
        ),
        None => Ok(()),
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_change(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    version: Version,
    change: Change,
    actor: &str,
    fence: &Fence,
    keep: Option<Keep>,
    published: &mut Vec<Published>,
) -> Result<ChangeResult, heed::Error> {
    match change {
        Change::Write(resource, condition) => {
            // The log's cache of recent entries still holds this change: a copy, once.
            let resource = std::sync::Arc::unwrap_or_clone(resource);
            write(
                dbs, wtxn, version, resource, condition, actor, fence, keep, published,
            )
        }
        Change::Delete {
            id,
            version: expected,
        } => {
            if let Err(refused) = check::check_key(&id) {
                return Ok(Err(refused));
            }
            if let Err(refused) = check_fence(dbs, wtxn, fence, version)? {
                return Ok(Err(refused));
            }
            let storage_key = StorageKey::of(&id);
            let key = schema::resource_key(&storage_key);
            let existing = match stored(dbs, wtxn, &key, &storage_key)? {
                Ok(existing) => existing,
                Err(refused) => return Ok(Err(refused)),
            };
            match check::check_delete(existing.as_ref(), &id, &expected) {
                Err(refused) => return Ok(Err(refused)),
                Ok(DeleteCheck::Nothing) => return Ok(Ok(Applied::Done)),
                Ok(DeleteCheck::Remove) => {}
            }
            let Some(existing) = existing else {
                return Ok(Ok(Applied::Done));
            };
            // What its quotas counted of it is given back (a delete is never refused).
            let quotas = quotas_over(dbs, wtxn, &storage_key)?;
            let charged = if quotas.is_empty() {
                Vec::new()
            } else {
                // The stored size, as a write charged it.
                let stored_bytes = get_sealed(dbs.resources, wtxn, &key)?.map_or(0, <[u8]>::len);
                match charge(quotas, &storage_key, quota::Delta::of_delete(stored_bytes)) {
                    Ok(charged) => charged,
                    Err(refused) => return Ok(Err(refused)),
                }
            };
            dbs.resources.delete(wtxn, &key)?;
            if let Some(owner) = check::owner_uid(&existing) {
                dbs.owners
                    .delete(wtxn, &schema::owner_key(owner, &storage_key))?;
            }
            record_revision(dbs, wtxn, &storage_key, version)?;
            if let Some(keep) = keep {
                let uid = existing
                    .id
                    .as_ref()
                    .map(|id| id.uid.clone())
                    .unwrap_or_default();
                super::history::record(
                    dbs,
                    wtxn,
                    &uid,
                    version,
                    &existing,
                    actor,
                    HistoryOperation::Delete,
                    keep,
                )?;
            }
            published.push(Published::Change {
                key: storage_key,
                event: WatchEvent {
                    version: version.to_string(),
                    operation: Operation::Delete(existing),
                    actor: actor.to_owned(),
                },
                before: None,
                version,
            });
            store_quotas(dbs, wtxn, version, charged, actor, published)?;
            Ok(Ok(Applied::Done))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn write(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    version: Version,
    mut resource: Resource,
    condition: WriteCondition,
    actor: &str,
    fence: &Fence,
    keep: Option<Keep>,
    published: &mut Vec<Published>,
) -> Result<ChangeResult, heed::Error> {
    // Sizes are the proposer's business (limits are configuration, and apply must not depend
    // on it); names and keys are not.
    if let Err(refused) = check::check_storable(&resource, usize::MAX) {
        return Ok(Err(refused));
    }
    if let Err(refused) = check_fence(dbs, wtxn, fence, version)? {
        return Ok(Err(refused));
    }
    let storage_key = StorageKey::of(resource.id.as_ref().unwrap_or(&Default::default()));
    let key = schema::resource_key(&storage_key);
    let existing = match stored_head(dbs, wtxn, &key, &storage_key)? {
        Ok(existing) => existing,
        Err(refused) => return Ok(Err(refused)),
    };
    if let Err(refused) = check::check_write(existing.as_ref(), &resource, condition) {
        return Ok(Err(refused));
    }
    resource.version = version.to_string();
    // A quota written is counted afresh from the state; what a quota counts is charged to it.
    // (The same limits as stored keep the stored use: counting a tenancy again is O(its
    // objects), done only when the limits change.)
    if quota::is_quota(&storage_key) {
        let kept = match stored(dbs, wtxn, &key, &storage_key)? {
            Ok(Some(previous)) => quota::keep_used(&mut resource, &previous),
            _ => false,
        };
        if !kept && let Err(refused) = recount_quota(dbs, wtxn, &storage_key, &mut resource)? {
            return Ok(Err(refused));
        }
    }
    // Most writes have no quota over them: the stored size is read only when one does.
    let quotas = quotas_over(dbs, wtxn, &storage_key)?;
    let charged = if quotas.is_empty() {
        Vec::new()
    } else {
        let before = get_sealed(dbs.resources, wtxn, &key)?.map(<[u8]>::len);
        let delta = quota::Delta::of_write(&resource, before, actor);
        match charge(quotas, &storage_key, delta) {
            Ok(charged) => charged,
            Err(refused) => return Ok(Err(refused)),
        }
    };
    if let Some(previous_owner) = existing.as_ref().and_then(check::owner_uid)
        && check::owner_uid(&resource) != Some(previous_owner)
    {
        dbs.owners
            .delete(wtxn, &schema::owner_key(previous_owner, &storage_key))?;
    }
    store(dbs, wtxn, &key, Some(&storage_key), &resource)?;
    record_revision(dbs, wtxn, &storage_key, version)?;
    if let Some(keep) = keep {
        let operation = history::operation_of(
            existing
                .as_ref()
                .map(|existing| existing.generation.as_str()),
            &resource,
        );
        let uid = resource
            .id
            .as_ref()
            .map(|id| id.uid.clone())
            .unwrap_or_default();
        super::history::record(dbs, wtxn, &uid, version, &resource, actor, operation, keep)?;
    }
    published.push(Published::Change {
        key: storage_key,
        event: WatchEvent {
            version: version.to_string(),
            operation: Operation::Upsert(resource.clone()),
            actor: actor.to_owned(),
        },
        before: existing.map(|existing| existing.metadata),
        version,
    });
    store_quotas(dbs, wtxn, version, charged, actor, published)?;
    Ok(Ok(Applied::Written(resource)))
}

/// The quotas that count `key`, with their keys (a prefix read per tenancy that may hold one).
fn quotas_over(
    dbs: &SmDbs,
    txn: &heed::RoTxn<'_, heed::WithoutTls>,
    key: &StorageKey,
) -> Result<Vec<(StorageKey, Resource)>, heed::Error> {
    let mut found = Vec::new();
    for (partition, namespace) in quota::scopes(key) {
        let mut prefix = schema::resource_key(&StorageKey {
            group: quota::GROUP.into(),
            kind: quota::KIND.into(),
            partition,
            namespace,
            name: String::new(),
        });
        // `…namespace 0 name`: the prefix ends with the separator before the name.
        if prefix.last() != Some(&schema::SEP) {
            prefix.push(schema::SEP);
        }
        for item in dbs.resources.prefix_iter(txn, &prefix)? {
            let (stored_key, stored) = item?;
            let Some(quota_key) = schema::parse_resource_key(stored_key) else {
                continue;
            };
            // The prefix of a partition's quotas (no namespace) is not a prefix of a
            // namespace's: `p 0 0 name` against `p 0 ns 0 name`.
            if !quota::covers(&quota_key, key) {
                continue;
            }
            let bytes = sealed::open(stored_key, stored)
                .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
            if let Ok(resource) = Resource::decode(bytes) {
                found.push((quota_key, resource));
            }
        }
    }
    Ok(found)
}

/// Charges `delta`, a change of `key`, to each of `quotas` (those that count it): the quotas
/// changed, or the first refusal.
fn charge(
    quotas: Vec<(StorageKey, Resource)>,
    key: &StorageKey,
    delta: quota::Delta,
) -> Result<Vec<(StorageKey, Resource)>, StorageError> {
    let mut charged = Vec::new();
    for (quota_key, stored) in quotas {
        if let Some(next) = quota::charge(&stored, &quota_key, key, delta)? {
            charged.push((quota_key, next));
        }
    }
    Ok(charged)
}

/// Stores the quotas a change charged, at the change's version, and publishes them.
fn store_quotas(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    version: Version,
    charged: Vec<(StorageKey, Resource)>,
    actor: &str,
    published: &mut Vec<Published>,
) -> Result<(), heed::Error> {
    for (quota_key, mut quota) in charged {
        let before = quota.metadata.clone();
        quota.version = version.to_string();
        let key = schema::resource_key(&quota_key);
        store(dbs, wtxn, &key, Some(&quota_key), &quota)?;
        published.push(Published::Change {
            key: quota_key,
            event: WatchEvent {
                version: version.to_string(),
                operation: Operation::Upsert(quota),
                actor: actor.to_owned(),
            },
            before: Some(before),
            version,
        });
    }
    Ok(())
}

/// Sets a quota's `used` from what its tenancy holds: every kind's objects there, read a kind
/// at a time (a seek to each kind, then its objects in the tenancy).
fn recount_quota(
    dbs: &SmDbs,
    txn: &heed::RoTxn<'_, heed::WithoutTls>,
    quota_key: &StorageKey,
    quota: &mut Resource,
) -> Result<Result<(), StorageError>, heed::Error> {
    let mut count = match quota::Recount::of(quota, quota_key) {
        Ok(count) => count,
        Err(refused) => return Ok(Err(refused)),
    };
    let mut from: Vec<u8> = Vec::new();
    loop {
        // LMDB refuses an empty key, even as a bound: the first seek is unbounded.
        let start = if from.is_empty() {
            std::ops::Bound::Unbounded
        } else {
            std::ops::Bound::Included(from.as_slice())
        };
        let range = (start, std::ops::Bound::Unbounded);
        let Some(first) = dbs.resources.range(txn, &range)?.next() else {
            break;
        };
        let (first_key, _) = first?;
        let Some(kind) = schema::parse_resource_key(first_key) else {
            // Not a resource key (never written so): go past it, counting on.
            from = first_key.to_vec();
            from.push(0);
            continue;
        };
        let mut kind_prefix = kind.group.as_bytes().to_vec();
        kind_prefix.push(schema::SEP);
        kind_prefix.extend_from_slice(kind.kind.as_bytes());
        kind_prefix.push(schema::SEP);
        let mut scope = kind_prefix.clone();
        scope.extend_from_slice(quota_key.partition.as_bytes());
        scope.push(schema::SEP);
        if !quota_key.namespace.is_empty() {
            scope.extend_from_slice(quota_key.namespace.as_bytes());
            scope.push(schema::SEP);
        }
        for item in dbs.resources.prefix_iter(txn, &scope)? {
            let (stored_key, stored) = item?;
            let Some(key) = schema::parse_resource_key(stored_key) else {
                continue;
            };
            let bytes = sealed::open(stored_key, stored)
                .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
            count.add(&key, bytes.len() as u64);
        }
        // The next kind: past every key of this one (`group 0 kind 1` sorts after them).
        kind_prefix.pop();
        kind_prefix.push(schema::SEP + 1);
        from = kind_prefix;
    }
    count.finish(quota);
    Ok(Ok(()))
}

fn another_restore() -> StorageError {
    StorageError::Rejected(
        "another restore started since this one began; this one changed nothing".into(),
    )
}

fn stage_restore_chunk(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    restore_id: &str,
    resources: &[Resource],
    history: &[(proto::resource::v1::HistoryEntry, i64)],
) -> Result<ChangeResult, heed::Error> {
    if get_meta(dbs, wtxn, schema::META_RESTORE_ID)? != Some(restore_id.as_bytes()) {
        return Ok(Err(another_restore()));
    }
    super::history::stage(dbs, wtxn, history)?;
    // The whole chunk or nothing: a record that cannot be stored fails the restore before its
    // commit changes anything.
    for resource in resources {
        if let Err(refused) = check::check_storable(resource, usize::MAX) {
            return Ok(Err(refused));
        }
    }
    for resource in resources {
        let storage_key = StorageKey::of(&resource.id.clone().unwrap_or_default());
        let key = schema::resource_key(&storage_key);
        dbs.restore
            .put(wtxn, &key, &sealed::seal_message(&key, resource))?;
    }
    Ok(Ok(Applied::Done))
}

/// Staged records a restore's commit copies at a time.
const RESTORE_COPY_CHUNK: usize = 512;

fn commit_restore(
    dbs: &SmDbs,
    wtxn: &mut Txn<'_>,
    version: Version,
    restore_id: &str,
    published: &mut Vec<Published>,
) -> Result<ChangeResult, heed::Error> {
    if get_meta(dbs, wtxn, schema::META_RESTORE_ID)? != Some(restore_id.as_bytes()) {
        return Ok(Err(another_restore()));
    }
    // Staged records were checked when they were staged; one that no longer decodes means the
    // staging area is damaged: refuse the commit before anything is cleared.
    for item in dbs.restore.iter(wtxn)? {
        let (key, stored) = item?;
        let bytes = sealed::open(key, stored)
            .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
        if let Err(error) = Resource::decode(bytes) {
            return Ok(Err(StorageError::Internal(format!(
                "a staged restore record does not decode ({error}); nothing was restored"
            ))));
        }
    }
    dbs.resources.clear(wtxn)?;
    dbs.owners.clear(wtxn)?;
    // Copied a chunk at a time (the staging area cannot be read while the same transaction
    // writes): memory stays a chunk, whatever the size of the restored state.
    let mut after: Option<Vec<u8>> = None;
    loop {
        let mut chunk = Vec::with_capacity(RESTORE_COPY_CHUNK);
        let range = (
            after
                .as_deref()
                .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
            std::ops::Bound::Unbounded,
        );
        for item in dbs.restore.range(wtxn, &range)?.take(RESTORE_COPY_CHUNK) {
            let (key, stored) = item?;
            let bytes = sealed::open(key, stored)
                .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
            let resource = Resource::decode(bytes)
                .map_err(|error| heed::Error::Io(std::io::Error::other(error)))?;
            chunk.push((key.to_vec(), resource));
        }
        let Some((last, _)) = chunk.last() else {
            break;
        };
        after = Some(last.clone());
        for (key, mut resource) in chunk {
            // Restored resources are new writes: versions keep increasing.
            resource.version = version.to_string();
            let storage_key = schema::parse_resource_key(&key);
            store(dbs, wtxn, &key, storage_key.as_ref(), &resource)?;
        }
    }
    dbs.restore.clear(wtxn)?;
    dbs.meta.delete(wtxn, schema::META_RESTORE_ID)?;
    // The restored objects' history is the snapshot's.
    super::history::commit_restore(dbs, wtxn, version)?;
    // Every restored object was stamped with this version (its size moved), and a snapshot's
    // `used` may not be its objects' anyway: each quota is counted again, in the same step.
    let mut prefix = quota::GROUP.as_bytes().to_vec();
    prefix.push(schema::SEP);
    prefix.extend_from_slice(quota::KIND.as_bytes());
    prefix.push(schema::SEP);
    let mut quotas = Vec::new();
    for item in dbs.resources.prefix_iter(wtxn, &prefix)? {
        let (stored_key, stored) = item?;
        let Some(quota_key) = schema::parse_resource_key(stored_key) else {
            continue;
        };
        let bytes = sealed::open(stored_key, stored)
            .map_err(|damage| heed::Error::Io(std::io::Error::other(damage)))?;
        if let Ok(resource) = Resource::decode(bytes) {
            quotas.push((quota_key, resource));
        }
    }
    for (quota_key, mut resource) in quotas {
        if let Ok(()) = recount_quota(dbs, wtxn, &quota_key, &mut resource)? {
            let key = schema::resource_key(&quota_key);
            store(dbs, wtxn, &key, Some(&quota_key), &resource)?;
        }
    }
    // Every Type and token is new: whatever was checked against the old ones is refused.
    for domain in Domain::ALL {
        put_meta(
            dbs,
            wtxn,
            &schema::meta_revision(domain),
            &schema::encode_revision(version),
        )?;
    }
    published.push(Published::Reset {
        reason: "the cluster state was restored from a snapshot; list again and start a new watch"
            .into(),
    });
    Ok(Ok(Applied::Done))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaf pages of 3,000 records of 1.2 KB (three to a page) written in `order`.
    fn leaf_pages(order: impl Iterator<Item = usize>, in_order: bool) -> usize {
        let dir = tempfile::tempdir().expect("temp dir");
        let (env, dbs) = schema::open_sm(dir.path(), 1 << 30).expect("open");
        let value = vec![7u8; 1200];
        for chunk in order.collect::<Vec<_>>().chunks(50) {
            // One transaction per 50 writes, as apply batches them.
            let mut wtxn = env.write_txn().expect("txn");
            for index in chunk {
                let key = format!("demo/Artist/default/default/bench-{index:06}");
                if in_order {
                    put_in_order(dbs.resources, &mut wtxn, key.as_bytes(), &value).expect("put");
                } else {
                    dbs.resources
                        .put(&mut wtxn, key.as_bytes(), &value)
                        .expect("put");
                }
            }
            wtxn.commit().expect("commit");
        }
        let rtxn = env.read_txn().expect("txn");
        dbs.resources.stat(&rtxn).expect("stat").leaf_pages
    }

    #[test]
    fn records_written_in_key_order_fill_their_pages() {
        let plain = leaf_pages(0..3_000, false);
        let appended = leaf_pages(0..3_000, true);
        assert!(
            appended <= 1_010 && plain >= 1_400,
            "3,000 records, three to a page: {appended} pages appended, {plain} split in half"
        );
        // Out of order, nothing is appended but nothing is lost either.
        let shuffled = (0..3_000).map(|index| (index * 7_919) % 3_000);
        assert!(leaf_pages(shuffled, true) >= 1_000);
    }
}
