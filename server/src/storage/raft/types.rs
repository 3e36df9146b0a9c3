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

/// The bytes of openraft's values as resd writes them (the write-ahead log's vote and entries,
/// the state machine's membership and snapshot metadata, the peers' RPCs) are bincode of
/// openraft's serde shapes: a format that an upgrade of openraft or bincode could change
/// without a word. These pin it: a failure here means data directories and peers of earlier
/// builds no longer read what this one writes (bump the format version, or keep the shape).
#[cfg(test)]
mod golden {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn node(n: u64) -> NodeAddr {
        NodeAddr {
            api_addr: format!("127.0.0.1:850{n}"),
            raft_addr: format!("127.0.0.1:930{n}"),
        }
    }

    fn log_id(term: u64, node: u64, index: u64) -> LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, node), index)
    }

    fn membership() -> openraft::Membership<NodeId, NodeAddr> {
        let nodes: BTreeMap<NodeId, NodeAddr> = (1..=3).map(|n| (n, node(n))).collect();
        openraft::Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
    }

    /// Each value, encoded, against the bytes this format has always had.
    #[test]
    fn openraft_values_keep_their_bytes() {
        let entry = |payload| Entry {
            log_id: log_id(2, 1, 75),
            payload,
        };
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("vote", encode(&Vote::new(3, 2)).expect("vote"), GOLDEN_VOTE),
            (
                "committed vote",
                encode(&Vote::new_committed(4, 1)).expect("vote"),
                GOLDEN_COMMITTED_VOTE,
            ),
            (
                "log id",
                encode(&log_id(2, 1, 75)).expect("log id"),
                GOLDEN_LOG_ID,
            ),
            (
                "blank entry",
                encode(&entry(openraft::EntryPayload::Blank)).expect("entry"),
                GOLDEN_BLANK_ENTRY,
            ),
            (
                "membership entry",
                encode(&entry(openraft::EntryPayload::Membership(membership()))).expect("entry"),
                GOLDEN_MEMBERSHIP_ENTRY,
            ),
            (
                "normal entry",
                encode(&entry(openraft::EntryPayload::Normal(Command::new(
                    Op::RestoreBegin {
                        restore_id: "r1".into(),
                    },
                ))))
                .expect("entry"),
                GOLDEN_NORMAL_ENTRY,
            ),
            (
                "stored membership",
                encode(&StoredMembership::new(Some(log_id(2, 1, 70)), membership()))
                    .expect("membership"),
                GOLDEN_STORED_MEMBERSHIP,
            ),
        ];
        let mut changed = Vec::new();
        for (name, bytes, golden) in &cases {
            if hex(bytes) != *golden {
                changed.push(format!("{name}: {}", hex(bytes)));
            }
        }
        assert!(
            changed.is_empty(),
            "openraft values changed their bytes:\n{}",
            changed.join("\n")
        );
        // And they read back.
        let read: Entry = decode(&cases[5].1).expect("the normal entry reads back");
        assert_eq!(read.log_id, log_id(2, 1, 75));
    }

    const GOLDEN_VOTE: &str = "0300000000000000020000000000000000";
    const GOLDEN_COMMITTED_VOTE: &str = "0400000000000000010000000000000001";
    const GOLDEN_LOG_ID: &str = "020000000000000001000000000000004b00000000000000";
    const GOLDEN_BLANK_ENTRY: &str = "020000000000000001000000000000004b0000000000000000000000";
    const GOLDEN_MEMBERSHIP_ENTRY: &str = concat!(
        "020000000000000001000000000000004b0000000000000002000000010000000000000003000000",
        "00000000010000000000000002000000000000000300000000000000030000000000000001000000",
        "000000000e000000000000003132372e302e302e313a383530310e000000000000003132372e302e",
        "302e313a3933303102000000000000000e000000000000003132372e302e302e313a383530320e00",
        "0000000000003132372e302e302e313a3933303203000000000000000e000000000000003132372e",
        "302e302e313a383530330e000000000000003132372e302e302e313a39333033",
    );
    const GOLDEN_NORMAL_ENTRY: &str = concat!(
        "020000000000000001000000000000004b000000000000000100000006000000000000001a040a02",
        "7231",
    );
    const GOLDEN_STORED_MEMBERSHIP: &str = concat!(
        "01020000000000000001000000000000004600000000000000010000000000000003000000000000",
        "00010000000000000002000000000000000300000000000000030000000000000001000000000000",
        "000e000000000000003132372e302e302e313a383530310e000000000000003132372e302e302e31",
        "3a3933303102000000000000000e000000000000003132372e302e302e313a383530320e00000000",
        "0000003132372e302e302e313a3933303203000000000000000e000000000000003132372e302e30",
        "2e313a383530330e000000000000003132372e302e302e313a39333033",
    );
}
