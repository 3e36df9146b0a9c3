//! The cache of a running controller.

use std::collections::HashMap;

use proto::resource::v1::{Id, Resource, Type};

/// A resource's place in the cache: its type without the version (stored objects are keyed
/// without one, DESIGN §2), tenancy and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    group: String,
    kind: String,
    partition: String,
    namespace: String,
    name: String,
}

impl CacheKey {
    fn of(id: &Id) -> CacheKey {
        let resource_type = id.r#type.clone().unwrap_or_default();
        let tenancy = id.tenancy.clone().unwrap_or_default();
        CacheKey {
            group: resource_type.group,
            kind: resource_type.kind,
            partition: tenancy.partition,
            namespace: tenancy.namespace,
            name: id.name.clone(),
        }
    }
}

/// The managed and watched resources of a running controller, as its watches last reported
/// them: primed from the watch snapshots before the first reconcile, then kept current by events.
/// Reads return copies.
#[derive(Debug, Default)]
pub struct Cache {
    resources: std::sync::RwLock<HashMap<CacheKey, Resource>>,
}

impl Cache {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<CacheKey, Resource>> {
        self.resources.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<CacheKey, Resource>> {
        self.resources.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn upsert(&self, resource: &Resource) {
        if let Some(id) = &resource.id {
            self.write().insert(CacheKey::of(id), resource.clone());
        }
    }

    pub(super) fn remove(&self, resource: &Resource) {
        if let Some(id) = &resource.id {
            self.write().remove(&CacheKey::of(id));
        }
    }

    /// The cached resource with this id's type (any version), tenancy and name.
    pub fn get(&self, id: &Id) -> Option<Resource> {
        self.read().get(&CacheKey::of(id)).cloned()
    }

    /// Every cached resource of a type (group and kind; any version).
    pub fn list(&self, resource_type: &Type) -> Vec<Resource> {
        self.read()
            .iter()
            .filter(|(key, _)| key.group == resource_type.group && key.kind == resource_type.kind)
            .map(|(_, resource)| resource.clone())
            .collect()
    }

    /// The ids of every cached resource of a type (group and kind; any version): what a
    /// re-queue needs, without copying the resources.
    pub fn ids(&self, resource_type: &Type) -> Vec<Id> {
        self.read()
            .iter()
            .filter(|(key, _)| key.group == resource_type.group && key.kind == resource_type.kind)
            .filter_map(|(_, resource)| resource.id.clone())
            .collect()
    }

    /// Cached resources owned by `owner` (matched by uid).
    pub fn owned_by(&self, owner: &Id) -> Vec<Resource> {
        self.read()
            .values()
            .filter(|r| {
                r.owner
                    .as_ref()
                    .is_some_and(|o| o.uid == owner.uid && !o.uid.is_empty())
            })
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
