//! The real `resctl` binary, run against a test cluster with no contexts file.

use std::process::{Command, Output, Stdio};

/// `resctl --server SERVER ARGS…`, stdin closed (so it never waits for an answer).
pub(crate) fn resctl(server: &str, args: &[&str]) -> Output {
    Command::new(tests::binary("resctl"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env("RESCTL_CONFIG", "/nonexistent/resctl-contexts.yaml")
        .stdin(Stdio::null())
        .output()
        .expect("resctl runs")
}

/// [`resctl`] that must succeed; its stdout.
pub(crate) fn ok(server: &str, args: &[&str]) -> String {
    let output = resctl(server, args);
    assert!(
        output.status.success(),
        "resctl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Attack: escapes in a tenant's report and in a schema's comments reached the operator's
/// terminal through `resctl controllers` and `resctl explain` (and cleared it). Nothing resctl
/// prints from the cluster carries a control character.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_resctl_prints_from_the_cluster_carries_an_escape() {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let dir = tempfile::tempdir().expect("dir");
    let documents = dir.path().join("hostile.yaml");
    std::fs::write(
        &documents,
        r#"type: registry.v1.Type
name: esc-thing
data:
  group: esc
  groupVersion: v1
  kind: Thing
  scope: SCOPE_NAMESPACE
  description: "\e[2J\e[Ha thing"
  proto: "syntax = \"proto3\";\npackage resd.esc.v1;\n// \e[2J\e[31mcleared your screen\nmessage Thing {\n  // \e]0;owned\a a field\n  string s = 1;\n}\n"
---
type: coordination.v1.Replica
name: esc-report
tenancy: {partition: default, namespace: default}
data:
  controller: things
  identity: things-1
  managedType: {group: esc, groupVersion: v1, kind: Thing}
  lastError: "\e[2J\e[Hall is well"
  reportEverySeconds: 10
"#,
    )
    .expect("write");
    let applied = resctl(&server, &["apply", "-f", &documents.display().to_string()]);
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    for args in [
        vec!["controllers"],
        vec!["controllers", "-o", "wide"],
        vec!["explain", "esc.v1.Thing"],
        vec!["get", "coordination.v1.Replica", "-A"],
        vec!["get", "registry.v1.Type", "esc-thing", "-o", "yaml"],
        vec![
            "get",
            "registry.v1.Type",
            "-o",
            "jsonpath={.items[*].data.description}",
        ],
    ] {
        let output = resctl(&server, &args);
        for (stream, bytes) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
            assert!(
                !bytes.contains(&0x1b) && !bytes.contains(&0x07),
                "resctl {args:?} printed an escape on {stream}: {:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}
