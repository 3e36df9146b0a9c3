//! [`WorkQueue`]: what a controller has to reconcile, by key.
//!
//! - A key is queued once however often it is added (deduplicated).
//! - A key is never handed out twice at once: adding a key that is being reconciled marks it
//!   dirty, and it is queued again (once) when the running reconcile is done — events that arrive
//!   during a run coalesce into one re-run.
//! - A delayed add keeps the earliest deadline; an immediate add beats any delay.
//! - Failures back off exponentially per key (`base * 2^failures`, capped at `max`) until the key
//!   succeeds ([`WorkQueue::forget`]).
//!
//! The shape follows client-go's workqueue and kube-rs's scheduler.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The longest a key waits (a reconciler's `Requeue(Duration::MAX)` must not overflow the
/// clock).
const LONGEST_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Exponential backoff bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (the first failure waits `base`).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }
}

#[derive(Debug)]
struct State<K> {
    /// Keys ready now, in arrival order, and the same as a set (asked on every add: a queue
    /// of many thousand keys must not be searched one by one).
    ready: VecDeque<K>,
    queued: HashSet<K>,
    /// Keys waiting for a deadline: the deadline per key, and the same ordered by time.
    deadlines: HashMap<K, (Instant, u64)>,
    timeline: BTreeSet<(Instant, u64)>,
    by_slot: HashMap<(Instant, u64), K>,
    sequence: u64,
    /// Keys being reconciled now.
    running: HashSet<K>,
    /// Keys added while running: queued again when they are done.
    dirty: HashSet<K>,
    failures: HashMap<K, u32>,
    shut_down: bool,
}

/// A keyed, deduplicating work queue with delays and per-key backoff.
#[derive(Debug)]
pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    changed: Notify,
    backoff: Backoff,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn new(backoff: Backoff) -> Self {
        WorkQueue {
            state: Mutex::new(State {
                ready: VecDeque::new(),
                queued: HashSet::new(),
                deadlines: HashMap::new(),
                timeline: BTreeSet::new(),
                by_slot: HashMap::new(),
                sequence: 0,
                running: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
                shut_down: false,
            }),
            changed: Notify::new(),
            backoff,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // Every update below leaves the state consistent at each step, so a poisoned lock (a
        // panic elsewhere while holding it) still guards a usable queue.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `key` to run as soon as possible.
    pub fn add(&self, key: K) {
        let mut state = self.lock();
        if state.shut_down {
            return;
        }
        if state.running.contains(&key) {
            state.dirty.insert(key);
            return;
        }
        Self::clear_deadline(&mut state, &key);
        Self::enqueue(&mut state, key);
        drop(state);
        self.changed.notify_one();
    }

    /// Queues `key` to run after `delay` (at most a year: a longer one, `Duration::MAX`
    /// included, is a year), unless it is already due sooner.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let delay = delay.min(LONGEST_DELAY);
        let deadline = Instant::now() + delay;
        let mut state = self.lock();
        if state.shut_down || state.queued.contains(&key) {
            return;
        }
        if state.running.contains(&key) {
            // Runs again when done anyway if dirty; otherwise remember the deadline.
            if state.dirty.contains(&key) {
                return;
            }
        }
        if let Some((existing, _)) = state.deadlines.get(&key)
            && *existing <= deadline
        {
            return;
        }
        Self::clear_deadline(&mut state, &key);
        state.sequence += 1;
        let slot = (deadline, state.sequence);
        state.deadlines.insert(key.clone(), slot);
        state.timeline.insert(slot);
        state.by_slot.insert(slot, key);
        drop(state);
        self.changed.notify_one();
    }

    /// Queues `key` after its backoff delay and counts a failure.
    pub fn add_with_backoff(&self, key: K) -> Duration {
        let failures = {
            let mut state = self.lock();
            let failures = state.failures.entry(key.clone()).or_insert(0);
            *failures = failures.saturating_add(1);
            *failures
        };
        let delay = self.backoff.delay(failures);
        self.add_after(key, delay);
        delay
    }

    /// Consecutive failures of `key` since it last succeeded.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Resets the backoff of `key` (it succeeded).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Marks a key handed out by [`WorkQueue::next`] as finished; if it was added meanwhile, it
    /// is queued again now.
    pub fn done(&self, key: &K) {
        let mut state = self.lock();
        state.running.remove(key);
        if state.dirty.remove(key) && !state.shut_down {
            Self::clear_deadline(&mut state, key);
            Self::enqueue(&mut state, key.clone());
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Keys waiting (ready, delayed, or dirty while running).
    pub fn len(&self) -> usize {
        let state = self.lock();
        state.ready.len() + state.deadlines.len() + state.dirty.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether [`WorkQueue::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.lock().shut_down
    }

    /// Stops the queue: waiting callers of `next` get `None`; adds are ignored.
    pub fn shutdown(&self) {
        self.lock().shut_down = true;
        self.changed.notify_waiters();
    }

    /// The next key to reconcile, waiting until one is due; `None` once shut down. The caller
    /// must call [`WorkQueue::done`] with it afterwards.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake_at = {
                let mut state = self.lock();
                if state.shut_down {
                    return None;
                }
                Self::promote_due(&mut state, Instant::now());
                if let Some(position) = state
                    .ready
                    .iter()
                    .position(|key| !state.running.contains(key))
                    && let Some(key) = state.ready.remove(position)
                {
                    state.queued.remove(&key);
                    state.running.insert(key.clone());
                    // Another waiter may take the next ready key.
                    if !state.ready.is_empty() {
                        self.changed.notify_one();
                    }
                    return Some(key);
                }
                state.timeline.first().map(|(deadline, _)| *deadline)
            };
            match wake_at {
                Some(deadline) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Puts `key` at the end of the ready keys unless it is among them.
    fn enqueue(state: &mut State<K>, key: K) {
        if state.queued.insert(key.clone()) {
            state.ready.push_back(key);
        }
    }

    fn clear_deadline(state: &mut State<K>, key: &K) {
        if let Some(slot) = state.deadlines.remove(key) {
            state.timeline.remove(&slot);
            state.by_slot.remove(&slot);
        }
    }

    fn promote_due(state: &mut State<K>, now: Instant) {
        while let Some(slot) = state.timeline.first().copied() {
            if slot.0 > now {
                break;
            }
            state.timeline.remove(&slot);
            if let Some(key) = state.by_slot.remove(&slot) {
                state.deadlines.remove(&key);
                if state.running.contains(&key) {
                    state.dirty.insert(key);
                } else {
                    Self::enqueue(state, key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
