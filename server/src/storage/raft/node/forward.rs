//! Running a request on the leader: served here when this node leads, forwarded over
//! `resd.raft.v1.RaftService/Forward` when it does not, waiting through elections up to the
//! forward timeout.

use std::time::{Duration, Instant};

use openraft::error::RaftError;

use super::super::codec;
use super::super::op::{ListQuery, Reply, ReplyResult, Request};
use super::super::types::{NodeAddr, NodeId};
use super::RaftNode;
use super::proposer::{Proposal, Proposed};
use super::retry::Retry;
use crate::storage::StorageError;

/// One try at serving a request: done (either way), or worth retrying (no or another leader).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(super) enum Attempt {
    Done(ReplyResult),
    Retry(Retry),
}

impl From<Proposed> for Attempt {
    fn from(proposed: Proposed) -> Self {
        match proposed {
            Proposed::Applied(result) => Attempt::Done(result.map(Reply::from)),
            Proposed::Retry(why) => Attempt::Retry(why),
        }
    }
}

fn shutting_down() -> Attempt {
    Attempt::Done(Err(StorageError::ShuttingDown(
        "this node is shutting down".into(),
    )))
}

impl RaftNode {
    /// Waits until some node is leader; `Inconsistent` once the deadline passes.
    async fn wait_for_leader(
        &self,
        deadline: Instant,
    ) -> Result<(NodeId, Option<NodeAddr>), StorageError> {
        let mut metrics = self.raft.metrics();
        loop {
            let (leader, node) = {
                let current = metrics.borrow();
                let leader = current.current_leader;
                let node = leader.and_then(|id| {
                    current
                        .membership_config
                        .membership()
                        .get_node(&id)
                        .cloned()
                });
                (leader, node)
            };
            if let Some(leader) = leader {
                return Ok((leader, node));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(StorageError::Inconsistent(
                    "no raft leader was elected before the request's deadline".into(),
                ));
            }
            let _ = tokio::time::timeout(remaining, metrics.changed()).await;
        }
    }

    /// Runs a request on the leader, forwarding it when this node is not the leader, and waiting
    /// through elections up to the forward timeout.
    pub(in crate::storage::raft) async fn submit(&self, request: Request) -> ReplyResult {
        if let Some(why) = self.removed() {
            return Err(StorageError::Removed(why));
        }
        let deadline = crate::storage::deadline::bounded(self.forward_timeout);
        let mut last: Option<Retry> = None;
        loop {
            let attempt = match self.wait_for_leader(deadline).await {
                Err(error) => {
                    let why = match &last {
                        None => error.to_string(),
                        Some(retry) => format!("{error} (last: {retry})"),
                    };
                    return Err(StorageError::Inconsistent(why));
                }
                Ok((leader, _)) if leader == self.id => self.serve_locally(request.clone()).await,
                // Boxed: the call to another node is the rare path, and its future is large;
                // held inline it would make every local write's future that much larger.
                Ok((leader, Some(node))) => Box::pin(self.forward(leader, &node, &request)).await,
                Ok((leader, None)) => Attempt::Retry(Retry::LeaderUnaddressed(leader)),
            };
            match attempt {
                Attempt::Done(reply) => return reply,
                Attempt::Retry(retry) => {
                    if Instant::now() >= deadline {
                        let heard = self
                            .voters_heard()
                            .map(|heard| format!("; {heard}"))
                            .unwrap_or_default();
                        return Err(StorageError::Inconsistent(format!(
                            "could not reach a raft leader before the request's deadline: {retry}{heard}"
                        )));
                    }
                    last = Some(retry);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn forward(&self, leader: NodeId, node: &NodeAddr, request: &Request) -> Attempt {
        let mut client = match self.peer_client(leader, &node.raft_addr) {
            Ok(client) => client,
            Err(why) => {
                return Attempt::Retry(Retry::Unreachable {
                    leader,
                    addr: node.raft_addr.clone(),
                    why,
                });
            }
        };
        let mut call = tonic::Request::new(codec::forward_request_of(request));
        call.set_timeout(
            crate::storage::deadline::bounded(self.forward_timeout)
                .saturating_duration_since(Instant::now()),
        );
        // A leader that stops answering (paused, partitioned) holds the call until its deadline;
        // once another leader is known, ask that one instead. Safe to abandon: the change keeps
        // its request id, so if the first attempt committed, the retry gets its outcome.
        let reply = tokio::select! {
            reply = client.forward(call) => reply,
            new_leader = self.leader_other_than(leader) => {
                return Attempt::Retry(Retry::LeaderSilent {
                    was: leader,
                    now: new_leader,
                });
            }
        };
        match reply {
            // The node we asked was not (or no longer) the leader: ask again.
            Ok(reply) => match codec::reply_of(reply.into_inner()) {
                // A leader on its way out answers until it stops: another will lead.
                Err(StorageError::Inconsistent(why) | StorageError::ShuttingDown(why)) => {
                    Attempt::Retry(Retry::LeaderRefused { leader, why })
                }
                reply => Attempt::Done(reply),
            },
            Err(status) => Attempt::Retry(Retry::Unreachable {
                leader,
                addr: node.raft_addr.clone(),
                why: status.message().to_owned(),
            }),
        }
    }

    /// Resolves once this node knows of a leader other than `leader` (never, while it does not).
    async fn leader_other_than(&self, leader: NodeId) -> NodeId {
        let mut metrics = self.raft.metrics();
        loop {
            if let Some(current) = metrics.borrow_and_update().current_leader
                && current != leader
            {
                return current;
            }
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Serves a request forwarded by a follower (already checked by the raft service).
    pub(crate) async fn serve_forwarded(&self, request: Request) -> ReplyResult {
        match self.serve_locally(request).await {
            Attempt::Done(reply) => reply,
            Attempt::Retry(retry) => Err(StorageError::Inconsistent(retry.to_string())),
        }
    }

    async fn serve_locally(&self, request: Request) -> Attempt {
        match request {
            Request::Change(change) => {
                // A client's new write needs room; a delete makes it (its tombstone, in the
                // server's `internal` group, is let through), and the server's own writes and its
                // controllers' (the default tenancy, statuses, finalizers) go on.
                if needs_room(&change)
                    && let Err(no_room) = self
                        .disk
                        .check_room()
                        .and_then(|()| self.sm.check_quota(change.change.size()))
                {
                    return Attempt::Done(Err(no_room));
                }
                let (reply, outcome) = tokio::sync::oneshot::channel();
                if self
                    .proposals
                    .send(Proposal { change, reply })
                    .await
                    .is_err()
                {
                    return shutting_down();
                }
                outcome
                    .await
                    .map_or_else(|_| shutting_down(), Attempt::from)
            }
            // Boxed: a read's wait for its leadership round is a larger future than a change's,
            // and every write would carry it inline.
            read => Box::pin(self.read_locally(read)).await,
        }
    }

    /// [`Self::serve_locally`] for the reads: linearized, then answered from this node.
    async fn read_locally(&self, request: Request) -> Attempt {
        match request {
            Request::Change(_) => Attempt::Done(Err(StorageError::Internal(
                "a change was served as a read".into(),
            ))),
            Request::Read(id) => match self.linearize().await {
                Err(attempt) => attempt,
                Ok(_) => Attempt::Done(self.sm.read(&id).map(Reply::Resource)),
            },
            Request::ReadIndex => match self.linearize().await {
                Ok(index) => Attempt::Done(Ok(Reply::ReadIndex(index))),
                Err(attempt) => attempt,
            },
            Request::List(ListQuery {
                resource_type,
                tenancy,
                name_prefix,
            }) => match self.linearize().await {
                Err(attempt) => attempt,
                Ok(_) => Attempt::Done(
                    self.sm
                        .list(&resource_type, &tenancy, &name_prefix)
                        .map(Reply::Resources),
                ),
            },
        }
    }

    /// Confirms leadership with a quorum and waits until this node has applied everything
    /// committed before the call; returns that read index.
    async fn linearize(&self) -> Result<u64, Attempt> {
        let raft = self.raft.clone();
        let round = move || {
            let raft = raft.clone();
            async move {
                raft.ensure_linearizable()
                    .await
                    .map(|read_log_id| read_log_id.map(|log_id| log_id.index).unwrap_or(0))
                    .map_err(not_leader)
            }
        };
        self.reads
            .join(round, || Err(Attempt::Retry(Retry::RoundDropped)))
            .await
    }
}

pub(super) fn not_leader<E: std::fmt::Display>(error: RaftError<NodeId, E>) -> Attempt {
    match error {
        RaftError::APIError(error) => Attempt::Retry(Retry::NotLeader(error.to_string())),
        RaftError::Fatal(fatal) => Attempt::Done(Err(StorageError::Inconsistent(format!(
            "raft stopped: {fatal}"
        )))),
    }
}

/// Whether a change is refused under the disk's reserve or past the quota: a write made for a
/// client, of anything but the server's `internal` types (a delete's tombstone).
fn needs_room(tagged: &super::super::op::Tagged) -> bool {
    let super::super::op::Change::Write(resource, _) = &tagged.change else {
        return false;
    };
    let internal = resource
        .id
        .as_ref()
        .and_then(|id| id.r#type.as_ref())
        .is_some_and(|t| t.group == crate::registry::builtin::INTERNAL_GROUP);
    let by_server = tagged.actor == crate::acl::SERVER_IDENTITY
        || tagged
            .actor
            .starts_with(crate::acl::CONTROLLER_IDENTITY_PREFIX);
    !internal && !by_server
}
