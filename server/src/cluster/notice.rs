//! Telling a removed node that it was removed, so it stops serving: its own log may never learn
//! it, since the leader stops replicating to it.

use crate::storage::raft::node::{RaftNode, names_node};
use crate::storage::raft::types::NodeId;

/// Tells node `id` (at `raft_addr`) that it was removed (best effort, a few tries over ~10 s: a
/// node that is down never learns it from us, and keeps failing to be elected). The notice
/// names the configuration that removed it, and the tries stop once the node is a member again:
/// a node that rejoins (with an empty data directory, under the same id) must not take a late
/// notice for itself.
pub(super) fn notify_removed(node: &RaftNode, id: NodeId, raft_addr: String, cluster_name: String) {
    let dialer = node.dialer().clone();
    let by = node.id();
    let raft = node.raft().clone();
    let membership_index = node
        .metrics()
        .membership_config
        .log_id()
        .map_or(0, |log_id| log_id.index);
    tokio::spawn(async move {
        let Ok(mut client) = crate::storage::raft::network::raft_client(&dialer, &raft_addr, id)
        else {
            return;
        };
        for attempt in 0..5u32 {
            if names_node(&raft, id) {
                return;
            }
            let notice = proto::raft::v1::RemovedNotice {
                node_id: id,
                by_node_id: by,
                cluster_name: cluster_name.clone(),
                membership_index,
            };
            let mut request = tonic::Request::new(notice);
            request.set_timeout(std::time::Duration::from_secs(2));
            match client.removed(request).await {
                Ok(_) => return,
                Err(status) => {
                    tracing::debug!(node = id, %status, attempt, "telling a removed node failed")
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
    });
}
