//! What a peer, a client or a snapshot file sends cannot halt raft, corrupt state or grow memory
//! without bound: hostile forwards on the raft port, crafted restores, garbage uploads, broken
//! and oversized requests, large rewrites.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message;
use prost::bytes::{Buf, BufMut};
use proto::cluster::v1::{SnapshotData, StatusRequest};
use proto::raft::v1::raft_service_client::RaftServiceClient;
use proto::raft::v1::{self as raft_pb, forward_request, forward_response, storage_failure};
use proto::resource::v1::{Id, ReadRequest, Resource, Tenancy, Type, WriteRequest};
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::process::{Cluster, Resd};
use crate::support::{artist, list_artists, restore, save_snapshot};

/// A complete artist as a leader would store it: uid, generation, default tenancy.
fn stored_artist(name: &str) -> Resource {
    let mut resource = artist(name);
    if let Some(id) = resource.id.as_mut() {
        id.uid = ulid::Ulid::new().to_string();
        id.tenancy = Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        });
    }
    resource.generation = ulid::Ulid::new().to_string();
    resource
}

async fn raft_client(node: &Resd) -> RaftServiceClient<tonic::transport::Channel> {
    let status = node
        .cluster()
        .await
        .status(StatusRequest {})
        .await
        .expect("status")
        .into_inner();
    RaftServiceClient::connect(format!("http://{}", status.raft_addr))
        .await
        .expect("connect to the raft port")
}

async fn forward_write(
    client: &mut RaftServiceClient<tonic::transport::Channel>,
    resource: Resource,
) -> raft_pb::ForwardResponse {
    forward_write_as(client, resource, &ulid::Ulid::new().to_string()).await
}

async fn forward_write_as(
    client: &mut RaftServiceClient<tonic::transport::Channel>,
    resource: Resource,
    request_id: &str,
) -> raft_pb::ForwardResponse {
    client
        .forward(raft_pb::ForwardRequest {
            request: Some(forward_request::Request::WriteCas(raft_pb::WriteCas {
                resource: Some(resource),
                request_id: request_id.to_owned(),
                actor: "hostile-test".into(),
                merged: false,
                guards: Vec::new(),
                history: None,
            })),
        })
        .await
        .expect("the forward is answered")
        .into_inner()
}

fn refusal(response: &raft_pb::ForwardResponse) -> String {
    match &response.response {
        Some(forward_response::Response::Failure(failure))
            if failure.code == storage_failure::Code::Rejected as i32 =>
        {
            failure.message.clone()
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Writes through the public API and reads the result back: the cluster still takes writes.
async fn still_serves_writes(node: &Resd, name: &str) {
    let mut client = node.resources().await;
    client
        .write(WriteRequest {
            resource: Some(artist(name)),
        })
        .await
        .unwrap_or_else(|status| panic!("write {name} after the hostile input: {status}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_forwards_are_refused_and_the_cluster_keeps_serving_and_restarts() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let mut client = raft_client(&cluster.nodes[leader]).await;

    let mut long_name = stored_artist("x");
    long_name.id.as_mut().expect("id").name = "a".repeat(600);
    let why = refusal(&forward_write(&mut client, long_name).await);
    assert!(why.contains("600 characters long"), "{why}");

    let mut bad_name = stored_artist("x");
    bad_name.id.as_mut().expect("id").name = "BAD NAME!".into();
    let why = refusal(&forward_write(&mut client, bad_name).await);
    assert!(why.contains("name"), "{why}");

    let mut missing_namespace = stored_artist("x");
    missing_namespace.id.as_mut().expect("id").tenancy = Some(Tenancy {
        partition: "default".into(),
        namespace: "nowhere".into(),
    });
    let why = refusal(&forward_write(&mut client, missing_namespace).await);
    assert!(why.contains("namespace not found"), "{why}");

    let mut unregistered = stored_artist("x");
    unregistered.id.as_mut().expect("id").r#type = Some(Type {
        group: "evil".into(),
        group_version: "v1".into(),
        kind: "Thing".into(),
    });
    let why = refusal(&forward_write(&mut client, unregistered).await);
    assert!(why.contains("not registered"), "{why}");

    let mut wrong_data = stored_artist("x");
    wrong_data.data = Some(proto::to_any(&proto::demo::v1::Concept {
        name: "not an artist".into(),
    }));
    let why = refusal(&forward_write(&mut client, wrong_data).await);
    assert!(why.contains("data"), "{why}");

    let malformed = client
        .forward(raft_pb::ForwardRequest { request: None })
        .await
        .expect_err("an empty request is refused");
    assert_eq!(malformed.code(), Code::InvalidArgument, "{malformed}");

    // Nothing was stored, and raft still works on every node, before and after a restart.
    assert!(list_artists(&cluster.nodes[leader]).await.is_empty());
    still_serves_writes(&cluster.nodes[leader], "after-forwards").await;
    for node in &mut cluster.nodes {
        assert_eq!(node.terminate().code(), Some(0));
    }
    for node in &mut cluster.nodes {
        node.restart();
    }
    let leader = cluster.wait_for_leader().await;
    still_serves_writes(&cluster.nodes[leader], "after-restart").await;
    let names: Vec<String> = list_artists(&cluster.nodes[leader])
        .await
        .into_iter()
        .filter_map(|r| r.id.map(|id| id.name))
        .collect();
    assert_eq!(names, ["after-forwards", "after-restart"]);
}

/// A snapshot file holding exactly `records`, with a correct header and checksum.
fn snapshot_of(records: &[Resource]) -> Vec<u8> {
    let mut writer = proto::snapshot::BodyWriter::new();
    let mut body = Vec::new();
    for record in records {
        writer.record(record, &mut body);
    }
    let header = writer.header(1, 1, prost_types::Timestamp::default());
    let mut file = proto::snapshot::preamble(&header);
    file.extend_from_slice(&body);
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_restore_is_refused_and_changes_nothing() {
    let mut node = Resd::start();
    still_serves_writes(&node, "before").await;
    let saved = save_snapshot(&node).await;
    let (_, good) = proto::snapshot::read(&saved).expect("a valid snapshot");

    let with = |extra: Resource| {
        let mut records = good.clone();
        records.push(extra);
        records
    };
    let mut long_name = stored_artist("x");
    long_name.id.as_mut().expect("id").name = "a".repeat(600);
    let mut bad_name = stored_artist("x");
    bad_name.id.as_mut().expect("id").name = "BAD NAME!".into();
    let mut unregistered = stored_artist("x");
    unregistered.id.as_mut().expect("id").r#type = Some(Type {
        group: "evil".into(),
        group_version: "v1".into(),
        kind: "Thing".into(),
    });
    let mut elsewhere = stored_artist("x");
    elsewhere.id.as_mut().expect("id").tenancy = Some(Tenancy {
        partition: "default".into(),
        namespace: "nowhere".into(),
    });
    let duplicate = good
        .iter()
        .find(|r| r.id.as_ref().is_some_and(|id| id.name == "before"))
        .cloned()
        .expect("the artist is in the snapshot");
    let without_default: Vec<Resource> = good
        .iter()
        .filter(|r| {
            r.id.as_ref()
                .and_then(|id| id.r#type.as_ref())
                .is_none_or(|t| t.kind != "Partition")
        })
        .cloned()
        .collect();
    let cases: Vec<(&str, Vec<Resource>, &str)> = vec![
        ("a 600-byte name", with(long_name), "600 characters long"),
        ("an invalid name", with(bad_name), "BAD NAME!"),
        ("an unregistered type", with(unregistered), "not registered"),
        ("a namespace it does not hold", with(elsewhere), "nowhere"),
        ("a duplicate record", with(duplicate), "duplicate"),
        ("no default partition", without_default, "default partition"),
    ];
    for (what, records, expected) in cases {
        let error = restore(&node, &snapshot_of(&records))
            .await
            .expect_err(what);
        assert_eq!(error.code(), Code::InvalidArgument, "{what}: {error}");
        assert!(
            error.message().contains(expected) && error.message().contains("nothing was changed"),
            "{what}: {error}"
        );
    }
    // Nothing changed: the artist is still there, the default tenancy too (writes work).
    let names: Vec<String> = list_artists(&node)
        .await
        .into_iter()
        .filter_map(|r| r.id.map(|id| id.name))
        .collect();
    assert_eq!(names, ["before"]);
    still_serves_writes(&node, "after").await;
    assert_eq!(node.terminate().code(), Some(0));
    node.restart();
    still_serves_writes(&node, "after-restart").await;
    // The good snapshot still restores.
    restore(&node, &saved)
        .await
        .expect("the saved snapshot restores");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_upload_is_refused_after_its_first_chunk() {
    let node = Resd::start();
    let pulled = Arc::new(AtomicUsize::new(0));
    let counter = pulled.clone();
    // 400 chunks of 1 MiB, made only when the client asks for them.
    let upload = tokio_stream::iter(0..400).map(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
        SnapshotData {
            data: vec![0x5a; 1 << 20],
        }
    });
    let error = node
        .cluster()
        .await
        .snapshot_restore(upload)
        .await
        .expect_err("garbage is refused");
    assert_eq!(error.code(), Code::InvalidArgument, "{error}");
    assert!(error.message().contains("not a resd snapshot"), "{error}");
    let sent = pulled.load(Ordering::SeqCst);
    assert!(
        sent < 40,
        "the server read {sent} MiB of garbage before refusing"
    );
    still_serves_writes(&node, "after-garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_larger_than_the_limit_is_refused_as_resource_exhausted() {
    let node = Resd::start_with(&["--max-snapshot-bytes", "100000"]);
    still_serves_writes(&node, "kept").await;
    let mut records = proto::snapshot::read(&save_snapshot(&node).await)
        .expect("valid")
        .1;
    for index in 0..50 {
        let mut big = stored_artist(&format!("big-{index}"));
        big.metadata.insert("payload".into(), "x".repeat(4000));
        records.push(big);
    }
    let error = restore(&node, &snapshot_of(&records))
        .await
        .expect_err("too large");
    assert_eq!(error.code(), Code::ResourceExhausted, "{error}");
    assert!(error.message().contains("100000"), "{error}");
    assert_eq!(list_artists(&node).await.len(), 1);
}

/// Sends raw bytes as the request of a unary method.
#[derive(Debug, Clone, Default)]
struct RawCodec;

#[derive(Debug)]
struct RawEncoder;

#[derive(Debug)]
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        Ok(Some(bytes.to_vec()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

async fn raw_write(node: &Resd, body: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(node.channel().await)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    grpc.ready().await.expect("ready");
    let path = http::uri::PathAndQuery::from_static("/resd.resource.v1.ResourceService/Write");
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .expect_err("the request is refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_oversized_requests_get_the_right_codes() {
    let node = Resd::start();

    let garbage = raw_write(&node, vec![0xff, 0xff, 0xff, 0xff]).await;
    assert_eq!(garbage.code(), Code::InvalidArgument, "{garbage}");

    let mut valid = WriteRequest {
        resource: Some(artist("zzzz")),
    }
    .encode_to_vec();
    let at = valid
        .windows(4)
        .position(|w| w == b"zzzz")
        .expect("the name is in the encoding");
    valid[at..at + 4].copy_from_slice(&[0xff, 0xfe, 0xfd, 0xfc]);
    let invalid_utf8 = raw_write(&node, valid).await;
    assert_eq!(invalid_utf8.code(), Code::InvalidArgument, "{invalid_utf8}");

    for mebibytes in [5usize, 50] {
        let mut resource = artist("huge");
        resource
            .metadata
            .insert("payload".into(), "x".repeat(mebibytes << 20));
        let status = raw_write(
            &node,
            WriteRequest {
                resource: Some(resource),
            }
            .encode_to_vec(),
        )
        .await;
        assert_eq!(
            status.code(),
            Code::ResourceExhausted,
            "{mebibytes} MiB: {status}"
        );
        assert!(status.message().contains("limit"), "{status}");
    }
    still_serves_writes(&node, "after-broken-requests").await;
}

/// Resident anonymous memory (the heap, not LMDB's file-backed pages) of a process.
fn anonymous_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .expect("RssAnon")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_bounded_under_rewrites_of_a_large_resource() {
    let node = Resd::start_with(&["--snapshot-every", "20"]);
    let pid = node.pid().expect("running");
    let mut client = node.resources().await;
    let payload = "x".repeat(3 << 20);
    for _ in 0..120 {
        let mut resource = artist("large");
        resource.metadata.insert("payload".into(), payload.clone());
        client
            .write(WriteRequest {
                resource: Some(resource),
            })
            .await
            .expect("a 3 MiB rewrite");
    }
    // 120 rewrites of 3 MiB pass 360 MiB through the node; the watch history keeps 64 MiB at
    // most, so the heap stays far below what went through. (LMDB's pages are file-backed page
    // cache, which the kernel reclaims; they are not counted.) What counts is what stays: the
    // allocator returns the copies a request makes within its decay time (10 s), so the least
    // seen over the next 20 s.
    let mut heap = anonymous_rss_bytes(pid);
    for _ in 0..20 {
        if heap < 192 << 20 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        heap = heap.min(anonymous_rss_bytes(pid));
    }
    assert!(
        heap < 192 << 20,
        "anonymous resident memory grew to {} MiB",
        heap >> 20
    );
    let read = client
        .read(ReadRequest {
            id: Some(Id {
                tenancy: Some(Tenancy::default()),
                ..crate::support::artist_id("large")
            }),
            ..Default::default()
        })
        .await
        .expect("read");
    assert!(read.into_inner().resource.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_retried_after_the_leader_committed_is_answered_with_its_first_outcome() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let mut client = raft_client(&cluster.nodes[leader]).await;
    let created = match forward_write(&mut client, stored_artist("register"))
        .await
        .response
    {
        Some(forward_response::Response::Resource(resource)) => resource,
        other => panic!("create: {other:?}"),
    };
    // The same CAS forwarded twice under one request id, as a follower does when it lost the
    // leader's first answer: both get the first attempt's result, and it is applied once.
    let mut update = created.clone();
    update.metadata.insert("attempt".into(), "1".into());
    let request_id = ulid::Ulid::new().to_string();
    let first = forward_write_as(&mut client, update.clone(), &request_id).await;
    let retry = forward_write_as(&mut client, update, &request_id).await;
    assert_eq!(first, retry, "the retry is answered like the first attempt");
    let Some(forward_response::Response::Resource(stored)) = first.response else {
        panic!("the CAS succeeded: {first:?}");
    };
    assert_ne!(stored.version, created.version);
    let now = list_artists(&cluster.nodes[leader]).await;
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].version, stored.version, "applied exactly once");
}

/// A `grpc-timeout` no clock can hold (the red team's `18446744073709551615S` panicked the
/// handler) or that is not a gRPC timeout at all: InvalidArgument, and the node serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crafted_grpc_timeout_is_refused_and_panics_nothing() {
    let node = Resd::start();
    let mut client = node.resources().await;
    for crafted in ["18446744073709551615S", "99999999999H", "-1S", "soon"] {
        let mut request = tonic::Request::new(ReadRequest {
            id: Some(crate::support::artist_id("anyone")),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("grpc-timeout", crafted.parse().expect("ascii"));
        let refused = client.read(request).await.expect_err(crafted);
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "{crafted}: {refused:?}"
        );
    }
    // The largest valid one is accepted (a deadline past what the clock holds is none).
    let mut request = tonic::Request::new(WriteRequest {
        resource: Some(artist("still-serving")),
    });
    request
        .metadata_mut()
        .insert("grpc-timeout", "99999999H".parse().expect("ascii"));
    client.write(request).await.expect("served");
}
