//! Controller runtime tests, in-process over the in-memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use proto::demo::v2 as demo_v2;
use proto::resource::v1::{Id, Resource, Tenancy, Type};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use runtime::controller::{Initializer, map_owner, replace_type};

use super::*;
use crate::registry::Registry;
use crate::resource;
use crate::storage::inmem::InMemBackend;

fn artist_type() -> Type {
    resource::new_type("demo", "v2", "Artist")
}

fn album_type() -> Type {
    resource::new_type("demo", "v2", "Album")
}

fn id(resource_type: Type, name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(resource_type),
        tenancy: Some(Tenancy::default()),
    }
}

fn artist(name: &str) -> Resource {
    Resource {
        id: Some(id(artist_type(), name)),
        data: Some(proto::to_any(&demo_v2::Artist {
            name: name.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

async fn runtime() -> Runtime {
    let registry = Arc::new(Registry::builtin().expect("registry"));
    let service = ResourceService::new(Arc::new(InMemBackend::new()), registry);
    service.ensure_default_tenancy().await.expect("tenancy");
    Runtime::new(InProcess::privileged(Arc::new(service)))
}

/// Reports every call and answers with what `answer` says for the n-th call (1-based).
struct Recorder {
    calls: mpsc::UnboundedSender<(Instant, String)>,
    count: AtomicU32,
    answer: Box<dyn Fn(u32) -> Result<Action, ReconcileError> + Send + Sync>,
}

#[async_trait]
impl Reconciler<InProcess> for Recorder {
    async fn reconcile(
        &self,
        _runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let call = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self.calls.send((Instant::now(), request.id.name.clone()));
        (self.answer)(call)
    }
}

fn recorder(
    answer: impl Fn(u32) -> Result<Action, ReconcileError> + Send + Sync + 'static,
) -> (Recorder, mpsc::UnboundedReceiver<(Instant, String)>) {
    let (calls, received) = mpsc::unbounded_channel();
    (
        Recorder {
            calls,
            count: AtomicU32::new(0),
            answer: Box::new(answer),
        },
        received,
    )
}

struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("the controller stops cleanly");
    }
}

fn start(controller: Controller, runtime: &Runtime) -> Running {
    let shutdown = CancellationToken::new();
    let stats = Arc::new(Stats::default());
    let api = InProcess::controller(runtime.api().service.clone(), &controller.name);
    let task = tokio::spawn(runtime::controller::run(
        Arc::new(controller),
        api,
        stats.clone(),
        None,
        shutdown.clone(),
    ));
    Running {
        shutdown,
        task,
        stats,
    }
}

async fn next_call(calls: &mut mpsc::UnboundedReceiver<(Instant, String)>) -> (Instant, String) {
    tokio::time::timeout(Duration::from_secs(10), calls.recv())
        .await
        .expect("a reconcile within 10s")
        .expect("recorder alive")
}

async fn no_call_for(calls: &mut mpsc::UnboundedReceiver<(Instant, String)>, quiet: Duration) {
    if let Ok(Some(call)) = tokio::time::timeout(quiet, calls.recv()).await {
        panic!("unexpected reconcile {call:?}");
    }
}

#[tokio::test]
async fn existing_resources_are_reconciled_once_at_start_then_each_write() {
    let runtime = runtime().await;
    runtime.write(artist("early")).await.expect("write");
    let (reconciler, mut calls) = recorder(|_| Ok(Action::await_change()));
    let running = start(
        Controller::new("artists", artist_type()).with_reconciler(reconciler),
        &runtime,
    );
    assert_eq!(next_call(&mut calls).await.1, "early");
    no_call_for(&mut calls, Duration::from_millis(200)).await;
    runtime.write(artist("late")).await.expect("write");
    assert_eq!(next_call(&mut calls).await.1, "late");
    assert_eq!(running.stats.reconciles_ok(), 2);
    running.stop().await;
}

#[tokio::test]
async fn a_change_of_a_watched_type_reconciles_the_owner() {
    let runtime = runtime().await;
    let owner = runtime.write(artist("miles")).await.expect("owner");
    let (reconciler, mut calls) = recorder(|_| Ok(Action::await_change()));
    let controller = Controller::new("artists", artist_type())
        .with_reconciler(reconciler)
        .with_watch(album_type(), map_owner());
    let running = start(controller, &runtime);
    assert_eq!(next_call(&mut calls).await.1, "miles", "the initial pass");
    let album = Resource {
        id: Some(id(album_type(), "kind-of-blue")),
        owner: owner.id.clone(),
        ..Default::default()
    };
    runtime.write(album).await.expect("album");
    assert_eq!(next_call(&mut calls).await.1, "miles", "the album's owner");
    running.stop().await;
}

#[tokio::test]
async fn errors_are_retried_with_backoff_until_they_succeed() {
    let runtime = runtime().await;
    runtime.write(artist("flaky")).await.expect("write");
    let (reconciler, mut calls) = recorder(|call| {
        if call <= 2 {
            Err(ReconcileError(format!("failure {call}")))
        } else {
            Ok(Action::await_change())
        }
    });
    let controller = Controller::new("artists", artist_type())
        .with_reconciler(reconciler)
        .with_backoff(Duration::from_millis(50), Duration::from_secs(1));
    let running = start(controller, &runtime);
    let (first, _) = next_call(&mut calls).await;
    let (second, _) = next_call(&mut calls).await;
    let (third, _) = next_call(&mut calls).await;
    assert!(
        second - first >= Duration::from_millis(50),
        "first retry after the base delay"
    );
    assert!(third - second >= Duration::from_millis(100), "then doubled");
    no_call_for(&mut calls, Duration::from_millis(300)).await;
    assert_eq!(running.stats.reconciles_failed(), 2);
    assert_eq!(running.stats.last_error().as_deref(), Some("failure 2"));
    running.stop().await;
}

struct Panicker {
    calls: Arc<AtomicU32>,
}

#[async_trait]
impl Reconciler<InProcess> for Panicker {
    async fn reconcile(
        &self,
        _runtime: &Runtime,
        _request: Request,
    ) -> Result<Action, ReconcileError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a bug in the reconciler");
        }
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn a_panicking_reconciler_is_an_error_and_a_retry_not_a_dead_controller() {
    let runtime = runtime().await;
    runtime.write(artist("boom")).await.expect("write");
    let calls = Arc::new(AtomicU32::new(0));
    let controller = Controller::new("artists", artist_type())
        .with_reconciler(Panicker {
            calls: calls.clone(),
        })
        .with_backoff(Duration::from_millis(20), Duration::from_millis(100));
    let running = start(controller, &runtime);
    for _ in 0..200 {
        if running.stats.reconciles_ok() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "it ran again after the panic"
    );
    assert_eq!(running.stats.reconciles_failed(), 1);
    assert_eq!(
        running.stats.last_error().as_deref(),
        Some("the reconciler panicked")
    );
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_requeue_runs_again_after_its_delay_and_not_before() {
    let runtime = runtime().await;
    runtime.write(artist("periodic")).await.expect("write");
    let (reconciler, mut calls) = recorder(|_| Ok(Action::requeue(Duration::from_secs(1))));
    let running = start(
        Controller::new("artists", artist_type()).with_reconciler(reconciler),
        &runtime,
    );
    let (first, _) = next_call(&mut calls).await;
    let (second, _) = next_call(&mut calls).await;
    let gap = second - first;
    assert!(
        gap >= Duration::from_secs(1) && gap < Duration::from_millis(1100),
        "{gap:?}"
    );
    running.stop().await;
}

struct FlakyInitializer {
    attempts: Arc<AtomicU32>,
}

#[async_trait]
impl Initializer<InProcess> for FlakyInitializer {
    async fn initialize(&self, _runtime: &Runtime) -> Result<(), ReconcileError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) < 2 {
            Err(ReconcileError("not yet".into()))
        } else {
            Ok(())
        }
    }
}

#[tokio::test]
async fn a_failing_initializer_is_retried_and_nothing_is_reconciled_before_it_succeeds() {
    let runtime = runtime().await;
    runtime.write(artist("waiting")).await.expect("write");
    let attempts = Arc::new(AtomicU32::new(0));
    let (reconciler, mut calls) = recorder(|_| Ok(Action::await_change()));
    let controller = Controller::new("artists", artist_type())
        .with_reconciler(reconciler)
        .with_initializer(FlakyInitializer {
            attempts: attempts.clone(),
        })
        .with_backoff(Duration::from_millis(30), Duration::from_secs(1));
    let running = start(controller, &runtime);
    let (_, name) = next_call(&mut calls).await;
    assert_eq!(name, "waiting");
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        3,
        "two failures, then success, then the first reconcile"
    );
    running.stop().await;
}

#[test]
fn definitions_without_a_reconciler_or_with_duplicate_watches_are_rejected() {
    let (reconciler, _calls) = recorder(|_| Ok(Action::await_change()));
    assert_eq!(
        Controller::new("c", artist_type()).validate(),
        Err(DefinitionError::NoReconciler("c".into()))
    );
    let twice = Controller::new("c", artist_type())
        .with_reconciler(reconciler)
        .with_watch(album_type(), map_owner())
        .with_watch(resource::new_type("demo", "v1", "Album"), map_owner());
    assert!(matches!(
        twice.validate(),
        Err(DefinitionError::DuplicateWatch { .. })
    ));
    let (reconciler, _calls) = recorder(|_| Ok(Action::await_change()));
    let itself = Controller::new("c", artist_type())
        .with_reconciler(reconciler)
        .with_watch(resource::new_type("demo", "v1", "Artist"), map_owner());
    assert!(matches!(
        itself.validate(),
        Err(DefinitionError::WatchesManagedType { .. })
    ));
}

#[test]
fn mappers_find_owners_and_same_named_resources() {
    let mut owner = id(artist_type(), "miles");
    owner.uid = "01ARZ3NDEKTSV4RRFFQ69G5FAV".into();
    let album = Resource {
        id: Some(id(album_type(), "kind-of-blue")),
        owner: Some(owner.clone()),
        ..Default::default()
    };
    assert_eq!(map_owner()(&album), vec![Request { id: owner.clone() }]);
    assert_eq!(
        map_owner_filtered(artist_type())(&album),
        vec![Request { id: owner }]
    );
    assert!(map_owner_filtered(resource::new_type("demo", "v1", "Concept"))(&album).is_empty());
    assert!(map_owner()(&artist("orphan")).is_empty());
    let replaced = replace_type(artist_type())(&album);
    assert_eq!(replaced[0].id.name, "kind-of-blue");
    assert_eq!(replaced[0].id.r#type, Some(artist_type()));
}

#[tokio::test]
async fn an_identical_status_is_not_written_again() {
    let runtime = runtime().await;
    let stored = runtime.write(artist("miles")).await.expect("write");
    let status = Status {
        observed_generation: stored.generation.clone(),
        conditions: vec![],
        updated_at: None,
    };
    assert!(
        runtime
            .write_status_if_changed(&stored, "ctl", status.clone())
            .await
            .expect("first")
    );
    let reread = runtime
        .read(&stored.id.clone().expect("id"))
        .await
        .expect("read")
        .expect("exists");
    assert!(
        !runtime
            .write_status_if_changed(&reread, "ctl", status)
            .await
            .expect("second")
    );
    let again = runtime
        .read(&stored.id.clone().expect("id"))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(again.version, reread.version, "no write happened");
}

/// Reports, at each reconcile, what the cache holds for the artist being reconciled.
struct CacheProbe {
    seen: mpsc::UnboundedSender<(bool, usize)>,
}

#[async_trait]
impl Reconciler<InProcess> for CacheProbe {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let artist = runtime.cache().get(&request.id);
        let albums = artist
            .as_ref()
            .and_then(|a| a.id.as_ref())
            .map(|artist_id| runtime.cache().owned_by(artist_id).len())
            .unwrap_or(0);
        let _ = self.seen.send((artist.is_some(), albums));
        Ok(Action::await_change())
    }
}

#[tokio::test]
async fn the_cache_is_primed_before_the_first_reconcile_and_follows_changes() {
    let runtime = runtime().await;
    let owner = runtime.write(artist("miles")).await.expect("owner");
    let album = |name: &str| Resource {
        id: Some(id(album_type(), name)),
        owner: owner.id.clone(),
        ..Default::default()
    };
    runtime.write(album("kind-of-blue")).await.expect("album");
    let (seen, mut probes) = mpsc::unbounded_channel();
    let controller = Controller::new("artists", artist_type())
        .with_reconciler(CacheProbe { seen })
        .with_watch(album_type(), map_owner());
    let running = start(controller, &runtime);
    let first = tokio::time::timeout(Duration::from_secs(10), probes.recv())
        .await
        .expect("a reconcile")
        .expect("open");
    assert_eq!(
        first,
        (true, 1),
        "the artist and its album are cached before the first reconcile"
    );
    runtime
        .write(album("sketches-of-spain"))
        .await
        .expect("second album");
    let mut latest = first;
    for _ in 0..10 {
        match tokio::time::timeout(Duration::from_secs(5), probes.recv()).await {
            Ok(Some(probe)) => latest = probe,
            _ => break,
        }
        if latest == (true, 2) {
            break;
        }
    }
    assert_eq!(latest, (true, 2), "the cache follows new albums");
    running.stop().await;
}

/// The runtime waits quietly for a server that cannot serve yet and warns of anything else:
/// what it is told is the service's error, typed.
#[test]
fn a_node_that_cannot_serve_yet_is_a_wait_and_a_refusal_is_a_failure() {
    let catching_up = api_error(service::Error::Unavailable(
        "this node is catching up after an unclean stop: applied 3 of 9".into(),
    ));
    assert!(
        matches!(&catching_up, ApiError::Unavailable(message) if message.contains("catching up")),
        "{catching_up:?}"
    );
    assert!(matches!(
        api_error(service::Error::PermissionDenied("no".into())),
        ApiError::Failed(_)
    ));
    assert!(matches!(
        api_error(service::Error::CasFailed("stale".into())),
        ApiError::Conflict(_)
    ));
    assert!(matches!(
        api_error(service::Error::OutOfRange("history moved on".into())),
        ApiError::Relist(_)
    ));
}

/// The service in process answers a controller as a cluster client does: the runtime's
/// conformance suite (the tests crate runs it over gRPC against a real cluster).
#[tokio::test]
async fn the_in_process_api_passes_the_runtime_conformance_suite() {
    let service = runtime().await.api().service.clone();
    let api = InProcess::controller(service, "conformance");
    runtime::api::conformance::run(&api, "conformance").await;
}
