//! The state machine's apply path alone (no network, no fsync): batches of 64 one-KiB resource
//! writes applied to an LMDB state machine, with request ids (exactly-once: each change looked
//! up and remembered in the deduplication table) and without (as entries written before
//! request ids are applied). Prints the time per change of each and the difference, so the cost
//! of exactly-once is measured where it is paid.
//!
//! `cargo bench -p server --bench apply`; `RESD_BENCH_ENTRIES` sets the entries per run
//! (default 2000, i.e. 128,000 changes: enough to reach the bound of remembered requests).

#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use openraft::storage::RaftStateMachine;
use proto::resource::v1::{Id, Resource, Tenancy, Type};
use server::storage::WriteCondition;
use server::storage::raft::op::{Change, Op, RequestId, Tagged};
use server::storage::raft::state_machine::StateMachineStore;
use server::storage::raft::types::{Command, Entry, LogId};

const CHANGES_PER_ENTRY: usize = 64;

fn resource(name: String) -> Resource {
    let mut resource = Resource {
        id: Some(Id {
            uid: ulid::Ulid::new().to_string(),
            name,
            r#type: Some(Type {
                group: "demo".into(),
                group_version: "v1".into(),
                kind: "Artist".into(),
            }),
            tenancy: Some(Tenancy {
                partition: "default".into(),
                namespace: "default".into(),
            }),
        }),
        generation: ulid::Ulid::new().to_string(),
        ..Default::default()
    };
    resource.metadata.insert("payload".into(), "x".repeat(1024));
    resource
}

fn entries(count: usize, with_ids: bool, history: bool) -> Vec<Entry> {
    (0..count)
        .map(|index| {
            let changes = (0..CHANGES_PER_ENTRY)
                .map(|n| Tagged {
                    request_id: with_ids.then(RequestId::new),
                    change: Change::Write(
                        std::sync::Arc::new(resource(format!("a-{index}-{n}"))),
                        WriteCondition::Version,
                    ),
                    actor: "controller/bench".into(),
                    fence: Default::default(),
                    keep: history.then(|| server::storage::history::Keep {
                        time_ms: 1_700_000_000_000 + index as i64,
                        retention: server::storage::history::Retention::default(),
                        node_bytes: 1 << 30,
                    }),
                })
                .collect();
            Entry {
                log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index as u64 + 1),
                payload: openraft::EntryPayload::Normal(Command::new(Op::Changes(changes))),
            }
        })
        .collect()
}

async fn run(count: usize, with_ids: bool, history: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let mut sm = StateMachineStore::open(dir.path(), Default::default()).unwrap();
    let entries = entries(count, with_ids, history);
    let started = Instant::now();
    // As openraft hands them over: a few entries per call.
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let batch: Vec<Entry> = entries.by_ref().take(4).collect();
        sm.apply(batch).await.unwrap();
    }
    started.elapsed()
}

fn main() {
    let count: usize = std::env::var("RESD_BENCH_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let changes = (count * CHANGES_PER_ENTRY) as f64;
    let mut without = Vec::new();
    let mut with = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..5 {
        without.push(runtime.block_on(run(count, false, false)).as_secs_f64() / changes * 1e6);
        with.push(runtime.block_on(run(count, true, false)).as_secs_f64() / changes * 1e6);
        kept.push(runtime.block_on(run(count, true, true)).as_secs_f64() / changes * 1e6);
    }
    without.sort_by(f64::total_cmp);
    with.sort_by(f64::total_cmp);
    kept.sort_by(f64::total_cmp);
    let (a, b, c) = (without[2], with[2], kept[2]);
    println!("apply, {count} entries of {CHANGES_PER_ENTRY} 1 KiB writes, median of 5 runs:");
    println!("  without request ids  {a:8.2} µs per change");
    println!(
        "  with request ids     {b:8.2} µs per change ({:+.1}%)",
        (b - a) / a * 100.0
    );
    println!(
        "  and history kept     {c:8.2} µs per change ({:+.1}% over request ids alone)",
        (c - b) / b * 100.0
    );
}
