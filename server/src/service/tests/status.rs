//! WriteStatus.

use proto::resource::v1::{Condition, Reference};
use tonic::Code;

use super::*;

#[tokio::test]
async fn write_status_sets_updated_at_and_keeps_the_generation() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let written = h
        .write_status(
            &id_of(&stored),
            &stored.version,
            "ctl",
            status(&stored.generation),
        )
        .await
        .expect("status");
    let entry = &written.status["ctl"];
    assert!(entry.updated_at.is_some(), "the server sets updated_at");
    assert_eq!(entry.observed_generation, stored.generation);
    assert_eq!(
        written.generation, stored.generation,
        "a status write is not a new generation"
    );
    assert_ne!(
        written.version, stored.version,
        "a status write is a new version"
    );
    assert_eq!(h.read(&id_of(&stored)).await.expect("read"), written);
}

#[tokio::test]
async fn write_status_keeps_other_keys() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    h.write_status(&id_of(&stored), "", "first", status(&stored.generation))
        .await
        .expect("first");
    let written = h
        .write_status(&id_of(&stored), "", "second", status(&stored.generation))
        .await
        .expect("second");
    let mut keys: Vec<&String> = written.status.keys().collect();
    keys.sort();
    assert_eq!(keys, ["first", "second"]);
}

#[tokio::test]
async fn write_status_without_key_or_status_is_invalid() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let result = h
        .service
        .write_status(
            &AllowAll,
            WriteStatusRequest {
                id: Some(id_of(&stored)),
                version: String::new(),
                key: String::new(),
                status: None,
            },
        )
        .await;
    let message = expect_error(result, Code::InvalidArgument, "key is required");
    assert!(message.contains("status is required"), "{message}");
}

#[tokio::test]
async fn write_status_requires_a_ulid_observed_generation() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    expect_error(
        h.write_status(&id_of(&stored), "", "ctl", status("")).await,
        Code::InvalidArgument,
        "status.observed_generation is required",
    );
    expect_error(
        h.write_status(&id_of(&stored), "", "ctl", status("not-a-ulid"))
            .await,
        Code::InvalidArgument,
        "status.observed_generation invalid",
    );
}

#[tokio::test]
async fn write_status_with_updated_at_is_invalid() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut with_time = status(&stored.generation);
    with_time.updated_at = Some(prost_types::Timestamp {
        seconds: 1,
        nanos: 0,
    });
    expect_error(
        h.write_status(&id_of(&stored), "", "ctl", with_time).await,
        Code::InvalidArgument,
        "status.updated_at is set by the server",
    );
}

#[tokio::test]
async fn write_status_conditions_need_a_type_and_a_valid_reference() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut bad = status(&stored.generation);
    bad.conditions.push(Condition {
        r#type: String::new(),
        resource: Some(Reference {
            r#type: None,
            tenancy: None,
            name: "Bad".into(),
            section: String::new(),
        }),
        ..Default::default()
    });
    let message = expect_error(
        h.write_status(&id_of(&stored), "", "ctl", bad).await,
        Code::InvalidArgument,
        "status.conditions[1].type is required",
    );
    assert!(
        message.contains("status.conditions[1].resource.type is required"),
        "{message}"
    );
    assert!(
        message.contains("status.conditions[1].resource.name invalid"),
        "{message}"
    );
    assert!(
        message.contains("status.conditions[1].resource.tenancy is required"),
        "{message}"
    );
}

#[tokio::test]
async fn write_status_of_a_missing_resource_is_not_found() {
    let h = harness().await;
    expect_error(
        h.write_status(
            &id("demo.v2.Artist", default_ns(), "nobody"),
            "",
            "ctl",
            status(&ulid::Ulid::new().to_string()),
        )
        .await,
        Code::NotFound,
        "resource not found",
    );
}

#[tokio::test]
async fn write_status_with_a_stale_uid_is_not_found() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut stale = id_of(&stored);
    stale.uid = ulid::Ulid::new().to_string();
    expect_error(
        h.write_status(&stale, "", "ctl", status(&stored.generation))
            .await,
        Code::NotFound,
        "resource not found",
    );
}

#[tokio::test]
async fn write_status_with_a_wrong_version_is_aborted() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    expect_error(
        h.write_status(&id_of(&stored), "12345", "ctl", status(&stored.generation))
            .await,
        Code::Aborted,
        "CAS operation failed",
    );
}

#[tokio::test]
async fn blind_write_status_retries_after_lost_cas_races() {
    let backend = Arc::new(LosingBackend::new());
    let h = harness_with(backend.clone()).await;
    let stored = h.write(artist("miles")).await.expect("create");
    backend.lose_next(2);
    h.write_status(&id_of(&stored), "", "ctl", status(&stored.generation))
        .await
        .expect("retried");
}

#[tokio::test]
async fn write_status_into_a_missing_namespace_is_invalid() {
    let h = harness().await;
    expect_error(
        h.write_status(
            &id("demo.v2.Artist", tenancy("default", "nowhere"), "miles"),
            "",
            "ctl",
            status(&ulid::Ulid::new().to_string()),
        )
        .await,
        Code::InvalidArgument,
        "namespace not found",
    );
}
