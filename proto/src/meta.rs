//! Conventions carried in `Resource.metadata` that servers, controllers and clients all read:
//! the finalizer set and the deletion mark.

use std::collections::BTreeSet;

use crate::resource::v1::Resource;

/// Metadata key holding the whitespace-separated set of finalizers.
pub const FINALIZERS_KEY: &str = "finalizers";

/// Metadata key holding the RFC 3339 time a resource with finalizers was marked for deletion.
pub const DELETION_TIMESTAMP_KEY: &str = "deletionTimestamp";

/// The finalizers of a resource, as a set.
pub fn finalizers(resource: &Resource) -> BTreeSet<&str> {
    resource
        .metadata
        .get(FINALIZERS_KEY)
        .map(|value| value.split_whitespace().collect())
        .unwrap_or_default()
}

/// Whether a delete has marked the resource and it now waits for its finalizers.
pub fn is_marked_for_deletion(resource: &Resource) -> bool {
    resource.metadata.contains_key(DELETION_TIMESTAMP_KEY)
}
