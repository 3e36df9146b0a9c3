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
