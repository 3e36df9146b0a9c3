//! openraft's own storage test suite on the LMDB log store and state machine.

use openraft::testing::{StoreBuilder, Suite};

use super::log_store::LogStore;
use super::state_machine::StateMachineStore;
use super::types::{RaftStorageError, TypeConfig};

struct LmdbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for LmdbBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), RaftStorageError> {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::read(&e))?;
        let log = LogStore::open(dir.path()).map_err(|e| openraft::StorageIOError::read(&e))?;
        let sm =
            StateMachineStore::open(dir.path()).map_err(|e| openraft::StorageIOError::read(&e))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn lmdb_log_store_and_state_machine_pass_the_openraft_suite() -> Result<(), RaftStorageError> {
    Suite::test_all(LmdbBuilder)
}
