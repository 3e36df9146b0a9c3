//! Manager tests: placement by leadership, registration rules, watch cycles.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controller::{
    Action, Controller, InProcess, Placement, ReconcileError, Reconciler, Request, Runtime,
};
use crate::registry::Registry;
use crate::service::ResourceService;
use crate::storage::inmem::InMemBackend;
use runtime::controller::map_owner;

struct Idle;

#[async_trait]
impl Reconciler<InProcess> for Idle {
    async fn reconcile(
        &self,
        _runtime: &Runtime,
        _request: Request,
    ) -> Result<Action, ReconcileError> {
        Ok(Action::await_change())
    }
}

async fn runtime() -> Runtime {
    let registry = Arc::new(Registry::builtin().expect("registry"));
    let service = ResourceService::new(Arc::new(InMemBackend::new()), registry);
    service.ensure_default_tenancy().await.expect("tenancy");
    Runtime::new(InProcess::privileged(Arc::new(service)))
}

fn kind(kind: &str) -> proto::resource::v1::Type {
    resource::new_type("demo", "v2", kind)
}

async fn running(stats: &Stats, expected: bool) {
    for _ in 0..500 {
        if stats.running() == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("controller running != {expected} after 5s");
}

#[tokio::test]
async fn singletons_run_only_while_leading_and_each_server_controllers_always() {
    let mut manager = Manager::new(runtime().await.api().service.clone());
    manager
        .register(Controller::new("single", kind("Artist")).with_reconciler(Idle))
        .expect("register");
    manager
        .register(
            Controller::new("everywhere", kind("Album"))
                .with_reconciler(Idle)
                .with_placement(Placement::EachReplica),
        )
        .expect("register");
    let single = manager.controllers()["single"].stats.clone();
    let everywhere = manager.controllers()["everywhere"].stats.clone();
    let (leader, leadership) = watch::channel(false);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(manager.run(leadership, shutdown.clone()));

    running(&everywhere, true).await;
    assert!(!single.running(), "not leading: no singleton");
    leader.send(true).expect("send");
    running(&single, true).await;
    leader.send(false).expect("send");
    running(&single, false).await;
    assert!(everywhere.running(), "EachServer keeps running");
    leader.send(true).expect("send");
    running(&single, true).await;

    shutdown.cancel();
    task.await.expect("the manager stops");
    assert!(!single.running());
    assert!(!everywhere.running());
}

#[tokio::test]
async fn registration_rejects_bad_definitions_duplicate_names_and_shared_managed_types() {
    let mut manager = Manager::new(runtime().await.api().service.clone());
    assert!(matches!(
        manager.register(Controller::new("no-reconciler", kind("Artist"))),
        Err(ManagerError::Definition(_))
    ));
    manager
        .register(Controller::new("a", kind("Artist")).with_reconciler(Idle))
        .expect("first");
    assert_eq!(
        manager.register(Controller::new("a", kind("Album")).with_reconciler(Idle)),
        Err(ManagerError::DuplicateName("a".into()))
    );
    assert!(matches!(
        manager.register(
            Controller::new("b", resource::new_type("demo", "v1", "Artist")).with_reconciler(Idle)
        ),
        Err(ManagerError::DuplicateManagedType { .. })
    ));
}

#[tokio::test]
async fn two_controllers_watching_each_other_are_reported() {
    let mut manager = Manager::new(runtime().await.api().service.clone());
    manager
        .register(
            Controller::new("artists", kind("Artist"))
                .with_reconciler(Idle)
                .with_watch(kind("Album"), map_owner()),
        )
        .expect("artists");
    manager
        .register(
            Controller::new("albums", kind("Album"))
                .with_reconciler(Idle)
                .with_watch(kind("Artist"), map_owner()),
        )
        .expect("albums");
    assert_eq!(
        manager.watch_cycles(),
        vec![("albums".to_owned(), "artists".to_owned())]
    );
}

/// Reports may not claim a built-in controller: the registry's list of them is the list the
/// server registers.
#[tokio::test]
async fn the_registry_knows_every_built_in_controller_by_name() {
    let runtime = runtime().await;
    let mut manager = Manager::new(runtime.api().service.clone());
    crate::controller::builtin::register(
        &mut manager,
        runtime.api().service.registry().clone(),
        Duration::from_secs(1),
    )
    .expect("register");
    let names: Vec<&str> = manager.controllers().keys().map(String::as_str).collect();
    let mut known = crate::registry::builtin::BUILTIN_CONTROLLERS.to_vec();
    known.sort_unstable();
    assert_eq!(names, known);
}
