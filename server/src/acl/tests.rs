//! Tests of policies and token resolution.

use super::*;

#[test]
fn longest_key_prefix_wins() {
    let policy = KeyRules::default()
        .key_prefix("resource/", Access::Read)
        .key_prefix("resource/demo.v2.Artist/", Access::Write)
        .key_prefix("resource/demo.v2.Artist/secret", Access::Deny);
    assert_eq!(policy.key("resource/demo.v1.Album/x"), Access::Read);
    assert_eq!(policy.key("resource/demo.v2.Artist/miles"), Access::Write);
    assert_eq!(
        policy.key("resource/demo.v2.Artist/secret-agent"),
        Access::Deny
    );
    assert_eq!(policy.key("other"), Access::Deny);
}

#[test]
fn requirements_compare_access_levels() {
    let policy = KeyRules::default()
        .operator(Access::Read)
        .key_prefix("resource/demo.v2.Artist/", Access::List);
    assert!(require_operator(&policy, Access::Read).is_ok());
    let denied = require_operator(&policy, Access::Write).expect_err("read < write");
    assert_eq!(
        denied.to_string(),
        "permission denied: token lacks operator write"
    );
    let id = Id {
        uid: String::new(),
        name: "miles-davis".into(),
        r#type: Some(crate::resource::new_type("demo", "v2", "Artist")),
        tenancy: Some(proto::resource::v1::Tenancy {
            partition: "default".into(),
            namespace: "jazz".into(),
        }),
    };
    assert!(require_resource(&policy, &id, Access::List).is_ok());
    let denied = require_resource(&policy, &id, Access::Write).expect_err("list < write");
    assert_eq!(
        denied.to_string(),
        "permission denied: token lacks write on demo.v2.Artist default/jazz/miles-davis"
    );
}

#[test]
fn static_tokens_reject_missing_and_unknown_tokens() {
    let resolver =
        StaticTokens::new().with_token("t1", KeyRules::default().operator(Access::Write));
    assert!(resolver.resolve(None).is_err());
    assert!(resolver.resolve(Some("")).is_err());
    assert!(resolver.resolve(Some("nope")).is_err());
    let authorizer = resolver.resolve(Some("t1")).expect("known token");
    assert_eq!(authorizer.operator(), Access::Write);
}

#[test]
fn disabled_acls_allow_everything_without_a_token() {
    let authorizer = AclsDisabled.resolve(None).expect("always resolves");
    assert_eq!(authorizer.operator(), Access::Write);
    assert_eq!(authorizer.resource(&Id::default()), Access::Write);
}
