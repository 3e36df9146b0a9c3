//! What a node knows about itself and its cluster (role, indexes, members and their progress),
//! and the primitives membership changes are made of (`crate::cluster` makes them).

use std::collections::{BTreeMap, BTreeSet};

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
pub(crate) struct StorageSample {
    /// Resources per `group.Kind`.
    pub resources: Vec<(String, u64)>,
    /// Bytes on disk per LMDB environment (`log`, `state`).
    pub lmdb_bytes: Vec<(&'static str, u64)>,
}

/// A node's raft role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

/// What a node knows about itself and the cluster.
#[derive(Debug, Clone)]
pub(crate) struct NodeStatus {
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
pub(crate) struct MemberStatus {
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

/// A member the leader has not heard from for this long counts as unreachable.
pub(super) const REACHABLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

impl RaftNode {
    /// Resources per `group.Kind` and the size of each LMDB environment, for the metrics.
    pub(crate) fn storage_sample(&self) -> StorageSample {
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
    pub(crate) fn serving(&self) -> Result<(), String> {
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
    pub(crate) fn alarms(&self) -> Vec<String> {
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

    pub(crate) fn status(&self) -> NodeStatus {
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
    pub(crate) fn members(&self) -> Vec<MemberStatus> {
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
    pub(crate) async fn damaged(&self) -> String {
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
    pub(crate) fn damage_found(&self) -> Option<String> {
        self.sm.damage().borrow().clone()
    }

    /// Waits until raft on this node stops on a fatal error and returns it; `None` when raft
    /// shuts down normally. A node whose raft stopped can serve nothing that needs it.
    ///
    /// Looks twice a second rather than at every change of raft's metrics: they change at
    /// every commit, and a task woken for each cost about 4 µs of CPU per write on every node.
    pub(crate) async fn halted(&self) -> Option<String> {
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

    /// Whether the latest membership this node knows names node `id` (voter or learner).
    pub(crate) fn names(&self, id: NodeId) -> bool {
        names_node(&self.raft, id)
    }

    /// How long ago node `id` last answered a raft RPC of this node (`None`: never).
    pub(crate) fn last_heard(&self, id: NodeId) -> Option<std::time::Duration> {
        self.contacts.since(id)
    }

    /// How long followers refuse votes after hearing from the leader (openraft's leader lease).
    pub(crate) fn leader_lease(&self) -> std::time::Duration {
        self.leader_lease
    }

    /// How this node connects to its peers.
    pub(crate) fn dialer(&self) -> &crate::tls::Dialer {
        &self.dialer
    }

    /// Stops proposing: once every proposal permit is held, nothing new reaches the log (and
    /// what was in flight has been proposed). Proposing resumes when the permits are dropped.
    pub(crate) async fn pause_proposals(
        &self,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError> {
        self.proposal_permits
            .clone()
            .acquire_many_owned(super::proposer::MAX_PROPOSALS_IN_FLIGHT as u32)
            .await
    }

    pub(crate) fn is_voter(&self, id: NodeId) -> bool {
        self.metrics()
            .membership_config
            .membership()
            .voter_ids()
            .any(|voter| voter == id)
    }

    /// Initializes a new single-voter cluster of this node, unless this node already belongs to
    /// one. Returns whether it initialized.
    pub(crate) async fn bootstrap(&self) -> Result<bool, StorageError> {
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
}

/// Whether the latest membership this node knows names node `id` (voter or learner).
pub(crate) fn names_node(raft: &Raft, id: NodeId) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .get_node(&id)
        .is_some()
}
