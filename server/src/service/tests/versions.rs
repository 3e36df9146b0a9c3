//! Versions of a registered type at the service (DESIGN §15.1), attacked: a Type whose
//! conversions are costly cannot make one List hold a thread for long, and a list in pages
//! still works; a watch in the costly version still gets its events.

use proto::registry::v1 as registry;
use proto::resource::v1::{ListRequest, Resource, Tenancy, WatchListRequest};

use super::*;

const V1: &str =
    "syntax = \"proto3\";\npackage resd.attack.v1;\nmessage Pile { repeated string tags = 1; }\n";
const V2: &str =
    "syntax = \"proto3\";\npackage resd.attack.v2;\nmessage Pile { repeated string labels = 2; }\n";

/// v2 stored; v1 served, its `tags` made from v2's `labels` by a CEL map over every element.
fn costly_type() -> Resource {
    let t = registry::Type {
        group: "attack".into(),
        kind: "Pile".into(),
        scope: registry::Scope::Namespace as i32,
        versions: vec![
            registry::TypeVersion {
                name: "v1".into(),
                proto: V1.into(),
                served: true,
                ..Default::default()
            },
            registry::TypeVersion {
                name: "v2".into(),
                proto: V2.into(),
                served: true,
                ..Default::default()
            },
        ],
        storage_version: "v2".into(),
        conversions: vec![
            registry::Conversion {
                from_version: "v1".into(),
                to_version: "v2".into(),
                field: "labels".into(),
                expression: "self.tags.map(t, t + '')".into(),
            },
            registry::Conversion {
                from_version: "v2".into(),
                to_version: "v1".into(),
                field: "tags".into(),
                expression: "self.labels.map(l, l + '')".into(),
            },
        ],
        ..Default::default()
    };
    Resource {
        id: Some(id("registry.v1.Type", Tenancy::default(), "attack-pile")),
        data: Some(proto::to_any(&t)),
        ..Default::default()
    }
}

fn pile(name: &str, labels: usize) -> Resource {
    let mut value = Vec::new();
    for index in 0..labels {
        prost::encoding::string::encode(2, &format!("{index:0>60}"), &mut value);
    }
    Resource {
        id: Some(id("attack.v2.Pile", default_ns(), name)),
        data: Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.attack.v2.Pile".into(),
            value,
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_in_a_version_whose_conversions_are_costly_is_bounded_and_pages_work() {
    let harness = harness().await;
    harness
        .write(costly_type())
        .await
        .expect("the Type registers");
    for index in 0..300 {
        harness
            .write(pile(&format!("pile-{index:03}"), 1500))
            .await
            .expect("a pile");
    }
    // In the storage version: nothing to convert.
    let stored = harness
        .list("attack.v2.Pile", default_ns(), "")
        .await
        .expect("listed as stored");
    assert_eq!(stored.len(), 300);
    // In v1, every object converted by CEL: over the list's conversion budget, refused
    // saying what to do, rather than converting for as long as it takes.
    let refused = match harness.list("attack.v1.Pile", default_ns(), "").await {
        Ok(listed) => panic!(
            "{} listed: over the budget, expected a refusal",
            listed.len()
        ),
        Err(error) => error,
    };
    let Error::ResourceExhausted(why) = refused else {
        panic!("expected RESOURCE_EXHAUSTED, got {refused:?}");
    };
    assert!(why.contains("list in pages") && why.contains("v2"), "{why}");
    // A page at a time, it works.
    let page = harness
        .service
        .list(
            &AllowAll,
            Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::parse_gvk("attack.v1.Pile").expect("gvk")),
                tenancy: Some(default_ns()),
                limit: 20,
                ..Default::default()
            },
        )
        .await
        .expect("a page");
    assert_eq!(page.resources.len(), 20);
    assert_eq!(
        page.resources[0].data.as_ref().expect("data").type_url,
        "type.googleapis.com/resd.attack.v1.Pile"
    );
    assert!(!page.next_page_token.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_in_a_costly_version_gets_its_events_converted_off_the_workers() {
    use futures::StreamExt as _;
    let harness = harness().await;
    harness
        .write(costly_type())
        .await
        .expect("the Type registers");
    let mut events = harness
        .service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::parse_gvk("attack.v1.Pile").expect("gvk")),
                tenancy: Some(default_ns()),
                ..Default::default()
            },
        )
        .await
        .expect("watch");
    // The end of the (empty) snapshot.
    events.next().await.expect("an event").expect("ok");
    harness.write(pile("big", 1500)).await.expect("a pile");
    let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.next())
        .await
        .expect("the event comes")
        .expect("an event")
        .expect("ok");
    let Some(proto::resource::v1::watch_event::Event::Upsert(upsert)) = event.event else {
        panic!("an upsert: {event:?}");
    };
    let resource = upsert.resource.expect("resource");
    assert_eq!(
        resource
            .id
            .as_ref()
            .and_then(|id| id.r#type.as_ref())
            .map(|t| t.group_version.as_str()),
        Some("v1")
    );
    #[derive(Clone, PartialEq, prost::Message)]
    struct PileV1 {
        #[prost(string, repeated, tag = "1")]
        tags: Vec<String>,
    }
    let converted: PileV1 =
        prost::Message::decode(resource.data.expect("data").value.as_slice()).expect("v1");
    assert_eq!(converted.tags.len(), 1500);
}

/// A conversion that makes an object larger cannot store one over the size limit: a write in
/// the written version's limit whose storage-version form is over it is refused, saying so.
#[tokio::test]
async fn a_conversion_that_inflates_an_object_past_the_limit_is_refused() {
    let harness = harness().await;
    let small =
        "syntax = \"proto3\";\npackage resd.inflate.v1;\nmessage Blob { string text = 1; }\n";
    let large = "syntax = \"proto3\";\npackage resd.inflate.v2;\nmessage Blob { string text = 1; string twice = 2; }\n";
    let t = registry::Type {
        group: "inflate".into(),
        kind: "Blob".into(),
        scope: registry::Scope::Namespace as i32,
        versions: vec![
            registry::TypeVersion {
                name: "v1".into(),
                proto: small.into(),
                served: true,
                ..Default::default()
            },
            registry::TypeVersion {
                name: "v2".into(),
                proto: large.into(),
                served: true,
                ..Default::default()
            },
        ],
        storage_version: "v2".into(),
        conversions: vec![registry::Conversion {
            from_version: "v1".into(),
            to_version: "v2".into(),
            field: "twice".into(),
            expression: "self.text + self.text".into(),
        }],
        ..Default::default()
    };
    harness
        .write(Resource {
            id: Some(id("registry.v1.Type", Tenancy::default(), "inflate-blob")),
            data: Some(proto::to_any(&t)),
            ..Default::default()
        })
        .await
        .expect("the Type registers");
    let mut value = Vec::new();
    prost::encoding::string::encode(1, &"x".repeat(1_500_000), &mut value);
    let written = harness
        .write(Resource {
            id: Some(id("inflate.v1.Blob", default_ns(), "big")),
            data: Some(prost_types::Any {
                type_url: "type.googleapis.com/resd.inflate.v1.Blob".into(),
                value,
            }),
            ..Default::default()
        })
        .await;
    let Err(refused) = written else {
        panic!("4.5 MB in v2 was stored");
    };
    let Error::InvalidArgument(why) = &refused else {
        panic!("expected INVALID_ARGUMENT, got {refused:?}");
    };
    assert!(
        why.contains("storage version v2") && why.contains("over the limit"),
        "{why}"
    );
}

/// Attack: a token that may read only `inflate.v1.*` asks for an object stored in v2 through
/// v1. Before, the conversion answered it; access holds on the object as stored too, so Read
/// is refused and List and WatchList leave it out.
#[tokio::test]
async fn a_grant_on_one_version_does_not_read_objects_stored_in_another() {
    use crate::acl::{Access, KeyRules};
    let harness = harness().await;
    harness
        .write(costly_type())
        .await
        .expect("the Type registers");
    harness
        .write(pile("secret", 3))
        .await
        .expect("stored in v2");
    let v1_reader = KeyRules::default()
        .key_prefix("resource/", Access::List)
        .key_prefix("resource/attack.v1.Pile/", Access::Read);
    let refused = harness
        .read_as(&v1_reader, &id("attack.v1.Pile", default_ns(), "secret"))
        .await
        .err()
        .map(|error| matches!(error, Error::PermissionDenied(_)));
    assert_eq!(refused, Some(true), "read as v1 of a v2 object is denied");
    let listed = harness
        .list_as(&v1_reader, "attack.v1.Pile", default_ns(), "")
        .await
        .expect("a list");
    assert!(listed.is_empty(), "{} listed", listed.len());
    // Who may read both versions reads it through either.
    let both = KeyRules::default()
        .key_prefix("resource/", Access::List)
        .key_prefix("resource/attack.", Access::Read);
    harness
        .read_as(&both, &id("attack.v1.Pile", default_ns(), "secret"))
        .await
        .expect("readable through v1");
}

/// A Type's `migration` status is what lets its owner retire a version: the owner (who may
/// write the Type and holds its schema) cannot write it to skip the migration, only the
/// server's type controller can.
#[tokio::test]
async fn a_types_owner_cannot_fake_its_migration() {
    use crate::acl::{Access, KeyRules};
    let harness = harness().await;
    let stored = harness
        .write(costly_type())
        .await
        .expect("the Type registers");
    let owner = KeyRules::default()
        .key_prefix("resource/", Access::Write)
        .schema(Access::Write);
    let type_id = stored.id.clone().expect("id");
    let migrated = Status {
        observed_generation: stored.generation.clone(),
        conditions: vec![proto::resource::v1::Condition {
            r#type: "Migrated".into(),
            state: proto::resource::v1::State::True as i32,
            ..Default::default()
        }],
        ..Default::default()
    };
    let refused = harness
        .write_status_as(
            &owner,
            &type_id,
            "",
            crate::service::MIGRATION_STATUS,
            migrated.clone(),
        )
        .await
        .expect_err("the owner fakes Migrated");
    assert!(
        matches!(&refused, Error::PermissionDenied(why) if why.contains("type controller")),
        "{refused:?}"
    );
    // Other statuses of its own Type it may write.
    harness
        .write_status_as(&owner, &type_id, "", "team-notes", migrated.clone())
        .await
        .expect("another status");
    // The server itself may.
    harness
        .write_status(&type_id, "", crate::service::MIGRATION_STATUS, migrated)
        .await
        .expect("the server's controller");
}

/// Data a client writes through a version that does not convert to the storage version is the
/// client's bad request (INVALID_ARGUMENT naming `resource.data`), not a state of the system.
#[tokio::test]
async fn a_write_that_does_not_convert_is_a_bad_request_naming_the_data() {
    let harness = harness().await;
    let t = registry::Type {
        group: "attack".into(),
        kind: "Count".into(),
        scope: registry::Scope::Namespace as i32,
        versions: vec![
            registry::TypeVersion {
                name: "v1".into(),
                proto: "syntax = \"proto3\";\npackage resd.attack.v1;\nmessage Count { string text = 1; int64 value = 2; }\n".into(),
                served: true,
                ..Default::default()
            },
            registry::TypeVersion {
                name: "v2".into(),
                proto: "syntax = \"proto3\";\npackage resd.attack.v2;\nmessage Count { string text = 1; int64 value = 2; }\n".into(),
                served: true,
                ..Default::default()
            },
        ],
        storage_version: "v2".into(),
        conversions: vec![
            registry::Conversion {
                from_version: "v1".into(),
                to_version: "v2".into(),
                field: "value".into(),
                // Fails on one text only (no sample has it).
                expression: "self.text == 'twelve' ? int(self.text) : self.value".into(),
            },
        ],
        ..Default::default()
    };
    harness
        .write(Resource {
            id: Some(id("registry.v1.Type", Tenancy::default(), "attack-count")),
            data: Some(proto::to_any(&t)),
            ..Default::default()
        })
        .await
        .expect("the Type registers");
    let mut value = Vec::new();
    prost::encoding::string::encode(1, &"twelve".to_owned(), &mut value);
    let refused = harness
        .write(Resource {
            id: Some(id("attack.v1.Count", default_ns(), "bad")),
            data: Some(prost_types::Any {
                type_url: "type.googleapis.com/resd.attack.v1.Count".into(),
                value,
            }),
            ..Default::default()
        })
        .await
        .expect_err("text that is no number");
    match &refused {
        Error::BadRequest(bad) => assert!(
            bad.0
                .iter()
                .any(|v| v.field == "resource.data" && v.message.contains("storage version")),
            "{refused:?}"
        ),
        other => panic!("{other:?}"),
    }
}

/// Serving a kept version again is a change stored objects must survive, as adding it would
/// be: an object its conversion loses is named and the Type refused (the check compared
/// versions by name and schema only, and let it through).
#[tokio::test]
async fn serving_a_version_again_checks_the_stored_objects() {
    let harness = harness().await;
    const V1: &str =
        "syntax = \"proto3\";\npackage resd.attack.v1;\nmessage Meter { int64 value = 2; }\n";
    const V2: &str =
        "syntax = \"proto3\";\npackage resd.attack.v2;\nmessage Meter { int64 value = 2; }\n";
    let meter_type = |v1_served: bool| {
        let t = registry::Type {
            group: "attack".into(),
            kind: "Meter".into(),
            scope: registry::Scope::Namespace as i32,
            versions: vec![
                registry::TypeVersion {
                    name: "v1".into(),
                    proto: V1.into(),
                    served: v1_served,
                    ..Default::default()
                },
                registry::TypeVersion {
                    name: "v2".into(),
                    proto: V2.into(),
                    served: true,
                    ..Default::default()
                },
            ],
            storage_version: "v2".into(),
            // v1 holds at most 1000: larger values are lost on the way.
            conversions: vec![registry::Conversion {
                from_version: "v2".into(),
                to_version: "v1".into(),
                field: "value".into(),
                expression: "self.value > 1000 ? 1000 : self.value".into(),
            }],
            ..Default::default()
        };
        Resource {
            id: Some(id("registry.v1.Type", Tenancy::default(), "attack-meter")),
            data: Some(proto::to_any(&t)),
            ..Default::default()
        }
    };
    harness
        .write(meter_type(false))
        .await
        .expect("registered with v1 kept, not served");
    let mut value = Vec::new();
    prost::encoding::int64::encode(2, &5000, &mut value);
    harness
        .write(Resource {
            id: Some(id("attack.v2.Meter", default_ns(), "large")),
            data: Some(prost_types::Any {
                type_url: "type.googleapis.com/resd.attack.v2.Meter".into(),
                value,
            }),
            ..Default::default()
        })
        .await
        .expect("stored in v2");
    let refused = harness
        .write(meter_type(true))
        .await
        .err()
        .map(|error| format!("{error:?}"));
    assert!(
        refused.as_ref().is_some_and(|why| why.contains("large")),
        "serving v1 again loses what `large` holds, named: {refused:?}"
    );
}

/// A plan counts the objects its caller may not read, without naming them or saying what they
/// hold: writing a Type does not let its owner read every object of the kind.
#[tokio::test]
async fn a_plan_withholds_objects_its_caller_may_not_read() {
    use crate::acl::{Access, KeyRules};
    let harness = harness().await;
    let thing = |rules: Vec<registry::Rule>| {
        let t = registry::Type {
            group: "attack".into(),
            group_version: "v1".into(),
            kind: "Thing".into(),
            scope: registry::Scope::Namespace as i32,
            proto:
                "syntax = \"proto3\";\npackage resd.attack.v1;\nmessage Thing { int64 n = 1; }\n"
                    .into(),
            rules,
            ..Default::default()
        };
        Resource {
            id: Some(id("registry.v1.Type", Tenancy::default(), "attack-thing")),
            data: Some(proto::to_any(&t)),
            ..Default::default()
        }
    };
    harness.write(thing(Vec::new())).await.expect("the Type");
    for name in ["mine-big", "secret-big"] {
        let mut value = Vec::new();
        prost::encoding::int64::encode(1, &50, &mut value);
        harness
            .write(Resource {
                id: Some(id("attack.v1.Thing", default_ns(), name)),
                data: Some(prost_types::Any {
                    type_url: "type.googleapis.com/resd.attack.v1.Thing".into(),
                    value,
                }),
                ..Default::default()
            })
            .await
            .expect("stored");
    }
    let owner = KeyRules::default()
        .key_prefix("resource/registry.v1.Type/", Access::Write)
        .key_prefix("resource/attack.v1.Thing/mine", Access::Read)
        .schema(Access::Write);
    let plan = harness
        .service
        .plan_type(
            &owner,
            Some(thing(vec![registry::Rule {
                expression: "self.n < 10".into(),
                message: "small".into(),
                field: "n".into(),
            }])),
        )
        .await
        .expect("a plan");
    assert_eq!(plan.failures.len(), 2, "{:?}", plan.failures);
    let named: Vec<&str> = plan
        .failures
        .iter()
        .filter_map(|f| f.id.as_ref().map(|id| id.name.as_str()))
        .collect();
    assert_eq!(named, ["mine-big"]);
    let withheld = plan
        .failures
        .iter()
        .find(|f| f.id.is_none())
        .expect("one withheld");
    assert!(
        withheld.message.contains("may not read"),
        "{}",
        withheld.message
    );
    assert!(!withheld.message.contains("secret"), "{}", withheld.message);
}
