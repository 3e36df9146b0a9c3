//! Selectors on List, ListByOwner and WatchList, and bookmarks (DESIGN §3).

use std::time::Duration;

use futures::StreamExt;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{ListByOwnerRequest, WatchEvent, WatchListRequest};
use tonic::Code;

use super::*;
use crate::service::read::WatchStream;

fn labelled(name: &str, labels: &[(&str, &str)]) -> Resource {
    let mut resource = artist(name);
    for (key, value) in labels {
        resource.metadata.insert((*key).into(), (*value).into());
    }
    resource
}

async fn list_selected(h: &Harness, selector: &str) -> Result<Vec<String>, Error> {
    let answer = h
        .service
        .list(
            &AllowAll,
            Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
                tenancy: Some(default_ns()),
                selector: selector.into(),
                ..ListRequest::default()
            },
        )
        .await?;
    Ok(answer
        .resources
        .iter()
        .map(|r| r.id.as_ref().expect("id").name.clone())
        .collect())
}

async fn watch_selected(
    h: &Harness,
    selector: &str,
    since_version: &str,
    bookmarks: bool,
) -> WatchStream {
    h.service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
                tenancy: Some(default_ns()),
                selector: selector.into(),
                since_version: since_version.into(),
                bookmarks,
                ..WatchListRequest::default()
            },
        )
        .await
        .expect("watch")
}

async fn next(stream: &mut WatchStream) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10s")
        .expect("stream open")
        .expect("no error")
}

/// What an event says, in a word and a name.
fn said(event: &WatchEvent) -> (String, String) {
    let name = |resource: &Option<Resource>| {
        resource
            .as_ref()
            .and_then(|r| r.id.as_ref())
            .map(|id| id.name.clone())
            .unwrap_or_default()
    };
    match &event.event {
        Some(Event::Upsert(upsert)) => ("upsert".into(), name(&upsert.resource)),
        Some(Event::Delete(delete)) => ("delete".into(), name(&delete.resource)),
        Some(Event::EndOfSnapshot(_)) => ("end".into(), String::new()),
        Some(Event::Bookmark(_)) => ("bookmark".into(), String::new()),
        None => ("nothing".into(), String::new()),
    }
}

fn pair(word: &str, name: &str) -> (String, String) {
    (word.into(), name.into())
}

#[tokio::test]
async fn a_list_keeps_what_the_selector_matches() {
    let h = harness().await;
    h.write(labelled("ann", &[("team", "billing"), ("tier", "gold")]))
        .await
        .expect("ann");
    h.write(labelled("bob", &[("team", "search")]))
        .await
        .expect("bob");
    h.write(labelled("cat", &[])).await.expect("cat");
    assert_eq!(list_selected(&h, "").await.unwrap(), ["ann", "bob", "cat"]);
    assert_eq!(list_selected(&h, "team=billing").await.unwrap(), ["ann"]);
    assert_eq!(
        list_selected(&h, "team!=billing").await.unwrap(),
        ["bob", "cat"]
    );
    assert_eq!(
        list_selected(&h, "team in (billing,search)").await.unwrap(),
        ["ann", "bob"]
    );
    assert_eq!(list_selected(&h, "!team").await.unwrap(), ["cat"]);
    assert_eq!(
        list_selected(&h, "team,tier notin (silver)").await.unwrap(),
        ["ann", "bob"]
    );
}

#[tokio::test]
async fn a_bad_selector_is_invalid_naming_its_column() {
    let h = harness().await;
    let message = expect_error(
        list_selected(&h, "team=billing,,x").await,
        Code::InvalidArgument,
        "selector invalid at column 14",
    );
    assert!(message.contains("expected a key"), "{message}");
    let reserved = tonic::Status::from(list_selected(&h, "finalizers").await.unwrap_err());
    let details = proto::reason::of(&reserved).expect("details");
    assert_eq!(
        details
            .field_violations
            .first()
            .map(|(field, _)| field.as_str()),
        Some("selector")
    );
    let watch = h
        .service
        .watch_list(
            Arc::new(AllowAll),
            WatchListRequest {
                r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
                tenancy: Some(default_ns()),
                selector: "team in (a".into(),
                ..WatchListRequest::default()
            },
        )
        .await;
    expect_error(
        watch.map(|_| ()),
        Code::InvalidArgument,
        "selector invalid at column 11",
    );
}

#[tokio::test]
async fn list_by_owner_keeps_the_children_the_selector_matches() {
    let h = harness().await;
    let owner = h.write(artist("owner")).await.expect("owner");
    for (name, team) in [("one", "billing"), ("two", "search")] {
        let mut child = labelled(name, &[("team", team)]);
        child.owner = owner.id.clone();
        h.write(child).await.expect("child");
    }
    let children = h
        .service
        .list_by_owner(
            &AllowAll,
            ListByOwnerRequest {
                owner: owner.id.clone(),
                selector: "team=search".into(),
            },
        )
        .await
        .expect("children")
        .resources;
    let names: Vec<&str> = children
        .iter()
        .map(|r| r.id.as_ref().unwrap().name.as_str())
        .collect();
    assert_eq!(names, ["two"]);
}

/// An object that starts matching arrives as an Upsert, one that stops matching as a Delete,
/// and changes to objects that never matched not at all.
#[tokio::test]
async fn a_selected_watch_sees_objects_cross_in_and_out_of_the_match() {
    let h = harness().await;
    let ann = h
        .write(labelled("ann", &[("team", "billing")]))
        .await
        .expect("ann");
    h.write(labelled("bob", &[("team", "search")]))
        .await
        .expect("bob");
    let mut watch = watch_selected(&h, "team=billing", "", false).await;
    assert_eq!(said(&next(&mut watch).await), pair("upsert", "ann"));
    assert_eq!(said(&next(&mut watch).await), pair("end", ""));

    // Out of the match: a Delete of the resource as it is now.
    let mut moved = ann.clone();
    moved.metadata.insert("team".into(), "search".into());
    let moved = h.write(moved).await.expect("ann moves");
    let out = next(&mut watch).await;
    assert_eq!(said(&out), pair("delete", "ann"));
    assert_eq!(out.version, moved.version);
    // A change to something that does not match, before or after: nothing.
    let mut bob = h
        .read(&id("demo.v2.Artist", default_ns(), "bob"))
        .await
        .unwrap();
    bob.metadata.insert("tier".into(), "gold".into());
    h.write(bob).await.expect("bob changes");
    // Back in: an Upsert.
    let mut back = moved.clone();
    back.metadata.insert("team".into(), "billing".into());
    let back = h.write(back).await.expect("ann back");
    assert_eq!(said(&next(&mut watch).await), pair("upsert", "ann"));
    // Created matching, deleted: both seen.
    let cat = h
        .write(labelled("cat", &[("team", "billing")]))
        .await
        .expect("cat");
    assert_eq!(said(&next(&mut watch).await), pair("upsert", "cat"));
    h.delete(&id_of(&cat), "").await.expect("delete cat");
    assert_eq!(said(&next(&mut watch).await), pair("delete", "cat"));
    // A deleted object that did not match is not news.
    let dot = h
        .write(labelled("dot", &[("team", "search")]))
        .await
        .expect("dot");
    h.delete(&id_of(&dot), "").await.expect("delete dot");
    let mut last = back.clone();
    last.metadata.insert("tier".into(), "x".into());
    h.write(last).await.expect("ann again");
    assert_eq!(said(&next(&mut watch).await), pair("upsert", "ann"));
}

/// Resumed from a version, the watch cannot know what the watcher holds: a change that leaves
/// an object outside the match is a Delete (the watcher may have had it).
#[tokio::test]
async fn a_resumed_selected_watch_reports_objects_leaving_the_match() {
    let h = harness().await;
    let ann = h
        .write(labelled("ann", &[("team", "billing")]))
        .await
        .expect("ann");
    let mut moved = ann.clone();
    moved.metadata.insert("team".into(), "search".into());
    let mut watch = watch_selected(&h, "team=billing", &ann.version, false).await;
    assert_eq!(said(&next(&mut watch).await), pair("end", ""));
    h.write(moved).await.expect("ann moves");
    assert_eq!(said(&next(&mut watch).await), pair("delete", "ann"));
}

/// A quiet filtered watch gets bookmarks carrying the version it has gone past, and a watch
/// resumed from one continues from there with nothing missed.
#[tokio::test(start_paused = true)]
async fn a_quiet_filtered_watch_gets_bookmarks_and_resumes_from_one() {
    let h = harness().await;
    let mut watch = watch_selected(&h, "team=billing", "", true).await;
    assert_eq!(said(&next(&mut watch).await), pair("end", ""));
    // Changes the watch does not match move the history on.
    let mut last = None;
    for n in 0..5 {
        last = Some(
            h.write(labelled(&format!("other-{n}"), &[("team", "search")]))
                .await
                .expect("other"),
        );
    }
    let last = last.expect("written");
    let bookmark = next(&mut watch).await;
    assert_eq!(said(&bookmark), pair("bookmark", ""));
    assert_eq!(bookmark.version, last.version);
    // Nothing moved since: the next bookmark comes all the same, within 5 s (DESIGN: at least
    // every 5 s while nothing that matches changes), at the same version.
    let again = tokio::time::timeout(Duration::from_secs(5), next(&mut watch))
        .await
        .expect("a bookmark within 5 s on a quiet watch");
    assert_eq!(said(&again), pair("bookmark", ""));
    assert_eq!(again.version, last.version);
    // A watcher that resumes from the bookmark misses nothing after it.
    let mut resumed = watch_selected(&h, "team=billing", &bookmark.version, true).await;
    assert_eq!(said(&next(&mut resumed).await), pair("end", ""));
    h.write(labelled("ann", &[("team", "billing")]))
        .await
        .expect("ann");
    assert_eq!(said(&next(&mut resumed).await), pair("upsert", "ann"));
    assert_eq!(said(&next(&mut watch).await), pair("upsert", "ann"));
}

/// Attack (issue 57): a filtered watch on an idle server — nothing written after it began —
/// got no bookmark at all; DESIGN promises one at least every 5 s.
#[tokio::test(start_paused = true)]
async fn an_idle_server_still_bookmarks_a_watch_every_few_seconds() {
    let h = harness().await;
    let mut watch = watch_selected(&h, "team=billing", "", true).await;
    assert_eq!(said(&next(&mut watch).await), pair("end", ""));
    for _ in 0..3 {
        let bookmark = tokio::time::timeout(Duration::from_secs(5), next(&mut watch))
            .await
            .expect("a bookmark within 5 s on an idle server");
        assert_eq!(said(&bookmark), pair("bookmark", ""));
        assert!(!bookmark.version.is_empty(), "a bookmark names a version");
    }
}

/// Without asking, a watch gets no bookmarks.
#[tokio::test(start_paused = true)]
async fn bookmarks_come_only_when_asked_for() {
    let h = harness().await;
    let mut watch = watch_selected(&h, "team=billing", "", false).await;
    assert_eq!(said(&next(&mut watch).await), pair("end", ""));
    h.write(labelled("other", &[("team", "search")]))
        .await
        .expect("other");
    let quiet = tokio::time::timeout(Duration::from_secs(30), watch.next()).await;
    assert!(quiet.is_err(), "{quiet:?}");
}
