//! Codec tests against the crate's own descriptor set.

use super::*;
use crate::cluster::v1::Scope;

fn codec() -> Codec {
    let info = |gvk: &str, scope: Scope| {
        let parts: Vec<&str> = gvk.split('.').collect();
        TypeInfo {
            r#type: Some(Type {
                group: parts[0].into(),
                group_version: parts[1].into(),
                kind: parts[2].into(),
            }),
            scope: scope as i32,
            message_name: format!("resd.{gvk}"),
            builtin: true,
            ..Default::default()
        }
    };
    Codec::new(ListTypesResponse {
        types: vec![
            info("demo.v1.Artist", Scope::Namespace),
            info("demo.v2.Artist", Scope::Namespace),
            info("demo.v2.Album", Scope::Namespace),
            info("demo.v1.Executive", Scope::Cluster),
            info("tenancy.v1.Namespace", Scope::Partition),
        ],
        file_descriptor_set: crate::FILE_DESCRIPTOR_SET.to_vec().into(),
        next_page_token: String::new(),
    })
    .expect("codec")
}

const ALBUM: &str = "
type: demo.v2.Album
name: kind-of-blue
tenancy: {partition: default, namespace: default}
owner: {type: demo.v2.Artist, name: miles-davis}
metadata: {finalizers: demo.resd.io/cleanup}
data:
  name: Kind of Blue
  yearOfRelease: 1959
  tracks: [So What, Freddie Freeloader]
";

#[test]
fn a_fixture_reads_into_a_resource_with_typed_data() {
    let resources = codec().read_yaml(ALBUM);
    assert_eq!(resources.len(), 1);
    let album = resources.into_iter().next().expect("one").expect("valid");
    let id = album.id.clone().expect("id");
    assert_eq!(id.name, "kind-of-blue");
    assert_eq!(
        id.r#type.as_ref().map(gvk).as_deref(),
        Some("demo.v2.Album")
    );
    assert_eq!(
        id.tenancy.as_ref().map(|t| t.namespace.as_str()),
        Some("default")
    );
    assert_eq!(
        album.owner.as_ref().map(|o| o.name.as_str()),
        Some("miles-davis")
    );
    assert_eq!(album.metadata["finalizers"], "demo.resd.io/cleanup");
    let any = album.data.expect("data");
    assert_eq!(any.type_url, "type.googleapis.com/resd.demo.v2.Album");
    let data = crate::demo::v2::Album::decode(any.value.as_slice()).expect("an Album");
    assert_eq!(data.year_of_release, 1959);
    assert_eq!(data.tracks, ["So What", "Freddie Freeloader"]);
}

#[test]
fn a_rendered_resource_reads_back_the_same() {
    let codec = codec();
    let mut album = codec.read_yaml(ALBUM).remove(0).expect("valid");
    album.version = "42".into();
    album.generation = "01ARZ3NDEKTSV4RRFFQ69G5FAV".into();
    if let Some(id) = album.id.as_mut() {
        id.uid = "01ARZ3NDEKTSV4RRFFQ69G5FAW".into();
    }
    album.status.insert(
        "demo.resd.io/album".into(),
        Status {
            observed_generation: "01ARZ3NDEKTSV4RRFFQ69G5FAV".into(),
            conditions: vec![crate::resource::v1::Condition {
                r#type: "Accepted".into(),
                state: crate::resource::v1::State::True as i32,
                reason: "Ok".into(),
                message: "fine".into(),
                resource: None,
            }],
            updated_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 0,
            }),
        },
    );
    let rendered = codec.to_yaml(&album).expect("yaml");
    let back = codec.read_yaml(&rendered).remove(0).expect("reads back");
    assert_eq!(back, album, "{rendered}");
    let json = codec.to_json(&album).expect("json");
    let back = codec
        .read_value(serde_json::from_str(&json).expect("json parses"))
        .expect("reads back");
    assert_eq!(back, album);
}

#[test]
fn kinds_resolve_when_unique_and_list_candidates_when_not() {
    let codec = codec();
    let executive = codec.resolve_type("Executive").expect("unique");
    assert_eq!(executive.message_name, "resd.demo.v1.Executive");
    assert_eq!(
        codec
            .resolve_type("album")
            .expect("case-insensitive")
            .message_name,
        "resd.demo.v2.Album"
    );
    // Two versions of one group: the newest, as kubectl picks the preferred version.
    assert_eq!(
        codec
            .resolve_type("Artist")
            .expect("the preferred version")
            .message_name,
        "resd.demo.v2.Artist"
    );
    let typo = codec
        .resolve_type("demo.v3.Artist")
        .expect_err("no such version");
    assert!(
        typo.message
            .contains("did you mean demo.v1.Artist or demo.v2.Artist?"),
        "{typo}"
    );
    assert!(codec.resolve_type("Nothing").is_err());
}

#[test]
fn bad_documents_are_reported_with_their_number_and_the_rest_still_read() {
    let text = "
type: demo.v2.Album
name: fine
---
type: demo.v2.Album
name: bad-field
data: {yearofrelease: 1959}
---
---
type: demo.v2.Albm
name: bad-type
---
type: demo.v2.Album
nmae: typo
";
    let results = codec().read_yaml(text);
    assert_eq!(results.len(), 4, "the empty document is skipped");
    assert!(results[0].is_ok());
    let field = results[1].as_ref().expect_err("unknown data field");
    assert_eq!(field.document, Some(2));
    assert!(field.to_string().contains("yearofrelease"), "{field}");
    let kind = results[2].as_ref().expect_err("unknown type");
    assert_eq!(kind.document, Some(4));
    assert!(kind.to_string().contains("demo.v2.Albm"), "{kind}");
    let key = results[3].as_ref().expect_err("unknown key");
    assert!(key.to_string().contains("nmae"), "{key}");
}

#[test]
fn scopes_come_from_the_registry() {
    let codec = codec();
    let executive = codec
        .resolve_type("Executive")
        .expect("type")
        .r#type
        .clone()
        .expect("type");
    assert_eq!(codec.scope(&executive), Some(Scope::Cluster));
}

#[test]
fn a_yaml_syntax_error_ends_the_stream_with_one_error() {
    let codec = codec();
    let results = codec.read_yaml("type: demo.v2.Artist\nname: [unclosed\n");
    assert_eq!(results.len(), 1);
    let error = results[0].as_ref().expect_err("syntax error");
    assert!(error.message.starts_with("not valid YAML"), "{error}");
}

#[test]
fn versions_rank_stable_over_beta_over_alpha_and_higher_numbers_first() {
    let mut versions = vec![
        "v1alpha1", "v2", "v1", "v1beta2", "v1beta1", "v10", "latest",
    ];
    versions.sort_by_key(|v| version_rank(v));
    assert_eq!(
        versions,
        [
            "latest", "v1alpha1", "v1beta1", "v1beta2", "v1", "v2", "v10"
        ]
    );
}

#[test]
fn a_list_of_resources_reads_as_one_document_per_item() {
    let codec = codec();
    let one = "{\"type\": \"demo.v1.Executive\", \"name\": \"a\", \"data\": {\"name\": \"A\"}}";
    let two = "{\"type\": \"demo.v1.Executive\", \"name\": \"b\", \"data\": {\"name\": \"B\"}}";
    for text in [
        format!("[{one}, {two}]"),
        format!("{{\"items\": [{one}, {two}]}}"),
    ] {
        let read: Vec<_> = codec.read_yaml(&text);
        assert_eq!(read.len(), 2, "{text}");
        let names: Vec<String> = read
            .into_iter()
            .map(|r| r.expect("valid").id.expect("id").name)
            .collect();
        assert_eq!(names, ["a", "b"]);
    }
    let broken = format!("[{one}, {{\"type\": \"demo.v1.Executive\"}}]");
    let read = codec.read_yaml(&broken);
    let error = read[1].as_ref().expect_err("no name");
    assert!(error.message.starts_with("item 2:"), "{error:?}");
}

#[test]
fn a_data_field_that_does_not_decode_is_named_with_what_it_takes() {
    let codec = codec();
    let read = codec.read_yaml(
        "type: demo.v2.Artist\nname: m\ntenancy: {partition: default, namespace: jazz}\ndata: {name: M, genre: GENRE_BEBOP}\n",
    );
    let error = read[0].as_ref().expect_err("unknown enum value");
    assert!(error.message.contains("data.genre:"), "{error:?}");
    assert!(
        error
            .message
            .contains("one of GENRE_UNSPECIFIED, GENRE_JAZZ"),
        "{error:?}"
    );
    let read = codec.read_yaml(
        "type: demo.v2.Album\nname: a\ntenancy: {partition: default, namespace: jazz}\ndata: {name: A, yearOfRelease: nineteen}\n",
    );
    let error = read[0].as_ref().expect_err("not a number");
    assert!(
        error
            .message
            .contains("data.yearOfRelease: invalid digit found in string (expected an integer)"),
        "{error:?}"
    );
}
