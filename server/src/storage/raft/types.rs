//! The openraft type configuration and the values it carries: commands (protobuf, carried as
//! bytes through serde), node addresses and snapshot files.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use proto::raft::v1 as pb;

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

/// A protobuf message carried through serde as its encoded bytes.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Wire<M>(pub M);

impl<M: prost::Message> Serialize for Wire<M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0.encode_to_vec())
    }
}

impl<'de, M: prost::Message + Default> Deserialize<'de> for Wire<M> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer)?;
        M::decode(bytes.as_slice())
            .map(Wire)
            .map_err(de::Error::custom)
    }
}

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

/// A protobuf message shared by the log, replication and apply without copying, and encoded at
/// most once (the bytes are reused for the LMDB log and for every follower).
pub struct Shared<M> {
    message: Arc<M>,
    encoded: Arc<OnceLock<Vec<u8>>>,
}

impl<M> Shared<M> {
    pub fn new(message: M) -> Self {
        Shared {
            message: Arc::new(message),
            encoded: Arc::new(OnceLock::new()),
        }
    }

    pub fn get(&self) -> &M {
        &self.message
    }

    /// The message itself, copied only if someone else still shares it.
    pub fn into_inner(self) -> M
    where
        M: Clone,
    {
        Arc::try_unwrap(self.message).unwrap_or_else(|shared| (*shared).clone())
    }
}

impl<M: prost::Message> Shared<M> {
    pub fn encoded(&self) -> &[u8] {
        self.encoded.get_or_init(|| self.message.encode_to_vec())
    }
}

impl<M> Clone for Shared<M> {
    fn clone(&self) -> Self {
        Shared {
            message: self.message.clone(),
            encoded: self.encoded.clone(),
        }
    }
}

impl<M: fmt::Debug> fmt::Debug for Shared<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.message.fmt(f)
    }
}

impl<M: PartialEq> PartialEq for Shared<M> {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl<M: Default> Default for Shared<M> {
    fn default() -> Self {
        Shared::new(M::default())
    }
}

impl<M: prost::Message> Serialize for Shared<M> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.encoded())
    }
}

impl<'de, M: prost::Message + Default> Deserialize<'de> for Shared<M> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let bytes = deserialize_bytes(deserializer)?;
        let message = M::decode(bytes.as_slice()).map_err(de::Error::custom)?;
        Ok(Shared {
            message: Arc::new(message),
            encoded: Arc::new(OnceLock::from(bytes)),
        })
    }
}

/// The payload of a normal log entry.
pub type Command = Shared<pb::Command>;
/// What applying a command produced, handed back to the proposer.
pub type CommandResult = Wire<pb::CommandResult>;

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
