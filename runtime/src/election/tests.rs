//! Elections on a fake store and a paused clock: client-go's rules, garbage leases, pauses.

use std::sync::Mutex;

use super::*;

/// A store of one lease with compare-and-swap on a version counter.
#[derive(Default, Clone)]
struct Store(Arc<Mutex<StoreState>>);

#[derive(Default)]
struct StoreState {
    lease: Option<Resource>,
    version: u64,
    /// Every write fails (the server is unreachable).
    down: bool,
    /// The next write lands but its answer is lost.
    lose_answer: bool,
}

#[async_trait::async_trait]
impl LeaseStore for Store {
    async fn read(&self, _id: &Id) -> Result<Option<Resource>, StoreError> {
        let state = self.0.lock().expect("lock");
        if state.down {
            return Err(StoreError::Failed("unreachable".into()));
        }
        Ok(state.lease.clone())
    }

    async fn write(&self, mut lease: Resource) -> Result<Resource, StoreError> {
        let mut state = self.0.lock().expect("lock");
        if state.down {
            return Err(StoreError::Failed("unreachable".into()));
        }
        // resd's semantics: a version is a compare-and-swap; no version is a blind write, which
        // a uid other than the stored one refuses.
        if let Some(stored) = &state.lease {
            let stored_uid = stored
                .id
                .as_ref()
                .map(|id| id.uid.clone())
                .unwrap_or_default();
            let uid = lease
                .id
                .as_ref()
                .map(|id| id.uid.clone())
                .unwrap_or_default();
            if (!lease.version.is_empty() && lease.version != stored.version)
                || (!uid.is_empty() && uid != stored_uid)
            {
                return Err(StoreError::Conflict);
            }
        } else if !lease.version.is_empty() {
            return Err(StoreError::Conflict);
        } else if let Some(id) = lease.id.as_mut() {
            id.uid = format!("stored-{}", state.version);
        }
        state.version += 1;
        lease.version = state.version.to_string();
        state.lease = Some(lease.clone());
        if std::mem::take(&mut state.lose_answer) {
            return Err(StoreError::Unavailable("the answer was lost".into()));
        }
        Ok(lease)
    }
}

impl Store {
    fn holder(&self) -> String {
        let state = self.0.lock().expect("lock");
        state
            .lease
            .as_ref()
            .and_then(|l| decode(l).ok())
            .map(|l| l.holder)
            .unwrap_or_default()
    }

    fn transitions(&self) -> u64 {
        let state = self.0.lock().expect("lock");
        state
            .lease
            .as_ref()
            .and_then(|l| decode(l).ok())
            .map(|l| l.transitions)
            .unwrap_or_default()
    }
}

fn config(identity: &str) -> Config {
    Config::new("default", "invoices", identity)
}

#[tokio::test(start_paused = true)]
async fn one_replica_takes_the_lease_and_another_waits_out_the_whole_duration() {
    let store = Store::default();
    let mut a = Elector::new(config("a"), store.clone()).expect("a");
    let mut b = Elector::new(config("b"), store.clone()).expect("b");
    assert!(a.try_acquire_or_renew().await.expect("a tries"));
    assert!(!b.try_acquire_or_renew().await.expect("b tries"));
    assert_eq!(b.leadership().holder(), "a");
    // a renews within the duration: b never takes over, however long it tries.
    for _ in 0..20 {
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(a.try_acquire_or_renew().await.expect("a renews"));
        assert!(!b.try_acquire_or_renew().await.expect("b waits"));
    }
    // a stops renewing: b takes over only once it has seen the lease unchanged for the
    // whole duration on its own clock.
    assert!(
        !b.try_acquire_or_renew()
            .await
            .expect("first sight of the last version")
    );
    tokio::time::advance(Duration::from_secs(14)).await;
    assert!(!b.try_acquire_or_renew().await.expect("not yet"));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(b.try_acquire_or_renew().await.expect("taken over"));
    assert_eq!(store.holder(), "b");
    assert_eq!(store.transitions(), 1);
    // a, back, finds b holding it.
    assert!(!a.try_acquire_or_renew().await.expect("a sees b"));
    assert_eq!(a.leadership().holder(), "b");
}

#[tokio::test(start_paused = true)]
async fn a_lease_written_by_hand_with_garbage_expires_after_the_duration() {
    let store = Store::default();
    store
        .write(Resource {
            id: Some(config("x").lease_id()),
            data: Some(prost_types::Any {
                type_url: "type.googleapis.com/resd.coordination.v1.Lease".into(),
                value: vec![0xff, 0xff, 0xff],
            }),
            ..Default::default()
        })
        .await
        .expect("garbage");
    let mut a = Elector::new(config("a"), store.clone()).expect("a");
    assert!(
        !a.try_acquire_or_renew()
            .await
            .expect("never trusted at once")
    );
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(a.try_acquire_or_renew().await.expect("taken over"));
    assert_eq!(store.holder(), "a");
}

/// Both read "no lease", then both write: the second create is refused by its own uid.
#[tokio::test(start_paused = true)]
async fn two_candidates_creating_the_lease_at_once_cannot_both_win() {
    struct Racing {
        store: Store,
        reads: tokio::sync::Barrier,
    }
    #[async_trait::async_trait]
    impl LeaseStore for Arc<Racing> {
        async fn read(&self, id: &Id) -> Result<Option<Resource>, StoreError> {
            let read = self.store.read(id).await;
            self.reads.wait().await;
            read
        }
        async fn write(&self, lease: Resource) -> Result<Resource, StoreError> {
            self.store.write(lease).await
        }
    }
    let racing = Arc::new(Racing {
        store: Store::default(),
        reads: tokio::sync::Barrier::new(2),
    });
    let mut a = Elector::new(config("a"), racing.clone()).expect("a");
    let mut b = Elector::new(config("b"), racing.clone()).expect("b");
    let (won_a, won_b) = tokio::join!(a.try_acquire_or_renew(), b.try_acquire_or_renew());
    let (won_a, won_b) = (won_a.expect("a"), won_b.expect("b"));
    assert!(won_a ^ won_b, "exactly one holds it: a {won_a}, b {won_b}");
}

/// A holder paused past its renew deadline leads no more the moment it runs again, before
/// its renewal loop notices; another replica takes over after the duration.
#[tokio::test(start_paused = true)]
async fn a_holder_paused_past_its_deadline_stops_leading_at_once() {
    let store = Store::default();
    let a = Elector::new(config("a"), store.clone()).expect("a");
    let leadership = a.leadership();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(a.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(leadership.holds());
    // The server becomes unreachable: renewals fail; within the renew deadline a still
    // leads, past it it does not.
    store.0.lock().expect("lock").down = true;
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(leadership.holds());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!leadership.holds(), "past the renew deadline");
    shutdown.cancel();
    running.await.expect("stops");

    // A pause: no loop runs at all, time passes; holds() alone says no.
    let store = Store::default();
    let mut b = Elector::new(config("b"), store.clone()).expect("b");
    let leadership = b.leadership();
    assert!(b.try_acquire_or_renew().await.expect("b takes"));
    b.leadership
        .lead_until(Some(Instant::now() + b.config.renew_deadline));
    assert!(leadership.holds());
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(
        !leadership.holds(),
        "a paused holder leads no more when it resumes"
    );
}

#[test]
fn timings_that_cannot_work_are_refused() {
    let mut bad = config("a");
    bad.renew_deadline = bad.duration;
    assert!(matches!(
        bad.check(),
        Err(ConfigError::RenewDeadline { .. })
    ));
    let mut bad = config("a");
    bad.retry_period = bad.renew_deadline;
    assert!(matches!(bad.check(), Err(ConfigError::RetryPeriod { .. })));
    let mut bad = config("");
    bad.identity.clear();
    assert_eq!(bad.check(), Err(ConfigError::NoIdentity));
    config("a").check().expect("the defaults work");
}

/// The fence a holder's writes carry (DESIGN §16) names its lease and the transitions it took
/// it at; a takeover gives the next holder the next number, and a write refused `FENCED`
/// (the cell revoked) ends the former holder's leadership at once, before its deadline.
#[tokio::test(start_paused = true)]
async fn the_fence_names_the_transitions_a_holder_took_the_lease_at_and_revoking_it_ends_leading() {
    let store = Store::default();
    let mut a = Elector::new(config("a"), store.clone()).expect("a");
    let mut b = Elector::new(config("b"), store.clone()).expect("b");
    assert!(a.try_acquire_or_renew().await.expect("a takes"));
    a.leadership
        .lead_until(Some(Instant::now() + Duration::from_secs(10)));
    let fence = a.leadership().fence().get().expect("a's fence");
    assert_eq!(fence.to_string(), "default/default/invoices@0");
    assert!(a.leadership().holds());
    // b takes over once a stops renewing.
    assert!(!b.try_acquire_or_renew().await.expect("b sees a"));
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(b.try_acquire_or_renew().await.expect("b takes over"));
    assert_eq!(
        b.leadership().fence().get().map(|f| f.to_string()),
        Some("default/default/invoices@1".to_owned())
    );
    // a's deadline has passed; had it not, a refusal of its fence ends its leadership.
    a.leadership
        .lead_until(Some(Instant::now() + Duration::from_secs(10)));
    a.leadership().fence().set(Some(fence.clone()));
    assert!(a.leadership().holds());
    a.leadership().fence().revoke(&fence);
    assert!(!a.leadership().holds(), "a refused fence ends leading");
    // Revoking a fence that is no longer the cell's leaves the newer one alone.
    let newer = b.leadership().fence().get().expect("b's fence");
    b.leadership().fence().revoke(&fence);
    assert_eq!(b.leadership().fence().get(), Some(newer));
}

/// A replica restarted under the same identity (or a second process given it) does not take
/// over a lease its earlier process still renews: that is another's lease, waited out; once the
/// earlier one stops, it is taken with its transitions raised, so the earlier process's fence
/// (a zombie's writes in flight) is refused.
#[tokio::test(start_paused = true)]
async fn a_second_process_of_the_same_identity_waits_the_first_out_and_fences_it() {
    let store = Store::default();
    let mut first = Elector::new(config("a"), store.clone()).expect("first");
    assert!(first.try_acquire_or_renew().await.expect("takes"));
    assert!(first.try_acquire_or_renew().await.expect("renews"));
    assert_eq!(store.transitions(), 0, "a renewal changes no hands");
    let mut second = Elector::new(config("a"), store.clone()).expect("second");
    for _ in 0..10 {
        assert!(!second.try_acquire_or_renew().await.expect("waits"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(
            first
                .try_acquire_or_renew()
                .await
                .expect("the first renews")
        );
    }
    // The first stops renewing: the second takes over after the duration, fencing it.
    assert!(!second.try_acquire_or_renew().await.expect("first sight"));
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(second.try_acquire_or_renew().await.expect("taken over"));
    assert_eq!(store.transitions(), 1);
    assert_eq!(
        second.leadership().fence().get().map(|f| f.transitions),
        Some(1)
    );
    // The first, back, finds a lease it did not write: not its own any more.
    assert!(
        !first
            .try_acquire_or_renew()
            .await
            .expect("the first sees it taken")
    );
}

/// A lease the server took from a shard member (its holder says so) is waited out like
/// another's, then taken back with the hook told at once — before the member leads again.
#[tokio::test(start_paused = true)]
async fn a_lease_taken_by_the_server_is_waited_out_and_its_taking_back_is_told() {
    let store = Store::default();
    let mut member = Elector::new(config("a"), store.clone()).expect("a");
    assert!(member.try_acquire_or_renew().await.expect("takes"));
    // The server takes it: holder marked, transitions raised.
    {
        let mut state = store.0.lock().expect("lock");
        state.version += 1;
        let version = state.version.to_string();
        let lease = state.lease.as_mut().expect("lease");
        let mut data = decode(lease).expect("a lease");
        data.holder = proto::shard::LEFT_THE_RING.into();
        data.transitions += 1;
        lease.data = Some(proto::to_any(&data));
        lease.version = version;
    }
    let told = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = told.clone();
    member.leadership().on_taken_back(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    assert!(!member.try_acquire_or_renew().await.expect("waits it out"));
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(member.try_acquire_or_renew().await.expect("takes it back"));
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(store.transitions(), 2);
    assert!(member.try_acquire_or_renew().await.expect("renews"));
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1, "once");
}

/// A renewal that landed but whose answer was lost is still the holder's own: the next attempt
/// renews (no wait, no change of hands).
#[tokio::test(start_paused = true)]
async fn a_renewal_whose_answer_was_lost_is_still_the_holders() {
    let store = Store::default();
    let mut a = Elector::new(config("a"), store.clone()).expect("a");
    assert!(a.try_acquire_or_renew().await.expect("takes"));
    store.0.lock().expect("lock").lose_answer = true;
    assert!(
        a.try_acquire_or_renew().await.is_err(),
        "the answer is lost"
    );
    assert!(a.try_acquire_or_renew().await.expect("renews"));
    assert_eq!(store.transitions(), 0, "no change of hands");
}
