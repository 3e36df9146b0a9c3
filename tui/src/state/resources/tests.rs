//! The rows follow the data in place of a rebuild: after any run of events and view changes,
//! they are what a rebuild from scratch gives.

use proto::resource::v1::State as ConditionState;

use super::*;
use crate::model::TOUCHED_MAX;
use crate::state::State;
use crate::testing::{
    condition, delete, end_of_snapshot, large_state, resource, upsert, with_status,
};

const GVK: &str = "demo.v1.Concept";

/// A small deterministic generator (the test must fail the same way every time).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// What the screen would show if its rows were built afresh.
fn from_scratch(screen: &ResourcesScreen, store: &Store) -> Vec<ResKey> {
    let mut fresh = ResourcesScreen {
        rows: Rows::default(),
        selected: None,
        cursor: Cursor::default(),
        ..screen.clone()
    };
    fresh.prepare(store, 20);
    fresh
        .rows
        .keys
        .iter()
        .map(|key| ResKey::clone(key))
        .collect()
}

fn shown(screen: &ResourcesScreen) -> Vec<ResKey> {
    screen
        .rows
        .keys
        .iter()
        .map(|key| ResKey::clone(key))
        .collect()
}

/// A resource with a team label, in one of two namespaces, with a condition of some state.
fn concept(dice: &mut Dice, name: &str, version: u64) -> Resource {
    let tenancy = if dice.below(3) == 0 {
        "default/blues"
    } else {
        "default/jazz"
    };
    let mut concept = resource(GVK, tenancy, name, version);
    concept
        .metadata
        .insert("team".into(), ["a", "b"][dice.below(2) as usize].into());
    let state = [
        ConditionState::True,
        ConditionState::False,
        ConditionState::Unknown,
    ][dice.below(3) as usize];
    if dice.below(2) == 0 {
        concept = with_status(
            concept,
            "observer",
            &version.to_string(),
            vec![condition("Seen", state, "Observed", "")],
        );
    }
    concept
}

/// One view change the user might make.
fn change_view(dice: &mut Dice, screen: &mut ResourcesScreen) {
    match dice.below(6) {
        0 => screen.sort = screen.sort.next(),
        1 => screen.descending = !screen.descending,
        2 => {
            // Typing: a longer filter narrows what a shorter one kept.
            let typed = [
                "",
                "c",
                "c-1",
                "c-12",
                "team=a",
                "blues",
                "seen=false",
                "false",
            ];
            screen.filter = typed[dice.below(typed.len() as u64) as usize].into();
        }
        3 => {
            screen.tenancy = match dice.below(3) {
                0 => TenancyFilter::All,
                1 => TenancyFilter::Partition("default".into()),
                _ => TenancyFilter::Namespace {
                    partition: "default".into(),
                    namespace: "jazz".into(),
                },
            }
        }
        _ => {}
    }
}

/// A listing that arrives out of the table's order and then churn (creations, updates that
/// move rows under every sort, deletions) with frames between random bursts and view changes
/// between them: the rows are always a rebuild's, and the selection stays on its resource.
#[test]
fn rows_that_follow_the_data_are_what_a_rebuild_gives() {
    for seed in 1..=6u64 {
        let mut dice = Dice(seed);
        let mut state = large_state(0);
        let data = state.store.get_mut(GVK).expect("type");
        data.synced = false;
        let mut names: Vec<String> = Vec::new();
        let mut version = 10u64;
        let check = |state: &mut State, step: &str| {
            state.resources.prepare(&state.store, 20);
            let data = state.store.get(GVK).expect("type");
            let expected = from_scratch(&state.resources, &state.store);
            let in_view = shown(&state.resources);
            let mut rows = in_view.clone();
            if !data.synced {
                // While the listing arrives, rows come in arrival order: the same set.
                rows.sort();
                let mut expected = expected.clone();
                expected.sort();
                assert_eq!(rows, expected, "seed {seed}, {step}: the listing's rows");
            } else {
                assert_eq!(rows, expected, "seed {seed}, {step}");
            }
            if let Some(selected) = &state.resources.selected {
                assert_eq!(
                    Some(selected),
                    in_view.get(state.resources.cursor.selected),
                    "seed {seed}, {step}: the cursor is on the selection"
                );
            }
        };
        // The listing: names in no particular order.
        for i in 0..120 {
            let name = format!("c-{}", dice.below(1_000));
            if names.contains(&name) {
                continue;
            }
            version += 1;
            let listed = concept(&mut dice, &name, version);
            names.push(name);
            state
                .store
                .get_mut(GVK)
                .expect("type")
                .apply(upsert(listed));
            if dice.below(8) == 0 {
                change_view(&mut dice, &mut state.resources);
            }
            if dice.below(10) == 0 {
                check(&mut state, &format!("listed {i}"));
            }
        }
        state
            .store
            .get_mut(GVK)
            .expect("type")
            .apply(end_of_snapshot(&version.to_string()));
        check(&mut state, "the listing's end");
        for step in 0..600 {
            version += 1;
            let data = state.store.get_mut(GVK).expect("type");
            match dice.below(4) {
                0 => {
                    let name = format!("c-{}", dice.below(1_000));
                    if !names.contains(&name) {
                        data.apply(upsert(concept(&mut dice, &name, version)));
                        names.push(name);
                    }
                }
                1 if !names.is_empty() => {
                    let name = names.swap_remove(dice.below(names.len() as u64) as usize);
                    data.apply(delete(resource(GVK, "default/jazz", &name, version)));
                    // It may have lived in the other namespace.
                    data.apply(delete(resource(GVK, "default/blues", &name, version)));
                }
                _ if !names.is_empty() => {
                    let name = names[dice.below(names.len() as u64) as usize].clone();
                    data.apply(upsert(concept(&mut dice, &name, version)));
                }
                _ => {}
            }
            if dice.below(12) == 0 {
                change_view(&mut dice, &mut state.resources);
            }
            if dice.below(4) == 0 {
                let rows = state.resources.rows.keys.len();
                if rows > 0 {
                    state.resources.cursor.selected = dice.below(rows as u64) as usize;
                    state.resources.select_at_cursor();
                }
                check(&mut state, &format!("step {step}"));
            }
        }
    }
}

/// More changes between two frames than the log keeps: the rows are rebuilt, not followed from
/// a log with a gap.
#[test]
fn rows_further_behind_than_the_log_are_rebuilt() {
    let mut state = large_state(100);
    state
        .store
        .get_mut(GVK)
        .expect("type")
        .apply(end_of_snapshot("1000"));
    state.resources.sort = SortKey::Version;
    state.resources.prepare(&state.store, 20);
    let data = state.store.get_mut(GVK).expect("type");
    for round in 0..(TOUCHED_MAX as u64 + 10) {
        let name = format!("concept-{:05}", round % 100);
        data.apply(upsert(resource(GVK, "default/jazz", &name, 2_000 + round)));
    }
    assert!(data.touched_after(state.resources.rows.revision).is_none());
    state.resources.prepare(&state.store, 20);
    assert_eq!(
        shown(&state.resources),
        from_scratch(&state.resources, &state.store)
    );
    // Newest last: the last update written was concept-(TOUCHED_MAX + 9) % 100.
    let last = (TOUCHED_MAX as u64 + 9) % 100;
    assert_eq!(
        state.resources.rows.keys.last().map(|key| key.name.clone()),
        Some(format!("concept-{last:05}"))
    );
}

/// The start of a key and a name's prefix never order two keys against their full order (long
/// partitions sharing 16 bytes, a partition that is another's prefix, names longer than 16).
#[test]
fn key_starts_and_prefixes_agree_with_the_full_order() {
    let parts = [
        "",
        "a",
        "ab",
        "default",
        "aaaaaaaaaaaaaaaa",
        "aaaaaaaaaaaaaaaab",
        "aaaaaaaaaaaaaaaaa",
        "listed-0000001",
        "listed-00000012345678901",
        "listed-00000012345678902",
    ];
    let mut keys = Vec::new();
    for partition in parts {
        for namespace in parts {
            for name in parts.iter().filter(|name| !name.is_empty()) {
                keys.push(ResKey {
                    partition: partition.into(),
                    namespace: namespace.into(),
                    name: (*name).into(),
                });
            }
        }
    }
    for a in &keys {
        for b in &keys {
            let starts = key_start(a).cmp(&key_start(b));
            assert!(starts.is_eq() || starts == a.cmp(b), "{a:?} {b:?}");
            let names = prefix(&a.name).cmp(&prefix(&b.name));
            assert!(names.is_eq() || names == a.name.cmp(&b.name), "{a:?} {b:?}");
        }
    }
}
