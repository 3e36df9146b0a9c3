//! Controller throughput on a real 3-node cluster: how long until 10,000 `demo.v2.Artist`s
//! created in a burst are all reconciled (each gets its album and an `Accepted` status with the
//! current generation), and the latency from one write to its reconcile at idle.
//!
//! `cargo bench -p server --bench reconcile_throughput`; `RESD_BENCH_ARTISTS` sets the burst
//! size (default 10000).

#![allow(clippy::print_stdout, clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "../tests/it/process.rs"]
mod process;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use proto::demo::v2 as demo_v2;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Id, Resource, State, Tenancy, Type, WatchListRequest, WriteRequest};
use tonic::transport::Channel;

use process::Cluster;

fn artist_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v2".into(),
        kind: "Artist".into(),
    }
}

fn artist(name: String) -> Resource {
    Resource {
        id: Some(Id {
            name: name.clone(),
            r#type: Some(artist_type()),
            tenancy: Some(Tenancy::default()),
            ..Default::default()
        }),
        data: Some(proto::to_any(&demo_v2::Artist {
            name,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn accepted(resource: &Resource) -> bool {
    resource
        .status
        .get("demo.resd.io/artist")
        .is_some_and(|status| {
            status.observed_generation == resource.generation
                && status
                    .conditions
                    .iter()
                    .any(|c| c.r#type == "Accepted" && c.state == State::True as i32)
        })
}

/// Watches artists and returns once every name with `prefix` in `expected` is accepted.
async fn wait_accepted(channel: Channel, prefix: String, expected: usize) -> Instant {
    let mut client = ResourceServiceClient::new(channel);
    let mut stream = client
        .watch_list(WatchListRequest {
            r#type: Some(artist_type()),
            tenancy: Some(Tenancy::default()),
            name_prefix: prefix,
            since_version: String::new(),
            ..WatchListRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut done = HashSet::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        if let Some(Event::Upsert(upsert)) = event.event {
            let resource = upsert.resource.unwrap();
            if accepted(&resource) {
                done.insert(resource.id.unwrap().name);
                if done.len() == expected {
                    return Instant::now();
                }
            }
        }
    }
    panic!("the watch ended before every artist was accepted");
}

#[tokio::main]
async fn main() {
    let total: usize = std::env::var("RESD_BENCH_ARTISTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader().await;
    let follower = (leader + 1) % 3;

    // Idle latency: one write at a time, until its Accepted status is seen.
    let mut latencies = Vec::new();
    for index in 0..20 {
        let name = format!("idle-{index}");
        let waiter = tokio::spawn(wait_accepted(
            cluster.nodes[follower].channel().await,
            name.clone(),
            1,
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let start = Instant::now();
        let mut client = ResourceServiceClient::new(cluster.nodes[leader].channel().await);
        client
            .write(WriteRequest {
                resource: Some(artist(name)),
            })
            .await
            .unwrap();
        latencies.push(waiter.await.unwrap() - start);
    }
    latencies.sort();
    println!(
        "write → Accepted at idle (20 artists): p50 {:.1} ms, max {:.1} ms",
        latencies[10].as_secs_f64() * 1000.0,
        latencies[19].as_secs_f64() * 1000.0
    );

    // The burst.
    let waiter = tokio::spawn(wait_accepted(
        cluster.nodes[follower].channel().await,
        "burst-".into(),
        total,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    let concurrency = 64;
    for worker in 0..concurrency {
        let channel = cluster.nodes[leader].channel().await;
        writers.spawn(async move {
            let mut client = ResourceServiceClient::new(channel);
            for index in (worker..total).step_by(concurrency) {
                let request = WriteRequest {
                    resource: Some(artist(format!("burst-{index}"))),
                };
                client.write(request).await.unwrap();
            }
        });
    }
    while writers.join_next().await.is_some() {}
    let written = start.elapsed();
    let finished = waiter.await.unwrap() - start;
    println!(
        "{total} artists: written in {:.1} s, all accepted after {:.1} s ({:.0} artists reconciled/s; goal: under 60 s)",
        written.as_secs_f64(),
        finished.as_secs_f64(),
        total as f64 / finished.as_secs_f64()
    );
}
