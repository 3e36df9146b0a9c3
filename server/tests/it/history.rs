//! Objects' history (DESIGN §18) on a real 3-node cluster with ACLs: an object written by three
//! tokens and a controller shows each actor on every node, after a restart and after a
//! restore; reads at a version return the old data; the history is read only by who may read
//! the object, and a uid names only its own object.

use std::time::{Duration, Instant};

use proto::acl::v1 as acl;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{
    HistoryEntry, Id, ListHistoryRequest, ReadRequest, Resource, history_entry,
};
use tonic::Code;

use crate::acl::{artist_in, demo_rule, policy, token, with_token, write_as};
use crate::process::Cluster;

const ALICE: &str = "alice-secret-0123456789";
const BOB: &str = "bob-secret-0123456789";
const CAROL: &str = "carol-secret-0123456789";
const OUTSIDER: &str = "outsider-secret-0123456789";

fn miles_id() -> Id {
    artist_in("default", "miles").id.expect("an id")
}

async fn history_on(
    client: &mut ResourceServiceClient<tonic::transport::Channel>,
    id: Id,
    token: &str,
) -> Result<Vec<HistoryEntry>, tonic::Status> {
    client
        .list_history(with_token(
            ListHistoryRequest {
                id: Some(id),
                ..Default::default()
            },
            Some(token),
        ))
        .await
        .map(|reply| reply.into_inner().entries)
}

fn writes_by(entries: &[HistoryEntry]) -> Vec<(String, String)> {
    entries
        .iter()
        .filter(|entry| entry.operation == history_entry::Operation::Write as i32)
        .map(|entry| (entry.version.clone(), entry.actor.clone()))
        .collect()
}

fn name_of(resource: &Resource) -> String {
    let data = resource.data.as_ref().expect("data");
    <proto::demo::v2::Artist as prost::Message>::decode(data.value.as_slice())
        .expect("an artist")
        .name
}

/// Waits until every node's history of `id` holds the writes `want` and a controller's status
/// (after a restore, which numbers the restored history again, only their actors and order).
async fn expect_everywhere(cluster: &Cluster, id: &Id, token: &str, want: &[(String, String)]) {
    expect_history(cluster, id, token, want, true).await;
}

async fn expect_history(
    cluster: &Cluster,
    id: &Id,
    token: &str,
    want: &[(String, String)],
    same_versions: bool,
) {
    for (index, node) in cluster.nodes.iter().enumerate() {
        let mut client = node.resources().await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let entries = history_on(&mut client, id.clone(), token).await;
            let actors = |writes: &[(String, String)]| {
                writes
                    .iter()
                    .map(|(_, actor)| actor.clone())
                    .collect::<Vec<_>>()
            };
            let ok = entries.as_ref().is_ok_and(|entries| {
                (if same_versions {
                    writes_by(entries) == want
                } else {
                    actors(&writes_by(entries)) == actors(want)
                }) && entries.iter().any(|entry| {
                    entry.operation == history_entry::Operation::Status as i32
                        && entry.actor.starts_with("controller/")
                })
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {index}: the history is {:?}, not the writes {want:?} and a controller's status",
                entries.map(|e| e
                    .iter()
                    .map(|e| (e.version.clone(), e.operation, e.actor.clone()))
                    .collect::<Vec<_>>())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn history_names_every_actor_on_every_node_after_a_restart_and_a_restore() {
    let (_ca, mut cluster) = crate::mtls::tls_cluster(3, &["--acl-enabled"]).await;
    let management = cluster.nodes[0]
        .harness_token
        .clone()
        .expect("a management token");
    let channel = cluster.nodes[0].channel().await;
    for resource in [
        policy(
            "jazz-write",
            vec![demo_rule("default", acl::Access::Write)],
            acl::Access::Unspecified,
        ),
        policy(
            "elsewhere",
            vec![demo_rule("elsewhere", acl::Access::Write)],
            acl::Access::Unspecified,
        ),
        token("alice", ALICE, &["jazz-write"], ""),
        token("bob", BOB, &["jazz-write"], ""),
        token("carol", CAROL, &["jazz-write"], ""),
        token("outsider", OUTSIDER, &["elsewhere"], ""),
    ] {
        write_as(&channel, &management, resource)
            .await
            .expect("set up the tokens");
    }
    // Three tokens write the object, the demo controller writes its status.
    let first = write_as(&channel, ALICE, artist_in("default", "miles"))
        .await
        .expect("alice creates");
    // Blind writes: the demo controller's status writes move the version meanwhile.
    // (Their statuses left out too: empty keeps the stored ones.)
    let mut second = first.clone();
    second.version.clear();
    second.status.clear();
    second.data = artist_in("default", "Miles Dewey Davis").data;
    let second = write_as(&channel, BOB, second).await.expect("bob renames");
    let mut third = second.clone();
    third.version.clear();
    third.status.clear();
    third.metadata.insert("team".into(), "jazz".into());
    let third = write_as(&channel, CAROL, third)
        .await
        .expect("carol labels");
    let want = vec![
        (third.version.clone(), "carol".to_owned()),
        (second.version.clone(), "bob".to_owned()),
        (first.version.clone(), "alice".to_owned()),
    ];
    let id = miles_id();
    expect_everywhere(&cluster, &id, &management, &want).await;

    // Read at a version: the old data, on any node.
    let mut client = cluster.nodes[2].resources().await;
    let old = client
        .read(with_token(
            ReadRequest {
                id: Some(id.clone()),
                at_version: first.version.clone(),
            },
            Some(BOB),
        ))
        .await
        .expect("a read at alice's version")
        .into_inner()
        .resource
        .expect("a resource");
    assert_eq!(name_of(&old), "miles");
    assert_eq!(old.version, first.version);
    let before = client
        .read(with_token(
            ReadRequest {
                id: Some(id.clone()),
                at_version: "1".into(),
            },
            Some(BOB),
        ))
        .await
        .expect_err("the object did not exist at version 1");
    assert_eq!(before.code(), Code::NotFound, "{}", before.message());

    // The attacker: a token that may not read the object reads none of its history; a uid
    // names only its own object (not one of another namespace under a name it may read).
    let denied = history_on(&mut client, id.clone(), OUTSIDER)
        .await
        .expect_err("the outsider may not read miles");
    assert_eq!(denied.code(), Code::PermissionDenied);
    let at = client
        .read(with_token(
            ReadRequest {
                id: Some(id.clone()),
                at_version: first.version.clone(),
            },
            Some(OUTSIDER),
        ))
        .await
        .expect_err("the outsider may not read miles as it was");
    assert_eq!(at.code(), Code::PermissionDenied);
    let mut elsewhere = artist_in("elsewhere", "miles").id.expect("an id");
    elsewhere.uid = first.id.as_ref().expect("an id").uid.clone();
    let namespace = Resource {
        id: Some(crate::acl::cluster_id("Namespace", "elsewhere")),
        data: Some(proto::to_any(&proto::tenancy::v1::Namespace::default())),
        ..Default::default()
    };
    let mut namespace = namespace;
    if let Some(id) = namespace.id.as_mut() {
        id.tenancy = Some(proto::resource::v1::Tenancy {
            partition: "default".into(),
            namespace: String::new(),
        });
    }
    write_as(&channel, &management, namespace)
        .await
        .expect("the outsider's namespace");
    let smuggled = history_on(&mut client, elsewhere, OUTSIDER)
        .await
        .expect_err("another object's uid under a name the outsider may read");
    assert_eq!(smuggled.code(), Code::NotFound, "{}", smuggled.message());

    // A restarted node keeps it.
    cluster.nodes[1].terminate();
    cluster.nodes[1].restart();
    expect_everywhere(&cluster, &id, &management, &want).await;

    // A restore brings the snapshot's history: a change after the save is gone from it.
    let saved = crate::support::save_snapshot_as(&cluster.nodes[0], &management).await;
    let mut fourth = third.clone();
    fourth.metadata.insert("team".into(), "bebop".into());
    // Blind: the controller's status moved the version since.
    fourth.version.clear();
    fourth.status.clear();
    let fourth = write_as(&channel, ALICE, fourth)
        .await
        .expect("alice relabels");
    let mut after = want.clone();
    after.insert(0, (fourth.version.clone(), "alice".to_owned()));
    expect_everywhere(&cluster, &id, &management, &after).await;
    let restored = crate::support::restore_as(&cluster.nodes[0], &saved, &management)
        .await
        .expect("restore");
    expect_history(&cluster, &id, &management, &want, false).await;
    // Numbered again below the restore: older than anything written after it.
    let entries = history_on(
        &mut cluster.nodes[0].resources().await,
        id.clone(),
        &management,
    )
    .await
    .expect("the restored history");
    assert!(
        entries.iter().all(|entry| {
            entry
                .version
                .split('.')
                .next()
                .and_then(|index| index.parse::<u64>().ok())
                .is_some_and(|index| index < restored.restored_index)
        }),
        "restored history sorts before the restore at {}: {:?}",
        restored.restored_index,
        entries
            .iter()
            .map(|e| e.version.clone())
            .collect::<Vec<_>>()
    );
}

fn event_as(reporter: &str, message: &str) -> Resource {
    let regarding = miles_id();
    Resource {
        id: Some(Id {
            uid: String::new(),
            name: "miles-forged".into(),
            r#type: Some(proto::resource::v1::Type {
                group: "events".into(),
                group_version: "v1".into(),
                kind: "Event".into(),
            }),
            tenancy: regarding.tenancy.clone(),
        }),
        data: Some(proto::to_any(&proto::events::v1::Event {
            regarding: Some(regarding),
            reason: "Cascaded".into(),
            message: message.into(),
            r#type: proto::events::v1::event::Type::Normal as i32,
            count: 1,
            reporter: reporter.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Attack: a token that may write events records as a built-in controller (`controller/reaper`
/// deleted your data), or puts terminal escapes in a message an operator's `resctl describe`
/// prints. Both are refused; an honest event of its own is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_cannot_claim_a_built_in_controller_or_carry_escapes() {
    let node = crate::process::Resd::start_with(&["--acl-enabled"]);
    let management = crate::acl::bootstrap(&node).await;
    let channel = node.channel().await;
    let events_rule = acl::Rule {
        types: vec!["events.*.*".into()],
        partition: "default".into(),
        namespace: "default".into(),
        name_prefix: String::new(),
        access: acl::Access::Write as i32,
        schema: 0,
    };
    for resource in [
        policy("events-write", vec![events_rule], acl::Access::Unspecified),
        token("recorder", ALICE, &["events-write"], ""),
    ] {
        write_as(&channel, &management, resource)
            .await
            .expect("set up a token");
    }
    let forged = write_as(&channel, ALICE, event_as("controller/reaper", "deleted"))
        .await
        .expect_err("a built-in controller's name");
    assert_eq!(
        forged.code(),
        Code::PermissionDenied,
        "{}",
        forged.message()
    );
    let escaped = write_as(
        &channel,
        ALICE,
        event_as("controller/mine", "\u{1b}[2J gone"),
    )
    .await
    .expect_err("an escape in the message");
    assert_eq!(
        escaped.code(),
        Code::InvalidArgument,
        "{}",
        escaped.message()
    );
    write_as(
        &channel,
        ALICE,
        event_as("controller/mine", "an honest event"),
    )
    .await
    .expect("an event of its own");
}

/// A history past its type's retention keeps the newest versions; a read of a dropped one is
/// OUT_OF_RANGE naming the oldest kept, a read before the object's first (when nothing was
/// dropped) is NOT_FOUND saying when it was created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_past_the_retention_is_out_of_range_naming_the_oldest_kept() {
    let node = crate::process::Resd::start_with(&["--history-versions", "3"]);
    let mut client = node.resources().await;
    let mut versions = Vec::new();
    let mut current: Option<Resource> = None;
    for n in 0..4 {
        let mut artist = current
            .clone()
            .unwrap_or_else(|| artist_in("default", "miles"));
        artist.version.clear();
        artist.status.clear();
        artist.metadata.insert("n".into(), n.to_string());
        let stored = client
            .write(proto::resource::v1::WriteRequest {
                resource: Some(artist),
            })
            .await
            .expect("write")
            .into_inner()
            .resource
            .expect("stored");
        versions.push(stored.version.clone());
        current = Some(stored);
    }
    let read_at = |version: &str| ReadRequest {
        id: Some(miles_id()),
        at_version: version.to_owned(),
    };
    let gone = client
        .read(read_at(&versions[0]))
        .await
        .expect_err("dropped by the retention");
    assert_eq!(gone.code(), Code::OutOfRange, "{}", gone.message());
    assert!(
        gone.message().contains("the oldest kept is"),
        "{}",
        gone.message()
    );
    let kept = client
        .read(read_at(&versions[3]))
        .await
        .expect("the newest is kept")
        .into_inner()
        .resource
        .expect("a resource");
    assert_eq!(kept.metadata.get("n").map(String::as_str), Some("3"));
    let listed = client
        .list_history(ListHistoryRequest {
            id: Some(miles_id()),
            ..Default::default()
        })
        .await
        .expect("history")
        .into_inner()
        .entries;
    assert!(
        listed.len() <= 3,
        "{} entries kept, retention is 3",
        listed.len()
    );
    // An object with nothing dropped: before its creation, NOT_FOUND saying when.
    let dizzy = client
        .write(proto::resource::v1::WriteRequest {
            resource: Some(artist_in("default", "dizzy")),
        })
        .await
        .expect("write")
        .into_inner()
        .resource
        .expect("stored");
    let before = client
        .read(ReadRequest {
            id: dizzy.id.clone().map(|mut id| {
                id.uid.clear();
                id
            }),
            at_version: "1".into(),
        })
        .await
        .expect_err("before its creation");
    assert_eq!(before.code(), Code::NotFound, "{}", before.message());
    assert!(
        before.message().contains("created later"),
        "{}",
        before.message()
    );
}
