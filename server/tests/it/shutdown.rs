//! Graceful shutdown: SIGTERM ends open watches and the process exits cleanly.

use std::time::Duration;

use proto::resource::v1::{Tenancy, Type, WatchListRequest};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::process::Resd;

#[tokio::test]
async fn sigterm_ends_open_watches_and_exits_zero() {
    let mut resd = Resd::start();
    let mut client = resd.resources().await;
    let mut watch = client
        .watch_list(WatchListRequest {
            r#type: Some(Type {
                group: "tenancy".into(),
                group_version: "v1".into(),
                kind: "Namespace".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: String::new(),
            }),
            name_prefix: String::new(),
            since_version: String::new(),
            ..WatchListRequest::default()
        })
        .await
        .expect("watch")
        .into_inner();
    // The snapshot holds the default namespace, then EndOfSnapshot.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("snapshot in time")
            .expect("stream open")
            .expect("ok");
    }

    let exit = tokio::task::spawn_blocking(move || resd.terminate())
        .await
        .expect("join");
    assert!(exit.success(), "resd exits 0 after SIGTERM, got {exit:?}");

    let ended = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch ends promptly");
    match ended {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        None => {}
        Some(Ok(event)) => panic!("unexpected event after shutdown: {event:?}"),
    }
}
