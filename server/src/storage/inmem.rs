//! [`InMemBackend`]: the storage contract over a mutex-guarded ordered map, with watches fed by a
//! broadcast channel. For tests and single-process runs; nothing survives a restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use proto::resource::v1::{Id, Resource, Tenancy};

use super::check::{self, DeleteCheck};
use super::events::{EventLog, GroupStamps, HistoryLimits, WatchFilter};
use super::history::{self, HistoryPolicy};
use super::quota;
use super::{
    Backend, Consistency, Domain, Fence, Operation, Projection, ProjectionSource, StorageError,
    StorageKey, UnversionedType, Version, Watch, WatchEvent, WatchOptions, WriteCondition,
};
use crate::resource;

pub(crate) struct InMemBackend {
    state: Mutex<State>,
    /// The event log's stamps, read without the lock.
    stamps: Arc<GroupStamps>,
    /// What each change is kept in history with.
    policy: std::sync::RwLock<Arc<dyn HistoryPolicy>>,
}

impl std::fmt::Debug for InMemBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemBackend").finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct State {
    resources: BTreeMap<StorageKey, Resource>,
    /// Owner uid → keys of the children pointing at that owner.
    children: HashMap<String, BTreeSet<StorageKey>>,
    /// Last version handed out; versions are a counter across all writes and deletes.
    version: u64,
    /// Each domain's last change ([`super::Guard::Domain`]).
    revisions: HashMap<Domain, Version>,
    events: EventLog,
    /// Objects' history.
    history: history::Memory,
}

impl State {
    /// Refuses a change whose fence no longer holds (it would be at the next version).
    fn check_fence(&self, fence: &Fence) -> Result<(), StorageError> {
        super::check_fence(
            fence,
            Version::new(self.version + 1),
            |key| {
                Ok(self
                    .resources
                    .get(key)
                    .map(|r| r.version.clone())
                    .unwrap_or_default())
            },
            |domain| self.revisions.get(&domain).copied().unwrap_or_default(),
            |key| Ok(self.resources.get(key).and_then(super::lease_transitions)),
        )
    }

    /// Charges `delta`, a change of `key`, to every quota that counts it (as raft's apply
    /// does): the quotas changed, or the first refusal.
    fn charge_quotas(
        &self,
        key: &StorageKey,
        delta: quota::Delta,
    ) -> Result<Vec<(StorageKey, Resource)>, StorageError> {
        let mut charged = Vec::new();
        for (partition, namespace) in quota::scopes(key) {
            let first = StorageKey {
                group: quota::GROUP.into(),
                kind: quota::KIND.into(),
                partition,
                namespace,
                name: String::new(),
            };
            for (quota_key, stored) in self.resources.range(first.clone()..) {
                if quota_key.group != first.group
                    || quota_key.kind != first.kind
                    || quota_key.partition != first.partition
                    || quota_key.namespace != first.namespace
                {
                    break;
                }
                if let Some(next) = quota::charge(stored, quota_key, key, delta)? {
                    charged.push((quota_key.clone(), next));
                }
            }
        }
        Ok(charged)
    }

    /// Stores the quotas a change charged, each at a version of its own, and publishes them.
    fn store_quotas(&mut self, charged: Vec<(StorageKey, Resource)>, actor: &str) {
        for (quota_key, mut quota) in charged {
            self.version += 1;
            quota.version = self.version.to_string();
            let previous = self.resources.insert(quota_key.clone(), quota.clone());
            let index = Version::new(self.version);
            self.events.publish_change(
                quota_key,
                WatchEvent {
                    version: quota.version.clone(),
                    operation: Operation::Upsert(quota),
                    actor: actor.to_owned(),
                },
                previous.map(|previous| previous.metadata),
                index,
            );
        }
    }

    /// Records a change of `key` at `version` in its domain, if it has one.
    fn changed(&mut self, key: &StorageKey, version: Version) {
        if let Some(domain) = Domain::of(&key.group, &key.kind) {
            self.revisions.insert(domain, version);
        }
    }
}

/// The stored state, read by a projection's reset.
struct Stored<'a> {
    resources: &'a BTreeMap<StorageKey, Resource>,
    revisions: &'a HashMap<Domain, Version>,
}

impl ProjectionSource for Stored<'_> {
    fn stored(&self, resource_type: &UnversionedType) -> Result<Vec<Resource>, StorageError> {
        let all = Tenancy {
            partition: resource::WILDCARD.into(),
            namespace: resource::WILDCARD.into(),
        };
        Ok(matching(self.resources, resource_type, &all, ""))
    }
    fn revision(&self, domain: Domain) -> Result<Version, StorageError> {
        Ok(self.revisions.get(&domain).copied().unwrap_or_default())
    }
}

impl Default for InMemBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemBackend {
    pub(crate) fn new() -> Self {
        Self::with_history(HistoryLimits::default())
    }

    /// `history`: the changes kept for resuming watches and for watchers that fall behind.
    pub(crate) fn with_history(history: HistoryLimits) -> Self {
        let events = EventLog::new(history, Version::new(0));
        InMemBackend {
            stamps: events.stamps(),
            state: Mutex::new(State {
                resources: BTreeMap::new(),
                children: HashMap::new(),
                version: 0,
                revisions: HashMap::new(),
                events,
                history: history::Memory::default(),
            }),
            policy: std::sync::RwLock::new(Arc::new(history::Defaults)),
        }
    }

    /// What a change of `key`'s type made now is kept with.
    fn keep(&self, key: &StorageKey) -> history::Keep {
        let policy = self
            .policy
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        history::keep_for(&*policy, &key.group, &key.kind)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated (every update below
        // is a handful of infallible inserts), so a poisoned lock is still a consistent state.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A write under `condition` (see [`Backend::write_cas_as`]).
    fn write(
        &self,
        resource: Resource,
        actor: &str,
        condition: WriteCondition,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        let id = resource.id.clone().unwrap_or_default();
        if id.uid.is_empty() {
            return Err(StorageError::Internal(format!(
                "write_cas of {} without a uid",
                resource::DisplayId(&id)
            )));
        }
        check::check_storable(&resource, usize::MAX)?;
        let key = StorageKey::of(&id);
        let keep = self.keep(&key);
        let mut state = self.lock();
        // As raft's apply: what the change was checked against first, then its CAS.
        state.check_fence(fence)?;
        check::check_write(state.resources.get(&key), &resource, condition)?;
        let version = (state.version + 1).to_string();
        let mut stored = resource;
        stored.version = version.clone();
        if quota::is_quota(&key) {
            quota::recount(
                &mut stored,
                &key,
                state
                    .resources
                    .iter()
                    .map(|(k, r)| (k.clone(), prost::Message::encoded_len(r) as u64)),
            )?;
        }
        let before = state.resources.get(&key).map(prost::Message::encoded_len);
        let delta = quota::Delta::of_write(&stored, before, actor);
        let charged = state.charge_quotas(&key, delta)?;
        state.version += 1;
        let previous = state.resources.insert(key.clone(), stored.clone());
        let operation = history::operation_of(
            previous
                .as_ref()
                .map(|previous| previous.generation.as_str()),
            &stored,
        );
        let entry = history::entry(
            stored.clone(),
            actor,
            keep.time_ms,
            operation,
            Version::new(state.version),
        );
        let at = Version::new(state.version);
        state.history.record(&id.uid, at, entry, keep);
        if let Some(uid) = previous.as_ref().and_then(check::owner_uid)
            && check::owner_uid(&stored) != Some(uid)
        {
            let uid = uid.to_owned();
            remove_child(&mut state.children, &uid, &key);
        }
        if let Some(uid) = check::owner_uid(&stored) {
            state
                .children
                .entry(uid.to_owned())
                .or_default()
                .insert(key.clone());
        }
        let index = Version::new(state.version);
        state.changed(&key, index);
        state.events.publish_change(
            key,
            WatchEvent {
                version,
                operation: Operation::Upsert(stored.clone()),
                actor: actor.to_owned(),
            },
            previous.map(|previous| previous.metadata),
            index,
        );
        state.store_quotas(charged, actor);
        Ok(stored)
    }
}

#[async_trait]
impl Backend for InMemBackend {
    async fn read(&self, _consistency: Consistency, id: &Id) -> Result<Resource, StorageError> {
        let state = self.lock();
        let stored = state
            .resources
            .get(&StorageKey::of(id))
            .ok_or(StorageError::NotFound)?;
        super::check_read(id, stored.clone())
    }

    async fn read_encoded(
        &self,
        consistency: Consistency,
        id: &Id,
    ) -> Result<Vec<u8>, StorageError> {
        self.read(consistency, id)
            .await
            .map(|resource| prost::Message::encode_to_vec(&resource))
    }

    async fn write_cas_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        self.write(resource, actor, WriteCondition::Version, fence)
    }

    async fn write_merged_as(
        &self,
        resource: Resource,
        actor: &str,
        fence: &Fence,
    ) -> Result<Resource, StorageError> {
        self.write(resource, actor, WriteCondition::Merged, fence)
    }

    async fn delete_cas_as(
        &self,
        id: &Id,
        version: &str,
        actor: &str,
        fence: &Fence,
    ) -> Result<(), StorageError> {
        let key = StorageKey::of(id);
        let keep = self.keep(&key);
        let mut state = self.lock();
        state.check_fence(fence)?;
        if check::check_delete(state.resources.get(&key), id, version)? == DeleteCheck::Nothing {
            return Ok(());
        }
        let Some(existing) = state.resources.get(&key) else {
            return Ok(());
        };
        let freed = quota::Delta::of_delete(prost::Message::encoded_len(existing));
        let charged = state.charge_quotas(&key, freed)?;
        let Some(removed) = state.resources.remove(&key) else {
            return Ok(());
        };
        if let Some(uid) = check::owner_uid(&removed) {
            let uid = uid.to_owned();
            remove_child(&mut state.children, &uid, &key);
        }
        state.version += 1;
        let version = state.version.to_string();
        let index = Version::new(state.version);
        state.changed(&key, index);
        let uid = removed
            .id
            .as_ref()
            .map(|id| id.uid.clone())
            .unwrap_or_default();
        let entry = history::entry(
            removed.clone(),
            actor,
            keep.time_ms,
            proto::resource::v1::history_entry::Operation::Delete,
            index,
        );
        state.history.record(&uid, index, entry, keep);
        state.events.publish_change(
            key,
            WatchEvent {
                version,
                operation: Operation::Delete(removed),
                actor: actor.to_owned(),
            },
            None,
            index,
        );
        state.store_quotas(charged, actor);
        Ok(())
    }

    async fn list(
        &self,
        _consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        let state = self.lock();
        Ok(matching(
            &state.resources,
            resource_type,
            tenancy,
            name_prefix,
        ))
    }

    async fn list_encoded(
        &self,
        _consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        after: Option<&StorageKey>,
        sink: &mut dyn crate::storage::EncodedSink,
    ) -> Result<(), StorageError> {
        let state = self.lock();
        let mut encoded = Vec::new();
        for resource in matching_after(&state.resources, resource_type, tenancy, name_prefix, after)
        {
            encoded.clear();
            prost::Message::encode(&resource, &mut encoded)
                .map_err(|error| StorageError::Internal(format!("encoding a resource: {error}")))?;
            if sink.take(&encoded).is_break() {
                break;
            }
        }
        Ok(())
    }

    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError> {
        if owner.uid.is_empty() {
            return Ok(Vec::new());
        }
        let state = self.lock();
        let Some(keys) = state.children.get(&owner.uid) else {
            return Ok(Vec::new());
        };
        Ok(keys
            .iter()
            .filter_map(|key| state.resources.get(key))
            .filter(|child| {
                child
                    .owner
                    .as_ref()
                    .is_some_and(|child_owner| resource::owner_matches(owner, child_owner))
            })
            .cloned()
            .collect())
    }

    async fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<Version>,
        options: WatchOptions,
    ) -> Result<Watch, StorageError> {
        let state = self.lock();
        let snapshot = match since {
            None => matching(&state.resources, resource_type, tenancy, name_prefix),
            Some(_) => Vec::new(),
        };
        state.events.watch(
            WatchFilter::new(resource_type, tenancy, name_prefix),
            options,
            snapshot,
            Version::new(state.version),
            since,
        )
    }

    fn group_stamp(&self, group: &str) -> Option<u64> {
        Some(self.stamps.get(group))
    }

    fn keep_history(&self, policy: Arc<dyn HistoryPolicy>) {
        *self
            .policy
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = policy;
    }

    async fn history(
        &self,
        _consistency: Consistency,
        uid: &str,
        before: Option<Version>,
        limit: usize,
    ) -> Result<history::Page, StorageError> {
        Ok(self.lock().history.page(uid, before, limit))
    }

    async fn sync(&self) -> Result<(), StorageError> {
        // One process: every change is applied when it is acknowledged.
        Ok(())
    }

    fn project(&self, projection: Arc<dyn Projection>) -> Result<(), StorageError> {
        let mut guard = self.lock();
        let State {
            resources,
            revisions,
            events,
            ..
        } = &mut *guard;
        events.project(
            projection,
            &Stored {
                resources,
                revisions,
            },
        )
    }
}

fn remove_child(
    children: &mut HashMap<String, BTreeSet<StorageKey>>,
    owner_uid: &str,
    key: &StorageKey,
) {
    if let Some(keys) = children.get_mut(owner_uid) {
        keys.remove(key);
        if keys.is_empty() {
            children.remove(owner_uid);
        }
    }
}

fn matching(
    resources: &BTreeMap<StorageKey, Resource>,
    resource_type: &UnversionedType,
    tenancy: &Tenancy,
    name_prefix: &str,
) -> Vec<Resource> {
    matching_after(resources, resource_type, tenancy, name_prefix, None)
}

/// [`matching`] after `after` (in key order), when given.
fn matching_after(
    resources: &BTreeMap<StorageKey, Resource>,
    resource_type: &UnversionedType,
    tenancy: &Tenancy,
    name_prefix: &str,
    after: Option<&StorageKey>,
) -> Vec<Resource> {
    use std::ops::Bound;
    let start = match after {
        Some(after) => Bound::Excluded(after.clone()),
        None => Bound::Included(StorageKey {
            group: resource_type.group.clone(),
            kind: resource_type.kind.clone(),
            partition: String::new(),
            namespace: String::new(),
            name: String::new(),
        }),
    };
    resources
        .range((start, Bound::Unbounded))
        .take_while(|(key, _)| key.group == resource_type.group && key.kind == resource_type.kind)
        .filter(|(key, _)| key.matches(resource_type, tenancy, name_prefix))
        .map(|(_, resource)| resource.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::InMemBackend;

    crate::conformance_tests!(|| async { super::InMemBackend::new() });

    mod registered_type {
        crate::conformance_tests!(registered: || async { super::super::InMemBackend::new() });
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_gets_an_error_not_a_gap() {
        use super::super::Backend;

        let backend = InMemBackend::with_history(super::HistoryLimits {
            changes: 2,
            bytes: 1 << 20,
        });
        let helpers = super::super::conformance::Fixture::new();
        let mut watch = backend
            .watch_list(
                &helpers.artist_type(),
                &helpers.wildcard(),
                "",
                None,
                crate::storage::WatchOptions::default(),
            )
            .await
            .expect("watch");
        assert!(matches!(
            watch
                .next()
                .await
                .map(|event| event.map(|e| e.operation.clone())),
            Some(Ok(super::Operation::EndOfSnapshot))
        ));
        for index in 0..5 {
            backend
                .write_cas(helpers.artist(&format!("a{index}")))
                .await
                .expect("write");
        }
        match watch.next().await {
            Some(Err(super::StorageError::WatchClosed(message))) => {
                assert!(message.contains("fell 3 events behind"), "{message}")
            }
            other => panic!("expected a closed watch, got {other:?}"),
        }
        assert!(
            watch.next().await.is_none(),
            "the watch ends after the error"
        );
    }
}

#[cfg(test)]
mod history_tests {
    use futures::StreamExt;

    use super::super::conformance::Fixture;
    use super::super::{Backend, Operation, StorageError};
    use super::InMemBackend;

    #[tokio::test]
    async fn a_resume_older_than_the_history_is_refused_with_a_relist_error() {
        let backend = InMemBackend::with_history(super::super::events::HistoryLimits {
            changes: 3,
            bytes: 1 << 20,
        });
        let fixture = Fixture::new();
        for index in 0..10 {
            backend
                .write_cas(fixture.artist(&format!("a{index}")))
                .await
                .expect("write");
        }
        let error = backend
            .watch_list(
                &fixture.artist_type(),
                &fixture.wildcard(),
                "",
                Some(super::super::Version::new(2)),
                crate::storage::WatchOptions::default(),
            )
            .await
            .err()
            .expect("too old");
        match error {
            StorageError::ResumeUnavailable(message) => {
                assert!(message.contains("list again"), "{message}")
            }
            other => panic!("expected ResumeUnavailable, got {other:?}"),
        }
        let mut resumed = backend
            .watch_list(
                &fixture.artist_type(),
                &fixture.wildcard(),
                "",
                Some(super::super::Version::new(7)),
                crate::storage::WatchOptions::default(),
            )
            .await
            .expect("within the history");
        let mut versions = Vec::new();
        while let Some(Ok(event)) = resumed.next().await {
            if event.operation == Operation::EndOfSnapshot {
                break;
            }
            versions.push(event.version.clone());
        }
        assert_eq!(versions, ["8", "9", "10"]);
    }
}
