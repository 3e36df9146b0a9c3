//! Resources per kind, for the metrics (`resd_resources`): counted once by a scan of the keys,
//! then kept as apply creates and deletes. A scrape at a million resources used to read every
//! key (half a second of a core, and every page of the file mapped into the process again).
//!
//! The scan reads a transaction taken under the apply lock; the changes applied while it reads
//! are kept aside and added to what it found. A state replaced whole (a restore, an installed
//! snapshot) is counted again at the next ask.

use std::collections::BTreeMap;

use crate::storage::Operation;
use crate::storage::events::Published;

/// Resources per group and kind.
pub(super) type Counts = BTreeMap<String, BTreeMap<String, i64>>;

/// What the state machine knows of its resources per kind.
#[derive(Debug, Default)]
pub(super) enum KindCounts {
    /// Not counted since the state was opened or replaced: the next ask scans.
    #[default]
    Unknown,
    /// A scan is reading a transaction taken before these changes were applied.
    Counting(Counts),
    /// Counted, and kept since.
    Known(Counts),
}

impl KindCounts {
    /// Takes in what an apply published (under the apply lock, after its commit).
    pub(super) fn applied(&mut self, published: &[Published]) {
        let counts = match self {
            KindCounts::Unknown => return,
            KindCounts::Counting(counts) | KindCounts::Known(counts) => counts,
        };
        for change in published {
            match change {
                Published::Change {
                    key, event, before, ..
                } => {
                    let delta = match (&event.operation, before) {
                        (Operation::Upsert(_), None) => 1,
                        (Operation::Delete(_), _) => -1,
                        _ => continue,
                    };
                    add(counts, &key.group, &key.kind, delta);
                }
                Published::Reset { .. } => {
                    *self = KindCounts::Unknown;
                    return;
                }
            }
        }
    }

    /// The state was replaced whole: counted again at the next ask.
    pub(super) fn forget(&mut self) {
        *self = KindCounts::Unknown;
    }

    /// Ends a scan that found `scanned`: known from now on, unless the state was replaced
    /// while it read (then it stays unknown: what the scan found is all there is to say).
    /// What the state holds now, as far as is known.
    pub(super) fn counted(&mut self, mut scanned: Counts) -> Counts {
        match self {
            KindCounts::Counting(since) => {
                for (group, kinds) in since.iter() {
                    for (kind, delta) in kinds {
                        add(&mut scanned, group, kind, *delta);
                    }
                }
                *self = KindCounts::Known(scanned.clone());
                scanned
            }
            // A rebase made them known while the scan read: those are the state's.
            KindCounts::Known(known) => known.clone(),
            KindCounts::Unknown => scanned,
        }
    }
}

/// Adds `delta` to the count of `group`/`kind`.
pub(super) fn add(counts: &mut Counts, group: &str, kind: &str, delta: i64) {
    match counts.get_mut(group) {
        Some(kinds) => match kinds.get_mut(kind) {
            Some(count) => *count += delta,
            None => {
                kinds.insert(kind.to_owned(), delta);
            }
        },
        None => {
            counts.insert(group.to_owned(), BTreeMap::from([(kind.to_owned(), delta)]));
        }
    }
}

/// Counts resource keys as they are read in key order (the keys of one kind are adjacent: a
/// run is counted, and added once).
#[derive(Debug, Default)]
pub(super) struct KeyTally {
    found: Counts,
    run: Option<(Vec<u8>, i64)>,
}

impl KeyTally {
    /// Counts the resource stored under `key` (`group SEP kind SEP …`).
    pub(super) fn key(&mut self, key: &[u8]) {
        let mut parts = key.splitn(3, |byte| *byte == super::schema::SEP);
        let (Some(group), Some(kind)) = (parts.next(), parts.next()) else {
            return;
        };
        let prefix = &key[..(group.len() + 1 + kind.len()).min(key.len())];
        match &mut self.run {
            Some((current, count)) if current.as_slice() == prefix => *count += 1,
            _ => {
                self.end_run();
                self.run = Some((prefix.to_vec(), 1));
            }
        }
    }

    fn end_run(&mut self) {
        if let Some((prefix, count)) = self.run.take() {
            let mut parts = prefix.splitn(2, |byte| *byte == super::schema::SEP);
            let group = String::from_utf8_lossy(parts.next().unwrap_or_default());
            let kind = String::from_utf8_lossy(parts.next().unwrap_or_default());
            add(&mut self.found, &group, &kind, count);
        }
    }

    /// What was counted.
    pub(super) fn finish(mut self) -> Counts {
        self.end_run();
        self.found
    }
}

/// `group.Kind` -> resources, for people and the metrics (kinds with none left out).
pub(super) fn labelled(counts: &Counts) -> BTreeMap<String, u64> {
    counts
        .iter()
        .flat_map(|(group, kinds)| {
            kinds
                .iter()
                .filter(|(_, count)| **count > 0)
                .map(move |(kind, count)| (format!("{group}.{kind}"), *count as u64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::conformance::Fixture;
    use crate::storage::{StorageKey, Version, WatchEvent};

    fn change(name: &str, operation: &str, created: bool) -> Published {
        let resource = Fixture::new().artist(name);
        let key = StorageKey::of(resource.id.as_ref().expect("id"));
        let operation = match operation {
            "upsert" => Operation::Upsert(resource),
            _ => Operation::Delete(resource),
        };
        Published::Change {
            key,
            event: WatchEvent {
                version: "1".into(),
                operation,
                actor: String::new(),
            },
            before: (!created).then(Default::default),
            version: Version::new(1),
        }
    }

    fn artists(counts: &Counts) -> i64 {
        counts.values().flat_map(|kinds| kinds.values()).sum()
    }

    #[test]
    fn creates_and_deletes_move_the_count_and_updates_do_not() {
        let mut counts = KindCounts::Known(Counts::new());
        counts.applied(&[
            change("a", "upsert", true),
            change("b", "upsert", true),
            change("a", "upsert", false),
            change("b", "delete", false),
        ]);
        let KindCounts::Known(known) = &counts else {
            panic!("still known: {counts:?}");
        };
        assert_eq!(artists(known), 1);
        assert_eq!(labelled(known).values().sum::<u64>(), 1);
    }

    #[test]
    fn changes_applied_while_a_scan_reads_are_added_to_what_it_found() {
        let mut counts = KindCounts::Counting(Counts::new());
        counts.applied(&[change("c", "upsert", true), change("d", "upsert", true)]);
        let mut scanned = Counts::new();
        let group = match change("x", "upsert", true) {
            Published::Change { key, .. } => key,
            Published::Reset { .. } => unreachable!(),
        };
        add(&mut scanned, &group.group, &group.kind, 5);
        let now = counts.counted(scanned);
        assert_eq!(artists(&now), 7);
        assert!(matches!(&counts, KindCounts::Known(known) if artists(known) == 7));
    }

    #[test]
    fn a_state_replaced_while_counting_or_after_is_counted_again() {
        let mut counts = KindCounts::Counting(Counts::new());
        counts.applied(&[Published::Reset {
            reason: "restored".into(),
        }]);
        assert!(matches!(counts, KindCounts::Unknown));
        let found = counts.counted(Counts::new());
        assert!(found.is_empty());
        assert!(
            matches!(counts, KindCounts::Unknown),
            "a scan of the state before the reset is not kept"
        );
        let mut known = KindCounts::Known(Counts::new());
        known.forget();
        assert!(matches!(known, KindCounts::Unknown));
        known.applied(&[change("e", "upsert", true)]);
        assert!(matches!(known, KindCounts::Unknown), "nothing kept unknown");
    }
}

#[cfg(test)]
mod kept {
    use std::sync::Arc;

    use openraft::storage::RaftStateMachine;

    use super::super::super::op::Change;
    use super::super::super::tests::entry_changing as entry;
    use super::super::{StateMachineStore, scan_kinds};
    use super::*;
    use crate::storage::WriteCondition;
    use crate::storage::conformance::Fixture;

    fn scanned(sm: &StateMachineStore) -> BTreeMap<String, u64> {
        let live = sm.shared.current();
        let rtxn = live.env.read_txn().expect("txn");
        labelled(&scan_kinds(&live, &rtxn).expect("scan"))
    }

    /// Once counted, the counts follow creates, updates and deletes without another scan, and
    /// always equal what a scan of the state finds.
    #[tokio::test]
    async fn counts_kept_by_apply_match_a_scan_of_the_state() {
        let dir = tempfile::tempdir().expect("dir");
        let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
        let fixture = Fixture::new();
        let artists: Vec<_> = ["a", "b", "c"].map(|name| fixture.artist(name)).into();
        for (index, artist) in artists.iter().enumerate() {
            let write = Change::Write(Arc::new(artist.clone()), WriteCondition::Version);
            sm.apply(vec![entry(index as u64 + 1, write)])
                .await
                .expect("apply");
        }
        let first = sm.shared.count_by_kind().expect("count");
        assert_eq!(first.values().sum::<u64>(), 3);
        assert_eq!(first, scanned(&sm));
        assert!(matches!(
            &*super::super::lock(&sm.shared.kind_counts),
            KindCounts::Known(_)
        ));

        let stored = |name: &str| {
            let artist = artists.iter().find(|a| a.id.as_ref().unwrap().name == name);
            sm.shared
                .read(artist.unwrap().id.as_ref().unwrap())
                .expect("read")
        };
        let deleted = stored("a");
        let mut updated = stored("b");
        updated.metadata.insert("touched".into(), "yes".into());
        sm.apply(vec![
            entry(
                4,
                Change::Delete {
                    id: deleted.id.clone().expect("id"),
                    version: deleted.version.clone(),
                },
            ),
            entry(5, Change::Write(Arc::new(updated), WriteCondition::Version)),
            entry(
                6,
                Change::Write(Arc::new(fixture.artist("d")), WriteCondition::Version),
            ),
        ])
        .await
        .expect("apply");
        let kept = sm.shared.count_by_kind().expect("count");
        assert_eq!(kept.values().sum::<u64>(), 3, "a gone, b updated, d new");
        assert_eq!(kept, scanned(&sm));
    }
}
