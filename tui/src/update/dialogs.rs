//! Keys while a dialog is open: each dialog's keys come from its keymap scope.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::resources::edit;
use crate::keymap::{self, Action, Scope};
use crate::msg::Effect;
use crate::state::{Choice, Dialog, State};

pub(super) fn on_dialog_key(state: &mut State, key: KeyEvent, effects: &mut Vec<Effect>) {
    let Some(dialog) = state.dialog.take() else {
        return;
    };
    match dialog {
        Dialog::Help { scroll } => {
            let scroll = match keymap::lookup(&key, &[Scope::Info, Scope::List]) {
                Some(Action::Close) => return,
                Some(Action::Up) => scroll.saturating_sub(1),
                Some(Action::Down) => scroll.saturating_add(1),
                Some(Action::PageUp) => scroll.saturating_sub(10),
                Some(Action::PageDown) => scroll.saturating_add(10),
                Some(Action::Top) => 0,
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
        Dialog::WhyStuck { at } => match keymap::lookup(&key, &[Scope::Stuck, Scope::Info]) {
            // Removing a finalizer by hand is an edit.
            Some(Action::Edit) => edit(state, at, effects),
            Some(Action::Close) => {}
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
            if keymap::lookup(&key, &[Scope::Info]) != Some(Action::Close) {
                state.dialog = Some(Dialog::Message { title, text });
            }
        }
    }
}

/// Closes the open dialog as esc would (ctrl-c): a confirmation is answered "no", an edit
/// that did not save keeps the user's text.
pub(super) fn dismiss(state: &mut State) {
    on_dialog_key(
        state,
        KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE),
        &mut Vec::new(),
    );
}
