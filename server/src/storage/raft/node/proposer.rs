//! The proposer: writes and deletes queued while a proposal is in flight travel together in one
//! log entry (group commit: one log fsync per node for all of them).

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};

use super::super::op::{ChangeResult, Op, Outcome, Tagged};
use super::super::types::{Command, NodeAddr, NodeId, Raft};
use super::retry::Retry;
use crate::storage::StorageError;

/// Most changes in one entry.
pub(super) const MAX_BATCH_CHANGES: usize = 1024;
/// Most encoded bytes of changes in one entry.
const MAX_BATCH_BYTES: usize = 8 << 20;
/// Batches proposed at once (the permits of the proposer's semaphore). One measured best on
/// loopback, with the LMDB log and again with the write-ahead log (two in flight: 64 writers on 3
/// nodes went from 7,800-8,400 to 6,300-6,900 writes/s): openraft 0.9 appends entries one at a
/// time anyway, so more in flight only splits the queue into smaller batches.
pub(super) const MAX_PROPOSALS_IN_FLIGHT: usize = 1;

/// One try at proposing: applied (either way), or worth retrying elsewhere (no or another
/// leader).
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(super) enum Proposed {
    Applied(ChangeResult),
    Retry(Retry),
}

/// A change waiting for the proposer, and where its outcome goes.
pub(super) struct Proposal {
    pub change: Tagged,
    pub reply: tokio::sync::oneshot::Sender<Proposed>,
}

/// Gathers queued changes into batches and proposes them, one at a time, until every sender
/// is gone. Each proposal holds a permit of `permits`; whoever holds them all (a leadership
/// transfer) pauses proposing. A proposal runs in this task: a task of its own would add a
/// hop between threads to every write's latency and buy nothing with one in flight.
pub(super) async fn run_proposer(
    raft: Raft,
    mut queue: tokio::sync::mpsc::Receiver<Proposal>,
    permits: Arc<tokio::sync::Semaphore>,
) {
    loop {
        // The permit is taken once there is something to propose: an idle proposer holding one
        // would keep a leadership transfer waiting for the next write.
        let Some(first) = queue.recv().await else {
            break;
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let mut bytes = first.change.change.size();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_CHANGES && bytes < MAX_BATCH_BYTES {
            match queue.try_recv() {
                Ok(proposal) => {
                    bytes += proposal.change.change.size();
                    batch.push(proposal);
                }
                Err(_) => break,
            }
        }
        propose_batch(&raft, batch).await;
        drop(permit);
    }
}

/// Proposes one batch as one entry and hands each change its result.
async fn propose_batch(raft: &Raft, batch: Vec<Proposal>) {
    let (changes, replies): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .map(|proposal| (proposal.change, proposal.reply))
        .unzip();
    let expected = changes.len();
    match propose(raft, Op::Changes(changes)).await {
        Ok(Outcome(results)) if results.len() == expected => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Proposed::Applied(result));
            }
        }
        Ok(Outcome(results)) => {
            let error = StorageError::Internal(format!(
                "a batch of {expected} changes applied to {} results",
                results.len()
            ));
            for reply in replies {
                let _ = reply.send(Proposed::Applied(Err(error.clone())));
            }
        }
        Err(proposed) => {
            for reply in replies {
                let _ = reply.send(proposed.clone());
            }
        }
    }
}

/// Proposes `op` as one entry and waits for it to be applied here.
pub(super) async fn propose(raft: &Raft, op: Op) -> Result<Outcome, Proposed> {
    match raft.client_write(Command::new(op)).await {
        Ok(written) => Ok(written.data),
        Err(error) => Err(proposed_of_error(error)),
    }
}

fn proposed_of_error(error: RaftError<NodeId, ClientWriteError<NodeId, NodeAddr>>) -> Proposed {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
            Proposed::Retry(Retry::LeaderMoved {
                to: forward.leader_id,
            })
        }
        RaftError::APIError(error) => {
            Proposed::Applied(Err(StorageError::Internal(error.to_string())))
        }
        RaftError::Fatal(fatal) => Proposed::Applied(Err(StorageError::Inconsistent(format!(
            "raft stopped: {fatal}"
        )))),
    }
}
