//! Projections: what a node decides from (the registry, the ACL tokens and policies, replica
//! reports), kept by storage itself on the committed state (DESIGN §15, "schema changes are
//! linearizable with writes").
//!
//! A [`Projection`] follows a few types. Storage resets it from what is stored when it is
//! added, tells it every committed change of those types in commit order — after the commit,
//! under the lock that publishes watch events, before any watcher sees the change — and resets
//! it again in the same step that replaces the whole state (a snapshot installed, a restore).
//! So a projection is always exactly the node's applied state of its types, and nothing else
//! (no watch of the node's own data, no second copy that may lag) changes it.

use std::sync::Arc;

use proto::resource::v1::Resource;

use super::{Domain, StorageError, StorageKey, UnversionedType, Version, WatchEvent};

/// A view of some types of the committed state (see the module).
pub trait Projection: Send + Sync + 'static {
    /// What it is, for logs.
    fn name(&self) -> &'static str;
    /// The types it follows.
    fn follows(&self) -> Vec<UnversionedType>;
    /// A committed change of a resource of a type it follows, at `version`.
    fn apply(&self, event: &WatchEvent, version: Version);
    /// The whole state replaced: `stored` is every resource of the types it follows (all
    /// tenancies), `revision` each domain's last change ([`super::Guard::Domain`]).
    fn reset(&self, stored: Vec<Resource>, revision: &dyn Fn(Domain) -> Version);
}

/// Where a reset reads the committed state from (a backend's read of what it just committed).
pub trait ProjectionSource {
    /// Every stored resource of `resource_type`, in every tenancy.
    fn stored(&self, resource_type: &UnversionedType) -> Result<Vec<Resource>, StorageError>;
    /// The domain's last change.
    fn revision(&self, domain: Domain) -> Result<Version, StorageError>;
}

/// Nothing stored (an event log without a backend: tests).
impl ProjectionSource for () {
    fn stored(&self, _: &UnversionedType) -> Result<Vec<Resource>, StorageError> {
        Ok(Vec::new())
    }
    fn revision(&self, _: Domain) -> Result<Version, StorageError> {
        Ok(Version::default())
    }
}

/// The projections of one node, each with the types it follows.
#[derive(Default)]
pub(crate) struct Projections {
    items: Vec<(Vec<UnversionedType>, Arc<dyn Projection>)>,
}

impl std::fmt::Debug for Projections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.items.iter().map(|(_, projection)| projection.name()))
            .finish()
    }
}

impl Projections {
    /// Resets `projection` from `source` and follows it from now on.
    pub(crate) fn add(
        &mut self,
        projection: Arc<dyn Projection>,
        source: &dyn ProjectionSource,
    ) -> Result<(), StorageError> {
        let follows = projection.follows();
        reset_one(&follows, &*projection, source)?;
        self.items.push((follows, projection));
        Ok(())
    }

    /// Whether a change of a resource of `group`/`kind` concerns any projection.
    pub(crate) fn concern(&self, group: &str, kind: &str) -> bool {
        self.items
            .iter()
            .any(|(follows, _)| follows.iter().any(|t| t.group == group && t.kind == kind))
    }

    /// Tells every projection following `key`'s type of a committed change.
    pub(crate) fn changed(&self, key: &StorageKey, event: &WatchEvent, version: Version) {
        for (follows, projection) in &self.items {
            if follows_key(follows, key) {
                projection.apply(event, version);
            }
        }
    }

    /// Resets every projection from `source` (the whole state was replaced).
    pub(crate) fn reset(&self, source: &dyn ProjectionSource) -> Result<(), StorageError> {
        for (follows, projection) in &self.items {
            reset_one(follows, &**projection, source)?;
        }
        Ok(())
    }
}

fn follows_key(follows: &[UnversionedType], key: &StorageKey) -> bool {
    follows
        .iter()
        .any(|t| t.group == key.group && t.kind == key.kind)
}

fn reset_one(
    follows: &[UnversionedType],
    projection: &dyn Projection,
    source: &dyn ProjectionSource,
) -> Result<(), StorageError> {
    let mut stored = Vec::new();
    for resource_type in follows {
        stored.extend(source.stored(resource_type)?);
    }
    let mut revisions = std::collections::BTreeMap::new();
    for domain in Domain::ALL {
        revisions.insert(domain, source.revision(domain)?);
    }
    projection.reset(stored, &|domain| {
        revisions.get(&domain).copied().unwrap_or_default()
    });
    Ok(())
}
