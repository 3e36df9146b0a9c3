//! Leader election over a real cluster (DESIGN §16): two replicas' electors on a
//! `coordination.v1.Lease` through the resource service; one holds it and renews, the other
//! waits; when the holder stops, the other takes over after the lease duration.

use std::time::{Duration, Instant};

use runtime::election::{ApiStore, Config, Elector};
use tokio_util::sync::CancellationToken;

fn config(identity: &str) -> Config {
    let mut config = Config::new("default", "invoices", identity);
    config.duration = Duration::from_secs(3);
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = Duration::from_millis(300);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_holder_and_the_other_takes_over_when_it_stops() {
    let cluster = tests::Cluster::start(3).await;
    let a = Elector::new(config("replica-a"), ApiStore(cluster.client(0))).expect("a");
    let b = Elector::new(config("replica-b"), ApiStore(cluster.client(2))).expect("b");
    let (lead_a, lead_b) = (a.leadership(), b.leadership());
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let (stop_a_for_release, stop_b_for_release) = (stop_a.clone(), stop_b.clone());
    let running_a = tokio::spawn(a.run(stop_a.clone()));
    let running_b = tokio::spawn(b.run(stop_b.clone()));

    let deadline = Instant::now() + Duration::from_secs(20);
    while !(lead_a.holds() || lead_b.holds()) {
        assert!(Instant::now() < deadline, "nobody took the lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Exactly one leads, and goes on leading while it renews.
    for _ in 0..20 {
        assert!(lead_a.holds() ^ lead_b.holds(), "exactly one replica leads");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (holder_stop, holder_running, other, other_name) = if lead_a.holds() {
        (stop_a, running_a, lead_b.clone(), "replica-b")
    } else {
        (stop_b, running_b, lead_a.clone(), "replica-a")
    };
    // The holder crashes (its task is gone, nothing released): the other waits the lease out.
    drop(holder_stop);
    holder_running.abort();
    let _ = holder_running.await;
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(3 + 5);
    while !other.holds() {
        assert!(
            Instant::now() < deadline,
            "the other replica did not take over within the duration and some"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        stopped.elapsed() >= Duration::from_secs(2),
        "taken over before the holder's lease could have run out ({:?})",
        stopped.elapsed()
    );
    assert_eq!(other.holder(), other_name);
    let other_stop = if other_name == "replica-b" {
        stop_b_for_release
    } else {
        stop_a_for_release
    };

    // The new holder stops cleanly and hands the lease back: a third replica takes it at once.
    other_stop.cancel();
    let c = Elector::new(config("replica-c"), ApiStore(cluster.client(1))).expect("c");
    let lead_c = c.leadership();
    let stop_c = CancellationToken::new();
    let handed_back = Instant::now();
    let running_c = tokio::spawn(c.run(stop_c.clone()));
    while !lead_c.holds() {
        assert!(
            handed_back.elapsed() < Duration::from_secs(2),
            "a released lease was not taken at once"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop_c.cancel();
    running_c.await.expect("c stops");
}

/// DESIGN §16: a replica outside the server is in every view — `ListControllers` lists it with
/// its lease, the placement map blames it by the finalizer it declares, and its report goes
/// when it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_outside_the_server_is_listed_and_blamed_by_its_finalizer() {
    use proto::client::placement::placement_map;
    use runtime::controller::Stats;
    use runtime::report::Identity;
    let cluster = tests::Cluster::start(1).await;
    let client = cluster.client(0);
    let elector = Elector::new(config("replica-a"), ApiStore(client.clone())).expect("a");
    let leadership = elector.leadership();
    let stop = CancellationToken::new();
    let electing = tokio::spawn(elector.run(stop.clone()));
    let stats = std::sync::Arc::new(Stats::default());
    stats.reconciled(None);
    stats.reconciled(Some("the receipt could not be written"));
    let identity = Identity {
        controller: "invoices".into(),
        identity: "replica-a".into(),
        host: "host-1".into(),
        partition: "default".into(),
        namespace: "default".into(),
        lease: Some("invoices".into()),
        shard: None,
        managed_type: proto::resource::v1::Type {
            group: "payments".into(),
            group_version: "v1".into(),
            kind: "Invoice".into(),
        },
        watched_types: Vec::new(),
        finalizers: vec!["payments.example.com/receipt".into()],
        every: Duration::from_millis(500),
    };
    let reporting = tokio::spawn(runtime::report::run(
        ApiStore(client.clone()),
        identity,
        stats,
        Some(leadership),
        stop.clone(),
    ));

    let deadline = Instant::now() + Duration::from_secs(20);
    let map = loop {
        let response = client.list_controllers(true).await.expect("controllers");
        let map = placement_map(&response);
        let holds = map
            .controllers
            .iter()
            .flat_map(|c| c.replicas.iter())
            .any(|r| r.identity == "replica-a" && r.holds_lease && r.running);
        if holds {
            break map;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never showed as the holder: {map:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let invoices = map
        .controllers
        .iter()
        .find(|c| c.name == "invoices")
        .expect("listed");
    assert_eq!(invoices.placement, "singleton (external)");
    assert_eq!(invoices.replicas[0].host, "host-1");
    assert_eq!(invoices.replicas[0].reconciles_failed, 1);
    let (labels, unowned) = map.release_labels(&["payments.example.com/receipt".to_owned()]);
    assert!(unowned.is_empty(), "{unowned:?}");
    assert!(
        labels[0].contains(
            "invoices releases payments.example.com/receipt, in replica replica-a on host-1"
        ) && labels[0].contains("holds the lease"),
        "{labels:?}"
    );

    stop.cancel();
    reporting.await.expect("the reporter stops");
    electing.await.expect("the elector stops");
    let response = client.list_controllers(true).await.expect("controllers");
    assert!(
        response.external.is_empty(),
        "the report is deleted: {:?}",
        response.external
    );
}

/// A cluster client answers a controller as the service in process does: the runtime's
/// conformance suite over gRPC, through two members of a 3-node cluster (at least one a
/// follower, whose writes are forwarded to the leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_api_passes_the_runtime_conformance_suite_through_two_members() {
    let cluster = tests::Cluster::start(3).await;
    runtime::api::conformance::run(&cluster.client(2), "through-node-3").await;
    runtime::api::conformance::run(&cluster.client(0), "through-node-1").await;
}
