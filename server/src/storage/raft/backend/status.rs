//! What a node knows about itself and its cluster (role, indexes, members and their progress),
//! and membership changes.

use std::collections::{BTreeMap, BTreeSet};

use openraft::ChangeMembers;

use super::super::types::{NodeAddr, NodeId, Raft};
use super::RaftBackend;
use crate::storage::StorageError;

/// Publishes whether this node leads whenever raft's metrics change.
pub(super) async fn follow_leadership(raft: Raft, leading: tokio::sync::watch::Sender<bool>) {
    let mut metrics = raft.metrics();
    loop {
        let is_leader = metrics.borrow_and_update().state == openraft::ServerState::Leader;
        leading.send_if_modified(|current| std::mem::replace(current, is_leader) != is_leader);
        if metrics.changed().await.is_err() {
            let _ = leading.send(false);
            return;
        }
    }
}

/// A node's raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

/// What a node knows about itself and the cluster.
#[derive(Debug, Clone)]
pub struct NodeStatus {
    pub node_id: NodeId,
    pub node: NodeAddr,
    pub role: Role,
    pub term: u64,
    pub leader: Option<(NodeId, NodeAddr)>,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_log_index: u64,
    pub snapshot_index: u64,
    pub log_commits: u64,
    pub log_entries: u64,
    pub log_operations: u64,
}

/// A member as the leader sees it.
#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub node_id: NodeId,
    pub node: NodeAddr,
    pub voter: bool,
    pub leader: bool,
    /// Highest index the leader knows the member holds; `None` if it has not heard from it.
    pub match_index: Option<u64>,
    pub lag: Option<u64>,
}

impl RaftBackend {
    pub fn status(&self) -> NodeStatus {
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        let role = match metrics.state {
            openraft::ServerState::Leader => Role::Leader,
            openraft::ServerState::Follower => Role::Follower,
            openraft::ServerState::Candidate => Role::Candidate,
            openraft::ServerState::Learner => Role::Learner,
            openraft::ServerState::Shutdown => Role::Shutdown,
        };
        let leader = metrics
            .current_leader
            .map(|id| (id, membership.get_node(&id).cloned().unwrap_or_default()));
        let applied_index = super::applied_index(&metrics);
        NodeStatus {
            node_id: self.id,
            node: self.node.clone(),
            role,
            term: metrics.current_term,
            leader,
            commit_index: self
                .log_stats
                .committed
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(applied_index),
            applied_index,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            snapshot_index: metrics.snapshot.map(|l| l.index).unwrap_or(0),
            log_commits: self
                .log_stats
                .commits
                .load(std::sync::atomic::Ordering::Relaxed),
            log_entries: self
                .log_stats
                .entries
                .load(std::sync::atomic::Ordering::Relaxed),
            log_operations: self
                .log_stats
                .operations
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Every member with its replication progress. Progress is known on the leader only; other
    /// nodes report members without it.
    pub fn members(&self) -> Vec<MemberStatus> {
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let last_log = metrics.last_log_index.unwrap_or(0);
        membership
            .nodes()
            .map(|(id, node)| {
                let match_index = match &metrics.replication {
                    None => None,
                    Some(_) if *id == self.id => Some(last_log),
                    Some(replication) => replication
                        .get(id)
                        .copied()
                        .flatten()
                        .map(|log_id| log_id.index),
                };
                MemberStatus {
                    node_id: *id,
                    node: node.clone(),
                    voter: voters.contains(id),
                    leader: metrics.current_leader == Some(*id),
                    match_index,
                    lag: match_index.map(|index| last_log.saturating_sub(index)),
                }
            })
            .collect()
    }

    /// Waits until raft on this node stops on a fatal error and returns it; `None` when raft
    /// shuts down normally. A node whose raft stopped can serve nothing that needs it.
    pub async fn halted(&self) -> Option<String> {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state {
                return Some(fatal.to_string());
            }
            if metrics.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Whether a node is already a voter with these addresses.
    /// Whether node `id` may speak to this node's raft service (DESIGN §12.2): a voter or
    /// learner of the latest membership this node knows, or a member of the cluster it is
    /// joining (see [`RaftBackend::expect_peers`]).
    pub fn admits_peer(&self, id: NodeId) -> bool {
        let known = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .is_some();
        known
            || self
                .joining_through
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id)
    }

    /// Admits the members of the cluster this node is joining, as told by the member it joins
    /// through, before this node's own log names them.
    pub fn expect_peers(&self, ids: impl IntoIterator<Item = NodeId>) {
        let mut joining = self
            .joining_through
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        joining.clear();
        joining.extend(ids);
    }

    pub fn is_voter(&self, id: NodeId) -> bool {
        self.metrics()
            .membership_config
            .membership()
            .voter_ids()
            .any(|voter| voter == id)
    }

    /// Initializes a new single-voter cluster of this node, unless this node already belongs to
    /// one. Returns whether it initialized.
    pub async fn bootstrap(&self) -> Result<bool, StorageError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|error| StorageError::Internal(error.to_string()))?;
        if initialized {
            return Ok(false);
        }
        let members = BTreeMap::from([(self.id, self.node.clone())]);
        self.raft.initialize(members).await.map_err(|error| {
            StorageError::Internal(format!("cannot initialize the cluster: {error}"))
        })?;
        Ok(true)
    }

    /// Adds a node as a learner, waits for it to catch up, then makes it a voter. Must run on
    /// the leader.
    pub async fn add_voter(&self, id: NodeId, node: NodeAddr) -> Result<(), String> {
        let _one_at_a_time = self.membership.lock().await;
        self.raft
            .add_learner(id, node, true)
            .await
            .map_err(|error| format!("cannot add node {id} as a learner: {error}"))?;
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|error| format!("cannot make node {id} a voter: {error}"))?;
        Ok(())
    }

    /// Removes a node from the voters and the cluster. Must run on the leader.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), String> {
        let _one_at_a_time = self.membership.lock().await;
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
            .await
            .map_err(|error| format!("cannot remove node {id} from the voters: {error}"))?;
        self.raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
            .await
            .map_err(|error| format!("cannot remove node {id}: {error}"))?;
        Ok(())
    }
}
