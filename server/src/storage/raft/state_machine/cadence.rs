//! When a raft snapshot is due. openraft's own policy counts log entries, but one entry carries
//! a whole batch of writes (about 20 with 64 clients writing), so "every 10,000 entries" meant
//! every 200,000 writes or so under load and every 10,000 with one client: a load of a million
//! resources built no snapshot at all, and the log (and an unclean restart's replay) kept every
//! write. The cadence counts writes instead, and grows with the state: a snapshot copies the
//! whole state, so it waits until a quarter as many writes as the state holds resources have
//! been applied since the last one. Copying then costs at most four records per write, and an
//! unclean restart replays at most a quarter of the state on top of the snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// The state's resources per write since the last snapshot before another is due.
const STATE_PER_WRITE: u64 = 4;

#[derive(Debug, Default)]
pub struct SnapshotCadence {
    /// `--snapshot-every`: the fewest writes between snapshots (0: none by writes).
    every: AtomicU64,
    /// Writes applied since this node opened its state.
    written: AtomicU64,
    /// `written` when the state the last snapshot copied was read.
    at_snapshot: AtomicU64,
    /// The writes the last due snapshot waited for.
    threshold: AtomicU64,
    due: tokio::sync::Notify,
}

impl SnapshotCadence {
    pub fn set_every(&self, every: u64) {
        self.every.store(every, Ordering::Relaxed);
    }

    /// Counts `writes` just applied to a state of `resources`; says (and wakes [`Self::due`])
    /// whether a snapshot is due.
    pub fn applied(&self, writes: u64, resources: u64) -> bool {
        if writes == 0 {
            return false;
        }
        self.written.fetch_add(writes, Ordering::Relaxed);
        let every = self.every.load(Ordering::Relaxed);
        self.threshold
            .store(every.max(resources / STATE_PER_WRITE), Ordering::Relaxed);
        let due = self.is_due();
        if due {
            self.due.notify_one();
        }
        due
    }

    /// Whether a snapshot is due now (an ask raft queued while the last one was being built
    /// may reach the builder after it finished).
    pub fn is_due(&self) -> bool {
        let every = self.every.load(Ordering::Relaxed);
        let since = self
            .written
            .load(Ordering::Relaxed)
            .saturating_sub(self.at_snapshot.load(Ordering::Relaxed));
        every > 0 && since >= self.threshold.load(Ordering::Relaxed).max(every)
    }

    /// Whether the cadence is set (a node's state machine) and no snapshot is due by it.
    pub fn nothing_due(&self) -> bool {
        self.every.load(Ordering::Relaxed) > 0 && !self.is_due()
    }

    /// The writes count to record with [`Self::snapshot_taken`] once a snapshot of the state as
    /// it is now is safely built.
    pub fn mark(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// A snapshot of the state as of `mark` was built or installed.
    pub fn snapshot_taken(&self, mark: u64) {
        self.at_snapshot.fetch_max(mark, Ordering::Relaxed);
    }

    /// Building a snapshot failed: the next try waits for half as many writes again as the
    /// last one did (not every apply, while the disk that failed it may fail it again).
    pub fn postpone(&self) {
        let written = self.written.load(Ordering::Relaxed);
        let threshold = self.threshold.load(Ordering::Relaxed);
        let half = (threshold / 2).max(1);
        // Due again once `half` more writes are applied.
        self.at_snapshot.fetch_max(
            (written + half).saturating_sub(threshold),
            Ordering::Relaxed,
        );
    }

    /// Waits until a snapshot is due (a due that came while nobody waited is kept).
    pub async fn due(&self) {
        self.due.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_due_by_writes_not_entries_and_no_sooner_than_a_quarter_of_the_state() {
        let cadence = SnapshotCadence::default();
        assert!(!cadence.applied(50, 10), "off until every is set");
        cadence.set_every(100);
        assert!(!cadence.applied(49, 10), "99 writes since open");
        assert!(
            cadence.applied(1, 10),
            "one batch entry of many writes counts them all"
        );
        let mark = cadence.mark();
        cadence.snapshot_taken(mark);
        assert!(!cadence.is_due(), "just taken");
        assert!(!cadence.applied(99, 10));
        assert!(cadence.applied(1, 10));
        assert!(cadence.is_due());
        cadence.snapshot_taken(cadence.mark());
        // A state of 1,000 resources waits for 250 writes, not 100.
        assert!(!cadence.applied(249, 1_000));
        assert!(cadence.applied(1, 1_000));
        assert!(
            !cadence.applied(0, 1_000),
            "an entry with no writes is never the one"
        );
    }

    #[test]
    fn an_older_snapshot_finishing_late_does_not_move_the_mark_back() {
        let cadence = SnapshotCadence::default();
        cadence.set_every(10);
        cadence.applied(30, 0);
        cadence.snapshot_taken(30);
        cadence.snapshot_taken(10);
        assert!(!cadence.applied(9, 0));
        assert!(cadence.applied(1, 0));
    }

    #[test]
    fn a_failed_snapshot_is_tried_again_after_half_as_many_writes() {
        let cadence = SnapshotCadence::default();
        cadence.set_every(100);
        assert!(cadence.applied(100, 0));
        cadence.postpone();
        assert!(
            !cadence.applied(49, 0),
            "not on every apply after a failure"
        );
        assert!(cadence.applied(1, 0), "again after half the writes");
    }

    #[tokio::test]
    async fn a_due_that_came_while_nobody_waited_is_kept() {
        let cadence = SnapshotCadence::default();
        cadence.set_every(1);
        assert!(cadence.applied(1, 0));
        tokio::time::timeout(std::time::Duration::from_secs(5), cadence.due())
            .await
            .expect("the due was kept for the next waiter");
    }
}
