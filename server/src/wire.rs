//! The one room for bytes resd writes by hand: openraft's values in resd's own codec
//! ([`raft`]), the protobuf framing written without building messages ([`proto`]), log entries
//! of changes written straight from the typed changes ([`changes`]), and the one number that
//! names the on-disk format ([`FORMAT`]).
//!
//! Typed values meet protobuf in `storage::raft::codec` (log payloads, forwarded requests) and
//! `service::encoded` (answers framed from stored bytes); what they write by hand is here. A
//! change of any byte written to disk here or there is a change of [`FORMAT`], and the golden
//! tests beside each codec say when bytes changed.

pub(crate) mod changes;
pub(crate) mod proto;
pub mod raft;

/// The on-disk format this build writes, and the newest it reads: the data directory's layout
/// (`storage::raft::schema`), the write-ahead log's records (`storage::raft::wal`), log entry
/// payloads (`storage::raft::codec`) and openraft's values ([`raft`]). Every LMDB environment
/// and every log segment records the format it was written in; a build refuses a newer one,
/// naming both, and reads older ones. Bump it (and teach the readers the old one) when any of
/// them changes.
///
/// 1: the raft log in LMDB. 2: the write-ahead log, with batch markers. 3: segment headers
/// record the segment's size and segments are sealed; every state machine value is sealed with
/// a checksum of its key and bytes.
pub(crate) const FORMAT: u32 = 3;
