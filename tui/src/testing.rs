//! Deterministic data for the dashboard's tests and benchmarks: the demo types, resources with
//! fixed uids (ULIDs at a fixed instant, so ages render the same on every run), watch events,
//! and a state that looks like a 3-node cluster holding the demo fixtures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proto::client::placement::placement_map;
use proto::cluster::v1::{
    ControllerInfo, ListControllersResponse, ListTypesResponse, Member, MembersResponse,
    NodeControllers, Placement, Role, Scope, StatusResponse, TypeInfo,
};
use proto::codec::Codec;
use proto::resource::v1::watch_event::{EndOfSnapshot, Event, Upsert};
use proto::resource::v1::{
    Condition, Id, Resource, State as ConditionState, Status, Tenancy, Type, WatchEvent,
};

use crate::model::Store;
use crate::state::State;

/// When every test resource was created: 2026-11-21T12:00:00Z.
pub const CREATED_MS: u64 = 1_795_262_400_000;

/// The test clock: ten minutes after [`CREATED_MS`].
pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(CREATED_MS) + Duration::from_secs(600)
}

/// A ULID for `millis` with a random part derived from `seed`.
pub fn ulid(millis: u64, seed: u64) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut text = String::with_capacity(26);
    for i in (0..10).rev() {
        text.push(ALPHABET[((millis >> (i * 5)) & 31) as usize] as char);
    }
    let mut random = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) as u128 | ((seed as u128) << 64);
    for _ in 0..16 {
        text.push(ALPHABET[(random & 31) as usize] as char);
        random >>= 5;
    }
    text
}

fn seed_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn resource_type(gvk: &str) -> Type {
    let mut parts = gvk.splitn(3, '.');
    Type {
        group: parts.next().unwrap_or_default().to_owned(),
        group_version: parts.next().unwrap_or_default().to_owned(),
        kind: parts.next().unwrap_or_default().to_owned(),
    }
}

pub fn info(group: &str, version: &str, kind: &str, scope: Scope) -> TypeInfo {
    TypeInfo {
        r#type: Some(Type {
            group: group.into(),
            group_version: version.into(),
            kind: kind.into(),
        }),
        scope: scope as i32,
        message_name: format!("resd.{group}.{version}.{kind}"),
        builtin: true,
        ..Default::default()
    }
}

/// The types a `resd` server registers.
pub fn demo_types() -> Vec<TypeInfo> {
    vec![
        info("demo", "v1", "Album", Scope::Namespace),
        info("demo", "v1", "Artist", Scope::Namespace),
        info("demo", "v1", "Concept", Scope::Namespace),
        info("demo", "v1", "Executive", Scope::Cluster),
        info("demo", "v1", "RecordLabel", Scope::Partition),
        info("demo", "v2", "Album", Scope::Namespace),
        info("demo", "v2", "Artist", Scope::Namespace),
        info("tenancy", "v1", "Namespace", Scope::Partition),
        info("tenancy", "v1", "Partition", Scope::Cluster),
    ]
}

pub fn demo_codec() -> Codec {
    Codec::new(ListTypesResponse {
        types: demo_types(),
        file_descriptor_set: proto::FILE_DESCRIPTOR_SET.to_vec().into(),
        next_page_token: String::new(),
    })
    .expect("the demo types decode")
}

/// A resource of type `gvk` in `tenancy` (`partition/namespace`, `partition` or ``) named
/// `name`, at `version` (the generation too), with a fixed uid.
pub fn resource(gvk: &str, tenancy: &str, name: &str, version: u64) -> Resource {
    let (partition, namespace) = tenancy.split_once('/').unwrap_or((tenancy, ""));
    let id = Id {
        uid: ulid(CREATED_MS, seed_of(&format!("{gvk}/{tenancy}/{name}"))),
        name: name.into(),
        r#type: Some(resource_type(gvk)),
        tenancy: Some(Tenancy {
            partition: partition.into(),
            namespace: namespace.into(),
        }),
    };
    Resource {
        id: Some(id),
        owner: None,
        version: version.to_string(),
        generation: version.to_string(),
        metadata: BTreeMap::new(),
        status: BTreeMap::new(),
        data: None,
    }
}

pub fn upsert(resource: Resource) -> WatchEvent {
    WatchEvent {
        actor: String::new(),
        version: resource.version.clone(),
        event: Some(Event::Upsert(Upsert {
            resource: Some(resource),
        })),
    }
}

pub fn delete(resource: Resource) -> WatchEvent {
    WatchEvent {
        actor: String::new(),
        version: resource.version.clone(),
        event: Some(Event::Delete(proto::resource::v1::watch_event::Delete {
            resource: Some(resource),
        })),
    }
}

pub fn end_of_snapshot(version: &str) -> WatchEvent {
    WatchEvent {
        actor: String::new(),
        version: version.into(),
        event: Some(Event::EndOfSnapshot(EndOfSnapshot {})),
    }
}

pub fn condition(kind: &str, state: ConditionState, reason: &str, message: &str) -> Condition {
    Condition {
        r#type: kind.into(),
        state: state as i32,
        reason: reason.into(),
        message: message.into(),
        resource: None,
    }
}

pub fn with_status(
    mut resource: Resource,
    key: &str,
    observed: &str,
    conditions: Vec<Condition>,
) -> Resource {
    resource.status.insert(
        key.into(),
        Status {
            observed_generation: observed.into(),
            conditions,
            updated_at: None,
        },
    );
    resource
}

/// The demo fixtures as the dashboard would hold them after the initial snapshots.
pub fn demo_resources(codec: &Codec) -> Vec<(String, Resource)> {
    let data = |gvk: &str, yaml: &str| -> Option<prost_types::Any> {
        let document = format!("type: {gvk}\nname: x\n{}data:\n{yaml}", tenancy_line(gvk));
        codec
            .read_yaml(&document)
            .into_iter()
            .next()
            .and_then(Result::ok)
            .and_then(|resource| resource.data)
    };
    let mut out = Vec::new();
    let mut push = |gvk: &str, resource: Resource| out.push((gvk.to_owned(), resource));
    push(
        "tenancy.v1.Partition",
        resource("tenancy.v1.Partition", "", "default", 2),
    );
    push(
        "tenancy.v1.Partition",
        resource("tenancy.v1.Partition", "", "labels", 3),
    );
    for namespace in ["default", "jazz", "rock"] {
        let mut ns = resource("tenancy.v1.Namespace", "default", namespace, 5);
        ns.metadata
            .insert("finalizers".into(), "resd.io/namespace-contents".into());
        push("tenancy.v1.Namespace", ns);
    }
    let mut miles = resource("demo.v2.Artist", "default/jazz", "miles-davis", 12);
    miles.data = data(
        "demo.v2.Artist",
        "  name: Miles Davis\n  genre: GENRE_JAZZ\n",
    );
    let miles = with_status(
        miles,
        "demo-artist",
        "12",
        vec![condition(
            "Accepted",
            ConditionState::True,
            "Ok",
            "albums generated",
        )],
    );
    let mut coltrane = resource("demo.v2.Artist", "default/jazz", "john-coltrane", 14);
    coltrane.data = data(
        "demo.v2.Artist",
        "  name: John Coltrane\n  genre: GENRE_JAZZ\n",
    );
    let coltrane = with_status(
        coltrane,
        "demo-artist",
        "13",
        vec![condition(
            "Accepted",
            ConditionState::Unknown,
            "Pending",
            "",
        )],
    );
    let mut beatles = resource("demo.v2.Artist", "default/rock", "the-beatles", 9);
    beatles.data = data(
        "demo.v2.Artist",
        "  name: The Beatles\n  genre: GENRE_POP\n",
    );
    let beatles = with_status(
        beatles,
        "demo-artist",
        "9",
        vec![condition(
            "Accepted",
            ConditionState::False,
            "InvalidGenre",
            "genre must be one of the rock genres",
        )],
    );
    let albums = [
        (&miles, "kind-of-blue", "Kind of Blue", 1959, false),
        (&miles, "bitches-brew", "Bitches Brew", 1970, true),
        (&coltrane, "a-love-supreme", "A Love Supreme", 1965, false),
        (&beatles, "abbey-road", "Abbey Road", 1969, false),
    ];
    for (owner, name, title, year, deleting) in albums {
        let tenancy = crate::model::ResKey::of(owner.id.as_ref().expect("id")).tenancy_label();
        let mut album = resource("demo.v2.Album", &tenancy, name, 20);
        album.owner = owner.id.clone();
        album.data = data(
            "demo.v2.Album",
            &format!("  name: {title}\n  yearOfRelease: {year}\n"),
        );
        album
            .metadata
            .insert("finalizers".into(), "demo.resd.io/album-cleanup".into());
        if deleting {
            album
                .metadata
                .insert("deletionTimestamp".into(), "2026-11-21T12:05:00Z".into());
        }
        push("demo.v2.Album", album);
    }
    push("demo.v2.Artist", miles.clone());
    push("demo.v2.Artist", coltrane);
    push("demo.v2.Artist", beatles);
    let mut columbia = resource("demo.v1.RecordLabel", "labels", "columbia", 4);
    columbia.data = data("demo.v1.RecordLabel", "  name: Columbia Records\n");
    push("demo.v1.RecordLabel", columbia);
    let mut clive = resource("demo.v1.Executive", "", "clive-davis", 6);
    clive.data = data(
        "demo.v1.Executive",
        "  name: Clive Davis\n  position: President\n",
    );
    push("demo.v1.Executive", clive);
    out
}

fn tenancy_line(gvk: &str) -> &'static str {
    match gvk {
        "demo.v1.Executive" | "tenancy.v1.Partition" => "",
        "demo.v1.RecordLabel" | "tenancy.v1.Namespace" => "tenancy: {partition: default}\n",
        _ => "tenancy: {partition: default, namespace: default}\n",
    }
}

fn status(node_id: u64, role: Role, commit: u64) -> StatusResponse {
    StatusResponse {
        node_id,
        api_addr: format!("127.0.0.1:850{}", node_id + 1),
        raft_addr: format!("127.0.0.1:830{}", node_id + 1),
        role: role as i32,
        term: 3,
        leader_id: 1,
        leader_api_addr: "127.0.0.1:8502".into(),
        commit_index: commit,
        applied_index: commit,
        last_log_index: commit,
        storage: "raft".into(),
        snapshot_index: 0,
        log_commits: 40,
        log_entries: 120,
        log_operations: 130,
        cluster_name: "dev".into(),
        ready: true,
        not_ready_reason: String::new(),
        write_rate: 12.5 * node_id as f64,
        apply_p99_ms: 0.8,
        writes_per_second: (0..60u64).map(|s| (s * node_id) % 23).collect(),
        disk_free_bytes: 40 << 30,
        alarms: Vec::new(),
    }
}

/// The controllers `resd` runs, placed as on a fresh 3-node cluster (singletons on node 1).
pub fn demo_controllers() -> ListControllersResponse {
    let controller = |name: &str, gvk: &str, placement: Placement, running: bool| ControllerInfo {
        name: name.into(),
        managed_type: Some(resource_type(gvk)),
        watched_types: Vec::new(),
        placement: placement as i32,
        running,
        queue_depth: 0,
        reconciles_ok: if running { 42 } else { 0 },
        reconciles_failed: 0,
        last_error: String::new(),
        last_reconcile: running.then_some(prost_types::Timestamp {
            seconds: (CREATED_MS / 1000 + 300) as i64,
            nanos: 0,
        }),
        finalizers: match name {
            "demo-album" => vec!["demo.resd.io/album-cleanup".into()],
            "namespace" => vec!["tenancy.resd.io/namespace-cleanup".into()],
            _ => Vec::new(),
        },
    };
    let nodes = (1..=3)
        .map(|node_id| {
            let leader = node_id == 1;
            let mut album = controller("demo-album", "demo.v2.Album", Placement::Singleton, leader);
            if leader {
                album.queue_depth = 2;
                album.reconciles_failed = 1;
                album.last_error = "album cleanup: upstream timed out".into();
            }
            NodeControllers {
                node_id,
                api_addr: format!("127.0.0.1:850{}", node_id + 1),
                controllers: vec![
                    album,
                    controller(
                        "demo-artist",
                        "demo.v2.Artist",
                        Placement::Singleton,
                        leader,
                    ),
                    controller(
                        "namespace",
                        "tenancy.v1.Namespace",
                        Placement::Singleton,
                        leader,
                    ),
                    controller("observer", "demo.v1.Concept", Placement::EachServer, true),
                ],
                error: String::new(),
            }
        })
        .collect();
    ListControllersResponse {
        nodes,
        external: Vec::new(),
    }
}

/// A dashboard connected to node 2 of a healthy 3-node cluster holding the demo fixtures.
pub fn demo_state() -> State {
    let codec = demo_codec();
    let mut state = State::new("127.0.0.1:8503", now());
    state.store = Store::new(demo_types());
    for (gvk, resource) in demo_resources(&codec) {
        if let Some(data) = state.store.get_mut(&gvk) {
            data.apply(upsert(resource));
        }
    }
    for data in &mut state.store.types {
        data.apply(end_of_snapshot("100"));
    }
    state.codec = Some(Arc::new(codec));
    state.link = crate::state::Link::Live;
    state.cluster.status = Some(status(2, Role::Follower, 120));
    state.cluster.members = Some(MembersResponse {
        members: (1..=3)
            .map(|node_id| Member {
                node_id,
                api_addr: format!("127.0.0.1:850{}", node_id + 1),
                raft_addr: format!("127.0.0.1:830{}", node_id + 1),
                voter: true,
                leader: node_id == 1,
                match_index: 120,
                lag: Some(0),
                reachable: true,
            })
            .collect(),
        leader_id: 1,
        term: 3,
        no_leader: false,
        answered_by: 1,
    });
    state.cluster.nodes = (1..=3)
        .map(|node_id| {
            let role = if node_id == 1 {
                Role::Leader
            } else {
                Role::Follower
            };
            (node_id, Ok(status(node_id, role, 120)))
        })
        .collect();
    state.cluster.placement = Some(placement_map(&demo_controllers()));
    state
}

/// The names in the resource table, top to bottom.
pub fn row_names(state: &State) -> Vec<String> {
    state
        .resources
        .rows
        .keys
        .iter()
        .map(|key| key.name.clone())
        .collect()
}

/// A state with one type holding `count` resources (for benchmarks and scrolling tests).
pub fn large_state(count: usize) -> State {
    let mut state = demo_state();
    let gvk = "demo.v1.Concept";
    if let Some(data) = state.store.get_mut(gvk) {
        for i in 0..count {
            let mut concept = resource(
                gvk,
                "default/jazz",
                &format!("concept-{i:05}"),
                i as u64 + 1,
            );
            if i % 7 == 0 {
                concept = with_status(
                    concept,
                    "observer",
                    &(i as u64 + 1).to_string(),
                    vec![condition("Seen", ConditionState::True, "Observed", "")],
                );
            }
            data.apply(upsert(concept));
        }
    }
    state.resources.current_type = Some(gvk.into());
    state.screen = crate::state::Screen::Resources;
    state
}
