//! WatchList.

use std::time::Duration;

use futures::StreamExt;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{WatchEvent, WatchListRequest};
use tonic::Code;

use super::*;
use crate::service::read::WatchStream;

async fn watch(h: &Harness, gvk: &str, tenancy: Tenancy) -> WatchStream {
    h.service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::parse_gvk(gvk).expect("gvk")),
                tenancy: Some(tenancy),
                name_prefix: String::new(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
        )
        .await
        .expect("watch")
}

async fn next(stream: &mut WatchStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("an event within 5s")
        .expect("stream open")
        .expect("no error")
}

fn upserted(event: &WatchEvent) -> &Resource {
    match &event.event {
        Some(Event::Upsert(upsert)) => upsert.resource.as_ref().expect("resource"),
        other => panic!("expected an upsert, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_sends_the_snapshot_then_end_of_snapshot_then_changes() {
    let h = harness().await;
    let existing = h.write(artist("miles")).await.expect("create");
    let mut stream = watch(&h, "demo.v2.Artist", default_ns()).await;

    let first = next(&mut stream).await;
    assert_eq!(upserted(&first), &existing);
    assert_eq!(first.version, existing.version);
    let end = next(&mut stream).await;
    assert!(
        matches!(end.event, Some(Event::EndOfSnapshot(_))),
        "{end:?}"
    );

    let created = h.write(artist("coltrane")).await.expect("create");
    let event = next(&mut stream).await;
    assert_eq!(upserted(&event), &created);
    assert_eq!(event.version, created.version, "events carry their version");

    h.delete(&id_of(&created), "").await.expect("delete");
    let event = next(&mut stream).await;
    match event.event {
        Some(Event::Delete(delete)) => assert_eq!(delete.resource, Some(created)),
        other => panic!("expected a delete, got {other:?}"),
    }
    assert!(!event.version.is_empty());
}

#[tokio::test]
async fn every_write_emits_an_upsert_even_without_changes() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut stream = watch(&h, "demo.v2.Artist", default_ns()).await;
    next(&mut stream).await;
    next(&mut stream).await;
    let rewritten = h.write(stored.clone()).await.expect("identical write");
    assert_eq!(upserted(&next(&mut stream).await), &rewritten);
    let with_status = h
        .write_status(&id_of(&stored), "", "ctl", status(&stored.generation))
        .await
        .expect("status");
    assert_eq!(upserted(&next(&mut stream).await), &with_status);
}

#[tokio::test]
async fn watch_filters_other_group_versions() {
    let h = harness().await;
    let mut stream = watch(&h, "demo.v2.Artist", default_ns()).await;
    assert!(matches!(
        next(&mut stream).await.event,
        Some(Event::EndOfSnapshot(_))
    ));
    h.write(v1_artist("old")).await.expect("v1");
    let v2 = h.write(artist("new")).await.expect("v2");
    assert_eq!(
        upserted(&next(&mut stream).await),
        &v2,
        "the v1 write is not seen"
    );
}

#[tokio::test]
async fn watch_with_an_invalid_request_fails_before_the_stream() {
    let h = harness().await;
    let result = h
        .service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::new_type("demo", "v9", "Artist")),
                tenancy: Some(default_ns()),
                name_prefix: String::new(),
                since_version: String::new(),
                ..WatchListRequest::default()
            },
        )
        .await;
    expect_error(result.map(|_| ()), Code::InvalidArgument, "not registered");
}

#[tokio::test]
async fn watch_ends_with_unavailable_on_shutdown() {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let registry = Arc::new(Registry::builtin().expect("registry"));
    let service = ResourceService::new(Arc::new(InMemBackend::new()), registry)
        .with_shutdown(shutdown.clone());
    service.ensure_default_tenancy().await.expect("tenancy");
    let h = Harness {
        service: Arc::new(service),
    };
    let mut stream = watch(&h, "demo.v2.Artist", default_ns()).await;
    next(&mut stream).await;
    shutdown.cancel();
    let error = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("ends promptly")
        .expect("one last item")
        .expect_err("an error");
    expect_error::<()>(Err(error), Code::Unavailable, "shutting down");
    assert!(stream.next().await.is_none(), "then the stream ends");
}
