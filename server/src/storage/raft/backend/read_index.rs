//! Linearizable reads the etcd way: concurrent reads share one leadership confirmation. A read
//! joins the next round that starts after it arrived (never one already under way, which may
//! have confirmed leadership before the read's write it must see); one round per moment of
//! contention instead of one heartbeat round per read.

use std::sync::{Arc, Mutex};

use super::super::types::Raft;
use super::forward::{Attempt, not_leader};

/// Reads waiting for the next round, and whether a round is under way.
#[derive(Default)]
struct Rounds {
    running: bool,
    waiting: Vec<tokio::sync::oneshot::Sender<Result<u64, Attempt>>>,
}

/// Batches `ensure_linearizable` across concurrent reads on the leader.
#[derive(Clone, Default)]
pub(super) struct ReadBatcher {
    rounds: Arc<Mutex<Rounds>>,
}

impl std::fmt::Debug for ReadBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadBatcher")
    }
}

impl ReadBatcher {
    /// Confirms leadership with a quorum in a round that starts after this call, waits until
    /// this node applied what was committed then, and returns that read index.
    pub(super) async fn confirm(&self, raft: &Raft) -> Result<u64, Attempt> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let start = {
            let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
            rounds.waiting.push(sender);
            !std::mem::replace(&mut rounds.running, true)
        };
        if start {
            // In its own task: a reader that gives up does not stop the round for the others.
            tokio::spawn(run_rounds(self.rounds.clone(), raft.clone()));
        }
        receiver
            .await
            .unwrap_or_else(|_| Err(Attempt::Retry("the read round was dropped".into())))
    }
}

/// Runs rounds while reads wait: each round answers the reads that were waiting when it
/// started.
async fn run_rounds(rounds: Arc<Mutex<Rounds>>, raft: Raft) {
    loop {
        let batch = {
            let mut rounds = rounds.lock().unwrap_or_else(|p| p.into_inner());
            if rounds.waiting.is_empty() {
                rounds.running = false;
                return;
            }
            std::mem::take(&mut rounds.waiting)
        };
        let result = raft
            .ensure_linearizable()
            .await
            .map(|read_log_id| read_log_id.map(|log_id| log_id.index).unwrap_or(0))
            .map_err(not_leader);
        for reader in batch {
            let _ = reader.send(result.clone());
        }
    }
}
