//! The `shards` controller (DESIGN §16, "Shards"): keeps each sharded controller's
//! `coordination.v1.ShardMap` from its members' `coordination.v1.Replica` reports. A member is
//! in the ring while its report is fresh (changed within three of its periods, timed on this
//! node's clock from when it saw each version: clocks are never compared). When the members
//! change, the ring version rises and the last settled ring is kept until every member's report
//! acknowledges the new one; then it settles. A member that drops out has its own lease taken
//! from it first (its holder emptied, its transitions raised), so a member that was only paused
//! has every later write refused `FENCED` before its objects can reach anyone else.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use proto::coordination::v1::{Lease, Replica, ReplicaPlacement, ShardMap, ShardMember};
use proto::resource::v1::{Id, Resource, Tenancy};
use runtime::controller::Mapper;

use super::{Action, ReconcileError, Reconciler, Request, Runtime};
use crate::registry::builtin::{MAX_REPORT_EVERY_SECONDS, MAX_SHARD_MEMBERS};
use crate::registry::decode_data;
use crate::resource::{self, DisplayId};

/// The controller's name.
pub(crate) const SHARDS: &str = "shards";

/// How many report periods without a change take a member out of the ring.
const STALE_PERIODS: u32 = 3;

/// The ShardMap of the sharded controller a report names (other reports map to nothing).
pub(crate) fn map_of_report() -> Mapper {
    Arc::new(|report: &Resource| {
        let Ok(data) = decode_data::<Replica>(report) else {
            return Vec::new();
        };
        if data.placement() != ReplicaPlacement::Sharded || data.controller.is_empty() {
            return Vec::new();
        }
        let tenancy = report.id.as_ref().and_then(|id| id.tenancy.clone());
        vec![Request {
            id: Id {
                uid: String::new(),
                name: data.controller,
                r#type: Some(resource::new_type("coordination", "v1", "ShardMap")),
                tenancy,
            },
        }]
    })
}

/// When this node first saw each report's version: per map, report key -> (version, when).
/// Each reconcile of a map keeps only the reports it found (the memory is the live reports').
#[derive(Default)]
pub(crate) struct Shards {
    seen: Mutex<HashMap<String, Seen>>,
}

/// A map's reports as seen in one reconcile.
type Seen = HashMap<String, (String, tokio::time::Instant)>;

/// Whether the report at `version` changed within `fresh_for` (noted in `now_seen`, from what
/// `seen` remembered), and how long until it would no longer count as fresh.
fn fresh(
    seen: &Seen,
    now_seen: &mut Seen,
    key: &str,
    version: &str,
    fresh_for: Duration,
) -> (bool, Duration) {
    let now = tokio::time::Instant::now();
    let since = match seen.get(key) {
        Some((seen_version, at)) if seen_version == version => *at,
        _ => now,
    };
    now_seen.insert(key.to_owned(), (version.to_owned(), since));
    let age = now.duration_since(since);
    (age <= fresh_for, fresh_for.saturating_sub(age))
}

/// One live member as its report says.
struct Live {
    lease: String,
    acked: u64,
}

#[async_trait]
impl Reconciler<super::InProcess> for Shards {
    async fn reconcile(
        &self,
        runtime: &Runtime,
        request: Request,
    ) -> Result<Action, ReconcileError> {
        let id = request.id;
        let tenancy = id.tenancy.clone().unwrap_or_default();
        let reports = runtime
            .list(
                &resource::new_type("coordination", "v1", "Replica"),
                &tenancy,
            )
            .await?;
        // The members whose reports are fresh, by identity (sorted), and when to look again.
        let mut live: BTreeMap<String, Live> = BTreeMap::new();
        let mut next_look: Option<Duration> = None;
        let map_key = DisplayId(&id).to_string();
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&map_key)
            .unwrap_or_default();
        let mut now_seen = Seen::new();
        for stored in &reports {
            let Ok(report) = decode_data::<Replica>(stored) else {
                continue;
            };
            if report.placement() != ReplicaPlacement::Sharded || report.controller != id.name {
                continue;
            }
            let every = Duration::from_secs(u64::from(
                report
                    .report_every_seconds
                    .clamp(1, MAX_REPORT_EVERY_SECONDS),
            ));
            let key = stored
                .id
                .as_ref()
                .map(|id| DisplayId(id).to_string())
                .unwrap_or_default();
            let (fresh, left) = fresh(
                &seen,
                &mut now_seen,
                &key,
                &stored.version,
                every * STALE_PERIODS,
            );
            if !fresh || report.identity.is_empty() {
                continue;
            }
            // Looked at again once it could have gone stale.
            let look = left + Duration::from_millis(100);
            next_look = Some(next_look.map_or(look, |n| n.min(look)));
            if live.len() < MAX_SHARD_MEMBERS {
                live.insert(
                    report.identity.clone(),
                    Live {
                        lease: report.lease.clone(),
                        acked: report.ring_version,
                    },
                );
            }
        }
        if !now_seen.is_empty() {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(map_key, now_seen);
        }
        let stored = runtime.read(&id).await?;
        let before: ShardMap = stored
            .as_ref()
            .and_then(|s| decode_data(s).ok())
            .unwrap_or_default();
        let mut map = ShardMap {
            controller: id.name.clone(),
            ..before.clone()
        };
        let names: Vec<&String> = live.keys().collect();
        let ring_changed = names != before.members.iter().map(|m| &m.name).collect::<Vec<_>>();
        if ring_changed {
            // Who left has its lease taken first: a paused member writes nothing more.
            for gone in before
                .members
                .iter()
                .filter(|m| !live.contains_key(&m.name))
            {
                take_lease(runtime, &tenancy, gone).await?;
            }
            map.ring_version = before.ring_version + 1;
            if before.members.is_empty() {
                // Nobody held anything: the new ring is settled at once.
                map.settled_members = live.keys().cloned().collect();
                map.settled_ring_version = map.ring_version;
            }
            tracing::info!(controller = %id.name, namespace = %DisplayId(&id), ring = map.ring_version, members = ?names, "shard ring changed");
        }
        map.members = live
            .iter()
            .map(|(name, member)| ShardMember {
                name: name.clone(),
                lease: member.lease.clone(),
                acked_ring_version: member.acked,
            })
            .collect();
        if map.settled_ring_version != map.ring_version
            && map
                .members
                .iter()
                .all(|m| m.acked_ring_version >= map.ring_version)
        {
            map.settled_members = map.members.iter().map(|m| m.name.clone()).collect();
            map.settled_ring_version = map.ring_version;
            tracing::info!(controller = %id.name, ring = map.ring_version, "every member acknowledged the ring: handed over");
        }
        if stored.is_none() || map != before {
            let mut resource = stored.unwrap_or_else(|| Resource {
                id: Some(Id {
                    uid: ulid::Ulid::new().to_string(),
                    ..id.clone()
                }),
                ..Resource::default()
            });
            resource.data = Some(proto::to_any(&map));
            resource.status.clear();
            match runtime::api::Api::write(runtime.api(), resource).await {
                Ok(_) => {}
                // Someone wrote it meanwhile: look again at what is stored now.
                Err(runtime::api::ApiError::Conflict(_)) => {
                    return Ok(Action::requeue(Duration::from_millis(50)));
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(match next_look {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }
}

/// Takes `member`'s own lease from it: holder emptied, transitions raised (compare-and-swap on
/// what was read). A lease that is gone, or unreadable, fences nothing and is left alone.
async fn take_lease(
    runtime: &Runtime,
    tenancy: &Tenancy,
    member: &ShardMember,
) -> Result<(), ReconcileError> {
    if member.lease.is_empty() {
        return Ok(());
    }
    let id = Id {
        uid: String::new(),
        name: member.lease.clone(),
        r#type: Some(resource::new_type("coordination", "v1", "Lease")),
        tenancy: Some(tenancy.clone()),
    };
    let Some(mut stored) = runtime.read(&id).await? else {
        return Ok(());
    };
    let Ok(mut lease) = decode_data::<Lease>(&stored) else {
        return Ok(());
    };
    if lease.holder.is_empty() {
        // Handed back (a clean stop): nobody writes under it.
        return Ok(());
    }
    tracing::info!(member = %member.name, lease = %member.lease, transitions = lease.transitions + 1, "a member left the ring: its lease is taken, fencing its writes");
    lease.holder.clear();
    lease.transitions = lease.transitions.saturating_add(1);
    stored.data = Some(proto::to_any(&lease));
    stored.status.clear();
    runtime::api::Api::write(runtime.api(), stored).await?;
    Ok(())
}
