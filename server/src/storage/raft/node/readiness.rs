//! Reads that never go back in time (DESIGN §14). After an unclean stop the state machine is
//! rebuilt from an older snapshot, so until this node has applied everything the leader had
//! committed when it came back — at least what it applied before it stopped — it serves no
//! reads: they answer `CatchingUp` ("catching up: applied X of Y"), health says NOT_SERVING,
//! and `Status` says why. A clean stop (or a new node) is ready at once.

use std::sync::Weak;
use std::time::Duration;

use super::super::op::{self, Request};
use super::RaftNode;
use crate::storage::StorageError;

/// Whether this node may serve reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Readiness {
    Ready,
    /// Rebuilt after an unclean stop: applying up to `target` (unknown until the leader answers).
    CatchingUp {
        applied: u64,
        target: Option<u64>,
    },
    /// Removed from the cluster: serves nothing, for good.
    Removed(crate::storage::Removal),
    /// Its raft log was damaged: repaired from the leader, voting for nobody (see `repair`).
    Repairing {
        applied: u64,
    },
    /// A record of its state failed its checksum (what and where, for its log): it serves
    /// nothing more and restarts to rebuild the state.
    Damaged(String),
    /// More than `threshold` entries behind the leader's commit index (a slow disk, an
    /// overloaded node): reads go elsewhere until it is within half the threshold again.
    Lagging {
        behind: u64,
        threshold: u64,
    },
}

impl Readiness {
    #[cfg(test)]
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }

    /// Why reads are refused, for people.
    pub(crate) fn reason(&self) -> Option<String> {
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
            Readiness::Removed(removal) => Some(removal.why.clone()),
            Readiness::Damaged(_) => Some(
                "its stored state was found damaged (a record failed its checksum): it restarts to rebuild it".into(),
            ),
            Readiness::Lagging { behind, threshold } => Some(format!(
                "lagging: {behind} entries behind the leader's commit index (more than --max-lag-entries {threshold}); a slow disk or an overloaded node?"
            )),
            Readiness::Repairing { applied } => Some(format!(
                "repairing from the leader: its raft log or state was damaged (set aside under raft/damaged-*); applied {applied}; votes for nobody until it holds the leader's log"
            )),
        }
    }
}

/// Pause between tries to learn the leader's commit index.
const RETRY: Duration = Duration::from_millis(200);

impl RaftNode {
    /// `Ok` when this node may serve reads, else why not (`CatchingUp`: Unavailable).
    pub(in crate::storage::raft) fn check_ready(&self) -> Result<(), StorageError> {
        match &*self.readiness.borrow() {
            Readiness::Ready => Ok(()),
            Readiness::Removed(removal) => Err(StorageError::Removed(removal.clone())),
            damaged @ Readiness::Damaged(_) => {
                Err(StorageError::Damaged(damaged.reason().unwrap_or_default()))
            }
            catching_up => {
                let (applied, target) = match catching_up {
                    Readiness::CatchingUp { applied, target } => (Some(*applied), *target),
                    Readiness::Repairing { applied } => (Some(*applied), None),
                    _ => (None, None),
                };
                Err(StorageError::CatchingUp(crate::storage::CatchingUp {
                    why: format!(
                        "this node is {}; retry shortly or ask another member",
                        catching_up.reason().unwrap_or_default()
                    ),
                    applied,
                    target,
                }))
            }
        }
    }

    /// Why this node serves nothing any more, if it was removed from the cluster.
    pub(crate) fn removed(&self) -> Option<crate::storage::Removal> {
        match &*self.readiness.borrow() {
            Readiness::Removed(removal) => Some(removal.clone()),
            _ => None,
        }
    }

    /// Records that this node was removed from the cluster: it serves nothing from now on,
    /// also after a restart, and never campaigns.
    pub(crate) fn mark_removed(&self, removal: crate::storage::Removal) {
        if self.removed().is_some() {
            return;
        }
        let marker = self.data_dir.join(super::super::schema::REMOVED_FILE);
        if let Err(error) = std::fs::write(&marker, removal.to_marker()) {
            tracing::error!(%error, path = %marker.display(), "cannot record the removal");
        }
        tracing::warn!("{removal}; serving nothing from now on");
        self.stop_for_removal(removal);
    }

    /// Stops campaigning and serving (a removed node).
    pub(super) fn stop_for_removal(&self, removal: crate::storage::Removal) {
        let runtime = self.raft.runtime_config();
        runtime.elect(false);
        runtime.heartbeat(false);
        runtime.tick(false);
        self.readiness.send_replace(Readiness::Removed(removal));
    }

    /// Whether this node may serve reads, as it changes.
    pub(crate) fn readiness(&self) -> tokio::sync::watch::Receiver<Readiness> {
        self.readiness.subscribe()
    }

    fn applied_index(&self) -> u64 {
        super::applied_index(&self.raft.metrics().borrow())
    }
}

/// Marks the node `Damaged` once its state machine finds damage (the agent then stops it, to
/// restart and rebuild). Holds the backend weakly: it ends when the node goes.
pub(super) async fn watch_damage(
    backend: Weak<RaftNode>,
    mut damage: tokio::sync::watch::Receiver<Option<String>>,
) {
    let Ok(found) = damage.wait_for(Option::is_some).await else {
        return;
    };
    let why = found.clone().unwrap_or_default();
    drop(found);
    if let Some(node) = backend.upgrade() {
        node.readiness.send_replace(Readiness::Damaged(why));
    }
}

/// How often a follower compares what it applied with the leader's commit index.
const LAG_EVERY: Duration = Duration::from_secs(1);

/// Keeps a follower's readiness honest about its lag: every second it learns the leader's
/// commit index (a read index) and is `Lagging` while it is more than `threshold` entries
/// behind, `Ready` again once within half of it. Leaves every other state alone (catching up,
/// repairing, removed). Holds the backend weakly: it ends when the node goes.
pub(super) async fn watch_lag(backend: Weak<RaftNode>, threshold: u64) {
    loop {
        tokio::time::sleep(LAG_EVERY).await;
        let Some(node) = backend.upgrade() else {
            return;
        };
        let watched = matches!(
            &*node.readiness.borrow(),
            Readiness::Ready | Readiness::Lagging { .. }
        );
        let follows = node
            .raft
            .metrics()
            .borrow()
            .current_leader
            .is_some_and(|leader| leader != node.id);
        if !watched || !follows {
            if watched {
                node.readiness.send_if_modified(|readiness| {
                    let lagging = matches!(readiness, Readiness::Lagging { .. });
                    if lagging {
                        *readiness = Readiness::Ready;
                    }
                    lagging
                });
            }
            continue;
        }
        let Ok(target) = op::expect_read_index(node.submit(Request::ReadIndex).await) else {
            continue;
        };
        let behind = target.saturating_sub(node.applied_index());
        node.readiness
            .send_if_modified(|readiness| match readiness {
                Readiness::Ready if behind > threshold => {
                    tracing::warn!(
                        behind,
                        threshold,
                        "this node lags the leader: not ready until it catches up"
                    );
                    *readiness = Readiness::Lagging { behind, threshold };
                    true
                }
                Readiness::Lagging { .. } if behind <= threshold / 2 => {
                    tracing::info!(behind, "caught up with the leader again: ready");
                    *readiness = Readiness::Ready;
                    true
                }
                Readiness::Lagging { behind: before, .. } if *before != behind => {
                    *before = behind;
                    true
                }
                _ => false,
            });
    }
}

/// Learns the leader's commit index (a read index), waits until this node has applied it, and
/// declares the node ready. Holds the backend weakly: it ends when the node goes.
pub(super) async fn catch_up(backend: Weak<RaftNode>) {
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
