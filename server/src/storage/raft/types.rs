//! The openraft type configuration and the values it carries: commands (typed [`Op`]s and their
//! [`codec`] bytes), node addresses and snapshot files. Their bytes are written by
//! `crate::wire::raft`.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::codec;
use super::op::{Op, Outcome};

openraft::declare_raft_types!(
    /// Types of resd's Raft group.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = NodeAddr,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotFile,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeAddr>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeAddr>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type RaftStorageError = openraft::StorageError<NodeId>;
pub type Raft = openraft::Raft<TypeConfig>;

/// The payload of a normal log entry: an [`Op`] shared by the log, replication and apply without
/// copying, and encoded (by [`codec`]) at most once — the bytes are reused for the LMDB log and
/// for every follower.
#[derive(Clone)]
pub struct Command {
    op: Arc<Op>,
    encoded: Arc<OnceLock<Vec<u8>>>,
}

impl Command {
    pub fn new(op: Op) -> Self {
        Command {
            op: Arc::new(op),
            encoded: Arc::new(OnceLock::new()),
        }
    }

    pub fn op(&self) -> &Op {
        &self.op
    }

    /// The op itself, copied only if someone else still shares it.
    pub fn into_op(self) -> Op {
        Arc::try_unwrap(self.op).unwrap_or_else(|shared| (*shared).clone())
    }

    pub fn encoded(&self) -> &[u8] {
        self.encoded.get_or_init(|| codec::encode_op(&self.op))
    }

    /// The command these payload bytes hold; the bytes are kept as its encoding.
    pub fn decode(bytes: &[u8]) -> Result<Self, codec::CodecError> {
        let op = codec::decode_op(bytes)?;
        Ok(Command {
            op: Arc::new(op),
            encoded: Arc::new(OnceLock::from(bytes.to_vec())),
        })
    }
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.op.fmt(f)
    }
}

impl PartialEq for Command {
    fn eq(&self, other: &Self) -> bool {
        self.op == other.op
    }
}

impl Default for Command {
    fn default() -> Self {
        Command::new(Op::Changes(Vec::new()))
    }
}

/// What applying a command produced, handed back to the proposer. It never leaves the node that
/// applied it.
pub type CommandResult = Outcome;

/// Where a node listens: its public API and its Raft (internal) address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAddr {
    pub api_addr: String,
    pub raft_addr: String,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "api={} raft={}", self.api_addr, self.raft_addr)
    }
}

/// A snapshot: a compacted copy of the state machine's LMDB file on disk.
#[derive(Debug)]
pub struct SnapshotFile {
    pub path: PathBuf,
}
