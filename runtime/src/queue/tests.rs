//! Work queue behaviour, on tokio's paused clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Backoff, WorkQueue};

fn queue() -> WorkQueue<&'static str> {
    WorkQueue::new(Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(1),
    })
}

/// The next key if one is due within `within`, else `None`.
async fn next_within(queue: &WorkQueue<&'static str>, within: Duration) -> Option<&'static str> {
    tokio::time::timeout(within, queue.next())
        .await
        .ok()
        .flatten()
}

#[tokio::test(start_paused = true)]
async fn a_key_added_twice_is_handed_out_once() {
    let queue = queue();
    queue.add("a");
    queue.add("a");
    assert_eq!(queue.len(), 1);
    assert_eq!(queue.next().await, Some("a"));
    queue.done(&"a");
    assert_eq!(next_within(&queue, Duration::from_secs(5)).await, None);
}

#[tokio::test(start_paused = true)]
async fn keys_come_out_in_arrival_order() {
    let queue = queue();
    for key in ["c", "a", "b"] {
        queue.add(key);
    }
    let mut order = Vec::new();
    for _ in 0..3 {
        let key = queue.next().await.expect("a key");
        order.push(key);
        queue.done(&key);
    }
    assert_eq!(order, ["c", "a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn a_running_key_is_not_handed_out_again_until_done() {
    let queue = queue();
    queue.add("a");
    assert_eq!(queue.next().await, Some("a"));
    queue.add("a");
    queue.add("a");
    assert_eq!(
        next_within(&queue, Duration::from_secs(5)).await,
        None,
        "not while running"
    );
    queue.done(&"a");
    assert_eq!(
        queue.next().await,
        Some("a"),
        "the adds during the run coalesce into one re-run"
    );
    queue.done(&"a");
    assert_eq!(
        next_within(&queue, Duration::from_secs(5)).await,
        None,
        "and only one"
    );
}

#[tokio::test(start_paused = true)]
async fn different_keys_run_at_the_same_time() {
    let queue = queue();
    queue.add("a");
    queue.add("b");
    assert_eq!(queue.next().await, Some("a"));
    assert_eq!(queue.next().await, Some("b"), "b does not wait for a");
}

#[tokio::test(start_paused = true)]
async fn a_delayed_key_waits_for_its_deadline() {
    let queue = queue();
    let start = Instant::now();
    queue.add_after("a", Duration::from_secs(1));
    assert_eq!(next_within(&queue, Duration::from_millis(999)).await, None);
    assert_eq!(queue.next().await, Some("a"));
    assert!(start.elapsed() >= Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn the_earliest_deadline_wins() {
    let queue = queue();
    let start = Instant::now();
    queue.add_after("a", Duration::from_secs(5));
    queue.add_after("a", Duration::from_secs(1));
    queue.add_after("a", Duration::from_secs(3));
    assert_eq!(queue.next().await, Some("a"));
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    queue.done(&"a");
    assert_eq!(
        next_within(&queue, Duration::from_secs(10)).await,
        None,
        "the later deadlines are gone"
    );
}

#[tokio::test(start_paused = true)]
async fn an_immediate_add_beats_a_delay() {
    let queue = queue();
    let start = Instant::now();
    queue.add_after("a", Duration::from_secs(60));
    queue.add("a");
    assert_eq!(queue.next().await, Some("a"));
    assert!(start.elapsed() < Duration::from_millis(1));
    queue.done(&"a");
    assert_eq!(next_within(&queue, Duration::from_secs(120)).await, None);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_passes_while_running_reruns_after_done() {
    let queue = queue();
    queue.add("a");
    assert_eq!(queue.next().await, Some("a"));
    queue.add_after("a", Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        next_within(&queue, Duration::from_millis(10)).await,
        None,
        "still running"
    );
    queue.done(&"a");
    assert_eq!(queue.next().await, Some("a"));
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_exponentially_up_to_the_cap_and_reset_on_success() {
    let queue = queue();
    let delays: Vec<Duration> = (0..6).map(|_| queue.add_with_backoff("a")).collect();
    assert_eq!(
        delays,
        [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis),
        "base doubling, capped at max"
    );
    assert_eq!(queue.failures(&"a"), 6);
    queue.forget(&"a");
    assert_eq!(queue.failures(&"a"), 0);
    assert_eq!(
        queue.add_with_backoff("a"),
        Duration::from_millis(100),
        "reset after success"
    );
}

#[tokio::test(start_paused = true)]
async fn a_backed_off_key_is_not_run_before_its_delay() {
    let queue = queue();
    queue.add_with_backoff("a");
    queue.add_with_backoff("a");
    let start = Instant::now();
    // The second failure asked for 200ms, but the first deadline (100ms) is earlier and wins.
    assert_eq!(queue.next().await, Some("a"));
    assert!(start.elapsed() >= Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_waiters_with_none_and_ignores_adds() {
    let queue = Arc::new(queue());
    let waiter = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.next().await })
    };
    tokio::task::yield_now().await;
    queue.shutdown();
    assert_eq!(waiter.await.expect("join"), None);
    queue.add("a");
    assert_eq!(queue.next().await, None);
}

#[tokio::test(start_paused = true)]
async fn two_waiters_take_two_ready_keys() {
    let queue = Arc::new(queue());
    let first = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.next().await })
    };
    let second = {
        let queue = queue.clone();
        tokio::spawn(async move { queue.next().await })
    };
    tokio::task::yield_now().await;
    queue.add("a");
    queue.add("b");
    let mut got = vec![first.await.expect("join"), second.await.expect("join")];
    got.sort();
    assert_eq!(got, [Some("a"), Some("b")]);
}

#[test]
fn backoff_delays_never_overflow() {
    let backoff = Backoff {
        base: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };
    assert_eq!(backoff.delay(1), Duration::from_secs(1));
    assert_eq!(backoff.delay(200), Duration::from_secs(30));
    assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(30));
}

/// A reconciler may ask for `Requeue(Duration::MAX)`: the key waits (a year), and nothing
/// overflows the clock.
#[tokio::test(start_paused = true)]
async fn a_delay_past_the_end_of_time_waits_a_year_without_overflowing() {
    let queue = queue();
    queue.add_after("forever", Duration::MAX);
    assert_eq!(queue.len(), 1);
    assert_eq!(next_within(&queue, Duration::from_secs(3600)).await, None);
    queue.add("soon");
    assert_eq!(queue.next().await, Some("soon"));
}

/// Many keys: each is queued once however often it is added, and handed out once, in order.
#[tokio::test]
async fn many_keys_are_queued_once_each_in_order() {
    let queue = WorkQueue::new(Backoff::default());
    for round in 0..3 {
        for key in 0..20_000u32 {
            if round == 1 {
                queue.add_after(key, Duration::from_secs(60));
            } else {
                queue.add(key);
            }
        }
    }
    assert_eq!(queue.len(), 20_000);
    for expected in 0..20_000u32 {
        let key = queue.next().await.expect("a key");
        assert_eq!(key, expected);
        queue.done(&key);
    }
    assert!(queue.is_empty());
    // Added again once handed out: queued again.
    queue.add(7);
    assert_eq!(queue.next().await, Some(7));
}
