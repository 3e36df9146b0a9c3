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
        OutputFormat::Table | OutputFormat::Wide => {
            let mut table = Table::new(["TYPE", "SCOPE", "MESSAGE"]);
            for row in &rows {
                table.row([
                    row.resource_type.clone(),
                    row.scope.clone(),
                    row.message.clone(),
                ]);
            }
            table.render()
        }
    };
    output::print(&text)?;
    Ok(0)
}
