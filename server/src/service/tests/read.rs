//! Read, List and ListByOwner.

use tonic::Code;

use super::*;

#[tokio::test]
async fn read_returns_the_stored_resource() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut by_name = id_of(&stored);
    by_name.uid.clear();
    assert_eq!(h.read(&by_name).await.expect("read by name"), stored);
    assert_eq!(h.read(&id_of(&stored)).await.expect("read by uid"), stored);
}

#[tokio::test]
async fn read_applies_tenancy_defaults() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let read = h
        .read(&id("demo.v2.Artist", default_ns(), "miles"))
        .await
        .expect("read with empty tenancy");
    assert_eq!(read, stored);
}

#[tokio::test]
async fn read_of_a_missing_resource_is_not_found() {
    let h = harness().await;
    let message = expect_error(
        h.read(&id("demo.v2.Artist", default_ns(), "nobody")).await,
        Code::NotFound,
        "resource not found",
    );
    assert!(
        message.contains("demo.v2.Artist/default/default/nobody"),
        "{message}"
    );
}

#[tokio::test]
async fn read_with_a_stale_uid_is_not_found() {
    let h = harness().await;
    let stored = h.write(artist("miles")).await.expect("create");
    let mut stale = id_of(&stored);
    stale.uid = ulid::Ulid::new().to_string();
    expect_error(h.read(&stale).await, Code::NotFound, "resource not found");
}

#[tokio::test]
async fn read_with_another_group_version_is_invalid() {
    let h = harness().await;
    h.write(artist("miles")).await.expect("create v2");
    expect_error(
        h.read(&id("demo.v1.Artist", default_ns(), "miles")).await,
        Code::InvalidArgument,
        "resource was requested with GroupVersion \"v1\", but stored with GroupVersion \"v2\"",
    );
}

#[tokio::test]
async fn read_in_a_missing_namespace_is_not_found_with_the_tenancy_message() {
    let h = harness().await;
    expect_error(
        h.read(&id(
            "demo.v2.Artist",
            tenancy("default", "nowhere"),
            "miles",
        ))
        .await,
        Code::NotFound,
        "namespace not found",
    );
    expect_error(
        h.read(&id(
            "demo.v2.Artist",
            tenancy("nowhere", "default"),
            "miles",
        ))
        .await,
        Code::NotFound,
        "partition not found",
    );
}

#[tokio::test]
async fn read_with_a_wildcard_tenancy_is_invalid() {
    let h = harness().await;
    expect_error(
        h.read(&id("demo.v2.Artist", tenancy("*", "default"), "miles"))
            .await,
        Code::InvalidArgument,
        "id.tenancy.partition cannot be the wildcard",
    );
}

#[tokio::test]
async fn read_without_an_id_is_invalid() {
    let h = harness().await;
    let result = h
        .service
        .read(
            &AllowAll,
            Consistency::Eventual,
            ReadRequest {
                id: None,
                ..Default::default()
            },
        )
        .await;
    expect_error(result, Code::InvalidArgument, "id is required");
}

#[tokio::test]
async fn read_of_an_unregistered_type_is_invalid() {
    let h = harness().await;
    expect_error(
        h.read(&id("demo.v3.Artist", default_ns(), "miles")).await,
        Code::InvalidArgument,
        "id.type demo.v3.Artist is not registered",
    );
}

#[tokio::test]
async fn list_filters_by_group_version() {
    let h = harness().await;
    h.write(artist("new")).await.expect("v2");
    h.write(v1_artist("old")).await.expect("v1");
    let v2 = h
        .list("demo.v2.Artist", default_ns(), "")
        .await
        .expect("list v2");
    assert_eq!(names(&v2), ["new"]);
    let v1 = h
        .list("demo.v1.Artist", default_ns(), "")
        .await
        .expect("list v1");
    assert_eq!(names(&v1), ["old"]);
}

#[tokio::test]
async fn list_with_wildcards_finds_across_namespaces() {
    let h = harness().await;
    h.write(Resource {
        id: Some(id("tenancy.v1.Namespace", tenancy("default", ""), "jazz")),
        ..Default::default()
    })
    .await
    .expect("namespace");
    h.write(artist("miles")).await.expect("default ns");
    let mut elsewhere = artist("coltrane");
    elsewhere.id.as_mut().expect("id").tenancy = Some(tenancy("default", "jazz"));
    h.write(elsewhere).await.expect("jazz ns");

    let all = h
        .list("demo.v2.Artist", tenancy("*", "*"), "")
        .await
        .expect("all");
    assert_eq!(names(&all), ["coltrane", "miles"]);
    let jazz = h
        .list("demo.v2.Artist", tenancy("default", "jazz"), "")
        .await
        .expect("jazz");
    assert_eq!(names(&jazz), ["coltrane"]);
    let defaults = h
        .list("demo.v2.Artist", default_ns(), "")
        .await
        .expect("defaults");
    assert_eq!(names(&defaults), ["miles"]);
}

#[tokio::test]
async fn list_of_a_partition_scoped_type_accepts_a_namespace_wildcard() {
    let h = harness().await;
    h.write(Resource {
        id: Some(id("demo.v1.RecordLabel", default_ns(), "blue-note")),
        ..Default::default()
    })
    .await
    .expect("label");
    let labels = h
        .list("demo.v1.RecordLabel", tenancy("*", "*"), "")
        .await
        .expect("list");
    assert_eq!(names(&labels), ["blue-note"]);
    expect_error(
        h.list("demo.v1.RecordLabel", tenancy("default", "default"), "")
            .await,
        Code::InvalidArgument,
        "partition scoped resource demo.v1.RecordLabel cannot have a namespace",
    );
}

#[tokio::test]
async fn list_in_a_missing_namespace_finds_nothing() {
    let h = harness().await;
    let listed = h
        .list("demo.v2.Artist", tenancy("default", "nowhere"), "")
        .await
        .expect("no tenancy check");
    assert!(listed.is_empty());
}

#[tokio::test]
async fn list_filters_by_name_prefix() {
    let h = harness().await;
    for name in ["miles", "mingus", "monk"] {
        h.write(artist(name)).await.expect("create");
    }
    let listed = h
        .list("demo.v2.Artist", default_ns(), "mi")
        .await
        .expect("list");
    assert_eq!(names(&listed), ["miles", "mingus"]);
}

#[tokio::test]
async fn list_without_type_or_tenancy_is_invalid() {
    let h = harness().await;
    let result = h
        .service
        .list(&AllowAll, Consistency::Eventual, ListRequest::default())
        .await;
    let message = expect_error(result, Code::InvalidArgument, "type is required");
    assert!(message.contains("tenancy is required"), "{message}");
}

#[tokio::test]
async fn list_by_owner_requires_the_owner_uid() {
    let h = harness().await;
    expect_error(
        h.list_by_owner(&id("demo.v2.Artist", default_ns(), "miles"))
            .await,
        Code::InvalidArgument,
        "owner uid is required",
    );
}

#[tokio::test]
async fn list_by_owner_returns_the_children_of_that_incarnation_only() {
    let h = harness().await;
    let first = h.write(artist("miles")).await.expect("owner");
    let mut child = album("kind-of-blue");
    child.owner = Some(id_of(&first));
    h.write(child).await.expect("child");
    h.delete(&id_of(&first), "").await.expect("delete owner");
    let second = h.write(artist("miles")).await.expect("recreated owner");
    assert_ne!(id_of(&second).uid, id_of(&first).uid);

    let of_first = h.list_by_owner(&id_of(&first)).await.expect("list");
    assert_eq!(
        names(&of_first),
        ["kind-of-blue"],
        "children outlive the owner until reaped"
    );
    let of_second = h.list_by_owner(&id_of(&second)).await.expect("list");
    assert!(
        of_second.is_empty(),
        "a recreated owner does not inherit children"
    );
}

#[tokio::test]
async fn list_by_owner_accepts_a_wildcard_owner_tenancy() {
    let h = harness().await;
    let owner = h.write(artist("miles")).await.expect("owner");
    let mut child = album("kind-of-blue");
    child.owner = Some(id_of(&owner));
    h.write(child).await.expect("child");
    let mut pattern = id_of(&owner);
    pattern.tenancy = Some(tenancy("*", "*"));
    assert_eq!(
        names(&h.list_by_owner(&pattern).await.expect("list")),
        ["kind-of-blue"]
    );
}

#[tokio::test]
async fn tenancy_checks_are_remembered_until_a_partition_or_namespace_changes() {
    let backend = Arc::new(LosingBackend::new());
    let h = harness_with(backend.clone()).await;
    let namespace = h
        .write(Resource {
            id: Some(id("tenancy.v1.Namespace", tenancy("default", ""), "jazz")),
            ..Default::default()
        })
        .await
        .expect("namespace");
    let mut miles = artist("miles");
    miles.id.as_mut().expect("id").tenancy = Some(tenancy("default", "jazz"));
    let miles = h.write(miles).await.expect("artist");
    let reads = |b: &LosingBackend| b.tenancy_reads.load(Ordering::SeqCst);

    // The write read the partition and the namespace; reads after it need neither again.
    let before = reads(&backend);
    for _ in 0..3 {
        h.read(&id_of(&miles)).await.expect("read");
    }
    assert_eq!(
        reads(&backend),
        before,
        "answered from what the write found"
    );

    // Another resource's change keeps them; a namespace's change does not.
    h.write(artist("coltrane")).await.expect("elsewhere");
    let before = reads(&backend);
    h.read(&id_of(&miles)).await.expect("read");
    assert_eq!(
        reads(&backend),
        before,
        "a change in another group keeps them"
    );
    h.delete(&id_of(&namespace), "")
        .await
        .expect("namespace gone");
    expect_error(
        h.read(&id_of(&miles)).await,
        Code::NotFound,
        "namespace not found",
    );
    let mut late = artist("late");
    late.id.as_mut().expect("id").tenancy = Some(tenancy("default", "jazz"));
    expect_error(
        h.write(late).await,
        Code::InvalidArgument,
        "namespace not found",
    );
    assert!(reads(&backend) > before, "read again after the change");
}
