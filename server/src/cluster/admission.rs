//! Which nodes may speak to this node's raft service (DESIGN §12.2, with TLS): a voter or
//! learner of the latest membership this node knows; a member of the cluster it is joining,
//! as told by the member it joins through (before its own log names them); and a node another
//! member vouches for — this node's log may be behind a change that added it (it was down
//! during the join). Vouching is asked over the internal raft service (`Vouch`), of the members
//! this node knows, never over the public API.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::storage::raft::network::PeerAdmission;
use crate::storage::raft::node::RaftNode;
use crate::storage::raft::types::{NodeAddr, NodeId};

/// How often the members are asked about the same unknown caller.
const ASK_INTERVAL: Duration = Duration::from_secs(2);

/// How long one member has to answer whether it vouches.
const VOUCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Callers remembered as asked about, at most (a flood of unknown ids forgets them all).
const MAX_ASKED: usize = 1024;

/// The peers this node admits beyond those its log names.
#[derive(Debug)]
pub(crate) struct Peers {
    node: Arc<RaftNode>,
    /// Members of the cluster this node is joining, and nodes a member vouched for.
    admitted: Mutex<BTreeSet<NodeId>>,
    /// When the members were last asked about a caller this node does not know.
    asked: Mutex<HashMap<NodeId, Instant>>,
}

impl Peers {
    pub(crate) fn new(node: Arc<RaftNode>) -> Self {
        Peers {
            node,
            admitted: Mutex::default(),
            asked: Mutex::default(),
        }
    }

    /// Admits the members of the cluster this node is joining, as told by the member it joins
    /// through, before this node's own log names them.
    pub(crate) fn expect(&self, ids: impl IntoIterator<Item = NodeId>) {
        let mut admitted = self.admitted.lock().unwrap_or_else(|p| p.into_inner());
        admitted.clear();
        admitted.extend(ids);
    }

    /// Asks the other members this node knows whether `id` is a member now; admits it when one
    /// says so.
    pub(crate) async fn ask_members_about(&self, id: NodeId) -> bool {
        let me = self.node.id();
        let known: Vec<(NodeId, NodeAddr)> = self
            .node
            .metrics()
            .membership_config
            .membership()
            .nodes()
            .filter(|(node, _)| **node != me && **node != id)
            .map(|(node, addr)| (*node, addr.clone()))
            .collect();
        for (member, addr) in known {
            let Ok(mut client) = crate::storage::raft::network::raft_client(
                self.node.dialer(),
                &addr.raft_addr,
                member,
            ) else {
                continue;
            };
            let mut request = tonic::Request::new(proto::raft::v1::VouchRequest { node_id: id });
            request.set_timeout(VOUCH_TIMEOUT);
            let Ok(answer) = client.vouch(request).await else {
                continue;
            };
            if answer.get_ref().member {
                tracing::info!(
                    node = id,
                    vouched_by = member,
                    "a member this node's log does not name yet is one now"
                );
                self.admitted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id);
                return true;
            }
        }
        false
    }

    /// Whether `id` was asked about within [`ASK_INTERVAL`]; records that it is being asked
    /// about now if not.
    fn asked_recently(&self, id: NodeId) -> bool {
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if asked.len() > MAX_ASKED {
            asked.clear();
        }
        if asked.get(&id).is_some_and(|at| at.elapsed() < ASK_INTERVAL) {
            return true;
        }
        asked.insert(id, Instant::now());
        false
    }
}

impl PeerAdmission for Peers {
    fn admits(&self, id: NodeId) -> bool {
        self.node.names(id)
            || self
                .admitted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&id)
    }

    fn refused(self: Arc<Self>, id: NodeId) {
        if self.asked_recently(id) {
            return;
        }
        tokio::spawn(async move {
            self.ask_members_about(id).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::raft::tests::TestCluster;

    /// A node whose log is behind a change that added a member (here: its raft stopped before
    /// the change) admits that member once another member vouches for it over the internal
    /// raft service, and nobody the members do not name.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_behind_a_join_admits_the_new_member_once_another_vouches() {
        let cluster = TestCluster::start(3).await;
        let behind = cluster.nodes[2].clone();
        behind.shutdown().await;
        let newcomer = NodeAddr {
            api_addr: String::new(),
            raft_addr: "127.0.0.1:1".into(),
        };
        cluster.nodes[0]
            .raft()
            .add_learner(99, newcomer, false)
            .await
            .expect("the two others commit the learner");
        let peers = Arc::new(Peers::new(behind));
        assert!(!peers.admits(99), "its own log does not name node 99");
        assert!(!peers.ask_members_about(98).await, "nobody vouches for 98");
        assert!(!peers.admits(98));
        assert!(
            peers.ask_members_about(99).await,
            "the leader vouches for 99"
        );
        assert!(peers.admits(99));
        // Told the members of a cluster it joins, it admits those (and forgets the earlier).
        peers.expect([1, 2, 7]);
        assert!(peers.admits(7) && !peers.admits(99));
    }

    #[test]
    fn a_refused_caller_is_asked_about_at_most_once_per_interval() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let cluster = runtime.block_on(TestCluster::start(1));
        let peers = Peers::new(cluster.nodes[0].clone());
        assert!(!peers.asked_recently(5));
        assert!(peers.asked_recently(5), "asked a moment ago");
        assert!(!peers.asked_recently(6));
        // A flood of unknown callers does not grow the memory of them without bound.
        for id in 100..(100 + 2 * MAX_ASKED as u64) {
            peers.asked_recently(id);
        }
        assert!(peers.asked.lock().unwrap().len() <= MAX_ASKED + 1);
        runtime.block_on(cluster.nodes[0].shutdown());
    }
}
