//! The example controller program (`runtime/examples/invoice_controller.rs`, DESIGN §16) with
//! real processes: two replicas against a 3-node cluster, started before their types are
//! registered (they retry). One holds the lease and reconciles —
//! a finalizer, a receipt the invoice owns, an `Accepted` condition — and both are listed;
//! the holder is killed (-9) and the other takes over within the lease duration and a second;
//! deleting an invoice waits for the controller's finalizer and takes its receipt along.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use proto::client::Client;
use proto::resource::v1::{Id, Tenancy, Type};
use tokio_util::sync::CancellationToken;

/// A replica of the example; killed when dropped.
struct Replica(Child);

impl Replica {
    fn start(identity: &str, servers: &str) -> Replica {
        Replica::start_with(identity, servers, &[])
    }

    /// A replica with more settings in its environment (a token, certificates, placement).
    fn start_with(identity: &str, servers: &str, env: &[(&str, String)]) -> Replica {
        Replica::spawn(identity, servers, env, Stdio::null())
    }

    fn spawn(identity: &str, servers: &str, env: &[(&str, String)], stderr: Stdio) -> Replica {
        let child = Command::new(tests::binary("examples/invoice_controller"))
            .arg(identity)
            .env("RESD_SERVER", servers)
            .env("LEASE_SECONDS", "3")
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            // Not the user's contexts: only what the test passes.
            .env("RESCTL_CONFIG", "/nonexistent/resctl-contexts.yaml")
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("the example starts");
        Replica(child)
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn invoice_id(name: &str) -> Id {
    Id {
        uid: String::new(),
        name: name.into(),
        r#type: Some(Type {
            group: "payments".into(),
            group_version: "v1".into(),
            kind: "Invoice".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    }
}

/// An invoice's resource, its data encoded as invoice.proto says (amount_cents = 1,
/// customer = 3): what a team's client would build from its schema.
fn new_invoice(name: &str, amount_cents: i64, customer: &str) -> proto::resource::v1::Resource {
    let mut value = Vec::new();
    prost::encoding::int64::encode(1, &amount_cents, &mut value);
    prost::encoding::string::encode(3, &customer.to_owned(), &mut value);
    proto::resource::v1::Resource {
        id: Some(invoice_id(name)),
        data: Some(prost_types::Any {
            type_url: "type.googleapis.com/resd.payments.v1.Invoice".into(),
            value,
        }),
        ..Default::default()
    }
}

fn receipt_id(invoice: &str) -> Id {
    let mut id = invoice_id(&format!("receipt-{invoice}"));
    if let Some(t) = id.r#type.as_mut() {
        t.kind = "Receipt".into();
    }
    id
}

/// Waits until the controller has accepted `invoice`: its receipt exists, owned by it, and
/// its status says Accepted.
async fn accepted(client: &Client, invoice: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let stored = client.read(&invoice_id(invoice)).await.ok().flatten();
        let receipt = client.read(&receipt_id(invoice)).await.ok().flatten();
        let done = stored.as_ref().is_some_and(|invoice| {
            proto::meta::finalizers(invoice).contains("payments.example.com/receipt")
                && invoice
                    .status
                    .get("payments.example.com/invoice-controller")
                    .is_some_and(|s| s.conditions.iter().any(|c| c.r#type == "Accepted"))
        }) && receipt
            .as_ref()
            .is_some_and(|r| r.owner.as_ref().map(|o| o.name.as_str()) == Some(invoice));
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{invoice} was not accepted within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `resctl apply -f fixtures/teams`: the Invoice and Receipt types, and two invoices.
/// A one-node cluster (plaintext, no ACLs) with the teams' types and invoices: the cluster,
/// its API address and a client.
async fn one_node_with_teams() -> (tests::Cluster, String, Client) {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let client = cluster.client(0);
    apply_teams(&server);
    (cluster, server, client)
}

fn apply_teams(server: &str) {
    resctl(
        server,
        &[
            "apply",
            "-f",
            &tests::fixtures().join("teams").display().to_string(),
        ],
    );
}

fn resctl(server: &str, args: &[&str]) {
    let output = Command::new(tests::binary("resctl"))
        .arg("--server")
        .arg(server)
        .args(args)
        .env("RESCTL_CONFIG", "/nonexistent/resctl-contexts.yaml")
        .output()
        .expect("resctl runs");
    assert!(
        output.status.success(),
        "resctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_of_the_example_controller_reconcile_fail_over_and_release_finalizers() {
    let cluster = tests::Cluster::start(3).await;
    let servers: Vec<String> = cluster.nodes.iter().map(|n| n.api_addr.clone()).collect();
    let client = cluster.client(0);
    // The replicas start before their types exist: their watches are refused, and they try
    // again until the types are registered.
    let first = Replica::start("replica-1", &servers.join(","));
    let second = Replica::start("replica-2", &format!("{},{}", servers[2], servers[1]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    apply_teams(&servers[0]);
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;
    accepted(&client, "globex-2026-001", Duration::from_secs(10)).await;

    // Both replicas are listed; one holds the lease.
    let deadline = Instant::now() + Duration::from_secs(15);
    let holder = loop {
        let response = client.list_controllers(true).await.expect("controllers");
        let replicas: Vec<_> = response
            .external
            .iter()
            .filter(|r| r.controller.as_ref().is_some_and(|c| c.name == "invoices"))
            .collect();
        let holders: Vec<&str> = replicas
            .iter()
            .filter(|r| r.holds_lease)
            .map(|r| r.identity.as_str())
            .collect();
        if replicas.len() == 2 && holders.len() == 1 {
            break holders[0].to_owned();
        }
        assert!(Instant::now() < deadline, "listed: {replicas:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // The holder is killed (SIGKILL: nothing handed back): the other takes over within the
    // lease (3 s) and a second, and accepts a new invoice.
    let (mut killed_replica, survivor) = if holder == "replica-1" {
        (first, second)
    } else {
        (second, first)
    };
    let _ = killed_replica.0.kill();
    let _ = killed_replica.0.wait();
    let killed = Instant::now();
    let invoice = new_invoice("initech-1", 4200, "Initech");
    client.write(&invoice).await.expect("a new invoice");
    accepted(&client, "initech-1", Duration::from_secs(3 + 1 + 5)).await;
    assert!(
        killed.elapsed() < Duration::from_secs(3 + 1 + 5),
        "taken over in {:?}",
        killed.elapsed()
    );

    // Deleting an invoice waits for the finalizer, which the live replica releases; the
    // receipt goes with it.
    resctl(
        &servers[0],
        &[
            "delete",
            "payments.v1.Invoice",
            "initech-1",
            "--wait",
            "--timeout",
            "30s",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while client
        .read(&receipt_id("initech-1"))
        .await
        .ok()
        .flatten()
        .is_some()
    {
        assert!(Instant::now() < deadline, "the receipt was not reaped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(survivor);
}

fn signal(replica: &Replica, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(replica.0.id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal}");
}

/// The lease's holder and how often it changed hands.
async fn lease(client: &Client) -> (String, u64) {
    let id = Id {
        uid: String::new(),
        name: "invoices".into(),
        r#type: Some(Type {
            group: "coordination".into(),
            group_version: "v1".into(),
            kind: "Lease".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    };
    let stored = client.read(&id).await.expect("read").expect("the lease");
    let lease = <proto::coordination::v1::Lease as prost::Message>::decode(
        stored.data.expect("data").value.as_slice(),
    )
    .expect("a lease");
    (lease.holder, lease.transitions)
}

/// A holder paused (SIGSTOP) past its lease: the other replica takes over; when the paused one
/// resumes it writes nothing as the former holder (the lease keeps its new holder, and changes
/// hands no more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_is_replaced_and_writes_nothing_when_it_resumes() {
    let (_cluster, server, client) = one_node_with_teams().await;
    let first = Replica::start("replica-1", &server);
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;
    let second = Replica::start("replica-2", &server);
    let (holder, _) = lease(&client).await;
    assert_eq!(holder, "replica-1");
    signal(&first, "STOP");
    let deadline = Instant::now() + Duration::from_secs(3 + 1 + 5);
    loop {
        let (holder, transitions) = lease(&client).await;
        if holder == "replica-2" {
            assert_eq!(transitions, 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "nobody took over from the paused holder"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal(&first, "CONT");
    // Resumed, the former holder neither renews nor takes the lease back while replica-2 holds it.
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(lease(&client).await, ("replica-2".to_owned(), 1));
    }
    drop(second);
    drop(first);
}

/// The server node a replica talks to is killed: the replica moves to the next address it was
/// given (its watch resumes there, its lease is renewed or taken again) and goes on
/// reconciling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_fails_over_when_its_server_node_dies() {
    let mut cluster = tests::Cluster::start(3).await;
    let servers: Vec<String> = cluster.nodes.iter().map(|n| n.api_addr.clone()).collect();
    apply_teams(&servers[1]);
    let client = cluster.client(1);
    let replica = Replica::start("replica-1", &format!("{},{}", servers[0], servers[1]));
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;
    cluster.nodes[0].kill();
    let invoice = new_invoice("after-failover", 100, "Hooli");
    // The write waits out an election if the killed node led.
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.write(&invoice).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the cluster did not take writes again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    accepted(&client, "after-failover", Duration::from_secs(30)).await;
    drop(replica);
}

/// DESIGN §16's ACL story: the controller runs with a token whose policy covers only its types
/// (payments, and its lease and reports); it does its work, and every change it makes names its
/// token as the actor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_runs_with_a_token_for_its_types_only_and_is_the_actor_of_its_changes() {
    use proto::client::WatchUpdate;
    use proto::resource::v1::WatchListRequest;
    use proto::resource::v1::watch_event::Event;
    let cluster = tests::Cluster::start_with_acls(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let secret = token_for_types(&cluster, INVOICE_RULES);

    let replica = Replica::start_with("replica-1", &server, &acl_env(&cluster, &secret));
    let client = cluster.client(0);
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;

    // The receipts it wrote name its token as the actor.
    let mut watcher = client.watcher(WatchListRequest {
        r#type: Some(Type {
            group: "payments".into(),
            group_version: "v1".into(),
            kind: "Receipt".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "*".into(),
            namespace: "*".into(),
        }),
        name_prefix: String::new(),
        since_version: "1".into(),
        ..WatchListRequest::default()
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let update = tokio::time::timeout(Duration::from_secs(10), watcher.next())
            .await
            .expect("an event")
            .expect("the watch goes on");
        if let WatchUpdate::Event(event) = update
            && matches!(event.event, Some(Event::Upsert(_)))
        {
            assert_eq!(event.actor, "invoice-controller");
            break;
        }
        assert!(Instant::now() < deadline, "no receipt event");
    }
    drop(replica);
}

/// `EachReplica` placement: no lease; every replica reconciles and is listed as running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_placed_on_every_replica_all_run_and_are_listed_running() {
    let (_cluster, server, client) = one_node_with_teams().await;
    let start = |identity: &str| {
        Replica::start_with(
            identity,
            &server,
            &[("PLACEMENT", "each-replica".to_owned())],
        )
    };
    let replicas = [start("replica-1"), start("replica-2")];
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;
    accepted(&client, "globex-2026-001", Duration::from_secs(10)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let response = client.list_controllers(true).await.expect("controllers");
        let running = response
            .external
            .iter()
            .filter(|r| {
                r.controller
                    .as_ref()
                    .is_some_and(|c| c.name == "invoices" && c.running)
                    && !r.holds_lease
            })
            .count();
        if running == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "listed: {:?}", response.external);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(replicas);
}

/// A replica killed (no clean stop, its report stays) is forgotten: the server deletes a report
/// that has not changed for ten of its periods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_of_a_killed_replica_is_deleted_after_ten_periods() {
    let (_cluster, server, client) = one_node_with_teams().await;
    let mut replica = Replica::start("replica-1", &server);
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;
    let _ = replica.0.kill();
    let _ = replica.0.wait();
    let killed = Instant::now();
    // Nobody asked for the controllers yet: the first answer, seven seconds on (three silent
    // periods of a second make a report stale), already calls the dead replica stale — every
    // node follows the reports as they are written — instead of starting to count then.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let first = client.list_controllers(true).await.expect("controllers");
    assert!(!first.external.is_empty(), "the report is still there");
    assert!(
        first
            .external
            .iter()
            .all(|replica| replica.stale && !replica.controller.as_ref().is_some_and(|c| c.running)),
        "the first answer after the replica died: {:?}",
        first.external
    );
    // Reports every second (the least a report names): forgotten after about ten.
    let deadline = killed + Duration::from_secs(10 + 15);
    loop {
        let response = client.list_controllers(true).await.expect("controllers");
        if response.external.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead replica's report is still there: {:?}",
            response.external
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        killed.elapsed() >= Duration::from_secs(9),
        "forgotten too early ({:?})",
        killed.elapsed()
    );
}

/// A program given a token the cluster does not know, or an address where nothing listens,
/// says so once (not once per retry) and keeps trying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_bad_token_or_address_says_so_once_and_keeps_trying() {
    let cluster = tests::Cluster::start_with_acls(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let scratch = tempfile::tempdir().expect("temp dir");
    let bad_token_log = scratch.path().join("bad-token.log");
    let nowhere_log = scratch.path().join("nowhere.log");
    let mut bad_token = Replica::spawn(
        "replica-1",
        &server,
        &acl_env(&cluster, &"0".repeat(64)),
        std::fs::File::create(&bad_token_log).expect("log").into(),
    );
    // Nothing listens on port 1.
    let mut nowhere = Replica::spawn(
        "replica-2",
        "127.0.0.1:1",
        &acl_env(&cluster, &"0".repeat(64)),
        std::fs::File::create(&nowhere_log).expect("log").into(),
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(bad_token.running(), "a refused replica keeps trying");
    assert!(nowhere.running(), "a replica without a server keeps trying");
    drop((bad_token, nowhere));

    said_once(&bad_token_log, "starting over", "unauthenticated");
    said_once(&nowhere_log, "the watch broke", "127.0.0.1:1");
}

/// A replica's environment on a cluster with ACLs: its token and the cluster's certificates.
fn acl_env(cluster: &tests::Cluster, token: &str) -> Vec<(&'static str, String)> {
    let tls = cluster.tls.clone().expect("TLS");
    vec![
        ("RESD_TOKEN", token.to_owned()),
        ("RESD_CA_CERT", tls.ca().display().to_string()),
        ("RESD_CLIENT_CERT", tls.client_cert().display().to_string()),
        ("RESD_CLIENT_KEY", tls.client_key().display().to_string()),
    ]
}

/// What a replica logged, after checking it said `phrase` exactly once and named `why`.
fn said_once(log: &std::path::Path, phrase: &str, why: &str) -> String {
    let said = std::fs::read_to_string(log).expect("log");
    let times = said.lines().filter(|line| line.contains(phrase)).count();
    assert_eq!(times, 1, "{phrase:?} is said once:\n{said}");
    assert!(said.contains(why), "and says why ({why:?}):\n{said}");
    said
}

/// The rules of the invoice controller's policy: its types, and its Lease and reports.
const INVOICE_RULES: &str = concat!(
    "    - {types: [\"payments.*.*\"], partition: \"*\", namespace: \"*\", access: ACCESS_WRITE}\n",
    "    - {types: [\"coordination.v1.*\"], partition: default, namespace: default, access: ACCESS_WRITE}\n",
);

/// resctl as the cluster's management token.
fn as_management(cluster: &tests::Cluster, args: &[&str]) -> String {
    let tls = cluster.tls.clone().expect("TLS");
    let mut all: Vec<String> = tls.client_flags();
    all.extend([
        "--token".to_owned(),
        cluster.token.clone().expect("a management token"),
    ]);
    all.extend(args.iter().map(|a| a.to_string()));
    let output = Command::new(tests::binary("resctl"))
        .arg("--server")
        .arg(&cluster.nodes[0].api_addr)
        .args(&all)
        .env("RESCTL_CONFIG", "/nonexistent/resctl-contexts.yaml")
        .output()
        .expect("resctl runs");
    assert!(
        output.status.success(),
        "resctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Registers the teams' types, and makes a token whose one policy has `rules` (YAML list
/// items, each line indented by four); its secret.
fn token_for_types(cluster: &tests::Cluster, rules: &str) -> String {
    as_management(
        cluster,
        &[
            "apply",
            "-f",
            &tests::fixtures().join("teams").display().to_string(),
        ],
    );
    let scratch = tempfile::tempdir().expect("temp dir");
    let policy = scratch.path().join("policy.yaml");
    std::fs::write(
        &policy,
        format!("type: acl.v1.Policy\nname: invoice-controller\ndata:\n  rules:\n{rules}"),
    )
    .expect("policy");
    as_management(cluster, &["apply", "-f", &policy.display().to_string()]);
    another_token(cluster, "invoice-controller")
}

/// The least credentials: a token that may write the invoices but not its Lease. The
/// replica says once why it cannot lead, and reconciles nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_token_cannot_write_its_lease_says_so_once_and_reconciles_nothing() {
    let cluster = tests::Cluster::start_with_acls(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let secret = token_for_types(
        &cluster,
        "    - {types: [\"payments.*.*\"], partition: \"*\", namespace: \"*\", access: ACCESS_WRITE}\n",
    );
    // The node knows the new token before the replica starts (else its first words would
    // be about an unknown token, then about the lease).
    let as_replica = cluster.client_as(0, Some(secret.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while as_replica.read(&invoice_id("acme-2026-001")).await.is_err() {
        assert!(Instant::now() < deadline, "the token never resolved");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let scratch = tempfile::tempdir().expect("temp dir");
    let log = scratch.path().join("replica.log");
    let mut replica = Replica::spawn(
        "replica-1",
        &server,
        &acl_env(&cluster, &secret),
        std::fs::File::create(&log).expect("log").into(),
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(replica.running(), "it keeps trying");
    drop(replica);
    said_once(&log, "cannot take or renew the lease", "permission denied");
    let invoice = cluster
        .client(0)
        .read(&invoice_id("acme-2026-001"))
        .await
        .expect("read")
        .expect("the invoice");
    assert!(
        invoice.status.is_empty() && !invoice.metadata.contains_key("finalizers"),
        "nothing reconciled without the lease: {invoice:?}"
    );
}

/// A token named `name` of the invoice controller's policy (applied by [`token_for_types`]):
/// its secret.
fn another_token(cluster: &tests::Cluster, name: &str) -> String {
    let created = as_management(
        cluster,
        &[
            "acl",
            "token",
            "create",
            name,
            "--policy",
            "invoice-controller",
            "-o",
            "json",
        ],
    );
    serde_json::from_str::<serde_json::Value>(&created).expect("json")["secret"]
        .as_str()
        .expect("a secret")
        .to_owned()
}

/// DESIGN §16's fenced writes, as an attacker (or a stop-the-world pause) would test them: the
/// holder is SIGSTOPped while it issues receipts (each takes `WORK_MS` between deciding and
/// writing), another replica takes the lease over, and the paused one is resumed with writes in
/// flight. Every write it makes after the takeover is refused `FENCED` — none is stored (the
/// objects' history names who wrote each version: each replica has a token of its own) — and
/// it stops reconciling; the new holder accepts everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_mid_write_past_its_lease_has_every_later_write_refused_fenced() {
    let cluster = tests::Cluster::start_with_acls(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let first_secret = token_for_types(&cluster, INVOICE_RULES);
    let second_secret = another_token(&cluster, "invoice-controller-2");
    let client = cluster.client(0);
    let scratch = tempfile::tempdir().expect("temp dir");
    let log = scratch.path().join("replica-1.log");
    let slow = |secret: &str| {
        let mut env = acl_env(&cluster, secret);
        env.push(("WORK_MS", "1500".into()));
        env
    };
    let first = Replica::spawn(
        "replica-1",
        &server,
        &slow(&first_secret),
        std::fs::File::create(&log).expect("log").into(),
    );
    accepted(&client, "acme-2026-001", Duration::from_secs(30)).await;
    let second = Replica::start_with("replica-2", &server, &slow(&second_secret));

    // Invoices keep coming, so the holder always has a receipt in the making.
    let stop_writing = CancellationToken::new();
    let writer = {
        let (client, stop) = (client.clone(), stop_writing.clone());
        tokio::spawn(async move {
            let mut written = Vec::new();
            for n in 0..200 {
                if stop.is_cancelled() {
                    break;
                }
                let name = format!("load-{n}");
                client
                    .write(&new_invoice(&name, 100 + n, "Load"))
                    .await
                    .expect("an invoice");
                written.push(name);
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            written
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    signal(&first, "STOP");
    let deadline = Instant::now() + Duration::from_secs(3 + 1 + 5);
    while lease(&client).await != ("replica-2".to_owned(), 1) {
        assert!(Instant::now() < deadline, "nobody took over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Everything after this version is the new holder's to write.
    let taken_over = client
        .write(&new_invoice("after-takeover", 1, "Marker"))
        .await
        .expect("a marker")
        .version;
    signal(&first, "CONT");
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop_writing.cancel();
    let mut written = writer.await.expect("the writer");
    written.push("after-takeover".into());
    for name in &written {
        accepted(&client, name, Duration::from_secs(60)).await;
    }
    drop(second);
    drop(first);

    let after = |version: &str| {
        let (index, _) = version.split_once('.').unwrap_or((version, ""));
        let (taken, _) = taken_over.split_once('.').unwrap_or((&taken_over, ""));
        index.parse::<u64>().expect("a version") > taken.parse::<u64>().expect("a version")
    };
    let mut checked = 0;
    for name in written.iter().map(String::as_str).chain(["acme-2026-001"]) {
        for id in [invoice_id(name), receipt_id(name)] {
            for entry in client.history(&id, 1000).await.expect("history") {
                checked += 1;
                assert!(
                    !(entry.actor == "invoice-controller" && after(&entry.version)),
                    "the former holder stored {} {} at {} after the takeover (at {taken_over})",
                    id.name,
                    match entry.operation {
                        2 => "a status",
                        _ => "a change",
                    },
                    entry.version
                );
            }
        }
    }
    assert!(
        checked > written.len(),
        "histories were read ({checked} entries)"
    );
    let said = std::fs::read_to_string(&log).expect("log");
    assert!(
        said.contains("changed hands since this writer took it"),
        "the resumed former holder's writes in flight were refused FENCED:\n{said}"
    );
}

/// Who wrote an invoice's `Accepted` condition (the example names itself in it).
fn accepted_by(resource: &proto::resource::v1::Resource) -> Option<String> {
    resource
        .status
        .get("payments.example.com/invoice-controller")?
        .conditions
        .iter()
        .find(|c| c.r#type == "Accepted")?
        .message
        .rsplit_once(" by ")
        .map(|(_, who)| who.to_owned())
}

/// Waits until every invoice in `names` is accepted for its current generation; who accepted
/// each.
async fn all_accepted(
    client: &Client,
    names: &[String],
    within: Duration,
) -> std::collections::BTreeMap<String, String> {
    let deadline = Instant::now() + within;
    loop {
        let mut by = std::collections::BTreeMap::new();
        let mut missing = None;
        for name in names {
            let Ok(Some(invoice)) = client.read(&invoice_id(name)).await else {
                break;
            };
            missing = Some(invoice.clone());
            let current = invoice
                .status
                .get("payments.example.com/invoice-controller")
                .is_some_and(|s| s.observed_generation == invoice.generation);
            match accepted_by(&invoice) {
                Some(who) if current => {
                    by.insert(name.clone(), who);
                }
                _ => break,
            }
        }
        if by.len() == names.len() {
            return by;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} invoices accepted within {within:?}; the first not: {missing:?}",
            by.len(),
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A new amount for every invoice (a new generation each: everything is reconciled again).
async fn touch_all(client: &Client, names: &[String], amount: i64) {
    for name in names {
        client
            .write(&new_invoice(name, amount, "Sharded"))
            .await
            .expect("an update");
    }
}

/// DESIGN §16's shards with real processes: three replicas of the example with `--placement
/// sharded` split the invoices; one is killed (-9) and its share is handed over (timed), then
/// it is started again and takes a share back. Every invoice is accepted at every step, and —
/// checked from the objects' history against the ShardMap's — every `Accepted` a member wrote
/// was written while the settled ring gave it that invoice: no invoice was reconciled by two
/// members at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sharded_replicas_split_the_invoices_and_hand_over_through_a_kill_and_a_restart() {
    let cluster = tests::Cluster::start_with(1, &["--history-versions", "10000"]).await;
    let server = cluster.nodes[0].api_addr.clone();
    let client = cluster.client(0);
    apply_teams(&server);
    let names: Vec<String> = (0..60).map(|n| format!("sharded-{n}")).collect();
    touch_all(&client, &names, 100).await;
    let sharded = [("PLACEMENT", "sharded".to_owned())];
    let mut replicas: Vec<Option<Replica>> = ["replica-1", "replica-2", "replica-3"]
        .iter()
        .map(|identity| Some(Replica::start_with(identity, &server, &sharded)))
        .collect();
    let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
    // Settled on three members, each with a share.
    let mut shares = std::collections::BTreeMap::<String, usize>::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        touch_all(&client, &names, 200 + shares.len() as i64).await;
        let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
        shares.clear();
        for who in by.values() {
            *shares.entry(who.clone()).or_default() += 1;
        }
        if shares.len() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never split three ways: {shares:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(by);

    // replica-3 is killed: its share goes to the others.
    let killed = replicas[2].take().expect("replica-3");
    drop(killed);
    let at = Instant::now();
    touch_all(&client, &names, 300).await;
    let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
    let handover = at.elapsed();
    assert!(
        by.values().all(|who| who != "replica-3"),
        "nothing accepted by the killed replica: {by:?}"
    );
    eprintln!("handover after a kill (lease 3 s): every invoice accepted again in {handover:?}");

    // Started again under the same identity: it takes a share back.
    replicas[2] = Some(Replica::start_with("replica-3", &server, &sharded));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut round = 0;
    loop {
        round += 1;
        touch_all(&client, &names, 400 + round).await;
        let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
        if by.values().any(|who| who == "replica-3") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica-3 never took a share back"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(replicas);

    // Every Accepted written by a member was written while the settled ring gave it the
    // invoice.
    let checked = acceptances_followed_the_settled_ring(&client, &names).await;
    assert!(checked >= names.len() * 4, "{checked} acceptances checked");
}

/// Checks, from the objects' history against the ShardMap's, that every `Accepted` a member
/// wrote was written while the settled ring gave it the invoice (no invoice reconciled by two
/// members at once); how many were checked.
async fn acceptances_followed_the_settled_ring(client: &Client, names: &[String]) -> usize {
    let map_id = Id {
        uid: String::new(),
        name: "invoices".into(),
        r#type: Some(Type {
            group: "coordination".into(),
            group_version: "v1".into(),
            kind: "ShardMap".into(),
        }),
        tenancy: Some(Tenancy {
            partition: "default".into(),
            namespace: "default".into(),
        }),
    };
    let index = |version: &str| -> (u64, u32) {
        let (index, position) = version.split_once('.').unwrap_or((version, "0"));
        (
            index.parse().expect("index"),
            position.parse().expect("position"),
        )
    };
    let mut maps: Vec<((u64, u32), proto::coordination::v1::ShardMap)> = client
        .history(&map_id, 100_000)
        .await
        .expect("the map's history")
        .into_iter()
        .filter_map(|entry| {
            let data = entry.resource?.data?;
            Some((
                index(&entry.version),
                <proto::coordination::v1::ShardMap as prost::Message>::decode(
                    data.value.as_slice(),
                )
                .ok()?,
            ))
        })
        .collect();
    maps.sort_by_key(|(version, _)| *version);
    assert!(
        maps.len() >= 4,
        "the ring changed: {} map versions",
        maps.len()
    );
    let mut checked = 0;
    for name in names {
        let id = invoice_id(name);
        for entry in client.history(&id, 100_000).await.expect("history") {
            let Some(resource) = entry.resource.as_ref() else {
                continue;
            };
            let Some(who) = accepted_by(resource) else {
                continue;
            };
            if entry.operation != 2 {
                continue;
            }
            let at = index(&entry.version);
            let Some((_, map)) = maps.iter().rev().find(|(version, _)| *version <= at) else {
                panic!(
                    "{name}: accepted by {who} at {} before any ShardMap",
                    entry.version
                );
            };
            let key = proto::shard::ShardKey::of(&id);
            let owner = proto::shard::owner(map.settled_members.iter().map(String::as_str), &key);
            assert_eq!(
                owner,
                Some(who.as_str()),
                "{name}: accepted by {who} at {} while the settled ring (version {}) gave it to {owner:?}",
                entry.version,
                map.settled_ring_version
            );
            checked += 1;
        }
    }
    checked
}

/// A sharded member SIGSTOPped past its report (the attacker's pause): it leaves the ring and
/// its lease is taken; the others take its invoices over; resumed, it waits its lease out,
/// takes it back knowing its ring is stale, and owns nothing until a newer ring settles —
/// while invoices keep changing, none is accepted by two members at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_member_paused_past_its_report_never_reconciles_what_moved_on() {
    let cluster = tests::Cluster::start_with(1, &["--history-versions", "10000"]).await;
    let server = cluster.nodes[0].api_addr.clone();
    let client = cluster.client(0);
    apply_teams(&server);
    let names: Vec<String> = (0..45).map(|n| format!("paused-{n}")).collect();
    touch_all(&client, &names, 100).await;
    let sharded = [
        ("PLACEMENT", "sharded".to_owned()),
        ("WORK_MS", "200".to_owned()),
    ];
    let replicas: Vec<Replica> = ["replica-1", "replica-2", "replica-3"]
        .iter()
        .map(|identity| Replica::start_with(identity, &server, &sharded))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut round = 0;
    loop {
        round += 1;
        touch_all(&client, &names, 100 + round).await;
        let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
        if by.values().collect::<std::collections::BTreeSet<_>>().len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "never split three ways: {by:?}");
    }
    // replica-2 is paused while invoices keep changing; it stays paused well past three of its
    // report periods (0.5 s each) and its lease (3 s); then it is resumed.
    signal(&replicas[1], "STOP");
    let paused = Instant::now();
    while paused.elapsed() < Duration::from_secs(5) {
        round += 1;
        touch_all(&client, &names, 100 + round).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
    assert!(by.values().all(|who| who != "replica-2"), "{by:?}");
    signal(&replicas[1], "CONT");
    let resumed = Instant::now();
    let deadline = resumed + Duration::from_secs(40);
    loop {
        round += 1;
        touch_all(&client, &names, 100 + round).await;
        let by = all_accepted(&client, &names, Duration::from_secs(60)).await;
        if by.values().any(|who| who == "replica-2") && resumed.elapsed() > Duration::from_secs(4) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replica-2 never took a share back: {by:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(replicas);
    let checked = acceptances_followed_the_settled_ring(&client, &names).await;
    assert!(checked >= names.len() * 3, "{checked} acceptances checked");
}
