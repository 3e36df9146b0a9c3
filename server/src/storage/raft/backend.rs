//! [`RaftBackend`]: the storage contract over a Raft group.
//!
//! Writes and strong reads run on the leader: a leader proposes the command (or confirms its
//! leadership with `ensure_linearizable` before a strong read); a follower forwards the request
//! over `resd.raft.v1.RaftService/Forward`. While there is no leader, requests wait for one up to
//! the forward timeout, then fail with [`StorageError::Inconsistent`]. Eventual reads, owner
//! lookups and watches are served from this node's state machine.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, RaftMetrics, SnapshotPolicy};
use proto::raft::v1::raft_service_client::RaftServiceClient;
use proto::raft::v1::{
    self as pb, forward_request::Request as Fwd, forward_response::Response as FwdResponse,
};
use proto::resource::v1::{Id, Resource, Tenancy};
use tonic::transport::Channel;

use super::log_store::{LogStats, LogStore};
use super::network::{self, NetworkFactory};
use super::state_machine::{SmShared, StateMachineStore};
use super::types::{NodeAddr, NodeId, Raft};
use crate::storage::{Backend, Consistency, StorageError, UnversionedType, Watch};

/// How a node runs its part of the Raft group.
#[derive(Debug, Clone)]
pub struct RaftOptions {
    pub node_id: NodeId,
    pub data_dir: PathBuf,
    /// Addresses other nodes and clients use to reach this one.
    pub node: NodeAddr,
    /// Build a snapshot (and purge the log behind it) every this many applied entries.
    pub snapshot_every: u64,
    /// How long a request waits for a leader before failing with `Unavailable`.
    pub forward_timeout: Duration,
    pub heartbeat: Duration,
    pub election_timeout: (Duration, Duration),
}

impl RaftOptions {
    pub fn new(node_id: NodeId, data_dir: PathBuf, node: NodeAddr) -> Self {
        RaftOptions {
            node_id,
            data_dir,
            node,
            snapshot_every: 10_000,
            forward_timeout: Duration::from_secs(10),
            heartbeat: Duration::from_millis(150),
            election_timeout: (Duration::from_millis(750), Duration::from_millis(1500)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RaftStartError {
    #[error("cannot open the raft log in {dir}: {source}")]
    Log { dir: PathBuf, source: heed::Error },
    #[error("cannot open the state machine in {dir}: {source}")]
    StateMachine {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid raft configuration: {0}")]
    Config(String),
    #[error("raft failed to start: {0}")]
    Fatal(String),
}

pub struct RaftBackend {
    id: NodeId,
    node: NodeAddr,
    raft: Raft,
    sm: Arc<SmShared>,
    log_stats: Arc<LogStats>,
    forward_timeout: Duration,
    /// Clients of peers' raft services, by raft address.
    peers: Mutex<HashMap<String, RaftServiceClient<Channel>>>,
    /// One membership change at a time: raft refuses a change while another is in flight.
    membership: tokio::sync::Mutex<()>,
    /// Whether this node leads, for placing singleton controllers.
    leadership: tokio::sync::watch::Receiver<bool>,
    leadership_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Writes and deletes waiting to be proposed.
    proposals: tokio::sync::mpsc::Sender<Proposal>,
    proposer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Publishes whether this node leads whenever raft's metrics change.
async fn follow_leadership(raft: Raft, leading: tokio::sync::watch::Sender<bool>) {
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

/// A write or delete waiting for the proposer, and where its outcome goes.
struct Proposal {
    operation: pb::batch_operation::Operation,
    reply: tokio::sync::oneshot::Sender<Attempt>,
}

/// Most operations in one batch entry.
const MAX_BATCH_OPERATIONS: usize = 1024;
/// Most encoded bytes of resources in one batch entry.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Batches proposed at once. One measured best on loopback (openraft 0.9 appends entries one at
/// a time anyway, so more in flight only splits the queue into smaller batches).
const MAX_PROPOSALS_IN_FLIGHT: usize = 1;

/// Gathers queued operations into batches and proposes them, up to
/// `MAX_PROPOSALS_IN_FLIGHT` at a time, until every sender is gone.
async fn run_proposer(raft: Raft, mut queue: tokio::sync::mpsc::Receiver<Proposal>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_PROPOSALS_IN_FLIGHT));
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let Some(first) = queue.recv().await else {
            break;
        };
        let mut batch = vec![first];
        let mut bytes = 0;
        while batch.len() < MAX_BATCH_OPERATIONS && bytes < MAX_BATCH_BYTES {
            match queue.try_recv() {
                Ok(proposal) => {
                    bytes += operation_size(&proposal.operation);
                    batch.push(proposal);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        in_flight.spawn(async move {
            propose_batch(&raft, batch).await;
            drop(permit);
        });
        // Reap finished proposals so the set does not grow.
        while in_flight.try_join_next().is_some() {}
    }
    while in_flight.join_next().await.is_some() {}
}

fn operation_size(operation: &pb::batch_operation::Operation) -> usize {
    match operation {
        pb::batch_operation::Operation::WriteCas(write) => prost::Message::encoded_len(write),
        pb::batch_operation::Operation::DeleteCas(delete) => prost::Message::encoded_len(delete),
    }
}

/// Proposes one batch and hands each operation its outcome. A batch of one is proposed as a
/// plain command, so an unbatched write's version is exactly its log index.
async fn propose_batch(raft: &Raft, mut batch: Vec<Proposal>) {
    if batch.len() == 1 {
        let Some(proposal) = batch.pop() else { return };
        let command = match proposal.operation {
            pb::batch_operation::Operation::WriteCas(write) => {
                pb::command::Command::WriteCas(write)
            }
            pb::batch_operation::Operation::DeleteCas(delete) => {
                pb::command::Command::DeleteCas(delete)
            }
        };
        let _ = proposal.reply.send(propose_command(raft, command).await);
        return;
    }
    let (operations, replies): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|proposal| {
            (
                pb::BatchOperation {
                    operation: Some(proposal.operation),
                },
                proposal.reply,
            )
        })
        .unzip();
    let command = pb::Command {
        command: Some(pb::command::Command::Batch(pb::Batch { operations })),
    };
    match raft.client_write(super::types::Shared::new(command)).await {
        Ok(written) => {
            let results = match written.data.0.result {
                Some(pb::command_result::Result::Batch(batch)) => batch.results,
                other => {
                    let error = StorageError::Internal(format!("a batch applied to {other:?}"));
                    for reply in replies {
                        let _ = reply.send(Attempt::done(failed(&error)));
                    }
                    return;
                }
            };
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Attempt::done(forward_response_of(result)));
            }
        }
        Err(error) => {
            let attempt = attempt_of_write_error(error);
            for reply in replies {
                let _ = reply.send(attempt.clone());
            }
        }
    }
}

/// Proposes one command as its own entry.
async fn propose_command(raft: &Raft, command: pb::command::Command) -> Attempt {
    let command = pb::Command {
        command: Some(command),
    };
    match raft.client_write(super::types::Shared::new(command)).await {
        Ok(written) => Attempt::done(forward_response_of(written.data.0)),
        Err(error) => attempt_of_write_error(error),
    }
}

fn forward_response_of(result: pb::CommandResult) -> pb::ForwardResponse {
    match result.result {
        Some(pb::command_result::Result::Written(resource)) => {
            response(FwdResponse::Resource(resource))
        }
        Some(pb::command_result::Result::Done(done)) => response(FwdResponse::Done(done)),
        Some(pb::command_result::Result::Failure(failure)) => {
            response(FwdResponse::Failure(failure))
        }
        Some(pb::command_result::Result::Batch(_)) | None => failed(&StorageError::Internal(
            "the state machine returned no result for a write".into(),
        )),
    }
}

fn attempt_of_write_error(error: RaftError<NodeId, ClientWriteError<NodeId, NodeAddr>>) -> Attempt {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            Attempt::Retry(format!("leadership moved to {:?}", forward.leader_id))
        }
        RaftError::APIError(error) => {
            Attempt::done(failed(&StorageError::Internal(error.to_string())))
        }
        RaftError::Fatal(fatal) => Attempt::done(failed(&StorageError::Inconsistent(format!(
            "raft stopped: {fatal}"
        )))),
    }
}

impl std::fmt::Debug for RaftBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftBackend")
            .field("id", &self.id)
            .field("node", &self.node)
            .finish_non_exhaustive()
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

/// One try at serving a request: done (either way), or worth retrying (no or another leader).
#[derive(Clone)]
enum Attempt {
    Done(Box<pb::ForwardResponse>),
    Retry(String),
}

impl Attempt {
    fn done(response: pb::ForwardResponse) -> Attempt {
        Attempt::Done(Box::new(response))
    }
}

fn response(result: FwdResponse) -> pb::ForwardResponse {
    pb::ForwardResponse {
        response: Some(result),
    }
}

fn failed(error: &StorageError) -> pb::ForwardResponse {
    response(FwdResponse::Failure(network::failure_of(error)))
}

impl RaftBackend {
    pub async fn open(options: RaftOptions) -> Result<Arc<RaftBackend>, RaftStartError> {
        let log = LogStore::open(&options.data_dir).map_err(|source| RaftStartError::Log {
            dir: options.data_dir.clone(),
            source,
        })?;
        let sm = StateMachineStore::open(&options.data_dir).map_err(|source| {
            RaftStartError::StateMachine {
                dir: options.data_dir.clone(),
                source,
            }
        })?;
        let config = openraft::Config {
            cluster_name: "resd".into(),
            heartbeat_interval: options.heartbeat.as_millis() as u64,
            election_timeout_min: options.election_timeout.0.as_millis() as u64,
            election_timeout_max: options.election_timeout.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(options.snapshot_every),
            max_in_snapshot_log_to_keep: options.snapshot_every.min(1000),
            ..Default::default()
        }
        .validate()
        .map_err(|error| RaftStartError::Config(error.to_string()))?;
        let log_stats = log.stats();
        let shared = sm.shared.clone();
        let raft = Raft::new(options.node_id, Arc::new(config), NetworkFactory, log, sm)
            .await
            .map_err(|error| RaftStartError::Fatal(error.to_string()))?;
        let (leading, leadership) = tokio::sync::watch::channel(false);
        let leadership_task = tokio::spawn(follow_leadership(raft.clone(), leading));
        let (proposals, queue) = tokio::sync::mpsc::channel(4 * MAX_BATCH_OPERATIONS);
        let proposer = tokio::spawn(run_proposer(raft.clone(), queue));
        Ok(Arc::new(RaftBackend {
            id: options.node_id,
            node: options.node,
            raft,
            sm: shared,
            log_stats,
            forward_timeout: options.forward_timeout,
            peers: Mutex::new(HashMap::new()),
            membership: tokio::sync::Mutex::new(()),
            leadership,
            leadership_task: Mutex::new(Some(leadership_task)),
            proposals,
            proposer: Mutex::new(Some(proposer)),
        }))
    }

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn node(&self) -> &NodeAddr {
        &self.node
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    pub fn metrics(&self) -> RaftMetrics<NodeId, NodeAddr> {
        self.raft.metrics().borrow().clone()
    }

    pub fn log_stats(&self) -> &LogStats {
        &self.log_stats
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
        let leader = metrics
            .current_leader
            .map(|id| (id, membership.get_node(&id).cloned().unwrap_or_default()));
        let applied_index = metrics.last_applied.map(|l| l.index).unwrap_or(0);
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

    /// Whether a node is already a voter with these addresses.
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

    /// Waits until some node is leader; `Inconsistent` once the deadline passes.
    async fn wait_for_leader(
        &self,
        deadline: Instant,
    ) -> Result<(NodeId, Option<NodeAddr>), StorageError> {
        let mut metrics = self.raft.metrics();
        loop {
            let (leader, node) = {
                let current = metrics.borrow();
                let leader = current.current_leader;
                let node = leader.and_then(|id| {
                    current
                        .membership_config
                        .membership()
                        .get_node(&id)
                        .cloned()
                });
                (leader, node)
            };
            if let Some(leader) = leader {
                return Ok((leader, node));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(StorageError::Inconsistent(
                    "no raft leader was elected before the request's deadline".into(),
                ));
            }
            let _ = tokio::time::timeout(remaining, metrics.changed()).await;
        }
    }

    /// Runs a request on the leader, forwarding it when this node is not the leader, and waiting
    /// through elections up to the forward timeout.
    async fn submit(&self, request: pb::ForwardRequest) -> pb::ForwardResponse {
        let deadline = crate::storage::deadline::bounded(self.forward_timeout);
        let mut last_reason = String::new();
        loop {
            let attempt = match self.wait_for_leader(deadline).await {
                Err(error) => {
                    let why = if last_reason.is_empty() {
                        error.to_string()
                    } else {
                        format!("{error} (last: {last_reason})")
                    };
                    return failed(&StorageError::Inconsistent(why));
                }
                Ok((leader, _)) if leader == self.id => self.serve_locally(request.clone()).await,
                Ok((leader, Some(node))) => self.forward(leader, &node, request.clone()).await,
                Ok((leader, None)) => {
                    Attempt::Retry(format!("leader {leader} has no known address"))
                }
            };
            match attempt {
                Attempt::Done(response) => return *response,
                Attempt::Retry(reason) => {
                    if Instant::now() >= deadline {
                        return failed(&StorageError::Inconsistent(format!(
                            "could not reach a raft leader before the request's deadline: {reason}"
                        )));
                    }
                    last_reason = reason;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        node: &NodeAddr,
        request: pb::ForwardRequest,
    ) -> Attempt {
        let client = {
            let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            match peers.get(&node.raft_addr) {
                Some(client) => client.clone(),
                None => match network::raft_client(&node.raft_addr) {
                    Ok(client) => {
                        peers.insert(node.raft_addr.clone(), client.clone());
                        client
                    }
                    Err(why) => return Attempt::Retry(why),
                },
            }
        };
        let mut client = client;
        let mut call = tonic::Request::new(request);
        call.set_timeout(
            crate::storage::deadline::bounded(self.forward_timeout)
                .saturating_duration_since(Instant::now()),
        );
        match client.forward(call).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                match &reply.response {
                    // The node we asked was not (or no longer) the leader: ask again.
                    Some(FwdResponse::Failure(failure))
                        if failure.code == pb::storage_failure::Code::Inconsistent as i32 =>
                    {
                        Attempt::Retry(format!("node {leader}: {}", failure.message))
                    }
                    _ => Attempt::done(reply),
                }
            }
            Err(status) => Attempt::Retry(format!(
                "forwarding to leader {leader} at {}: {}",
                node.raft_addr,
                status.message()
            )),
        }
    }

    /// Serves a request forwarded by a follower (or submitted here while this node leads).
    pub async fn serve_forwarded(&self, request: pb::ForwardRequest) -> pb::ForwardResponse {
        match self.serve_locally(request).await {
            Attempt::Done(response) => *response,
            Attempt::Retry(reason) => failed(&StorageError::Inconsistent(reason)),
        }
    }

    async fn serve_locally(&self, request: pb::ForwardRequest) -> Attempt {
        match request.request {
            None => Attempt::done(failed(&StorageError::Internal(
                "empty forwarded request".into(),
            ))),
            Some(Fwd::WriteCas(write)) => {
                self.propose_batched(pb::batch_operation::Operation::WriteCas(write))
                    .await
            }
            Some(Fwd::DeleteCas(delete)) => {
                self.propose_batched(pb::batch_operation::Operation::DeleteCas(delete))
                    .await
            }
            Some(Fwd::Read(id)) => match self.linearize().await {
                Err(attempt) => attempt,
                Ok(()) => Attempt::done(match self.sm.read(&id) {
                    Ok(resource) => response(FwdResponse::Resource(resource)),
                    Err(error) => failed(&error),
                }),
            },
            Some(Fwd::ReadIndex(_)) => match self.raft.ensure_linearizable().await {
                Ok(read_log_id) => Attempt::done(response(FwdResponse::ReadIndex(
                    read_log_id.map(|log_id| log_id.index).unwrap_or(0),
                ))),
                Err(RaftError::APIError(error)) => {
                    Attempt::Retry(format!("not the leader: {error}"))
                }
                Err(RaftError::Fatal(fatal)) => Attempt::done(failed(&StorageError::Inconsistent(
                    format!("raft stopped: {fatal}"),
                ))),
            },
            Some(Fwd::List(query)) => match self.linearize().await {
                Err(attempt) => attempt,
                Ok(()) => {
                    let resource_type = UnversionedType {
                        group: query.group,
                        kind: query.kind,
                    };
                    let tenancy = query.tenancy.unwrap_or_default();
                    Attempt::done(
                        match self.sm.list(&resource_type, &tenancy, &query.name_prefix) {
                            Ok(resources) => {
                                response(FwdResponse::Resources(pb::Resources { resources }))
                            }
                            Err(error) => failed(&error),
                        },
                    )
                }
            },
        }
    }

    /// Confirms leadership with a quorum and waits until this node has applied everything
    /// committed before the call.
    async fn linearize(&self) -> Result<(), Attempt> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(error)) => {
                Err(Attempt::Retry(format!("not the leader: {error}")))
            }
            Err(RaftError::Fatal(fatal)) => Err(Attempt::done(failed(
                &StorageError::Inconsistent(format!("raft stopped: {fatal}")),
            ))),
        }
    }

    /// Proposes a command as its own log entry (restores, and batches from the proposer).
    async fn propose(&self, command: pb::command::Command) -> Attempt {
        propose_command(&self.raft, command).await
    }

    /// Proposes a write or delete through the batching proposer: operations queued while a
    /// proposal is in flight travel together in one entry (one fsync per node for all of them).
    async fn propose_batched(&self, operation: pb::batch_operation::Operation) -> Attempt {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        let proposal = Proposal { operation, reply };
        if self.proposals.send(proposal).await.is_err() {
            return Attempt::done(failed(&StorageError::Inconsistent(
                "this node is shutting down".into(),
            )));
        }
        outcome.await.unwrap_or_else(|_| {
            Attempt::done(failed(&StorageError::Inconsistent(
                "this node is shutting down".into(),
            )))
        })
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

    /// Waits until this node has applied every write committed before the call (the raft
    /// "read index"): afterwards, local reads are linearizable. Returns the index.
    pub async fn read_barrier(&self) -> Result<u64, StorageError> {
        let reply = self
            .submit(pb::ForwardRequest {
                request: Some(Fwd::ReadIndex(pb::ReadIndex {})),
            })
            .await;
        let index = match reply.response {
            Some(FwdResponse::ReadIndex(index)) => index,
            Some(FwdResponse::Failure(failure)) => return Err(network::error_of(failure)),
            other => {
                return Err(StorageError::Internal(format!(
                    "unexpected reply {other:?}"
                )));
            }
        };
        let deadline = Instant::now() + self.forward_timeout;
        let mut metrics = self.raft.metrics();
        loop {
            let applied = metrics.borrow().last_applied.map(|l| l.index).unwrap_or(0);
            if applied >= index {
                return Ok(index);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(StorageError::Inconsistent(format!(
                    "this node did not apply index {index} within {:?}",
                    self.forward_timeout
                )));
            }
            let _ = tokio::time::timeout(remaining, metrics.changed()).await;
        }
    }

    /// A consistent snapshot of every resource as an operator snapshot file, in chunks.
    pub async fn export(
        &self,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>, StorageError>>, StorageError> {
        self.read_barrier().await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let sm = self.sm.clone();
        let node_id = self.id;
        // Detached on purpose: it ends when the export is done or the receiver is dropped.
        tokio::task::spawn_blocking(move || {
            if let Err(error) = sm.export_blocking(node_id, sender.clone()) {
                let _ = sender.blocking_send(Err(error));
            }
        });
        Ok(receiver)
    }

    /// Replaces the whole state with `resources` through raft: begin, chunks, commit. Returns the
    /// index at which the restored state took effect.
    pub async fn restore(&self, resources: Vec<Resource>) -> Result<u64, StorageError> {
        const CHUNK_BYTES: usize = 4 << 20;
        let restore_id = ulid::Ulid::new().to_string();
        self.run_command(pb::command::Command::RestoreBegin(pb::RestoreBegin {
            restore_id: restore_id.clone(),
        }))
        .await?;
        let mut chunk = Vec::new();
        let mut chunk_bytes = 0;
        for resource in resources {
            chunk_bytes += prost::Message::encoded_len(&resource);
            chunk.push(resource);
            if chunk_bytes >= CHUNK_BYTES {
                self.run_command(pb::command::Command::RestoreChunk(pb::RestoreChunk {
                    restore_id: restore_id.clone(),
                    resources: std::mem::take(&mut chunk),
                }))
                .await?;
                chunk_bytes = 0;
            }
        }
        if !chunk.is_empty() {
            self.run_command(pb::command::Command::RestoreChunk(pb::RestoreChunk {
                restore_id: restore_id.clone(),
                resources: chunk,
            }))
            .await?;
        }
        self.run_command(pb::command::Command::RestoreCommit(pb::RestoreCommit {
            restore_id,
        }))
        .await?;
        self.read_barrier().await
    }

    /// Proposes a command on the leader (this node must lead); waits through elections.
    async fn run_command(&self, command: pb::command::Command) -> Result<(), StorageError> {
        let deadline = Instant::now() + self.forward_timeout;
        loop {
            match self.propose(command.clone()).await {
                Attempt::Done(reply) => {
                    return match reply.response {
                        Some(FwdResponse::Failure(failure)) => Err(network::error_of(failure)),
                        _ => Ok(()),
                    };
                }
                Attempt::Retry(reason) if Instant::now() >= deadline => {
                    return Err(StorageError::Inconsistent(reason));
                }
                Attempt::Retry(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Whether this node is the leader, as it changes.
    pub fn leadership(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leadership.clone()
    }

    /// Stops raft on this node.
    pub async fn shutdown(&self) {
        let follower = self
            .leadership_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(follower) = follower {
            follower.abort();
            let _ = follower.await;
        }
        let proposer = self
            .proposer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(proposer) = proposer {
            proposer.abort();
            let _ = proposer.await;
        }
        if let Err(error) = self.raft.shutdown().await {
            tracing::warn!(%error, "raft did not shut down cleanly");
            return;
        }
        // Nothing applies any more: make the state machine durable so the next start uses it.
        if let Err(error) = self.sm.close_cleanly() {
            tracing::warn!(%error, "cannot sync the state machine; it will be rebuilt at the next start");
        }
    }

    pub fn state_machine(&self) -> &Arc<SmShared> {
        &self.sm
    }
}

fn into_resource(reply: pb::ForwardResponse) -> Result<Resource, StorageError> {
    match reply.response {
        Some(FwdResponse::Resource(resource)) => Ok(resource),
        Some(FwdResponse::Failure(failure)) => Err(network::error_of(failure)),
        other => Err(StorageError::Internal(format!(
            "unexpected reply {other:?}"
        ))),
    }
}

#[async_trait]
impl Backend for RaftBackend {
    async fn read(&self, consistency: Consistency, id: &Id) -> Result<Resource, StorageError> {
        match consistency {
            Consistency::Eventual => self.sm.read(id),
            Consistency::Strong => into_resource(
                self.submit(pb::ForwardRequest {
                    request: Some(Fwd::Read(id.clone())),
                })
                .await,
            ),
        }
    }

    async fn write_cas(&self, resource: Resource) -> Result<Resource, StorageError> {
        let request = pb::ForwardRequest {
            request: Some(Fwd::WriteCas(pb::WriteCas {
                resource: Some(resource),
            })),
        };
        into_resource(self.submit(request).await)
    }

    async fn delete_cas(&self, id: &Id, version: &str) -> Result<(), StorageError> {
        let request = pb::ForwardRequest {
            request: Some(Fwd::DeleteCas(pb::DeleteCas {
                id: Some(id.clone()),
                version: version.into(),
            })),
        };
        match self.submit(request).await.response {
            Some(FwdResponse::Done(_)) => Ok(()),
            Some(FwdResponse::Failure(failure)) => Err(network::error_of(failure)),
            other => Err(StorageError::Internal(format!(
                "unexpected reply {other:?}"
            ))),
        }
    }

    async fn list(
        &self,
        consistency: Consistency,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<Resource>, StorageError> {
        match consistency {
            Consistency::Eventual => self.sm.list(resource_type, tenancy, name_prefix),
            Consistency::Strong => {
                let request = pb::ForwardRequest {
                    request: Some(Fwd::List(pb::ListQuery {
                        group: resource_type.group.clone(),
                        kind: resource_type.kind.clone(),
                        tenancy: Some(tenancy.clone()),
                        name_prefix: name_prefix.into(),
                    })),
                };
                match self.submit(request).await.response {
                    Some(FwdResponse::Resources(list)) => Ok(list.resources),
                    Some(FwdResponse::Failure(failure)) => Err(network::error_of(failure)),
                    other => Err(StorageError::Internal(format!(
                        "unexpected reply {other:?}"
                    ))),
                }
            }
        }
    }

    async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, StorageError> {
        self.sm.list_by_owner(owner)
    }

    async fn watch_list(
        &self,
        resource_type: &UnversionedType,
        tenancy: &Tenancy,
        name_prefix: &str,
        since: Option<crate::storage::Version>,
    ) -> Result<Watch, StorageError> {
        self.sm
            .watch_list(resource_type, tenancy, name_prefix, since)
    }
}
