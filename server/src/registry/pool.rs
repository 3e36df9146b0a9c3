//! The bounded pool where tenants' code runs (DESIGN §15, "the costs are bounded"): compiling a
//! Type's schema and evaluating its rules happen here, on blocking threads, a few at a time, so
//! a costly rule or schema never holds an async worker (health, management writes and raft go
//! on) and never takes more than its share of the cores.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// At most this many jobs run at once; the others wait their turn (within their caller's
/// deadline: a caller that goes away leaves the queue).
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    permits: Arc<Semaphore>,
}

/// The pool stopped (the runtime is shutting down) or the job panicked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the rule pool could not run the job: {0}")]
pub(crate) struct PoolError(pub String);

impl Default for Pool {
    fn default() -> Self {
        // Half the cores: the other half stays free for the async workers and raft.
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Pool::new((cores / 2).max(1))
    }
}

impl Pool {
    pub(crate) fn new(jobs: usize) -> Self {
        Pool {
            permits: Arc::new(Semaphore::new(jobs.max(1))),
        }
    }

    /// Runs `job` on a blocking thread once a place is free.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| PoolError("closed".into()))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job()
        })
        .await
        .map_err(|error| PoolError(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_at_most_its_size_at_once() {
        let pool = Pool::new(2);
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let jobs: Vec<_> = (0..8)
            .map(|_| {
                let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    pool.run(move || {
                        use std::sync::atomic::Ordering::SeqCst;
                        let now = running.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        running.fetch_sub(1, SeqCst);
                    })
                    .await
                })
            })
            .collect();
        for job in jobs {
            job.await.expect("joins").expect("runs");
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_not_a_crash() {
        let pool = Pool::new(1);
        #[allow(clippy::panic)]
        let failed = pool.run(|| -> u32 { panic!("boom") }).await;
        assert!(failed.is_err());
        assert_eq!(pool.run(|| 7).await, Ok(7));
    }
}
