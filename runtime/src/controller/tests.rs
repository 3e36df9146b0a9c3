//! The runner over a fake [`Api`]: priming before mapping, resync, the lease gate, watches
//! that are refused or cannot be served yet, watches that end.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use proto::resource::v1::watch_event::{Delete, EndOfSnapshot, Event, Upsert};
use proto::resource::v1::{Status, Tenancy, WatchEvent, WatchListRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::runner::Stopped;
use super::*;
use crate::api::EventStream;
use crate::election::Leadership;

type Sender = mpsc::UnboundedSender<Result<WatchEvent, ApiError>>;

/// A store of resources by kind and name, with watches: a snapshot, `EndOfSnapshot` (held back
/// for the kinds in `held`), then every change.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeState>>);

#[derive(Default)]
struct FakeState {
    resources: BTreeMap<(String, String), Resource>,
    watchers: Vec<(String, Sender)>,
    /// Kinds whose snapshots do not end until released.
    held: HashSet<String>,
    /// Watches opened, per kind.
    opened: BTreeMap<String, usize>,
    /// What opening a watch answers instead, until cleared.
    refuse: Option<ApiError>,
    version: u64,
}

impl Fake {
    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().expect("fake")
    }

    fn hold_snapshots_of(&self, kind: &str) {
        self.state().held.insert(kind.into());
    }

    fn release_snapshots_of(&self, kind: &str) {
        let mut state = self.state();
        state.held.remove(kind);
        for (watched, sender) in &state.watchers {
            if watched == kind {
                let _ = sender.send(Ok(event(Event::EndOfSnapshot(EndOfSnapshot {}))));
            }
        }
    }

    /// Ends the watches of `kind` with `error` (a refusal on the stream, a failover that
    /// cannot resume).
    fn fail_watches_of(&self, kind: &str, error: ApiError) {
        let mut state = self.state();
        state.watchers.retain(|(watched, sender)| {
            if watched == kind {
                let _ = sender.send(Err(error.clone()));
                false
            } else {
                true
            }
        });
    }

    fn opened(&self, kind: &str) -> usize {
        self.state().opened.get(kind).copied().unwrap_or(0)
    }

    fn remove(&self, kind: &str, name: &str) {
        let mut state = self.state();
        if let Some(gone) = state.resources.remove(&(kind.into(), name.into())) {
            for (watched, sender) in &state.watchers {
                if watched == kind {
                    let _ = sender.send(Ok(event(Event::Delete(Delete {
                        resource: Some(gone.clone()),
                    }))));
                }
            }
        }
    }
}

fn event(event: Event) -> WatchEvent {
    WatchEvent {
        event: Some(event),
        ..Default::default()
    }
}

fn kind_of(id: &Id) -> String {
    id.r#type
        .as_ref()
        .map(|t| t.kind.clone())
        .unwrap_or_default()
}

#[async_trait::async_trait]
impl Api for Fake {
    /// The fence is the server's to check; this store has none.
    fn fenced(&self, _: proto::fence::FenceCell) -> Self {
        self.clone()
    }
    async fn read(&self, id: &Id) -> Result<Option<Resource>, ApiError> {
        Ok(self
            .state()
            .resources
            .get(&(kind_of(id), id.name.clone()))
            .cloned())
    }

    async fn write(&self, mut resource: Resource) -> Result<Resource, ApiError> {
        let mut state = self.state();
        state.version += 1;
        resource.version = state.version.to_string();
        let id = resource.id.clone().unwrap_or_default();
        state
            .resources
            .insert((kind_of(&id), id.name.clone()), resource.clone());
        for (watched, sender) in &state.watchers {
            if *watched == kind_of(&id) {
                let _ = sender.send(Ok(event(Event::Upsert(Upsert {
                    resource: Some(resource.clone()),
                }))));
            }
        }
        Ok(resource)
    }

    async fn delete(&self, id: &Id, _version: &str) -> Result<(), ApiError> {
        self.remove(&kind_of(id), &id.name);
        Ok(())
    }

    async fn list(&self, resource_type: &Type, _: &Tenancy) -> Result<Vec<Resource>, ApiError> {
        Ok(self
            .state()
            .resources
            .iter()
            .filter(|((kind, _), _)| *kind == resource_type.kind)
            .map(|(_, resource)| resource.clone())
            .collect())
    }

    async fn list_by_owner(&self, _owner: &Id) -> Result<Vec<Resource>, ApiError> {
        Ok(Vec::new())
    }

    async fn write_status(
        &self,
        id: &Id,
        _version: &str,
        key: &str,
        status: Status,
    ) -> Result<Resource, ApiError> {
        let mut stored = self
            .read(id)
            .await?
            .ok_or_else(|| ApiError::NotFound(id.name.clone()))?;
        stored.status.insert(key.into(), status);
        self.write(stored).await
    }

    async fn watch(&self, request: WatchListRequest) -> Result<EventStream, ApiError> {
        let kind = request.r#type.map(|t| t.kind).unwrap_or_default();
        let mut state = self.state();
        *state.opened.entry(kind.clone()).or_insert(0) += 1;
        if let Some(refusal) = &state.refuse {
            return Err(refusal.clone());
        }
        let (sender, mut receiver) = mpsc::unbounded_channel();
        for ((stored_kind, _), resource) in &state.resources {
            if *stored_kind == kind {
                let _ = sender.send(Ok(event(Event::Upsert(Upsert {
                    resource: Some(resource.clone()),
                }))));
            }
        }
        if !state.held.contains(&kind) {
            let _ = sender.send(Ok(event(Event::EndOfSnapshot(EndOfSnapshot {}))));
        }
        state.watchers.push((kind, sender));
        Ok(futures::stream::poll_fn(move |cx| receiver.poll_recv(cx)).boxed())
    }
}

fn new_type(kind: &str) -> Type {
    Type {
        group: "demo".into(),
        group_version: "v2".into(),
        kind: kind.into(),
    }
}

fn resource(kind: &str, name: &str, owner: Option<&str>) -> Resource {
    Resource {
        id: Some(Id {
            uid: format!("uid-{name}"),
            name: name.into(),
            r#type: Some(new_type(kind)),
            tenancy: Some(Tenancy::default()),
        }),
        owner: owner.map(|owner| Id {
            uid: format!("uid-{owner}"),
            name: owner.into(),
            r#type: Some(new_type("Artist")),
            tenancy: Some(Tenancy::default()),
        }),
        ..Default::default()
    }
}

type Calls = mpsc::UnboundedReceiver<(String, usize, usize)>;

/// Sends each reconcile's name and what the cache held then (artists, albums).
struct Probe(mpsc::UnboundedSender<(String, usize, usize)>);

#[async_trait::async_trait]
impl Reconciler<Fake> for Probe {
    async fn reconcile(
        &self,
        context: &Context<Fake>,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let cache = context.cache();
        let _ = self.0.send((
            request.id.name,
            cache.list(&new_type("Artist")).len(),
            cache.list(&new_type("Album")).len(),
        ));
        Ok(Action::AwaitChange)
    }
}

fn probe() -> (Probe, Calls) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (Probe(sender), receiver)
}

async fn next(calls: &mut Calls) -> (String, usize, usize) {
    tokio::time::timeout(Duration::from_secs(10), calls.recv())
        .await
        .expect("a reconcile within 10s")
        .expect("probe alive")
}

struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
}

fn start(controller: Controller<Fake>, api: &Fake, gate: Option<Gate>) -> Running {
    let shutdown = CancellationToken::new();
    let stats = Arc::new(Stats::default());
    let task = tokio::spawn(run(
        Arc::new(controller),
        api.clone(),
        stats.clone(),
        gate,
        shutdown.clone(),
    ));
    Running {
        shutdown,
        task,
        stats,
    }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("stops within 10s")
            .expect("stops cleanly");
    }
}

/// Consul's #20421: a mapper that ran while the cache was still filling mapped against half
/// the world. Here no mapper runs, and nothing is reconciled, until every watch's snapshot is
/// complete; what was deleted meanwhile is mapped too.
#[tokio::test]
async fn mappers_run_only_once_every_watch_is_primed() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    api.write(resource("Album", "kind-of-blue", Some("miles")))
        .await
        .expect("album");
    api.write(resource("Album", "orphan", Some("coltrane")))
        .await
        .expect("album");
    api.hold_snapshots_of("Album");
    let mapped = Arc::new(AtomicUsize::new(0));
    let counted = mapped.clone();
    let mapper: Mapper = Arc::new(move |changed: &Resource| {
        counted.fetch_add(1, Ordering::SeqCst);
        map_owner()(changed)
    });
    let (probe, mut calls) = probe();
    let controller = Controller::new("artists", new_type("Artist"))
        .with_reconciler(probe)
        .with_watch(new_type("Album"), mapper);
    let running = start(controller, &api, None);
    for _ in 0..100 {
        if api.opened("Album") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The album watch has its snapshot but not its end; meanwhile one album goes.
    api.remove("Album", "orphan");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(mapped.load(Ordering::SeqCst), 0, "no mapper before priming");
    assert!(calls.try_recv().is_err(), "no reconcile before priming");

    api.release_snapshots_of("Album");
    let mut seen = BTreeSet::new();
    for _ in 0..2 {
        let (name, artists, albums) = next(&mut calls).await;
        assert_eq!(
            (artists, albums),
            (1, 1),
            "{name} reconciled with the whole cache"
        );
        seen.insert(name);
    }
    assert_eq!(
        seen,
        BTreeSet::from(["coltrane".to_owned(), "miles".to_owned()]),
        "the owner of the album deleted while priming is reconciled too"
    );
    assert_eq!(mapped.load(Ordering::SeqCst), 2);
    running.stop().await;
}

/// With a resync, every managed resource is reconciled again though nothing changed.
#[tokio::test(start_paused = true)]
async fn a_resync_reconciles_every_managed_resource_again() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    let (probe, mut calls) = probe();
    let controller = Controller::new("artists", new_type("Artist"))
        .with_reconciler(probe)
        .with_resync(Duration::from_secs(30));
    let running = start(controller, &api, None);
    assert_eq!(next(&mut calls).await.0, "miles");
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(calls.try_recv().is_err(), "nothing before the period");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(next(&mut calls).await.0, "miles", "again after the period");
    running.stop().await;
}

#[test]
fn a_resync_more_often_than_a_second_is_refused() {
    let (probe, _calls) = probe();
    let controller = Controller::<Fake>::new("artists", new_type("Artist"))
        .with_reconciler(probe)
        .with_resync(Duration::from_millis(10));
    assert!(matches!(
        controller.validate(),
        Err(DefinitionError::ResyncTooOften { .. })
    ));
}

/// A replica that does not hold its lease reconciles nothing; once it does, it catches up.
#[tokio::test(start_paused = true)]
async fn a_gated_replica_reconciles_only_while_it_holds_the_lease() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    let leadership = Arc::new(Leadership::default());
    let gate = Gate {
        leadership: leadership.clone(),
        recheck: Duration::from_secs(2),
        shard: None,
    };
    let (probe, mut calls) = probe();
    let controller = Controller::new("artists", new_type("Artist")).with_reconciler(probe);
    let running = start(controller, &api, Some(gate));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(calls.try_recv().is_err(), "nothing without the lease");
    assert_eq!(running.stats.reconciles_ok(), 0);

    leadership.lead_until(Some(tokio::time::Instant::now() + Duration::from_secs(60)));
    assert_eq!(next(&mut calls).await.0, "miles");
    running.stop().await;
}

/// A refusal is retried with backoff (not in a hot loop), a server that cannot serve yet is
/// waited for, and the controller runs once the server can.
#[tokio::test(start_paused = true)]
async fn a_refused_watch_is_retried_with_backoff_until_it_opens() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    api.state().refuse = Some(ApiError::Failed(
        "type demo.v2.Artist is not registered".into(),
    ));
    let (probe, mut calls) = probe();
    let controller = Controller::new("artists", new_type("Artist"))
        .with_reconciler(probe)
        .with_backoff(Duration::from_millis(100), Duration::from_secs(5));
    let running = start(controller, &api, None);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let attempts = api.opened("Artist");
    assert!(
        (3..=12).contains(&attempts),
        "{attempts} attempts in 30 s: backing off to 5 s"
    );
    assert!(running.stats.running());

    api.state().refuse = Some(ApiError::Unavailable("no leader".into()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    api.state().refuse = None;
    assert_eq!(next(&mut calls).await.0, "miles");
    running.stop().await;
    let refused = |error| Stopped::WatchRefused {
        watched: new_type("Artist"),
        error,
    };
    assert!(!refused(ApiError::Failed("no".into())).is_wait());
    assert!(refused(ApiError::Unavailable("no".into())).is_wait());
}

/// A watch that ends starts the controller over: fresh watches, a fresh cache, everything
/// reconciled again.
#[tokio::test]
async fn a_watch_that_ends_starts_the_controller_over() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    let (probe, mut calls) = probe();
    let controller = Controller::new("artists", new_type("Artist")).with_reconciler(probe);
    let running = start(controller, &api, None);
    assert_eq!(next(&mut calls).await.0, "miles");
    // The server ends every watch (a restore).
    api.state().watchers.clear();
    assert_eq!(
        next(&mut calls).await.0,
        "miles",
        "reconciled again after the start over"
    );
    assert_eq!(api.opened("Artist"), 2);
    running.stop().await;
}

/// A watch refused on its stream while another is still priming ends the life (and is said),
/// rather than leaving the controller waiting forever for a snapshot that never ends.
#[tokio::test(start_paused = true)]
async fn a_watch_that_fails_while_another_primes_starts_the_controller_over() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    api.hold_snapshots_of("Album");
    let (probe, mut calls) = probe();
    let controller = Controller::new("artists", new_type("Artist"))
        .with_reconciler(probe)
        .with_watch(new_type("Album"), map_owner())
        .with_backoff(Duration::from_millis(100), Duration::from_secs(5));
    let running = start(controller, &api, None);
    for _ in 0..100 {
        if api.opened("Album") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    api.fail_watches_of(
        "Album",
        ApiError::Failed("permission denied: no list on demo.v2.Album".into()),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        api.opened("Album") >= 2,
        "the controller started over and opened its watches again"
    );
    api.release_snapshots_of("Album");
    assert_eq!(next(&mut calls).await.0, "miles");
    running.stop().await;
}

/// Reports its call, then waits forever (a write for a quorum that is gone).
struct Stuck(mpsc::UnboundedSender<(String, usize, usize)>);

#[async_trait::async_trait]
impl Reconciler<Fake> for Stuck {
    async fn reconcile(
        &self,
        _context: &Context<Fake>,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let _ = self.0.send((request.id.name, 0, 0));
        std::future::pending().await
    }
}

/// A reconcile that never returns cannot keep its controller, and the process stopping it,
/// from ending: it gets a grace period and is then cancelled.
#[tokio::test]
async fn a_reconcile_that_never_returns_does_not_stop_the_shutdown() {
    let api = Fake::default();
    api.write(resource("Artist", "miles", None))
        .await
        .expect("artist");
    let (sender, mut calls) = mpsc::unbounded_channel();
    let controller = Controller::new("artists", new_type("Artist")).with_reconciler(Stuck(sender));
    let running = start(controller, &api, None);
    let (name, _, _) = next(&mut calls).await;
    assert_eq!(name, "miles");
    running.stop().await;
}
