//! Admission policies (DESIGN §17) at the service: DENY with params refuses exactly what it
//! matches, WARN warns, a policy without its params fails closed (DENY) or open (WARN), a
//! policy cannot name the platform's own types, and writing one needs the types' ownership.

use proto::policy::v1 as pb;
use proto::resource::v1::{Resource, Tenancy};

use super::*;
use crate::acl::{Access, KeyRules};

fn policy(name: &str, policy: pb::AdmissionPolicy) -> Resource {
    Resource {
        id: Some(id("policy.v1.AdmissionPolicy", Tenancy::default(), name)),
        data: Some(proto::to_any(&policy)),
        ..Default::default()
    }
}

fn album_of(name: &str, year: i32, namespace: &str) -> Resource {
    Resource {
        id: Some(id(
            "demo.v2.Album",
            Tenancy {
                partition: "default".into(),
                namespace: namespace.into(),
            },
            name,
        )),
        data: Some(proto::to_any(&proto::demo::v2::Album {
            name: name.into(),
            year_of_release: year,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Albums in `default` from before the year the params album says are refused.
fn minimum_year(action: pb::Action, params: &str) -> pb::AdmissionPolicy {
    pb::AdmissionPolicy {
        r#match: Some(pb::Match {
            types: vec!["demo.*.Album".into()],
            namespaces: vec!["default".into()],
            ..Default::default()
        }),
        params: Some(id("demo.v2.Album", default_ns(), params)),
        validations: vec![pb::Validation {
            expression: "object.data.yearOfRelease >= params.yearOfRelease".into(),
            message: "albums here are from the year params says or later".into(),
        }],
        action: action as i32,
        ..Default::default()
    }
}

fn denied_by(error: &Error) -> Option<&str> {
    match error {
        Error::AdmissionDenied(denied) => Some(denied.policy.as_str()),
        _ => None,
    }
}

#[tokio::test]
async fn a_deny_policy_with_params_refuses_exactly_what_it_matches() {
    let h = harness().await;
    h.write(album_of("threshold", 1960, "default"))
        .await
        .expect("the params");
    h.write(policy(
        "modern-only",
        minimum_year(pb::Action::Deny, "threshold"),
    ))
    .await
    .expect("the policy");
    let refused = h
        .write(album_of("old", 1950, "default"))
        .await
        .expect_err("before 1960");
    assert_eq!(denied_by(&refused), Some("modern-only"), "{refused:?}");
    assert!(
        refused.to_string().contains("from the year params says"),
        "{refused}"
    );
    h.write(album_of("new", 1970, "default"))
        .await
        .expect("after 1960");
    // Not matched: another namespace (it does not exist yet: create it), another type.
    h.write(Resource {
        id: Some(id(
            "tenancy.v1.Namespace",
            Tenancy {
                partition: "default".into(),
                namespace: String::new(),
            },
            "elsewhere",
        )),
        data: Some(proto::to_any(&proto::tenancy::v1::Namespace::default())),
        ..Default::default()
    })
    .await
    .expect("namespace");
    h.write(album_of("old", 1950, "elsewhere"))
        .await
        .expect("another namespace");
    h.write(artist("miles")).await.expect("another type");
    // Raising the threshold refuses the next update of a stored album, not what is stored.
    h.write(album_of("threshold", 1980, "default"))
        .await
        .expect("params changed");
    let refused = h
        .write(album_of("new", 1971, "default"))
        .await
        .expect_err("an update under the raised threshold");
    assert_eq!(denied_by(&refused), Some("modern-only"));
}

#[tokio::test]
async fn warn_warns_and_missing_params_fail_deny_closed_and_warn_open() {
    let h = harness().await;
    h.write(policy(
        "warn-old",
        minimum_year(pb::Action::Warn, "threshold"),
    ))
    .await
    .expect("a warn policy");
    // Its params do not exist: it lets the write through, saying why.
    let (written, warnings) =
        crate::service::policy::collecting(h.write(album_of("old", 1950, "default"))).await;
    written.expect("WARN fails open");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("warn-old") && w.contains("do not exist")),
        "{warnings:?}"
    );
    h.write(album_of("threshold", 1960, "default"))
        .await
        .expect("the params");
    let (written, warnings) =
        crate::service::policy::collecting(h.write(album_of("older", 1940, "default"))).await;
    written.expect("a warning only");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("warn-old") && w.contains("from the year params says")),
        "{warnings:?}"
    );
    h.write(policy(
        "deny-old",
        minimum_year(pb::Action::Deny, "missing"),
    ))
    .await
    .expect("a deny policy");
    let refused = h
        .write(album_of("newest", 2020, "default"))
        .await
        .expect_err("DENY fails closed without its params");
    assert_eq!(denied_by(&refused), Some("deny-old"));
    assert!(refused.to_string().contains("do not exist"), "{refused}");
}

#[tokio::test]
async fn deletes_are_policed_and_a_deletion_under_way_is_not() {
    let h = harness().await;
    let protected = pb::AdmissionPolicy {
        r#match: Some(pb::Match {
            types: vec!["demo.v2.Album".into()],
            operations: vec![pb::Operation::Delete as i32],
            ..Default::default()
        }),
        validations: vec![pb::Validation {
            expression: "!('protected' in object.metadata) && request.operation == 'DELETE'".into(),
            message: "a protected album is not deleted".into(),
        }],
        action: pb::Action::Deny as i32,
        ..Default::default()
    };
    h.write(policy("keep-protected", protected))
        .await
        .expect("policy");
    let mut kept = album_of("kept", 1960, "default");
    kept.metadata.insert("protected".into(), "yes".into());
    let kept = h.write(kept).await.expect("an album");
    let tmp = h
        .write(album_of("tmp", 1960, "default"))
        .await
        .expect("another");
    let writer = KeyRules::default().key_prefix("resource/", Access::Write);
    let refused = h
        .delete_as(&writer, &id_of(&kept), "")
        .await
        .expect_err("a protected album");
    assert_eq!(denied_by(&refused), Some("keep-protected"));
    h.delete_as(&writer, &id_of(&tmp), "")
        .await
        .expect("an unprotected one");
    // The server's own deletes (a namespace emptied, a cascade) always complete.
    h.delete(&id_of(&kept), "")
        .await
        .expect("the server deletes it");
}

#[tokio::test]
async fn policies_cannot_name_the_platforms_types_and_need_their_types_ownership() {
    let h = harness().await;
    for glob in [
        "acl.*.*",
        "registry.v1.Type",
        "policy.*.*",
        "tenancy.v1.Quota",
    ] {
        let refused = h
            .write(policy(
                "over-the-platform",
                pb::AdmissionPolicy {
                    r#match: Some(pb::Match {
                        types: vec![glob.into()],
                        ..Default::default()
                    }),
                    validations: vec![pb::Validation {
                        expression: "false".into(),
                        message: "no".into(),
                    }],
                    action: pb::Action::Deny as i32,
                    ..Default::default()
                },
            ))
            .await
            .err()
            .map(|error| format!("{error:?}"));
        assert!(
            refused
                .as_ref()
                .is_some_and(|why| why.contains("match.types[0]")),
            "{glob}: {refused:?}"
        );
    }
    // `*` never covers them: a deny-everything policy leaves tokens and Types writable.
    h.write(policy(
        "deny-everything",
        pb::AdmissionPolicy {
            validations: vec![pb::Validation {
                expression: "false".into(),
                message: "nothing is admitted".into(),
            }],
            action: pb::Action::Deny as i32,
            ..Default::default()
        },
    ))
    .await
    .expect("a policy over every type");
    assert!(denied_by(&h.write(artist("refused")).await.expect_err("denied")).is_some());
    h.write(policy(
        "deny-everything",
        pb::AdmissionPolicy {
            validations: vec![pb::Validation {
                expression: "true".into(),
                message: "everything is admitted".into(),
            }],
            action: pb::Action::Deny as i32,
            ..Default::default()
        },
    ))
    .await
    .expect("policies stay writable under it");
    // Without the types' ownership, a team cannot police them.
    let team = KeyRules::default().key_prefix("resource/", Access::Write);
    let refused = h
        .write_as(
            &team,
            policy("teams-rule", minimum_year(pb::Action::Deny, "x")),
        )
        .await
        .err()
        .map(|error| format!("{error:?}"));
    assert!(
        refused
            .as_ref()
            .is_some_and(|why| why.contains("schema write on demo.*.Album")),
        "{refused:?}"
    );
    let owner = team.clone().schema(Access::Write);
    h.write_as(
        &owner,
        policy("teams-rule", minimum_year(pb::Action::Warn, "x")),
    )
    .await
    .expect("the owner of the types");
}

/// A plan lists exactly the stored objects a proposed policy would refuse (whatever its
/// action), withholds the names its caller may not read, and stores nothing.
#[tokio::test]
async fn a_plan_names_exactly_the_objects_a_policy_would_refuse() {
    let h = harness().await;
    h.write(album_of("threshold", 1960, "default"))
        .await
        .expect("the params");
    for (name, year) in [("old", 1950), ("older", 1940), ("new", 1970)] {
        h.write(album_of(name, year, "default"))
            .await
            .expect("an album");
    }
    let plan = h
        .service
        .plan_policy(
            &AllowAll,
            Some(policy(
                "modern-only",
                minimum_year(pb::Action::Warn, "threshold"),
            )),
        )
        .await
        .expect("a plan");
    let mut named: Vec<&str> = plan
        .failures
        .iter()
        .filter_map(|f| f.id.as_ref().map(|id| id.name.as_str()))
        .collect();
    named.sort_unstable();
    assert_eq!(named, ["old", "older"], "{:?}", plan.failures);
    assert_eq!(plan.checked, 4);
    // Nothing was stored: the policy does not hold.
    h.write(album_of("oldest", 1930, "default"))
        .await
        .expect("no policy was written");
    // A caller who may not read the albums learns how many, not which.
    // (It may read the params: a policy's writer must.)
    let owner = KeyRules::default()
        .key_prefix("resource/policy.", Access::Write)
        .key_prefix("resource/demo.v2.Album/threshold", Access::Read)
        .schema(Access::Write);
    let plan = h
        .service
        .plan_policy(
            &owner,
            Some(policy(
                "modern-only",
                minimum_year(pb::Action::Deny, "threshold"),
            )),
        )
        .await
        .expect("a plan");
    assert_eq!(plan.failures.len(), 3);
    assert!(plan.failures.iter().all(|f| f.id.is_none()));
    // Params its writer may not read are refused: a policy cannot read for its writer.
    let no_params = KeyRules::default()
        .key_prefix("resource/policy.", Access::Write)
        .schema(Access::Write);
    let refused = h
        .write_as(
            &no_params,
            policy("peek", minimum_year(pb::Action::Deny, "threshold")),
        )
        .await
        .err()
        .map(|error| format!("{error:?}"));
    assert!(
        refused
            .as_ref()
            .is_some_and(|why| why.contains("must be able to read them")),
        "{refused:?}"
    );
}

/// A policy whose validation may cost more than a rule's budget on the largest object is
/// refused when written, naming the validation; one over a list of the object's is fine.
#[tokio::test]
async fn a_policy_over_budget_is_refused_when_written() {
    let h = harness().await;
    let with = |expression: &str| {
        policy(
            "costly",
            pb::AdmissionPolicy {
                r#match: Some(pb::Match {
                    types: vec!["demo.v2.Album".into()],
                    ..Default::default()
                }),
                validations: vec![pb::Validation {
                    expression: expression.into(),
                    message: "no".into(),
                }],
                action: pb::Action::Deny as i32,
                ..Default::default()
            },
        )
    };
    let refused = h
        .write(with(
            "object.data.tracks.all(a, object.data.tracks.all(b, a == b || a != b))",
        ))
        .await
        .err()
        .map(|error| format!("{error:?}"));
    assert!(
        refused.as_ref().is_some_and(
            |why| why.contains("validations[0].expression") && why.contains("over the budget")
        ),
        "{refused:?}"
    );
    h.write(with("object.data.tracks.all(t, size(t) < 200)"))
        .await
        .expect("one pass over a list");
}

/// A dry run (MutateAndValidate: `resctl apply --dry-run`) is told what the write would be: a
/// DENY policy refuses it there too.
#[tokio::test]
async fn a_dry_run_meets_the_policies_the_write_would() {
    let h = harness().await;
    h.write(album_of("threshold", 1960, "default"))
        .await
        .expect("the params");
    h.write(policy(
        "modern-only",
        minimum_year(pb::Action::Deny, "threshold"),
    ))
    .await
    .expect("the policy");
    let refused = h
        .service
        .mutate_and_validate(
            &AllowAll,
            proto::resource::v1::MutateAndValidateRequest {
                resource: Some(album_of("old", 1950, "default")),
            },
        )
        .await
        .expect_err("a dry run of an old album");
    assert_eq!(denied_by(&refused), Some("modern-only"));
    h.service
        .mutate_and_validate(
            &AllowAll,
            proto::resource::v1::MutateAndValidateRequest {
                resource: Some(album_of("new", 1970, "default")),
            },
        )
        .await
        .expect("a dry run of a new one");
}

/// A policy over one version of a Type holds for writes through that version, whatever
/// version stores them (it matched only the stored version before).
#[tokio::test]
async fn a_policy_over_a_version_holds_for_writes_through_it() {
    use proto::registry::v1 as registry;
    let h = harness().await;
    let proto_of = |version: &str| {
        format!(
            "syntax = \"proto3\";\npackage resd.gauges.{version};\nmessage Gauge {{ int64 value = 2; }}\n"
        )
    };
    let t = registry::Type {
        group: "gauges".into(),
        kind: "Gauge".into(),
        scope: registry::Scope::Namespace as i32,
        versions: ["v1", "v2"]
            .into_iter()
            .map(|name| registry::TypeVersion {
                name: name.into(),
                proto: proto_of(name),
                served: true,
                ..Default::default()
            })
            .collect(),
        storage_version: "v2".into(),
        ..Default::default()
    };
    h.write(Resource {
        id: Some(id("registry.v1.Type", Tenancy::default(), "gauges-gauge")),
        data: Some(proto::to_any(&t)),
        ..Default::default()
    })
    .await
    .expect("the Type");
    h.write(policy(
        "small-v1",
        pb::AdmissionPolicy {
            r#match: Some(pb::Match {
                types: vec!["gauges.v1.Gauge".into()],
                ..Default::default()
            }),
            validations: vec![pb::Validation {
                expression: "object.data.value < 10".into(),
                message: "v1 gauges stay small".into(),
            }],
            action: pb::Action::Deny as i32,
            ..Default::default()
        },
    ))
    .await
    .expect("the policy");
    let gauge = |version: &str, value: i64| {
        let mut bytes = Vec::new();
        prost::encoding::int64::encode(2, &value, &mut bytes);
        Resource {
            id: Some(id(&format!("gauges.{version}.Gauge"), default_ns(), "g")),
            data: Some(prost_types::Any {
                type_url: format!("type.googleapis.com/resd.gauges.{version}.Gauge"),
                value: bytes,
            }),
            ..Default::default()
        }
    };
    let refused = h.write(gauge("v1", 50)).await.expect_err("through v1");
    assert_eq!(denied_by(&refused), Some("small-v1"));
    h.write(gauge("v2", 50))
        .await
        .expect("through v2 it is not matched");
}

/// A write checked against a policy is fenced on the params it read: params changed before the
/// write is stored refuse it at the store (the service then checks it again, under the new
/// params). Without the guard the write was stored under the old params.
#[tokio::test]
async fn a_write_is_fenced_on_the_params_its_policies_read() {
    let backend = Arc::new(InMemBackend::new());
    let h = harness_with(backend.clone()).await;
    h.write(album_of("threshold", 1960, "default"))
        .await
        .expect("the params");
    h.write(policy(
        "modern-only",
        minimum_year(pb::Action::Deny, "threshold"),
    ))
    .await
    .expect("the policy");
    let set = h.service.policies_now();
    let mut album = album_of("racing", 1970, "default");
    let guards = h
        .service
        .admit(
            &set,
            &album,
            None,
            crate::registry::policies::Operation::Create,
            "test",
            None,
        )
        .await
        .expect("admitted under a threshold of 1960");
    assert_eq!(guards.len(), 1, "{guards:?}");
    // The threshold moves past the album before it is stored.
    h.write(album_of("threshold", 1980, "default"))
        .await
        .expect("params raised");
    if let Some(id) = album.id.as_mut() {
        id.uid = ulid::Ulid::new().to_string();
        id.tenancy = Some(tenancy("default", "default"));
    }
    album.generation = ulid::Ulid::new().to_string();
    let refused = backend
        .write_cas_as(album, "test", &crate::storage::Fence { guards })
        .await
        .expect_err("stored under params that changed");
    assert!(matches!(refused, StorageError::Fenced(_)), "{refused:?}");
}
