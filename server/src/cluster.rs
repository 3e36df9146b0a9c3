//! The cluster room: who belongs to this node's raft group, and every change of that (DESIGN §8
//! and §12.2). A membership rule is added here, and only here:
//! - [`change`]: joining (refused for a node whose removal its data remembers, or whose id is
//!   a member at other addresses), adding a voter (a learner first, promoted once it holds the
//!   leader's log, removed again when it cannot follow) and removing a member (never the last
//!   voter, never below a quorum of reachable voters unless forced); one change at a time, each
//!   after the configuration before it committed;
//! - [`transfer`]: handing leadership to another voter (proposals paused, the target caught
//!   up, heartbeats stopped for the followers' lease) and campaigning when chosen;
//! - [`notice`]: telling a removed node that it was removed;
//! - [`admission`]: which nodes may speak to this node's raft service: the members its log
//!   names, the members of the cluster it is joining, and those a member vouches for (asked over
//!   the internal raft service);
//! - [`join`]: a new node asking a cluster to add it, until it is a voter.
//!
//! The cluster service (`service::cluster`) takes a [`Cluster`]: it authenticates and
//! authorizes the caller, forwards a change to the leader and answers; what the cluster may do
//! is decided here. The node's primitives (openraft's handle, its metrics, pausing proposals)
//! are `storage::raft::node`'s.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use crate::storage::StorageError;
use crate::storage::raft::node::{MemberStatus, NodeStatus, RaftNode, RestoreChunks};
use crate::storage::raft::types::{NodeAddr, NodeId};

mod admission;
mod change;
pub(crate) mod join;
mod notice;
mod transfer;

pub(crate) use admission::Peers;
pub(crate) use change::{JoinOutcome, Joiner, MembershipError};
pub(crate) use transfer::Handover;

/// The chunks of an operator snapshot being exported.
pub(crate) type ExportChunks = tokio::sync::mpsc::Receiver<Result<Vec<u8>, StorageError>>;

pub(crate) use crate::storage::raft::node::BuiltIn;

/// What the cluster service asks of the cluster this node belongs to.
#[async_trait]
pub(crate) trait Cluster: Send + Sync + std::fmt::Debug {
    /// This node's id.
    fn id(&self) -> NodeId;
    /// What this node knows about itself and the cluster.
    fn status(&self) -> NodeStatus;
    /// The members as this node knows them (with progress when it leads).
    fn members(&self) -> Vec<MemberStatus>;
    /// Why this node does not serve now (`Ok`: it serves).
    fn serving(&self) -> Result<(), String>;
    /// Why this node was removed from the cluster, if it was.
    fn removed(&self) -> Option<crate::storage::Removal>;
    /// The node's data directory (files an operator leaves for it).
    fn data_dir(&self) -> PathBuf;
    /// Where uploaded operator snapshots are spooled.
    fn spool_dir(&self) -> PathBuf;
    /// A consistent operator snapshot of every resource, in chunks; refused if the state holds
    /// a resource of a type that is neither `built_in(group, kind)` nor registered by a Type.
    async fn export(&self, built_in: BuiltIn) -> Result<ExportChunks, StorageError>;
    /// Replaces the state with an operator snapshot's records; the index it was restored at.
    async fn restore(&self, chunks: RestoreChunks) -> Result<u64, StorageError>;
    /// Adds `joiner` as a voter (must run on the leader). `removed_at`: the raft address a
    /// recorded removal of the same id names.
    async fn join(
        &self,
        joiner: Joiner,
        removed_at: Option<String>,
        deadline: Instant,
    ) -> Result<JoinOutcome, MembershipError>;
    /// Removes member `id` (must run on the leader); the removed member's addresses.
    async fn remove(
        &self,
        id: NodeId,
        force: bool,
        deadline: Instant,
    ) -> Result<NodeAddr, MembershipError>;
    /// Tells node `id` that it was removed (best effort, in the background).
    fn notify_removed(&self, id: NodeId, raft_addr: String);
    /// Prepares handing leadership to `to` (the best voter when `None`); must run on the
    /// leader. The pause it holds ends when the handover is dropped.
    async fn prepare_handover(
        &self,
        to: Option<NodeId>,
        deadline: Instant,
    ) -> Result<Handover, MembershipError>;
    /// Campaigns for leadership (a transfer chose this node) until it leads or `deadline`.
    async fn campaign(&self, deadline: Instant) -> Result<(), MembershipError>;
}

/// The cluster of a raft node.
#[derive(Debug)]
pub(crate) struct RaftCluster {
    node: Arc<RaftNode>,
    peers: Arc<Peers>,
    /// The cluster's name, told to a node it removed.
    name: String,
    /// One membership change at a time: raft refuses a change while another is in flight.
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
}

impl RaftCluster {
    pub(crate) fn new(node: Arc<RaftNode>, peers: Arc<Peers>, name: String) -> Self {
        RaftCluster {
            node,
            peers,
            name,
            one_at_a_time: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Who may speak to this node's raft service.
    pub(crate) fn peers(&self) -> &Arc<Peers> {
        &self.peers
    }
}

#[async_trait]
impl Cluster for RaftCluster {
    fn id(&self) -> NodeId {
        self.node.id()
    }

    fn status(&self) -> NodeStatus {
        self.node.status()
    }

    fn members(&self) -> Vec<MemberStatus> {
        self.node.members()
    }

    fn serving(&self) -> Result<(), String> {
        self.node.serving()
    }

    fn removed(&self) -> Option<crate::storage::Removal> {
        self.node.removed()
    }

    fn data_dir(&self) -> PathBuf {
        self.node.data_dir().to_path_buf()
    }

    fn spool_dir(&self) -> PathBuf {
        self.node.spool_dir()
    }

    async fn export(&self, built_in: BuiltIn) -> Result<ExportChunks, StorageError> {
        self.node.export(built_in).await
    }

    async fn restore(&self, chunks: RestoreChunks) -> Result<u64, StorageError> {
        self.node.restore(chunks).await
    }

    async fn join(
        &self,
        joiner: Joiner,
        removed_at: Option<String>,
        deadline: Instant,
    ) -> Result<JoinOutcome, MembershipError> {
        change::join(self, joiner, removed_at, deadline).await
    }

    async fn remove(
        &self,
        id: NodeId,
        force: bool,
        deadline: Instant,
    ) -> Result<NodeAddr, MembershipError> {
        change::remove(self, id, force, deadline).await
    }

    fn notify_removed(&self, id: NodeId, raft_addr: String) {
        notice::notify_removed(&self.node, id, raft_addr, self.name.clone());
    }

    async fn prepare_handover(
        &self,
        to: Option<NodeId>,
        deadline: Instant,
    ) -> Result<Handover, MembershipError> {
        transfer::prepare_handover(self, to, deadline).await
    }

    async fn campaign(&self, deadline: Instant) -> Result<(), MembershipError> {
        transfer::campaign(&self.node, deadline).await
    }
}
