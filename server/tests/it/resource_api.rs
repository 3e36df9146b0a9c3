//! Write, Read, List, WatchList, WriteStatus and Delete over gRPC against a real resd.

use std::time::Duration;

use proto::demo::v2 as demo_v2;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{
    DeleteRequest, Id, ReadRequest, Resource, Tenancy, WatchListRequest, WriteRequest,
    WriteStatusRequest,
};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::process::Resd;
use crate::support::{artist, artist_type, list_artists};

#[tokio::test]
async fn write_read_list_watch_and_delete_over_grpc() {
    let resd = Resd::start();
    let mut client = resd.resources().await;

    let mut watch = client
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
    let first = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("event in time")
        .expect("stream open")
        .expect("ok");
    assert!(
        matches!(first.event, Some(Event::EndOfSnapshot(_))),
        "empty snapshot: {first:?}"
    );

    let written = client
        .write(WriteRequest {
            resource: Some(artist("miles")),
        })
        .await
        .expect("write")
        .into_inner()
        .resource
        .expect("resource");
    let written_id = written.id.clone().expect("id");
    assert_eq!(
        written_id.tenancy,
        Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into()
        })
    );
    let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("event in time")
        .expect("stream open")
        .expect("ok");
    match event.event {
        Some(Event::Upsert(upsert)) => assert_eq!(upsert.resource.as_ref(), Some(&written)),
        other => panic!("expected an upsert, got {other:?}"),
    }
    assert_eq!(event.version, written.version);

    let mut consistent = tonic::Request::new(ReadRequest {
        id: Some(written_id.clone()),
        ..Default::default()
    });
    consistent.metadata_mut().insert(
        "x-resd-consistency-mode",
        "consistent".parse().expect("ascii"),
    );
    let read = client
        .read(consistent)
        .await
        .expect("read")
        .into_inner()
        .resource;
    assert_eq!(read.as_ref(), Some(&written));

    let with_status = client
        .write_status(WriteStatusRequest {
            id: Some(written_id.clone()),
            version: written.version.clone(),
            key: "it".into(),
            status: Some(proto::resource::v1::Status {
                observed_generation: written.generation.clone(),
                conditions: vec![],
                updated_at: None,
            }),
        })
        .await
        .expect("write status")
        .into_inner()
        .resource
        .expect("resource");
    assert!(with_status.status["it"].updated_at.is_some());

    let listed = list_artists(&resd).await;
    assert_eq!(listed, vec![with_status.clone()]);

    client
        .delete(DeleteRequest {
            id: Some(written_id.clone()),
            version: String::new(),
        })
        .await
        .expect("delete");
    let status = client
        .read(ReadRequest {
            id: Some(written_id.clone()),
            ..Default::default()
        })
        .await
        .expect_err("deleted");
    assert_eq!(status.code(), Code::NotFound);

    // The watch saw the status write and the delete, in order.
    let mut kinds = Vec::new();
    while kinds.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .expect("ok");
        kinds.push(match event.event {
            Some(Event::Upsert(_)) => "upsert",
            Some(Event::Delete(_)) => "delete",
            _ => "other",
        });
    }
    assert_eq!(kinds, ["upsert", "delete"]);
}

#[tokio::test]
async fn a_write_runs_the_types_mutate_hook() {
    let resd = Resd::start();
    let mut v2 = artist("miles");
    if let Some(resource_type) = v2.id.as_mut().and_then(|id| id.r#type.as_mut()) {
        resource_type.group_version = "v2".into();
    }
    v2.data = Some(proto::to_any(&demo_v2::Artist {
        name: "Miles".into(),
        ..Default::default()
    }));
    let written = resd
        .resources()
        .await
        .write(WriteRequest { resource: Some(v2) })
        .await
        .expect("write")
        .into_inner()
        .resource
        .expect("resource");
    let data: demo_v2::Artist =
        prost::Message::decode(written.data.as_ref().expect("data").value.as_slice())
            .expect("decode");
    assert_eq!(
        data.genre,
        demo_v2::Genre::Disco as i32,
        "the mutate hook ran"
    );
}

#[tokio::test]
async fn bad_input_gets_invalid_argument_naming_the_field() {
    let resd = Resd::start();
    let mut client = resd.resources().await;
    let mut bad = artist("Miles Davis");
    bad.data = Some(proto::to_any(&proto::demo::v1::Album::default()));
    let status = client
        .write(WriteRequest {
            resource: Some(bad),
        })
        .await
        .expect_err("invalid name");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("resource.id.name invalid"),
        "{}",
        status.message()
    );

    let status = client
        .write(WriteRequest {
            resource: Some(Resource::default()),
        })
        .await
        .expect_err("no id");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("resource.id is required"),
        "{}",
        status.message()
    );

    // The server is still healthy after the bad requests.
    client
        .write(WriteRequest {
            resource: Some(artist("miles")),
        })
        .await
        .expect("a good write still works");
}

#[tokio::test]
async fn an_oversized_resource_gets_a_clear_error_not_a_transport_failure() {
    let resd = Resd::start();
    let mut client = resd
        .resources()
        .await
        .max_encoding_message_size(16 * 1024 * 1024);
    let mut big = artist("big");
    big.metadata
        .insert("blob".into(), "x".repeat(4 * 1024 * 1024 + 10));
    let status = client
        .write(WriteRequest {
            resource: Some(big),
        })
        .await
        .expect_err("too big");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("over the limit of 4194304 bytes"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn the_resource_limit_is_configurable() {
    let resd = Resd::start_memory(&["--max-resource-bytes", "1024"]);
    let mut client = resd.resources().await;
    let mut big = artist("big");
    big.metadata.insert("blob".into(), "x".repeat(2048));
    let status = client
        .write(WriteRequest {
            resource: Some(big),
        })
        .await
        .expect_err("too big");
    assert!(
        status.message().contains("over the limit of 1024 bytes"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn list_types_publishes_the_registry_and_descriptors() {
    let resd = Resd::start();
    let mut cluster = resd.cluster().await;
    let response = cluster
        .list_types(proto::cluster::v1::ListTypesRequest::default())
        .await
        .expect("list types")
        .into_inner();
    let artist = response
        .types
        .iter()
        .find(|t| t.message_name == "resd.demo.v2.Artist")
        .expect("demo.v2.Artist is registered");
    assert_eq!(artist.scope, proto::cluster::v1::Scope::Namespace as i32);
    let label = response
        .types
        .iter()
        .find(|t| t.message_name == "resd.demo.v1.RecordLabel")
        .expect("RecordLabel");
    assert_eq!(label.scope, proto::cluster::v1::Scope::Partition as i32);
    let set: prost_types::FileDescriptorSet =
        prost::Message::decode(response.file_descriptor_set.as_ref())
            .expect("descriptor set decodes");
    assert!(set.file.iter().any(|f| f.package() == "resd.demo.v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_grpc_examples_work_without_a_tenancy() {
    let node = Resd::start();
    let mut client = node.resources().await;
    let artist_v2 = || proto::resource::v1::Type {
        group: "demo".into(),
        group_version: "v2".into(),
        kind: "Artist".into(),
    };
    let mut watch = client
        .watch_list(WatchListRequest {
            r#type: Some(artist_v2()),
            ..Default::default()
        })
        .await
        .expect("a watch without a tenancy")
        .into_inner();
    let written = client
        .write(WriteRequest {
            resource: Some(Resource {
                id: Some(Id {
                    name: "miles-davis".into(),
                    r#type: Some(artist_v2()),
                    ..Default::default()
                }),
                data: Some(proto::to_any(&demo_v2::Artist {
                    name: "Miles Davis".into(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
        })
        .await
        .expect("a write without a tenancy")
        .into_inner()
        .resource
        .expect("stored");
    let tenancy = written.id.as_ref().and_then(|id| id.tenancy.clone());
    assert_eq!(
        tenancy
            .as_ref()
            .map(|t| (t.partition.as_str(), t.namespace.as_str())),
        Some(("default", "default"))
    );
    let mut read = tonic::Request::new(ReadRequest {
        id: Some(Id {
            name: "miles-davis".into(),
            r#type: Some(artist_v2()),
            ..Default::default()
        }),
        ..Default::default()
    });
    read.metadata_mut().insert(
        "x-resd-consistency-mode",
        "consistent".parse().expect("ascii"),
    );
    let read = client
        .read(read)
        .await
        .expect("a read without a tenancy")
        .into_inner()
        .resource
        .expect("resource");
    // The demo controller may have written its status since: the same resource, no older.
    assert_eq!(
        read.id.map(|id| id.uid),
        written.id.as_ref().map(|id| id.uid.clone())
    );
    // Versions are `index` or `index.position` (a change in a batch entry), ordered as pairs.
    let version = |text: &str| -> (u64, u32) {
        let (index, position) = text.split_once('.').unwrap_or((text, "0"));
        (
            index.parse().expect("a version's index"),
            position.parse().expect("a version's position"),
        )
    };
    assert!(
        version(&read.version) >= version(&written.version),
        "read {} after writing {}",
        read.version,
        written.version
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("an event")
            .expect("open")
            .expect("ok");
        // The watch's opening listing may already hold the write, and the demo controller may
        // have written its status by then: the same resource at this version or a later one.
        if let Some(Event::Upsert(upsert)) = event.event {
            let seen = upsert.resource.expect("an upsert carries its resource");
            assert_eq!(
                seen.id.map(|id| id.uid),
                written.id.as_ref().map(|id| id.uid.clone())
            );
            assert!(version(&seen.version) >= version(&written.version));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no upsert");
    }
}
