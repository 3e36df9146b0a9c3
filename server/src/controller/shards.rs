//! The `shards` controller (DESIGN §16, "Shards"): keeps each sharded controller's
//! `coordination.v1.ShardMap` from its members' `coordination.v1.Replica` reports. A member is
//! in the ring while its report is fresh (changed within three of its periods, timed on this
//! node's clock from when it saw each version: clocks are never compared). When the members
//! change, the ring version rises and the last settled ring is kept until every member's report
//! acknowledges the new one; then it settles. A member that drops out has its own lease taken
//! from it first (its holder marked [`proto::shard::LEFT_THE_RING`], its transitions raised), so
//! a member that was only paused has every later write refused `FENCED` before its objects can
//! reach anyone else.

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
        // A controller whose name cannot name a ShardMap has none (nothing to retry).
        if data.placement() != ReplicaPlacement::Sharded
            || resource::check_name(&data.controller, resource::MAX_NAME_LEN).is_err()
        {
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

/// What this node remembers of each map between reconciles (the memory is the live reports').
#[derive(Default)]
pub(crate) struct Shards {
    seen: Mutex<HashMap<String, Remembered>>,
}

/// A map's reports as seen, and since when its ring has waited for acknowledgements.
#[derive(Default)]
struct Remembered {
    /// Report key -> (version, when first seen, whether seen to change under this clock).
    reports: HashMap<String, (String, tokio::time::Instant, bool)>,
    /// The ring version waiting to settle, and since when.
    unsettled: Option<(u64, tokio::time::Instant)>,
    /// Members taken out for not acknowledging a ring: kept out until their report
    /// acknowledges it (a member whose reconcile hangs does not come straight back).
    evicted: HashMap<String, u64>,
}

/// How many report periods a ring may wait for a member's acknowledgement before the member
/// is taken out of it (a reconcile that hangs, a member paused with a long period).
const ACK_PERIODS: u32 = 10;

/// A report as this node's clock judges it.
struct Judged {
    /// Changed within three periods.
    fresh: bool,
    /// Seen to change at least once under this clock (a node that just became leader does not
    /// let a report it has never seen change bring a member into the ring: it may be a dead
    /// member's last).
    confirmed: bool,
    /// How long until it would no longer count as fresh.
    left: Duration,
}

fn judge(
    before: &Remembered,
    now_seen: &mut Remembered,
    key: &str,
    version: &str,
    fresh_for: Duration,
) -> Judged {
    let now = tokio::time::Instant::now();
    let (since, confirmed) = match before.reports.get(key) {
        Some((seen, at, confirmed)) if seen == version => (*at, *confirmed),
        Some(_) => (now, true),
        None => (now, false),
    };
    now_seen
        .reports
        .insert(key.to_owned(), (version.to_owned(), since, confirmed));
    let age = now.duration_since(since);
    Judged {
        fresh: age <= fresh_for,
        confirmed,
        left: fresh_for.saturating_sub(age),
    }
}

/// One live member as its report says.
struct Live {
    lease: String,
    acked: u64,
    every: Duration,
}

fn unversioned(t: &proto::resource::v1::Type) -> (&str, &str) {
    (t.group.as_str(), t.kind.as_str())
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
        let stored = runtime.read(&id).await?;
        let before: ShardMap = stored
            .as_ref()
            .and_then(|s| decode_data(s).ok())
            .unwrap_or_default();
        let map_key = DisplayId(&id).to_string();
        let remembered = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&map_key)
            .unwrap_or_default();
        let mut now_seen = Remembered {
            reports: HashMap::new(),
            unsettled: remembered.unsettled,
            evicted: HashMap::new(),
        };
        // The type the ring reconciles: the map's, else the first member's (by identity).
        let mut managed = before.managed_type.clone();
        // The members whose reports are fresh, by identity, and when to look again.
        let mut live: BTreeMap<String, Live> = BTreeMap::new();
        let mut types: BTreeMap<String, proto::resource::v1::Type> = BTreeMap::new();
        let mut next_look: Option<Duration> = None;
        let mut highest_ack = 0;
        for stored in &reports {
            let Ok(report) = decode_data::<Replica>(stored) else {
                continue;
            };
            if report.placement() != ReplicaPlacement::Sharded || report.controller != id.name {
                continue;
            }
            highest_ack = highest_ack.max(report.ring_version);
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
            let judged = judge(
                &remembered,
                &mut now_seen,
                &key,
                &stored.version,
                every * STALE_PERIODS,
            );
            let member = before.members.iter().any(|m| m.name == report.identity);
            // Looked at again once it could have gone stale, or changed (to be confirmed).
            let look = if judged.fresh && !judged.confirmed {
                every
            } else {
                judged.left + Duration::from_millis(100)
            };
            next_look = Some(next_look.map_or(look, |n| n.min(look)));
            // A member is its report's identity holding its own lease, fresh (and, to join,
            // seen to report under this clock).
            if let Some(ring) = remembered.evicted.get(&report.identity)
                && report.ring_version < *ring
            {
                now_seen.evicted.insert(report.identity.clone(), *ring);
                continue;
            }
            if !judged.fresh
                || report.identity.is_empty()
                || !report.holds_lease
                || !(member || judged.confirmed)
            {
                continue;
            }
            if let Some(managed_type) = report.managed_type {
                types.insert(report.identity.clone(), managed_type);
            }
            live.insert(
                report.identity.clone(),
                Live {
                    lease: report.lease.clone(),
                    acked: report.ring_version,
                    every,
                },
            );
        }
        if managed.is_none() {
            managed = types.values().next().cloned();
        }
        // Only members of the ring's type (another team naming the same controller stays out),
        // at most MAX_SHARD_MEMBERS, by identity.
        live.retain(|identity, _| {
            types.get(identity).map(unversioned) == managed.as_ref().map(unversioned)
        });
        while live.len() > MAX_SHARD_MEMBERS {
            live.pop_last();
        }
        // A ring that waited too long for a member's acknowledgement goes on without it.
        if let Some((ring, since)) = now_seen.unsettled
            && ring == before.ring_version
            && before.settled_ring_version != before.ring_version
        {
            let waited = tokio::time::Instant::now().duration_since(since);
            let evicted = &mut now_seen.evicted;
            live.retain(|identity, member| {
                let late = member.acked < ring && waited > member.every * ACK_PERIODS;
                if late {
                    tracing::warn!(controller = %id.name, member = %identity, ring, ?waited, "a member did not acknowledge the ring in time: it leaves the ring until it does");
                    evicted.insert(identity.clone(), ring);
                }
                !late
            });
        }
        let mut map = ShardMap {
            controller: id.name.clone(),
            managed_type: managed.clone(),
            ..before.clone()
        };
        let names: Vec<&String> = live.keys().collect();
        let ring_changed = names != before.members.iter().map(|m| &m.name).collect::<Vec<_>>();
        if stored.is_none() && live.is_empty() {
            // Nothing to place (a report gone, another's controller): no map.
            self.remember(map_key, now_seen);
            return Ok(next_look.map_or(Action::await_change(), Action::requeue));
        }
        if ring_changed {
            // Who left has its lease taken first: a paused member writes nothing more.
            for gone in before
                .members
                .iter()
                .filter(|m| !live.contains_key(&m.name))
            {
                take_lease(runtime, &tenancy, &id.name, gone).await?;
            }
            // Past every version any member acknowledged (a map deleted and made again never
            // reuses one).
            map.ring_version = before.ring_version.max(highest_ack) + 1;
            if stored.is_none() && highest_ack == 0 {
                // A new ring where nobody held anything: settled at once.
                map.settled_members = live.keys().cloned().collect();
                map.settled_ring_version = map.ring_version;
            }
            now_seen.unsettled = Some((map.ring_version, tokio::time::Instant::now()));
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
            now_seen.unsettled = None;
            tracing::info!(controller = %id.name, ring = map.ring_version, "every member acknowledged the ring: handed over");
        }
        self.remember(map_key, now_seen);
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
        // An unsettled ring is looked at again when a late member would be due out.
        let pending = (map.settled_ring_version != map.ring_version).then(|| {
            live.values()
                .map(|m| m.every * ACK_PERIODS)
                .max()
                .unwrap_or(Duration::from_secs(10))
        });
        let next = match (next_look, pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(next.map_or(Action::await_change(), Action::requeue))
    }
}

impl Shards {
    fn remember(&self, map_key: String, now_seen: Remembered) {
        if !now_seen.reports.is_empty()
            || now_seen.unsettled.is_some()
            || !now_seen.evicted.is_empty()
        {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(map_key, now_seen);
        }
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
    // Not emptied: the member waits out a whole lease before taking it back (its view of the
    // ring catches up meanwhile), and knows from this holder that its view is older.
    lease.holder = proto::shard::LEFT_THE_RING.to_owned();
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

    fn members(map: &ShardMap) -> Vec<&str> {
        map.members.iter().map(|m| m.name.as_str()).collect()
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
        // Reports this node has not seen change bring nobody in (they may be the dead's last).
        shards
            .reconcile(&runtime, Request { id: map_id() })
            .await
            .expect("reconciled");
        assert!(runtime.read(&map_id()).await.expect("read").is_none());
        for member in ["a", "b"] {
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
        assert_eq!(members(&map), ["b"]);
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
        assert_eq!(
            (taken.holder.as_str(), taken.transitions),
            (proto::shard::LEFT_THE_RING, 1)
        );
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
        shards
            .reconcile(&runtime, Request { id: map_id() })
            .await
            .expect("reconciled");
        for n in 0..1000 {
            report(&runtime, &format!("member-{n:04}"), 0).await;
        }
        let (map, version) = reconcile(&shards, &runtime).await;
        assert_eq!(map.members.len(), MAX_SHARD_MEMBERS);
        assert_eq!(map.members[0].name, "member-0000", "the first by identity");
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
        let forged = Replica {
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
                    name: runtime::report::member_name("invoices", "evil"),
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

    /// A member killed mid-handover (the ring waits for its acknowledgement) leaves the ring
    /// once its report is stale; one that never acknowledges is taken out after ten periods;
    /// the ring then settles on the others' acknowledgements, its version past every one
    /// acknowledged.
    #[tokio::test(start_paused = true)]
    async fn a_member_killed_mid_handover_or_never_acknowledging_leaves_and_the_ring_settles() {
        let runtime = runtime().await;
        let shards = Shards::default();
        for member in ["a", "b", "c"] {
            own_lease(&runtime, member).await;
        }
        let both = |members: &'static [&'static str], acked: u64| {
            let runtime = &runtime;
            async move {
                for member in members {
                    report(runtime, member, acked).await;
                }
            }
        };
        both(&["a"], 0).await;
        let _ = shards.reconcile(&runtime, Request { id: map_id() }).await;
        both(&["a"], 0).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!((map.ring_version, map.settled_ring_version), (1, 1));
        // b and c join: ring 2 waits for a, b and c.
        both(&["a", "b", "c"], 1).await;
        let _ = shards.reconcile(&runtime, Request { id: map_id() }).await;
        both(&["a", "b", "c"], 1).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!((map.ring_version, map.settled_ring_version), (2, 1));
        // a is killed before acknowledging; b acknowledges; c never does.
        tokio::time::advance(Duration::from_secs(2)).await;
        both(&["b"], 2).await;
        both(&["c"], 1).await;
        tokio::time::advance(Duration::from_secs(2)).await;
        both(&["b"], 2).await;
        both(&["c"], 1).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(members(&map), ["b", "c"]);
        assert_eq!(map.ring_version, 3, "a left");
        assert_ne!(map.settled_ring_version, 3, "c has not acknowledged");
        // c goes on reporting without acknowledging: after ten periods it is taken out.
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(1)).await;
            both(&["b"], 3).await;
            both(&["c"], 1).await;
        }
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(members(&map), ["b"]);
        assert_eq!(map.ring_version, 4);
        both(&["b"], 4).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(
            (map.settled_ring_version, map.settled_members.clone()),
            (4, vec!["b".to_owned()])
        );
        // The map deleted by hand and made again: its ring is past every acknowledgement, and
        // it does not settle before they acknowledge it.
        runtime.delete(&map_id()).await.expect("deleted");
        both(&["b"], 4).await;
        let (map, _) = reconcile(&shards, &runtime).await;
        assert_eq!(map.ring_version, 5);
        assert_ne!(map.settled_ring_version, 5);
    }
}
