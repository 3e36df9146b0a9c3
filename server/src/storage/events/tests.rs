//! The history's bounds, and watchers as cursors into it.

use futures::StreamExt;

use super::*;
use crate::storage::conformance::Fixture;

fn change(log: &mut EventLog, name: &str, index: u64, payload: usize) {
    log.publish_all(
        vec![upsert(name, Version::new(index), payload)],
        Version::new(index),
        &(),
    )
    .expect("published");
}

/// An artist written at `version`, carrying `payload` bytes of metadata.
fn upsert(name: &str, version: Version, payload: usize) -> Published {
    let mut resource = Fixture::new().artist(name);
    resource.version = version.to_string();
    resource
        .metadata
        .insert("payload".into(), "x".repeat(payload));
    Published::Change {
        key: StorageKey::of(resource.id.as_ref().expect("id")),
        event: WatchEvent {
            version: version.to_string(),
            operation: Operation::Upsert(resource),
            actor: String::new(),
        },
        before: None,
        version,
    }
}

/// The group of the fixture's artists.
fn artist_group() -> String {
    Fixture::new()
        .artist("a")
        .id
        .and_then(|id| id.r#type)
        .expect("type")
        .group
}

fn everything() -> WatchFilter {
    let fixture = Fixture::new();
    WatchFilter::new(&fixture.artist_type(), &fixture.wildcard(), "")
}

#[test]
fn the_history_is_bounded_by_bytes_as_well_as_count() {
    let mut log = EventLog::new(
        HistoryLimits {
            changes: 1000,
            bytes: 10 << 20,
        },
        Version::new(0),
    );
    for index in 1..=120 {
        change(&mut log, "big", index, 1 << 20);
    }
    let (bytes, changes) = log.history_size();
    assert!(bytes <= 10 << 20, "{bytes} bytes kept");
    assert!((8..=10).contains(&changes), "{changes} changes kept");
}

#[test]
fn the_newest_change_is_kept_even_when_it_alone_exceeds_the_bytes() {
    let mut log = EventLog::new(
        HistoryLimits {
            changes: 10,
            bytes: 100,
        },
        Version::new(0),
    );
    change(&mut log, "a", 1, 1000);
    change(&mut log, "b", 2, 1000);
    assert_eq!(log.history_size().1, 1);
}

#[tokio::test]
async fn a_resume_past_the_byte_bound_gets_the_relist_error() {
    let mut log = EventLog::new(
        HistoryLimits {
            changes: 1000,
            bytes: 3 << 20,
        },
        Version::new(0),
    );
    for index in 1..=10 {
        change(&mut log, "big", index, 1 << 20);
    }
    let error = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(10),
            Some(Version::new(2)),
        )
        .err()
        .expect("too old");
    assert!(
        matches!(&error, StorageError::ResumeUnavailable(why) if why.contains("list again")),
        "{error:?}"
    );
    let mut resumed = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(10),
            Some(Version::new(9)),
        )
        .expect("within the history");
    let first = resumed.next().await.expect("event").expect("ok");
    assert_eq!(first.version, "10");
}

#[tokio::test]
async fn many_watchers_follow_the_same_changes_in_order() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watches: Vec<_> = (0..50)
        .map(|_| {
            log.watch(
                everything(),
                WatchOptions::default(),
                Vec::new(),
                Version::new(0),
                None,
            )
            .expect("watch")
        })
        .collect();
    for index in 1..=5 {
        change(&mut log, &format!("a{index}"), index, 10);
    }
    for watch in &mut watches {
        let end = watch.next().await.expect("end").expect("ok");
        assert_eq!(end.operation, Operation::EndOfSnapshot);
        for index in 1..=5 {
            let event = watch.next().await.expect("event").expect("ok");
            assert_eq!(event.version, index.to_string());
        }
    }
}

#[tokio::test]
async fn a_waiting_watcher_is_woken_by_a_publish() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watch = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(0),
            None,
        )
        .expect("watch");
    watch.next().await.expect("end").expect("ok");
    let waiter = tokio::spawn(async move { watch.next().await });
    tokio::task::yield_now().await;
    change(&mut log, "late", 1, 10);
    let event = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("woken")
        .expect("joined")
        .expect("event")
        .expect("ok");
    assert_eq!(event.version, "1");
}

#[tokio::test]
async fn a_reset_ends_every_open_watch_with_its_reason() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watch = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(0),
            None,
        )
        .expect("watch");
    watch.next().await.expect("end").expect("ok");
    log.reset("restored".into(), Version::new(7), &())
        .expect("published");
    match watch.next().await {
        Some(Err(StorageError::WatchClosed(why))) => assert_eq!(why, "restored"),
        other => panic!("expected the reset, got {other:?}"),
    }
    assert!(watch.next().await.is_none());
    let mut fresh = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(7),
            None,
        )
        .expect("watch after the reset");
    let end = fresh.next().await.expect("end").expect("ok");
    assert_eq!(end.version, "7");
}

#[tokio::test]
async fn every_watcher_of_a_change_shares_one_copy_and_one_encoding() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watches: Vec<_> = (0..3)
        .map(|_| {
            log.watch(
                everything(),
                WatchOptions::default(),
                Vec::new(),
                Version::new(0),
                None,
            )
            .expect("watch")
        })
        .collect();
    for watch in &mut watches {
        watch.next().await.expect("end").expect("ok");
    }
    change(&mut log, "shared", 1, 10);
    let mut events = Vec::new();
    for watch in &mut watches {
        events.push(watch.next().await.expect("event").expect("ok"));
    }
    let encoded = events[0].wire(|event| bytes::Bytes::from(event.version.clone()));
    for event in &events[1..] {
        let again = event.wire(|_| panic!("the change was encoded a second time"));
        assert_eq!(
            again.as_ptr(),
            encoded.as_ptr(),
            "one buffer for all watchers"
        );
    }
    // A copy that nobody else holds is handed over without copying.
    let only = SharedEvent::new(events[0].event().clone());
    assert_eq!(only.into_event().version, "1");
}

#[tokio::test]
async fn encodings_watchers_make_count_against_the_bound_while_their_change_is_kept() {
    let mut log = EventLog::new(
        HistoryLimits {
            changes: 4,
            bytes: 64 << 20,
        },
        Version::new(0),
    );
    let mut watch = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(0),
            None,
        )
        .expect("watch");
    watch.next().await.expect("end").expect("ok");
    change(&mut log, "first", 1, 10);
    let (before, _) = log.history_size();
    let event = watch.next().await.expect("event").expect("ok");
    event.wire(|_| bytes::Bytes::from(vec![0u8; 5000]));
    assert_eq!(
        log.history_size().0,
        before + 5000,
        "the encoding is counted"
    );
    // Four more changes push the first out of the ring: its encoding leaves the count with it.
    for index in 2..=5 {
        change(&mut log, "later", index, 10);
    }
    let (after, kept) = log.history_size();
    assert_eq!(kept, 4);
    assert!(
        after < before * 4 + 5000,
        "{after} bytes: the evicted encoding still counted"
    );
    // An encoding made after its change left the history is never counted.
    let second = watch.next().await.expect("event").expect("ok");
    assert_eq!(second.version, "2");
    for index in 6..=9 {
        change(&mut log, "later", index, 10);
    }
    let (now, _) = log.history_size();
    second.wire(|_| bytes::Bytes::from(vec![0u8; 5000]));
    assert_eq!(
        log.history_size().0,
        now,
        "an evicted change's encoding is not counted"
    );
}

#[test]
fn a_change_moves_its_groups_stamp_and_a_reset_moves_every_stamp() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let stamps = log.stamps();
    let group = artist_group();
    let (before, tenancy) = (stamps.get(&group), stamps.get("tenancy"));
    change(&mut log, "a", 1, 0);
    assert!(stamps.get(&group) > before, "the artist's group moved");
    assert_eq!(stamps.get("tenancy"), tenancy, "another group did not");
    log.reset("restored".into(), Version::new(2), &())
        .expect("published");
    assert!(stamps.get("tenancy") > tenancy, "a reset moves every group");
}

#[tokio::test]
async fn a_commit_is_published_at_once_in_order_and_wakes_a_waiting_watcher() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let stamps = log.stamps();
    let group = artist_group();
    let before = stamps.get(&group);
    let mut watch = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(0),
            None,
        )
        .expect("watch");
    watch.next().await.expect("end").expect("ok");
    let waiter = tokio::spawn(async move {
        let mut versions = Vec::new();
        for _ in 0..3 {
            versions.push(
                watch
                    .next()
                    .await
                    .expect("event")
                    .expect("ok")
                    .version
                    .clone(),
            );
        }
        versions
    });
    tokio::task::yield_now().await;
    log.publish_all(
        vec![
            upsert("a", Version::new(5), 0),
            upsert(
                "b",
                Version {
                    index: 5,
                    position: 1,
                },
                0,
            ),
            upsert(
                "c",
                Version {
                    index: 5,
                    position: 2,
                },
                0,
            ),
        ],
        Version::new(5),
        &(),
    )
    .expect("published");
    let versions = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("woken")
        .expect("joined");
    assert_eq!(versions, ["5", "5.1", "5.2"]);
    assert_eq!(log.history_size().1, 3);
    assert!(
        stamps.get(&group) >= before + 3,
        "every change moved its group's stamp"
    );
    // Nothing collected: the history stays as it was.
    log.publish_all(Vec::new(), Version::new(6), &())
        .expect("published");
    assert_eq!(log.history_size().1, 3);
}

#[tokio::test]
async fn a_reset_within_a_commit_ends_the_watches_and_empties_the_history() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watch = log
        .watch(
            everything(),
            WatchOptions::default(),
            Vec::new(),
            Version::new(0),
            None,
        )
        .expect("watch");
    watch.next().await.expect("end").expect("ok");
    log.publish_all(
        vec![
            upsert("a", Version::new(3), 0),
            Published::Reset {
                reason: "restored".into(),
            },
        ],
        Version::new(3),
        &(),
    )
    .expect("published");
    // The change before the reset left the history with it: the watch ends with the reason.
    match watch.next().await {
        Some(Err(StorageError::WatchClosed(why))) => assert_eq!(why, "restored"),
        other => panic!("expected the reset, got {other:?}"),
    }
    assert!(watch.next().await.is_none());
    assert_eq!(log.history_size().1, 0, "the reset emptied the history");
}

fn artist_at(name: &str, version: u64) -> Resource {
    let mut resource = Fixture::new().artist(name);
    resource.version = Version::new(version).to_string();
    resource
}

#[tokio::test]
async fn watchers_of_the_same_resource_versions_share_their_snapshot_events() {
    let log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let first_event = |watch: Watch| async move {
        let mut watch = watch;
        watch.next().await.expect("an event").expect("ok")
    };
    let snapshot = || vec![artist_at("a", 5)];
    let a = first_event(
        log.watch(
            everything(),
            WatchOptions::default(),
            snapshot(),
            Version::new(5),
            None,
        )
        .expect("watch"),
    )
    .await;
    let b = first_event(
        log.watch(
            everything(),
            WatchOptions::default(),
            snapshot(),
            Version::new(5),
            None,
        )
        .expect("watch"),
    )
    .await;
    assert!(a.same(&b), "one event for both watchers");
    let newer = first_event(
        log.watch(
            everything(),
            WatchOptions::default(),
            vec![artist_at("a", 6)],
            Version::new(6),
            None,
        )
        .expect("watch"),
    )
    .await;
    assert!(!newer.same(&a), "another version is another event");
    assert_eq!(newer.event().version, Version::new(6).to_string());
}

#[test]
fn shared_snapshot_entries_are_swept_once_no_watcher_holds_them() {
    let log = EventLog::new(HistoryLimits::default(), Version::new(0));
    for i in 0..(4 * SNAPSHOTS_FIRST_SWEEP as u64) {
        let watch = log
            .watch(
                everything(),
                WatchOptions::default(),
                vec![artist_at(&format!("a{i}"), 1)],
                Version::new(1),
                None,
            )
            .expect("watch");
        drop(watch);
    }
    let held = log.snapshots.lock().map_or(usize::MAX, |s| s.events.len());
    assert!(held <= 2 * SNAPSHOTS_FIRST_SWEEP, "{held} entries kept");
}

/// An artist labelled `team=TEAM`, written at `index` (over its last version in the history, as
/// a backend publishes it).
fn labelled(log: &mut EventLog, name: &str, index: u64, team: &str) {
    let Published::Change {
        key,
        mut event,
        version,
        ..
    } = upsert(name, Version::new(index), 0)
    else {
        unreachable!("upsert makes a change");
    };
    if let Operation::Upsert(resource) = &mut event.operation {
        resource.metadata.insert("team".into(), team.into());
    }
    event.actor = "tester".into();
    let before = lock(&log.ring)
        .items
        .iter()
        .rev()
        .find(|item| item.key == key)
        .and_then(|item| match &item.event.event().operation {
            Operation::Upsert(resource) => Some(resource.metadata.clone()),
            _ => None,
        });
    log.publish_all(
        vec![Published::Change {
            key,
            event,
            before,
            version,
        }],
        version,
        &(),
    )
    .expect("published");
}

/// A watch of the artists labelled `team=a` from now on, with progress marks or without.
fn team_a(log: &EventLog, progress: bool) -> Watch {
    log.watch(
        everything(),
        WatchOptions {
            selector: Some(Selector::parse("team=a").expect("selector")),
            progress,
        },
        Vec::new(),
        Version::new(0),
        None,
    )
    .expect("watch")
}

/// The next event of `watch`, which must have one queued.
async fn next_event(watch: &mut Watch) -> WatchEvent {
    tokio::time::timeout(std::time::Duration::from_secs(5), watch.next())
        .await
        .expect("an event is queued")
        .expect("open")
        .expect("ok")
        .event()
        .clone()
}

/// `watch` has nothing for `quiet`.
async fn assert_quiet(watch: &mut Watch, quiet: std::time::Duration, why: &str) {
    let next = tokio::time::timeout(quiet, watch.next()).await;
    assert!(next.is_err(), "{why}: {next:?}");
}

/// The selector is applied in the cursor: a change that does not match is never queued for the
/// watcher (only a progress mark, when asked for), one that starts matching is an Upsert and one
/// that stops matching a Delete.
#[tokio::test(start_paused = true)]
async fn a_selected_watch_sees_crossings_and_progress_but_no_other_changes() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watch = team_a(&log, true);
    assert!(matches!(
        next_event(&mut watch).await.operation,
        Operation::EndOfSnapshot
    ));
    labelled(&mut log, "other", 1, "b");
    labelled(&mut log, "other", 2, "b");
    let progress = next_event(&mut watch).await;
    assert!(matches!(progress.operation, Operation::Bookmark));
    assert_eq!(progress.version, Version::new(2).to_string());
    labelled(&mut log, "x", 3, "a");
    let upsert = next_event(&mut watch).await;
    assert!(
        matches!(upsert.operation, Operation::Upsert(_)),
        "{upsert:?}"
    );
    labelled(&mut log, "x", 4, "b");
    let stopped = next_event(&mut watch).await;
    assert!(
        matches!(stopped.operation, Operation::Delete(_)),
        "{stopped:?}"
    );
    assert_eq!(stopped.version, Version::new(4).to_string());
    // Nothing else is queued: the non-matching changes were dropped where they are.
    labelled(&mut log, "x", 5, "b");
    let progress = next_event(&mut watch).await;
    assert!(
        matches!(progress.operation, Operation::Bookmark),
        "{progress:?}"
    );
    assert_quiet(
        &mut watch,
        std::time::Duration::from_millis(50),
        "nothing else",
    )
    .await;
}

/// Without progress asked for, a watch that goes past changes that are not for it gets nothing.
#[tokio::test]
async fn a_watch_without_progress_gets_no_marks() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let mut watch = team_a(&log, false);
    next_event(&mut watch).await;
    labelled(&mut log, "other", 1, "b");
    labelled(&mut log, "x", 2, "a");
    let first = next_event(&mut watch).await;
    assert!(matches!(first.operation, Operation::Upsert(_)), "{first:?}");
}

/// A publish marks (and wakes) only the watchers the change may concern: of its type, whose
/// selector requires one of its labels before or after the change.
#[test]
fn a_publish_wakes_only_the_watchers_it_concerns() {
    let fixture = Fixture::new();
    let artist = fixture.artist_type();
    let mut interests = Interests::default();
    let (of_type, _) = interests.register(Index::Type {
        group: artist.group.clone(),
        kind: artist.kind.clone(),
    });
    let (of_other_type, _) = interests.register(Index::Type {
        group: artist.group.clone(),
        kind: "Album".into(),
    });
    let (of_team_a, _) = interests.register(Index::Labels {
        key: "team".into(),
        values: vec!["a".into()],
    });
    let pending = |interests: &mut Interests| {
        let mut woken: Vec<u64> = interests
            .watchers
            .iter_mut()
            .filter_map(|(id, interest)| interest.pending.take().map(|_| *id))
            .collect();
        woken.sort_unstable();
        woken
    };
    let change = |name: &str, team: &str| {
        let mut resource = fixture.artist(name);
        resource.metadata.insert("team".into(), team.into());
        let key = StorageKey::of(resource.id.as_ref().expect("id"));
        let event = WatchEvent {
            version: "1".into(),
            operation: Operation::Upsert(resource),
            actor: String::new(),
        };
        (key, event)
    };
    let (key, event) = change("x", "b");
    interests.published(1, &key, &event, None);
    assert_eq!(pending(&mut interests), vec![of_type]);
    let (key, event) = change("x", "a");
    let team = |team: &str| Labels::from([("team".to_owned(), team.to_owned())]);
    interests.published(2, &key, &event, Some(&team("b")));
    assert_eq!(pending(&mut interests), vec![of_type, of_team_a]);
    // The team-a watcher hears of x when it leaves team a: team=a is in what the change replaced.
    let (key, event) = change("x", "b");
    interests.published(3, &key, &event, Some(&team("a")));
    assert_eq!(pending(&mut interests), vec![of_type, of_team_a]);
    interests.leave(of_team_a);
    interests.published(4, &key, &event, Some(&team("a")));
    assert_eq!(pending(&mut interests), vec![of_type]);
    assert!(interests.by_label.is_empty());
    interests.leave(of_other_type);
    assert_eq!(interests.by_type.0[&artist.group].len(), 1);
}

/// A selected watch that nothing it selects concerns does not fall behind however far the
/// history moves on (it was never woken: nothing it skipped was for it); one that was left a
/// change it selects before the history dropped it does.
#[tokio::test]
async fn a_sparse_watch_survives_the_history_moving_on_but_not_losing_its_change() {
    let mut log = EventLog::new(
        HistoryLimits {
            changes: 10,
            bytes: 64 << 20,
        },
        Version::new(0),
    );
    let mut quiet = team_a(&log, false);
    let mut lagging = team_a(&log, false);
    next_event(&mut quiet).await;
    next_event(&mut lagging).await;
    labelled(&mut log, "mine", 1, "a");
    next_event(&mut quiet).await;
    // `lagging` does not read its change before the history drops it.
    for index in 2..=100 {
        labelled(&mut log, "other", index, "b");
    }
    labelled(&mut log, "mine", 101, "a");
    let seen = next_event(&mut quiet).await;
    assert!(matches!(seen.operation, Operation::Upsert(_)), "{seen:?}");
    assert_eq!(seen.version, Version::new(101).to_string());
    let behind = tokio::time::timeout(std::time::Duration::from_secs(5), lagging.next())
        .await
        .expect("an answer")
        .expect("open");
    assert!(
        matches!(&behind, Err(StorageError::WatchClosed(why)) if why.contains("fell")),
        "{behind:?}"
    );
}

/// A resumed selected watch hears of a resource leaving its match (its labels before the change
/// matched) and of nothing that never matched: the change carries what it replaced, so no
/// watcher keeps a set of what it matched (a watch matching a million resources held a million
/// keys, and its wake index as many). Before, a resumed watch got a Delete for every change
/// that did not match.
#[tokio::test(start_paused = true)]
async fn a_resumed_selected_watch_hears_only_of_what_matched_before_or_after() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    labelled(&mut log, "x", 1, "a");
    labelled(&mut log, "y", 2, "b");
    let mut watch = log
        .watch(
            everything(),
            WatchOptions {
                selector: Some(Selector::parse("team=a").expect("selector")),
                progress: false,
            },
            Vec::new(),
            Version::new(2),
            Some(Version::new(2)),
        )
        .expect("watch");
    assert!(matches!(
        next_event(&mut watch).await.operation,
        Operation::EndOfSnapshot
    ));
    labelled(&mut log, "y", 3, "c");
    labelled(&mut log, "x", 4, "b");
    let left = next_event(&mut watch).await;
    assert!(
        matches!(&left.operation, Operation::Delete(resource) if resource.id.as_ref().is_some_and(|id| id.name == "x")),
        "{left:?}"
    );
    assert_eq!(left.version, Version::new(4).to_string());
    labelled(&mut log, "x", 5, "c");
    assert_quiet(
        &mut watch,
        std::time::Duration::from_secs(5),
        "x no longer matched before this change: nothing to say",
    )
    .await;
}

/// The history keeps the labels a change replaced only when it changed them: a write of data or
/// a status costs no copy of its labels.
#[test]
fn only_changed_labels_are_kept() {
    let mut log = EventLog::new(HistoryLimits::default(), Version::new(0));
    let before = |log: &EventLog| {
        lock(&log.ring)
            .items
            .back()
            .and_then(|item| item.before.clone())
    };
    labelled(&mut log, "x", 1, "a");
    assert_eq!(before(&log), None, "created");
    labelled(&mut log, "x", 2, "a");
    assert_eq!(before(&log), None, "the same labels");
    labelled(&mut log, "x", 3, "b");
    assert_eq!(
        before(&log).and_then(|labels| labels.get("team").cloned()),
        Some("a".to_owned())
    );
}
