//! What a node knows about itself and its cluster (role, indexes, members and their progress),
//! and membership changes.

use std::collections::{BTreeMap, BTreeSet};

use openraft::ChangeMembers;

use super::super::types::{NodeAddr, NodeId, Raft};
use super::RaftNode;
use crate::storage::StorageError;

/// Publishes whether this node leads whenever raft's role changes (its server metrics: the
/// vote, the role, the leader, the membership — not every commit).
pub(super) async fn follow_leadership(raft: Raft, leading: tokio::sync::watch::Sender<bool>) {
    let mut metrics = raft.server_metrics();
    loop {
        let is_leader = metrics.borrow_and_update().state == openraft::ServerState::Leader;
        leading.send_if_modified(|current| std::mem::replace(current, is_leader) != is_leader);
        if metrics.changed().await.is_err() {
            let _ = leading.send(false);
            return;
        }
    }
}

/// What the storage holds, for the metrics.
#[derive(Debug, Clone, Default)]
pub struct StorageSample {
    /// Resources per `group.Kind`.
    pub resources: Vec<(String, u64)>,
    /// Bytes on disk per LMDB environment (`log`, `state`).
    pub lmdb_bytes: Vec<(&'static str, u64)>,
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
    /// Writes applied and apply durations over the last seconds.
    pub recent: crate::metrics::RecentSummary,
    /// Bytes free on the data directory's disk, as last measured.
    pub disk_free_bytes: u64,
    /// What the node refuses now and why (a disk under its reserve).
    pub alarms: Vec<String>,
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
    /// Entries behind the leader's log; `None` (unknown) unless the member answered recently.
    pub lag: Option<u64>,
    /// The leader heard from it within [`REACHABLE_WITHIN`] (always true for the leader itself).
    pub reachable: bool,
}

/// A leader paused for a leadership transfer; dropping it resumes proposing and heartbeats.
pub struct TransferPause {
    raft: Raft,
    _permits: tokio::sync::OwnedSemaphorePermit,
    _membership: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for TransferPause {
    fn drop(&mut self) {
        self.raft.runtime_config().heartbeat(true);
    }
}

/// Why a change of membership failed, as the caller decides on it (the words are for people).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    /// The change gave up and undid itself: nothing changed, and the same call fails the
    /// same way.
    #[error("{0}")]
    Unchanged(String),
    /// A change is proposed but not committed (this one, or an earlier one that blocks it):
    /// it completes once enough voters of the new configuration answer.
    #[error("{0}")]
    Pending(String),
    #[error("{0}")]
    ShuttingDown(String),
    /// Anything else (a timeout, a peer out of reach): trying again may work.
    #[error("{0}")]
    Failed(String),
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

/// How long a membership change waits for the configuration before it to commit.
pub(super) const MEMBERSHIP_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// A learner that has not answered for this long is given up on by Join.
pub(super) const UNREACHABLE_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(10);

/// A member the leader has not heard from for this long counts as unreachable.
pub(super) const REACHABLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

impl RaftNode {
    /// Resources per `group.Kind` and the size of each LMDB environment, for the metrics.
    pub fn storage_sample(&self) -> StorageSample {
        let counts = match self.sm.count_by_kind() {
            Ok(counts) => counts.into_iter().collect(),
            Err(error) => {
                tracing::debug!(%error, "cannot count resources for the metrics");
                Vec::new()
            }
        };
        let log = super::super::wal::disk_bytes(&self.data_dir.join(super::super::schema::WAL_DIR));
        StorageSample {
            resources: counts,
            lmdb_bytes: vec![("log", log), ("state", self.sm.disk_bytes())],
        }
    }

    /// Whether this node can serve now (DESIGN §13, `/readyz`): it has applied what it had
    /// before it stopped, is a voter, and knows a leader; else why not.
    pub fn serving(&self) -> Result<(), String> {
        if let Some(why) = self.readiness.borrow().reason() {
            return Err(why);
        }

        let metrics = self.metrics();
        if !metrics
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == self.id)
        {
            return Err(format!(
                "node {} is not a voter of the cluster (yet): it may still be catching up as a learner",
                self.id
            ));
        }
        if self.known_leader(&metrics).is_none() {
            return Err(self.voters_heard().unwrap_or_else(|| {
                "no leader is known (an election is under way, or no quorum)".into()
            }));
        }
        Ok(())
    }

    /// What this node refuses now, or is about to, and why: new writes while the disk is under
    /// its reserve; writes past the quota once the state holds 95 % of it.
    pub fn alarms(&self) -> Vec<String> {
        let mut alarms: Vec<String> = self.disk.alarm().into_iter().collect();
        let (used, quota) = (self.sm.state_bytes(), self.sm.quota());
        if used.saturating_mul(20) >= quota.saturating_mul(19) {
            alarms.push(format!(
                "the state holds {} of its quota of {}: writes that would pass it are refused (delete resources, or raise --quota-bytes)",
                proto::bytes_label(used),
                proto::bytes_label(quota)
            ));
        }
        alarms
    }

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
        let leader = self
            .known_leader(&metrics)
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
            recent: self.storage_metrics.apply.summary(),
            disk_free_bytes: self.disk.free(),
            alarms: self.alarms(),
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
                let reachable = *id == self.id
                    || (metrics.replication.is_some()
                        && self
                            .contacts
                            .since(*id)
                            .is_some_and(|since| since < REACHABLE_WITHIN));
                MemberStatus {
                    node_id: *id,
                    node: node.clone(),
                    voter: voters.contains(id),
                    leader: metrics.current_leader == Some(*id),
                    match_index,
                    lag: match_index
                        .filter(|_| reachable)
                        .map(|index| last_log.saturating_sub(index)),
                    reachable,
                }
            })
            .collect()
    }

    /// Waits until this node's state machine is found damaged (a record failed its checksum)
    /// and returns what and where; never returns otherwise.
    pub async fn damaged(&self) -> String {
        let mut damage = self.sm.damage();
        let found = damage
            .wait_for(Option::is_some)
            .await
            .map(|found| found.clone().unwrap_or_default());
        match found {
            Ok(why) => why,
            // The sender lives as long as the state machine, which outlives this backend.
            Err(_) => std::future::pending().await,
        }
    }

    /// The damage found in this node's state machine, if any.
    pub fn damage_found(&self) -> Option<String> {
        self.sm.damage().borrow().clone()
    }

    /// Waits until raft on this node stops on a fatal error and returns it; `None` when raft
    /// shuts down normally. A node whose raft stopped can serve nothing that needs it.
    ///
    /// Looks twice a second rather than at every change of raft's metrics: they change at
    /// every commit, and a task woken for each cost about 4 µs of CPU per write on every node.
    pub async fn halted(&self) -> Option<String> {
        const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
        // `Stopped` is how raft reports a normal shutdown.
        let fatal =
            |metrics: &tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, NodeAddr>>| {
                match &metrics.borrow().running_state {
                    Err(openraft::error::Fatal::Stopped) | Ok(()) => None,
                    Err(fatal) => Some(fatal.to_string()),
                }
            };
        let metrics = self.raft.metrics();
        loop {
            if let Some(why) = fatal(&metrics) {
                return Some(why);
            }
            // Ended (cleanly, or with a fatal error sent just before), or stopped normally.
            if metrics.has_changed().is_err() || metrics.borrow().running_state.is_err() {
                return fatal(&metrics);
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Whether node `id` may speak to this node's raft service (DESIGN §12.2): a voter or
    /// learner of the latest membership this node knows, or a member of the cluster it is
    /// joining (see [`RaftNode::expect_peers`]).
    pub fn admits_peer(&self, id: NodeId) -> bool {
        names_node(&self.raft, id)
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

    /// Admits `id` too: a member this node's log does not name yet (it missed the join) but
    /// another member vouched for.
    pub fn vouched_peer(&self, id: NodeId) {
        self.joining_through
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id);
    }

    /// Asks the other members this node knows whether `id` is a member now (this node's log may
    /// be behind a membership change); admits it when one says so.
    pub async fn ask_members_about(&self, id: NodeId) -> bool {
        use proto::cluster::v1::MembersRequest;
        use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
        let known: Vec<(NodeId, NodeAddr)> = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .filter(|(node, _)| **node != self.id && **node != id)
            .map(|(node, addr)| (*node, addr.clone()))
            .collect();
        for (node, addr) in known {
            let Ok(endpoint) = self.dialer.endpoint(&addr.api_addr, Some(node)) else {
                continue;
            };
            let Ok(channel) = endpoint.connect().await else {
                continue;
            };
            let mut request = tonic::Request::new(MembersRequest {});
            request.set_timeout(std::time::Duration::from_secs(2));
            let Ok(reply) = ClusterServiceClient::new(channel).members(request).await else {
                continue;
            };
            if reply.get_ref().members.iter().any(|m| m.node_id == id) {
                tracing::info!(
                    node = id,
                    vouched_by = node,
                    "a member this node's log does not name yet is one now"
                );
                self.vouched_peer(id);
                return true;
            }
        }
        false
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
    pub async fn add_voter(
        &self,
        id: NodeId,
        node: NodeAddr,
        deadline: std::time::Instant,
    ) -> Result<(), MembershipError> {
        let _one_at_a_time = self.membership.lock().await;
        self.settle_membership(deadline).await;
        let raft_addr = node.raft_addr.clone();
        self.raft
            .add_learner(id, node, false)
            .await
            .map_err(|error| {
                membership_error(format!("cannot add node {id} as a learner"), error)
            })?;
        if let Err(why) = self.wait_caught_up(id, deadline).await {
            // Never leave a learner (let alone a voter) that cannot follow behind.
            let removed = self
                .raft
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
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|error| membership_error(format!("cannot make node {id} a voter"), error))?;
        Ok(())
    }

    /// Waits until learner `id` answers and holds the leader's log as it was when the wait
    /// began: unreachable for [`UNREACHABLE_GIVE_UP`], or not caught up by `deadline`, fails.
    async fn wait_caught_up(&self, id: NodeId, deadline: std::time::Instant) -> Result<(), String> {
        let started = std::time::Instant::now();
        let target = self.metrics().last_log_index.unwrap_or(0);
        let mut metrics = self.raft.metrics();
        loop {
            let matched = metrics
                .borrow_and_update()
                .replication
                .as_ref()
                .and_then(|replication| replication.get(&id).copied().flatten())
                .map(|log_id| log_id.index);
            // Heard from since the wait began (not a stale contact of an earlier incarnation).
            let answered = self
                .contacts
                .since(id)
                .is_some_and(|since| since <= started.elapsed());
            if answered && matched.is_some_and(|index| index >= target) {
                return Ok(());
            }
            let now = std::time::Instant::now();
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
                .min(std::time::Duration::from_millis(200));
            let _ = tokio::time::timeout(wait, metrics.changed()).await;
        }
    }

    /// Prepares moving leadership to `target` (DESIGN §8): it must be a reachable voter; this
    /// leader stops proposing, waits until `target` holds its whole log, stops heartbeats and
    /// waits out the followers' leader lease, so `target`'s campaign can win. Dropping the
    /// returned pause resumes proposing and heartbeats (harmless once another node leads).
    pub async fn pause_for_transfer(
        &self,
        target: NodeId,
        deadline: std::time::Instant,
    ) -> Result<TransferPause, String> {
        let until = tokio::time::Instant::from_std(deadline);
        tracing::info!(
            to = target,
            "leadership transfer: waiting for membership changes in progress"
        );
        let membership = tokio::time::timeout_at(until, self.membership.clone().lock_owned())
            .await
            .map_err(|_| {
                "a membership change in progress did not finish before the deadline".to_owned()
            })?;
        let member = self
            .members()
            .into_iter()
            .find(|m| m.node_id == target)
            .ok_or_else(|| format!("node {target} is not a member"))?;
        if !member.voter {
            return Err(format!("node {target} is a learner, not a voter"));
        }
        if !member.reachable {
            return Err(format!("node {target} is not reachable from the leader"));
        }
        tracing::info!(
            to = target,
            "leadership transfer: pausing new writes, waiting for those in flight"
        );
        let permits = tokio::time::timeout_at(
            until,
            self.proposal_permits
                .clone()
                .acquire_many_owned(super::proposer::MAX_PROPOSALS_IN_FLIGHT as u32),
        )
        .await
        .map_err(|_| "writes in flight did not finish before the deadline".to_owned())?
        .map_err(|_| "this node is shutting down".to_owned())?;
        tracing::info!(
            to = target,
            "leadership transfer: waiting for the target to hold the whole log"
        );
        let pause = TransferPause {
            raft: self.raft.clone(),
            _permits: permits,
            _membership: membership,
        };
        // Nothing new is proposed now: wait for the target to hold everything there is.
        let mut metrics = self.raft.metrics();
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
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "node {target} did not catch up before the deadline (holds {}, the leader {})",
                    matched.unwrap_or(0),
                    last.unwrap_or(0)
                ));
            }
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), metrics.changed())
                .await;
        }
        self.raft.runtime_config().heartbeat(false);
        tracing::info!(
            to = target,
            lease_ms = self.leader_lease.as_millis() as u64,
            "leadership transfer: heartbeats stopped, waiting out the followers' leader lease"
        );
        tokio::time::sleep(self.leader_lease + std::time::Duration::from_millis(100)).await;
        Ok(pause)
    }

    /// Campaigns for leadership (this node was chosen by a transfer) and waits until it leads.
    pub async fn campaign(&self, deadline: std::time::Instant) -> Result<(), String> {
        if !self.is_voter(self.id) {
            return Err(format!("node {} is not a voter", self.id));
        }
        if self.repairing() {
            return Err(format!(
                "node {} is being repaired from the leader after its log or state was damaged: it does not lead until repaired",
                self.id
            ));
        }
        let mut metrics = self.raft.metrics();
        let mut next_try = std::time::Instant::now();
        loop {
            if metrics.borrow_and_update().current_leader == Some(self.id) {
                return Ok(());
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                let leader = self.metrics().current_leader;
                return Err(match leader {
                    Some(other) => format!("node {other} leads instead; try again"),
                    None => "the election did not finish before the deadline".to_owned(),
                });
            }
            if now >= next_try {
                self.raft
                    .trigger()
                    .elect()
                    .await
                    .map_err(|error| format!("cannot start an election: {error}"))?;
                next_try = now + self.leader_lease;
            }
            let _ = tokio::time::timeout(std::time::Duration::from_millis(100), metrics.changed())
                .await;
        }
    }

    /// The voter a transfer with no target goes to: reachable, other than this node, holding
    /// the most of the log.
    pub fn transfer_candidate(&self) -> Option<NodeId> {
        self.members()
            .into_iter()
            .filter(|m| m.voter && m.reachable && m.node_id != self.id)
            .max_by_key(|m| m.match_index.unwrap_or(0))
            .map(|m| m.node_id)
    }

    /// Tells node `id` (at `raft_addr`) that it was removed, so it stops serving (best effort,
    /// a few tries over ~10 s: a node that is down learns it... never from us, and keeps
    /// failing to be elected). The notice names the configuration that removed it, and the
    /// tries stop once the node is a member again: a node that rejoins (with an empty data
    /// directory, under the same id) must not take a late notice for itself.
    pub fn notify_removed(&self, id: NodeId, raft_addr: String, cluster_name: String) {
        let dialer = self.dialer.clone();
        let by = self.id;
        let raft = self.raft.clone();
        let membership_index = self
            .metrics()
            .membership_config
            .log_id()
            .map_or(0, |log_id| log_id.index);
        tokio::spawn(async move {
            let Ok(mut client) = super::super::network::raft_client(&dialer, &raft_addr, id) else {
                return;
            };
            for attempt in 0..5u32 {
                if names_node(&raft, id) {
                    return;
                }
                let notice = proto::raft::v1::RemovedNotice {
                    node_id: id,
                    by_node_id: by,
                    cluster_name: cluster_name.clone(),
                    membership_index,
                };
                let mut request = tonic::Request::new(notice);
                request.set_timeout(std::time::Duration::from_secs(2));
                match client.removed(request).await {
                    Ok(_) => return,
                    Err(status) => {
                        tracing::debug!(node = id, %status, attempt, "telling a removed node failed")
                    }
                }
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
        });
    }

    /// Whether removing `id` keeps the cluster safe (DESIGN §8): never the last voter, and
    /// (unless `force`) never below a quorum of reachable voters. Must run on the leader.
    pub fn check_removal(&self, id: NodeId, force: bool) -> Result<(), String> {
        let members = self.members();
        let Some(removed) = members.iter().find(|m| m.node_id == id) else {
            return Err(format!("node {id} is not a member"));
        };
        if !removed.voter {
            return Ok(());
        }
        let remaining: Vec<&MemberStatus> = members
            .iter()
            .filter(|m| m.voter && m.node_id != id)
            .collect();
        if remaining.is_empty() {
            return Err(format!(
                "node {id} is the last voter: removing it would leave no cluster"
            ));
        }
        let reachable = remaining.iter().filter(|m| m.reachable).count();
        let quorum = remaining.len() / 2 + 1;
        if reachable < quorum && !force {
            return Err(format!(
                "removing node {id} would leave {reachable} reachable of {} voters, less than a quorum of {quorum}; bring members back first, or remove with force",
                remaining.len()
            ));
        }
        Ok(())
    }

    /// Waits (at most [`MEMBERSHIP_SETTLE`], and not past `deadline`) until the configuration in
    /// effect is applied, so committed. A leader just elected, or just done with a change, has
    /// its configuration committed within a round trip; a change asked for in between would
    /// otherwise be refused as one that overlaps an earlier change. A configuration that does
    /// not commit in that time is left to the change itself to report.
    async fn settle_membership(&self, deadline: std::time::Instant) {
        let until = deadline.min(std::time::Instant::now() + MEMBERSHIP_SETTLE);
        let mut metrics = self.raft.metrics();
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
                tokio::time::timeout_at(tokio::time::Instant::from_std(until), metrics.changed())
                    .await;
            if !matches!(waited, Ok(Ok(()))) {
                return;
            }
        }
    }

    /// Removes a node from the voters and the cluster. Must run on the leader.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        let _one_at_a_time = self.membership.lock().await;
        self.settle_membership(std::time::Instant::now() + MEMBERSHIP_SETTLE)
            .await;
        // `retain: false`: a voter leaving the configuration leaves the membership too.
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
            .await
            .map_err(|error| {
                membership_error(format!("cannot remove node {id} from the voters"), error)
            })?;
        // A learner is removed with a second change — never by a leader that just removed
        // itself: it is no longer the leader, and openraft asserts it is when it changes
        // membership (a race that stopped its raft).
        let still_listed = self.members().iter().any(|member| member.node_id == id);
        if still_listed && id != self.id {
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(|error| membership_error(format!("cannot remove node {id}"), error))?;
        }
        Ok(())
    }
}

/// Whether the latest membership this node knows names node `id` (voter or learner).
fn names_node(raft: &Raft, id: NodeId) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .get_node(&id)
        .is_some()
}
