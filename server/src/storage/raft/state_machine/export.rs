//! The operator snapshot (`ClusterService.SnapshotSave`): this node's whole state streamed as a
//! `proto::snapshot` file from one read transaction.

use super::{SmShared, applied_index, decode_resource, scan, sealed, storage_internal};
use crate::storage::{StorageError, UnversionedType};

/// Resources of unregistered types a refused snapshot names (of how many).
const ORPHANS_NAMED: usize = 5;

impl SmShared {
    /// Streams this node's state as an operator snapshot file into `chunks`: one read
    /// transaction, a first pass to count, hash and check, a second to send. Blocking; run it
    /// on a blocking thread.
    ///
    /// A snapshot is restorable by construction (DESIGN §15): a state holding a resource of a
    /// type that is neither `built_in` nor registered by a Type of the same state (which the
    /// fence keeps from ever being stored) is refused, naming the resources, rather than
    /// saved as a file that cannot be restored.
    pub fn export_blocking(
        &self,
        node_id: u64,
        chunks: tokio::sync::mpsc::Sender<Result<Vec<u8>, StorageError>>,
        built_in: &dyn Fn(&str, &str) -> bool,
    ) -> Result<(), StorageError> {
        const CHUNK_BYTES: usize = 1 << 20;
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let raft_index = applied_index(&sm.dbs, &rtxn).map_err(|e| self.read_failed(e))?;
        let all = proto::resource::v1::Tenancy {
            partition: crate::resource::WILDCARD.into(),
            namespace: crate::resource::WILDCARD.into(),
        };
        let types = UnversionedType {
            group: "registry".into(),
            kind: "Type".into(),
        };
        let registered: std::collections::HashSet<(String, String)> =
            scan(&sm, &rtxn, &types, &all, "")
                .map_err(|e| self.read_failed(e))?
                .iter()
                .filter_map(|stored| {
                    let data = stored.data.as_ref()?;
                    let t: proto::registry::v1::Type =
                        prost::Message::decode(data.value.as_slice()).ok()?;
                    Some((t.group, t.kind))
                })
                .collect();
        let mut orphans = Vec::new();
        let mut orphan_count = 0usize;
        let mut body = proto::snapshot::BodyWriter::new();
        let mut scratch = Vec::new();
        for item in sm.dbs.resources.iter(&rtxn).map_err(storage_internal)? {
            let (key, stored) = item.map_err(storage_internal)?;
            let bytes = sealed::open(key, stored).map_err(|damage| self.found_damage(&damage))?;
            let resource = decode_resource(bytes)?;
            let (group, kind) = resource
                .id
                .as_ref()
                .and_then(|id| id.r#type.as_ref())
                .map(|t| (t.group.as_str(), t.kind.as_str()))
                .unwrap_or_default();
            if !built_in(group, kind) && !registered.contains(&(group.to_owned(), kind.to_owned()))
            {
                orphan_count += 1;
                if orphans.len() < ORPHANS_NAMED {
                    orphans.push(
                        resource
                            .id
                            .as_ref()
                            .map(|id| crate::resource::DisplayId(id).to_string())
                            .unwrap_or_default(),
                    );
                }
            }
            scratch.clear();
            body.record(&resource, &mut scratch);
        }
        // The objects' history, after every resource (DESIGN §18: a restore brings it).
        super::history::each(&sm.dbs, &rtxn, |entry, expires_ms| {
            scratch.clear();
            body.history_record(
                &proto::cluster::v1::SnapshotHistoryRecord {
                    entry: Some(entry),
                    expires_ms,
                },
                &mut scratch,
            );
            Ok(())
        })?;
        if orphan_count > 0 {
            return Err(StorageError::Internal(format!(
                "the state holds {orphan_count} resources of types no Type registers ({}{}): a snapshot of it could not be restored; delete them, or register their types again, and save again",
                orphans.join(", "),
                if orphan_count > orphans.len() {
                    ", …"
                } else {
                    ""
                }
            )));
        }
        let header = body.header(
            raft_index,
            node_id,
            prost_types::Timestamp::from(std::time::SystemTime::now()),
        );
        let send = |chunk: Vec<u8>| {
            chunks
                .blocking_send(Ok(chunk))
                .map_err(|_| StorageError::Internal("the snapshot reader went away".into()))
        };
        send(proto::snapshot::preamble(&header))?;
        let mut discard = proto::snapshot::BodyWriter::new();
        let mut chunk = Vec::with_capacity(CHUNK_BYTES);
        for item in sm.dbs.resources.iter(&rtxn).map_err(storage_internal)? {
            let (key, stored) = item.map_err(storage_internal)?;
            let bytes = sealed::open(key, stored).map_err(|damage| self.found_damage(&damage))?;
            discard.record(&decode_resource(bytes)?, &mut chunk);
            if chunk.len() >= CHUNK_BYTES {
                send(std::mem::replace(
                    &mut chunk,
                    Vec::with_capacity(CHUNK_BYTES),
                ))?;
            }
        }
        super::history::each(&sm.dbs, &rtxn, |entry, expires_ms| {
            discard.history_record(
                &proto::cluster::v1::SnapshotHistoryRecord {
                    entry: Some(entry),
                    expires_ms,
                },
                &mut chunk,
            );
            if chunk.len() >= CHUNK_BYTES {
                send(std::mem::replace(
                    &mut chunk,
                    Vec::with_capacity(CHUNK_BYTES),
                ))?;
            }
            Ok(())
        })?;
        if !chunk.is_empty() {
            send(chunk)?;
        }
        Ok(())
    }
}
