//! Running one controller: lives (initialize, watch, prime, reconcile) started over while the
//! controller runs.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use proto::resource::v1::{Id, Resource, Tenancy, Type, WatchListRequest, watch_event};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Action, Cache, Context, Controller, Gate, Mapper, ReconcileError, Reconciler, Request, Stats,
    gvk,
};
use crate::api::{Api, ApiError, EventStream};
use crate::queue::WorkQueue;

/// Key of the work queue: the managed resource without its uid and version (a recreated
/// resource is the same work).
fn queue_key(id: &Id) -> Request {
    let mut id = id.clone();
    id.uid.clear();
    Request { id }
}

/// Runs one controller over `api` until `shutdown` is cancelled, reconciling only while `gate`
/// (if any) says this replica leads. A watch that ends starts the controller over from its
/// initial state, after a pause that doubles (from the backoff's base to its max) each time,
/// and starts again from the base only after a life that lasted the backoff's max.
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
    let mut said: Option<Stopped> = None;
    // One recorder for every life: what it merged is written whatever restarts.
    let events =
        crate::events::Recorder::new(api.clone(), &format!("controller/{}", controller.name));
    loop {
        let began = Instant::now();
        let stopped = run_once(&controller, &api, &events, &stats, gate.as_ref(), &shutdown).await;
        stats.set_queue_depth(0);
        if shutdown.is_cancelled() {
            break;
        }
        if began.elapsed() >= controller.backoff.max {
            restart_pause = controller.backoff.base;
        }
        if said.as_ref() == Some(&stopped) {
            tracing::debug!(controller = controller.name, reason = %stopped, retry_in = ?restart_pause, "controller still cannot run");
        } else if stopped.is_wait() {
            tracing::info!(controller = controller.name, reason = %stopped, "controller waiting for the server");
        } else {
            tracing::warn!(controller = controller.name, reason = %stopped, retry_in = ?restart_pause, "controller starting over");
        }
        said = Some(stopped);
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(restart_pause) => {}
        }
        restart_pause = (restart_pause * 2).min(controller.backoff.max);
    }
    stats.running.store(false, Ordering::Relaxed);
}

/// Why one life of a controller ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stopped {
    ShuttingDown,
    NoReconciler,
    /// A watch could not be opened, or failed.
    WatchRefused {
        watched: Type,
        error: ApiError,
    },
    /// A watch ended before its snapshot was complete.
    EndedBeforeSnapshot {
        watched: Type,
    },
    /// A watch ended (a restore, a watcher that fell behind).
    WatchEnded {
        watched: Type,
    },
    /// A task of the life failed (a bug).
    TaskFailed(String),
}

impl Stopped {
    /// The server could not serve the controller yet: a wait, not a failure.
    pub(super) fn is_wait(&self) -> bool {
        matches!(
            self,
            Stopped::WatchRefused {
                error: ApiError::Unavailable(_),
                ..
            }
        )
    }
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stopped::ShuttingDown => write!(f, "shutting down"),
            Stopped::NoReconciler => write!(f, "no reconciler"),
            Stopped::WatchRefused { watched, error } => {
                write!(f, "cannot watch {}: {error}", gvk(watched))
            }
            Stopped::EndedBeforeSnapshot { watched } => write!(
                f,
                "the watch of {} ended before its snapshot was complete",
                gvk(watched)
            ),
            Stopped::WatchEnded { watched } => write!(f, "the watch of {} ended", gvk(watched)),
            Stopped::TaskFailed(why) => write!(f, "a task of the controller failed: {why}"),
        }
    }
}

/// How a watch feeding the queue ended.
enum Ended {
    Stopped,
    Closed,
    Failed(ApiError),
}

impl Ended {
    /// Why the life ends because this watch ended, before or after its snapshot.
    fn stopped(self, watched: Type, primed: bool) -> Stopped {
        match self {
            Ended::Failed(error) => Stopped::WatchRefused { watched, error },
            Ended::Stopped | Ended::Closed if primed => Stopped::WatchEnded { watched },
            Ended::Stopped | Ended::Closed => Stopped::EndedBeforeSnapshot { watched },
        }
    }
}

/// One life of a controller: initialize, watch, prime, reconcile. Returns why it stopped.
async fn run_once<A: Api>(
    controller: &Arc<Controller<A>>,
    api: &A,
    events: &crate::events::Recorder<A>,
    stats: &Arc<Stats>,
    gate: Option<&Gate>,
    shutdown: &CancellationToken,
) -> Stopped {
    let Some(reconciler) = controller.reconciler.clone() else {
        return Stopped::NoReconciler;
    };
    let context = Arc::new(Context {
        api: api.clone(),
        cache: Arc::new(Cache::default()),
        gate: gate.cloned(),
        events: events.clone(),
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
                () = shutdown.cancelled() => return Stopped::ShuttingDown,
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
    for (watched, mapper) in sources {
        // A shard member watches only its own managed objects (the server decides which);
        // what its other watches map to is checked before each reconcile.
        let shard = gate
            .and_then(|gate| gate.shard.as_ref())
            .filter(|_| mapper.is_none())
            .map(|shard| shard.selector());
        let request = WatchListRequest {
            r#type: Some(watched.clone()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            shard,
            ..WatchListRequest::default()
        };
        let stream = match api.watch(request).await {
            Ok(stream) => stream,
            Err(error) => {
                life.cancel();
                while watches.join_next().await.is_some() {}
                return Stopped::WatchRefused { watched, error };
            }
        };
        let feed = Feed {
            watched,
            mapper,
            queue: queue.clone(),
            stats: stats.clone(),
            cache: context.cache.clone(),
            primed: primed.clone(),
            all_primed: all_primed.clone(),
            life: life.clone(),
        };
        watches.spawn(feed.run(stream));
    }
    drop(primed);

    // Prime the cache from every watch's snapshot before anything is mapped or reconciled:
    // events that arrive meanwhile are cached, but no mapper and no worker runs yet. A watch
    // that ends meanwhile (refused on its stream, a failover that cannot resume) ends the life.
    let sources = 1 + controller.watches.len();
    let mut complete = 0;
    let why = |ended: Option<Result<(Type, Ended), tokio::task::JoinError>>| match ended {
        Some(Ok((watched, ended))) => ended.stopped(watched, false),
        Some(Err(error)) => Stopped::TaskFailed(error.to_string()),
        None => Stopped::TaskFailed("no watches".into()),
    };
    while complete < sources {
        let ended = tokio::select! {
            () = shutdown.cancelled() => Some(Stopped::ShuttingDown),
            signal = primed_count.recv() => match signal {
                Some(()) => { complete += 1; None }
                // Every feed ended (each held a sender): say why the first did.
                None => Some(why(watches.join_next().await)),
            },
            Some(ended) = watches.join_next() => Some(why(Some(ended))),
        };
        if let Some(stopped) = ended {
            life.cancel();
            while watches.join_next().await.is_some() {}
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
    if let Some(shard) = gate.and_then(|gate| gate.shard.clone()) {
        // The server places objects by the map it has, this member by the map it last saw:
        // an object that arrived while the member's map was behind was set aside; when the map
        // changes, what is cached and the member's now is queued again.
        let (queue, cache, managed, life) = (
            queue.clone(),
            context.cache.clone(),
            controller.managed_type.clone(),
            life.clone(),
        );
        let mut changes = shard.subscribe_placement();
        workers.spawn(async move {
            loop {
                for id in cache.ids(&managed) {
                    if shard.owns(&id) {
                        queue.add(queue_key(&id));
                    }
                }
                tokio::select! {
                    () = life.cancelled() => return,
                    changed = changes.changed() => if changed.is_err() { return },
                }
            }
        });
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
                for id in cache.ids(&managed) {
                    queue.add(queue_key(&id));
                }
            }
        });
    }

    // The controller lives until a watch ends or the node shuts down.
    let stopped = tokio::select! {
        () = shutdown.cancelled() => Stopped::ShuttingDown,
        finished = watches.join_next() => match finished {
            Some(Ok((watched, ended))) => ended.stopped(watched, true),
            Some(Err(error)) => Stopped::TaskFailed(error.to_string()),
            None => Stopped::TaskFailed("no watches".into()),
        },
    };
    life.cancel();
    queue.shutdown();
    while watches.join_next().await.is_some() {}
    // A reconcile in flight finishes, within a grace period: one that waits on something that
    // will not come (a write for a quorum that is gone) is stopped, or the controller, and the
    // process stopping it, would never end.
    let finished = tokio::time::timeout(RECONCILE_GRACE, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            controller = controller.name,
            grace = ?RECONCILE_GRACE,
            "a reconcile was still running when the controller stopped; cancelling it"
        );
        workers.abort_all();
        while workers.join_next().await.is_some() {}
    }
    stopped
}

/// How long reconciles in flight have to finish once their controller stops.
const RECONCILE_GRACE: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(10)
};

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
            // Waiting for the lease: this worker holds its key and waits (every key cycling
            // through the queue instead would cost a replica with a large cache its CPU while it
            // waits, however long); the other keys wait in the queue.
            while !gate.leadership.holds() && !queue.is_shut_down() {
                tokio::select! {
                    () = gate.leadership.changed() => {}
                    () = tokio::time::sleep(gate.recheck) => {}
                }
            }
            if queue.is_shut_down() {
                queue.done(&request);
                return;
            }
        }
        // A shard member reconciles only its own objects, counted while it does (its
        // acknowledgement of a ring change waits for those the change took away).
        let running = match context.gate.as_ref().and_then(|gate| gate.shard.as_ref()) {
            Some(shard) => match shard.begin(&request.id) {
                Some(running) => Some(running),
                None => {
                    // Another member's now: the server sends it back if it returns.
                    tracing::debug!(controller = name, id = %proto::client::describe::id_label(&request.id), "not this member's object now; skipped");
                    queue.done(&request);
                    queue.forget(&request);
                    stats.set_queue_depth(queue.len());
                    continue;
                }
            },
            None => None,
        };
        let outcome = AssertUnwindSafe(reconciler.reconcile(&context, request.clone()))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(ReconcileError("the reconciler panicked".into())));
        drop(running);
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
                tracing::warn!(controller = name, id = %proto::client::describe::id_label(&request.id), %error, retry_in = ?delay, "reconcile failed");
            }
        }
        stats.set_queue_depth(queue.len());
    }
}

/// One watch of a running controller, feeding its cache and queue.
struct Feed {
    watched: Type,
    mapper: Option<Mapper>,
    queue: Arc<WorkQueue<Request>>,
    stats: Arc<Stats>,
    cache: Arc<Cache>,
    /// Told once this watch's snapshot is complete.
    primed: tokio::sync::mpsc::UnboundedSender<()>,
    /// Cancelled once every watch of the controller is primed.
    all_primed: CancellationToken,
    life: CancellationToken,
}

/// Where a feed is: priming (caching only, keeping what was deleted meanwhile), or live.
enum Phase {
    Priming { deleted: Vec<Resource> },
    Live,
}

impl Feed {
    /// The managed resources to reconcile for a changed resource.
    fn map(&self, resource: &Resource) -> Vec<Request> {
        match &self.mapper {
            None => resource
                .id
                .as_ref()
                .map(|id| vec![queue_key(id)])
                .unwrap_or_default(),
            Some(mapper) => mapper(resource).iter().map(|r| queue_key(&r.id)).collect(),
        }
    }

    fn queue(&self, requests: Vec<Request>) {
        for request in requests {
            self.queue.add(request);
        }
        self.stats.set_queue_depth(self.queue.len());
    }

    /// Turns the watch into cache updates and, once every watch of the controller is primed,
    /// into queue adds: until then it only caches, so no mapper ever runs against a half-filled
    /// cache (Consul's #20421); then it maps everything it has seen at once (what was deleted
    /// meanwhile too), and each event as it comes. Returns the watched type and how it ended.
    async fn run(self, mut stream: EventStream) -> (Type, Ended) {
        let mut phase = Phase::Priming {
            deleted: Vec::new(),
        };
        let ended = loop {
            let priming = matches!(phase, Phase::Priming { .. });
            let event = tokio::select! {
                biased;
                () = self.life.cancelled() => break Ended::Stopped,
                () = self.all_primed.cancelled(), if priming => {
                    if let Phase::Priming { deleted } = std::mem::replace(&mut phase, Phase::Live) {
                        let seen = self.cache.list(&self.watched);
                        let requests = seen.iter().chain(&deleted).flat_map(|r| self.map(r)).collect();
                        self.queue(requests);
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
                            self.cache.upsert(resource);
                        }
                        upsert.resource
                    }
                    Some(watch_event::Event::Delete(delete)) => {
                        if let Some(resource) = &delete.resource {
                            self.cache.remove(resource);
                            if let Phase::Priming { deleted } = &mut phase {
                                deleted.push(resource.clone());
                            }
                        }
                        delete.resource
                    }
                    Some(watch_event::Event::EndOfSnapshot(_)) => {
                        let _ = self.primed.send(());
                        None
                    }
                    // Not asked for: the runner's watches have no selector to fall behind by.
                    Some(watch_event::Event::Bookmark(_)) | None => None,
                },
            };
            if let (Phase::Live, Some(resource)) = (&phase, resource) {
                self.queue(self.map(&resource));
            }
        };
        (self.watched, ended)
    }
}
