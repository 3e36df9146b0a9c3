//! What a replica of a controller running outside the server reports of itself (DESIGN §16):
//! a `coordination.v1.Replica` written every few seconds (and when its leadership changes),
//! deleted when it stops cleanly, so that `ListControllers`, `resctl controllers`, the
//! dashboard and "why is this stuck" show and blame it like a built-in controller.

use std::sync::Arc;
use std::time::Duration;

use proto::coordination::v1::{Replica, ReplicaPlacement};
use proto::resource::v1::{Id, Resource, Tenancy, Type};
use tokio_util::sync::CancellationToken;

use crate::api::Api;
use crate::controller::Stats;
use crate::election::{ApiStore, Leadership, StoreError};

/// How a replica writes and removes its report.
#[async_trait::async_trait]
pub trait ReportStore: Send + Sync {
    /// Writes the report (a blind write: only this replica writes it).
    async fn write_report(&self, report: Resource) -> Result<Resource, StoreError>;
    async fn delete_report(&self, id: &Id) -> Result<(), StoreError>;
}

#[async_trait::async_trait]
impl<A: Api> ReportStore for ApiStore<A> {
    async fn write_report(&self, report: Resource) -> Result<Resource, StoreError> {
        self.0
            .write(report)
            .await
            .map_err(|error| StoreError::Failed(error.to_string()))
    }

    async fn delete_report(&self, id: &Id) -> Result<(), StoreError> {
        self.0
            .delete(id, "")
            .await
            .map_err(|error| StoreError::Failed(error.to_string()))
    }
}

/// Who the replica is and what it runs.
#[derive(Debug, Clone)]
pub struct Identity {
    pub controller: String,
    pub identity: String,
    pub host: String,
    /// Where its report (and, for a singleton, its Lease) lives.
    pub partition: String,
    pub namespace: String,
    /// The Lease of a singleton controller (or of this member of a sharded one); `None`:
    /// every replica runs.
    pub lease: Option<String>,
    /// This member of a sharded controller.
    pub shard: Option<Arc<crate::shard::Shard>>,
    pub managed_type: Type,
    pub watched_types: Vec<Type>,
    pub finalizers: Vec<String>,
    /// How often it reports.
    pub every: Duration,
}

impl Identity {
    /// The report's id: named after the controller and a hash of the replica's identity
    /// ([`member_name`]).
    pub fn report_id(&self) -> Id {
        Id {
            uid: String::new(),
            name: member_name(&self.controller, &self.identity),
            r#type: Some(Type {
                group: "coordination".into(),
                group_version: "v1".into(),
                kind: "Replica".into(),
            }),
            tenancy: Some(Tenancy {
                partition: self.partition.clone(),
                namespace: self.namespace.clone(),
            }),
        }
    }

    /// The report, acknowledging ring `ring_version` (a shard member's; 0 otherwise).
    fn report(&self, stats: &Stats, holds_lease: bool, ring_version: u64) -> Replica {
        Replica {
            controller: self.controller.clone(),
            identity: self.identity.clone(),
            host: self.host.clone(),
            placement: if self.shard.is_some() {
                ReplicaPlacement::Sharded
            } else if self.lease.is_some() {
                ReplicaPlacement::Singleton
            } else {
                ReplicaPlacement::EachReplica
            } as i32,
            lease: self.lease.clone().unwrap_or_default(),
            holds_lease,
            managed_type: Some(self.managed_type.clone()),
            watched_types: self.watched_types.clone(),
            finalizers: self.finalizers.clone(),
            queue_depth: stats.queue_depth(),
            reconciles_ok: stats.reconciles_ok(),
            reconciles_failed: stats.reconciles_failed(),
            last_error: stats.last_error().unwrap_or_default(),
            last_reconcile: stats.last_reconcile().map(prost_types::Timestamp::from),
            report_every_seconds: u32::try_from(self.every.as_secs().max(1)).unwrap_or(u32::MAX),
            ring_version,
        }
    }
}

/// A name (a DNS label, whatever the identity holds) for what is one replica's of a
/// controller: its report, and a shard member's own lease — the controller's name and a hash of
/// the identity.
pub fn member_name(controller: &str, identity: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in identity.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let prefix: String = controller.chars().take(63 - 17).collect();
    format!("{}-{hash:016x}", prefix.trim_end_matches('-'))
}

/// Reports every `identity.every` and at each change of `leadership`, until `shutdown`; then
/// deletes the report. A failed write is retried at the next period (the store says why once).
pub async fn run(
    store: impl ReportStore,
    identity: Identity,
    stats: Arc<Stats>,
    leadership: Option<Arc<Leadership>>,
    shutdown: CancellationToken,
) {
    let id = identity.report_id();
    let mut failing = false;
    let mut changes = identity.shard.as_ref().map(|shard| shard.subscribe());
    loop {
        let holds = leadership.as_ref().is_some_and(|l| l.holds());
        let acknowledged = identity
            .shard
            .as_ref()
            .map_or(0, |shard| shard.acknowledged());
        let resource = Resource {
            id: Some(id.clone()),
            data: Some(proto::to_any(&identity.report(&stats, holds, acknowledged))),
            ..Default::default()
        };
        match store.write_report(resource).await {
            Ok(_) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(controller = %identity.controller, %error, "cannot write this replica's report; retrying");
            }
            Err(_) => {}
        }
        let changed = async {
            match &leadership {
                Some(leadership) => leadership.changed().await,
                None => std::future::pending().await,
            }
        };
        // A shard member reports a ring change it adopted at once (the handover waits on it).
        let ring = async {
            match (&identity.shard, &mut changes) {
                (Some(shard), Some(changes)) => loop {
                    if changes.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if shard.acknowledged() != acknowledged {
                        break;
                    }
                },
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(identity.every) => {}
            () = changed => {}
            () = ring => {}
        }
    }
    if let Err(error) = store.delete_report(&id).await {
        tracing::debug!(controller = %identity.controller, %error, "cannot delete this replica's report; it goes stale");
    }
}
