//! What a running controller counts.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

/// What a running controller counts, for `ListControllers` and a replica's report.
#[derive(Debug, Default)]
pub struct Stats {
    pub(super) running: AtomicBool,
    queue_depth: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    /// The last error, and when the last reconcile ended.
    last: Mutex<(Option<String>, Option<SystemTime>)>,
}

impl Stats {
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    pub fn queue_depth(&self) -> u64 {
        self.queue_depth.load(Ordering::Relaxed)
    }

    pub fn reconciles_ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    pub fn reconciles_failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub fn last_error(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .0
            .clone()
    }

    pub fn last_reconcile(&self) -> Option<SystemTime> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    /// Records a reconcile that ended now, with its error if it failed.
    pub fn reconciled(&self, error: Option<&str>) {
        match error {
            None => self.ok.fetch_add(1, Ordering::Relaxed),
            Some(_) => self.failed.fetch_add(1, Ordering::Relaxed),
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(error) = error {
            last.0 = Some(error.to_owned());
        }
        last.1 = Some(SystemTime::now());
    }

    pub(super) fn set_queue_depth(&self, depth: usize) {
        self.queue_depth
            .store(u64::try_from(depth).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}
