//! The controller runtime for programs of their own (DESIGN §16), which the server's built-in
//! controllers share as it grows:
//! - [`queue`]: deduplicated keys, one run per key at a time, per-key backoff (the server's
//!   controllers use it already);
//! - [`election`]: placement across replicas, taking, renewing and giving up a
//!   `coordination.v1.Lease` with client-go's rules over an [`election::LeaseStore`];
//! - [`report`]: what makes a replica visible in every view;
//! - [`controller`]: a controller of a program outside the server, built from the above;
//! - [`grpc::ClusterStore`]: both stores for a program talking to a cluster.

pub mod controller;
pub mod election;
pub mod grpc;
pub mod queue;
pub mod report;

/// Now, as the informational times of leases and reports carry it (this machine's clock: never
/// compared with another's).
fn now_timestamp() -> prost_types::Timestamp {
    let now = time::OffsetDateTime::now_utc();
    prost_types::Timestamp {
        seconds: now.unix_timestamp(),
        nanos: i32::try_from(now.nanosecond()).unwrap_or(0),
    }
}
