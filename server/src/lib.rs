//! resd's server: the resource service, the type registry, ACLs and the storage backends.
//!
//! Layout (one concept per module):
//! - [`resource`]: pure values and rules of the resource model (names, types, finalizers);
//! - [`registry`]: registered types, their scopes and hooks, and the built-in types;
//! - [`acl`]: authorizers, policies and token resolution;
//! - [`storage`]: the [`storage::Backend`] contract, its backends and the conformance suite;
//! - [`service`]: the resource and cluster services and their gRPC handlers;
//! - [`controller`]: the controller runtime (controllers, reconcile loop, work queue);
//! - [`tls`]: certificates for a cluster (`resd tls`): CA, node and client certificates;
//! - [`agent`]: one running node, assembled from the above.

pub mod acl;
pub mod agent;
pub mod controller;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod registry;
pub mod resource;
pub mod service;
pub mod storage;
pub mod tls;
