//! `resctl explain TYPE[.field…]` (DESIGN §15): a type's schema as the server publishes it —
//! each field with its type and the comment above it in the `.proto`, like `kubectl explain`.

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
}

#[derive(Debug, Clone, Serialize)]
pub struct FieldRow {
    pub name: String,
    /// The name YAML and JSON documents use.
    pub json_name: String,
    pub number: u32,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
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
    })
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
    if !explanation.description.is_empty() {
        text.push_str(&format!("\n{}\n", explanation.description));
    }
    if !explanation.fields.is_empty() {
        text.push_str("\nFIELDS:\n");
        let mut table = Table::new(["  NAME", "TYPE", "DESCRIPTION"]);
        for field in &explanation.fields {
            table.row([
                format!("  {}", field.name),
                field.kind.clone(),
                field.description.clone(),
            ]);
        }
        text.push_str(&table.render());
    }
    text
}

pub async fn run(session: &Session, args: &ExplainArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let explanation = explain(codec, &args.path)?;
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
