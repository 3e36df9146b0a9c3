//! Consul 1.18's absent tenancy: an id without one means the scope's defaults, a watch without
//! one follows every tenancy of the scope, List still needs one; name prefixes are lowercase.

use std::time::Duration;

use futures::StreamExt;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{ListRequest, WatchListRequest};
use tonic::Code;

use super::*;

/// A resource of `gvk` named `name` with the given tenancy (`None`: left out).
fn resource(gvk: &str, tenancy: Option<Tenancy>, name: &str) -> Resource {
    let data = match gvk {
        "demo.v1.RecordLabel" => proto::to_any(&proto::demo::v1::RecordLabel {
            name: name.into(),
            ..Default::default()
        }),
        "demo.v1.Executive" => proto::to_any(&proto::demo::v1::Executive {
            name: name.into(),
            ..Default::default()
        }),
        _ => proto::to_any(&proto::demo::v1::Artist {
            name: name.into(),
            ..Default::default()
        }),
    };
    let mut id = id(gvk, Tenancy::default(), name);
    id.tenancy = tenancy;
    Resource {
        id: Some(id),
        data: Some(data),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_absent_tenancy_is_the_scope_defaults_for_every_scope() {
    let h = harness().await;
    for (gvk, stored_tenancy) in [
        ("demo.v1.Artist", tenancy("default", "default")),
        ("demo.v1.RecordLabel", tenancy("default", "")),
        ("demo.v1.Executive", tenancy("", "")),
    ] {
        let absent = h
            .write(resource(gvk, None, "absent"))
            .await
            .unwrap_or_else(|error| panic!("{gvk} without a tenancy: {error}"));
        let empty = h
            .write(resource(gvk, Some(Tenancy::default()), "empty"))
            .await
            .expect("empty tenancy");
        assert_eq!(
            id_of(&absent).tenancy,
            Some(stored_tenancy.clone()),
            "{gvk}"
        );
        assert_eq!(id_of(&empty).tenancy, Some(stored_tenancy.clone()), "{gvk}");

        // Read, WriteStatus, MutateAndValidate and Delete take a tenancy-less id too.
        let mut bare = id_of(&absent);
        bare.tenancy = None;
        bare.uid.clear();
        let read = h.read(&bare).await.expect("read without a tenancy");
        assert_eq!(read.id, absent.id, "{gvk}");
        let generation = absent.generation.clone();
        h.write_status(&bare, "", "test", status(&generation))
            .await
            .expect("status without a tenancy");
        h.service
            .mutate_and_validate(
                &AllowAll,
                proto::resource::v1::MutateAndValidateRequest {
                    resource: Some(resource(gvk, None, "checked")),
                },
            )
            .await
            .expect("mutate and validate without a tenancy");
        h.delete(&bare, "").await.expect("delete without a tenancy");
        assert!(h.read(&id_of(&absent)).await.is_err(), "{gvk} deleted");
    }
}

#[tokio::test]
async fn an_owner_without_a_tenancy_is_found_in_the_defaults() {
    let h = harness().await;
    let owner = h.write(artist("miles")).await.expect("owner");
    let mut child = album("kind-of-blue");
    let mut owner_id = id_of(&owner);
    owner_id.tenancy = None;
    owner_id.uid.clear();
    child.owner = Some(owner_id);
    let stored = h
        .write(child)
        .await
        .expect("child with a tenancy-less owner");
    assert_eq!(stored.owner.map(|o| o.uid), Some(id_of(&owner).uid));
}

#[tokio::test]
async fn a_watch_without_a_tenancy_follows_every_tenancy_of_the_scope() {
    let h = harness().await;
    for namespace in ["jazz", "rock"] {
        h.write(Resource {
            id: Some(id(
                "tenancy.v1.Namespace",
                tenancy("default", ""),
                namespace,
            )),
            data: Some(proto::to_any(&proto::tenancy::v1::Namespace::default())),
            ..Default::default()
        })
        .await
        .expect("namespace");
    }
    let mut watch = h
        .service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::parse_gvk("demo.v1.Artist").expect("gvk")),
                tenancy: None,
                name_prefix: String::new(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
        )
        .await
        .expect("a watch without a tenancy");
    for namespace in ["jazz", "rock"] {
        h.write(resource(
            "demo.v1.Artist",
            Some(tenancy("default", namespace)),
            namespace,
        ))
        .await
        .expect("write");
    }
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("an event")
            .expect("open")
            .expect("ok");
        if let Some(Event::Upsert(upsert)) = event.event {
            let id = upsert.resource.and_then(|r| r.id).expect("id");
            seen.push(id.tenancy.expect("tenancy").namespace);
        }
    }
    assert_eq!(seen, ["jazz", "rock"]);
}

#[tokio::test]
async fn list_still_needs_a_tenancy() {
    let h = harness().await;
    let result = h
        .service
        .list(
            &AllowAll,
            Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::parse_gvk("demo.v1.Artist").expect("gvk")),
                tenancy: None,
                name_prefix: String::new(),
                ..ListRequest::default()
            },
        )
        .await;
    expect_error(result, Code::InvalidArgument, "tenancy is required");
}

#[tokio::test]
async fn an_uppercase_name_prefix_is_invalid_in_list_and_watch() {
    let h = harness().await;
    let list = h
        .service
        .list(
            &AllowAll,
            Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::parse_gvk("demo.v1.Artist").expect("gvk")),
                tenancy: Some(default_ns()),
                name_prefix: "Miles".into(),
                ..ListRequest::default()
            },
        )
        .await;
    expect_error(list, Code::InvalidArgument, "name_prefix invalid");
    let watch = h
        .service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::parse_gvk("demo.v1.Artist").expect("gvk")),
                tenancy: None,
                name_prefix: "Miles".into(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
        )
        .await;
    expect_error(
        watch.map(|_| ()),
        Code::InvalidArgument,
        "name_prefix invalid",
    );
}
