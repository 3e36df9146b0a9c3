//! A Jepsen-style test of the promises across crashes (DESIGN §14) against a real 3-node cluster.
//!
//! Clients on every node run, concurrently: strong reads, compare-and-swap writes and blind
//! writes of a few registers (each write a unique value), default reads, and creates of unique
//! resources. Raw gRPC clients, no client-side retries: an operation whose outcome is unknown
//! (timeout, unreachable node, no leader) is recorded as possibly applied. A nemesis kills the
//! leader (SIGKILL) and restarts it, pauses nodes (SIGSTOP/SIGCONT), kills the leader while a
//! follower is paused, and restarts a killed follower while the others are paused (probing it
//! with default reads). One node is never killed and watches everything.
//!
//! Checked afterwards: every register's history is linearizable ([`checker`]); default reads on
//! one node never go back (a lower version, or not found after found); every acknowledged create
//! exists; and no change was applied twice (each written value appears in at most one event of
//! the observer's watch).
//!
//! Always on: one short run (about 25 s). `RESD_CHAOS=1` runs 5 rounds of 90 s each
//! (`RESD_CHAOS_ROUNDS`, `RESD_CHAOS_SECONDS` change that).

mod checker;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::cluster::v1::StatusRequest;
use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use proto::resource::v1::watch_event::Event;
use proto::resource::v1::{
    Id, ListRequest, ReadRequest, Resource, Tenancy, Type, WatchListRequest, WriteRequest,
};
use tests::Cluster;
use tonic::Code;
use tonic::transport::Channel;

use checker::{Call, Operation};

const REGISTERS: usize = 3;
/// The node the nemesis leaves alone; it watches every change.
const OBSERVER: usize = 2;
const OPERATION_TIMEOUT: Duration = Duration::from_secs(4);

fn artist_type() -> Type {
    Type {
        group: "demo".into(),
        group_version: "v1".into(),
        kind: "Artist".into(),
    }
}

fn id(name: &str) -> Id {
    Id {
        name: name.into(),
        r#type: Some(artist_type()),
        tenancy: Some(Tenancy::default()),
        ..Default::default()
    }
}

fn register(key: usize) -> String {
    format!("register-{key}")
}

/// The register value a resource holds.
fn value_of(resource: &Resource) -> Option<u64> {
    resource.metadata.get("value").and_then(|v| v.parse().ok())
}

fn with_value(mut resource: Resource, value: u64) -> Resource {
    resource.metadata.insert("value".into(), value.to_string());
    resource
}

/// `index.position` as a comparable pair.
fn version(text: &str) -> (u64, u32) {
    let (index, position) = text.split_once('.').unwrap_or((text, "0"));
    (index.parse().unwrap_or(0), position.parse().unwrap_or(0))
}

/// Whether an error leaves the operation's outcome unknown.
fn indeterminate(status: &tonic::Status) -> bool {
    !matches!(
        status.code(),
        Code::Aborted | Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
    )
}

fn timed<T>(message: T, consistent: bool) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(OPERATION_TIMEOUT);
    if consistent {
        request.metadata_mut().insert(
            "x-resd-consistency-mode",
            "consistent".parse().expect("ascii"),
        );
    }
    request
}

/// Everything the clients saw.
#[derive(Default)]
struct History {
    registers: Vec<Vec<Operation>>,
    /// Per node and register: the default reads it served (`None`: not found).
    default_reads: BTreeMap<(usize, usize), Vec<DefaultRead>>,
    created: Vec<String>,
    maybe_created: Vec<String>,
    operations: u64,
    unknown: u64,
}

/// A default read: when it was invoked and returned, and the version it saw.
#[derive(Clone, Debug)]
struct DefaultRead {
    invoked: u64,
    returned: u64,
    version: Option<(u64, u32)>,
}

/// Reads that went back in time: one that began after another had returned saw an older
/// version (or nothing, after something). Returns how many, and the first.
fn went_back(reads: &[DefaultRead]) -> (usize, Option<String>) {
    let mut by_return: Vec<&DefaultRead> = reads.iter().collect();
    by_return.sort_by_key(|read| read.returned);
    let mut by_invocation: Vec<&DefaultRead> = reads.iter().collect();
    by_invocation.sort_by_key(|read| read.invoked);
    let mut finished = by_return.iter().peekable();
    // The newest version any read had returned before the current one began.
    let mut newest: Option<(u64, u32)> = None;
    let mut found_before = false;
    let mut count = 0;
    let mut first = None;
    for read in by_invocation {
        while let Some(done) = finished.next_if(|done| done.returned < read.invoked) {
            if let Some(version) = done.version {
                found_before = true;
                newest = newest.max(Some(version));
            }
        }
        let back = match (read.version, newest) {
            (None, Some(before)) if found_before => Some(format!("not found after {before:?}")),
            (Some(now), Some(before)) if now < before => {
                Some(format!("version {now:?} after {before:?}"))
            }
            _ => None,
        };
        if let Some(what) = back {
            count += 1;
            first.get_or_insert(what);
        }
    }
    (count, first)
}

struct Run {
    started: Instant,
    history: Mutex<History>,
    next_value: std::sync::atomic::AtomicU64,
}

impl Run {
    fn now(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn value(&self) -> u64 {
        self.next_value
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// A default read of register `key` on `node`, invoked at `invoked` and returning now.
    fn record_default_read(&self, node: usize, key: usize, invoked: u64, seen: Option<(u64, u32)>) {
        let returned = self.now();
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        history.operations += 1;
        history
            .default_reads
            .entry((node, key))
            .or_default()
            .push(DefaultRead {
                invoked,
                returned,
                version: seen,
            });
    }

    fn record(&self, key: usize, call: Call, invoked: u64, returned: Option<u64>) {
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        history.operations += 1;
        if returned.is_none() {
            history.unknown += 1;
        }
        history.registers[key].push(Operation {
            call,
            invoked,
            returned,
            happened: false,
        });
    }
}

async fn channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

/// One client: a loop of random operations through one node until `stop`.
async fn client(run: Arc<Run>, node: usize, addr: String, worker: usize, stop: Instant) {
    let mut resources = ResourceServiceClient::new(channel(&addr).await);
    let mut sequence = 0u64;
    let mut seed = (node * 7919 + worker * 104_729 + 17) as u64;
    let mut random = move |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    while Instant::now() < stop {
        let key = random(REGISTERS as u64) as usize;
        let name = register(key);
        match random(100) {
            // A strong read, then (half the time) a CAS from what it read.
            0..=44 => {
                let invoked = run.now();
                let read = resources
                    .read(timed(
                        ReadRequest {
                            id: Some(id(&name)),
                            ..Default::default()
                        },
                        true,
                    ))
                    .await;
                let current = match read {
                    Ok(reply) => {
                        let resource = reply.into_inner().resource.unwrap_or_default();
                        run.record(
                            key,
                            Call::Read(value_of(&resource)),
                            invoked,
                            Some(run.now()),
                        );
                        Some(resource)
                    }
                    Err(status) if status.code() == Code::NotFound => {
                        run.record(key, Call::Read(None), invoked, Some(run.now()));
                        None
                    }
                    Err(_) => continue,
                };
                if random(2) == 0 {
                    let new = run.value();
                    // From a read of nothing there is no version to compare: the write is a
                    // blind one (it creates, or updates whatever appeared meanwhile).
                    // `Some(expected)`: a CAS on the version read; `None`: a blind write.
                    let (compare, resource) = match current {
                        Some(resource) => (Some(value_of(&resource)), with_value(resource, new)),
                        None => (
                            None,
                            with_value(
                                Resource {
                                    id: Some(id(&name)),
                                    ..Default::default()
                                },
                                new,
                            ),
                        ),
                    };
                    let call = |succeeded| match compare {
                        Some(expected) => Call::Cas {
                            expected,
                            new,
                            succeeded,
                        },
                        None => Call::Write(new),
                    };
                    let invoked = run.now();
                    let written = resources
                        .write(timed(
                            WriteRequest {
                                resource: Some(resource),
                            },
                            false,
                        ))
                        .await;
                    match &written {
                        Ok(_) => run.record(key, call(true), invoked, Some(run.now())),
                        Err(status) if indeterminate(status) => {
                            run.record(key, call(true), invoked, None)
                        }
                        // A blind write that gave up did not happen; a failed CAS read a
                        // different value.
                        Err(_) if compare.is_none() => {}
                        Err(_) => run.record(key, call(false), invoked, Some(run.now())),
                    }
                }
            }
            // A blind write: unconditional (the server retries its own CAS races).
            45..=59 => {
                let new = run.value();
                let invoked = run.now();
                let resource = with_value(
                    Resource {
                        id: Some(id(&name)),
                        ..Default::default()
                    },
                    new,
                );
                match resources
                    .write(timed(
                        WriteRequest {
                            resource: Some(resource),
                        },
                        false,
                    ))
                    .await
                {
                    Ok(_) => run.record(key, Call::Write(new), invoked, Some(run.now())),
                    Err(status) if indeterminate(&status) => {
                        run.record(key, Call::Write(new), invoked, None)
                    }
                    // Gave up under contention: it did not happen.
                    Err(_) => {}
                }
            }
            // A default read on this node: never older than the last one here.
            60..=84 => {
                let invoked = run.now();
                let read = resources
                    .read(timed(
                        ReadRequest {
                            id: Some(id(&name)),
                            ..Default::default()
                        },
                        false,
                    ))
                    .await;
                let seen = match read {
                    Ok(reply) => Some(version(
                        &reply.into_inner().resource.unwrap_or_default().version,
                    )),
                    Err(status) if status.code() == Code::NotFound => None,
                    Err(_) => continue,
                };
                run.record_default_read(node, key, invoked, seen);
            }
            // A unique create.
            _ => {
                sequence += 1;
                let name = format!("unique-{node}-{worker}-{sequence}");
                let created = resources
                    .write(timed(
                        WriteRequest {
                            resource: Some(Resource {
                                id: Some(id(&name)),
                                ..Default::default()
                            }),
                        },
                        false,
                    ))
                    .await;
                let mut history = run.history.lock().unwrap_or_else(|p| p.into_inner());
                history.operations += 1;
                match created {
                    Ok(_) => history.created.push(name),
                    Err(status) if indeterminate(&status) => history.maybe_created.push(name),
                    Err(status) => panic!("create {name} refused: {status}"),
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The index of the leader, if one node says it leads.
async fn leader(cluster: &Cluster, alive: &[bool]) -> Option<usize> {
    for (index, node) in cluster.nodes.iter().enumerate() {
        if !alive[index] {
            continue;
        }
        let mut client = ClusterServiceClient::new(channel(&node.api_addr).await);
        let mut request = tonic::Request::new(StatusRequest {});
        request.set_timeout(Duration::from_millis(500));
        if let Ok(status) = client.status(request).await
            && status.get_ref().role == proto::cluster::v1::Role::Leader as i32
        {
            return Some(index);
        }
    }
    None
}

fn signal(cluster: &Cluster, node: usize, signal: &str) {
    let pid = cluster.nodes[node].pid().expect("running");
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Default reads of every register on a node that just restarted, for a while: the moment a
/// node rebuilt from an older snapshot could serve the past.
fn probe(run: Arc<Run>, node: usize, addr: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut client = ResourceServiceClient::new(channel(&addr).await);
        let stop = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < stop {
            for key in 0..REGISTERS {
                let invoked = run.now();
                let mut request = tonic::Request::new(ReadRequest {
                    id: Some(id(&register(key))),
                    ..Default::default()
                });
                request.set_timeout(Duration::from_millis(500));
                let seen = match client.read(request).await {
                    Ok(reply) => Some(version(
                        &reply.into_inner().resource.unwrap_or_default().version,
                    )),
                    Err(status) if status.code() == Code::NotFound => None,
                    Err(_) => continue,
                };
                run.record_default_read(node, key, invoked, seen);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

/// Faults, one every few seconds, until `stop`. Returns how many of each it injected.
async fn nemesis(
    run: &Arc<Run>,
    cluster: &mut Cluster,
    stop: Instant,
) -> BTreeMap<&'static str, u32> {
    let mut probes = Vec::new();
    let mut faults = BTreeMap::new();
    let mut round = 0u32;
    let all = [true; 3];
    while Instant::now() + Duration::from_secs(4) < stop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let leader = leader(cluster, &all).await;
        // The target is the leader unless the observer leads; then one of the others.
        let target = match leader {
            Some(leader) if leader != OBSERVER => leader,
            _ => (round as usize) % 2,
        };
        let other = 1 - target;
        match round % 4 {
            0 => {
                cluster.nodes[target].kill();
                tokio::time::sleep(Duration::from_millis(1200)).await;
                cluster.nodes[target].restart();
                probes.push(probe(
                    run.clone(),
                    target,
                    cluster.nodes[target].api_addr.clone(),
                ));
                *faults.entry("kill -9 leader, restart").or_default() += 1;
            }
            1 => {
                signal(cluster, target, "STOP");
                tokio::time::sleep(Duration::from_millis(2000)).await;
                signal(cluster, target, "CONT");
                *faults.entry("pause leader (SIGSTOP 2 s)").or_default() += 1;
            }
            3 => {
                // A follower restarts while nobody it could learn from answers: it must not
                // serve the older state it rebuilt from.
                let follower = match leader {
                    Some(leader) if leader < 2 => 1 - leader,
                    _ => (round as usize / 4) % 2,
                };
                let others: Vec<usize> = (0..3).filter(|node| *node != follower).collect();
                cluster.nodes[follower].kill();
                for node in &others {
                    signal(cluster, *node, "STOP");
                }
                cluster.nodes[follower].restart();
                let probed = probe(
                    run.clone(),
                    follower,
                    cluster.nodes[follower].api_addr.clone(),
                );
                probed.await.expect("a probe panicked");
                for node in &others {
                    signal(cluster, *node, "CONT");
                }
                *faults
                    .entry("kill -9 a follower, restart it alone")
                    .or_default() += 1;
            }
            _ => {
                signal(cluster, other, "STOP");
                cluster.nodes[target].kill();
                tokio::time::sleep(Duration::from_millis(1000)).await;
                cluster.nodes[target].restart();
                probes.push(probe(
                    run.clone(),
                    target,
                    cluster.nodes[target].api_addr.clone(),
                ));
                tokio::time::sleep(Duration::from_millis(500)).await;
                signal(cluster, other, "CONT");
                *faults
                    .entry("pause a follower + kill -9 leader")
                    .or_default() += 1;
            }
        }
        round += 1;
    }
    for probe in probes {
        probe.await.expect("a probe panicked");
    }
    faults
}

/// The upserts the observer saw: (name, register value) of each.
type Observed = Arc<Mutex<Vec<(String, Option<u64>)>>>;

/// Every change the observer node saw: (name, value) of each upsert.
async fn observe(addr: String, events: Observed) -> String {
    let mut client = ResourceServiceClient::new(channel(&addr).await);
    let request = WatchListRequest {
        r#type: Some(artist_type()),
        tenancy: Some(Tenancy {
            partition: "*".into(),
            namespace: "*".into(),
        }),
        ..Default::default()
    };
    let mut stream = match client.watch_list(request).await {
        Ok(stream) => stream.into_inner(),
        Err(status) => return format!("the observer's watch did not start: {status}"),
    };
    loop {
        match stream.message().await {
            Ok(Some(event)) => {
                if let Some(Event::Upsert(upsert)) = event.event {
                    let resource = upsert.resource.unwrap_or_default();
                    let name = resource.id.clone().unwrap_or_default().name;
                    events
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((name, value_of(&resource)));
                }
            }
            Ok(None) => return "the observer's watch ended".into(),
            Err(status) => return format!("the observer's watch failed: {status}"),
        }
    }
}

async fn status_of(addr: &str) -> Option<proto::cluster::v1::StatusResponse> {
    let mut client = ClusterServiceClient::new(channel(addr).await);
    let mut request = tonic::Request::new(StatusRequest {});
    request.set_timeout(Duration::from_secs(1));
    client
        .status(request)
        .await
        .ok()
        .map(|reply| reply.into_inner())
}

/// Waits until every node serves and one leads.
async fn settle(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(60);
    'waiting: while Instant::now() < deadline {
        for node in &cluster.nodes {
            let mut client = ClusterServiceClient::new(channel(&node.api_addr).await);
            let mut request = tonic::Request::new(StatusRequest {});
            request.set_timeout(Duration::from_secs(1));
            match client.status(request).await {
                Ok(status) if status.get_ref().ready && status.get_ref().leader_id != 0 => {}
                _ => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue 'waiting;
                }
            }
        }
        return;
    }
    panic!("the cluster did not settle within 60 s after the faults");
}

/// One run: clients and nemesis for `seconds`, then every check. Returns a summary line.
async fn round(seconds: u64) -> String {
    // Frequent raft snapshots: a node killed mid-run rebuilds from an older one, and laggards
    // catch up by installing them.
    let mut cluster = Cluster::start_with(3, &["--snapshot-every", "200"]).await;
    let run = Arc::new(Run {
        started: Instant::now(),
        history: Mutex::new(History {
            registers: vec![Vec::new(); REGISTERS],
            ..Default::default()
        }),
        next_value: std::sync::atomic::AtomicU64::new(1),
    });
    let events = Arc::new(Mutex::new(Vec::new()));
    let observer = tokio::spawn(observe(
        cluster.nodes[OBSERVER].api_addr.clone(),
        events.clone(),
    ));
    let stop = Instant::now() + Duration::from_secs(seconds);
    let mut clients = tokio::task::JoinSet::new();
    for (node, member) in cluster.nodes.iter().enumerate() {
        for worker in 0..2 {
            clients.spawn(client(
                run.clone(),
                node,
                member.api_addr.clone(),
                worker,
                stop,
            ));
        }
    }
    let faults = nemesis(&run, &mut cluster, stop).await;
    while let Some(joined) = clients.join_next().await {
        joined.expect("a client panicked");
    }
    settle(&cluster).await;

    // Final strong reads close every register's history.
    let mut final_client = ResourceServiceClient::new(channel(&cluster.nodes[0].api_addr).await);
    for key in 0..REGISTERS {
        let invoked = run.now();
        let value = match final_client
            .read(timed(
                ReadRequest {
                    id: Some(id(&register(key))),
                    ..Default::default()
                },
                true,
            ))
            .await
        {
            Ok(reply) => value_of(&reply.into_inner().resource.unwrap_or_default()),
            Err(status) if status.code() == Code::NotFound => None,
            Err(status) => panic!("final read of {}: {status}", register(key)),
        };
        run.record(key, Call::Read(value), invoked, Some(run.now()));
    }
    let stored: HashSet<String> = final_client
        .list(timed(
            ListRequest {
                r#type: Some(artist_type()),
                tenancy: Some(Tenancy::default()),
                name_prefix: "unique-".into(),
                ..ListRequest::default()
            },
            true,
        ))
        .await
        .expect("final list")
        .into_inner()
        .resources
        .into_iter()
        .filter_map(|resource| resource.id.map(|id| id.name))
        .collect();
    // Let the observer apply (and stream) everything committed, then stop it.
    let committed = status_of(&cluster.nodes[0].api_addr)
        .await
        .map(|status| status.commit_index)
        .unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while status_of(&cluster.nodes[OBSERVER].api_addr)
        .await
        .is_none_or(|status| status.applied_index < committed)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    observer.abort();
    if let Ok(ended) = observer.await {
        panic!("{ended}");
    }

    let history = std::mem::take(&mut *run.history.lock().unwrap_or_else(|p| p.into_inner()));
    let mut problems = Vec::new();
    let events = events.lock().unwrap_or_else(|p| p.into_inner()).clone();

    // What was applied, as the observer saw it, settles every write whose client saw no answer:
    // its value was upserted (it happened) or not (it did not).
    let mut applied: Vec<HashSet<u64>> = vec![HashSet::new(); REGISTERS];
    for (name, value) in &events {
        if let (Some(key), Some(value)) =
            ((0..REGISTERS).find(|key| register(*key) == *name), value)
        {
            applied[key].insert(*value);
        }
    }
    let mut registers = Vec::new();
    for (key, operations) in history.registers.iter().enumerate() {
        let mut settled = Vec::new();
        for operation in operations {
            let written = match &operation.call {
                Call::Read(_) => None,
                Call::Write(value) | Call::Cas { new: value, .. } => Some(*value),
            };
            let seen = written.is_some_and(|value| applied[key].contains(&value));
            match (&operation.call, operation.returned, seen) {
                (Call::Read(_), _, _) => settled.push(operation.clone()),
                (_, None, true) => settled.push(Operation {
                    happened: true,
                    ..operation.clone()
                }),
                (_, None, false) => {}
                (
                    Call::Cas {
                        succeeded: false,
                        new,
                        ..
                    },
                    Some(_),
                    true,
                ) => problems.push(format!(
                    "{}: a CAS answered as failed was applied (value {new})",
                    register(key)
                )),
                (_, Some(_), false)
                    if !matches!(
                        operation.call,
                        Call::Cas {
                            succeeded: false,
                            ..
                        }
                    ) =>
                {
                    problems.push(format!(
                        "{}: an acknowledged write (value {:?}) never reached the observer",
                        register(key),
                        written
                    ))
                }
                _ => settled.push(operation.clone()),
            }
        }
        registers.push(settled);
    }

    // Linearizability of every register (on a thread: the search can be deep).
    let verdicts = std::thread::spawn(move || {
        registers
            .iter()
            .enumerate()
            .map(|(key, operations)| (key, checker::check(None, operations)))
            .collect::<Vec<_>>()
    })
    .join()
    .expect("the checker");
    for (key, verdict) in verdicts {
        if let Err(why) = verdict {
            problems.push(format!("{}: {why}", register(key)));
        }
    }

    // Default reads never go back on one node.
    for ((node, key), reads) in &history.default_reads {
        if let (count, Some(first)) = went_back(reads) {
            problems.push(format!(
                "node {} went back in time on {} {count} times, first: {first}",
                node + 1,
                register(*key)
            ));
        }
    }

    // No acknowledged create is lost.
    let lost: Vec<&String> = history
        .created
        .iter()
        .filter(|name| !stored.contains(*name))
        .collect();
    if !lost.is_empty() {
        problems.push(format!("acknowledged creates lost: {lost:?}"));
    }
    let known: HashSet<&String> = history
        .created
        .iter()
        .chain(&history.maybe_created)
        .collect();
    let unknown: Vec<&String> = stored.iter().filter(|name| !known.contains(name)).collect();
    if !unknown.is_empty() {
        problems.push(format!("creates nobody made: {unknown:?}"));
    }

    // Nothing applied twice: every value, and every unique create, is upserted at most once.
    let mut upserts: HashMap<(String, Option<u64>), u32> = HashMap::new();
    for (name, value) in &events {
        if name.starts_with("unique-") || value.is_some() {
            *upserts.entry((name.clone(), *value)).or_default() += 1;
        }
    }
    let twice: Vec<_> = upserts.iter().filter(|(_, count)| **count > 1).collect();
    if !twice.is_empty() {
        problems.push(format!("changes applied more than once: {twice:?}"));
    }

    assert!(problems.is_empty(), "{problems:#?}");
    format!(
        "{} operations ({} without an answer), {} creates acknowledged, {} events observed, faults {faults:?}",
        history.operations,
        history.unknown,
        history.created.len(),
        events.len()
    )
}

fn chaos_requested() -> bool {
    std::env::var("RESD_CHAOS").is_ok_and(|v| v == "1")
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn only_reads_that_began_after_another_returned_must_not_go_back() {
    let read = |invoked, returned, version| DefaultRead {
        invoked,
        returned,
        version,
    };
    // Overlapping reads may finish in either order.
    let overlapping = [read(0, 10, Some((5, 0))), read(1, 5, Some((4, 0)))];
    assert_eq!(went_back(&overlapping).0, 0);
    let later_older = [read(0, 5, Some((5, 0))), read(6, 8, Some((4, 0)))];
    assert_eq!(went_back(&later_older).0, 1);
    let later_missing = [read(0, 5, Some((5, 0))), read(6, 8, None)];
    assert_eq!(went_back(&later_missing).0, 1);
    let never_found = [read(0, 5, None), read(6, 8, None)];
    assert_eq!(went_back(&never_found).0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashes_pauses_and_retries_keep_every_promise() {
    let (rounds, seconds) = if chaos_requested() {
        (
            env_number("RESD_CHAOS_ROUNDS", 5),
            env_number("RESD_CHAOS_SECONDS", 90),
        )
    } else {
        (1, 25)
    };
    for index in 1..=rounds {
        let summary = round(seconds).await;
        eprintln!("chaos round {index}/{rounds} ({seconds} s): {summary}");
    }
}
