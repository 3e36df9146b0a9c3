//! Handing leadership to another voter (DESIGN §8): the leader stops proposing, waits until the
//! target holds its whole log, stops heartbeats and waits out the followers' leader lease, so
//! the target's campaign wins; the target campaigns when asked.

use std::time::{Duration, Instant};

use super::{MembershipError, RaftCluster};
use crate::storage::raft::node::RaftNode;
use crate::storage::raft::types::{NodeId, Raft};

/// A leader paused for a leadership transfer; dropping it resumes proposing and heartbeats.
pub(crate) struct TransferPause {
    raft: Raft,
    _permits: tokio::sync::OwnedSemaphorePermit,
    _one_at_a_time: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for TransferPause {
    fn drop(&mut self) {
        self.raft.runtime_config().heartbeat(true);
    }
}

/// A prepared handover: to whom, where to ask it to campaign, and the pause that lasts until
/// the handover is dropped. `None` pause: this node was chosen, so there is nothing to hand
/// over.
pub(crate) struct Handover {
    pub(crate) target: NodeId,
    pub(crate) api_addr: String,
    pub(crate) pause: Option<TransferPause>,
}

/// Prepares moving leadership to `to` (the reachable voter holding the most of the log when
/// `None`): it must be a reachable voter. Must run on the leader.
pub(super) async fn prepare_handover(
    cluster: &RaftCluster,
    to: Option<NodeId>,
    deadline: Instant,
) -> Result<Handover, MembershipError> {
    let node = &cluster.node;
    let target = match to {
        Some(id) => id,
        None => candidate(node).ok_or_else(|| {
            MembershipError::Refused("no other reachable voter to hand leadership to".into())
        })?,
    };
    let Some(member) = node.members().into_iter().find(|m| m.node_id == target) else {
        return Err(MembershipError::NotMember(format!(
            "node {target} is not a member"
        )));
    };
    if target == node.id() {
        return Ok(Handover {
            target,
            api_addr: member.node.api_addr,
            pause: None,
        });
    }
    let pause = pause_for(cluster, target, deadline).await?;
    Ok(Handover {
        target,
        api_addr: member.node.api_addr,
        pause: Some(pause),
    })
}

/// The voter a transfer with no target goes to: reachable, other than this node, holding the
/// most of the log.
fn candidate(node: &RaftNode) -> Option<NodeId> {
    node.members()
        .into_iter()
        .filter(|m| m.voter && m.reachable && m.node_id != node.id())
        .max_by_key(|m| m.match_index.unwrap_or(0))
        .map(|m| m.node_id)
}

/// Pauses this leader for a transfer to `target`. Dropping the pause resumes proposing and
/// heartbeats (harmless once another node leads).
async fn pause_for(
    cluster: &RaftCluster,
    target: NodeId,
    deadline: Instant,
) -> Result<TransferPause, MembershipError> {
    let node = &cluster.node;
    let refused = MembershipError::Refused;
    let until = tokio::time::Instant::from_std(deadline);
    tracing::info!(
        to = target,
        "leadership transfer: waiting for membership changes in progress"
    );
    let one_at_a_time = tokio::time::timeout_at(until, cluster.one_at_a_time.clone().lock_owned())
        .await
        .map_err(|_| {
            refused("a membership change in progress did not finish before the deadline".into())
        })?;
    let member = node
        .members()
        .into_iter()
        .find(|m| m.node_id == target)
        .ok_or_else(|| MembershipError::NotMember(format!("node {target} is not a member")))?;
    if !member.voter {
        return Err(refused(format!("node {target} is a learner, not a voter")));
    }
    if !member.reachable {
        return Err(refused(format!(
            "node {target} is not reachable from the leader"
        )));
    }
    tracing::info!(
        to = target,
        "leadership transfer: pausing new writes, waiting for those in flight"
    );
    let permits = tokio::time::timeout_at(until, node.pause_proposals())
        .await
        .map_err(|_| refused("writes in flight did not finish before the deadline".into()))?
        .map_err(|_| refused("this node is shutting down".into()))?;
    tracing::info!(
        to = target,
        "leadership transfer: waiting for the target to hold the whole log"
    );
    let raft = node.raft();
    let pause = TransferPause {
        raft: raft.clone(),
        _permits: permits,
        _one_at_a_time: one_at_a_time,
    };
    // Nothing new is proposed now: wait for the target to hold everything there is.
    let mut metrics = raft.metrics();
    loop {
        let (last, matched) = {
            let current = metrics.borrow_and_update();
            let matched = current
                .replication
                .as_ref()
                .and_then(|r| r.get(&target).copied().flatten())
                .map(|log_id| log_id.index);
            (current.last_log_index, matched)
        };
        if matched.is_some() && matched == last {
            break;
        }
        if Instant::now() >= deadline {
            return Err(refused(format!(
                "node {target} did not catch up before the deadline (holds {}, the leader {})",
                matched.unwrap_or(0),
                last.unwrap_or(0)
            )));
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    }
    raft.runtime_config().heartbeat(false);
    let lease = node.leader_lease();
    tracing::info!(
        to = target,
        lease_ms = lease.as_millis() as u64,
        "leadership transfer: heartbeats stopped, waiting out the followers' leader lease"
    );
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    Ok(pause)
}

/// Campaigns for leadership (this node was chosen by a transfer) and waits until it leads.
/// Every failure is one to retry (`Failed`): the transfer's leader resumes when it hears.
pub(super) async fn campaign(node: &RaftNode, deadline: Instant) -> Result<(), MembershipError> {
    let id = node.id();
    if !node.is_voter(id) {
        return Err(MembershipError::Failed(format!("node {id} is not a voter")));
    }
    if node.repairing() {
        return Err(MembershipError::Failed(format!(
            "node {id} is being repaired from the leader after its log or state was damaged: it does not lead until repaired"
        )));
    }
    let raft = node.raft();
    let mut metrics = raft.metrics();
    let mut next_try = Instant::now();
    loop {
        if metrics.borrow_and_update().current_leader == Some(id) {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            let leader = node.metrics().current_leader;
            return Err(MembershipError::Failed(match leader {
                Some(other) => format!("node {other} leads instead; try again"),
                None => "the election did not finish before the deadline".to_owned(),
            }));
        }
        if now >= next_try {
            raft.trigger().elect().await.map_err(|error| {
                MembershipError::Failed(format!("cannot start an election: {error}"))
            })?;
            next_try = now + node.leader_lease();
        }
        let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
    }
}
