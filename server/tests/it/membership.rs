//! Membership an operator can trust (DESIGN §8), with real processes: a join to an address where
//! nothing listens fails and changes nothing; a join under write load promotes only a caught-up
//! learner; removals never take the last voter or (without force) a quorum of reachable voters;
//! a member that is down can be removed, and its lag is unknown rather than 0.

use std::time::{Duration, Instant};

use proto::cluster::v1::{JoinRequest, MembersRequest, MembersResponse, RemoveRequest};
use proto::resource::v1::WriteRequest;
use tonic::Code;

use crate::process::{Cluster, free_port};
use crate::support::artist;

async fn members(cluster: &Cluster) -> MembersResponse {
    let leader = cluster.wait_for_leader().await;
    cluster.nodes[leader]
        .cluster()
        .await
        .members(MembersRequest {})
        .await
        .expect("members")
        .into_inner()
}

async fn remove(cluster: &Cluster, node_id: u64, force: bool) -> Result<(), tonic::Status> {
    let leader = cluster.wait_for_leader().await;
    let mut request = tonic::Request::new(RemoveRequest { node_id, force });
    request.set_timeout(Duration::from_secs(30));
    cluster.nodes[leader]
        .cluster()
        .await
        .remove(request)
        .await
        .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_an_address_where_nothing_listens_fails_and_changes_nothing() {
    let cluster = Cluster::start(1, &[]).await;
    let dead_raft = format!("127.0.0.1:{}", free_port());
    let started = Instant::now();
    let refused = cluster.nodes[0]
        .cluster()
        .await
        .join(JoinRequest {
            node_id: 4,
            api_addr: format!("127.0.0.1:{}", free_port()),
            raft_addr: dead_raft.clone(),
            from_node: false,
        })
        .await
        .expect_err("nothing listens there");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains(&dead_raft), "{refused:?}");
    assert!(
        refused.message().contains("membership is unchanged"),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let after = members(&cluster).await;
    assert_eq!(after.members.len(), 1, "{after:?}");
    // And the cluster still takes writes: quorum is still 1 of 1.
    cluster.nodes[0]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("after-the-failed-join")),
        })
        .await
        .expect("still writable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_under_write_load_promotes_only_a_caught_up_learner() {
    let mut cluster = Cluster::start(2, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let channel = cluster.nodes[leader].channel().await;
    let writer = tokio::spawn(async move {
        let mut client =
            proto::resource::v1::resource_service_client::ResourceServiceClient::new(channel);
        for index in 0..600 {
            let _ = client
                .write(WriteRequest {
                    resource: Some(artist(&format!("load-{index}"))),
                })
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joined = cluster.add_node(&[]).await;
    let node_id = joined as u64 + 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = members(&cluster).await;
        if let Some(member) = view.members.iter().find(|m| m.node_id == node_id)
            && member.voter
        {
            // Promoted: it answers and holds (nearly) the leader's log.
            assert!(member.reachable, "{member:?}");
            assert!(member.match_index > 0, "{member:?}");
            assert!(member.lag.is_some_and(|lag| lag < 500), "{member:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {node_id} never became a voter: {view:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writer.await.expect("the writer finished");
    cluster.wait_for_members(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removals_keep_a_quorum_and_never_take_the_last_voter() {
    let mut cluster = Cluster::start(3, &[]).await;

    // Node 3 goes down: the leader reports it unreachable, its lag unknown.
    cluster.nodes[2].kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = members(&cluster).await;
        let third = view.members.iter().find(|m| m.node_id == 3).cloned();
        if third
            .as_ref()
            .is_some_and(|m| !m.reachable && m.lag.is_none())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 still looks reachable: {third:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Removing a live voter now would leave 1 reachable of 2: refused without force.
    let leader = cluster.wait_for_leader().await;
    let other = if leader == 0 { 2 } else { 1 };
    let refused = remove(&cluster, other, false)
        .await
        .expect_err("below quorum");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("quorum"), "{refused:?}");

    // The member that is down can be removed.
    remove(&cluster, 3, false)
        .await
        .expect("remove the dead member");
    assert_eq!(members(&cluster).await.members.len(), 2);

    // Down to one voter, then never the last.
    let leader = cluster.wait_for_leader().await;
    let follower = if leader == 0 { 2 } else { 1 };
    remove(&cluster, follower, false)
        .await
        .expect("remove down to one voter");
    let view = members(&cluster).await;
    assert_eq!(view.members.len(), 1, "{view:?}");
    let last = view.members[0].node_id;
    let refused = remove(&cluster, last, true)
        .await
        .expect_err("the last voter stays");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("last voter"), "{refused:?}");
    // The single remaining voter still takes writes.
    cluster.nodes[leader]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("one-voter-left")),
        })
        .await
        .expect("writable with one voter");
}

#[test]
fn a_data_directory_of_another_node_or_cluster_is_refused_at_start() {
    let data = tempfile::tempdir().expect("temp dir");
    let run = |node_id: &str, cluster: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_resd"))
            .args([
                "agent",
                "--node-id",
                node_id,
                "--cluster-name",
                cluster,
                "--data-dir",
                &data.path().display().to_string(),
                "--api-addr",
                "127.0.0.1:0",
                "--raft-addr",
                "127.0.0.1:0",
                "--bootstrap",
                "--insecure",
            ])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn resd")
    };
    // Node 1 of cluster prod takes the directory, and stops.
    let mut first = run("1", "prod");
    let stdout = first.stdout.take().expect("stdout");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let serving = lines
        .find(|line| {
            line.as_ref()
                .is_ok_and(|l| l.starts_with("resd: serving gRPC on"))
        })
        .is_some();
    assert!(serving, "node 1 started");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status();
    let _ = first.wait();

    for (node_id, cluster, needle) in [
        ("2", "prod", "belongs to node 1"),
        ("1", "dev", "cluster \"prod\""),
    ] {
        let output = run(node_id, cluster)
            .wait_with_output()
            .expect("resd exits");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_each_node_in_turn_while_writes_go_on() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use proto::cluster::v1::{ListControllersRequest, TransferLeaderRequest};

    let cluster = Cluster::start(3, &[]).await;
    // Writers through every node; each acknowledged name is remembered.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for (index, node) in cluster.nodes.iter().enumerate() {
        let channel = node.channel().await;
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut client =
                proto::resource::v1::resource_service_client::ResourceServiceClient::new(channel);
            let mut acknowledged = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) && n < 10_000 {
                let name = format!("w{index}-{n}");
                n += 1;
                if client
                    .write(WriteRequest {
                        resource: Some(artist(&name)),
                    })
                    .await
                    .is_ok()
                {
                    acknowledged.push(name);
                }
            }
            acknowledged
        }));
    }

    for target in [2u64, 3, 1] {
        let mut request = tonic::Request::new(TransferLeaderRequest {
            to_node_id: target,
            campaign: false,
        });
        request.set_timeout(Duration::from_secs(30));
        // Asked through a node that is not the target, leader or not.
        let via = (target as usize) % 3;
        let reply = cluster.nodes[via]
            .cluster()
            .await
            .transfer_leader(request)
            .await
            .unwrap_or_else(|status| panic!("transfer to node {target}: {status:?}"))
            .into_inner();
        assert_eq!(reply.leader_id, target);
        let leader = cluster.wait_for_leader().await;
        assert_eq!(leader as u64 + 1, target, "node {target} leads");
        // The singleton controllers run on the new leader.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let listing = cluster.nodes[leader]
                .cluster()
                .await
                .list_controllers(ListControllersRequest { all_nodes: false })
                .await
                .expect("controllers")
                .into_inner();
            let running = listing.nodes.iter().any(|node| {
                node.controllers
                    .iter()
                    .any(|c| c.name == "demo-artist" && c.running)
            });
            if running {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the controllers did not follow: {listing:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for writer in writers {
        acknowledged.extend(writer.await.expect("writer"));
    }
    assert!(
        acknowledged.len() > 30,
        "writes went on: {}",
        acknowledged.len()
    );
    // No acknowledged write is lost.
    let leader = cluster.wait_for_leader().await;
    let stored: std::collections::BTreeSet<String> =
        crate::support::list_artists(&cluster.nodes[leader])
            .await
            .into_iter()
            .filter_map(|r| r.id.map(|id| id.name))
            .collect();
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !stored.contains(*n))
        .collect();
    assert!(lost.is_empty(), "lost acknowledged writes: {lost:?}");
}

/// The recovery the damaged-log error prescribes: remove the node while it is down, move its
/// data aside, join it again empty under the same id. It rejoins while the leader is still
/// retrying the removal notice meant for its earlier incarnation; it must not take it.
/// A quiet maintenance window: leadership moves on an idle cluster (nothing written while it
/// moves), three times in a row, each within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_on_an_idle_cluster() {
    use proto::cluster::v1::TransferLeaderRequest;
    let cluster = Cluster::start(3, &[]).await;
    let first = cluster.wait_for_leader().await;
    // Let the cluster settle: no writes from here on.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut leader = first;
    for round in 0..3 {
        let target = (leader + 1) % 3;
        let mut request = tonic::Request::new(TransferLeaderRequest {
            to_node_id: target as u64 + 1,
            campaign: false,
        });
        request.set_timeout(Duration::from_secs(10));
        let started = Instant::now();
        let reply = tokio::time::timeout(
            Duration::from_secs(5),
            cluster.nodes[leader]
                .cluster()
                .await
                .transfer_leader(request),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "round {round}: the transfer to node {} took over 5 s",
                target + 1
            )
        })
        .unwrap_or_else(|status| {
            panic!("round {round}: transfer to node {}: {status:?}", target + 1)
        })
        .into_inner();
        assert_eq!(reply.leader_id, target as u64 + 1);
        eprintln!(
            "round {round}: leadership moved to node {} in {:?}",
            target + 1,
            started.elapsed()
        );
        leader = cluster.wait_for_leader().await;
        assert_eq!(leader, target, "node {} leads", target + 1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_while_down_and_joined_again_empty_keeps_serving() {
    use proto::cluster::v1::Role;

    let mut cluster = Cluster::start(3, &[]).await;
    cluster.wait_for_members(3).await;
    cluster.nodes[2].kill9();
    remove(&cluster, 3, false).await.expect("remove node 3");
    std::fs::remove_dir_all(cluster.data_dir(2)).expect("move node 3's data aside");
    cluster.nodes[2].restart();
    cluster.wait_for_members(3).await;
    // The leader retries its notice for ~10 s; past that, node 3 must still be a serving
    // member.
    let deadline = Instant::now() + Duration::from_secs(14);
    while Instant::now() < deadline {
        if let Some(status) = cluster.nodes[2].status().await {
            assert_ne!(
                status.role,
                Role::Removed as i32,
                "the rejoined node took the old removal for itself: {status:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status = cluster.nodes[2].status().await.expect("status of node 3");
    assert!(status.ready, "{status:?}");
    cluster.nodes[2]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("after-rejoin")),
        })
        .await
        .expect("a write through the rejoined node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_node_serves_nothing_and_says_why_also_after_a_restart() {
    use proto::cluster::v1::{Role, StatusRequest};
    use proto::resource::v1::ReadRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let mut cluster = Cluster::start(3, &[]).await;
    let node_3 = members(&cluster)
        .await
        .members
        .into_iter()
        .find(|member| member.node_id == 3)
        .expect("node 3 is a member");
    remove(&cluster, 3, false).await.expect("remove node 3");
    let removed = &cluster.nodes[2];
    // An operator's join of the removed id (its data directory remembers the removal) is
    // refused, naming the removal; the members stay two.
    let leader = cluster.wait_for_leader().await;
    let refused = cluster.nodes[leader]
        .cluster()
        .await
        .join(JoinRequest {
            node_id: 3,
            api_addr: node_3.api_addr.clone(),
            raft_addr: node_3.raft_addr.clone(),
            from_node: false,
        })
        .await
        .expect_err("a removed id joins again only by itself, with an empty data directory");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("was removed"), "{refused:?}");
    assert_eq!(members(&cluster).await.members.len(), 2);
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let read = removed
            .resources()
            .await
            .read(ReadRequest {
                id: Some(crate::support::artist_id("anything")),
                ..Default::default()
            })
            .await;
        match read {
            Err(status) if status.code() == Code::FailedPrecondition => break status,
            other => {
                assert!(Instant::now() < deadline, "node 3 still serves: {other:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        refused
            .message()
            .contains("node 3 was removed from cluster resd"),
        "{refused:?}"
    );

    let check = |node: &crate::process::Resd| {
        let endpoint = node.endpoint();
        async move {
            let channel = endpoint.connect().await.expect("connect");
            let health = HealthClient::new(channel.clone())
                .check(HealthCheckRequest {
                    service: "resd.resource.v1.ResourceService".into(),
                })
                .await
                .expect("health")
                .into_inner()
                .status;
            // The whole server's status (what load balancers ask for) follows.
            let overall = HealthClient::new(channel.clone())
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .expect("health")
                .into_inner()
                .status;
            let health = if overall == health { health } else { -1 };
            let status =
                proto::cluster::v1::cluster_service_client::ClusterServiceClient::new(channel)
                    .status(StatusRequest {})
                    .await
                    .expect("status")
                    .into_inner();
            (health, status)
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (health, status) = check(removed).await;
        if health == ServingStatus::NotServing as i32 {
            assert_eq!(status.role, Role::Removed as i32, "{status:?}");
            assert_eq!(
                status.leader_id, 0,
                "a removed node claims no leader: {status:?}"
            );
            assert!(!status.ready, "{status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "health stayed {health}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // After a restart it still knows, and never campaigns.
    cluster.nodes[2].kill9();
    cluster.nodes[2].restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (health, status) = check(&cluster.nodes[2]).await;
    assert_eq!(health, ServingStatus::NotServing as i32);
    assert_eq!(status.role, Role::Removed as i32, "{status:?}");
    // The two remaining members serve on, with a stable leader.
    let view = members(&cluster).await;
    assert_eq!(view.members.len(), 2, "{view:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_removes_itself_and_the_others_go_on() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let leader_id = leader as u64 + 1;
    remove(&cluster, leader_id, false)
        .await
        .expect("the leader removes itself");
    // The others elect a leader among themselves, list only themselves, and take writes.
    let others: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = cluster.nodes[others[0]]
            .cluster()
            .await
            .members(MembersRequest {})
            .await;
        if let Ok(reply) = answer {
            let reply = reply.into_inner();
            let ids: Vec<u64> = reply.members.iter().map(|m| m.node_id).collect();
            if reply.leader_id != 0 && reply.leader_id != leader_id && !ids.contains(&leader_id) {
                assert_eq!(ids.len(), 2, "{ids:?}");
                break;
            }
        }
        assert!(Instant::now() < deadline, "no leader among the others");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.nodes[others[1]]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("after-the-leader-left")),
        })
        .await
        .expect("a write after the old leader left");
    cluster.nodes[leader].kill9();
}

/// Quorum loss, as the operator meets it: with two of three nodes killed, the survivor's
/// `Status` and `Members` answer at once, both saying there is no leader, and `Status.ready`
/// agrees with `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_quorum_says_so_at_once() {
    use proto::cluster::v1::StatusRequest;
    let mut cluster = Cluster::start_with_http(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let survivor = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let written = cluster.nodes[leader]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("before-the-loss")),
        })
        .await
        .expect("a write")
        .into_inner()
        .resource
        .expect("stored");
    // Let the followers apply it before the leader goes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.nodes[leader].kill9();
    cluster.nodes[other].kill9();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let started = Instant::now();
        let status = tokio::time::timeout(
            Duration::from_secs(1),
            cluster.nodes[survivor]
                .cluster()
                .await
                .status(StatusRequest {}),
        )
        .await
        .expect("Status answers within 1 s")
        .expect("status")
        .into_inner();
        assert!(started.elapsed() < Duration::from_secs(1));
        if status.leader_id == 0 {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the survivor still knows a leader: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!status.ready, "{status:?}");
    assert!(
        status
            .not_ready_reason
            .contains("no leader: this node has heard from 1 of 3 voters"),
        "{status:?}"
    );
    let (code, body) = cluster.nodes[survivor]
        .http_get("/readyz")
        .expect("/readyz answers");
    assert_eq!(code, 503, "{body}");
    let started = Instant::now();
    let view = tokio::time::timeout(
        Duration::from_secs(1),
        cluster.nodes[survivor]
            .cluster()
            .await
            .members(MembersRequest {}),
    )
    .await
    .expect("Members answers within 1 s")
    .expect("members")
    .into_inner();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(view.no_leader, "{view:?}");
    assert_eq!(view.leader_id, 0);
    assert_eq!(view.members.len(), 3, "{view:?}");
    assert_eq!(view.answered_by, survivor as u64 + 1);
    // A default read is still answered, saying it may be stale.
    let read = cluster.nodes[survivor]
        .resources()
        .await
        .read(proto::resource::v1::ReadRequest {
            id: written.id.clone(),
            ..Default::default()
        })
        .await
        .expect("a default read is answered");
    let stale = read
        .metadata()
        .get(proto::STALE_HEADER)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(stale.contains("knows no leader"), "{stale:?}");
}

/// Pre-vote: a node cut off from the others (here: they are paused) stands for election only
/// once a quorum would vote for it, so its term does not move while it is alone, and when the
/// others come back the leader they had stays leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_node_keeps_its_term_and_deposes_no_one() {
    use proto::cluster::v1::StatusRequest;
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let alone = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let term_of = |index: usize| {
        let node = &cluster.nodes[index];
        async move {
            node.cluster()
                .await
                .status(StatusRequest {})
                .await
                .expect("status")
                .into_inner()
                .term
        }
    };
    let before = term_of(alone).await;
    cluster.nodes[leader].signal("STOP");
    cluster.nodes[other].signal("STOP");
    // Several election timeouts (0.75–1.5 s each) alone.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let while_alone = term_of(alone).await;
    cluster.nodes[leader].signal("CONT");
    cluster.nodes[other].signal("CONT");
    assert_eq!(
        while_alone, before,
        "the isolated node raised its term from {before} to {while_alone}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        cluster.wait_for_leader().await,
        leader,
        "the leader stays leader when the isolated node returns"
    );
    assert_eq!(
        term_of(alone).await,
        before,
        "and the term is the one they had"
    );
}
