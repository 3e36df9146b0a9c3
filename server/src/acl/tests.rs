//! Tests of policies and token resolution.

use super::*;

#[test]
fn longest_key_prefix_wins() {
    let policy = Policy::default()
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
    let policy = Policy::default()
        .operator(Access::Read)
        .key_prefix("k", Access::List);
    assert!(require_operator(&policy, Access::Read).is_ok());
    let denied = require_operator(&policy, Access::Write).expect_err("read < write");
    assert_eq!(
        denied.to_string(),
        "permission denied: token lacks operator:write"
    );
    assert!(require_key(&policy, "k1", Access::List).is_ok());
    assert!(require_key(&policy, "k1", Access::Read).is_err());
}

#[test]
fn static_tokens_reject_missing_and_unknown_tokens() {
    let resolver = StaticTokens::new().with_token("t1", Policy::default().operator(Access::Write));
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
    assert_eq!(authorizer.key("anything"), Access::Write);
}
