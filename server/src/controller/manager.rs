//! [`Manager`]: runs a node's controllers. Controllers placed on each replica run on every
//! server for the node's whole life; Singleton controllers run only while the node is the raft
//! leader, and stop (queues and all) when it loses leadership.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use runtime::controller::run;

use super::{Controller, DefinitionError, InProcess, Placement, Stats};
use crate::resource;
use crate::service::ResourceService;

/// A controller registered with a manager, and its live statistics.
#[derive(Debug, Clone)]
pub(crate) struct Registered {
    pub controller: Arc<Controller>,
    pub stats: Arc<Stats>,
}

/// What `ClusterService.ListControllers` reports for these controllers now.
pub(crate) fn report(
    controllers: &BTreeMap<String, Registered>,
) -> Vec<proto::cluster::v1::ControllerInfo> {
    use proto::cluster::v1 as pb;
    controllers
        .values()
        .map(|registered| {
            let controller = &registered.controller;
            let stats = &registered.stats;
            pb::ControllerInfo {
                name: controller.name.clone(),
                managed_type: Some(controller.managed_type.clone()),
                watched_types: controller.watches.iter().map(|(t, _)| t.clone()).collect(),
                placement: match controller.placement {
                    Placement::Singleton => pb::Placement::Singleton,
                    Placement::EachReplica => pb::Placement::EachServer,
                    Placement::Sharded => pb::Placement::Sharded,
                } as i32,
                running: stats.running(),
                queue_depth: stats.queue_depth(),
                reconciles_ok: stats.reconciles_ok(),
                reconciles_failed: stats.reconciles_failed(),
                last_error: stats.last_error().unwrap_or_default(),
                last_reconcile: stats.last_reconcile().map(prost_types::Timestamp::from),
                finalizers: controller.finalizers.clone(),
            }
        })
        .collect()
}

#[derive(Debug)]
pub(crate) struct Manager {
    service: Arc<ResourceService>,
    controllers: BTreeMap<String, Registered>,
}

#[cfg(test)]
mod tests;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ManagerError {
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    #[error("a controller named {0:?} is already registered")]
    DuplicateName(String),
    #[error("controllers {first:?} and {second:?} both manage {gvk}")]
    DuplicateManagedType {
        first: String,
        second: String,
        gvk: String,
    },
    #[error(
        "controller {0:?} is Sharded: only a program's replicas shard (the server places its controllers on the leader or on every server)"
    )]
    Sharded(String),
}

impl Manager {
    pub(crate) fn new(service: Arc<ResourceService>) -> Self {
        Manager {
            service,
            controllers: BTreeMap::new(),
        }
    }

    /// Adds a controller; invalid definitions are errors (caught at startup).
    pub(crate) fn register(&mut self, controller: Controller) -> Result<(), ManagerError> {
        controller.validate()?;
        if controller.placement == Placement::Sharded {
            return Err(ManagerError::Sharded(controller.name));
        }
        if self.controllers.contains_key(&controller.name) {
            return Err(ManagerError::DuplicateName(controller.name));
        }
        let unversioned = |t: &proto::resource::v1::Type| (t.group.clone(), t.kind.clone());
        if let Some(existing) = self.controllers.values().find(|r| {
            unversioned(&r.controller.managed_type) == unversioned(&controller.managed_type)
        }) {
            return Err(ManagerError::DuplicateManagedType {
                first: existing.controller.name.clone(),
                second: controller.name,
                gvk: resource::gvk(&controller.managed_type),
            });
        }
        self.controllers.insert(
            controller.name.clone(),
            Registered {
                controller: Arc::new(controller),
                stats: Arc::new(Stats::default()),
            },
        );
        Ok(())
    }

    /// Pairs of controllers that watch each other's managed types: each one's writes can wake
    /// the other. Not an error (status dirty checks usually end the ping-pong), but worth a log.
    pub(crate) fn watch_cycles(&self) -> Vec<(String, String)> {
        let unversioned = |t: &proto::resource::v1::Type| (t.group.clone(), t.kind.clone());
        let watches = |a: &Registered, b: &Registered| {
            a.controller
                .watches
                .iter()
                .any(|(watched, _)| unversioned(watched) == unversioned(&b.controller.managed_type))
        };
        let all: Vec<&Registered> = self.controllers.values().collect();
        let mut cycles = Vec::new();
        for (index, a) in all.iter().enumerate() {
            for b in &all[index + 1..] {
                if watches(a, b) && watches(b, a) {
                    cycles.push((a.controller.name.clone(), b.controller.name.clone()));
                }
            }
        }
        cycles
    }

    /// The registered controllers and their statistics, by name.
    pub(crate) fn controllers(&self) -> &BTreeMap<String, Registered> {
        &self.controllers
    }

    /// Runs every controller until `shutdown`: those on each replica throughout, Singleton ones while
    /// `leader` says this node leads.
    pub(crate) async fn run(self, mut leader: watch::Receiver<bool>, shutdown: CancellationToken) {
        for (first, second) in self.watch_cycles() {
            tracing::warn!(
                first,
                second,
                "controllers watch each other's managed types: a write loop is possible"
            );
        }
        // The manager's own scope: ending it stops every controller, not the node.
        let scope = shutdown.child_token();
        let mut tasks = tokio::task::JoinSet::new();
        let (singletons, everywhere): (Vec<&Registered>, Vec<&Registered>) = self
            .controllers
            .values()
            .partition(|r| r.controller.placement == Placement::Singleton);
        for registered in everywhere {
            tasks.spawn(run(
                registered.controller.clone(),
                InProcess::controller(self.service.clone(), &registered.controller.name),
                registered.stats.clone(),
                None,
                scope.clone(),
            ));
        }
        let mut leading: Option<CancellationToken> = None;
        loop {
            let is_leader = *leader.borrow_and_update();
            match (is_leader, &leading) {
                (true, None) => {
                    tracing::info!("this node leads: starting singleton controllers");
                    let term = scope.child_token();
                    for registered in &singletons {
                        tasks.spawn(run(
                            registered.controller.clone(),
                            InProcess::controller(
                                self.service.clone(),
                                &registered.controller.name,
                            ),
                            registered.stats.clone(),
                            None,
                            term.clone(),
                        ));
                    }
                    leading = Some(term);
                }
                (false, Some(term)) => {
                    tracing::info!("this node no longer leads: stopping singleton controllers");
                    term.cancel();
                    leading = None;
                }
                _ => {}
            }
            tokio::select! {
                () = scope.cancelled() => break,
                changed = leader.changed() => if changed.is_err() { break },
                // Reap controllers that stopped.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        scope.cancel();
        while tasks.join_next().await.is_some() {}
    }
}
