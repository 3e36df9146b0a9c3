//! The Raft storage backend: openraft with its log and state machine in LMDB.
//!
//! - [`types`]: the openraft type configuration and the values it carries;
//! - [`schema`]: every LMDB environment, database name and key encoding;
//! - [`log_store`]: the Raft log, with group commit;
//! - [`state_machine`]: applied state, watch events, snapshots;
//! - [`network`]: the internal gRPC service between nodes (raft RPCs, snapshots, forwarding);
//! - [`backend`]: [`backend::RaftBackend`], the storage contract over the Raft group.

// openraft's storage traits fix the error type, and it is large.
#![allow(clippy::result_large_err)]

pub mod backend;
pub mod log_store;
pub mod network;
pub mod schema;
pub mod state_machine;
pub mod types;

#[cfg(test)]
mod tests;
