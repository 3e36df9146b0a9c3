//! Unit tests of apply's ordering and reporting.

use proto::resource::v1::{Id, Resource, Tenancy, Type};

use super::*;

fn id(kind: &str, name: &str) -> Id {
    let (group, version) = match kind {
        "Partition" | "Namespace" => ("tenancy", "v1"),
        _ => ("demo", "v2"),
    };
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(Type {
            group: group.into(),
            group_version: version.into(),
            kind: kind.into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

fn document(kind: &str, name: &str, owner: Option<(&str, &str)>) -> Document {
    Document {
        file: "test.yaml".into(),
        index: 1,
        resource: Ok(Resource {
            id: Some(id(kind, name)),
            owner: owner.map(|(kind, name)| id(kind, name)),
            ..Default::default()
        }),
    }
}

#[test]
fn tenancies_come_first_and_owners_before_what_they_own() {
    let documents = vec![
        document("Track", "so-what", Some(("Album", "kind-of-blue"))),
        document("Album", "kind-of-blue", Some(("Artist", "miles"))),
        document("Artist", "miles", None),
        document("Namespace", "jazz", None),
        document("Partition", "music", None),
        document("Album", "orphan", Some(("Artist", "not-in-input"))),
    ];
    let groups = order(&documents);
    assert_eq!(groups, vec![vec![4], vec![3], vec![2, 5], vec![1], vec![0]]);
}

#[test]
fn an_owner_cycle_in_the_input_still_orders_every_document() {
    let documents = vec![
        document("Artist", "a", Some(("Artist", "b"))),
        document("Artist", "b", Some(("Artist", "a"))),
    ];
    let ordered: Vec<usize> = order(&documents).into_iter().flatten().collect();
    assert_eq!(ordered.len(), 2);
}

#[test]
fn the_summary_counts_each_outcome_and_failures_name_file_and_document() {
    let result = |outcome, error: Option<&str>| Applied {
        file: "fixtures/x.yaml".into(),
        document: 2,
        resource_type: "demo.v2.Artist".into(),
        name: "miles".into(),
        tenancy: "default/default".into(),
        outcome,
        version: String::new(),
        error: error.map(str::to_owned),
    };
    let report = ApplyReport {
        dry_run: false,
        results: vec![
            result(Outcome::Created, None),
            result(Outcome::Created, None),
            result(Outcome::Unchanged, None),
            result(Outcome::Failed, Some("resource.data.name is required")),
        ],
    };
    assert_eq!(summary(&report), "2 created, 1 unchanged, 1 failed\n");
    assert_eq!(
        failures(&report),
        "error: fixtures/x.yaml document 2 (demo.v2.Artist miles): resource.data.name is required\n"
    );
}

#[test]
fn metadata_merges_keys_and_keeps_finalizers_others_hold() {
    let mut desired = Resource::default();
    desired.metadata.insert("team".into(), "jazz".into());
    desired
        .metadata
        .insert("finalizers".into(), "mine.example/hold".into());
    let mut stored = Resource::default();
    stored.metadata.insert("team".into(), "rock".into());
    stored
        .metadata
        .insert("managed-by".into(), "someone".into());
    stored
        .metadata
        .insert("finalizers".into(), "controller.example/cleanup".into());
    merge_metadata(&mut desired, &stored);
    assert_eq!(desired.metadata["team"], "jazz");
    assert_eq!(desired.metadata["managed-by"], "someone");
    assert_eq!(
        desired.metadata["finalizers"],
        "controller.example/cleanup mine.example/hold"
    );
}
