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

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use proto::resource::v1::{Id, Resource, Type};

use crate::api::{Api, ApiError};
use crate::queue::Backoff;

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
    /// A program's replicas split the managed objects between them (DESIGN §16, "Shards"):
    /// each reconciles the objects the server's `coordination.v1.ShardMap` gives it, under a
    /// lease of its own that fences its writes. Programs only.
    Sharded,
}

/// `group.version.Kind` (the codec's form).
pub use proto::codec::gvk;

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

mod cache;
mod context;
mod runner;
mod stats;

#[cfg(test)]
mod tests;

pub use cache::Cache;
pub use context::{Context, Gate};
pub use runner::run;
pub use stats::Stats;
