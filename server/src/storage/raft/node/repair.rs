//! A node whose raft log was damaged is repaired from the leader, and votes for nothing until
//! then (DESIGN §14; protocol-aware recovery, Alagappan et al., "Protocol-Aware Recovery for
//! Consensus-Based Storage", FAST 2018).
//!
//! A damaged log lost entries this node had synced, and so may have acknowledged: counted by a
//! leader towards a commit. Were the node to vote as if it had never held them, it could elect
//! a candidate that lacks them, and a committed write would be gone. So when the log is damaged
//! and the cluster has other voters to repair from, the log is set aside
//! (`raft/damaged-<time>/wal`, kept for people), a new one started, and the node, marked by
//! `raft/REPAIRING` (kept across restarts until the repair ends):
//! - never campaigns (openraft's election is off) and refuses every vote request;
//! - serves no reads (`Readiness::Repairing`: health, `/readyz`, `Status` say so);
//! - takes the leader's snapshot and log as any lagging follower does.
//!
//! It is repaired once it has applied an entry of the term of a leader it follows: a leader's
//! log holds every entry committed before its term, and this node's log now matches it up to
//! that entry. Then the marker goes, elections come back, and the node catches up like one
//! restarted after an unclean stop before it serves reads. A node whose cluster has no other
//! voter (or none it knows of) has nobody to repair from: its log refuses to open, naming the
//! damage and the recovery.
//!
//! Who the voters are is read from the state machine and from `raft/MEMBERS`, which this node
//! rewrites whenever the membership it follows changes (the state machine of a node rebuilt
//! after an unclean stop may not know yet).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Weak;

use openraft::raft::{VoteRequest, VoteResponse};

use super::super::schema;
use super::super::types::{NodeId, Raft};
use super::RaftNode;
use super::readiness::Readiness;

/// The voters this data directory knows of: those of the state machine's membership and of
/// `raft/MEMBERS`.
pub(super) fn known_voters(data_dir: &Path, from_state: Vec<NodeId>) -> BTreeSet<NodeId> {
    let mut voters: BTreeSet<NodeId> = from_state.into_iter().collect();
    if let Ok(text) = std::fs::read_to_string(data_dir.join(schema::MEMBERS_FILE)) {
        voters.extend(
            text.split_whitespace()
                .filter_map(|word| word.parse::<NodeId>().ok()),
        );
    }
    voters
}

/// Writes the voters to `raft/MEMBERS`, durably.
fn write_members(data_dir: &Path, voters: &BTreeSet<NodeId>) -> std::io::Result<()> {
    let text: Vec<String> = voters.iter().map(|id| id.to_string()).collect();
    schema::write_durably(&data_dir.join(schema::MEMBERS_FILE), text.join(" ") + "\n")
}

/// Keeps `raft/MEMBERS` naming the voters of the membership this node follows, until raft stops.
pub(super) async fn record_members(raft: Raft, data_dir: PathBuf) {
    // Raft's server metrics change with the vote, the role, the leader and the membership,
    // not at every commit (a task woken per commit costs every write CPU on every node).
    let mut metrics = raft.server_metrics();
    let mut recorded = BTreeSet::new();
    let mut seen = None;
    loop {
        // The membership changes only with its own log entries.
        let voters: Option<BTreeSet<NodeId>> = {
            let now = metrics.borrow_and_update();
            let config = &now.membership_config;
            (seen != Some(*config.log_id())).then(|| {
                seen = Some(*config.log_id());
                config.membership().voter_ids().collect()
            })
        };
        if let Some(voters) = voters
            && !voters.is_empty()
            && voters != recorded
        {
            match write_members(&data_dir, &voters) {
                Ok(()) => recorded = voters,
                Err(error) => {
                    // Tried again at the next change.
                    seen = None;
                    tracing::warn!(
                    %error,
                    path = %data_dir.join(schema::MEMBERS_FILE).display(),
                    "cannot record the cluster's voters (a damaged log could then not be repaired from them)"
                    );
                }
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Sets the log, the state machine and the raft snapshots aside under `raft/damaged-*` (the
/// log's format marker and the node's identity stay), for a repair from the leader, once the
/// directory is marked as under repair (`why`). Returns where they went.
pub(super) fn set_aside_state(data_dir: &Path, why: &str) -> std::io::Result<PathBuf> {
    schema::mark_repairing(data_dir, why)?;
    schema::set_aside(
        data_dir,
        &[
            Path::new(schema::WAL_DIR),
            Path::new(schema::SM_DIR),
            Path::new(schema::SNAPSHOT_DIR),
        ],
    )
}

impl RaftNode {
    /// Whether this node is being repaired (and so votes for nobody).
    pub(crate) fn repairing(&self) -> bool {
        matches!(&*self.readiness.borrow(), Readiness::Repairing { .. })
    }

    /// The answer to a vote request while this node is repaired: not granted. `None` when the
    /// node may vote.
    pub(crate) fn refuse_vote(
        &self,
        request: &VoteRequest<NodeId>,
    ) -> Option<VoteResponse<NodeId>> {
        if !self.repairing() {
            return None;
        }
        tracing::debug!(candidate = ?request.vote, "vote refused: this node is being repaired");
        Some(VoteResponse {
            vote: self.raft.metrics().borrow().vote,
            vote_granted: false,
            last_log_id: None,
        })
    }
}

/// Waits until this node has applied an entry of the term of a leader it follows, then ends
/// the repair: the marker goes, elections come back, and the node catches up before it serves
/// reads. Holds the backend weakly: it ends when the node goes.
pub(super) async fn repair(backend: Weak<RaftNode>) {
    let Some(node) = backend.upgrade() else {
        return;
    };
    let mut metrics = node.raft.metrics();
    let id = node.id;
    drop(node);
    loop {
        let (repaired, applied) = {
            let now = metrics.borrow_and_update();
            let follows =
                now.current_leader.is_some_and(|leader| leader != id) && now.vote.is_committed();
            let applied_term = now.last_applied.map(|log_id| log_id.leader_id.term);
            (
                follows && applied_term == Some(now.current_term),
                super::applied_index(&now),
            )
        };
        let Some(node) = backend.upgrade() else {
            return;
        };
        if repaired {
            let marker = node.data_dir.join(schema::REPAIR_FILE);
            let removed = std::fs::remove_file(&marker)
                .and_then(|()| schema::sync_dir(marker.parent().unwrap_or(&node.data_dir)));
            if let Err(error) = removed {
                tracing::error!(%error, path = %marker.display(), "cannot record the end of the repair; it stays marked as under repair");
                return;
            }
            tracing::info!(
                applied,
                "repaired from the leader: voting again, catching up before serving reads"
            );
            node.raft.runtime_config().elect(true);
            node.readiness.send_replace(Readiness::CatchingUp {
                applied,
                target: None,
            });
            let task = tokio::spawn(super::readiness::catch_up(backend.clone()));
            *node.catch_up.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
            return;
        }
        node.readiness.send_modify(|readiness| {
            if let Readiness::Repairing { applied: now, .. } = readiness {
                *now = applied;
            }
        });
        drop(node);
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
