//! resd's controller runtime (DESIGN §7, §16): one library for the server's built-in
//! controllers (in process, over the resource service) and for a team's program (over gRPC,
//! with a token and several servers):
//! - [`api`]: the small client a controller acts through ([`api::Api`]), implemented by the
//!   server in process and by [`grpc`] over a cluster client;
//! - [`controller`]: definitions, the cache, the runner (prime, map, reconcile, retry, resync);
//! - [`queue`]: deduplicated keys, one run per key at a time, per-key backoff;
//! - [`election`]: placement across replicas, taking, renewing and giving up a
//!   `coordination.v1.Lease` with client-go's rules;
//! - [`report`]: what makes a program's replica visible in every view;
//! - [`shard`]: a member of a sharded controller: its objects by the server's ShardMap, and the
//!   handover's acknowledgement;
//! - [`events`]: what a controller did and why, merged and rate-limited into Events;
//! - [`replica`]: a program's replica of a controller, built from the above;
//! - [`program`]: finding the cluster as resctl does (flags, environment, contexts file) and
//!   logging plainly off a terminal.

pub mod api;
pub mod controller;
pub mod election;
pub mod events;
pub mod grpc;
pub mod program;
pub mod queue;
pub mod replica;
pub mod report;
pub mod shard;

/// Now, as the informational times of leases carry it (this machine's clock: never compared
/// with another's).
fn now_timestamp() -> prost_types::Timestamp {
    let now = time::OffsetDateTime::now_utc();
    prost_types::Timestamp {
        seconds: now.unix_timestamp(),
        nanos: i32::try_from(now.nanosecond()).unwrap_or(0),
    }
}
