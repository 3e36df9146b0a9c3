//! `resd tls`: certificates made by the real binary, and its refusals.

use std::process::Command;

fn resd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_resd"))
        .args(args)
        .output()
        .expect("run resd")
}

#[test]
fn resd_tls_makes_a_ca_node_and_client_certificates_and_never_overwrites() {
    let dir = tempfile::tempdir().expect("temp dir");
    let dir_arg = dir.path().to_str().expect("utf-8 path");
    let ca = resd(&["tls", "ca", "create", "--dir", dir_arg]);
    assert!(ca.status.success(), "{ca:?}");
    let node = resd(&[
        "tls",
        "cert",
        "create",
        "--node-id",
        "1",
        "--cluster-name",
        "prod",
        "--ip",
        "10.1.2.3",
        "--dir",
        dir_arg,
    ]);
    assert!(node.status.success(), "{node:?}");
    let said = String::from_utf8_lossy(&node.stdout);
    assert!(
        said.contains("node-1.prod.resd, localhost, 127.0.0.1, 10.1.2.3"),
        "{said}"
    );
    let client = resd(&["tls", "cert", "create", "--client", "ops", "--dir", dir_arg]);
    assert!(client.status.success(), "{client:?}");
    for file in [
        "resd-ca.pem",
        "resd-ca-key.pem",
        "node-1.pem",
        "node-1-key.pem",
        "client-ops.pem",
        "client-ops-key.pem",
    ] {
        let text = std::fs::read_to_string(dir.path().join(file)).expect(file);
        assert!(text.starts_with("-----BEGIN "), "{file} is PEM");
    }
    let again = resd(&["tls", "ca", "create", "--dir", dir_arg]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("never overwrites"),
        "{again:?}"
    );
    let neither = resd(&["tls", "cert", "create", "--dir", dir_arg]);
    assert_eq!(neither.status.code(), Some(2), "a usage error");
}

/// Starts `resd agent ARGS`, collects its log until it serves, and stops it by PID.
fn startup_log(args: &[&str]) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_resd"))
        .arg("agent")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn resd");
    let stderr = child.stderr.take().expect("piped");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    // Warnings come before serving; give the node a moment, bounded.
    let mut log = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match receiver.recv_timeout(left) {
            Ok(line) => {
                log.push_str(&line);
                log.push('\n');
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    log
}

#[test]
fn a_node_bound_beyond_loopback_without_tls_warns_once() {
    let exposed = startup_log(&[
        "--insecure",
        "--storage",
        "memory",
        "--api-addr",
        "0.0.0.0:0",
    ]);
    assert_eq!(
        exposed.matches("not on a loopback address").count(),
        1,
        "{exposed}"
    );
    let quiet = startup_log(&[
        "--insecure",
        "--storage",
        "memory",
        "--api-addr",
        "127.0.0.1:0",
    ]);
    assert!(!quiet.contains("loopback"), "{quiet}");
}
