//! `resctl snapshot save|inspect|restore`. Save streams into a temporary file beside the
//! target, verifies the checksum and every record, then renames (a failed save never leaves a
//! half file under the final name). Restore verifies first, shows what will be replaced and
//! asks before sending. The file handling is `proto::client::snapshot_file`, shared with the
//! dashboard.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use indicatif::ProgressBar;
use proto::client::snapshot_file;
use proto::cluster::v1::SnapshotHeader;
use serde::Serialize;

use crate::cli::SnapshotCommand;
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct HeaderView {
    pub format_version: u32,
    pub raft_index: u64,
    pub created_at: String,
    pub node_id: u64,
    pub resources: u64,
    pub body_bytes: u64,
    pub sha256: String,
    pub counts: BTreeMap<String, u64>,
}

impl HeaderView {
    fn of(header: &SnapshotHeader) -> HeaderView {
        HeaderView {
            format_version: header.format_version,
            raft_index: header.raft_index,
            created_at: header
                .created_at
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            node_id: header.node_id,
            resources: header.resource_count,
            body_bytes: header.body_bytes,
            sha256: header.sha256.clone(),
            counts: header.counts.clone().into_iter().collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Saved {
    pub file: PathBuf,
    pub bytes: u64,
    pub header: HeaderView,
}

#[derive(Debug, Clone, Serialize)]
pub struct TenancyCount {
    #[serde(rename = "type")]
    pub resource_type: String,
    pub tenancy: String,
    pub count: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Inspected {
    pub file: PathBuf,
    pub bytes: u64,
    pub header: HeaderView,
    pub by_tenancy: Vec<TenancyCount>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub file: PathBuf,
    pub restored_index: u64,
    pub header: HeaderView,
}

/// Saves a snapshot to `path` (temp file, verify, rename).
pub async fn save(session: &Session, path: &Path, bar: &ProgressBar) -> anyhow::Result<Saved> {
    let progress = bar.clone();
    let saved = snapshot_file::save(&session.client, path, &mut move |written, total| {
        if let Some(total) = total {
            progress.set_length(total);
        }
        progress.set_position(written);
    })
    .await?;
    Ok(Saved {
        file: saved.path,
        bytes: saved.bytes,
        header: HeaderView::of(&saved.header),
    })
}

pub fn inspect(path: &Path) -> anyhow::Result<Inspected> {
    let (file, resources) = snapshot_file::open(path)?;
    Ok(Inspected {
        file: file.path,
        bytes: file.bytes,
        header: HeaderView::of(&file.header),
        by_tenancy: snapshot_file::counts_by_tenancy(&resources)
            .into_iter()
            .map(|((resource_type, tenancy), count)| TenancyCount {
                resource_type,
                tenancy,
                count,
            })
            .collect(),
    })
}

/// How many resources of each type the cluster holds now (what a restore replaces).
pub async fn current_counts(session: &Session) -> anyhow::Result<BTreeMap<String, u64>> {
    let codec = session.codec().await?;
    Ok(snapshot_file::cluster_counts(&session.client, codec.types()).await?)
}

/// Restores `path` into the cluster (already verified and confirmed by the caller).
pub async fn restore(
    session: &Session,
    path: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<Restored> {
    let progress = bar.clone();
    let (header, response) = snapshot_file::restore(&session.client, path, move |sent, total| {
        progress.set_length(total);
        progress.set_position(sent);
    })
    .await
    .context("restore failed; the cluster keeps its current state")?;
    Ok(Restored {
        file: path.to_owned(),
        restored_index: response.restored_index,
        header: HeaderView::of(&header),
    })
}

fn header_table(header: &HeaderView, file: &Path, bytes: u64) -> String {
    let mut table = Table::new(["FIELD", "VALUE"]);
    for (field, value) in [
        ("file", file.display().to_string()),
        ("size", format!("{bytes} bytes")),
        ("format version", header.format_version.to_string()),
        ("raft index", header.raft_index.to_string()),
        ("created at", header.created_at.clone()),
        ("taken on node", header.node_id.to_string()),
        ("resources", header.resources.to_string()),
        ("sha256", header.sha256.clone()),
    ] {
        table.row([field.to_owned(), value]);
    }
    table.render()
}

pub async fn run(session: &Session, command: SnapshotCommand) -> anyhow::Result<u8> {
    let format = session.output;
    match command {
        SnapshotCommand::Save(args) => {
            let bar = session.byte_progress(None, "saving snapshot");
            let saved = save(session, &args.file, &bar).await?;
            bar.finish_and_clear();
            output::print(&match format {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&saved)?,
                OutputFormat::Yaml => output::yaml(&saved)?,
                _ => format!(
                    "saved {} ({} resources at raft index {}, {} bytes, sha256 {})\n",
                    saved.file.display(),
                    saved.header.resources,
                    saved.header.raft_index,
                    saved.bytes,
                    saved.header.sha256
                ),
            })?;
        }
        SnapshotCommand::Inspect(args) => {
            let inspected = inspect(&args.file)?;
            output::print(&match format {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&inspected)?,
                OutputFormat::Yaml => output::yaml(&inspected)?,
                _ => {
                    let mut text =
                        header_table(&inspected.header, &inspected.file, inspected.bytes);
                    text.push('\n');
                    let mut table = Table::new(["TYPE", "TENANCY", "COUNT"]);
                    for row in &inspected.by_tenancy {
                        table.row([
                            row.resource_type.clone(),
                            row.tenancy.clone(),
                            row.count.to_string(),
                        ]);
                    }
                    text.push_str(&table.render());
                    text
                }
            })?;
        }
        SnapshotCommand::Restore(args) => {
            let inspected = inspect(&args.file)?;
            let current = current_counts(session).await?;
            let mut table = Table::new(["TYPE", "NOW", "AFTER RESTORE"]);
            let mut types: Vec<&String> = current
                .keys()
                .chain(inspected.header.counts.keys())
                .collect();
            types.sort();
            types.dedup();
            for resource_type in types {
                table.row([
                    resource_type.clone(),
                    current.get(resource_type).copied().unwrap_or(0).to_string(),
                    inspected
                        .header
                        .counts
                        .get(resource_type)
                        .copied()
                        .unwrap_or(0)
                        .to_string(),
                ]);
            }
            crate::say!(
                "restoring {} (raft index {}, taken {}) replaces everything the cluster at {} holds:\n{}",
                args.file.display(),
                inspected.header.raft_index,
                inspected.header.created_at,
                session.client.server(),
                table.render()
            );
            if !args.yes {
                if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
                    return Err(crate::UsageError(
                        "restore replaces the cluster's state; pass --yes to confirm when not running interactively".into(),
                    )
                    .into());
                }
                if !crate::session::confirm(
                    "replace the cluster's state with this snapshot?",
                    false,
                ) {
                    crate::say!("restore cancelled; nothing changed");
                    return Ok(1);
                }
            }
            let bar = session.byte_progress(Some(inspected.bytes), "restoring");
            let restored = restore(session, &args.file, &bar).await?;
            bar.finish_and_clear();
            output::print(&match format {
                OutputFormat::Json | OutputFormat::JsonPath => output::json(&restored)?,
                OutputFormat::Yaml => output::yaml(&restored)?,
                _ => format!(
                    "restored {} resources from {} (cluster now at index {})\n",
                    restored.header.resources,
                    restored.file.display(),
                    restored.restored_index
                ),
            })?;
        }
    }
    Ok(0)
}
