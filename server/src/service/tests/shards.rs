//! WatchList by shard (DESIGN §16, "Shards"): a member gets exactly the objects the ShardMap
//! gives it, the difference when the ring changes (what left it as Deletes at once, what comes
//! to it as Upserts once settled), and the attacker's requests are refused.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use proto::coordination::v1::{ShardMap, ShardMember};
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{ShardSelector, WatchListRequest};
use tonic::Code;

use super::*;
use crate::acl::{Access, KeyRules};
use crate::service::read::WatchStream;

fn map_resource(members: &[&str], ring: u64, settled: &[&str], settled_ring: u64) -> Resource {
    Resource {
        id: Some(id("coordination.v1.ShardMap", default_ns(), "artists")),
        data: Some(proto::to_any(&ShardMap {
            controller: "artists".into(),
            members: members
                .iter()
                .map(|m| ShardMember {
                    name: (*m).into(),
                    lease: format!("lease-{m}"),
                    acked_ring_version: 0,
                })
                .collect(),
            ring_version: ring,
            settled_members: settled.iter().map(|s| (*s).to_owned()).collect(),
            settled_ring_version: settled_ring,
            managed_type: None,
        })),
        ..Default::default()
    }
}

fn request(member: &str) -> WatchListRequest {
    WatchListRequest {
        r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
        tenancy: Some(default_ns()),
        shard: Some(ShardSelector {
            controller: "artists".into(),
            member: member.into(),
            ..ShardSelector::default()
        }),
        ..WatchListRequest::default()
    }
}

async fn watch(h: &Harness, member: &str) -> WatchStream {
    h.service
        .watch_list(Arc::new(AllowAll), request(member))
        .await
        .expect("watch")
}

/// What a member is sent until nothing comes for a while: upserted and deleted names, and
/// whether an EndOfSnapshot came.
async fn drain(stream: &mut WatchStream) -> (BTreeSet<String>, BTreeSet<String>, bool) {
    let (mut upserts, mut deletes, mut end) = (BTreeSet::new(), BTreeSet::new(), false);
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(400), stream.next()).await
    {
        match event.expect("no error").event {
            Some(Event::Upsert(u)) => {
                upserts.insert(u.resource.and_then(|r| r.id).expect("id").name);
            }
            Some(Event::Delete(d)) => {
                deletes.insert(d.resource.and_then(|r| r.id).expect("id").name);
            }
            Some(Event::EndOfSnapshot(_)) => end = true,
            _ => {}
        }
    }
    (upserts, deletes, end)
}

fn owned_by(names: &[String], members: &[&str], member: &str) -> BTreeSet<String> {
    names
        .iter()
        .filter(|name| {
            let id = id("demo.v2.Artist", tenancy("default", "default"), name);
            proto::shard::owner(members.iter().copied(), &proto::shard::ShardKey::of(&id))
                == Some(member)
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_member_is_sent_its_objects_and_the_difference_at_each_ring_change() {
    let h = harness().await;
    let names: Vec<String> = (0..40).map(|n| format!("artist-{n}")).collect();
    for name in &names {
        h.write(artist(name)).await.expect("artist");
    }
    let stored = h
        .write(map_resource(&["a"], 1, &["a"], 1))
        .await
        .expect("map");
    let mut a = watch(&h, "a").await;
    let mut b = watch(&h, "b").await;
    let (upserts, deletes, end) = drain(&mut a).await;
    assert!(end && deletes.is_empty());
    assert_eq!(
        upserts,
        names.iter().cloned().collect(),
        "a owns everything"
    );
    let (upserts, _, end) = drain(&mut b).await;
    assert!(
        end && upserts.is_empty(),
        "b is not in the ring: {upserts:?}"
    );

    // b joins; not settled: what b will own leaves a at once, and reaches nobody yet.
    let for_b = owned_by(&names, &["a", "b"], "b");
    assert!(!for_b.is_empty() && for_b.len() < names.len());
    let mut joining = map_resource(&["a", "b"], 2, &["a"], 1);
    joining.version = stored.version.clone();
    let stored = h.write(joining).await.expect("b joins");
    let (upserts, deletes, _) = drain(&mut a).await;
    assert!(upserts.is_empty(), "{upserts:?}");
    assert_eq!(deletes, for_b, "what b will own leaves a");
    let (upserts, deletes, _) = drain(&mut b).await;
    assert!(
        upserts.is_empty() && deletes.is_empty(),
        "b waits for the handover"
    );

    // Settled: b is sent its objects; a nothing.
    let mut settled = map_resource(&["a", "b"], 2, &["a", "b"], 2);
    settled.version = stored.version.clone();
    h.write(settled).await.expect("settled");
    let (upserts, deletes, _) = drain(&mut b).await;
    assert_eq!(upserts, for_b, "b gets exactly its objects");
    assert!(deletes.is_empty());
    let (upserts, deletes, _) = drain(&mut a).await;
    assert!(
        upserts.is_empty() && deletes.is_empty(),
        "{upserts:?} {deletes:?}"
    );

    // Changes go to their owner only.
    let new_names: Vec<String> = (40..60).map(|n| format!("artist-{n}")).collect();
    for name in &new_names {
        h.write(artist(name)).await.expect("artist");
    }
    let (upserts_b, _, _) = drain(&mut b).await;
    let (upserts_a, _, _) = drain(&mut a).await;
    assert_eq!(upserts_b, owned_by(&new_names, &["a", "b"], "b"));
    assert_eq!(upserts_a, owned_by(&new_names, &["a", "b"], "a"));
    let gone = for_b.iter().next().expect("one of b's").clone();
    h.delete(&id("demo.v2.Artist", default_ns(), &gone), "")
        .await
        .expect("delete");
    let (_, deletes, _) = drain(&mut b).await;
    assert_eq!(deletes, [gone].into());
    let (_, deletes, _) = drain(&mut a).await;
    assert!(deletes.is_empty());
}

#[tokio::test]
async fn shard_watches_the_attacker_sends_are_refused() {
    let h = harness().await;
    // Resumed: cannot be (the objects move with the ring).
    let mut resumed = request("a");
    resumed.since_version = "1".into();
    let refused = h.service.watch_list(Arc::new(AllowAll), resumed).await;
    expect_error(refused.map(drop), Code::OutOfRange, "cannot be resumed");
    // No member, a control character, a wildcard with nowhere for the map.
    for (member, namespace, why) in [
        ("", "", "shard.member"),
        ("a\u{7}", "", "shard.member"),
        ("a", "*", "where the ShardMap lives"),
    ] {
        let mut bad = request(member);
        bad.tenancy = Some(tenancy("default", namespace));
        let refused = h.service.watch_list(Arc::new(AllowAll), bad).await;
        expect_error(refused.map(drop), Code::InvalidArgument, why);
    }
}

/// A team's token that may write in the namespace — coordination types included — may not
/// write a ShardMap by hand (it would hand itself another member's objects); an operator may.
#[tokio::test]
async fn a_shard_map_written_by_hand_is_refused_unless_by_an_operator() {
    let h = harness().await;
    let team = KeyRules::default().key_prefix("resource/", Access::Write);
    expect_error(
        h.write_as(&team, map_resource(&["mine"], 1, &["mine"], 1))
            .await,
        Code::PermissionDenied,
        "kept by the server's `shards` controller",
    );
    let operator = KeyRules::default()
        .key_prefix("resource/", Access::Write)
        .operator(Access::Write);
    h.write_as(&operator, map_resource(&["a"], 1, &["a"], 1))
        .await
        .expect("an operator repairs a map");
}

/// What a map or a sharded report names is printed by resctl and the dashboard, and names a
/// ShardMap: control characters are refused even from an operator, and a sharded controller's
/// name must be a resource name.
#[tokio::test]
async fn shard_names_are_printable_and_a_sharded_controller_names_a_map() {
    let h = harness().await;
    let operator = KeyRules::default()
        .key_prefix("resource/", Access::Write)
        .operator(Access::Write);
    expect_error(
        h.write_as(&operator, map_resource(&["a\u{1b}[2J"], 1, &["a"], 1))
            .await,
        Code::InvalidArgument,
        "resource.data.members[].name",
    );
    let identity = "replica-1";
    let report = |controller: &str| Resource {
        id: Some(id(
            "coordination.v1.Replica",
            default_ns(),
            &runtime::report::member_name(controller, identity),
        )),
        data: Some(proto::to_any(&proto::coordination::v1::Replica {
            controller: controller.into(),
            identity: identity.into(),
            placement: proto::coordination::v1::ReplicaPlacement::Sharded as i32,
            lease: runtime::report::member_name(controller, identity),
            managed_type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
            ..Default::default()
        })),
        ..Default::default()
    };
    // 64 characters: its report's name (cut to fit) is valid, a ShardMap of that name is not.
    expect_error(
        h.write(report(&"invoices".repeat(8))).await,
        Code::InvalidArgument,
        "a sharded controller's name names its ShardMap",
    );
    h.write(report("invoices")).await.expect("a valid report");
}
