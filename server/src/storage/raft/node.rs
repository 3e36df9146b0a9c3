//! [`RaftNode`]: this node's part in the Raft group — openraft's handle, its log and state
//! machine, and what the storage contract ([`super::backend::RaftBackend`]) is built from.
//!
//! Writes and strong reads run on the leader: a leader proposes the change (or confirms its
//! leadership with `ensure_linearizable` before a strong read); a follower forwards the request
//! over `resd.raft.v1.RaftService/Forward`. While there is no leader, requests wait for one up to
//! the forward timeout, then fail with [`StorageError::Inconsistent`]. Eventual reads, owner
//! lookups and watches are served from this node's state machine.
//!
//! Rooms: [`proposer`] batches changes into entries; [`forward`] runs a request on the leader,
//! here or over the network; [`read_index`] shares leadership confirmations between reads;
//! [`readiness`] says whether this node serves; [`prevote`] keeps a node cut off from the
//! others from deposing a healthy leader; [`repair`] rebuilds damaged data from the leader;
//! [`status`] reports the node and its members and holds the primitives membership changes are
//! made of. This file holds the node's lifecycle and operator export and restore. Membership
//! itself (join, add voter, remove, transfer, peer admission) is `crate::cluster`'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::{RaftMetrics, SnapshotPolicy};
use proto::raft::v1::raft_service_client::RaftServiceClient;
use proto::resource::v1::Resource;
use tonic::transport::Channel;

use super::log_store::{LogStats, LogStore};
use super::network::NetworkFactory;
use super::op::{self, Op, Request};
use super::state_machine::{SmShared, StateMachineStore};
use super::types::{NodeAddr, NodeId, Raft};
use crate::storage::events::HistoryLimits;
use crate::storage::{Consistency, StorageError};
use crate::tls::Dialer;

mod forward;
mod prevote;
mod proposer;
mod read_index;
mod readiness;
mod repair;
mod retry;
mod status;

pub(crate) use readiness::Readiness;
pub(crate) use status::{MemberStatus, NodeStatus, Role, names_node};

/// Largest raft snapshot (and operator restore) accepted by default.
pub(crate) const DEFAULT_MAX_SNAPSHOT_BYTES: u64 = 8 << 30;

/// How a node runs its part of the Raft group.
#[derive(Debug, Clone)]
pub(crate) struct RaftOptions {
    pub node_id: NodeId,
    pub data_dir: PathBuf,
    /// Addresses other nodes and clients use to reach this one.
    pub node: NodeAddr,
    /// Build a snapshot (and purge the log behind it) once this many writes were applied since
    /// the last one, and no fewer than a quarter of the state's resources (`SnapshotCadence`).
    pub snapshot_every: u64,
    /// How long a request waits for a leader before failing with `Unavailable`.
    pub forward_timeout: Duration,
    pub heartbeat: Duration,
    pub election_timeout: (Duration, Duration),
    /// The watch history this node keeps.
    pub history: HistoryLimits,
    /// Largest raft snapshot this node accepts from a leader.
    pub max_snapshot_bytes: u64,
    /// How this node connects to its peers (plain, or TLS with its node certificate).
    pub dialer: Dialer,
    /// The cluster's name, recorded in the data directory with the node id.
    pub cluster_name: String,
    /// Where log commits, applies and batch sizes are recorded.
    pub metrics: crate::metrics::StorageMetrics,
    /// Free space on the data directory's disk below which new writes are refused.
    pub disk_reserve: u64,
    /// Bytes the state may hold (see [`super::schema::state_bytes`]); writes past it are
    /// refused. At most [`super::schema::MAX_QUOTA_BYTES`].
    pub quota_bytes: u64,
    /// Entries behind the leader's commit index past which a follower is not ready.
    pub max_lag_entries: u64,
}

impl RaftOptions {
    pub(crate) fn new(node_id: NodeId, data_dir: PathBuf, node: NodeAddr) -> Self {
        RaftOptions {
            node_id,
            data_dir,
            node,
            snapshot_every: 10_000,
            forward_timeout: Duration::from_secs(10),
            heartbeat: Duration::from_millis(150),
            election_timeout: (Duration::from_millis(750), Duration::from_millis(1500)),
            history: HistoryLimits::default(),
            max_snapshot_bytes: DEFAULT_MAX_SNAPSHOT_BYTES,
            dialer: Dialer::default(),
            cluster_name: "resd".into(),
            metrics: crate::metrics::StorageMetrics::default(),
            disk_reserve: DEFAULT_DISK_RESERVE,
            quota_bytes: super::schema::DEFAULT_QUOTA_BYTES,
            max_lag_entries: DEFAULT_MAX_LAG_ENTRIES,
        }
    }
}

/// Entries behind the leader past which a follower is not ready (a healthy follower under load
/// is a few entries behind; each entry carries a batch of writes).
pub(crate) const DEFAULT_MAX_LAG_ENTRIES: u64 = 256;

/// Free space below which new writes are refused: room for the log to roll a few segments and
/// the state machine to apply what is already committed.
pub(crate) const DEFAULT_DISK_RESERVE: u64 = 128 << 20;

/// What to do with damage a node cannot be repaired from.
const UNREPAIRABLE: &str = "This node knows no other voter to repair it from: if it belongs to a cluster whose other members hold the data, remove it there (`resctl cluster remove N` on a healthy member), move its data directory aside and join it again with an empty one; if it is the only node, start a new node and restore the latest operator snapshot into it (`resctl snapshot restore FILE`)";

#[derive(Debug, thiserror::Error)]
pub enum RaftStartError {
    // The cause is part of the message, not a `source` too: `resd: {error:#}` would print it
    // twice.
    #[error("cannot open the raft log in {dir}: {error}")]
    Log {
        dir: PathBuf,
        error: super::log_store::LogOpenError,
    },
    /// The state machine cannot be rebuilt and no other voter is known to repair it from.
    #[error("cannot open the state machine in {dir}: {why}. {UNREPAIRABLE}")]
    Unrebuildable { dir: PathBuf, why: String },
    /// The log is damaged and no other voter is known to repair it from.
    #[error("cannot open the raft log in {dir}: {error}. {UNREPAIRABLE}")]
    Damaged {
        dir: PathBuf,
        error: super::log_store::LogOpenError,
    },
    #[error("cannot open the state machine in {dir}: {error}")]
    StateMachine { dir: PathBuf, error: std::io::Error },
    #[error("invalid raft configuration: {0}")]
    Config(String),
    /// The data directory belongs to another node or cluster.
    #[error("{0}")]
    Identity(String),
    #[error("raft failed to start: {0}")]
    Fatal(String),
}

/// Whether a group and kind name one of the server's own types (an export's check).
pub(crate) type BuiltIn = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

pub(crate) struct RaftNode {
    id: NodeId,
    data_dir: PathBuf,
    node: NodeAddr,
    raft: Raft,
    sm: Arc<SmShared>,
    log_stats: Arc<LogStats>,
    forward_timeout: Duration,
    max_snapshot_bytes: u64,
    /// How this node connects to peers.
    dialer: Dialer,
    /// Free space under the data directory, and the reserve new writes need.
    disk: Arc<super::disk::DiskSpace>,
    /// When each peer last answered a raft RPC of this node.
    contacts: Arc<super::network::Contacts>,
    /// The proposer's permits: holding them all pauses proposing (leadership transfer).
    proposal_permits: Arc<tokio::sync::Semaphore>,
    /// How long followers refuse votes after hearing from the leader (openraft's leader lease:
    /// the longest election timeout).
    leader_lease: Duration,
    /// Clients of peers' raft services, by node and raft address.
    peers: Mutex<HashMap<(NodeId, String), RaftServiceClient<Channel>>>,
    /// When an append from the leader was last taken (pre-vote: see `prevote`).
    last_heard_leader: Mutex<Option<Instant>>,
    /// When this backend started.
    started: Instant,
    /// The voters (this node included) that answered its last pre-vote round, of how many,
    /// and when.
    voters_heard: Mutex<Option<(usize, usize, Instant)>>,
    /// Whether this node leads, for placing singleton controllers.
    leadership: tokio::sync::watch::Receiver<bool>,
    leadership_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Changes waiting to be proposed.
    proposals: tokio::sync::mpsc::Sender<proposer::Proposal>,
    proposer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    readiness: tokio::sync::watch::Sender<Readiness>,
    catch_up: Mutex<Option<tokio::task::JoinHandle<()>>>,
    storage_metrics: crate::metrics::StorageMetrics,
    /// Concurrent linearizable reads share leadership confirmations (on the leader).
    reads: read_index::RoundBatcher<Result<u64, forward::Attempt>>,
    /// Concurrent linearizable reads share read-index requests (to the leader, or to `reads`).
    read_indexes: read_index::RoundBatcher<Result<u64, StorageError>>,
    /// This backend, for tasks that outlive a call (read-index rounds).
    me: std::sync::Weak<RaftNode>,
    /// What each change made here is kept in history with (chosen before proposing).
    history: std::sync::RwLock<Arc<dyn crate::storage::history::HistoryPolicy>>,
}

impl std::fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode")
            .field("id", &self.id)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Records of an operator restore, in chunks, as the caller reads them from its spooled file.
pub(crate) type RestoreChunks = tokio::sync::mpsc::Receiver<Result<RestoreRecords, StorageError>>;

/// A chunk of an operator snapshot's records: resources, then (after every resource) the
/// objects' history, each entry with its expiry.
#[derive(Debug, Default)]
pub(crate) struct RestoreRecords {
    pub resources: Vec<Resource>,
    pub history: Vec<(proto::resource::v1::HistoryEntry, i64)>,
}

impl RaftNode {
    pub(crate) async fn open(options: RaftOptions) -> Result<Arc<RaftNode>, RaftStartError> {
        super::schema::check_identity(
            &options.data_dir,
            &super::schema::Identity {
                cluster: options.cluster_name.clone(),
                node_id: options.node_id,
            },
        )
        .map_err(RaftStartError::Identity)?;
        let open_sm = || {
            StateMachineStore::open_sized(
                &options.data_dir,
                options.history,
                super::schema::map_size_for(options.quota_bytes),
            )
            .map_err(|error| RaftStartError::StateMachine {
                dir: options.data_dir.clone(),
                error,
            })
        };
        let mut sm = open_sm()?;
        // A damaged log is repaired from the other voters when there are any (see `repair`);
        // a node alone refuses it.
        let voters = repair::known_voters(&options.data_dir, sm.shared.voters());
        let can_repair = voters.iter().any(|voter| *voter != options.node_id);
        let log_failed = |error: super::log_store::LogOpenError| {
            let dir = options.data_dir.clone();
            if error.is_damage() {
                RaftStartError::Damaged { dir, error }
            } else {
                RaftStartError::Log { dir, error }
            }
        };
        let (mut log, set_aside) = if can_repair {
            LogStore::open_setting_damage_aside(&options.data_dir).map_err(log_failed)?
        } else {
            (LogStore::open(&options.data_dir).map_err(log_failed)?, None)
        };
        // The state machine holds at least what the log was purged behind (a snapshot is on
        // disk before the log is purged behind it). Less — its latest snapshot missing or
        // damaged, or its files gone — cannot be rebuilt from here.
        let applied = sm.shared.last_applied_index();
        // What was set aside, and the last vote it still holds: a repaired node never grants a
        // vote in a term the set-aside log covers.
        let mut damage = set_aside
            .as_ref()
            .map(|set_aside| set_aside.damage.to_string());
        let mut vote = set_aside
            .as_ref()
            .and_then(|set_aside| super::wal::salvage_vote(&set_aside.dir.join("wal")));
        if let Some(purged) = log.purged_index()
            && applied < purged
        {
            let why = format!(
                "the state machine holds entries up to {applied} only (its latest snapshot is missing or damaged, or its files are gone), and the raft log starts after entry {purged}: it cannot be rebuilt from this node's own data"
            );
            if !can_repair {
                return Err(RaftStartError::Unrebuildable {
                    dir: options.data_dir.clone(),
                    why,
                });
            }
            drop(sm);
            drop(log);
            let aside = repair::set_aside_state(&options.data_dir, &format!("{why}\n")).map_err(
                |error| RaftStartError::StateMachine {
                    dir: options.data_dir.clone(),
                    error,
                },
            )?;
            tracing::warn!(
                "{why}; it was set aside and is repaired from the leader (delete raft/damaged-* once it is no longer needed)"
            );
            sm = open_sm()?;
            log = LogStore::open_anew(&options.data_dir).map_err(log_failed)?;
            vote = vote.or_else(|| super::wal::salvage_vote(&aside.join("wal")));
            damage = Some(why);
        }
        if let Some(vote) = &vote {
            openraft::storage::RaftLogStorage::save_vote(&mut log, vote)
                .await
                .map_err(|error| RaftStartError::Fatal(error.to_string()))?;
        }
        if let Some(damage) = &damage {
            super::schema::mark_repairing(
                &options.data_dir,
                &format!(
                    "this node's raft log or state was damaged and set aside; repairing from voters {voters:?}: {damage}\n"
                ),
            )
            .map_err(|error| RaftStartError::StateMachine {
                dir: options.data_dir.clone(),
                error,
            })?;
        }
        let repairing = super::schema::is_repairing(&options.data_dir);
        if repairing {
            tracing::warn!(
                ?voters,
                "this node's raft log or state was damaged: it votes for nobody and serves nothing until it is repaired from the leader"
            );
        }
        resign_restored_leadership(&mut log, options.node_id).await?;
        let config = openraft::Config {
            cluster_name: "resd".into(),
            heartbeat_interval: options.heartbeat.as_millis() as u64,
            election_timeout_min: options.election_timeout.0.as_millis() as u64,
            election_timeout_max: options.election_timeout.1.as_millis() as u64,
            // Snapshots are asked for by the state machine's cadence (by writes, growing with
            // the state; see `snapshot_when_due`): openraft's policy counts entries, and one
            // entry carries a whole batch of writes.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: options.snapshot_every.min(1000),
            // Elections open only after a pre-vote a quorum granted (`prevote`); a node being
            // repaired stays out until its repair ends.
            enable_elect: false,
            ..Default::default()
        }
        .validate()
        .map_err(|error| RaftStartError::Config(error.to_string()))?;
        let log_stats = log.stats();
        let _ = log_stats.metrics.set(options.metrics.clone());
        sm.shared.use_metrics(options.metrics.clone());
        sm.shared.use_log(log.handle());
        let disk = Arc::new(super::disk::DiskSpace::new(
            &options.data_dir,
            options.disk_reserve,
        ));
        let _ = log_stats.disk.set(disk.clone());
        sm.shared.use_disk(disk.clone());
        sm.shared
            .set_quota(options.quota_bytes.min(super::schema::MAX_QUOTA_BYTES));
        let cadence = sm.shared.cadence();
        cadence.set_every(options.snapshot_every);
        sm.shared.measure_state();
        let contacts = Arc::new(super::network::Contacts::default());
        let shared = sm.shared.clone();
        let ready = shared.opened_cleanly();
        let raft = Raft::new(
            options.node_id,
            Arc::new(config),
            NetworkFactory::new(options.dialer.clone(), contacts.clone()),
            log,
            sm,
        )
        .await
        .map_err(|error| RaftStartError::Fatal(error.to_string()))?;
        let (leading, leadership) = tokio::sync::watch::channel(false);
        let leadership_task = tokio::spawn(status::follow_leadership(raft.clone(), leading));
        let (proposals, queue) = tokio::sync::mpsc::channel(4 * proposer::MAX_BATCH_CHANGES);
        let proposal_permits = Arc::new(tokio::sync::Semaphore::new(
            proposer::MAX_PROPOSALS_IN_FLIGHT,
        ));
        let proposer = tokio::spawn(proposer::run_proposer(
            raft.clone(),
            queue,
            proposal_permits.clone(),
        ));
        let removed_marker =
            std::fs::read_to_string(options.data_dir.join(super::schema::REMOVED_FILE)).ok();
        let (readiness, _) = tokio::sync::watch::channel(if repairing {
            Readiness::Repairing { applied: 0 }
        } else if ready {
            Readiness::Ready
        } else {
            Readiness::CatchingUp {
                applied: 0,
                target: None,
            }
        });
        let backend = Arc::new_cyclic(|me| RaftNode {
            id: options.node_id,
            data_dir: options.data_dir.clone(),
            node: options.node,
            raft,
            sm: shared,
            log_stats,
            forward_timeout: options.forward_timeout,
            max_snapshot_bytes: options.max_snapshot_bytes,
            dialer: options.dialer,
            disk,
            contacts,
            proposal_permits,
            leader_lease: options.election_timeout.1,
            peers: Mutex::new(HashMap::new()),
            last_heard_leader: Mutex::new(None),
            started: Instant::now(),
            voters_heard: Mutex::new(None),
            leadership,
            leadership_task: Mutex::new(Some(leadership_task)),
            proposals,
            proposer: Mutex::new(Some(proposer)),
            readiness,
            catch_up: Mutex::new(None),
            storage_metrics: options.metrics,
            history: std::sync::RwLock::new(Arc::new(crate::storage::history::Defaults)),
            reads: read_index::RoundBatcher::default(),
            read_indexes: read_index::RoundBatcher::default(),
            me: me.clone(),
        });
        tokio::spawn(watch_disk(Arc::downgrade(&backend)));
        tokio::spawn(snapshot_when_due(Arc::downgrade(&backend), cadence));
        tokio::spawn(prevote::gate_elections(
            Arc::downgrade(&backend),
            options.election_timeout.0 / 3,
        ));
        tokio::spawn(readiness::watch_damage(
            Arc::downgrade(&backend),
            backend.sm.damage(),
        ));
        tokio::spawn(readiness::watch_lag(
            Arc::downgrade(&backend),
            options.max_lag_entries.max(1),
        ));
        tokio::spawn(repair::record_members(
            backend.raft.clone(),
            options.data_dir.clone(),
        ));
        if let Some(marker) = removed_marker {
            let removal = crate::storage::Removal::of_marker(&marker);
            tracing::warn!("{removal}; serving nothing");
            backend.stop_for_removal(removal);
        } else if repairing {
            let task = tokio::spawn(repair::repair(Arc::downgrade(&backend)));
            *backend.catch_up.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        } else if !ready {
            tracing::warn!("serving no reads until this node has caught up with the leader");
            let task = tokio::spawn(readiness::catch_up(Arc::downgrade(&backend)));
            *backend.catch_up.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        }
        Ok(backend)
    }

    pub(crate) fn id(&self) -> NodeId {
        self.id
    }

    pub(crate) fn node(&self) -> &NodeAddr {
        &self.node
    }

    pub(crate) fn raft(&self) -> &Raft {
        &self.raft
    }

    pub(crate) fn metrics(&self) -> RaftMetrics<NodeId, NodeAddr> {
        self.raft.metrics().borrow().clone()
    }

    #[cfg(test)]
    pub(crate) fn log_stats(&self) -> &LogStats {
        &self.log_stats
    }

    /// Where operator restores are spooled while they are checked.
    pub(crate) fn spool_dir(&self) -> PathBuf {
        self.data_dir.join(super::schema::RESTORE_SPOOL_DIR)
    }

    /// This node's data directory.
    pub(crate) fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
    }

    /// Largest raft snapshot this node accepts.
    pub(crate) fn max_snapshot_bytes(&self) -> u64 {
        self.max_snapshot_bytes
    }

    /// Whether this node may serve a local read at `consistency` now: it is ready, and for a
    /// strong read it has applied the read index. ReadIndex: the leader confirms (in a round
    /// shared with concurrent reads) and names the index; this node serves from its own state
    /// once it applied that far, so a follower ships no data over the raft port.
    pub(super) async fn ready_to_read(&self, consistency: Consistency) -> Result<(), StorageError> {
        self.check_ready()?;
        if consistency == Consistency::Strong {
            self.read_barrier().await?;
        }
        Ok(())
    }

    /// Waits until this node has applied every write committed before the call (the raft
    /// "read index"): afterwards, local reads are linearizable. Returns the index.
    pub(crate) async fn read_barrier(&self) -> Result<u64, StorageError> {
        let me = self.me.clone();
        let round = move || {
            let me = me.clone();
            async move {
                match me.upgrade() {
                    Some(backend) => {
                        op::expect_read_index(backend.submit(Request::ReadIndex).await)
                    }
                    None => Err(StorageError::ShuttingDown(
                        "this node is shutting down".into(),
                    )),
                }
            }
        };
        let dropped = || {
            Err(StorageError::ShuttingDown(
                "the read-index round ended without an answer: this node is shutting down".into(),
            ))
        };
        let deadline = crate::storage::deadline::bounded(self.forward_timeout);
        let index =
            tokio::time::timeout_at(deadline.into(), self.read_indexes.join(round, dropped))
                .await
                .map_err(|_| {
                    StorageError::Inconsistent(
                        "no read index from the leader before the request's deadline".into(),
                    )
                })??;
        self.wait_applied(index).await?;
        Ok(index)
    }

    /// Waits until this node has applied `index`, up to the request's deadline (bounded by the
    /// forward timeout); `Inconsistent` past it or when raft stops.
    pub(super) async fn wait_applied(&self, index: u64) -> Result<(), StorageError> {
        let deadline = crate::storage::deadline::bounded(self.forward_timeout);
        let mut metrics = self.raft.metrics();
        loop {
            let applied = applied_index(&metrics.borrow_and_update());
            if applied >= index {
                return Ok(());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(StorageError::Inconsistent(format!(
                    "this node has applied {applied} of the {index} entries it must apply first"
                )));
            }
            if let Ok(Err(_)) = tokio::time::timeout(remaining, metrics.changed()).await {
                return Err(StorageError::Inconsistent("raft stopped".into()));
            }
        }
    }

    /// A consistent snapshot of every resource as an operator snapshot file, in chunks.
    /// `built_in(group, kind)`: whether a type is the server's own (every other type needs a
    /// Type in the state for the snapshot to be restorable).
    pub(crate) async fn export(
        &self,
        built_in: BuiltIn,
    ) -> Result<tokio::sync::mpsc::Receiver<Result<Vec<u8>, StorageError>>, StorageError> {
        self.read_barrier().await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        let sm = self.sm.clone();
        let node_id = self.id;
        // Detached on purpose: it ends when the export is done or the receiver is dropped.
        tokio::task::spawn_blocking(move || {
            if let Err(error) = sm.export_blocking(node_id, sender.clone(), &*built_in) {
                let _ = sender.blocking_send(Err(error));
            }
        });
        Ok(receiver)
    }

    /// What each change made here is kept in history with.
    pub(crate) fn history_policy(&self) -> Arc<dyn crate::storage::history::HistoryPolicy> {
        self.history
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(crate) fn set_history_policy(
        &self,
        policy: Arc<dyn crate::storage::history::HistoryPolicy>,
    ) {
        *self
            .history
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = policy;
    }

    /// Replaces the whole state with the records `chunks` yields, through raft: begin, one
    /// entry per chunk, commit. Nothing changes unless every chunk arrives and is staged; the
    /// records must have been validated. Must run on the leader. Returns the index at which the
    /// restored state took effect.
    pub(crate) async fn restore(&self, mut chunks: RestoreChunks) -> Result<u64, StorageError> {
        let restore_id = ulid::Ulid::new().to_string();
        let mut staged = 0usize;
        // The history restored is bounded like the node's own: past the bound, the rest of the
        // snapshot's history is left out (said once).
        let history_bound = self.history_policy().node_bytes();
        let mut history_staged = 0u64;
        let mut history_left_out = 0u64;
        self.run_op(Op::RestoreBegin {
            restore_id: restore_id.clone(),
        })
        .await?;
        while let Some(chunk) = chunks.recv().await {
            let chunk = chunk?;
            // The restored state replaces the current one: it alone must fit the quota.
            staged += chunk
                .resources
                .iter()
                .map(prost::Message::encoded_len)
                .sum::<usize>();
            if staged as u64 > self.sm.quota() {
                // A new begin clears what this restore staged, so it counts against nothing.
                if let Err(error) = self
                    .run_op(Op::RestoreBegin {
                        restore_id: ulid::Ulid::new().to_string(),
                    })
                    .await
                {
                    tracing::warn!(%error, "cannot clear a refused restore's staging; the next restore clears it");
                }
                return Err(StorageError::NoSpace(format!(
                    "the snapshot holds more than the state's quota of {} (--quota-bytes); nothing was restored",
                    proto::bytes_label(self.sm.quota())
                )));
            }
            let mut history = chunk.history;
            history.retain(|(entry, _)| {
                let size = prost::Message::encoded_len(entry) as u64;
                if history_staged + size > history_bound {
                    history_left_out += 1;
                    return false;
                }
                history_staged += size;
                true
            });
            self.run_op(Op::RestoreChunk {
                restore_id: restore_id.clone(),
                resources: chunk.resources,
                history,
            })
            .await?;
        }
        if history_left_out > 0 {
            tracing::warn!(
                left_out = history_left_out,
                bound = history_bound,
                "the snapshot holds more history than this node keeps (--history-node-bytes): the rest was left out"
            );
        }
        self.run_op(Op::RestoreCommit { restore_id }).await?;
        // The commit is applied here (a proposal answers once applied): the restored state
        // took effect at or before this node's applied index. No read barrier: after a long
        // restore the caller's deadline may have passed, and a barrier that gave up would
        // report a restore that happened as one that did not. The state machine's own index,
        // not raft's metrics: those are told of the apply after the proposal is answered.
        Ok(self
            .sm
            .last_applied_index()
            .max(applied_index(&self.raft.metrics().borrow())))
    }

    /// Proposes `op` as its own entry on the leader (this node must lead); waits through
    /// elections.
    async fn run_op(&self, op: Op) -> Result<(), StorageError> {
        let deadline = Instant::now() + self.forward_timeout;
        loop {
            match proposer::propose(&self.raft, op.clone()).await {
                Ok(outcome) => return outcome.single().map(|_| ()),
                Err(proposer::Proposed::Applied(result)) => return result.map(|_| ()),
                Err(proposer::Proposed::Retry(retry)) if Instant::now() >= deadline => {
                    return Err(StorageError::Inconsistent(retry.to_string()));
                }
                Err(proposer::Proposed::Retry(_)) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
            }
        }
    }

    /// Whether this node is the leader, as it changes.
    pub(crate) fn leadership(&self) -> tokio::sync::watch::Receiver<bool> {
        self.leadership.clone()
    }

    /// Stops raft on this node.
    pub(crate) async fn shutdown(&self) {
        // Waits for disk space give up: raft stops with the node.
        self.disk.stop();
        let catch_up = self
            .catch_up
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(catch_up) = catch_up {
            catch_up.abort();
            let _ = catch_up.await;
        }
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
        // On the blocking pool: a sync stalled by the disk must not hold the shutdown past its
        // grace (the caller's timeout drops this wait; the next start then rebuilds).
        let sm = self.sm.clone();
        match tokio::task::spawn_blocking(move || sm.close_cleanly()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot sync the state machine; it will be rebuilt at the next start")
            }
            Err(error) => {
                tracing::warn!(%error, "the state machine's final sync failed; it will be rebuilt at the next start")
            }
        }
    }

    pub(crate) fn state_machine(&self) -> &Arc<SmShared> {
        &self.sm
    }
}

/// Asks raft for a snapshot whenever the state machine's cadence says one is due (raft ignores
/// the ask while it builds one). Ends with the node.
async fn snapshot_when_due(
    backend: std::sync::Weak<RaftNode>,
    cadence: Arc<super::state_machine::SnapshotCadence>,
) {
    loop {
        // Asked for when due, and every second while it stays due: raft ignores an ask that
        // comes while a snapshot is being built (with its rebase, seconds at scale), and no
        // write may come to ask again.
        let asked = tokio::time::timeout(Duration::from_secs(1), cadence.due())
            .await
            .is_ok();
        let Some(node) = backend.upgrade() else {
            return;
        };
        if (asked || cadence.is_due())
            && let Err(error) = node.raft.trigger().snapshot().await
        {
            tracing::debug!(%error, "raft stopped: no more snapshots");
            return;
        }
    }
}

/// Measures the data directory's free space every second (for the reserve, `Status` and
/// `resd_disk_free_bytes`), saying when new writes start and stop being refused. Holds the
/// backend weakly: it ends when the node goes.
async fn watch_disk(backend: std::sync::Weak<RaftNode>) {
    let mut alarmed = false;
    loop {
        let Some(node) = backend.upgrade() else {
            return;
        };
        if let Err(error) = node.disk.refresh() {
            tracing::debug!(%error, "cannot measure the free disk space");
        }
        node.storage_metrics
            .disk_free_bytes
            .set(node.disk.free() as i64);
        node.storage_metrics
            .state_bytes
            .set(node.sm.state_bytes().min(i64::MAX as u64) as i64);
        node.storage_metrics
            .state_quota_bytes
            .set(node.sm.quota().min(i64::MAX as u64) as i64);
        match (node.disk.alarm(), alarmed) {
            (Some(alarm), false) => {
                tracing::error!("{alarm}");
                alarmed = true;
            }
            (None, true) => {
                tracing::info!(
                    free = %proto::bytes_label(node.disk.free()),
                    "the disk has room again: new writes are taken"
                );
                alarmed = false;
            }
            _ => {}
        }
        drop(node);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The index of the last entry the state machine applied (0 before any).
fn applied_index(metrics: &RaftMetrics<NodeId, NodeAddr>) -> u64 {
    metrics.last_applied.map(|log_id| log_id.index).unwrap_or(0)
}

/// A node whose stored vote says it led (a committed vote for itself) gives that term up before
/// raft starts, and stands for election in a new one instead of resuming it. A leader sends
/// entries to its followers while its own write of them runs (the vendored openraft patch), so a
/// leader that stopped uncleanly may have lost entries its followers hold; openraft 0.9 would
/// resume the term and propose new entries under the same log ids, which those followers would
/// take for the ones they already have. Keeping the vote for itself in that term (uncommitted)
/// still refuses every other candidate of the term.
pub(super) async fn resign_restored_leadership(
    log: &mut LogStore,
    node_id: NodeId,
) -> Result<(), RaftStartError> {
    use openraft::storage::RaftLogStorage;
    let fatal = |error: super::types::RaftStorageError| RaftStartError::Fatal(error.to_string());
    let Some(vote) = log.read_vote().await.map_err(fatal)? else {
        return Ok(());
    };
    if vote.is_committed() && vote.leader_id().voted_for() == Some(node_id) {
        let term = vote.leader_id().get_term();
        log.save_vote(&super::types::Vote::new(term, node_id))
            .await
            .map_err(fatal)?;
        tracing::info!(
            term,
            "this node led term {term} before it stopped; it stands for election in a new term instead of resuming that one"
        );
    }
    Ok(())
}
