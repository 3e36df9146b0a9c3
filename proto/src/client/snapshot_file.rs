//! Snapshot files on the operator's side, shared by `resctl snapshot` and the dashboard's
//! stepper: save (into a temporary file beside the target, fsync, checksum and every record
//! verified, then renamed — a failed or cancelled save never leaves a half file under the final
//! name), read back verified, restore with progress, count what the cluster holds.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use tokio_stream::StreamExt as _;

use crate::cluster::v1::{SnapshotData, SnapshotHeader, SnapshotRestoreResponse};
use crate::codec::gvk;
use crate::resource::v1::Resource;
use crate::snapshot::{self, SnapshotError};

use super::{Client, ClientError, describe};

/// Size of the chunks a restore sends.
const CHUNK: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error(transparent)]
    Client(#[from] ClientError),
    // The cause is part of each message (not a `source`), so a report that prints the chain
    // (anyhow's `{:#}`) says it once.
    #[error("cannot {action} {path}: {cause}")]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{path} is not a usable snapshot: {cause}")]
    Invalid { path: PathBuf, cause: SnapshotError },
    #[error("the snapshot received is not valid ({cause}); nothing was saved to {path}")]
    Received { path: PathBuf, cause: SnapshotError },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotFileError {
    let path = path.to_owned();
    move |cause| SnapshotFileError::Io {
        action,
        path,
        cause,
    }
}

/// A snapshot file, read and verified.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    pub path: PathBuf,
    pub bytes: u64,
    pub header: SnapshotHeader,
}

/// Saves the cluster's snapshot to `path`. `progress(written, total)` is called after each
/// chunk (`total` is known once the header has arrived).
pub async fn save(
    client: &Client,
    path: &Path,
    progress: &mut (dyn FnMut(u64, Option<u64>) + Send),
) -> Result<SnapshotFile, SnapshotFileError> {
    let directory = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut temp = tempfile::Builder::new()
        .prefix(".resd-snapshot-")
        .tempfile_in(directory)
        .map_err(io("create a temporary file in", directory))?;
    let mut stream = client.snapshot_save().await?;
    let mut written: u64 = 0;
    let mut head: Vec<u8> = Vec::new();
    let mut total: Option<u64> = None;
    while let Some(chunk) = stream
        .message()
        .await
        .map_err(|status| client.explain(client.decode(&status)))?
    {
        temp.write_all(&chunk.data)
            .map_err(io("write", temp.path()))?;
        written += chunk.data.len() as u64;
        if total.is_none() {
            head.extend_from_slice(&chunk.data);
            if let Ok((header, body)) = snapshot::read_header(&head) {
                let preamble = (head.len() - body.len()) as u64;
                total = Some(preamble + header.body_bytes);
                head = Vec::new();
            }
        }
        progress(written, total);
    }
    temp.as_file()
        .sync_all()
        .map_err(io("flush", temp.path()))?;
    let bytes = std::fs::read(temp.path()).map_err(io("read back", temp.path()))?;
    let (header, _) = snapshot::read(&bytes).map_err(|cause| SnapshotFileError::Received {
        path: path.to_owned(),
        cause,
    })?;
    temp.persist(path).map_err(|error| SnapshotFileError::Io {
        action: "rename the snapshot to",
        path: path.to_owned(),
        cause: error.error,
    })?;
    Ok(SnapshotFile {
        path: path.to_owned(),
        bytes: written,
        header,
    })
}

/// Reads `path`, verifying its checksum and every record.
pub fn read_verified(
    path: &Path,
) -> Result<(Vec<u8>, SnapshotHeader, Vec<Resource>), SnapshotFileError> {
    let bytes = std::fs::read(path).map_err(io("read", path))?;
    let (header, resources) =
        snapshot::read(&bytes).map_err(|cause| SnapshotFileError::Invalid {
            path: path.to_owned(),
            cause,
        })?;
    Ok((bytes, header, resources))
}

/// Opens a snapshot file for inspection.
pub fn open(path: &Path) -> Result<(SnapshotFile, Vec<Resource>), SnapshotFileError> {
    let (bytes, header, resources) = read_verified(path)?;
    Ok((
        SnapshotFile {
            path: path.to_owned(),
            bytes: bytes.len() as u64,
            header,
        },
        resources,
    ))
}

/// Resources per (`group.version.kind`, tenancy label).
pub fn counts_by_tenancy(resources: &[Resource]) -> BTreeMap<(String, String), u64> {
    let mut counts = BTreeMap::new();
    for resource in resources {
        let id = resource.id.clone().unwrap_or_default();
        let key = (
            id.r#type.as_ref().map(gvk).unwrap_or_default(),
            describe::tenancy_label(id.tenancy.as_ref()),
        );
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// Restores `path` into the cluster (verified again first). `progress(sent, total)` is called
/// as the chunks are handed to the connection.
pub async fn restore(
    client: &Client,
    path: &Path,
    progress: impl FnMut(u64, u64) + Send + 'static,
) -> Result<(SnapshotHeader, SnapshotRestoreResponse), SnapshotFileError> {
    let (bytes, header, _) = read_verified(path)?;
    let total = bytes.len() as u64;
    let chunks: Vec<SnapshotData> = bytes
        .chunks(CHUNK)
        .map(|chunk| SnapshotData {
            data: chunk.to_vec(),
        })
        .collect();
    let mut progress = progress;
    let mut sent = 0;
    let stream = tokio_stream::iter(chunks).map(move |chunk| {
        sent += chunk.data.len() as u64;
        progress(sent, total);
        chunk
    });
    let response = client.snapshot_restore(stream).await?;
    Ok((header, response))
}

/// Resources per page when counting: a page is all either side holds at once, whatever the
/// cluster holds (an unpaged list of a million resources is over a gigabyte in one answer).
const COUNT_PAGE: u32 = 1_000;

/// How many resources of each type the cluster holds now (types without any left out),
/// counted page by page.
pub async fn cluster_counts(
    client: &Client,
    types: &[crate::cluster::v1::TypeInfo],
) -> Result<BTreeMap<String, u64>, ClientError> {
    let mut counts = BTreeMap::new();
    for info in types {
        let resource_type = info.r#type.clone().unwrap_or_default();
        let mut count = 0u64;
        client
            .list_in_pages(
                &resource_type,
                &describe::every_tenancy(info.scope()),
                &crate::client::ListOptions::default(),
                COUNT_PAGE,
                |page| count += page.len() as u64,
            )
            .await?;
        if count > 0 {
            counts.insert(gvk(&resource_type), count);
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod message_tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_snapshot_is_said_so_once_in_words() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notes.txt");
        std::fs::write(&path, "hello").expect("write");
        let error = read_verified(&path).expect_err("not a snapshot");
        let text = error.to_string();
        assert!(text.contains("not a resd snapshot"), "{text}");
        assert!(text.contains("\"RESDSNAP\""), "{text}");
        assert_eq!(text.matches("not a resd snapshot").count(), 1, "{text}");
        // The cause is in the message, not repeated as a source.
        assert!(std::error::Error::source(&error).is_none());
    }
}
