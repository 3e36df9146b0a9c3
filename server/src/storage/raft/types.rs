//! The openraft type configuration and the values it carries: commands (typed [`Op`]s, carried
//! through serde as their [`codec`] bytes), node addresses and snapshot files.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

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

/// Reads serde bytes (or, from formats without bytes, a sequence of u8).
fn deserialize_bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    struct BytesVisitor;
    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an encoded protobuf message")
        }
        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
            Ok(bytes.to_vec())
        }
        fn visit_byte_buf<E: de::Error>(self, bytes: Vec<u8>) -> Result<Self::Value, E> {
            Ok(bytes)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut bytes = Vec::new();
            while let Some(byte) = seq.next_element::<u8>()? {
                bytes.push(byte);
            }
            Ok(bytes)
        }
    }
    deserializer.deserialize_byte_buf(BytesVisitor)
}

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

impl Serialize for Command {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.encoded())
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer)?;
        let op = codec::decode_op(&bytes).map_err(de::Error::custom)?;
        Ok(Command {
            op: Arc::new(op),
            encoded: Arc::new(OnceLock::from(bytes)),
        })
    }
}

/// What applying a command produced, handed back to the proposer. It never leaves the node that
/// applied it; openraft still wants it serializable.
pub type CommandResult = Outcome;

impl Serialize for Outcome {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&codec::encode_outcome(self))
    }
}

impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer)?;
        codec::decode_outcome(&bytes).map_err(de::Error::custom)
    }
}

/// Where a node listens: its public API and its Raft (internal) address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// Binary encoding of openraft values (votes, log ids, entries, RPCs).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(value)
}

pub fn decode<T: de::DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    bincode::deserialize(bytes)
}
