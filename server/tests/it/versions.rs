//! Types that evolve (DESIGN §15.1), on a real 3-node cluster: a team ships `platform.v1
//! .Database`, writes objects, then adds v2 (reshaped, a field renamed, one added) and makes it
//! the storage version. Objects stored in v1 read as v2 and back unchanged, on every node; a
//! v1 watcher sees v2 writes as v1; a write through v1 keeps what only v2 has; the deprecated
//! v1 warns through gRPC and HTTP; each version's rules hold; another Type cannot take a
//! version of the kind.

use std::time::Duration;

use proto::registry::v1 as registry;
use proto::resource::v1::{ListRequest, Resource, Tenancy, WatchListRequest, watch_event::Event};
use tonic::Code;

use crate::process::{Cluster, Resd};
use crate::support::{restore, save_snapshot};
use crate::types::{read, type_of, write};

const V1: &str = r#"
syntax = "proto3";
package resd.platform.v1;
message Database {
  string engine = 1;
  int64 size_gb = 2;
  string owner = 3;
}
"#;

const V2: &str = r#"
syntax = "proto3";
package resd.platform.v2;
message Database {
  string engine = 1;
  // `owner` in v1: the same number and type carry over.
  string team = 3;
  Storage storage = 4;
  string region = 5;
}
message Storage { int64 size_gb = 1; }
"#;

const DEPRECATED: &str = "platform.v1.Database is deprecated: use v2 (storage.size_gb)";

#[derive(Clone, PartialEq, prost::Message)]
struct DatabaseV1 {
    #[prost(string, tag = "1")]
    engine: String,
    #[prost(int64, tag = "2")]
    size_gb: i64,
    #[prost(string, tag = "3")]
    owner: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Storage {
    #[prost(int64, tag = "1")]
    size_gb: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct DatabaseV2 {
    #[prost(string, tag = "1")]
    engine: String,
    #[prost(string, tag = "3")]
    team: String,
    #[prost(message, optional, tag = "4")]
    storage: Option<Storage>,
    #[prost(string, tag = "5")]
    region: String,
}

fn tenancy() -> Tenancy {
    Tenancy {
        partition: "default".into(),
        namespace: "default".into(),
    }
}

fn id(version: &str, name: &str) -> proto::resource::v1::Id {
    proto::resource::v1::Id {
        name: name.into(),
        r#type: Some(type_of("platform", version, "Database")),
        tenancy: Some(tenancy()),
        ..Default::default()
    }
}

fn v1(name: &str, data: &DatabaseV1) -> Resource {
    Resource {
        id: Some(id("v1", name)),
        data: Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.platform.v1.Database".into(),
            value: prost::Message::encode_to_vec(data),
        }),
        ..Default::default()
    }
}

fn v2(name: &str, data: &DatabaseV2) -> Resource {
    Resource {
        id: Some(id("v2", name)),
        data: Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.platform.v2.Database".into(),
            value: prost::Message::encode_to_vec(data),
        }),
        ..Default::default()
    }
}

fn data<M: prost::Message + Default>(resource: &Resource) -> M {
    M::decode(resource.data.as_ref().expect("data").value.as_slice()).expect("decodes")
}

fn group_version(resource: &Resource) -> String {
    resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .map(|t| t.group_version.clone())
        .unwrap_or_default()
}

fn type_resource(t: registry::Type) -> Resource {
    Resource {
        id: Some(proto::resource::v1::Id {
            name: "platform-database".into(),
            r#type: Some(type_of("registry", "v1", "Type")),
            tenancy: Some(Tenancy::default()),
            ..Default::default()
        }),
        data: Some(proto::to_any(&t)),
        ..Default::default()
    }
}

fn single_version() -> registry::Type {
    registry::Type {
        group: "platform".into(),
        group_version: "v1".into(),
        kind: "Database".into(),
        scope: registry::Scope::Namespace as i32,
        proto: V1.into(),
        ..Default::default()
    }
}

fn conversion(from: &str, to: &str, field: &str, expression: &str) -> registry::Conversion {
    registry::Conversion {
        from_version: from.into(),
        to_version: to.into(),
        field: field.into(),
        expression: expression.into(),
    }
}

/// v1 deprecated, v2 stored; v2 refuses databases over 100 GB.
fn two_versions() -> registry::Type {
    registry::Type {
        group: "platform".into(),
        kind: "Database".into(),
        scope: registry::Scope::Namespace as i32,
        versions: vec![
            registry::TypeVersion {
                name: "v1".into(),
                proto: V1.into(),
                served: true,
                deprecated: true,
                deprecation_message: DEPRECATED.into(),
                ..Default::default()
            },
            registry::TypeVersion {
                name: "v2".into(),
                proto: V2.into(),
                served: true,
                rules: vec![registry::Rule {
                    expression: "!has(self.storage) || self.storage.size_gb <= 100".into(),
                    message: "a database holds at most 100 GB".into(),
                    field: "storage".into(),
                }],
                ..Default::default()
            },
        ],
        storage_version: "v2".into(),
        conversions: vec![
            conversion("v1", "v2", "storage.size_gb", "self.size_gb"),
            conversion(
                "v2",
                "v1",
                "size_gb",
                "has(self.storage) ? self.storage.size_gb : 0",
            ),
        ],
        ..Default::default()
    }
}

/// Writes the Type over its stored version (the type controller may write its status
/// meanwhile: a lost race is tried again).
async fn put_type(node: &Resd, t: registry::Type) -> Result<Resource, tonic::Status> {
    for _ in 0..50 {
        let mut resource = type_resource(t.clone());
        if let Ok(stored) = read(node, resource.id.clone().expect("id")).await {
            resource.version = stored.version;
            resource.metadata = stored.metadata;
            resource.id = stored.id;
        }
        match write(node, resource).await {
            Err(status) if status.code() == Code::Aborted => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => return other,
        }
    }
    panic!("the Type kept changing under 50 writes");
}

async fn list(node: &Resd, version: &str) -> Vec<Resource> {
    node.resources()
        .await
        .list(ListRequest {
            r#type: Some(type_of("platform", version, "Database")),
            tenancy: Some(tenancy()),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .resources
}

async fn watch(
    node: &Resd,
    version: &str,
) -> tonic::Response<tonic::Streaming<proto::resource::v1::WatchEvent>> {
    node.resources()
        .await
        .watch_list(WatchListRequest {
            r#type: Some(type_of("platform", version, "Database")),
            tenancy: Some(tenancy()),
            ..Default::default()
        })
        .await
        .expect("watch")
}

async fn next_upsert(
    watch: &mut tonic::Streaming<proto::resource::v1::WatchEvent>,
    name: &str,
) -> Resource {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .unwrap_or_else(|_| panic!("{name} is watched"))
            .expect("the watch")
            .expect("an event");
        if let Some(Event::Upsert(upsert)) = event.event {
            let resource = upsert.resource.expect("resource");
            if resource.id.as_ref().is_some_and(|id| id.name == name) {
                return resource;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_gains_a_version_and_every_node_serves_both() {
    let cluster = Cluster::start_with_http(3, &[]).await;
    let (a, b, c) = (&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]);

    // v1 ships; objects are written.
    put_type(a, single_version()).await.expect("v1 registers");
    let first = DatabaseV1 {
        engine: "postgres".into(),
        size_gb: 40,
        owner: "payments".into(),
    };
    let written = write(b, v1("orders", &first)).await.expect("a v1 object");
    write(
        c,
        v1(
            "ledger",
            &DatabaseV1 {
                engine: "mysql".into(),
                size_gb: 10,
                owner: "finance".into(),
            },
        ),
    )
    .await
    .expect("another");

    // Another Type cannot take a version of the kind.
    let mut rival = single_version();
    rival.group_version = "v2".into();
    rival.proto = V1.replace("resd.platform.v1", "resd.platform.v2");
    let mut rival = type_resource(rival);
    rival.id.as_mut().expect("id").name = "rival".into();
    let refused = write(c, rival).await.expect_err("one Type per kind");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("platform-database"),
        "names the owner: {refused:?}"
    );

    // A v2 that would lose a field on the way back is refused, naming it.
    let mut lossy = two_versions();
    lossy.conversions.retain(|c| c.to_version != "v1");
    let refused = put_type(b, lossy).await.expect_err("size_gb is lost");
    assert!(refused.message().contains("size_gb"), "{refused:?}");

    // v2 arrives and becomes the storage version; v1 stays served, deprecated.
    put_type(c, two_versions()).await.expect("v2 registers");

    // Stored in v1, read as v2 on every node; and as v1 again, unchanged.
    for node in [a, b, c] {
        let as_v2 = read(node, id("v2", "orders")).await.expect("read as v2");
        assert_eq!(group_version(&as_v2), "v2");
        assert_eq!(
            as_v2.id.as_ref().expect("id").uid,
            written.id.as_ref().expect("id").uid
        );
        assert_eq!(
            data::<DatabaseV2>(&as_v2),
            DatabaseV2 {
                engine: "postgres".into(),
                team: "payments".into(),
                storage: Some(Storage { size_gb: 40 }),
                region: String::new(),
            }
        );
        let as_v1 = read(node, id("v1", "orders")).await.expect("read as v1");
        assert_eq!(data::<DatabaseV1>(&as_v1), first);
    }

    // Watchers in each version, on followers.
    let v1_watch = watch(c, "v1").await;
    assert!(
        v1_watch
            .metadata()
            .get(proto::WARNING_HEADER)
            .is_some_and(|w| w.to_str().is_ok_and(|w| w.contains("deprecated"))),
        "a v1 watch warns: {:?}",
        v1_watch.metadata()
    );
    let mut v1_watch = v1_watch.into_inner();
    let mut v2_watch = watch(b, "v2").await.into_inner();

    // A v2 write is stored in v2 and seen as v1 by the v1 watcher.
    let in_v2 = DatabaseV2 {
        engine: "postgres".into(),
        team: "search".into(),
        storage: Some(Storage { size_gb: 80 }),
        region: "eu-west".into(),
    };
    let stored = write(a, v2("search", &in_v2)).await.expect("a v2 write");
    assert_eq!(group_version(&stored), "v2");
    let seen = next_upsert(&mut v1_watch, "search").await;
    assert_eq!(group_version(&seen), "v1");
    assert_eq!(
        data::<DatabaseV1>(&seen),
        DatabaseV1 {
            engine: "postgres".into(),
            size_gb: 80,
            owner: "search".into(),
        }
    );
    assert_eq!(seen.version, stored.version);
    let seen = next_upsert(&mut v2_watch, "search").await;
    assert_eq!(data::<DatabaseV2>(&seen), in_v2);

    // An update through v1 keeps what only v2 has (the region).
    let mut through_v1 = read(b, id("v1", "search")).await.expect("as v1");
    let mut edited = data::<DatabaseV1>(&through_v1);
    edited.size_gb = 90;
    through_v1.data = Some(prost_types::Any {
        type_url: "type.googleapis.com/resd.platform.v1.Database".into(),
        value: prost::Message::encode_to_vec(&edited),
    });
    let answered = write(c, through_v1).await.expect("a v1 update");
    assert_eq!(
        group_version(&answered),
        "v1",
        "answered in the version written"
    );
    assert_eq!(data::<DatabaseV1>(&answered), edited);
    let now = read(a, id("v2", "search")).await.expect("as v2");
    assert_eq!(
        data::<DatabaseV2>(&now),
        DatabaseV2 {
            storage: Some(Storage { size_gb: 90 }),
            ..in_v2.clone()
        }
    );
    let seen = next_upsert(&mut v1_watch, "search").await;
    assert_eq!(data::<DatabaseV1>(&seen).size_gb, 90);

    // v2's rule judges a write made through v1, after conversion, naming the version.
    let refused = write(
        b,
        v1(
            "huge",
            &DatabaseV1 {
                engine: "postgres".into(),
                size_gb: 500,
                owner: "x".into(),
            },
        ),
    )
    .await
    .expect_err("over 100 GB in v2");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("at most 100 GB") && refused.message().contains("v2"),
        "{refused:?}"
    );

    // MutateAndValidate (apply's dry run) judges the same, storing nothing.
    let refused = b
        .resources()
        .await
        .mutate_and_validate(proto::resource::v1::MutateAndValidateRequest {
            resource: Some(v1(
                "huge",
                &DatabaseV1 {
                    engine: "postgres".into(),
                    size_gb: 500,
                    owner: "x".into(),
                },
            )),
        })
        .await
        .expect_err("over 100 GB in v2");
    assert!(refused.message().contains("at most 100 GB"), "{refused:?}");

    // Lists in either version hold every object, converted.
    for (node, version) in [(a, "v1"), (b, "v2"), (c, "v1")] {
        let listed = list(node, version).await;
        let names: Vec<&str> = listed
            .iter()
            .map(|r| r.id.as_ref().expect("id").name.as_str())
            .collect();
        assert_eq!(names, ["ledger", "orders", "search"], "{version} on a node");
        assert!(listed.iter().all(|r| group_version(r) == version));
    }

    // The deprecated version warns: gRPC metadata on a read, HTTP `Warning` on a GET; v2 does
    // not.
    let answer = b
        .resources()
        .await
        .read(proto::resource::v1::ReadRequest {
            id: Some(id("v1", "orders")),
            ..Default::default()
        })
        .await
        .expect("read");
    let warnings: Vec<&str> = answer
        .metadata()
        .get_all(proto::WARNING_HEADER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    assert_eq!(warnings, [DEPRECATED]);
    let answer = b
        .resources()
        .await
        .read(proto::resource::v1::ReadRequest {
            id: Some(id("v2", "orders")),
            ..Default::default()
        })
        .await
        .expect("read");
    assert!(answer.metadata().get(proto::WARNING_HEADER).is_none());
    let (status, head, body) = c
        .http_get_with_headers(
            "/v1/resources/platform/v1/Database/orders?partition=default&namespace=default",
        )
        .expect("HTTP answers");
    assert_eq!(status, 200, "{body}");
    assert!(
        head.lines().any(|line| line
            .to_ascii_lowercase()
            .starts_with("warning: 299 - \"platform.v1.database is deprecated")),
        "{head}"
    );
    assert!(body.contains("\"sizeGb\":\"40\""), "v1 JSON: {body}");
    let (status, head, body) = c
        .http_get_with_headers(
            "/v1/resources/platform/v2/Database/orders?partition=default&namespace=default",
        )
        .expect("HTTP answers");
    assert_eq!(status, 200, "{body}");
    assert!(!head.to_ascii_lowercase().contains("warning:"), "{head}");
    assert!(
        body.contains("\"storage\":{\"sizeGb\":\"40\"}"),
        "v2 JSON: {body}"
    );

    // A version the Type does not serve is InvalidArgument.
    let refused = read(a, id("v3", "orders")).await.expect_err("no v3");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // Removing the storage version is refused while objects are stored in it.
    let mut without_v2 = two_versions();
    without_v2.versions.remove(1);
    without_v2.storage_version = "v1".into();
    without_v2.conversions.clear();
    let refused = put_type(a, without_v2).await.expect_err("v2 holds objects");
    assert!(
        refused.message().contains("v2 is the storage version"),
        "{refused:?}"
    );

    // v1 no longer served: its stored objects still read as v2, and a snapshot of them
    // restores (they are this Type's, in a version it keeps).
    let mut retired = two_versions();
    retired.versions[0].served = false;
    put_type(b, retired).await.expect("v1 unserved");
    // A strong read: another node's default read may answer from before it applied the change.
    let mut strong = tonic::Request::new(proto::resource::v1::ReadRequest {
        id: Some(id("v1", "orders")),
        ..Default::default()
    });
    strong.metadata_mut().insert(
        "x-resd-consistency-mode",
        "consistent".parse().expect("ascii"),
    );
    let refused = c
        .resources()
        .await
        .read(strong)
        .await
        .expect_err("v1 is not served");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let as_v2 = read(c, id("v2", "orders"))
        .await
        .expect("still readable as v2");
    assert_eq!(
        data::<DatabaseV2>(&as_v2).storage,
        Some(Storage { size_gb: 40 })
    );
    let snapshot = save_snapshot(a).await;
    restore(a, &snapshot)
        .await
        .expect("a snapshot with objects in v1 restores");
    let as_v2 = read(b, id("v2", "ledger"))
        .await
        .expect("readable after the restore");
    assert_eq!(data::<DatabaseV2>(&as_v2).team, "finance");
}

/// The Type's `migration` status: whether the condition Migrated is TRUE, and its message.
async fn migration(node: &Resd) -> Option<(bool, String)> {
    let stored = read(node, type_resource(single_version()).id.expect("id"))
        .await
        .ok()?;
    let status = stored.status.get("migration")?;
    if status.observed_generation != stored.generation {
        return None;
    }
    let condition = status.conditions.iter().find(|c| c.r#type == "Migrated")?;
    Some((
        condition.state == proto::resource::v1::State::True as i32,
        condition.message.clone(),
    ))
}

/// Objects in one migration run (more with `RESD_MIGRATION_OBJECTS`).
fn migration_objects() -> usize {
    std::env::var("RESD_MIGRATION_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1500)
}

/// Changing the storage version migrates every object, in passes, while the leader (where the
/// type controller runs) is killed in the middle: it completes, each object rewritten exactly
/// once (an ordinary update by `controller/type-migration`, its generation kept), and the
/// Type's status says `Migrated` with `migrated=N remaining=0`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_survives_a_leader_kill_and_rewrites_each_object_once() {
    use futures::StreamExt as _;
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let watcher = (leader + 1) % 3;
    put_type(&cluster.nodes[watcher], single_version())
        .await
        .expect("v1 registers");
    let count = migration_objects();
    let node = &cluster.nodes[watcher];
    let written: Vec<Resource> = futures::stream::iter(0..count)
        .map(|i| async move {
            write(
                node,
                v1(
                    &format!("db-{i:05}"),
                    &DatabaseV1 {
                        engine: "postgres".into(),
                        size_gb: (i % 100) as i64,
                        owner: format!("team-{}", i % 7),
                    },
                ),
            )
            .await
            .expect("a v1 object")
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let generations: std::collections::BTreeMap<String, String> = written
        .iter()
        .map(|r| {
            (
                r.id.as_ref().expect("id").name.clone(),
                r.generation.clone(),
            )
        })
        .collect();
    let mut events = watch(&cluster.nodes[watcher], "v1").await.into_inner();

    let started = std::time::Instant::now();
    put_type(&cluster.nodes[watcher], two_versions())
        .await
        .expect("v2 becomes the storage version");
    // The first rewrite seen, then the leader goes.
    let mut rewrites: std::collections::BTreeMap<String, usize> = Default::default();
    let record = |event: proto::resource::v1::WatchEvent,
                  rewrites: &mut std::collections::BTreeMap<String, usize>| {
        if event.actor != "controller/type-migration" {
            return;
        }
        let Some(Event::Upsert(upsert)) = event.event else {
            panic!("a migration writes updates only: {event:?}");
        };
        let resource = upsert.resource.expect("resource");
        let name = resource.id.as_ref().expect("id").name.clone();
        assert_eq!(
            generations.get(&name),
            Some(&resource.generation),
            "{name} keeps its generation"
        );
        *rewrites.entry(name).or_default() += 1;
    };
    while rewrites.is_empty() {
        let event = tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("the migration starts")
            .expect("the watch")
            .expect("an event");
        record(event, &mut rewrites);
    }
    cluster.nodes[leader].kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut restarted = false;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the migration did not finish: {} of {count} rewritten",
            rewrites.len()
        );
        if !restarted && std::time::Instant::now() > started + Duration::from_secs(3) {
            cluster.nodes[leader].restart();
            restarted = true;
        }
        match tokio::time::timeout(Duration::from_millis(500), events.message()).await {
            Ok(Ok(Some(event))) => record(event, &mut rewrites),
            Ok(other) => panic!("the watch on a surviving node ended: {other:?}"),
            Err(_) => {}
        }
        if rewrites.len() == count
            && let Some((true, message)) = migration(&cluster.nodes[watcher]).await
        {
            assert_eq!(message, format!("migrated={count} remaining=0"));
            break;
        }
    }
    let took = started.elapsed();
    assert!(
        rewrites.values().all(|times| *times == 1),
        "rewritten more than once: {:?}",
        rewrites.iter().filter(|(_, t)| **t > 1).collect::<Vec<_>>()
    );
    eprintln!(
        "migrated {count} objects in {:.1} s across a leader kill ({:.0} objects/s)",
        took.as_secs_f64(),
        count as f64 / took.as_secs_f64()
    );
    // Nothing is left in v1: the plan of the Type as it is has nothing to migrate, and v1 can
    // now go.
    let plan = cluster.nodes[watcher]
        .cluster()
        .await
        .plan_type(proto::cluster::v1::PlanTypeRequest {
            r#type: Some(type_resource(two_versions())),
        })
        .await
        .expect("plan")
        .into_inner();
    assert_eq!(plan.checked, count as u64);
    assert_eq!(plan.to_migrate, 0);
    assert!(plan.failures.is_empty(), "{:?}", plan.failures);
}

/// A plan names exactly the objects a new rule would refuse, and a Type that does not compile
/// is InvalidArgument; nothing changes either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_names_exactly_the_objects_a_new_rule_would_refuse() {
    let cluster = Cluster::start(3, &[]).await;
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    put_type(a, single_version()).await.expect("v1 registers");
    for (name, size) in [("small", 10), ("big", 150), ("huge", 900), ("edge", 100)] {
        write(
            b,
            v1(
                name,
                &DatabaseV1 {
                    engine: "postgres".into(),
                    size_gb: size,
                    owner: "t".into(),
                },
            ),
        )
        .await
        .expect("written");
    }
    let plan = |t: registry::Type| async move {
        b.cluster()
            .await
            .plan_type(proto::cluster::v1::PlanTypeRequest {
                r#type: Some(type_resource(t)),
            })
            .await
            .map(|answer| answer.into_inner())
    };
    let answer = plan(two_versions()).await.expect("a plan");
    assert_eq!(answer.checked, 4);
    assert_eq!(answer.to_migrate, 4);
    assert_eq!(answer.storage_version, "v2");
    let named: Vec<&str> = answer
        .failures
        .iter()
        .map(|f| f.id.as_ref().expect("id").name.as_str())
        .collect();
    assert_eq!(named, ["big", "huge"], "{:?}", answer.failures);
    assert!(
        answer.failures[0]
            .message
            .contains("a database holds at most 100 GB")
            && answer.failures[0].message.contains("v2"),
        "{:?}",
        answer.failures[0]
    );
    // A conversion that loses what only some stored objects hold (generated samples pass it):
    // writing the Type is refused, naming an object that would not survive.
    let mut lossy = two_versions();
    lossy.conversions[1].expression =
        "has(self.storage) && self.storage.size_gb < 500 ? self.storage.size_gb : 0".into();
    let refused = put_type(a, lossy)
        .await
        .expect_err("huge would lose its size");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("huge") && refused.message().contains("size_gb"),
        "{refused:?}"
    );
    // A Type that does not compile.
    let mut broken = two_versions();
    broken.versions[1].proto = "syntax = \"proto3\"; message {".into();
    let refused = plan(broken).await.expect_err("does not compile");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("does not compile"),
        "{refused:?}"
    );
    // Nothing changed: still one version.
    let refused = read(a, id("v2", "small"))
        .await
        .expect_err("v2 is not registered");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

/// The message of the Type's `Migrated` condition once it is TRUE (within 60 s).
async fn migration_finished(node: &Resd) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((true, message)) = migration(node).await {
            return message;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the migration finishes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A snapshot saved in the middle of a migration restores, and the migration resumes from
/// what the snapshot holds: it completes again, every object in the storage version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_resumes_after_a_restore_of_a_snapshot_taken_in_its_middle() {
    use futures::StreamExt as _;
    let cluster = Cluster::start(3, &[]).await;
    let node = &cluster.nodes[1];
    put_type(node, single_version())
        .await
        .expect("v1 registers");
    let count = 1200;
    futures::stream::iter(0..count)
        .map(|i| async move {
            write(
                node,
                v1(
                    &format!("db-{i:05}"),
                    &DatabaseV1 {
                        engine: "mysql".into(),
                        size_gb: (i % 50) as i64,
                        owner: "t".into(),
                    },
                ),
            )
            .await
            .expect("a v1 object")
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let mut events = watch(node, "v1").await.into_inner();
    put_type(node, two_versions()).await.expect("v2 stored");
    // The first rewrite, then a snapshot while the migration runs.
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("the migration starts")
            .expect("the watch")
            .expect("an event");
        if event.actor == "controller/type-migration" {
            break;
        }
    }
    let snapshot = save_snapshot(node).await;
    assert_eq!(
        migration_finished(node).await,
        format!("migrated={count} remaining=0")
    );
    restore(node, &snapshot)
        .await
        .expect("the snapshot restores");
    let plan = node
        .cluster()
        .await
        .plan_type(proto::cluster::v1::PlanTypeRequest {
            r#type: Some(type_resource(two_versions())),
        })
        .await
        .expect("plan")
        .into_inner();
    assert!(
        plan.to_migrate > 0 && plan.to_migrate < count as u64,
        "the snapshot holds a migration half done: {} to migrate",
        plan.to_migrate
    );
    assert_eq!(
        migration_finished(node).await,
        format!("migrated={count} remaining=0")
    );
    let plan = node
        .cluster()
        .await
        .plan_type(proto::cluster::v1::PlanTypeRequest {
            r#type: Some(type_resource(two_versions())),
        })
        .await
        .expect("plan")
        .into_inner();
    assert_eq!(plan.to_migrate, 0);
    assert_eq!(plan.checked, count as u64);
}
