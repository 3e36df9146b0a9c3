//! The input line: `:` commands, the `/` filter as you type, snapshot file names.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use proto::codec::gvk;

use super::{resources, snapshot, switch_to};
use crate::msg::Effect;
use crate::state::{Dialog, Input, InputKind, Screen, State, TenancyFilter};

pub(super) fn on_input_key(state: &mut State, key: KeyEvent, effects: &mut Vec<Effect>) {
    let Some(mut input) = state.input.take() else {
        return;
    };
    let control = key.modifiers.contains(KeyModifiers::CONTROL);
    match key.code {
        KeyCode::Esc => {
            match input.kind {
                InputKind::Filter => state.resources.filter.clear(),
                InputKind::EventFilter => state.events.filter.clear(),
                _ => {}
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
    match input.kind {
        InputKind::Filter => state.resources.filter = input.text.clone(),
        InputKind::EventFilter => {
            state.events.filter = input.text.clone();
            state.events.scroll = 0;
        }
        _ => {}
    }
    state.input = Some(input);
}

fn submit_input(state: &mut State, input: Input, effects: &mut Vec<Effect>) {
    let text = input.text.trim().to_owned();
    match input.kind {
        InputKind::Filter => {
            state.resources.filter = text;
        }
        InputKind::EventFilter => {
            state.events.filter = text;
        }
        InputKind::Command => run_command(state, &text),
        InputKind::SnapshotPath(purpose) => {
            if text.is_empty() {
                state.flash_error("no file name given; nothing done");
                return;
            }
            snapshot::start(state, purpose, std::path::PathBuf::from(text), effects);
        }
    }
}

/// `:` commands: a screen name, `ns …`, `q`, or a type to open.
pub(super) fn run_command(state: &mut State, text: &str) {
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
            state.resources.tenancy = match rest {
                "" | "all" | "*" => TenancyFilter::All,
                _ => match rest.split_once('/') {
                    Some((partition, namespace)) => TenancyFilter::Namespace {
                        partition: partition.to_owned(),
                        namespace: namespace.to_owned(),
                    },
                    None => TenancyFilter::Partition(rest.to_owned()),
                },
            };
            state.flash(format!("showing {}", state.resources.tenancy.label()));
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
            resources::open_type(state, gvk);
        }
        Err(error) => state.flash_error(format!(
            "{}; try a kind (Executive), group.version.Kind, or a screen (types, cluster, \
             controllers, events, snapshot)",
            error.message
        )),
    }
}
