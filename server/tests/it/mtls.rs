//! Mutual TLS with real processes (DESIGN §12.2): a TLS cluster forms, replicates, fails over
//! and restores; strangers (plaintext, another CA, an expired certificate, no certificate) are
//! refused on both ports and logged once; a valid certificate of a non-member cannot append,
//! vote, forward or install a snapshot, and a member's certificate cannot speak for another
//! node; unusable certificate files stop the agent with exit code 2.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::raft::{AppendEntriesRequest, VoteRequest};
use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::cluster::v1::{JoinRequest, StatusRequest};
use proto::raft::v1::raft_service_client::RaftServiceClient;
use proto::raft::v1::{self as raft_pb};
use proto::resource::v1::{ReadRequest, WriteRequest};
use server::storage::raft::types::{TypeConfig, Vote};
use server::wire::raft::encode;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::process::{Cluster, Resd, TestCa, endpoint_of};
use crate::support::{artist, artist_id, list_artists, restore, save_snapshot};

fn client_identity() -> Option<(&'static str, &'static str)> {
    Some(("client-test.pem", "client-test-key.pem"))
}

pub(crate) async fn tls_cluster(size: u64, extra: &[&str]) -> (Arc<TestCa>, Cluster) {
    let ca = Arc::new(TestCa::new(size + 1));
    let client = ca.client(client_identity());
    let cluster = Cluster::start_tls(size as usize, extra, ca.clone(), client).await;
    (ca, cluster)
}

async fn raft_addr(node: &Resd) -> String {
    node.cluster()
        .await
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner()
        .raft_addr
}

/// A raft client of `addr` presenting `identity` (files of `ca`'s directory).
async fn raft_client_as(
    addr: &str,
    tls: Option<ClientTlsConfig>,
) -> Result<RaftServiceClient<tonic::transport::Channel>, tonic::transport::Error> {
    let channel = endpoint_of(addr, tls)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(RaftServiceClient::new(channel))
}

fn node_tls(ca: &TestCa, node_id: u64) -> ClientTlsConfig {
    ca.client(None)
        .identity(Identity::from_pem(
            ca.read(&format!("node-{node_id}.pem")),
            ca.read(&format!("node-{node_id}-key.pem")),
        ))
        .domain_name("localhost")
}

fn append_as(leader: u64, term: u64) -> raft_pb::RaftMessage {
    let rpc = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    raft_pb::RaftMessage {
        payload: encode(&rpc),
    }
}

fn vote_for(candidate: u64, term: u64) -> raft_pb::RaftMessage {
    let rpc = VoteRequest::<u64>::new(Vote::new(term, candidate), None);
    raft_pb::RaftMessage {
        payload: encode(&rpc),
    }
}

async fn term_of(node: &Resd) -> u64 {
    node.status().await.expect("status").term
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_forms_replicates_fails_over_and_restores() {
    // Snapshots every 5 entries: the restarted node is sent a snapshot over the raft port.
    let (_ca, mut cluster) =
        tls_cluster(3, &["--tls-verify-clients", "--snapshot-every", "5"]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;

    // A write through a follower (forwarded to the leader over the mutual raft port).
    cluster.nodes[follower]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("tls-one")),
        })
        .await
        .expect("write through a follower");
    let deadline = Instant::now() + Duration::from_secs(30);
    for node in &cluster.nodes {
        while !list_artists(node)
            .await
            .iter()
            .any(|a| a.id.as_ref().is_some_and(|id| id.name == "tls-one"))
        {
            assert!(Instant::now() < deadline, "every node replicates the write");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Fail over: the leader dies, another is elected over TLS and takes writes.
    cluster.nodes[leader].kill9();
    let new_leader = cluster.wait_for_leader().await;
    assert_ne!(new_leader, leader);
    cluster.nodes[new_leader]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("tls-two")),
        })
        .await
        .expect("write after failover");
    for i in 0..20 {
        cluster.nodes[new_leader]
            .resources()
            .await
            .write(WriteRequest {
                resource: Some(artist(&format!("tls-filler-{i}"))),
            })
            .await
            .expect("write after failover");
    }

    // Save and restore through the new leader.
    let file = save_snapshot(&cluster.nodes[new_leader]).await;
    cluster.nodes[new_leader]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("tls-after-save")),
        })
        .await
        .expect("write after the save");
    restore(&cluster.nodes[new_leader], &file)
        .await
        .expect("restore over TLS");
    let read = cluster.nodes[new_leader]
        .resources()
        .await
        .read(ReadRequest {
            id: Some(artist_id("tls-after-save")),
            ..Default::default()
        })
        .await;
    assert_eq!(
        read.expect_err("the restore went back to the saved state")
            .code(),
        Code::NotFound
    );

    // The old leader restarts and catches up through the mutual raft port.
    cluster.nodes[leader].restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let names: Vec<String> = list_artists(&cluster.nodes[leader])
            .await
            .into_iter()
            .filter_map(|a| a.id.map(|id| id.name))
            .collect();
        if names.contains(&"tls-two".to_owned()) && !names.contains(&"tls-after-save".to_owned()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node caught up: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_refused_on_both_ports() {
    let (ca, cluster) = tls_cluster(1, &["--tls-verify-clients"]).await;
    let node = &cluster.nodes[0];
    let api = node.api_addr.to_string();
    let raft = raft_addr(node).await;
    let other = TestCa::new(1);
    let expired = expired_client(&ca);

    let strangers: Vec<(&str, Option<ClientTlsConfig>)> = vec![
        ("plaintext", None),
        ("another CA's client", Some(other.client(client_identity()))),
        ("no client certificate", Some(ca.client(None))),
        (
            "an expired client certificate",
            Some(ca.client(None).identity(Identity::from_pem(
                std::fs::read(expired.path().join("client-old.pem")).expect("read"),
                std::fs::read(expired.path().join("client-old-key.pem")).expect("read"),
            ))),
        ),
        (
            "a client trusting another CA",
            Some(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(other.read("resd-ca.pem")))
                    .identity(Identity::from_pem(
                        ca.read("client-test.pem"),
                        ca.read("client-test-key.pem"),
                    )),
            ),
        ),
    ];
    for (who, tls) in strangers {
        assert!(
            api_status(&api, tls.clone()).await.is_err(),
            "{who} was served on the API port"
        );
        assert!(
            raft_read_index(&raft, tls).await.is_err(),
            "{who} was served on the raft port"
        );
    }
    // The same calls from the CA's client and from a member are served.
    api_status(&api, Some(ca.client(client_identity())))
        .await
        .expect("the CA's client is served on the API port");
    raft_read_index(&raft, Some(node_tls(&ca, 1)))
        .await
        .expect("a member is served on the raft port");

    // The right client is served, and the refusals changed nothing.
    let status = node.status().await.expect("a client of the CA is served");
    assert_eq!(status.term, 1);
    node.resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("still-serving")),
        })
        .await
        .expect("still serving");
}

async fn api_status(addr: &str, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let channel = endpoint_of(addr, tls)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|error| error.to_string())?;
    ClusterServiceClient::new(channel)
        .status(StatusRequest {})
        .await
        .map(drop)
        .map_err(|status| status.to_string())
}

async fn raft_read_index(addr: &str, tls: Option<ClientTlsConfig>) -> Result<(), String> {
    let tls = tls.map(|tls| tls.domain_name("localhost"));
    let mut client = raft_client_as(addr, tls)
        .await
        .map_err(|error| error.to_string())?;
    client
        .forward(raft_pb::ForwardRequest {
            request: Some(raft_pb::forward_request::Request::ReadIndex(
                raft_pb::ReadIndex {},
            )),
        })
        .await
        .map(drop)
        .map_err(|status| status.to_string())
}

/// A client certificate signed by `ca` that expired yesterday, in its own directory.
fn expired_client(ca: &TestCa) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_cert = String::from_utf8(ca.read("resd-ca.pem")).expect("utf-8");
    let ca_key =
        rcgen::KeyPair::from_pem(&String::from_utf8(ca.read("resd-ca-key.pem")).expect("utf-8"))
            .expect("CA key");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_cert, ca_key).expect("issuer");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "old");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(30);
    params.not_after = now - time::Duration::days(1);
    let cert = params.signed_by(&key, &issuer).expect("sign");
    std::fs::write(dir.path().join("client-old.pem"), cert.pem()).expect("write");
    std::fs::write(dir.path().join("client-old-key.pem"), key.serialize_pem()).expect("write");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_member_certificate_cannot_join_as_another_append_vote_or_forward() {
    // Certificates exist for nodes 1..=3; node 3 never joins.
    let (ca, cluster) = tls_cluster(2, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = 1 - leader;
    let target = raft_addr(&cluster.nodes[follower]).await;
    let term = term_of(&cluster.nodes[leader]).await;
    let leader_id = leader as u64 + 1;
    let follower_id = follower as u64 + 1;

    let mut stranger = raft_client_as(&target, Some(node_tls(&ca, 3)))
        .await
        .expect("a valid certificate completes the handshake");
    let refused = stranger
        .append_entries(append_as(3, term + 5))
        .await
        .expect_err("a non-member cannot append");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("not a member"), "{refused:?}");
    let refused = stranger
        .vote(vote_for(3, term + 100))
        .await
        .expect_err("a non-member cannot ask for votes");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let refused = stranger
        .forward(raft_pb::ForwardRequest {
            request: Some(raft_pb::forward_request::Request::List(
                raft_pb::ListQuery::default(),
            )),
        })
        .await
        .expect_err("a non-member cannot forward");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Nor learn who the members are: only members ask whether a node is one.
    let refused = stranger
        .vouch(raft_pb::VouchRequest { node_id: leader_id })
        .await
        .expect_err("a non-member cannot ask who is a member");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    // A member's certificate cannot speak for another node.
    let mut member = raft_client_as(&target, Some(node_tls(&ca, leader_id)))
        .await
        .expect("connect as the leader");
    // A member asking about a node hears whether this node's configuration names it.
    for (asked, named) in [(follower_id, true), (leader_id, true), (3, false)] {
        let answer = member
            .vouch(raft_pb::VouchRequest { node_id: asked })
            .await
            .expect("a member may ask")
            .into_inner();
        assert_eq!(answer.member, named, "node {asked}");
    }
    let refused = member
        .vote(vote_for(99, term + 100))
        .await
        .expect_err("a vote in another node's name");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("in the name of node 99"),
        "{refused:?}"
    );
    let mut other_member = raft_client_as(
        &raft_addr(&cluster.nodes[leader]).await,
        Some(node_tls(&ca, follower_id)),
    )
    .await
    .expect("connect as the follower");
    let refused = other_member
        .append_entries(append_as(leader_id, term + 1))
        .await
        .expect_err("entries in the leader's name from the follower's certificate");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    // The append stream checks the same: a stranger's stream is refused when it opens, and a
    // member's request in another node's name gets the refusal as its answer.
    let refused = stranger
        .append_stream(futures::stream::iter(vec![raft_pb::StreamedRequest {
            id: 1,
            payload: append_as(3, term + 5).payload,
        }]))
        .await
        .expect_err("a non-member cannot open the append stream");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let mut answers = other_member
        .append_stream(futures::stream::iter(vec![raft_pb::StreamedRequest {
            id: 7,
            payload: append_as(leader_id, term + 1).payload,
        }]))
        .await
        .expect("a member opens the append stream")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("the stream answers")
        .expect("one answer");
    assert_eq!(answer.id, 7);
    assert!(answer.payload.is_empty(), "{answer:?}");
    assert!(
        answer
            .error
            .contains(&format!("in the name of node {leader_id}")),
        "{answer:?}"
    );

    // Node 3's certificate cannot join as node 7.
    let api = endpoint_of(
        &cluster.nodes[leader].api_addr.to_string(),
        Some(node_tls(&ca, 3)),
    )
    .connect()
    .await
    .expect("connect to the API as node 3");
    let refused = ClusterServiceClient::new(api.clone())
        .join(JoinRequest {
            node_id: 7,
            api_addr: "127.0.0.1:1".into(),
            raft_addr: "127.0.0.1:2".into(),
            from_node: false,
        })
        .await
        .expect_err("joining as another node");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Nor can a member's certificate vouch for another node.
    let member_api = endpoint_of(
        &cluster.nodes[leader].api_addr.to_string(),
        Some(node_tls(&ca, follower as u64 + 1)),
    )
    .connect()
    .await
    .expect("connect to the API as the follower");
    let refused = ClusterServiceClient::new(member_api)
        .join(JoinRequest {
            node_id: 7,
            api_addr: "127.0.0.1:1".into(),
            raft_addr: "127.0.0.1:2".into(),
            from_node: false,
        })
        .await
        .expect_err("a member joining another node");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Nor can a client certificate join at all.
    let client_api = endpoint_of(
        &cluster.nodes[leader].api_addr.to_string(),
        Some(ca.client(client_identity())),
    )
    .connect()
    .await
    .expect("connect as a client");
    let refused = ClusterServiceClient::new(client_api)
        .join(JoinRequest {
            node_id: 3,
            api_addr: "127.0.0.1:1".into(),
            raft_addr: "127.0.0.1:2".into(),
            from_node: false,
        })
        .await
        .expect_err("a client certificate joining");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    // Without --tls-verify-clients, a client that only trusts the CA is served on the API.
    api_status(
        &cluster.nodes[leader].api_addr.to_string(),
        Some(ca.client(None)),
    )
    .await
    .expect("a client with the CA only");

    // Nothing changed: same term, same two voters, still serving.
    assert_eq!(term_of(&cluster.nodes[leader]).await, term);
    assert_eq!(term_of(&cluster.nodes[follower]).await, term);
    let members = cluster.nodes[leader]
        .cluster()
        .await
        .members(proto::cluster::v1::MembersRequest {})
        .await
        .expect("members")
        .into_inner()
        .members;
    assert_eq!(members.len(), 2, "{members:?}");
    cluster.nodes[follower]
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("after-strangers")),
        })
        .await
        .expect("still serving");
}

/// Runs `resd agent ARGS` expecting it to refuse to start; returns its exit code and stderr.
pub(crate) fn refused_start(args: &[String]) -> (Option<i32>, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_resd"))
        .arg("agent")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run resd");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn unusable_certificate_files_stop_the_agent_with_exit_code_2() {
    let ca = TestCa::new(2);
    let data = tempfile::tempdir().expect("temp dir");
    let base = |node_id: u64| -> Vec<String> {
        vec![
            "--node-id".into(),
            node_id.to_string(),
            "--data-dir".into(),
            data.path().display().to_string(),
            "--api-addr".into(),
            "127.0.0.1:0".into(),
            "--raft-addr".into(),
            "127.0.0.1:0".into(),
            "--bootstrap".into(),
        ]
    };

    let mut missing = base(1);
    missing.extend(ca.node_flags(1));
    let cert = missing.len() - 3;
    missing[cert] = ca.path("no-such-node.pem");
    let (code, stderr) = refused_start(&missing);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("no-such-node.pem") && stderr.contains("No such file"),
        "{stderr}"
    );

    // Node 2's certificate for node 1.
    let mut wrong_node = base(1);
    wrong_node.extend(ca.node_flags(2));
    let (code, stderr) = refused_start(&wrong_node);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("node-1.resd.resd"), "{stderr}");

    // A certificate of another CA.
    let other = TestCa::new(1);
    let mut foreign = base(1);
    foreign.extend(other.node_flags(1));
    let ca_path = foreign.len() - 5;
    foreign[ca_path] = ca.path("resd-ca.pem");
    let (code, stderr) = refused_start(&foreign);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not signed by the CA"), "{stderr}");

    // A key that is not the certificate's.
    let mut mismatched = base(1);
    mismatched.extend(ca.node_flags(1));
    let last = mismatched.len() - 1;
    mismatched[last] = ca.path("node-2-key.pem");
    let (code, stderr) = refused_start(&mismatched);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("node-2-key.pem"), "{stderr}");

    // Only some of the three flags.
    let mut partial = base(1);
    partial.extend(["--tls-ca".to_owned(), ca.path("resd-ca.pem")]);
    let (code, stderr) = refused_start(&partial);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("missing --tls-cert and --tls-key"),
        "{stderr}"
    );
}

#[test]
fn refused_handshakes_are_logged_once_per_peer() {
    use std::io::{BufRead, BufReader, Write};
    let ca = TestCa::new(1);
    let data = tempfile::tempdir().expect("temp dir");
    let port = crate::process::free_port();
    let mut args = vec![
        "agent".to_owned(),
        "--node-id".into(),
        "1".into(),
        "--data-dir".into(),
        data.path().display().to_string(),
        "--api-addr".into(),
        format!("127.0.0.1:{port}"),
        "--raft-addr".into(),
        "127.0.0.1:0".into(),
        "--bootstrap".into(),
    ];
    args.extend(ca.node_flags(1));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_resd"))
        .args(&args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn resd");
    let stderr = child.stderr.take().expect("piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    // Twenty plaintext clients, one after the other.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    while sent < 20 && Instant::now() < deadline {
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = std::io::Read::read(&mut stream, &mut [0u8; 64]);
            sent += 1;
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert_eq!(sent, 20, "the node accepted connections");
    std::thread::sleep(Duration::from_millis(500));
    let _ = child.kill();
    let _ = child.wait();
    let lines: Vec<String> = receiver.try_iter().collect();
    let refusals = lines
        .iter()
        .filter(|line| line.contains("not a TLS client"))
        .count();
    assert_eq!(refusals, 1, "one line for twenty refusals: {lines:#?}");
}

/// A Join whose client goes away (its deadline passes while the new node cannot be reached)
/// still runs to its end: the learner it added is removed again, never left as a dead member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_cancelled_by_its_client_still_rolls_back() {
    use proto::cluster::v1::MembersRequest;

    let (ca, cluster) = tls_cluster(1, &[]).await;
    let leader = &cluster.nodes[0];
    let channel = endpoint_of(&leader.api_addr.to_string(), Some(node_tls(&ca, 2)))
        .connect()
        .await
        .expect("connect as node 2");
    // Nobody listens at this raft address: the join can only time out and roll back.
    let nowhere = format!("127.0.0.1:{}", crate::process::free_port());
    // The client gives up after 1.5 s without telling the server a deadline: the stream is
    // reset under the handler, which would drop a join running inside it.
    let mut client = ClusterServiceClient::new(channel);
    let join = client.join(JoinRequest {
        node_id: 2,
        api_addr: nowhere.clone(),
        raft_addr: nowhere,
        from_node: false,
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), join)
            .await
            .is_err(),
        "the join answered before the client gave up"
    );
    drop(client);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let members = leader
            .cluster()
            .await
            .members(MembersRequest {})
            .await
            .expect("members")
            .into_inner()
            .members;
        if members.iter().all(|member| member.node_id != 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 2 is still a member 40 s after its join was cancelled: {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The cluster takes writes as before.
    leader
        .resources()
        .await
        .write(WriteRequest {
            resource: Some(artist("after-the-rollback")),
        })
        .await
        .expect("a write");
}

/// A member of a build before DESIGN §15's fence applies fenced changes without checking them:
/// this build and it never replicate to each other. A leader's certificate that sends entries
/// (or asks for a vote) without saying it checks fences — as an earlier build does — is refused
/// with the reason, and the cluster goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_of_a_build_before_the_fence_is_not_replicated_with() {
    let (ca, cluster) = tls_cluster(2, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = 1 - leader;
    let target = raft_addr(&cluster.nodes[follower]).await;
    let term = term_of(&cluster.nodes[leader]).await;
    let leader_id = leader as u64 + 1;
    let mut earlier = raft_client_as(&target, Some(node_tls(&ca, leader_id)))
        .await
        .expect("connect as the leader");
    let refused = earlier
        .append_entries(append_as(leader_id, term))
        .await
        .expect_err("entries from a build that does not check fences");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("applies changes by other rules"),
        "{refused:?}"
    );
    let refused = earlier
        .vote(vote_for(leader_id, term + 1))
        .await
        .expect_err("a vote asked by a build that does not check fences");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    // The members of this build go on.
    assert!(cluster.nodes[leader].status().await.is_some());
}
