//! The audit log (DESIGN §18) of a real node: one JSON line per request that carried
//! credentials or reached authorization — refused ones included — with the caller's token by
//! name and never a secret (the test greps the file for every secret it used); and a log on a
//! full disk loses lines, counts them, and every request is still served.

use std::time::{Duration, Instant};

use proto::acl::v1 as acl;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{ReadRequest, WriteRequest};
use tonic::Code;

use crate::acl::{artist_in, bootstrap, demo_rule, policy, token, with_token, write_as};
use crate::process::Resd;

const WRITER: &str = "writer-secret-0123456789abcdef";
const UNKNOWN: &str = "not-a-token-0123456789abcdef";

/// The log's lines once it holds at least `count` (the writer is a thread of its own).
fn lines_of(path: &std::path::Path, count: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).expect("every line is JSON"))
            .collect();
        if lines.len() >= count || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_logged_once_with_its_caller_and_never_a_secret() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("audit.log");
    let path_arg = path.display().to_string();
    let node = Resd::start_with(&[
        "--acl-enabled",
        "--audit-log",
        &path_arg,
        "--audit-level",
        "request",
    ]);
    let management = bootstrap(&node).await;
    let channel = node.channel().await;
    for resource in [
        policy(
            "ns-write",
            vec![demo_rule("default", acl::Access::Write)],
            acl::Access::Unspecified,
        ),
        token("writer", WRITER, &["ns-write"], ""),
    ] {
        write_as(&channel, &management, resource)
            .await
            .expect("set up a token");
    }
    // The set-up's lines are written by the log's own thread, just after their answers: wait
    // for the file to settle before counting them.
    let count = || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let mut before = count();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = count();
        if now == before {
            break;
        }
        before = now;
    }
    let mut client = ResourceServiceClient::new(channel.clone());
    let miles = write_as(&channel, WRITER, artist_in("default", "miles"))
        .await
        .expect("the writer writes");
    let read = |token: Option<&str>| {
        with_token(
            ReadRequest {
                id: miles.id.clone(),
                ..Default::default()
            },
            token,
        )
    };
    let anonymous = client.read(read(None)).await.expect_err("no token");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let unknown = client
        .read(read(Some(UNKNOWN)))
        .await
        .expect_err("an unknown token");
    assert_eq!(unknown.code(), Code::Unauthenticated);
    let elsewhere = client
        .write(with_token(
            WriteRequest {
                resource: Some(artist_in("elsewhere", "dizzy")),
            },
            Some(WRITER),
        ))
        .await
        .expect_err("the writer may not write elsewhere");
    assert_eq!(elsewhere.code(), Code::PermissionDenied);

    let lines = lines_of(&path, before + 4);
    let ours = &lines[before..];
    assert_eq!(ours.len(), 4, "one line per request: {ours:#?}");
    let field = |line: &serde_json::Value, key: &str| line[key].as_str().unwrap_or("").to_owned();
    let write = &ours[0];
    assert_eq!(
        field(write, "method"),
        "/resd.resource.v1.ResourceService/Write"
    );
    assert_eq!(field(write, "token"), "writer");
    assert_eq!(field(write, "code"), "OK");
    assert_eq!(
        field(write, "resource"),
        "demo.v2.Artist/default/default/miles"
    );
    assert!(write["latency_ms"].is_number());
    assert!(write["body"].is_object(), "request level logs the body");
    assert!(!field(write, "peer").is_empty());
    assert!(
        time::OffsetDateTime::parse(
            &field(write, "time"),
            &time::format_description::well_known::Rfc3339
        )
        .is_ok()
    );
    assert_eq!(field(&ours[1], "code"), "UNAUTHENTICATED");
    assert_eq!(field(&ours[1], "token"), "");
    assert_eq!(field(&ours[2], "code"), "UNAUTHENTICATED");
    assert_eq!(field(&ours[3], "code"), "PERMISSION_DENIED");
    assert_eq!(field(&ours[3], "token"), "writer");
    assert_eq!(
        field(&ours[3], "resource"),
        "demo.v2.Artist/default/elsewhere/dizzy"
    );
    assert!(
        !field(&ours[3], "reason").is_empty(),
        "a refusal says its reason"
    );

    // No secret anywhere in the file: the management secret, the token written with its
    // secret in the body, a secret nobody holds.
    let text = std::fs::read_to_string(&path).expect("the log");
    for secret in [management.as_str(), WRITER, UNKNOWN] {
        assert!(!text.contains(secret), "a secret reached the audit log");
    }
    assert!(
        text.contains("[redacted]"),
        "the token's secret field is redacted, not dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_on_a_full_disk_counts_its_losses_and_requests_are_served() {
    if !std::path::Path::new("/dev/full").exists() {
        return;
    }
    let http = format!("127.0.0.1:{}", crate::process::free_port());
    let node = Resd::start_with(&["--audit-log", "/dev/full", "--http-addr", &http]);
    let mut client = node.resources().await;
    for n in 0..20 {
        client
            .write(WriteRequest {
                resource: Some(artist_in("default", &format!("a{n}"))),
            })
            .await
            .expect("served while the audit log cannot be written");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = node.http_get("/metrics").expect("metrics");
        assert_eq!(status, 200);
        let lost = body
            .lines()
            .find(|line| line.starts_with("resd_audit_lines_lost_total "))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0);
        if lost >= 20.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{lost} lines counted lost, not 20"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
