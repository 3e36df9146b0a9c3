//! Tests of the Raft backend: openraft's storage suite on the LMDB stores, and the storage
//! conformance suite on a single node, on the leader of a three-node cluster and on a follower.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::testing::{StoreBuilder, Suite};
use tokio_util::sync::CancellationToken;

use super::backend::RaftBackend;
use super::log_store::LogStore;
use super::network;
use super::node::{RaftNode, RaftOptions};
use super::state_machine::StateMachineStore;
use super::types::{Entry, LogId, NodeAddr, RaftStorageError, TypeConfig};

/// Admits what storage can store; these tests have no registry.
struct StorableOnly;

#[async_trait::async_trait]
impl crate::storage::Admission for StorableOnly {
    async fn admit(
        &self,
        resource: &proto::resource::v1::Resource,
    ) -> Result<(), crate::storage::StorageError> {
        crate::storage::check::check_storable(resource, usize::MAX)
    }
}

struct LmdbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for LmdbBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), RaftStorageError> {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::read(&e))?;
        let log = LogStore::open(dir.path()).map_err(|e| openraft::StorageIOError::read(&e))?;
        let sm = StateMachineStore::open(dir.path(), Default::default())
            .map_err(|e| openraft::StorageIOError::read(&e))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn lmdb_log_store_and_state_machine_pass_the_openraft_suite() -> Result<(), RaftStorageError> {
    Suite::test_all(LmdbBuilder)
}

/// Raft nodes in this process, each with its own data directory and raft server on loopback.
pub(crate) struct TestCluster {
    pub nodes: Vec<Arc<RaftNode>>,
    shutdown: CancellationToken,
    /// Raft servers; they end when `shutdown` is cancelled.
    _servers: Vec<tokio::task::JoinHandle<()>>,
    _dirs: Vec<tempfile::TempDir>,
}

/// Adds `node` to `leader`'s cluster as a voter, the plain raft way (the cluster room's rules,
/// `crate::cluster`, sit above storage and have tests of their own).
async fn add_voter(leader: &RaftNode, node: &RaftNode) -> Result<(), String> {
    let raft = leader.raft();
    raft.add_learner(node.id(), node.node().clone(), true)
        .await
        .map_err(|error| error.to_string())?;
    raft.change_membership(
        openraft::ChangeMembers::AddVoterIds(std::collections::BTreeSet::from([node.id()])),
        false,
    )
    .await
    .map_err(|error| error.to_string())?;
    Ok(())
}

impl TestCluster {
    pub(crate) async fn start(size: u64) -> TestCluster {
        Self::start_with(size, Duration::from_secs(10)).await
    }

    pub(super) async fn start_with(size: u64, forward_timeout: Duration) -> TestCluster {
        Self::start_configured(size, forward_timeout, |_| {}).await
    }

    /// A cluster whose nodes' options `configure` adjusts last.
    pub(super) async fn start_configured(
        size: u64,
        forward_timeout: Duration,
        configure: impl Fn(&mut RaftOptions),
    ) -> TestCluster {
        let shutdown = CancellationToken::new();
        let mut nodes = Vec::new();
        let mut servers = Vec::new();
        let mut dirs = Vec::new();
        for node_id in 1..=size {
            let dir = tempfile::tempdir().expect("temp dir");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let raft_addr = listener.local_addr().expect("addr").to_string();
            let mut options = RaftOptions::new(
                node_id,
                dir.path().to_path_buf(),
                NodeAddr {
                    api_addr: String::new(),
                    raft_addr,
                },
            );
            options.heartbeat = Duration::from_millis(50);
            options.forward_timeout = forward_timeout;
            options.election_timeout = (Duration::from_millis(300), Duration::from_millis(600));
            configure(&mut options);
            let backend = RaftNode::open(options).await.expect("open raft backend");
            let grpc = network::RaftGrpc::new(backend.clone(), Arc::new(StorableOnly));
            let token = shutdown.clone();
            servers.push(tokio::spawn(async move {
                let served = tonic::transport::Server::builder()
                    .add_service(grpc.into_server())
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        token.cancelled_owned(),
                    )
                    .await;
                if let Err(error) = served {
                    tracing::warn!(%error, "test raft server failed");
                }
            }));
            nodes.push(backend);
            dirs.push(dir);
        }
        let cluster = TestCluster {
            nodes,
            shutdown,
            _servers: servers,
            _dirs: dirs,
        };
        cluster.nodes[0].bootstrap().await.expect("bootstrap");
        cluster.wait_for_leader(1, 1).await;
        for node in &cluster.nodes[1..] {
            add_voter(&cluster.nodes[0], node)
                .await
                .unwrap_or_else(|error| panic!("add voter {}: {error}", node.id()));
        }
        cluster.wait_for_leader(1, cluster.nodes.len()).await;
        cluster.wait_until_ready().await;
        cluster
    }

    /// Waits until every node serves: a follower that knows its leader may still be catching
    /// up to the commit index it learned, and refuses reads and watches until it has applied it.
    pub(super) async fn wait_until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let waiting: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|node| {
                    node.check_ready()
                        .err()
                        .map(|e| format!("{}: {e}", node.id()))
                })
                .collect();
            if waiting.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nodes not ready within 20s: {waiting:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the first `count` nodes see `expected` as leader.
    pub(super) async fn wait_for_leader(&self, expected: u64, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.nodes[..count]
                .iter()
                .all(|node| node.metrics().current_leader == Some(expected))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("node {expected} did not become leader of every node within 20s");
    }
}

/// One node of a test cluster, keeping the whole cluster alive.
pub(super) struct Member {
    cluster: Arc<TestCluster>,
    index: usize,
}

impl Member {
    pub(super) async fn single() -> Member {
        Member {
            cluster: Arc::new(TestCluster::start(1).await),
            index: 0,
        }
    }

    /// A single node whose options `configure` adjusts last.
    pub(super) async fn single_configured(configure: impl Fn(&mut RaftOptions)) -> Member {
        Member {
            cluster: Arc::new(
                TestCluster::start_configured(1, Duration::from_secs(10), configure).await,
            ),
            index: 0,
        }
    }

    pub(super) async fn leader_of_three() -> Member {
        Member {
            cluster: Arc::new(TestCluster::start(3).await),
            index: 0,
        }
    }

    pub(super) async fn follower_of_three() -> Member {
        Member {
            cluster: Arc::new(TestCluster::start(3).await),
            index: 2,
        }
    }
}

impl std::ops::Deref for Member {
    type Target = RaftNode;
    fn deref(&self) -> &RaftNode {
        &self.cluster.nodes[self.index]
    }
}

/// The storage contract over `node`.
pub(super) fn storage(node: &Arc<RaftNode>) -> RaftBackend {
    RaftBackend::new(node.clone())
}

impl Member {
    /// The storage contract over this node.
    pub(super) fn backend(&self) -> RaftBackend {
        RaftBackend::new(self.cluster.nodes[self.index].clone())
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.cluster.shutdown.cancel();
    }
}

#[async_trait::async_trait]
impl crate::storage::Backend for Member {
    async fn read(
        &self,
        consistency: crate::storage::Consistency,
        id: &proto::resource::v1::Id,
    ) -> Result<proto::resource::v1::Resource, crate::storage::StorageError> {
        self.backend().read(consistency, id).await
    }
    async fn read_encoded(
        &self,
        consistency: crate::storage::Consistency,
        id: &proto::resource::v1::Id,
    ) -> Result<Vec<u8>, crate::storage::StorageError> {
        self.backend().read_encoded(consistency, id).await
    }
    async fn write_cas_as(
        &self,
        resource: proto::resource::v1::Resource,
        actor: &str,
        fence: &crate::storage::Fence,
    ) -> Result<proto::resource::v1::Resource, crate::storage::StorageError> {
        self.backend().write_cas_as(resource, actor, fence).await
    }
    async fn write_merged_as(
        &self,
        resource: proto::resource::v1::Resource,
        actor: &str,
        fence: &crate::storage::Fence,
    ) -> Result<proto::resource::v1::Resource, crate::storage::StorageError> {
        self.backend().write_merged_as(resource, actor, fence).await
    }
    async fn delete_cas_as(
        &self,
        id: &proto::resource::v1::Id,
        version: &str,
        actor: &str,
        fence: &crate::storage::Fence,
    ) -> Result<(), crate::storage::StorageError> {
        self.backend()
            .delete_cas_as(id, version, actor, fence)
            .await
    }
    async fn list(
        &self,
        consistency: crate::storage::Consistency,
        resource_type: &crate::storage::UnversionedType,
        tenancy: &proto::resource::v1::Tenancy,
        name_prefix: &str,
    ) -> Result<Vec<proto::resource::v1::Resource>, crate::storage::StorageError> {
        self.backend()
            .list(consistency, resource_type, tenancy, name_prefix)
            .await
    }
    async fn list_encoded(
        &self,
        consistency: crate::storage::Consistency,
        resource_type: &crate::storage::UnversionedType,
        tenancy: &proto::resource::v1::Tenancy,
        name_prefix: &str,
        after: Option<&crate::storage::StorageKey>,
        sink: &mut dyn crate::storage::EncodedSink,
    ) -> Result<(), crate::storage::StorageError> {
        self.backend()
            .list_encoded(
                consistency,
                resource_type,
                tenancy,
                name_prefix,
                after,
                sink,
            )
            .await
    }
    async fn list_by_owner(
        &self,
        owner: &proto::resource::v1::Id,
    ) -> Result<Vec<proto::resource::v1::Resource>, crate::storage::StorageError> {
        self.backend().list_by_owner(owner).await
    }
    async fn watch_list(
        &self,
        resource_type: &crate::storage::UnversionedType,
        tenancy: &proto::resource::v1::Tenancy,
        name_prefix: &str,
        since: Option<crate::storage::Version>,
        options: crate::storage::WatchOptions,
    ) -> Result<crate::storage::Watch, crate::storage::StorageError> {
        self.backend()
            .watch_list(resource_type, tenancy, name_prefix, since, options)
            .await
    }
    fn group_stamp(&self, group: &str) -> Option<u64> {
        self.backend().group_stamp(group)
    }
    fn keep_history(&self, policy: Arc<dyn crate::storage::history::HistoryPolicy>) {
        self.backend().keep_history(policy)
    }
    async fn history(
        &self,
        consistency: crate::storage::Consistency,
        uid: &str,
        before: Option<crate::storage::Version>,
        limit: usize,
    ) -> Result<crate::storage::history::Page, crate::storage::StorageError> {
        self.backend()
            .history(consistency, uid, before, limit)
            .await
    }
    async fn sync(&self) -> Result<(), crate::storage::StorageError> {
        self.backend().sync().await
    }
    fn project(
        &self,
        projection: Arc<dyn crate::storage::Projection>,
    ) -> Result<(), crate::storage::StorageError> {
        self.backend().project(projection)
    }
}

mod single_node {
    #[allow(unused_imports)]
    use super::Member;
    crate::conformance_tests!(|| async { Member::single().await });
}

mod leader_of_three {
    #[allow(unused_imports)]
    use super::Member;
    crate::conformance_tests!(|| async { Member::leader_of_three().await });
}

mod follower_of_three {
    #[allow(unused_imports)]
    use super::Member;
    crate::conformance_tests!(|| async { Member::follower_of_three().await });
}

/// The suite once more with a type registered at runtime in place of the demo types.
mod registered_type_on_a_follower_of_three {
    #[allow(unused_imports)]
    use super::Member;
    crate::conformance_tests!(registered: || async { Member::follower_of_three().await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_a_forwarded_write_fails_as_inconsistent_after_its_deadline() {
    use crate::storage::{Backend, StorageError};

    let cluster = TestCluster::start_with(3, Duration::from_secs(2)).await;
    // Stop the leader and one follower: the last node can never elect a leader.
    cluster.nodes[0].shutdown().await;
    cluster.nodes[1].shutdown().await;
    let survivor = &cluster.nodes[2];
    let fixture = crate::storage::conformance::Fixture::new();
    let started = Instant::now();
    let error = storage(survivor)
        .write_cas(fixture.artist("lonely"))
        .await
        .expect_err("no quorum");
    assert!(matches!(error, StorageError::Inconsistent(_)), "{error:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "it waited for a leader first: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(30),
        "and gave up after its deadline, not never: {waited:?}"
    );
    // An eventual read still answers from local state.
    let missing = storage(survivor)
        .read(
            crate::storage::Consistency::Eventual,
            &fixture.artist("lonely").id.unwrap_or_default(),
        )
        .await;
    assert!(matches!(missing, Err(StorageError::NotFound)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_are_batched_with_unique_ordered_versions_and_resumable_events() {
    use std::collections::BTreeSet;

    use futures::StreamExt;

    use crate::storage::{Backend, Operation, Version};

    let member = Member::leader_of_three().await;
    let backend = member.backend();
    let fixture = crate::storage::conformance::Fixture::new();
    let everything = crate::storage::conformance::tenancy("*", "*");
    let mut watch = backend
        .watch_list(
            &fixture.artist_type(),
            &everything,
            "",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    assert_eq!(
        watch.next().await.expect("event").expect("ok").operation,
        Operation::EndOfSnapshot
    );

    let mut writers = tokio::task::JoinSet::new();
    for index in 0..200 {
        let resource = fixture.artist(&format!("batched-{index}"));
        let cluster = member.cluster.clone();
        writers.spawn(async move { storage(&cluster.nodes[0]).write_cas(resource).await });
    }
    let mut versions = BTreeSet::new();
    while let Some(result) = writers.join_next().await {
        let stored = result.expect("join").expect("every write lands");
        let version: Version = stored.version.parse().expect("versions parse");
        assert!(versions.insert(version), "version {version} given twice");
    }
    assert_eq!(versions.len(), 200);
    assert!(
        versions.iter().any(|version| version.position > 0),
        "some writes shared an entry (group commit)"
    );
    let stats = backend.node().status();
    assert!(
        stats.log_operations > stats.log_commits,
        "more writes than log commits: {stats:?}"
    );

    // The watcher saw each write once, in version order.
    let mut seen = Vec::new();
    while seen.len() < 200 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("events in time")
            .expect("open")
            .expect("ok");
        seen.push(event.version.parse::<Version>().expect("version"));
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "events arrive once each, in commit order");

    // Resuming from the middle of a batch replays exactly the rest.
    let middle = *versions
        .iter()
        .find(|version| version.position > 0)
        .expect("a batched version");
    let mut resumed = backend
        .watch_list(
            &fixture.artist_type(),
            &everything,
            "",
            Some(middle),
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("resume");
    let mut replayed = Vec::new();
    loop {
        let event = resumed.next().await.expect("event").expect("ok");
        if event.operation == Operation::EndOfSnapshot {
            break;
        }
        replayed.push(event.version.parse::<Version>().expect("version"));
    }
    let expected: Vec<Version> = versions
        .iter()
        .copied()
        .filter(|version| *version > middle)
        .collect();
    assert_eq!(replayed, expected);
}

/// A leader sends its entries to the followers while it writes them itself (the patched
/// openraft, vendor/README.md): with the leader's log writer stalled, a write still commits on
/// the followers' copies and is applied on the leader; the leader's own copy lands once its disk
/// moves again, and only then does it count itself (a write the followers alone cannot carry
/// would wait for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_commits_on_its_followers_while_its_own_log_write_stalls() {
    use std::sync::atomic::Ordering;

    use crate::storage::{Backend, Consistency};

    let member = Member::leader_of_three().await;
    let fixture = crate::storage::conformance::Fixture::new();
    let stats = member.log_stats();
    let commits = stats.commits.load(Ordering::Relaxed);
    let stalled = stats.stall.write().await;
    let written = tokio::time::timeout(
        Duration::from_secs(20),
        member.write_cas(fixture.artist("while-the-leader-syncs")),
    )
    .await
    .expect("the write committed on the followers while the leader's log write stalled")
    .expect("write");
    assert_eq!(
        stats.commits.load(Ordering::Relaxed),
        commits,
        "the leader's log has not committed meanwhile"
    );
    let read = member
        .read(Consistency::Eventual, written.id.as_ref().expect("id"))
        .await
        .expect("applied on the leader");
    assert_eq!(read.version, written.version);

    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.commits.load(Ordering::Relaxed) == commits {
        assert!(
            Instant::now() < deadline,
            "the leader's log never caught up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The leader's own progress moved: with a follower gone, the leader and the other follower
    // still commit. (On a loaded machine the stall may have cost node 0 its leadership: the
    // node stopped is never the leader of now, or the write would wait for an election.)
    let leader = member.metrics().current_leader;
    let follower = (1..3)
        .find(|&index| Some(member.cluster.nodes[index].id()) != leader)
        .expect("two followers");
    member.cluster.nodes[follower].shutdown().await;
    tokio::time::timeout(
        Duration::from_secs(20),
        member.write_cas(fixture.artist("after-the-stall")),
    )
    .await
    .expect("a write with one follower gone commits on the leader and the other")
    .expect("write");
}

/// Blind writes merged from one read of a resource all land, however the proposer batches
/// them (the state machine stores each over the one before), each with its own version, and a
/// follower holds the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_merged_writes_from_one_read_all_land() {
    use std::collections::BTreeSet;

    use crate::storage::{Backend, Consistency, Version};

    let member = Member::leader_of_three().await;
    let fixture = crate::storage::conformance::Fixture::new();
    let first = member
        .write_cas(fixture.artist("contended"))
        .await
        .expect("create");
    let mut writers = tokio::task::JoinSet::new();
    for n in 0..64 {
        let mut write = first.clone();
        write.metadata.insert("writer".into(), n.to_string());
        let cluster = member.cluster.clone();
        writers.spawn(async move {
            storage(&cluster.nodes[n % 3])
                .write_merged_as(write, "", &Default::default())
                .await
        });
    }
    let mut versions = BTreeSet::new();
    while let Some(result) = writers.join_next().await {
        let stored = result.expect("join").expect("every merged write lands");
        let version: Version = stored.version.parse().expect("version");
        assert!(versions.insert(version), "version {version} given twice");
    }
    let last = versions.last().copied().expect("versions");
    let read = crate::storage::conformance::eventually("the follower has the last write", || {
        let node = member.cluster.nodes[2].clone();
        let id = first.id.clone().unwrap_or_default();
        async move {
            let read = storage(&node)
                .read(Consistency::Eventual, &id)
                .await
                .map_err(|e| format!("{e:?}"))?;
            if read.version == last.to_string() {
                Ok(read)
            } else {
                Err(format!("at {}", read.version))
            }
        }
    })
    .await;
    assert!(read.metadata.contains_key("writer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writes_to_one_resource_in_a_batch_follow_cas() {
    use crate::storage::{Backend, StorageError};

    let member = Member::leader_of_three().await;
    let fixture = crate::storage::conformance::Fixture::new();
    let created = member
        .write_cas(fixture.artist("shared"))
        .await
        .expect("create");
    // Many writers race with the same expected version: exactly one wins each round.
    let mut writers = tokio::task::JoinSet::new();
    for index in 0..32 {
        let mut update = created.clone();
        update.metadata.insert("writer".into(), index.to_string());
        let cluster = member.cluster.clone();
        writers.spawn(async move { storage(&cluster.nodes[0]).write_cas(update).await });
    }
    let mut wins = 0;
    while let Some(result) = writers.join_next().await {
        match result.expect("join") {
            Ok(_) => wins += 1,
            Err(StorageError::CasFailure) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(wins, 1, "one CAS write wins, the others see a CAS failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_deadline_shorter_than_the_forward_timeout_ends_the_wait() {
    use crate::storage::{Backend, StorageError, deadline};

    let cluster = TestCluster::start_with(3, Duration::from_secs(30)).await;
    cluster.nodes[0].shutdown().await;
    cluster.nodes[1].shutdown().await;
    let fixture = crate::storage::conformance::Fixture::new();
    let started = Instant::now();
    let result = deadline::scope(
        Some(Instant::now() + Duration::from_millis(800)),
        storage(&cluster.nodes[2]).write_cas(fixture.artist("hurry")),
    )
    .await;
    assert!(
        matches!(result, Err(StorageError::Inconsistent(_))),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the caller's deadline won: {:?}",
        started.elapsed()
    );
}

/// The log entry at `index` (term 1) that carries `change` alone.
pub(super) fn entry_changing(index: u64, change: super::op::Change) -> Entry {
    let command = super::op::Op::Changes(vec![super::op::Tagged::by_test(change)]);
    Entry {
        log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Normal(super::types::Command::new(command)),
    }
}

/// The log entry at `index` that writes `resource` (created: no version expected).
pub(super) fn entry_writing(index: u64, resource: proto::resource::v1::Resource) -> Entry {
    entry_changing(
        index,
        super::op::Change::Write(Arc::new(resource), crate::storage::WriteCondition::Version),
    )
}

/// The log entry at `index` that creates an artist named `name`.
pub(super) fn write_entry(index: u64, name: &str) -> Entry {
    let fixture = crate::storage::conformance::Fixture::new();
    entry_writing(index, fixture.artist(name))
}

/// The names of the artists `sm` holds, sorted.
pub(super) fn names(sm: &StateMachineStore) -> Vec<String> {
    let fixture = crate::storage::conformance::Fixture::new();
    let mut names: Vec<String> = sm
        .shared
        .list(&fixture.artist_type(), &fixture.wildcard(), "")
        .expect("list")
        .into_iter()
        .map(|r| r.id.unwrap_or_default().name)
        .collect();
    names.sort();
    names
}

mod restart {
    use openraft::RaftSnapshotBuilder;
    use openraft::storage::RaftStateMachine;

    use super::super::state_machine::StateMachineStore;
    use super::super::types::{Entry, LogId};
    use super::{entry_writing, names, write_entry};

    #[tokio::test]
    async fn an_unclean_stop_rebuilds_the_state_machine_from_the_latest_snapshot() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
            sm.apply(vec![write_entry(1, "in-snapshot")])
                .await
                .expect("apply");
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .expect("snapshot");
            sm.apply(vec![write_entry(2, "after-snapshot")])
                .await
                .expect("apply");
            assert_eq!(names(&sm), ["after-snapshot", "in-snapshot"]);
            // Dropped without close_cleanly: a crash.
        }
        let mut reopened = StateMachineStore::open(dir.path(), Default::default()).expect("reopen");
        assert_eq!(
            names(&reopened),
            ["in-snapshot"],
            "rebuilt from the snapshot; raft re-applies the rest"
        );
        let (applied, _) = reopened.applied_state().await.expect("applied");
        assert_eq!(applied.map(|l| l.index), Some(1));
    }

    #[tokio::test]
    async fn a_clean_stop_keeps_the_state_machine_as_it_was() {
        let dir = tempfile::tempdir().expect("dir");
        {
            let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
            sm.apply(vec![write_entry(1, "kept")]).await.expect("apply");
            sm.shared.close_cleanly().expect("close");
            assert!(
                sm.apply(vec![write_entry(2, "too-late")]).await.is_err(),
                "no apply after closing"
            );
        }
        let mut reopened = StateMachineStore::open(dir.path(), Default::default()).expect("reopen");
        assert_eq!(names(&reopened), ["kept"]);
        let (applied, _) = reopened.applied_state().await.expect("applied");
        assert_eq!(applied.map(|l| l.index), Some(1), "nothing to replay");
        drop(reopened);
        // The marker is consumed: a crash after this start rebuilds again.
        let again = StateMachineStore::open(dir.path(), Default::default()).expect("third open");
        assert!(
            names(&again).is_empty(),
            "no snapshot existed, so the rebuild starts empty"
        );
    }

    fn needle_entry(index: u64, name: &str, needle: &str) -> Entry {
        let fixture = crate::storage::conformance::Fixture::new();
        let mut resource = fixture.artist(name);
        resource.metadata.insert("mark".into(), needle.into());
        entry_writing(index, resource)
    }

    /// Flips one byte of every copy of `needle` in the state machine's current file (old copies
    /// of a page may linger in free pages).
    fn flip_needle(data_dir: &std::path::Path, needle: &str) -> usize {
        use std::os::unix::fs::FileExt;
        let generation = std::fs::read_to_string(data_dir.join("raft/sm/CURRENT"))
            .map_or(0, |text| text.trim().parse::<u64>().expect("generation"));
        let path = super::super::schema::sm_generation_dir(data_dir, generation).join("data.mdb");
        let bytes = std::fs::read(&path).expect("read");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        let mut flipped = 0;
        for at in 0..bytes.len().saturating_sub(needle.len()) {
            if &bytes[at..at + needle.len()] == needle.as_bytes() {
                file.write_all_at(&[bytes[at + 3] ^ 0x20], (at + 3) as u64)
                    .expect("flip");
                flipped += 1;
            }
        }
        flipped
    }

    /// A record damaged under a running state machine: the read that meets it is `Damaged`
    /// (never the damaged bytes, never INTERNAL), so is an apply that must read it (apply stops:
    /// the other nodes decide from their own state), the damage is recorded durably, the stop
    /// is not clean, and the next open rebuilds the state from the snapshot.
    #[tokio::test]
    async fn a_record_damaged_under_a_running_state_machine_is_refused_and_rebuilt_at_open() {
        use crate::storage::StorageError;

        let dir = tempfile::tempdir().expect("dir");
        {
            let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
            sm.apply(vec![write_entry(1, "in-snapshot")])
                .await
                .expect("apply");
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .expect("snapshot");
            sm.apply(vec![needle_entry(2, "needle", "NEEDLE-0123456789")])
                .await
                .expect("apply");
            let mut id = crate::storage::conformance::Fixture::new()
                .artist("needle")
                .id
                .expect("id");
            id.uid.clear();
            assert_eq!(
                sm.shared.read(&id).expect("read").metadata["mark"],
                "NEEDLE-0123456789"
            );
            assert!(flip_needle(dir.path(), "NEEDLE-0123456789") >= 1);

            let read = sm.shared.read(&id);
            assert!(matches!(read, Err(StorageError::Damaged(_))), "{read:?}");
            let fixture = crate::storage::conformance::Fixture::new();
            let list = sm
                .shared
                .list(&fixture.artist_type(), &fixture.wildcard(), "");
            assert!(matches!(list, Err(StorageError::Damaged(_))), "{list:?}");
            let found = sm
                .shared
                .damage()
                .borrow()
                .clone()
                .expect("damage recorded");
            assert!(
                found.contains("/Artist/")
                    && found.contains("needle")
                    && found.contains("data.mdb"),
                "{found}"
            );
            let marker = std::fs::read_to_string(dir.path().join("raft/sm/DAMAGED"))
                .expect("the damage is recorded on disk");
            assert!(marker.contains("needle"), "{marker}");
            // Apply that must read the damaged record stops instead of deciding from it.
            assert!(
                sm.apply(vec![needle_entry(3, "needle", "NEEDLE-again")])
                    .await
                    .is_err()
            );
            sm.shared.close_cleanly().expect("close");
            assert!(
                !dir.path().join("raft/sm/CLEAN").exists(),
                "a damaged state is never marked clean"
            );
        }
        let mut reopened = StateMachineStore::open(dir.path(), Default::default()).expect("reopen");
        assert_eq!(
            names(&reopened),
            ["in-snapshot"],
            "rebuilt from the snapshot"
        );
        let (applied, _) = reopened.applied_state().await.expect("applied");
        assert_eq!(
            applied.map(|l| l.index),
            Some(1),
            "raft applies the rest again"
        );
        assert!(!dir.path().join("raft/sm/DAMAGED").exists(), "consumed");
        assert!(reopened.shared.damage().borrow().is_none());
    }

    /// A record damaged in the live state and never read since does not become a snapshot (the
    /// log would be purged behind it): the build fails and the damage is recorded.
    #[tokio::test]
    async fn a_snapshot_is_never_built_from_a_damaged_record() {
        let dir = tempfile::tempdir().expect("dir");
        let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
        sm.apply(vec![needle_entry(1, "needle", "NEEDLE-9876543210")])
            .await
            .expect("apply");
        assert!(flip_needle(dir.path(), "NEEDLE-9876543210") >= 1);
        let built = sm.get_snapshot_builder().await.build_snapshot().await;
        assert!(built.is_err(), "a snapshot of a damaged state was built");
        let found = sm
            .shared
            .damage()
            .borrow()
            .clone()
            .expect("damage recorded");
        assert!(
            found.contains("snapshot") && found.contains("needle"),
            "{found}"
        );
        assert!(
            std::fs::read_dir(dir.path().join("raft/snapshots"))
                .map(|entries| entries.count())
                .unwrap_or(0)
                == 0,
            "nothing left behind"
        );
    }

    /// A state machine written before values were sealed (format 2) is sealed when it is first
    /// opened, and reads as it did.
    #[tokio::test]
    async fn a_state_machine_of_format_2_is_sealed_when_opened() {
        use super::super::schema;

        let dir = tempfile::tempdir().expect("dir");
        let generation = schema::sm_generation_dir(dir.path(), 0);
        let fixture = crate::storage::conformance::Fixture::new();
        {
            let (env, dbs) = schema::open_sm(&generation, 1 << 30).expect("open");
            let mut wtxn = env.write_txn().expect("txn");
            for name in ["a", "b"] {
                let resource = fixture.artist(name);
                let key = schema::resource_key(&crate::storage::StorageKey::of(
                    resource.id.as_ref().expect("id"),
                ));
                dbs.resources
                    .put(&mut wtxn, &key, &prost::Message::encode_to_vec(&resource))
                    .expect("put");
            }
            let applied = crate::wire::raft::encode(&Some(LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                2,
            )));
            dbs.meta
                .put(&mut wtxn, schema::META_LAST_APPLIED, &applied)
                .expect("put");
            dbs.meta
                .put(&mut wtxn, schema::META_FORMAT, &2u32.to_be_bytes())
                .expect("put");
            wtxn.commit().expect("commit");
            env.force_sync().expect("sync");
            env.prepare_for_closing().wait();
        }
        std::fs::write(dir.path().join("raft/sm/CURRENT"), "0").expect("current");
        std::fs::write(dir.path().join("raft/sm/CLEAN"), "clean").expect("clean");
        let mut sm = StateMachineStore::open(dir.path(), Default::default()).expect("open");
        assert_eq!(names(&sm), ["a", "b"]);
        let (applied, _) = sm.applied_state().await.expect("applied");
        assert_eq!(applied.map(|l| l.index), Some(2));
        assert!(sm.shared.damage().borrow().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_apply_cannot_store_is_refused_for_its_caller_and_raft_goes_on() {
    use super::op::{Change, Request, Tagged};
    use crate::storage::WriteCondition;
    use crate::storage::{Backend, Consistency, StorageError};

    let cluster = TestCluster::start(3).await;
    let fixture = crate::storage::conformance::Fixture::new();
    // Past every admission check, straight to the proposer: apply is the last line.
    let mut long_name = fixture.artist("x");
    long_name.id.as_mut().expect("id").name = "a".repeat(600);
    let mut huge_owner = fixture.artist("child");
    let mut owner = fixture.artist("owner").id.expect("id");
    owner.uid = "0".repeat(480);
    huge_owner.owner = Some(owner);
    for resource in [long_name, huge_owner] {
        let reply = cluster.nodes[0]
            .serve_forwarded(Request::Change(Tagged::by_test(Change::Write(
                Arc::new(resource),
                WriteCondition::Version,
            ))))
            .await;
        assert!(
            matches!(&reply, Err(StorageError::Rejected(_))),
            "expected a refusal, got {reply:?}"
        );
    }
    let delete = cluster.nodes[0]
        .serve_forwarded(Request::Change(Tagged::by_test(Change::Delete {
            id: {
                let mut id = fixture.artist("x").id.expect("id");
                id.name = "b".repeat(700);
                id
            },
            version: "1".into(),
        })))
        .await;
    assert!(
        matches!(delete, Err(StorageError::Rejected(_))),
        "{delete:?}"
    );
    // Every node applied (and refused) those entries and goes on applying.
    let written = storage(&cluster.nodes[1])
        .write_cas(fixture.artist("fine"))
        .await
        .expect("a later write");
    let index: u64 = written.version.parse().expect("an unbatched version");
    for node in &cluster.nodes {
        let deadline = Instant::now() + Duration::from_secs(10);
        while node.state_machine().last_applied_index() < index && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let read = storage(node)
            .read(Consistency::Eventual, written.id.as_ref().expect("id"))
            .await
            .expect("applied everywhere");
        assert_eq!(read.version, written.version);
    }
}

#[test]
fn a_data_directory_of_a_newer_format_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let (env, dbs) = super::schema::open_log(dir.path()).expect("open");
        let mut wtxn = env.write_txn().expect("txn");
        dbs.meta
            .put(&mut wtxn, super::schema::META_FORMAT, &7u32.to_be_bytes())
            .expect("put");
        wtxn.commit().expect("commit");
        env.prepare_for_closing().wait();
    }
    let message = match LogStore::open(dir.path()) {
        Ok(_) => panic!("a newer format was opened"),
        Err(error) => error.to_string(),
    };
    assert!(
        message.contains("format version 7")
            && message.contains(&format!("up to {}", crate::wire::FORMAT)),
        "{message}"
    );
}

/// A data directory of format 1 kept the raft log in LMDB: the first open moves the vote, the
/// purge point and the entries to the write-ahead log and removes the LMDB log.
#[tokio::test]
async fn a_log_kept_in_lmdb_by_an_earlier_resd_is_moved_to_the_write_ahead_log() {
    use openraft::RaftLogReader;
    use openraft::storage::RaftLogStorage;

    use super::types::{Entry, LogId, Vote};
    use crate::wire::raft::encode;

    let dir = tempfile::tempdir().expect("temp dir");
    let log_id = |index| LogId::new(openraft::CommittedLeaderId::new(4, 2), index);
    {
        let (env, dbs) = super::schema::open_log(dir.path()).expect("open");
        let mut wtxn = env.write_txn().expect("txn");
        dbs.meta
            .put(&mut wtxn, super::schema::META_FORMAT, &1u32.to_be_bytes())
            .expect("format");
        dbs.meta
            .put(
                &mut wtxn,
                super::schema::META_VOTE,
                &encode(&Vote::new_committed(4, 2)),
            )
            .expect("vote");
        dbs.meta
            .put(
                &mut wtxn,
                super::schema::META_LAST_PURGED,
                &encode(&Some(log_id(10))),
            )
            .expect("purged");
        for index in 11..=20 {
            let entry = Entry {
                log_id: log_id(index),
                payload: openraft::EntryPayload::Blank,
            };
            dbs.entries
                .put(&mut wtxn, &index, &encode(&entry))
                .expect("entry");
        }
        wtxn.commit().expect("commit");
        env.prepare_for_closing().wait();
    }
    for _round in 0..2 {
        let mut log = LogStore::open(dir.path()).expect("open");
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(Vote::new_committed(4, 2))
        );
        let state = log.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(10)));
        assert_eq!(state.last_log_id, Some(log_id(20)));
        let entries = log.try_get_log_entries(0..100).await.expect("read");
        assert_eq!(
            entries.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            (11..=20).collect::<Vec<_>>()
        );
    }
    // What stays of the LMDB log is the format marker: empty, and of the current format, so an
    // older resd refuses the directory.
    let (env, dbs) = super::schema::open_log(dir.path()).expect("open the marker");
    let rtxn = env.read_txn().expect("txn");
    assert!(dbs.entries.is_empty(&rtxn).expect("entries"));
    assert!(
        dbs.meta
            .get(&rtxn, super::schema::META_VOTE)
            .expect("vote")
            .is_none()
    );
    assert_eq!(
        super::schema::format_of(&env, dbs.meta).expect("format"),
        Some(crate::wire::FORMAT)
    );
}

#[test]
fn new_environments_record_the_format_they_were_written_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (env, dbs) = super::schema::open_log(dir.path()).expect("open");
    assert_eq!(
        super::schema::format_of(&env, dbs.meta).expect("read"),
        Some(crate::wire::FORMAT)
    );
}

#[test]
fn snapshot_ids_that_are_not_ours_are_refused() {
    for bad in ["../../etc", "1-2", "a-b-c", "1-2-3-4", ""] {
        assert!(super::schema::check_snapshot_id(bad).is_err(), "{bad:?}");
    }
    super::schema::check_snapshot_id("3-1200-0").expect("ours");
}

#[test]
fn received_snapshots_are_checked_before_raft_sees_them() {
    // Not an LMDB file at all.
    let garbage = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        garbage.path().join(super::schema::SNAPSHOT_DATA),
        vec![0x5a; 64 << 10],
    )
    .expect("write");
    assert!(super::state_machine::check_received(garbage.path(), 1 << 30).is_err());

    // A state machine holding a record under the wrong key, and one with a 600-byte name.
    let fixture = crate::storage::conformance::Fixture::new();
    for (key_name, mut resource) in [
        ("elsewhere", fixture.artist("here")),
        ("x", fixture.artist("x")),
    ] {
        if key_name == "x" {
            resource.id.as_mut().expect("id").name = "a".repeat(600);
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let (env, dbs) = super::schema::open_sm(dir.path(), 1 << 30).expect("open");
        let mut wtxn = env.write_txn().expect("txn");
        let mut key_id = resource.id.clone().expect("id");
        key_id.name = key_name.into();
        let key = super::schema::resource_key(&crate::storage::StorageKey::of(&key_id));
        dbs.resources
            .put(
                &mut wtxn,
                &key,
                &super::sealed::seal_message(&key, &resource),
            )
            .expect("put");
        wtxn.commit().expect("commit");
        env.prepare_for_closing().wait();
        let why = super::state_machine::check_received(dir.path(), 1 << 30).expect_err("refused");
        assert!(why.contains("record 0"), "{why}");
    }

    // A good one passes; the same with one byte of its record flipped does not.
    for flip in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let (env, dbs) = super::schema::open_sm(dir.path(), 1 << 30).expect("open");
        let mut wtxn = env.write_txn().expect("txn");
        let resource = fixture.artist("fine");
        let key = super::schema::resource_key(&crate::storage::StorageKey::of(
            resource.id.as_ref().expect("id"),
        ));
        let mut value = super::sealed::seal_message(&key, &resource);
        if flip {
            value[3] ^= 0x10;
        }
        dbs.resources.put(&mut wtxn, &key, &value).expect("put");
        wtxn.commit().expect("commit");
        env.prepare_for_closing().wait();
        let checked = super::state_machine::check_received(dir.path(), 1 << 30);
        if flip {
            let why = checked.expect_err("a flipped record is refused");
            assert!(
                why.contains("/Artist/") && why.contains("checksum"),
                "{why}"
            );
        } else {
            assert_eq!(checked, Ok(1));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_raft_stopped_says_so() {
    use crate::storage::Backend;

    let cluster = TestCluster::start(1).await;
    let node = cluster.nodes[0].clone();
    let halted = tokio::spawn({
        let node = node.clone();
        async move { node.halted().await }
    });
    // A state machine that refuses to apply (closed under raft's feet) stops raft for good.
    node.state_machine().close_cleanly().expect("close");
    let fixture = crate::storage::conformance::Fixture::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        storage(&node).write_cas(fixture.artist("x")),
    )
    .await;
    let reason = tokio::time::timeout(Duration::from_secs(10), halted)
        .await
        .expect("halted in time")
        .expect("joined");
    assert!(
        reason.as_deref().is_some_and(|why| why.contains("closed")),
        "{reason:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_change_is_answered_with_its_first_outcome_and_applied_once() {
    use futures::StreamExt;

    use super::op::{self, Change, Request, Tagged};
    use crate::storage::WriteCondition;
    use crate::storage::{Backend, Operation};

    let cluster = TestCluster::start(3).await;
    let fixture = crate::storage::conformance::Fixture::new();
    let created = storage(&cluster.nodes[1])
        .write_cas(fixture.artist("register"))
        .await
        .expect("create");
    let mut watch = storage(&cluster.nodes[2])
        .watch_list(
            &fixture.artist_type(),
            &fixture.wildcard(),
            "",
            None,
            crate::storage::WatchOptions::default(),
        )
        .await
        .expect("watch");
    // A CAS forwarded twice with one request id, as a follower retries after losing the
    // leader's answer: the second attempt must not fail its version check against the first.
    let mut update = created.clone();
    update.metadata.insert("n".into(), "1".into());
    let cas = Request::Change(Tagged::by_test(Change::Write(
        Arc::new(update),
        WriteCondition::Version,
    )));
    let first = op::expect_resource(cluster.nodes[0].serve_forwarded(cas.clone()).await)
        .expect("the first attempt");
    let retry = op::expect_resource(cluster.nodes[0].serve_forwarded(cas).await)
        .expect("the retry is not ABORTED");
    assert_eq!(retry, first);
    // A blind create retried the same way is stored once.
    let blind = Request::Change(Tagged::by_test(Change::Write(
        Arc::new(fixture.artist("once")),
        WriteCondition::Version,
    )));
    let a =
        op::expect_resource(cluster.nodes[0].serve_forwarded(blind.clone()).await).expect("create");
    let b = op::expect_resource(cluster.nodes[0].serve_forwarded(blind).await).expect("retry");
    assert_eq!(a.version, b.version);

    let mut upserts = Vec::new();
    while upserts.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("an event in time")
            .expect("open")
            .expect("ok");
        if let Operation::Upsert(resource) = event.into_event().operation {
            upserts.push((resource.id.expect("id").name, resource.version));
        }
    }
    // The snapshot's create, one update, one create: nothing twice.
    assert_eq!(
        upserts,
        [
            ("register".to_owned(), created.version.clone()),
            ("register".to_owned(), first.version.clone()),
            ("once".to_owned(), a.version.clone()),
        ]
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), watch.next()).await;
    assert!(
        extra.is_err(),
        "no second upsert for a retried change: {extra:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_requests_are_bounded_and_forgotten_oldest_first() {
    use super::op::{Change, Op, Outcome, Tagged};
    use crate::storage::WriteCondition;

    let dir = tempfile::tempdir().expect("temp dir");
    let shared = StateMachineStore::open(dir.path(), Default::default())
        .expect("open")
        .shared;
    let fixture = crate::storage::conformance::Fixture::new();
    let first = Tagged::by_test(Change::Write(
        Arc::new(fixture.artist("first")),
        WriteCondition::Version,
    ));
    let entry = |index: u64, changes: Vec<Tagged>| Entry {
        log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Normal(super::types::Command::new(Op::Changes(changes))),
    };
    let mut sm = StateMachineStore { shared };
    let mut applied =
        openraft::storage::RaftStateMachine::apply(&mut sm, vec![entry(1, vec![first.clone()])])
            .await
            .expect("apply");
    assert!(matches!(applied.pop(), Some(Outcome(ref results)) if results[0].is_ok()));
    // Enough later requests (deletes of nothing, in large batches) to push the first out.
    let total = super::schema::REMEMBERED_REQUESTS + 1;
    let mut index = 2;
    let mut sent = 0;
    while sent < total {
        let batch: Vec<Tagged> = (0..4096.min(total - sent))
            .map(|n| {
                Tagged::by_test(Change::Delete {
                    id: fixture.artist(&format!("gone-{index}-{n}")).id.expect("id"),
                    version: "1".into(),
                })
            })
            .collect();
        sent += batch.len() as u64;
        openraft::storage::RaftStateMachine::apply(&mut sm, vec![entry(index, batch)])
            .await
            .expect("apply");
        index += 1;
    }
    // Forgotten: the same request applies again (a CAS failure now, the name exists).
    let again =
        openraft::storage::RaftStateMachine::apply(&mut sm, vec![entry(index, vec![first])])
            .await
            .expect("apply")
            .pop()
            .expect("outcome");
    assert!(
        matches!(
            again.0.first(),
            Some(Err(crate::storage::StorageError::CasFailure))
        ),
        "{again:?}"
    );
}

#[test]
fn small_applies_run_in_place_unless_something_holds_the_event_log() {
    use super::op::{Change, Op, Tagged};
    use super::state_machine::INLINE_APPLY_CHANGES;
    use crate::storage::WriteCondition;

    let dir = tempfile::tempdir().expect("temp dir");
    let shared = StateMachineStore::open(dir.path(), Default::default())
        .expect("open")
        .shared;
    let fixture = crate::storage::conformance::Fixture::new();
    let entry = |index: u64, op: Op| Entry {
        log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: openraft::EntryPayload::Normal(super::types::Command::new(op)),
    };
    let writes = |first: usize, count: usize| {
        Op::Changes(
            (first..first + count)
                .map(|n| {
                    Tagged::by_test(Change::Write(
                        Arc::new(fixture.artist(&format!("a{n}"))),
                        WriteCondition::Version,
                    ))
                })
                .collect(),
        )
    };
    let applied = shared
        .try_apply_now(vec![entry(1, writes(0, 3))])
        .expect("a few changes are applied in place")
        .expect("applied");
    assert_eq!(applied.len(), 1);
    let handed_back = shared
        .try_apply_now(vec![entry(2, writes(10, INLINE_APPLY_CHANGES + 1))])
        .expect_err("a large batch goes to the blocking pool");
    assert_eq!(handed_back.len(), 1);
    {
        let _watcher = shared.hold_events();
        shared
            .try_apply_now(vec![entry(2, writes(10, 1))])
            .expect_err("never waits for the event log on an async thread");
    }
    shared
        .try_apply_now(vec![entry(
            2,
            Op::RestoreBegin {
                restore_id: "r".into(),
            },
        )])
        .expect_err("restores never run in place");
    // Nothing handed back was applied: only the first three are stored.
    let stored = shared
        .list(&fixture.artist_type(), &fixture.wildcard(), "")
        .expect("list");
    assert_eq!(stored.len(), 3);
}

/// A node whose vote says it led gives the term up at start (it may have lost entries it had
/// already sent, so it must not propose new ones under the same log ids): its vote stays its own
/// in that term, uncommitted. Another node's leadership is left as it is.
#[tokio::test]
async fn a_node_that_led_stands_for_a_new_term_instead_of_resuming_its_old_one() {
    use openraft::storage::RaftLogStorage;

    use super::types::Vote;

    let dir = tempfile::tempdir().expect("temp dir");
    {
        let mut log = LogStore::open(dir.path()).expect("open");
        log.save_vote(&Vote::new_committed(5, 1))
            .await
            .expect("save vote");
    }
    let mut log = LogStore::open(dir.path()).expect("reopen");
    super::node::resign_restored_leadership(&mut log, 1)
        .await
        .expect("resign");
    assert_eq!(log.read_vote().await.expect("read"), Some(Vote::new(5, 1)));
    log.save_vote(&Vote::new_committed(6, 2))
        .await
        .expect("save vote");
    super::node::resign_restored_leadership(&mut log, 1)
        .await
        .expect("resign");
    assert_eq!(
        log.read_vote().await.expect("read"),
        Some(Vote::new_committed(6, 2))
    );
}

/// A follower whose disk stalls falls behind the leader, is not ready (with its lag as the
/// reason) and refuses reads; once its disk moves again it catches up and is ready again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_lags_past_the_threshold_is_not_ready_until_it_catches_up() {
    use crate::storage::{Backend, Consistency};

    let cluster = TestCluster::start_configured(3, Duration::from_secs(10), |options| {
        options.max_lag_entries = 20;
    })
    .await;
    let leader = &cluster.nodes[0];
    let follower = &cluster.nodes[2];
    let fixture = crate::storage::conformance::Fixture::new();
    let stats = follower.log_stats();
    let stalled = stats.stall.write().await;
    for i in 0..60 {
        storage(leader)
            .write_cas(fixture.artist(&format!("while-a-follower-stalls-{i}")))
            .await
            .expect("committed by the leader and the other follower");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let reason = loop {
        if let Some(reason) = follower.readiness().borrow().reason() {
            break reason;
        }
        assert!(
            Instant::now() < deadline,
            "a follower 60 entries behind stayed ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(reason.contains("entries behind the leader"), "{reason}");
    assert!(follower.serving().is_err());
    let written = fixture.artist("while-a-follower-stalls-0");
    let refused = storage(follower)
        .read(Consistency::Eventual, written.id.as_ref().expect("id"))
        .await
        .expect_err("a lagging follower refuses reads");
    assert!(refused.to_string().contains("lagging"), "{refused}");

    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !follower.readiness().borrow().is_ready() {
        assert!(
            Instant::now() < deadline,
            "the follower did not become ready again after its disk moved"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A restore's commit copies the staged records a chunk at a time (it used to hold them all in
/// memory at once): more records than a chunk, owners among them, all land with the commit's
/// version, and nothing of the state before is left. The commit counts as writing every
/// resource, so a snapshot of the restored state follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_larger_than_a_copy_chunk_replaces_the_state_whole() {
    use crate::storage::{Backend, Consistency};

    let member = Member {
        cluster: Arc::new(
            TestCluster::start_configured(1, Duration::from_secs(10), |options| {
                options.snapshot_every = 1_000;
            })
            .await,
        ),
        index: 0,
    };
    let backend = member.backend();
    let fixture = crate::storage::conformance::Fixture::new();
    let before = backend
        .write_cas(fixture.artist("before-the-restore"))
        .await
        .expect("write");
    let owner = fixture.artist("restored-owner");
    let owner_id = owner.id.clone().expect("id");
    let mut records = vec![owner];
    for index in 0..1_300 {
        let mut artist = fixture.artist(&format!("restored-{index:04}"));
        if index % 10 == 0 {
            artist.owner = Some(owner_id.clone());
        }
        records.push(artist);
    }
    let (chunks, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        for chunk in records.chunks(500) {
            let chunk = super::node::RestoreRecords {
                resources: chunk.to_vec(),
                history: Vec::new(),
            };
            if chunks.send(Ok(chunk)).await.is_err() {
                return;
            }
        }
    });
    let applied = member.restore(receiver).await.expect("restore");
    let listed = backend
        .list(
            Consistency::Strong,
            &fixture.artist_type(),
            &fixture.wildcard(),
            "",
        )
        .await
        .expect("list");
    assert_eq!(listed.len(), 1_301, "the owner and 1,300 restored artists");
    assert!(listed.iter().all(|r| {
        r.id.as_ref()
            .is_some_and(|id| id.name != "before-the-restore")
    }));
    let versions: std::collections::BTreeSet<&str> =
        listed.iter().map(|r| r.version.as_str()).collect();
    assert_eq!(versions.len(), 1, "one commit, one version: {versions:?}");
    let version: crate::storage::Version = listed[0].version.parse().expect("version");
    assert!(
        version.index
            > before
                .version
                .parse::<crate::storage::Version>()
                .expect("v")
                .index
    );
    assert!(
        version.index <= applied,
        "the restore took effect at {} and says {applied}",
        version.index
    );
    let owned = backend.list_by_owner(&owner_id).await.expect("by owner");
    assert_eq!(
        owned.len(),
        130,
        "the owner index was rebuilt for every chunk"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let snapshot = member
            .raft()
            .metrics()
            .borrow()
            .snapshot
            .map_or(0, |log_id| log_id.index);
        if snapshot >= version.index {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot of the restored state (at {}) within 30 s: {snapshot}",
            version.index
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A restore counts every quota again from what it restored: a snapshot's `used` (here a
/// made-up 999) is not trusted, and the restored objects' new versions are what it counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_counts_its_quotas_again() {
    use crate::storage::{Backend, Consistency};
    use proto::tenancy::v1::Quota;

    let member = Member::single().await;
    let backend = member.backend();
    let fixture = crate::storage::conformance::Fixture::new();
    let glob = "count/demo.*".to_owned();
    let mut quota = fixture.resource(
        "v1",
        "Quota",
        crate::storage::conformance::tenancy("default", "default"),
        "limits",
    );
    if let Some(id) = quota.id.as_mut()
        && let Some(t) = id.r#type.as_mut()
    {
        t.group = "tenancy".into();
    }
    quota.data = Some(proto::to_any(&Quota {
        hard: [(glob.clone(), 100), ("bytes".to_owned(), 1 << 30)].into(),
        used: [(glob.clone(), 999), ("bytes".to_owned(), 999)].into(),
    }));
    let quota_id = quota.id.clone().expect("id");
    let mut records = vec![quota];
    for index in 0..7 {
        records.push(fixture.artist(&format!("restored-{index}")));
    }
    let (chunks, receiver) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let _ = chunks
            .send(Ok(super::node::RestoreRecords {
                resources: records,
                history: Vec::new(),
            }))
            .await;
    });
    member.restore(receiver).await.expect("restore");
    let restored = backend
        .read(Consistency::Strong, &quota_id)
        .await
        .expect("the quota");
    let data: Quota = prost::Message::decode(
        restored
            .data
            .as_ref()
            .map(|d| d.value.as_slice())
            .unwrap_or_default(),
    )
    .expect("decodes");
    assert_eq!(data.used[&glob], 7, "{data:?}");
    let listed = backend
        .list(
            Consistency::Strong,
            &fixture.artist_type(),
            &fixture.wildcard(),
            "",
        )
        .await
        .expect("list");
    let bytes: u64 = listed
        .iter()
        .map(|r| prost::Message::encoded_len(r) as u64)
        .sum();
    assert_eq!(data.used["bytes"], bytes, "the restored objects' bytes");
}

/// A cluster-scoped resource of `group.v1.kind` named `name` (a Type, a token), with a uid.
fn cluster_scoped(group: &str, kind: &str, name: &str) -> proto::resource::v1::Resource {
    proto::resource::v1::Resource {
        id: Some(proto::resource::v1::Id {
            uid: ulid::Ulid::new().to_string(),
            name: name.into(),
            r#type: Some(crate::resource::new_type(group, "v1", kind)),
            tenancy: Some(Default::default()),
        }),
        generation: ulid::Ulid::new().to_string(),
        ..Default::default()
    }
}

/// The fence in apply (DESIGN §15): a change whose Type moved since it was checked, or whose
/// domain (every Type, every token and policy) changed after the revision it was checked at,
/// is refused for that change alone, on every node the same way; the domains' revisions are
/// the state's, and a restore moves them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_change_whose_guard_moved() {
    use super::op::{Change, Op, Outcome, Tagged};
    use crate::storage::WriteCondition;
    use crate::storage::{Domain, Fence, FenceKind, Guard, StorageError, StorageKey, Version};

    let dir = tempfile::tempdir().expect("temp dir");
    let shared = StateMachineStore::open(dir.path(), Default::default())
        .expect("open")
        .shared;
    let sm = StateMachineStore { shared };
    let fixture = crate::storage::conformance::Fixture::new();
    let mut index = 0;
    let mut apply = |change: Change, fence: Fence| {
        index += 1;
        let entry = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(super::types::Command::new(Op::Changes(vec![
                Tagged::by_test(change).fenced(&fence),
            ]))),
        };
        let mut sm = sm.clone();
        async move {
            let Outcome(mut results) =
                openraft::storage::RaftStateMachine::apply(&mut sm, vec![entry])
                    .await
                    .expect("apply")
                    .pop()
                    .expect("an outcome");
            results.pop().expect("a result")
        }
    };
    let write = |resource: proto::resource::v1::Resource| {
        Change::Write(Arc::new(resource), WriteCondition::Version)
    };
    let type_key = StorageKey::of(
        cluster_scoped("registry", "Type", "payments-invoice")
            .id
            .as_ref()
            .expect("id"),
    );
    let on_type = |version: &str| Fence {
        guards: vec![Guard::Resource {
            key: type_key.clone(),
            version: version.into(),
        }],
    };
    let domain = |domain, index| Fence {
        guards: vec![Guard::Domain {
            domain,
            revision: Version::new(index),
        }],
    };
    let fenced = |result: &super::op::ChangeResult, kind: FenceKind| matches!(result, Err(StorageError::Fenced(fenced)) if fenced.kind == kind);

    let the_type = cluster_scoped("registry", "Type", "payments-invoice");
    let stored = apply(write(the_type.clone()), Fence::default()).await;
    assert!(stored.is_ok(), "{stored:?}"); // index 1
    assert!(
        apply(write(fixture.artist("a")), on_type("1"))
            .await
            .is_ok()
    );
    let mut changed = the_type.clone();
    changed.version = "1".into();
    assert!(apply(write(changed), Fence::default()).await.is_ok()); // index 3
    let refused = apply(write(fixture.artist("b")), on_type("1")).await;
    assert!(fenced(&refused, FenceKind::Schema), "{refused:?}");
    assert!(
        apply(write(fixture.artist("b")), on_type("3"))
            .await
            .is_ok()
    );
    // A Type that was never stored (or was deleted) holds nothing either.
    let absent = Fence {
        guards: vec![Guard::Resource {
            key: StorageKey::of(
                cluster_scoped("registry", "Type", "gone")
                    .id
                    .as_ref()
                    .expect("id"),
            ),
            version: "1".into(),
        }],
    };
    let refused = apply(write(fixture.artist("c")), absent).await;
    assert!(fenced(&refused, FenceKind::Schema), "{refused:?}");
    // Every Type: checked at 1, changed at 3.
    let refused = apply(write(fixture.artist("d")), domain(Domain::Types, 1)).await;
    assert!(fenced(&refused, FenceKind::Schema), "{refused:?}");
    assert!(
        apply(write(fixture.artist("d")), domain(Domain::Types, 3))
            .await
            .is_ok()
    );
    // The ACLs: a token written at 9 fences off what was authorized before it; deletes too.
    assert!(
        apply(
            write(cluster_scoped("acl", "Token", "alice")),
            Fence::default()
        )
        .await
        .is_ok()
    );
    let refused = apply(write(fixture.artist("e")), domain(Domain::Acl, 0)).await;
    assert!(fenced(&refused, FenceKind::Acl), "{refused:?}");
    let stored_d = fixture.artist("d").id.expect("id");
    let refused = apply(
        Change::Delete {
            id: stored_d,
            version: "8".into(),
        },
        domain(Domain::Acl, 0),
    )
    .await;
    assert!(fenced(&refused, FenceKind::Acl), "{refused:?}");
    assert!(
        apply(write(fixture.artist("e")), domain(Domain::Acl, 9))
            .await
            .is_ok()
    );
}

/// An operator snapshot is restorable by construction: a state holding a resource of a type
/// neither built in nor registered by one of its Types is refused, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_resource_no_type_registers_is_refused() {
    let member = Member::single().await;
    let backend = member.backend();
    let fixture = crate::storage::conformance::Fixture::new();
    crate::storage::Backend::write_cas(&backend, fixture.artist("orphan"))
        .await
        .expect("stored below any registry");
    let export = |built_in: &'static (dyn Fn(&str, &str) -> bool + Send + Sync)| {
        let shared = member.state_machine().clone();
        let id = member.id();
        tokio::task::spawn_blocking(move || {
            let (sender, mut receiver) = tokio::sync::mpsc::channel(1024);
            let result = shared.export_blocking(id, sender, built_in);
            receiver.close();
            result
        })
    };
    let refused = export(&|_, _| false)
        .await
        .expect("joined")
        .expect_err("an unregistered type");
    let message = refused.to_string();
    assert!(
        message.contains("no Type registers") && message.contains("orphan"),
        "{message}"
    );
    export(&|group, _| group == "demo")
        .await
        .expect("joined")
        .expect("a built-in type's resources are saved");
}
