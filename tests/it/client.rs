//! The shared client's promises against real processes: a watch survives a server restart and
//! sees what happened meanwhile; an edit that loses a compare-and-swap race shows the server's
//! change and saves the merge on the next round.

use std::path::Path;
use std::time::Duration;

use ctl::command::edit::{self, EditOutcome, Problem};
use ctl::output::OutputFormat;
use ctl::session::Session;
use proto::client::{Client, WatchUpdate};
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Resource, Tenancy, Type, WatchListRequest};

fn concept_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Concept".into(),
    }
}

async fn write_document(client: &Client, yaml: &str) -> Resource {
    let codec = proto::codec::Codec::new(client.list_types().await.expect("types")).expect("codec");
    let resource = codec
        .read_yaml(yaml)
        .into_iter()
        .next()
        .expect("one document")
        .expect("valid document");
    client.write(&resource).await.expect("write")
}

fn concept(name: &str) -> String {
    format!(
        "type: demo.v1.Concept\nname: {name}\ntenancy: {{partition: default, namespace: default}}\ndata: {{name: {name}}}\n"
    )
}

fn upserted_name(update: &WatchUpdate) -> Option<String> {
    match update {
        WatchUpdate::Event(event) => match &event.event {
            Some(Event::Upsert(upsert)) => upsert
                .resource
                .as_ref()
                .and_then(|r| r.id.as_ref())
                .map(|id| id.name.clone()),
            _ => None,
        },
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_survives_a_server_restart_and_sees_what_happened_meanwhile() {
    let mut cluster = tests::Cluster::start(3).await;
    let leader_client = cluster.client(0);
    let watched_client = cluster.client(2);
    let mut watcher = watched_client.watcher(WatchListRequest {
        r#type: Some(concept_type()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
        name_prefix: String::new(),
        since_version: String::new(),
        ..WatchListRequest::default()
    });
    write_document(&leader_client, &concept("before")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let update = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .expect("the first write arrives")
            .expect("watching");
        if upserted_name(&update).as_deref() == Some("before") {
            break;
        }
    }

    cluster.nodes[2].kill();
    write_document(&leader_client, &concept("meanwhile")).await;
    cluster.nodes[2].restart();

    let mut notices = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let update = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the write made while the server was down never arrived; notices: {notices:?}"
                )
            })
            .expect("watching");
        match &update {
            WatchUpdate::Disconnected { .. } => notices.push("disconnected"),
            WatchUpdate::Resumed { .. } => notices.push("resumed"),
            WatchUpdate::Relisting { .. } => notices.push("relisting"),
            WatchUpdate::Failed(error) => panic!("the watch gave up: {error}"),
            WatchUpdate::Event(_) => {}
        }
        if upserted_name(&update).as_deref() == Some("meanwhile") {
            break;
        }
    }
    assert_eq!(notices.first(), Some(&"disconnected"), "{notices:?}");
    assert!(
        notices.contains(&"resumed") || notices.contains(&"relisting"),
        "the watcher says how it came back: {notices:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_that_loses_a_race_shows_the_server_change_and_saves_the_merge() {
    let cluster = tests::Cluster::start(1).await;
    let client = cluster.client(0);
    write_document(
        &client,
        "type: demo.v1.Executive\nname: ed\ndata: {name: Ed, position: CEO}\n",
    )
    .await;
    let session = Session::new(client.clone(), OutputFormat::Json);
    let mut round = 0;
    let racing_client = client.clone();
    let mut editor = |path: &Path| -> Result<(), proto::client::edit::EditError> {
        round += 1;
        if round == 1 {
            let text = std::fs::read_to_string(path).expect("the edit file is readable");
            std::fs::write(path, text.replace("CEO", "CFO")).expect("the edit file is writable");
            // Someone else renames the executive while this editor is open.
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(write_document(
                    &racing_client,
                    "type: demo.v1.Executive\nname: ed\ndata: {name: Edward, position: CEO}\n",
                ))
            });
        }
        // Round 2: the merged document is saved as it is.
        Ok(())
    };
    let mut problems = Vec::new();
    let mut retry = |problem: &Problem| {
        problems.push(problem.clone());
        true
    };
    let outcome = edit::edit(&session, "Executive", "ed", &mut editor, &mut retry)
        .await
        .expect("the edit is saved on the second round");
    let EditOutcome::Saved(saved) = outcome else {
        panic!("expected a save, got {outcome:?}");
    };
    assert_eq!(round, 2);
    match problems.as_slice() {
        [Problem::Conflict { changes, .. }] => {
            assert!(changes.contains("+   name: Edward"), "{changes}")
        }
        other => panic!("expected one conflict, got {other:?}"),
    }
    let codec = session.codec().await.expect("codec");
    let stored = codec.to_value(&saved).expect("value");
    assert_eq!(
        stored["data"]["name"], "Edward",
        "the server's change survives"
    );
    assert_eq!(
        stored["data"]["position"], "CFO",
        "the editor's change is saved"
    );
}

/// A field set back to its default by someone else shows in the conflict as both lines, and the
/// text kept for a script applies as it is (it carries the server's version, not the stale one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_conflict_shows_a_field_reset_to_its_default_and_keeps_an_applicable_merge() {
    let cluster = tests::Cluster::start(1).await;
    let client = cluster.client(0);
    let album = |acclaimed: bool, year: u32| {
        format!(
            "type: demo.v2.Album\nname: kind-of-blue\ntenancy: {{partition: default, namespace: default}}\n\
             data: {{name: Kind of Blue, yearOfRelease: {year}, criticallyAcclaimed: {acclaimed}}}\n"
        )
    };
    write_document(&client, &album(true, 1959)).await;
    let session = Session::new(client.clone(), OutputFormat::Json);
    let racing_client = client.clone();
    let mut editor = |path: &Path| -> Result<(), proto::client::edit::EditError> {
        let text = std::fs::read_to_string(path).expect("readable");
        std::fs::write(path, text.replace("1959", "1960")).expect("writable");
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(write_document(&racing_client, &album(false, 1959)))
        });
        Ok(())
    };
    let mut problems = Vec::new();
    let mut script = |problem: &Problem| {
        problems.push(problem.clone());
        false
    };
    let error = edit::edit(
        &session,
        "demo.v2.Album",
        "kind-of-blue",
        &mut editor,
        &mut script,
    )
    .await
    .expect_err("a script does not retry")
    .to_string();
    match problems.as_slice() {
        [Problem::Conflict { changes, .. }] => {
            assert!(
                changes.contains("-   criticallyAcclaimed: true"),
                "{changes}"
            );
            assert!(
                changes.contains("+   criticallyAcclaimed: false"),
                "{changes}"
            );
        }
        other => panic!("expected one conflict, got {other:?}"),
    }
    let kept = error
        .split("your edit is kept in ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no kept file named in: {error}"));
    let text = std::fs::read_to_string(kept).expect("the kept edit is readable");
    let saved = write_document(&client, &text).await;
    let codec = session.codec().await.expect("codec");
    let stored = codec.to_value(&saved).expect("value");
    assert_eq!(
        stored["data"]["yearOfRelease"], 1960,
        "the edit is in the kept text"
    );
    assert_eq!(
        stored["data"].get("criticallyAcclaimed"),
        None,
        "the server's change too"
    );
    let _ = std::fs::remove_file(kept);
}

/// A rejected document reopens at once with the error on top; closing the editor without a
/// change then gives up, keeping the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_edit_reopens_and_closing_it_unchanged_gives_up() {
    let cluster = tests::Cluster::start(1).await;
    let client = cluster.client(0);
    write_document(
        &client,
        "type: demo.v1.Executive\nname: bo\ndata: {name: Bo, position: CEO}\n",
    )
    .await;
    let session = Session::new(client.clone(), OutputFormat::Json);
    let mut opened = Vec::new();
    let mut editor = |path: &Path| -> Result<(), proto::client::edit::EditError> {
        let text = std::fs::read_to_string(path).expect("readable");
        if opened.is_empty() {
            std::fs::write(
                path,
                text.replace("position: CEO", "position: CEO\n  salary: lots"),
            )
            .expect("writable");
        }
        opened.push(text);
        Ok(())
    };
    let mut person = |_: &Problem| true;
    let error = edit::edit(&session, "Executive", "bo", &mut editor, &mut person)
        .await
        .expect_err("given up")
        .to_string();
    assert_eq!(opened.len(), 2, "reopened once");
    assert!(
        opened[1].contains("# error:") && opened[1].contains("salary"),
        "{}",
        opened[1]
    );
    assert!(error.contains("closed without a change"), "{error}");
    assert!(error.contains("your edit is kept in "), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_that_does_not_save_keeps_the_users_text_and_says_where() {
    let cluster = tests::Cluster::start(1).await;
    let client = cluster.client(0);
    write_document(
        &client,
        "type: demo.v1.Executive\nname: al\ndata: {name: Al, position: CEO}\n",
    )
    .await;
    let session = Session::new(client.clone(), OutputFormat::Json);
    // The user's edit makes the document invalid, and a script does not retry.
    let mut editor = |path: &Path| -> Result<(), proto::client::edit::EditError> {
        let text = std::fs::read_to_string(path).expect("readable");
        std::fs::write(
            path,
            text.replace("position: CEO", "position: CEO\n  salary: lots"),
        )
        .expect("writable");
        Ok(())
    };
    let mut never = |_: &Problem| false;
    let error = edit::edit(&session, "Executive", "al", &mut editor, &mut never)
        .await
        .expect_err("the edit is refused")
        .to_string();
    let kept = error
        .split("your edit is kept in ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("no kept file named in: {error}"));
    let text = std::fs::read_to_string(kept).expect("the kept edit is readable");
    assert!(text.contains("salary: lots"), "{text}");
    let _ = std::fs::remove_file(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_several_servers_skips_a_dead_one_and_its_watch_moves_when_its_server_dies() {
    let mut cluster = tests::Cluster::start(3).await;
    let writer = cluster.client(0);
    // A dead address first, then nodes 3 and 2: calls go past the dead one.
    let dead = format!("127.0.0.1:{}", tests::free_port());
    let servers = format!(
        "{dead},{},{}",
        cluster.nodes[2].api_addr, cluster.nodes[1].api_addr
    );
    let client = Client::new(proto::client::ClientConfig::new(servers)).expect("client");
    client
        .list_types()
        .await
        .expect("answered by a live server");
    assert_eq!(client.server(), cluster.nodes[2].api_addr);

    let mut watcher = client.watcher(WatchListRequest {
        r#type: Some(concept_type()),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
        name_prefix: String::new(),
        since_version: String::new(),
        ..WatchListRequest::default()
    });
    let mut seen: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for index in 0..5 {
        write_document(&writer, &concept(&format!("before-{index}"))).await;
    }
    while seen.len() < 5 {
        seen.push(next_upsert(&mut watcher, deadline).await);
    }

    // The node the watch streams from dies; writes go on through node 1.
    cluster.nodes[2].kill();
    for index in 0..5 {
        write_document(&writer, &concept(&format!("after-{index}"))).await;
    }
    while seen.len() < 10 {
        seen.push(next_upsert(&mut watcher, deadline).await);
    }
    let expected: Vec<String> = (0..5)
        .map(|i| format!("before-{i}"))
        .chain((0..5).map(|i| format!("after-{i}")))
        .collect();
    assert_eq!(seen, expected, "every change once, in order");
    assert_eq!(
        client.server(),
        cluster.nodes[1].api_addr,
        "moved to node 2"
    );
    // Calls follow too.
    client
        .list_types()
        .await
        .expect("answered after the failover");
}

/// The name of the next upsert the watcher delivers (bounded by `deadline`).
async fn next_upsert(
    watcher: &mut proto::client::Watcher,
    deadline: tokio::time::Instant,
) -> String {
    loop {
        let update = tokio::time::timeout_at(deadline, watcher.next())
            .await
            .expect("events in time")
            .expect("watching");
        if let WatchUpdate::Failed(error) = &update {
            panic!("the watch gave up: {error}");
        }
        if let Some(name) = upserted_name(&update) {
            return name;
        }
    }
}

/// Runs the real `resctl` against `server`.
fn resctl(server: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(tests::binary("resctl"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env("RESCTL_CONFIG", "/nonexistent/resctl-contexts.yaml")
        .env_remove("RESD_SERVER")
        .env_remove("RESD_TOKEN")
        .output()
        .expect("resctl runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resctl_wait_returns_when_a_condition_holds_or_the_resource_is_gone() {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let client = cluster.client(0);
    let artist = write_document(
        &client,
        "type: demo.v2.Artist\nname: nina\ntenancy: {partition: default, namespace: default}\ndata: {name: Nina Simone}\n",
    )
    .await;
    // The artist controller sets Accepted.
    let waited = tokio::task::spawn_blocking({
        let server = server.clone();
        move || {
            resctl(
                &server,
                &[
                    "wait",
                    "Artist",
                    "nina",
                    "--for",
                    "condition=Accepted",
                    "--timeout",
                    "30s",
                ],
            )
        }
    })
    .await
    .expect("resctl wait");
    assert_eq!(waited.status.code(), Some(0), "{waited:?}");
    assert!(
        String::from_utf8_lossy(&waited.stdout).contains("Accepted=True"),
        "{waited:?}"
    );

    // Not deleted: a short wait times out with exit 1 and says what it saw.
    let timed_out = tokio::task::spawn_blocking({
        let server = server.clone();
        move || {
            resctl(
                &server,
                &[
                    "wait",
                    "Artist",
                    "nina",
                    "--for",
                    "delete",
                    "--timeout",
                    "1s",
                ],
            )
        }
    })
    .await
    .expect("resctl wait");
    assert_eq!(timed_out.status.code(), Some(1), "{timed_out:?}");
    assert!(
        String::from_utf8_lossy(&timed_out.stderr).contains("last seen: present"),
        "{timed_out:?}"
    );

    // Deleted meanwhile: the wait returns.
    let id = artist.id.clone().expect("id");
    let waiter = tokio::task::spawn_blocking({
        let server = server.clone();
        move || {
            resctl(
                &server,
                &[
                    "wait",
                    "Artist",
                    "nina",
                    "--for",
                    "delete",
                    "--timeout",
                    "30s",
                ],
            )
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.delete(&id, "").await.expect("delete");
    let gone = waiter.await.expect("resctl wait");
    assert_eq!(gone.status.code(), Some(0), "{gone:?}");

    // A bad --for is a usage error.
    let bad = resctl(&server, &["wait", "Artist", "nina", "--for", "ready"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resctl_diff_shows_what_apply_would_change_and_jsonpath_picks_fields() {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("records.yaml");
    let documents = |artist_name: &str| {
        format!(
            "type: tenancy.v1.Namespace\nname: records\ntenancy: {{partition: default}}\ndata: {{description: Records}}\n---\n\
             type: demo.v2.Artist\nname: nina\ntenancy: {{partition: default, namespace: records}}\ndata: {{name: {artist_name}}}\n"
        )
    };
    std::fs::write(&file, documents("Nina Simone")).expect("write");
    let path = file.display().to_string();
    let run = move |args: Vec<String>| {
        let server = server.clone();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            resctl(&server, &args)
        })
    };
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // Nothing stored yet: both documents would be created, the artist in the namespace the
    // same input creates first.
    let fresh = run(args(&["diff", "-f", &path, "-o", "json"]))
        .await
        .expect("diff");
    assert_eq!(fresh.status.code(), Some(1), "{fresh:?}");
    let report: serde_json::Value = serde_json::from_slice(&fresh.stdout).expect("json");
    let changes: Vec<&str> = report
        .as_array()
        .expect("array")
        .iter()
        .map(|d| d["change"].as_str().expect("change"))
        .collect();
    assert_eq!(changes, ["create", "create"], "{report}");

    let applied = run(args(&["apply", "-f", &path])).await.expect("apply");
    assert_eq!(applied.status.code(), Some(0), "{applied:?}");
    let same = run(args(&["diff", "-f", &path])).await.expect("diff");
    assert_eq!(same.status.code(), Some(0), "{same:?}");
    assert!(same.stdout.is_empty(), "{same:?}");

    std::fs::write(&file, documents("Eunice Waymon")).expect("write");
    let changed = run(args(&["diff", "-f", &path])).await.expect("diff");
    assert_eq!(changed.status.code(), Some(1), "{changed:?}");
    let text = String::from_utf8_lossy(&changed.stdout);
    assert!(
        text.contains("--- live/demo.v2.Artist/default/records/nina"),
        "{text}"
    );
    assert!(
        text.contains("-  name: Nina Simone\n+  name: Eunice Waymon"),
        "{text}"
    );

    // A document the server rejects is an error (2), not a difference.
    std::fs::write(
        &file,
        "type: demo.v2.Artist\nname: x\ndata: {genre: POLKA}\n",
    )
    .expect("write");
    let rejected = run(args(&["diff", "-f", &path])).await.expect("diff");
    assert_eq!(rejected.status.code(), Some(2), "{rejected:?}");
    assert!(
        String::from_utf8_lossy(&rejected.stderr).contains("POLKA"),
        "{rejected:?}"
    );

    let picked = run(args(&[
        "get",
        "Artist",
        "-A",
        "-o",
        "jsonpath={range .items[*]}{.tenancy.namespace}/{.name}={.data.name}{\"\\n\"}{end}",
    ]))
    .await
    .expect("get");
    assert_eq!(picked.status.code(), Some(0), "{picked:?}");
    assert_eq!(
        String::from_utf8_lossy(&picked.stdout),
        "records/nina=Nina Simone\n"
    );
    let one = run(args(&[
        "get",
        "Artist",
        "nina",
        "-n",
        "records",
        "-o",
        "jsonpath={.data.name}",
    ]))
    .await
    .expect("get");
    assert_eq!(String::from_utf8_lossy(&one.stdout), "Nina Simone");
    // What `-o name` prints can be piped back: get TYPE/NAME, delete TYPE/NAME.
    let named = run(args(&["get", "Artist", "-n", "records", "-o", "name"]))
        .await
        .expect("get -o name");
    let name = String::from_utf8_lossy(&named.stdout).trim().to_owned();
    assert_eq!(name, "demo.v2.Artist/nina", "{named:?}");
    let again = run(args(&[
        "get",
        &name,
        "-n",
        "records",
        "-o",
        "jsonpath={.name}",
    ]))
    .await
    .expect("get TYPE/NAME");
    assert_eq!(String::from_utf8_lossy(&again.stdout), "nina", "{again:?}");
    let bad = run(args(&["get", "Artist", "-o", "jsonpath={.items[0"]))
        .await
        .expect("get");
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("expected `]`"),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_blind_writers_on_ten_keys_all_succeed() {
    let cluster = tests::Cluster::start(3).await;
    let clients: Vec<Client> = (0..3).map(|index| cluster.client(index)).collect();
    let codec = std::sync::Arc::new(
        proto::codec::Codec::new(clients[0].list_types().await.expect("types")).expect("codec"),
    );
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..64usize {
        let client = clients[writer % 3].clone();
        let codec = codec.clone();
        writers.spawn(async move {
            let mut failures = Vec::new();
            for round in 0..10usize {
                let key = (writer + round) % 10;
                let resource = codec
                    .read_yaml(&format!(
                        "type: demo.v1.Concept\nname: key-{key}\ntenancy: {{partition: default, namespace: default}}\ndata: {{name: w{writer}r{round}}}\n"
                    ))
                    .remove(0)
                    .expect("document");
                if let Err(error) = client.write(&resource).await {
                    failures.push(format!("writer {writer} round {round}: {error}"));
                }
            }
            failures
        });
    }
    let mut failures = Vec::new();
    while let Some(result) = tokio::time::timeout(Duration::from_secs(120), writers.join_next())
        .await
        .expect("the writers finish within 2 minutes")
    {
        failures.extend(result.expect("writer task"));
    }
    assert!(
        failures.is_empty(),
        "{} of 640 blind writes failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// `--request-timeout` bounds a command against a server that takes the connection and never
/// answers (without it, a call waits 30 s), and a bad one is a usage error.
#[test]
fn resctl_gives_up_at_its_request_timeout() {
    // Connections complete in the backlog; nothing is ever read or answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let server = silent.local_addr().expect("address").to_string();
    let started = std::time::Instant::now();
    let output = resctl(&server, &["--request-timeout", "1s", "cluster", "status"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    let bad = resctl(&server, &["--request-timeout", "soon", "cluster", "status"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--request-timeout"),
        "{bad:?}"
    );
    drop(silent);
}
