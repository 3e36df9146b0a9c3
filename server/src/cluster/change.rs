//! Changes of membership: a node joins (as a learner, promoted once it holds the leader's log)
//! or a member is removed. One change at a time, each after the configuration before it
//! committed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::ChangeMembers;

use super::RaftCluster;
use crate::storage::raft::node::MemberStatus;
use crate::storage::raft::types::{NodeAddr, NodeId};

/// How long a membership change waits for the configuration before it to commit.
const MEMBERSHIP_SETTLE: Duration = Duration::from_secs(2);

/// A learner that has not answered for this long is given up on by a join.
const UNREACHABLE_GIVE_UP: Duration = Duration::from_secs(10);

/// The longest a join runs, whatever deadline its caller asked for: it holds the change lock
/// until it ends.
const JOIN_AT_MOST: Duration = Duration::from_secs(60);

/// Why a change of membership failed, as the caller decides on it (the words are for people).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MembershipError {
    /// The change gave up and undid itself: nothing changed, and the same call fails the
    /// same way.
    #[error("{0}")]
    Unchanged(String),
    /// A change is proposed but not committed (this one, or an earlier one that blocks it):
    /// it completes once enough voters of the new configuration answer.
    #[error("{0}")]
    Pending(String),
    /// The node named is not a member.
    #[error("{0}")]
    NotMember(String),
    /// The id is a member already, with other addresses.
    #[error("{0}")]
    Conflict(String),
    /// A rule of the cluster refuses the change as asked (the words say which and what to do).
    #[error("{0}")]
    Refused(String),
    /// Anything else (a timeout, a peer out of reach): trying again may work.
    #[error("{0}")]
    Failed(String),
}

/// A node asking to join.
#[derive(Debug, Clone)]
pub(crate) struct Joiner {
    pub(crate) node_id: NodeId,
    pub(crate) node: NodeAddr,
    /// The node asks for itself (its data directory carries no removal), not an operator for
    /// it.
    pub(crate) from_node: bool,
}

/// What a join did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinOutcome {
    /// It was a voter already, at the same addresses.
    AlreadyVoter,
    /// It is a voter now.
    Added,
}

/// A failed change of membership, classified by openraft's error (not its words): a change
/// still pending blocks every later one until it commits.
fn membership_error(
    doing: String,
    error: openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, NodeAddr>>,
) -> MembershipError {
    use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
    match error {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(_),
        )) => MembershipError::Pending(format!(
            "{doing}: an earlier membership change is still waiting for a quorum of its new configuration, and no other change can start before it commits; bring the missing voters back"
        )),
        error => MembershipError::Failed(format!("{doing}: {error}")),
    }
}

/// Adds `joiner` as a voter. A node whose removal this cluster recorded (`removed_at`) joins
/// again only by asking for itself, with a data directory that carries no removal; an id that
/// is a voter already must come with the same addresses.
pub(super) async fn join(
    cluster: &RaftCluster,
    joiner: Joiner,
    removed_at: Option<String>,
    deadline: Instant,
) -> Result<JoinOutcome, MembershipError> {
    let node = &cluster.node;
    let id = joiner.node_id;
    if let Some(raft_addr) = removed_at
        && !joiner.from_node
        && !node.is_voter(id)
    {
        return Err(MembershipError::Refused(format!(
            "node {id} was removed from this cluster (it was at {raft_addr}): its data directory remembers the removal, so it would serve nothing; stop it, move its data directory away, and start it again with --join (it asks to join for itself)"
        )));
    }
    if node.is_voter(id) {
        let known = node.members().into_iter().find(|m| m.node_id == id);
        if let Some(member) = known
            && member.node != joiner.node
        {
            return Err(MembershipError::Conflict(format!(
                "node {id} is already a member with other addresses ({}); remove it first",
                member.node
            )));
        }
        return Ok(JoinOutcome::AlreadyVoter);
    }
    tracing::info!(node_id = id, node = %joiner.node, "adding a node to the cluster");
    // In a task of its own: a caller that goes away (its deadline, a cancel) must not cut the
    // join short between adding the learner and promoting or removing it. Bounded whatever
    // deadline the caller asked for: the join holds the change lock until it ends.
    let deadline = deadline.min(Instant::now() + JOIN_AT_MOST);
    let adding = {
        let node = node.clone();
        let one_at_a_time = cluster.one_at_a_time.clone();
        tokio::spawn(async move {
            let _one_at_a_time = one_at_a_time.lock().await;
            add_voter(&node, id, joiner.node, deadline).await
        })
    };
    adding
        .await
        .map_err(|error| MembershipError::Failed(format!("the join failed: {error}")))??;
    Ok(JoinOutcome::Added)
}

/// Adds a node as a learner, waits for it to catch up, then makes it a voter. Must run on the
/// leader, holding the change lock.
async fn add_voter(
    node: &crate::storage::raft::node::RaftNode,
    id: NodeId,
    addr: NodeAddr,
    deadline: Instant,
) -> Result<(), MembershipError> {
    settle(node, deadline).await;
    let raft = node.raft();
    let raft_addr = addr.raft_addr.clone();
    raft.add_learner(id, addr, false)
        .await
        .map_err(|error| membership_error(format!("cannot add node {id} as a learner"), error))?;
    if let Err(why) = wait_caught_up(node, id, deadline).await {
        // Never leave a learner (let alone a voter) that cannot follow behind.
        let removed = raft
            .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
            .await;
        let cleanup = match removed {
            Ok(_) => "it was removed again".to_owned(),
            Err(error) => format!("removing it again failed too: {error}"),
        };
        return Err(MembershipError::Unchanged(format!(
            "node {id} at {raft_addr} {why}; {cleanup} and membership is unchanged"
        )));
    }
    raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
        .await
        .map_err(|error| membership_error(format!("cannot make node {id} a voter"), error))?;
    Ok(())
}

/// Waits until learner `id` answers and holds the leader's log as it was when the wait began:
/// unreachable for [`UNREACHABLE_GIVE_UP`], or not caught up by `deadline`, fails.
async fn wait_caught_up(
    node: &crate::storage::raft::node::RaftNode,
    id: NodeId,
    deadline: Instant,
) -> Result<(), String> {
    let started = Instant::now();
    let target = node.metrics().last_log_index.unwrap_or(0);
    let mut metrics = node.raft().metrics();
    loop {
        let matched = metrics
            .borrow_and_update()
            .replication
            .as_ref()
            .and_then(|replication| replication.get(&id).copied().flatten())
            .map(|log_id| log_id.index);
        // Heard from since the wait began (not a stale contact of an earlier incarnation).
        let answered = node
            .last_heard(id)
            .is_some_and(|since| since <= started.elapsed());
        if answered && matched.is_some_and(|index| index >= target) {
            return Ok(());
        }
        let now = Instant::now();
        if !answered && now.duration_since(started) > UNREACHABLE_GIVE_UP {
            return Err(format!(
                "did not answer within {}s (is it running, and is its raft address reachable from here?)",
                UNREACHABLE_GIVE_UP.as_secs()
            ));
        }
        if now >= deadline {
            return Err(format!(
                "did not catch up before the deadline (it holds up to index {}, the leader had {target})",
                matched.unwrap_or(0)
            ));
        }
        let wait = deadline
            .saturating_duration_since(now)
            .min(Duration::from_millis(200));
        let _ = tokio::time::timeout(wait, metrics.changed()).await;
    }
}

/// Whether removing `id` keeps the cluster safe (DESIGN §8): never the last voter, and (unless
/// `force`) never below a quorum of reachable voters.
pub(super) fn check_removal(
    members: &[MemberStatus],
    id: NodeId,
    force: bool,
) -> Result<(), MembershipError> {
    let Some(removed) = members.iter().find(|m| m.node_id == id) else {
        return Err(MembershipError::NotMember(format!(
            "node {id} is not a member"
        )));
    };
    if !removed.voter {
        return Ok(());
    }
    let remaining: Vec<&MemberStatus> = members
        .iter()
        .filter(|m| m.voter && m.node_id != id)
        .collect();
    if remaining.is_empty() {
        return Err(MembershipError::Refused(format!(
            "node {id} is the last voter: removing it would leave no cluster"
        )));
    }
    let reachable = remaining.iter().filter(|m| m.reachable).count();
    let quorum = remaining.len() / 2 + 1;
    if reachable < quorum && !force {
        return Err(MembershipError::Refused(format!(
            "removing node {id} would leave {reachable} reachable of {} voters, less than a quorum of {quorum}; bring members back first, or remove with force",
            remaining.len()
        )));
    }
    Ok(())
}

/// Removes member `id` from the voters and the cluster, answering by `deadline`: a forced
/// removal below quorum cannot commit until enough voters are back, and says so instead of
/// hanging. Must run on the leader. Returns the removed member's addresses.
pub(super) async fn remove(
    cluster: &RaftCluster,
    id: NodeId,
    force: bool,
    deadline: Instant,
) -> Result<NodeAddr, MembershipError> {
    let node = &cluster.node;
    let members = node.members();
    check_removal(&members, id, force)?;
    let addr = members
        .into_iter()
        .find(|m| m.node_id == id)
        .map(|m| m.node)
        .unwrap_or_default();
    tracing::info!(node_id = id, "removing a node from the cluster");
    let removing = async {
        let _one_at_a_time = cluster.one_at_a_time.lock().await;
        remove_member(node, id).await
    };
    match tokio::time::timeout_at(deadline.into(), removing).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(MembershipError::Pending(format!(
                "the removal of node {id} is proposed but not committed: too few voters of the new configuration answer; it completes once enough of them are back"
            )));
        }
    }
    Ok(addr)
}

/// Removes a node from the voters and the cluster. Must run on the leader, holding the change
/// lock.
async fn remove_member(
    node: &crate::storage::raft::node::RaftNode,
    id: NodeId,
) -> Result<(), MembershipError> {
    settle(node, Instant::now() + MEMBERSHIP_SETTLE).await;
    let raft = node.raft();
    // `retain: false`: a voter leaving the configuration leaves the membership too.
    raft.change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
        .await
        .map_err(|error| {
            membership_error(format!("cannot remove node {id} from the voters"), error)
        })?;
    // A learner is removed with a second change — never by a leader that just removed itself:
    // it is no longer the leader, and openraft asserts it is when it changes membership (a
    // race that stopped its raft).
    let still_listed = node.members().iter().any(|member| member.node_id == id);
    if still_listed && id != node.id() {
        raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
            .await
            .map_err(|error| membership_error(format!("cannot remove node {id}"), error))?;
    }
    Ok(())
}

/// Waits (at most [`MEMBERSHIP_SETTLE`], and not past `deadline`) until the configuration in
/// effect is applied, so committed. A leader just elected, or just done with a change, has its
/// configuration committed within a round trip; a change asked for in between would otherwise
/// be refused as one that overlaps an earlier change. A configuration that does not commit in
/// that time is left to the change itself to report.
async fn settle(node: &crate::storage::raft::node::RaftNode, deadline: Instant) {
    let until = deadline.min(Instant::now() + MEMBERSHIP_SETTLE);
    let mut metrics = node.raft().metrics();
    loop {
        let settled = {
            let now = metrics.borrow_and_update();
            let applied = now.last_applied.as_ref().map(|log_id| log_id.index);
            let membership = now.membership_config.log_id().as_ref().map(|id| id.index);
            applied >= membership
        };
        if settled {
            return;
        }
        let waited =
            tokio::time::timeout_at(tokio::time::Instant::from_std(until), metrics.changed()).await;
        if !matches!(waited, Ok(Ok(()))) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(node_id: NodeId, voter: bool, reachable: bool) -> MemberStatus {
        MemberStatus {
            node_id,
            node: NodeAddr::default(),
            voter,
            leader: node_id == 1,
            match_index: Some(1),
            lag: Some(0),
            reachable,
        }
    }

    #[test]
    fn a_removal_never_takes_the_last_voter_nor_quorum_without_force() {
        let three = [
            member(1, true, true),
            member(2, true, true),
            member(3, true, false),
        ];
        assert_eq!(check_removal(&three, 3, false), Ok(()));
        // Removing 2 leaves 1 reachable of 2 voters: below a quorum of 2.
        assert!(matches!(
            check_removal(&three, 2, false),
            Err(MembershipError::Refused(why)) if why.contains("less than a quorum of 2")
        ));
        assert_eq!(check_removal(&three, 2, true), Ok(()));
        assert!(matches!(
            check_removal(&three, 9, false),
            Err(MembershipError::NotMember(_))
        ));
        let last = [member(1, true, true), member(4, false, false)];
        assert!(matches!(
            check_removal(&last, 1, true),
            Err(MembershipError::Refused(why)) if why.contains("last voter")
        ));
        // A learner goes whatever the voters' state.
        assert_eq!(check_removal(&last, 4, false), Ok(()));
    }
}
