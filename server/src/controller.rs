//! The controller runtime: reconcile loops that react to resource changes.
//!
//! A [`Controller`] names a managed type, a [`Reconciler`], the other types it watches (each with
//! a [`Mapper`] from a changed resource to the managed resources to reconcile), an optional
//! [`Initializer`], a [`Placement`] and a [`Backoff`]. [`run`] drives one controller: it runs the
//! initializer (retrying with backoff until it succeeds), opens WatchList streams for the managed
//! and watched types, reconciles every existing managed resource once, then follows events. A
//! reconciler answers with an [`Action`]; an error or a panic is retried with per-key backoff.
//! Controllers act through the resource service with the privileged identity ([`Runtime`]).
//!
//! - [`builtin`]: the reaper, the namespace controller and the demo controllers;
//! - [`manager`]: runs a node's controllers with their placement;
//! - [`queue`]: the work queue (dedup, coalescing, delays, backoff).

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt};
use proto::resource::v1::{Id, Resource, Tenancy, Type, WatchListRequest, watch_event};
use tokio_util::sync::CancellationToken;

use crate::acl::{AllowAll, Authorizer, ControllerIdentity};
use crate::resource::{self, DisplayId};
use crate::service::{self, ResourceService};

pub mod builtin;
pub mod manager;
/// The work queue (shared with controller programs outside the server: the `runtime` crate).
pub use runtime::queue;

#[cfg(test)]
mod tests;

pub use queue::Backoff;

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

impl From<service::Error> for ReconcileError {
    fn from(error: service::Error) -> Self {
        ReconcileError(error.to_string())
    }
}

/// Brings the world in line with one managed resource.
#[async_trait]
pub trait Reconciler: Send + Sync + 'static {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError>;
}

/// Runs once before a controller reconciles anything; retried with backoff until it succeeds.
#[async_trait]
pub trait Initializer: Send + Sync + 'static {
    async fn initialize(&self, runtime: &Runtime) -> Result<(), ReconcileError>;
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

/// Where a controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// On the raft leader only.
    Singleton,
    /// On every server.
    EachServer,
}

/// A controller definition. Build with [`Controller::new`] and the `with_*` methods.
#[derive(Clone)]
pub struct Controller {
    pub name: String,
    pub managed_type: Type,
    pub reconciler: Option<Arc<dyn Reconciler>>,
    pub watches: Vec<(Type, Mapper)>,
    pub initializer: Option<Arc<dyn Initializer>>,
    pub placement: Placement,
    pub backoff: Backoff,
    /// Reconciles running at once (never two for the same key).
    pub concurrency: usize,
    /// The finalizers it adds and releases (reported, so "what holds this?" is answered by
    /// finalizer name, not by type).
    pub finalizers: Vec<String>,
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("managed_type", &resource::gvk(&self.managed_type))
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
}

impl Controller {
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
        }
    }

    /// Declares a finalizer this controller adds and releases.
    pub fn with_finalizer(mut self, finalizer: impl Into<String>) -> Self {
        self.finalizers.push(finalizer.into());
        self
    }

    pub fn with_reconciler(mut self, reconciler: impl Reconciler) -> Self {
        self.reconciler = Some(Arc::new(reconciler));
        self
    }

    pub fn with_watch(mut self, watched_type: Type, mapper: Mapper) -> Self {
        self.watches.push((watched_type, mapper));
        self
    }

    pub fn with_initializer(mut self, initializer: impl Initializer) -> Self {
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

    /// Checks the definition: a reconciler, and each watched type once (and not the managed type).
    pub fn validate(&self) -> Result<(), DefinitionError> {
        if self.reconciler.is_none() {
            return Err(DefinitionError::NoReconciler(self.name.clone()));
        }
        let unversioned = |t: &Type| (t.group.clone(), t.kind.clone());
        let mut seen = std::collections::BTreeSet::new();
        for (watched, _) in &self.watches {
            if unversioned(watched) == unversioned(&self.managed_type) {
                return Err(DefinitionError::WatchesManagedType {
                    name: self.name.clone(),
                    gvk: resource::gvk(watched),
                });
            }
            if !seen.insert(unversioned(watched)) {
                return Err(DefinitionError::DuplicateWatch {
                    name: self.name.clone(),
                    gvk: resource::gvk(watched),
                });
            }
        }
        Ok(())
    }
}

/// The managed and watched resources of a running controller, as its watches last reported
/// them: primed from the watch snapshots before the first reconcile, then kept current by events.
/// Reads return copies.
#[derive(Debug, Default)]
pub struct Cache {
    resources: std::sync::RwLock<std::collections::HashMap<crate::storage::StorageKey, Resource>>,
}

impl Cache {
    fn write(
        &self,
    ) -> std::sync::RwLockWriteGuard<
        '_,
        std::collections::HashMap<crate::storage::StorageKey, Resource>,
    > {
        self.resources.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(
        &self,
    ) -> std::sync::RwLockReadGuard<
        '_,
        std::collections::HashMap<crate::storage::StorageKey, Resource>,
    > {
        self.resources.read().unwrap_or_else(|p| p.into_inner())
    }

    fn upsert(&self, resource: &Resource) {
        if let Some(id) = &resource.id {
            self.write()
                .insert(crate::storage::StorageKey::of(id), resource.clone());
        }
    }

    fn remove(&self, resource: &Resource) {
        if let Some(id) = &resource.id {
            self.write().remove(&crate::storage::StorageKey::of(id));
        }
    }

    /// The cached resource with this id's type (any version), tenancy and name.
    pub fn get(&self, id: &Id) -> Option<Resource> {
        self.read()
            .get(&crate::storage::StorageKey::of(id))
            .cloned()
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

/// What reconcilers act through: the resource service, as the controller's own identity
/// (`controller/<name>`: allowed everything, presentable by no client), and the running
/// controller's cache.
#[derive(Clone, Debug)]
pub struct Runtime {
    pub service: Arc<ResourceService>,
    cache: Arc<Cache>,
    identity: Arc<dyn Authorizer>,
}

impl Runtime {
    pub fn new(service: Arc<ResourceService>) -> Self {
        Runtime {
            service,
            cache: Arc::new(Cache::default()),
            identity: Arc::new(AllowAll),
        }
    }

    /// The runtime of one life of controller `name`: its identity and a fresh cache.
    fn for_controller(&self, name: &str) -> Runtime {
        Runtime {
            service: self.service.clone(),
            cache: Arc::new(Cache::default()),
            identity: Arc::new(ControllerIdentity::new(name)),
        }
    }

    /// The running controller's cache of its managed and watched resources.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Reads a resource (a copy); `None` when it does not exist.
    pub async fn read(&self, id: &Id) -> Result<Option<Resource>, ReconcileError> {
        let request = proto::resource::v1::ReadRequest {
            id: Some(id.clone()),
        };
        match self
            .service
            .read(
                self.identity.as_ref(),
                crate::storage::Consistency::Eventual,
                request,
            )
            .await
        {
            Ok(response) => Ok(response.resource),
            Err(service::Error::NotFound(_)) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    pub async fn write(&self, resource: Resource) -> Result<Resource, ReconcileError> {
        let request = proto::resource::v1::WriteRequest {
            resource: Some(resource),
        };
        let response = self.service.write(self.identity.as_ref(), request).await?;
        response
            .resource
            .ok_or_else(|| ReconcileError("write returned no resource".into()))
    }

    pub async fn delete(&self, id: &Id) -> Result<(), ReconcileError> {
        let request = proto::resource::v1::DeleteRequest {
            id: Some(id.clone()),
            version: String::new(),
        };
        self.service.delete(self.identity.as_ref(), request).await?;
        Ok(())
    }

    pub async fn list_by_owner(&self, owner: &Id) -> Result<Vec<Resource>, ReconcileError> {
        let request = proto::resource::v1::ListByOwnerRequest {
            owner: Some(owner.clone()),
        };
        Ok(self
            .service
            .list_by_owner(self.identity.as_ref(), request)
            .await?
            .resources)
    }

    /// Writes the status under `key` unless the stored one is the same (ignoring `updated_at`),
    /// so status writes do not cause reconcile loops.
    pub async fn write_status_if_changed(
        &self,
        resource: &Resource,
        key: &str,
        status: proto::resource::v1::Status,
    ) -> Result<bool, ReconcileError> {
        if resource
            .status
            .get(key)
            .is_some_and(|stored| resource::equal_status(stored, &status))
        {
            return Ok(false);
        }
        let request = proto::resource::v1::WriteStatusRequest {
            id: resource.id.clone(),
            version: String::new(),
            key: key.to_owned(),
            status: Some(status),
        };
        self.service
            .write_status(self.identity.as_ref(), request)
            .await?;
        Ok(true)
    }
}

/// Counters a running controller keeps, for `ListControllers`.
#[derive(Debug, Default)]
pub struct ControllerStats {
    pub running: AtomicBool,
    pub reconciles_ok: AtomicU64,
    pub reconciles_failed: AtomicU64,
    pub queue_depth: AtomicU64,
    last_error: Mutex<Option<String>>,
    last_reconcile: Mutex<Option<SystemTime>>,
}

impl ControllerStats {
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn last_reconcile(&self) -> Option<SystemTime> {
        *self
            .last_reconcile
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, outcome: &Result<Action, ReconcileError>) {
        match outcome {
            Ok(_) => {
                self.reconciles_ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                self.reconciles_failed.fetch_add(1, Ordering::Relaxed);
                *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(error.0.clone());
            }
        }
        *self
            .last_reconcile
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(SystemTime::now());
    }
}

/// Key of the work queue: the managed resource without its uid and version (a recreated
/// resource is the same work).
fn queue_key(id: &Id) -> Request {
    let mut id = id.clone();
    id.uid.clear();
    Request { id }
}

/// Runs one controller until `shutdown` is cancelled. A watch that ends (a snapshot restore, a
/// watcher that fell behind) restarts the controller from its initial state.
pub async fn run(
    controller: Arc<Controller>,
    runtime: Runtime,
    stats: Arc<ControllerStats>,
    shutdown: CancellationToken,
) {
    if let Err(error) = controller.validate() {
        tracing::error!(%error, "controller definition is invalid; not running it");
        return;
    }
    stats.running.store(true, Ordering::Relaxed);
    let mut restart_pause = controller.backoff.base;
    // A wait for the node (catching up after an unclean stop, no leader yet) is said once, at
    // info: it is expected and ends by itself. Failures are warnings, each time.
    let mut said_waiting = false;
    loop {
        let Stopped { reason, waiting } = run_once(&controller, &runtime, &stats, &shutdown).await;
        if shutdown.is_cancelled() {
            break;
        }
        if !waiting {
            said_waiting = false;
            tracing::warn!(controller = controller.name, %reason, "controller restarting");
        } else if !said_waiting {
            said_waiting = true;
            tracing::info!(controller = controller.name, %reason, "controller waiting for this node");
        } else {
            tracing::debug!(controller = controller.name, %reason, "controller still waiting");
        }
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
    /// The node could not serve the controller yet (`Unavailable`): a wait, not a failure.
    waiting: bool,
}

impl Stopped {
    /// A watch the controller needs could not be opened: a wait while the node cannot serve it
    /// yet (`Unavailable`: catching up, no leader), a failure otherwise.
    fn watch_refused(watched: &Type, error: &service::Error) -> Self {
        Stopped {
            reason: format!("cannot watch {}: {error}", resource::gvk(watched)),
            waiting: matches!(error, service::Error::Unavailable(_)),
        }
    }
}

impl From<String> for Stopped {
    fn from(reason: String) -> Self {
        Stopped {
            reason,
            waiting: false,
        }
    }
}

impl From<&str> for Stopped {
    fn from(reason: &str) -> Self {
        Stopped::from(reason.to_owned())
    }
}

/// One life of a controller: initialize, watch, reconcile. Returns why it stopped.
async fn run_once(
    controller: &Arc<Controller>,
    runtime: &Runtime,
    stats: &Arc<ControllerStats>,
    shutdown: &CancellationToken,
) -> Stopped {
    let Some(reconciler) = controller.reconciler.clone() else {
        return "no reconciler".into();
    };
    let runtime = &runtime.for_controller(&controller.name);
    if let Some(initializer) = &controller.initializer {
        let mut failures = 0;
        loop {
            let attempt = AssertUnwindSafe(initializer.initialize(runtime))
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
                () = shutdown.cancelled() => return "shutting down".into(),
                () = tokio::time::sleep(controller.backoff.delay(failures)) => {}
            }
        }
    }

    let queue = Arc::new(queue::WorkQueue::<Request>::new(controller.backoff));
    let life = shutdown.child_token();
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
                partition: resource::WILDCARD.into(),
                namespace: resource::WILDCARD.into(),
            }),
            name_prefix: String::new(),
            since_version: String::new(),
        };
        let stream = match runtime
            .service
            .watch_list(runtime.identity.clone(), request)
            .await
        {
            Ok(stream) => stream,
            Err(error) => return Stopped::watch_refused(&watched_type, &error),
        };
        watches.spawn(feed_queue(
            stream,
            mapper,
            queue.clone(),
            runtime.cache.clone(),
            primed.clone(),
            life.clone(),
        ));
    }
    drop(primed);
    // Prime the cache from every watch's snapshot before the first reconcile.
    let sources = 1 + controller.watches.len();
    for _ in 0..sources {
        tokio::select! {
            () = shutdown.cancelled() => {
                life.cancel();
                while watches.join_next().await.is_some() {}
                return "shutting down".into();
            }
            signal = primed_count.recv() => if signal.is_none() {
                life.cancel();
                while watches.join_next().await.is_some() {}
                return "a watch ended before its snapshot was complete".into();
            },
        }
    }

    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..controller.concurrency {
        let (queue, reconciler, runtime, stats, name) = (
            queue.clone(),
            reconciler.clone(),
            runtime.clone(),
            stats.clone(),
            controller.name.clone(),
        );
        workers.spawn(async move {
            while let Some(request) = queue.next().await {
                let outcome = AssertUnwindSafe(reconciler.reconcile(&runtime, request.clone()))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|_| Err(ReconcileError("the reconciler panicked".into())));
                stats.record(&outcome);
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
                stats.queue_depth.store(queue.len() as u64, Ordering::Relaxed);
            }
        });
    }

    // The controller lives until a watch ends or the node shuts down.
    let reason = tokio::select! {
        () = shutdown.cancelled() => "shutting down".to_owned(),
        finished = watches.join_next() => match finished {
            Some(Ok(reason)) => reason,
            Some(Err(error)) => format!("a watch task failed: {error}"),
            None => "no watches".to_owned(),
        },
    };
    life.cancel();
    queue.shutdown();
    while watches.join_next().await.is_some() {}
    while workers.join_next().await.is_some() {}
    reason.into()
}

/// Turns a watch stream into queue adds until it ends; returns why it ended.
async fn feed_queue(
    mut stream: service::WatchStream,
    mapper: Option<Mapper>,
    queue: Arc<queue::WorkQueue<Request>>,
    cache: Arc<Cache>,
    primed: tokio::sync::mpsc::UnboundedSender<()>,
    life: CancellationToken,
) -> String {
    loop {
        let event = tokio::select! {
            () = life.cancelled() => return "stopped".into(),
            event = stream.next() => event,
        };
        let resource = match event {
            None => return "the watch ended".into(),
            Some(Err(error)) => return format!("the watch failed: {error}"),
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
        let Some(resource) = resource else { continue };
        let requests = match &mapper {
            None => resource
                .id
                .as_ref()
                .map(|id| vec![queue_key(id)])
                .unwrap_or_default(),
            Some(mapper) => mapper(&resource).iter().map(|r| queue_key(&r.id)).collect(),
        };
        for request in requests {
            queue.add(request);
        }
    }
}
