//! Conventions carried in `Resource.metadata` that servers, controllers and clients all read:
//! the finalizer set and the deletion mark, and the status dirty check.

use std::collections::BTreeSet;

use crate::resource::v1::{Resource, Status};

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

/// Whether any finalizer holds the resource.
pub fn has_finalizers(resource: &Resource) -> bool {
    !finalizers(resource).is_empty()
}

pub fn has_finalizer(resource: &Resource, finalizer: &str) -> bool {
    finalizers(resource).contains(finalizer)
}

/// Stores a finalizer set; an empty set removes the key.
pub fn set_finalizers<'a>(resource: &mut Resource, set: impl IntoIterator<Item = &'a str>) {
    let set: BTreeSet<&str> = set.into_iter().collect();
    if set.is_empty() {
        resource.metadata.remove(FINALIZERS_KEY);
    } else {
        let value = set.into_iter().collect::<Vec<_>>().join(" ");
        resource.metadata.insert(FINALIZERS_KEY.to_owned(), value);
    }
}

pub fn add_finalizer(resource: &mut Resource, finalizer: &str) {
    let mut set: BTreeSet<String> = finalizers(resource)
        .into_iter()
        .map(str::to_owned)
        .collect();
    set.insert(finalizer.to_owned());
    set_finalizers(resource, set.iter().map(String::as_str));
}

pub fn remove_finalizer(resource: &mut Resource, finalizer: &str) {
    let set: BTreeSet<String> = finalizers(resource)
        .into_iter()
        .filter(|f| *f != finalizer)
        .map(str::to_owned)
        .collect();
    set_finalizers(resource, set.iter().map(String::as_str));
}

/// Compares two statuses ignoring `updated_at`: the dirty check controllers use to skip writes
/// that would change nothing.
pub fn equal_status(a: &Status, b: &Status) -> bool {
    a.observed_generation == b.observed_generation && a.conditions == b.conditions
}
