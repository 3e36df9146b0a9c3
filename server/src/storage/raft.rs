//! The Raft storage backend: openraft with its log and state machine in LMDB.
//!
//! - [`op`]: the vocabulary — [`op::Op`] (a log entry's payload), [`op::Outcome`] (what applying
//!   it produced), [`op::Request`]/[`op::Reply`] (what a follower forwards to the leader);
//! - [`codec`]: the one conversion between that vocabulary and protobuf (the log entry format,
//!   the Forward RPC, storage errors on the wire);
//! - [`types`]: the openraft type configuration and the values it carries;
//! - [`schema`]: every LMDB environment, database name, key encoding, file name and the on-disk
//!   format version; [`sealed`]: the checksum every state machine value carries;
//! - [`log_store`]: the Raft log, with group commit;
//! - [`state_machine`]: apply, recovery, raft snapshots, operator export, local reads;
//! - [`network`]: the internal gRPC service between nodes (client and server sides);
//! - [`node`]: [`node::RaftNode`], one node of the group: its lifecycle, the proposer,
//!   forwarding to the leader, read-index rounds, readiness, pre-vote, repair and status;
//! - [`backend`]: [`backend::RaftBackend`], the storage contract over a node (thin).
//!
//! Membership (join, add voter, remove, transfer, peer admission) is `crate::cluster`'s.

// openraft's storage traits fix the error type, and it is large.
#![allow(clippy::result_large_err)]

pub(crate) mod backend;
pub(crate) mod codec;
pub(crate) mod disk;
pub(crate) mod log_store;
pub(crate) mod network;
pub(crate) mod node;
pub mod op;
pub(crate) mod schema;
pub(crate) mod sealed;
pub mod state_machine;
pub mod types;
pub(crate) mod wal;

#[cfg(test)]
pub(crate) mod tests;
