//! The Raft network over the internal gRPC service `resd.raft.v1.RaftService`: the client side
//! openraft uses to reach peers ([`client`]) and the server side that receives their RPCs and
//! forwarded requests ([`server`]). Values cross the wire through [`super::codec`] (requests,
//! replies, errors) and `crate::wire::raft` (openraft's own messages).

use proto::raft::v1::raft_service_client::RaftServiceClient;
use tonic::transport::Channel;

use super::types::NodeId;
use crate::tls::Dialer;

mod client;
mod pipe;
mod server;

pub(crate) use client::NetworkFactory;
pub(crate) use server::{PeerAdmission, RaftGrpc};

/// When this node last heard from each peer (a successful raft RPC), so membership can tell a
/// member that answers from one that does not (openraft 0.9 keeps only match indexes).
#[derive(Debug, Default)]
pub(crate) struct Contacts {
    last: std::sync::Mutex<std::collections::HashMap<NodeId, std::time::Instant>>,
}

impl Contacts {
    pub(crate) fn heard(&self, node: NodeId) {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(node, std::time::Instant::now());
    }

    /// How long ago `node` last answered; `None` if it never did.
    pub(crate) fn since(&self, node: NodeId) -> Option<std::time::Duration> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .map(std::time::Instant::elapsed)
    }
}

/// Largest AppendEntries message sent; larger batches are cut and reported as partial success.
pub(crate) const MAX_APPEND_BYTES: usize = 32 << 20;

/// Sent with every replication call (append, vote, snapshot) and with every answer to one, by
/// builds whose state machine checks changes' fences (DESIGN §15). A build before them
/// applies fenced changes without checking them, so the two must never replicate to each
/// other: a follower of this build refuses a leader of an earlier one, and a leader of this
/// build does not replicate to a follower of an earlier one (treated as unreachable). A
/// cluster then goes on with whichever build holds a majority; members of the other catch up
/// once upgraded, and no two members ever apply the same entry differently.
///
/// Its value is the level of the rules apply enforces, raised whenever apply decides anything
/// differently: 1, the fence; 2, quotas kept and enforced in apply and the admission policies'
/// domain (DESIGN §17); 3, objects' history kept and compacted by apply (DESIGN §18); 4, writes fenced by a lease
/// (DESIGN §16, a `LeaseGuard`). Only
/// members of the same level replicate to each other.
///
/// Up to level 2 it was named `x-resd-fence`; it is `x-resd-apply-rules` from level 3, so as
/// not to be taken for the API's fenced-write metadata (DESIGN §16). A peer of level 2 or less
/// finds no header of its name on this build's calls and answers, and refuses them, as it must.
pub(crate) const FENCE_HEADER: &str = "x-resd-apply-rules";

/// The level of apply's rules this build sends and requires ([`FENCE_HEADER`]).
const APPLY_RULES: &str = "4";

/// Whether `metadata` says its sender applies changes by this build's rules.
pub(crate) fn checks_fences(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get(FENCE_HEADER)
        .is_some_and(|value| value == APPLY_RULES)
}

/// Marks `metadata` as sent by a build that checks fences.
pub(crate) fn mark_fences(metadata: &mut tonic::metadata::MetadataMap) {
    metadata.insert(
        FENCE_HEADER,
        tonic::metadata::MetadataValue::from_static(APPLY_RULES),
    );
}

/// What a member of this build says of a peer of an earlier one.
pub(crate) fn earlier_build(peer: &str) -> String {
    format!(
        "raft peer {peer} runs a build that applies changes by other rules (before DESIGN §15's fence or §17's quotas and policies): the two do not replicate to each other; upgrade every member"
    )
}
/// Largest message the raft server accepts (a single entry may hold a 4 MiB resource).
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Size of the chunks a snapshot is streamed in.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// HTTP/2 flow-control windows of raft connections, both ways: appends share one stream per
/// peer (see `pipe`), so its window, not a new stream's, bounds the bytes in flight.
pub(crate) const STREAM_WINDOW: u32 = 16 << 20;
pub(crate) const CONNECTION_WINDOW: u32 = 32 << 20;

/// How often an idle connection to a peer is pinged, and how long a ping may go unanswered.
const KEEP_ALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);
const KEEP_ALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// A lazily connecting client of the raft service of peer `node` at `addr` (with TLS, the
/// peer must present node `node`'s certificate).
pub(crate) fn raft_client(
    dialer: &Dialer,
    addr: &str,
    node: NodeId,
) -> Result<RaftServiceClient<Channel>, String> {
    let endpoint = dialer
        .endpoint(addr, Some(node))
        .map_err(|why| format!("raft address of node {node}: {why}"))?
        // A connection that stops answering (a peer's host gone, a partition) is noticed
        // within seconds and closed, which ends the append stream on it; the next call dials.
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    Ok(RaftServiceClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}
