//! The controller runtime: reconcile loops that react to resource changes, the same for the
//! server's built-in controllers (in process) and a team's program (over gRPC, DESIGN §16).
//!
//! A [`Controller`] names a managed type, a [`Reconciler`], the other types it watches (each with
//! a [`Mapper`] from a changed resource to the managed resources to reconcile), an optional
//! [`Initializer`], a [`Placement`], a [`Backoff`] and an optional periodic resync. [`run`]
//! drives one controller over an [`Api`]: it runs the initializer (retrying with backoff until
//! it succeeds), opens a watch for the managed type and each watched one, primes the
//! [`Cache`] from every watch's snapshot, and only then maps and reconciles — every existing
//! managed resource once, then what changes. A reconciler answers with an [`Action`]; an error
//! or a panic is retried with per-key backoff. A watch that ends (a restore, a watcher that fell
//! behind, a history the server cannot resume) starts the controller over from fresh snapshots.
//!
//! Who runs a controller is the caller's business: the server's manager runs a singleton only
//! on the raft leader; a program's replica ([`crate::replica`]) passes a [`Gate`], and its
//! workers reconcile only while the replica holds its lease.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::{FutureExt, StreamExt};
use proto::resource::v1::{Id, Resource, Status, Tenancy, Type, WatchListRequest, watch_event};
use tokio_util::sync::CancellationToken;

use crate::api::{Api, ApiError, EventStream};
use crate::election::Leadership;
use crate::queue::{Backoff, WorkQueue};

/// What to reconcile: a managed resource, by id (the uid may be empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub id: Id,
}

/// What a reconciler wants next for the resource it reconciled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the resource (or something mapped to it) changes.
    AwaitChange,
    /// Reconcile again after this long, even without a change.
    Requeue(Duration),
}

impl Action {
    pub fn await_change() -> Action {
        Action::AwaitChange
    }

    pub fn requeue(after: Duration) -> Action {
        Action::Requeue(after)
    }
}

/// A reconcile or initializer failure; retried with backoff.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReconcileError(pub String);

impl From<ApiError> for ReconcileError {
    fn from(error: ApiError) -> Self {
        ReconcileError(error.to_string())
    }
}

/// Brings the world in line with one managed resource.
#[async_trait::async_trait]
pub trait Reconciler<A: Api>: Send + Sync + 'static {
    async fn reconcile(
        &self,
        context: &Context<A>,
        request: Request,
    ) -> Result<Action, ReconcileError>;
}

/// Runs once before a controller reconciles anything (at each start over); retried with backoff
/// until it succeeds.
#[async_trait::async_trait]
pub trait Initializer<A: Api>: Send + Sync + 'static {
    async fn initialize(&self, context: &Context<A>) -> Result<(), ReconcileError>;
}

/// From a changed resource of a watched type to the managed resources to reconcile.
pub type Mapper = Arc<dyn Fn(&Resource) -> Vec<Request> + Send + Sync>;

/// Reconciles the owner of the changed resource (if it has one).
pub fn map_owner() -> Mapper {
    Arc::new(|resource: &Resource| {
        resource
            .owner
            .clone()
            .map(|owner| vec![Request { id: owner }])
            .unwrap_or_default()
    })
}

/// Reconciles the owner of the changed resource when the owner is of `owner_type` (group and
/// kind; any version).
pub fn map_owner_filtered(owner_type: Type) -> Mapper {
    Arc::new(move |resource: &Resource| match &resource.owner {
        Some(owner)
            if owner
                .r#type
                .as_ref()
                .is_some_and(|t| t.group == owner_type.group && t.kind == owner_type.kind) =>
        {
            vec![Request { id: owner.clone() }]
        }
        _ => Vec::new(),
    })
}

/// Reconciles the managed resource with the same name and tenancy as the changed one.
pub fn replace_type(managed_type: Type) -> Mapper {
    Arc::new(move |resource: &Resource| {
        let mut id = resource.id.clone().unwrap_or_default();
        id.uid.clear();
        id.r#type = Some(managed_type.clone());
        vec![Request { id }]
    })
}

/// Where a controller reconciles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// One place at a time: in the server, the raft leader; in a program, the replica holding
    /// the Lease named after the controller.
    Singleton,
    /// Everywhere: every server, every replica of a program.
    EachReplica,
}

/// `group.version.Kind`.
pub fn gvk(resource_type: &Type) -> String {
    format!(
        "{}.{}.{}",
        resource_type.group, resource_type.group_version, resource_type.kind
    )
}

/// A controller definition. Build with [`Controller::new`] and the `with_*` methods.
pub struct Controller<A: Api> {
    pub name: String,
    pub managed_type: Type,
    pub reconciler: Option<Arc<dyn Reconciler<A>>>,
    pub watches: Vec<(Type, Mapper)>,
    pub initializer: Option<Arc<dyn Initializer<A>>>,
    pub placement: Placement,
    pub backoff: Backoff,
    /// Reconciles running at once (never two for the same key).
    pub concurrency: usize,
    /// The finalizers it adds and releases (reported, so "what holds this?" is answered by
    /// finalizer name, not by type).
    pub finalizers: Vec<String>,
    /// Every this long, every cached managed resource is queued again, changed or not.
    pub resync: Option<Duration>,
}

impl<A: Api> Clone for Controller<A> {
    fn clone(&self) -> Self {
        Controller {
            name: self.name.clone(),
            managed_type: self.managed_type.clone(),
            reconciler: self.reconciler.clone(),
            watches: self.watches.clone(),
            initializer: self.initializer.clone(),
            placement: self.placement,
            backoff: self.backoff,
            concurrency: self.concurrency,
            finalizers: self.finalizers.clone(),
            resync: self.resync,
        }
    }
}

impl<A: Api> fmt::Debug for Controller<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("managed_type", &gvk(&self.managed_type))
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

/// A controller definition that cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DefinitionError {
    #[error("controller {0:?} has no reconciler")]
    NoReconciler(String),
    #[error("controller {name:?} watches {gvk} twice")]
    DuplicateWatch { name: String, gvk: String },
    #[error("controller {name:?} watches its own managed type {gvk}")]
    WatchesManagedType { name: String, gvk: String },
    #[error("controller {name:?} resyncs every {every:?}; at least a second, please")]
    ResyncTooOften { name: String, every: Duration },
}

impl<A: Api> Controller<A> {
    pub fn new(name: impl Into<String>, managed_type: Type) -> Self {
        Controller {
            name: name.into(),
            managed_type,
            reconciler: None,
            watches: Vec::new(),
            initializer: None,
            placement: Placement::Singleton,
            backoff: Backoff::default(),
            concurrency: 4,
            finalizers: Vec::new(),
            resync: None,
        }
    }

    /// Declares a finalizer this controller adds and releases.
    pub fn with_finalizer(mut self, finalizer: impl Into<String>) -> Self {
        self.finalizers.push(finalizer.into());
        self
    }

    pub fn with_reconciler(mut self, reconciler: impl Reconciler<A>) -> Self {
        self.reconciler = Some(Arc::new(reconciler));
        self
    }

    pub fn with_watch(mut self, watched_type: Type, mapper: Mapper) -> Self {
        self.watches.push((watched_type, mapper));
        self
    }

    pub fn with_initializer(mut self, initializer: impl Initializer<A>) -> Self {
        self.initializer = Some(Arc::new(initializer));
        self
    }

    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff { base, max };
        self
    }

    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Queues every managed resource again every `every` (level-triggered safety net for
    /// reconcilers that act on the world outside the cluster).
    pub fn with_resync(mut self, every: Duration) -> Self {
        self.resync = Some(every);
        self
    }

    /// Checks the definition: a reconciler, each watched type once (and not the managed
    /// type), a resync of a second or more.
    pub fn validate(&self) -> Result<(), DefinitionError> {
        if self.reconciler.is_none() {
            return Err(DefinitionError::NoReconciler(self.name.clone()));
        }
        if let Some(every) = self.resync
            && every < Duration::from_secs(1)
        {
            return Err(DefinitionError::ResyncTooOften {
                name: self.name.clone(),
                every,
            });
        }
        let unversioned = |t: &Type| (t.group.clone(), t.kind.clone());
        let mut seen = BTreeSet::new();
        for (watched, _) in &self.watches {
            if unversioned(watched) == unversioned(&self.managed_type) {
                return Err(DefinitionError::WatchesManagedType {
                    name: self.name.clone(),
                    gvk: gvk(watched),
                });
            }
            if !seen.insert(unversioned(watched)) {
                return Err(DefinitionError::DuplicateWatch {
                    name: self.name.clone(),
                    gvk: gvk(watched),
                });
            }
        }
        Ok(())
    }
}

/// A resource's place in the cache: its type without the version (stored objects are keyed
/// without one, DESIGN §2), tenancy and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    group: String,
    kind: String,
    partition: String,
    namespace: String,
    name: String,
}

impl CacheKey {
    fn of(id: &Id) -> CacheKey {
        let resource_type = id.r#type.clone().unwrap_or_default();
        let tenancy = id.tenancy.clone().unwrap_or_default();
        CacheKey {
            group: resource_type.group,
            kind: resource_type.kind,
            partition: tenancy.partition,
            namespace: tenancy.namespace,
            name: id.name.clone(),
        }
    }
}

/// The managed and watched resources of a running controller, as its watches last reported
/// them: primed from the watch snapshots before the first reconcile, then kept current by events.
/// Reads return copies.
#[derive(Debug, Default)]
pub struct Cache {
    resources: std::sync::RwLock<HashMap<CacheKey, Resource>>,
}

impl Cache {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<CacheKey, Resource>> {
        self.resources.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<CacheKey, Resource>> {
        self.resources.read().unwrap_or_else(|p| p.into_inner())
    }

    fn upsert(&self, resource: &Resource) {
        if let Some(id) = &resource.id {
            self.write().insert(CacheKey::of(id), resource.clone());
        }
    }

    fn remove(&self, resource: &Resource) {
        if let Some(id) = &resource.id {
            self.write().remove(&CacheKey::of(id));
        }
    }

    /// The cached resource with this id's type (any version), tenancy and name.
    pub fn get(&self, id: &Id) -> Option<Resource> {
        self.read().get(&CacheKey::of(id)).cloned()
    }

    /// Every cached resource of a type (group and kind; any version).
    pub fn list(&self, resource_type: &Type) -> Vec<Resource> {
        self.read()
            .iter()
            .filter(|(key, _)| key.group == resource_type.group && key.kind == resource_type.kind)
            .map(|(_, resource)| resource.clone())
            .collect()
    }

    /// Cached resources owned by `owner` (matched by uid).
    pub fn owned_by(&self, owner: &Id) -> Vec<Resource> {
        self.read()
            .values()
            .filter(|r| {
                r.owner
                    .as_ref()
                    .is_some_and(|o| o.uid == owner.uid && !o.uid.is_empty())
            })
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Who may reconcile now: a singleton's replica only while it holds its lease. A worker that
/// finds it does not puts the key back for `recheck`.
#[derive(Debug, Clone)]
pub struct Gate {
    pub leadership: Arc<Leadership>,
    pub recheck: Duration,
}

/// What a reconciler acts through: the [`Api`] (as the controller's identity), the running
/// controller's cache, and whether this replica may act.
pub struct Context<A> {
    api: A,
    cache: Arc<Cache>,
    gate: Option<Gate>,
}

impl<A: Api> Context<A> {
    /// A context outside a running controller (tests, tools): an empty cache, no gate.
    pub fn new(api: A) -> Self {
        Context {
            api,
            cache: Arc::new(Cache::default()),
            gate: None,
        }
    }

    /// The client the controller acts through.
    pub fn api(&self) -> &A {
        &self.api
    }

    /// The running controller's cache of its managed and watched resources.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Whether this replica may act now (a singleton's replica: only while it holds the lease;
    /// always in the server, whose manager stops a singleton on a node that stops leading).
    /// Checked before each reconcile; a reconciler that writes after a long wait checks again.
    pub fn leads(&self) -> bool {
        self.gate.as_ref().is_none_or(|g| g.leadership.holds())
    }

    /// Reads a resource (a copy); `None` when it does not exist.
    pub async fn read(&self, id: &Id) -> Result<Option<Resource>, ReconcileError> {
        Ok(self.api.read(id).await?)
    }

    pub async fn write(&self, resource: Resource) -> Result<Resource, ReconcileError> {
        Ok(self.api.write(resource).await?)
    }

    /// Deletes whatever is stored under `id`.
    pub async fn delete(&self, id: &Id) -> Result<(), ReconcileError> {
        Ok(self.api.delete(id, "").await?)
    }

    pub async fn list(
        &self,
        resource_type: &Type,
        tenancy: &Tenancy,
    ) -> Result<Vec<Resource>, ReconcileError> {
        Ok(self.api.list(resource_type, tenancy).await?)
    }

    pub async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ReconcileError> {
        Ok(self.api.list_by_owner(owner).await?)
    }

    /// Writes the status under `key` unless the stored one is the same (its observed
    /// generation and conditions; `updated_at` aside), so status writes do not cause reconcile
    /// loops. Whether it wrote.
    pub async fn write_status_if_changed(
        &self,
        resource: &Resource,
        key: &str,
        status: Status,
    ) -> Result<bool, ReconcileError> {
        if resource
            .status
            .get(key)
            .is_some_and(|stored| proto::meta::equal_status(stored, &status))
        {
            return Ok(false);
        }
        let id = resource.id.clone().unwrap_or_default();
        self.api.write_status(&id, "", key, status).await?;
        Ok(true)
    }
}

/// What a running controller counts, for `ListControllers` and a replica's report.
#[derive(Debug, Default)]
pub struct Stats {
    running: AtomicBool,
    queue_depth: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    /// The last error, and when the last reconcile ended.
    last: Mutex<(Option<String>, Option<SystemTime>)>,
}

impl Stats {
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    pub fn queue_depth(&self) -> u64 {
        self.queue_depth.load(Ordering::Relaxed)
    }

    pub fn reconciles_ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    pub fn reconciles_failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub fn last_error(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    pub fn last_reconcile(&self) -> Option<SystemTime> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    /// Records a reconcile that ended now, with its error if it failed.
    pub fn reconciled(&self, error: Option<&str>) {
        match error {
            None => self.ok.fetch_add(1, Ordering::Relaxed),
            Some(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(error) = error {
            last.0 = Some(error.to_owned());
        }
        last.1 = Some(SystemTime::now());
    }

    fn set_queue_depth(&self, depth: usize) {
        self.queue_depth
            .store(u64::try_from(depth).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// Key of the work queue: the managed resource without its uid and version (a recreated
/// resource is the same work).
fn queue_key(id: &Id) -> Request {
    let mut id = id.clone();
    id.uid.clear();
    Request { id }
}

/// Runs one controller over `api` until `shutdown` is cancelled, reconciling only while `gate`
/// (if any) says this replica leads. A watch that ends starts the controller over from its
/// initial state, after a pause that grows while it keeps ending before it is primed.
pub async fn run<A: Api>(
    controller: Arc<Controller<A>>,
    api: A,
    stats: Arc<Stats>,
    gate: Option<Gate>,
    shutdown: CancellationToken,
) {
    if let Err(error) = controller.validate() {
        tracing::error!(%error, "controller definition is invalid; not running it");
        return;
    }
    stats.running.store(true, Ordering::Relaxed);
    let mut restart_pause = controller.backoff.base;
    // A wait for the server (catching up, no leader yet) is said once, at info: it is expected
    // and ends by itself. A failure is a warning, said again only when the reason changes.
    let mut said: Option<(String, bool)> = None;
    loop {
        let Stopped {
            reason,
            waiting,
            primed,
        } = run_once(&controller, &api, &stats, gate.as_ref(), &shutdown).await;
        if shutdown.is_cancelled() {
            break;
        }
        if primed {
            restart_pause = controller.backoff.base;
        }
        let repeated = said
            .as_ref()
            .is_some_and(|(said, was_waiting)| *said == reason && *was_waiting == waiting);
        if repeated {
            tracing::debug!(controller = controller.name, %reason, retry_in = ?restart_pause, "controller still cannot run");
        } else if waiting {
            tracing::info!(controller = controller.name, %reason, "controller waiting for the server");
        } else {
            tracing::warn!(controller = controller.name, %reason, retry_in = ?restart_pause, "controller starting over");
        }
        said = Some((reason, waiting));
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(restart_pause) => {}
        }
        restart_pause = (restart_pause * 2).min(controller.backoff.max);
    }
    stats.running.store(false, Ordering::Relaxed);
}

/// Why one life of a controller ended.
struct Stopped {
    reason: String,
    /// The server could not serve the controller yet: a wait, not a failure.
    waiting: bool,
    /// The life got as far as reconciling (its watches were primed).
    primed: bool,
}

impl Stopped {
    fn early(reason: impl Into<String>) -> Self {
        Stopped {
            reason: reason.into(),
            waiting: false,
            primed: false,
        }
    }

    /// A watch the controller needs could not be opened or primed.
    fn watch_refused(watched: &Type, error: &ApiError) -> Self {
        Stopped {
            reason: format!("cannot watch {}: {error}", gvk(watched)),
            waiting: matches!(error, ApiError::Unavailable(_)),
            primed: false,
        }
    }
}

/// How a watch feeding the queue ended.
enum Ended {
    Stopped,
    Closed,
    Failed(ApiError),
}

/// One life of a controller: initialize, watch, prime, reconcile. Returns why it stopped.
async fn run_once<A: Api>(
    controller: &Arc<Controller<A>>,
    api: &A,
    stats: &Arc<Stats>,
    gate: Option<&Gate>,
    shutdown: &CancellationToken,
) -> Stopped {
    let Some(reconciler) = controller.reconciler.clone() else {
        return Stopped::early("no reconciler");
    };
    let context = Arc::new(Context {
        api: api.clone(),
        cache: Arc::new(Cache::default()),
        gate: gate.cloned(),
    });
    if let Some(initializer) = &controller.initializer {
        let mut failures = 0;
        loop {
            let attempt = AssertUnwindSafe(initializer.initialize(&context))
                .catch_unwind()
                .await;
            match attempt {
                Ok(Ok(())) => break,
                Ok(Err(error)) => {
                    tracing::warn!(controller = controller.name, %error, "initializer failed")
                }
                Err(_) => tracing::error!(controller = controller.name, "initializer panicked"),
            }
            failures += 1;
            tokio::select! {
                () = shutdown.cancelled() => return Stopped::early("shutting down"),
                () = tokio::time::sleep(controller.backoff.delay(failures)) => {}
            }
        }
    }

    let queue = Arc::new(WorkQueue::<Request>::new(controller.backoff));
    let life = shutdown.child_token();
    let all_primed = CancellationToken::new();
    let (primed, mut primed_count) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut watches = tokio::task::JoinSet::new();
    let mut sources: Vec<(Type, Option<Mapper>)> = vec![(controller.managed_type.clone(), None)];
    sources.extend(
        controller
            .watches
            .iter()
            .map(|(t, m)| (t.clone(), Some(m.clone()))),
    );
    for (watched_type, mapper) in sources {
        let request = WatchListRequest {
            r#type: Some(watched_type.clone()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: String::new(),
            since_version: String::new(),
        };
        let stream = match api.watch(request).await {
            Ok(stream) => stream,
            Err(error) => return Stopped::watch_refused(&watched_type, &error),
        };
        let feed = Feed {
            watched: watched_type,
            mapper,
            queue: queue.clone(),
            cache: context.cache.clone(),
            primed: primed.clone(),
            all_primed: all_primed.clone(),
            life: life.clone(),
        };
        watches.spawn(feed_queue(feed, stream));
    }
    drop(primed);
    // Prime the cache from every watch's snapshot before anything is mapped or reconciled:
    // events that arrive meanwhile are cached and queued, but no worker runs yet.
    let sources = 1 + controller.watches.len();
    for _ in 0..sources {
        let signal = tokio::select! {
            () = shutdown.cancelled() => None,
            signal = primed_count.recv() => Some(signal),
        };
        if signal.flatten().is_none() {
            life.cancel();
            let mut stopped = Stopped::early("shutting down");
            while let Some(ended) = watches.join_next().await {
                if let Ok((watched, Ended::Failed(error))) = ended
                    && !shutdown.is_cancelled()
                {
                    stopped = Stopped::watch_refused(&watched, &error);
                }
            }
            if !shutdown.is_cancelled() && stopped.reason == "shutting down" {
                stopped = Stopped::early("a watch ended before its snapshot was complete");
            }
            return stopped;
        }
    }

    all_primed.cancel();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..controller.concurrency {
        workers.spawn(work(
            queue.clone(),
            reconciler.clone(),
            context.clone(),
            stats.clone(),
            controller.name.clone(),
        ));
    }
    if let Some(every) = controller.resync {
        let (queue, cache, managed, life) = (
            queue.clone(),
            context.cache.clone(),
            controller.managed_type.clone(),
            life.clone(),
        );
        workers.spawn(async move {
            loop {
                tokio::select! {
                    () = life.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                for resource in cache.list(&managed) {
                    if let Some(id) = &resource.id {
                        queue.add(queue_key(id));
                    }
                }
            }
        });
    }

    // The controller lives until a watch ends or the node shuts down.
    let stopped = tokio::select! {
        () = shutdown.cancelled() => Stopped::early("shutting down"),
        finished = watches.join_next() => match finished {
            Some(Ok((watched, Ended::Failed(error)))) => Stopped::watch_refused(&watched, &error),
            Some(Ok((watched, _))) => Stopped::early(format!("the watch of {} ended", gvk(&watched))),
            Some(Err(error)) => Stopped::early(format!("a watch task failed: {error}")),
            None => Stopped::early("no watches"),
        },
    };
    life.cancel();
    queue.shutdown();
    while watches.join_next().await.is_some() {}
    while workers.join_next().await.is_some() {}
    Stopped {
        primed: true,
        ..stopped
    }
}

/// One worker: takes keys off the queue and reconciles them (while the gate allows) until the
/// queue shuts down.
async fn work<A: Api>(
    queue: Arc<WorkQueue<Request>>,
    reconciler: Arc<dyn Reconciler<A>>,
    context: Arc<Context<A>>,
    stats: Arc<Stats>,
    name: String,
) {
    while let Some(request) = queue.next().await {
        if let Some(gate) = &context.gate
            && !gate.leadership.holds()
        {
            // Waiting for the lease: look again once it may have changed hands.
            queue.done(&request);
            queue.add_after(request, gate.recheck);
            continue;
        }
        let outcome = AssertUnwindSafe(reconciler.reconcile(&context, request.clone()))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(ReconcileError("the reconciler panicked".into())));
        stats.reconciled(outcome.as_ref().err().map(|e| e.0.as_str()));
        queue.done(&request);
        match outcome {
            Ok(Action::AwaitChange) => queue.forget(&request),
            Ok(Action::Requeue(after)) => {
                queue.forget(&request);
                queue.add_after(request, after);
            }
            Err(error) => {
                let delay = queue.add_with_backoff(request.clone());
                tracing::warn!(controller = name, id = %DisplayId(&request.id), %error, retry_in = ?delay, "reconcile failed");
            }
        }
        stats.set_queue_depth(queue.len());
    }
}

/// An id as `group.version.Kind partition/namespace/name`, for logs.
struct DisplayId<'a>(&'a Id);

impl fmt::Display for DisplayId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenancy = self.0.tenancy.clone().unwrap_or_default();
        let resource_type = self.0.r#type.clone().unwrap_or_default();
        write!(
            f,
            "{} {}/{}/{}",
            gvk(&resource_type),
            tenancy.partition,
            tenancy.namespace,
            self.0.name
        )
    }
}

/// Turns a watch stream into cache updates and, once every watch of the controller is primed
/// (`all_primed`), into queue adds: until then it only caches (and keeps what was deleted), so
/// no mapper ever runs against a half-filled cache (Consul's #20421); then it maps everything
/// it has seen at once, and each event as it comes. Returns the watched type and how it ended.
struct Feed {
    watched: Type,
    mapper: Option<Mapper>,
    queue: Arc<WorkQueue<Request>>,
    cache: Arc<Cache>,
    /// Told once this watch's snapshot is complete.
    primed: tokio::sync::mpsc::UnboundedSender<()>,
    /// Cancelled once every watch of the controller is primed.
    all_primed: CancellationToken,
    life: CancellationToken,
}

async fn feed_queue(feed: Feed, mut stream: EventStream) -> (Type, Ended) {
    let Feed {
        watched,
        mapper,
        queue,
        cache,
        primed,
        all_primed,
        life,
    } = feed;
    let map = |resource: &Resource| -> Vec<Request> {
        match &mapper {
            None => resource
                .id
                .as_ref()
                .map(|id| vec![queue_key(id)])
                .unwrap_or_default(),
            Some(mapper) => mapper(resource).iter().map(|r| queue_key(&r.id)).collect(),
        }
    };
    // Deleted before every watch was primed: mapped with the rest once it is.
    let mut deleted_while_priming: Option<Vec<Resource>> = Some(Vec::new());
    let ended = loop {
        let event = tokio::select! {
            biased;
            () = life.cancelled() => break Ended::Stopped,
            () = all_primed.cancelled(), if deleted_while_priming.is_some() => {
                let deleted = deleted_while_priming.take().unwrap_or_default();
                for resource in cache.list(&watched).iter().chain(&deleted) {
                    for request in map(resource) {
                        queue.add(request);
                    }
                }
                continue;
            }
            event = stream.next() => event,
        };
        let resource = match event {
            None => break Ended::Closed,
            Some(Err(error)) => break Ended::Failed(error),
            Some(Ok(event)) => match event.event {
                Some(watch_event::Event::Upsert(upsert)) => {
                    if let Some(resource) = &upsert.resource {
                        cache.upsert(resource);
                    }
                    upsert.resource
                }
                Some(watch_event::Event::Delete(delete)) => {
                    if let Some(resource) = &delete.resource {
                        cache.remove(resource);
                        if let Some(deleted) = &mut deleted_while_priming {
                            deleted.push(resource.clone());
                        }
                    }
                    delete.resource
                }
                Some(watch_event::Event::EndOfSnapshot(_)) => {
                    let _ = primed.send(());
                    None
                }
                None => None,
            },
        };
        if deleted_while_priming.is_some() {
            continue;
        }
        if let Some(resource) = resource {
            for request in map(&resource) {
                queue.add(request);
            }
        }
    };
    (watched, ended)
}

#[cfg(test)]
mod tests;
