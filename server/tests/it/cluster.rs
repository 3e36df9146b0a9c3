//! Multi-process clusters: writes through followers, leader failure under CAS writes, restarts,
//! and catching up through a snapshot.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use proto::resource::v1::{ReadRequest, Resource, WriteRequest};

use crate::process::{Cluster, Resd};
use crate::support::{artist, artist_id, list_artists};

async fn write(node: &Resd, resource: Resource) -> Result<Resource, tonic::Status> {
    let mut client = node.resources().await;
    client
        .write(WriteRequest {
            resource: Some(resource),
        })
        .await
        .map(|reply| reply.into_inner().resource.unwrap_or_default())
}

/// Names of the artists this node has applied (an eventual, local read).
async fn local_artists(node: &Resd) -> BTreeSet<String> {
    list_artists(node)
        .await
        .into_iter()
        .filter_map(|r| r.id.map(|id| id.name))
        .collect()
}

/// The highest applied index among the running nodes' leader.
async fn leader_applied(cluster: &Cluster) -> u64 {
    let leader = cluster.wait_for_leader().await;
    cluster.nodes[leader]
        .status()
        .await
        .map(|s| s.applied_index)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_a_follower_are_readable_on_every_node() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    let written = write(&cluster.nodes[follower], artist("miles"))
        .await
        .expect("write through a follower");
    let version: u64 = written.version.parse().expect("versions are raft indexes");
    cluster.wait_for_applied(version).await;
    for node in &cluster.nodes {
        let mut client = node.resources().await;
        let read = client
            .read(ReadRequest {
                id: Some(artist_id("miles")),
                ..Default::default()
            })
            .await
            .expect("local read")
            .into_inner()
            .resource;
        assert_eq!(read.as_ref(), Some(&written));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_cas_writes_loses_no_acknowledged_write() {
    let mut cluster = Cluster::start(3, &[]).await;
    let old_leader = cluster.wait_for_leader().await;
    let mut acknowledged = BTreeSet::new();
    let mut counter: Option<Resource> = None;
    let mut killed = false;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut attempt = 0usize;
    // Before the kill: 30 acknowledged writes; after: 30 more.
    while acknowledged.len() < 60 && Instant::now() < deadline {
        if !killed && acknowledged.len() == 30 {
            cluster.nodes[old_leader].kill9();
            killed = true;
        }
        attempt += 1;
        let running: Vec<usize> = (0..3).filter(|i| !(killed && *i == old_leader)).collect();
        let node = &cluster.nodes[running[attempt % running.len()]];
        // A CAS update of a shared counter, then a create: both must survive once acknowledged.
        let mut next = counter.clone().unwrap_or_else(|| artist("counter"));
        next.metadata.insert("count".into(), attempt.to_string());
        match write(node, next).await {
            Ok(stored) => counter = Some(stored),
            Err(status) if status.code() == tonic::Code::Aborted => {
                // Lost the race with an earlier attempt that did land: read the current version.
                let mut client = node.resources().await;
                let mut strong = tonic::Request::new(ReadRequest {
                    id: Some(artist_id("counter")),
                    ..Default::default()
                });
                strong.metadata_mut().insert(
                    "x-resd-consistency-mode",
                    "consistent".parse().expect("ascii"),
                );
                if let Ok(reply) = client.read(strong).await {
                    counter = reply.into_inner().resource;
                }
            }
            Err(_) => {}
        }
        let name = format!("w-{attempt}");
        if write(node, artist(&name)).await.is_ok() {
            acknowledged.insert(name);
        }
    }
    assert!(killed, "the leader was killed");
    assert_eq!(
        acknowledged.len(),
        60,
        "writes continued after the failover"
    );
    let new_leader = cluster.wait_for_leader().await;
    assert_ne!(new_leader, old_leader, "a new leader was elected");

    let target = leader_applied(&cluster).await;
    cluster.wait_for_applied(target).await;
    for (index, node) in cluster.nodes.iter().enumerate() {
        if index == old_leader {
            continue;
        }
        let present = local_artists(node).await;
        let missing: Vec<&String> = acknowledged.difference(&present).collect();
        assert!(
            missing.is_empty(),
            "node {} lacks acknowledged writes {missing:?}",
            index + 1
        );
    }

    cluster.nodes[old_leader].restart();
    cluster.wait_for_applied(target).await;
    let present = local_artists(&cluster.nodes[old_leader]).await;
    let missing: Vec<&String> = acknowledged.difference(&present).collect();
    assert!(missing.is_empty(), "the restarted node lacks {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_and_restarted_cluster_keeps_its_data() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let mut names = BTreeSet::new();
    for index in 0..20 {
        let name = format!("keep-{index}");
        write(&cluster.nodes[leader], artist(&name))
            .await
            .expect("write");
        names.insert(name);
    }
    for node in &mut cluster.nodes {
        let status = node.terminate();
        assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    }
    for node in &mut cluster.nodes {
        node.restart();
    }
    let target = leader_applied(&cluster).await;
    cluster.wait_for_applied(target).await;
    for node in &cluster.nodes {
        assert!(
            names.is_subset(&local_artists(node).await),
            "data survives a full restart"
        );
    }
    // And the cluster takes writes again.
    let leader = cluster.wait_for_leader().await;
    write(&cluster.nodes[leader], artist("after-restart"))
        .await
        .expect("write after restart");
}

/// A follower stops promptly on SIGTERM while its leader keeps running (the leader's append
/// stream to it stays open; the follower ends it instead of waiting for the leader to), and
/// rejoins when restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_stops_promptly_while_its_leader_runs() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    write(&cluster.nodes[leader], artist("before-stop"))
        .await
        .expect("write");
    let follower = (leader + 1) % cluster.nodes.len();
    // Inside the servers' shutdown grace period (10 s): the stream must end, not time out.
    let status = cluster.nodes[follower]
        .terminate_within(Duration::from_secs(8))
        .expect("a follower exits within 8 s of SIGTERM while its leader runs");
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    write(&cluster.nodes[leader], artist("while-stopped"))
        .await
        .expect("the remaining two take writes");
    cluster.nodes[follower].restart();
    let target = leader_applied(&cluster).await;
    cluster.wait_for_applied(target).await;
    let names = local_artists(&cluster.nodes[follower]).await;
    assert!(names.contains("before-stop") && names.contains("while-stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_after_a_snapshot_catches_up_through_it() {
    let mut cluster = Cluster::start(3, &["--snapshot-every", "20"]).await;
    let leader = cluster.wait_for_leader().await;
    let mut names = BTreeSet::new();
    for index in 0..120 {
        let name = format!("early-{index}");
        write(&cluster.nodes[leader], artist(&name))
            .await
            .expect("write");
        names.insert(name);
    }
    let newcomer = cluster.add_node(&["--snapshot-every", "20"]).await;
    cluster.wait_for_members(4).await;
    let target = leader_applied(&cluster).await;
    cluster.wait_for_applied(target).await;
    assert!(names.is_subset(&local_artists(&cluster.nodes[newcomer]).await));
    let status = cluster.nodes[newcomer].status().await.expect("status");
    assert!(
        status.snapshot_index > 0,
        "the new node installed a snapshot (the log before it was purged): {status:?}"
    );
}
