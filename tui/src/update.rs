//! `update(state, msg) -> effects`: the only place the dashboard's state changes. No I/O here;
//! what needs the network or the terminal comes back as an [`Effect`] for the runtime.
//!
//! One module per screen (as `view/` draws them), each exporting a [`Keys`]: how the keys that
//! mean something different on every screen (moving, enter, esc, the screen's own actions)
//! act there. [`keys_of`] is the registration; adding a screen touches its module and that
//! match. Dialogs and the input line have their own modules; every key goes through the keymap.

mod cluster;
mod dialogs;
mod events;
mod input;
mod resources;
mod snapshot;

use std::sync::Arc;
use std::time::Duration;

use crossterm::event::KeyEvent;
use proto::client::WatchUpdate;
use proto::client::describe;
use proto::client::edit::{EditOutcome, Round};
use proto::codec::{Codec, gvk};
use proto::resource::v1::watch_event::Event;

use crate::keymap::{self, Action, Scope};
use crate::model::Store;
use crate::msg::{Effect, Msg};
use crate::state::{Dialog, EventKind, Input, InputKind, Link, Screen, State};

/// What a screen does with the keys whose meaning depends on the screen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keys {
    /// ↑/↓, page up/down, home/end: move by `delta` rows (the events tail scrolls).
    pub move_by: fn(&mut State, isize),
    /// enter.
    pub open: fn(&mut State),
    /// esc.
    pub back: fn(&mut State),
    /// The actions of the screen's own keymap scopes; `false` when it has none for `action`.
    pub perform: fn(&mut State, Action, &mut Vec<Effect>) -> bool,
}

/// The registration: which module answers for which screen.
fn keys_of(screen: Screen) -> &'static Keys {
    match screen {
        Screen::Types => &resources::TYPES,
        Screen::Resources => &resources::TABLE,
        Screen::Detail => &resources::DETAIL,
        Screen::Tree => &resources::TREE,
        Screen::Cluster => &cluster::NODES,
        Screen::Controllers => &cluster::CONTROLLERS,
        Screen::Events => &events::EVENTS,
        Screen::Snapshot => &snapshot::SNAPSHOT,
    }
}

/// How long a footer message stays.
const FLASH_FOR: Duration = Duration::from_secs(6);

/// The type whose resources register the others.
const REGISTRY_TYPE: &str = "registry.v1.Type";

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
        Msg::Types(Ok(response)) if state.codec.is_some() => match Codec::new(response.clone()) {
            // A later list: types registered or deleted while the dashboard runs.
            Ok(codec) => {
                state.codec = Some(Arc::new(codec));
                let (added, gone) = state.store.merge(response.types);
                for info in &added {
                    let name = info.r#type.as_ref().map(gvk).unwrap_or_default();
                    state.push_event(EventKind::Notice, format!("type {name} registered"));
                }
                for name in gone {
                    state.push_event(EventKind::Notice, format!("type {name} is gone"));
                }
                if !added.is_empty() {
                    effects.push(Effect::Watch(added));
                }
            }
            Err(error) => state.types_error = Some(error.to_string()),
        },
        Msg::Types(Ok(response)) => match Codec::new(response.clone()) {
            Ok(codec) => {
                state.codec = Some(Arc::new(codec));
                state.types_error = None;
                state.store = Store::new(response.types.clone());
                effects.push(Effect::Watch(response.types));
                for command in std::mem::take(&mut state.start) {
                    input::run_command(state, &command);
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
        Msg::Watch { gvk, update } => {
            // A Type written or deleted after the first list: the server's types changed.
            let types_changed = gvk == REGISTRY_TYPE
                && state.store.get(&gvk).is_some_and(|data| data.synced)
                && matches!(
                    &update,
                    WatchUpdate::Event(event) if matches!(event.event, Some(Event::Upsert(_) | Event::Delete(_)))
                );
            events::on_watch(state, &gvk, update);
            if types_changed {
                effects.push(Effect::RefreshTypes);
            }
        }
        Msg::Cluster(report) => cluster::on_cluster(state, *report),
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
                "{label} marked for deletion; it goes once {} removed (w shows what holds it)",
                if finalizers == 1 {
                    "its finalizer is".to_owned()
                } else {
                    format!("its {finalizers} finalizers are")
                }
            )),
            Ok(()) => state.flash(format!("deleted {label}")),
            Err(error) => state.flash_error(format!("cannot delete {label}: {error}")),
        },
        Msg::Snapshot(msg) => snapshot::on_snapshot(state, msg, &mut effects),
        Msg::Transferred(result) => match result {
            Ok(leader) => state.flash(format!("node {leader} leads now")),
            Err(error) => state.flash_error(format!("leadership did not move: {error}")),
        },
        Msg::History { at, result } => {
            if state.detail.at.as_ref() == Some(&at)
                && let Some(pane) = state.detail.history.as_mut()
            {
                pane.selected = 0;
                pane.entries = Some(result);
            }
        }
    }
    effects
}

fn on_key(state: &mut State, key: KeyEvent, effects: &mut Vec<Effect>) {
    if key.kind == crossterm::event::KeyEventKind::Release {
        return;
    }
    if keymap::lookup(&key, &[Scope::Always]) == Some(Action::Interrupt) {
        // ctrl-c first closes the prompt or dialog that is open (as esc does); then it quits.
        if let Some(input) = state.input.take() {
            if input.kind == InputKind::Filter {
                state.resources.filter.clear();
            }
        } else if state.dialog.is_some() {
            dialogs::dismiss(state);
        } else {
            state.quit = true;
        }
        return;
    }
    if state.input.is_some() {
        input::on_input_key(state, key, effects);
        return;
    }
    if state.dialog.is_some() {
        dialogs::on_dialog_key(state, key, effects);
        return;
    }
    if let Some(action) = keymap::lookup(&key, &keymap::screen_scopes(state.screen)) {
        perform(state, action, effects);
    }
}

/// What the keys that mean the same everywhere do; the rest goes to the screen's [`Keys`].
fn perform(state: &mut State, action: Action, effects: &mut Vec<Effect>) {
    let keys = keys_of(state.screen);
    let page = state.page.max(1) as isize;
    match action {
        Action::Quit => state.quit = true,
        Action::Help => state.dialog = Some(Dialog::Help { scroll: 0 }),
        Action::CommandBar => {
            state.input = Some(Input {
                kind: InputKind::Command,
                text: String::new(),
            })
        }
        Action::Back => (keys.back)(state),
        Action::Up => (keys.move_by)(state, -1),
        Action::Down => (keys.move_by)(state, 1),
        Action::PageUp => (keys.move_by)(state, -page),
        Action::PageDown => (keys.move_by)(state, page),
        Action::Top => (keys.move_by)(state, isize::MIN / 2),
        Action::Bottom => (keys.move_by)(state, isize::MAX / 2),
        Action::Open => (keys.open)(state),
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
        action => {
            (keys.perform)(state, action, effects);
        }
    }
}

fn switch_to(state: &mut State, screen: Screen) {
    state.back.clear();
    state.screen = screen;
}

#[cfg(test)]
mod tests;
