//! Tests of registration rules and the built-in hooks.

use proto::demo::v2 as demo_v2;

use super::*;

#[test]
fn builtin_registry_holds_every_builtin_type() {
    let registry = Registry::builtin().expect("built-in registrations are valid");
    let names: Vec<String> = registry.types().map(|r| r.gvk()).collect();
    for expected in [
        "internal.v1.Tombstone",
        "tenancy.v1.Partition",
        "tenancy.v1.Namespace",
        "demo.v2.Artist",
        "demo.v2.Album",
        "demo.v1.Artist",
        "demo.v1.Album",
        "demo.v1.Concept",
        "demo.v1.RecordLabel",
        "demo.v1.Executive",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
    let artist = registry
        .resolve(&resource::new_type("demo", "v2", "Artist"))
        .expect("registered");
    assert_eq!(artist.message_name, "resd.demo.v2.Artist");
    assert_eq!(artist.scope, Scope::Namespace);
}

#[test]
fn registering_an_invalid_type_is_an_error() {
    let mut registry = Registry::new();
    let error = registry
        .register(Registration::new::<demo_v2::Artist>(
            "demo.2.Artist",
            Scope::Namespace,
        ))
        .expect_err("invalid version");
    assert!(
        matches!(error, RegistryError::InvalidType { .. }),
        "{error}"
    );
    let error = registry
        .register(Registration::new::<demo_v2::Artist>(
            "demoArtist",
            Scope::Namespace,
        ))
        .expect_err("no dots");
    assert!(
        matches!(error, RegistryError::InvalidType { .. }),
        "{error}"
    );
}

#[test]
fn registering_a_type_twice_is_an_error() {
    let mut registry = Registry::new();
    registry
        .register(Registration::new::<demo_v2::Artist>(
            "demo.v2.Artist",
            Scope::Namespace,
        ))
        .expect("first");
    let error = registry
        .register(Registration::new::<demo_v2::Album>(
            "demo.v2.Artist",
            Scope::Namespace,
        ))
        .expect_err("duplicate");
    assert_eq!(error, RegistryError::Duplicate("demo.v2.Artist".to_owned()));
}

#[test]
fn data_of_another_message_is_rejected() {
    let registry = Registry::builtin().expect("valid");
    let artist = registry
        .resolve(&resource::new_type("demo", "v2", "Artist"))
        .expect("registered");
    let album = proto::to_any(&demo_v2::Album::default());
    let message = artist.check_data(&album).expect_err("wrong message");
    assert!(message.contains("wrong type"), "{message}");
    assert!(
        artist
            .check_data(&proto::to_any(&demo_v2::Artist::default()))
            .is_ok()
    );
    let garbage = prost_types::Any {
        type_url: "type.googleapis.com/resd.demo.v2.Artist".to_owned(),
        value: vec![0xff, 0xff, 0xff],
    };
    assert!(
        artist
            .check_data(&garbage)
            .expect_err("garbage")
            .contains("cannot decode")
    );
}

#[test]
fn artist_mutate_hook_defaults_the_genre_to_disco() {
    let registry = Registry::builtin().expect("valid");
    let artist = registry
        .resolve(&resource::new_type("demo", "v2", "Artist"))
        .expect("registered");
    let mut resource = Resource {
        data: Some(proto::to_any(&demo_v2::Artist {
            name: "Miles".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    (artist.mutate.as_ref().expect("has a mutate hook"))(&mut resource).expect("mutates");
    let mutated: demo_v2::Artist = decode_data(&resource).expect("decodes");
    assert_eq!(mutated.genre, demo_v2::Genre::Disco as i32);
}

#[test]
fn artist_validate_hook_requires_a_name() {
    let registry = Registry::builtin().expect("valid");
    let artist = registry
        .resolve(&resource::new_type("demo", "v2", "Artist"))
        .expect("registered");
    let resource = Resource {
        data: Some(proto::to_any(&demo_v2::Artist::default())),
        ..Default::default()
    };
    let invalid = (artist.validate.as_ref().expect("has a validate hook"))(&resource)
        .expect_err("name missing");
    assert_eq!(
        invalid,
        resource::Invalid::at("resource.data.name", "resource.data.name is required")
    );
}

#[test]
fn tombstone_names_embed_the_name_and_lowercase_uid() {
    let deleted = Id {
        uid: "01HZZZZZZZZZZZZZZZZZZZZZZZ".into(),
        name: "miles".into(),
        r#type: Some(resource::new_type("demo", "v2", "Artist")),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    };
    let tombstone = builtin::tombstone_id(&deleted);
    assert_eq!(tombstone.name, "tombstone-miles-01hzzzzzzzzzzzzzzzzzzzzzzz");
    assert_eq!(tombstone.tenancy, deleted.tenancy);
    let longest = "a".repeat(63);
    let long_tombstone = builtin::tombstone_id(&Id {
        name: longest,
        ..deleted
    });
    assert!(resource::check_name(&long_tombstone.name, builtin::MAX_TOMBSTONE_NAME_LEN).is_ok());
}

#[test]
fn similar_types_suggest_other_versions_and_near_kinds() {
    let registry = Registry::builtin().expect("valid");
    let typo = registry.similar(&resource::new_type("demo", "v2", "Artst"));
    assert!(typo.contains(&"demo.v2.Artist".to_owned()), "{typo:?}");
    let version = registry.similar(&resource::new_type("demo", "v3", "Album"));
    assert_eq!(version, ["demo.v1.Album", "demo.v2.Album"]);
    assert!(
        registry
            .similar(&resource::new_type("other", "v1", "Artist"))
            .is_empty()
    );
}

#[test]
fn data_equality_compares_decoded_messages() {
    let registry = Registry::builtin().expect("valid");
    let artist = registry
        .resolve(&resource::new_type("demo", "v2", "Artist"))
        .expect("registered");
    let message = demo_v2::Artist {
        name: "Miles".into(),
        genre: demo_v2::Genre::Jazz as i32,
        ..Default::default()
    };
    let canonical = proto::to_any(&message);
    // The same fields in another order: a different encoding of an equal message.
    let mut reordered = Vec::new();
    prost::encoding::int32::encode(3, &message.genre, &mut reordered);
    prost::encoding::string::encode(1, &message.name, &mut reordered);
    assert_ne!(reordered, canonical.value);
    let reordered = prost_types::Any {
        type_url: canonical.type_url.clone(),
        value: reordered,
    };
    assert!(artist.same_data(Some(&canonical), Some(&reordered)));
    let other = proto::to_any(&demo_v2::Artist::default());
    assert!(!artist.same_data(Some(&canonical), Some(&other)));
    assert!(!artist.same_data(Some(&canonical), None));
    assert!(artist.same_data(None, None));
}
