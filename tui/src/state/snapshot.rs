//! The snapshot stepper's state.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proto::cluster::v1::SnapshotHeader;

use super::Choice;

/// Whether a file name is asked for to save a snapshot or to open one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPurpose {
    Save,
    Open,
}

/// What a snapshot file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub path: PathBuf,
    pub bytes: u64,
    pub header: SnapshotHeader,
}

impl SnapshotInfo {
    /// Resources per `group.version.kind`, sorted.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.header
            .counts
            .iter()
            .map(|(gvk, count)| (gvk.clone(), *count))
            .collect()
    }
}

/// One type after a restore: what the snapshot held and what the cluster now lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyRow {
    pub gvk: String,
    pub expected: u64,
    pub actual: u64,
}

/// The snapshot stepper: save → inspect → confirm → restore → verify. Every step says what
/// it waits for, and `esc` leaves it (cancelling a save or restore under way).
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotStep {
    /// Nothing under way: `s` saves a new snapshot, `o` opens a file.
    Start,
    Saving {
        path: PathBuf,
        written: u64,
        total: Option<u64>,
    },
    Opening {
        path: PathBuf,
    },
    Inspect(Box<SnapshotInfo>),
    Confirm {
        info: Box<SnapshotInfo>,
        choice: Choice,
    },
    Restoring {
        info: Box<SnapshotInfo>,
        sent: u64,
        total: u64,
    },
    Verifying {
        info: Box<SnapshotInfo>,
        restored_index: u64,
    },
    Verified {
        info: Box<SnapshotInfo>,
        restored_index: u64,
        rows: Vec<VerifyRow>,
    },
    Failed {
        what: String,
        error: String,
        info: Option<Box<SnapshotInfo>>,
    },
}
