//! What the cluster and controllers screens show, and where their cursors are.

use std::collections::BTreeMap;

use proto::client::placement::PlacementMap;
use proto::cluster::v1::{MembersResponse, StatusResponse};

use super::Cursor;

/// What the dashboard knows about the cluster (refreshed in the background).
#[derive(Debug, Clone, Default)]
pub struct ClusterInfo {
    /// The node the dashboard talks to.
    pub status: Option<StatusResponse>,
    pub members: Option<MembersResponse>,
    /// Why the members could not be asked since `members` was fetched, and since when: the
    /// list shown is that old.
    pub members_error: Option<(String, std::time::SystemTime)>,
    /// Each member's own status (commit and applied index), or why it could not be asked.
    pub nodes: BTreeMap<u64, Result<StatusResponse, String>>,
    pub placement: Option<PlacementMap>,
    /// Why the last refresh of the controllers failed, if it did.
    pub placement_error: Option<String>,
    /// What the token cannot see of the cluster (its status was refused), if anything.
    pub denied: Option<String>,
    /// Who the dashboard acts as: `Some(accessor)` with ACLs on.
    pub identity: Option<String>,
}

/// The cluster screen: the members, one selected (for leader transfer).
#[derive(Debug, Clone, Default)]
pub struct NodesScreen {
    pub cursor: Cursor,
}

/// The controllers × nodes placement map.
#[derive(Debug, Clone, Default)]
pub struct ControllersScreen {
    pub cursor: Cursor,
}
