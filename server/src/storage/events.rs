//! [`EventLog`]: the watch events a backend publishes after each commit, a bounded history of
//! them for resuming watches, and the streams watchers read.
//!
//! A backend owns one `EventLog` under the same lock it commits with: it publishes after each
//! commit, and a new watcher takes its snapshot (or replay) and subscribes under that lock, so
//! it sees every later change exactly once.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use proto::resource::v1::{Resource, Tenancy};
use tokio::sync::broadcast;

use super::{Operation, StorageError, StorageKey, UnversionedType, Version, Watch, WatchEvent};

/// Changes kept for resuming watches.
pub const DEFAULT_HISTORY: usize = 16 * 1024;
/// How far a watcher may fall behind before its watch is closed.
pub const DEFAULT_WATCH_BUFFER: usize = 16 * 1024;

/// One published item.
// Items live behind an `Arc`; the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Published {
    Change {
        key: StorageKey,
        event: WatchEvent,
        version: Version,
    },
    /// The whole state was replaced: every watch ends and must list again.
    Reset { reason: String },
}

/// What a watch selects.
#[derive(Debug, Clone)]
pub struct WatchFilter {
    pub resource_type: UnversionedType,
    pub tenancy: Tenancy,
    pub name_prefix: String,
}

impl WatchFilter {
    pub fn new(resource_type: &UnversionedType, tenancy: &Tenancy, name_prefix: &str) -> Self {
        WatchFilter {
            resource_type: resource_type.clone(),
            tenancy: tenancy.clone(),
            name_prefix: name_prefix.to_owned(),
        }
    }

    pub fn matches(&self, key: &StorageKey) -> bool {
        key.matches(&self.resource_type, &self.tenancy, &self.name_prefix)
    }
}

#[derive(Debug)]
pub struct EventLog {
    history: VecDeque<Arc<Published>>,
    capacity: usize,
    /// Every change after this version is in `history`.
    floor: Version,
    /// The newest change published (or the floor).
    latest: Version,
    sender: broadcast::Sender<Arc<Published>>,
}

impl EventLog {
    /// A log whose history starts at version `floor` (what was applied when it was created).
    pub fn new(capacity: usize, watch_buffer: usize, floor: Version) -> Self {
        let (sender, _) = broadcast::channel(watch_buffer.max(1));
        EventLog {
            history: VecDeque::new(),
            capacity: capacity.max(1),
            floor,
            latest: floor,
            sender,
        }
    }

    pub fn publish_change(&mut self, key: StorageKey, event: WatchEvent, version: Version) {
        self.latest = self.latest.max(version);
        let published = Arc::new(Published::Change {
            key,
            event,
            version,
        });
        if self.history.len() >= self.capacity
            && let Some(evicted) = self.history.pop_front()
            && let Published::Change { version, .. } = evicted.as_ref()
        {
            self.floor = *version;
        }
        self.history.push_back(published.clone());
        // No receivers is fine: nobody is watching.
        let _ = self.sender.send(published);
    }

    /// Ends every watch; resumes from before `index` are no longer possible.
    pub fn reset(&mut self, reason: String, version: Version) {
        self.history.clear();
        self.floor = version;
        self.latest = version;
        let _ = self.sender.send(Arc::new(Published::Reset { reason }));
    }

    /// Starts a watch. `snapshot` is what matches now (ignored when resuming); `applied` is the
    /// version the state is at (changes within that entry may be newer). Call under the lock
    /// that publishing happens under.
    pub fn watch(
        &self,
        filter: WatchFilter,
        snapshot: Vec<Resource>,
        applied: Version,
        since: Option<Version>,
    ) -> Result<Watch, StorageError> {
        let current = self.latest.max(applied);
        let initial: Vec<WatchEvent> = match since {
            None => snapshot
                .into_iter()
                .map(|resource| WatchEvent {
                    version: resource.version.clone(),
                    operation: Operation::Upsert(resource),
                })
                .collect(),
            Some(since) if since > current => {
                return Err(StorageError::ResumeUnavailable(format!(
                    "version {since} is ahead of this server, which has applied up to {current} (it may lag behind the leader); retry shortly or list again"
                )));
            }
            Some(since) if since < self.floor => {
                return Err(StorageError::ResumeUnavailable(format!(
                    "version {since} is older than the history this server keeps (it can resume from {} on); list again and watch from scratch",
                    self.floor
                )));
            }
            Some(since) => self
                .history
                .iter()
                .filter_map(|published| match published.as_ref() {
                    Published::Change {
                        key,
                        event,
                        version,
                    } if *version > since && filter.matches(key) => Some(event.clone()),
                    _ => None,
                })
                .collect(),
        };
        let receiver = self.sender.subscribe();
        let caught_up = WatchEvent {
            version: current.to_string(),
            operation: Operation::EndOfSnapshot,
        };
        let initial = initial
            .into_iter()
            .chain(std::iter::once(caught_up))
            .map(Ok);
        Ok(futures::stream::iter(initial)
            .chain(follow(receiver, filter))
            .boxed())
    }
}

/// The changes after the start of a watch, filtered; a reset or a lag ends it with an error.
fn follow(
    receiver: broadcast::Receiver<Arc<Published>>,
    filter: WatchFilter,
) -> impl Stream<Item = Result<WatchEvent, StorageError>> + Send {
    futures::stream::unfold(Some((receiver, filter)), |state| async move {
        let (mut receiver, filter) = state?;
        loop {
            match receiver.recv().await {
                Ok(published) => match published.as_ref() {
                    Published::Change { key, event, .. } => {
                        if filter.matches(key) {
                            return Some((Ok(event.clone()), Some((receiver, filter))));
                        }
                    }
                    Published::Reset { reason } => {
                        return Some((Err(StorageError::WatchClosed(reason.clone())), None));
                    }
                },
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    let error = StorageError::WatchClosed(format!(
                        "the watcher fell {missed} events behind; resume from its last version or list again"
                    ));
                    return Some((Err(error), None));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}
