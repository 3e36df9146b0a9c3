//! The storage conformance suite: the behaviour every [`Backend`] must have, after Consul's
//! `internal/storage/conformance`. Run it against a backend with [`conformance_tests!`]:
//!
//! ```ignore
//! server::conformance_tests!(|| async { InMemBackend::new() });
//! ```
//!
//! Assertions that follow a write go through [`eventually`], so the suite also runs against a
//! Raft follower whose eventual reads lag the leader; on a backend without lag the first attempt
//! passes.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use proto::resource::v1::{Id, Resource, Tenancy, Type};

use super::{Backend, Consistency, Operation, StorageError, UnversionedType, Watch, WatchEvent};
use crate::resource;

/// Expands to one `#[tokio::test]` per conformance case, each on a fresh backend built by the
/// given closure (returning a future of the backend).
///
/// `conformance_tests!(registered: make)` runs the same cases with the resources of a type
/// registered at runtime (`payments.*.Invoice` and `Receipt`, DESIGN §15) in place of the demo
/// types: storage must not care which.
#[macro_export]
macro_rules! conformance_tests {
    (registered: $make:expr) => {
        $crate::conformance_tests!(@all $make, $crate::storage::conformance::Fixture::registered());
    };
    ($make:expr) => {
        $crate::conformance_tests!(@all $make, $crate::storage::conformance::Fixture::default());
    };
    (@all $make:expr, $fixture:expr) => {
        $crate::conformance_tests!(@cases $make, $fixture;
            read_returns_the_stored_resource,
            read_of_a_missing_resource_is_not_found,
            read_with_another_uid_is_not_found,
            read_with_another_group_version_carries_the_stored_resource,
            create_with_a_version_is_a_cas_failure,
            update_with_a_stale_version_is_a_cas_failure,
            update_with_the_current_version_stores_a_new_version,
            a_merged_write_lands_over_a_later_version_until_a_status_changes,
            write_over_another_uid_is_wrong_uid_even_with_the_right_version,
            write_with_another_group_version_replaces_the_stored_object,
            delete_with_a_stale_version_is_a_cas_failure,
            delete_with_the_current_version_removes_the_resource,
            delete_of_a_missing_resource_succeeds,
            delete_with_another_uid_deletes_nothing,
            list_honours_every_wildcard_combination,
            list_filters_by_name_prefix,
            list_returns_every_group_version,
            list_by_owner_is_anchored_on_the_owner_uid,
            list_by_owner_outlives_the_owner,
            watch_sends_a_snapshot_then_end_of_snapshot,
            watch_follows_upserts_and_deletes_in_order,
            watch_ignores_resources_outside_its_query,
            watch_event_versions_are_readable_afterwards,
            watch_resumes_after_a_version_without_gap_or_duplicate,
            watch_resume_from_a_future_version_is_refused,
            quotas_are_kept_and_enforced_by_the_store,
            a_change_fenced_by_a_lease_lands_only_while_the_lease_has_not_changed_hands,
            history_keeps_every_version_with_its_actor,
            history_keeps_the_types_retention,
            history_is_bounded_per_node_and_by_age,
        );
    };
    (@cases $make:expr, $fixture:expr; $($case:ident),* $(,)?) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test]
                async fn $case() {
                    let make = $make;
                    let backend = make().await;
                    $crate::storage::conformance::FIXTURE
                        .scope($fixture, $crate::storage::conformance::$case(&backend))
                        .await;
                }
            )*
        }
    };
}

/// How long [`eventually`] keeps trying.
const EVENTUALLY_ATTEMPTS: usize = 100;
const EVENTUALLY_PAUSE: Duration = Duration::from_millis(20);
/// How long a watch assertion waits for one event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Retries a check until it returns `Ok`, at most `EVENTUALLY_ATTEMPTS` times, and returns
/// its value; panics with the last failure.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let mut last = String::new();
    for _ in 0..EVENTUALLY_ATTEMPTS {
        match check().await {
            Ok(value) => return value,
            Err(failure) => last = failure,
        }
        tokio::time::sleep(EVENTUALLY_PAUSE).await;
    }
    panic!("{what}: still failing after {EVENTUALLY_ATTEMPTS} attempts: {last}");
}

tokio::task_local! {
    /// The fixture a case builds its resources with ([`conformance_tests!`] sets it).
    pub static FIXTURE: Fixture;
}

/// Builds ids and resources for the cases: of the demo types, or of a registered type.
#[derive(Debug, Clone)]
pub(crate) struct Fixture {
    group: String,
    /// The kinds the cases call `Artist` and `Album`.
    primary: String,
    secondary: String,
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture {
            group: "demo".into(),
            primary: "Artist".into(),
            secondary: "Album".into(),
        }
    }
}

impl Fixture {
    /// The fixture of the running case (the demo types outside one).
    pub(crate) fn new() -> Self {
        FIXTURE.try_with(Clone::clone).unwrap_or_default()
    }

    /// Resources of a type registered at runtime instead of the demo types.
    pub(crate) fn registered() -> Self {
        Fixture {
            group: "payments".into(),
            primary: "Invoice".into(),
            secondary: "Receipt".into(),
        }
    }

    fn kind(&self, kind: &str) -> String {
        match kind {
            "Artist" => self.primary.clone(),
            "Album" => self.secondary.clone(),
            other => other.to_owned(),
        }
    }

    pub(crate) fn artist_type(&self) -> UnversionedType {
        UnversionedType {
            group: self.group.clone(),
            kind: self.primary.clone(),
        }
    }

    pub(crate) fn wildcard(&self) -> Tenancy {
        tenancy(resource::WILDCARD, resource::WILDCARD)
    }

    /// A new `demo.v2.Artist` in `default/default`, with a fresh uid.
    pub(crate) fn artist(&self, name: &str) -> Resource {
        self.resource("v2", "Artist", tenancy("default", "default"), name)
    }

    pub(crate) fn resource(
        &self,
        group_version: &str,
        kind: &str,
        tenancy: Tenancy,
        name: &str,
    ) -> Resource {
        Resource {
            id: Some(Id {
                uid: ulid::Ulid::new().to_string(),
                name: name.into(),
                r#type: Some(Type {
                    group: self.group.clone(),
                    group_version: group_version.into(),
                    kind: self.kind(kind),
                }),
                tenancy: Some(tenancy),
            }),
            generation: ulid::Ulid::new().to_string(),
            ..Default::default()
        }
    }
}

pub(crate) fn tenancy(partition: &str, namespace: &str) -> Tenancy {
    Tenancy {
        partition: partition.into(),
        namespace: namespace.into(),
    }
}

fn id_of(resource: &Resource) -> Id {
    resource.id.clone().unwrap_or_default()
}

fn names(resources: &[Resource]) -> Vec<String> {
    let mut names: Vec<String> = resources.iter().map(|r| id_of(r).name).collect();
    names.sort();
    names
}

async fn next_event(watch: &mut Watch) -> WatchEvent {
    match tokio::time::timeout(EVENT_TIMEOUT, watch.next()).await {
        Ok(Some(Ok(event))) => event.into_event(),
        Ok(Some(Err(error))) => panic!("watch failed: {error}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch event within {EVENT_TIMEOUT:?}"),
    }
}

async fn expect_read<B: Backend>(backend: &B, id: &Id, want_version: &str) -> Resource {
    eventually("read after write", || async {
        match backend.read(Consistency::Eventual, id).await {
            Ok(resource) if resource.version == want_version => Ok(resource),
            Ok(resource) => Err(format!("version {} != {want_version}", resource.version)),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

/// `read_encoded` answers what `read` answers: the same resource's encoding, or the same error.
async fn expect_encoded_read_agrees<B: Backend>(backend: &B, id: &Id) {
    let read = backend.read(Consistency::Strong, id).await;
    let encoded = backend.read_encoded(Consistency::Strong, id).await;
    match (read, encoded) {
        (Ok(resource), Ok(bytes)) => assert_eq!(
            <Resource as prost::Message>::decode(bytes.as_slice()).expect("decodes"),
            resource
        ),
        (Err(StorageError::NotFound), Err(StorageError::NotFound)) => {}
        (
            Err(StorageError::GroupVersionMismatch { stored: read }),
            Err(StorageError::GroupVersionMismatch { stored: encoded }),
        ) => assert_eq!(read, encoded),
        (read, encoded) => panic!("read gave {read:?}, read_encoded {encoded:?}"),
    }
}

async fn expect_not_found<B: Backend>(backend: &B, id: &Id) {
    eventually("read after delete", || async {
        match backend.read(Consistency::Eventual, id).await {
            Err(StorageError::NotFound) => Ok(()),
            other => Err(format!("expected NotFound, got {other:?}")),
        }
    })
    .await;
}

async fn expect_list<B: Backend>(
    backend: &B,
    resource_type: &UnversionedType,
    tenancy: &Tenancy,
    prefix: &str,
    want: &[&str],
) {
    let mut want: Vec<String> = want.iter().map(|name| name.to_string()).collect();
    want.sort();
    eventually("list", || async {
        let listed = backend
            .list(Consistency::Eventual, resource_type, tenancy, prefix)
            .await
            .map_err(|error| error.to_string())?;
        let got = names(&listed);
        // The encoded list is the same resources, in the same order.
        let mut taken: Vec<Vec<u8>> = Vec::new();
        backend
            .list_encoded(Consistency::Eventual, resource_type, tenancy, prefix, None, &mut taken)
            .await
            .map_err(|error| error.to_string())?;
        // A sink that breaks after the first resource gets only that one.
        let mut first = FirstOnly(Vec::new());
        backend
            .list_encoded(Consistency::Eventual, resource_type, tenancy, prefix, None, &mut first)
            .await
            .map_err(|error| error.to_string())?;
        if first.0 != taken.iter().take(1).cloned().collect::<Vec<_>>() {
            return Err(format!(
                "list_encoded {tenancy:?} {prefix:?}: a sink that breaks after one resource got {} of {}",
                first.0.len(),
                taken.len()
            ));
        }
        let encoded = taken
            .iter()
            .map(|bytes| <Resource as prost::Message>::decode(bytes.as_slice()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| format!("list_encoded gave bytes that do not decode: {error}"))?;
        if encoded != listed {
            return Err(format!(
                "list_encoded {tenancy:?} {prefix:?}: got {:?}, list gave {got:?}",
                names(&encoded)
            ));
        }
        // Resumed after each key (a paged listing), exactly what follows it, in order.
        for (at, resource) in listed.iter().enumerate() {
            let after = crate::storage::StorageKey::of(resource.id.as_ref().expect("id"));
            let mut rest: Vec<Vec<u8>> = Vec::new();
            backend
                .list_encoded(
                    Consistency::Eventual,
                    resource_type,
                    tenancy,
                    prefix,
                    Some(&after),
                    &mut rest,
                )
                .await
                .map_err(|error| error.to_string())?;
            if rest[..] != taken[at + 1..] {
                return Err(format!(
                    "list_encoded {tenancy:?} {prefix:?} after {after:?}: {} resources, want the {} after it",
                    rest.len(),
                    taken.len() - at - 1
                ));
            }
        }
        if got == want {
            Ok(())
        } else {
            Err(format!(
                "list {tenancy:?} {prefix:?}: got {got:?}, want {want:?}"
            ))
        }
    })
    .await;
}

/// Keeps the first encoding it is given, then stops the listing.
struct FirstOnly(Vec<Vec<u8>>);

impl crate::storage::EncodedSink for FirstOnly {
    fn take(&mut self, encoded: &[u8]) -> std::ops::ControlFlow<()> {
        self.0.push(encoded.to_vec());
        std::ops::ControlFlow::Break(())
    }
}

pub(crate) async fn read_returns_the_stored_resource<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let mut artist = fixture.artist("miles");
    artist.metadata.insert("genre".into(), "jazz".into());
    let stored = backend.write_cas(artist.clone()).await.expect("create");
    assert!(!stored.version.is_empty(), "the stored copy has a version");
    let read = expect_read(backend, &id_of(&artist), &stored.version).await;
    assert_eq!(read, stored);
    assert_eq!(read.metadata["genre"], "jazz");

    let mut without_uid = id_of(&artist);
    without_uid.uid.clear();
    let read = backend
        .read(Consistency::Strong, &without_uid)
        .await
        .expect("empty uid reads whatever is stored");
    assert_eq!(read, stored);
    expect_encoded_read_agrees(backend, &id_of(&artist)).await;
    expect_encoded_read_agrees(backend, &without_uid).await;
}

pub(crate) async fn read_of_a_missing_resource_is_not_found<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let error = backend
        .read(Consistency::Strong, &id_of(&fixture.artist("nobody")))
        .await
        .expect_err("missing");
    assert!(matches!(error, StorageError::NotFound), "{error:?}");
    expect_encoded_read_agrees(backend, &id_of(&fixture.artist("nobody"))).await;
}

pub(crate) async fn read_with_another_uid_is_not_found<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let artist = fixture.artist("miles");
    let stored = backend.write_cas(artist.clone()).await.expect("create");
    expect_read(backend, &id_of(&artist), &stored.version).await;
    let mut other = id_of(&artist);
    other.uid = ulid::Ulid::new().to_string();
    let error = backend
        .read(Consistency::Strong, &other)
        .await
        .expect_err("other uid");
    assert!(matches!(error, StorageError::NotFound), "{error:?}");
    expect_encoded_read_agrees(backend, &other).await;
}

pub(crate) async fn read_with_another_group_version_carries_the_stored_resource<B: Backend>(
    backend: &B,
) {
    let fixture = Fixture::new();
    let artist = fixture.artist("miles");
    let stored = backend.write_cas(artist.clone()).await.expect("create");
    expect_read(backend, &id_of(&artist), &stored.version).await;
    let mut v1 = id_of(&artist);
    if let Some(resource_type) = v1.r#type.as_mut() {
        resource_type.group_version = "v1".into();
    }
    match backend.read(Consistency::Strong, &v1).await {
        Err(StorageError::GroupVersionMismatch { stored: mismatched }) => {
            assert_eq!(*mismatched, stored)
        }
        other => panic!("expected GroupVersionMismatch, got {other:?}"),
    }
    expect_encoded_read_agrees(backend, &v1).await;
}

pub(crate) async fn create_with_a_version_is_a_cas_failure<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let mut artist = fixture.artist("miles");
    artist.version = "12345".into();
    let error = backend
        .write_cas(artist.clone())
        .await
        .expect_err("create with version");
    assert!(matches!(error, StorageError::CasFailure), "{error:?}");
    let error = backend
        .read(Consistency::Strong, &id_of(&artist))
        .await
        .expect_err("nothing stored");
    assert!(matches!(error, StorageError::NotFound), "{error:?}");
}

pub(crate) async fn update_with_a_stale_version_is_a_cas_failure<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let artist = fixture.artist("miles");
    let first = backend.write_cas(artist.clone()).await.expect("create");
    let second = backend.write_cas(first.clone()).await.expect("update");
    let error = backend.write_cas(first.clone()).await.expect_err("stale");
    assert!(matches!(error, StorageError::CasFailure), "{error:?}");
    let mut blind = second.clone();
    blind.version.clear();
    let error = backend
        .write_cas(blind)
        .await
        .expect_err("empty version on an existing resource");
    assert!(matches!(error, StorageError::CasFailure), "{error:?}");
    expect_read(backend, &id_of(&artist), &second.version).await;
}

pub(crate) async fn update_with_the_current_version_stores_a_new_version<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let artist = fixture.artist("miles");
    let first = backend.write_cas(artist).await.expect("create");
    let mut update = first.clone();
    update.metadata.insert("k".into(), "v".into());
    let second = backend.write_cas(update).await.expect("update");
    assert_ne!(
        second.version, first.version,
        "every write gets a new version"
    );
    assert_eq!(second.metadata["k"], "v");
    let read = expect_read(backend, &id_of(&first), &second.version).await;
    assert_eq!(read, second);
}

pub(crate) async fn a_merged_write_lands_over_a_later_version_until_a_status_changes<B: Backend>(
    backend: &B,
) {
    let fixture = Fixture::new();
    let first = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    // Two blind writes merged from `first`: the one that lands second still lands.
    let mut one = first.clone();
    one.metadata.insert("writer".into(), "one".into());
    let mut two = first.clone();
    two.metadata.insert("writer".into(), "two".into());
    let one = backend
        .write_merged_as(one, "", &Default::default())
        .await
        .expect("first merge");
    let two = backend
        .write_merged_as(two, "", &Default::default())
        .await
        .expect("second merge over the first one's version");
    assert_ne!(two.version, one.version);
    assert_eq!(two.metadata["writer"], "two");
    expect_read(backend, &id_of(&first), &two.version).await;
    // A compare-and-swap from `first` does not land over them.
    let error = backend
        .write_cas(first.clone())
        .await
        .expect_err("stale CAS");
    assert!(matches!(error, StorageError::CasFailure), "{error:?}");
    // A status written since: the merge would drop it, so it does not land.
    let mut with_status = two.clone();
    with_status
        .status
        .insert("reconciled".into(), Default::default());
    let with_status = backend.write_cas(with_status).await.expect("status");
    let error = backend
        .write_merged_as(two.clone(), "", &Default::default())
        .await
        .expect_err("merged from before the status");
    assert!(matches!(error, StorageError::CasFailure), "{error:?}");
    expect_read(backend, &id_of(&first), &with_status.version).await;
}

pub(crate) async fn write_over_another_uid_is_wrong_uid_even_with_the_right_version<B: Backend>(
    backend: &B,
) {
    let fixture = Fixture::new();
    let stored = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    let mut impostor = stored.clone();
    if let Some(id) = impostor.id.as_mut() {
        id.uid = ulid::Ulid::new().to_string();
    }
    let error = backend
        .write_cas(impostor.clone())
        .await
        .expect_err("other uid");
    assert!(matches!(error, StorageError::WrongUid), "{error:?}");
    impostor.version = "999999".into();
    let error = backend
        .write_cas(impostor)
        .await
        .expect_err("other uid, wrong version");
    assert!(
        matches!(error, StorageError::WrongUid),
        "uid is checked first: {error:?}"
    );
}

pub(crate) async fn write_with_another_group_version_replaces_the_stored_object<B: Backend>(
    backend: &B,
) {
    let fixture = Fixture::new();
    let stored = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create v2");
    let mut as_v1 = stored.clone();
    if let Some(resource_type) = as_v1.id.as_mut().and_then(|id| id.r#type.as_mut()) {
        resource_type.group_version = "v1".into();
    }
    let v1 = backend.write_cas(as_v1).await.expect("update as v1");
    let read = expect_read(backend, &id_of(&v1), &v1.version).await;
    assert_eq!(
        read.id.and_then(|id| id.r#type).map(|t| t.group_version),
        Some("v1".into())
    );
}

pub(crate) async fn delete_with_a_stale_version_is_a_cas_failure<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let first = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    let second = backend.write_cas(first.clone()).await.expect("update");
    let error = backend
        .delete_cas(&id_of(&first), &first.version)
        .await
        .expect_err("stale");
    assert!(matches!(error, StorageError::CasFailure), "{error:?}");
    expect_read(backend, &id_of(&first), &second.version).await;
}

pub(crate) async fn delete_with_the_current_version_removes_the_resource<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let stored = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    backend
        .delete_cas(&id_of(&stored), &stored.version)
        .await
        .expect("delete");
    expect_not_found(backend, &id_of(&stored)).await;
}

/// A change sent under a lease (DESIGN §16's fenced writes, [`crate::storage::Guard::Lease`]):
/// stored while the lease exists with the fence's `transitions`; once it changed hands, or
/// where there is no lease, refused `Fenced` (kind `Lease`) with nothing stored — writes and
/// deletes alike.
pub(crate) async fn a_change_fenced_by_a_lease_lands_only_while_the_lease_has_not_changed_hands<
    B: Backend,
>(
    backend: &B,
) {
    use crate::storage::{Fence, FenceKind, Fenced, Guard, StorageKey};
    use proto::coordination::v1::Lease;
    let fixture = Fixture::new();
    let lease_of = |holder: &str, transitions: u64| Lease {
        holder: holder.into(),
        duration_seconds: 15,
        transitions,
        ..Default::default()
    };
    let mut lease = Resource {
        id: Some(Id {
            uid: ulid::Ulid::new().to_string(),
            name: "invoices".into(),
            r#type: Some(Type {
                group: "coordination".into(),
                group_version: "v1".into(),
                kind: "Lease".into(),
            }),
            tenancy: Some(tenancy("default", "team")),
        }),
        data: Some(proto::to_any(&lease_of("replica-a", 3))),
        ..Default::default()
    };
    let stored_lease = backend.write_cas(lease.clone()).await.expect("the lease");
    let fence_at = |transitions: u64, name: &str| Fence {
        guards: vec![Guard::Lease {
            key: StorageKey {
                name: name.into(),
                ..StorageKey::of(&id_of(&stored_lease))
            },
            transitions,
        }],
    };
    let held = fence_at(3, "invoices");
    let miles = backend
        .write_cas_as(fixture.artist("miles"), "replica-a", &held)
        .await
        .expect("a write under the lease as it is lands");
    // Renewed by its holder (same transitions): still the holder's.
    lease.version = stored_lease.version.clone();
    lease.data = Some(proto::to_any(&lease_of("replica-a", 3)));
    let renewed = backend.write_cas(lease.clone()).await.expect("renewed");
    let miles = backend
        .write_cas_as(
            Resource {
                metadata: [("renewed".to_owned(), "yes".to_owned())].into(),
                ..miles
            },
            "replica-a",
            &held,
        )
        .await
        .expect("a renewal does not fence its holder");
    // Taken over.
    lease.version = renewed.version.clone();
    lease.data = Some(proto::to_any(&lease_of("replica-b", 4)));
    backend.write_cas(lease).await.expect("taken over");
    let fenced = |outcome: Result<(), StorageError>, what: &str| match outcome {
        Err(StorageError::Fenced(Fenced {
            kind: FenceKind::Lease,
            why,
            ..
        })) => assert!(why.contains("default/team/"), "{what}: {why}"),
        other => panic!("{what}: expected Fenced(Lease), got {other:?}"),
    };
    fenced(
        backend
            .write_cas_as(fixture.artist("coltrane"), "replica-a", &held)
            .await
            .map(drop),
        "a create by the former holder",
    );
    fenced(
        backend
            .write_cas_as(miles.clone(), "replica-a", &held)
            .await
            .map(drop),
        "an update by the former holder",
    );
    fenced(
        backend
            .delete_cas_as(&id_of(&miles), &miles.version, "replica-a", &held)
            .await,
        "a delete by the former holder",
    );
    fenced(
        backend
            .write_cas_as(fixture.artist("bird"), "replica-a", &fence_at(3, "nobody"))
            .await
            .map(drop),
        "a write under a lease that does not exist",
    );
    // Nothing the former holder sent was stored; the new holder's fence lands.
    let no_uid = |resource: &Resource| Id {
        uid: String::new(),
        ..id_of(resource)
    };
    expect_not_found(backend, &no_uid(&fixture.artist("coltrane"))).await;
    expect_not_found(backend, &no_uid(&fixture.artist("bird"))).await;
    expect_read(backend, &id_of(&miles), &miles.version).await;
    backend
        .delete_cas_as(
            &id_of(&miles),
            &miles.version,
            "replica-b",
            &fence_at(4, "invoices"),
        )
        .await
        .expect("the new holder's delete lands");
    expect_not_found(backend, &id_of(&miles)).await;
}

/// A quota (DESIGN §17) as the store keeps it: `used` counted from what is stored when it is
/// written (a client's value ignored), charged with every create and delete it covers, a raise
/// past a limit refused naming the quota, a delete never; other namespaces are not counted.
pub(crate) async fn quotas_are_kept_and_enforced_by_the_store<B: Backend>(backend: &B) {
    use proto::tenancy::v1::Quota;
    let fixture = Fixture::new();
    let glob = format!("count/{}.*", fixture.group);
    let first = backend
        .write_cas(fixture.artist("before-the-quota"))
        .await
        .expect("an object the quota finds");
    let mut quota = Resource {
        id: Some(Id {
            uid: ulid::Ulid::new().to_string(),
            name: "limits".into(),
            r#type: Some(Type {
                group: "tenancy".into(),
                group_version: "v1".into(),
                kind: "Quota".into(),
            }),
            tenancy: Some(tenancy("default", "default")),
        }),
        generation: ulid::Ulid::new().to_string(),
        ..Default::default()
    };
    quota.data = Some(proto::to_any(&Quota {
        hard: [(glob.clone(), 3)].into(),
        used: [(glob.clone(), 999)].into(),
    }));
    let stored = backend.write_cas(quota).await.expect("the quota");
    let used = |resource: &Resource| -> u64 {
        let data: Quota = prost::Message::decode(
            resource
                .data
                .as_ref()
                .map(|d| d.value.as_slice())
                .unwrap_or_default(),
        )
        .expect("decodes");
        data.used.get(&glob).copied().unwrap_or_default()
    };
    assert_eq!(
        used(&stored),
        1,
        "counted from the store, not from the client"
    );
    let quota_id = id_of(&stored);
    for name in ["second", "third"] {
        backend
            .write_cas(fixture.artist(name))
            .await
            .expect("within the quota");
    }
    let refused = backend
        .write_cas(fixture.artist("fourth"))
        .await
        .expect_err("over the quota");
    match &refused {
        StorageError::QuotaExceeded(exceeded) => {
            assert_eq!(exceeded.quota, "default/default/limits");
            assert_eq!((exceeded.limit, exceeded.used), (3, 3));
        }
        other => panic!("{other:?}"),
    }
    // Another namespace is not counted.
    backend
        .write_cas(fixture.resource("v2", "Artist", tenancy("default", "other"), "elsewhere"))
        .await
        .expect("another namespace");
    // An update that adds nothing passes; a delete always, and frees its place.
    let mut again = first.clone();
    again.metadata.insert("touched".into(), "yes".into());
    let first = backend
        .write_cas(again)
        .await
        .expect("an update counts no object");
    backend
        .delete_cas(&id_of(&first), &first.version)
        .await
        .expect("a delete");
    let now = eventually("the quota's use after the delete", || async {
        let quota = backend
            .read(Consistency::Strong, &quota_id)
            .await
            .map_err(|e| e.to_string())?;
        if used(&quota) == 2 {
            Ok(quota)
        } else {
            Err(format!("used {}", used(&quota)))
        }
    })
    .await;
    assert_eq!(used(&now), 2);
    backend
        .write_cas(fixture.artist("fourth"))
        .await
        .expect("room again");
}

pub(crate) async fn delete_of_a_missing_resource_succeeds<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    backend
        .delete_cas(&id_of(&fixture.artist("nobody")), "1")
        .await
        .expect("deleting nothing is fine");
}

pub(crate) async fn delete_with_another_uid_deletes_nothing<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let stored = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    let mut other = id_of(&stored);
    other.uid = ulid::Ulid::new().to_string();
    backend
        .delete_cas(&other, &stored.version)
        .await
        .expect("a stale uid is a no-op");
    expect_read(backend, &id_of(&stored), &stored.version).await;
}

/// Writes artists named `<partition>-<namespace>-<n>` in four tenancies.
async fn seed_tenancies<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    for (partition, namespace) in [("p1", "n1"), ("p1", "n2"), ("p2", "n1"), ("p2", "n2")] {
        for index in 0..2 {
            let name = format!("{partition}-{namespace}-{index}");
            backend
                .write_cas(fixture.resource("v2", "Artist", tenancy(partition, namespace), &name))
                .await
                .expect("seed");
        }
    }
    // Another kind in the same tenancies must never show up.
    backend
        .write_cas(fixture.resource("v2", "Album", tenancy("p1", "n1"), "p1-n1-album"))
        .await
        .expect("seed album");
}

pub(crate) async fn list_honours_every_wildcard_combination<B: Backend>(backend: &B) {
    seed_tenancies(backend).await;
    let artists = Fixture::new().artist_type();
    let all = [
        "p1-n1-0", "p1-n1-1", "p1-n2-0", "p1-n2-1", "p2-n1-0", "p2-n1-1", "p2-n2-0", "p2-n2-1",
    ];
    expect_list(backend, &artists, &tenancy("*", "*"), "", &all).await;
    expect_list(
        backend,
        &artists,
        &tenancy("p1", "*"),
        "",
        &["p1-n1-0", "p1-n1-1", "p1-n2-0", "p1-n2-1"],
    )
    .await;
    expect_list(
        backend,
        &artists,
        &tenancy("*", "n1"),
        "",
        &["p1-n1-0", "p1-n1-1", "p2-n1-0", "p2-n1-1"],
    )
    .await;
    expect_list(
        backend,
        &artists,
        &tenancy("p2", "n2"),
        "",
        &["p2-n2-0", "p2-n2-1"],
    )
    .await;
    expect_list(backend, &artists, &tenancy("p3", "*"), "", &[]).await;
}

pub(crate) async fn list_filters_by_name_prefix<B: Backend>(backend: &B) {
    seed_tenancies(backend).await;
    let artists = Fixture::new().artist_type();
    expect_list(
        backend,
        &artists,
        &tenancy("*", "*"),
        "p1-n2",
        &["p1-n2-0", "p1-n2-1"],
    )
    .await;
    expect_list(
        backend,
        &artists,
        &tenancy("*", "*"),
        "p2-n1-1",
        &["p2-n1-1"],
    )
    .await;
    expect_list(backend, &artists, &tenancy("p1", "*"), "p2", &[]).await;
}

pub(crate) async fn list_returns_every_group_version<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let default = tenancy("default", "default");
    backend
        .write_cas(fixture.resource("v1", "Artist", default.clone(), "old"))
        .await
        .expect("v1");
    backend
        .write_cas(fixture.resource("v2", "Artist", default.clone(), "new"))
        .await
        .expect("v2");
    expect_list(
        backend,
        &fixture.artist_type(),
        &default,
        "",
        &["new", "old"],
    )
    .await;
}

pub(crate) async fn list_by_owner_is_anchored_on_the_owner_uid<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let owner = backend
        .write_cas(fixture.artist("owner"))
        .await
        .expect("owner");
    let owner_id = id_of(&owner);
    for name in ["album-a", "album-b"] {
        let mut child = fixture.resource("v2", "Album", tenancy("default", "default"), name);
        child.owner = Some(owner_id.clone());
        backend.write_cas(child).await.expect("child");
    }
    // A child of a different incarnation of the owner (same name, other uid).
    let mut stranger = fixture.resource("v2", "Album", tenancy("default", "default"), "album-c");
    let mut old_owner = owner_id.clone();
    old_owner.uid = ulid::Ulid::new().to_string();
    stranger.owner = Some(old_owner.clone());
    backend.write_cas(stranger).await.expect("stranger");

    eventually("list_by_owner", || async {
        let children = backend
            .list_by_owner(&owner_id)
            .await
            .map_err(|e| e.to_string())?;
        let got = names(&children);
        if got == ["album-a", "album-b"] {
            Ok(())
        } else {
            Err(format!("got {got:?}"))
        }
    })
    .await;
    eventually("list_by_owner of the old incarnation", || async {
        let children = backend
            .list_by_owner(&old_owner)
            .await
            .map_err(|e| e.to_string())?;
        if names(&children) == ["album-c"] {
            Ok(())
        } else {
            Err(format!("got {:?}", names(&children)))
        }
    })
    .await;
    let mut unknown = owner_id.clone();
    unknown.uid = ulid::Ulid::new().to_string();
    assert!(
        backend
            .list_by_owner(&unknown)
            .await
            .expect("unknown owner")
            .is_empty()
    );
}

pub(crate) async fn list_by_owner_outlives_the_owner<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let owner = backend
        .write_cas(fixture.artist("owner"))
        .await
        .expect("owner");
    let mut child = fixture.resource("v2", "Album", tenancy("default", "default"), "album");
    child.owner = Some(id_of(&owner));
    backend.write_cas(child).await.expect("child");
    backend
        .delete_cas(&id_of(&owner), &owner.version)
        .await
        .expect("delete owner");
    eventually("children after the owner's deletion", || async {
        let children = backend
            .list_by_owner(&id_of(&owner))
            .await
            .map_err(|e| e.to_string())?;
        if names(&children) == ["album"] {
            Ok(())
        } else {
            Err(format!("got {:?}", names(&children)))
        }
    })
    .await;
}

pub(crate) async fn watch_sends_a_snapshot_then_end_of_snapshot<B: Backend>(backend: &B) {
    seed_tenancies(backend).await;
    let artists = Fixture::new().artist_type();
    // Wait until this node has applied the seed, so the snapshot is complete.
    expect_list(
        backend,
        &artists,
        &tenancy("p1", "*"),
        "",
        &["p1-n1-0", "p1-n1-1", "p1-n2-0", "p1-n2-1"],
    )
    .await;
    let mut watch = backend
        .watch_list(
            &artists,
            &tenancy("p1", "*"),
            "",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    let mut snapshot = Vec::new();
    loop {
        let event = next_event(&mut watch).await;
        match event.operation {
            Operation::Upsert(resource) => {
                assert_eq!(
                    event.version, resource.version,
                    "snapshot events carry the resource's version"
                );
                snapshot.push(resource);
            }
            Operation::EndOfSnapshot => break,
            Operation::Delete(resource) => panic!("delete in a snapshot: {resource:?}"),
            Operation::Bookmark => panic!("storage publishes no bookmark"),
        }
    }
    assert_eq!(
        names(&snapshot),
        ["p1-n1-0", "p1-n1-1", "p1-n2-0", "p1-n2-1"]
    );
}

async fn skip_snapshot(watch: &mut Watch) {
    loop {
        if next_event(watch).await.operation == Operation::EndOfSnapshot {
            return;
        }
    }
}

pub(crate) async fn watch_follows_upserts_and_deletes_in_order<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let mut watch = backend
        .watch_list(
            &fixture.artist_type(),
            &tenancy("default", "default"),
            "",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    skip_snapshot(&mut watch).await;

    let created = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    let updated = backend.write_cas(created.clone()).await.expect("update");
    backend
        .delete_cas(&id_of(&updated), &updated.version)
        .await
        .expect("delete");

    let event = next_event(&mut watch).await;
    assert_eq!(event.operation, Operation::Upsert(created.clone()));
    assert_eq!(event.version, created.version);
    let event = next_event(&mut watch).await;
    assert_eq!(event.operation, Operation::Upsert(updated.clone()));
    let event = next_event(&mut watch).await;
    assert_eq!(
        event.operation,
        Operation::Delete(updated.clone()),
        "a delete carries the last stored resource"
    );
    assert!(!event.version.is_empty());
}

pub(crate) async fn watch_ignores_resources_outside_its_query<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let mut watch = backend
        .watch_list(
            &fixture.artist_type(),
            &tenancy("default", "default"),
            "keep",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    skip_snapshot(&mut watch).await;

    backend
        .write_cas(fixture.artist("other-name"))
        .await
        .expect("other name");
    backend
        .write_cas(fixture.resource(
            "v2",
            "Artist",
            tenancy("default", "elsewhere"),
            "keep-elsewhere",
        ))
        .await
        .expect("other namespace");
    backend
        .write_cas(fixture.resource("v2", "Album", tenancy("default", "default"), "keep-album"))
        .await
        .expect("other kind");
    let kept = backend
        .write_cas(fixture.artist("keep-me"))
        .await
        .expect("matching");

    let event = next_event(&mut watch).await;
    assert_eq!(event.operation, Operation::Upsert(kept));
}

pub(crate) async fn watch_event_versions_are_readable_afterwards<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    let mut watch = backend
        .watch_list(
            &fixture.artist_type(),
            &tenancy("*", "*"),
            "",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    skip_snapshot(&mut watch).await;
    let created = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    let event = next_event(&mut watch).await;
    let Operation::Upsert(seen) = event.operation else {
        panic!("expected an upsert");
    };
    // Published after commit: an immediate read on this node sees it.
    let read = backend
        .read(Consistency::Eventual, &id_of(&created))
        .await
        .expect("read");
    assert_eq!(read.version, seen.version);
}

pub(crate) async fn watch_resumes_after_a_version_without_gap_or_duplicate<B: Backend>(
    backend: &B,
) {
    let fixture = Fixture::new();
    let default = tenancy("default", "default");
    let mut first = backend
        .watch_list(
            &fixture.artist_type(),
            &default,
            "",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    skip_snapshot(&mut first).await;
    let a = backend.write_cas(fixture.artist("a")).await.expect("a");
    let b = backend.write_cas(fixture.artist("b")).await.expect("b");
    let c = backend.write_cas(fixture.artist("c")).await.expect("c");
    let seen_a = next_event(&mut first).await;
    assert_eq!(seen_a.operation, Operation::Upsert(a));
    // Make sure this node has applied c before resuming here.
    for _ in 0..2 {
        next_event(&mut first).await;
    }
    let since: super::Version = seen_a.version.parse().expect("versions parse");
    let mut resumed = backend
        .watch_list(
            &fixture.artist_type(),
            &default,
            "",
            Some(since),
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("resume");
    assert_eq!(
        next_event(&mut resumed).await.operation,
        Operation::Upsert(b)
    );
    assert_eq!(
        next_event(&mut resumed).await.operation,
        Operation::Upsert(c.clone())
    );
    assert_eq!(
        next_event(&mut resumed).await.operation,
        Operation::EndOfSnapshot
    );
    let d = backend.write_cas(fixture.artist("d")).await.expect("d");
    assert_eq!(
        next_event(&mut resumed).await.operation,
        Operation::Upsert(d)
    );
}

pub(crate) async fn watch_resume_from_a_future_version_is_refused<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    match backend
        .watch_list(
            &fixture.artist_type(),
            &fixture.wildcard(),
            "",
            Some(super::Version::new(u64::MAX / 2)),
            crate::storage::WatchOptions::default(),
        )
        .await
    {
        Err(StorageError::ResumeUnavailable(message)) => {
            assert!(message.contains("ahead"), "{message}")
        }
        Err(other) => panic!("expected ResumeUnavailable, got {other:?}"),
        Ok(_) => panic!("expected ResumeUnavailable, got a watch"),
    }
}

/// A policy keeping `retention` for every type, and `node_bytes` in all.
#[derive(Debug)]
struct Keeping {
    retention: resource::Retention,
    node_bytes: u64,
}

impl super::history::HistoryPolicy for Keeping {
    fn retention(&self, _group: &str, _kind: &str) -> resource::Retention {
        self.retention
    }
    fn node_bytes(&self) -> u64 {
        self.node_bytes
    }
}

fn keeping(versions: u32, seconds: u64, bytes: u64, node_bytes: u64) -> std::sync::Arc<Keeping> {
    std::sync::Arc::new(Keeping {
        retention: resource::Retention {
            versions,
            seconds,
            bytes,
        },
        node_bytes,
    })
}

/// The history of `uid` as a strong read finds it, once it holds `count` entries.
async fn history_of<B: Backend>(backend: &B, uid: &str, count: usize) -> super::history::Page {
    eventually("the history holds every change", || async {
        let page = backend
            .history(Consistency::Strong, uid, None, 1000)
            .await
            .map_err(|error| error.to_string())?;
        if page.entries.len() == count {
            Ok(page)
        } else {
            Err(format!("{} entries, not {count}", page.entries.len()))
        }
    })
    .await
}

fn operations(page: &super::history::Page) -> Vec<(String, i32, String)> {
    page.entries
        .iter()
        .map(|entry| (entry.version.clone(), entry.operation, entry.actor.clone()))
        .collect()
}

/// DESIGN §18: every stored version — a write, a status write (same generation), a deletion —
/// with its actor and time, newest first, paged by version; a deleted object's history stays
/// readable by its uid.
pub(crate) async fn history_keeps_every_version_with_its_actor<B: Backend>(backend: &B) {
    use proto::resource::v1::history_entry::Operation as Op;
    let fixture = Fixture::new();
    let fence = super::Fence::default();
    let first = backend
        .write_cas_as(fixture.artist("miles"), "alice", &fence)
        .await
        .expect("create");
    let mut update = first.clone();
    update.metadata.insert("k".into(), "v".into());
    update.generation = ulid::Ulid::new().to_string();
    let second = backend
        .write_cas_as(update, "bob", &fence)
        .await
        .expect("update");
    let mut status = second.clone();
    status.status.insert(
        "demo".into(),
        proto::resource::v1::Status {
            observed_generation: second.generation.clone(),
            ..Default::default()
        },
    );
    let third = backend
        .write_cas_as(status, "controller/demo", &fence)
        .await
        .expect("status");
    backend
        .delete_cas_as(&id_of(&third), &third.version, "carol", &fence)
        .await
        .expect("delete");
    let uid = id_of(&first).uid;
    let page = history_of(backend, &uid, 4).await;
    let seen = operations(&page);
    assert_eq!(
        seen.iter()
            .map(|(_, op, actor)| (*op, actor.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (Op::Delete as i32, "carol"),
            (Op::Status as i32, "controller/demo"),
            (Op::Write as i32, "bob"),
            (Op::Write as i32, "alice"),
        ],
        "newest first, each with its actor and what it did"
    );
    assert_eq!(seen[1].0, third.version);
    assert_eq!(seen[2].0, second.version);
    assert_eq!(seen[3].0, first.version);
    assert_eq!(
        page.entries[2].resource.as_ref(),
        Some(&second),
        "as stored then"
    );
    assert_eq!(
        page.entries[0].resource.as_ref().map(|r| &r.version),
        Some(&third.version),
        "a deletion carries the object as it last was"
    );
    assert!(page.entries.iter().all(|entry| entry.time.is_some()));
    assert_eq!(page.oldest.as_deref(), Some(first.version.as_str()));
    assert!(
        !page.dropped,
        "nothing was dropped: the oldest kept is the first"
    );
    // Paged: the entries older than a version.
    let older = backend
        .history(
            Consistency::Strong,
            &uid,
            Some(second.version.parse().expect("a version")),
            10,
        )
        .await
        .expect("a page");
    assert_eq!(operations(&older), vec![seen[3].clone()]);
    // Another uid has no history here.
    let none = backend
        .history(
            Consistency::Strong,
            &ulid::Ulid::new().to_string(),
            None,
            10,
        )
        .await
        .expect("an empty page");
    assert!(none.entries.is_empty() && none.oldest.is_none());
}

/// DESIGN §18: a history keeps its type's retention — the newest versions stay, the oldest go,
/// and what was dropped is said; a type that keeps none keeps none.
pub(crate) async fn history_keeps_the_types_retention<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    backend.keep_history(keeping(3, 0, 0, 1 << 30));
    let mut stored = backend
        .write_cas(fixture.artist("miles"))
        .await
        .expect("create");
    let mut versions = vec![stored.version.clone()];
    for n in 0..5 {
        let mut next = stored.clone();
        next.metadata.insert("n".into(), n.to_string());
        stored = backend.write_cas(next).await.expect("update");
        versions.push(stored.version.clone());
    }
    let uid = id_of(&stored).uid;
    let page = history_of(backend, &uid, 3).await;
    let kept: Vec<String> = page.entries.iter().map(|e| e.version.clone()).collect();
    assert_eq!(
        kept,
        versions[3..].iter().rev().cloned().collect::<Vec<_>>()
    );
    assert!(page.dropped);
    assert_eq!(page.oldest.as_deref(), Some(versions[3].as_str()));

    // By bytes: only the newest stays when each version is larger than the bound.
    backend.keep_history(keeping(100, 0, 10, 1 << 30));
    let mut next = stored.clone();
    next.metadata.insert("n".into(), "last".into());
    let last = backend.write_cas(next).await.expect("update");
    let page = history_of(backend, &uid, 1).await;
    assert_eq!(
        page.entries[0].version, last.version,
        "the newest always stays"
    );

    // A type keeping none.
    backend.keep_history(keeping(0, 0, 0, 1 << 30));
    let quiet = backend
        .write_cas(fixture.artist("quiet"))
        .await
        .expect("create");
    let none = backend
        .history(Consistency::Strong, &id_of(&quiet).uid, None, 10)
        .await
        .expect("a page");
    assert!(
        none.entries.is_empty(),
        "a type that keeps no history keeps none"
    );
}

/// DESIGN §18: the node's bound on all history together: the versions expiring soonest go,
/// whatever object they are of; and versions past their age go as the store moves on.
pub(crate) async fn history_is_bounded_per_node_and_by_age<B: Backend>(backend: &B) {
    let fixture = Fixture::new();
    // Room for a few versions in all.
    backend.keep_history(keeping(100, 0, 0, 600));
    let mut uids = Vec::new();
    for n in 0..10 {
        let stored = backend
            .write_cas(fixture.artist(&format!("a{n}")))
            .await
            .expect("create");
        uids.push(id_of(&stored).uid);
    }
    let mut kept = 0;
    for uid in &uids {
        kept += backend
            .history(Consistency::Strong, uid, None, 10)
            .await
            .expect("a page")
            .entries
            .len();
    }
    assert!(
        (1..10).contains(&kept),
        "{kept} versions kept of 10 under a node bound that holds a few"
    );
    let last = backend
        .history(Consistency::Strong, &uids[9], None, 10)
        .await
        .expect("a page");
    assert_eq!(
        last.entries.len(),
        1,
        "the newest version is among those kept"
    );

    // By age: one second, then any change sweeps what expired.
    backend.keep_history(keeping(100, 1, 0, 1 << 30));
    let old = backend
        .write_cas(fixture.artist("old"))
        .await
        .expect("create");
    history_of(backend, &id_of(&old).uid, 1).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    backend
        .write_cas(fixture.artist("new"))
        .await
        .expect("create");
    let gone = backend
        .history(Consistency::Strong, &id_of(&old).uid, None, 10)
        .await
        .expect("a page");
    assert!(gone.entries.is_empty(), "a version past its age is dropped");
}
