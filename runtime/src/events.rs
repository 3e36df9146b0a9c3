//! Events (DESIGN §18): what a controller did and why, recorded by the runtime for every
//! controller (built in or a team's program) as `events.v1.Event` resources.
//!
//! [`Recorder::record`] never waits and never writes: occurrences are merged in memory by
//! (regarding, reason) — the count rises, the message and time are the last one's — and a
//! flusher task writes them at most [`WRITES_PER_SECOND`] a second (a burst of [`BURST`]), each
//! into one Event named from both (its `count` raised by compare-and-swap). A controller that
//! records ten thousand times a second about one object writes one Event about once a second;
//! one that records about more distinct (regarding, reason) pairs than [`MAX_PENDING`] at once
//! loses the excess, counted and said once. Events about objects of cluster or partition scope
//! live in `default/default`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use proto::events::v1::{Event, event};
use proto::resource::v1::{Id, Resource, Tenancy, Type};

use crate::api::{Api, ApiError};

/// Event writes one recorder makes a second, on average.
pub const WRITES_PER_SECOND: u32 = 5;
/// Writes it may make at once after a quiet spell.
pub const BURST: u32 = 20;
/// Distinct (regarding, reason) pairs waiting at most; more are dropped (counted).
pub const MAX_PENDING: usize = 1024;
/// Longest message kept (longer ones are cut).
const MAX_MESSAGE: usize = 1024;
/// Tries of a compare-and-swap that lost to another writer of the same Event.
const CAS_TRIES: usize = 3;

/// How an event reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// The type of Event resources.
pub fn event_type() -> Type {
    Type {
        group: "events".into(),
        group_version: "v1".into(),
        kind: "Event".into(),
    }
}

/// The name of the Event about `regarding` for `reason`: the object's name (cut) and a hash of
/// its type, tenancy, name and uid and the reason. The same pair always names the same Event.
pub fn event_name(regarding: &Id, reason: &str) -> String {
    let tenancy = regarding.tenancy.clone().unwrap_or_default();
    let (group, kind) = regarding
        .r#type
        .as_ref()
        .map(|t| (t.group.as_str(), t.kind.as_str()))
        .unwrap_or_default();
    // FNV-1a, 64 bits: stable across builds and machines.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [
        group,
        kind,
        &tenancy.partition,
        &tenancy.namespace,
        &regarding.name,
        &regarding.uid,
        reason,
    ] {
        for byte in part.as_bytes().iter().chain(std::iter::once(&0u8)) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut base: String = regarding
        .name
        .chars()
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .take(40)
        .collect();
    while base.ends_with('-') {
        base.pop();
    }
    while base.starts_with('-') {
        base.remove(0);
    }
    if base.is_empty() {
        format!("event-{hash:016x}")
    } else {
        format!("{base}-{hash:016x}")
    }
}

/// Where the Event about `regarding` lives: its namespace, or `default/default`.
pub fn event_tenancy(regarding: &Id) -> Tenancy {
    let tenancy = regarding.tenancy.clone().unwrap_or_default();
    if tenancy.namespace.is_empty() {
        Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }
    } else {
        tenancy
    }
}

#[derive(Debug, Clone)]
struct Pending {
    regarding: Id,
    reason: String,
    message: String,
    kind: EventType,
    count: u64,
    first_seen: prost_types::Timestamp,
    last_seen: prost_types::Timestamp,
}

#[derive(Debug, Default)]
struct Queue {
    /// By (event name, tenancy) key.
    pending: HashMap<String, Pending>,
    /// Keys in the order they first arrived (flushed oldest first).
    order: VecDeque<String>,
}

#[derive(Debug)]
struct Shared {
    reporter: String,
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
    dropped: AtomicU64,
    said_dropped: AtomicBool,
    said_failed: AtomicBool,
    started: AtomicBool,
}

/// Records a controller's events (see the module's doc). Cheap to clone; the flusher ends when
/// the last clone is dropped, after writing what is pending.
pub struct Recorder<A: Api> {
    shared: Arc<Shared>,
    api: A,
}

impl<A: Api> Clone for Recorder<A> {
    fn clone(&self) -> Self {
        Recorder {
            shared: self.shared.clone(),
            api: self.api.clone(),
        }
    }
}

impl<A: Api> std::fmt::Debug for Recorder<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("reporter", &self.shared.reporter)
            .finish_non_exhaustive()
    }
}

impl<A: Api> Recorder<A> {
    /// A recorder writing through `api` as `reporter` (`controller/<name>`).
    pub fn new(api: A, reporter: &str) -> Self {
        Recorder {
            shared: Arc::new(Shared {
                reporter: reporter.to_owned(),
                queue: Mutex::new(Queue::default()),
                wake: tokio::sync::Notify::new(),
                dropped: AtomicU64::new(0),
                said_dropped: AtomicBool::new(false),
                said_failed: AtomicBool::new(false),
                started: AtomicBool::new(false),
            }),
            api,
        }
    }

    /// Occurrences dropped because too many distinct events were waiting.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Records that `reason` happened to `regarding` (merged with the pending occurrences of
    /// the same pair; written later). Never waits.
    pub fn record(
        &self,
        regarding: &Id,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        // One line, no control characters (the server refuses them: a terminal shows events).
        let mut message: String = message
            .into()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if message.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let now = crate::now_timestamp();
        let key = {
            let tenancy = event_tenancy(regarding);
            format!(
                "{}/{}/{}",
                tenancy.partition,
                tenancy.namespace,
                event_name(regarding, reason)
            )
        };
        {
            let mut queue = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(pending) = queue.pending.get_mut(&key) {
                pending.count += 1;
                pending.message = message;
                pending.kind = kind;
                pending.last_seen = now;
            } else if queue.pending.len() >= MAX_PENDING {
                drop(queue);
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.shared.said_dropped.swap(true, Ordering::Relaxed) {
                    tracing::warn!(reporter = %self.shared.reporter, "too many distinct events waiting to be written: some are dropped");
                }
                return;
            } else {
                queue.order.push_back(key.clone());
                queue.pending.insert(
                    key,
                    Pending {
                        regarding: regarding.clone(),
                        reason: reason.to_owned(),
                        message,
                        kind,
                        count: 1,
                        first_seen: now,
                        last_seen: now,
                    },
                );
            }
        }
        self.start();
        self.shared.wake.notify_one();
    }

    /// [`Self::record`] of a normal event about `regarding`.
    pub fn normal(&self, regarding: &Resource, reason: &str, message: impl Into<String>) {
        if let Some(id) = &regarding.id {
            self.record(id, EventType::Normal, reason, message);
        }
    }

    /// [`Self::record`] of a warning about `regarding`.
    pub fn warning(&self, regarding: &Resource, reason: &str, message: impl Into<String>) {
        if let Some(id) = &regarding.id {
            self.record(id, EventType::Warning, reason, message);
        }
    }

    /// Starts the flusher on the current runtime, once.
    fn start(&self) {
        if self.shared.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.shared.started.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(&self.shared);
        let api = self.api.clone();
        handle.spawn(flush(weak, api));
    }

    /// Writes what is pending now, ignoring the rate (tests, and a controller stopping).
    pub async fn flush_now(&self) {
        while let Some(pending) = take_one(&self.shared) {
            write_merged(&self.shared, &self.api, pending).await;
        }
    }
}

fn take_one(shared: &Shared) -> Option<Pending> {
    let mut queue = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(key) = queue.order.pop_front() {
        if let Some(pending) = queue.pending.remove(&key) {
            return Some(pending);
        }
    }
    None
}

/// The flusher: a token bucket of [`WRITES_PER_SECOND`], [`BURST`] deep.
async fn flush<A: Api>(shared: Weak<Shared>, api: A) {
    let mut tokens = f64::from(BURST);
    let mut last = tokio::time::Instant::now();
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let now = tokio::time::Instant::now();
        tokens = (tokens + now.duration_since(last).as_secs_f64() * f64::from(WRITES_PER_SECOND))
            .min(f64::from(BURST));
        last = now;
        if tokens >= 1.0 {
            if let Some(pending) = take_one(&strong) {
                tokens -= 1.0;
                write_merged(&strong, &api, pending).await;
                continue;
            }
            // Nothing pending: wait for a record (or a second, to notice the recorder gone).
            let _ = tokio::time::timeout(Duration::from_secs(1), strong.wake.notified()).await;
        } else {
            drop(strong);
            let wait = (1.0 - tokens) / f64::from(WRITES_PER_SECOND);
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}

/// Adds `pending` to its Event: created, or its count raised by compare-and-swap.
async fn write_merged<A: Api>(shared: &Shared, api: &A, pending: Pending) {
    let tenancy = event_tenancy(&pending.regarding);
    let id = Id {
        uid: String::new(),
        name: event_name(&pending.regarding, &pending.reason),
        r#type: Some(event_type()),
        tenancy: Some(tenancy),
    };
    let kind = match pending.kind {
        EventType::Normal => event::Type::Normal,
        EventType::Warning => event::Type::Warning,
    };
    let mut outcome = Ok(());
    for _ in 0..CAS_TRIES {
        let stored = match api.read(&id).await {
            Ok(stored) => stored,
            Err(error) => {
                outcome = Err(error);
                break;
            }
        };
        let previous = stored
            .as_ref()
            .and_then(|r| r.data.as_ref())
            .and_then(|d| <Event as prost::Message>::decode(d.value.as_slice()).ok());
        let event = Event {
            regarding: Some(pending.regarding.clone()),
            reason: pending.reason.clone(),
            message: pending.message.clone(),
            r#type: kind as i32,
            count: previous.as_ref().map_or(0, |e| e.count) + pending.count,
            first_seen: previous
                .as_ref()
                .and_then(|e| e.first_seen)
                .or(Some(pending.first_seen)),
            last_seen: Some(pending.last_seen),
            reporter: shared.reporter.clone(),
        };
        let resource = Resource {
            id: Some(match &stored {
                Some(stored) => stored.id.clone().unwrap_or_else(|| id.clone()),
                None => id.clone(),
            }),
            version: stored
                .as_ref()
                .map(|r| r.version.clone())
                .unwrap_or_default(),
            data: Some(proto::to_any(&event)),
            ..Default::default()
        };
        match api.write(resource).await {
            Ok(_) => {
                outcome = Ok(());
                break;
            }
            Err(ApiError::Conflict(why)) => outcome = Err(ApiError::Conflict(why)),
            Err(error) => {
                outcome = Err(error);
                break;
            }
        }
    }
    match outcome {
        Ok(()) => {
            shared.said_failed.store(false, Ordering::Relaxed);
        }
        Err(error) => {
            if !shared.said_failed.swap(true, Ordering::Relaxed) {
                tracing::warn!(reporter = %shared.reporter, %error, "cannot write an event (said once until one is written again)");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Api that keeps Events by name, checks versions like the server (empty: create), and
    /// counts writes.
    /// Events by name, the last version, writes made.
    type Stored = (HashMap<String, Resource>, u64, u64);

    #[derive(Clone, Default)]
    struct Store(Arc<Mutex<Stored>>);

    impl Store {
        fn writes(&self) -> u64 {
            self.0.lock().unwrap().2
        }
        fn events(&self) -> Vec<Event> {
            self.0
                .lock()
                .unwrap()
                .0
                .values()
                .filter_map(|r| {
                    <Event as prost::Message>::decode(r.data.as_ref()?.value.as_slice()).ok()
                })
                .collect()
        }
    }

    #[async_trait::async_trait]
    impl Api for Store {
        /// The fence is the server's to check; this store has none.
        fn fenced(&self, _: proto::fence::FenceCell) -> Self {
            self.clone()
        }
        async fn read(&self, id: &Id) -> Result<Option<Resource>, ApiError> {
            Ok(self.0.lock().unwrap().0.get(&id.name).cloned())
        }
        async fn write(&self, mut resource: Resource) -> Result<Resource, ApiError> {
            let mut state = self.0.lock().unwrap();
            let name = resource
                .id
                .as_ref()
                .map(|id| id.name.clone())
                .unwrap_or_default();
            let stored = state
                .0
                .get(&name)
                .map(|r| r.version.clone())
                .unwrap_or_default();
            if stored != resource.version {
                return Err(ApiError::Conflict("version".into()));
            }
            state.1 += 1;
            state.2 += 1;
            resource.version = state.1.to_string();
            state.0.insert(name, resource.clone());
            Ok(resource)
        }
        async fn delete(&self, _: &Id, _: &str) -> Result<(), ApiError> {
            Err(ApiError::Failed("not used by events".into()))
        }
        async fn list(&self, _: &Type, _: &Tenancy) -> Result<Vec<Resource>, ApiError> {
            Err(ApiError::Failed("not used by events".into()))
        }
        async fn list_by_owner(&self, _: &Id) -> Result<Vec<Resource>, ApiError> {
            Err(ApiError::Failed("not used by events".into()))
        }
        async fn write_status(
            &self,
            _: &Id,
            _: &str,
            _: &str,
            _: proto::resource::v1::Status,
        ) -> Result<Resource, ApiError> {
            Err(ApiError::Failed("not used by events".into()))
        }
        async fn watch(
            &self,
            _: proto::resource::v1::WatchListRequest,
        ) -> Result<crate::api::EventStream, ApiError> {
            Err(ApiError::Failed("not used by events".into()))
        }
    }

    /// The attacker's storm: ten thousand occurrences at once about one object, and a
    /// thousand more spread over many objects, make a bounded number of writes — merged into
    /// one Event per (regarding, reason) whose count holds every occurrence.
    #[tokio::test(start_paused = true)]
    async fn a_storm_of_events_is_merged_and_rate_limited_never_a_write_storm() {
        let store = Store::default();
        let recorder = Recorder::new(store.clone(), "controller/storm");
        let target = id("miles", "jazz");
        for n in 0..10_000 {
            recorder.record(
                &target,
                EventType::Warning,
                "Failing",
                format!("attempt {n}"),
            );
        }
        for n in 0..(MAX_PENDING + 50) {
            recorder.record(
                &id(&format!("a{n}"), "jazz"),
                EventType::Normal,
                "Seen",
                "once",
            );
        }
        // One second of the flusher: at most the burst and a second's rate.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let first_second = store.writes();
        assert!(
            first_second <= u64::from(BURST + WRITES_PER_SECOND) + 1,
            "{first_second} writes in the first second"
        );
        assert!(first_second >= 1, "the flusher writes");
        let storm = store
            .events()
            .into_iter()
            .find(|e| e.reason == "Failing")
            .expect("the storm's event is written first");
        assert_eq!(
            storm.count, 10_000,
            "every occurrence is counted in one Event"
        );
        assert_eq!(
            storm.message, "attempt 9999",
            "the last occurrence's message"
        );
        assert_eq!(storm.reporter, "controller/storm");
        // The excess distinct events were dropped, counted.
        assert_eq!(recorder.dropped(), 50 + 1);
        // More occurrences of a written event raise its count by compare-and-swap.
        for _ in 0..5 {
            recorder.record(&target, EventType::Warning, "Failing", "again");
        }
        recorder.flush_now().await;
        let storm = store
            .events()
            .into_iter()
            .find(|e| e.reason == "Failing")
            .expect("the storm's event");
        assert_eq!(storm.count, 10_005);
        let names: std::collections::HashSet<String> =
            store.0.lock().unwrap().0.keys().cloned().collect();
        assert!(names.contains(&event_name(&target, "Failing")));
    }

    fn id(name: &str, namespace: &str) -> Id {
        Id {
            uid: "01J0000000000000000000000A".into(),
            name: name.into(),
            r#type: Some(Type {
                group: "demo".into(),
                group_version: "v2".into(),
                kind: "Artist".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: namespace.into(),
            }),
        }
    }

    #[test]
    fn the_same_pair_names_the_same_event_and_names_are_valid() {
        let a = event_name(&id("miles", "jazz"), "Cascaded");
        assert_eq!(a, event_name(&id("miles", "jazz"), "Cascaded"));
        assert_ne!(a, event_name(&id("miles", "jazz"), "Emptied"));
        assert_ne!(a, event_name(&id("miles", "bebop"), "Cascaded"));
        let long = event_name(&id(&"x".repeat(63), "jazz"), "Cascaded");
        assert!(long.len() <= 63, "{long}");
        for name in [a, long, event_name(&id("-", "jazz"), "R")] {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !name.starts_with('-')
                    && !name.ends_with('-'),
                "{name}"
            );
        }
    }

    #[test]
    fn events_of_cluster_scoped_objects_live_in_default() {
        let mut cluster = id("team", "");
        cluster.tenancy = Some(Tenancy::default());
        assert_eq!(
            event_tenancy(&cluster),
            Tenancy {
                partition: "default".into(),
                namespace: "default".into()
            }
        );
        assert_eq!(event_tenancy(&id("m", "jazz")).namespace, "jazz");
    }
}
