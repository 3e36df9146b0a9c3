//! Integration tests against real `resd` processes on loopback: the binary is started on a free
//! port, driven over gRPC, and stopped by its PID.

mod acl;
mod acl_attacks;
mod audit;
mod can_i;
mod cluster;
mod controllers;
mod crash;
mod dev;
mod disk;
mod exhaustion;
mod fence;
mod history;
mod hostile;
mod membership;
mod mtls;
mod policies;
mod process;
mod quota;
mod reflection;
mod resource_api;
mod shutdown;
mod snapshot;
mod support;
mod tidy;
mod tls;
mod type_attacks;
mod types;
mod versions;
