//! The controller runtime for programs of their own (DESIGN §16). This crate starts with
//! placement across replicas: [`election`] takes, renews and gives up a
//! `coordination.v1.Lease` with client-go's rules, over a [`election::LeaseStore`]:
//! [`grpc::ClusterStore`] for a program talking to a cluster; [`report`] makes a replica visible in
//! every view.

pub mod election;
pub mod grpc;
pub mod report;
