//! What the service learnt about partitions and namespaces, kept while it is current.
//!
//! Every Read, Write, WriteStatus and MutateAndValidate checks that its tenancy exists: a
//! partition and a namespace read from the store (a read transaction and a decode each) — on a
//! node serving reads, about a sixth of the work of a Read. [`TenancyUnits`] remembers each unit
//! found with the backend's stamp of the tenancy group ([`crate::storage::Backend::group_stamp`])
//! taken before it was read; an answer is used only while that stamp has not moved, i.e. while
//! no partition or namespace has changed on this node since. A unit not found is never kept (the
//! service then asks the leader before it concludes), so only "exists" and "marked for
//! deletion" are answered from here, and exactly when the store would answer the same.

use std::collections::HashMap;
use std::sync::Mutex;

use proto::resource::v1::Id;

use crate::registry::builtin;

/// Units remembered at most; past it everything is forgotten (a cluster with this many
/// partitions and namespaces in use at once re-reads them).
const MAX_UNITS: usize = 4096;

/// A tenancy unit: a partition (`namespace` empty) or a namespace in a partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct UnitKey {
    pub partition: String,
    pub namespace: String,
}

impl UnitKey {
    pub(super) fn partition(partition: &str) -> UnitKey {
        UnitKey {
            partition: partition.to_owned(),
            namespace: String::new(),
        }
    }

    pub(super) fn namespace(partition: &str, namespace: &str) -> UnitKey {
        UnitKey {
            partition: partition.to_owned(),
            namespace: namespace.to_owned(),
        }
    }

    /// The id of the `Partition` or `Namespace` resource that is this unit.
    pub(super) fn id(&self) -> Id {
        if self.namespace.is_empty() {
            builtin::partition_id(&self.partition)
        } else {
            builtin::namespace_id(&self.partition, &self.namespace)
        }
    }

    /// What a request in this unit is told when it does not exist.
    pub(super) fn missing(&self) -> String {
        if self.namespace.is_empty() {
            format!("partition not found: {:?}", self.partition)
        } else {
            format!(
                "namespace not found: {:?} in partition {:?}",
                self.namespace, self.partition
            )
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct TenancyUnits {
    /// Unit → (the tenancy group's stamp before it was read, whether it is marked for deletion).
    units: Mutex<HashMap<UnitKey, (u64, bool)>>,
}

impl TenancyUnits {
    /// Whether the unit is marked for deletion, if it was found while the stamp was `stamp`.
    pub(super) fn get(&self, key: &UnitKey, stamp: u64) -> Option<bool> {
        let units = self.units.lock().unwrap_or_else(|p| p.into_inner());
        match units.get(key) {
            Some((seen, marked)) if *seen == stamp => Some(*marked),
            _ => None,
        }
    }

    /// Remembers a unit found by a read that started when the stamp was `stamp`.
    pub(super) fn found(&self, key: &UnitKey, stamp: u64, marked: bool) {
        let mut units = self.units.lock().unwrap_or_else(|p| p.into_inner());
        if units.len() >= MAX_UNITS && !units.contains_key(key) {
            units.clear();
        }
        units.insert(key.clone(), (stamp, marked));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(partition: &str, namespace: &str) -> UnitKey {
        if namespace.is_empty() {
            UnitKey::partition(partition)
        } else {
            UnitKey::namespace(partition, namespace)
        }
    }

    #[test]
    fn an_answer_holds_only_for_the_stamp_it_was_read_under() {
        let units = TenancyUnits::default();
        assert_eq!(units.get(&key("default", ""), 3), None);
        units.found(&key("default", ""), 3, false);
        units.found(&key("default", "team"), 3, true);
        assert_eq!(units.get(&key("default", ""), 3), Some(false));
        assert_eq!(units.get(&key("default", "team"), 3), Some(true));
        assert_eq!(units.get(&key("default", ""), 4), None, "the stamp moved");
        assert_eq!(units.get(&key("other", ""), 3), None);
    }

    #[test]
    fn the_memory_is_bounded() {
        let units = TenancyUnits::default();
        for n in 0..MAX_UNITS + 10 {
            units.found(&key(&format!("p{n}"), ""), 1, false);
        }
        let kept = units.units.lock().expect("lock").len();
        assert!(kept <= MAX_UNITS, "{kept}");
    }
}
