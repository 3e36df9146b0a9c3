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
