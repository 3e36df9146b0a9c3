//! Every screen and dialog rendered on ratatui's `TestBackend` and compared with a snapshot
//! (`src/view/snapshots/`). Uids and clock times are masked; ages come from fixed uids and a
//! fixed clock, so they are stable.

use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use proto::client::edit::{EditSession, Problem};
use proto::cluster::v1::SnapshotHeader;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::Color;

use super::*;
use crate::msg::Msg;
use crate::state::{Choice, Dialog, EventKind, SnapshotInfo, SnapshotStep, VerifyRow};
use crate::testing::{self, demo_state, large_state};
use crate::update::update;

const WIDTH: u16 = 140;
const HEIGHT: u16 = 30;

fn draw(state: &mut State) -> Buffer {
    draw_at(state, WIDTH, HEIGHT)
}

fn draw_at(state: &mut State, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    state.page = page_rows(height);
    state.prepare();
    terminal.draw(|frame| render(state, frame)).expect("draws");
    terminal.backend().buffer().clone()
}

fn text(buffer: &Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in 0..area.height {
        let mut line = String::new();
        for x in 0..area.width {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn screen(state: &mut State) -> String {
    text(&draw(state))
}

macro_rules! snapshot {
    ($name:expr, $state:expr) => {{
        let rendered = screen($state);
        insta::with_settings!({filters => vec![
            (r"\b[0-9A-HJKMNP-TV-Z]{26}\b", "[uid]"),
            (r"\b\d{2}:\d{2}:\d{2}\b", "[time]"),
        ]}, {
            insta::assert_snapshot!($name, rendered);
        });
    }};
}

fn key(state: &mut State, code: KeyCode) {
    update(state, Msg::Key(KeyEvent::new(code, KeyModifiers::NONE)));
}

fn command(state: &mut State, text: &str) {
    key(state, KeyCode::Char(':'));
    for c in text.chars() {
        key(state, KeyCode::Char(c));
    }
    key(state, KeyCode::Enter);
}

/// Where on screen `needle` starts.
fn find(buffer: &Buffer, needle: &str) -> Option<(u16, u16)> {
    let rendered = text(buffer);
    rendered.lines().enumerate().find_map(|(y, line)| {
        line.find(needle)
            .map(|byte| (line[..byte].chars().count() as u16, y as u16))
    })
}

#[test]
fn types_screen() {
    snapshot!("types", &mut demo_state());
}

#[test]
fn types_screen_before_the_registry_is_read() {
    let mut state = State::new("127.0.0.1:8502", testing::now());
    snapshot!("types_connecting", &mut state);
    update(&mut state, Msg::Types(Err("server 127.0.0.1:8502 unreachable: connection refused (is `resd dev` … running there?)".into())));
    snapshot!("types_unreachable", &mut state);
}

#[test]
fn resources_table() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    snapshot!("resources_albums", &mut state);
    let buffer = draw(&mut state);
    // The deleting album is shown in magenta with its finalizer.
    let (x, y) = find(&buffer, "deleting: album-cleanup").expect("shown");
    assert_eq!(buffer[(x, y)].fg, Color::Magenta);
}

#[test]
fn resources_table_colours_conditions_and_marks_stale_status() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Artist");
    snapshot!("resources_artists", &mut state);
    let buffer = draw(&mut state);
    let (x, y) = find(&buffer, "Accepted=False").expect("shown");
    assert_eq!(buffer[(x, y)].fg, Color::Red);
    let (x, y) = find(&buffer, "Accepted=True").expect("shown");
    assert_eq!(buffer[(x, y)].fg, Color::Green);
    let (x, y) = find(&buffer, "Accepted=Unknown (stale)").expect("stale marked");
    assert_eq!(buffer[(x, y)].fg, Color::Yellow);
}

#[test]
fn resources_table_filtered_and_in_one_namespace() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    command(&mut state, "ns default/jazz");
    key(&mut state, KeyCode::Char('/'));
    key(&mut state, KeyCode::Char('b'));
    snapshot!("resources_filter_typing", &mut state);
    key(&mut state, KeyCode::Char('z'));
    key(&mut state, KeyCode::Enter);
    snapshot!("resources_filter_no_match", &mut state);
}

#[test]
fn resources_table_with_no_type_chosen() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('2'));
    snapshot!("resources_no_type", &mut state);
}

#[test]
fn ten_thousand_rows_render_one_screenful_around_the_selection() {
    let mut state = large_state(10_000);
    state.page = page_rows(HEIGHT);
    state.prepare();
    for _ in 0..200 {
        key(&mut state, KeyCode::PageDown);
        state.prepare();
    }
    key(&mut state, KeyCode::Up);
    snapshot!("resources_10k_scrolled", &mut state);
}

#[test]
fn detail_pane() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Artist");
    key(&mut state, KeyCode::Char('j'));
    state.prepare();
    key(&mut state, KeyCode::Enter);
    snapshot!("detail_artist", &mut state);
}

/// `v` opens the history beside the detail (reading it), ↓ picks an older version and shows
/// what it changed, `b` shows each field's blame, esc closes the pane, esc again goes back.
#[test]
fn detail_with_its_history_and_blame() {
    use proto::resource::v1::{HistoryEntry, history_entry::Operation};
    let mut state = demo_state();
    command(&mut state, "demo.v2.Artist");
    key(&mut state, KeyCode::Char('j'));
    state.prepare();
    key(&mut state, KeyCode::Enter);
    let at = state.detail.at.clone().expect("a resource in detail");
    let current = state.store.resource(&at).cloned().expect("stored");
    let effects = update(
        &mut state,
        Msg::Key(KeyEvent::new(KeyCode::Char('v'), KeyModifiers::NONE)),
    );
    assert!(
        effects
            .iter()
            .any(|effect| matches!(effect, crate::msg::Effect::History { .. })),
        "v reads the history"
    );
    assert!(screen(&mut state).contains("reading the history"));
    let mut older = current.clone();
    older.version = "3".into();
    older.metadata.insert("team".into(), "bebop".into());
    let entry = |resource: &proto::resource::v1::Resource, actor: &str, operation: Operation| {
        HistoryEntry {
            resource: Some(resource.clone()),
            actor: actor.into(),
            time: Some(prost_types::Timestamp {
                seconds: 1_795_262_700,
                nanos: 0,
            }),
            operation: operation as i32,
            version: resource.version.clone(),
        }
    };
    update(
        &mut state,
        Msg::History {
            at: at.clone(),
            result: Ok(vec![
                entry(&current, "alice", Operation::Write),
                entry(&older, "bob", Operation::Write),
            ]),
        },
    );
    let shown = screen(&mut state);
    assert!(
        shown.contains("History") && shown.contains("alice") && shown.contains("bob"),
        "{shown}"
    );
    assert!(
        shown.contains("metadata.team"),
        "the newest version's change: {shown}"
    );
    key(&mut state, KeyCode::Down);
    assert!(screen(&mut state).contains("the oldest version kept"));
    key(&mut state, KeyCode::Char('b'));
    let blamed = screen(&mut state);
    assert!(
        blamed.contains("Blame") && blamed.contains("data.name"),
        "{blamed}"
    );
    key(&mut state, KeyCode::Esc);
    assert!(state.detail.history.is_none(), "esc closes the pane");
    assert_eq!(state.screen, Screen::Detail);
    key(&mut state, KeyCode::Esc);
    assert_ne!(state.screen, Screen::Detail, "esc again goes back");
}

#[test]
fn detail_pane_of_a_resource_being_deleted() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    key(&mut state, KeyCode::Char('j'));
    key(&mut state, KeyCode::Char('j'));
    state.prepare();
    key(&mut state, KeyCode::Enter);
    snapshot!("detail_deleting_album", &mut state);
}

#[test]
fn owner_tree() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    key(&mut state, KeyCode::Char('o'));
    snapshot!("tree_from_album", &mut state);
}

#[test]
fn cluster_screen() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('3'));
    snapshot!("cluster", &mut state);
}

#[test]
fn a_member_catching_up_after_an_unclean_stop_says_it_serves_nothing() {
    let mut state = demo_state();
    if let Some(Ok(status)) = state.cluster.nodes.get_mut(&2) {
        status.ready = false;
        status.not_ready_reason = "catching up after an unclean stop: applied 10 of 42".into();
    }
    key(&mut state, KeyCode::Char('3'));
    let shown = screen(&mut state);
    assert!(shown.contains("not serving: catching up"), "{shown}");
}

#[test]
fn a_disk_under_its_reserve_is_shown_on_the_node_and_its_member_row() {
    let mut state = demo_state();
    let alarm = "the disk holding /var/lib/resd has 90.0 MiB free, below the reserve of 128.0 MiB: new writes are refused until space is freed";
    if let Some(status) = state.cluster.status.as_mut() {
        status.disk_free_bytes = 90 << 20;
        status.alarms = vec![alarm.into()];
    }
    if let Some(Ok(status)) = state.cluster.nodes.get_mut(&2) {
        status.alarms = vec![alarm.into()];
    }
    key(&mut state, KeyCode::Char('3'));
    let shown = screen(&mut state);
    assert!(
        shown.contains("disk 90.0 MiB free")
            && shown.contains("alarm")
            && shown.contains("below the reserve"),
        "{shown}"
    );
}

#[test]
fn cluster_screen_with_an_unreachable_member() {
    let mut state = demo_state();
    state.cluster.nodes.insert(
        3,
        Err("server 127.0.0.1:8504 unreachable: connection refused".into()),
    );
    key(&mut state, KeyCode::Char('3'));
    snapshot!("cluster_node_down", &mut state);
}

#[test]
fn members_that_cannot_be_asked_are_shown_with_their_age_and_no_health() {
    let mut state = demo_state();
    let since = state.now - Duration::from_secs(40);
    state.cluster.members_error = Some(("no raft leader is elected right now".into(), since));
    key(&mut state, KeyCode::Char('3'));
    let shown = screen(&mut state);
    assert!(shown.contains("as of 40s ago"), "{shown}");
    assert!(!shown.contains("healthy"), "{shown}");
    assert!(shown.contains("unknown"), "{shown}");
}

#[test]
fn at_80_by_24_the_cluster_and_placement_screens_show_whole_names_and_addresses() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('3'));
    let cluster = text(&draw_at(&mut state, 80, 24));
    for address in ["127.0.0.1:8502", "127.0.0.1:8503", "127.0.0.1:8504"] {
        assert!(cluster.contains(address), "{cluster}");
    }
    assert!(cluster.contains("healthy"), "{cluster}");
    key(&mut state, KeyCode::Char('4'));
    let placement = text(&draw_at(&mut state, 80, 24));
    for name in ["demo-album", "demo-artist", "namespace", "observer"] {
        assert!(
            placement.contains(&format!("{name} ")),
            "{name} is cut:\n{placement}"
        );
    }
}

#[test]
fn controllers_screen() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('4'));
    snapshot!("controllers", &mut state);
}

/// A controller outside the server: its row says which replica holds the lease, and the panel
/// lists every replica.
#[test]
fn controllers_screen_with_replicas_outside_the_server() {
    use proto::cluster::v1::{ControllerInfo, ExternalReplica, Placement};
    let mut state = demo_state();
    let mut listing = testing::demo_controllers();
    for (identity, holds) in [("invoices-a", true), ("invoices-b", false)] {
        listing.external.push(ExternalReplica {
            controller: Some(ControllerInfo {
                name: "invoices".into(),
                placement: Placement::Singleton as i32,
                running: holds,
                queue_depth: 2,
                reconciles_ok: 7,
                ..Default::default()
            }),
            identity: identity.into(),
            host: "host-1".into(),
            holds_lease: holds,
            ..Default::default()
        });
    }
    state.cluster.placement = Some(proto::client::placement::placement_map(&listing));
    key(&mut state, KeyCode::Char('4'));
    let screen = text(&draw(&mut state));
    assert!(
        screen.contains("● invoices-a leads") && screen.contains("external (2)"),
        "{screen}"
    );
    // Select it (external controllers sort after the built-in ones) and read the panel.
    for _ in 0..10 {
        key(&mut state, KeyCode::Down);
    }
    let screen = text(&draw(&mut state));
    assert!(
        screen.contains("replica invoices-b on host-1") && screen.contains("waiting for the lease"),
        "{screen}"
    );
}

#[test]
fn events_screen() {
    let mut state = demo_state();
    for (i, (kind, text)) in [
        (EventKind::Created, "demo.v1.Concept default/jazz/bebop v28"),
        (
            EventKind::Updated,
            "demo.v2.Album default/jazz/kind-of-blue v29 (deleting)",
        ),
        (
            EventKind::Deleted,
            "demo.v2.Album default/jazz/kind-of-blue v31 CleanedUp=True (deleting)",
        ),
        (
            EventKind::Notice,
            "disconnected: server unreachable; retrying every 0.4s at most",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        state.now = testing::now() + Duration::from_secs(i as u64);
        state.push_event(kind, text.into());
    }
    key(&mut state, KeyCode::Char('5'));
    snapshot!("events", &mut state);
    key(&mut state, KeyCode::Up);
    snapshot!("events_paused", &mut state);
}

#[test]
fn header_while_disconnected() {
    let mut state = demo_state();
    state.link = Link::Disconnected {
        error: "server 127.0.0.1:8503 unreachable".into(),
    };
    let rendered = screen(&mut state);
    let header = rendered.lines().next().unwrap_or_default();
    assert!(
        header.contains("◌ disconnected — retrying (server 127.0.0.1:8503 unreachable)"),
        "{header}"
    );
    assert!(
        rendered.contains("demo.v2.Album"),
        "the last data stays on screen"
    );
}

fn snapshot_info() -> SnapshotInfo {
    SnapshotInfo {
        path: "/tmp/resd.snap".into(),
        bytes: 7_300,
        header: SnapshotHeader {
            format_version: 1,
            raft_index: 34,
            created_at: Some(prost_types::Timestamp {
                seconds: 1_795_262_700,
                nanos: 0,
            }),
            counts: [
                ("demo.v2.Album".to_owned(), 4),
                ("demo.v2.Artist".to_owned(), 3),
                ("demo.v1.Concept".to_owned(), 2),
            ]
            .into_iter()
            .collect(),
            resource_count: 9,
            history_count: 0,
            sha256: "de21bad9bb0b772e3a2056a309b7e6bd345c54a6a71fee692e5033319d68b628".into(),
            body_bytes: 7_000,
            node_id: 2,
        },
    }
}

#[test]
fn snapshot_stepper() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('6'));
    snapshot!("snapshot_start", &mut state);
    key(&mut state, KeyCode::Char('s'));
    snapshot!("snapshot_path_prompt", &mut state);
    key(&mut state, KeyCode::Enter);
    state.snapshot = SnapshotStep::Saving {
        path: "/tmp/resd.snap".into(),
        written: 3_650,
        total: Some(7_300),
    };
    snapshot!("snapshot_saving", &mut state);
    state.snapshot = SnapshotStep::Inspect(Box::new(snapshot_info()));
    snapshot!("snapshot_inspect", &mut state);
    state.snapshot = SnapshotStep::Confirm {
        info: Box::new(snapshot_info()),
        choice: Choice::Cancel,
    };
    snapshot!("snapshot_confirm", &mut state);
    state.snapshot = SnapshotStep::Restoring {
        info: Box::new(snapshot_info()),
        sent: 7_300,
        total: 7_300,
    };
    snapshot!("snapshot_restoring", &mut state);
    state.snapshot = SnapshotStep::Verified {
        info: Box::new(snapshot_info()),
        restored_index: 40,
        rows: vec![
            VerifyRow {
                gvk: "demo.v2.Album".into(),
                expected: 4,
                actual: 4,
            },
            VerifyRow {
                gvk: "demo.v2.Artist".into(),
                expected: 3,
                actual: 2,
            },
        ],
    };
    snapshot!("snapshot_verified_with_difference", &mut state);
    state.snapshot = SnapshotStep::Failed {
        what: "save to /nope/resd.snap".into(),
        error: "cannot create a temporary file in /nope: No such file or directory (os error 2)"
            .into(),
        info: None,
    };
    snapshot!("snapshot_failed", &mut state);
}

#[test]
fn help_dialog_lists_the_keymap() {
    let mut state = demo_state();
    key(&mut state, KeyCode::Char('?'));
    snapshot!("help", &mut state);
}

#[test]
fn delete_dialog() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Artist");
    key(&mut state, KeyCode::Char('j'));
    state.prepare();
    key(&mut state, KeyCode::Char('d'));
    snapshot!("delete_artist", &mut state);
    key(&mut state, KeyCode::Esc);
    command(&mut state, "demo.v1.Executive");
    key(&mut state, KeyCode::Char('d'));
    key(&mut state, KeyCode::Right);
    snapshot!("delete_executive_confirm_highlighted", &mut state);
}

#[test]
fn why_stuck_dialog() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    key(&mut state, KeyCode::Char('j'));
    key(&mut state, KeyCode::Char('j'));
    state.prepare();
    key(&mut state, KeyCode::Char('w'));
    snapshot!("why_stuck_album", &mut state);
    // Without a running controller for the type, it says nothing will remove the finalizer.
    state.cluster.placement = Some(proto::client::placement::PlacementMap::default());
    snapshot!("why_stuck_no_controller", &mut state);
}

#[test]
fn edit_conflict_dialog() {
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
        problem: Problem::Conflict {
            changes:
                "- version: '6'\n+ version: '7'\n-   name: Clive Davis\n+   name: Clive J. Davis\n"
                    .into(),
            yours: "-   position: President\n+   position: Founder\n".into(),
            read_version: "6".into(),
            server_version: "7".into(),
        },
    });
    snapshot!("edit_conflict", &mut state);
}

#[test]
fn at_80_columns_name_keeps_its_width_and_less_important_columns_give_way() {
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    let rendered = text(&draw_at(&mut state, 80, 12));
    insta::assert_snapshot!("resources_albums_80_columns", rendered);
    // Every album name whole, and the condition column still there.
    for name in [
        "a-love-supreme",
        "abbey-road",
        "bitches-brew",
        "kind-of-blue",
    ] {
        assert!(rendered.contains(name), "{rendered}");
    }
    assert!(rendered.contains("CONDITION"), "{rendered}");
}

#[test]
fn a_small_terminal_still_draws() {
    let mut terminal = Terminal::new(TestBackend::new(30, 6)).expect("test terminal");
    let mut state = demo_state();
    command(&mut state, "demo.v2.Album");
    key(&mut state, KeyCode::Char('d'));
    state.page = page_rows(6);
    state.prepare();
    terminal.draw(|frame| render(&state, frame)).expect("draws");
}

/// `/` takes a selector over metadata, or text found in any column; a selector that does not
/// parse says why instead of showing nothing.
#[test]
fn the_filter_takes_a_selector_or_text_of_any_column() {
    let mut state = large_state(30);
    if let Some(data) = state.store.get_mut("demo.v1.Concept") {
        for i in [3usize, 4, 17] {
            let key = data
                .resources
                .keys()
                .find(|key| key.name == format!("concept-{i:05}"))
                .cloned()
                .expect("concept");
            let mut labelled = data.resources[&key].clone();
            labelled.metadata.insert(
                "team".into(),
                if i == 17 { "search" } else { "billing" }.into(),
            );
            labelled.version = format!("{}", 1000 + i);
            data.apply(testing::upsert(labelled));
        }
    }
    let filter = |state: &mut State, text: &str| {
        key(state, KeyCode::Char('/'));
        for c in text.chars() {
            key(state, KeyCode::Char(c));
        }
        key(state, KeyCode::Enter);
        state.prepare();
        let names: Vec<String> = state
            .resources
            .rows
            .keys
            .iter()
            .map(|key| key.name.clone())
            .collect();
        key(state, KeyCode::Esc);
        names
    };
    assert_eq!(
        filter(&mut state, "team=billing"),
        ["concept-00003", "concept-00004"]
    );
    assert_eq!(filter(&mut state, "team in (search)"), ["concept-00017"]);
    // Text: the version column (1017), and a condition's words.
    assert_eq!(filter(&mut state, "1017"), ["concept-00017"]);
    let seen = filter(&mut state, "seen");
    assert_eq!(seen.len(), 5, "every seventh concept has Seen: {seen:?}");
    // A selector that does not parse: the table says so.
    key(&mut state, KeyCode::Char('/'));
    for c in "team in (a".chars() {
        key(&mut state, KeyCode::Char(c));
    }
    key(&mut state, KeyCode::Enter);
    let shown = screen(&mut state);
    assert!(
        shown.contains("is no selector") && shown.contains("column 11"),
        "{shown}"
    );
}

/// While a listing arrives, what arrives is appended to the table (filtered, not re-sorted: the
/// server sends it in key order), so a batch costs what it brought, not a rebuild of every row;
/// the listing's end sorts once. A new filter applies to everything at once.
#[test]
fn a_listing_that_is_still_arriving_is_appended_then_sorted_once() {
    let mut state = large_state(0);
    let gvk = "demo.v1.Concept";
    state.resources.filter = "late".into();
    if let Some(data) = state.store.get_mut(gvk) {
        data.synced = false;
    }
    state.prepare();
    assert!(state.resources.rows.keys.is_empty());
    let arrive = |state: &mut State, names: &[&str]| {
        let data = state.store.get_mut(gvk).expect("type");
        for (i, name) in names.iter().enumerate() {
            data.apply(testing::upsert(testing::resource(
                gvk,
                "default/jazz",
                name,
                1000 + i as u64,
            )));
        }
    };
    let names = testing::row_names;
    arrive(&mut state, &["late-3", "late-1", "other"]);
    state.prepare();
    assert_eq!(
        names(&state),
        ["late-3", "late-1"],
        "appended as they came, filtered"
    );
    arrive(&mut state, &["late-2"]);
    state.prepare();
    assert_eq!(names(&state), ["late-3", "late-1", "late-2"]);
    // The listing completes: one rebuild, sorted.
    if let Some(data) = state.store.get_mut(gvk) {
        data.apply(testing::end_of_snapshot("2000"));
    }
    state.prepare();
    assert_eq!(names(&state), ["late-1", "late-2", "late-3"]);
    // A new filter is the user's: it applies at once, to every row.
    state.resources.filter = "late-2".into();
    state.prepare();
    assert_eq!(names(&state), ["late-2"]);
}

/// What the cluster holds was written by others: an escape sequence in a label (or any text)
/// never reaches the terminal (ratatui drops control characters from what it draws).
#[test]
fn control_characters_from_the_cluster_are_never_drawn() {
    let mut state = demo_state();
    let mut hostile = testing::resource("demo.v2.Artist", "default/jazz", "hostile", 200);
    hostile
        .metadata
        .insert("team".into(), "\u{1b}[2J\u{1b}[Hpwned\u{7}".into());
    if let Some(data) = state.store.get_mut("demo.v2.Artist") {
        data.apply(testing::upsert(hostile));
    }
    command(&mut state, "demo.v2.Artist");
    let drawn = text(&draw(&mut state));
    assert!(drawn.contains("hostile"), "{drawn}");
    assert!(
        !drawn.contains('\u{1b}') && !drawn.contains('\u{7}'),
        "{drawn}"
    );
}

/// A registered type's own columns show after NAME and TENANCY (DESIGN §15.1), and a deprecated
/// version says so in the table's title, in yellow.
#[test]
fn a_types_columns_and_its_deprecation_show_in_the_resource_table() {
    let mut state = demo_state();
    if let Some(data) = state.store.get_mut("demo.v2.Artist") {
        data.info.columns = vec![proto::registry::v1::Column {
            name: "Called".into(),
            json_path: ".data.name".into(),
            r#type: "string".into(),
        }];
        data.info.deprecated = true;
        data.info.deprecation_message = "demo.v2.Artist is deprecated: use v3".into();
    }
    command(&mut state, "demo.v2.Artist");
    let buffer = draw(&mut state);
    let (called, row) = find(&buffer, "CALLED").expect("the column's header");
    let (tenancy, _) = find(&buffer, "TENANCY").expect("TENANCY");
    let (version, _) = find(&buffer, "VERSION").expect("VERSION");
    assert!(
        tenancy < called && called < version,
        "after TENANCY, before VERSION"
    );
    assert!(
        text(&buffer)
            .lines()
            .skip(usize::from(row) + 1)
            .any(|line| line.contains("miles-davis") && line.contains("Miles Davis")),
        "the column holds each artist's name:\n{}",
        text(&buffer)
    );
    let (x, y) = find(&buffer, "demo.v2.Artist is deprecated: use v3").expect("the warning");
    assert_eq!(buffer[(x, y)].fg, Color::Yellow);
}

/// A quota at 80 % of a limit or more shows on the rows of the types it counts (DESIGN §17),
/// yellow, red once full; types it does not count show nothing.
#[test]
fn a_quota_near_its_limit_shows_on_the_types_it_counts() {
    let mut state = demo_state();
    let mut types = testing::demo_types();
    types.push(testing::info(
        "tenancy",
        "v1",
        "Quota",
        proto::cluster::v1::Scope::Any,
    ));
    let kept: Vec<_> = std::mem::take(&mut state.store.types);
    state.store = crate::model::Store::new(types);
    for old in kept {
        if let Some(data) = state.store.get_mut(&old.gvk.clone()) {
            *data = old;
        }
    }
    let mut quota = testing::resource("tenancy.v1.Quota", "default/jazz", "limits", 7);
    quota.data = Some(proto::to_any(&proto::tenancy::v1::Quota {
        hard: [
            ("count/demo.Artist".to_owned(), 20),
            ("count/demo.Concept".to_owned(), 10),
        ]
        .into(),
        used: [
            ("count/demo.Artist".to_owned(), 19),
            ("count/demo.Concept".to_owned(), 10),
        ]
        .into(),
    }));
    if let Some(data) = state.store.get_mut("tenancy.v1.Quota") {
        data.apply(testing::upsert(quota));
        data.apply(testing::end_of_snapshot("100"));
    }
    let buffer = draw(&mut state);
    let screen = text(&buffer);
    let row = |gvk: &str| {
        screen
            .lines()
            .find(|line| line.contains(gvk))
            .unwrap_or_default()
            .to_owned()
    };
    for gvk in ["demo.v1.Artist", "demo.v2.Artist"] {
        assert!(row(gvk).contains("quota 95%"), "{gvk}:\n{screen}");
    }
    assert!(row("demo.v1.Concept").contains("quota 100%"), "{screen}");
    assert!(!row("demo.v2.Album").contains("quota"), "{screen}");
    let (x, y) = find(&buffer, "quota 100%").expect("shown");
    assert_eq!(buffer[(x, y)].fg, Color::Red);
}
