//! ACL hooks: denials, the read hook that needs the resource, list filtering.

use std::sync::Arc;

use futures::StreamExt;
use proto::resource::v1::WatchListRequest;
use proto::resource::v1::watch_event::Event;
use tonic::Code;

use super::*;
use crate::acl::{Access, KeyRules};
use proto::resource::v1::Tenancy;

fn record_label(name: &str) -> Resource {
    Resource {
        id: Some(id("demo.v1.RecordLabel", default_ns(), name)),
        data: Some(proto::to_any(&proto::demo::v1::RecordLabel {
            name: name.into(),
            description: String::new(),
        })),
        ..Default::default()
    }
}

fn reader_of(prefix: &str) -> KeyRules {
    KeyRules::default()
        .key_prefix("resource/", Access::List)
        .key_prefix(prefix, Access::Read)
}

#[tokio::test]
async fn write_denied_by_the_acl_hook_is_permission_denied() {
    let h = harness().await;
    let policy = reader_of("resource/demo.v2.Artist/");
    expect_error(
        h.write_as(&policy, artist("miles")).await,
        Code::PermissionDenied,
        "lacks write on demo.v2.Artist default/default/miles",
    );
}

#[tokio::test]
async fn write_allowed_by_the_acl_hook_succeeds() {
    let h = harness().await;
    let policy = KeyRules::default().key_prefix("resource/demo.v2.Artist/", Access::Write);
    h.write_as(&policy, artist("miles")).await.expect("allowed");
}

#[tokio::test]
async fn read_denied_is_permission_denied() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let policy = reader_of("resource/demo.v2.Album/");
    expect_error(
        h.read_as(&policy, &id_of(&stored)).await,
        Code::PermissionDenied,
        "lacks read on demo.v2.Artist default/default/miles",
    );
}

#[tokio::test]
async fn read_hook_needing_the_resource_gives_not_found_when_missing() {
    let h = harness().await;
    let nobody = KeyRules::default();
    expect_error(
        h.read_as(&nobody, &id("demo.v1.RecordLabel", default_ns(), "missing"))
            .await,
        Code::NotFound,
        "resource not found",
    );
}

#[tokio::test]
async fn read_hook_needing_the_resource_gives_permission_denied_when_present() {
    let h = harness().await;
    let stored = h.write(record_label("blue-note")).await.expect("create");
    let nobody = KeyRules::default();
    expect_error(
        h.read_as(&nobody, &id_of(&stored)).await,
        Code::PermissionDenied,
        "lacks read on demo.v1.RecordLabel",
    );
    let reader = reader_of("resource/demo.v1.RecordLabel/");
    assert_eq!(
        h.read_as(&reader, &id_of(&stored)).await.expect("allowed"),
        stored
    );
}

#[tokio::test]
async fn a_list_without_read_access_returns_nothing() {
    let h = harness().await;
    h.write(artist("miles")).await.expect("create");
    let nobody = KeyRules::default();
    let listed = h
        .list_as(&nobody, "demo.v2.Artist", default_ns(), "")
        .await
        .expect("a list is never refused, only filtered");
    assert!(listed.is_empty(), "{listed:?}");
}

#[tokio::test]
async fn list_filters_items_the_caller_cannot_read() {
    let h = harness().await;
    for name in ["public-one", "public-two", "secret"] {
        h.write(artist(name)).await.expect("create");
    }
    let policy = reader_of("resource/demo.v2.Artist/public");
    let listed = h
        .list_as(&policy, "demo.v2.Artist", default_ns(), "")
        .await
        .expect("list");
    assert_eq!(names(&listed), ["public-one", "public-two"]);
}

#[tokio::test]
async fn watch_filters_items_the_caller_cannot_read() {
    let h = harness().await;
    h.write(artist("secret")).await.expect("create");
    let policy: Arc<dyn Authorizer> = Arc::new(reader_of("resource/demo.v2.Artist/public"));
    let mut stream = h
        .service
        .watch_list(
            policy,
            WatchListRequest {
                r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
                tenancy: Some(default_ns()),
                name_prefix: String::new(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
        )
        .await
        .expect("watch");
    let first = stream.next().await.expect("event").expect("ok");
    assert!(
        matches!(first.event, Some(Event::EndOfSnapshot(_))),
        "the secret is not in the snapshot"
    );
    h.write(artist("secret-two")).await.expect("hidden");
    let visible = h.write(artist("public-one")).await.expect("visible");
    let event = stream.next().await.expect("event").expect("ok");
    match event.event {
        Some(Event::Upsert(upsert)) => assert_eq!(upsert.resource, Some(visible)),
        other => panic!("expected the public upsert, got {other:?}"),
    }
}

#[tokio::test]
async fn the_acl_types_need_acl_read_even_to_watch_and_operator_write_is_not_it() {
    let h = harness().await;
    let result = h
        .service
        .watch_list(
            Arc::new(KeyRules::default().operator(Access::Write)),
            WatchListRequest {
                r#type: Some(resource::parse_gvk("acl.v1.Token").expect("gvk")),
                tenancy: Some(Tenancy::default()),
                name_prefix: String::new(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
        )
        .await;
    expect_error(
        result.map(|_| ()),
        Code::PermissionDenied,
        "token lacks acl read",
    );
}

#[tokio::test]
async fn delete_uses_the_write_hook_on_the_stored_resource() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let reader = reader_of("resource/");
    expect_error(
        h.delete_as(&reader, &id_of(&stored), "").await,
        Code::PermissionDenied,
        "lacks write on demo.v2.Artist default/default/miles",
    );
    h.read(&id_of(&stored)).await.expect("not deleted");
    let writer = KeyRules::default().key_prefix("resource/demo.v2.Artist/miles", Access::Write);
    h.delete_as(&writer, &id_of(&stored), "")
        .await
        .expect("allowed");
}

#[tokio::test]
async fn write_status_uses_the_write_hook() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let reader = reader_of("resource/");
    expect_error(
        h.write_status_as(
            &reader,
            &id_of(&stored),
            "",
            "ctl",
            status(&stored.generation),
        )
        .await,
        Code::PermissionDenied,
        "lacks write on demo.v2.Artist default/default/miles",
    );
}

#[tokio::test]
async fn default_hooks_require_access_to_the_resource() {
    let h = harness().await;
    let namespace = Resource {
        id: Some(id("tenancy.v1.Namespace", tenancy("default", ""), "jazz")),
        ..Default::default()
    };
    let reader = KeyRules::default().key_prefix("resource/tenancy.v1.Namespace/", Access::Read);
    expect_error(
        h.write_as(&reader, namespace.clone()).await,
        Code::PermissionDenied,
        "lacks write on tenancy.v1.Namespace default/jazz",
    );
    let writer = KeyRules::default().key_prefix("resource/tenancy.v1.", Access::Write);
    let stored = h
        .write_as(&writer, namespace)
        .await
        .expect("write access to the namespace");
    h.read_as(&reader, &id_of(&stored))
        .await
        .expect("read access");
    expect_error(
        h.read_as(&KeyRules::default(), &id_of(&stored)).await,
        Code::PermissionDenied,
        "lacks read on tenancy.v1.Namespace default/jazz",
    );
}

#[tokio::test]
async fn mutate_and_validate_runs_the_write_hook() {
    let h = harness().await;
    let result = h
        .service
        .mutate_and_validate(
            &KeyRules::default(),
            proto::resource::v1::MutateAndValidateRequest {
                resource: Some(artist("miles")),
            },
        )
        .await;
    expect_error(
        result,
        Code::PermissionDenied,
        "lacks write on demo.v2.Artist default/default/miles",
    );
}

/// A selector and pages never widen what the least access sees: the unreadable resource that
/// matches the selector stays out, and so does it from every page.
#[tokio::test]
async fn selectors_and_pages_keep_what_the_caller_cannot_read_out() {
    let h = harness().await;
    for name in ["public-one", "public-two", "secret"] {
        let mut resource = artist(name);
        resource.metadata.insert("team".into(), "billing".into());
        h.write(resource).await.expect("create");
    }
    let policy = reader_of("resource/demo.v2.Artist/public");
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..5 {
        let page = h
            .service
            .list(
                &policy,
                Consistency::Eventual,
                ListRequest {
                    r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
                    tenancy: Some(default_ns()),
                    selector: "team=billing".into(),
                    limit: 1,
                    page_token: token.clone(),
                    ..Default::default()
                },
            )
            .await
            .expect("list");
        seen.extend(names(&page.resources));
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert_eq!(seen, ["public-one", "public-two"]);
}

/// A namespace's writers may not raise their own limits: writing a quota needs operator write;
/// a quota at cluster scope or with an unknown limit is refused naming the field.
#[tokio::test]
async fn quotas_are_written_by_operators_and_checked() {
    use crate::acl::{Access, KeyRules};
    let h = harness().await;
    let quota = |tenancy: Tenancy, key: &str| Resource {
        id: Some(id("tenancy.v1.Quota", tenancy, "limits")),
        data: Some(proto::to_any(&proto::tenancy::v1::Quota {
            hard: [(key.to_owned(), 10)].into(),
            used: Default::default(),
        })),
        ..Default::default()
    };
    let writer = KeyRules::default().key_prefix("resource/", Access::Write);
    let refused = h
        .write_as(
            &writer,
            quota(tenancy("default", "default"), "count/demo.*"),
        )
        .await
        .err()
        .map(|error| format!("{error:?}"));
    assert!(
        refused
            .as_ref()
            .is_some_and(|why| why.contains("operator write")),
        "{refused:?}"
    );
    let operator = writer.clone().operator(Access::Write);
    h.write_as(
        &operator,
        quota(tenancy("default", "default"), "count/demo.*"),
    )
    .await
    .expect("an operator sets a quota");
    for (tenancy, key, field) in [
        (Tenancy::default(), "bytes", "resource.id.tenancy"),
        (
            tenancy("default", "default"),
            "count/demo.v2.Artist",
            "resource.data.hard",
        ),
    ] {
        let refused = h
            .write_as(&operator, quota(tenancy, key))
            .await
            .err()
            .map(|error| format!("{error:?}"));
        assert!(
            refused.as_ref().is_some_and(|why| why.contains(field)),
            "{field}: {refused:?}"
        );
    }
}
