//! Pre-vote (Raft thesis §9.6): a node stands for election only once a quorum of voters say
//! they would vote for it. openraft 0.9 has no pre-vote, and its candidates raise their term at
//! every election timeout, so a node cut off from the others would come back with a term far
//! ahead and depose a healthy leader. Here openraft's election timer is gated
//! (`RuntimeConfigHandle::elect`): [`gate_elections`] opens it only after a pre-vote round
//! that a quorum granted, and closes it otherwise. A voter grants a pre-vote when it has not
//! heard from a leader within the leader lease (the same lease openraft's votes honour) and the
//! candidate's log is at least as long as its own ([`RaftNode::pre_vote`]; the real vote
//! still compares terms).

use std::sync::Weak;
use std::time::{Duration, Instant};

use super::super::network;
use super::super::types::NodeId;
use super::RaftNode;

/// How long a pre-vote round waits for each voter.
const PRE_VOTE_TIMEOUT: Duration = Duration::from_millis(300);

impl RaftNode {
    /// Notes that the leader was just heard from (an append it sent was taken).
    pub(crate) fn heard_from_leader(&self) {
        *self
            .last_heard_leader
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// The leader this node follows, as far as it knows: raft's, unless this node is a follower
    /// that has not heard from it for twice the leader lease (with pre-vote a follower cut off
    /// from its leader does not campaign, so raft goes on naming the leader it lost).
    pub(crate) fn known_leader(
        &self,
        metrics: &openraft::RaftMetrics<NodeId, super::super::types::NodeAddr>,
    ) -> Option<NodeId> {
        let leader = metrics.current_leader?;
        if leader == self.id || self.heard_within(2 * self.leader_lease) {
            return Some(leader);
        }
        // Not heard from since this node started (its leader may not have sent anything yet):
        // trust raft until the lease has passed since the start.
        let never_heard = self
            .last_heard_leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none();
        (never_heard && self.started.elapsed() < 2 * self.leader_lease).then_some(leader)
    }

    /// How many voters (this node included) answered this node's last pre-vote round, if it
    /// ran one in the last few seconds: "no leader: this node has heard from 1 of 3 voters".
    pub(crate) fn voters_heard(&self) -> Option<String> {
        let heard = *self.voters_heard.lock().unwrap_or_else(|p| p.into_inner());
        let (answered, voters, at) = heard?;
        (at.elapsed() < Duration::from_secs(5))
            .then(|| format!("no leader: this node has heard from {answered} of {voters} voters"))
    }

    /// Whether this node heard from a leader within `within`.
    fn heard_within(&self, within: Duration) -> bool {
        self.last_heard_leader
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < within)
    }

    /// This voter's answer to `candidate`'s pre-vote: `Ok` to grant, or why not.
    pub(crate) fn pre_vote(
        &self,
        candidate: NodeId,
        last_log_index: Option<u64>,
    ) -> Result<(), String> {
        if self.removed().is_some() || self.repairing() {
            return Err(format!("node {} takes no part in elections now", self.id));
        }
        let metrics = self.metrics();
        if metrics.current_leader == Some(self.id) {
            return Err(format!("node {} leads", self.id));
        }
        if self.heard_within(self.leader_lease) {
            return Err(format!(
                "node {} heard from its leader within the last {} ms",
                self.id,
                self.leader_lease.as_millis()
            ));
        }
        if last_log_index < metrics.last_log_index {
            return Err(format!(
                "node {candidate}'s log is shorter than node {}'s",
                self.id
            ));
        }
        Ok(())
    }
}

/// Opens openraft's election timer only after a pre-vote round a quorum granted (see the module
/// docs). Runs while the backend lives; leaves the timer alone while the node is removed or
/// being repaired (those decide it themselves) and while it leads.
pub(super) async fn gate_elections(backend: Weak<RaftNode>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut open = None;
    loop {
        tick.tick().await;
        let Some(node) = backend.upgrade() else {
            return;
        };
        if node.removed().is_some() || node.repairing() {
            open = None;
            continue;
        }
        let metrics = node.metrics();
        if metrics.current_leader == Some(node.id) {
            continue;
        }
        let voters: Vec<NodeId> = metrics.membership_config.membership().voter_ids().collect();
        if !voters.contains(&node.id) {
            continue;
        }
        let granted = if node.heard_within(node.leader_lease / 2) {
            // A leader is heard: no election is due.
            false
        } else {
            pre_vote_round(&node, &voters).await
        };
        if open != Some(granted) {
            if granted {
                tracing::info!(
                    "pre-vote: a quorum would vote for this node; it may stand for election"
                );
            } else if open == Some(true) {
                tracing::debug!("pre-vote: elections closed again");
            }
            node.raft.runtime_config().elect(granted);
            open = Some(granted);
        }
    }
}

/// Asks every other voter for a pre-vote; whether a quorum (this node included) said yes.
async fn pre_vote_round(node: &RaftNode, voters: &[NodeId]) -> bool {
    let quorum = voters.len() / 2 + 1;
    let last_log_index = node.metrics().last_log_index;
    let members = node.metrics().membership_config.membership().clone();
    let asks = voters
        .iter()
        .filter(|id| **id != node.id)
        .filter_map(|id| {
            let addr = members.get_node(id)?.raft_addr.clone();
            Some((*id, addr))
        })
        .map(|(id, addr)| {
            let client = node.peer_client(id, &addr);
            let request = proto::raft::v1::PreVoteRequest {
                candidate: node.id,
                last_log_index,
            };
            async move {
                let Ok(mut client) = client else {
                    return None;
                };
                let mut call = tonic::Request::new(request);
                call.set_timeout(PRE_VOTE_TIMEOUT);
                match tokio::time::timeout(PRE_VOTE_TIMEOUT, client.pre_vote(call)).await {
                    Ok(Ok(answer)) => {
                        let answer = answer.into_inner();
                        if !answer.granted {
                            tracing::debug!(voter = id, reason = answer.reason, "pre-vote refused");
                        }
                        Some(answer.granted)
                    }
                    _ => None,
                }
            }
        });
    let answers = futures::future::join_all(asks).await;
    let answered = answers.iter().filter(|answer| answer.is_some()).count();
    let granted = answers
        .iter()
        .filter(|answer| **answer == Some(true))
        .count();
    *node.voters_heard.lock().unwrap_or_else(|p| p.into_inner()) =
        Some((answered + 1, voters.len(), Instant::now()));
    granted + 1 >= quorum
}

impl RaftNode {
    /// A client of `id`'s raft service at `addr`, made once and kept (forwarding and pre-votes
    /// share them).
    pub(super) fn peer_client(
        &self,
        id: NodeId,
        addr: &str,
    ) -> Result<
        proto::raft::v1::raft_service_client::RaftServiceClient<tonic::transport::Channel>,
        String,
    > {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let key = (id, addr.to_owned());
        if let Some(client) = peers.get(&key) {
            return Ok(client.clone());
        }
        let client = network::raft_client(&self.dialer, addr, id)?;
        peers.insert(key, client.clone());
        Ok(client)
    }
}
