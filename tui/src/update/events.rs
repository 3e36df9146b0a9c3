//! Watch updates (into the store and the event tail) and the events screen.

use proto::client::{WatchUpdate, describe};
use proto::meta;
use proto::resource::v1::watch_event::Event;

use super::Keys;
use crate::keymap::Action;
use crate::model::Change;
use crate::state::{EventKind, Input, InputKind, Link, State};

/// The event tail: ↑ reads back in time, ↓ (or G) comes back to the live tail, esc follows it
/// (and clears a filter); `/` filters as you type, `h` shows or hides heartbeats.
pub(super) const EVENTS: Keys = Keys {
    move_by: |state, delta| {
        let scroll = state.events.scroll as isize - delta;
        let shown = state.events.visible().len();
        state.events.scroll = scroll.clamp(0, shown as isize) as usize;
    },
    open: |_| {},
    back: |state| {
        if state.events.scroll == 0 && !state.events.filter.is_empty() {
            state.events.filter.clear();
            state.flash("filter cleared");
        }
        state.events.scroll = 0;
    },
    perform: |state, action, _| match action {
        Action::Filter => {
            state.input = Some(Input {
                kind: InputKind::EventFilter,
                text: state.events.filter.clone(),
            });
            true
        }
        Action::Heartbeats => {
            state.events.show_heartbeats = !state.events.show_heartbeats;
            state.events.scroll = 0;
            state.flash(if state.events.show_heartbeats {
                "showing lease and report heartbeats"
            } else {
                "hiding lease and report heartbeats"
            });
            true
        }
        _ => false,
    },
};

pub(super) fn on_watch(state: &mut State, gvk: &str, update: WatchUpdate) {
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
                state.push_change(gvk, kind, text);
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
                proto::client::ClientError::PermissionDenied {
                    message: missing, ..
                } => {
                    format!("your token cannot read {gvk} ({missing})")
                }
                proto::client::ClientError::Unauthenticated { message: why, .. } => format!(
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
pub(super) fn push_notice_once(state: &mut State, text: String) {
    let repeated = state
        .events
        .lines
        .iter()
        .rev()
        .take(32)
        .any(|line| line.kind == EventKind::Notice && line.text == text);
    if !repeated {
        state.push_event(EventKind::Notice, text);
    }
}

/// `demo.v2.Album default/jazz/kind-of-blue v12 Accepted=True`.
fn event_text(resource: &proto::resource::v1::Resource) -> String {
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
