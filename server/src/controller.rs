//! The controller runtime: reconcile loops that react to resource changes. So far its work
//! queue ([`queue::WorkQueue`]); controllers, the manager and the built-in controllers build on it.

pub mod queue;
