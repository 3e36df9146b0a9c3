//! Tests of the pure resource rules.

use super::*;
use proto::meta::equal_status;
use proto::resource::v1::{Resource, Status};

fn check_name_result(name: &str, expected_problem: Option<&str>) {
    match (check_name(name, MAX_NAME_LEN), expected_problem) {
        (Ok(()), None) => {}
        (Err(message), Some(problem)) => {
            assert!(
                message.contains(problem),
                "{name:?}: {message:?} lacks {problem:?}"
            )
        }
        (result, expected) => panic!("{name:?}: got {result:?}, expected problem {expected:?}"),
    }
}

#[test]
fn names_follow_the_dns_label_rule() {
    check_name_result("a", None);
    check_name_result("miles-davis", None);
    check_name_result("a1-b2", None);
    check_name_result(&"a".repeat(63), None);
    check_name_result("", Some("is empty"));
    check_name_result(&"a".repeat(64), Some("64 characters long"));
    check_name_result("Miles", Some("uppercase letter 'M'"));
    check_name_result("miles_davis", Some("contains '_'"));
    check_name_result("miles.davis", Some("contains '.'"));
    check_name_result("-miles", Some("starts or ends"));
    check_name_result("miles-", Some("starts or ends"));
    check_name_result("*", Some("contains '*'"));
}

#[test]
fn types_parse_and_format_round_trip() {
    let parsed = parse_gvk("demo.v2.Artist").expect("valid");
    assert_eq!(parsed, new_type("demo", "v2", "Artist"));
    assert_eq!(gvk(&parsed), "demo.v2.Artist");
    assert!(parse_gvk("demo.v1alpha1.Artist").is_ok());
    assert!(parse_gvk("my_group.v1.Thing2").is_ok());
}

#[test]
fn invalid_types_name_every_bad_part() {
    let message = parse_gvk("Demo.2.artist").expect_err("invalid");
    assert!(message.contains("group \"Demo\""), "{message}");
    assert!(message.contains("group_version \"2\""), "{message}");
    assert!(message.contains("kind \"artist\""), "{message}");
    assert!(
        parse_gvk("demo.v2")
            .expect_err("two parts")
            .contains("expected group.group_version.Kind")
    );
    assert!(check_group_version("v").is_err());
    assert!(check_group_version("v1a").is_err());
    assert!(check_group("d").is_err());
    assert!(check_kind("A").is_err());
}

#[test]
fn finalizers_are_a_whitespace_separated_set() {
    let mut resource = Resource::default();
    assert!(!has_finalizers(&resource));
    add_finalizer(&mut resource, "b.example/x");
    add_finalizer(&mut resource, "a.example/y");
    add_finalizer(&mut resource, "a.example/y");
    assert_eq!(resource.metadata[FINALIZERS_KEY], "a.example/y b.example/x");
    assert!(has_finalizer(&resource, "b.example/x"));
    remove_finalizer(&mut resource, "a.example/y");
    remove_finalizer(&mut resource, "b.example/x");
    assert!(!resource.metadata.contains_key(FINALIZERS_KEY));

    resource
        .metadata
        .insert(FINALIZERS_KEY.to_owned(), "  one\ttwo  one ".to_owned());
    assert_eq!(
        finalizers(&resource).into_iter().collect::<Vec<_>>(),
        ["one", "two"]
    );
}

#[test]
fn wildcard_tenancy_matches_any_value_of_its_field() {
    let tenancy = |partition: &str, namespace: &str| Tenancy {
        partition: partition.to_owned(),
        namespace: namespace.to_owned(),
    };
    assert!(tenancy_matches(&tenancy("*", "*"), &tenancy("p", "n")));
    assert!(tenancy_matches(&tenancy("p", "*"), &tenancy("p", "n")));
    assert!(!tenancy_matches(&tenancy("p", "*"), &tenancy("q", "n")));
    assert!(tenancy_matches(&tenancy("p", "n"), &tenancy("p", "n")));
    assert!(!tenancy_matches(&tenancy("p", "n"), &tenancy("p", "m")));
}

#[test]
fn status_equality_ignores_updated_at() {
    let status = Status {
        observed_generation: "01HXYZ".to_owned(),
        conditions: vec![],
        updated_at: Some(prost_types::Timestamp {
            seconds: 1,
            nanos: 0,
        }),
    };
    let mut later = status.clone();
    later.updated_at = Some(prost_types::Timestamp {
        seconds: 2,
        nanos: 0,
    });
    assert!(equal_status(&status, &later));
    later.observed_generation = "01HXZZ".to_owned();
    assert!(!equal_status(&status, &later));
}

#[test]
fn display_id_shows_type_tenancy_and_name() {
    let id = Id {
        uid: String::new(),
        name: "miles".to_owned(),
        r#type: Some(new_type("demo", "v2", "Artist")),
        tenancy: Some(Tenancy {
            partition: "default".to_owned(),
            namespace: "jazz".to_owned(),
        }),
    };
    assert_eq!(
        DisplayId(&id).to_string(),
        "demo.v2.Artist/default/jazz/miles"
    );
}
