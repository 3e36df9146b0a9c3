//! `resctl status TYPE NAME`: every status key's conditions, and whether each key has observed
//! the resource's current generation.

use proto::client::describe;
use serde::Serialize;

use crate::cli::NamedArgs;
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct ConditionRow {
    pub key: String,
    #[serde(rename = "type")]
    pub condition_type: String,
    pub state: String,
    pub reason: String,
    pub message: String,
    pub observed_generation: String,
    /// Whether this key's controller has seen the current generation.
    pub up_to_date: bool,
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    pub id: String,
    pub generation: String,
    pub version: String,
    pub conditions: Vec<ConditionRow>,
}

pub async fn status(
    session: &Session,
    type_name: &str,
    name: &str,
) -> anyhow::Result<StatusReport> {
    let resource = super::get::read(session, type_name, name).await?;
    Ok(report_of(&resource))
}

/// A resource's status keys and conditions, as `resctl status` shows them.
pub fn report_of(resource: &proto::resource::v1::Resource) -> StatusReport {
    let mut conditions = Vec::new();
    for (key, status) in &resource.status {
        let up_to_date = status.observed_generation == resource.generation;
        let updated_at = status
            .updated_at
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        if status.conditions.is_empty() {
            conditions.push(ConditionRow {
                key: key.clone(),
                condition_type: String::new(),
                state: String::new(),
                reason: String::new(),
                message: String::new(),
                observed_generation: status.observed_generation.clone(),
                up_to_date,
                updated_at: updated_at.clone(),
            });
        }
        for condition in &status.conditions {
            conditions.push(ConditionRow {
                key: key.clone(),
                condition_type: condition.r#type.clone(),
                state: describe::state_label(condition.state).to_owned(),
                reason: condition.reason.clone(),
                message: condition.message.clone(),
                observed_generation: status.observed_generation.clone(),
                up_to_date,
                updated_at: updated_at.clone(),
            });
        }
    }
    StatusReport {
        id: describe::id_label(&resource.id.clone().unwrap_or_default()),
        generation: resource.generation.clone(),
        version: resource.version.clone(),
        conditions,
    }
}

pub async fn run(session: &Session, args: &NamedArgs) -> anyhow::Result<u8> {
    let report = status(session, &args.resource_type, &args.name).await?;
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&report)?,
        OutputFormat::Yaml => output::yaml(&report)?,
        OutputFormat::Name => format!("{}\n", report.id),
        OutputFormat::Table | OutputFormat::Wide | OutputFormat::CustomColumns => {
            let mut text = format!("{}  generation {}\n", report.id, report.generation);
            if report.conditions.is_empty() {
                text.push_str("no status yet: no controller has reported on this resource\n");
            } else {
                let mut headers =
                    vec!["KEY", "CONDITION", "STATE", "REASON", "OBSERVED", "MESSAGE"];
                if session.output == OutputFormat::Wide {
                    headers.push("UPDATED");
                }
                let mut table = Table::new(headers);
                for row in &report.conditions {
                    let observed = if row.up_to_date {
                        row.observed_generation.clone()
                    } else {
                        format!("{} (stale)", row.observed_generation)
                    };
                    let mut cells = vec![
                        row.key.clone(),
                        row.condition_type.clone(),
                        row.state.clone(),
                        row.reason.clone(),
                        observed,
                        row.message.clone(),
                    ];
                    if session.output == OutputFormat::Wide {
                        cells.push(row.updated_at.clone());
                    }
                    table.row(cells);
                }
                text.push_str(&table.render());
            }
            text
        }
    };
    output::print(&text)?;
    Ok(0)
}
