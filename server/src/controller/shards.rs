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
                take_lease(runtime, &tenancy, &id.name, gone).await?;
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
    controller: &str,
    member: &ShardMember,
) -> Result<(), ReconcileError> {
    // Only the member's own lease (reports are checked for it; a map written by hand may say
    // anything): never another controller's or replica's.
    if member.lease.is_empty()
        || member.lease != runtime::report::member_name(controller, &member.name)
    {
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
    if lease.holder != member.name {
        // Handed back (a clean stop: nobody writes under it), or someone else's now.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::InProcess;
    use crate::registry::Registry;
    use crate::service::ResourceService;
    use crate::storage::inmem::InMemBackend;

    fn default_tenancy() -> Tenancy {
        Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }
    }

    fn map_id() -> Id {
        Id {
            uid: String::new(),
            name: "invoices".into(),
            r#type: Some(resource::new_type("coordination", "v1", "ShardMap")),
            tenancy: Some(default_tenancy()),
        }
    }

    async fn runtime() -> Runtime {
        let registry = Arc::new(Registry::builtin().expect("registry"));
        let service = ResourceService::new(Arc::new(InMemBackend::new()), registry);
        service.ensure_default_tenancy().await.expect("tenancy");
        Runtime::new(InProcess::privileged(Arc::new(service)))
    }

    /// A member's report (reporting every second), acknowledging `acked`.
    async fn report(runtime: &Runtime, identity: &str, acked: u64) {
        let lease = runtime::report::member_name("invoices", identity);
        let resource = Resource {
            id: Some(Id {
                uid: String::new(),
                name: runtime::report::member_name("invoices", identity),
                r#type: Some(resource::new_type("coordination", "v1", "Replica")),
                tenancy: Some(default_tenancy()),
            }),
            data: Some(proto::to_any(&Replica {
                controller: "invoices".into(),
                identity: identity.into(),
                placement: ReplicaPlacement::Sharded as i32,
                lease,
                holds_lease: true,
                managed_type: Some(resource::new_type("payments", "v1", "Invoice")),
                report_every_seconds: 1,
                ring_version: acked,
                ..Replica::default()
            })),
            ..Resource::default()
        };
        runtime.write(resource).await.expect("report");
    }

    async fn own_lease(runtime: &Runtime, identity: &str) {
        let resource = Resource {
            id: Some(Id {
                uid: ulid::Ulid::new().to_string(),
                name: runtime::report::member_name("invoices", identity),
                r#type: Some(resource::new_type("coordination", "v1", "Lease")),
                tenancy: Some(default_tenancy()),
            }),
            data: Some(proto::to_any(&Lease {
                holder: identity.into(),
                duration_seconds: 3,
                ..Lease::default()
            })),
            ..Resource::default()
        };
        runtime.write(resource).await.expect("lease");
    }

    async fn reconcile(shards: &Shards, runtime: &Runtime) -> (ShardMap, String) {
        shards
            .reconcile(runtime, Request { id: map_id() })
            .await
            .expect("reconciled");
        let stored = runtime.read(&map_id()).await.expect("read").expect("a map");
        (decode_data(&stored).expect("a ShardMap"), stored.version)
    }

    /// A member whose report goes stale leaves the ring, its own lease taken first (holder
    /// emptied, transitions raised); the ring settles once every remaining member acknowledged.
    #[tokio::test(start_paused = true)]
    async fn a_silent_member_leaves_the_ring_its_lease_taken_and_the_ring_settles_on_acks() {
        let runtime = runtime().await;
        let shards = Shards::default();
        for member in ["a", "b"] {
            own_lease(&runtime, member).await;
            report(&runtime, member, 0).await;
        }
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(map.ring_version, 1);
        assert_eq!(
            map.settled_members,
            ["a", "b"],
            "the first ring settles at once"
        );
        // a stops reporting; b goes on.
        tokio::time::advance(Duration::from_secs(2)).await;
        report(&runtime, "b", 1).await;
        tokio::time::advance(Duration::from_secs(2)).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(
            map.members
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        assert_eq!(map.ring_version, 2);
        assert_eq!(
            map.settled_ring_version, 1,
            "not settled before b acknowledges"
        );
        assert_eq!(map.settled_members, ["a", "b"]);
        let lease_id = Id {
            uid: String::new(),
            name: runtime::report::member_name("invoices", "a"),
            r#type: Some(resource::new_type("coordination", "v1", "Lease")),
            tenancy: Some(default_tenancy()),
        };
        let taken: Lease =
            decode_data(&runtime.read(&lease_id).await.expect("read").expect("lease"))
                .expect("lease");
        assert_eq!((taken.holder.as_str(), taken.transitions), ("", 1));
        report(&runtime, "b", 2).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(
            (map.settled_ring_version, map.settled_members.clone()),
            (2, vec!["b".to_owned()])
        );
    }

    /// A thousand replicas reporting at once make one ring change, of at most
    /// MAX_SHARD_MEMBERS members; reconciling again without a change writes nothing.
    #[tokio::test]
    async fn a_thousand_members_joining_at_once_make_one_bounded_ring_change() {
        let runtime = runtime().await;
        let shards = Shards::default();
        for n in 0..1000 {
            report(&runtime, &format!("member-{n:04}"), 0).await;
        }
        let (map, version) = reconcile(&shards, &runtime).await;
        assert_eq!(map.members.len(), MAX_SHARD_MEMBERS);
        assert_eq!(map.ring_version, 1);
        let (again, same) = reconcile(&shards, &runtime).await;
        assert_eq!(
            (again, same),
            (map, version),
            "nothing changed, nothing written"
        );
    }

    /// A report cannot point the server at a lease that is not the member's own: it is refused
    /// when written, and a map written by hand naming another's lease never has it taken.
    #[tokio::test(start_paused = true)]
    async fn a_member_can_have_only_its_own_lease_taken() {
        let runtime = runtime().await;
        let mut forged = Replica {
            controller: "invoices".into(),
            identity: "evil".into(),
            placement: ReplicaPlacement::Sharded as i32,
            lease: "payments-singleton".into(),
            managed_type: Some(resource::new_type("payments", "v1", "Invoice")),
            ..Replica::default()
        };
        let written = runtime
            .write(Resource {
                id: Some(Id {
                    uid: String::new(),
                    name: "evil-report".into(),
                    r#type: Some(resource::new_type("coordination", "v1", "Replica")),
                    tenancy: Some(default_tenancy()),
                }),
                data: Some(proto::to_any(&forged)),
                ..Resource::default()
            })
            .await;
        let error = written.expect_err("refused").0;
        assert!(error.contains("lease is its own"), "{error}");
        // A map (by hand) naming someone else's lease: the lease is left alone.
        forged.lease = "payments-singleton".into();
        let victim = Resource {
            id: Some(Id {
                uid: ulid::Ulid::new().to_string(),
                name: "payments-singleton".into(),
                r#type: Some(resource::new_type("coordination", "v1", "Lease")),
                tenancy: Some(default_tenancy()),
            }),
            data: Some(proto::to_any(&Lease {
                holder: "evil".into(),
                ..Lease::default()
            })),
            ..Resource::default()
        };
        runtime.write(victim).await.expect("victim lease");
        take_lease(
            &runtime,
            &default_tenancy(),
            "invoices",
            &ShardMember {
                name: "evil".into(),
                lease: "payments-singleton".into(),
                acked_ring_version: 0,
            },
        )
        .await
        .expect("nothing to do");
        let id = Id {
            uid: String::new(),
            name: "payments-singleton".into(),
            r#type: Some(resource::new_type("coordination", "v1", "Lease")),
            tenancy: Some(default_tenancy()),
        };
        let untouched: Lease =
            decode_data(&runtime.read(&id).await.expect("read").expect("lease")).expect("lease");
        assert_eq!(untouched.transitions, 0);
    }
}
