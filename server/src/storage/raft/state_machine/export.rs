//! The operator snapshot (`ClusterService.SnapshotSave`): this node's whole state streamed as a
//! `proto::snapshot` file from one read transaction.

use super::{SmShared, applied_index, decode_resource, sealed, storage_internal};
use crate::storage::StorageError;

impl SmShared {
    /// Streams this node's state as an operator snapshot file into `chunks`: one read
    /// transaction, a first pass to count and hash, a second to send. Blocking; run it on a
    /// blocking thread.
    pub fn export_blocking(
        &self,
        node_id: u64,
        chunks: tokio::sync::mpsc::Sender<Result<Vec<u8>, StorageError>>,
    ) -> Result<(), StorageError> {
        const CHUNK_BYTES: usize = 1 << 20;
        let sm = self.current();
        let rtxn = sm.env.read_txn().map_err(storage_internal)?;
        let raft_index = applied_index(&sm.dbs, &rtxn).map_err(|e| self.read_failed(e))?;
        let mut body = proto::snapshot::BodyWriter::new();
        let mut scratch = Vec::new();
        for item in sm.dbs.resources.iter(&rtxn).map_err(storage_internal)? {
            let (key, stored) = item.map_err(storage_internal)?;
            let bytes = sealed::open(key, stored).map_err(|damage| self.found_damage(&damage))?;
            scratch.clear();
            body.record(&decode_resource(bytes)?, &mut scratch);
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
        if !chunk.is_empty() {
            send(chunk)?;
        }
        Ok(())
    }
}
