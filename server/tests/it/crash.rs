//! Promises across crashes (DESIGN §14): a node restarted after an unclean stop serves no read
//! older than what it served before, and a restarted leader's strong reads are linearizable.

use std::time::{Duration, Instant};

use proto::cluster::v1::StatusRequest;
use proto::resource::v1::{ReadRequest, WriteRequest};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::process::{Cluster, Resd};
use crate::support::{artist, artist_id, artist_type};

async fn count_artists(node: &Resd) -> Result<usize, tonic::Status> {
    node.resources()
        .await
        .list(proto::resource::v1::ListRequest {
            r#type: Some(artist_type()),
            tenancy: Some(proto::resource::v1::Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: String::new(),
            ..proto::resource::v1::ListRequest::default()
        })
        .await
        .map(|reply| reply.into_inner().resources.len())
}

/// What `node`'s gRPC health says of `service` (`""`: the whole server); UNKNOWN when it does
/// not answer.
async fn health_of(node: &Resd, service: &str) -> i32 {
    HealthClient::new(node.channel().await)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map(|reply| reply.into_inner().status)
        .unwrap_or(ServingStatus::Unknown as i32)
}

/// The resource service's health, after checking that the whole server's (service `""`, what
/// load balancers ask for) says the same.
async fn health(node: &Resd) -> i32 {
    let resources = health_of(node, "resd.resource.v1.ResourceService").await;
    let overall = health_of(node, "").await;
    assert_eq!(overall, resources, "the overall status follows the node's");
    resources
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_an_unclean_stop_serves_nothing_older_until_caught_up() {
    let mut cluster = Cluster::start_with_http(3, &["--snapshot-every", "20"]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    for index in 0..30 {
        cluster.nodes[leader]
            .resources()
            .await
            .write(WriteRequest {
                resource: Some(artist(&format!("a{index}"))),
            })
            .await
            .expect("write");
    }
    let applied = cluster.nodes[leader]
        .status()
        .await
        .expect("status")
        .applied_index;
    cluster.wait_for_applied(applied).await;
    assert_eq!(
        count_artists(&cluster.nodes[follower]).await.expect("list"),
        30
    );

    // The follower dies without a clean stop while nobody it could learn from is running.
    cluster.nodes[follower].kill9();
    cluster.nodes[leader].signal("STOP");
    cluster.nodes[other].signal("STOP");
    cluster.nodes[follower].restart();
    let refused = count_artists(&cluster.nodes[follower])
        .await
        .expect_err("no reads while catching up");
    assert_eq!(refused.code(), Code::Unavailable, "{refused}");
    assert!(refused.message().contains("catching up"), "{refused}");
    assert_eq!(
        health(&cluster.nodes[follower]).await,
        ServingStatus::NotServing as i32
    );
    let (code, body) = cluster.nodes[follower]
        .http_get("/readyz")
        .expect("/readyz answers while catching up");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("catching up"), "{body}");
    let status = cluster.nodes[follower]
        .cluster()
        .await
        .status(StatusRequest {})
        .await
        .expect("status is always served")
        .into_inner();
    assert!(!status.ready);
    assert!(
        status.not_ready_reason.contains("catching up"),
        "{status:?}"
    );

    cluster.nodes[leader].signal("CONT");
    cluster.nodes[other].signal("CONT");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match count_artists(&cluster.nodes[follower]).await {
            Ok(count) => {
                assert_eq!(count, 30, "a read after the restart went back in time");
                break;
            }
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("the follower never caught up: {status}"),
        }
    }
    assert_eq!(
        health(&cluster.nodes[follower]).await,
        ServingStatus::Serving as i32
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster.nodes[follower]
        .http_get("/readyz")
        .map(|(code, _)| code)
        != Some(200)
    {
        assert!(Instant::now() < deadline, "/readyz never said ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_answers_strong_reads_with_the_latest_write() {
    let mut node = Resd::start_with(&["--snapshot-every", "5"]);
    let mut client = node.resources().await;
    let mut last = client
        .write(WriteRequest {
            resource: Some(artist("register")),
        })
        .await
        .expect("create")
        .into_inner()
        .resource
        .expect("stored");
    for _ in 0..22 {
        last = client
            .write(WriteRequest {
                resource: Some(last.clone()),
            })
            .await
            .expect("cas")
            .into_inner()
            .resource
            .expect("stored");
    }
    node.kill9();
    node.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut read = tonic::Request::new(ReadRequest {
            id: Some(artist_id("register")),
            ..Default::default()
        });
        read.metadata_mut().insert(
            "x-resd-consistency-mode",
            "consistent".parse().expect("ascii"),
        );
        match node.resources().await.read(read).await {
            Ok(reply) => {
                let read = reply.into_inner().resource.expect("resource");
                assert_eq!(
                    read.version, last.version,
                    "a strong read went back in time"
                );
                break;
            }
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("no strong read after the restart: {status}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_through_a_follower_moves_on_when_the_leader_stops_answering() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;
    let mut client = cluster.nodes[follower].resources().await;
    client
        .write(WriteRequest {
            resource: Some(artist("before")),
        })
        .await
        .expect("write while the leader answers");
    // The leader's process stops answering but keeps its connections: a forward in flight to it
    // hangs. Two of three nodes still form a majority and elect another leader.
    cluster.nodes[leader].signal("STOP");
    let mut write = tonic::Request::new(WriteRequest {
        resource: Some(artist("during")),
    });
    write.set_timeout(Duration::from_secs(6));
    let result = client.write(write).await;
    cluster.nodes[leader].signal("CONT");
    let stored = result.expect("the write reaches the new leader within its deadline");
    assert!(stored.into_inner().resource.is_some());
}

/// Waits until `node`'s health — the overall status and the resource service's both — is
/// `want` (they change one after the other); what `/readyz` answered then.
async fn health_reaches(node: &Resd, want: i32) -> Option<u16> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let overall = health_of(node, "").await;
        let resources = health_of(node, "resd.resource.v1.ResourceService").await;
        let ready = node.http_get("/readyz").map(|(code, _)| code);
        if overall == want && resources == want {
            return ready;
        }
        assert!(
            Instant::now() < deadline,
            "health is {overall} (resources {resources}), not {want} (readyz {ready:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// DESIGN §13: gRPC health follows `/readyz` for every reason. A follower left alone (the
/// leader and the other follower killed) knows no leader: `/readyz` is 503 and health — the
/// overall status load balancers ask for and the resource service's — says NOT_SERVING too;
/// once a peer is back and a leader elected, both say serving again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_not_serving_when_a_quorum_is_lost_as_readyz_does() {
    let mut cluster = Cluster::start_with_http(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let alone = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let serving = ServingStatus::Serving as i32;
    assert_eq!(
        health_reaches(&cluster.nodes[alone], serving).await,
        Some(200)
    );
    cluster.nodes[leader].kill9();
    cluster.nodes[other].kill9();
    let ready = health_reaches(&cluster.nodes[alone], ServingStatus::NotServing as i32).await;
    assert_eq!(ready, Some(503), "readyz agrees: no leader");
    cluster.nodes[other].restart();
    assert_eq!(
        health_reaches(&cluster.nodes[alone], serving).await,
        Some(200)
    );
}
