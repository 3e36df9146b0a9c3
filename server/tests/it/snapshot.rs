//! Operator snapshots: save, restore on a live cluster, rejection of damaged files.

use std::collections::BTreeMap;
use std::time::Duration;

use proto::resource::v1::{DeleteRequest, Tenancy, WatchListRequest, WriteRequest};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::process::{Cluster, Resd};
use crate::support::{artist, artist_type, list_artists, restore, save_snapshot};

/// name → (uid, data) of every artist on a node (local read).
async fn artists(node: &Resd) -> BTreeMap<String, (String, Vec<u8>, u64)> {
    list_artists(node)
        .await
        .into_iter()
        .map(|r| {
            let id = r.id.clone().unwrap_or_default();
            let version = r.version.parse().unwrap_or(0);
            (
                id.name,
                (id.uid, r.data.map(|d| d.value).unwrap_or_default(), version),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_replaces_the_state_on_every_node_and_aborts_watches() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    for index in 0..30 {
        let mut client = cluster.nodes[leader].resources().await;
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("saved-{index}"))),
            })
            .await
            .expect("write");
    }
    let file = save_snapshot(&cluster.nodes[follower]).await;
    let (header, saved) = proto::snapshot::read(&file).expect("a valid snapshot file");
    assert_eq!(header.counts["demo.v1.Artist"], 30);
    assert_eq!(header.counts["tenancy.v1.Namespace"], 1);
    assert_eq!(saved.len() as u64, header.resource_count);

    // Change things after the save.
    let mut client = cluster.nodes[leader].resources().await;
    for index in 0..10 {
        client
            .write(WriteRequest {
                resource: Some(artist(&format!("later-{index}"))),
            })
            .await
            .expect("write");
    }
    for index in 0..5 {
        let mut id = artist(&format!("saved-{index}")).id.expect("id");
        id.tenancy = Some(Tenancy::default());
        client
            .delete(DeleteRequest {
                id: Some(id),
                version: String::new(),
            })
            .await
            .expect("delete");
    }
    let before = artists(&cluster.nodes[leader]).await;
    let highest_before = before.values().map(|(_, _, v)| *v).max().unwrap_or(0);

    let mut watch = cluster.nodes[follower]
        .resources()
        .await
        .watch_list(WatchListRequest {
            r#type: Some(artist_type()),
            tenancy: Some(Tenancy::default()),
            name_prefix: String::new(),
            since_version: String::new(),
            ..WatchListRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();

    let restored = restore(&cluster.nodes[(leader + 2) % 3], &file)
        .await
        .expect("restore");
    assert!(restored.restored_index > header.raft_index);
    cluster.wait_for_applied(restored.restored_index).await;

    let expected: BTreeMap<String, (String, Vec<u8>)> = saved
        .iter()
        .filter(|r| proto::snapshot::gvk_of(r) == "demo.v1.Artist")
        .map(|r| {
            let id = r.id.clone().unwrap_or_default();
            (
                id.name,
                (id.uid, r.data.clone().map(|d| d.value).unwrap_or_default()),
            )
        })
        .collect();
    for node in &cluster.nodes {
        let now = artists(node).await;
        let without_versions: BTreeMap<String, (String, Vec<u8>)> = now
            .iter()
            .map(|(k, (uid, data, _))| (k.clone(), (uid.clone(), data.clone())))
            .collect();
        assert_eq!(
            without_versions, expected,
            "every node holds exactly the snapshot"
        );
        assert!(
            now.values()
                .all(|(_, _, version)| *version > highest_before),
            "versions keep increasing after a restore"
        );
    }

    // The open watch saw the snapshot, then was aborted.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(item) = watch.next().await {
            if let Err(status) = item {
                return Some(status);
            }
        }
        None
    })
    .await
    .expect("the watch ends");
    let status = ended.expect("the watch ends with an error");
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(
        status.message().contains("restored"),
        "{}",
        status.message()
    );

    // The restored state survives a restart of every node.
    for node in &mut cluster.nodes {
        node.terminate();
    }
    for node in &mut cluster.nodes {
        node.restart();
    }
    let leader = cluster.wait_for_leader().await;
    let index = cluster.nodes[leader]
        .status()
        .await
        .map(|s| s.applied_index)
        .unwrap_or(0);
    cluster.wait_for_applied(index).await;
    for node in &cluster.nodes {
        assert_eq!(artists(node).await.len(), expected.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_snapshots_are_rejected_before_anything_changes() {
    let resd = Resd::start();
    let mut client = resd.resources().await;
    client
        .write(WriteRequest {
            resource: Some(artist("keeper")),
        })
        .await
        .expect("write");
    let file = save_snapshot(&resd).await;
    let before = artists(&resd).await;

    let truncated = &file[..file.len() - 3];
    let status = restore(&resd, truncated).await.expect_err("truncated");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("truncated"),
        "{}",
        status.message()
    );

    let mut corrupt = file.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let status = restore(&resd, &corrupt).await.expect_err("corrupt");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("checksum"),
        "{}",
        status.message()
    );

    let status = restore(&resd, b"not a snapshot at all")
        .await
        .expect_err("garbage");
    assert!(
        status.message().contains("not a resd snapshot"),
        "{}",
        status.message()
    );

    assert_eq!(artists(&resd).await, before, "nothing changed");
}
