//! A type that evolves, with the real `resctl` (DESIGN §15.1, README "Types that evolve"):
//! `fixtures/evolve` walks a team from v1 to v2 to v2 as the storage version to v1 removed.
//! The plan before the change, the plan's summary in `apply`, columns in `get`, a deprecation
//! warning on stderr, `explain` with the versions, the migration awaited with `wait`, and v1
//! removed only once nothing is stored in it.

use crate::cli::{ok, resctl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_evolves_its_type_from_v1_to_v2_with_resctl() {
    let cluster = tests::Cluster::start(3).await;
    let server = cluster.nodes[1].api_addr.clone();
    let evolve = tests::fixtures().join("evolve");
    let file = |name: &str| evolve.join(name).display().to_string();

    // v1 and three objects; `get` shows the type's columns.
    ok(&server, &["apply", "-f", &file("00-database-v1.yaml")]);
    ok(&server, &["apply", "-f", &file("10-databases.yaml")]);
    let listed = ok(&server, &["get", "Database"]);
    let header = listed.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NAME") && header.contains("ENGINE") && header.contains("SIZE"),
        "{listed}"
    );
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("orders") && l.contains("postgres") && l.contains("40")),
        "{listed}"
    );

    // The plan of v2: nothing would fail, three objects to migrate; exit 0.
    let planned = ok(
        &server,
        &["type", "plan", "-f", &file("20-database-v2.yaml")],
    );
    assert!(
        planned.contains(
            "Type platform-database: 3 objects checked, 0 would fail; 3 to migrate to v2"
        ),
        "{planned}"
    );
    // A rule that stored objects break: the plan names them and exits 1.
    let scratch = tempfile::tempdir().expect("dir");
    let strict = scratch.path().join("strict.yaml");
    std::fs::copy(
        evolve.join("database-v1.proto"),
        scratch.path().join("database-v1.proto"),
    )
    .expect("copy");
    std::fs::copy(
        evolve.join("database-v2.proto"),
        scratch.path().join("database-v2.proto"),
    )
    .expect("copy");
    std::fs::write(
        &strict,
        std::fs::read_to_string(evolve.join("20-database-v2.yaml"))
            .expect("read")
            .replace("size_gb <= 500", "size_gb <= 20"),
    )
    .expect("write");
    let strict = strict.display().to_string();
    let refused = resctl(&server, &["type", "plan", "-f", &strict]);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stdout);
    assert!(
        said.contains("2 would fail") && said.contains("orders") && said.contains("search"),
        "{said}"
    );
    assert!(!said.contains("ledger"), "ledger is 10 GB: {said}");
    // Applying it is refused for the same reason, and changes nothing; --force would.
    let applied = resctl(&server, &["apply", "-f", &strict]);
    assert_eq!(applied.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&applied.stderr);
    assert!(
        stderr.contains("2 would fail") && stderr.contains("--force"),
        "{stderr}"
    );

    // v2 for real: the plan's summary first.
    let applied = resctl(&server, &["apply", "-f", &file("20-database-v2.yaml")]);
    assert!(applied.status.success(), "{applied:?}");
    assert!(
        String::from_utf8_lossy(&applied.stderr).contains("3 to migrate to v2"),
        "{applied:?}"
    );

    // A kind resolves to the newest served version; v2's columns.
    let listed = ok(&server, &["get", "Database"]);
    assert!(
        listed.lines().next().unwrap_or_default().contains("REGION"),
        "{listed}"
    );
    let orders: serde_json::Value =
        serde_json::from_str(&ok(&server, &["get", "Database", "orders", "-o", "json"]))
            .expect("json");
    assert_eq!(orders["type"], "platform.v2.Database", "{orders}");
    assert_eq!(orders["data"]["storage"]["sizeGb"], "40", "{orders}");
    assert_eq!(orders["data"]["team"], "payments", "{orders}");
    // The deprecated v1 still answers, with a warning on stderr.
    let old = resctl(
        &server,
        &["get", "platform.v1.Database", "orders", "-o", "json"],
    );
    assert!(old.status.success(), "{old:?}");
    assert!(
        String::from_utf8_lossy(&old.stderr)
            .contains("warning: platform.v1.Database is deprecated: use platform.v2.Database"),
        "{old:?}"
    );
    let old: serde_json::Value = serde_json::from_slice(&old.stdout).expect("json");
    assert_eq!(old["data"]["sizeGb"], "40", "{old}");

    // explain shows the versions, the JSON names and the rules.
    let explained = ok(&server, &["explain", "platform.v2.Database"]);
    assert!(
        explained.contains("VERSIONS: v1 (deprecated), v2 (storage)")
            && explained.contains("size_gb <= 500")
            && explained.contains("\"eu-west-1\""),
        "{explained}"
    );

    // Removing v1 waits for the migration.
    ok(
        &server,
        &[
            "wait",
            "registry.v1.Type",
            "platform-database",
            "--for",
            "condition=Migrated",
            "--timeout",
            "60s",
        ],
    );
    ok(&server, &["apply", "-f", &file("30-database-v2-only.yaml")]);
    let gone = resctl(&server, &["get", "platform.v1.Database"]);
    assert!(!gone.status.success(), "v1 is gone: {gone:?}");
    let listed = ok(&server, &["get", "Database", "-o", "name"]);
    assert_eq!(listed.lines().count(), 3, "{listed}");
}
