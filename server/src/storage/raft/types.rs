//! The openraft type configuration and the values it carries: commands (protobuf, carried as
//! bytes through serde), node addresses and snapshot files.

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;

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
        struct BytesVisitor<M>(PhantomData<M>);
        impl<'de, M: prost::Message + Default> Visitor<'de> for BytesVisitor<M> {
            type Value = Wire<M>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an encoded protobuf message")
            }
            fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Self::Value, E> {
                M::decode(bytes).map(Wire).map_err(E::custom)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut bytes = Vec::new();
                while let Some(byte) = seq.next_element::<u8>()? {
                    bytes.push(byte);
                }
                self.visit_bytes(&bytes)
            }
        }
        deserializer.deserialize_bytes(BytesVisitor(PhantomData))
    }
}

/// The payload of a normal log entry.
pub type Command = Wire<pb::Command>;
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
