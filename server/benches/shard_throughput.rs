//! Sharded controllers (DESIGN §16): how fast 1, 2 and 4 replicas of the example invoice
//! controller (`--placement sharded`) reconcile a burst of invoices — each gets a finalizer, a
//! receipt and an `Accepted` status for its current generation — and how long after one member
//! is killed (-9) the invoices it owned are reconciled again by the others (the handover: its
//! report goes stale, it leaves the ring, the others acknowledge, the ring settles).
//!
//! Each count runs on a fresh single-node server from this build, the replicas are the release
//! example:
//!
//! ```sh
//! cargo build --release -p ctl -p runtime --example invoice_controller
//! cargo bench -p server --bench shard_throughput      # RESD_BENCH_INVOICES (default 100000)
//! ```

#![allow(clippy::print_stdout, clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "../tests/it/process.rs"]
mod process;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use proto::coordination::v1::ShardMap;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{
    Id, ReadRequest, Resource, State, Tenancy, Type, WatchListRequest, WriteRequest,
};
use tonic::transport::Channel;

use process::Resd;

/// `target/release` (this bench's binaries' directory).
fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn invoice_type() -> Type {
    Type {
        group: "payments".into(),
        group_version: "v1".into(),
        kind: "Invoice".into(),
    }
}

fn invoice(name: &str, amount: i64) -> Resource {
    let mut value = Vec::new();
    prost::encoding::int64::encode(1, &amount, &mut value);
    prost::encoding::string::encode(3, &"Bench".to_owned(), &mut value);
    Resource {
        id: Some(Id {
            name: name.into(),
            r#type: Some(invoice_type()),
            tenancy: Some(Tenancy::default()),
            ..Default::default()
        }),
        data: Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.payments.v1.Invoice".into(),
            value,
        }),
        ..Default::default()
    }
}

fn accepted(resource: &Resource) -> bool {
    resource
        .status
        .get("payments.example.com/invoice-controller")
        .is_some_and(|status| {
            status.observed_generation == resource.generation
                && status
                    .conditions
                    .iter()
                    .any(|c| c.r#type == "Accepted" && c.state == State::True as i32)
        })
}

/// Returns once every name in `names` is accepted for its current generation.
async fn wait_accepted(channel: Channel, names: HashSet<String>) -> Instant {
    let mut client = ResourceServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let mut stream = client
        .watch_list(WatchListRequest {
            r#type: Some(invoice_type()),
            tenancy: Some(Tenancy::default()),
            ..WatchListRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut done = HashSet::new();
    while let Some(event) = stream.next().await {
        if let Some(Event::Upsert(upsert)) = event.unwrap().event {
            let resource = upsert.resource.unwrap();
            let name = resource.id.as_ref().unwrap().name.clone();
            if names.contains(&name) {
                if accepted(&resource) {
                    done.insert(name);
                } else {
                    done.remove(&name);
                }
                if done.len() == names.len() {
                    return Instant::now();
                }
            }
        }
    }
    panic!("the watch ended before every invoice was accepted");
}

async fn write_all(channel: &Channel, names: &[String], amount: i64) {
    let mut writers = tokio::task::JoinSet::new();
    let concurrency = 64;
    let names = std::sync::Arc::new(names.to_vec());
    for worker in 0..concurrency {
        let (channel, names) = (channel.clone(), names.clone());
        writers.spawn(async move {
            let mut client = ResourceServiceClient::new(channel);
            for index in (worker..names.len()).step_by(concurrency) {
                let request = WriteRequest {
                    resource: Some(invoice(&names[index], amount)),
                };
                client.write(request).await.unwrap();
            }
        });
    }
    while writers.join_next().await.is_some() {}
}

fn replica(server: &str, identity: &str) -> Child {
    Command::new(release_dir().join("examples/invoice_controller"))
        .args([identity, "--placement", "sharded", "--lease-seconds", "3"])
        .env("RESD_SERVER", server)
        .env("RESCTL_CONFIG", "/nonexistent/contexts.yaml")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(
            "the release example (cargo build --release -p runtime --example invoice_controller)",
        )
}

/// The ShardMap as stored now.
async fn shard_map(channel: &Channel) -> ShardMap {
    let mut client = ResourceServiceClient::new(channel.clone());
    let read = client
        .read(ReadRequest {
            id: Some(Id {
                name: "invoices".into(),
                r#type: Some(Type {
                    group: "coordination".into(),
                    group_version: "v1".into(),
                    kind: "ShardMap".into(),
                }),
                tenancy: Some(Tenancy::default()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let data = read.resource.unwrap().data.unwrap();
    <ShardMap as prost::Message>::decode(data.value.as_slice()).unwrap()
}

/// One count of replicas on a fresh server: the burst's figure, and (for more than one) the
/// handover after a kill.
async fn run(total: usize, replicas: usize) {
    let server = Resd::start();
    let address = server.api_addr.to_string();
    let applied = Command::new(release_dir().join("resctl"))
        .args(["--server", &address, "apply", "-f"])
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../fixtures/teams/00-invoice-type.yaml"),
        )
        .env("RESCTL_CONFIG", "/nonexistent/contexts.yaml")
        .output()
        .expect("the release resctl (cargo build --release -p ctl)");
    assert!(applied.status.success(), "{applied:?}");
    let applied = Command::new(release_dir().join("resctl"))
        .args(["--server", &address, "apply", "-f"])
        .arg(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../fixtures/teams/01-receipt-type.yaml"),
        )
        .env("RESCTL_CONFIG", "/nonexistent/contexts.yaml")
        .output()
        .expect("resctl");
    assert!(applied.status.success(), "{applied:?}");
    let channel = server.channel().await;
    let names: Vec<String> = (0..total).map(|n| format!("invoice-{n}")).collect();
    let written = Instant::now();
    write_all(&channel, &names, 100).await;
    let written = written.elapsed();
    let waiter = tokio::spawn(wait_accepted(
        channel.clone(),
        names.iter().cloned().collect(),
    ));
    let start = Instant::now();
    let mut children: Vec<Child> = (1..=replicas)
        .map(|n| replica(&address, &format!("replica-{n}")))
        .collect();
    let finished = waiter.await.unwrap() - start;
    println!(
        "{replicas} sharded replica(s), {total} invoices (written in {:.1} s): all accepted after {:.1} s — {:.0} invoices reconciled/s",
        written.as_secs_f64(),
        finished.as_secs_f64(),
        total as f64 / finished.as_secs_f64()
    );
    if replicas > 1 {
        // replica-1 is killed; the invoices it owned are changed at once, and timed until the
        // others have accepted every one of them.
        let map = shard_map(&channel).await;
        let owned: Vec<String> = names
            .iter()
            .filter(|name| {
                let id = Id {
                    name: (*name).clone(),
                    r#type: Some(invoice_type()),
                    tenancy: Some(Tenancy {
                        partition: "default".into(),
                        namespace: "default".into(),
                    }),
                    ..Default::default()
                };
                proto::shard::owner(
                    map.members.iter().map(|m| m.name.as_str()),
                    &proto::shard::ShardKey::of(&id),
                ) == Some("replica-1")
            })
            .take(2000)
            .cloned()
            .collect();
        let killed = Instant::now();
        let _ = children[0].kill();
        write_all(&channel, &owned, 200).await;
        // The handover: the ring without replica-1, settled (every member acknowledged it).
        let settled = loop {
            let map = shard_map(&channel).await;
            if map.members.iter().all(|m| m.name != "replica-1")
                && map.settled_ring_version == map.ring_version
            {
                break killed.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Watched once written: its snapshot has each at its new generation.
        let handed = wait_accepted(channel.clone(), owned.iter().cloned().collect()).await - killed;
        println!(
            "  replica-1 killed (-9, lease 3 s): the ring settled without it after {:.1} s; its {} changed invoices were all accepted by the others after {:.1} s (each of its ~{} invoices is reconciled again by its new owner)",
            settled.as_secs_f64(),
            owned.len(),
            handed.as_secs_f64(),
            total / replicas
        );
    }
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(server);
}

#[tokio::main]
async fn main() {
    let total: usize = std::env::var("RESD_BENCH_INVOICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    for replicas in [1, 2, 4] {
        run(total, replicas).await;
    }
}
