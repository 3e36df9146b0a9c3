//! The resource screens: types, the resource table, a resource's detail and its owner tree,
//! and what can be done to the resource in focus (edit, delete, tree, why stuck).

use proto::client::describe;
use proto::client::edit::EditSession;
use proto::meta;

use super::{Keys, switch_to};
use crate::keymap::Action;
use crate::model::{ResRef, Store};
use crate::msg::Effect;
use crate::state::{
    Choice, Cursor, DeletePlan, Dialog, Input, InputKind, Screen, State, TenancyFilter, owner_tree,
};

pub(super) const TYPES: Keys = Keys {
    move_by: |state, delta| {
        state.types.cursor = state.types.cursor.moved(delta, state.store.types.len());
    },
    open: |state| {
        if let Some(data) = state.store.types.get(state.types.cursor.selected) {
            let gvk = data.gvk.clone();
            open_type(state, gvk);
        }
    },
    back: |_| {},
    perform: |_, _, _| false,
};

pub(super) const TABLE: Keys = Keys {
    move_by: |state, delta| {
        state.resources.cursor = state
            .resources
            .cursor
            .moved(delta, state.resources.rows.keys.len());
        state.resources.select_at_cursor();
    },
    open: open_detail,
    back: |state| {
        if state.resources.filter.is_empty() {
            state.screen = Screen::Types;
        } else {
            state.resources.filter.clear();
            state.flash("filter cleared");
        }
    },
    perform: |state, action, effects| match action {
        Action::Filter => {
            state.input = Some(Input {
                kind: InputKind::Filter,
                text: state.resources.filter.clone(),
            });
            true
        }
        Action::Sort => {
            state.resources.sort = state.resources.sort.next();
            state.flash(format!("sorted by {}", state.resources.sort.label()));
            true
        }
        Action::ReverseSort => {
            state.resources.descending = !state.resources.descending;
            let order = if state.resources.descending {
                "descending"
            } else {
                "ascending"
            };
            state.flash(format!(
                "sorted by {}, {order}",
                state.resources.sort.label()
            ));
            true
        }
        Action::NextTenancy => {
            state.resources.tenancy = next_tenancy(&state.store, &state.resources.tenancy);
            state.flash(format!("showing {}", state.resources.tenancy.label()));
            true
        }
        action => on_focused(state, action, effects),
    },
};

pub(super) const DETAIL: Keys = Keys {
    move_by: |state, delta| {
        // With the history open, ↑↓ pick a version (↑ newer); otherwise they scroll.
        if let Some(pane) = state.detail.history.as_mut()
            && let Some(Ok(entries)) = &pane.entries
            && !pane.blame
        {
            let last = entries.len().saturating_sub(1) as isize;
            pane.selected = (pane.selected as isize + delta).clamp(0, last) as usize;
            return;
        }
        let scroll = (i64::from(state.detail.scroll) + delta as i64).clamp(0, 10_000);
        state.detail.scroll = scroll as u16;
    },
    open: |_| {},
    back: |state| {
        if state.detail.history.take().is_none() {
            go_back(state);
        }
    },
    perform: |state, action, effects| match action {
        Action::History => {
            toggle_history(state, effects);
            true
        }
        Action::Blame => {
            if state.detail.history.is_none() {
                toggle_history(state, effects);
            }
            if let Some(pane) = state.detail.history.as_mut() {
                pane.blame = !pane.blame;
            }
            true
        }
        other => on_focused(state, other, effects),
    },
};

/// Opens the detail's history pane (reading the history) or closes it.
fn toggle_history(state: &mut State, effects: &mut Vec<Effect>) {
    if state.detail.history.take().is_some() {
        return;
    }
    let Some(at) = state.detail.at.clone() else {
        return;
    };
    let Some(id) = state.store.resource(&at).and_then(|r| r.id.clone()) else {
        state.flash_error(format!(
            "{} is gone: no history to show",
            state.label_of(&at)
        ));
        return;
    };
    state.detail.history = Some(crate::state::HistoryPane::default());
    effects.push(Effect::History { at, id });
}

pub(super) const TREE: Keys = Keys {
    move_by: |state, delta| {
        state.tree.cursor = state.tree.cursor.moved(delta, state.tree.lines.len());
    },
    open: open_detail,
    back: go_back,
    perform: on_focused,
};

/// Detail and Tree go back where they were opened from.
fn go_back(state: &mut State) {
    state.screen = state.back.pop().unwrap_or(Screen::Resources);
}

fn open_detail(state: &mut State) {
    if let Some(at) = state.focused() {
        state.back.push(state.screen);
        state.detail.at = Some(at);
        state.detail.scroll = 0;
        state.detail.history = None;
        state.screen = Screen::Detail;
    }
}

/// What can be done to the resource in focus, on every resource screen.
fn on_focused(state: &mut State, action: Action, effects: &mut Vec<Effect>) -> bool {
    match action {
        Action::Edit => start_edit(state, effects),
        Action::Delete => plan_delete(state),
        Action::Tree => {
            let Some(at) = state.focused() else {
                state.flash_error("select a resource first");
                return true;
            };
            open_tree(state, at);
        }
        Action::WhyStuck => {
            let Some((at, resource)) = state.focused_resource() else {
                state.flash_error("select a resource first");
                return true;
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
        _ => return false,
    }
    true
}

pub(super) fn open_type(state: &mut State, gvk: String) {
    if state.resources.current_type.as_deref() != Some(gvk.as_str()) {
        state.resources.current_type = Some(gvk.clone());
        state.resources.cursor = Cursor::default();
        state.resources.selected = None;
        state.resources.filter.clear();
    }
    if let Some(at) = state.store.position(&gvk) {
        state.types.cursor.selected = at;
    }
    switch_to(state, Screen::Resources);
}

pub(super) fn open_tree(state: &mut State, at: ResRef) {
    state.tree.lines = owner_tree(&state.store, &at);
    state.tree.cursor = Cursor::default();
    state.tree.cursor.selected = state
        .tree
        .lines
        .iter()
        .position(|line| line.focus)
        .unwrap_or(0);
    state.tree.focus = Some(at);
    if state.screen != Screen::Tree {
        state.back.push(state.screen);
    }
    state.screen = Screen::Tree;
}

pub(super) fn start_edit(state: &mut State, effects: &mut Vec<Effect>) {
    match state.focused() {
        Some(at) => edit(state, at, effects),
        None => state.flash_error("select a resource first"),
    }
}

pub(super) fn edit(state: &mut State, at: ResRef, effects: &mut Vec<Effect>) {
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
pub(super) fn plan_delete(state: &mut State) {
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

pub(super) fn next_tenancy(store: &Store, current: &TenancyFilter) -> TenancyFilter {
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
