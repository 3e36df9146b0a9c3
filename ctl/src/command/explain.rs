//! `resctl explain TYPE[.field…]` (DESIGN §15, §15.1): a type's schema as the server publishes
//! it — each field with its JSON name, its type (an enum's values), its default and the comment
//! above it in the `.proto`, like `kubectl explain` — and for a registered type its rules and
//! the versions its Type serves.

use prost_reflect::{Kind, MessageDescriptor};
use proto::codec::{Codec, field_type_name, gvk, leading_comment};
use serde::Serialize;

use crate::cli::ExplainArgs;
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

/// What `explain` says of a type or a field.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    #[serde(rename = "type")]
    pub resource_type: String,
    /// The field path explained (empty: the type's data message).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
    /// The field's type, or the data message's name.
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The fields of the message explained (none for a scalar field).
    pub fields: Vec<FieldRow>,
    /// An enum field's values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// The field's default (JSON text), for a registered type.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default: String,
    /// The rules of this version of a registered type (on the field explained, or all).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleRow>,
    /// The versions of its Type (a registered type).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<VersionRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RuleRow {
    pub expression: String,
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct VersionRow {
    pub name: String,
    pub served: bool,
    pub storage: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deprecated: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct FieldRow {
    pub name: String,
    /// The name YAML and JSON documents use.
    pub json_name: String,
    pub number: u32,
    #[serde(rename = "type")]
    pub kind: String,
    /// An enum's values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Its default (JSON text), for a registered type.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
}

/// An enum field's values, `NAME` each (empty for other fields).
fn enum_values(field: &prost_reflect::FieldDescriptor) -> Vec<String> {
    match field.kind() {
        Kind::Enum(values) => values.values().map(|v| v.name().to_owned()).collect(),
        _ => Vec::new(),
    }
}

/// Explains `path`: the longest prefix that names a type, then fields of its data message.
pub fn explain(codec: &Codec, path: &str) -> anyhow::Result<Explanation> {
    let parts: Vec<&str> = path.split('.').collect();
    let mut found = None;
    for end in (1..=parts.len().min(3)).rev() {
        if let Ok(info) = codec.resolve_type(&parts[..end].join(".")) {
            found = Some((info.clone(), &parts[end..]));
            break;
        }
    }
    let Some((info, fields)) = found else {
        // Say why the type part failed, as `get` would.
        let type_part = parts.first().copied().unwrap_or_default();
        codec.resolve_type(type_part)?;
        anyhow::bail!("{path:?} names no type (`resctl types` lists them)");
    };
    let resource_type = info.r#type.as_ref().map(gvk).unwrap_or_default();
    let mut message = codec
        .message_descriptor(&info.message_name)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the server did not publish the schema of {resource_type} ({})",
                info.message_name
            )
        })?;
    let mut kind = message.full_name().to_owned();
    let mut description = comment_of_message(&message);
    let mut walked = Vec::new();
    let mut scalar = false;
    let mut values = Vec::new();
    for name in fields {
        if scalar {
            anyhow::bail!("{} is a {kind}: it has no field {name}", walked.join("."));
        }
        let field = message
            .get_field_by_name(name)
            .or_else(|| message.fields().find(|f| f.json_name() == *name))
            .ok_or_else(|| {
                let known: Vec<String> = message.fields().map(|f| f.name().to_owned()).collect();
                anyhow::anyhow!(
                    "{} has no field {name:?}; its fields: {}",
                    message.full_name(),
                    known.join(", ")
                )
            })?;
        walked.push(field.name().to_owned());
        kind = field_type_name(&field);
        values = enum_values(&field);
        description = leading_comment(field.parent_file().file_descriptor_proto(), field.path())
            .unwrap_or_default();
        match field.kind() {
            Kind::Message(next) if !field.is_map() => message = next,
            _ => scalar = true,
        }
    }
    let fields = if scalar {
        Vec::new()
    } else {
        message
            .fields()
            .map(|field| FieldRow {
                name: field.name().to_owned(),
                json_name: field.json_name().to_owned(),
                number: field.number(),
                kind: field_type_name(&field),
                values: enum_values(&field),
                default: String::new(),
                description: leading_comment(
                    field.parent_file().file_descriptor_proto(),
                    field.path(),
                )
                .unwrap_or_default(),
            })
            .collect()
    };
    Ok(Explanation {
        resource_type,
        field: walked.join("."),
        kind,
        description,
        fields,
        values,
        default: String::new(),
        rules: Vec::new(),
        versions: Vec::new(),
    })
}

/// Adds what the registered type's Type says: the defaults and rules of this version (those
/// on the field explained, or all of them) and every version with its state.
pub fn add_type_details(
    explanation: &mut Explanation,
    t: &proto::registry::v1::Type,
    version: &str,
) {
    let (rules, defaults) = if t.versions.is_empty() {
        (t.rules.clone(), t.defaults.clone())
    } else {
        t.versions
            .iter()
            .find(|v| v.name == version)
            .map(|v| (v.rules.clone(), v.defaults.clone()))
            .unwrap_or_default()
    };
    let top = explanation.field.split('.').next().unwrap_or_default();
    if explanation.field.is_empty() {
        for row in &mut explanation.fields {
            if let Some(default) = defaults.iter().find(|d| d.field == row.name) {
                row.default = default.value.clone();
            }
        }
    } else if !explanation.field.contains('.')
        && let Some(default) = defaults.iter().find(|d| d.field == top)
    {
        explanation.default = default.value.clone();
    }
    explanation.rules = rules
        .into_iter()
        .filter(|rule| {
            explanation.field.is_empty()
                || rule.field == explanation.field
                || rule.field.starts_with(&format!("{}.", explanation.field))
        })
        .map(|rule| RuleRow {
            expression: rule.expression,
            message: rule.message,
            field: rule.field,
        })
        .collect();
    explanation.versions = if t.versions.is_empty() {
        vec![VersionRow {
            name: t.group_version.clone(),
            served: true,
            storage: true,
            deprecated: false,
        }]
    } else {
        t.versions
            .iter()
            .map(|v| VersionRow {
                name: v.name.clone(),
                served: v.served,
                storage: v.name == t.storage_version,
                deprecated: v.deprecated,
            })
            .collect()
    };
}

fn comment_of_message(message: &MessageDescriptor) -> String {
    leading_comment(message.parent_file_descriptor_proto(), message.path()).unwrap_or_default()
}

pub fn render(explanation: &Explanation) -> String {
    let mut text = format!("TYPE:  {}\n", explanation.resource_type);
    if explanation.field.is_empty() {
        text.push_str(&format!("DATA:  {}\n", explanation.kind));
    } else {
        text.push_str(&format!(
            "FIELD: {} <{}>\n",
            explanation.field, explanation.kind
        ));
    }
    if !explanation.versions.is_empty() {
        let versions: Vec<String> = explanation
            .versions
            .iter()
            .map(|v| {
                let mut notes = Vec::new();
                if v.storage {
                    notes.push("storage");
                }
                if !v.served {
                    notes.push("not served");
                }
                if v.deprecated {
                    notes.push("deprecated");
                }
                if notes.is_empty() {
                    v.name.clone()
                } else {
                    format!("{} ({})", v.name, notes.join(", "))
                }
            })
            .collect();
        text.push_str(&format!("VERSIONS: {}\n", versions.join(", ")));
    }
    if !explanation.values.is_empty() {
        text.push_str(&format!("VALUES: {}\n", explanation.values.join(", ")));
    }
    if !explanation.default.is_empty() {
        text.push_str(&format!("DEFAULT: {}\n", explanation.default));
    }
    if !explanation.description.is_empty() {
        text.push_str(&format!("\n{}\n", explanation.description));
    }
    if !explanation.fields.is_empty() {
        text.push_str("\nFIELDS:\n");
        let mut table = Table::new(["  NAME", "JSON", "TYPE", "DEFAULT", "DESCRIPTION"]);
        for field in &explanation.fields {
            let kind = if field.values.is_empty() {
                field.kind.clone()
            } else {
                format!("{} ({})", field.kind, field.values.join("|"))
            };
            table.row([
                format!("  {}", field.name),
                field.json_name.clone(),
                kind,
                if field.default.is_empty() {
                    "-".to_owned()
                } else {
                    field.default.clone()
                },
                field.description.clone(),
            ]);
        }
        text.push_str(&table.render());
    }
    if !explanation.rules.is_empty() {
        text.push_str("\nRULES:\n");
        let mut table = Table::new(["  FIELD", "EXPRESSION", "MESSAGE"]);
        for rule in &explanation.rules {
            table.row([
                format!(
                    "  {}",
                    if rule.field.is_empty() {
                        "(data)"
                    } else {
                        &rule.field
                    }
                ),
                rule.expression.clone(),
                rule.message.clone(),
            ]);
        }
        text.push_str(&table.render());
    }
    text
}

pub async fn run(session: &Session, args: &ExplainArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let mut explanation = explain(codec, &args.path)?;
    // A registered type: its Type says the rules, defaults and versions.
    let info = codec
        .types()
        .iter()
        .find(|info| info.r#type.as_ref().map(gvk).as_deref() == Some(&explanation.resource_type))
        .cloned();
    if let Some(info) = info.filter(|info| !info.registered_by.is_empty()) {
        let id = proto::resource::v1::Id {
            name: info.registered_by.clone(),
            r#type: Some(proto::resource::v1::Type {
                group: "registry".into(),
                group_version: "v1".into(),
                kind: "Type".into(),
            }),
            tenancy: Some(Default::default()),
            uid: String::new(),
        };
        // A caller who may not read the Type still gets the schema.
        if let Ok(Some(stored)) = session.client.read(&id).await
            && let Some(data) = &stored.data
            && let Ok(t) =
                <proto::registry::v1::Type as prost::Message>::decode(data.value.as_slice())
        {
            let version = info
                .r#type
                .as_ref()
                .map(|t| t.group_version.clone())
                .unwrap_or_default();
            add_type_details(&mut explanation, &t, &version);
        }
    }
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&explanation)?,
        OutputFormat::Yaml => output::yaml(&explanation)?,
        OutputFormat::Name => format!("{}\n", explanation.resource_type),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            render(&explanation)
        }
    };
    output::print(&text)?;
    Ok(0)
}
