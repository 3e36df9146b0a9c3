//! Protobuf written and read by hand, where building or decoding whole messages would copy
//! what is already encoded: the framing of a length-delimited field, partial views of a stored
//! `Resource` (its id; its id and version; everything but its data), and fields read in place.
//!
//! Each piece is tested byte for byte against what prost writes and reads for the generated
//! message.

use bytes::BufMut;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use proto::resource::v1::{Id, Resource};

use crate::storage::StorageError;

/// `ListResponse.resources` and `ReadResponse.resource`: field 1 of the answers that carry
/// stored resources.
pub(crate) const RESOURCE_FIELD: u32 = 1;

/// The bytes a length-delimited field of `len` bytes takes, with its key and length.
pub(crate) fn field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A length-delimited field's key and length; its `len` bytes follow.
pub(crate) fn put_field_header<B: BufMut>(tag: u32, len: usize, dst: &mut B) {
    encode_key(tag, WireType::LengthDelimited, dst);
    encode_varint(len as u64, dst);
}

/// A length-delimited field: key, length, bytes (an embedded message already encoded, or a
/// string's bytes).
pub(crate) fn put_bytes_field<B: BufMut>(tag: u32, bytes: &[u8], dst: &mut B) {
    put_field_header(tag, bytes.len(), dst);
    dst.put_slice(bytes);
}

/// A resource's first field, its id: prost skips the rest of an encoding without decoding it.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct IdOnly {
    #[prost(message, optional, tag = "1")]
    pub id: Option<Id>,
}

/// A resource's metadata (field 5 of `Resource`): what a selector reads of a stored resource,
/// the rest skipped without copying.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MetadataOnly {
    #[prost(btree_map = "string, string", tag = "5")]
    pub(crate) metadata: std::collections::BTreeMap<String, String>,
}

/// A resource's id and version: what a watch's snapshot needs to find an event another watcher
/// holds for the same version, without decoding the rest.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct IdAndVersion {
    #[prost(message, optional, tag = "1")]
    pub id: Option<Id>,
    #[prost(string, tag = "3")]
    pub version: String,
}

/// A resource without its data (fields 1 to 6 of `Resource`, the same tags and types): what
/// the compare-and-swap check and the owner index read of a stored resource. prost skips the
/// data field without copying it.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceHead {
    #[prost(message, optional, tag = "1")]
    pub id: Option<Id>,
    #[prost(message, optional, tag = "2")]
    pub owner: Option<Id>,
    #[prost(string, tag = "3")]
    pub version: String,
    #[prost(string, tag = "4")]
    pub generation: String,
    #[prost(btree_map = "string, string", tag = "5")]
    pub metadata: std::collections::BTreeMap<String, String>,
    #[prost(btree_map = "string, message", tag = "6")]
    pub status: std::collections::BTreeMap<String, proto::resource::v1::Status>,
}

impl ResourceHead {
    /// The resource it heads, with no data.
    pub(crate) fn into_resource(self) -> Resource {
        let ResourceHead {
            id,
            owner,
            version,
            generation,
            metadata,
            status,
        } = self;
        Resource {
            id,
            owner,
            version,
            generation,
            metadata,
            status,
            data: None,
        }
    }
}

/// The group version (`id.type.group_version`) of an encoded resource, read in place: no
/// string is decoded or copied. As a decoder would see it: the last occurrence wins (repeated
/// embedded messages merge). `None` when the resource names no type.
pub(crate) fn encoded_group_version(resource: &[u8]) -> Result<Option<&[u8]>, StorageError> {
    let damaged = |error: String| {
        StorageError::Internal(format!("a stored resource does not decode: {error}"))
    };
    let mut found = None;
    for id in length_delimited(resource, 1) {
        for resource_type in length_delimited(id.map_err(damaged)?, 3) {
            for group_version in length_delimited(resource_type.map_err(damaged)?, 2) {
                found = Some(group_version.map_err(damaged)?);
            }
        }
    }
    Ok(found)
}

/// The length-delimited occurrences of field `tag` in an encoded message, borrowed; every other
/// field is skipped. Ends with an error where the message does not decode.
pub(crate) fn length_delimited(
    mut message: &[u8],
    tag: u64,
) -> impl Iterator<Item = Result<&[u8], String>> {
    let decode_varint = |message: &mut &[u8]| {
        prost::encoding::decode_varint(message).map_err(|error| error.to_string())
    };
    let truncated = || "a field runs past the end of its message".to_owned();
    let mut failed = false;
    std::iter::from_fn(move || {
        while !failed && !message.is_empty() {
            let step = (|| {
                let key = decode_varint(&mut message)?;
                let len = match key & 7 {
                    0 => {
                        decode_varint(&mut message)?;
                        return Ok(None);
                    }
                    1 => 8,
                    2 => usize::try_from(decode_varint(&mut message)?).map_err(|_| truncated())?,
                    5 => 4,
                    wire_type => return Err(format!("unexpected wire type {wire_type}")),
                };
                let (field, rest) = message.split_at_checked(len).ok_or_else(truncated)?;
                message = rest;
                Ok((key & 7 == 2 && key >> 3 == tag).then_some(field))
            })();
            match step {
                Ok(Some(field)) => return Some(Ok(field)),
                Ok(None) => {}
                Err(error) => {
                    failed = true;
                    return Some(Err(error));
                }
            }
        }
        None
    })
}

/// A `resd.resource.v1.HistoryEntry` written straight from its parts, the resource borrowed
/// (apply keeps every version without copying it into a message first); byte for byte what
/// prost writes (`storage::history`'s test compares them).
pub(crate) fn history_entry(
    buf: &mut Vec<u8>,
    resource: &Resource,
    actor: &str,
    time: &prost_types::Timestamp,
    operation: i32,
    version: &str,
) {
    use prost::encoding::{int32, message, string};
    message::encode(1, resource, buf);
    if !actor.is_empty() {
        string::encode(2, &actor.to_owned(), buf);
    }
    message::encode(3, time, buf);
    if operation != 0 {
        int32::encode(4, &operation, buf);
    }
    if !version.is_empty() {
        string::encode(5, &version.to_owned(), buf);
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;
    use proto::resource::v1::{Condition, Status};

    use super::*;
    use crate::storage::conformance::Fixture;

    #[test]
    fn the_group_version_read_in_place_is_the_one_a_decoder_sees() {
        let fixture = Fixture::new();
        let artist = fixture.artist("in-place");
        let encoded = artist.encode_to_vec();
        assert_eq!(encoded_group_version(&encoded).unwrap(), Some(&b"v2"[..]));
        // Fields before the id, and a second id whose type says otherwise: embedded messages
        // merge, the last group version wins.
        let mut later = artist.clone();
        later
            .id
            .as_mut()
            .unwrap()
            .r#type
            .as_mut()
            .unwrap()
            .group_version = "v1".into();
        later.version = "7".into();
        let mut merged = later.encode_to_vec();
        merged.extend_from_slice(&encoded);
        let decoded = Resource::decode(merged.as_slice()).unwrap();
        assert_eq!(decoded.id.unwrap().r#type.unwrap().group_version, "v2");
        assert_eq!(encoded_group_version(&merged).unwrap(), Some(&b"v2"[..]));
        // No type at all, and nothing at all.
        let mut untyped = artist.clone();
        untyped.id.as_mut().unwrap().r#type = None;
        assert_eq!(
            encoded_group_version(&untyped.encode_to_vec()).unwrap(),
            None
        );
        assert_eq!(encoded_group_version(b"").unwrap(), None);
        // Cut anywhere inside the id: an error, never a panic or a wrong answer.
        let id_end = 2 + artist.id.as_ref().unwrap().encoded_len();
        for cut in 1..id_end {
            assert!(
                encoded_group_version(&encoded[..cut]).is_err(),
                "cut at {cut} of {id_end}"
            );
        }
        assert!(encoded_group_version(b"\x0f").is_err(), "wire type 7");
    }

    #[test]
    fn a_resource_head_is_the_resource_without_its_data() {
        let fixture = Fixture::new();
        let mut resource = fixture.artist("head");
        resource.owner = fixture.artist("owner").id;
        resource.data = Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.demo.v2.Artist".into(),
            value: vec![0x12, 3, b'a', b'b', b'c'],
        });
        resource.version = "12.3".into();
        resource.generation = "01J000000000000000000000GN".into();
        resource
            .metadata
            .insert("finalizers".into(), "example.com/a".into());
        resource.status.insert(
            "consumer".into(),
            Status {
                observed_generation: "01J000000000000000000000GN".into(),
                conditions: vec![Condition {
                    r#type: "Ready".into(),
                    ..Default::default()
                }],
                updated_at: None,
            },
        );
        let head = ResourceHead::decode(resource.encode_to_vec().as_slice()).unwrap();
        let expected = Resource {
            data: None,
            ..resource
        };
        assert_eq!(head.into_resource(), expected);
    }

    #[test]
    fn framed_resources_are_the_answers_prost_writes() {
        use proto::resource::v1::{ListResponse, ReadResponse};

        let fixture = Fixture::new();
        let small = fixture.artist("small");
        let mut large = fixture.artist("large");
        // Lengths on both sides of each varint width.
        large.metadata.insert("pad".into(), "x".repeat(20_000));
        for resource in [&small, &large, &Resource::default()] {
            let encoded = resource.encode_to_vec();
            let mut framed = Vec::new();
            put_bytes_field(RESOURCE_FIELD, &encoded, &mut framed);
            let read = ReadResponse {
                resource: Some(resource.clone()),
            };
            assert_eq!(framed, read.encode_to_vec());
            assert_eq!(field_len(RESOURCE_FIELD, encoded.len()), framed.len());
        }
        let mut list = Vec::new();
        for resource in [&small, &large] {
            put_bytes_field(RESOURCE_FIELD, &resource.encode_to_vec(), &mut list);
        }
        let answer = ListResponse {
            resources: vec![small.clone(), large.clone()],
            ..ListResponse::default()
        };
        assert_eq!(list, answer.encode_to_vec());
    }

    #[test]
    fn field_framing_is_prosts_for_every_key_and_length_width() {
        for tag in [1, 6, 15, 16, 2047, 2048] {
            for len in [0, 1, 127, 128, 16_383, 16_384] {
                let bytes = vec![7u8; len];
                let mut ours = Vec::new();
                put_bytes_field(tag, &bytes, &mut ours);
                let mut prosts = Vec::new();
                prost::encoding::bytes::encode(tag, &bytes, &mut prosts);
                assert_eq!(ours, prosts, "tag {tag}, {len} bytes");
                assert_eq!(field_len(tag, len), ours.len(), "tag {tag}, {len} bytes");
            }
        }
    }

    #[test]
    fn partial_views_read_what_the_whole_resource_holds() {
        let fixture = Fixture::new();
        let mut resource = fixture.artist("partial");
        resource.version = "41.2".into();
        let encoded = resource.encode_to_vec();
        assert_eq!(IdOnly::decode(encoded.as_slice()).unwrap().id, resource.id);
        let head = IdAndVersion::decode(encoded.as_slice()).unwrap();
        assert_eq!(
            (head.id, head.version),
            (resource.id.clone(), resource.version)
        );
    }

    #[test]
    fn fields_read_in_place_are_the_ones_prost_decodes() {
        let fixture = Fixture::new();
        let mut resource = fixture.artist("fields");
        resource.owner = fixture.artist("owner").id;
        let encoded = resource.encode_to_vec();
        let ids: Vec<&[u8]> = length_delimited(&encoded, 1).map(Result::unwrap).collect();
        assert_eq!(
            ids,
            vec![resource.id.as_ref().unwrap().encode_to_vec().as_slice()]
        );
        let owners: Vec<&[u8]> = length_delimited(&encoded, 2).map(Result::unwrap).collect();
        assert_eq!(
            owners,
            vec![resource.owner.as_ref().unwrap().encode_to_vec().as_slice()]
        );
    }
}
