//! Write and MutateAndValidate.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use proto::demo::v2 as demo_v2;
use proto::resource::v1::{MutateAndValidateRequest, Resource};
use tonic::Code;

use super::*;
use crate::registry::decode_data;

#[tokio::test]
async fn write_creates_a_resource_with_uid_generation_and_version() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let stored_id = id_of(&stored);
    assert_eq!(stored_id.uid.len(), 26, "uid is a ULID: {}", stored_id.uid);
    assert!(
        ulid::Ulid::from_string(&stored.generation).is_ok(),
        "generation is a ULID"
    );
    assert!(!stored.version.is_empty());
    assert_eq!(h.read(&stored_id).await.expect("read back"), stored);
}

#[tokio::test]
async fn write_ignores_a_client_uid_on_create() {
    let h = harness().await;
    let mut input = artist("miles");
    input.id.as_mut().expect("id").uid = "01ARZ3NDEKTSV4RRFFQ69G5FAV".into();
    let stored = h.write(input).await.expect("create");
    assert_ne!(id_of(&stored).uid, "01ARZ3NDEKTSV4RRFFQ69G5FAV");
}

#[tokio::test]
async fn write_without_a_resource_is_invalid() {
    let h = harness().await;
    let result = h
        .service
        .write(&AllowAll, WriteRequest { resource: None })
        .await;
    expect_error(result, Code::InvalidArgument, "resource is required");
}

#[tokio::test]
async fn write_without_an_id_is_invalid() {
    let h = harness().await;
    let result = h.write(Resource::default()).await;
    expect_error(result, Code::InvalidArgument, "resource.id is required");
}

#[tokio::test]
async fn write_without_a_type_names_the_missing_field_and_not_the_tenancy() {
    let h = harness().await;
    let mut input = artist("miles");
    let id = input.id.as_mut().expect("id");
    id.r#type = None;
    id.tenancy = None;
    let message = expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.id.type is required",
    );
    // An absent tenancy is the scope's defaults (Consul 1.18), not a violation.
    assert!(!message.contains("tenancy"), "{message}");
}

#[tokio::test]
async fn write_with_an_uppercase_name_is_invalid() {
    let h = harness().await;
    expect_error(
        h.write(artist("Miles")).await,
        Code::InvalidArgument,
        "resource.id.name invalid",
    );
}

#[tokio::test]
async fn write_with_an_empty_name_is_invalid() {
    let h = harness().await;
    expect_error(
        h.write(artist("")).await,
        Code::InvalidArgument,
        "resource.id.name invalid: \"\" is empty",
    );
}

#[tokio::test]
async fn write_with_a_64_character_name_is_invalid() {
    let h = harness().await;
    expect_error(
        h.write(artist(&"a".repeat(64))).await,
        Code::InvalidArgument,
        "64 characters long",
    );
    h.write(artist(&"a".repeat(63)))
        .await
        .expect("63 characters is fine");
}

#[tokio::test]
async fn write_with_invalid_tenancy_names_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.id.as_mut().expect("id").tenancy = Some(tenancy("Bad", "*"));
    let message = expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.id.tenancy.partition invalid",
    );
    assert!(
        message.contains("resource.id.tenancy.namespace cannot be the wildcard"),
        "{message}"
    );
}

#[tokio::test]
async fn write_reports_every_violation_at_once() {
    let h = harness().await;
    let mut input = artist("Bad_Name");
    let id = input.id.as_mut().expect("id");
    id.r#type.as_mut().expect("type").kind = "artist".into();
    input.owner = Some(Id::default());
    let message = expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.id.type.kind",
    );
    assert!(message.contains("resource.id.name invalid"), "{message}");
    assert!(
        message.contains("resource.owner.type is required"),
        "{message}"
    );
    assert!(message.contains("resource.owner.name invalid"), "{message}");
}

#[tokio::test]
async fn write_of_an_unregistered_type_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.id.as_mut().expect("id").r#type = Some(resource::new_type("demo", "v9", "Artist"));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "demo.v9.Artist is not registered",
    );
}

#[tokio::test]
async fn write_with_data_of_the_wrong_type_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.data = Some(proto::to_any(&demo_v2::Album::default()));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.data is of the wrong type",
    );
}

#[tokio::test]
async fn write_with_undecodable_data_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.data.as_mut().expect("data").value = vec![0x0a, 0xff];
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "cannot decode resd.demo.v2.Artist",
    );
}

#[tokio::test]
async fn write_runs_the_mutate_hook() {
    let h = harness().await;
    let mut input = artist("miles");
    input.data = Some(proto::to_any(&demo_v2::Artist {
        name: "Miles".into(),
        ..Default::default()
    }));
    let stored = h.write(input).await.expect("create");
    let data: demo_v2::Artist = decode_data(&stored).expect("decodes");
    assert_eq!(data.genre, demo_v2::Genre::Disco as i32);
}

#[tokio::test]
async fn write_failing_the_validate_hook_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.data = Some(proto::to_any(&demo_v2::Artist::default()));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.data.name is required",
    );
}

#[tokio::test]
async fn write_of_a_partition_scoped_type_with_a_namespace_is_invalid() {
    let h = harness().await;
    let input = Resource {
        id: Some(id(
            "demo.v1.RecordLabel",
            tenancy("default", "default"),
            "blue-note",
        )),
        ..Default::default()
    };
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "partition scoped resource demo.v1.RecordLabel cannot have a namespace",
    );
}

#[tokio::test]
async fn write_of_a_cluster_scoped_type_with_a_partition_is_invalid() {
    let h = harness().await;
    let input = Resource {
        id: Some(id("demo.v1.Executive", tenancy("default", ""), "boss")),
        ..Default::default()
    };
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "cluster scoped resource demo.v1.Executive cannot have a partition",
    );
}

#[tokio::test]
async fn write_fills_tenancy_defaults_by_scope() {
    let h = harness().await;
    let artist = h.write(artist("miles")).await.expect("namespace scope");
    assert_eq!(id_of(&artist).tenancy, Some(tenancy("default", "default")));
    let label = h
        .write(Resource {
            id: Some(id("demo.v1.RecordLabel", default_ns(), "blue-note")),
            ..Default::default()
        })
        .await
        .expect("partition scope");
    assert_eq!(id_of(&label).tenancy, Some(tenancy("default", "")));
    let executive = h
        .write(Resource {
            id: Some(id("demo.v1.Executive", default_ns(), "boss")),
            ..Default::default()
        })
        .await
        .expect("cluster scope");
    assert_eq!(id_of(&executive).tenancy, Some(tenancy("", "")));
}

#[tokio::test]
async fn write_into_a_missing_partition_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.id.as_mut().expect("id").tenancy = Some(tenancy("nowhere", "default"));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "partition not found",
    );
}

#[tokio::test]
async fn write_into_a_missing_namespace_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.id.as_mut().expect("id").tenancy = Some(tenancy("default", "nowhere"));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "namespace not found",
    );
}

#[tokio::test]
async fn write_into_a_created_namespace_succeeds() {
    let h = harness().await;
    h.write(Resource {
        id: Some(id("tenancy.v1.Namespace", tenancy("default", ""), "jazz")),
        ..Default::default()
    })
    .await
    .expect("namespace");
    let mut input = artist("miles");
    input.id.as_mut().expect("id").tenancy = Some(tenancy("default", "jazz"));
    h.write(input).await.expect("artist in the new namespace");
}

#[tokio::test]
async fn write_of_a_namespace_in_a_missing_partition_is_invalid() {
    let h = harness().await;
    let input = Resource {
        id: Some(id("tenancy.v1.Namespace", tenancy("nowhere", ""), "jazz")),
        ..Default::default()
    };
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "partition not found",
    );
}

#[tokio::test]
async fn write_of_a_tombstone_is_invalid() {
    let h = harness().await;
    let input = Resource {
        id: Some(id(
            "internal.v1.Tombstone",
            tenancy("default", "default"),
            "tombstone-x",
        )),
        ..Default::default()
    };
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "written by the server only",
    );
}

#[tokio::test]
async fn write_over_the_size_limit_is_rejected_with_the_limit_in_the_message() {
    let h = harness().await;
    let mut input = artist("miles");
    input.metadata.insert(
        "blob".into(),
        "x".repeat(super::super::DEFAULT_MAX_RESOURCE_BYTES + 1),
    );
    let message = expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "over the limit of 4194304 bytes",
    );
    assert!(message.starts_with("resource is 41944"), "{message}");
    let listed = h
        .list("demo.v2.Artist", tenancy("*", "*"), "")
        .await
        .expect("list");
    assert!(listed.is_empty(), "nothing was stored");
}

#[tokio::test]
async fn create_with_a_version_is_aborted() {
    let h = harness().await;
    let mut input = artist("miles");
    input.version = "7".into();
    expect_error(h.write(input).await, Code::Aborted, "CAS operation failed");
}

#[tokio::test]
async fn update_with_a_stale_version_is_aborted() {
    let h = harness().await;
    let first = h.write(artist("miles")).await.expect("create");
    h.write(first.clone()).await.expect("update");
    expect_error(h.write(first).await, Code::Aborted, "CAS operation failed");
}

#[tokio::test]
async fn update_with_the_current_version_gets_a_new_version_and_generation() {
    let h = harness().await;
    let first = h.write(artist("miles")).await.expect("create");
    let mut update = first.clone();
    update.metadata.insert("label".into(), "blue-note".into());
    let second = h.write(update).await.expect("update");
    assert_ne!(second.version, first.version);
    assert_ne!(second.generation, first.generation);
    assert_eq!(id_of(&second).uid, id_of(&first).uid);
    assert_eq!(second.metadata["label"], "blue-note");
}

#[tokio::test]
async fn every_write_gets_a_new_version_even_when_nothing_changed() {
    let h = harness().await;
    let first = h.write(artist("miles")).await.expect("create");
    let second = h.write(first.clone()).await.expect("same content");
    assert_ne!(second.version, first.version);
    assert_ne!(second.generation, first.generation);
}

#[tokio::test]
async fn blind_write_updates_the_stored_resource() {
    let h = harness().await;
    let first = h.write(artist("miles")).await.expect("create");
    let mut blind = artist("miles");
    blind.metadata.insert("k".into(), "v".into());
    let second = h.write(blind).await.expect("blind update");
    assert_eq!(id_of(&second).uid, id_of(&first).uid);
    assert_eq!(second.metadata["k"], "v");
}

#[tokio::test]
async fn blind_write_retries_after_lost_cas_races() {
    let backend = Arc::new(LosingBackend::new());
    let h = harness_with(backend.clone()).await;
    h.write(artist("miles")).await.expect("create");
    backend.lose_next(3);
    let before = backend.writes.load(Ordering::SeqCst);
    h.write(artist("miles")).await.expect("blind write retries");
    assert_eq!(
        backend.writes.load(Ordering::SeqCst) - before,
        4,
        "three lost attempts, then success"
    );
}

#[tokio::test]
async fn blind_write_keeps_retrying_lost_races_until_its_deadline() {
    let backend = Arc::new(LosingBackend::new());
    let h = harness_with(backend.clone()).await;
    // Twenty lost races in a row still end in success.
    backend.lose_next(20);
    h.write(artist("miles")).await.expect("blind write retries");
    // Losing forever: the request's deadline ends it, saying why.
    backend.lose_next(u32::MAX);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
    expect_error(
        crate::storage::deadline::scope(Some(deadline), h.write(artist("miles"))).await,
        Code::Aborted,
        "kept losing to concurrent writers",
    );
}

#[tokio::test]
async fn cas_write_that_loses_a_race_is_not_retried() {
    let backend = Arc::new(LosingBackend::new());
    let h = harness_with(backend.clone()).await;
    let stored = h.write(artist("miles")).await.expect("create");
    backend.lose_next(1);
    let before = backend.writes.load(Ordering::SeqCst);
    expect_error(h.write(stored).await, Code::Aborted, "CAS operation failed");
    assert_eq!(backend.writes.load(Ordering::SeqCst) - before, 1);
}

#[tokio::test]
async fn write_with_another_uid_fails_the_precondition() {
    let h = harness().await;
    let mut stored = h.write(artist("miles")).await.expect("create");
    stored.id.as_mut().expect("id").uid = ulid::Ulid::new().to_string();
    expect_error(
        h.write(stored).await,
        Code::FailedPrecondition,
        "uid doesn't match",
    );
}

#[tokio::test]
async fn write_with_status_on_create_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input
        .status
        .insert("ctl".into(), status(&ulid::Ulid::new().to_string()));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.status cannot be set on create",
    );
}

#[tokio::test]
async fn write_with_a_changed_status_is_invalid() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut input = stored.clone();
    input
        .status
        .insert("ctl".into(), status(&stored.generation));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "resource.status can only be changed with WriteStatus",
    );
}

#[tokio::test]
async fn write_with_the_stored_status_or_none_keeps_the_statuses() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let with_status = h
        .write_status(&id_of(&stored), "", "ctl", status(&stored.generation))
        .await
        .expect("status");
    let echoed = h
        .write(with_status.clone())
        .await
        .expect("same statuses echoed back");
    assert_eq!(echoed.status, with_status.status);
    let mut without = echoed.clone();
    without.status.clear();
    let kept = h.write(without).await.expect("no statuses sent");
    assert_eq!(kept.status, with_status.status);
}

#[tokio::test]
async fn owner_without_uid_is_resolved_on_create() {
    let h = harness().await;
    let owner = h.write(artist("miles")).await.expect("owner");
    let mut child = album("kind-of-blue");
    let mut owner_ref = id_of(&owner);
    owner_ref.uid.clear();
    child.owner = Some(owner_ref);
    let stored = h.write(child).await.expect("child");
    assert_eq!(stored.owner.expect("owner").uid, id_of(&owner).uid);
}

#[tokio::test]
async fn owner_that_does_not_exist_is_invalid() {
    let h = harness().await;
    let mut child = album("kind-of-blue");
    child.owner = Some(id("demo.v2.Artist", default_ns(), "nobody"));
    expect_error(
        h.write(child).await,
        Code::InvalidArgument,
        "resource.owner does not exist",
    );
}

#[tokio::test]
async fn owner_of_an_unregistered_type_is_invalid() {
    let h = harness().await;
    let mut child = album("kind-of-blue");
    child.owner = Some(id("demo.v7.Artist", default_ns(), "nobody"));
    expect_error(
        h.write(child).await,
        Code::InvalidArgument,
        "resource.owner.type demo.v7.Artist is not registered",
    );
}

#[tokio::test]
async fn owner_with_uid_is_accepted_as_given() {
    let h = harness().await;
    let mut child = album("kind-of-blue");
    let mut owner = id(
        "demo.v2.Artist",
        tenancy("default", "default"),
        "not-written-yet",
    );
    owner.uid = ulid::Ulid::new().to_string();
    child.owner = Some(owner.clone());
    let stored = h
        .write(child)
        .await
        .expect("owner with uid is not looked up");
    assert_eq!(stored.owner, Some(owner));
}

#[tokio::test]
async fn owner_cannot_be_changed() {
    let h = harness().await;
    let first_owner = h.write(artist("miles")).await.expect("owner");
    let second_owner = h.write(artist("coltrane")).await.expect("owner");
    let mut child = album("kind-of-blue");
    child.owner = Some(id_of(&first_owner));
    let stored = h.write(child).await.expect("child");
    let mut moved = stored.clone();
    moved.owner = Some(id_of(&second_owner));
    expect_error(
        h.write(moved).await,
        Code::InvalidArgument,
        "resource.owner cannot be changed",
    );
    let mut orphaned = stored;
    orphaned.owner = None;
    expect_error(
        h.write(orphaned).await,
        Code::InvalidArgument,
        "resource.owner cannot be changed",
    );
}

#[tokio::test]
async fn owner_cannot_be_added_after_create() {
    let h = harness().await;
    let owner = h.write(artist("miles")).await.expect("owner");
    let mut child = h.write(album("kind-of-blue")).await.expect("child");
    child.owner = Some(id_of(&owner));
    expect_error(
        h.write(child).await,
        Code::InvalidArgument,
        "resource.owner cannot be changed",
    );
}

#[tokio::test]
async fn update_naming_the_owner_without_uid_keeps_the_stored_uid() {
    let h = harness().await;
    let owner = h.write(artist("miles")).await.expect("owner");
    let mut child = album("kind-of-blue");
    child.owner = Some(id_of(&owner));
    h.write(child).await.expect("child");
    let mut update = album("kind-of-blue");
    let mut owner_ref = id_of(&owner);
    owner_ref.uid.clear();
    update.owner = Some(owner_ref);
    let stored = h
        .write(update)
        .await
        .expect("blind update with uid-less owner");
    assert_eq!(stored.owner.expect("owner").uid, id_of(&owner).uid);
}

#[tokio::test]
async fn create_with_a_deletion_timestamp_is_invalid() {
    let h = harness().await;
    let mut input = artist("miles");
    input.metadata.insert(
        resource::DELETION_TIMESTAMP_KEY.into(),
        "2026-01-01T00:00:00Z".into(),
    );
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "deletionTimestamp cannot be set on create",
    );
}

#[tokio::test]
async fn write_setting_a_deletion_timestamp_on_a_live_resource_is_invalid() {
    let h = harness().await;
    let mut stored = h.write(artist("miles")).await.expect("create");
    stored.metadata.insert(
        resource::DELETION_TIMESTAMP_KEY.into(),
        "2026-01-01T00:00:00Z".into(),
    );
    expect_error(
        h.write(stored).await,
        Code::InvalidArgument,
        "deletionTimestamp is set by Delete",
    );
}

#[tokio::test]
async fn write_across_group_versions_replaces_the_stored_version() {
    let h = harness().await;
    let v2 = h.write(artist("miles")).await.expect("v2");
    let v1 = h.write(v1_artist("miles")).await.expect("v1 over v2");
    assert_eq!(id_of(&v1).uid, id_of(&v2).uid, "same object");
    let read = h
        .read(&id("demo.v1.Artist", default_ns(), "miles"))
        .await
        .expect("read v1");
    assert_eq!(read.version, v1.version);
}

#[tokio::test]
async fn mutate_and_validate_returns_the_mutated_resource_and_stores_nothing() {
    let h = harness().await;
    let mut input = artist("miles");
    input.data = Some(proto::to_any(&demo_v2::Artist {
        name: "Miles".into(),
        ..Default::default()
    }));
    let response = h
        .service
        .mutate_and_validate(
            &AllowAll,
            MutateAndValidateRequest {
                resource: Some(input),
            },
        )
        .await
        .expect("valid");
    let mutated = response.resource.expect("resource");
    let data: demo_v2::Artist = decode_data(&mutated).expect("decodes");
    assert_eq!(data.genre, demo_v2::Genre::Disco as i32);
    assert_eq!(
        id_of(&mutated).tenancy,
        Some(tenancy("default", "default")),
        "defaults applied"
    );
    expect_error(
        h.read(&id_of(&mutated)).await,
        Code::NotFound,
        "resource not found",
    );
}

#[tokio::test]
async fn mutate_and_validate_runs_the_validate_hook_and_tenancy_checks() {
    let h = harness().await;
    let mut nameless = artist("miles");
    nameless.data = Some(proto::to_any(&demo_v2::Artist::default()));
    let result = h
        .service
        .mutate_and_validate(
            &AllowAll,
            MutateAndValidateRequest {
                resource: Some(nameless),
            },
        )
        .await;
    expect_error(
        result,
        Code::InvalidArgument,
        "resource.data.name is required",
    );
    let mut elsewhere = artist("miles");
    elsewhere.id.as_mut().expect("id").tenancy = Some(tenancy("default", "nowhere"));
    let result = h
        .service
        .mutate_and_validate(
            &AllowAll,
            MutateAndValidateRequest {
                resource: Some(elsewhere),
            },
        )
        .await;
    expect_error(result, Code::InvalidArgument, "namespace not found");
}

#[tokio::test]
async fn an_unregistered_type_suggests_what_was_probably_meant() {
    let h = harness().await;
    let mut input = artist("miles");
    input.id.as_mut().expect("id").r#type = Some(resource::new_type("demo", "v2", "Artst"));
    expect_error(
        h.write(input).await,
        Code::InvalidArgument,
        "did you mean demo.v2.Artist?",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_blind_creates_of_one_name_all_succeed() {
    let h = Arc::new(harness().await);
    let mut writers = Vec::new();
    for index in 0..8 {
        let h = h.clone();
        writers.push(tokio::spawn(async move {
            let mut input = artist("contended");
            input.metadata.insert("writer".into(), index.to_string());
            h.write(input).await
        }));
    }
    let mut uids = std::collections::BTreeSet::new();
    for writer in writers {
        let stored = writer
            .await
            .expect("join")
            .expect("every blind write lands");
        uids.insert(id_of(&stored).uid);
    }
    assert_eq!(
        uids.len(),
        1,
        "one resource, created once and updated by the rest"
    );
}

/// The leader's check of a change a follower forwarded: a namespace that does not exist (the
/// follower's local look was stale, or it was deleted since) is refused with its reason, as
/// the same write on the leader is, not as a merely invalid change.
#[tokio::test]
async fn a_forwarded_change_into_a_missing_namespace_keeps_its_reason() {
    use crate::storage::{Admission, StorageError};

    let harness = harness().await;
    let service = harness.service;
    let admission = crate::service::ForwardAdmission::new(service.clone());
    let mut lost = artist("lost");
    lost.id.as_mut().unwrap().tenancy = Some(tenancy("default", "gone"));
    lost.id.as_mut().unwrap().uid = crate::service::new_ulid();
    lost.generation = crate::service::new_ulid();
    let refused = admission.admit(&lost).await.expect_err("no such namespace");
    assert!(
        matches!(refused, StorageError::MissingTenancy(_)),
        "{refused:?}"
    );
    let (code, reason) = Error::from_storage(refused).code_and_reason();
    assert_eq!(
        (code, reason),
        (
            Code::InvalidArgument,
            proto::reason::Reason::TenancyNotFound
        )
    );
}
