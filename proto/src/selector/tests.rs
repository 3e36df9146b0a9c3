//! The grammar, every operator and every error.

use super::*;

fn metadata(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
    Selector::parse(selector)
        .unwrap_or_else(|error| panic!("{selector:?}: {error}"))
        .matches(&metadata(pairs))
}

#[test]
fn every_operator_matches_as_kubernetes_does() {
    let billing = [("team", "billing"), ("tier", "gold")];
    let none: [(&str, &str); 0] = [];
    assert!(selects("", &none));
    assert!(selects("   ", &billing));
    assert!(selects("team=billing", &billing));
    assert!(selects("team==billing", &billing));
    assert!(!selects("team=search", &billing));
    assert!(!selects("team=billing", &none), "= needs the key");
    assert!(selects("team!=search", &billing));
    assert!(!selects("team!=billing", &billing));
    assert!(
        selects("team!=billing", &none),
        "!= matches a resource without the key"
    );
    assert!(selects("team in (search, billing)", &billing));
    assert!(!selects("team in (search)", &billing));
    assert!(!selects("team in (billing)", &none), "in needs the key");
    assert!(selects("team notin (search)", &billing));
    assert!(!selects("team notin (search,billing)", &billing));
    assert!(
        selects("team notin (billing)", &none),
        "notin matches without the key"
    );
    assert!(selects("team", &billing));
    assert!(!selects("owner", &billing));
    assert!(selects("!owner", &billing));
    assert!(!selects("!team", &billing));
    assert!(selects(
        "team=billing, tier in (gold,silver), !owner",
        &billing
    ));
    assert!(
        !selects("team=billing,tier=silver", &billing),
        "comma is and"
    );
    assert!(selects("empty=", &[("empty", "")]));
    assert!(selects(
        "example.com/team=billing",
        &[("example.com/team", "billing")]
    ));
}

#[test]
fn a_selector_prints_canonically_and_parses_back() {
    for text in [
        "team=billing",
        "team!=billing",
        "team in (a,b)",
        "team notin (a)",
        "team",
        "!team",
        "a=1,b in (x,y),!c",
    ] {
        let parsed = Selector::parse(text).expect(text);
        assert_eq!(parsed.to_string(), text);
        assert_eq!(Selector::parse(&parsed.to_string()), Ok(parsed));
    }
    assert_eq!(
        Selector::parse(" team == billing ,  tier in ( b , a ) ")
            .unwrap()
            .to_string(),
        "team=billing,tier in (a,b)"
    );
}

#[test]
fn every_error_names_its_column() {
    let cases = [
        ("team=billing,", 14, "expected a key, found the end"),
        (",team", 1, "expected a key"),
        ("team=billing team2", 14, "expected \",\" or the end"),
        ("team >= 3", 6, "unexpected '>'"),
        ("team in billing", 9, "expected \"(\""),
        ("team in (a b)", 12, "expected \",\" or \")\""),
        ("team in ()", 9, "the set of values is empty"),
        ("team in (a", 11, "expected \",\" or \")\""),
        ("!", 2, "expected a key, found the end"),
        ("finalizers", 1, "reserved metadata key"),
        ("x, deletionTimestamp=1", 4, "reserved metadata key"),
        ("-team=x", 1, "invalid key"),
        ("a/b/c=x", 1, "invalid key"),
        ("team=a/b", 6, "\"/\" is for keys"),
        ("team=é", 6, "unexpected 'é'"),
        ("é=x", 1, "unexpected 'é'"),
        ("team (a)", 6, "expected an operator"),
    ];
    for (text, column, words) in cases {
        let error = Selector::parse(text).expect_err(text);
        assert_eq!(error.column, column, "{text:?}: {error}");
        assert!(error.message.contains(words), "{text:?}: {error}");
        assert!(
            error
                .to_string()
                .starts_with(&format!("selector invalid at column {column}: "))
        );
    }
    let long_value = format!("team={}", "v".repeat(64));
    assert!(
        Selector::parse(&long_value)
            .unwrap_err()
            .message
            .contains("at most 63")
    );
    let huge = "a,".repeat(MAX_SELECTOR_BYTES);
    assert!(
        Selector::parse(&huge)
            .unwrap_err()
            .message
            .contains("at most 4096 bytes")
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    // The error after a multi-byte character still points at the character.
    let error = Selector::parse("é").unwrap_err();
    assert_eq!(error.column, 1);
    let error = Selector::parse("a=b,é").unwrap_err();
    assert_eq!(error.column, 5);
}

mod properties {
    //! Random selectors: the canonical text of a parsed selector parses to the same selector
    //! (and the same text); any text at all parses or is refused, never panics.

    use proptest::prelude::*;

    use super::*;

    fn key() -> impl Strategy<Value = String> {
        "([a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?/)?[a-z0-9]([a-z0-9_.-]{0,12}[a-z0-9])?"
    }

    fn value() -> impl Strategy<Value = String> {
        "([a-z0-9]([a-z0-9_.-]{0,12}[a-z0-9])?)?"
    }

    fn set_value() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9_.-]{0,12}[a-z0-9])?"
    }

    fn requirement() -> impl Strategy<Value = String> {
        prop_oneof![
            (key(), value()).prop_map(|(k, v)| format!("{k}={v}")),
            (key(), value()).prop_map(|(k, v)| format!("{k}=={v}")),
            (key(), value()).prop_map(|(k, v)| format!("{k}!={v}")),
            (key(), prop::collection::vec(set_value(), 1..4))
                .prop_map(|(k, vs)| format!("{k} in ({})", vs.join(","))),
            (key(), prop::collection::vec(set_value(), 1..4))
                .prop_map(|(k, vs)| format!("{k} notin ({})", vs.join(", "))),
            key(),
            key().prop_map(|k| format!("!{k}")),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn the_canonical_text_parses_to_the_same_selector(parts in prop::collection::vec(requirement(), 1..5)) {
            let text = parts.join(",");
            let parsed = Selector::parse(&text);
            prop_assert!(parsed.is_ok(), "{text:?}: {parsed:?}");
            let parsed = parsed.unwrap_or_default();
            let canonical = parsed.to_string();
            let again = Selector::parse(&canonical);
            prop_assert_eq!(again.as_ref().map(ToString::to_string), Ok(canonical.clone()));
            prop_assert_eq!(again.ok(), Some(parsed));
        }

        #[test]
        fn any_text_parses_or_is_refused(text in "[ -~]{0,64}") {
            let _ = Selector::parse(&text);
        }
    }
}
