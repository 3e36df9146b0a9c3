//! A member of a `Sharded` controller (DESIGN §16, "Shards"): which of the controller's objects
//! are its own now, by the `coordination.v1.ShardMap` the server keeps ([`Shard::follow`]
//! watches it), and which ring version it has adopted — the handover's acknowledgement its
//! report carries. A reconcile runs only while its object is the member's ([`Shard::begin`]:
//! checked and counted under one lock), and the member acknowledges a ring version only once
//! no reconcile of an object that version took away is still running; the server gives such an
//! object to its new owner only after every member acknowledged, so no object is reconciled by
//! two members at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use proto::coordination::v1::ShardMap;
use proto::resource::v1::{Id, ShardSelector, Tenancy, WatchListRequest, watch_event};
use proto::shard::{ShardKey, owns};
use tokio_util::sync::CancellationToken;

use crate::api::Api;

/// One member's view of its controller's ring.
#[derive(Debug)]
pub struct Shard {
    pub controller: String,
    /// This member (its replica identity).
    pub member: String,
    /// Where the map lives (the replicas' namespace).
    pub partition: String,
    pub namespace: String,
    state: Mutex<State>,
    /// Counts changes of the map and ends of reconciles that held an acknowledgement back
    /// ([`Shard::subscribe`]): a receiver misses none between two looks.
    changes: tokio::sync::watch::Sender<u64>,
    /// Counts changes of placement only ([`Shard::subscribe_placement`]).
    placement: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    map: ShardMap,
    /// Reconciles running: a number of each -> the ring version it was checked under.
    running: HashMap<u64, (Id, u64)>,
    next: u64,
    /// The ring version last acknowledged.
    acked: u64,
    /// The ring version its map must reach before it owns anything again: a member that
    /// dropped out of the ring (paused, cut off) and took its lease back knows only an older
    /// ring ([`Shard::took_lease_back`]).
    floor: u64,
}

impl State {
    fn owns(&self, member: &str, id: &Id) -> bool {
        self.map.ring_version >= self.floor && owns(&self.map, member, &ShardKey::of(id))
    }

    /// The latest ring version no running reconcile holds back.
    fn acknowledgeable(&mut self, member: &str) -> u64 {
        let now = self.map.ring_version;
        let behind = self
            .running
            .values()
            .any(|(id, checked)| *checked < now && !owns(&self.map, member, &ShardKey::of(id)));
        if !behind {
            self.acked = now;
        }
        self.acked
    }
}

/// A reconcile in flight, counted until dropped.
pub struct Running {
    shard: Arc<Shard>,
    number: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let ended = {
            let mut state = self.shard.state.lock().unwrap_or_else(|p| p.into_inner());
            state.running.remove(&self.number);
            state.map.ring_version > state.acked
        };
        if ended {
            // What held the acknowledgement back may be done: say so at once.
            self.shard.changed();
        }
    }
}

impl Shard {
    pub fn new(controller: &str, member: &str, partition: &str, namespace: &str) -> Arc<Shard> {
        Arc::new(Shard {
            controller: controller.to_owned(),
            member: member.to_owned(),
            partition: partition.to_owned(),
            namespace: namespace.to_owned(),
            state: Mutex::default(),
            changes: tokio::sync::watch::Sender::new(0),
            placement: tokio::sync::watch::Sender::new(0),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a watch of the member's objects asks the server for.
    pub fn selector(&self) -> ShardSelector {
        ShardSelector {
            controller: self.controller.clone(),
            member: self.member.clone(),
            partition: self.partition.clone(),
            namespace: self.namespace.clone(),
        }
    }

    /// Whether `id` is this member's now.
    pub fn owns(&self, id: &Id) -> bool {
        self.state().owns(&self.member, id)
    }

    /// The member took its lease back from the server, which took it when the member dropped
    /// out of the ring (called as it is taken, before the member leads again): whatever ring it
    /// knows is older than the one it left, so it owns nothing until it sees a newer one.
    pub fn took_lease_back(&self) {
        let mut state = self.state();
        state.floor = state.map.ring_version + 1;
        tracing::info!(controller = %self.controller, floor = state.floor, "this member took its lease back after leaving the ring: it owns nothing until it sees a newer ring");
    }

    /// A reconcile of `id` may start (it is this member's under the ring it knows): counted
    /// until the returned value is dropped. `None`: not this member's.
    pub fn begin(self: &Arc<Self>, id: &Id) -> Option<Running> {
        let mut state = self.state();
        if !state.owns(&self.member, id) {
            return None;
        }
        let number = state.next;
        state.next += 1;
        let ring = state.map.ring_version;
        state.running.insert(number, (id.clone(), ring));
        Some(Running {
            shard: self.clone(),
            number,
        })
    }

    /// The ring version this member acknowledges now (its report carries it).
    pub fn acknowledged(&self) -> u64 {
        let member = self.member.clone();
        self.state().acknowledgeable(&member)
    }

    /// The ring as last seen: its version and how many members it has, and whether this member
    /// is one.
    pub fn ring(&self) -> (u64, usize, bool) {
        let state = self.state();
        (
            state.map.ring_version,
            state.map.members.len(),
            state.map.members.iter().any(|m| m.name == self.member),
        )
    }

    /// Changes of the map, and of what holds an acknowledgement back, from now on: the
    /// receiver's `changed()` resolves once per look after any number of them.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    /// A map as read: one older than the map known (a server behind the one read before) is
    /// ignored; `None` (deleted) leaves the member owning nothing, at the ring it knew.
    pub(crate) fn set_map(&self, map: Option<ShardMap>) {
        let placement_changed = {
            let mut state = self.state();
            let map = map.unwrap_or_else(|| ShardMap {
                ring_version: state.map.ring_version,
                ..ShardMap::default()
            });
            if map.ring_version < state.map.ring_version {
                tracing::debug!(controller = %self.controller, ring = map.ring_version, known = state.map.ring_version, "an older shard map; ignored");
                return;
            }
            tracing::debug!(controller = %self.controller, ring = map.ring_version, settled = map.settled_ring_version, members = map.members.len(), "shard map");
            let changed = !proto::shard::same_placement(&state.map, &map)
                || (state.map.ring_version < state.floor && map.ring_version >= state.floor);
            state.map = map;
            changed
        };
        if placement_changed {
            self.placement
                .send_modify(|count| *count = count.wrapping_add(1));
        }
        self.changed();
    }

    /// Changes of which objects this member owns: the runner queues what it now owns again.
    pub fn subscribe_placement(&self) -> tokio::sync::watch::Receiver<u64> {
        self.placement.subscribe()
    }

    /// Follows the controller's ShardMap until `shutdown`: a watch of it, opened again (after a
    /// pause that doubles up to 5 s) whenever it ends.
    pub async fn follow<A: Api>(self: Arc<Self>, api: A, shutdown: CancellationToken) {
        let mut pause = Duration::from_millis(200);
        loop {
            let request = WatchListRequest {
                r#type: Some(proto::resource::v1::Type {
                    group: "coordination".into(),
                    group_version: "v1".into(),
                    kind: "ShardMap".into(),
                }),
                tenancy: Some(Tenancy {
                    partition: self.partition.clone(),
                    namespace: self.namespace.clone(),
                }),
                name_prefix: self.controller.clone(),
                ..WatchListRequest::default()
            };
            match api.watch(request).await {
                Ok(mut stream) => loop {
                    let event = tokio::select! {
                        () = shutdown.cancelled() => return,
                        event = stream.next() => event,
                    };
                    let Some(Ok(event)) = event else {
                        break;
                    };
                    let (resource, deleted) = match event.event {
                        Some(watch_event::Event::Upsert(upsert)) => (upsert.resource, false),
                        Some(watch_event::Event::Delete(delete)) => (delete.resource, true),
                        _ => continue,
                    };
                    let Some(resource) = resource
                        .filter(|r| r.id.as_ref().is_some_and(|id| id.name == self.controller))
                    else {
                        continue;
                    };
                    pause = Duration::from_millis(200);
                    let map = if deleted {
                        None
                    } else {
                        Some(
                            resource
                                .data
                                .as_ref()
                                .and_then(|data| {
                                    <ShardMap as prost::Message>::decode(data.value.as_slice()).ok()
                                })
                                .unwrap_or_default(),
                        )
                    };
                    self.set_map(map);
                },
                Err(error) => {
                    tracing::debug!(controller = %self.controller, %error, "cannot watch the shard map; trying again");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::coordination::v1::ShardMember;

    fn invoice(name: &str) -> Id {
        Id {
            uid: String::new(),
            name: name.into(),
            r#type: Some(proto::resource::v1::Type {
                group: "payments".into(),
                group_version: "v1".into(),
                kind: "Invoice".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "billing".into(),
            }),
        }
    }

    fn ring(members: &[&str], version: u64, settled: &[&str], settled_version: u64) -> ShardMap {
        ShardMap {
            controller: "invoices".into(),
            members: members
                .iter()
                .map(|m| ShardMember {
                    name: (*m).into(),
                    lease: String::new(),
                    acked_ring_version: 0,
                })
                .collect(),
            ring_version: version,
            settled_members: settled.iter().map(|s| (*s).to_owned()).collect(),
            settled_ring_version: settled_version,
            managed_type: None,
        }
    }

    /// A member acknowledges a ring that took an object from it only once the reconcile of that
    /// object (started under the earlier ring) has ended; reconciles of what it keeps do not
    /// hold the acknowledgement back, and nothing it no longer owns may start.
    #[test]
    fn a_ring_is_acknowledged_once_no_reconcile_of_what_it_took_is_running() {
        let shard = Shard::new("invoices", "a", "default", "billing");
        shard.set_map(Some(ring(&["a"], 1, &["a"], 1)));
        assert_eq!(shard.acknowledged(), 1);
        let names: Vec<String> = (0..64).map(|n| format!("invoice-{n}")).collect();
        let mut running: Vec<(String, Running)> = names
            .iter()
            .map(|name| (name.clone(), shard.begin(&invoice(name)).expect("all a's")))
            .collect();
        // b joins: what b now owns leaves a at once.
        shard.set_map(Some(ring(&["a", "b"], 2, &["a"], 1)));
        let leaving: Vec<&String> = names
            .iter()
            .filter(|name| !shard.owns(&invoice(name)))
            .collect();
        assert!(!leaving.is_empty() && leaving.len() < names.len());
        assert!(
            shard.begin(&invoice(leaving[0])).is_none(),
            "no new reconcile of a leaver"
        );
        assert_eq!(
            shard.acknowledged(),
            1,
            "held back by the leavers in flight"
        );
        // The reconciles of kept objects end: still held back.
        running.retain(|(name, _)| leaving.contains(&name));
        assert_eq!(shard.acknowledged(), 1);
        running.clear();
        assert_eq!(shard.acknowledged(), 2);
        // A reconcile of a kept object started under ring 2 does not hold ring 3 back unless
        // ring 3 takes it.
        let kept = names
            .iter()
            .find(|name| shard.owns(&invoice(name)))
            .expect("a keeps some");
        let _still = shard.begin(&invoice(kept)).expect("a's");
        shard.set_map(Some(ring(&["a", "b"], 3, &["a", "b"], 3)));
        assert_eq!(shard.acknowledged(), 3);
    }

    /// A member that took its lease back from the server (it had dropped out of the ring:
    /// paused, cut off) owns nothing until it sees a newer ring than it knew; a map older than
    /// the one known (a server behind) is ignored; a deleted map leaves it owning nothing.
    #[test]
    fn a_member_back_from_outside_the_ring_owns_nothing_until_it_sees_a_newer_one() {
        let shard = Shard::new("invoices", "a", "default", "billing");
        shard.set_map(Some(ring(&["a"], 1, &["a"], 1)));
        assert!(shard.begin(&invoice("x")).is_some());
        shard.took_lease_back();
        assert!(shard.begin(&invoice("x")).is_none(), "its ring 1 is stale");
        shard.set_map(Some(ring(&["a"], 0, &["a"], 0)));
        assert!(
            shard.begin(&invoice("x")).is_none(),
            "an older map is ignored"
        );
        shard.set_map(Some(ring(&["b"], 2, &["b"], 2)));
        assert!(shard.begin(&invoice("x")).is_none(), "the ring without it");
        shard.set_map(Some(ring(&["a"], 3, &["a"], 3)));
        assert!(shard.begin(&invoice("x")).is_some(), "back in a newer ring");
        shard.set_map(None);
        assert!(!shard.owns(&invoice("x")), "deleted: nothing");
        shard.set_map(Some(ring(&["a"], 2, &["a"], 2)));
        assert!(!shard.owns(&invoice("x")), "older than what it knew");
    }
}
