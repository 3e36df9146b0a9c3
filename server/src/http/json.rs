//! Protobuf messages to and from JSON (the protobuf JSON mapping) through the descriptors the
//! registry publishes (built-in and registered types), so `data` (an `Any`) reads and writes
//! as the type's own fields with `@type`.

use prost::Message as _;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, SerializeOptions};

fn descriptor(
    pool: &DescriptorPool,
    name: &str,
) -> Result<prost_reflect::MessageDescriptor, String> {
    pool.get_message_by_name(name)
        .ok_or_else(|| format!("the descriptors do not define {name}"))
}

/// A message as protobuf JSON (`name` is its full protobuf name).
pub(super) fn to_json<M: prost::Message>(
    pool: &DescriptorPool,
    message: &M,
    name: &str,
) -> Result<serde_json::Value, String> {
    let dynamic =
        DynamicMessage::decode(descriptor(pool, name)?, message.encode_to_vec().as_slice())
            .map_err(|error| format!("cannot convert {name}: {error}"))?;
    dynamic
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().skip_default_fields(true),
        )
        .map_err(|error| format!("cannot convert {name} to JSON: {error}"))
}

/// A message from protobuf JSON; unknown fields are errors that name them.
pub(super) fn from_json<M: prost::Message + Default>(
    pool: &DescriptorPool,
    value: serde_json::Value,
    name: &str,
) -> Result<M, String> {
    let dynamic = DynamicMessage::deserialize_with_options(
        descriptor(pool, name)?,
        value,
        &DeserializeOptions::new(),
    )
    .map_err(|error| error.to_string())?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|error| error.to_string())
}

/// The `@type` of `data` holding the message `message_name` (e.g. `resd.demo.v2.Artist`).
pub(super) fn type_url(message_name: &str) -> String {
    format!("type.googleapis.com/{message_name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::resource::v1::{Id, Resource, Tenancy, Type};

    #[test]
    fn a_resource_round_trips_with_its_data_as_fields() {
        let value = serde_json::json!({
            "id": {
                "type": {"group": "demo", "groupVersion": "v2", "kind": "Artist"},
                "tenancy": {"partition": "default", "namespace": "default"},
                "name": "nina"
            },
            "data": {"@type": "type.googleapis.com/resd.demo.v2.Artist", "name": "Nina Simone"}
        });
        let pool = DescriptorPool::decode(proto::FILE_DESCRIPTOR_SET).expect("pool");
        let resource: Resource =
            from_json(&pool, value.clone(), "resd.resource.v1.Resource").expect("decodes");
        assert_eq!(
            resource.id,
            Some(Id {
                uid: String::new(),
                name: "nina".into(),
                r#type: Some(Type {
                    group: "demo".into(),
                    group_version: "v2".into(),
                    kind: "Artist".into()
                }),
                tenancy: Some(Tenancy {
                    partition: "default".into(),
                    namespace: "default".into()
                }),
            })
        );
        let back = to_json(&pool, &resource, "resd.resource.v1.Resource").expect("encodes");
        assert_eq!(back, value);
        let error = from_json::<Resource>(
            &pool,
            serde_json::json!({"id": {"nmae": "x"}}),
            "resd.resource.v1.Resource",
        )
        .expect_err("unknown field");
        assert!(error.contains("nmae"), "{error}");
    }
}
