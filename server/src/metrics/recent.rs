//! The last minute of one recorder, per second: how many writes it handled and how long each
//! run took, for `Status` (recent write rate, p99) and the dashboard's sparkline. Every
//! observation also goes into a Prometheus histogram, so the two never disagree.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::histogram::Histogram;

/// Seconds kept.
pub(crate) const WINDOW_SECONDS: usize = 60;

/// Latency buckets of the per-second slots (upper bounds, seconds): 50 µs × 2^n.
const BUCKETS: usize = 18;

fn bucket_bound(index: usize) -> f64 {
    0.00005 * f64::from(1u32 << index.min(31))
}

fn bucket_of(seconds: f64) -> usize {
    (0..BUCKETS)
        .find(|index| seconds <= bucket_bound(*index))
        .unwrap_or(BUCKETS - 1)
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// The second (since the epoch) this slot holds; stale slots are ignored.
    second: u64,
    writes: u64,
    latencies: [u64; BUCKETS],
}

/// A recorder of runs (each with a duration and a number of writes) over the last minute.
#[derive(Clone, Debug)]
pub struct Recent {
    histogram: Histogram,
    slots: Arc<Mutex<[Slot; WINDOW_SECONDS]>>,
}

impl Default for Recent {
    fn default() -> Self {
        Recent {
            histogram: super::sync_histogram(),
            slots: Arc::new(Mutex::new([Slot::default(); WINDOW_SECONDS])),
        }
    }
}

/// What [`Recent`] saw lately.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecentSummary {
    /// Writes per second over the last 10 complete seconds.
    pub write_rate: f64,
    /// The 99th percentile of run durations over the last 10 complete seconds, in
    /// milliseconds (an upper bound: the bucket it falls in); 0 without runs.
    pub p99_ms: f64,
    /// Writes in each of the last 60 complete seconds, oldest first.
    pub writes_per_second: Vec<u64>,
}

fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Recent {
    /// The cumulative histogram every run is also recorded in.
    pub fn histogram(&self) -> Histogram {
        self.histogram.clone()
    }

    /// Records a run that took `seconds` and handled `writes`.
    pub fn record(&self, seconds: f64, writes: u64) {
        self.record_at(now_second(), seconds, writes);
    }

    fn record_at(&self, second: u64, seconds: f64, writes: u64) {
        self.histogram.observe(seconds);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut slots[(second % WINDOW_SECONDS as u64) as usize];
        if slot.second != second {
            *slot = Slot {
                second,
                ..Slot::default()
            };
        }
        slot.writes += writes;
        slot.latencies[bucket_of(seconds)] += 1;
    }

    pub fn summary(&self) -> RecentSummary {
        self.summary_at(now_second())
    }

    fn summary_at(&self, now: u64) -> RecentSummary {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot_for = |second: u64| {
            let slot = &slots[(second % WINDOW_SECONDS as u64) as usize];
            (slot.second == second).then_some(*slot)
        };
        // Complete seconds only: the current one is still filling.
        let writes_per_second: Vec<u64> = (1..=WINDOW_SECONDS as u64)
            .rev()
            .map(|back| slot_for(now.saturating_sub(back)).map_or(0, |slot| slot.writes))
            .collect();
        let mut latencies = [0u64; BUCKETS];
        let mut writes = 0;
        for back in 1..=10 {
            if let Some(slot) = slot_for(now.saturating_sub(back)) {
                writes += slot.writes;
                for (total, count) in latencies.iter_mut().zip(slot.latencies) {
                    *total += count;
                }
            }
        }
        let runs: u64 = latencies.iter().sum();
        let p99_ms = if runs == 0 {
            0.0
        } else {
            let rank = (runs * 99).div_ceil(100);
            let mut seen = 0;
            let bucket = latencies
                .iter()
                .position(|count| {
                    seen += count;
                    seen >= rank
                })
                .unwrap_or(BUCKETS - 1);
            bucket_bound(bucket) * 1000.0
        };
        RecentSummary {
            write_rate: writes as f64 / 10.0,
            p99_ms,
            writes_per_second,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_p99_cover_the_last_ten_complete_seconds() {
        let recent = Recent::default();
        let now = 1_000_000;
        // 10 s of 100 fast runs (≤ 0.1 ms) with 5 writes each, and two slow ones (≤ 12.8 ms).
        for back in 1..=10 {
            for _ in 0..100 {
                recent.record_at(now - back, 0.00008, 5);
            }
        }
        recent.record_at(now - 3, 0.012, 1);
        recent.record_at(now - 4, 0.012, 1);
        // Older than the window for rate and p99, and the current second: not counted there.
        recent.record_at(now - 30, 1.0, 1000);
        recent.record_at(now, 1.0, 1000);
        let summary = recent.summary_at(now);
        assert_eq!(summary.write_rate, 500.2);
        assert_eq!(summary.p99_ms, 0.1, "2 slow runs of 1002 are under 1%");
        assert_eq!(summary.writes_per_second.len(), WINDOW_SECONDS);
        assert_eq!(summary.writes_per_second[WINDOW_SECONDS - 1], 500);
        assert_eq!(summary.writes_per_second[WINDOW_SECONDS - 30], 1000);
        for _ in 0..20 {
            recent.record_at(now - 1, 0.012, 1);
        }
        assert_eq!(recent.summary_at(now).p99_ms, 12.8);
        // A minute later the slots are stale.
        assert_eq!(
            recent.summary_at(now + 120),
            RecentSummary {
                write_rate: 0.0,
                p99_ms: 0.0,
                writes_per_second: vec![0; WINDOW_SECONDS],
            }
        );
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("apply", "", recent.histogram());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(text.contains("apply_count 1024"), "{text}");
    }
}
