//! `resctl history`, `blame`, `diff --from`, `get --at` and `describe` (DESIGN §18), the real
//! binary against a real node: an artist written three times shows each version, who wrote it
//! and what it changed; the demo controller's events appear in `describe` merged with a count.

use std::time::{Duration, Instant};

use crate::cli::{ok, resctl};

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("resctl -o json prints JSON")
}

fn apply(server: &str, yaml: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("nina.yaml");
    std::fs::write(&path, yaml).expect("write");
    ok(server, &["apply", "-f", &path.display().to_string()]);
}

fn nina(name: &str, genre: &str) -> String {
    format!(
        "type: demo.v2.Artist\nname: nina\ntenancy: {{partition: default, namespace: default}}\ndata: {{name: {name}, genre: {genre}}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_blame_diff_and_describe_tell_what_happened_to_an_object() {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    tokio::task::spawn_blocking(move || {
        apply(&server, &nina("Nina Simone", "GENRE_JAZZ"));
        apply(&server, &nina("Nina Simone", "GENRE_BLUES"));
        apply(&server, &nina("Eunice Waymon", "GENRE_BLUES"));

        let history = json(&ok(&server, &["history", "Artist", "nina", "-o", "json"]));
        let writes: Vec<&serde_json::Value> = history
            .as_array()
            .expect("rows")
            .iter()
            .filter(|row| row["operation"] == "write")
            .collect();
        assert_eq!(writes.len(), 3, "{history:#}");
        let version = |row: &serde_json::Value| row["version"].as_str().expect("a version").to_owned();
        let (newest, middle, first) = (version(writes[0]), version(writes[1]), version(writes[2]));
        assert_eq!(writes[0]["changed"], serde_json::json!(["data.name"]));
        assert_eq!(writes[1]["changed"], serde_json::json!(["data.genre"]));
        assert!(history.as_array().expect("rows").iter().any(|row| row["operation"] == "status"
            && row["actor"] == "controller/demo-artist"), "the controller's status writes are kept too: {history:#}");

        // Blame: each field with the version that last changed it.
        let blame = json(&ok(&server, &["blame", "Artist", "nina", "-o", "json"]));
        let blamed = |field: &str| {
            blame
                .as_array()
                .expect("fields")
                .iter()
                .find(|b| b["field"] == field)
                .map(|b| b["version"].as_str().unwrap_or_default().to_owned())
                .unwrap_or_default()
        };
        assert_eq!(blamed("data.name"), newest);
        assert_eq!(blamed("data.genre"), middle);

        // The object as it was.
        let old = json(&ok(&server, &["get", "Artist", "nina", "--at", &first, "-o", "json"]));
        assert_eq!(old["data"]["genre"], "GENRE_JAZZ");
        assert_eq!(old["version"], first);

        // Two versions compared: exit 1 with the change, 0 when the same.
        let changed = resctl(&server, &["diff", "Artist", "nina", "--from", &first, "--to", &middle]);
        assert_eq!(changed.status.code(), Some(1), "{changed:?}");
        let text = String::from_utf8_lossy(&changed.stdout);
        assert!(text.contains("-  genre: GENRE_JAZZ") && text.contains("+  genre: GENRE_BLUES"), "{text}");
        let same = resctl(&server, &["diff", "Artist", "nina", "--from", &middle, "--to", &middle]);
        assert_eq!(same.status.code(), Some(0), "{same:?}");
        let before = resctl(&server, &["get", "Artist", "nina", "--at", "1"]);
        assert_eq!(before.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&before.stderr).contains("did not exist at version 1"), "{before:?}");

        // The demo controller's events: one per generation it reconciled, merged into one Event.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let described = json(&ok(&server, &["describe", "Artist", "nina", "-o", "json"]));
            let reconciled = described["events"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["reason"] == "AlbumsReconciled");
            // One occurrence per generation the controller saw (two writes close together may
            // be reconciled once): merged into one Event counting more than one.
            if let Some(event) = reconciled
                && event["count"].as_u64().is_some_and(|count| count >= 2)
            {
                assert_eq!(event["reporter"], "controller/demo-artist");
                assert_eq!(described["conditions"][0]["state"], "True");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no AlbumsReconciled event counted twice or more: {described:#}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let table = ok(&server, &["describe", "Artist", "nina"]);
        assert!(table.contains("Events:") && table.contains("AlbumsReconciled"), "{table}");
    })
    .await
    .expect("the CLI steps");
}
