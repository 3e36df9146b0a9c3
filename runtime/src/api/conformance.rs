//! What every [`Api`] must do, as a suite: the server's `InProcess` (server's controller
//! tests) and `proto::client::Client` over a real cluster (the tests crate) both run it, so
//! a controller sees the same answers — and the same [`ApiError`] for the same refusal — in
//! process and over gRPC. Behind the `conformance` feature.

use std::time::Duration;

use futures::StreamExt;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{
    Condition, Id, Resource, State, Status, Tenancy, Type, WatchEvent, WatchListRequest,
};

use super::{Api, ApiError};

/// A built-in type no built-in controller writes: the suite's own events are all there is.
fn lease_type() -> Type {
    Type {
        group: "coordination".into(),
        group_version: "v1".into(),
        kind: "Lease".into(),
    }
}

fn id(name: &str, namespace: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(lease_type()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: namespace.into(),
        }),
    }
}

fn lease(name: &str) -> Resource {
    Resource {
        id: Some(id(name, "default")),
        data: Some(proto::to_any(&proto::coordination::v1::Lease {
            holder: "conformance".into(),
            duration_seconds: 15,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The next event of a watch within ten seconds.
async fn next(events: &mut super::EventStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("an event within 10s")
        .expect("the watch goes on")
        .expect("an event, not an error")
}

/// Runs the suite against `api`, which talks to one server (its watch and its reads come from
/// the same server, so a read after the watch sent a change sees it), with names starting
/// `prefix` (unique per run: the suite
/// creates and deletes its own `coordination.v1.Lease`s in `default/default`).
pub async fn run<A: Api>(api: &A, prefix: &str) {
    let name = |suffix: &str| format!("{prefix}-{suffix}");

    // Reads of what does not exist are `None`, in a namespace that does not exist too.
    assert_eq!(api.read(&id(&name("missing"), "default")).await, Ok(None));
    assert_eq!(
        api.read(&id(&name("missing"), "no-such-namespace")).await,
        Ok(None),
        "a read in a missing namespace"
    );

    // A watch: the snapshot, its end, then changes as they happen.
    let mut events = api
        .watch(WatchListRequest {
            r#type: Some(lease_type()),
            tenancy: Some(Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            }),
            name_prefix: prefix.into(),
            since_version: String::new(),
            ..WatchListRequest::default()
        })
        .await
        .expect("watch");
    assert!(matches!(
        next(&mut events).await.event,
        Some(Event::EndOfSnapshot(_))
    ));

    // Create, then compare-and-swap.
    let created = api.write(lease(&name("miles"))).await.expect("create");
    assert!(!created.version.is_empty());
    let uid = created
        .id
        .as_ref()
        .map(|id| id.uid.clone())
        .unwrap_or_default();
    assert!(!uid.is_empty(), "the server gives the uid");
    match next(&mut events).await.event {
        Some(Event::Upsert(upsert)) => assert_eq!(upsert.resource, Some(created.clone())),
        other => panic!("expected the create's upsert, got {other:?}"),
    }
    let updated = api.write(created.clone()).await.expect("update");
    upserted(&mut events, &updated.version).await;
    let stale = api.write(created.clone()).await;
    assert!(
        matches!(stale, Err(ApiError::Conflict(_))),
        "a write at a stale version: {stale:?}"
    );
    // A create carrying a uid of its own over an existing resource (how a lease is created).
    let mut other_uid = lease(&name("miles"));
    if let Some(id) = other_uid.id.as_mut() {
        id.uid = "01ARZ3NDEKTSV4RRFFQ69G5FAV".into();
    }
    let refused = api.write(other_uid).await;
    assert!(
        matches!(refused, Err(ApiError::Conflict(_))),
        "a create over another uid: {refused:?}"
    );

    // Statuses, lists.
    let status = Status {
        observed_generation: updated.generation.clone(),
        conditions: vec![Condition {
            r#type: "Accepted".into(),
            state: State::True as i32,
            reason: "Conformance".into(),
            message: "the suite wrote it".into(),
            resource: None,
        }],
        updated_at: None,
    };
    let with_status = api
        .write_status(
            updated.id.as_ref().expect("id"),
            "",
            "conformance.resd.io/suite",
            status,
        )
        .await
        .expect("write status");
    assert!(with_status.status.contains_key("conformance.resd.io/suite"));
    // Once the watch (on the same server) sent a change, that server has applied it: what
    // follows reads it there, however eventual reads are.
    upserted(&mut events, &with_status.version).await;
    let listed = api
        .list(&lease_type(), &Tenancy::default())
        .await
        .expect("list");
    assert!(
        listed
            .iter()
            .any(|r| r.id.as_ref().is_some_and(|id| id.uid == uid)),
        "the list holds it: {listed:?}"
    );
    assert_eq!(
        api.list_by_owner(with_status.id.as_ref().expect("id"))
            .await
            .expect("owned"),
        Vec::new()
    );

    // Bad input is refused, and said.
    let invalid = api.write(lease("Not A Name")).await;
    assert!(
        matches!(invalid, Err(ApiError::Failed(ref message)) if message.contains("name")),
        "an invalid name: {invalid:?}"
    );

    // Deletes: compare-and-swap, then whatever is stored; a delete of nothing is fine.
    let stale_delete = api
        .delete(created.id.as_ref().expect("id"), &created.version)
        .await;
    assert!(
        matches!(stale_delete, Err(ApiError::Conflict(_))),
        "a delete at a stale version: {stale_delete:?}"
    );
    api.delete(&id(&name("miles"), "default"), "")
        .await
        .expect("delete");
    match next(&mut events).await.event {
        Some(Event::Delete(_)) => {}
        other => panic!("expected the delete, got {other:?}"),
    }
    assert_eq!(
        api.read(&id(&name("miles"), "default")).await,
        Ok(None),
        "gone once deleted"
    );
    api.delete(&id(&name("miles"), "default"), "")
        .await
        .expect("a delete of nothing");

    // Fenced (DESIGN §16): writes under the lease as it is land; with no lease in the cell
    // nothing is sent; a stale fence is refused `Fenced` by the server and empties the cell.
    api.write(lease(&name("holder"))).await.expect("a lease");
    let fence = proto::fence::FenceCell::default();
    let fenced = api.fenced(fence.clone());
    let refused = fenced.write(lease(&name("unsent"))).await;
    assert!(
        matches!(refused, Err(ApiError::Fenced(_))),
        "no lease held: {refused:?}"
    );
    let at = |transitions: u64| proto::fence::LeaseFence {
        partition: "default".into(),
        namespace: "default".into(),
        name: name("holder"),
        transitions,
    };
    fence.set(Some(at(0)));
    fenced
        .write(lease(&name("fenced")))
        .await
        .expect("a write under the lease as it is");
    fence.set(Some(at(7)));
    let stale = fenced.delete(&id(&name("fenced"), "default"), "").await;
    assert!(
        matches!(stale, Err(ApiError::Fenced(_))),
        "a stale fence: {stale:?}"
    );
    assert_eq!(fence.get(), None, "a refusal empties the cell");
    assert!(
        api.read(&id(&name("fenced"), "default"))
            .await
            .expect("read")
            .is_some(),
        "nothing deleted under the stale fence"
    );
    assert_eq!(
        api.read(&id(&name("unsent"), "default")).await,
        Ok(None),
        "nothing written without a lease"
    );
    for cleanup in [name("fenced"), name("holder")] {
        api.delete(&id(&cleanup, "default"), "")
            .await
            .expect("cleanup");
    }
}

/// Waits for the watch's upsert of `version`.
async fn upserted(events: &mut super::EventStream, version: &str) {
    match next(events).await.event {
        Some(Event::Upsert(upsert)) => assert_eq!(
            upsert.resource.map(|r| r.version).as_deref(),
            Some(version),
            "the upsert of the last write"
        ),
        other => panic!("expected an upsert, got {other:?}"),
    }
}
