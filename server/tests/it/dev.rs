//! `resd dev` and the agent's config file, driven as a user would.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use proto::cluster::v1::MembersRequest;
use proto::cluster::v1::cluster_service_client::ClusterServiceClient;

use crate::process::{Resd, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resd_dev_runs_a_three_node_cluster_and_stops_cleanly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_resd"))
        .args(["dev", "--api-port", "0", "--raft-port", "0"])
        .env("RUST_LOG", "warn,openraft=error")
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
    while api_addrs.len() < 3 {
        let line = receiver
            .recv_timeout(Duration::from_secs(30))
            .expect("resd dev prints its nodes");
        if let Some(rest) = line.strip_prefix("node ") {
            let api = rest
                .split_whitespace()
                .nth(2)
                .expect("node N  api ADDR ...")
                .to_owned();
            api_addrs.push(api);
        }
    }
    let mut members = 0;
    for _ in 0..100 {
        if let Ok(mut client) =
            ClusterServiceClient::connect(format!("http://{}", api_addrs[2])).await
            && let Ok(reply) = client.members(MembersRequest {}).await
        {
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(members, 3, "the dev cluster has three voters");

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
