//! Linearizable reads the etcd way: concurrent reads share one leadership confirmation. A read
//! joins the next round that starts after it arrived (never one already under way, which may
//! have confirmed leadership before the read's write it must see); one round per moment of
//! contention instead of one heartbeat round per read.
//!
//! Two places batch this way: the leader's `ensure_linearizable` rounds (one heartbeat round for
//! all reads waiting), and a follower's read-index requests to the leader (one RPC for all reads
//! waiting). The second is linearizable for the same reason as the first: every read of a round
//! arrived before the round's request left, the leader confirms leadership in a round that starts
//! after the request arrived, so the index it answers covers every write finished before any of
//! those reads began.

use std::sync::{Arc, Mutex};

/// Callers waiting for the next round, and whether a round is under way.
struct Rounds<T> {
    running: bool,
    waiting: Vec<tokio::sync::oneshot::Sender<T>>,
}

/// Runs a round for all callers that arrived before it started; `T` is a round's outcome (each
/// caller gets a clone).
pub(super) struct RoundBatcher<T> {
    rounds: Arc<Mutex<Rounds<T>>>,
}

impl<T> Default for RoundBatcher<T> {
    fn default() -> Self {
        RoundBatcher {
            rounds: Arc::new(Mutex::new(Rounds {
                running: false,
                waiting: Vec::new(),
            })),
        }
    }
}

impl<T> Clone for RoundBatcher<T> {
    fn clone(&self) -> Self {
        RoundBatcher {
            rounds: self.rounds.clone(),
        }
    }
}

impl<T> std::fmt::Debug for RoundBatcher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundBatcher")
    }
}

impl<T: Clone + Send + 'static> RoundBatcher<T> {
    /// The outcome of a round of `round` that starts after this call. `round` is used only when
    /// this call starts the rounds (none is under way); the rounds run in their own task, so a
    /// caller that gives up does not stop them for the others. `dropped` answers if the rounds'
    /// task went away without answering (a panic in `round`, the runtime shutting down).
    pub(super) async fn join<F, Fut>(&self, round: F, dropped: impl FnOnce() -> T) -> T
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let start = {
            let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
            rounds.waiting.push(sender);
            !std::mem::replace(&mut rounds.running, true)
        };
        if start {
            tokio::spawn(run_rounds(self.rounds.clone(), round));
        }
        receiver.await.unwrap_or_else(|_| dropped())
    }
}

/// Runs rounds while callers wait: each round answers the callers that were waiting when it
/// started.
async fn run_rounds<T, F, Fut>(rounds: Arc<Mutex<Rounds<T>>>, round: F)
where
    T: Clone,
    F: Fn() -> Fut,
    Fut: Future<Output = T>,
{
    // Whatever else ends this task (a panic in `round`, the runtime dropping it), the next
    // caller must be able to start rounds again.
    struct Running<'a, T> {
        rounds: &'a Mutex<Rounds<T>>,
        ended: bool,
    }
    impl<T> Drop for Running<'_, T> {
        fn drop(&mut self) {
            if self.ended {
                return;
            }
            let mut rounds = self.rounds.lock().unwrap_or_else(|p| p.into_inner());
            rounds.running = false;
            // Waiting callers see their senders dropped and get `dropped()`.
            rounds.waiting.clear();
        }
    }
    let mut running = Running {
        rounds: &rounds,
        ended: false,
    };
    loop {
        let batch = {
            let mut rounds = rounds.lock().unwrap_or_else(|p| p.into_inner());
            if rounds.waiting.is_empty() {
                // Under the same lock that found nobody waiting: a caller that comes after
                // sees no round under way and starts the next one itself.
                rounds.running = false;
                running.ended = true;
                return;
            }
            std::mem::take(&mut rounds.waiting)
        };
        let outcome = round().await;
        for caller in batch {
            let _ = caller.send(outcome.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn callers_that_arrive_during_a_round_share_the_next_one() {
        let batcher = RoundBatcher::<usize>::default();
        let rounds = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let round = {
            let rounds = rounds.clone();
            move || {
                let rounds = rounds.clone();
                let mut released = released.clone();
                async move {
                    let number = rounds.fetch_add(1, Ordering::SeqCst) + 1;
                    let _ = released.wait_for(|go| *go).await;
                    number
                }
            }
        };
        // The first caller starts round 1 and holds it open.
        let first = tokio::spawn({
            let batcher = batcher.clone();
            let round = round.clone();
            async move { batcher.join(round, || 0).await }
        });
        while rounds.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Ten callers arrive while round 1 runs: they must not be answered by it.
        let mut later = Vec::new();
        for _ in 0..10 {
            let batcher = batcher.clone();
            let round = round.clone();
            later.push(tokio::spawn(async move { batcher.join(round, || 0).await }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        release.send_replace(true);
        assert_eq!(first.await.expect("joined"), 1);
        for caller in later {
            assert_eq!(caller.await.expect("joined"), 2, "one shared later round");
        }
        assert_eq!(rounds.load(Ordering::SeqCst), 2);
        // Idle again: the next caller starts a new round.
        assert_eq!(batcher.join(round, || 0).await, 3);
    }

    /// The rounds' task ends when it finds nobody waiting; a caller that arrives just then must
    /// start the next round or be answered, never be dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_caller_arriving_as_the_rounds_end_is_answered() {
        let batcher = RoundBatcher::<u32>::default();
        let round = || async { 1 };
        let mut dropped = 0;
        for _ in 0..2_000 {
            let callers: Vec<_> = (0..4)
                .map(|_| {
                    let batcher = batcher.clone();
                    tokio::spawn(async move { batcher.join(round, || 0).await })
                })
                .collect();
            for caller in callers {
                if caller.await.expect("joined") == 0 {
                    dropped += 1;
                }
            }
        }
        assert_eq!(dropped, 0, "callers answered as dropped");
    }

    #[tokio::test]
    async fn a_caller_that_gives_up_does_not_stop_the_round_for_the_others() {
        let batcher = RoundBatcher::<u32>::default();
        let round = || async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            7
        };
        let impatient = tokio::time::timeout(Duration::from_millis(5), batcher.join(round, || 0));
        let patient = batcher.clone();
        let patient = tokio::spawn(async move { patient.join(round, || 0).await });
        assert!(impatient.await.is_err(), "the impatient caller timed out");
        assert_eq!(patient.await.expect("joined"), 7);
    }
}
