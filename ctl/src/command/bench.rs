//! `resctl bench`: a bounded load generator. Runs `count` operations of one workload with
//! `concurrency` in flight against any server and reports throughput and latency percentiles.
//! Workloads: `write` (blind writes over `keys` names), `cas` (read, then write at the read
//! version; conflicts retried and counted), `read`, and `watch` (writes while watches receive
//! them: the first measures the time from sending a write to receiving its event; with
//! `--watchers N --stalled M --watch-groups G`, N watches spread over G label groups, of which M
//! never read, show what many and stalled consumers cost the writers and the other watches).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use proto::client::{Client, ClientError, WatchUpdate, Watcher};
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
    /// What every watch received (watch workload only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// The watch workload's watches: how many, how many never read, and whether the readers got
/// every event of the writes their selector matches.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FanOut {
    pub watchers: usize,
    pub stalled: usize,
    /// Groups the writes and watches are spread over (`bench-group` label and selector).
    pub groups: u64,
    /// Events of acknowledged writes the reading watches should have received.
    pub expected_events: u64,
    pub delivered_events: u64,
    /// Reading watches that were disconnected, relisted or failed during the run.
    pub disturbed_readers: u64,
    /// Seconds from the last acknowledged write until every reader had its events (or the
    /// wait gave up).
    pub drained_seconds: f64,
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

/// A write's key, name, version and when it was sent (to match its watch events).
struct Acknowledged {
    key: u64,
    name: String,
    version: String,
    sent: Instant,
}

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
    /// With more than one, each resource carries the label `bench-group=KEY % groups`.
    groups: u64,
    /// Digits of the largest key: names are padded to it, so that key order is name order
    /// (a load in key order is a load in the store's order, as etcd's benchmarks load etcd).
    digits: usize,
}

/// The name of key `key`, its number padded to `digits`.
fn bench_name(key: u64, digits: usize) -> String {
    format!("{NAME_PREFIX}{key:0digits$}")
}

/// The label that spreads the watch workload's writes over its watches' selectors.
const GROUP_LABEL: &str = "bench-group";

impl Plan {
    fn name(&self, key: u64) -> String {
        bench_name(key, self.digits)
    }

    fn resource(&self, key: u64, seed: u64) -> Result<Resource, ClientError> {
        let mut document = self.document.clone();
        document["name"] = self.name(key).into();
        document["data"]["description"] = payload(self.value_size, seed ^ key).into();
        if self.groups > 1 {
            document["metadata"] =
                serde_json::json!({ GROUP_LABEL: (key % self.groups).to_string() });
        }
        self.codec
            .read_value(document)
            .map_err(|error| ClientError::InvalidArgument {
                reason: None,
                message: error.to_string(),
            })
    }

    fn id(&self, key: u64) -> Id {
        let mut document = self.document.clone();
        document["name"] = self.name(key).into();
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
        groups: args.watch_groups,
        digits: args.keys.saturating_sub(1).to_string().len(),
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
    check_watch_args(args)?;
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
    let watches = if args.workload == Workload::Watch {
        let request = WatchListRequest {
            r#type: plan.template().id.and_then(|id| id.r#type),
            tenancy: plan.id(0).tenancy,
            name_prefix: NAME_PREFIX.into(),
            ..WatchListRequest::default()
        };
        Some(Watches::open(&client, request, args, bar).await?)
    } else {
        None
    };

    bar.set_message(format!("{:?}", args.workload).to_lowercase());
    bar.set_position(0);
    bar.set_length(args.count);
    let conflicts = Arc::new(AtomicU64::new(0));
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
                            Some(Acknowledged {
                                key,
                                name,
                                version: written.version,
                                sent: begun,
                            })
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
                                        conflicts.fetch_add(1, Ordering::Relaxed);
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
    let (watch_delay_ms, fan_out) = match watches {
        None => (None, None),
        Some(watches) => {
            bar.set_message("waiting for the watches' last events");
            let (delay, fan_out) = watches.finish(&acknowledgements).await;
            (Some(delay), Some(fan_out))
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
        conflicts: conflicts.load(Ordering::Relaxed),
        concurrency: args.concurrency,
        value_size: args.value_size,
        seconds: elapsed.as_secs_f64(),
        per_second: done as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
        latency_ms: Percentiles::of(&mut latencies),
        watch_delay_ms,
        fan_out,
        first_error,
    })
}

fn check_watch_args(args: &BenchArgs) -> Result<(), crate::UsageError> {
    let defaults = args.watchers == 1 && args.stalled == 0 && args.watch_groups == 1;
    if args.workload != Workload::Watch && !defaults {
        return Err(crate::UsageError(
            "--watchers, --stalled and --watch-groups apply to --workload watch".into(),
        ));
    }
    if args.watchers == 0 || args.watch_groups == 0 {
        return Err(crate::UsageError(
            "--watchers and --watch-groups must be at least 1".into(),
        ));
    }
    if args.stalled >= args.watchers {
        return Err(crate::UsageError(format!(
            "--stalled {} leaves no watch reading: it must be less than --watchers {}",
            args.stalled, args.watchers
        )));
    }
    Ok(())
}

/// When the timed watch received each (name, version).
type Arrivals = Arc<Mutex<HashMap<(String, String), Instant>>>;

/// Watches one connection carries (the server allows 256 streams per connection).
const WATCHES_PER_CONNECTION: usize = 200;
/// Watches opened at once while the workload sets up.
const OPENING_AT_ONCE: usize = 64;
/// How long a watch may take to deliver its opening listing.
const OPENING_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the readers may take to receive the last writes' events.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The watch workload's watches: reading ones, each on a task counting what it receives (the
/// first also timing it), and stalled ones, held open and never read.
struct Watches {
    groups: u64,
    stalled: Vec<Watcher>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    /// When the first reader received each (name, version).
    arrivals: Arrivals,
    delivered: Arc<AtomicU64>,
    disturbed: Arc<AtomicU64>,
}

impl Watches {
    /// Opens `--watchers` watches (each past its opening listing), readers first.
    async fn open(
        client: &Client,
        request: WatchListRequest,
        args: &BenchArgs,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<Watches> {
        let readers = args.watchers - args.stalled;
        let groups = args.watch_groups;
        // Stalled watches get connections of their own: a stream nobody reads holds its
        // connection's window, which would stall the readers sharing it (client-side).
        let connections = |watches: usize| -> Result<Vec<Client>, ClientError> {
            (0..watches.div_ceil(WATCHES_PER_CONNECTION))
                .map(|_| client.with_own_connections())
                .collect()
        };
        let (reading, stalling) = (connections(readers)?, connections(args.stalled)?);
        bar.set_message("opening watches");
        bar.set_position(0);
        bar.set_length(args.watchers as u64);
        let mut opened: Vec<(usize, Watcher)> = futures::stream::iter(0..args.watchers)
            .map(|index| {
                let connection = if index < readers {
                    &reading[index / WATCHES_PER_CONNECTION]
                } else {
                    &stalling[(index - readers) / WATCHES_PER_CONNECTION]
                };
                // A stalled watch selects every write: a stopped consumer of a whole type, the
                // kind whose backlog would grow fastest.
                let mut request = request.clone();
                if groups > 1 && index < readers {
                    request.selector = format!("{GROUP_LABEL}={}", index as u64 % groups);
                }
                let watcher = connection.watcher(request);
                async move { past_listing(watcher, index).await.map(|w| (index, w)) }
            })
            .buffer_unordered(OPENING_AT_ONCE)
            .inspect(|_| bar.inc(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<_>>()?;
        opened.sort_by_key(|(index, _)| *index);
        let arrivals: Arrivals = Arc::default();
        let delivered = Arc::new(AtomicU64::new(0));
        let disturbed = Arc::new(AtomicU64::new(0));
        let mut watches = Watches {
            groups,
            stalled: Vec::new(),
            readers: Vec::new(),
            arrivals: arrivals.clone(),
            delivered: delivered.clone(),
            disturbed: disturbed.clone(),
        };
        for (index, watcher) in opened {
            if index >= readers {
                watches.stalled.push(watcher);
                continue;
            }
            let timed = (index == 0).then(|| arrivals.clone());
            let (delivered, disturbed) = (delivered.clone(), disturbed.clone());
            watches.readers.push(tokio::spawn(read_events(
                watcher, timed, delivered, disturbed,
            )));
        }
        Ok(watches)
    }

    /// Waits (bounded) until the readers have every acknowledged write's events, stops them,
    /// and closes the stalled watches.
    async fn finish(self, acknowledgements: &[Acknowledged]) -> (Percentiles, FanOut) {
        let groups = self.groups;
        let group = |key: u64| key % groups;
        // Reader `index` selects group `index % groups`.
        let readers = self.readers.len() as u64;
        let readers_of = |group: u64| readers / groups + u64::from(group < readers % groups);
        let expected: u64 = acknowledgements
            .iter()
            .map(|ack| readers_of(group(ack.key)))
            .sum();
        let first_expects = acknowledgements
            .iter()
            .filter(|ack| group(ack.key) == 0)
            .count();
        let waited = Instant::now();
        loop {
            let timed = self.arrivals.lock().map(|a| a.len()).unwrap_or(0);
            let delivered = self.delivered.load(Ordering::Relaxed);
            if (timed >= first_expects && delivered >= expected) || waited.elapsed() > DRAIN_TIMEOUT
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let drained_seconds = waited.elapsed().as_secs_f64();
        for reader in &self.readers {
            reader.abort();
        }
        let arrivals = self.arrivals.lock().map(|a| a.clone()).unwrap_or_default();
        let mut delays: Vec<Duration> = acknowledgements
            .iter()
            .filter_map(|ack| {
                arrivals
                    .get(&(ack.name.clone(), ack.version.clone()))
                    .map(|arrived| arrived.saturating_duration_since(ack.sent))
            })
            .collect();
        let fan_out = FanOut {
            watchers: self.readers.len() + self.stalled.len(),
            stalled: self.stalled.len(),
            groups,
            expected_events: expected,
            delivered_events: self.delivered.load(Ordering::Relaxed),
            disturbed_readers: self.disturbed.load(Ordering::Relaxed),
            drained_seconds,
        };
        (Percentiles::of(&mut delays), fan_out)
    }
}

/// Reads `watcher` until its opening listing has ended.
async fn past_listing(mut watcher: Watcher, index: usize) -> anyhow::Result<Watcher> {
    let listed = async {
        loop {
            match watcher.next().await {
                Some(WatchUpdate::Event(event))
                    if matches!(event.event, Some(Event::EndOfSnapshot(_))) =>
                {
                    return Ok(());
                }
                Some(WatchUpdate::Failed(error)) => return Err(error_of(error)),
                None => anyhow::bail!("watch {index} ended before its opening listing did"),
                _ => {}
            }
        }
    };
    match tokio::time::timeout(OPENING_TIMEOUT, listed).await {
        Ok(result) => result.map(|()| watcher),
        Err(_) => anyhow::bail!(
            "watch {index} did not finish its opening listing within {} s",
            OPENING_TIMEOUT.as_secs()
        ),
    }
}

/// A reading watch: counts the upserts it receives (timing them when `timed`), and whether it
/// was ever disconnected, relisted or failed.
async fn read_events(
    mut watcher: Watcher,
    timed: Option<Arrivals>,
    delivered: Arc<AtomicU64>,
    disturbed: Arc<AtomicU64>,
) {
    let mut was_disturbed = false;
    while let Some(update) = watcher.next().await {
        match update {
            WatchUpdate::Event(event) => {
                let Some(Event::Upsert(upsert)) = event.event else {
                    continue;
                };
                delivered.fetch_add(1, Ordering::Relaxed);
                if let (Some(arrivals), Some(resource)) = (&timed, upsert.resource) {
                    let name = resource.id.map(|id| id.name).unwrap_or_default();
                    if let Ok(mut arrivals) = arrivals.lock() {
                        arrivals.insert((name, resource.version), Instant::now());
                    }
                }
            }
            WatchUpdate::Resumed { .. } => {}
            WatchUpdate::Disconnected { .. }
            | WatchUpdate::Relisting { .. }
            | WatchUpdate::Failed(_) => {
                if !was_disturbed {
                    was_disturbed = true;
                    disturbed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
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
            if let Some(fan_out) = &report.fan_out {
                table.row([
                    "watches".to_owned(),
                    format!(
                        "{} ({} stalled) over {} group(s); {} of {} events delivered, {} readers disturbed, drained in {:.2} s",
                        fan_out.watchers,
                        fan_out.stalled,
                        fan_out.groups,
                        fan_out.delivered_events,
                        fan_out.expected_events,
                        fan_out.disturbed_readers,
                        fan_out.drained_seconds
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

    /// Names sort as their keys do, so writing keys in order writes the store in order.
    #[test]
    fn names_sort_as_keys() {
        let digits = 999_999u64.to_string().len();
        let names: Vec<String> = [0u64, 9, 10, 99, 100, 999_999]
            .iter()
            .map(|key| bench_name(*key, digits))
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(bench_name(42, digits), "bench-000042");
        assert_eq!(bench_name(7, 1), "bench-7");
    }
}
