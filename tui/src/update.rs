//! `update(state, msg) -> effects`: the only place the dashboard's state changes. No I/O here;
//! what needs the network or the terminal comes back as an [`Effect`] for the runtime.

use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use proto::client::WatchUpdate;
use proto::client::describe;
use proto::client::edit::{EditOutcome, EditSession, Round};
use proto::client::placement::placement_map;
use proto::codec::{Codec, gvk};
use proto::meta;
use proto::resource::v1::watch_event::Event;

use crate::clock;
use crate::keymap::{self, Action, Scope};
use crate::model::{Change, ResRef, Store};
use crate::msg::{ClusterReport, Effect, Msg, SnapshotMsg};
use crate::state::{
    Choice, Cursor, DeletePlan, Dialog, EventKind, Input, InputKind, Link, Screen, SnapshotPurpose,
    SnapshotStep, State, TenancyFilter, owner_tree,
};

/// How long a footer message stays.
const FLASH_FOR: Duration = Duration::from_secs(6);

pub fn update(state: &mut State, msg: Msg) -> Vec<Effect> {
    let mut effects = Vec::new();
    match msg {
        Msg::Key(key) => {
            state.prepare();
            on_key(state, key, &mut effects);
        }
        Msg::Resize => {}
        Msg::Tick(now) => {
            state.now = now;
            if let Some(flash) = &state.flash
                && now.duration_since(flash.at).unwrap_or_default() >= FLASH_FOR
            {
                state.flash = None;
            }
        }
        Msg::Types(Ok(response)) => match Codec::new(response.clone()) {
            Ok(codec) => {
                state.codec = Some(Arc::new(codec));
                state.types_error = None;
                state.store = Store::new(response.types.clone());
                effects.push(Effect::Watch(response.types));
                for command in std::mem::take(&mut state.start) {
                    run_command(state, &command);
                }
            }
            Err(error) => state.types_error = Some(error.to_string()),
        },
        Msg::Types(Err(error)) => {
            state.link = Link::Disconnected {
                error: error.clone(),
            };
            state.types_error = Some(error);
        }
        Msg::Watch { gvk, update } => on_watch(state, &gvk, update),
        Msg::Cluster(report) => on_cluster(state, *report),
        Msg::EditRound { session, result } => match result {
            Ok(Round::Done(EditOutcome::Saved(saved))) => {
                let label = saved
                    .id
                    .as_ref()
                    .map(describe::short_label)
                    .unwrap_or_default();
                state.flash(format!("saved {label} (version {})", saved.version));
            }
            Ok(Round::Done(EditOutcome::Unchanged)) => state.flash("no changes; nothing saved"),
            Ok(Round::Done(EditOutcome::Cancelled)) => {
                state.flash("edit cancelled (empty file); nothing saved")
            }
            Ok(Round::Problem(problem)) => {
                state.dialog = Some(Dialog::EditProblem { session, problem });
            }
            Err(error) => {
                state.dialog = Some(Dialog::Message {
                    title: format!("Edit of {} failed", session.label()),
                    text: format!("{error}\n\nNothing was saved."),
                });
            }
        },
        Msg::Deleted {
            label,
            finalizers,
            result,
        } => match result {
            Ok(()) if finalizers > 0 => state.flash(format!(
                "{label} marked for deletion; it goes once its {finalizers} finalizers are \
                 removed (w shows what holds it)"
            )),
            Ok(()) => state.flash(format!("deleted {label}")),
            Err(error) => state.flash_error(format!("cannot delete {label}: {error}")),
        },
        Msg::Snapshot(msg) => on_snapshot(state, msg, &mut effects),
        Msg::Transferred(result) => match result {
            Ok(leader) => state.flash(format!("node {leader} leads now")),
            Err(error) => state.flash_error(format!("leadership did not move: {error}")),
        },
    }
    effects
}

/// Asks before making the selected member the leader.
fn plan_transfer(state: &mut State) {
    let selected = state
        .cluster
        .members
        .as_ref()
        .and_then(|m| m.members.get(state.cluster_cursor.selected))
        .cloned();
    match selected {
        None => state.flash_error("select a member first"),
        Some(member) if member.leader => {
            state.flash(format!("node {} leads already", member.node_id))
        }
        Some(member) if !member.voter => state.flash_error(format!(
            "node {} is a learner; only voters can lead",
            member.node_id
        )),
        Some(member) => {
            state.dialog = Some(Dialog::ConfirmTransfer {
                node: member.node_id,
                api_addr: member.api_addr,
                choice: Choice::Cancel,
            })
        }
    }
}

fn on_watch(state: &mut State, gvk: &str, update: WatchUpdate) {
    match update {
        WatchUpdate::Event(event) => {
            if state.link != Link::Live {
                state.link = Link::Live;
            }
            let Some(data) = state.store.get_mut(gvk) else {
                return;
            };
            let relisted = data.relisting.is_some();
            // Only changes after the initial snapshot (or a relist) go to the tail; its line is
            // written before the event moves into the store (no copy of the resource).
            let text = if data.synced && !relisted {
                let text = match &event.event {
                    Some(Event::Upsert(upsert)) => upsert.resource.as_ref().map(event_text),
                    Some(Event::Delete(delete)) => delete.resource.as_ref().map(event_text),
                    _ => None,
                };
                // Who changed it, when the server recorded it.
                text.map(|text| match event.actor.as_str() {
                    "" => text,
                    actor => format!("{text}  by {actor}"),
                })
            } else {
                None
            };
            let change = data.apply(event);
            let count = data.resources.len();
            let kind = match change {
                Change::Created => EventKind::Created,
                Change::Updated => EventKind::Updated,
                Change::Deleted => EventKind::Deleted,
                Change::Synced if relisted => {
                    state.push_event(
                        EventKind::Notice,
                        format!("{gvk}: listed again ({count} resources)"),
                    );
                    return;
                }
                Change::Synced | Change::Nothing => return,
            };
            if let Some(text) = text {
                state.push_event(kind, text);
            }
        }
        WatchUpdate::Disconnected { error, retry_in } => {
            let text = format!(
                "disconnected: {error}; retrying every {:.1}s at most",
                retry_in.as_secs_f64().max(0.2)
            );
            state.link = Link::Disconnected { error };
            push_notice_once(state, text);
        }
        WatchUpdate::Resumed {
            since_version,
            server,
        } => {
            state.link = Link::Live;
            state.push_event(
                EventKind::Notice,
                format!("{gvk}: watch resumed after version {since_version} on {server}"),
            );
        }
        WatchUpdate::Relisting { reason } => {
            if let Some(data) = state.store.get_mut(gvk) {
                data.begin_relist();
            }
            push_notice_once(
                state,
                format!("watches cannot resume ({reason}); listing every type again"),
            );
        }
        WatchUpdate::Failed(error) => {
            let reason = match &error {
                proto::client::ClientError::PermissionDenied(missing) => {
                    format!("your token cannot read {gvk} ({missing})")
                }
                proto::client::ClientError::Unauthenticated(why) => format!(
                    "your token was refused ({why}); start the dashboard with another --token"
                ),
                other => other.to_string(),
            };
            let text = format!("{gvk}: the watch stopped: {reason}");
            if let Some(data) = state.store.get_mut(gvk) {
                data.failed = Some(reason);
            }
            state.push_event(EventKind::Notice, text);
        }
    }
}

/// The same notice from every watch (they all lose the server at once) is shown once.
fn push_notice_once(state: &mut State, text: String) {
    let repeated = state
        .events
        .iter()
        .rev()
        .take(32)
        .any(|line| line.kind == EventKind::Notice && line.text == text);
    if !repeated {
        state.push_event(EventKind::Notice, text);
    }
}

/// `demo.v2.Album default/jazz/kind-of-blue v12 Accepted=True`.
pub fn event_text(resource: &proto::resource::v1::Resource) -> String {
    let id = resource.id.clone().unwrap_or_default();
    let mut text = format!("{} v{}", describe::id_label(&id), resource.version);
    if let Some(condition) = describe::worst_condition(resource) {
        text.push(' ');
        text.push_str(&describe::condition_label(condition));
    }
    if meta::is_marked_for_deletion(resource) {
        text.push_str(" (deleting)");
    }
    text
}

fn on_cluster(state: &mut State, report: ClusterReport) {
    if let Some(Ok(identity)) = report.identity {
        state.cluster.identity = identity;
    }
    if report.denied.is_some() {
        // The server answers; this token may not see the cluster. Not a broken link.
        if state.cluster.denied != report.denied
            && let Some(denied) = &report.denied
        {
            state.push_event(EventKind::Notice, denied.clone());
        }
        state.cluster.denied = report.denied;
        if state.link != Link::Live {
            state.link = Link::Live;
        }
        return;
    }
    state.cluster.denied = None;
    match report.status {
        Ok(status) => {
            state.cluster.status = Some(status);
            if state.link != Link::Live {
                state.link = Link::Live;
            }
        }
        Err(error) => {
            if state.link
                != (Link::Disconnected {
                    error: error.clone(),
                })
            {
                push_notice_once(state, format!("disconnected: {error}"));
            }
            state.link = Link::Disconnected { error };
        }
    }
    if let Some(Ok(members)) = report.members {
        state.cluster.members = Some(members);
    }
    if !report.nodes.is_empty() {
        state.cluster.nodes = report.nodes;
    }
    match report.controllers {
        Some(Ok(listing)) => {
            state.cluster.placement = Some(placement_map(&listing));
            state.cluster.placement_error = None;
        }
        Some(Err(error)) => state.cluster.placement_error = Some(error),
        None => {}
    }
}

fn on_key(state: &mut State, key: KeyEvent, effects: &mut Vec<Effect>) {
    if key.kind == crossterm::event::KeyEventKind::Release {
        return;
    }
    if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
        // Like esc, ctrl-c first closes the prompt or dialog that is open; then it quits.
        let esc = KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE);
        if state.input.is_some() {
            on_input_key(state, esc, effects);
        } else if state.dialog.is_some() {
            on_dialog_key(state, esc, effects);
        } else {
            state.quit = true;
        }
        return;
    }
    if state.input.is_some() {
        on_input_key(state, key, effects);
        return;
    }
    if state.dialog.is_some() {
        on_dialog_key(state, key, effects);
        return;
    }
    if let Some(action) = keymap::lookup(&key, &keymap::screen_scopes(state.screen)) {
        perform(state, action, effects);
    }
}

fn perform(state: &mut State, action: Action, effects: &mut Vec<Effect>) {
    match action {
        Action::Quit => state.quit = true,
        Action::Help => state.dialog = Some(Dialog::Help { scroll: 0 }),
        Action::CommandBar => {
            state.input = Some(Input {
                kind: InputKind::Command,
                text: String::new(),
            })
        }
        Action::Filter => {
            state.input = Some(Input {
                kind: InputKind::Filter,
                text: state.filter.clone(),
            })
        }
        Action::Back => back(state),
        Action::Up => move_cursor(state, -1),
        Action::Down => move_cursor(state, 1),
        Action::PageUp => move_cursor(state, -(state.page.max(1) as isize)),
        Action::PageDown => move_cursor(state, state.page.max(1) as isize),
        Action::Top => move_cursor(state, isize::MIN / 2),
        Action::Bottom => move_cursor(state, isize::MAX / 2),
        Action::Open => open(state),
        Action::NextTab | Action::PrevTab => {
            let tabs = Screen::TABS;
            let at = tabs
                .iter()
                .position(|s| *s == state.screen.tab())
                .unwrap_or(0);
            let next = if action == Action::NextTab {
                (at + 1) % tabs.len()
            } else {
                (at + tabs.len() - 1) % tabs.len()
            };
            switch_to(state, tabs[next]);
        }
        Action::Tab(screen) => switch_to(state, screen),
        Action::Edit => start_edit(state, effects),
        Action::Delete => plan_delete(state),
        Action::TransferLeader => plan_transfer(state),
        Action::Tree => {
            let Some(at) = state.focused() else {
                state.flash_error("select a resource first");
                return;
            };
            open_tree(state, at);
        }
        Action::WhyStuck => {
            let Some((at, resource)) = state.focused_resource() else {
                state.flash_error("select a resource first");
                return;
            };
            if meta::is_marked_for_deletion(resource) {
                state.dialog = Some(Dialog::WhyStuck { at });
            } else {
                let label = state.label_of(&at);
                state.flash(format!(
                    "{label} is not being deleted: nothing holds it (d deletes it)"
                ));
            }
        }
        Action::Sort => {
            state.sort = state.sort.next();
            state.flash(format!("sorted by {}", state.sort.label()));
        }
        Action::ReverseSort => {
            state.descending = !state.descending;
            let order = if state.descending {
                "descending"
            } else {
                "ascending"
            };
            state.flash(format!("sorted by {}, {order}", state.sort.label()));
        }
        Action::NextTenancy => {
            state.tenancy = next_tenancy(&state.store, &state.tenancy);
            state.flash(format!("showing {}", state.tenancy.label()));
        }
        Action::SnapshotSave => match &state.snapshot {
            SnapshotStep::Saving { .. }
            | SnapshotStep::Opening { .. }
            | SnapshotStep::Restoring { .. }
            | SnapshotStep::Verifying { .. } => {
                state.flash_error("a snapshot step is under way; esc cancels it")
            }
            _ => {
                state.input = Some(Input {
                    kind: InputKind::SnapshotPath(SnapshotPurpose::Save),
                    text: format!("resd-{}.snap", clock::file_stamp(state.now)),
                })
            }
        },
        Action::SnapshotOpen => match &state.snapshot {
            SnapshotStep::Saving { .. }
            | SnapshotStep::Opening { .. }
            | SnapshotStep::Restoring { .. }
            | SnapshotStep::Verifying { .. } => {
                state.flash_error("a snapshot step is under way; esc cancels it")
            }
            step => {
                let text = snapshot_info(step)
                    .map(|info| info.path.display().to_string())
                    .unwrap_or_default();
                state.input = Some(Input {
                    kind: InputKind::SnapshotPath(SnapshotPurpose::Open),
                    text,
                });
            }
        },
        Action::SnapshotRestore => match &state.snapshot {
            SnapshotStep::Inspect(info)
            | SnapshotStep::Verified { info, .. }
            | SnapshotStep::Failed {
                info: Some(info), ..
            } => {
                state.snapshot = SnapshotStep::Confirm {
                    info: info.clone(),
                    choice: Choice::Cancel,
                };
            }
            _ => state.flash_error("save or open a snapshot first (s or o), then r restores it"),
        },
        Action::Toggle => {
            if let SnapshotStep::Confirm { choice, .. } = &mut state.snapshot {
                *choice = choice.toggled();
            }
        }
        Action::Choose | Action::Yes => {
            if let SnapshotStep::Confirm { info, choice } = &state.snapshot {
                if action == Action::Yes || *choice == Choice::Confirm {
                    let path = info.path.clone();
                    state.snapshot = SnapshotStep::Restoring {
                        total: info.bytes,
                        info: info.clone(),
                        sent: 0,
                    };
                    effects.push(Effect::SnapshotRestore(path));
                } else {
                    state.snapshot = SnapshotStep::Inspect(info.clone());
                }
            }
        }
        Action::Cancel => cancel_snapshot_step(state, effects),
    }
}

fn snapshot_info(step: &SnapshotStep) -> Option<&crate::state::SnapshotInfo> {
    match step {
        SnapshotStep::Inspect(info)
        | SnapshotStep::Confirm { info, .. }
        | SnapshotStep::Restoring { info, .. }
        | SnapshotStep::Verifying { info, .. }
        | SnapshotStep::Verified { info, .. }
        | SnapshotStep::Failed {
            info: Some(info), ..
        } => Some(info),
        _ => None,
    }
}

fn cancel_snapshot_step(state: &mut State, effects: &mut Vec<Effect>) {
    let step = std::mem::replace(&mut state.snapshot, SnapshotStep::Start);
    state.snapshot = match step {
        SnapshotStep::Saving { path, .. } => {
            effects.push(Effect::SnapshotCancel);
            state.flash(format!(
                "save cancelled; nothing was written to {}",
                path.display()
            ));
            SnapshotStep::Start
        }
        SnapshotStep::Opening { .. } => {
            effects.push(Effect::SnapshotCancel);
            SnapshotStep::Start
        }
        SnapshotStep::Restoring { info, .. } => {
            effects.push(Effect::SnapshotCancel);
            SnapshotStep::Failed {
                what: "restore".into(),
                error: "cancelled: the upload was stopped before the server committed it, so \
                        the cluster keeps its state (check the counts on the Types screen)"
                    .into(),
                info: Some(info),
            }
        }
        SnapshotStep::Confirm { info, .. } => SnapshotStep::Inspect(info),
        SnapshotStep::Verifying { info, .. } => {
            effects.push(Effect::SnapshotCancel);
            SnapshotStep::Inspect(info)
        }
        SnapshotStep::Start
        | SnapshotStep::Inspect(_)
        | SnapshotStep::Verified { .. }
        | SnapshotStep::Failed { .. } => SnapshotStep::Start,
    };
}

fn back(state: &mut State) {
    match state.screen {
        Screen::Detail | Screen::Tree => {
            state.screen = state.back.pop().unwrap_or(Screen::Resources);
        }
        Screen::Resources if !state.filter.is_empty() => {
            state.filter.clear();
            state.flash("filter cleared");
        }
        Screen::Resources => state.screen = Screen::Types,
        Screen::Events => state.events_scroll = 0,
        _ => {}
    }
}

fn switch_to(state: &mut State, screen: Screen) {
    state.back.clear();
    state.screen = screen;
}

fn move_cursor(state: &mut State, delta: isize) {
    match state.screen {
        Screen::Types => {
            state.types_cursor = state.types_cursor.moved(delta, state.store.types.len());
        }
        Screen::Resources => {
            state.resource_cursor = state.resource_cursor.moved(delta, state.rows.keys.len());
            state.selected = state.rows.keys.get(state.resource_cursor.selected).cloned();
        }
        Screen::Detail => {
            let scroll = (i64::from(state.detail_scroll) + delta as i64).clamp(0, 10_000);
            state.detail_scroll = scroll as u16;
        }
        Screen::Tree => state.tree_cursor = state.tree_cursor.moved(delta, state.tree.len()),
        Screen::Cluster => {
            let len = state
                .cluster
                .members
                .as_ref()
                .map_or(0, |m| m.members.len());
            state.cluster_cursor = state.cluster_cursor.moved(delta, len);
        }
        Screen::Controllers => {
            let len = state
                .cluster
                .placement
                .as_ref()
                .map_or(0, |p| p.controllers.len());
            state.controllers_cursor = state.controllers_cursor.moved(delta, len);
        }
        Screen::Events => {
            // Up reads back in time; down (or G) comes back to the live tail.
            let scroll = state.events_scroll as isize - delta;
            state.events_scroll = scroll.clamp(0, state.events.len() as isize) as usize;
        }
        Screen::Snapshot => {}
    }
}

fn open(state: &mut State) {
    match state.screen {
        Screen::Types => {
            if let Some(data) = state.store.types.get(state.types_cursor.selected) {
                let gvk = data.gvk.clone();
                open_type(state, gvk);
            }
        }
        Screen::Resources | Screen::Tree => {
            if let Some(at) = state.focused() {
                state.back.push(state.screen);
                state.detail = Some(at);
                state.detail_scroll = 0;
                state.screen = Screen::Detail;
            }
        }
        _ => {}
    }
}

fn open_type(state: &mut State, gvk: String) {
    if state.current_type.as_deref() != Some(gvk.as_str()) {
        state.current_type = Some(gvk.clone());
        state.resource_cursor = Cursor::default();
        state.selected = None;
        state.filter.clear();
    }
    if let Some(at) = state.store.position(&gvk) {
        state.types_cursor.selected = at;
    }
    switch_to(state, Screen::Resources);
}

fn open_tree(state: &mut State, at: ResRef) {
    state.tree = owner_tree(&state.store, &at);
    state.tree_cursor = Cursor::default();
    state.tree_cursor.selected = state.tree.iter().position(|line| line.focus).unwrap_or(0);
    state.tree_focus = Some(at);
    if state.screen != Screen::Tree {
        state.back.push(state.screen);
    }
    state.screen = Screen::Tree;
}

fn start_edit(state: &mut State, effects: &mut Vec<Effect>) {
    match state.focused() {
        Some(at) => edit(state, at, effects),
        None => state.flash_error("select a resource first"),
    }
}

fn edit(state: &mut State, at: ResRef, effects: &mut Vec<Effect>) {
    let Some(resource) = state.store.resource(&at) else {
        state.flash_error(format!("{} is gone; nothing to edit", state.label_of(&at)));
        return;
    };
    let Some(codec) = state.codec.clone() else {
        state.flash_error("the type registry has not been read yet; try again in a moment");
        return;
    };
    match EditSession::new(&codec, resource) {
        Ok(session) => effects.push(Effect::Edit(Box::new(session))),
        Err(error) => {
            let label = state.label_of(&at);
            state.flash_error(format!("cannot edit {label}: {error}"));
        }
    }
}

/// What a delete of the focused resource would run into, for the confirmation dialog.
fn plan_delete(state: &mut State) {
    let Some((at, resource)) = state.focused_resource() else {
        state.flash_error("select a resource first");
        return;
    };
    if meta::is_marked_for_deletion(resource) {
        state.dialog = Some(Dialog::WhyStuck { at });
        state.flash("already marked for deletion; this is what holds it");
        return;
    }
    let id = resource.id.clone().unwrap_or_default();
    let children = state
        .store
        .children(resource)
        .iter()
        .map(|child| state.label_of(child))
        .collect();
    let finalizers: Vec<String> = meta::finalizers(resource)
        .into_iter()
        .map(str::to_owned)
        .collect();
    let (controllers, unowned) = state
        .cluster
        .placement
        .as_ref()
        .map(|map| map.release_labels(&finalizers))
        .unwrap_or_default();
    let plan = DeletePlan {
        label: describe::id_label(&id),
        version: resource.version.clone(),
        id,
        at,
        finalizers,
        children,
        controllers,
        unowned,
        choice: Choice::Cancel,
    };
    state.dialog = Some(Dialog::ConfirmDelete(Box::new(plan)));
}

fn next_tenancy(store: &Store, current: &TenancyFilter) -> TenancyFilter {
    let mut cycle = vec![TenancyFilter::All];
    let tenancies = store.tenancies();
    let mut partitions: Vec<&String> = tenancies.iter().map(|(p, _)| p).collect();
    partitions.dedup();
    for partition in partitions {
        cycle.push(TenancyFilter::Partition(partition.clone()));
        for (p, namespace) in &tenancies {
            if p == partition && !namespace.is_empty() {
                cycle.push(TenancyFilter::Namespace {
                    partition: p.clone(),
                    namespace: namespace.clone(),
                });
            }
        }
    }
    let at = cycle.iter().position(|t| t == current);
    match at {
        Some(at) => cycle[(at + 1) % cycle.len()].clone(),
        None => TenancyFilter::All,
    }
}

fn on_input_key(state: &mut State, key: KeyEvent, effects: &mut Vec<Effect>) {
    let Some(mut input) = state.input.take() else {
        return;
    };
    let control = key.modifiers.contains(KeyModifiers::CONTROL);
    match key.code {
        KeyCode::Esc => {
            if input.kind == InputKind::Filter {
                state.filter.clear();
            }
            return;
        }
        KeyCode::Enter => {
            submit_input(state, input, effects);
            return;
        }
        KeyCode::Backspace => {
            input.text.pop();
        }
        KeyCode::Char('u') if control => input.text.clear(),
        KeyCode::Char(c) if !control && !key.modifiers.contains(KeyModifiers::ALT) => {
            input.text.push(c);
        }
        _ => {}
    }
    if input.kind == InputKind::Filter {
        state.filter = input.text.clone();
    }
    state.input = Some(input);
}

fn submit_input(state: &mut State, input: Input, effects: &mut Vec<Effect>) {
    let text = input.text.trim().to_owned();
    match input.kind {
        InputKind::Filter => {
            state.filter = text;
        }
        InputKind::Command => run_command(state, &text),
        InputKind::SnapshotPath(purpose) => {
            if text.is_empty() {
                state.flash_error("no file name given; nothing done");
                return;
            }
            let path = std::path::PathBuf::from(text);
            match purpose {
                SnapshotPurpose::Save => {
                    state.snapshot = SnapshotStep::Saving {
                        path: path.clone(),
                        written: 0,
                        total: None,
                    };
                    effects.push(Effect::SnapshotSave(path));
                }
                SnapshotPurpose::Open => {
                    state.snapshot = SnapshotStep::Opening { path: path.clone() };
                    effects.push(Effect::SnapshotOpen(path));
                }
            }
        }
    }
}

/// `:` commands: a screen name, `ns …`, `q`, or a type to open.
fn run_command(state: &mut State, text: &str) {
    let (word, rest) = text
        .split_once(char::is_whitespace)
        .map_or((text, ""), |(w, r)| (w, r.trim()));
    let screen = match word {
        "" => return,
        "q" | "quit" | "exit" => {
            state.quit = true;
            return;
        }
        "help" | "?" => {
            state.dialog = Some(Dialog::Help { scroll: 0 });
            return;
        }
        "types" | "t" => Some(Screen::Types),
        "resources" | "res" | "r" => Some(Screen::Resources),
        "cluster" | "nodes" | "members" => Some(Screen::Cluster),
        "controllers" | "ctrl" | "placement" => Some(Screen::Controllers),
        "events" | "ev" => Some(Screen::Events),
        "snapshot" | "snap" => Some(Screen::Snapshot),
        "ns" | "tenancy" => {
            state.tenancy = match rest {
                "" | "all" | "*" => TenancyFilter::All,
                _ => match rest.split_once('/') {
                    Some((partition, namespace)) => TenancyFilter::Namespace {
                        partition: partition.to_owned(),
                        namespace: namespace.to_owned(),
                    },
                    None => TenancyFilter::Partition(rest.to_owned()),
                },
            };
            state.flash(format!("showing {}", state.tenancy.label()));
            return;
        }
        _ => None,
    };
    if let Some(screen) = screen {
        switch_to(state, screen);
        return;
    }
    let Some(codec) = state.codec.clone() else {
        state.flash_error("the type registry has not been read yet; try again in a moment");
        return;
    };
    match codec.resolve_type(text) {
        Ok(info) => {
            let gvk = info.r#type.as_ref().map(gvk).unwrap_or_default();
            open_type(state, gvk);
        }
        Err(error) => state.flash_error(format!(
            "{}; try a kind (Executive), group.version.Kind, or a screen (types, cluster, \
             controllers, events, snapshot)",
            error.message
        )),
    }
}

fn on_dialog_key(state: &mut State, key: KeyEvent, effects: &mut Vec<Effect>) {
    let Some(dialog) = state.dialog.take() else {
        return;
    };
    match dialog {
        Dialog::Help { scroll } => {
            let scroll = match keymap::lookup(&key, &[Scope::List]) {
                Some(Action::Up) => scroll.saturating_sub(1),
                Some(Action::Down) => scroll.saturating_add(1),
                Some(Action::PageUp) => scroll.saturating_sub(10),
                Some(Action::PageDown) => scroll.saturating_add(10),
                Some(Action::Top) => 0,
                _ if matches!(
                    key.code,
                    KeyCode::Esc | KeyCode::Char('q' | '?') | KeyCode::Enter
                ) =>
                {
                    return;
                }
                _ => scroll,
            };
            state.dialog = Some(Dialog::Help { scroll });
        }
        Dialog::ConfirmDelete(mut plan) => match keymap::lookup(&key, &[Scope::Dialog]) {
            Some(Action::Toggle) => {
                plan.choice = plan.choice.toggled();
                state.dialog = Some(Dialog::ConfirmDelete(plan));
            }
            Some(Action::Choose) if plan.choice == Choice::Cancel => state.flash("not deleted"),
            Some(Action::Choose | Action::Yes) => {
                state.flash(format!("deleting {}…", plan.label));
                effects.push(Effect::Delete {
                    id: plan.id.clone(),
                    version: plan.version.clone(),
                    label: plan.label.clone(),
                    finalizers: plan.finalizers.len(),
                });
            }
            Some(Action::Cancel) => state.flash("not deleted"),
            _ => state.dialog = Some(Dialog::ConfirmDelete(plan)),
        },
        Dialog::ConfirmTransfer {
            node,
            api_addr,
            choice,
        } => match keymap::lookup(&key, &[Scope::Dialog]) {
            Some(Action::Toggle) => {
                state.dialog = Some(Dialog::ConfirmTransfer {
                    node,
                    api_addr,
                    choice: choice.toggled(),
                });
            }
            Some(Action::Choose) if choice == Choice::Cancel => state.flash("leadership unchanged"),
            Some(Action::Choose | Action::Yes) => {
                state.flash(format!("handing leadership to node {node}…"));
                effects.push(Effect::TransferLeader(node));
            }
            Some(Action::Cancel) => state.flash("leadership unchanged"),
            _ => {
                state.dialog = Some(Dialog::ConfirmTransfer {
                    node,
                    api_addr,
                    choice,
                })
            }
        },
        Dialog::WhyStuck { at } => match key.code {
            // Removing a finalizer by hand is an edit.
            KeyCode::Char('e') => edit(state, at, effects),
            KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q' | 'w' | 'n') => {}
            _ => state.dialog = Some(Dialog::WhyStuck { at }),
        },
        Dialog::EditProblem { session, problem } => {
            match keymap::lookup(&key, &[Scope::EditProblem]) {
                Some(Action::Edit) => effects.push(Effect::Edit(session)),
                Some(Action::Cancel) => {
                    // Never throw the user's text away: keep it in a file and say where.
                    match proto::client::edit::keep_edit(session.label(), session.body()) {
                        Some(path) => state.flash(format!(
                            "edit abandoned; nothing saved; your text is kept in {}",
                            path.display()
                        )),
                        None => state.flash("edit abandoned; nothing saved"),
                    }
                }
                _ => state.dialog = Some(Dialog::EditProblem { session, problem }),
            }
        }
        Dialog::Message { title, text } => {
            if !matches!(key.code, KeyCode::Esc | KeyCode::Enter | KeyCode::Char('q')) {
                state.dialog = Some(Dialog::Message { title, text });
            }
        }
    }
}

fn on_snapshot(state: &mut State, msg: SnapshotMsg, effects: &mut Vec<Effect>) {
    let step = std::mem::replace(&mut state.snapshot, SnapshotStep::Start);
    state.snapshot = match (step, msg) {
        (SnapshotStep::Saving { path, .. }, SnapshotMsg::SaveProgress { written, total }) => {
            SnapshotStep::Saving {
                path,
                written,
                total,
            }
        }
        (SnapshotStep::Saving { .. }, SnapshotMsg::Saved(Ok(info))) => {
            state.flash(format!(
                "saved {} ({} resources)",
                info.path.display(),
                info.header.resource_count
            ));
            SnapshotStep::Inspect(Box::new(info))
        }
        (SnapshotStep::Saving { path, .. }, SnapshotMsg::Saved(Err(error))) => {
            SnapshotStep::Failed {
                what: format!("save to {}", path.display()),
                error,
                info: None,
            }
        }
        (SnapshotStep::Opening { .. }, SnapshotMsg::Opened(Ok(info))) => {
            SnapshotStep::Inspect(Box::new(info))
        }
        (SnapshotStep::Opening { path }, SnapshotMsg::Opened(Err(error))) => SnapshotStep::Failed {
            what: format!("open {}", path.display()),
            error,
            info: None,
        },
        (SnapshotStep::Restoring { info, .. }, SnapshotMsg::RestoreProgress { sent, total }) => {
            SnapshotStep::Restoring { info, sent, total }
        }
        (SnapshotStep::Restoring { info, .. }, SnapshotMsg::Restored(Ok(restored_index))) => {
            effects.push(Effect::SnapshotVerify(info.counts()));
            SnapshotStep::Verifying {
                info,
                restored_index,
            }
        }
        (SnapshotStep::Restoring { info, .. }, SnapshotMsg::Restored(Err(error))) => {
            SnapshotStep::Failed {
                what: "restore".into(),
                error,
                info: Some(info),
            }
        }
        (
            SnapshotStep::Verifying {
                info,
                restored_index,
            },
            SnapshotMsg::Verified(Ok(rows)),
        ) => SnapshotStep::Verified {
            info,
            restored_index,
            rows,
        },
        (SnapshotStep::Verifying { info, .. }, SnapshotMsg::Verified(Err(error))) => {
            SnapshotStep::Failed {
                what: "verify the restored counts".into(),
                error,
                info: Some(info),
            }
        }
        // A late message from a step that was cancelled: nothing to do.
        (step, _) => step,
    };
}

#[cfg(test)]
mod tests;
