//! `resctl snapshot save|inspect|restore`. Save streams into a temporary file beside the
//! target, verifies the checksum and every record, then renames (a failed save never leaves a
//! half file under the final name). Restore verifies first, shows what will be replaced and
//! asks before sending.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use futures::StreamExt as _;
use indicatif::ProgressBar;
use proto::client::describe;
use proto::cluster::v1::{Scope, SnapshotData, SnapshotHeader};
use proto::codec::gvk;
use proto::resource::v1::{Resource, Tenancy};
use proto::snapshot;
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
    let directory = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = tempfile::Builder::new()
        .prefix(".resctl-snapshot-")
        .tempfile_in(directory)
        .with_context(|| format!("cannot create a temporary file in {}", directory.display()))?;
    let mut stream = session.client.snapshot_save().await?;
    let mut written: u64 = 0;
    let mut head: Vec<u8> = Vec::new();
    let mut length_known = false;
    while let Some(chunk) = stream.message().await.map_err(|status| {
        proto::client::ClientError::from_status(session.client.server(), &status)
    })? {
        temp.write_all(&chunk.data)
            .with_context(|| format!("cannot write {}", temp.path().display()))?;
        written += chunk.data.len() as u64;
        if !length_known {
            head.extend_from_slice(&chunk.data);
            if let Ok((header, body)) = snapshot::read_header(&head) {
                let preamble = (head.len() - body.len()) as u64;
                bar.set_length(preamble + header.body_bytes);
                length_known = true;
            }
        }
        bar.set_position(written);
    }
    temp.as_file().sync_all()?;
    let bytes = std::fs::read(temp.path())?;
    let (header, _) = snapshot::read(&bytes).map_err(|error| {
        anyhow::anyhow!(
            "the snapshot received is not valid ({error}); nothing was saved to {}",
            path.display()
        )
    })?;
    temp.persist(path)
        .with_context(|| format!("cannot rename the snapshot to {}", path.display()))?;
    Ok(Saved {
        file: path.to_owned(),
        bytes: written,
        header: HeaderView::of(&header),
    })
}

fn read_verified(path: &Path) -> anyhow::Result<(Vec<u8>, SnapshotHeader, Vec<Resource>)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (header, resources) = snapshot::read(&bytes)
        .with_context(|| format!("{} is not a usable snapshot", path.display()))?;
    Ok((bytes, header, resources))
}

pub fn inspect(path: &Path) -> anyhow::Result<Inspected> {
    let (bytes, header, resources) = read_verified(path)?;
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for resource in &resources {
        let id = resource.id.clone().unwrap_or_default();
        let key = (
            id.r#type.as_ref().map(gvk).unwrap_or_default(),
            describe::tenancy_label(id.tenancy.as_ref()),
        );
        *counts.entry(key).or_default() += 1;
    }
    Ok(Inspected {
        file: path.to_owned(),
        bytes: bytes.len() as u64,
        header: HeaderView::of(&header),
        by_tenancy: counts
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
    let mut counts = BTreeMap::new();
    for info in codec.types() {
        let resource_type = info.r#type.clone().unwrap_or_default();
        let tenancy = match info.scope() {
            Scope::Cluster => Tenancy::default(),
            Scope::Partition => Tenancy {
                partition: "*".into(),
                namespace: String::new(),
            },
            _ => Tenancy {
                partition: "*".into(),
                namespace: "*".into(),
            },
        };
        let listed = session.client.list(&resource_type, &tenancy, "").await?;
        if !listed.is_empty() {
            counts.insert(gvk(&resource_type), listed.len() as u64);
        }
    }
    Ok(counts)
}

/// Restores `path` into the cluster (already verified and confirmed by the caller).
pub async fn restore(
    session: &Session,
    path: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<Restored> {
    let (bytes, header, _) = read_verified(path)?;
    const CHUNK: usize = 1 << 20;
    bar.set_length(bytes.len() as u64);
    let chunks: Vec<SnapshotData> = bytes
        .chunks(CHUNK)
        .map(|chunk| SnapshotData {
            data: chunk.to_vec(),
        })
        .collect();
    let progress = bar.clone();
    let stream =
        futures::stream::iter(chunks).inspect(move |chunk| progress.inc(chunk.data.len() as u64));
    let response = session
        .client
        .snapshot_restore(stream)
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
                OutputFormat::Json => output::json(&saved)?,
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
                OutputFormat::Json => output::json(&inspected)?,
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
            eprintln!(
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
                    eprintln!("restore cancelled; nothing changed");
                    return Ok(1);
                }
            }
            let bar = session.byte_progress(Some(inspected.bytes), "restoring");
            let restored = restore(session, &args.file, &bar).await?;
            bar.finish_and_clear();
            output::print(&match format {
                OutputFormat::Json => output::json(&restored)?,
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
