//! The cluster and controllers screens: the periodic cluster report, the member list and
//! leader transfer.

use super::Keys;
use crate::keymap::Action;
use proto::client::placement::placement_map;

use super::events::push_notice_once;
use crate::msg::ClusterReport;
use crate::state::{Choice, Dialog, EventKind, Link, State};

/// The cluster screen: ↑/↓ pick a member, `L` hands it leadership.
pub(super) const NODES: Keys = Keys {
    move_by: |state, delta| {
        let len = state
            .cluster
            .members
            .as_ref()
            .map_or(0, |m| m.members.len());
        state.nodes.cursor = state.nodes.cursor.moved(delta, len);
    },
    open: |_| {},
    back: |_| {},
    perform: |state, action, _| match action {
        Action::TransferLeader => {
            plan_transfer(state);
            true
        }
        _ => false,
    },
};

/// The controllers × nodes map.
pub(super) const CONTROLLERS: Keys = Keys {
    move_by: |state, delta| {
        let len = state
            .cluster
            .placement
            .as_ref()
            .map_or(0, |p| p.controllers.len());
        state.controllers.cursor = state.controllers.cursor.moved(delta, len);
    },
    open: |_| {},
    back: |_| {},
    perform: |_, _, _| false,
};

/// Asks before making the selected member the leader.
fn plan_transfer(state: &mut State) {
    let selected = state
        .cluster
        .members
        .as_ref()
        .and_then(|m| m.members.get(state.nodes.cursor.selected))
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

pub(super) fn on_cluster(state: &mut State, report: ClusterReport) {
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
    match report.members {
        Some(Ok(members)) => {
            state.cluster.members = Some(members);
            state.cluster.members_error = None;
        }
        Some(Err(error)) => {
            // The list stays, marked with its age: a member seen an hour ago is not "healthy".
            let since = state
                .cluster
                .members_error
                .as_ref()
                .map_or(state.now, |(_, since)| *since);
            state.cluster.members_error = Some((error, since));
        }
        None => {}
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
