//! Operator restores (`ClusterService.SnapshotRestore`): the upload is spooled to a file under
//! the node's data directory and checked completely before anything is proposed.
//!
//! - The header is read as soon as it has arrived: a file that is not a snapshot is refused
//!   after its first chunk, one that declares (or sends) more than `--max-snapshot-bytes` as
//!   soon as that is known.
//! - The body's length and checksum are checked as it streams to disk.
//! - Every record is then read back and checked as a Write would check it ([`check_record`]),
//!   with no duplicates, every partition and namespace a record lives in present in the snapshot
//!   itself, the `default` partition and namespace present, and the header's counts exact.
//!
//! Only then are the records handed to raft, chunk by chunk, from the file.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufReader, Seek, SeekFrom};
use std::path::Path;

use proto::cluster::v1::{SnapshotData, SnapshotHeader};
use proto::resource::v1::{Resource, Tenancy};
use proto::snapshot::{self, BodyVerifier};
use tokio::io::AsyncWriteExt;
use tonic::Streaming;

use crate::registry::{Registry, Scope, builtin};
use crate::resource::{self, DisplayId};
use crate::service::Error;
use crate::service::admission::check_record;
use crate::storage::raft::node::{RestoreChunks, RestoreRecords};

/// A record of a snapshot's body.
enum Record {
    Resource(Resource),
    History(proto::cluster::v1::SnapshotHistoryRecord),
}
use crate::storage::{StorageError, StorageKey};

/// Longest preamble accepted before the header must have arrived.
const MAX_PREAMBLE_BYTES: usize = (1 << 20) + 16;
/// Encoded bytes of records per raft entry.
const CHUNK_BYTES: usize = 4 << 20;

/// An uploaded snapshot on disk, its body verified. The file goes when this is dropped.
#[derive(Debug)]
pub(super) struct Spooled {
    file: tempfile::NamedTempFile,
    pub header: SnapshotHeader,
    body_offset: u64,
}

fn rejected(why: impl std::fmt::Display) -> Error {
    Error::invalid(format!("snapshot rejected, nothing was changed: {why}"))
}

fn spool_error(error: std::io::Error) -> Error {
    Error::Internal(format!(
        "cannot spool the uploaded snapshot to disk: {error}"
    ))
}

fn too_large(limit: u64) -> Error {
    Error::ResourceExhausted(format!(
        "snapshot rejected, nothing was changed: it is larger than this node's --max-snapshot-bytes limit of {limit} bytes"
    ))
}

/// Receives an upload into a file under `dir`, checking the header, the size and the body's
/// checksum as it arrives.
pub(super) async fn receive(
    chunks: &mut Streaming<SnapshotData>,
    dir: &Path,
    max_bytes: u64,
) -> Result<Spooled, tonic::Status> {
    tokio::fs::create_dir_all(dir).await.map_err(spool_error)?;
    let file = tempfile::NamedTempFile::new_in(dir).map_err(spool_error)?;
    let mut writer = tokio::fs::File::from_std(file.reopen().map_err(spool_error)?);
    let mut head = Vec::new();
    let mut body: Option<(SnapshotHeader, u64, BodyVerifier)> = None;
    let mut received = 0u64;
    while let Some(chunk) = chunks.message().await? {
        received += chunk.data.len() as u64;
        if received > max_bytes {
            return Err(too_large(max_bytes).into());
        }
        match body.as_mut() {
            Some((_, _, verifier)) => {
                verifier.update(&chunk.data).map_err(rejected)?;
                writer.write_all(&chunk.data).await.map_err(spool_error)?;
            }
            None => {
                head.extend_from_slice(&chunk.data);
                let Some((header, offset)) = snapshot::parse_preamble(&head).map_err(rejected)?
                else {
                    if head.len() > MAX_PREAMBLE_BYTES {
                        return Err(rejected("no complete header in its first megabyte").into());
                    }
                    continue;
                };
                if (offset as u64).saturating_add(header.body_bytes) > max_bytes {
                    return Err(too_large(max_bytes).into());
                }
                let mut verifier = BodyVerifier::new(&header);
                verifier.update(&head[offset..]).map_err(rejected)?;
                writer.write_all(&head).await.map_err(spool_error)?;
                body = Some((header, offset as u64, verifier));
                head = Vec::new();
            }
        }
    }
    let Some((header, body_offset, verifier)) = body else {
        return Err(rejected(snapshot::SnapshotError::Truncated("in the header")).into());
    };
    verifier.finish().map_err(rejected)?;
    writer.flush().await.map_err(spool_error)?;
    Ok(Spooled {
        file,
        header,
        body_offset,
    })
}

/// Which tenancy units a record needs, by its type's scope.
fn needed_units(scope: Scope, tenancy: &Tenancy) -> (Option<String>, Option<(String, String)>) {
    let partition = || Some(tenancy.partition.clone());
    let namespace = || Some((tenancy.partition.clone(), tenancy.namespace.clone()));
    match scope {
        Scope::Cluster => (None, None),
        Scope::Partition => (partition(), None),
        Scope::Namespace => (partition(), namespace()),
        Scope::Any => (
            partition().filter(|p| !p.is_empty()),
            namespace().filter(|(_, n)| !n.is_empty()),
        ),
    }
}

impl Spooled {
    fn body(&self) -> Result<BufReader<std::fs::File>, Error> {
        let mut file = self.file.reopen().map_err(spool_error)?;
        file.seek(SeekFrom::Start(self.body_offset))
            .map_err(spool_error)?;
        Ok(BufReader::with_capacity(1 << 20, file))
    }

    /// The registry as it will be once the snapshot is restored: the built-in types, and the
    /// types the snapshot's `registry.v1.Type` records register (a restore replaces the
    /// registry: a type the snapshot lacks is unregistered, DESIGN §15).
    fn registry_of_snapshot(&self) -> Result<Registry, Error> {
        let view = Registry::builtin()
            .map_err(|error| Error::Internal(format!("the built-in registry: {error}")))?;
        view.dynamic().set_max_types(usize::MAX);
        view.dynamic().set_max_schema_bytes(usize::MAX);
        let mut body = self.body()?;
        let mut index = 0u64;
        while index < self.header.resource_count {
            let Some(record) = snapshot::read_record(&mut body, index).map_err(rejected)? else {
                break;
            };
            let is_type = record
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref())
                .is_some_and(|t| resource::gvk(t) == builtin::REGISTRY_TYPE);
            if is_type {
                view.dynamic().install_stored(&record);
            }
            index += 1;
        }
        Ok(view)
    }

    /// Reads every record back and checks it against the registry the snapshot makes ([`Self::registry_of_snapshot`]); blocking (run it on a blocking thread).
    pub(super) fn check(&self, max_resource_bytes: usize) -> Result<(), Error> {
        let view = self.registry_of_snapshot()?;
        let registry = &view;
        let mut body = self.body()?;
        let mut seen: HashSet<StorageKey> = HashSet::new();
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        let mut partitions: BTreeSet<String> = BTreeSet::new();
        let mut namespaces: BTreeSet<(String, String)> = BTreeSet::new();
        let mut needed_partitions: BTreeMap<String, String> = BTreeMap::new();
        let mut needed_namespaces: BTreeMap<(String, String), String> = BTreeMap::new();
        let partition_type = builtin::partition_id("x").r#type.unwrap_or_default();
        let namespace_type = builtin::namespace_id("x", "x").r#type.unwrap_or_default();
        let mut index = 0u64;
        while index < self.header.resource_count {
            let Some(record) = snapshot::read_record(&mut body, index).map_err(rejected)? else {
                break;
            };
            let id = record.id.clone().unwrap_or_default();
            let registration =
                check_record(registry, max_resource_bytes, &record).map_err(|error| {
                    rejected(format!("record {index} ({}): {error}", DisplayId(&id)))
                })?;
            if !seen.insert(StorageKey::of(&id)) {
                return Err(rejected(format!(
                    "record {index} ({}) is a duplicate: another record has the same type, tenancy and name",
                    DisplayId(&id)
                )));
            }
            *counts.entry(snapshot::gvk_of(&record)).or_default() += 1;
            let tenancy = id.tenancy.clone().unwrap_or_default();
            let resource_type = id.r#type.clone().unwrap_or_default();
            let same_kind = |t: &proto::resource::v1::Type| {
                t.group == resource_type.group && t.kind == resource_type.kind
            };
            if same_kind(&partition_type) {
                partitions.insert(id.name.clone());
            } else if same_kind(&namespace_type) {
                namespaces.insert((tenancy.partition.clone(), id.name.clone()));
            }
            let (partition, namespace) = needed_units(registration.scope, &tenancy);
            if let Some(partition) = partition {
                needed_partitions
                    .entry(partition)
                    .or_insert_with(|| DisplayId(&id).to_string());
            }
            if let Some(namespace) = namespace {
                needed_namespaces
                    .entry(namespace)
                    .or_insert_with(|| DisplayId(&id).to_string());
            }
            index += 1;
        }
        if index != self.header.resource_count {
            return Err(rejected(format!(
                "{index} records, the header says {}",
                self.header.resource_count
            )));
        }
        // The objects' history after them: each entry whole, of an object with a uid, of a
        // type the snapshot registers (stored as it was; never checked against today's rules).
        let mut kept = 0u64;
        while let Some(record) =
            snapshot::read_history_record(&mut body, index + kept).map_err(rejected)?
        {
            let entry = record.entry.unwrap_or_default();
            let id = entry
                .resource
                .as_ref()
                .and_then(|r| r.id.clone())
                .unwrap_or_default();
            if id.uid.is_empty() || entry.version.parse::<crate::storage::Version>().is_err() {
                return Err(rejected(format!(
                    "history record {kept} names no object or version"
                )));
            }
            let known = id
                .r#type
                .as_ref()
                .is_some_and(|t| registry.resolve_stored(t).is_some());
            if !known {
                return Err(rejected(format!(
                    "history record {kept} ({}) is of a type the snapshot does not register",
                    DisplayId(&id)
                )));
            }
            kept += 1;
        }
        if kept != self.header.history_count {
            return Err(rejected(format!(
                "{kept} history records, the header says {}",
                self.header.history_count
            )));
        }
        let header_counts: BTreeMap<String, u64> = self.header.counts.clone().into_iter().collect();
        if counts != header_counts {
            return Err(rejected("per-type counts differ from the header"));
        }
        let default_partition = resource::DEFAULT_PARTITION.to_owned();
        let default_namespace = (
            resource::DEFAULT_PARTITION.to_owned(),
            resource::DEFAULT_NAMESPACE.to_owned(),
        );
        if !partitions.contains(&default_partition) || !namespaces.contains(&default_namespace) {
            return Err(rejected(
                "it has no default partition and default/default namespace, which every cluster needs",
            ));
        }
        if let Some((partition, user)) = needed_partitions
            .iter()
            .find(|(partition, _)| !partitions.contains(*partition))
        {
            return Err(rejected(format!(
                "{user} lives in partition {partition:?}, which the snapshot does not hold"
            )));
        }
        if let Some(((partition, namespace), user)) = needed_namespaces
            .iter()
            .find(|(unit, _)| !namespaces.contains(*unit))
        {
            return Err(rejected(format!(
                "{user} lives in namespace {namespace:?} of partition {partition:?}, which the snapshot does not hold"
            )));
        }
        Ok(())
    }

    /// The records, read from the file in chunks of about [`CHUNK_BYTES`] on a blocking thread.
    pub(super) fn chunks(&self) -> Result<RestoreChunks, Error> {
        let mut body = self.body()?;
        let resource_count = self.header.resource_count;
        let (sender, receiver) = tokio::sync::mpsc::channel(2);
        // Detached on purpose: it ends at the end of the file or when the receiver goes.
        tokio::task::spawn_blocking(move || {
            let mut chunk = RestoreRecords::default();
            let mut bytes = 0;
            let mut index = 0u64;
            loop {
                let read = if index < resource_count {
                    snapshot::read_record(&mut body, index).map(|r| r.map(Record::Resource))
                } else {
                    snapshot::read_history_record(&mut body, index).map(|r| r.map(Record::History))
                };
                match read {
                    Ok(Some(record)) => {
                        index += 1;
                        match record {
                            Record::Resource(resource) => {
                                bytes += prost::Message::encoded_len(&resource);
                                chunk.resources.push(resource);
                            }
                            Record::History(record) => {
                                let entry = record.entry.unwrap_or_default();
                                bytes += prost::Message::encoded_len(&entry);
                                chunk.history.push((entry, record.expires_ms));
                            }
                        }
                        if bytes >= CHUNK_BYTES {
                            bytes = 0;
                            if sender
                                .blocking_send(Ok(std::mem::take(&mut chunk)))
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        let _ = sender.blocking_send(Err(StorageError::Internal(format!(
                            "the spooled snapshot changed after it was checked: {error}"
                        ))));
                        return;
                    }
                }
            }
            if !chunk.resources.is_empty() || !chunk.history.is_empty() {
                let _ = sender.blocking_send(Ok(chunk));
            }
        });
        Ok(receiver)
    }

    /// The whole file again, in 1 MiB pieces, for forwarding it to the leader.
    pub(super) fn upload(
        &self,
    ) -> Result<impl futures::Stream<Item = SnapshotData> + Send + 'static, Error> {
        let file = tokio::fs::File::from_std(self.file.reopen().map_err(spool_error)?);
        Ok(futures::stream::unfold(file, |mut file| async move {
            use tokio::io::AsyncReadExt;
            let mut data = vec![0u8; 1 << 20];
            let mut filled = 0;
            while filled < data.len() {
                match file.read(&mut data[filled..]).await {
                    Ok(0) => break,
                    Ok(read) => filled += read,
                    Err(error) => {
                        tracing::warn!(%error, "reading the spooled snapshot failed");
                        return None;
                    }
                }
            }
            if filled == 0 {
                return None;
            }
            data.truncate(filled);
            Some((SnapshotData { data }, file))
        }))
    }
}
