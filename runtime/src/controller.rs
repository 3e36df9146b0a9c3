//! A controller of a program outside the server (DESIGN §16): it watches its managed type on a
//! cluster, queues what changed ([`crate::queue`]: one run per resource at a time, per-resource
//! backoff), and reconciles — only while it holds its lease when it is a singleton
//! ([`crate::election`]) — while [`crate::report`] shows it in `ListControllers`, `resctl
//! controllers`, the dashboard and the blame of the finalizers it declares.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::client::{Client, ClientError, WatchUpdate};
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Id, Resource, Tenancy, Type, WatchListRequest};
use tokio_util::sync::CancellationToken;

use crate::election::{Config, Elector, Leadership};
use crate::grpc::ClusterStore;
use crate::queue::{Backoff, WorkQueue};
use crate::report::{Identity, Stats};

/// What a reconciler is asked to reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: Id,
}

/// What a reconciler wants next for the resource it reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the resource changes.
    AwaitChange,
    /// Reconcile again after this long, even without a change.
    Requeue(Duration),
}

/// Why a reconcile failed; it is retried with backoff.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ReconcileError(pub String);

impl From<ClientError> for ReconcileError {
    fn from(error: ClientError) -> Self {
        ReconcileError(error.to_string())
    }
}

/// What a reconciler acts through.
pub struct Context {
    pub client: Client,
    leadership: Option<Arc<Leadership>>,
}

impl Context {
    /// Whether this replica may act now (a singleton's replica: only while it holds the lease).
    /// Checked before each reconcile; a reconciler that writes after a long wait checks again.
    pub fn leads(&self) -> bool {
        self.leadership.as_ref().is_none_or(|l| l.holds())
    }
}

/// Brings the world in line with one managed resource.
#[async_trait::async_trait]
pub trait Reconciler: Send + Sync + 'static {
    async fn reconcile(
        &self,
        context: &Context,
        request: Request,
    ) -> Result<Action, ReconcileError>;
}

/// Where the replicas of a controller reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// One replica at a time: the holder of the Lease named after the controller.
    Singleton,
    /// Every replica.
    EachReplica,
}

/// A controller, built then run.
#[derive(Debug, Clone)]
pub struct Controller {
    pub name: String,
    pub managed_type: Type,
    pub finalizers: Vec<String>,
    pub placement: Placement,
    /// Where its Lease and reports live.
    pub partition: String,
    pub namespace: String,
    /// This replica (as a Lease's holder names it) and its host.
    pub identity: String,
    pub host: String,
    pub backoff: Backoff,
    pub report_every: Duration,
    /// The lease timings (client-go's defaults unless set).
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Controller {
    /// A singleton controller of `managed_type` named `name`, its lease in `default/default`.
    pub fn new(name: &str, managed_type: Type, identity: &str) -> Controller {
        Controller {
            name: name.into(),
            managed_type,
            finalizers: Vec::new(),
            placement: Placement::Singleton,
            partition: "default".into(),
            namespace: "default".into(),
            identity: identity.into(),
            host: std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into()),
            backoff: Backoff::default(),
            report_every: Duration::from_secs(5),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Declares a finalizer this controller adds and releases (what "why stuck" blames it for).
    pub fn with_finalizer(mut self, finalizer: &str) -> Controller {
        self.finalizers.push(finalizer.into());
        self
    }

    /// Runs on `client` until `shutdown`: the election (a singleton), the report, the watch of
    /// the managed type and the reconciles. Bad timings are refused before anything starts.
    pub async fn run(
        self,
        client: Client,
        reconciler: impl Reconciler,
        shutdown: CancellationToken,
    ) -> Result<(), String> {
        let leadership = match self.placement {
            Placement::EachReplica => None,
            Placement::Singleton => {
                let mut config = Config::new(&self.namespace, &self.name, &self.identity);
                config.partition = self.partition.clone();
                config.duration = self.lease_duration;
                config.renew_deadline = self.renew_deadline;
                config.retry_period = self.retry_period;
                let elector = Elector::new(config, ClusterStore(client.clone()))?;
                let leadership = elector.leadership();
                tokio::spawn(elector.run(shutdown.clone()));
                Some(leadership)
            }
        };
        let stats = Arc::new(Stats::default());
        let reporting = tokio::spawn(crate::report::run(
            ClusterStore(client.clone()),
            Identity {
                controller: self.name.clone(),
                identity: self.identity.clone(),
                host: self.host.clone(),
                partition: self.partition.clone(),
                namespace: self.namespace.clone(),
                lease: (self.placement == Placement::Singleton).then(|| self.name.clone()),
                managed_type: self.managed_type.clone(),
                watched_types: Vec::new(),
                finalizers: self.finalizers.clone(),
                every: self.report_every,
            },
            stats.clone(),
            leadership.clone(),
            shutdown.clone(),
        ));
        let queue = Arc::new(WorkQueue::<String>::new(self.backoff));
        let ids: Arc<Mutex<HashMap<String, Id>>> = Arc::default();
        let watching = tokio::spawn(watch(
            client.clone(),
            self.managed_type.clone(),
            queue.clone(),
            ids.clone(),
            shutdown.clone(),
        ));
        let context = Context {
            client,
            leadership: leadership.clone(),
        };
        loop {
            let key = tokio::select! {
                () = shutdown.cancelled() => break,
                key = queue.next() => match key { Some(key) => key, None => break },
            };
            stats.set_queue_depth(queue.len() as u64);
            let id = ids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .cloned();
            let Some(id) = id else {
                queue.done(&key);
                continue;
            };
            if !context.leads() {
                // Waiting for the lease: look again once it may have changed hands.
                queue.done(&key);
                queue.add_after(key, self.retry_period);
                continue;
            }
            let result = reconciler.reconcile(&context, Request { id }).await;
            queue.done(&key);
            match result {
                Ok(Action::AwaitChange) => {
                    stats.reconciled(None);
                    queue.forget(&key);
                }
                Ok(Action::Requeue(after)) => {
                    stats.reconciled(None);
                    queue.forget(&key);
                    queue.add_after(key, after);
                }
                Err(error) => {
                    stats.reconciled(Some(&error.0));
                    let retry_in = queue.add_with_backoff(key.clone());
                    tracing::warn!(controller = %self.name, key, %error, ?retry_in, "reconcile failed");
                }
            }
        }
        queue.shutdown();
        watching.abort();
        let _ = reporting.await;
        Ok(())
    }
}

/// A resource's key in the queue: its type, tenancy and name.
fn key_of(id: &Id) -> String {
    let tenancy = id.tenancy.clone().unwrap_or_default();
    format!("{}/{}/{}", tenancy.partition, tenancy.namespace, id.name)
}

/// Watches the managed type everywhere and queues what changes (the watcher resumes or lists
/// again across disconnections and failovers). A watch refused for good (the type not
/// registered yet, a token without read) is said once and opened again with backoff.
async fn watch(
    client: Client,
    managed_type: Type,
    queue: Arc<WorkQueue<String>>,
    ids: Arc<Mutex<HashMap<String, Id>>>,
    shutdown: CancellationToken,
) {
    let mut refused: Option<String> = None;
    let mut pause = Duration::from_millis(500);
    loop {
        let mut watcher = client.watcher(WatchListRequest {
            r#type: Some(managed_type.clone()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: String::new(),
            since_version: String::new(),
        });
        let mut failing = false;
        let why = loop {
            let update = tokio::select! {
                () = shutdown.cancelled() => return,
                update = watcher.next() => update,
            };
            match update {
                None => break "the watch ended".to_owned(),
                Some(WatchUpdate::Event(event)) => {
                    failing = false;
                    if refused.take().is_some() {
                        tracing::info!("watching again");
                        pause = Duration::from_millis(500);
                    }
                    let resource: Option<Resource> = match event.event {
                        Some(Event::Upsert(upsert)) => upsert.resource,
                        Some(Event::Delete(delete)) => delete.resource,
                        _ => None,
                    };
                    if let Some(id) = resource.and_then(|r| r.id) {
                        let key = key_of(&id);
                        ids.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(key.clone(), id);
                        queue.add(key);
                    }
                }
                Some(WatchUpdate::Disconnected { error, retry_in }) if !failing => {
                    failing = true;
                    tracing::warn!(%error, ?retry_in, "the watch broke; retrying");
                }
                Some(WatchUpdate::Failed(error)) => break error.to_string(),
                Some(_) => {}
            }
        };
        if refused.as_deref() != Some(why.as_str()) {
            tracing::error!(error = %why, retry_in = ?pause, "the watch was refused (a type not registered yet, or a token without read?); trying again");
            refused = Some(why);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}
