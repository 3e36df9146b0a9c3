//! `update` as data: messages in, state and effects out.

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use proto::client::edit::{EditOutcome, EditSession, Problem, Round};
use proto::client::{ClientError, WatchUpdate};
use proto::cluster::v1::{ListTypesResponse, SnapshotHeader};
use proto::resource::v1::State as ConditionState;
use proto::resource::v1::WatchEvent;
use proto::resource::v1::watch_event::{Delete, Event};

use super::*;
use crate::msg::{ClusterReport, SnapshotMsg};
use crate::state::{
    Choice, Cursor, EVENT_TAIL, EventKind, SnapshotInfo, SnapshotStep, SortKey, TenancyFilter,
    VerifyRow,
};
use crate::testing::{self, demo_state, resource, row_names, upsert};

fn key(state: &mut State, code: KeyCode) -> Vec<Effect> {
    update(state, Msg::Key(KeyEvent::new(code, KeyModifiers::NONE)))
}

fn keys(state: &mut State, text: &str) -> Vec<Effect> {
    let mut effects = Vec::new();
    for c in text.chars() {
        effects.extend(key(state, KeyCode::Char(c)));
    }
    effects
}

fn ctrl(state: &mut State, c: char) -> Vec<Effect> {
    update(
        state,
        Msg::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)),
    )
}

fn watch(state: &mut State, gvk: &str, event: WatchEvent) {
    update(
        state,
        Msg::Watch {
            gvk: gvk.into(),
            update: WatchUpdate::Event(event),
        },
    );
}

fn selected_name(state: &State) -> Option<String> {
    state
        .resources
        .selected
        .as_ref()
        .map(|key| key.name.clone())
}

fn open(state: &mut State, type_name: &str) {
    keys(state, ":");
    keys(state, type_name);
    key(state, KeyCode::Enter);
    state.prepare();
}

#[test]
fn the_type_registry_starts_one_watch_per_type_and_the_start_commands() {
    let mut state = State::new("127.0.0.1:8502", testing::now());
    state.start = vec!["ns default/jazz".into(), "Executive".into()];
    let effects = update(
        &mut state,
        Msg::Types(Ok(ListTypesResponse {
            types: testing::demo_types(),
            file_descriptor_set: proto::FILE_DESCRIPTOR_SET.to_vec().into(),
            next_page_token: String::new(),
        })),
    );
    match effects.as_slice() {
        [Effect::Watch(types)] => assert_eq!(types.len(), testing::demo_types().len()),
        other => panic!("expected one Watch effect, got {other:?}"),
    }
    assert_eq!(state.store.types.len(), 9);
    assert_eq!(state.screen, Screen::Resources);
    assert_eq!(
        state.resources.current_type.as_deref(),
        Some("demo.v1.Executive")
    );
    assert_eq!(
        state.resources.tenancy,
        TenancyFilter::Namespace {
            partition: "default".into(),
            namespace: "jazz".into()
        }
    );
    assert!(state.start.is_empty());
}

#[test]
fn a_registry_failure_is_shown_and_marks_the_link() {
    let mut state = State::new("127.0.0.1:8502", testing::now());
    update(&mut state, Msg::Types(Err("server unreachable".into())));
    assert_eq!(state.types_error.as_deref(), Some("server unreachable"));
    assert!(matches!(state.link, Link::Disconnected { .. }));
}

#[test]
fn the_event_tail_shows_live_changes_not_the_initial_snapshot() {
    let mut state = State::new("127.0.0.1:8502", testing::now());
    state.store = Store::new(testing::demo_types());
    let gvk = "demo.v1.Concept";
    watch(
        &mut state,
        gvk,
        upsert(resource(gvk, "default/jazz", "modal", 3)),
    );
    watch(&mut state, gvk, testing::end_of_snapshot("3"));
    assert!(
        state.events.lines.is_empty(),
        "snapshot upserts are not events"
    );
    assert_eq!(state.link, Link::Live);
    watch(
        &mut state,
        gvk,
        upsert(resource(gvk, "default/jazz", "bebop", 4)),
    );
    watch(
        &mut state,
        gvk,
        upsert(resource(gvk, "default/jazz", "bebop", 5)),
    );
    watch(
        &mut state,
        gvk,
        WatchEvent {
            actor: String::new(),
            version: "6".into(),
            event: Some(Event::Delete(Delete {
                resource: Some(resource(gvk, "default/jazz", "modal", 3)),
            })),
        },
    );
    let lines: Vec<(EventKind, &str)> = state
        .events
        .lines
        .iter()
        .map(|e| (e.kind, e.text.as_str()))
        .collect();
    assert_eq!(
        lines,
        [
            (EventKind::Created, "demo.v1.Concept default/jazz/bebop v4"),
            (EventKind::Updated, "demo.v1.Concept default/jazz/bebop v5"),
            (EventKind::Deleted, "demo.v1.Concept default/jazz/modal v3"),
        ]
    );
    assert_eq!(state.store.get(gvk).map(|d| d.resources.len()), Some(1));
}

#[test]
fn the_event_tail_is_bounded() {
    let mut state = demo_state();
    let gvk = "demo.v1.Concept";
    for i in 0..EVENT_TAIL + 10 {
        watch(
            &mut state,
            gvk,
            upsert(resource(gvk, "default/jazz", &format!("c{i}"), i as u64)),
        );
    }
    assert_eq!(state.events.lines.len(), EVENT_TAIL);
    assert!(
        state
            .events
            .lines
            .back()
            .is_some_and(|e| e.text.contains(&format!("c{}", EVENT_TAIL + 9)))
    );
}

#[test]
fn a_disconnect_keeps_the_data_and_a_relist_replaces_it_at_its_end() {
    let mut state = demo_state();
    let albums = state.store.get("demo.v2.Album").map(|d| d.resources.len());
    update(
        &mut state,
        Msg::Watch {
            gvk: "demo.v2.Album".into(),
            update: WatchUpdate::Disconnected {
                error: "connection refused".into(),
                retry_in: Duration::from_millis(400),
            },
        },
    );
    assert_eq!(
        state.link,
        Link::Disconnected {
            error: "connection refused".into()
        }
    );
    assert_eq!(
        state.store.get("demo.v2.Album").map(|d| d.resources.len()),
        albums
    );
    // Every watch reports the same outage: one notice.
    update(
        &mut state,
        Msg::Watch {
            gvk: "demo.v2.Artist".into(),
            update: WatchUpdate::Disconnected {
                error: "connection refused".into(),
                retry_in: Duration::from_millis(400),
            },
        },
    );
    assert_eq!(state.events.lines.len(), 1);

    update(
        &mut state,
        Msg::Watch {
            gvk: "demo.v2.Album".into(),
            update: WatchUpdate::Relisting {
                reason: "restored from a snapshot".into(),
            },
        },
    );
    watch(
        &mut state,
        "demo.v2.Album",
        upsert(resource(
            "demo.v2.Album",
            "default/jazz",
            "kind-of-blue",
            30,
        )),
    );
    // Until the fresh snapshot ends, the old rows stay.
    assert_eq!(
        state.store.get("demo.v2.Album").map(|d| d.resources.len()),
        albums
    );
    watch(&mut state, "demo.v2.Album", testing::end_of_snapshot("31"));
    assert_eq!(
        state.store.get("demo.v2.Album").map(|d| d.resources.len()),
        Some(1)
    );
    assert_eq!(state.link, Link::Live);
    assert!(
        state
            .events
            .lines
            .iter()
            .any(|e| e.text.contains("listed again (1 resources)"))
    );
}

#[test]
fn a_token_that_cannot_see_the_cluster_keeps_the_link_live_and_says_why() {
    let mut state = demo_state();
    update(
        &mut state,
        Msg::Cluster(Box::new(ClusterReport {
            status: Err("permission denied: token lacks operator read".into()),
            members: None,
            nodes: Default::default(),
            controllers: None,
            denied: Some("your token cannot see the cluster's status".into()),
            identity: Some(Ok(Some("jazzer".into()))),
        })),
    );
    assert_eq!(state.link, Link::Live);
    assert_eq!(state.cluster.identity.as_deref(), Some("jazzer"));
    assert!(
        state
            .cluster
            .denied
            .as_deref()
            .is_some_and(|d| d.contains("your token cannot"))
    );
}

#[test]
fn the_event_tail_says_who_made_each_change() {
    let mut state = demo_state();
    let gvk = "demo.v1.Concept";
    let mut event = upsert(resource(gvk, "default/jazz", "bebop", 40));
    event.actor = "jazz-editor".into();
    update(
        &mut state,
        Msg::Watch {
            gvk: gvk.into(),
            update: WatchUpdate::Event(event),
        },
    );
    let last = state
        .events
        .lines
        .back()
        .map(|e| e.text.clone())
        .unwrap_or_default();
    assert!(last.ends_with("by jazz-editor"), "{last}");
}

#[test]
fn a_failed_watch_is_recorded_on_its_type() {
    let mut state = demo_state();
    update(
        &mut state,
        Msg::Watch {
            gvk: "demo.v1.Executive".into(),
            update: WatchUpdate::Failed(ClientError::PermissionDenied {
                reason: None,
                message: "token lacks read".into(),
            }),
        },
    );
    let failed = state
        .store
        .get("demo.v1.Executive")
        .and_then(|d| d.failed.clone());
    assert!(
        failed.is_some_and(|f| f.contains("your token cannot read demo.v1.Executive")
            && f.contains("token lacks read"))
    );
}

#[test]
fn the_selection_follows_its_resource_across_updates() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Album");
    key(&mut state, KeyCode::Char('j'));
    state.prepare();
    assert_eq!(selected_name(&state).as_deref(), Some("abbey-road"));
    // New rows sorting before it do not move the selection off it.
    for name in ["aa", "ab", "ac"] {
        watch(
            &mut state,
            "demo.v2.Album",
            upsert(resource("demo.v2.Album", "default/jazz", name, 40)),
        );
    }
    state.prepare();
    assert_eq!(selected_name(&state).as_deref(), Some("abbey-road"));
    assert_eq!(state.resources.cursor.selected, 3);
    // When it goes away, the cursor stays on the same row.
    watch(
        &mut state,
        "demo.v2.Album",
        WatchEvent {
            actor: String::new(),
            version: "41".into(),
            event: Some(Event::Delete(Delete {
                resource: Some(resource("demo.v2.Album", "default/rock", "abbey-road", 20)),
            })),
        },
    );
    state.prepare();
    assert_eq!(state.resources.cursor.selected, 3);
    assert_eq!(selected_name(&state).as_deref(), Some("ac"));
}

#[test]
fn the_filter_narrows_as_you_type_and_esc_clears_it() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Album");
    keys(&mut state, "/blu");
    state.prepare();
    assert_eq!(state.resources.filter, "blu");
    let names: Vec<&str> = state
        .resources
        .rows
        .keys
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(names, ["kind-of-blue"]);
    key(&mut state, KeyCode::Backspace);
    key(&mut state, KeyCode::Enter);
    assert!(state.input.is_none());
    assert_eq!(state.resources.filter, "bl");
    // esc on the table clears a kept filter; a second esc goes back to the types.
    key(&mut state, KeyCode::Esc);
    assert!(state.resources.filter.is_empty());
    key(&mut state, KeyCode::Esc);
    assert_eq!(state.screen, Screen::Types);
}

#[test]
fn sorting_cycles_columns_and_reverses() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Artist");
    let names = row_names;
    assert_eq!(
        names(&state),
        ["john-coltrane", "miles-davis", "the-beatles"]
    );
    key(&mut state, KeyCode::Char('s')); // tenancy
    key(&mut state, KeyCode::Char('s')); // version
    state.prepare();
    assert_eq!(state.resources.sort, SortKey::Version);
    assert_eq!(
        names(&state),
        ["the-beatles", "miles-davis", "john-coltrane"]
    );
    key(&mut state, KeyCode::Char('s')); // age
    key(&mut state, KeyCode::Char('s')); // condition: worst first
    state.prepare();
    assert_eq!(state.resources.sort, SortKey::Condition);
    assert_eq!(
        names(&state),
        ["the-beatles", "john-coltrane", "miles-davis"]
    );
    key(&mut state, KeyCode::Char('S'));
    state.prepare();
    assert_eq!(
        names(&state),
        ["miles-davis", "john-coltrane", "the-beatles"]
    );
}

#[test]
fn versions_sort_numerically_including_batched_ones() {
    let mut state = demo_state();
    let gvk = "demo.v1.Concept";
    for (name, version) in [("a", "18.4"), ("b", "9"), ("c", "18.10"), ("d", "100")] {
        let mut concept = resource(gvk, "default/jazz", name, 1);
        concept.version = version.into();
        watch(&mut state, gvk, upsert(concept));
    }
    open(&mut state, gvk);
    state.resources.sort = SortKey::Version;
    state.prepare();
    let names: Vec<&str> = state
        .resources
        .rows
        .keys
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(names, ["b", "a", "c", "d"]);
}

#[test]
fn n_cycles_through_every_tenancy_and_back_to_all() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Album");
    let mut seen = Vec::new();
    for _ in 0..6 {
        key(&mut state, KeyCode::Char('n'));
        seen.push(state.resources.tenancy.label());
    }
    assert_eq!(
        seen,
        [
            "partition default",
            "default/default",
            "default/jazz",
            "default/rock",
            "partition labels",
            "all tenancies"
        ]
    );
    state.resources.tenancy = TenancyFilter::Namespace {
        partition: "default".into(),
        namespace: "rock".into(),
    };
    state.prepare();
    let names: Vec<&str> = state
        .resources
        .rows
        .keys
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(names, ["abbey-road"]);
}

#[test]
fn the_command_bar_opens_types_and_screens_and_explains_unknown_kinds() {
    let mut state = demo_state();
    open(&mut state, "Executive");
    assert_eq!(
        state.resources.current_type.as_deref(),
        Some("demo.v1.Executive")
    );
    assert_eq!(state.screen, Screen::Resources);
    // A kind in two versions of one group opens the newest.
    open(&mut state, "Artist");
    assert_eq!(
        state.resources.current_type.as_deref(),
        Some("demo.v2.Artist")
    );
    open(&mut state, "Nonesuch");
    let flash = state.flash.clone().expect("an error");
    assert!(flash.error);
    assert!(flash.text.contains("Nonesuch"), "{}", flash.text);
    assert_eq!(
        state.resources.current_type.as_deref(),
        Some("demo.v2.Artist")
    );
    open(&mut state, "controllers");
    assert_eq!(state.screen, Screen::Controllers);
    keys(&mut state, ":nope");
    key(&mut state, KeyCode::Esc);
    assert!(state.input.is_none());
    assert_eq!(state.screen, Screen::Controllers);
}

#[test]
fn tabs_and_number_keys_switch_screens() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('3'));
    assert_eq!(state.screen, Screen::Cluster);
    key(&mut state, KeyCode::Tab);
    assert_eq!(state.screen, Screen::Controllers);
    key(&mut state, KeyCode::BackTab);
    key(&mut state, KeyCode::BackTab);
    assert_eq!(state.screen, Screen::Resources);
    key(&mut state, KeyCode::Char('1'));
    key(&mut state, KeyCode::BackTab);
    assert_eq!(state.screen, Screen::Snapshot);
}

#[test]
fn enter_drills_down_and_esc_comes_back() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('G'));
    state.prepare();
    key(&mut state, KeyCode::Up);
    key(&mut state, KeyCode::Up);
    key(&mut state, KeyCode::Enter); // demo.v2.Artist
    state.prepare();
    assert_eq!(
        state.resources.current_type.as_deref(),
        Some("demo.v2.Artist")
    );
    key(&mut state, KeyCode::Enter);
    assert_eq!(state.screen, Screen::Detail);
    assert_eq!(
        state.detail.at.as_ref().map(|d| d.key.name.as_str()),
        Some("john-coltrane")
    );
    key(&mut state, KeyCode::Char('o'));
    assert_eq!(state.screen, Screen::Tree);
    key(&mut state, KeyCode::Esc);
    assert_eq!(state.screen, Screen::Detail);
    key(&mut state, KeyCode::Esc);
    assert_eq!(state.screen, Screen::Resources);
}

#[test]
fn the_owner_tree_shows_ancestors_and_descendants() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Album");
    keys(&mut state, "jj"); // abbey-road, bitches-brew
    state.prepare();
    assert_eq!(selected_name(&state).as_deref(), Some("bitches-brew"));
    key(&mut state, KeyCode::Char('o'));
    let lines: Vec<String> = state
        .tree
        .lines
        .iter()
        .map(|line| {
            format!(
                "{}{}{}",
                line.prefix,
                state.label_of(&line.at),
                if line.focus { " *" } else { "" }
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            "Artist/miles-davis",
            "├─ Album/bitches-brew *",
            "└─ Album/kind-of-blue",
        ]
    );
    assert_eq!(state.tree.cursor.selected, 1);
}

#[test]
fn delete_asks_first_defaults_to_cancel_and_names_the_blockers() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Artist");
    keys(&mut state, "j"); // miles-davis
    state.prepare();
    assert!(key(&mut state, KeyCode::Char('d')).is_empty());
    let Some(Dialog::ConfirmDelete(plan)) = &state.dialog else {
        panic!("expected the delete dialog, got {:?}", state.dialog);
    };
    assert_eq!(plan.choice, Choice::Cancel);
    assert_eq!(plan.label, "demo.v2.Artist default/jazz/miles-davis");
    assert_eq!(plan.children, ["Album/bitches-brew", "Album/kind-of-blue"]);
    assert!(plan.finalizers.is_empty());
    // No finalizers: no controller holds it up (blame goes by finalizer, not by type).
    assert!(plan.controllers.is_empty() && plan.unowned.is_empty());
    // Enter on the default choice cancels.
    assert!(key(&mut state, KeyCode::Enter).is_empty());
    assert!(state.dialog.is_none());
    // d, → (Delete), enter deletes.
    key(&mut state, KeyCode::Char('d'));
    key(&mut state, KeyCode::Right);
    let effects = key(&mut state, KeyCode::Enter);
    match effects.as_slice() {
        [Effect::Delete { id, version, .. }] => {
            assert_eq!(id.name, "miles-davis");
            assert_eq!(version, "12");
        }
        other => panic!("expected a delete, got {other:?}"),
    }
}

#[test]
fn a_resource_being_deleted_explains_what_holds_it() {
    let mut state = demo_state();
    open(&mut state, "demo.v2.Album");
    key(&mut state, KeyCode::Char('w')); // a-love-supreme: not deleting
    assert!(state.dialog.is_none());
    assert!(
        state
            .flash
            .as_ref()
            .is_some_and(|f| f.text.contains("not being deleted"))
    );
    keys(&mut state, "jj"); // bitches-brew: marked
    state.prepare();
    key(&mut state, KeyCode::Char('w'));
    assert!(
        matches!(&state.dialog, Some(Dialog::WhyStuck { at }) if at.key.name == "bitches-brew")
    );
    key(&mut state, KeyCode::Esc);
    // d on a marked resource shows the same panel instead of deleting again.
    assert!(key(&mut state, KeyCode::Char('d')).is_empty());
    assert!(matches!(&state.dialog, Some(Dialog::WhyStuck { .. })));
    // e from the panel edits it (to remove a finalizer by hand).
    let effects = key(&mut state, KeyCode::Char('e'));
    assert!(
        matches!(effects.as_slice(), [Effect::Edit(session)] if session.id().name == "bitches-brew")
    );
}

#[test]
fn edit_rounds_end_in_a_message_or_a_dialog_that_can_edit_again() {
    let mut state = demo_state();
    open(&mut state, "Executive");
    let effects = key(&mut state, KeyCode::Char('e'));
    let [Effect::Edit(session)] = effects.as_slice() else {
        panic!("expected an edit, got {effects:?}");
    };
    assert_eq!(session.base_version(), "6");
    update(
        &mut state,
        Msg::EditRound {
            session: session.clone(),
            result: Ok(Round::Problem(Problem::Conflict {
                changes: "+ a\n".into(),
                yours: "+ b\n".into(),
                read_version: "6".into(),
                server_version: "7".into(),
            })),
        },
    );
    assert!(matches!(state.dialog, Some(Dialog::EditProblem { .. })));
    // Keys other than e/esc leave the dialog up.
    key(&mut state, KeyCode::Char('x'));
    assert!(state.dialog.is_some());
    let effects = key(&mut state, KeyCode::Char('e'));
    assert!(matches!(effects.as_slice(), [Effect::Edit(_)]));
    assert!(state.dialog.is_none());
    update(
        &mut state,
        Msg::EditRound {
            session: session.clone(),
            result: Ok(Round::Done(EditOutcome::Unchanged)),
        },
    );
    assert_eq!(
        state.flash.as_ref().map(|f| f.text.as_str()),
        Some("no changes; nothing saved")
    );
    update(
        &mut state,
        Msg::EditRound {
            session: session.clone(),
            result: Err("the editor \"nano\" exited with exit status: 1".into()),
        },
    );
    assert!(
        matches!(&state.dialog, Some(Dialog::Message { text, .. }) if text.contains("Nothing was saved"))
    );
}

#[test]
fn resource_actions_need_a_resource() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('3'));
    assert!(key(&mut state, KeyCode::Char('e')).is_empty());
    assert!(
        state.flash.is_none(),
        "e means nothing on the cluster screen"
    );
    let mut state = demo_state();
    state.screen = Screen::Resources;
    assert!(key(&mut state, KeyCode::Char('e')).is_empty());
    assert!(state.flash.as_ref().is_some_and(|f| f.error));
}

fn info() -> SnapshotInfo {
    SnapshotInfo {
        path: "/tmp/s.snap".into(),
        bytes: 4096,
        header: SnapshotHeader {
            format_version: 1,
            raft_index: 34,
            resource_count: 3,
            counts: [("demo.v2.Artist".to_owned(), 3)].into_iter().collect(),
            ..Default::default()
        },
    }
}

#[test]
fn the_snapshot_stepper_walks_save_inspect_confirm_restore_verify() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('6'));
    key(&mut state, KeyCode::Char('r'));
    assert!(
        state.flash.as_ref().is_some_and(|f| f.error),
        "nothing to restore yet"
    );
    key(&mut state, KeyCode::Char('s'));
    let input = state.input.clone().expect("asks for a file");
    assert_eq!(input.text, "resd-20261121-121000.snap");
    ctrl(&mut state, 'u');
    keys(&mut state, "/tmp/s.snap");
    let effects = key(&mut state, KeyCode::Enter);
    assert!(
        matches!(effects.as_slice(), [Effect::SnapshotSave(path)] if path.to_str() == Some("/tmp/s.snap"))
    );
    update(
        &mut state,
        Msg::Snapshot(SnapshotMsg::SaveProgress {
            written: 1024,
            total: Some(4096),
        }),
    );
    assert!(matches!(
        state.snapshot,
        SnapshotStep::Saving {
            written: 1024,
            total: Some(4096),
            ..
        }
    ));
    update(&mut state, Msg::Snapshot(SnapshotMsg::Saved(Ok(info()))));
    assert!(matches!(state.snapshot, SnapshotStep::Inspect(_)));
    key(&mut state, KeyCode::Char('r'));
    assert!(matches!(
        state.snapshot,
        SnapshotStep::Confirm {
            choice: Choice::Cancel,
            ..
        }
    ));
    // Enter on Cancel goes back to inspecting.
    assert!(key(&mut state, KeyCode::Enter).is_empty());
    assert!(matches!(state.snapshot, SnapshotStep::Inspect(_)));
    key(&mut state, KeyCode::Char('r'));
    let effects = key(&mut state, KeyCode::Char('y'));
    assert!(matches!(effects.as_slice(), [Effect::SnapshotRestore(_)]));
    update(
        &mut state,
        Msg::Snapshot(SnapshotMsg::RestoreProgress {
            sent: 4096,
            total: 4096,
        }),
    );
    let effects = update(&mut state, Msg::Snapshot(SnapshotMsg::Restored(Ok(40))));
    match effects.as_slice() {
        [Effect::SnapshotVerify(expected)] => assert_eq!(expected.get("demo.v2.Artist"), Some(&3)),
        other => panic!("expected verification, got {other:?}"),
    }
    let rows = vec![VerifyRow {
        gvk: "demo.v2.Artist".into(),
        expected: 3,
        actual: 3,
    }];
    update(
        &mut state,
        Msg::Snapshot(SnapshotMsg::Verified(Ok(rows.clone()))),
    );
    assert_eq!(
        state.snapshot,
        SnapshotStep::Verified {
            info: Box::new(info()),
            restored_index: 40,
            rows
        }
    );
    key(&mut state, KeyCode::Esc);
    assert_eq!(state.snapshot, SnapshotStep::Start);
}

#[test]
fn every_snapshot_step_under_way_can_be_cancelled() {
    let mut state = demo_state();
    state.screen = Screen::Snapshot;
    state.snapshot = SnapshotStep::Saving {
        path: "/tmp/x.snap".into(),
        written: 10,
        total: None,
    };
    assert!(matches!(
        key(&mut state, KeyCode::Esc).as_slice(),
        [Effect::SnapshotCancel]
    ));
    assert_eq!(state.snapshot, SnapshotStep::Start);
    // A late progress message from the cancelled save changes nothing.
    update(&mut state, Msg::Snapshot(SnapshotMsg::Saved(Ok(info()))));
    assert_eq!(state.snapshot, SnapshotStep::Start);

    state.snapshot = SnapshotStep::Restoring {
        info: Box::new(info()),
        sent: 1,
        total: 2,
    };
    assert!(matches!(
        key(&mut state, KeyCode::Esc).as_slice(),
        [Effect::SnapshotCancel]
    ));
    assert!(
        matches!(&state.snapshot, SnapshotStep::Failed { what, info: Some(_), .. } if what == "restore")
    );
    // From the failure, r offers the restore again (after confirmation).
    key(&mut state, KeyCode::Char('r'));
    assert!(matches!(state.snapshot, SnapshotStep::Confirm { .. }));
    update(
        &mut state,
        Msg::Snapshot(SnapshotMsg::Opened(Err("late".into()))),
    );
    assert!(matches!(state.snapshot, SnapshotStep::Confirm { .. }));
}

#[test]
fn a_failed_save_says_what_and_why() {
    let mut state = demo_state();
    state.snapshot = SnapshotStep::Saving {
        path: "/nope/x.snap".into(),
        written: 0,
        total: None,
    };
    update(
        &mut state,
        Msg::Snapshot(SnapshotMsg::Saved(Err(
            "cannot create a temporary file in /nope".into(),
        ))),
    );
    assert!(
        matches!(&state.snapshot, SnapshotStep::Failed { what, error, info: None }
        if what == "save to /nope/x.snap" && error.contains("/nope"))
    );
}

#[test]
fn ctrl_c_closes_the_open_prompt_or_dialog_first_then_quits() {
    for setup in [
        |s: &mut State| {
            keys(s, ":");
        },
        |s: &mut State| {
            key(s, KeyCode::Char('?'));
        },
        |s: &mut State| {
            open(s, "Executive");
            keys(s, "/cl");
        },
        |s: &mut State| {
            open(s, "Executive");
            key(s, KeyCode::Char('d'));
            assert!(matches!(s.dialog, Some(Dialog::ConfirmDelete(_))));
        },
    ] {
        let mut state = demo_state();
        setup(&mut state);
        let effects = ctrl(&mut state, 'c');
        assert!(effects.is_empty(), "ctrl-c answers no: {effects:?}");
        assert!(!state.quit, "the first ctrl-c closes what is open");
        assert!(state.input.is_none() && state.dialog.is_none());
        assert!(
            state.resources.filter.is_empty(),
            "as esc, it clears a filter being typed"
        );
        ctrl(&mut state, 'c');
        assert!(state.quit, "the second quits");
    }
    let mut state = demo_state();
    ctrl(&mut state, 'c');
    assert!(state.quit, "with nothing open, ctrl-c quits at once");
    let mut state = demo_state();
    open(&mut state, "Executive");
    keys(&mut state, "/q");
    assert!(!state.quit, "q types into the filter");
    key(&mut state, KeyCode::Esc);
    keys(&mut state, "q");
    assert!(state.quit);
}

#[test]
fn help_opens_scrolls_and_closes() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('?'));
    key(&mut state, KeyCode::Down);
    key(&mut state, KeyCode::Down);
    assert!(matches!(state.dialog, Some(Dialog::Help { scroll: 2 })));
    key(&mut state, KeyCode::Char('q'));
    assert!(state.dialog.is_none());
    assert!(!state.quit, "q closes help first");
}

#[test]
fn paging_moves_a_screenful_and_stays_in_bounds() {
    let mut state = testing::large_state(10_000);
    state.page = 30;
    state.prepare();
    key(&mut state, KeyCode::PageDown);
    state.prepare();
    assert_eq!(state.resources.cursor.selected, 30);
    assert_eq!(state.resources.cursor.offset, 1);
    key(&mut state, KeyCode::Char('G'));
    state.prepare();
    assert_eq!(state.resources.cursor.selected, 9_999);
    assert_eq!(state.resources.cursor.offset, 9_970);
    assert_eq!(selected_name(&state).as_deref(), Some("concept-09999"));
    key(&mut state, KeyCode::PageDown);
    key(&mut state, KeyCode::Char('g'));
    state.prepare();
    assert_eq!(state.resources.cursor, Cursor::default());
}

#[test]
fn the_events_screen_scrolls_back_and_follows_again() {
    let mut state = demo_state();
    for i in 0..5 {
        state.push_event(EventKind::Notice, format!("n{i}"));
    }
    state.screen = Screen::Events;
    key(&mut state, KeyCode::Up);
    key(&mut state, KeyCode::Up);
    assert_eq!(state.events.scroll, 2);
    state.push_event(EventKind::Notice, "new".into());
    assert_eq!(state.events.scroll, 3, "the lines being read stay put");
    key(&mut state, KeyCode::Char('G'));
    assert_eq!(state.events.scroll, 0);
}

/// Two replicas renewing leases and reporting would fill the tail: heartbeats are hidden until
/// `h`, and `/` narrows the tail to a type, a name or a reason as you type; esc clears it.
#[test]
fn the_events_screen_hides_heartbeats_and_filters_as_you_type() {
    let mut state = demo_state();
    state.push_change(
        "coordination.v1.Lease",
        EventKind::Updated,
        "lease renewed".into(),
    );
    state.push_change(
        "coordination.v1.Replica",
        EventKind::Updated,
        "report".into(),
    );
    state.push_change(
        "demo.v2.Album",
        EventKind::Created,
        "demo.v2.Album kind-of-blue".into(),
    );
    state.push_change(
        "demo.v2.Artist",
        EventKind::Updated,
        "demo.v2.Artist miles".into(),
    );
    state.screen = Screen::Events;
    let shown = |state: &State| {
        state
            .events
            .visible()
            .iter()
            .map(|line| line.text.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        shown(&state),
        vec!["demo.v2.Album kind-of-blue", "demo.v2.Artist miles"]
    );
    assert_eq!(state.events.hidden(), 2);
    key(&mut state, KeyCode::Char('h'));
    assert_eq!(shown(&state).len(), 4, "h shows the heartbeats");
    key(&mut state, KeyCode::Char('h'));
    keys(&mut state, "/album");
    assert_eq!(
        shown(&state),
        vec!["demo.v2.Album kind-of-blue"],
        "narrowed as you type"
    );
    key(&mut state, KeyCode::Enter);
    assert_eq!(state.events.filter, "album");
    key(&mut state, KeyCode::Esc);
    assert!(state.events.filter.is_empty(), "esc clears the filter");
    assert_eq!(shown(&state).len(), 2);
}

#[test]
fn ticks_move_the_clock_and_expire_messages() {
    let mut state = demo_state();
    state.flash("hello");
    update(
        &mut state,
        Msg::Tick(testing::now() + Duration::from_secs(2)),
    );
    assert!(state.flash.is_some());
    update(
        &mut state,
        Msg::Tick(testing::now() + Duration::from_secs(7)),
    );
    assert!(state.flash.is_none());
    assert_eq!(state.now, testing::now() + Duration::from_secs(7));
}

#[test]
fn the_cluster_report_updates_placement_and_keeps_data_when_unreachable() {
    let mut state = demo_state();
    update(
        &mut state,
        Msg::Cluster(Box::new(ClusterReport {
            status: Err("server 127.0.0.1:8503 unreachable".into()),
            members: None,
            nodes: Default::default(),
            controllers: None,
            denied: None,
            identity: None,
        })),
    );
    assert!(matches!(state.link, Link::Disconnected { .. }));
    assert!(
        state.cluster.members.is_some(),
        "the last members stay on screen"
    );
    assert!(state.cluster.placement.is_some());
    let status = state.cluster.status.clone().expect("kept");
    update(
        &mut state,
        Msg::Cluster(Box::new(ClusterReport {
            status: Ok(status),
            members: None,
            nodes: Default::default(),
            controllers: Some(Err("node 3: deadline exceeded".into())),
            denied: None,
            identity: Some(Ok(Some("jazzer".into()))),
        })),
    );
    assert_eq!(state.link, Link::Live);
    assert_eq!(
        state.cluster.placement_error.as_deref(),
        Some("node 3: deadline exceeded")
    );
}

#[test]
fn conditions_drive_the_attention_sort() {
    let mut state = demo_state();
    let gvk = "demo.v1.Concept";
    let failing = testing::with_status(
        resource(gvk, "default/jazz", "zz-failing", 2),
        "observer",
        "2",
        vec![testing::condition(
            "Seen",
            ConditionState::False,
            "Broken",
            "",
        )],
    );
    watch(&mut state, gvk, upsert(failing));
    open(&mut state, gvk);
    state.resources.sort = SortKey::Condition;
    state.prepare();
    assert_eq!(
        state.resources.rows.keys.first().map(|k| k.name.as_str()),
        Some("zz-failing")
    );
}

#[test]
fn l_on_the_cluster_screen_asks_before_moving_leadership() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('3'));
    assert_eq!(state.screen, Screen::Cluster);
    // The leader (node 1) is selected first: nothing to do.
    assert!(key(&mut state, KeyCode::Char('L')).is_empty());
    assert!(state.dialog.is_none());
    key(&mut state, KeyCode::Char('j'));
    assert!(key(&mut state, KeyCode::Char('L')).is_empty(), "asks first");
    assert!(matches!(
        state.dialog,
        Some(Dialog::ConfirmTransfer { node: 2, .. })
    ));
    let effects = key(&mut state, KeyCode::Char('y'));
    assert!(
        matches!(effects.as_slice(), [Effect::TransferLeader(2)]),
        "{effects:?}"
    );
    update(&mut state, Msg::Transferred(Ok(2)));
    // And esc leaves leadership alone.
    key(&mut state, KeyCode::Char('L'));
    assert!(state.dialog.is_some());
    assert!(key(&mut state, KeyCode::Esc).is_empty());
    assert!(state.dialog.is_none());
}

#[test]
fn giving_up_on_an_edit_keeps_the_users_text() {
    let mut state = demo_state();
    let codec = state.codec.clone().expect("codec");
    let resource = state
        .store
        .get("demo.v1.Executive")
        .and_then(|data| data.resources.values().next().cloned())
        .expect("an executive");
    let session = EditSession::new(&codec, &resource).expect("session");
    state.dialog = Some(Dialog::EditProblem {
        session: Box::new(session),
        problem: Problem::Rejected("data.salary: unknown field".into()),
    });
    assert!(key(&mut state, KeyCode::Esc).is_empty());
    let flash = state.flash.clone().expect("a message");
    let path = flash
        .text
        .split("your text is kept in ")
        .nth(1)
        .unwrap_or_else(|| panic!("no kept file in {:?}", flash.text))
        .to_owned();
    let kept = std::fs::read_to_string(&path).expect("the kept text");
    assert!(
        kept.contains("clive-davis") || kept.contains("name:"),
        "{kept}"
    );
    let _ = std::fs::remove_file(path);
}

/// A Type written while the dashboard runs makes it list the types again; a type new to it is
/// added and watched, the others keep their resources, and a type the server dropped goes.
#[test]
fn types_registered_while_running_are_learned_and_watched() {
    let mut state = demo_state();
    let with_registry = || {
        let mut types = testing::demo_types();
        types.push(testing::info(
            "registry",
            "v1",
            "Type",
            proto::cluster::v1::Scope::Cluster,
        ));
        types
    };
    state.store = Store::new(with_registry());
    state
        .store
        .get_mut("demo.v2.Artist")
        .expect("artists")
        .apply(upsert(resource(
            "demo.v2.Artist",
            "default/jazz",
            "miles-davis",
            5,
        )));
    for data in &mut state.store.types {
        data.apply(testing::end_of_snapshot("100"));
    }
    // A Type upserted after the first snapshot: list the types again.
    let effects = update(
        &mut state,
        Msg::Watch {
            gvk: "registry.v1.Type".into(),
            update: WatchUpdate::Event(upsert(resource(
                "registry.v1.Type",
                "",
                "payments-invoice",
                101,
            ))),
        },
    );
    assert!(
        matches!(effects.as_slice(), [Effect::RefreshTypes]),
        "{effects:?}"
    );
    let mut types = with_registry();
    types.retain(|info| info.r#type.as_ref().is_some_and(|t| t.kind != "Concept"));
    let mut invoice = testing::info(
        "payments",
        "v1",
        "Invoice",
        proto::cluster::v1::Scope::Namespace,
    );
    invoice.builtin = false;
    invoice.registered_by = "payments-invoice".into();
    types.push(invoice);
    let effects = update(
        &mut state,
        Msg::Types(Ok(ListTypesResponse {
            types,
            file_descriptor_set: proto::FILE_DESCRIPTOR_SET.to_vec().into(),
            next_page_token: String::new(),
        })),
    );
    match effects.as_slice() {
        [Effect::Watch(added)] => {
            assert_eq!(added.len(), 1);
            assert_eq!(added[0].registered_by, "payments-invoice");
        }
        other => panic!("expected a Watch of the new type, got {other:?}"),
    }
    assert!(state.store.get("payments.v1.Invoice").is_some());
    assert!(state.store.get("demo.v1.Concept").is_none(), "dropped");
    assert_eq!(
        state
            .store
            .get("demo.v2.Artist")
            .map(|data| data.resources.len()),
        Some(1),
        "kept with its resources"
    );
    let notices: Vec<&str> = state
        .events
        .lines
        .iter()
        .map(|line| line.text.as_str())
        .collect();
    assert!(
        notices
            .iter()
            .any(|text| text.contains("type payments.v1.Invoice registered")),
        "{notices:?}"
    );
}
