//! Write throughput of real `resd` clusters on loopback: 1-node and 3-node clusters, 1 KiB
//! resources written through the gRPC API at concurrency 1, 16 and 64. Prints throughput,
//! p50/p99 latency and resource writes per sync of the leader's raft log (group commit)
//! for each run.
//!
//! `cargo bench -p server --bench write_throughput`; `RESD_BENCH_SECONDS` sets each run's
//! length (default 5), `RESD_BENCH_NODES` the cluster sizes (default "1,3") and
//! `RESD_BENCH_CONCURRENCY` the concurrency levels (default "1,16,64"), `RESD_BENCH_AGENT_ARGS`
//! extra `resd agent` flags for every node (e.g. "--worker-threads 1"), `RESD_BENCH_TRANSPORT`
//! the transports (default "plain"; "plain,tls" also runs every cluster with mutual TLS on both
//! ports and client certificates verified, to measure what TLS costs).

#![allow(clippy::print_stdout, clippy::unwrap_used)]

#[allow(dead_code)]
#[path = "../tests/it/process.rs"]
mod process;

use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::demo::v1 as demo_v1;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::{Id, Resource, Tenancy, Type, WriteRequest};
use tonic::transport::Channel;

use process::Cluster;

fn list(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn resource(name: String, description: &str) -> Resource {
    Resource {
        id: Some(Id {
            name,
            // demo.v1.Artist: no controller reacts to it, so this measures writes alone.
            r#type: Some(Type {
                group: "demo".into(),
                group_version: "v1".into(),
                kind: "Artist".into(),
            }),
            tenancy: Some(Tenancy::default()),
            ..Default::default()
        }),
        data: Some(proto::to_any(&demo_v1::Artist {
            name: "Benchmark Artist".into(),
            description: description.into(),
            genre: demo_v1::Genre::Jazz as i32,
            ..Default::default()
        })),
        ..Default::default()
    }
}

struct Run {
    writes: usize,
    errors: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

async fn drive(channels: &[Channel], concurrency: usize, seconds: u64, tag: &str) -> Run {
    // A 1 KiB resource: the description fills it up.
    let description: Arc<str> = "x".repeat(1024 - 120).into();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let mut client = ResourceServiceClient::new(channels[worker % channels.len()].clone());
        let description = description.clone();
        let tag = tag.to_owned();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            let mut sequence = 0usize;
            while Instant::now() < deadline {
                sequence += 1;
                let request = WriteRequest {
                    resource: Some(resource(format!("{tag}-{worker}-{sequence}"), &description)),
                };
                let begin = Instant::now();
                match client.write(request).await {
                    Ok(_) => latencies.push(begin.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (worker_latencies, worker_errors) = worker.await.unwrap();
        latencies.extend(worker_latencies);
        errors += worker_errors;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Run {
        writes: latencies.len(),
        errors,
        elapsed,
        latencies,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::var("RESD_BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let sizes = list("RESD_BENCH_NODES", "1,3");
    let levels = list("RESD_BENCH_CONCURRENCY", "1,16,64");
    println!(
        "resd write throughput: 1 KiB resources, {seconds}s per run, writes sent to the leader"
    );
    println!(
        "{:>9} {:>5} {:>11} {:>8} {:>10} {:>9} {:>9} {:>15} {:>7}",
        "transport",
        "nodes",
        "concurrency",
        "writes",
        "writes/s",
        "p50 ms",
        "p99 ms",
        "writes/commit",
        "errors"
    );
    let transports: Vec<String> = std::env::var("RESD_BENCH_TRANSPORT")
        .unwrap_or_else(|_| "plain".into())
        .split(',')
        .map(|t| t.trim().to_owned())
        .collect();
    let runs: Vec<(usize, &str)> = sizes
        .iter()
        .flat_map(|&size| transports.iter().map(move |t| (size, t.as_str())))
        .collect();
    for (size, transport) in runs {
        let extra: Vec<String> = std::env::var("RESD_BENCH_AGENT_ARGS")
            .map(|args| args.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let cluster = match transport {
            "tls" => {
                let ca = Arc::new(process::TestCa::new(size as u64));
                let client = ca.client(Some(("client-test.pem", "client-test-key.pem")));
                let mut extra = extra.clone();
                extra.push("--tls-verify-clients");
                Cluster::start_tls(size, &extra, ca, client).await
            }
            _ => Cluster::start(size, &extra).await,
        };
        let leader = cluster.wait_for_leader().await;
        let channels: Vec<Channel> = {
            let mut channels = Vec::new();
            for _ in 0..8 {
                channels.push(cluster.nodes[leader].channel().await);
            }
            channels
        };
        for &concurrency in &levels {
            let before = cluster.nodes[leader].status().await.unwrap();
            let run = drive(
                &channels,
                concurrency,
                seconds,
                &format!("n{size}c{concurrency}"),
            )
            .await;
            let after = cluster.nodes[leader].status().await.unwrap();
            let commits = after.log_commits.saturating_sub(before.log_commits).max(1);
            let writes = after.log_operations.saturating_sub(before.log_operations);
            println!(
                "{:>9} {:>5} {:>11} {:>8} {:>10.0} {:>9.2} {:>9.2} {:>15.1} {:>7}",
                transport,
                size,
                concurrency,
                run.writes,
                run.writes as f64 / run.elapsed.as_secs_f64(),
                percentile(&run.latencies, 0.50),
                percentile(&run.latencies, 0.99),
                writes as f64 / commits as f64,
                run.errors,
            );
        }
    }
}
