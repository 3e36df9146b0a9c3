//! Labels, selectors, sorting and columns with the real `resctl` (DESIGN §3, issue 41): `label`
//! sets and removes keys with compare-and-swap, `get -l` selects on them (also through pages),
//! `--sort-by` orders by any path, `-o custom-columns` prints the columns asked for, `delete -l`
//! asks before it deletes and `--yes` confirms, and a bad selector is refused before any call
//! with the column it fails at.

use crate::cli::{ok, resctl};

fn names(json: &str) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_str(json).expect("json");
    value
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["name"].as_str().expect("name").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_select_sort_and_print_the_columns_asked_for() {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let scratch = tempfile::tempdir().expect("temp dir");
    let artists = scratch.path().join("artists.yaml");
    let mut documents = String::new();
    for (n, name) in ["ann", "bob", "cat", "dan", "eve"].iter().enumerate() {
        if n > 0 {
            documents.push_str("---\n");
        }
        documents.push_str(&format!(
            "type: demo.v2.Artist\nname: {name}\ndata: {{name: {name}, genre: GENRE_JAZZ}}\n"
        ));
    }
    std::fs::write(&artists, documents).expect("write");
    ok(&server, &["apply", "-f", &artists.display().to_string()]);

    // label: set (CAS), refuse to overwrite unasked, overwrite, remove.
    let said = ok(
        &server,
        &["label", "Artist", "ann", "team=billing", "tier=3"],
    );
    assert!(said.contains("demo.v2.Artist/ann labeled"), "{said}");
    ok(
        &server,
        &["label", "Artist", "bob", "team=billing", "tier=10"],
    );
    ok(
        &server,
        &["label", "Artist", "cat", "team=search", "tier=2"],
    );
    let refused = resctl(&server, &["label", "Artist", "cat", "team=billing"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--overwrite"),
        "{refused:?}"
    );
    ok(&server, &["label", "Artist", "dan", "team=search"]);
    ok(
        &server,
        &["label", "Artist", "dan", "team=billing", "--overwrite"],
    );
    ok(&server, &["label", "Artist", "dan", "team-"]);
    let unchanged = ok(&server, &["label", "Artist", "dan", "team-"]);
    assert!(unchanged.contains("unchanged"), "{unchanged}");

    // get -l, through the server's selector.
    let billing = ok(
        &server,
        &["get", "Artist", "-l", "team=billing", "-o", "json"],
    );
    assert_eq!(names(&billing), ["ann", "bob"]);
    let unlabelled = ok(&server, &["get", "Artist", "-l", "!team", "-o", "json"]);
    assert_eq!(names(&unlabelled), ["dan", "eve"]);
    let either = ok(
        &server,
        &[
            "get",
            "Artist",
            "-l",
            "team in (billing,search),tier",
            "-o",
            "json",
        ],
    );
    assert_eq!(names(&either), ["ann", "bob", "cat"]);

    // --sort-by: numbers as numbers (10 after 3), missing values last.
    let sorted = ok(
        &server,
        &["get", "Artist", "--sort-by", ".metadata.tier", "-o", "json"],
    );
    assert_eq!(names(&sorted), ["cat", "ann", "bob", "dan", "eve"]);

    // custom columns.
    let table = ok(
        &server,
        &[
            "get",
            "Artist",
            "-l",
            "team",
            "-o",
            "custom-columns=NAME:.name,TEAM:.metadata.team,GENRE:.data.genre",
        ],
    );
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "TEAM", "GENRE"]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["ann", "billing", "GENRE_JAZZ"],
        "{table}"
    );
    assert_eq!(lines.len(), 4, "{table}");

    // A bad selector: refused before any call, naming the column (exit 2).
    let bad = resctl(&server, &["get", "Artist", "-l", "team=billing,,x"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("selector invalid at column 14"),
        "{bad:?}"
    );

    // delete -l: not interactive, so it asks for --yes and deletes nothing.
    let asked = resctl(&server, &["delete", "Artist", "-l", "team=billing"]);
    assert_eq!(asked.status.code(), Some(2), "{asked:?}");
    assert!(
        String::from_utf8_lossy(&asked.stderr).contains("delete 2"),
        "{asked:?}"
    );
    assert_eq!(
        names(&ok(&server, &["get", "Artist", "-o", "json"])).len(),
        5,
        "nothing deleted without --yes"
    );
    let deleted = ok(
        &server,
        &["delete", "Artist", "-l", "team=billing", "--yes", "--wait"],
    );
    assert!(
        deleted.contains("ann") && deleted.contains("bob"),
        "{deleted}"
    );
    assert_eq!(
        names(&ok(&server, &["get", "Artist", "-o", "json"])),
        ["cat", "dan", "eve"]
    );
    ok(&server, &["delete", "Artist", "--all", "--yes", "--wait"]);
    assert_eq!(
        names(&ok(&server, &["get", "Artist", "-o", "json"])).len(),
        0
    );
}
