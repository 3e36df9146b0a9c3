//! Delete, tombstones and finalizers.

use proto::internal::v1::Tombstone;
use tonic::Code;

use super::*;
use crate::registry::{builtin, decode_data};

const FINALIZER: &str = "demo.resd.io/cleanup";

async fn tombstones(h: &Harness) -> Vec<Resource> {
    h.list("internal.v1.Tombstone", tenancy("*", "*"), "")
        .await
        .expect("list tombstones")
}

async fn with_finalizers(h: &Harness, name: &str, finalizers: &str) -> Resource {
    let mut input = artist(name);
    input
        .metadata
        .insert(resource::FINALIZERS_KEY.into(), finalizers.into());
    h.write(input).await.expect("create with finalizers")
}

#[tokio::test]
async fn delete_of_a_missing_resource_succeeds() {
    let h = harness().await;
    h.delete(&id("demo.v2.Artist", default_ns(), "nobody"), "")
        .await
        .expect("idempotent");
    assert!(tombstones(&h).await.is_empty());
}

#[tokio::test]
async fn delete_removes_the_resource_and_writes_a_tombstone() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    h.delete(&id_of(&stored), "").await.expect("delete");
    expect_error(
        h.read(&id_of(&stored)).await,
        Code::NotFound,
        "resource not found",
    );

    let tombstones = tombstones(&h).await;
    assert_eq!(tombstones.len(), 1);
    let tombstone_id = id_of(&tombstones[0]);
    assert_eq!(
        tombstone_id.name,
        format!("tombstone-miles-{}", id_of(&stored).uid.to_lowercase())
    );
    assert_eq!(tombstone_id.tenancy, Some(tenancy("default", "default")));
    let data: Tombstone = decode_data(&tombstones[0]).expect("tombstone data");
    assert_eq!(
        data.owner,
        Some(id_of(&stored)),
        "the tombstone names the deleted resource with its uid"
    );
}

#[tokio::test]
async fn delete_with_the_current_version_succeeds() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    h.delete(&id_of(&stored), &stored.version)
        .await
        .expect("CAS delete");
    expect_error(h.read(&id_of(&stored)).await, Code::NotFound, "not found");
}

#[tokio::test]
async fn delete_with_a_stale_uid_deletes_nothing() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut stale = id_of(&stored);
    stale.uid = ulid::Ulid::new().to_string();
    h.delete(&stale, "").await.expect("ok, no-op");
    assert_eq!(h.read(&id_of(&stored)).await.expect("still there"), stored);
}

#[tokio::test]
async fn delete_with_a_wrong_version_is_aborted() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    expect_error(
        h.delete(&id_of(&stored), "999").await,
        Code::Aborted,
        "CAS operation failed",
    );
    h.read(&id_of(&stored)).await.expect("still there");
}

#[tokio::test]
async fn blind_delete_retries_after_lost_cas_races() {
    let backend = Arc::new(LosingBackend::new());
    let h = harness_with(backend.clone()).await;
    let stored = h.write(artist("miles")).await.expect("create");
    backend.lose_next(2);
    h.delete(&id_of(&stored), "")
        .await
        .expect("blind delete retries");
    expect_error(h.read(&id_of(&stored)).await, Code::NotFound, "not found");
}

#[tokio::test]
async fn deleting_a_tombstone_writes_no_new_tombstone() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    h.delete(&id_of(&stored), "").await.expect("delete");
    let tombstone = tombstones(&h).await.pop().expect("one tombstone");
    h.delete(&id_of(&tombstone), "")
        .await
        .expect("delete the tombstone");
    assert!(tombstones(&h).await.is_empty());
}

#[tokio::test]
async fn delete_of_the_default_namespace_is_invalid() {
    let h = harness().await;
    expect_error(
        h.delete(&builtin::namespace_id("default", "default"), "")
            .await,
        Code::InvalidArgument,
        "cannot be deleted",
    );
    expect_error(
        h.delete(&builtin::partition_id("default"), "").await,
        Code::InvalidArgument,
        "cannot be deleted",
    );
}

#[tokio::test]
async fn delete_without_an_id_is_invalid() {
    let h = harness().await;
    let result = h.service.delete(&AllowAll, DeleteRequest::default()).await;
    expect_error(result, Code::InvalidArgument, "id is required");
}

#[tokio::test]
async fn delete_with_finalizers_only_marks_the_resource() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let marked = h.read(&id_of(&stored)).await.expect("still there");
    assert!(resource::is_marked_for_deletion(&marked));
    assert_ne!(marked.version, stored.version, "marking is a write");
    assert_eq!(
        marked.generation, stored.generation,
        "marking is not a new generation of the spec"
    );
    assert!(tombstones(&h).await.is_empty());
}

#[tokio::test]
async fn second_delete_of_a_marked_resource_is_a_no_op() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let marked = h.read(&id_of(&stored)).await.expect("marked");
    h.delete(&id_of(&stored), "").await.expect("no-op");
    assert_eq!(h.read(&id_of(&stored)).await.expect("unchanged"), marked);
}

#[tokio::test]
async fn marked_resource_accepts_a_write_that_removes_a_finalizer() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", "a.example/one b.example/two").await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    resource::remove_finalizer(&mut marked, "a.example/one");
    let written = h.write(marked).await.expect("finalizer removal");
    assert_eq!(
        resource::finalizers(&written)
            .into_iter()
            .collect::<Vec<_>>(),
        ["b.example/two"]
    );
    assert!(resource::is_marked_for_deletion(&written));
}

#[tokio::test]
async fn marked_resource_rejects_data_changes() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", "a.example/one b.example/two").await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    resource::remove_finalizer(&mut marked, "a.example/one");
    marked.data = artist("other").data;
    expect_error(
        h.write(marked).await,
        Code::InvalidArgument,
        "resource.data cannot change",
    );
}

#[tokio::test]
async fn marked_resource_rejects_new_finalizers() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    resource::add_finalizer(&mut marked, "new.example/x");
    expect_error(h.write(marked).await, Code::InvalidArgument, "cannot gain");
}

#[tokio::test]
async fn marked_resource_rejects_other_metadata_changes() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", "a.example/one b.example/two").await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    resource::remove_finalizer(&mut marked, "a.example/one");
    marked.metadata.insert("label".into(), "x".into());
    expect_error(
        h.write(marked).await,
        Code::InvalidArgument,
        "resource.metadata cannot change",
    );
}

#[tokio::test]
async fn marked_resource_rejects_a_no_op_write() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let marked = h.read(&id_of(&stored)).await.expect("marked");
    expect_error(
        h.write(marked).await,
        Code::InvalidArgument,
        "no-op write rejected",
    );
}

#[tokio::test]
async fn marked_resource_rejects_removing_the_deletion_timestamp() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", "a.example/one b.example/two").await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    resource::remove_finalizer(&mut marked, "a.example/one");
    marked.metadata.remove(resource::DELETION_TIMESTAMP_KEY);
    expect_error(
        h.write(marked).await,
        Code::InvalidArgument,
        "deletionTimestamp cannot be changed or removed",
    );
}

#[tokio::test]
async fn blind_write_without_finalizers_keeps_the_stored_finalizers() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    let mut blind = artist("miles");
    blind.metadata.insert("label".into(), "x".into());
    let written = h.write(blind).await.expect("blind write");
    assert!(resource::has_finalizer(&written, FINALIZER));
    assert_eq!(id_of(&written).uid, id_of(&stored).uid);
}

#[tokio::test]
async fn blind_write_to_a_marked_resource_keeps_the_deletion_timestamp() {
    let h = harness().await;
    with_finalizers(&h, "miles", "a.example/one b.example/two").await;
    h.delete(&id("demo.v2.Artist", default_ns(), "miles"), "")
        .await
        .expect("mark");
    let marked = h
        .read(&id("demo.v2.Artist", default_ns(), "miles"))
        .await
        .expect("marked");
    let mut blind = artist("miles");
    blind.data = marked.data.clone();
    blind
        .metadata
        .insert(resource::FINALIZERS_KEY.into(), "b.example/two".into());
    let written = h.write(blind).await.expect("blind finalizer removal");
    assert_eq!(
        written.metadata.get(resource::DELETION_TIMESTAMP_KEY),
        marked.metadata.get(resource::DELETION_TIMESTAMP_KEY)
    );
}

#[tokio::test]
async fn removing_the_last_finalizer_completes_the_delete() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    resource::remove_finalizer(&mut marked, FINALIZER);
    h.write(marked).await.expect("last finalizer removed");
    expect_error(
        h.read(&id_of(&stored)).await,
        Code::NotFound,
        "resource not found",
    );
    assert_eq!(
        tombstones(&h).await.len(),
        1,
        "the completed delete leaves a tombstone"
    );
}

#[tokio::test]
async fn delete_of_a_marked_resource_without_finalizers_completes_it() {
    let h = harness().await;
    // A marked resource whose last finalizer went but whose delete did not finish (a crash in
    // between) is deleted by the next Delete.
    let mut stuck = h.write(artist("miles")).await.expect("create");
    stuck.metadata.insert(
        resource::DELETION_TIMESTAMP_KEY.into(),
        "2026-01-01T00:00:00Z".into(),
    );
    let stuck = h
        .service
        .backend
        .write_cas(stuck)
        .await
        .expect("plant a stuck resource");
    h.delete(&id_of(&stuck), "").await.expect("delete");
    expect_error(h.read(&id_of(&stuck)).await, Code::NotFound, "not found");
}

#[tokio::test]
async fn write_status_is_allowed_on_a_marked_resource() {
    let h = harness().await;
    let stored = with_finalizers(&h, "miles", FINALIZER).await;
    h.delete(&id_of(&stored), "").await.expect("mark");
    h.write_status(&id_of(&stored), "", "ctl", status(&stored.generation))
        .await
        .expect("status on a marked resource");
}

#[tokio::test]
async fn create_in_a_namespace_marked_for_deletion_is_invalid() {
    let h = harness().await;
    let mut namespace = Resource {
        id: Some(id(
            "tenancy.v1.Namespace",
            tenancy("default", ""),
            "closing",
        )),
        ..Default::default()
    };
    namespace
        .metadata
        .insert(resource::FINALIZERS_KEY.into(), "resd.io/namespace".into());
    let namespace = h.write(namespace).await.expect("namespace");
    let mut inside = artist("early");
    inside.id.as_mut().expect("id").tenancy = Some(tenancy("default", "closing"));
    let early = h.write(inside.clone()).await.expect("before the mark");
    h.delete(&id_of(&namespace), "")
        .await
        .expect("mark the namespace");

    let mut late = artist("late");
    late.id.as_mut().expect("id").tenancy = Some(tenancy("default", "closing"));
    expect_error(
        h.write(late).await,
        Code::InvalidArgument,
        "marked for deletion",
    );
    expect_error(
        h.write(early.clone()).await,
        Code::InvalidArgument,
        "marked for deletion",
    );
    h.delete(&id_of(&early), "")
        .await
        .expect("deletes still work inside");
}

#[tokio::test]
async fn marked_resource_accepts_equal_data_in_another_encoding() {
    let h = harness().await;
    let mut input = artist("band");
    input.data = Some(proto::to_any(&proto::demo::v2::Artist {
        name: "The Band".into(),
        genre: proto::demo::v2::Genre::Folk as i32,
        group_members: [
            ("robbie".to_owned(), "guitar".to_owned()),
            ("levon".to_owned(), "drums".to_owned()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    }));
    input.metadata.insert(
        resource::FINALIZERS_KEY.into(),
        "a.example/one b.example/two".into(),
    );
    let stored = h.write(input).await.expect("create");
    h.delete(&id_of(&stored), "").await.expect("mark");
    let mut marked = h.read(&id_of(&stored)).await.expect("marked");
    // Re-encode the same message with its fields in reverse order, as another client might.
    let data = marked.data.as_mut().expect("data");
    let decoded: proto::demo::v2::Artist =
        prost::Message::decode(data.value.as_slice()).expect("decode");
    let mut reordered = Vec::new();
    prost::encoding::btree_map::encode(
        prost::encoding::string::encode,
        prost::encoding::string::encoded_len,
        prost::encoding::string::encode,
        prost::encoding::string::encoded_len,
        4,
        &decoded.group_members,
        &mut reordered,
    );
    prost::encoding::int32::encode(3, &decoded.genre, &mut reordered);
    prost::encoding::string::encode(1, &decoded.name, &mut reordered);
    assert_ne!(reordered, data.value, "a different encoding");
    data.value = reordered;
    resource::remove_finalizer(&mut marked, "a.example/one");
    h.write(marked)
        .await
        .expect("equal data in another encoding is not a change");
}
