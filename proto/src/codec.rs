//! The YAML/JSON ↔ `Resource` codec that `resctl` and the dashboard share. It is built from
//! `ClusterService.ListTypes` (the registry and its descriptor set), so every type the server
//! knows can be read and written without recompiling.
//!
//! A resource document (DESIGN §9):
//!
//! ```yaml
//! type: demo.v2.Album            # GVK, or a unique kind such as Album
//! name: kind-of-blue
//! tenancy: {partition: default, namespace: default}   # optional
//! owner: {type: demo.v2.Artist, name: miles-davis}    # optional; uid optional
//! metadata: {finalizers: demo.resd.io/cleanup}        # optional
//! data:                          # the protobuf JSON mapping of the type's message
//!   name: Kind of Blue
//!   yearOfRelease: 1959
//! ```
//!
//! Rendering adds what the server keeps (`uid`, `version`, `generation`, `status`); reading
//! accepts them too, so rendered documents read back to the same resource.

use std::collections::BTreeMap;

use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, SerializeOptions};
use serde::{Deserialize, Serialize};

use crate::cluster::v1::{ListTypesResponse, Scope, TypeInfo};
use crate::resource::v1::{Id, Resource, Status, Tenancy, Type};

/// What went wrong with one document (numbered from 1 in multi-document input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", document.map(|d| format!("document {d}: ")).unwrap_or_default())]
pub struct CodecError {
    pub document: Option<usize>,
    /// The document names a type the server does not publish (yet): a Type applied in the
    /// same run may register it.
    pub unregistered_type: bool,
    pub message: String,
}

impl CodecError {
    pub fn new(message: impl Into<String>) -> Self {
        CodecError {
            document: None,
            unregistered_type: false,
            message: message.into(),
        }
    }

    fn unregistered(message: String) -> Self {
        CodecError {
            unregistered_type: true,
            ..CodecError::new(message)
        }
    }

    fn in_document(mut self, document: usize) -> Self {
        self.document = Some(document);
        self
    }
}

/// The document shape, as serde sees it.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(rename = "type")]
    resource_type: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenancy: Option<TenancyDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<OwnerDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    status: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenancyDocument {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    partition: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    namespace: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerDocument {
    #[serde(rename = "type")]
    resource_type: String,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenancy: Option<TenancyDocument>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
}

/// Turns documents into resources and back, for the types one server publishes.
#[derive(Debug, Clone)]
pub struct Codec {
    pool: DescriptorPool,
    types: Vec<TypeInfo>,
}

pub fn gvk(resource_type: &Type) -> String {
    format!(
        "{}.{}.{}",
        resource_type.group, resource_type.group_version, resource_type.kind
    )
}

/// Which field of `value` (a JSON object for `descriptor`) does not decode, and why, in words:
/// `data.yearOfRelease: invalid digit found in string (expected an integer)`, or for an enum
/// the values it takes. `None` when no single field is to blame.
fn explain_data_error(
    descriptor: &prost_reflect::MessageDescriptor,
    value: &serde_json::Value,
    path: &str,
) -> Option<String> {
    use prost_reflect::Kind;
    let object = value.as_object()?;
    for (key, field_value) in object {
        let field = descriptor
            .get_field_by_json_name(key)
            .or_else(|| descriptor.get_field_by_name(key))?;
        let alone =
            serde_json::Value::Object([(key.clone(), field_value.clone())].into_iter().collect());
        let Err(error) = DynamicMessage::deserialize_with_options(
            descriptor.clone(),
            alone,
            &DeserializeOptions::new().deny_unknown_fields(true),
        ) else {
            continue;
        };
        let here = format!("{path}.{key}");
        let expected = match field.kind() {
            Kind::Message(inner) => {
                let nested = match field_value {
                    serde_json::Value::Array(items) if field.is_list() => {
                        items.iter().enumerate().find_map(|(i, item)| {
                            explain_data_error(&inner, item, &format!("{here}[{i}]"))
                        })
                    }
                    _ => explain_data_error(&inner, field_value, &here),
                };
                if let Some(nested) = nested {
                    return Some(nested);
                }
                format!("an object ({})", inner.full_name())
            }
            Kind::Enum(values) => format!(
                "one of {}",
                values
                    .values()
                    .map(|v| v.name().to_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Kind::Bool => "true or false".to_owned(),
            Kind::String => "a string".to_owned(),
            Kind::Bytes => "base64 bytes".to_owned(),
            Kind::Float | Kind::Double => "a number".to_owned(),
            _ => "an integer".to_owned(),
        };
        let expected = if field.is_list() {
            format!("a list of {expected}")
        } else {
            expected
        };
        return Some(format!("{here}: {error} (expected {expected})"));
    }
    None
}

/// How new a version name is, kubernetes-style: `v2` > `v1` > `v1beta2` > `v1beta1` >
/// `v1alpha1`; a name that is not of that shape ranks below all of them.
pub fn version_rank(version: &str) -> (u32, u8, u32) {
    let Some(rest) = version.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let Ok(major) = rest[..digits].parse::<u32>() else {
        return (0, 0, 0);
    };
    let suffix = &rest[digits..];
    let (stage, number) = if suffix.is_empty() {
        (3, 0)
    } else if let Some(n) = suffix.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = suffix.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else {
        (0, 0)
    };
    (major, stage, number)
}

impl Codec {
    pub fn new(types: ListTypesResponse) -> Result<Codec, CodecError> {
        let pool = DescriptorPool::decode(types.file_descriptor_set.as_ref()).map_err(|error| {
            CodecError::new(format!(
                "the server's descriptor set is unreadable: {error}"
            ))
        })?;
        Ok(Codec {
            pool,
            types: types.types,
        })
    }

    /// Every registered type.
    pub fn types(&self) -> &[TypeInfo] {
        &self.types
    }

    /// The registered type a name means: a GVK (`demo.v2.Artist`) or a kind registered once
    /// (`Album` when only one version exists). Ambiguous kinds list their candidates.
    /// A type by `group.version.Kind`, or by a kind: the one type with that kind, or — when
    /// every type with it is a version of one group — the newest version (`v2` over `v1`,
    /// stable over `beta` over `alpha`); a kind in several groups lists the candidates.
    pub fn resolve_type(&self, name: &str) -> Result<&TypeInfo, CodecError> {
        if name.contains('.') {
            return self
                .types
                .iter()
                .find(|info| info.r#type.as_ref().map(gvk).as_deref() == Some(name))
                .ok_or_else(|| {
                    let kind = name.rsplit('.').next().unwrap_or(name);
                    let similar = self.with_kind(kind);
                    let hint = if similar.is_empty() {
                        "`resctl types` lists the registered types".to_owned()
                    } else {
                        format!("did you mean {}?", similar.join(" or "))
                    };
                    CodecError::unregistered(format!("{name} is not registered ({hint})"))
                });
        }
        let matches: Vec<&TypeInfo> = self
            .types
            .iter()
            .filter(|info| {
                info.r#type
                    .as_ref()
                    .is_some_and(|t| t.kind.eq_ignore_ascii_case(name))
            })
            .collect();
        let one_group = matches
            .iter()
            .filter_map(|info| info.r#type.as_ref().map(|t| t.group.as_str()))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == 1;
        match matches.as_slice() {
            [only] => Ok(only),
            [] => Err(CodecError::unregistered(format!(
                "no registered type has the kind {name:?}: `resctl types` lists them"
            ))),
            // Versions of one group: the newest, as kubectl picks the preferred version.
            many if one_group => Ok(many
                .iter()
                .copied()
                .max_by_key(|info| {
                    version_rank(
                        info.r#type
                            .as_ref()
                            .map(|t| t.group_version.as_str())
                            .unwrap_or_default(),
                    )
                })
                .unwrap_or(many[0])),
            many => Err(CodecError::new(format!(
                "the kind {name:?} is ambiguous: use one of {}",
                many.iter()
                    .filter_map(|info| info.r#type.as_ref().map(gvk))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// What ListTypes said of `resource_type` (exactly that version).
    pub fn type_info(&self, resource_type: &Type) -> Option<&TypeInfo> {
        self.types
            .iter()
            .find(|info| info.r#type.as_ref() == Some(resource_type))
    }

    fn with_kind(&self, kind: &str) -> Vec<String> {
        self.types
            .iter()
            .filter_map(|info| info.r#type.as_ref())
            .filter(|t| t.kind.eq_ignore_ascii_case(kind))
            .map(gvk)
            .collect()
    }

    /// Reads every document of a (multi-document) YAML text. Empty documents are skipped; each
    /// result says which document it came from.
    pub fn read_yaml(&self, text: &str) -> Vec<Result<Resource, CodecError>> {
        self.read_yaml_from(text, None)
    }

    /// [`Codec::read_yaml`] of a file in `base` (a directory): a `registry.v1.Type` document's
    /// `data.protoFile` names its `.proto` source relative to it (else to the current
    /// directory), and is replaced by the file's text as `data.proto`.
    pub fn read_yaml_from(
        &self,
        text: &str,
        base: Option<&std::path::Path>,
    ) -> Vec<Result<Resource, CodecError>> {
        let mut results = Vec::new();
        for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let number = index + 1;
            let value = match serde_json::Value::deserialize(document) {
                Ok(serde_json::Value::Null) => continue,
                Ok(value) => value,
                Err(error) => {
                    results.push(Err(
                        CodecError::new(format!("not valid YAML: {error}")).in_document(number)
                    ));
                    // A syntax error leaves the parser where it cannot find the next document
                    // (it would report the same error forever).
                    break;
                }
            };
            // `get -o json|yaml` of several resources prints a list (or `{items: [...]}`):
            // each element is a document of its own.
            let items = match value {
                serde_json::Value::Array(items) => items,
                serde_json::Value::Object(mut map)
                    if !map.contains_key("type")
                        && map.get("items").is_some_and(|i| i.is_array()) =>
                {
                    match map.remove("items") {
                        Some(serde_json::Value::Array(items)) => items,
                        _ => Vec::new(),
                    }
                }
                value => vec![value],
            };
            let several = items.len() > 1;
            for (position, mut item) in items.into_iter().enumerate() {
                let read = inline_proto_file(&mut item, base).and_then(|()| self.read_value(item));
                results.push(read.map_err(|error| {
                    let error = if several {
                        CodecError::new(format!("item {}: {}", position + 1, error.message))
                    } else {
                        error
                    };
                    error.in_document(number)
                }));
            }
        }
        results
    }

    /// Reads one document given as JSON (or any serde value). A `registry.v1.Type` document's
    /// `data.protoFile` must have been inlined ([`Codec::read_yaml_from`]).
    pub fn read_value(&self, value: serde_json::Value) -> Result<Resource, CodecError> {
        let document: Document =
            serde_json::from_value(value).map_err(|error| CodecError::new(error.to_string()))?;
        let info = self.resolve_type(&document.resource_type)?;
        let resource_type = info.r#type.clone().unwrap_or_default();
        let data = match document.data {
            None => None,
            Some(value) => {
                let descriptor = self
                    .pool
                    .get_message_by_name(&info.message_name)
                    .ok_or_else(|| {
                        CodecError::new(format!(
                            "the server did not publish the message {}",
                            info.message_name
                        ))
                    })?;
                let message = DynamicMessage::deserialize_with_options(
                    descriptor.clone(),
                    value.clone(),
                    &DeserializeOptions::new().deny_unknown_fields(true),
                )
                .map_err(|error| {
                    let detail = explain_data_error(&descriptor, &value, "data")
                        .unwrap_or_else(|| format!("data: {error}"));
                    CodecError::new(format!("{detail} (as {})", info.message_name))
                })?;
                Some(prost_types::Any {
                    type_url: format!("{}{}", crate::TYPE_URL_PREFIX, info.message_name),
                    value: message.encode_to_vec(),
                })
            }
        };
        let owner = match document.owner {
            None => None,
            Some(owner) => {
                let owner_type = self
                    .resolve_type(&owner.resource_type)?
                    .r#type
                    .clone()
                    .unwrap_or_default();
                Some(Id {
                    uid: owner.uid.unwrap_or_default(),
                    name: owner.name,
                    r#type: Some(owner_type),
                    tenancy: Some(tenancy_of(owner.tenancy)),
                })
            }
        };
        let mut status = BTreeMap::new();
        for (key, value) in document.status {
            status.insert(
                key.clone(),
                self.read_status(value)
                    .map_err(|e| CodecError::new(format!("status.{key}: {}", e.message)))?,
            );
        }
        Ok(Resource {
            id: Some(Id {
                uid: document.uid.unwrap_or_default(),
                name: document.name,
                r#type: Some(resource_type),
                tenancy: Some(tenancy_of(document.tenancy)),
            }),
            owner,
            version: document.version.unwrap_or_default(),
            generation: document.generation.unwrap_or_default(),
            metadata: document.metadata,
            status,
            data,
        })
    }

    fn read_status(&self, value: serde_json::Value) -> Result<Status, CodecError> {
        let descriptor = self
            .pool
            .get_message_by_name("resd.resource.v1.Status")
            .ok_or_else(|| CodecError::new("the server did not publish resd.resource.v1.Status"))?;
        let message = DynamicMessage::deserialize_with_options(
            descriptor,
            value,
            &DeserializeOptions::new().deny_unknown_fields(true),
        )
        .map_err(|error| CodecError::new(error.to_string()))?;
        Status::decode(message.encode_to_vec().as_slice())
            .map_err(|error| CodecError::new(error.to_string()))
    }

    /// A resource as a document value (the shape `read_value` reads).
    pub fn to_value(&self, resource: &Resource) -> Result<serde_json::Value, CodecError> {
        self.value_of(resource, true)
    }

    /// Like [`Codec::to_yaml`], with the fields at their default value written out too
    /// (`criticallyAcclaimed: false`): what a diff shows, so that a field set back to its
    /// default appears as a change rather than only as a line gone.
    pub fn to_yaml_with_defaults(&self, resource: &Resource) -> Result<String, CodecError> {
        serde_yaml_ng::to_string(&self.value_of(resource, false)?)
            .map_err(|error| CodecError::new(error.to_string()))
    }

    fn value_of(
        &self,
        resource: &Resource,
        skip_defaults: bool,
    ) -> Result<serde_json::Value, CodecError> {
        let id = resource.id.clone().unwrap_or_default();
        let resource_type = id.r#type.clone().unwrap_or_default();
        let options = SerializeOptions::new().skip_default_fields(skip_defaults);
        let data = match &resource.data {
            None => None,
            Some(any) => {
                let name = any.type_url.rsplit('/').next().unwrap_or_default();
                let descriptor = self
                    .pool
                    .get_message_by_name(name)
                    .ok_or_else(|| CodecError::new(format!("unknown data message {name}")))?;
                let message = DynamicMessage::decode(descriptor, any.value.as_slice())
                    .map_err(|error| CodecError::new(format!("data: {error}")))?;
                Some(
                    message
                        .serialize_with_options(serde_json::value::Serializer, &options)
                        .map_err(|error| CodecError::new(format!("data: {error}")))?,
                )
            }
        };
        let status_descriptor = self
            .pool
            .get_message_by_name("resd.resource.v1.Status")
            .ok_or_else(|| CodecError::new("the server did not publish resd.resource.v1.Status"))?;
        let mut status = BTreeMap::new();
        for (key, value) in &resource.status {
            let message =
                DynamicMessage::decode(status_descriptor.clone(), value.encode_to_vec().as_slice())
                    .map_err(|error| CodecError::new(error.to_string()))?;
            status.insert(
                key.clone(),
                message
                    .serialize_with_options(serde_json::value::Serializer, &options)
                    .map_err(|error| CodecError::new(error.to_string()))?,
            );
        }
        let document = Document {
            resource_type: gvk(&resource_type),
            name: id.name.clone(),
            uid: Some(id.uid.clone()).filter(|uid| !uid.is_empty()),
            tenancy: tenancy_document(id.tenancy.as_ref()),
            owner: resource.owner.as_ref().map(|owner| OwnerDocument {
                resource_type: owner.r#type.as_ref().map(gvk).unwrap_or_default(),
                name: owner.name.clone(),
                tenancy: tenancy_document(owner.tenancy.as_ref()),
                uid: Some(owner.uid.clone()).filter(|uid| !uid.is_empty()),
            }),
            version: Some(resource.version.clone()).filter(|v| !v.is_empty()),
            generation: Some(resource.generation.clone()).filter(|g| !g.is_empty()),
            metadata: resource.metadata.clone(),
            data,
            status,
        };
        serde_json::to_value(document).map_err(|error| CodecError::new(error.to_string()))
    }

    pub fn to_yaml(&self, resource: &Resource) -> Result<String, CodecError> {
        serde_yaml_ng::to_string(&self.to_value(resource)?)
            .map_err(|error| CodecError::new(error.to_string()))
    }

    pub fn to_json(&self, resource: &Resource) -> Result<String, CodecError> {
        serde_json::to_string(&self.to_value(resource)?)
            .map_err(|error| CodecError::new(error.to_string()))
    }

    /// The descriptor of a data message the server published.
    pub fn message_descriptor(&self, name: &str) -> Option<prost_reflect::MessageDescriptor> {
        self.pool.get_message_by_name(name)
    }

    /// The scope of a registered type.
    /// Whether two `data` payloads hold the same message, compared decoded (so two encodings
    /// of equal values are equal).
    pub fn same_data(&self, a: Option<&prost_types::Any>, b: Option<&prost_types::Any>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) if a.type_url == b.type_url => {
                if a.value == b.value {
                    return true;
                }
                let name = a.type_url.rsplit('/').next().unwrap_or_default();
                let Some(descriptor) = self.pool.get_message_by_name(name) else {
                    return false;
                };
                match (
                    DynamicMessage::decode(descriptor.clone(), a.value.as_slice()),
                    DynamicMessage::decode(descriptor, b.value.as_slice()),
                ) {
                    (Ok(a), Ok(b)) => a == b,
                    _ => false,
                }
            }
            _ => false,
        }
    }

    pub fn scope(&self, resource_type: &Type) -> Option<Scope> {
        self.types
            .iter()
            .find(|info| info.r#type.as_ref() == Some(resource_type))
            .and_then(|info| Scope::try_from(info.scope).ok())
    }
}

fn tenancy_of(document: Option<TenancyDocument>) -> Tenancy {
    let document = document.unwrap_or_default();
    Tenancy {
        partition: document.partition,
        namespace: document.namespace,
    }
}

fn tenancy_document(tenancy: Option<&Tenancy>) -> Option<TenancyDocument> {
    tenancy
        .filter(|t| !t.partition.is_empty() || !t.namespace.is_empty())
        .map(|t| TenancyDocument {
            partition: t.partition.clone(),
            namespace: t.namespace.clone(),
        })
}

#[cfg(test)]
mod tests;

/// Replaces `data.protoFile` of a `registry.v1.Type` document (and `protoFile` of each of
/// its `data.versions`) by the file's text as `proto` (DESIGN §15, §15.1), the path relative
/// to `base`.
fn inline_proto_file(
    document: &mut serde_json::Value,
    base: Option<&std::path::Path>,
) -> Result<(), CodecError> {
    let is_type = document.get("type").and_then(|t| t.as_str()) == Some("registry.v1.Type");
    let Some(data) = document
        .get_mut("data")
        .and_then(|d| d.as_object_mut())
        .filter(|_| is_type)
    else {
        return Ok(());
    };
    inline_one(data, "data", base)?;
    if let Some(versions) = data.get_mut("versions").and_then(|v| v.as_array_mut()) {
        for (index, version) in versions.iter_mut().enumerate() {
            if let Some(version) = version.as_object_mut() {
                inline_one(version, &format!("data.versions[{index}]"), base)?;
            }
        }
    }
    Ok(())
}

/// `protoFile` of one object (`at` names it in errors) read into `proto`.
fn inline_one(
    object: &mut serde_json::Map<String, serde_json::Value>,
    at: &str,
    base: Option<&std::path::Path>,
) -> Result<(), CodecError> {
    let Some(file) = object.remove("protoFile") else {
        return Ok(());
    };
    let Some(file) = file.as_str() else {
        return Err(CodecError::new(format!(
            "{at}.protoFile must be a path (a string)"
        )));
    };
    if object.contains_key("proto") {
        return Err(CodecError::new(format!(
            "{at}.proto and {at}.protoFile are both given: keep one"
        )));
    }
    let path = match base {
        Some(base) => base.join(file),
        None => std::path::PathBuf::from(file),
    };
    let text = std::fs::read_to_string(&path).map_err(|error| {
        CodecError::new(format!(
            "{at}.protoFile: cannot read {}: {error}",
            path.display()
        ))
    })?;
    object.insert("proto".into(), serde_json::Value::String(text));
    Ok(())
}

/// `string`, `repeated int64`, `map<string, int32>`, `resd.payments.v1.Line`: a field's type as
/// the `.proto` spells it.
pub fn field_type_name(field: &prost_reflect::FieldDescriptor) -> String {
    use prost_reflect::Kind;
    fn scalar(kind: &Kind) -> String {
        match kind {
            Kind::Double => "double".into(),
            Kind::Float => "float".into(),
            Kind::Int32 => "int32".into(),
            Kind::Int64 => "int64".into(),
            Kind::Uint32 => "uint32".into(),
            Kind::Uint64 => "uint64".into(),
            Kind::Sint32 => "sint32".into(),
            Kind::Sint64 => "sint64".into(),
            Kind::Fixed32 => "fixed32".into(),
            Kind::Fixed64 => "fixed64".into(),
            Kind::Sfixed32 => "sfixed32".into(),
            Kind::Sfixed64 => "sfixed64".into(),
            Kind::Bool => "bool".into(),
            Kind::String => "string".into(),
            Kind::Bytes => "bytes".into(),
            Kind::Message(m) => m.full_name().into(),
            Kind::Enum(e) => e.full_name().into(),
        }
    }
    if field.is_map()
        && let Kind::Message(entry) = field.kind()
    {
        let key = entry.map_entry_key_field();
        let value = entry.map_entry_value_field();
        return format!("map<{}, {}>", scalar(&key.kind()), scalar(&value.kind()));
    }
    if field.is_list() {
        return format!("repeated {}", scalar(&field.kind()));
    }
    scalar(&field.kind())
}

/// The comment above a declaration in its `.proto` file (when the descriptor set kept source
/// info), trimmed: what `resctl explain` shows.
pub fn leading_comment(file: &prost_types::FileDescriptorProto, path: &[i32]) -> Option<String> {
    let location = file
        .source_code_info
        .as_ref()?
        .location
        .iter()
        .find(|location| location.path == path)?;
    let text = location.leading_comments();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    (!lines.is_empty()).then(|| lines.join(" "))
}
