//! Reads that never go back in time (DESIGN §14). After an unclean stop the state machine is
//! rebuilt from an older snapshot, so until this node has applied everything the leader had
//! committed when it came back — at least what it applied before it stopped — it serves no
//! reads: they answer `CatchingUp` ("catching up: applied X of Y"), health says NOT_SERVING,
//! and `Status` says why. A clean stop (or a new node) is ready at once.

use std::sync::Weak;
use std::time::Duration;

use super::super::op::{self, Request};
use super::RaftBackend;
use crate::storage::StorageError;

/// Whether this node may serve reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Rebuilt after an unclean stop: applying up to `target` (unknown until the leader answers).
    CatchingUp {
        applied: u64,
        target: Option<u64>,
    },
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }

    /// Why reads are refused, for people.
    pub fn reason(&self) -> Option<String> {
        match self {
            Readiness::Ready => None,
            Readiness::CatchingUp {
                applied,
                target: Some(target),
            } => Some(format!(
                "catching up after an unclean stop: applied {applied} of {target}"
            )),
            Readiness::CatchingUp {
                applied,
                target: None,
            } => Some(format!(
                "catching up after an unclean stop: applied {applied}, waiting to learn the leader's commit index"
            )),
        }
    }
}

/// Pause between tries to learn the leader's commit index.
const RETRY: Duration = Duration::from_millis(200);

impl RaftBackend {
    /// `Ok` when this node may serve reads, else why not (`CatchingUp`: Unavailable).
    pub(super) fn check_ready(&self) -> Result<(), StorageError> {
        match self.readiness.borrow().reason() {
            None => Ok(()),
            Some(reason) => Err(StorageError::CatchingUp(reason)),
        }
    }

    /// Whether this node may serve reads, as it changes.
    pub fn readiness(&self) -> tokio::sync::watch::Receiver<Readiness> {
        self.readiness.subscribe()
    }

    fn applied_index(&self) -> u64 {
        super::applied_index(&self.raft.metrics().borrow())
    }
}

/// Learns the leader's commit index (a read index), waits until this node has applied it, and
/// declares the node ready. Holds the backend weakly: it ends when the node goes.
pub(super) async fn catch_up(backend: Weak<RaftBackend>) {
    loop {
        let Some(node) = backend.upgrade() else {
            return;
        };
        let applied = node.applied_index();
        match op::expect_read_index(node.submit(Request::ReadIndex).await) {
            Ok(target) => {
                node.readiness.send_replace(Readiness::CatchingUp {
                    applied,
                    target: Some(target),
                });
                let mut metrics = node.raft.metrics();
                loop {
                    let applied = super::applied_index(&metrics.borrow_and_update());
                    if applied >= target {
                        tracing::info!(applied, "caught up after an unclean stop; serving reads");
                        node.readiness.send_replace(Readiness::Ready);
                        return;
                    }
                    node.readiness.send_replace(Readiness::CatchingUp {
                        applied,
                        target: Some(target),
                    });
                    if metrics.changed().await.is_err() {
                        return;
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%error, "catching up: no read index yet");
                node.readiness.send_replace(Readiness::CatchingUp {
                    applied,
                    target: None,
                });
                drop(node);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
