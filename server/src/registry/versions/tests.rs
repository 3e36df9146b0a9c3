//! Versions of a Type: compiling them, converting between them, the round-trip check and
//! what an update may change.

use prost::Message as _;
use prost_reflect::DynamicMessage;
use proto::registry::v1 as pb;

use super::*;

const V1: &str = r#"
syntax = "proto3";
package resd.platform.v1;
message Database {
  string engine = 1;
  int64 size_gb = 2;
  // Renamed `team` in v2: the same number and type carry over.
  string owner = 3;
}
"#;

const V2: &str = r#"
syntax = "proto3";
package resd.platform.v2;
message Database {
  string engine = 1;
  string team = 3;
  Storage storage = 4;
  string region = 5;
}
message Storage { int64 size_gb = 1; }
"#;

const V3: &str = r#"
syntax = "proto3";
package resd.platform.v3;
message Database {
  string engine = 1;
  string team = 3;
  Storage storage = 4;
  string region = 5;
}
message Storage { int64 size_gb = 1; }
"#;

fn version(name: &str, proto: &str) -> pb::TypeVersion {
    pb::TypeVersion {
        name: name.into(),
        proto: proto.into(),
        served: true,
        ..Default::default()
    }
}

fn conversion(from: &str, to: &str, field: &str, expression: &str) -> pb::Conversion {
    pb::Conversion {
        from_version: from.into(),
        to_version: to.into(),
        field: field.into(),
        expression: expression.into(),
    }
}

fn database() -> pb::Type {
    pb::Type {
        group: "platform".into(),
        kind: "Database".into(),
        scope: pb::Scope::Namespace as i32,
        versions: vec![version("v1", V1), version("v2", V2)],
        storage_version: "v2".into(),
        conversions: vec![
            conversion("v1", "v2", "storage.size_gb", "self.size_gb"),
            conversion("v2", "v1", "size_gb", "self.storage.size_gb"),
        ],
        ..Default::default()
    }
}

fn family(t: &pb::Type) -> Family {
    let compiled = compile(t).expect("compiles");
    Family::load(&compiled).expect("loads")
}

fn encode(family: &Family, version: &str, json: serde_json::Value) -> Vec<u8> {
    let message = family
        .version(version)
        .expect("version")
        .compiled
        .message
        .clone();
    DynamicMessage::deserialize(message, json)
        .expect("valid data")
        .encode_to_vec()
}

fn json(family: &Family, version: &str, bytes: &[u8]) -> serde_json::Value {
    let message = family
        .version(version)
        .expect("version")
        .compiled
        .message
        .clone();
    serde_json::to_value(DynamicMessage::decode(message, bytes).expect("decodes")).expect("json")
}

fn meter() -> Meter {
    Meter::new(cel::REQUEST_BUDGET)
}

#[test]
fn a_v1_object_reads_as_v2_and_back_unchanged() {
    let family = family(&database());
    let v1 = encode(
        &family,
        "v1",
        serde_json::json!({"engine": "postgres", "sizeGb": "40", "owner": "payments"}),
    );
    let v2 = family
        .convert(&v1, "v1", "v2", None, &mut meter())
        .expect("to v2");
    assert_eq!(
        json(&family, "v2", &v2),
        serde_json::json!({"engine": "postgres", "team": "payments", "storage": {"sizeGb": "40"}})
    );
    let back = family
        .convert(&v2, "v2", "v1", None, &mut meter())
        .expect("to v1");
    assert_eq!(json(&family, "v1", &back), json(&family, "v1", &v1));
}

#[test]
fn a_write_through_an_older_version_keeps_what_only_the_newer_one_has() {
    let family = family(&database());
    let stored = encode(
        &family,
        "v2",
        serde_json::json!({"engine": "postgres", "team": "a", "storage": {"sizeGb": "10"}, "region": "eu-west"}),
    );
    let read = family
        .convert(&stored, "v2", "v1", None, &mut meter())
        .expect("to v1");
    let mut edited = json(&family, "v1", &read);
    edited["sizeGb"] = serde_json::json!("20");
    let written = encode(&family, "v1", edited);
    let merged = family
        .convert(&written, "v1", "v2", Some(&stored), &mut meter())
        .expect("to v2");
    assert_eq!(
        json(&family, "v2", &merged),
        serde_json::json!({"engine": "postgres", "team": "a", "storage": {"sizeGb": "20"}, "region": "eu-west"})
    );
    // Without the stored object, v2's own field is simply unset.
    let fresh = family
        .convert(&written, "v1", "v2", None, &mut meter())
        .expect("to v2");
    assert!(json(&family, "v2", &fresh).get("region").is_none());
}

#[test]
fn a_version_that_loses_a_field_is_refused_naming_it() {
    let mut t = database();
    t.conversions.retain(|c| c.to_version != "v1");
    let error = compile(&t).expect_err("size_gb does not come back");
    assert!(error.contains("field size_gb of v1"), "{error}");
    assert!(error.contains("v1 → v2 → v1"), "{error}");
}

#[test]
fn a_conversion_that_does_not_fit_its_field_is_refused_naming_it() {
    let mut t = database();
    t.conversions[0].expression = "string(self.size_gb) + ' GB'".into();
    let error = compile(&t).expect_err("a string is no int64");
    assert!(error.contains("conversions[0]"), "{error}");
    assert!(error.contains("storage.size_gb"), "{error}");
}

#[test]
fn conversions_are_checked_against_both_versions() {
    let mut t = database();
    t.conversions[0].expression = "self.size_in_gb".into();
    let error = compile(&t).expect_err("no such field in v1");
    assert!(error.contains("data.conversions[0].expression"), "{error}");
    assert!(error.contains("size_in_gb"), "{error}");

    let mut t = database();
    t.conversions[0].field = "storage.size".into();
    let error = compile(&t).expect_err("no such field in v2");
    assert!(error.contains("data.conversions[0].field"), "{error}");

    let mut t = database();
    t.conversions[0].to_version = "v9".into();
    let error = compile(&t).expect_err("no such version");
    assert!(error.contains("to_version \"v9\""), "{error}");

    let mut t = database();
    t.conversions[0].expression = "old.size_gb".into();
    assert!(compile(&t).expect_err("old").contains("reads `old`"));

    let mut t = database();
    t.conversions[0].expression = "self.size_gb +".into();
    assert!(
        compile(&t)
            .expect_err("syntax")
            .contains("does not compile")
    );
}

#[test]
fn the_shape_of_a_multi_version_type_is_checked() {
    let mut t = database();
    t.storage_version = "v7".into();
    assert!(
        compile(&t)
            .expect_err("unknown storage version")
            .contains("data.storage_version \"v7\" is not one of data.versions")
    );
    let mut t = database();
    t.storage_version.clear();
    assert!(
        compile(&t)
            .expect_err("none")
            .contains("storage_version is required")
    );
    let mut t = database();
    t.proto = V1.into();
    t.group_version = "v1".into();
    let error = compile(&t).expect_err("top level set");
    assert!(
        error.contains("data.group_version must be empty"),
        "{error}"
    );
    assert!(error.contains("data.proto must be empty"), "{error}");
    let mut t = database();
    t.versions.push(version("v1", V1));
    assert!(compile(&t).expect_err("twice").contains("listed twice"));
    let mut t = database();
    for v in &mut t.versions {
        v.served = false;
    }
    assert!(
        compile(&t)
            .expect_err("none served")
            .contains("no version is served")
    );
    let mut t = database();
    t.versions[0].proto = V1.replace("resd.platform.v1", "resd.platform.v2");
    let error = compile(&t).expect_err("wrong package");
    assert!(
        error.contains("data.versions[0].proto declares package"),
        "{error}"
    );
    let mut t = database();
    t.versions[1].columns.push(pb::Column {
        name: "SIZE".into(),
        json_path: "data.storage".into(),
        r#type: "money".into(),
    });
    let error = compile(&t).expect_err("bad column");
    assert!(error.contains("json_path"), "{error}");
    assert!(error.contains("must be one of string"), "{error}");
}

#[test]
fn the_storage_version_may_be_unserved_and_versions_convert_through_it() {
    let mut t = database();
    t.versions.push(version("v3", V3));
    t.versions[1].served = false;
    t.conversions
        .push(conversion("v2", "v1", "owner", "self.team + ''"));
    let family = family(&t);
    assert_eq!(family.storage_version().name, "v2");
    assert_eq!(
        family.served().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["v1", "v3"]
    );
    let v1 = encode(
        &family,
        "v1",
        serde_json::json!({"engine": "mysql", "sizeGb": "7", "owner": "t"}),
    );
    let v3 = family
        .convert(&v1, "v1", "v3", None, &mut meter())
        .expect("through v2");
    assert_eq!(
        json(&family, "v3", &v3),
        serde_json::json!({"engine": "mysql", "team": "t", "storage": {"sizeGb": "7"}})
    );
}

/// A conversion between two versions neither of which is the storage version would never run:
/// refused, saying how to write it.
#[test]
fn a_conversion_that_would_never_run_is_refused() {
    let mut t = database();
    t.versions.push(version("v3", V3));
    t.conversions
        .push(conversion("v1", "v3", "storage.size_gb", "self.size_gb"));
    let refused = compile(&t).expect_err("v1 → v3 beside storage v2");
    assert!(
        refused.contains("data.conversions[2]") && refused.contains("would never run"),
        "{refused}"
    );
}

#[test]
fn an_update_keeps_the_storage_version_and_compatible_versions() {
    let old = family(&database());
    // Adding a version and moving storage to it is fine.
    let mut next = database();
    next.versions.push(version("v3", V3));
    next.storage_version = "v3".into();
    // v1 ↔ v2 would never run now (conversions go to and from the storage version).
    next.conversions.clear();
    next.conversions
        .push(conversion("v1", "v3", "storage.size_gb", "self.size_gb"));
    next.conversions
        .push(conversion("v3", "v1", "size_gb", "self.storage.size_gb"));
    check_update(&old, &family(&next)).expect("compatible");
    // Removing the version objects are stored in is not.
    let mut removed = database();
    removed.versions.remove(1);
    removed.versions.push(version("v3", V3));
    removed.storage_version = "v3".into();
    removed.conversions.clear();
    removed
        .conversions
        .push(conversion("v1", "v3", "storage.size_gb", "self.size_gb"));
    removed
        .conversions
        .push(conversion("v3", "v1", "size_gb", "self.storage.size_gb"));
    let error = check_update(&old, &family(&removed)).expect_err("storage removed");
    assert!(error.contains("v2 is the storage version"), "{error}");
    // A breaking change inside a version names the version (loaded without the round-trip
    // check, which would refuse it first).
    let mut broken = compile(&database()).expect("compiles");
    broken.versions[0].proto = V1.replace("int64 size_gb = 2;", "string size_gb = 2;");
    let alone =
        dynamic::compile(&version_type(&broken, &broken.versions[0])).expect("v1 alone compiles");
    broken.versions[0].descriptor_set = alone.descriptor_set;
    broken.conversions.clear();
    let error = check_update(&old, &Family::load(&broken).expect("loads")).expect_err("retyped");
    assert!(error.contains("version v1:"), "{error}");
    assert!(error.contains("size_gb"), "{error}");
}

#[test]
fn a_single_version_type_is_a_family_of_one() {
    let t = dynamic::tests::invoice_type();
    let compiled = dynamic::compile(&t).expect("compiles");
    let family = Family::load_any(&compiled).expect("loads");
    assert!(!family.converts());
    assert_eq!(family.storage, "v1");
    assert_eq!(family.served().count(), 1);
}

/// Every member of a oneof is sampled, not only the last: a first member that does not carry
/// over (its type changed) is found.
#[test]
fn every_member_of_a_oneof_is_sampled() {
    let old = "syntax = \"proto3\";\npackage resd.pay.v1;\nmessage Charge { oneof by { string card = 1; string iban = 2; } }\n";
    let new = "syntax = \"proto3\";\npackage resd.pay.v2;\nmessage Charge { oneof by { int64 card = 1; string iban = 2; } }\n";
    let t = pb::Type {
        group: "pay".into(),
        kind: "Charge".into(),
        scope: pb::Scope::Namespace as i32,
        versions: vec![version("v1", old), version("v2", new)],
        storage_version: "v2".into(),
        ..Default::default()
    };
    let refused = compile(&t).expect_err("card is lost on the way");
    assert!(refused.contains("field card of v1"), "{refused}");
    let message = family(&pb::Type {
        versions: vec![
            version("v1", old),
            version("v2", old.replace("pay.v1", "pay.v2").as_str()),
        ],
        ..t
    })
    .version("v1")
    .expect("v1")
    .compiled
    .message
    .clone();
    let all = samples(&message);
    assert_eq!(all.len(), 2);
    for (sample, member) in all.iter().zip(["card", "iban"]) {
        assert!(sample.has_field_by_name(member), "{member} in {sample:?}");
    }
}

#[test]
fn samples_set_every_field() {
    let family = family(&database());
    let message = family.version("v2").expect("v2").compiled.message.clone();
    let sample = samples(&message).remove(0);
    for field in message.fields() {
        assert!(sample.has_field(&field), "{} unset", field.name());
    }
    let mut other = sample.clone();
    other.set_field_by_name("region", Value::String("x".into()));
    assert_eq!(first_difference(&sample, &other).as_deref(), Some("region"));
}

/// A write through an older version keeps what only the newer one has inside messages in lists
/// and maps too (the item at the same index, the value at the same key).
#[test]
fn a_write_through_an_older_version_keeps_newer_fields_inside_lists_and_maps() {
    let old = "syntax = \"proto3\";\npackage resd.net.v1;\nmessage Port { int32 port = 1; }\nmessage Service { repeated Port ports = 1; map<string, Port> named = 2; }\n";
    let new = "syntax = \"proto3\";\npackage resd.net.v2;\nmessage Port { int32 port = 1; string protocol = 2; }\nmessage Service { repeated Port ports = 1; map<string, Port> named = 2; }\n";
    let t = pb::Type {
        group: "net".into(),
        kind: "Service".into(),
        scope: pb::Scope::Namespace as i32,
        versions: vec![version("v1", old), version("v2", new)],
        storage_version: "v2".into(),
        ..Default::default()
    };
    let family = family(&t);
    let stored = encode(
        &family,
        "v2",
        serde_json::json!({"ports": [{"port": 80, "protocol": "TCP"}], "named": {"web": {"port": 443, "protocol": "TLS"}}}),
    );
    let read = family
        .convert(&stored, "v2", "v1", None, &mut meter())
        .expect("to v1");
    let mut edited = json(&family, "v1", &read);
    edited["ports"][0]["port"] = serde_json::json!(8080);
    let written = encode(&family, "v1", edited);
    let merged = family
        .convert(&written, "v1", "v2", Some(&stored), &mut meter())
        .expect("to v2");
    assert_eq!(
        json(&family, "v2", &merged),
        serde_json::json!({"ports": [{"port": 8080, "protocol": "TCP"}], "named": {"web": {"port": 443, "protocol": "TLS"}}})
    );
}
