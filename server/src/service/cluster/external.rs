//! Replicas of controllers running outside the server (DESIGN §16), as `ListControllers`
//! shows them: from their `coordination.v1.Replica` reports. A report is stale when its version
//! has not changed for three report periods on this server's own clock (clocks are never
//! compared across machines), counted from when this server first saw that version: every
//! node follows the reports as they are written ([`ReportClock::saw`], fed by the agent), so
//! the first `ListControllers` after a replica died already knows how long it has been silent.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proto::cluster::v1 as pb;
use proto::coordination::v1::{Replica, ReplicaPlacement, ShardMap};
use proto::resource::v1::{ListRequest, Resource, Tenancy};

use super::super::{Error, ResourceService};
use crate::acl::AllowAll;
use crate::registry::decode_data;
use crate::resource;

/// When this server first saw each report's current version.
#[derive(Debug, Default)]
pub(crate) struct ReportClock {
    seen: Mutex<HashMap<String, (String, Instant)>>,
}

impl ReportClock {
    /// Notes that report `key` is at `version` now (its clock restarts when the version
    /// changes).
    pub(crate) fn saw(&self, key: &str, version: &str) {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get_mut(key) {
            Some(entry) if entry.0 == version => {}
            Some(entry) => *entry = (version.to_owned(), now),
            None => {
                seen.insert(key.to_owned(), (version.to_owned(), now));
            }
        }
    }

    /// Forgets a report that is gone.
    /// Forgets every report but those named in `keys` (the whole state was replaced).
    pub(crate) fn keep_only(&self, keys: &std::collections::HashSet<String>) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| keys.contains(key));
    }

    pub(crate) fn forget(&self, key: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Whether a report at `version` has stayed unchanged for longer than `stale_after`.
    fn stale(&self, key: &str, version: &str, stale_after: Duration) -> bool {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        // The projection owns the clock ([`ReportClock::saw`], in apply); a report it has not
        // seen yet starts counting now.
        let entry = seen
            .entry(key.to_owned())
            .or_insert_with(|| (version.to_owned(), now));
        entry.0 == version && now.duration_since(entry.1) > stale_after
    }

    /// Forgets reports that are gone.
    fn keep(&self, keys: &[String]) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|key, _| keys.contains(key));
    }
}

/// Every replica report in the cluster, as `ListControllers` answers them.
pub(crate) async fn external_replicas(
    service: &ResourceService,
    clock: &ReportClock,
) -> Result<Vec<pb::ExternalReplica>, Error> {
    let reports = service
        .list(
            &AllowAll,
            crate::storage::Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::new_type("coordination", "v1", "Replica")),
                tenancy: Some(Tenancy {
                    partition: resource::WILDCARD.into(),
                    namespace: resource::WILDCARD.into(),
                }),
                ..ListRequest::default()
            },
        )
        .await?
        .resources;
    let keys: Vec<String> = reports.iter().map(key_of).collect();
    clock.keep(&keys);
    // The sharded controllers' maps, by where they live and whose they are.
    let maps: HashMap<(String, String, String), ShardMap> = service
        .list(
            &AllowAll,
            crate::storage::Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::new_type("coordination", "v1", "ShardMap")),
                tenancy: Some(Tenancy {
                    partition: resource::WILDCARD.into(),
                    namespace: resource::WILDCARD.into(),
                }),
                ..ListRequest::default()
            },
        )
        .await?
        .resources
        .iter()
        .filter_map(|stored| {
            let id = stored.id.as_ref()?;
            let tenancy = id.tenancy.clone().unwrap_or_default();
            Some((
                (tenancy.partition, tenancy.namespace, id.name.clone()),
                decode_data(stored).ok()?,
            ))
        })
        .collect();
    Ok(reports
        .iter()
        .filter_map(|stored| {
            let report: Replica = decode_data(stored).ok()?;
            // Bounded here too: a report stored before the bound was enforced.
            let every = Duration::from_secs(u64::from(
                report
                    .report_every_seconds
                    .clamp(1, crate::registry::builtin::MAX_REPORT_EVERY_SECONDS),
            ));
            let stale = clock.stale(&key_of(stored), &stored.version, every * 3);
            let tenancy = stored
                .id
                .as_ref()
                .and_then(|id| id.tenancy.clone())
                .unwrap_or_default();
            let map = maps.get(&(
                tenancy.partition,
                tenancy.namespace,
                report.controller.clone(),
            ));
            Some(external_of(stored, report, stale, map))
        })
        .collect())
}

/// A report's key in the clock.
pub(crate) fn key_of(stored: &Resource) -> String {
    stored
        .id
        .as_ref()
        .map(|id| resource::DisplayId(id).to_string())
        .unwrap_or_default()
}

fn external_of(
    stored: &Resource,
    report: Replica,
    stale: bool,
    map: Option<&ShardMap>,
) -> pb::ExternalReplica {
    let each = report.placement() == ReplicaPlacement::EachReplica;
    let shard = (report.placement() == ReplicaPlacement::Sharded).then(|| {
        let map = map.cloned().unwrap_or_default();
        pb::ShardPlace {
            in_ring: map.members.iter().any(|m| m.name == report.identity),
            members: u32::try_from(map.members.len()).unwrap_or(u32::MAX),
            ring_version: map.ring_version,
            acked_ring_version: report.ring_version,
            settled: map.settled_ring_version == map.ring_version,
        }
    });
    let placement = match report.placement() {
        ReplicaPlacement::EachReplica => pb::Placement::EachReplica,
        ReplicaPlacement::Sharded => pb::Placement::Sharded,
        _ => pb::Placement::Singleton,
    };
    let running = !stale
        && match &shard {
            Some(place) => place.in_ring && report.holds_lease,
            None => each || report.holds_lease,
        };
    pb::ExternalReplica {
        controller: Some(pb::ControllerInfo {
            name: report.controller,
            managed_type: report.managed_type,
            watched_types: report.watched_types,
            placement: placement as i32,
            running,
            queue_depth: report.queue_depth,
            reconciles_ok: report.reconciles_ok,
            reconciles_failed: report.reconciles_failed,
            last_error: report.last_error,
            last_reconcile: report.last_reconcile,
            finalizers: report.finalizers,
        }),
        identity: report.identity,
        host: report.host,
        tenancy: stored.id.as_ref().and_then(|id| id.tenancy.clone()),
        lease: report.lease,
        holds_lease: report.holds_lease,
        stale,
        shard,
    }
}
