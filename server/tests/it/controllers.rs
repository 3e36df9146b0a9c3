//! The built-in controllers on real multi-process clusters.

use std::future::Future;
use std::time::{Duration, Instant};

use proto::cluster::v1::{ListControllersRequest, Placement};
use proto::demo::v2 as demo_v2;
use proto::resource::v1::{
    DeleteRequest, Id, ListByOwnerRequest, ListRequest, ReadRequest, Resource, State, Tenancy,
    Type, WriteRequest,
};

use crate::process::{Cluster, Resd};

fn gvk(group: &str, version: &str, kind: &str) -> Type {
    Type {
        group: group.into(),
        group_version: version.into(),
        kind: kind.into(),
    }
}

fn id_in(resource_type: Type, namespace: &str, name: &str) -> Id {
    Id {
        name: name.into(),
        r#type: Some(resource_type),
        tenancy: Some(Tenancy {
            partition: String::new(),
            namespace: namespace.into(),
        }),
        ..Default::default()
    }
}

fn artist_in(namespace: &str, name: &str, members: &[&str]) -> Resource {
    Resource {
        id: Some(id_in(gvk("demo", "v2", "Artist"), namespace, name)),
        data: Some(proto::to_any(&demo_v2::Artist {
            name: name.into(),
            group_members: members
                .iter()
                .map(|m| (m.to_string(), "plays".to_string()))
                .collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Polls `check` every 100 ms for up to 30 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(value) = check().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 30s");
}

async fn write(node: &Resd, resource: Resource) -> Resource {
    node.resources()
        .await
        .write(WriteRequest {
            resource: Some(resource),
        })
        .await
        .expect("write")
        .into_inner()
        .resource
        .expect("resource")
}

async fn read(node: &Resd, id: &Id) -> Option<Resource> {
    node.resources()
        .await
        .read(ReadRequest {
            id: Some(id.clone()),
            ..Default::default()
        })
        .await
        .ok()
        .and_then(|reply| reply.into_inner().resource)
}

async fn count(node: &Resd, resource_type: Type, namespace: &str) -> usize {
    node.resources()
        .await
        .list(ListRequest {
            r#type: Some(resource_type),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: namespace.into(),
            }),
            name_prefix: String::new(),
            ..ListRequest::default()
        })
        .await
        .map(|reply| reply.into_inner().resources.len())
        .unwrap_or(usize::MAX)
}

/// The albums owned by `artist`, once the artist controller has accepted it.
async fn accepted_albums(node: &Resd, artist: &Id, expected: usize) -> Vec<Resource> {
    eventually("albums and Accepted", || async {
        let stored = read(node, artist).await?;
        let accepted = stored
            .status
            .get("demo.resd.io/artist")
            .is_some_and(|status| {
                status.observed_generation == stored.generation
                    && status
                        .conditions
                        .iter()
                        .any(|c| c.r#type == "Accepted" && c.state == State::True as i32)
            });
        let albums = node
            .resources()
            .await
            .list_by_owner(ListByOwnerRequest {
                owner: stored.id.clone(),
                ..ListByOwnerRequest::default()
            })
            .await
            .ok()?
            .into_inner()
            .resources;
        (accepted && albums.len() == expected).then_some(albums)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artist_gets_its_albums_and_deleting_it_removes_them_and_the_tombstones() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = &cluster.nodes[(leader + 1) % 3];
    let stored = write(follower, artist_in("", "the-band", &["robbie", "levon"])).await;
    let artist_id = stored.id.clone().expect("id");
    let albums = accepted_albums(follower, &artist_id, 3).await;
    for album in &albums {
        let owner = album.owner.as_ref().expect("owned");
        assert_eq!(
            owner.uid, artist_id.uid,
            "albums are owned by this incarnation"
        );
        assert!(
            album
                .metadata
                .get("finalizers")
                .is_some_and(|f| f.contains("demo.resd.io/album-cleanup")),
            "the album controller holds its finalizer"
        );
    }

    follower
        .resources()
        .await
        .delete(DeleteRequest {
            id: Some(artist_id.clone()),
            version: String::new(),
        })
        .await
        .expect("delete");
    eventually("albums and tombstones gone", || async {
        let albums = count(follower, gvk("demo", "v2", "Album"), "*").await;
        let tombstones = count(follower, gvk("internal", "v1", "Tombstone"), "*").await;
        (albums == 0 && tombstones == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_leader_dies_singletons_run_on_the_new_leader_and_keep_reconciling() {
    let mut cluster = Cluster::start(3, &[]).await;
    let old_leader = cluster.wait_for_leader().await;
    cluster.nodes[old_leader].kill9();
    let new_leader = eventually("a new leader", || async {
        cluster
            .leader()
            .await
            .filter(|leader| *leader != old_leader)
    })
    .await;
    let survivor = &cluster.nodes[new_leader];
    let placement = eventually("the reaper running on the new leader", || async {
        let reply = survivor
            .cluster()
            .await
            .list_controllers(ListControllersRequest { all_nodes: true })
            .await
            .ok()?
            .into_inner();
        let running_reaper: Vec<u64> = reply
            .nodes
            .iter()
            .filter(|node| {
                node.controllers.iter().any(|c| {
                    c.name == "reaper" && c.running && c.placement == Placement::Singleton as i32
                })
            })
            .map(|node| node.node_id)
            .collect();
        let each_server = reply
            .nodes
            .iter()
            .filter(|node| {
                node.controllers
                    .iter()
                    .any(|c| c.name == "demo-concept-observer" && c.running)
            })
            .count();
        (running_reaper == [new_leader as u64 + 1]).then_some(each_server)
    })
    .await;
    assert_eq!(
        placement, 2,
        "the EachServer controller runs on both live nodes"
    );

    let stored = write(survivor, artist_in("", "after-failover", &[])).await;
    accepted_albums(survivor, &stored.id.expect("id"), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_namespace_deletes_everything_in_it() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let node = &cluster.nodes[leader];
    let namespace_id = id_in(gvk("tenancy", "v1", "Namespace"), "", "jazz");
    let mut namespace_id = namespace_id;
    namespace_id.tenancy = Some(Tenancy::default());
    write(
        node,
        Resource {
            id: Some(namespace_id.clone()),
            ..Default::default()
        },
    )
    .await;
    eventually("the namespace finalizer", || async {
        read(node, &namespace_id)
            .await?
            .metadata
            .get("finalizers")
            .filter(|f| f.contains("tenancy.resd.io/namespace-cleanup"))
            .map(|_| ())
    })
    .await;
    let monk = write(node, artist_in("jazz", "monk", &["art"])).await;
    accepted_albums(node, &monk.id.expect("id"), 2).await;

    node.resources()
        .await
        .delete(DeleteRequest {
            id: Some(namespace_id.clone()),
            version: String::new(),
        })
        .await
        .expect("delete the namespace");
    eventually("the namespace and its contents gone", || async {
        let gone = read(node, &namespace_id).await.is_none();
        let artists = count(node, gvk("demo", "v2", "Artist"), "jazz").await;
        let albums = count(node, gvk("demo", "v2", "Album"), "jazz").await;
        (gone && artists == 0 && albums == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controllers_restart_after_a_restore_closes_their_watches() {
    use proto::cluster::v1::SnapshotData;

    let resd = Resd::start();
    let before = write(&resd, artist_in("", "before", &[])).await;
    accepted_albums(&resd, &before.id.clone().expect("id"), 1).await;

    let file = crate::support::save_snapshot(&resd).await;
    resd.cluster()
        .await
        .snapshot_restore(tokio_stream::iter(vec![SnapshotData { data: file }]))
        .await
        .expect("restore");

    // The restore aborted every controller watch; they restart with fresh state and go on.
    let after = write(&resd, artist_in("", "after-restore", &["one"])).await;
    accepted_albums(&resd, &after.id.expect("id"), 2).await;
}
