//! Watches whose client stopped reading are ended, so what they hold is given back.
//!
//! A watch holds its place in the history and the events it has not sent yet (its snapshot's,
//! shared with other watchers of the same versions, and a batch of changes). A client that
//! stops reading while events wait for it would hold them, and every version of every resource
//! its snapshot named, for as long as its connection lives. [`Stalls`] notices: a watch that
//! handed an event to its transport and was not asked for the next one within
//! [`STALLED_AFTER`] is cut. What it held is dropped at once; the client, when it reads again,
//! gets everything sent before and then `ABORTED` naming the version to resume from (or, in the
//! snapshot, saying to watch again). A watch that waits for changes is never cut: it holds
//! nothing.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;

use super::Error;
use super::read::SharedWatchStream;
use crate::storage::{Operation, SharedEvent};

/// How long a watch may wait for its client to read an event it was handed before it is cut.
pub(crate) const STALLED_AFTER: Duration = Duration::from_secs(30);
/// How often open watches are looked at.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The open watches of a node, swept for stalled ones.
#[derive(Debug)]
pub(crate) struct Stalls {
    watches: Mutex<Vec<Weak<Slot>>>,
    stalled_after: Duration,
    /// Set once the sweeping task runs (it stops when this is dropped).
    sweeping: std::sync::OnceLock<()>,
}

impl Default for Stalls {
    fn default() -> Self {
        Stalls::new(STALLED_AFTER)
    }
}

/// One watch's state, shared by its stream and the sweeper.
struct Slot {
    state: Mutex<SlotState>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

struct SlotState {
    /// `None` once the watch ended or was cut.
    events: Option<SharedWatchStream>,
    /// Since when the reader has not asked for what waits for it (the watch's start, or the
    /// last event handed out); `None` while the reader waits for events.
    handed_at: Option<Instant>,
    /// The version a resumed watch starts after: the snapshot's end, then each change's.
    /// `None` while the snapshot is being sent.
    resume_from: Option<String>,
    /// Why the watch was cut, until its reader learns it.
    cut: Option<Error>,
}

impl Stalls {
    pub(crate) fn new(stalled_after: Duration) -> Stalls {
        Stalls {
            watches: Mutex::default(),
            stalled_after,
            sweeping: std::sync::OnceLock::new(),
        }
    }

    /// `events`, cut if its reader stalls. Needs a Tokio runtime (the sweeper runs on it).
    pub(crate) fn watch(self: &Arc<Self>, events: SharedWatchStream) -> Watched {
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState {
                events: Some(events),
                // A new watch has its snapshot's end (at least) to send: a client that never
                // asks for it (an HTTP/2 window of zero) is stalled from the start.
                handed_at: Some(Instant::now()),
                resume_from: None,
                cut: None,
            }),
        });
        self.lock().push(Arc::downgrade(&slot));
        self.sweeping.get_or_init(|| {
            tokio::spawn(sweep(Arc::downgrade(self)));
        });
        Watched { slot }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Slot>>> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts the watches stalled now; forgets the ended ones. Returns how many it cut.
    fn sweep_once(&self) -> usize {
        let slots: Vec<Arc<Slot>> = {
            let mut watches = self.lock();
            watches.retain(|slot| slot.strong_count() > 0);
            watches.iter().filter_map(Weak::upgrade).collect()
        };
        let mut cut = 0;
        for slot in slots {
            let mut state = slot.lock();
            let stalled = state.events.is_some()
                && state
                    .handed_at
                    .is_some_and(|at| at.elapsed() >= self.stalled_after);
            if !stalled {
                continue;
            }
            let seconds = self.stalled_after.as_secs();
            let error = match &state.resume_from {
                Some(version) => Error::Aborted(format!(
                    "watch ended: its client read nothing for {seconds} s while changes waited (a stalled or overloaded client); watch again with since_version={version} to resume where it stopped"
                )),
                None => Error::Aborted(format!(
                    "watch ended: its client read nothing for {seconds} s while its snapshot was being sent (a stalled or overloaded client); watch again"
                )),
            };
            tracing::info!(%error, "ending a stalled watch");
            // Dropping the stream gives back its place in the history and its events.
            state.events = None;
            state.cut = Some(error);
            cut += 1;
        }
        cut
    }

    /// Watches open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.lock()
            .iter()
            .filter(|slot| slot.strong_count() > 0)
            .count()
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn sweep(stalls: Weak<Stalls>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(stalls) = stalls.upgrade() else {
            return;
        };
        stalls.sweep_once();
    }
}

/// A watch's events, as long as its reader keeps reading (see the module docs).
pub(crate) struct Watched {
    slot: Arc<Slot>,
}

impl Stream for Watched {
    type Item = Result<SharedEvent, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut state = self.slot.lock();
        if let Some(error) = state.cut.take() {
            return Poll::Ready(Some(Err(error)));
        }
        let Some(events) = state.events.as_mut() else {
            return Poll::Ready(None);
        };
        match events.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(event))) => {
                match &event.event().operation {
                    Operation::EndOfSnapshot => {
                        state.resume_from = Some(event.event().version.clone());
                    }
                    Operation::Upsert(_) | Operation::Delete(_) | Operation::Bookmark => {
                        if state.resume_from.is_some() {
                            state.resume_from = Some(event.event().version.clone());
                        }
                    }
                }
                state.handed_at = Some(Instant::now());
                Poll::Ready(Some(Ok(event)))
            }
            Poll::Ready(Some(Err(error))) => {
                state.events = None;
                Poll::Ready(Some(Err(error)))
            }
            Poll::Ready(None) => {
                state.events = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                state.handed_at = None;
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;
    use crate::storage::WatchEvent;
    use crate::storage::conformance::Fixture;

    fn event(version: &str, operation: Operation) -> Result<SharedEvent, Error> {
        Ok(SharedEvent::new(WatchEvent {
            version: version.into(),
            operation,
            actor: String::new(),
        }))
    }

    /// A snapshot of one artist, its end at version 5, a change at 6, a change at 7, then
    /// nothing (the watch stays open).
    fn events() -> SharedWatchStream {
        let artist = Fixture::new().artist("a");
        futures::stream::iter([
            event("3", Operation::Upsert(artist.clone())),
            event("5", Operation::EndOfSnapshot),
            event("6", Operation::Upsert(artist.clone())),
            event("7", Operation::Upsert(artist)),
        ])
        .chain(futures::stream::pending())
        .boxed()
    }

    #[tokio::test]
    async fn a_reader_that_stops_reading_is_cut_with_the_version_to_resume_from() {
        let stalls = Arc::new(Stalls::new(Duration::ZERO));
        let mut watch = stalls.watch(events());
        for _ in 0..3 {
            watch.next().await.expect("an event").expect("ok");
        }
        assert_eq!(
            stalls.sweep_once(),
            1,
            "handed an event and never asked again"
        );
        let error = watch.next().await.expect("the cut").expect_err("an error");
        assert!(
            matches!(&error, Error::Aborted(m) if m.contains("since_version=6")),
            "{error}"
        );
        assert!(watch.next().await.is_none(), "and then the end");
        assert_eq!(stalls.sweep_once(), 0);
    }

    #[tokio::test]
    async fn a_reader_cut_in_the_snapshot_is_told_to_watch_again() {
        let stalls = Arc::new(Stalls::new(Duration::ZERO));
        let mut watch = stalls.watch(events());
        watch.next().await.expect("an event").expect("ok");
        stalls.sweep_once();
        let error = watch.next().await.expect("the cut").expect_err("an error");
        assert!(
            matches!(&error, Error::Aborted(m) if !m.contains("since_version") && m.contains("snapshot")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_watch_waiting_for_changes_is_never_cut_and_ended_ones_are_forgotten() {
        let stalls = Arc::new(Stalls::new(Duration::ZERO));
        let mut watch = stalls.watch(events());
        for _ in 0..4 {
            watch.next().await.expect("an event").expect("ok");
        }
        // The reader asks again and waits: nothing is held for it.
        let waiting = tokio::time::timeout(Duration::from_millis(20), watch.next()).await;
        assert!(waiting.is_err(), "nothing more to read");
        assert_eq!(stalls.sweep_once(), 0);
        assert_eq!(stalls.open(), 1);
        drop(watch);
        assert_eq!(stalls.open(), 0);
    }

    #[tokio::test]
    async fn a_watch_whose_reader_never_asks_is_cut_too() {
        let stalls = Arc::new(Stalls::new(Duration::ZERO));
        let mut watch = stalls.watch(events());
        // An HTTP/2 window of zero: the transport never polls the watch.
        assert_eq!(stalls.sweep_once(), 1);
        let error = watch.next().await.expect("the cut").expect_err("an error");
        assert!(
            matches!(&error, Error::Aborted(m) if m.contains("snapshot")),
            "{error}"
        );
    }
}
