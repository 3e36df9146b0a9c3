//! Leader election over a `coordination.v1.Lease` (DESIGN §16), with client-go's rules:
//!
//! - taking and renewing are compare-and-swap writes of the lease;
//! - a holder renews every `retry_period`, and stops leading as soon as it has not renewed for
//!   `renew_deadline` (well inside `duration`), whatever its renewal loop was doing (a process
//!   paused past it finds, the moment it runs again, that it no longer leads: [`Leadership::holds`]);
//! - a candidate takes the lease over only after it has seen it unchanged (same version) for
//!   the whole `duration` on its own clock. Clocks are never compared across machines: the
//!   lease's times are informational.
//!
//! A lease whose data cannot be read (written by hand) is a lease held by nobody known: it is
//! taken over once it has stayed unchanged for the duration, never trusted, never a panic.

use std::sync::Arc;
use std::time::Duration;

use proto::coordination::v1::Lease;
use proto::resource::v1::{Id, Resource, Tenancy, Type};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{Api, ApiError};

/// How a replica reads and writes its lease.
#[async_trait::async_trait]
pub trait LeaseStore: Send + Sync {
    /// The stored lease, or `None`.
    async fn read(&self, id: &Id) -> Result<Option<Resource>, StoreError>;
    /// Writes `lease`: compare-and-swap on its `version`; without one, a create whose id
    /// carries a uid of its own (refused as [`StoreError::Conflict`] when the lease exists).
    async fn write(&self, lease: Resource) -> Result<Resource, StoreError>;
}

/// Why a read or write of the lease failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// Someone else wrote it since it was read (or created it first).
    #[error("the lease changed since it was read")]
    Conflict,
    /// The cluster cannot answer now (no quorum, a node catching up, out of reach): a wait.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else (the token refused…): the attempt failed.
    #[error("{0}")]
    Failed(String),
}

impl StoreError {
    /// What kind of failure this is, for saying each kind once (its words vary: "applied
    /// 3 of 9", then "applied 5 of 9").
    fn kind(&self) -> &'static str {
        match self {
            StoreError::Conflict => "conflict",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Failed(_) => "failed",
        }
    }
}

/// The timings of an election, client-go's defaults.
#[derive(Debug, Clone)]
pub struct Config {
    /// The lease: `coordination.v1.Lease` `<namespace>/<name>`.
    pub partition: String,
    pub namespace: String,
    pub name: String,
    /// This replica, as the lease's `holder` says it.
    pub identity: String,
    /// How long a lease is held without renewal before a candidate may take it.
    pub duration: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews and candidates try.
    pub retry_period: Duration,
}

impl Config {
    pub fn new(namespace: &str, name: &str, identity: &str) -> Config {
        Config {
            partition: "default".into(),
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The lease's id.
    pub fn lease_id(&self) -> Id {
        Id {
            uid: String::new(),
            name: self.name.clone(),
            r#type: Some(Type {
                group: "coordination".into(),
                group_version: "v1".into(),
                kind: "Lease".into(),
            }),
            tenancy: Some(Tenancy {
                partition: self.partition.clone(),
                namespace: self.namespace.clone(),
            }),
        }
    }

    /// Timings that cannot work are refused: the holder must give up before others may take over.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.renew_deadline >= self.duration {
            return Err(ConfigError::RenewDeadline {
                renew_deadline: self.renew_deadline,
                duration: self.duration,
            });
        }
        if self.retry_period >= self.renew_deadline {
            return Err(ConfigError::RetryPeriod {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.identity.is_empty() {
            return Err(ConfigError::NoIdentity);
        }
        Ok(())
    }
}

/// Election settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the renew deadline ({renew_deadline:?}) must be shorter than the lease duration ({duration:?}): the holder must stop before another may take over"
    )]
    RenewDeadline {
        renew_deadline: Duration,
        duration: Duration,
    },
    #[error(
        "the retry period ({retry_period:?}) must be shorter than the renew deadline ({renew_deadline:?})"
    )]
    RetryPeriod {
        retry_period: Duration,
        renew_deadline: Duration,
    },
    #[error("a replica needs an identity to hold a lease")]
    NoIdentity,
}

/// What an election makes of an [`Api`]'s error.
pub(crate) fn store_error(error: ApiError) -> StoreError {
    match error {
        ApiError::Conflict(_) => StoreError::Conflict,
        ApiError::Unavailable(why) => StoreError::Unavailable(why),
        error => StoreError::Failed(error.to_string()),
    }
}

/// Leases and reports kept through an [`Api`].
#[derive(Debug, Clone)]
pub struct ApiStore<A>(pub A);

/// A lost compare-and-swap or a create that met a lease created first is
/// [`StoreError::Conflict`].
#[async_trait::async_trait]
impl<A: Api> LeaseStore for ApiStore<A> {
    async fn read(&self, id: &Id) -> Result<Option<Resource>, StoreError> {
        self.0.read(id).await.map_err(store_error)
    }

    async fn write(&self, lease: Resource) -> Result<Resource, StoreError> {
        self.0.write(lease).await.map_err(store_error)
    }
}

/// What a replica knows of its leadership, shared with the code that reconciles.
#[derive(Debug, Default)]
pub struct Leadership {
    /// Until when this replica leads (its last successful take or renewal + the renew
    /// deadline), on its own clock; `None`: it does not.
    until: std::sync::Mutex<Option<Instant>>,
    /// Who holds the lease as last seen (empty: nobody known).
    holder: std::sync::Mutex<String>,
    changed: tokio::sync::Notify,
    /// The lease this replica's writes are fenced by while it leads (DESIGN §16): set by its
    /// elector on each take and renewal, emptied when it stops leading — or by a write the
    /// server refused `FENCED`, which ends the leadership at once.
    fence: proto::fence::FenceCell,
    /// Whether an elector keeps [`Leadership::fence`] (then leading needs it set).
    fencing: std::sync::atomic::AtomicBool,
    /// Told, as it happens, when this replica takes its lease back from the server, which took
    /// it when the replica dropped out of its shard ring ([`proto::shard::LEFT_THE_RING`]).
    on_taken_back: std::sync::Mutex<Option<TakenBack>>,
}

/// What [`Leadership::on_taken_back`] calls.
#[derive(Clone)]
struct TakenBack(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for TakenBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TakenBack")
    }
}

impl Leadership {
    /// Whether this replica leads now. Checked before every reconcile and every write on
    /// the lease holder's behalf: a replica that was paused past its renew deadline answers
    /// `false` the moment it runs again, before its renewal loop has noticed.
    pub fn holds(&self) -> bool {
        let fenced_off =
            self.fencing.load(std::sync::atomic::Ordering::Relaxed) && self.fence.get().is_none();
        !fenced_off
            && self
                .until
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|until| Instant::now() < until)
    }

    /// The cell holding the lease this replica's writes are fenced by ([`crate::api::Api::fenced`]).
    pub fn fence(&self) -> proto::fence::FenceCell {
        self.fence.clone()
    }

    /// Calls `hook` whenever this replica takes its lease back from the server after dropping
    /// out of its shard ring — before it leads again.
    pub fn on_taken_back(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.on_taken_back.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(TakenBack(Arc::new(hook)));
    }

    /// Who holds the lease, as this replica last saw it.
    pub fn holder(&self) -> String {
        self.holder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Resolves at the next change of leadership.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    pub(crate) fn lead_until(&self, until: Option<Instant>) {
        let was = self.holds();
        if until.is_none() {
            self.fence.set(None);
        }
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = until;
        if was != self.holds() {
            self.changed.notify_waiters();
        }
    }

    fn saw_holder(&self, holder: &str) {
        let mut seen = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        if *seen != holder {
            *seen = holder.to_owned();
            self.changed.notify_waiters();
        }
    }
}

/// One replica's side of an election.
pub struct Elector<S> {
    config: Config,
    store: S,
    /// The lease version last seen, and when (on this replica's clock) it was first seen.
    observed: Option<(String, Instant)>,
    /// The lease version this elector last wrote, and the lease it last tried to write (a
    /// write whose answer was lost may still have landed): a lease that names this replica's
    /// identity but is neither (a restart, or a zombie of an earlier process) is another's —
    /// waited out, then taken with its transitions raised, fencing the other.
    written: Option<String>,
    attempted: Option<Lease>,
    leadership: Arc<Leadership>,
}

impl<S: LeaseStore> Elector<S> {
    pub fn new(config: Config, store: S) -> Result<Self, ConfigError> {
        config.check()?;
        let leadership = Leadership::default();
        leadership
            .fencing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(Elector {
            config,
            store,
            observed: None,
            written: None,
            attempted: None,
            leadership: Arc::new(leadership),
        })
    }

    /// What the reconciling code consults.
    pub fn leadership(&self) -> Arc<Leadership> {
        self.leadership.clone()
    }

    /// One attempt to take or renew the lease (client-go's `tryAcquireOrRenew`): whether this
    /// replica holds it after the attempt.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, StoreError> {
        let now = Instant::now();
        let id = self.config.lease_id();
        let stored = self.store.read(&id).await?;
        let (version, lease) = match &stored {
            None => (String::new(), None),
            Some(resource) => (resource.version.clone(), Some(decode(resource))),
        };
        // A version not seen before restarts this replica's count of the lease's duration.
        if stored.is_some()
            && self
                .observed
                .as_ref()
                .is_none_or(|(seen, _)| *seen != version)
        {
            self.observed = Some((version.clone(), now));
        }
        let holder = lease
            .as_ref()
            .and_then(|lease| lease.as_ref().ok())
            .map(|lease| lease.holder.clone())
            .unwrap_or_default();
        self.leadership.saw_holder(&holder);
        let ours = self.written.as_deref() == Some(&version)
            || lease
                .as_ref()
                .and_then(|lease| lease.as_ref().ok())
                .is_some_and(|lease| self.attempted.as_ref() == Some(lease));
        let mine = holder == self.config.identity && ours;
        let unreadable = lease.as_ref().is_some_and(Result::is_err);
        let held_by_another = stored.is_some() && !mine && !holder.is_empty();
        if !mine {
            self.written = None;
        }
        if held_by_another || unreadable {
            // Held by another (or unreadable): taken over only once unchanged for the duration.
            let seen_at = self.observed.as_ref().map_or(now, |(_, at)| *at);
            if now.duration_since(seen_at) < self.config.duration {
                return Ok(false);
            }
        }
        let previous = lease.and_then(Result::ok).unwrap_or_default();
        let wall = crate::now_timestamp();
        let next = Lease {
            holder: self.config.identity.clone(),
            duration_seconds: u32::try_from(self.config.duration.as_secs()).unwrap_or(u32::MAX),
            acquired_at: if mine {
                previous.acquired_at.or(Some(wall))
            } else {
                Some(wall)
            },
            renewed_at: Some(wall),
            transitions: if mine || stored.is_none() {
                previous.transitions
            } else {
                previous.transitions.saturating_add(1)
            },
        };
        // A write without a version is blind in resd: a create carries a uid of its own, which
        // the server ignores when it creates and refuses (uid mismatch) when someone created
        // the lease first, so two candidates of an empty lease cannot both win.
        let mut resource = stored.unwrap_or_else(|| Resource {
            id: Some(Id {
                uid: ulid::Ulid::new().to_string(),
                ..id
            }),
            ..Default::default()
        });
        resource.data = Some(proto::to_any(&next));
        resource.status.clear();
        self.attempted = Some(next.clone());
        match self.store.write(resource).await {
            Ok(written) => {
                self.observed = Some((written.version.clone(), now));
                self.written = Some(written.version.clone());
                if !mine && holder == proto::shard::LEFT_THE_RING {
                    // The server took it when this member dropped out of its ring: what this
                    // member knows of the ring is older than that.
                    let hook = self
                        .leadership
                        .on_taken_back
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    if let Some(TakenBack(hook)) = hook {
                        hook();
                    }
                }
                self.leadership.saw_holder(&self.config.identity);
                self.leadership.fence.set(Some(proto::fence::LeaseFence {
                    partition: self.config.partition.clone(),
                    namespace: self.config.namespace.clone(),
                    name: self.config.name.clone(),
                    transitions: next.transitions,
                }));
                Ok(true)
            }
            Err(StoreError::Conflict) => {
                self.written = None;
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Campaigns and leads until `shutdown`: tries every `retry_period` until it holds the
    /// lease, then renews every `retry_period`; a holder that has not renewed for
    /// `renew_deadline` stops leading and campaigns again.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut last_renewal: Option<Instant> = None;
        // A failure that is not a lost race (a token that may not write the lease, a cluster
        // that cannot answer, an attempt that ran out of time) is said once per kind, at warn,
        // until the kind changes or an attempt goes through.
        let mut failing: Option<&'static str> = None;
        loop {
            let attempt = tokio::select! {
                () = shutdown.cancelled() => break,
                attempt = tokio::time::timeout(self.config.retry_period, self.try_acquire_or_renew()) => attempt,
            };
            let now = Instant::now();
            match attempt {
                Ok(Ok(true)) => {
                    failing = None;
                    if last_renewal.is_none() {
                        tracing::info!(lease = %self.config.name, identity = %self.config.identity, "took the lease: leading");
                    }
                    last_renewal = Some(now);
                    self.leadership
                        .lead_until(Some(now + self.config.renew_deadline));
                }
                other => {
                    let (kind, error) = match &other {
                        Ok(Ok(_)) => (None, String::new()),
                        Ok(Err(error)) => (Some(error.kind()), error.to_string()),
                        Err(_) => (
                            Some("timed out"),
                            format!(
                                "no answer within the retry period ({:?})",
                                self.config.retry_period
                            ),
                        ),
                    };
                    match kind {
                        None => failing = None,
                        Some(kind) if failing != Some(kind) => {
                            tracing::warn!(lease = %self.config.name, identity = %self.config.identity, %error, "cannot take or renew the lease; trying again");
                            failing = Some(kind);
                        }
                        Some(_) => {
                            tracing::debug!(lease = %self.config.name, %error, "lease attempt failed")
                        }
                    }
                    if let Some(renewed) = last_renewal
                        && now.duration_since(renewed) >= self.config.renew_deadline
                    {
                        tracing::warn!(lease = %self.config.name, identity = %self.config.identity, "could not renew the lease within the renew deadline: no longer leading");
                        last_renewal = None;
                        self.written = None;
                        self.leadership.lead_until(None);
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        let leading = self.leadership.holds();
        self.leadership.lead_until(None);
        if leading {
            // Handed back so the next replica need not wait out the duration (client-go's
            // ReleaseOnCancel); a holder that cannot is simply waited out.
            match tokio::time::timeout(self.config.retry_period, self.release()).await {
                Ok(Ok(())) => tracing::info!(lease = %self.config.name, "lease released"),
                _ => {
                    tracing::debug!(lease = %self.config.name, "could not release the lease; it expires")
                }
            }
        }
    }

    /// Gives the lease back if this replica holds it: a compare-and-swap that empties the
    /// holder.
    pub async fn release(&mut self) -> Result<(), StoreError> {
        let Some(mut stored) = self.store.read(&self.config.lease_id()).await? else {
            return Ok(());
        };
        let Ok(mut lease) = decode(&stored) else {
            return Ok(());
        };
        if lease.holder != self.config.identity {
            return Ok(());
        }
        lease.holder.clear();
        stored.data = Some(proto::to_any(&lease));
        stored.status.clear();
        self.store.write(stored).await.map(drop)
    }
}

/// The lease in a stored resource, or why it cannot be read.
fn decode(resource: &Resource) -> Result<Lease, String> {
    let data = resource
        .data
        .as_ref()
        .ok_or_else(|| "the lease has no data".to_owned())?;
    <Lease as prost::Message>::decode(data.value.as_slice()).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests;
