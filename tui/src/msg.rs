//! What flows into [`crate::update`] (messages: keys, ticks, what the background tasks
//! learned) and out of it (effects: work for the runtime, which answers with more messages).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

use crossterm::event::KeyEvent;
use proto::client::WatchUpdate;
use proto::client::edit::{EditSession, Round};
use proto::cluster::v1::{
    ListControllersResponse, ListTypesResponse, MembersResponse, StatusResponse, TypeInfo,
};
use proto::resource::v1::Id;

use crate::state::{SnapshotInfo, VerifyRow};

/// What the background poller learned about the cluster.
#[derive(Debug, Clone)]
pub struct ClusterReport {
    /// The node the dashboard talks to.
    pub status: Result<StatusResponse, String>,
    pub members: Option<Result<MembersResponse, String>>,
    /// Each member's own status.
    pub nodes: BTreeMap<u64, Result<StatusResponse, String>>,
    pub controllers: Option<Result<ListControllersResponse, String>>,
    /// The status was refused to this token (the server is reachable): what the token cannot do.
    pub denied: Option<String>,
    /// Who the dashboard acts as: the token's accessor, or `None` with ACLs off.
    pub identity: Option<Result<Option<String>, String>>,
}

#[derive(Debug, Clone)]
pub enum SnapshotMsg {
    SaveProgress { written: u64, total: Option<u64> },
    Saved(Result<SnapshotInfo, String>),
    Opened(Result<SnapshotInfo, String>),
    RestoreProgress { sent: u64, total: u64 },
    Restored(Result<u64, String>),
    Verified(Result<Vec<VerifyRow>, String>),
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Msg {
    Key(KeyEvent),
    /// The terminal changed size (the next frame lays out again).
    Resize,
    /// The clock moved (ages, expiring messages).
    Tick(SystemTime),
    Types(Result<ListTypesResponse, String>),
    /// From the watch of type `gvk`.
    Watch {
        gvk: String,
        update: WatchUpdate,
    },
    Cluster(Box<ClusterReport>),
    /// An edit round ended (the editor closed and the save was tried).
    EditRound {
        session: Box<EditSession>,
        result: Result<Round, String>,
    },
    Deleted {
        label: String,
        /// Finalizers it had (it stays, marked, until they are removed).
        finalizers: usize,
        result: Result<(), String>,
    },
    Snapshot(SnapshotMsg),
    /// A leadership transfer ended: the new leader, or why not.
    Transferred(Result<u64, String>),
    /// The history of the resource `at` (newest first), or why it could not be read.
    History {
        at: crate::model::ResRef,
        result: Result<Vec<proto::resource::v1::HistoryEntry>, String>,
    },
}

/// Work for the runtime.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Start one watch per type (all tenancies).
    Watch(Vec<TypeInfo>),
    /// List the server's types again (a `registry.v1.Type` changed).
    RefreshTypes,
    /// Suspend the terminal, run `$EDITOR` on the session's document, restore the terminal,
    /// submit the result.
    Edit(Box<EditSession>),
    Delete {
        id: Id,
        version: String,
        label: String,
        finalizers: usize,
    },
    SnapshotSave(PathBuf),
    SnapshotOpen(PathBuf),
    SnapshotRestore(PathBuf),
    /// Count every type on the server and compare with the snapshot's counts.
    SnapshotVerify(BTreeMap<String, u64>),
    /// Stop the save or restore under way.
    SnapshotCancel,
    /// Make `node` the leader.
    TransferLeader(u64),
    /// Read the history of the resource `at` (whose id is `id`).
    History {
        at: crate::model::ResRef,
        id: Id,
    },
}
