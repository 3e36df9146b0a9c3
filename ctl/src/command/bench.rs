//! `resctl bench`: a bounded load generator. Runs `count` operations of one workload with
//! `concurrency` in flight against any server and reports throughput and latency percentiles.
//! Workloads: `write` (blind writes over `keys` names), `cas` (read, then write at the read
//! version; conflicts retried and counted), `read`, and `watch` (writes while one watch measures
//! the time from sending a write to receiving its event).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use proto::client::{ClientError, WatchUpdate};
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{Id, Resource, WatchListRequest};
use serde::Serialize;

use crate::cli::{BenchArgs, Workload};
use crate::output::{self, OutputFormat, Table};
use crate::session::Session;

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub workload: String,
    pub operations: u64,
    pub errors: u64,
    pub conflicts: u64,
    pub concurrency: usize,
    pub value_size: usize,
    pub seconds: f64,
    pub per_second: f64,
    pub latency_ms: Percentiles,
    /// Write sent → its watch event received (watch workload only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch_delay_ms: Option<Percentiles>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let at = |quantile: f64| {
            let index =
                ((samples.len() as f64 * quantile).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[index].as_secs_f64() * 1000.0
        };
        Percentiles {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// A write's name, version and when it was sent (to match its watch event).
type Acknowledged = (String, String, Instant);

const NAME_PREFIX: &str = "bench-";

fn payload(size: usize, seed: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[(state % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

/// How the workload builds its resources: a document template read through the codec, so any
/// type with string fields `name` and `description` works.
struct Plan {
    codec: proto::codec::Codec,
    document: serde_json::Value,
    value_size: usize,
}

impl Plan {
    fn resource(&self, key: u64, seed: u64) -> Result<Resource, ClientError> {
        let mut document = self.document.clone();
        document["name"] = format!("{NAME_PREFIX}{key}").into();
        document["data"]["description"] = payload(self.value_size, seed ^ key).into();
        self.codec
            .read_value(document)
            .map_err(|error| ClientError::InvalidArgument {
                reason: None,
                message: error.to_string(),
            })
    }

    fn id(&self, key: u64) -> Id {
        let mut document = self.document.clone();
        document["name"] = format!("{NAME_PREFIX}{key}").into();
        self.codec
            .read_value(document)
            .ok()
            .and_then(|resource| resource.id)
            .unwrap_or_default()
    }

    fn template(&self) -> Resource {
        self.codec
            .read_value(self.document.clone())
            .unwrap_or_default()
    }
}

async fn plan(session: &Session, args: &BenchArgs) -> anyhow::Result<Plan> {
    let codec = session.codec().await?;
    let info = session.resolve_type(&args.resource_type).await?;
    let document = serde_json::json!({
        "type": proto::codec::gvk(info.r#type.as_ref().unwrap_or(&Default::default())),
        "name": format!("{NAME_PREFIX}0"),
        "tenancy": {
            "partition": session.partition,
            "namespace": session.namespace,
        },
        "data": {"name": "resctl bench", "description": ""},
    });
    codec.read_value(document.clone()).map_err(|error| {
        anyhow::anyhow!(
            "bench writes {}, whose data must have string fields `name` and `description`: {error}",
            args.resource_type
        )
    })?;
    Ok(Plan {
        codec: codec.clone(),
        document,
        value_size: args.value_size,
    })
}

/// Runs the benchmark; `bar` counts operations.
pub async fn bench(
    session: &Session,
    args: &BenchArgs,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<BenchReport> {
    if args.concurrency == 0 || args.keys == 0 {
        return Err(crate::UsageError("--concurrency and --keys must be at least 1".into()).into());
    }
    let plan = Arc::new(plan(session, args).await?);
    let client = session.client.clone();
    if matches!(args.workload, Workload::Cas | Workload::Read) {
        // Seed the keys the workload reads.
        bar.set_message("creating keys");
        futures::stream::iter(0..args.keys.min(args.count))
            .map(|key| {
                let client = client.clone();
                let plan = plan.clone();
                async move { client.write(&plan.resource(key, 0)?).await }
            })
            .buffer_unordered(args.concurrency)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
    }
    // Watch workload: a watch recording when each (name, version) arrives.
    let arrivals: Arc<Mutex<HashMap<(String, String), Instant>>> = Arc::default();
    let watch_task = if args.workload == Workload::Watch {
        let mut watcher = client.watcher(WatchListRequest {
            r#type: plan.template().id.and_then(|id| id.r#type),
            tenancy: plan.id(0).tenancy,
            name_prefix: NAME_PREFIX.into(),
            ..WatchListRequest::default()
        });
        // Wait for the end of the initial snapshot so every timed write is a live event.
        loop {
            match watcher.next().await {
                Some(WatchUpdate::Event(event))
                    if matches!(event.event, Some(Event::EndOfSnapshot(_))) =>
                {
                    break;
                }
                Some(WatchUpdate::Failed(error)) => return Err(error_of(error)),
                None => anyhow::bail!("the watch ended before it was ready"),
                _ => {}
            }
        }
        let arrivals = arrivals.clone();
        Some(tokio::spawn(async move {
            while let Some(update) = watcher.next().await {
                if let WatchUpdate::Event(event) = update
                    && let Some(Event::Upsert(upsert)) = event.event
                    && let Some(resource) = upsert.resource
                {
                    let name = resource.id.map(|id| id.name).unwrap_or_default();
                    if let Ok(mut arrivals) = arrivals.lock() {
                        arrivals.insert((name, resource.version), Instant::now());
                    }
                }
            }
        }))
    } else {
        None
    };

    bar.set_message(format!("{:?}", args.workload).to_lowercase());
    bar.set_length(args.count);
    let conflicts = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let outcomes: Vec<Result<(Duration, Option<Acknowledged>), ClientError>> =
        futures::stream::iter(0..args.count)
            .map(|operation| {
                let client = client.clone();
                let plan = plan.clone();
                let conflicts = conflicts.clone();
                let workload = args.workload;
                let key = operation % args.keys;
                async move {
                    let begun = Instant::now();
                    let acknowledged = match workload {
                        Workload::Write | Workload::Watch => {
                            let written = client.write(&plan.resource(key, operation)?).await?;
                            let name = written.id.map(|id| id.name).unwrap_or_default();
                            Some((name, written.version, begun))
                        }
                        Workload::Read => {
                            client.read(&plan.id(key)).await?;
                            None
                        }
                        Workload::Cas => {
                            let mut attempts = 0;
                            loop {
                                attempts += 1;
                                let current = client.read(&plan.id(key)).await?;
                                let mut next = plan.resource(key, operation)?;
                                next.version = current.map(|r| r.version).unwrap_or_default();
                                match client.write(&next).await {
                                    Ok(_) => break,
                                    Err(ClientError::Conflict { .. }) if attempts < 100 => {
                                        conflicts
                                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    }
                                    Err(error) => return Err(error),
                                }
                            }
                            None
                        }
                    };
                    Ok((begun.elapsed(), acknowledged))
                }
            })
            .buffer_unordered(args.concurrency)
            .inspect(|_| bar.inc(1))
            .collect()
            .await;
    let elapsed = started.elapsed();

    let mut latencies = Vec::with_capacity(outcomes.len());
    let mut acknowledgements = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for outcome in outcomes {
        match outcome {
            Ok((latency, acknowledged)) => {
                latencies.push(latency);
                acknowledgements.extend(acknowledged);
            }
            Err(error) => {
                errors += 1;
                first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
    let watch_delay_ms = match watch_task {
        None => None,
        Some(task) => {
            // Give the last events a moment to arrive.
            let wait_until = Instant::now() + Duration::from_secs(5);
            loop {
                let received = arrivals.lock().map(|a| a.len()).unwrap_or(0);
                if received >= acknowledgements.len() || Instant::now() > wait_until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            task.abort();
            let arrivals = arrivals.lock().map(|a| a.clone()).unwrap_or_default();
            let mut delays: Vec<Duration> = acknowledgements
                .iter()
                .filter_map(|(name, version, sent)| {
                    arrivals
                        .get(&(name.clone(), version.clone()))
                        .map(|arrived| arrived.saturating_duration_since(*sent))
                })
                .collect();
            Some(Percentiles::of(&mut delays))
        }
    };
    if !args.keep {
        bar.set_message("cleaning up");
        futures::stream::iter(0..args.keys.min(args.count))
            .map(|key| {
                let client = client.clone();
                let plan = plan.clone();
                async move { client.delete(&plan.id(key), "").await }
            })
            .buffer_unordered(args.concurrency)
            .collect::<Vec<_>>()
            .await;
    }
    let done = latencies.len() as u64;
    Ok(BenchReport {
        workload: format!("{:?}", args.workload).to_lowercase(),
        operations: done,
        errors,
        conflicts: conflicts.load(std::sync::atomic::Ordering::Relaxed),
        concurrency: args.concurrency,
        value_size: args.value_size,
        seconds: elapsed.as_secs_f64(),
        per_second: done as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
        latency_ms: Percentiles::of(&mut latencies),
        watch_delay_ms,
        first_error,
    })
}

fn error_of(error: ClientError) -> anyhow::Error {
    anyhow::Error::new(error).context("the benchmark's watch failed")
}

pub async fn run(session: &Session, args: &BenchArgs) -> anyhow::Result<u8> {
    let bar = session.progress(args.count, "bench");
    let report = bench(session, args, &bar).await?;
    bar.finish_and_clear();
    let text = match session.output {
        OutputFormat::Json | OutputFormat::JsonPath => output::json(&report)?,
        OutputFormat::Yaml => output::yaml(&report)?,
        _ => {
            let mut table = Table::new(["METRIC", "VALUE"]);
            let rows = [
                ("workload", report.workload.clone()),
                (
                    "operations",
                    format!(
                        "{} ({} errors, {} CAS conflicts retried)",
                        report.operations, report.errors, report.conflicts
                    ),
                ),
                ("concurrency", report.concurrency.to_string()),
                ("value size", format!("{} bytes", report.value_size)),
                ("elapsed", format!("{:.2} s", report.seconds)),
                ("throughput", format!("{:.0} ops/s", report.per_second)),
                (
                    "latency",
                    format!(
                        "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                        report.latency_ms.p50,
                        report.latency_ms.p90,
                        report.latency_ms.p99,
                        report.latency_ms.max
                    ),
                ),
            ];
            for (metric, value) in rows {
                table.row([metric.to_owned(), value]);
            }
            if let Some(delay) = &report.watch_delay_ms {
                table.row([
                    "write sent → event".to_owned(),
                    format!(
                        "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                        delay.p50, delay.p90, delay.p99, delay.max
                    ),
                ]);
            }
            let mut text = table.render();
            if let Some(error) = &report.first_error {
                text.push_str(&format!("first error: {error}\n"));
            }
            text
        }
    };
    output::print(&text)?;
    Ok(if report.errors > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&mut samples);
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(Percentiles::of(&mut []).max, 0.0);
    }
}
