//! An object's history (DESIGN §18): `resctl history TYPE NAME` (every version kept, newest
//! first, with who made it and what it changed), `resctl diff TYPE NAME --from V [--to V]`
//! (two versions as a unified diff, rendered as `diff -f` renders), `resctl blame TYPE NAME`
//! (each field with the version and actor that last changed it) and `resctl get --at V`.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use proto::client::describe;
use proto::client::history;
use proto::codec::Codec;
use proto::resource::v1::{HistoryEntry, Id, Resource};
use serde::Serialize;
use serde_json::Value;

use crate::output::{self, OutputFormat};
use crate::session::Session;

/// Most entries a command reads of one history.
const MAX_ENTRIES: usize = 10_000;

/// The id of `TYPE NAME` (with `uid`, a deleted object's history).
async fn id_of(
    session: &Session,
    type_name: &str,
    name: &str,
    uid: Option<&str>,
) -> anyhow::Result<Id> {
    let mut id = session.id(type_name, name).await?;
    if let Some(uid) = uid {
        id.uid = uid.to_owned();
    }
    Ok(id)
}

async fn entries_of(session: &Session, id: &Id) -> anyhow::Result<Vec<HistoryEntry>> {
    session
        .client
        .history(id, MAX_ENTRIES)
        .await
        .with_context(|| format!("cannot read the history of {}", describe::id_label(id)))
}

fn summary(paths: &[String]) -> String {
    const SHOWN: usize = 3;
    let mut text = paths
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        text.push_str(&format!(" (+{} more)", paths.len() - SHOWN));
    }
    text
}

/// One row of `resctl history`.
#[derive(Debug, Serialize)]
pub struct Row {
    pub version: String,
    pub operation: &'static str,
    pub actor: String,
    pub time: String,
    /// The paths this version changed from the one before it (none for the oldest kept).
    pub changed: Vec<String>,
    #[serde(skip)]
    pub resource: Option<Resource>,
}

/// The history as rows, newest first, each with what it changed (`history::changes`: the
/// oldest kept and a deletion change nothing).
pub fn rows(codec: &Codec, entries: &[HistoryEntry]) -> anyhow::Result<Vec<Row>> {
    let changes = history::changes(codec, entries)?;
    Ok(entries
        .iter()
        .zip(changes)
        .map(|(entry, changes)| Row {
            version: entry.version.clone(),
            operation: history::operation_name(entry),
            actor: entry.actor.clone(),
            time: history::time_of(entry),
            changed: changes.into_iter().map(|change| change.path).collect(),
            resource: entry.resource.clone(),
        })
        .collect())
}

/// `resctl history TYPE NAME`.
pub async fn history(session: &Session, args: &crate::cli::HistoryArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let id = id_of(
        session,
        &args.resource_type,
        &args.name,
        args.uid.as_deref(),
    )
    .await?;
    let mut entries = entries_of(session, &id).await?;
    if let Some(limit) = args.limit {
        entries.truncate(limit);
    }
    let rows = rows(codec, &entries)?;
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => {
            output::json(&with_resources(codec, &rows)?)?
        }
        OutputFormat::Yaml => output::yaml(&with_resources(codec, &rows)?)?,
        OutputFormat::Name => rows
            .iter()
            .map(|row| format!("{}\n", row.version))
            .collect(),
        _ => {
            let mut table =
                output::Table::new(["VERSION", "OPERATION", "ACTOR", "TIME", "CHANGED"]);
            for (index, row) in rows.iter().enumerate() {
                let changed = if row.operation == "delete" {
                    "(deleted)".to_owned()
                } else if index + 1 == rows.len() {
                    "(oldest kept)".to_owned()
                } else {
                    summary(&row.changed)
                };
                table.row([
                    row.version.clone(),
                    row.operation.to_owned(),
                    row.actor.clone(),
                    row.time.clone(),
                    changed,
                ]);
            }
            table.render()
        }
    };
    output::print(&text)?;
    Ok(0)
}

/// Rows with each version's object, for `-o json|yaml`.
fn with_resources(codec: &Codec, rows: &[Row]) -> anyhow::Result<Vec<Value>> {
    rows.iter()
        .map(|row| {
            let mut value = serde_json::to_value(row)?;
            if let (Value::Object(fields), Some(resource)) = (&mut value, &row.resource) {
                fields.insert("resource".into(), codec.to_value(resource)?);
            }
            Ok(value)
        })
        .collect()
}

/// `resctl blame TYPE NAME`.
pub async fn blame_run(session: &Session, args: &crate::cli::HistoryArgs) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let id = id_of(
        session,
        &args.resource_type,
        &args.name,
        args.uid.as_deref(),
    )
    .await?;
    let entries = entries_of(session, &id).await?;
    let blamed = history::blame(codec, &entries)?;
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&blamed)?,
        OutputFormat::Yaml => output::yaml(&blamed)?,
        OutputFormat::Name => blamed.iter().map(|b| format!("{}\n", b.field)).collect(),
        _ => {
            let mut table = output::Table::new(["VERSION", "ACTOR", "TIME", "FIELD", "VALUE"]);
            for b in &blamed {
                table.row([
                    b.version.clone(),
                    b.actor.clone(),
                    b.time.clone(),
                    b.field.clone(),
                    history::text(&b.value),
                ]);
            }
            table.render()
        }
    };
    output::print(&text)?;
    if entries.len() >= MAX_ENTRIES {
        crate::say!("note: only the newest {MAX_ENTRIES} versions were read");
    }
    Ok(0)
}

/// `resctl get TYPE NAME --at V`.
pub async fn get_at(
    session: &Session,
    type_name: &str,
    name: &str,
    version: &str,
) -> anyhow::Result<Resource> {
    let id = session.id(type_name, name).await?;
    session.client.read_at(&id, version).await.with_context(|| {
        format!(
            "cannot read {} at version {version}",
            describe::id_label(&id)
        )
    })
}

/// What a history diff shows of a version: its owner, metadata, data and statuses (not the
/// server's version and generation, which every write moves).
fn shown(codec: &Codec, resource: Option<&Resource>) -> anyhow::Result<String> {
    let Some(resource) = resource else {
        return Ok(String::new());
    };
    let mut resource = resource.clone();
    resource.version.clear();
    resource.generation.clear();
    Ok(codec.to_yaml_with_defaults(&resource)?)
}

/// `resctl diff TYPE NAME --from V [--to V]`: exit 0 when the same, 1 when they differ, 2 on
/// errors (as `diff -f`).
pub async fn diff(
    session: &Session,
    type_name: &str,
    name: &str,
    from: &str,
    to: Option<&str>,
) -> anyhow::Result<u8> {
    let codec = session.codec().await?;
    let id = session.id(type_name, name).await?;
    let label = describe::id_label(&id);
    let before = read_version(session, &id, from).await?;
    let after = match to {
        Some(to) => read_version(session, &id, to).await?,
        None => session
            .client
            .read(&id)
            .await
            .with_context(|| format!("cannot read {label}"))?,
    };
    let to_label = to.map_or_else(|| "now".to_owned(), |v| format!("@{v}"));
    let text = similar::TextDiff::from_lines(
        &shown(codec, before.as_ref())?,
        &shown(codec, after.as_ref())?,
    )
    .unified_diff()
    .context_radius(3)
    .header(&format!("{label}@{from}"), &format!("{label} {to_label}"))
    .to_string();
    let changed = !text.is_empty();
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath | OutputFormat::Yaml => {
            #[derive(Serialize)]
            struct Compared<'a> {
                from: &'a str,
                to: String,
                changed: bool,
                diff: &'a str,
            }
            let compared = Compared {
                from,
                to: to.map_or_else(|| "current".to_owned(), str::to_owned),
                changed,
                diff: &text,
            };
            if session.output == OutputFormat::Yaml {
                output::yaml(&compared)?
            } else {
                output::json(&compared)?
            }
        }
        _ if std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none() => {
            super::diff::colour(&text)
        }
        _ => text,
    };
    output::print(&text)?;
    Ok(u8::from(changed))
}

/// The object at `version` (`None`: it did not exist then).
async fn read_version(
    session: &Session,
    id: &Id,
    version: &str,
) -> anyhow::Result<Option<Resource>> {
    match session.client.read_at(id, version).await {
        Ok(resource) => Ok(Some(resource)),
        Err(proto::client::ClientError::NotFound { message, .. })
            if message.contains("did not exist at version") =>
        {
            Ok(None)
        }
        Err(error) => Err(error).with_context(|| {
            format!(
                "cannot read {} at version {version}",
                describe::id_label(id)
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_list_names_three_paths_then_counts_the_rest() {
        let paths: Vec<String> = ["data.a", "data.b"]
            .iter()
            .map(|p| (*p).to_owned())
            .collect();
        assert_eq!(summary(&paths), "data.a, data.b");
        let many: Vec<String> = (0..5).map(|n| format!("data.f{n}")).collect();
        assert_eq!(summary(&many), "data.f0, data.f1, data.f2 (+2 more)");
    }
}
