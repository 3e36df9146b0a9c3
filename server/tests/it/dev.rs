//! `resd dev` and the agent's config file, driven as a user would.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use proto::cluster::v1::MembersRequest;
use proto::cluster::v1::cluster_service_client::ClusterServiceClient;

use crate::process::{Resd, free_port};

/// `resd dev` with no flag: a secure three-node cluster (TLS with client certificates, ACLs
/// bootstrapped) whose resctl context, made current while it runs, holds everything a client
/// needs; a client without the context's certificate or token is refused; Ctrl-C stops it
/// cleanly and puts the previous context back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resd_dev_runs_a_secure_three_node_cluster_with_a_context_and_stops_cleanly() {
    let home = tempfile::tempdir().expect("temp dir");
    let contexts = home.path().join("contexts.yaml");
    std::fs::write(
        &contexts,
        "current: prod\ncontexts:\n  prod: {server: 10.0.0.1:8502}\n",
    )
    .expect("an existing contexts file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_resd"))
        .args(tests::DEV_ON_FREE_PORTS)
        .env("RUST_LOG", "warn,openraft=error")
        .env("RESCTL_CONFIG", &contexts)
        // Its data directory goes with the test's, however the test ends.
        .env("TMPDIR", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn resd dev");
    let stdout = child.stdout.take().expect("stdout");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    let mut api_addrs = Vec::new();
    let mut context_written = false;
    while api_addrs.len() < 3 || !context_written {
        let line = receiver
            .recv_timeout(Duration::from_secs(30))
            .expect("resd dev prints its nodes and its context");
        if let Some(rest) = line.strip_prefix("node ") {
            let api = rest
                .split_whitespace()
                .nth(2)
                .expect("node N  api ADDR ...")
                .to_owned();
            api_addrs.push(api);
        }
        context_written |= line.contains("resctl context resd-dev");
    }
    let written: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&contexts).expect("read contexts"))
            .expect("yaml");
    assert_eq!(written["current"].as_str(), Some("resd-dev"));
    assert_eq!(
        written["contexts"]["prod"]["server"].as_str(),
        Some("10.0.0.1:8502")
    );
    let dev = &written["contexts"]["resd-dev"];
    let field = |name: &str| dev[name].as_str().expect(name).to_owned();
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(
            std::fs::read(field("ca_cert")).expect("ca"),
        ))
        .identity(tonic::transport::Identity::from_pem(
            std::fs::read(field("client_cert")).expect("cert"),
            std::fs::read(field("client_key")).expect("key"),
        ));
    let token: tonic::metadata::MetadataValue<_> = field("token").parse().expect("token");
    let mut members = 0;
    for _ in 0..150 {
        let endpoint = crate::process::endpoint_of(&api_addrs[2], Some(tls.clone()));
        if let Ok(channel) = endpoint.connect().await {
            let mut request = tonic::Request::new(MembersRequest {});
            request
                .metadata_mut()
                .insert(proto::TOKEN_HEADER, token.clone());
            if let Ok(reply) = ClusterServiceClient::new(channel).members(request).await {
                members = reply
                    .into_inner()
                    .members
                    .iter()
                    .filter(|m| m.voter)
                    .count();
                if members == 3 {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(members, 3, "the dev cluster has three voters");
    // Plaintext is refused, and so is TLS without the token.
    assert!(
        ClusterServiceClient::connect(format!("http://{}", api_addrs[0]))
            .await
            .map_err(|error| error.to_string())
            .and_then(|_| Err::<(), _>("connected".to_owned()))
            .is_err()
    );
    let channel = crate::process::endpoint_of(&api_addrs[0], Some(tls))
        .connect()
        .await
        .expect("connect with the context's certificate");
    let anonymous = ClusterServiceClient::new(channel)
        .members(MembersRequest {})
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);

    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill")
            .success()
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "resd dev exits 0 on Ctrl-C: {status:?}");
    let after: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&contexts).expect("read contexts"))
            .expect("yaml");
    assert_eq!(after["current"].as_str(), Some("prod"), "{after:?}");
    assert!(after["contexts"]["resd-dev"].is_null(), "{after:?}");
}

#[tokio::test]
async fn the_agent_reads_its_settings_from_a_config_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let api_port = free_port();
    let config = dir.path().join("node.yaml");
    std::fs::write(
        &config,
        format!(
            "node_id: 7\ndata_dir: {}\napi_addr: 127.0.0.1:{api_port}\nraft_addr: 127.0.0.1:0\nbootstrap: true\n",
            dir.path().join("data").display()
        ),
    )
    .expect("write config");
    let resd = Resd::spawn(vec!["--config".into(), config.display().to_string()]);
    assert_eq!(resd.api_addr.port(), api_port);
    let status = resd.status().await.expect("status");
    assert_eq!(status.node_id, 7);
    assert_eq!(status.storage, "raft");
}

#[tokio::test]
async fn a_config_file_with_an_unknown_key_is_rejected_with_its_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("node.yaml");
    std::fs::write(&config, "node_id: 1\nnode_name: typo\n").expect("write config");
    let output = Command::new(env!("CARGO_BIN_EXE_resd"))
        .args(["agent", "--config", &config.display().to_string()])
        .output()
        .expect("run resd");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("node_name"), "{stderr}");
    assert!(stderr.contains("node.yaml"), "{stderr}");
}

/// `resd --version` names the program, not its crate.
#[test]
fn the_version_names_resd() {
    let output = Command::new(env!("CARGO_BIN_EXE_resd"))
        .arg("--version")
        .output()
        .expect("run resd --version");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.starts_with("resd "), "{text}");
}
