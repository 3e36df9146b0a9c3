//! openraft's values in resd's own codec: the write-ahead log's votes, entries and purge marks,
//! the state machine's membership and snapshot metadata, and the peers' raft RPCs.
//!
//! The layout is the one these values have always had on disk and between peers (it began as
//! bincode's fixed-width, little-endian encoding of openraft's serde shapes), now written here:
//! - integers are fixed width, little-endian; a `bool` is one byte, 0 or 1;
//! - an `Option` is a byte (0 none, 1 some) and the value;
//! - a sequence, set, map, string or byte string is its length as a `u64`, then its items;
//! - an enum is its variant's number as a `u32`, then the variant's fields;
//! - a struct is its fields in order.
//!
//! An upgrade of openraft or of a serializer cannot change these bytes: `golden` pins every
//! value, and a change here is a change of [`super::FORMAT`].
//!
//! Decoding is total: a record that is truncated, too long, or holds an impossible tag is an
//! error, never a panic, and no length read from the bytes is trusted for an allocation larger
//! than the bytes that remain.

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::Fatal;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{CommittedLeaderId, EntryPayload, LeaderId, Membership};

use crate::storage::raft::types::{
    Command, Entry, LogId, NodeAddr, NodeId, SnapshotMeta, StoredMembership, TypeConfig, Vote,
};

/// Bytes that are not a value of the type they were read as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{what} runs past the end of its record")]
    Truncated { what: &'static str },
    #[error("{what} has {found} unexpected byte(s) after it")]
    Trailing { what: &'static str, found: usize },
    #[error("{what} holds an impossible {field}: {value}")]
    Tag {
        what: &'static str,
        field: &'static str,
        value: u64,
    },
    #[error("{what} holds a string that is not UTF-8")]
    Utf8 { what: &'static str },
    #[error("{what}: {why}")]
    Invalid { what: &'static str, why: String },
}

/// A value written in this codec.
pub trait Wire: Sized {
    /// What the value is called in errors ("a vote", "a log entry").
    const WHAT: &'static str;
    fn put(&self, out: &mut Vec<u8>);
    fn take(input: &mut Reader<'_>) -> Result<Self, WireError>;
}

/// The value's bytes.
pub fn encode<T: Wire>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.put(&mut out);
    out
}

/// The value these bytes hold, all of them.
pub fn decode<T: Wire>(bytes: &[u8]) -> Result<T, WireError> {
    let mut input = Reader {
        bytes,
        what: T::WHAT,
    };
    let value = T::take(&mut input)?;
    if !input.bytes.is_empty() {
        return Err(WireError::Trailing {
            what: T::WHAT,
            found: input.bytes.len(),
        });
    }
    Ok(value)
}

/// The bytes still to be read, and what they are read as (for errors).
pub struct Reader<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(WireError::Truncated { what: self.what })?;
        self.bytes = rest;
        Ok(*head)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.tag("bool", other.into())),
        }
    }

    /// A variant number.
    fn variant(&mut self) -> Result<u32, WireError> {
        self.u32()
    }

    /// A count of items that each take at least `min_item` bytes: never more than the bytes
    /// left could hold.
    fn count(&mut self, min_item: usize) -> Result<usize, WireError> {
        let count = self.u64()?;
        let most = self.bytes.len() / min_item.max(1);
        usize::try_from(count)
            .ok()
            .filter(|count| *count <= most)
            .ok_or(WireError::Truncated { what: self.what })
    }

    fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.count(1)?;
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    fn string(&mut self) -> Result<String, WireError> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::Utf8 { what: self.what })
    }

    fn tag(&self, field: &'static str, value: u64) -> WireError {
        WireError::Tag {
            what: self.what,
            field,
            value,
        }
    }
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    put_u64(out, len as u64);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn put_option<T>(out: &mut Vec<u8>, value: &Option<T>, put: impl FnOnce(&T, &mut Vec<u8>)) {
    match value {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            put(value, out);
        }
    }
}

fn take_option<T>(
    input: &mut Reader<'_>,
    take: impl FnOnce(&mut Reader<'_>) -> Result<T, WireError>,
) -> Result<Option<T>, WireError> {
    match input.u8()? {
        0 => Ok(None),
        1 => take(input).map(Some),
        other => Err(input.tag("option", other.into())),
    }
}

impl Wire for Vote {
    const WHAT: &'static str = "a vote";

    fn put(&self, out: &mut Vec<u8>) {
        put_u64(out, self.leader_id.term);
        put_u64(out, self.leader_id.node_id);
        out.push(self.committed.into());
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let term = input.u64()?;
        let node_id = input.u64()?;
        let committed = input.bool()?;
        Ok(Vote {
            leader_id: LeaderId::new(term, node_id),
            committed,
        })
    }
}

impl Wire for LogId {
    const WHAT: &'static str = "a log id";

    fn put(&self, out: &mut Vec<u8>) {
        put_u64(out, self.leader_id.term);
        put_u64(out, self.leader_id.node_id);
        put_u64(out, self.index);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let term = input.u64()?;
        let node_id = input.u64()?;
        let index = input.u64()?;
        Ok(LogId::new(CommittedLeaderId::new(term, node_id), index))
    }
}

impl<T: Wire> Wire for Option<T> {
    const WHAT: &'static str = T::WHAT;

    fn put(&self, out: &mut Vec<u8>) {
        put_option(out, self, T::put);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        take_option(input, T::take)
    }
}

impl Wire for NodeAddr {
    const WHAT: &'static str = "a node's addresses";

    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.api_addr.as_bytes());
        put_bytes(out, self.raft_addr.as_bytes());
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(NodeAddr {
            api_addr: input.string()?,
            raft_addr: input.string()?,
        })
    }
}

/// A membership: its configurations (more than one while joint), then every node's addresses.
impl Wire for Membership<NodeId, NodeAddr> {
    const WHAT: &'static str = "a membership";

    fn put(&self, out: &mut Vec<u8>) {
        let configs = self.get_joint_config();
        put_len(out, configs.len());
        for config in configs {
            put_len(out, config.len());
            for id in config {
                put_u64(out, *id);
            }
        }
        let nodes: Vec<_> = self.nodes().collect();
        put_len(out, nodes.len());
        for (id, node) in nodes {
            put_u64(out, *id);
            node.put(out);
        }
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let mut configs = Vec::new();
        for _ in 0..input.count(8)? {
            let mut config = BTreeSet::new();
            for _ in 0..input.count(8)? {
                config.insert(input.u64()?);
            }
            configs.push(config);
        }
        let mut nodes = BTreeMap::new();
        // An id and two empty strings at least.
        for _ in 0..input.count(24)? {
            let id = input.u64()?;
            nodes.insert(id, NodeAddr::take(input)?);
        }
        if let Some(voter) = configs.iter().flatten().find(|id| !nodes.contains_key(id)) {
            return Err(WireError::Invalid {
                what: input.what,
                why: format!("voter {voter} has no address"),
            });
        }
        Ok(Membership::new(configs, nodes))
    }
}

impl Wire for StoredMembership {
    const WHAT: &'static str = "a stored membership";

    fn put(&self, out: &mut Vec<u8>) {
        self.log_id().put(out);
        self.membership().put(out);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let log_id = <Option<LogId> as Wire>::take(input)?;
        let membership = Membership::take(input)?;
        Ok(StoredMembership::new(log_id, membership))
    }
}

impl Wire for Entry {
    const WHAT: &'static str = "a log entry";

    fn put(&self, out: &mut Vec<u8>) {
        self.log_id.put(out);
        match &self.payload {
            EntryPayload::Blank => put_u32(out, 0),
            EntryPayload::Normal(command) => {
                put_u32(out, 1);
                put_bytes(out, command.encoded());
            }
            EntryPayload::Membership(membership) => {
                put_u32(out, 2);
                membership.put(out);
            }
        }
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let log_id = LogId::take(input)?;
        let payload = match input.variant()? {
            0 => EntryPayload::Blank,
            1 => {
                let bytes = input.bytes()?;
                let command = Command::decode(bytes).map_err(|error| WireError::Invalid {
                    what: input.what,
                    why: error.to_string(),
                })?;
                EntryPayload::Normal(command)
            }
            2 => EntryPayload::Membership(Membership::take(input)?),
            other => return Err(input.tag("payload kind", other.into())),
        };
        Ok(Entry { log_id, payload })
    }
}

impl Wire for SnapshotMeta {
    const WHAT: &'static str = "snapshot metadata";

    fn put(&self, out: &mut Vec<u8>) {
        self.last_log_id.put(out);
        self.last_membership.put(out);
        put_bytes(out, self.snapshot_id.as_bytes());
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(SnapshotMeta {
            last_log_id: <Option<LogId> as Wire>::take(input)?,
            last_membership: StoredMembership::take(input)?,
            snapshot_id: input.string()?,
        })
    }
}

/// The header of a snapshot sent to a follower: the leader's vote and what the snapshot holds.
impl Wire for (Vote, SnapshotMeta) {
    const WHAT: &'static str = "a snapshot's header";

    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out);
        self.1.put(out);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok((Vote::take(input)?, SnapshotMeta::take(input)?))
    }
}

impl Wire for AppendEntriesRequest<TypeConfig> {
    const WHAT: &'static str = "an append-entries request";

    fn put(&self, out: &mut Vec<u8>) {
        self.vote.put(out);
        self.prev_log_id.put(out);
        put_len(out, self.entries.len());
        for entry in &self.entries {
            entry.put(out);
        }
        self.leader_commit.put(out);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        let vote = Vote::take(input)?;
        let prev_log_id = <Option<LogId> as Wire>::take(input)?;
        // A log id and a payload kind at least.
        let count = input.count(28)?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push(Entry::take(input)?);
        }
        Ok(AppendEntriesRequest {
            vote,
            prev_log_id,
            entries,
            leader_commit: <Option<LogId> as Wire>::take(input)?,
        })
    }
}

impl Wire for AppendEntriesResponse<NodeId> {
    const WHAT: &'static str = "an append-entries answer";

    fn put(&self, out: &mut Vec<u8>) {
        match self {
            AppendEntriesResponse::Success => put_u32(out, 0),
            AppendEntriesResponse::PartialSuccess(upto) => {
                put_u32(out, 1);
                upto.put(out);
            }
            AppendEntriesResponse::Conflict => put_u32(out, 2),
            AppendEntriesResponse::HigherVote(vote) => {
                put_u32(out, 3);
                vote.put(out);
            }
        }
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(match input.variant()? {
            0 => AppendEntriesResponse::Success,
            1 => AppendEntriesResponse::PartialSuccess(<Option<LogId> as Wire>::take(input)?),
            2 => AppendEntriesResponse::Conflict,
            3 => AppendEntriesResponse::HigherVote(Vote::take(input)?),
            other => return Err(input.tag("answer kind", other.into())),
        })
    }
}

impl Wire for VoteRequest<NodeId> {
    const WHAT: &'static str = "a vote request";

    fn put(&self, out: &mut Vec<u8>) {
        self.vote.put(out);
        self.last_log_id.put(out);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(VoteRequest {
            vote: Vote::take(input)?,
            last_log_id: <Option<LogId> as Wire>::take(input)?,
        })
    }
}

impl Wire for VoteResponse<NodeId> {
    const WHAT: &'static str = "a vote answer";

    fn put(&self, out: &mut Vec<u8>) {
        self.vote.put(out);
        out.push(self.vote_granted.into());
        self.last_log_id.put(out);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(VoteResponse {
            vote: Vote::take(input)?,
            vote_granted: input.bool()?,
            last_log_id: <Option<LogId> as Wire>::take(input)?,
        })
    }
}

impl Wire for SnapshotResponse<NodeId> {
    const WHAT: &'static str = "a snapshot answer";

    fn put(&self, out: &mut Vec<u8>) {
        self.vote.put(out);
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(SnapshotResponse {
            vote: Vote::take(input)?,
        })
    }
}

/// A peer's failure, as its words: variant 1 of a raft answer. Only a stopped or broken raft
/// answers with one, and its receiver only reports it, so it travels as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure(pub String);

impl PeerFailure {
    /// The failure as openraft's fatal error, for raft to handle as a peer's.
    pub fn into_fatal(self) -> Fatal<NodeId> {
        Fatal::StorageError(openraft::StorageError::from(openraft::StorageIOError::<
            NodeId,
        >::read(
            &std::io::Error::other(self.0),
        )))
    }
}

/// A raft answer: the value (variant 0) or the peer's failure (variant 1).
impl<T: Wire> Wire for Result<T, PeerFailure> {
    const WHAT: &'static str = T::WHAT;

    fn put(&self, out: &mut Vec<u8>) {
        match self {
            Ok(value) => {
                put_u32(out, 0);
                value.put(out);
            }
            Err(PeerFailure(why)) => {
                put_u32(out, 1);
                put_bytes(out, why.as_bytes());
            }
        }
    }

    fn take(input: &mut Reader<'_>) -> Result<Self, WireError> {
        match input.variant()? {
            0 => T::take(input).map(Ok),
            // Builds before this codec wrote openraft's own error shape here: that is not
            // read, but it is still the peer's failure.
            1 => Ok(Err(PeerFailure(input.string().unwrap_or_else(|_| {
                input.bytes = &[];
                "the peer failed (its error is in a format this build does not read)".to_owned()
            })))),
            other => Err(input.tag("answer kind", other.into())),
        }
    }
}

#[cfg(test)]
mod tests;
