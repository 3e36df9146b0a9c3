//! The CLI scenario, once, run by both drivers against a real 3-node cluster: apply the demo
//! fixtures (created, then unchanged), get in every output format (YAML re-applies unchanged),
//! edit, watch a write and a delete in order, the owner tree, snapshot save → inspect →
//! restore, delete --wait through the finalizer cascade, and every invalid fixture failing with
//! its expected message.

use std::path::Path;
use std::time::Duration;

use ctl::output::OutputFormat;
use serde_json::Value;

use crate::drivers::{Binary, Driver, Library};

fn outcomes(report: &Value) -> Vec<(String, String)> {
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            (
                r["outcome"].as_str().unwrap_or_default().to_owned(),
                format!(
                    "{}/{}",
                    r["type"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default()
                ),
            )
        })
        .collect()
}

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn write_file(directory: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = directory.join(name);
    std::fs::write(&path, text).expect("write a scenario file");
    path
}

async fn scenario<D: Driver>(driver: &D) {
    let who = driver.name();
    let fixtures = tests::fixtures();
    let scratch = tempfile::tempdir().expect("temp dir");

    // A dry run on the fresh cluster predicts the whole apply (namespaces it creates count for
    // the documents after them) and stores nothing.
    let predicted = driver
        .apply_dry_run(&fixtures.join("demo"))
        .await
        .success("apply --dry-run demo");
    let predicted = outcomes(&predicted);
    assert_eq!(predicted.len(), 14, "{who}: {predicted:?}");
    assert!(
        predicted.iter().all(|(outcome, _)| outcome == "created"),
        "{who}: {predicted:?}"
    );

    // Apply the demo fixtures: every object created; again: every object unchanged.
    let first = driver
        .apply(&fixtures.join("demo"))
        .await
        .success("apply demo");
    let first = outcomes(&first);
    assert_eq!(first.len(), 14, "{who}: {first:?}");
    assert!(
        first.iter().all(|(outcome, _)| outcome == "created"),
        "{who}: {first:?}"
    );
    let second = outcomes(
        &driver
            .apply(&fixtures.join("demo"))
            .await
            .success("re-apply demo"),
    );
    assert!(
        second.iter().all(|(outcome, _)| outcome == "unchanged"),
        "{who}: {second:?}"
    );

    // Get and list, in each output format; the YAML re-applies as unchanged.
    let albums = driver
        .get("jazz", "demo.v2.Album", None)
        .await
        .success("list albums");
    let listed = names(&albums);
    for album in ["a-love-supreme", "bitches-brew", "kind-of-blue"] {
        assert!(listed.contains(&album.to_owned()), "{who}: {listed:?}");
    }
    let table = driver
        .get_formatted("jazz", "demo.v2.Album", OutputFormat::Table)
        .await;
    assert!(table.starts_with("NAME "), "{who}: {table}");
    assert!(
        table.contains("kind-of-blue") && table.contains("Artist/miles-davis"),
        "{who}: {table}"
    );
    let wide = driver
        .get_formatted("jazz", "demo.v2.Album", OutputFormat::Wide)
        .await;
    assert!(
        wide.contains("FINALIZERS") && wide.contains("demo.resd.io/album-cleanup"),
        "{who}: {wide}"
    );
    let json: Value = serde_json::from_str(
        &driver
            .get_formatted("jazz", "demo.v2.Album", OutputFormat::Json)
            .await,
    )
    .expect("json output parses");
    assert_eq!(names(&json), listed, "{who}");
    let name_lines = driver
        .get_formatted("jazz", "demo.v2.Album", OutputFormat::Name)
        .await;
    assert!(
        name_lines
            .lines()
            .any(|l| l == "demo.v2.Album/kind-of-blue"),
        "{who}: {name_lines}"
    );
    let yaml = driver
        .get_formatted("jazz", "demo.v2.Album", OutputFormat::Yaml)
        .await;
    let yaml_file = write_file(scratch.path(), "albums.yaml", &yaml);
    let reapplied = outcomes(
        &driver
            .apply(&yaml_file)
            .await
            .success("re-apply get -o yaml"),
    );
    assert_eq!(reapplied.len(), listed.len(), "{who}");
    assert!(
        reapplied.iter().all(|(outcome, _)| outcome == "unchanged"),
        "{who}: {reapplied:?}"
    );
    // So does `get -o json` of many (a JSON list).
    let json_list = driver
        .get_formatted("jazz", "demo.v2.Album", OutputFormat::Json)
        .await;
    let json_file = write_file(scratch.path(), "albums.json", &json_list);
    let reapplied = outcomes(
        &driver
            .apply(&json_file)
            .await
            .success("re-apply get -o json"),
    );
    assert_eq!(reapplied.len(), listed.len(), "{who}: {reapplied:?}");
    assert!(
        reapplied.iter().all(|(outcome, _)| outcome == "unchanged"),
        "{who}: {reapplied:?}"
    );

    // Edit one album with a scripted editor; the change is stored with a new generation.
    let before = driver
        .get("jazz", "demo.v2.Album", Some("kind-of-blue"))
        .await
        .success("get album");
    let edited = driver
        .edit(
            "jazz",
            "demo.v2.Album",
            "kind-of-blue",
            "Kind of Blue",
            "Kind of Blue (Legacy Edition)",
        )
        .await
        .success("edit");
    assert_eq!(edited["saved"], true, "{who}: {edited}");
    let after = driver
        .get("jazz", "demo.v2.Album", Some("kind-of-blue"))
        .await
        .success("get album");
    assert_eq!(
        after["data"]["name"], "Kind of Blue (Legacy Edition)",
        "{who}"
    );
    assert_ne!(after["generation"], before["generation"], "{who}");
    assert_eq!(after["version"], edited["version"], "{who}");

    // Watch sees a write and a delete, in order, from a version.
    let concept = |name: &str| {
        format!(
            "type: demo.v1.Concept\nname: bebop\ntenancy: {{partition: default, namespace: jazz}}\ndata: {{name: {name}}}\n"
        )
    };
    driver
        .apply(&write_file(scratch.path(), "bebop.yaml", &concept("Bebop")))
        .await
        .success("apply bebop");
    let created = driver
        .get("jazz", "demo.v1.Concept", Some("bebop"))
        .await
        .success("get bebop");
    let from_version = created["version"].as_str().expect("version").to_owned();
    driver
        .apply(&write_file(
            scratch.path(),
            "bebop.yaml",
            &concept("Bebop (hard)"),
        ))
        .await
        .success("update bebop");
    driver
        .delete_wait("jazz", "demo.v1.Concept", "bebop", Duration::from_secs(30))
        .await
        .success("delete bebop");
    let events = driver
        .watch("jazz", "demo.v1.Concept", &from_version, 2)
        .await;
    let seen: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or_default().to_owned(),
                e["resource"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("upsert".to_owned(), "bebop".to_owned()),
            ("delete".to_owned(), "bebop".to_owned())
        ],
        "{who}"
    );
    assert_eq!(
        events[0]["resource"]["data"]["name"], "Bebop (hard)",
        "{who}"
    );
    // Who made each change: the driver's identity wrote bebop.
    assert_eq!(events[0]["actor"], driver.actor(), "{who}: {:?}", events[0]);
    assert!(
        events[1]["actor"].as_str().is_some_and(|a| !a.is_empty()),
        "{who}: {:?}",
        events[1]
    );

    // The owner tree shows the albums under their artist.
    let tree = driver
        .tree("jazz", "demo.v2.Artist", "miles-davis")
        .await
        .success("tree");
    let children = names(&tree["node"]["children"]);
    assert!(
        children.contains(&"kind-of-blue".to_owned())
            && children.contains(&"bitches-brew".to_owned()),
        "{who}: {tree}"
    );
    let album_tree = driver
        .tree("jazz", "demo.v2.Album", "kind-of-blue")
        .await
        .success("album tree");
    assert_eq!(
        names(&album_tree["ancestors"]),
        vec!["miles-davis".to_owned()],
        "{who}"
    );

    // Snapshot: save → inspect → change → restore brings the saved state back.
    let file = scratch.path().join("cluster.snap");
    let saved = driver.snapshot_save(&file).await.success("snapshot save");
    let inspected = driver
        .snapshot_inspect(&file)
        .await
        .success("snapshot inspect");
    assert_eq!(inspected["header"], saved["header"], "{who}");
    assert_eq!(
        inspected["header"]["counts"]["demo.v2.Artist"], 3,
        "{who}: {inspected}"
    );
    let per_tenancy: u64 = inspected["by_tenancy"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        per_tenancy,
        saved["header"]["resources"].as_u64().expect("count"),
        "{who}"
    );
    driver
        .delete_wait(
            "default",
            "demo.v1.Executive",
            "clive-davis",
            Duration::from_secs(30),
        )
        .await
        .success("delete executive");
    assert_eq!(
        driver
            .get("default", "demo.v1.Executive", Some("clive-davis"))
            .await
            .code,
        1,
        "{who}"
    );
    let restored = driver
        .snapshot_restore(&file)
        .await
        .success("snapshot restore");
    assert_eq!(
        restored["header"]["raft_index"], saved["header"]["raft_index"],
        "{who}"
    );
    driver
        .get("default", "demo.v1.Executive", Some("clive-davis"))
        .await
        .success("executive is back");

    // Deleting an artist with --wait finishes after the cascade: albums (with finalizers) gone.
    let deleted = driver
        .delete_wait(
            "jazz",
            "demo.v2.Artist",
            "miles-davis",
            Duration::from_secs(60),
        )
        .await
        .success("delete --wait artist");
    assert_eq!(
        deleted["results"][0]["result"], "deleted",
        "{who}: {deleted}"
    );
    let remaining = names(
        &driver
            .get("jazz", "demo.v2.Album", None)
            .await
            .success("list albums"),
    );
    assert!(
        !remaining
            .iter()
            .any(|n| n == "kind-of-blue" || n == "bitches-brew" || n.starts_with("miles-davis")),
        "{who}: {remaining:?}"
    );

    // Every invalid fixture fails with its expected message; exit code 1.
    let invalid = fixtures.join("invalid");
    let mut files: Vec<_> = std::fs::read_dir(&invalid)
        .expect("fixtures/invalid")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "one file per bad-input class");
    for file in files {
        let expected = std::fs::read_to_string(file.with_extension("error"))
            .unwrap_or_else(|_| panic!("{} has no .error file beside it", file.display()));
        let reply = driver.apply(&file).await;
        assert_eq!(reply.code, 1, "{who}: {} should fail", file.display());
        let error = reply.value["results"][0]["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            error.contains(expected.trim()),
            "{who}: {}: expected {:?} in {error:?}",
            file.display(),
            expected.trim()
        );
        assert!(
            reply.stderr.contains(expected.trim()),
            "{who}: stderr {}",
            reply.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_scenario_passes_through_the_client_library() {
    let cluster = tests::Cluster::start(3).await;
    // A follower: writes forward to the leader.
    let driver = Library {
        client: cluster.client(1),
    };
    scenario(&driver).await;
}

/// The binary runs the scenario against a cluster with ACLs on, with the management token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_scenario_passes_through_the_resctl_binary_with_acls_on() {
    let cluster = tests::Cluster::start_with_acls(3).await;
    let config = tempfile::tempdir().expect("temp dir");
    let driver = Binary {
        server: cluster.nodes[2].api_addr.clone(),
        config: config.path().join("contexts.yaml"),
        token: cluster.token.clone(),
        tls: cluster.tls.clone(),
    };
    scenario(&driver).await;
    // Without the token, the same binary is refused.
    let anonymous = Binary {
        token: None,
        ..driver
    };
    let refused = anonymous.get("default", "demo.v2.Artist", None).await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("unauthenticated"),
        "{}",
        refused.stderr
    );
}
