//! `resctl types`: the types the server's registry publishes.

use proto::cluster::v1::Scope;
use proto::codec::gvk;
use serde::Serialize;

use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct TypeRow {
    #[serde(rename = "type")]
    pub resource_type: String,
    pub scope: String,
    pub message: String,
    /// Compiled into the server, or registered at runtime by a `registry.v1.Type`.
    pub builtin: bool,
    /// The Type resource that registered it (empty for a built-in type).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub registered_by: String,
    /// Whether its Type is being deleted.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

impl TypeRow {
    /// `built-in`, `Type payments-invoice`, `Type payments-invoice (deleting)`.
    pub fn source(&self) -> String {
        match (self.builtin, self.deleting) {
            (true, _) => "built-in".to_owned(),
            (false, false) => format!("Type {}", self.registered_by),
            (false, true) => format!("Type {} (deleting)", self.registered_by),
        }
    }
}

pub fn scope_label(scope: Scope) -> &'static str {
    match scope {
        Scope::Cluster => "cluster",
        Scope::Partition => "partition",
        Scope::Namespace => "namespace",
        Scope::Any => "any",
        Scope::Undefined => "undefined",
    }
}

pub async fn types(session: &Session) -> anyhow::Result<Vec<TypeRow>> {
    let codec = session.codec().await?;
    let mut rows: Vec<TypeRow> = codec
        .types()
        .iter()
        .map(|info| TypeRow {
            resource_type: info.r#type.as_ref().map(gvk).unwrap_or_default(),
            scope: scope_label(info.scope()).to_owned(),
            message: info.message_name.clone(),
            builtin: info.builtin,
            registered_by: info.registered_by.clone(),
            deleting: info.deleting,
        })
        .collect();
    rows.sort_by(|a, b| a.resource_type.cmp(&b.resource_type));
    Ok(rows)
}

pub async fn run(session: &Session) -> anyhow::Result<u8> {
    let rows = types(session).await?;
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&rows)?,
        OutputFormat::Yaml => output::yaml(&rows)?,
        OutputFormat::Name => rows
            .iter()
            .map(|r| format!("{}\n", r.resource_type))
            .collect(),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            let mut table = Table::new(["TYPE", "SCOPE", "MESSAGE", "SOURCE"]);
            for row in &rows {
                table.row([
                    row.resource_type.clone(),
                    row.scope.clone(),
                    row.message.clone(),
                    row.source(),
                ]);
            }
            table.render()
        }
    };
    output::print(&text)?;
    Ok(0)
}
