//! What storage refuses, and the CAS rules both backends share.

use proto::resource::v1::Id;

use super::*;
use crate::storage::conformance::Fixture;

fn artist(name: &str) -> Resource {
    Fixture::new().artist(name)
}

fn refusal(resource: &Resource) -> String {
    match check_storable(resource, 4 << 20) {
        Err(StorageError::Rejected(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_fixture_resource_is_storable() {
    check_storable(&artist("miles"), 4 << 20).expect("storable");
}

#[test]
fn a_600_byte_name_is_refused_naming_the_limit() {
    let mut resource = artist("x");
    if let Some(id) = resource.id.as_mut() {
        id.name = "a".repeat(600);
    }
    let why = refusal(&resource);
    assert!(why.contains("600 characters long"), "{why}");
}

#[test]
fn invalid_names_tenancies_and_uids_are_refused_together() {
    let mut resource = artist("x");
    if let Some(id) = resource.id.as_mut() {
        id.name = "BAD NAME!".into();
        id.uid = "not-a-ulid".into();
        if let Some(tenancy) = id.tenancy.as_mut() {
            tenancy.namespace = "*".into();
        }
    }
    let why = refusal(&resource);
    for expected in ["id.name", "id.uid", "id.tenancy.namespace"] {
        assert!(why.contains(expected), "{expected} missing in {why}");
    }
}

#[test]
fn an_owner_with_a_huge_uid_is_refused() {
    let mut resource = artist("x");
    let mut owner = artist("o").id.expect("id");
    owner.uid = "0".repeat(500);
    resource.owner = Some(owner);
    let why = refusal(&resource);
    assert!(why.contains("owner.uid"), "{why}");
    assert!(why.contains("owner index key"), "{why}");
}

#[test]
fn group_and_kind_lengths_are_bounded() {
    let mut resource = artist("x");
    if let Some(t) = resource.id.as_mut().and_then(|id| id.r#type.as_mut()) {
        t.group = format!("g{}", "a".repeat(300));
    }
    let why = refusal(&resource);
    assert!(why.contains("id.type.group"), "{why}");
}

#[test]
fn oversized_resources_are_refused_with_both_sizes() {
    let resource = artist("x");
    let why = match check_storable(&resource, 10) {
        Err(StorageError::Rejected(why)) => why,
        other => panic!("{other:?}"),
    };
    assert!(why.contains("the limit is 10"), "{why}");
}

#[test]
fn a_resource_without_an_id_is_refused() {
    assert!(matches!(
        check_storable(&Resource::default(), 1 << 20),
        Err(StorageError::Rejected(_))
    ));
    assert!(check_key(&Id::default()).is_err());
}

#[test]
fn cas_checks_compare_uid_before_version() {
    let stored = {
        let mut resource = artist("a");
        resource.version = "5".into();
        resource
    };
    let mut other_uid = stored.clone();
    if let Some(id) = other_uid.id.as_mut() {
        id.uid = "01BX5ZZKBKACTAV9WEVGEMMVRZ".into();
    }
    other_uid.version = "4".into();
    assert!(matches!(
        check_write(Some(&stored), &other_uid, WriteCondition::Merged),
        Err(StorageError::WrongUid)
    ));
    let mut stale = stored.clone();
    stale.version = "4".into();
    assert!(matches!(
        check_write(Some(&stored), &stale, WriteCondition::Version),
        Err(StorageError::CasFailure)
    ));
    assert!(check_write(Some(&stored), &stored, WriteCondition::Version).is_ok());
    assert!(matches!(
        check_write(None, &stored, WriteCondition::Merged),
        Err(StorageError::CasFailure)
    ));
    let mut create = stored.clone();
    create.version.clear();
    assert!(check_write(None, &create, WriteCondition::Version).is_ok());
}

#[test]
fn a_merged_write_lands_over_a_later_version_only_while_what_it_merged_is_unchanged() {
    use proto::meta::{DELETION_TIMESTAMP_KEY, FINALIZERS_KEY};

    let fixture = Fixture::new();
    let read = {
        let mut resource = artist("a");
        resource.version = "5".into();
        resource.metadata.insert(FINALIZERS_KEY.into(), "x".into());
        resource.status.insert("ok".into(), Default::default());
        resource
    };
    // The blind write as the service merged it from `read`, with new data.
    let incoming = {
        let mut resource = read.clone();
        resource.data = fixture.artist("b").data;
        resource
    };
    let later = |change: &dyn Fn(&mut Resource)| {
        let mut stored = read.clone();
        stored.version = "7".into();
        change(&mut stored);
        stored
    };
    let cases: [(&str, Resource, bool); 6] = [
        (
            "only data and version moved",
            later(&|r| r.data = None),
            true,
        ),
        (
            "a status was written since",
            later(&|r| {
                r.status.insert("new".into(), Default::default());
            }),
            false,
        ),
        (
            "the finalizers changed",
            later(&|r| {
                r.metadata.insert(FINALIZERS_KEY.into(), "y".into());
            }),
            false,
        ),
        (
            "it was marked for deletion",
            later(&|r| {
                r.metadata
                    .insert(DELETION_TIMESTAMP_KEY.into(), "2026-01-01T00:00:00Z".into());
            }),
            false,
        ),
        (
            "the owner differs",
            later(&|r| r.owner = Some(fixture.artist("o").id.unwrap_or_default())),
            false,
        ),
        (
            "other metadata changed",
            later(&|r| {
                r.metadata.insert("label".into(), "v".into());
            }),
            true,
        ),
    ];
    for (what, stored, lands) in cases {
        let merged = check_write(Some(&stored), &incoming, WriteCondition::Merged);
        assert_eq!(merged.is_ok(), lands, "{what}: {merged:?}");
        if !lands {
            assert!(matches!(merged, Err(StorageError::CasFailure)), "{what}");
        }
        // A plain compare-and-swap never lands over another version.
        assert!(
            matches!(
                check_write(Some(&stored), &incoming, WriteCondition::Version),
                Err(StorageError::CasFailure)
            ),
            "{what}"
        );
    }
    // Deleted and created again: another uid, whatever the condition.
    let recreated = later(&|r| {
        if let Some(id) = r.id.as_mut() {
            id.uid = "01BX5ZZKBKACTAV9WEVGEMMVRZ".into();
        }
    });
    assert!(matches!(
        check_write(Some(&recreated), &incoming, WriteCondition::Merged),
        Err(StorageError::WrongUid)
    ));
    // Deleted since: nothing to merge into.
    assert!(matches!(
        check_write(None, &incoming, WriteCondition::Merged),
        Err(StorageError::CasFailure)
    ));
}

#[test]
fn delete_checks_treat_missing_and_other_uids_as_nothing() {
    let mut stored = artist("a");
    stored.version = "5".into();
    let id = stored.id.clone().expect("id");
    assert_eq!(
        check_delete(None, &id, "5").ok(),
        Some(DeleteCheck::Nothing)
    );
    let mut other = id.clone();
    other.uid = "01BX5ZZKBKACTAV9WEVGEMMVRZ".into();
    assert_eq!(
        check_delete(Some(&stored), &other, "1").ok(),
        Some(DeleteCheck::Nothing)
    );
    assert!(matches!(
        check_delete(Some(&stored), &id, "4"),
        Err(StorageError::CasFailure)
    ));
    assert_eq!(
        check_delete(Some(&stored), &id, "5").ok(),
        Some(DeleteCheck::Remove)
    );
}
