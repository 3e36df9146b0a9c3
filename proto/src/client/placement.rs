//! The placement map: every controller against every node (where it runs, its queue depth, its
//! last error), folded from `ListControllers(all_nodes)`. `resctl controllers`, `resctl delete
//! --wait` and the dashboard all read controllers through it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::cluster::v1::{ListControllersResponse, Placement};
use crate::codec::gvk;

/// One controller on one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControllerOnNode {
    pub node_id: u64,
    pub running: bool,
    pub queue_depth: u64,
    pub reconciles_ok: u64,
    pub reconciles_failed: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    /// RFC 3339, empty before the first reconcile.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_reconcile: String,
}

/// One replica of a controller running outside the server (DESIGN §16).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaView {
    pub identity: String,
    pub host: String,
    /// `partition/namespace` of its report and Lease.
    pub tenancy: String,
    /// Whether it reconciles now (holds the lease, or every replica runs).
    pub running: bool,
    pub holds_lease: bool,
    /// Its report stopped changing: the replica is probably gone.
    pub stale: bool,
    pub queue_depth: u64,
    pub reconciles_ok: u64,
    pub reconciles_failed: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub last_error: String,
    /// A member of a sharded controller: its place in the ring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardView>,
}

/// A sharded controller's member in its ShardMap (DESIGN §16).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardView {
    pub in_ring: bool,
    pub members: u32,
    pub ring_version: u64,
    pub acked_ring_version: u64,
    /// Every member acknowledged the current ring: no object waits for its new owner.
    pub settled: bool,
}

impl ReplicaView {
    /// Where the replica stands, in words: stale, its shard (in the ring of N, handing over,
    /// joining), holds the lease, running, or waiting.
    pub fn state_label(&self) -> String {
        if self.stale {
            return "stale (no report)".into();
        }
        if let Some(shard) = &self.shard {
            return if !self.holds_lease {
                "sharded, without its lease".into()
            } else if !shard.in_ring {
                "joining the ring".into()
            } else if shard.acked_ring_version < shard.ring_version {
                format!(
                    "sharded 1/{}, handing over (ring {}, acknowledged {})",
                    shard.members, shard.ring_version, shard.acked_ring_version
                )
            } else if !shard.settled {
                format!(
                    "sharded 1/{}, ring {} settling",
                    shard.members, shard.ring_version
                )
            } else {
                format!("sharded 1/{} (ring {})", shard.members, shard.ring_version)
            };
        }
        if self.holds_lease {
            "holds the lease"
        } else if self.running {
            "running"
        } else {
            "waiting for the lease"
        }
        .into()
    }
}

/// One controller on every node that reported it (or, for a controller outside the server,
/// every replica that reports).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControllerPlacement {
    pub name: String,
    /// `group.version.kind` of the type it reconciles.
    pub managed_type: String,
    pub placement: String,
    /// The finalizers it adds and releases.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
    pub nodes: Vec<ControllerOnNode>,
    /// For a controller outside the server: its replicas (and no nodes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaView>,
}

impl ControllerPlacement {
    /// The nodes it runs on (a singleton's standbys are left out).
    pub fn running(&self) -> impl Iterator<Item = &ControllerOnNode> {
        self.nodes.iter().filter(|node| node.running)
    }

    /// Where it stands on `node_id`, if that node reported it.
    pub fn on(&self, node_id: u64) -> Option<&ControllerOnNode> {
        self.nodes.iter().find(|node| node.node_id == node_id)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlacementMap {
    /// Sorted by name.
    pub controllers: Vec<ControllerPlacement>,
    /// Nodes that could not be asked, with why.
    pub unreachable: BTreeMap<u64, String>,
    /// Every node asked, sorted.
    pub node_ids: Vec<u64>,
}

impl PlacementMap {
    /// The controllers that reconcile resources of type `gvk` (what releases their finalizers).
    pub fn managing<'a>(&'a self, gvk: &'a str) -> impl Iterator<Item = &'a ControllerPlacement> {
        self.controllers
            .iter()
            .filter(move |controller| controller.managed_type == gvk)
    }

    /// The controllers that release `finalizer` (they declared it).
    pub fn releasing<'a>(
        &'a self,
        finalizer: &'a str,
    ) -> impl Iterator<Item = &'a ControllerPlacement> {
        self.controllers
            .iter()
            .filter(move |controller| controller.finalizers.iter().any(|f| f == finalizer))
    }

    /// For pending `finalizers`: one line per node where a controller that releases one runs
    /// ("demo-album releases demo.resd.io/album-cleanup, on node 1 (running, queue 0)"), and
    /// the finalizers no controller releases (only a person can remove those).
    pub fn release_labels(&self, finalizers: &[String]) -> (Vec<String>, Vec<String>) {
        let mut labels = Vec::new();
        let mut unowned = Vec::new();
        for finalizer in finalizers {
            let mut owners = self.releasing(finalizer).peekable();
            if owners.peek().is_none() {
                unowned.push(finalizer.clone());
            }
            for controller in owners {
                if !controller.replicas.is_empty() {
                    labels.extend(replica_labels(
                        controller,
                        &format!("releases {finalizer}, "),
                    ));
                    continue;
                }
                let running: Vec<&ControllerOnNode> = controller.running().collect();
                if running.is_empty() {
                    labels.push(format!(
                        "{} releases {finalizer}, but runs on no node right now (no leader?)",
                        controller.name
                    ));
                }
                for node in running {
                    let mut line = format!(
                        "{} releases {finalizer}, on node {} (running, queue {})",
                        controller.name, node.node_id, node.queue_depth
                    );
                    if !node.last_error.is_empty() {
                        line.push_str(&format!(", last error: {}", node.last_error));
                    }
                    labels.push(line);
                }
            }
        }
        (labels, unowned)
    }

    /// One line per node where a controller of type `gvk` runs: "name on node N (running,
    /// queue Q)" plus its last error.
    pub fn running_labels(&self, gvk: &str) -> Vec<String> {
        let mut labels = Vec::new();
        for controller in self.managing(gvk) {
            if !controller.replicas.is_empty() {
                labels.extend(replica_labels(controller, ""));
                continue;
            }
            for node in controller.running() {
                let mut line = format!(
                    "{} on node {} (running, queue {})",
                    controller.name, node.node_id, node.queue_depth
                );
                if !node.last_error.is_empty() {
                    line.push_str(&format!(", last error: {}", node.last_error));
                }
                labels.push(line);
            }
        }
        labels
    }
}

/// Where the replicas of an external controller that run stand: "invoices releases F, in
/// replica r1 on host-1 (holds the lease, queue 0)", or that none runs.
fn replica_labels(controller: &ControllerPlacement, doing: &str) -> Vec<String> {
    let running: Vec<&ReplicaView> = controller.replicas.iter().filter(|r| r.running).collect();
    if running.is_empty() {
        return vec![format!(
            "{} {doing}but none of its {} replica(s) outside the server runs right now",
            controller.name,
            controller.replicas.len()
        )];
    }
    running
        .into_iter()
        .map(|replica| {
            let mut line = format!(
                "{} {doing}in replica {} on {} (outside the server, {}queue {})",
                controller.name,
                replica.identity,
                replica.host,
                if replica.shard.is_some() {
                    format!("{}, ", replica.state_label())
                } else if replica.holds_lease {
                    "holds the lease, ".to_owned()
                } else {
                    String::new()
                },
                replica.queue_depth
            );
            if !replica.last_error.is_empty() {
                line.push_str(&format!(", last error: {}", replica.last_error));
            }
            line
        })
        .collect()
}

pub fn placement_label(placement: i32) -> &'static str {
    match Placement::try_from(placement) {
        Ok(Placement::Singleton) => "singleton",
        Ok(Placement::EachServer) => "each-server",
        Ok(Placement::EachReplica) => "each-replica",
        Ok(Placement::Sharded) => "sharded",
        _ => "unspecified",
    }
}

/// A controller's entry in the map, before its nodes or replicas are added.
fn entry_of(
    controller: &crate::cluster::v1::ControllerInfo,
    placement: String,
) -> ControllerPlacement {
    ControllerPlacement {
        name: controller.name.clone(),
        managed_type: controller
            .managed_type
            .as_ref()
            .map(gvk)
            .unwrap_or_default(),
        placement,
        finalizers: controller.finalizers.clone(),
        nodes: Vec::new(),
        replicas: Vec::new(),
    }
}

pub fn placement_map(response: &ListControllersResponse) -> PlacementMap {
    let mut controllers: BTreeMap<String, ControllerPlacement> = BTreeMap::new();
    let mut unreachable = BTreeMap::new();
    let mut node_ids = Vec::new();
    for node in &response.nodes {
        node_ids.push(node.node_id);
        if !node.error.is_empty() {
            unreachable.insert(node.node_id, node.error.clone());
        }
        for controller in &node.controllers {
            let entry = controllers
                .entry(controller.name.clone())
                .or_insert_with(|| {
                    entry_of(controller, placement_label(controller.placement).to_owned())
                });
            entry.nodes.push(ControllerOnNode {
                node_id: node.node_id,
                running: controller.running,
                queue_depth: controller.queue_depth,
                reconciles_ok: controller.reconciles_ok,
                reconciles_failed: controller.reconciles_failed,
                last_error: controller.last_error.clone(),
                last_reconcile: controller
                    .last_reconcile
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
            });
        }
    }
    // Controllers outside the server, keyed apart from the built-in ones of the same name.
    for external in &response.external {
        let Some(controller) = &external.controller else {
            continue;
        };
        let entry = controllers
            .entry(format!("\u{10ffff}{}", controller.name))
            .or_insert_with(|| {
                entry_of(
                    controller,
                    format!("{} (external)", placement_label(controller.placement)),
                )
            });
        entry.replicas.push(ReplicaView {
            identity: external.identity.clone(),
            host: external.host.clone(),
            tenancy: external
                .tenancy
                .as_ref()
                .map(|t| format!("{}/{}", t.partition, t.namespace))
                .unwrap_or_default(),
            running: controller.running,
            holds_lease: external.holds_lease,
            stale: external.stale,
            queue_depth: controller.queue_depth,
            reconciles_ok: controller.reconciles_ok,
            reconciles_failed: controller.reconciles_failed,
            last_error: controller.last_error.clone(),
            shard: external.shard.as_ref().map(|place| ShardView {
                in_ring: place.in_ring,
                members: place.members,
                ring_version: place.ring_version,
                acked_ring_version: place.acked_ring_version,
                settled: place.settled,
            }),
        });
    }
    node_ids.sort_unstable();
    for controller in controllers.values_mut() {
        controller
            .replicas
            .sort_by(|a, b| a.identity.cmp(&b.identity));
        controller.nodes.sort_by_key(|node| node.node_id);
    }
    PlacementMap {
        controllers: controllers.into_values().collect(),
        unreachable,
        node_ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::v1::{ControllerInfo, NodeControllers};
    use crate::resource::v1::Type;

    pub(super) fn info(name: &str, kind: &str, running: bool, queue: u64) -> ControllerInfo {
        ControllerInfo {
            name: name.into(),
            managed_type: Some(Type {
                group: "demo".into(),
                group_version: "v2".into(),
                kind: kind.into(),
            }),
            placement: Placement::Singleton as i32,
            running,
            queue_depth: queue,
            ..Default::default()
        }
    }

    #[test]
    fn folds_nodes_into_controllers_and_names_where_each_runs() {
        let response = ListControllersResponse {
            nodes: vec![
                NodeControllers {
                    node_id: 2,
                    api_addr: "b".into(),
                    controllers: vec![info("album", "Album", false, 0)],
                    error: String::new(),
                },
                NodeControllers {
                    node_id: 1,
                    api_addr: "a".into(),
                    controllers: vec![
                        info("album", "Album", true, 3),
                        info("artist", "Artist", true, 0),
                    ],
                    error: String::new(),
                },
                NodeControllers {
                    node_id: 3,
                    api_addr: "c".into(),
                    controllers: Vec::new(),
                    error: "connection refused".into(),
                },
            ],
            external: Vec::new(),
        };
        let map = placement_map(&response);
        assert_eq!(map.node_ids, vec![1, 2, 3]);
        assert_eq!(
            map.unreachable.get(&3).map(String::as_str),
            Some("connection refused")
        );
        let names: Vec<&str> = map.controllers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["album", "artist"]);
        let album = &map.controllers[0];
        assert_eq!(album.managed_type, "demo.v2.Album");
        assert_eq!(album.placement, "singleton");
        assert_eq!(
            album.nodes.iter().map(|n| n.node_id).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(album.on(2).is_some_and(|node| !node.running));
        assert_eq!(
            map.running_labels("demo.v2.Album"),
            ["album on node 1 (running, queue 3)"]
        );
        assert!(map.running_labels("demo.v1.Album").is_empty());
    }
}

#[cfg(test)]
mod finalizer_tests {
    use super::*;
    use crate::cluster::v1::{ControllerInfo, NodeControllers};

    #[test]
    fn blame_goes_by_finalizer_not_by_type() {
        let album = |running| ControllerInfo {
            name: "demo-album".into(),
            placement: Placement::Singleton as i32,
            running,
            finalizers: vec!["demo.resd.io/album-cleanup".into()],
            ..Default::default()
        };
        let map = placement_map(&ListControllersResponse {
            nodes: vec![
                NodeControllers {
                    node_id: 1,
                    api_addr: "a".into(),
                    controllers: vec![album(true)],
                    error: String::new(),
                },
                NodeControllers {
                    node_id: 2,
                    api_addr: "b".into(),
                    controllers: vec![album(false)],
                    error: String::new(),
                },
            ],
            external: Vec::new(),
        });
        let (labels, unowned) = map.release_labels(&[
            "demo.resd.io/album-cleanup".into(),
            "ops.example.com/hold".into(),
        ]);
        assert_eq!(
            labels,
            ["demo-album releases demo.resd.io/album-cleanup, on node 1 (running, queue 0)"]
        );
        assert_eq!(unowned, ["ops.example.com/hold"]);
        assert_eq!(map.releasing("ops.example.com/hold").count(), 0);
    }

    /// A sharded controller's members say their place in the ring: settled, handing over,
    /// joining, and which of them blame names for a finalizer.
    #[test]
    fn sharded_members_say_their_place_in_the_ring() {
        use crate::cluster::v1::{ExternalReplica, ShardPlace};
        let member = |identity: &str, place: ShardPlace| ExternalReplica {
            controller: Some(ControllerInfo {
                placement: Placement::Sharded as i32,
                running: place.in_ring,
                finalizers: vec!["payments.example.com/receipt".into()],
                ..tests::info("invoices", "Invoice", true, 0)
            }),
            identity: identity.into(),
            host: "host".into(),
            holds_lease: true,
            shard: Some(place),
            ..Default::default()
        };
        let place = |in_ring, ring_version, acked_ring_version, settled| ShardPlace {
            in_ring,
            members: 3,
            ring_version,
            acked_ring_version,
            settled,
        };
        let response = ListControllersResponse {
            nodes: Vec::new(),
            external: vec![
                member("r1", place(true, 4, 4, true)),
                member("r2", place(true, 5, 4, false)),
                member("r3", place(false, 5, 5, false)),
            ],
        };
        let map = placement_map(&response);
        let controller = &map.controllers[0];
        assert_eq!(controller.placement, "sharded (external)");
        let labels: Vec<String> = controller
            .replicas
            .iter()
            .map(ReplicaView::state_label)
            .collect();
        assert_eq!(
            labels,
            [
                "sharded 1/3 (ring 4)",
                "sharded 1/3, handing over (ring 5, acknowledged 4)",
                "joining the ring",
            ]
        );
        let blamed = replica_labels(controller, "releases F, ");
        assert_eq!(blamed.len(), 2, "the members in the ring: {blamed:?}");
        assert!(blamed[0].contains("sharded 1/3 (ring 4)"), "{blamed:?}");
    }
}
