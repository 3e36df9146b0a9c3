//! One node's metrics (DESIGN §13), in the Prometheus text format.
//!
//! Two kinds of figures: instruments the code records into as things happen (request counts and
//! durations, log commits and applies, watch events, leader changes) and samples read at scrape
//! time from what the node keeps anyway (raft indexes, controller counters and queues, resource
//! counts, LMDB sizes) through a [`Sampler`]. Every node owns its own [`Metrics`]: `resd dev`
//! runs three in one process, each with its own `/metrics`.
//!
//! Labels are bounded: methods come from the published service descriptors (anything else is
//! `other`), types from the registry, controllers from the manager; no resource names.

pub(crate) mod grpc;
pub(crate) mod recent;

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub(crate) use self::recent::{Recent, RecentSummary};

/// Label sets: a few fixed keys with bounded values.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// Request durations: 100 µs to ~26 s.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

/// Disk syncs and applies: 50 µs to ~1.6 s.
pub(crate) fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

/// Writes per log entry: 1 to 4096.
fn batch_buckets() -> Vec<f64> {
    exponential_buckets(1.0, 2.0, 13).collect()
}

/// Histograms by label, each made with the family's buckets.
pub(crate) type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// What the storage layer records: how entries batch, how long syncs and applies take.
#[derive(Clone, Debug)]
pub struct StorageMetrics {
    /// Resource writes per applied log entry.
    pub batch_entries: Histogram,
    /// Syncs of a store, by environment (`log`: one write and `fdatasync` of the raft log).
    pub sync_duration: HistogramFamily,
    /// Applying a run of entries to the state machine, commit included; with the writes they
    /// held, for `Status` (rate and p99 over the last seconds).
    pub apply: Recent,
    /// AppendEntries this node served as a follower (calls and append-stream messages), its log
    /// flush included.
    pub append_duration: Histogram,
    /// Bytes free on the data directory's disk.
    pub disk_free_bytes: Gauge,
    /// Bytes the state holds, and its quota.
    pub state_bytes: Gauge,
    pub state_quota_bytes: Gauge,
    /// Rebases of the live state onto a new snapshot, by outcome (`done`, `abandoned`), and
    /// the log entries they wrote again to catch up.
    pub state_rebases: Family<Labels, Counter>,
    pub state_rebase_entries: Counter,
}

impl Default for StorageMetrics {
    fn default() -> Self {
        StorageMetrics {
            batch_entries: Histogram::new(batch_buckets()),
            sync_duration: HistogramFamily::new_with_constructor(sync_histogram),
            apply: Recent::default(),
            append_duration: sync_histogram(),
            disk_free_bytes: Gauge::default(),
            state_bytes: Gauge::default(),
            state_quota_bytes: Gauge::default(),
            state_rebases: Family::default(),
            state_rebase_entries: Counter::default(),
        }
    }
}

impl StorageMetrics {
    /// Records one sync of `env` that took `seconds`.
    pub fn synced(&self, env: &'static str, seconds: f64) {
        self.sync_duration
            .get_or_create(&vec![("env", env.to_owned())])
            .observe(seconds);
    }
}

/// What the watch streams record.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchMetrics {
    pub streams: Gauge,
    pub events_sent: Counter,
}

impl WatchMetrics {
    /// Counts an open stream until the guard drops.
    pub(crate) fn open_stream(&self) -> StreamGuard {
        self.streams.inc();
        StreamGuard(self.streams.clone())
    }
}

/// An open watch stream (decrements `resd_watch_streams` when dropped).
#[derive(Debug)]
pub(crate) struct StreamGuard(Gauge);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Figures read at scrape time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub raft: Option<RaftSample>,
    /// Per controller: name, successful and failed reconciles, queue depth.
    pub controllers: Vec<ControllerSample>,
    /// Resources per `group.Kind` (all versions of a kind share storage).
    pub resources: Vec<(String, u64)>,
    /// Bytes on disk per store: `log` (the raft log's segments), `state` (the state machine's
    /// LMDB environment). The family keeps DESIGN §13's name.
    pub lmdb_bytes: Vec<(&'static str, u64)>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RaftSample {
    pub term: u64,
    pub is_leader: bool,
    pub commit_index: u64,
    pub applied_index: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct ControllerSample {
    pub name: String,
    pub reconciles_ok: u64,
    pub reconciles_failed: u64,
    pub queue_depth: u64,
}

/// Reads a [`Sample`] (called on every scrape).
pub(crate) type Sampler = Arc<dyn Fn() -> Sample + Send + Sync>;

/// A node's registry and instruments.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Mutex<Registry>,
    pub leader_changes: Counter,
    pub grpc: grpc::GrpcMetrics,
    /// HTTP API requests by route and status.
    pub http_requests: Family<Labels, Counter>,
    pub storage: StorageMetrics,
    pub watch: WatchMetrics,
    /// Audit log lines lost (its writer behind, or the file not writable).
    pub audit_lines_lost: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::default();
        let leader_changes = Counter::default();
        registry.register(
            "resd_raft_leader_changes",
            "Times this node saw the cluster's leader change",
            leader_changes.clone(),
        );
        let grpc = grpc::GrpcMetrics::new(HistogramFamily::new_with_constructor(request_histogram));
        registry.register(
            "resd_grpc_requests",
            "gRPC requests answered, by service, method and status code",
            grpc.requests.clone(),
        );
        registry.register(
            "resd_grpc_request_duration_seconds",
            "Time to answer a gRPC request by method (streams: until the first response)",
            grpc.duration.clone(),
        );
        let audit_lines_lost = Counter::default();
        registry.register(
            "resd_audit_lines_lost",
            "Audit log lines lost: its writer was behind, or the file could not be written (a full disk)",
            audit_lines_lost.clone(),
        );
        let http_requests = Family::<Labels, Counter>::default();
        registry.register(
            "resd_http_requests",
            "HTTP requests answered, by route and status",
            http_requests.clone(),
        );
        let storage = StorageMetrics::default();
        registry.register(
            "resd_raft_batch_entries",
            "Resource writes per applied log entry (the leader batches concurrent writes)",
            storage.batch_entries.clone(),
        );
        registry.register(
            "resd_storage_sync_duration_seconds",
            "Syncs of a store (env=log: one write and fdatasync of the raft log)",
            storage.sync_duration.clone(),
        );
        registry.register(
            "resd_raft_apply_duration_seconds",
            "Applying committed entries to the state machine, commit included",
            storage.apply.histogram(),
        );
        registry.register(
            "resd_raft_append_duration_seconds",
            "AppendEntries served as a follower (calls and append-stream messages), log flush included",
            storage.append_duration.clone(),
        );
        registry.register(
            "resd_disk_free_bytes",
            "Bytes free on the disk holding the data directory (new writes are refused under the reserve, --disk-reserve-bytes)",
            storage.disk_free_bytes.clone(),
        );
        registry.register(
            "resd_state_bytes",
            "Bytes the stored state holds (its databases' pages), which --quota-bytes bounds",
            storage.state_bytes.clone(),
        );
        registry.register(
            "resd_state_quota_bytes",
            "The state's quota (--quota-bytes)",
            storage.state_quota_bytes.clone(),
        );
        registry.register(
            "resd_state_rebases",
            "Rebases of the live state onto the snapshot just built (a dense copy, caught up from the raft log), by outcome",
            storage.state_rebases.clone(),
        );
        registry.register(
            "resd_state_rebase_entries",
            "Raft log entries rebases wrote again into their copy to catch up with the live state",
            storage.state_rebase_entries.clone(),
        );
        let watch = WatchMetrics::default();
        registry.register(
            "resd_watch_streams",
            "Watch streams open on this node",
            watch.streams.clone(),
        );
        registry.register(
            "resd_watch_events_sent",
            "Watch events sent to clients",
            watch.events_sent.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            leader_changes,
            grpc,
            http_requests,
            storage,
            watch,
            audit_lines_lost,
        }
    }

    /// Adds the figures read at scrape time.
    pub(crate) fn sample_with(&self, sampler: Sampler) {
        self.registry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .register_collector(Box::new(Sampled(sampler)));
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// The scrape-time families of a [`Sample`].
struct Sampled(Sampler);

impl std::fmt::Debug for Sampled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sampled")
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    let descriptor = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(descriptor)
}

impl Collector for Sampled {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sample = (self.0)();
        if let Some(raft) = sample.raft {
            let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            gauge(
                &mut encoder,
                "resd_raft_term",
                "The raft term this node is in",
                as_i64(raft.term),
            )?;
            gauge(
                &mut encoder,
                "resd_raft_is_leader",
                "1 while this node leads",
                i64::from(raft.is_leader),
            )?;
            gauge(
                &mut encoder,
                "resd_raft_commit_index",
                "The highest log index this node knows committed",
                as_i64(raft.commit_index),
            )?;
            gauge(
                &mut encoder,
                "resd_raft_applied_index",
                "The highest log index applied to this node's state machine",
                as_i64(raft.applied_index),
            )?;
        }
        {
            let reconciles = ConstCounter::new(0u64);
            let mut family = encoder.encode_descriptor(
                "resd_controller_reconciles",
                "Reconciles run on this node, by controller and result",
                None,
                reconciles.metric_type(),
            )?;
            for controller in &sample.controllers {
                for (result, count) in [
                    ("ok", controller.reconciles_ok),
                    ("error", controller.reconciles_failed),
                ] {
                    let labels: Labels = vec![
                        ("controller", controller.name.clone()),
                        ("result", result.to_owned()),
                    ];
                    ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        {
            let depth = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(
                "resd_controller_queue_depth",
                "Requests waiting in each controller's queue on this node",
                None,
                depth.metric_type(),
            )?;
            for controller in &sample.controllers {
                let labels: Labels = vec![("controller", controller.name.clone())];
                ConstGauge::new(i64::try_from(controller.queue_depth).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let count = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(
                "resd_resources",
                "Resources stored, by type (group.Kind: the versions of a kind share storage)",
                None,
                count.metric_type(),
            )?;
            for (resource_type, count) in &sample.resources {
                let labels: Labels = vec![("type", resource_type.clone())];
                ConstGauge::new(i64::try_from(*count).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let bytes = ConstGauge::new(0i64);
            let mut family = encoder.encode_descriptor(
                "resd_lmdb_bytes",
                "Size on disk of each store: env=log is the raft log's segments, env=state the state machine's LMDB environment",
                None,
                bytes.metric_type(),
            )?;
            for (env, size) in &sample.lmdb_bytes {
                let labels: Labels = vec![("env", (*env).to_owned())];
                ConstGauge::new(i64::try_from(*size).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_renders_with_bounded_labels() {
        let metrics = Metrics::new();
        metrics.sample_with(Arc::new(|| Sample {
            raft: Some(RaftSample {
                term: 3,
                is_leader: true,
                commit_index: 40,
                applied_index: 39,
            }),
            controllers: vec![ControllerSample {
                name: "artist".into(),
                reconciles_ok: 5,
                reconciles_failed: 1,
                queue_depth: 2,
            }],
            resources: vec![("demo.Artist".into(), 7)],
            lmdb_bytes: vec![("log", 4096), ("state", 8192)],
        }));
        metrics.leader_changes.inc();
        metrics.storage.batch_entries.observe(3.0);
        metrics.storage.synced("log", 0.002);
        metrics.storage.apply.record(0.001, 3);
        let _stream = metrics.watch.open_stream();
        metrics.watch.events_sent.inc_by(2);
        metrics.grpc.record(
            "/resd.resource.v1.ResourceService/Write",
            tonic::Code::Ok,
            0.003,
        );
        metrics
            .grpc
            .record("/no.such.Service/Nope", tonic::Code::Unimplemented, 0.0001);
        let text = metrics.render();
        for line in [
            "resd_raft_term 3",
            "resd_raft_is_leader 1",
            "resd_raft_commit_index 40",
            "resd_raft_applied_index 39",
            "resd_raft_leader_changes_total 1",
            "resd_raft_batch_entries_count 1",
            "resd_storage_sync_duration_seconds_count{env=\"log\"} 1",
            "resd_watch_streams 1",
            "resd_watch_events_sent_total 2",
            "resd_controller_reconciles_total{controller=\"artist\",result=\"error\"} 1",
            "resd_controller_queue_depth{controller=\"artist\"} 2",
            "resd_resources{type=\"demo.Artist\"} 7",
            "resd_lmdb_bytes{env=\"state\"} 8192",
            "resd_grpc_requests_total{service=\"resd.resource.v1.ResourceService\",method=\"Write\",code=\"OK\"} 1",
            "resd_grpc_requests_total{service=\"other\",method=\"other\",code=\"UNIMPLEMENTED\"} 1",
            "resd_grpc_request_duration_seconds_count{method=\"Write\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
