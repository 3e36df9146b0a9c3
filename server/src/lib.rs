//! resd's server: the resource service, the type registry, ACLs and the storage backends.
//!
//! Layout (one concept per module; ARCHITECTURE.md is the map):
//! - [`resource`]: pure values and rules of the resource model (names, types, finalizers);
//! - [`registry`]: registered types (built in, and registered at runtime), scopes and hooks;
//! - [`acl`]: authorizers, policies, rules and token resolution;
//! - [`storage`]: the [`storage::Backend`] contract, its backends (raft, in memory) and the
//!   conformance suite;
//! - [`cluster`]: membership of the raft group (join, add voter, remove, transfer, peer
//!   admission), behind the trait the cluster service takes;
//! - [`service`]: the resource and cluster services, their gRPC handlers and the one mapping
//!   of errors to statuses and reasons;
//! - [`controller`]: the server's controllers on the `runtime` crate (`InProcess`, the
//!   manager, the built-ins);
//! - [`limits`]: what a caller may hold at once (rates, watches, bytes in flight);
//! - [`metrics`]: the Prometheus registry and its instruments;
//! - [`http`]: the HTTP server (`/metrics`, health, the HTTP+JSON API);
//! - [`tls`]: certificates for a cluster (`resd tls`) and the TLS of both ports;
//! - [`wire`]: bytes written by hand (openraft's values, protobuf framing) and the on-disk
//!   format number;
//! - [`agent`]: one running node, assembled from the above, and `resd dev`.

pub(crate) mod acl;
pub mod agent;
pub mod audit;
pub(crate) mod cluster;
pub(crate) mod controller;
pub(crate) mod http;
pub(crate) mod limits;
pub(crate) mod metrics;
pub(crate) mod registry;
pub(crate) mod resource;
pub(crate) mod service;
pub mod storage;
pub mod tls;
pub mod wire;
